//! Q5_K weights · Q8_K activations on AVX2 (the tile shape and contract of
//! `q4_k/avx2.rs`), in the order of llama.cpp's tiled K-quant matmul with mins (the
//! AVX-512 VNNI kernels', `flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`): per block
//! the exact integers `S = sum_j sc_j * dot_j` and `M = sum_j m_j * bsum_j`, then
//! `r = fma(-dmin, M, S * d)` and `acc = fma(r, d_a, acc)`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5K, BlockQ8K};

use crate::kernels::x86::avx2::{
    bcast16, head16, hsum8_i32, k4_header, k4_mins_dup, load32, load32i, load32u, load_bsums,
};

/// Q5_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        let d = _mm_cvtss_f32(ddm);
        let dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
        let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
        let mins = k4_mins_dup(u);
        let hbits = load32(&b.qh);
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let (h_lo, h_hi) = q5k_high(hbits, j);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
            let s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j)));
            let s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j + 1)));
            for r in 0..R {
                let yq = &y[r][i].qs;
                let ya = load32i(&yq[64 * j..]);
                let yb = load32i(&yq[64 * j + 32..]);
                let pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ya), s_lo);
                let pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yb), s_hi);
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pa, pb));
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            let s = hsum8_i32(sumi[r]);
            let m = hsum8_i32(_mm256_madd_epi16(load_bsums(yb), mins));
            acc[r] = tiled_step(acc[r], s, m, d, dmin, yb.d);
        }
    }
    *out = acc;
}

/// One block of the tiled order with mins: `r = fma(-dmin, M, S * d)`, then
/// `fma(r, d_a, acc)` (`flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`'s step), for
/// the block's exact integers `s` and `m`. Shared by this level's kernel and `vnni.rs`.
#[inline(always)]
pub(crate) fn tiled_step(acc: f32, s: i32, m: i32, d: f32, dmin: f32, d_a: f32) -> f32 {
    (-dmin).mul_add(m as f32, s as f32 * d).mul_add(d_a, acc)
}

/// The fifth bits of the 64 quants `64j .. 64j+64` of a Q5_K block as 0x10 bytes: bit 2j
/// of `qh[l]` belongs to element `64j + l`, bit 2j+1 to `64j + 32 + l`. (A 16-bit shift
/// by < 8 keeps bit 0 of every byte inside that byte.)
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q5k_high(hbits: __m256i, j: usize) -> (__m256i, __m256i) {
    let (h_lo, h_hi) = match j {
        0 => (hbits, _mm256_srli_epi16::<1>(hbits)),
        1 => (_mm256_srli_epi16::<2>(hbits), _mm256_srli_epi16::<3>(hbits)),
        2 => (_mm256_srli_epi16::<4>(hbits), _mm256_srli_epi16::<5>(hbits)),
        _ => (_mm256_srli_epi16::<6>(hbits), _mm256_srli_epi16::<7>(hbits)),
    };
    let one = _mm256_set1_epi8(1);
    (
        _mm256_slli_epi16::<4>(_mm256_and_si256(h_lo, one)),
        _mm256_slli_epi16::<4>(_mm256_and_si256(h_hi, one)),
    )
}
