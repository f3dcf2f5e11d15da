//! Q2_K's part of the eight-row prompt-batch panels (`kq_panel_avx2.rs`; every x86 level
//! from AVX2 up): its blocks decoded into panel blocks, and its tile in the scalar
//! reference's order (bit for bit [`super::avx2::dot_q2k`], the row kernels of every
//! level).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ2K, BlockQ8K};

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel::{bsum_pair, quad};
use crate::kernels::kq_panel_avx2::{
    i16_pair, lanes8, lanes8_ps, q8k_acts, sum16, KPanel8, KPanel8Block,
};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::load32u;

impl KPanel8 for BlockQ2K {
    q8k_acts!();

    /// Element `128k + 32j + l` is bits `2j` of `qs[32k + l]`: per half `k` and plane `j`
    /// the 32 quants (dwords `32k + 8j..32k + 8j + 8`) masked out per row, then each
    /// group of eight dwords transposed across the rows; per 16-element group `g` the
    /// rows' 4-bit scale twice as i16, per pair of groups the rows' two mins.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, false);
    }

    /// Per block the exact integers `I = sum_g sc_g·dot_g` (each group's four dwords
    /// added as i16: at most 4 · 2 · 3 · 128 = 3072 in magnitude) and `M = sum_g
    /// m_g·bsum_g`, then `sum = sum + ((d_a·d)·I - (d_a·dmin)·M)`: products, difference
    /// and add, no `fma`, as the reference.
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
            let mut isum = [_mm256_setzero_si256(); A];
            for g in 0..16 {
                let s = sum16::<4, A>(b, 4 * g, &yb);
                let sc = lanes8(&b.sc[g]);
                for a in 0..A {
                    isum[a] = _mm256_add_epi32(isum[a], _mm256_madd_epi16(s[a], sc));
                }
            }
            for a in 0..A {
                acc[a] = _mm256_add_ps(acc[a], block_term(b, yb[a], isum[a]));
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }

    const VNNI: bool = true;

    /// [`Self::decode_block`] with each quant times its group's scale.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_block_vnni(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, true);
    }

    /// [`Self::tile`]'s integers by `vpdpbusd` of the scaled quants
    /// ([`Self::decode_block_vnni`]: `I = sum_e (sc_g(e)·q_e)·a_e`, one instruction per
    /// four elements of the eight rows); the same `M` and float steps.
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
            // Two chains per activation row (even and odd dwords), in registers.
            let mut even = [_mm256_setzero_si256(); A];
            let mut odd = [_mm256_setzero_si256(); A];
            for t in (0..64).step_by(2) {
                // SAFETY: 32 readable bytes each, 32-byte aligned.
                let (w0, w1) = unsafe {
                    (
                        _mm256_load_si256(b.u[t].as_ptr() as *const __m256i),
                        _mm256_load_si256(b.u[t + 1].as_ptr() as *const __m256i),
                    )
                };
                for a in 0..A {
                    even[a] = _mm256_dpbusd_epi32(even[a], w0, _mm256_set1_epi32(quad(yb[a], t)));
                    odd[a] = _mm256_dpbusd_epi32(odd[a], w1, _mm256_set1_epi32(quad(yb[a], t + 1)));
                }
            }
            for a in 0..A {
                let isum = _mm256_add_epi32(even[a], odd[a]);
                acc[a] = _mm256_add_ps(acc[a], block_term(b, yb[a], isum));
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }
}

/// Decodes block `i` of up to eight Q2_K rows into `o` ([`KPanel8::decode_block`]); with
/// `scaled` each quant times its group's scale (at most 45: [`KPanel8::decode_block_vnni`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn decode(rows: &[&[BlockQ2K]], i: usize, o: &mut KPanel8Block, scaled: bool) {
    let m3 = _mm256_set1_epi8(3);
    let zero = _mm256_setzero_si256();
    for k in 0..2 {
        let q: [__m256i; PANEL8_ROWS] = std::array::from_fn(|r| {
            rows.get(r)
                .map_or(zero, |row| load32u(&row[i].qs[32 * k..]))
        });
        for j in 0..4 {
            let mut plane = q.map(|q| {
                let s = match j {
                    0 => q,
                    1 => _mm256_srli_epi16::<2>(q),
                    2 => _mm256_srli_epi16::<4>(q),
                    _ => _mm256_srli_epi16::<6>(q),
                };
                _mm256_and_si256(s, m3)
            });
            if scaled {
                // Run m = 4k + j: groups 2m (low 128 bits) and 2m + 1 (high); each
                // quant looked up in its group's table `[0, sc, 2 sc, 3 sc]` (one
                // product gives it: `sc` is at most 15).
                let m = 4 * k + j;
                for (r, row) in rows.iter().enumerate() {
                    let sc = &row[i].scales;
                    let table = |g: usize| (u32::from(sc[g] & 0x0F) * 0x0302_0100) as i32;
                    let t = _mm256_setr_epi32(table(2 * m), 0, 0, 0, table(2 * m + 1), 0, 0, 0);
                    plane[r] = _mm256_shuffle_epi8(t, plane[r]);
                }
            }
            o.put_dwords(32 * k + 8 * j, plane);
        }
    }
    let mut sc = [[0i32; PANEL8_ROWS]; 16];
    let mut pairs = [[0i32; PANEL8_ROWS]; 8];
    let mut d = [0f32; PANEL8_ROWS];
    let mut dmin = [0f32; PANEL8_ROWS];
    for (r, row) in rows.iter().enumerate() {
        let b = &row[i];
        for g in 0..16 {
            let s = i32::from(b.scales[g] & 0x0F);
            sc[g][r] = i16_pair(s, s);
        }
        for p in 0..8 {
            pairs[p][r] = i16_pair(
                i32::from(b.scales[2 * p] >> 4),
                i32::from(b.scales[2 * p + 1] >> 4),
            );
        }
        (d[r], dmin[r]) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    }
    (o.sc, o.pairs, o.d, o.dmin) = (sc, pairs, d, dmin);
}

/// One block's term of the eight rows' sums against activation block `y`, from the
/// exact `I` of each row (`isum`): `(d_a·d)·I - (d_a·dmin)·M` with `M = sum_g
/// m_g·bsum_g` (exact), the reference's products and difference.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block_term(b: &KPanel8Block, y: &BlockQ8K, isum: __m256i) -> __m256 {
    let mut msum = _mm256_setzero_si256();
    for p in 0..8 {
        let m = _mm256_madd_epi16(lanes8(&b.pairs[p]), _mm256_set1_epi32(bsum_pair(y, p)));
        msum = _mm256_add_epi32(msum, m);
    }
    let da = _mm256_set1_ps(y.d);
    _mm256_sub_ps(
        _mm256_mul_ps(_mm256_mul_ps(da, lanes8_ps(&b.d)), _mm256_cvtepi32_ps(isum)),
        _mm256_mul_ps(
            _mm256_mul_ps(da, lanes8_ps(&b.dmin)),
            _mm256_cvtepi32_ps(msum),
        ),
    )
}
