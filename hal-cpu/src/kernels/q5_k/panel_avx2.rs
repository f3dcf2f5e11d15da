//! Q5_K's part of the eight-row prompt-batch panels (`kq_panel_avx2.rs`; every x86 level
//! from AVX2 up): its blocks decoded into panel blocks, and its tile in the order of
//! llama.cpp's tiled K-quant matmul with mins (bit for bit [`super::avx2::dot_q5k`] and
//! the AVX-512 VNNI kernels, `flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5K, BlockQ8K};

use crate::kernels::kq_panel::{bsum_pair, quad};
use crate::kernels::kq_panel_avx2::{lanes8, lanes8_ps, q8k_acts, sum16, KPanel8, KPanel8Block};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::{load32, load32u};

use super::avx2::q5k_high;

impl KPanel8 for BlockQ5K {
    q8k_acts!();

    /// Bytes `32j..32j + 32` of `qs` hold quants `64j..` in their low nibbles and
    /// `64j + 32..` in their high ones, each with its fifth bit from `qh`
    /// ([`q5k_high`]): the 5-bit quants per row in element order, each group of eight
    /// dwords transposed across the rows; the 6-bit scales and mins per row
    /// (`k4_scale_min`), as Q4_K's panels hold them.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        let m4 = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        for j in 0..4 {
            let mut lo = [zero; PANEL8_ROWS];
            let mut hi = [zero; PANEL8_ROWS];
            for (r, row) in rows.iter().enumerate() {
                let b = &row[i];
                let q = load32u(&b.qs[32 * j..]);
                let (h_lo, h_hi) = q5k_high(load32(&b.qh), j);
                lo[r] = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
                hi[r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
            }
            o.put_dwords(16 * j, lo);
            o.put_dwords(16 * j + 8, hi);
        }
        o.put_k4_headers(
            rows.iter()
                .map(|row| (&row[i].scales, row[i].d, row[i].dmin)),
        );
    }

    /// Per block the exact integers `S = sum_s sc_s·dot_s` (each half sub-block's four
    /// dwords added as i16: at most 4 · 2 · 31 · 128 = 31744 in magnitude) and `M =
    /// sum_s m_s·bsum_s`, then `r = fma(-dmin, M, S·d)` and `acc = fma(r, d_a, acc)`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        let nb = panel.len();
        let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
        let mut acc = [_mm256_setzero_ps(); A];
        for (i, b) in panel.iter().enumerate() {
            let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
            let mut s = [_mm256_setzero_si256(); A];
            let mut m = [_mm256_setzero_si256(); A];
            for k in 0..8 {
                let lo = sum16::<4, A>(b, 8 * k, &yb);
                let hi = sum16::<4, A>(b, 8 * k + 4, &yb);
                let (sk, mk) = (lanes8(&b.sc[k]), lanes8(&b.pairs[k]));
                for a in 0..A {
                    // Widened apart (`lo + hi` could reach 63488 as i16).
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(lo[a], sk),
                        _mm256_madd_epi16(hi[a], sk),
                    );
                    s[a] = _mm256_add_epi32(s[a], p);
                    let bs = _mm256_set1_epi32(bsum_pair(yb[a], k));
                    m[a] = _mm256_add_epi32(m[a], _mm256_madd_epi16(mk, bs));
                }
            }
            block_float(&mut acc, b, &s, &m, &yb);
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }

    const VNNI: bool = true;

    /// [`Self::tile`]'s integers with `vpdpbusd` (the 5-bit quants are unsigned bytes
    /// already, the panel block is [`Self::decode_block`]'s): per sub-block `k` the
    /// exact `dot_k` of each row, one instruction per four quants of the eight rows, then
    /// `S += sc_k·dot_k` by `vpmulld` (at most 63 · 32 · 31 · 128 in magnitude); `M` and
    /// the float steps as [`Self::tile`].
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn tile_vnni<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        let nb = panel.len();
        let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
        let mut acc = [_mm256_setzero_ps(); A];
        for (i, b) in panel.iter().enumerate() {
            let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
            let mut s = [_mm256_setzero_si256(); A];
            let mut m = [_mm256_setzero_si256(); A];
            for k in 0..8 {
                let mut dot = [_mm256_setzero_si256(); A];
                for t in 8 * k..8 * k + 8 {
                    // SAFETY: 32 readable bytes, 32-byte aligned.
                    let w = unsafe { _mm256_load_si256(b.u[t].as_ptr() as *const __m256i) };
                    for a in 0..A {
                        dot[a] = _mm256_dpbusd_epi32(dot[a], w, _mm256_set1_epi32(quad(yb[a], t)));
                    }
                }
                // The scale pair's high half: the scale (6 bits, unsigned).
                let sk = _mm256_srli_epi32::<16>(lanes8(&b.sc[k]));
                let mk = lanes8(&b.pairs[k]);
                for a in 0..A {
                    s[a] = _mm256_add_epi32(s[a], _mm256_mullo_epi32(dot[a], sk));
                    let bs = _mm256_set1_epi32(bsum_pair(yb[a], k));
                    m[a] = _mm256_add_epi32(m[a], _mm256_madd_epi16(mk, bs));
                }
            }
            block_float(&mut acc, b, &s, &m, &yb);
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }
}

/// A block's float steps for `A` activation rows (`s`, `m`: the exact `S` and `M` of
/// the eight rows): `r = fma(-dmin, M, S·d)`, then `acc = fma(r, d_a, acc)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block_float<const A: usize>(
    acc: &mut [__m256; A],
    b: &KPanel8Block,
    s: &[__m256i; A],
    m: &[__m256i; A],
    yb: &[&BlockQ8K; A],
) {
    let (d, dmin) = (lanes8_ps(&b.d), lanes8_ps(&b.dmin));
    // -dmin: the sign flipped (exact, as the scalar `-dmin`).
    let ndmin = _mm256_xor_ps(dmin, _mm256_set1_ps(-0.0));
    for a in 0..A {
        let r = _mm256_fmadd_ps(
            ndmin,
            _mm256_cvtepi32_ps(m[a]),
            _mm256_mul_ps(_mm256_cvtepi32_ps(s[a]), d),
        );
        acc[a] = _mm256_fmadd_ps(r, _mm256_set1_ps(yb[a].d), acc[a]);
    }
}
