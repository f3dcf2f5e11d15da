//! Q2_K weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them. The caller must have
//! checked AVX2, FMA and F16C at device open.
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_q2_K_q8_K`), bit for bit: per 256-element block the exact integers
//! `I = sum_c sc_c * dot_c` (the sixteen 16-element groups, 4-bit scales) and
//! `M = sum_c m_c * bsum_c` (4-bit mins, the activation's group sums), then
//! `sum = sum + ((d_a * d_w) * I - (d_a * dmin_w) * M)` in block order, plain `f32`
//! products, difference and add (no `fma`), from `sum = 0`. Only `I` and `M` are
//! computed in SIMD (exactly). llama.cpp's AVX2 kernel (`fma` into eight lanes) and its
//! repacked `q2_K_8x8` path sum in other orders.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ2K, BlockQ8K};

use crate::kernels::x86::avx2::{f16c_to_f32, hsum8_i32, load32i, load32u, load_bsums};

/// Q2_K x Q8_K.
///
/// # Panics
/// If an activation row is shorter than the weight row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q2k<const R: usize>(x: &[BlockQ2K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let nb = x.len();
    for yr in y {
        assert!(yr.len() >= nb, "q2_k: short activation row");
    }
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0F);
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
        let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc8), m4));
        let scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m4));
        // Run m = 4k + j of 32 elements (128k + 32j + l: bits 2j of qs[32k + l]), groups
        // 2m (low 128 bits) and 2m + 1 (high): their scales as i16 in each half.
        let q0 = load32u(&b.qs[..32]);
        let q1 = load32u(&b.qs[32..]);
        let q: [__m256i; 8] = [
            _mm256_and_si256(q0, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(q0), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q0), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(q0), m3),
            _mm256_and_si256(q1, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(q1), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(q1), m3),
        ];
        let s: [__m256i; 8] = std::array::from_fn(|m| {
            // Bytes 2m (low half) and 2m + 1 (high half) of the scales, zero-extended.
            let lo = ((0x80 << 8) | (2 * m)) as i16;
            let hi = ((0x80 << 8) | (2 * m + 1)) as i16;
            _mm256_shuffle_epi8(
                scales,
                _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)),
            )
        });
        let dw = f16c_to_f32(b.d);
        let dmw = f16c_to_f32(b.dmin);
        for r in 0..R {
            let yb = &y[r][i];
            let mut sumi = _mm256_setzero_si256();
            for m in 0..8 {
                let p = _mm256_maddubs_epi16(q[m], load32i(&yb.qs[32 * m..]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s[m]));
            }
            let isum = hsum8_i32(sumi);
            let summs = hsum8_i32(_mm256_madd_epi16(load_bsums(yb), mins));
            let dall = yb.d * dw;
            let dmin = yb.d * dmw;
            acc[r] += dall * isum as f32 - dmin * summs as f32;
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{assert_tiles_match_reference, q2_k_weights, q8k_acts, seed};

    use flint_core::GgmlType;

    /// Every tile size equals the scalar reference bit for bit.
    #[test]
    fn equals_the_scalar_reference_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2: Q2_K kernel not exercised");
            return;
        }
        let mut s = seed("q2_k");
        for nb in [1, 2, 3, 5, 11] {
            for _ in 0..8 {
                let w = q2_k_weights(nb, &mut s);
                let ys: Vec<Vec<BlockQ8K>> = (0..4).map(|_| q8k_acts(nb, &mut s)).collect();
                assert_tiles_match_reference!(GgmlType::Q2_K, dot_q2k, &w, &ys, nb * 256);
            }
        }
    }
}
