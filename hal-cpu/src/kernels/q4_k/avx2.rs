//! Q4_K weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, decoding every weight block once for all `R` rows (the batched tile
//! of M > 1). The caller must have checked AVX2, FMA and F16C at device open.
//!
//! The float steps are those of llama.cpp's repacked Q4_K gemm (`q4_K_8x8`, the AVX-512
//! VNNI kernels' order, `flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_repack` with
//! `Q4kPath::Gemm`, docs/parity.md): per pair `j` of 32-quant sub-blocks the exact
//! integers `I_j = sc_2j·dot_2j + sc_2j+1·dot_2j+1` and `M_j = m_2j·bs_2j +
//! m_2j+1·bs_2j+1`, then `acc = fma(I_j, d·d_a, acc)` and `mins = fma(M_j, dmin·d_a,
//! mins)`, the result `acc - mins`. So every SIMD level computes the same bits, and a
//! CPU without AVX-512 VNNI reproduces llama.cpp's logits as one with it does.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::x86::avx2::{bcast16, head16, k4_header, load32i, load32u, load_bsums};

/// Q4_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k<const R: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm_setzero_ps(); R];
    let mut accm = [_mm_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        // The eight scales as i16 in both 128-bit lanes (for the per-sub-block shuffles),
        // the eight mins as i16.
        let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
        let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(u, u));
        // Per row and pair j: eight i32 lanes that sum to I_j.
        let mut v = [[_mm256_setzero_si256(); 4]; R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j)));
            let s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j + 1)));
            for r in 0..R {
                let yq = &y[r][i].qs;
                let ya = load32i(&yq[64 * j..]);
                let yb = load32i(&yq[64 * j + 32..]);
                let pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ya), s_lo);
                let pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yb), s_hi);
                v[r][j] = _mm256_add_epi32(pa, pb);
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            // [I_0, I_1, I_2, I_3]: the four pairs' lanes summed (exact integers).
            let t01 = _mm256_hadd_epi32(v[r][0], v[r][1]);
            let t23 = _mm256_hadd_epi32(v[r][2], v[r][3]);
            let t = _mm256_hadd_epi32(t01, t23);
            let isum = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            // bs_s = bsums[2s] + bsums[2s+1] (at most 4096 in magnitude: an i16), then
            // [M_0, M_1, M_2, M_3] = the pairs of m_s·bs_s in one multiply-add.
            let b = load_bsums(yb);
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let msum = _mm_madd_epi16(mins, bs);
            let (fi, fm) = (_mm_cvtepi32_ps(isum), _mm_cvtepi32_ps(msum));
            // d·d_a and dmin·d_a: one f32 product each, in lane 0 (the lane `fma_ss` reads).
            let dd = _mm_mul_ps(ddm, _mm_set1_ps(yb.d));
            let dm = _mm_movehdup_ps(dd);
            // The chains in order j = 0..4, each a single-lane fma (lane 0 carries).
            acc[r] = _mm_fmadd_ss(fi, dd, acc[r]);
            accm[r] = _mm_fmadd_ss(fm, dm, accm[r]);
            acc[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0x55>(fi, fi), dd, acc[r]);
            accm[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0x55>(fm, fm), dm, accm[r]);
            acc[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0xAA>(fi, fi), dd, acc[r]);
            accm[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0xAA>(fm, fm), dm, accm[r]);
            acc[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0xFF>(fi, fi), dd, acc[r]);
            accm[r] = _mm_fmadd_ss(_mm_shuffle_ps::<0xFF>(fm, fm), dm, accm[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm_cvtss_f32(_mm_sub_ss(acc[r], accm[r]));
    }
}
