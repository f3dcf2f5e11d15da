//! Q3_K weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them. The caller must have
//! checked AVX2, FMA and F16C at device open.
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_q3_K_q8_K`), bit for bit. Eight `f32` lane sums run across the blocks,
//! lane `l` taking the elements `e` with `e mod 8 == l`: per 256-element block the exact
//! integer `A_l = sum_{e mod 8 == l} sc_{e/16} * q_e * a_e` (`q_e` in -4..=3, the 6-bit
//! scales less 32), then `lane_l = lane_l + (d_w * d_a) * A_l` (a product and an add, no
//! `fma`); at the end `((0 + lane_0) + lane_1) + ... + lane_7`. llama.cpp's AVX2 kernel
//! (one `fma` per block into eight lanes that mix the elements differently, then a
//! horizontal sum) sums in another order.
//!
//! To keep each `A_l` in its own i32 lane, the 32 bytes of a run of elements (groups `A`
//! and `B` of 16, with their two scales) are transposed ([`lanes_of_8`]) so that i32
//! lane `l` holds elements `l, l + 8` of `A` and `l, l + 8` of `B`: `vpmaddubsw` then adds
//! the two of each group, and `vpmaddwd` weights them by the group's scale and adds the
//! two groups. Weights and activations take the same transposition.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ3K, BlockQ8K};

use crate::kernels::x86::avx2::{f16c_to_f32, load32i, load32u};

/// The 32 bytes `v` reordered so that i32 lane `l` holds bytes `l, l + 8, l + 16,
/// l + 24`: dwords 0, 2, 4, 6 (bytes 0..4, 8..12, 16..20, 24..28) to the low 128-bit half
/// and 1, 3, 5, 7 to the high one, then a 4x4 byte transposition within each half.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_of_8(v: __m256i) -> __m256i {
    let d = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    let t = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm256_shuffle_epi8(d, _mm256_broadcastsi128_si256(t))
}

/// The sixteen 6-bit scales of a block less 32, as i16 (ggml's unpacking of the 12
/// bytes: low nibbles from bytes 0..8, two high bits from bytes 8..12).
#[inline]
#[target_feature(enable = "avx2")]
fn scales16(s: &[u8; 12]) -> __m256i {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let v = _mm_setr_epi32(
        ((a0 & k2) | ((a2 & k1) << 4)) as i32,
        ((a1 & k2) | (((a2 >> 2) & k1) << 4)) as i32,
        (((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4)) as i32,
        (((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4)) as i32,
    );
    _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32))
}

/// Q3_K x Q8_K (activation quants in -127..=127, as every Flint quantizer writes them).
///
/// # Panics
/// If an activation row is shorter than the weight row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q3k<const R: usize>(x: &[BlockQ3K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let nb = x.len();
    for yr in y {
        assert!(yr.len() >= nb, "q3_k: short activation row");
    }
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let four = _mm256_set1_epi8(4);
    let mut lanes = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let sc = scales16(&b.scales);
        let h = lanes_of_8(load32u(&b.hmask));
        let qs = [
            lanes_of_8(load32u(&b.qs[..32])),
            lanes_of_8(load32u(&b.qs[32..])),
        ];
        // Run m = 4j + s of 32 elements (128j + 32s + l): low bits 2s of qs[32j + l],
        // high bit 4j + s of hmask[l] (clear: less 4); groups 2m and 2m + 1.
        let mut w = [_mm256_setzero_si256(); 8];
        let mut aw = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for m in 0..8 {
            let (j, sh) = (m / 4, m % 4);
            let low = _mm256_and_si256(
                _mm256_srl_epi16(qs[j], _mm_cvtsi32_si128(2 * sh as i32)),
                m3,
            );
            let hb = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(m as i32)), one);
            let q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16::<2>(hb)), four);
            w[m] = q;
            aw[m] = _mm256_sign_epi8(q, q);
            // Scales 2m and 2m + 1 (one dword of `sc`) in every dword.
            s[m] = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(m as i32));
        }
        let dw = f16c_to_f32(b.d);
        for r in 0..R {
            let yb = &y[r][i];
            let mut sumi = _mm256_setzero_si256();
            for m in 0..8 {
                let a = _mm256_sign_epi8(lanes_of_8(load32i(&yb.qs[32 * m..])), w[m]);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[m], a), s[m]);
                sumi = _mm256_add_epi32(sumi, p);
            }
            let d = _mm256_set1_ps(dw * yb.d);
            lanes[r] = _mm256_add_ps(lanes[r], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        }
    }
    for r in 0..R {
        let mut f = [0f32; 8];
        // SAFETY: `f` is 8 writable f32; storeu is unaligned.
        unsafe { _mm256_storeu_ps(f.as_mut_ptr(), lanes[r]) };
        out[r] = f.iter().fold(0.0f32, |s, &v| s + v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{assert_tiles_match_reference, q3_k_weights, q8k_acts, seed};

    use flint_core::GgmlType;

    /// Every tile size equals the scalar reference bit for bit.
    #[test]
    fn equals_the_scalar_reference_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2: Q3_K kernel not exercised");
            return;
        }
        let mut s = seed("q3_k");
        for nb in [1, 2, 3, 5, 11] {
            for _ in 0..8 {
                let w = q3_k_weights(nb, &mut s);
                let ys: Vec<Vec<BlockQ8K>> = (0..4).map(|_| q8k_acts(nb, &mut s)).collect();
                assert_tiles_match_reference!(GgmlType::Q3_K, dot_q3k, &w, &ys, nb * 256);
            }
        }
    }
}
