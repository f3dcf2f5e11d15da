//! Q6_K's part of the AVX2 prompt-batch panels (`kq_panel_avx2.rs`): its blocks decoded
//! into eight-row panel blocks, and its tile in the order of llama.cpp's tiled K-quant
//! matmul (bit for bit [`super::avx2::dot_q6k`], this level's row kernel).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel::bsum_pair;
use crate::kernels::kq_panel_avx2::{
    i16_pair, lanes8, lanes8_ps, q8k_acts, sum16, KPanel8, KPanel8Block,
};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::load32u;

impl KPanel8 for BlockQ6K {
    q8k_acts!();

    /// Per half `n` of the block, quants `128n + 32k..` (`k = 0..4`: dwords `32n + 8k..`)
    /// put together from `ql` and `qh` per row as `dot_q6k` does (unsigned, 0..63), each
    /// group of eight dwords transposed across the rows; the scales and the offset's
    /// pairs per row.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        let m4 = _mm256_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(3);
        let zero = _mm256_setzero_si256();
        for n in 0..2 {
            let mut q = [[zero; PANEL8_ROWS]; 4];
            for (r, row) in rows.iter().enumerate() {
                let b = &row[i];
                let ql0 = load32u(&b.ql[64 * n..]);
                let ql1 = load32u(&b.ql[64 * n + 32..]);
                let h = load32u(&b.qh[32 * n..]);
                let high = |s: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(s, m3));
                q[0][r] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(h));
                q[1][r] =
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16::<2>(h)));
                q[2][r] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    high(_mm256_srli_epi16::<4>(h)),
                );
                q[3][r] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    high(_mm256_srli_epi16::<6>(h)),
                );
            }
            for (k, rows_k) in q.into_iter().enumerate() {
                o.put_dwords(32 * n + 8 * k, rows_k);
            }
        }
        let mut sc = [[0i32; PANEL8_ROWS]; 16];
        let mut pairs = [[0i32; PANEL8_ROWS]; 8];
        let mut d = [0f32; PANEL8_ROWS];
        for (r, row) in rows.iter().enumerate() {
            let b = &row[i];
            let s = |k: usize| i32::from(b.scales[k]);
            for (k, v) in sc.iter_mut().enumerate() {
                v[r] = i16_pair(s(k), s(k));
            }
            for (p, v) in pairs.iter_mut().enumerate() {
                v[r] = i16_pair(-32 * s(2 * p), -32 * s(2 * p + 1));
            }
            d[r] = f16_to_f32(b.d);
        }
        (o.sc, o.pairs, o.d, o.dmin) = (sc, pairs, d, [0.0; PANEL8_ROWS]);
    }

    /// Per block the exact integer `S = sum_s sc_s·dot_s - 32·sum_s sc_s·bsum_s` (each
    /// pair of dwords added as i16: at most 2 · 2 · 63 · 128 = 32256 in magnitude), then
    /// `acc = fma(S·d, d_a, acc)`.
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
            // The offset first: S starts at -32·sum_s sc_s·bsum_s.
            let mut s = [_mm256_setzero_si256(); A];
            for p in 0..8 {
                let c = lanes8(&b.pairs[p]);
                for a in 0..A {
                    let t = _mm256_madd_epi16(c, _mm256_set1_epi32(bsum_pair(yb[a], p)));
                    s[a] = _mm256_add_epi32(s[a], t);
                }
            }
            for sb in 0..16 {
                let sc = lanes8(&b.sc[sb]);
                for half in 0..2 {
                    let p = sum16::<2, A>(b, 4 * sb + 2 * half, &yb);
                    for a in 0..A {
                        s[a] = _mm256_add_epi32(s[a], _mm256_madd_epi16(p[a], sc));
                    }
                }
            }
            let d = lanes8_ps(&b.d);
            for a in 0..A {
                let sd = _mm256_mul_ps(_mm256_cvtepi32_ps(s[a]), d);
                acc[a] = _mm256_fmadd_ps(sd, _mm256_set1_ps(yb[a].d), acc[a]);
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }
}
