//! Q4_K's part of the AVX2 prompt-batch panels (`kq_panel_avx2.rs`): its blocks decoded
//! into eight-row panel blocks, and its tile in llama.cpp's repacked `q4_K_8x8` order
//! (bit for bit [`super::avx2::dot_q4k`], this level's row kernel).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::kq_panel::bsum_pair;
use crate::kernels::kq_panel_avx2::{lanes8, lanes8_ps, q8k_acts, sum16, KPanel8, KPanel8Block};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::load32u;

impl KPanel8 for BlockQ4K {
    q8k_acts!();

    /// Bytes `32j..32j + 32` of `qs` hold quants `64j..` in their low nibbles (dwords
    /// `16j..16j + 8`) and `64j + 32..` in their high ones (dwords `16j + 8..16j + 16`):
    /// split per row, then each group of eight dwords transposed across the rows; the
    /// 6-bit scales and mins unpacked per row (`k4_scale_min`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        let m4 = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        for j in 0..4 {
            let mut lo = [zero; PANEL8_ROWS];
            let mut hi = [zero; PANEL8_ROWS];
            for (r, row) in rows.iter().enumerate() {
                let q = load32u(&row[i].qs[32 * j..]);
                lo[r] = _mm256_and_si256(q, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            }
            o.put_dwords(16 * j, lo);
            o.put_dwords(16 * j + 8, hi);
        }
        o.put_k4_headers(
            rows.iter()
                .map(|row| (&row[i].scales, row[i].d, row[i].dmin)),
        );
    }

    /// Per block, per pair `j` of sub-blocks the exact integers `I_j = sc_2j·dot_2j +
    /// sc_2j+1·dot_2j+1` (each sub-block's eight dwords added as i16: at most 8 · 2 · 15
    /// · 128 = 30720 in magnitude) and `M_j = m_2j·bsum_2j + m_2j+1·bsum_2j+1`, then
    /// `acc = fma(I_j, d·d_a, acc)` and `mins = fma(M_j, dmin·d_a, mins)`; the result
    /// `acc - mins`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        let nb = panel.len();
        let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
        let mut acc = [_mm256_setzero_ps(); A];
        let mut accm = [_mm256_setzero_ps(); A];
        for (i, b) in panel.iter().enumerate() {
            let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
            let (d, dmin) = (lanes8_ps(&b.d), lanes8_ps(&b.dmin));
            let mut dd = [_mm256_setzero_ps(); A];
            let mut dm = [_mm256_setzero_ps(); A];
            for a in 0..A {
                let da = _mm256_set1_ps(yb[a].d);
                dd[a] = _mm256_mul_ps(d, da);
                dm[a] = _mm256_mul_ps(dmin, da);
            }
            for j in 0..4 {
                let lo = sum16::<8, A>(b, 16 * j, &yb);
                let hi = sum16::<8, A>(b, 16 * j + 8, &yb);
                let (s0, s1) = (lanes8(&b.sc[2 * j]), lanes8(&b.sc[2 * j + 1]));
                let (m0, m1) = (lanes8(&b.pairs[2 * j]), lanes8(&b.pairs[2 * j + 1]));
                for a in 0..A {
                    let isum = _mm256_add_epi32(
                        _mm256_madd_epi16(lo[a], s0),
                        _mm256_madd_epi16(hi[a], s1),
                    );
                    // bsums 4j, 4j + 1 belong to sub-block 2j; 4j + 2, 4j + 3 to 2j + 1.
                    let msum = _mm256_add_epi32(
                        _mm256_madd_epi16(m0, _mm256_set1_epi32(bsum_pair(yb[a], 2 * j))),
                        _mm256_madd_epi16(m1, _mm256_set1_epi32(bsum_pair(yb[a], 2 * j + 1))),
                    );
                    acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd[a], acc[a]);
                    accm[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), dm[a], accm[a]);
                }
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), _mm256_sub_ps(acc[a], accm[a])) };
        }
    }
}
