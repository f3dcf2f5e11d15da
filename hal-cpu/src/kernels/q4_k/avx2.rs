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

/// Q4_K x Q8_K, for at most four activation rows (`R`): each row's float chains in
/// its own lane of one 128-bit vector.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k<const R: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    assert!(R <= 4, "dot_q4k: at most four activation rows");
    let m4 = _mm256_set1_epi8(0x0F);
    // Lane r: activation row r's sums (lanes past R carry zeros).
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
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
        // Per row: [I_0, I_1, I_2, I_3] and [M_0, M_1, M_2, M_3] as floats (exact
        // integers), then transposed so that vector j holds I_j (M_j) of every row.
        let mut fi = [_mm_setzero_ps(); 4];
        let mut fm = [_mm_setzero_ps(); 4];
        let mut da = [0f32; 4];
        for r in 0..R {
            let yb = &y[r][i];
            // The four pairs' lanes summed (exact integers).
            let t01 = _mm256_hadd_epi32(v[r][0], v[r][1]);
            let t23 = _mm256_hadd_epi32(v[r][2], v[r][3]);
            let t = _mm256_hadd_epi32(t01, t23);
            let isum = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            // bs_s = bsums[2s] + bsums[2s+1] (at most 4096 in magnitude: an i16), then
            // the pairs of m_s·bs_s in one multiply-add.
            let b = load_bsums(yb);
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let msum = _mm_madd_epi16(mins, bs);
            (fi[r], fm[r]) = (_mm_cvtepi32_ps(isum), _mm_cvtepi32_ps(msum));
            da[r] = yb.d;
        }
        let fi = transpose4(fi);
        let fm = transpose4(fm);
        // d·d_a and dmin·d_a: one f32 product per row.
        // SAFETY: 4 readable f32; loadu is unaligned.
        let dav = unsafe { _mm_loadu_ps(da.as_ptr()) };
        let dd = _mm_mul_ps(_mm_shuffle_ps::<0x00>(ddm, ddm), dav);
        let dm = _mm_mul_ps(_mm_shuffle_ps::<0x55>(ddm, ddm), dav);
        // The chains in order j = 0..4, one fma per row and pair (each row in its lane).
        for j in 0..4 {
            acc = _mm_fmadd_ps(fi[j], dd, acc);
            accm = _mm_fmadd_ps(fm[j], dm, accm);
        }
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc, accm)) };
    out.copy_from_slice(&o[..R]);
}

/// The 4 x 4 transpose of f32 lanes: lane `r` of result `j` is lane `j` of `a[r]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose4(a: [__m128; 4]) -> [__m128; 4] {
    let t0 = _mm_unpacklo_ps(a[0], a[1]);
    let t1 = _mm_unpacklo_ps(a[2], a[3]);
    let t2 = _mm_unpackhi_ps(a[0], a[1]);
    let t3 = _mm_unpackhi_ps(a[2], a[3]);
    [
        _mm_movelh_ps(t0, t1),
        _mm_movehl_ps(t1, t0),
        _mm_movelh_ps(t2, t3),
        _mm_movehl_ps(t3, t2),
    ]
}
