//! IQ4_XS weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them. The caller must have
//! checked AVX2, FMA and F16C at device open.
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_iq4_xs_q8_K`), bit for bit: per 32-element sub-block `ib` of each
//! 256-element block, the exact integer sum `S_ib` of the code-book values times the
//! activation quants, then `sum = sum + ((d_w * d_a) * (ls_ib - 32)) * S_ib` in block and
//! sub-block order, `f32` products and one `f32` add per sub-block (no `fma`), from
//! `sum = 0`. The eight `S_ib` of a block come from one reduction (`reduce8`), their
//! products from one vector (the same roundings lane by lane), added in order.
//! llama.cpp's AVX2 kernel (two `fma` accumulators of eight lanes) sums in another order.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4XS, BlockQ8K};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::x86::avx2::{
    add_in_order, codebook, f16c_to_f32, load32i, nibbles, reduce8, signed_lanes,
};

/// The eight 6-bit sub-block scales of a block, less 32, as f32 (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn sub_scales(b: &BlockIQ4XS) -> __m256 {
    // Sub-block ib: bits 4ib..4ib+4 of the four `scales_l` bytes (little-endian), above
    // them bits 2ib..2ib+2 of `scales_h`.
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(u32::from_le_bytes(b.scales_l) as i32),
            _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        ),
        _mm256_set1_epi32(0x0F),
    );
    let high = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(b.scales_h as i32),
            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
        ),
        _mm256_set1_epi32(3),
    );
    let ls = _mm256_or_si256(low, _mm256_slli_epi32::<4>(high));
    _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))
}

/// IQ4_XS x Q8_K (activation quants in -127..=127, as every Flint quantizer writes them).
///
/// # Panics
/// If an activation row is shorter than the weight row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4xs<const R: usize>(
    x: &[BlockIQ4XS],
    y: &[&[BlockQ8K]; R],
    out: &mut [f32; R],
) {
    let nb = x.len();
    for yr in y {
        assert!(yr.len() >= nb, "iq4_xs: short activation row");
    }
    let lut = codebook(&KVALUES_IQ4NL);
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        let (qs, _) = b.qs.as_chunks::<16>();
        let v: [__m256i; 8] = std::array::from_fn(|ib| _mm256_shuffle_epi8(lut, nibbles(&qs[ib])));
        let av = v.map(|q| _mm256_sign_epi8(q, q));
        let ls = sub_scales(b);
        let dw = f16c_to_f32(b.d);
        for r in 0..R {
            let yb = &y[r][i];
            let sums = reduce8(std::array::from_fn(|ib| {
                signed_lanes(v[ib], av[ib], load32i(&yb.qs[32 * ib..]))
            }));
            let d = _mm256_mul_ps(_mm256_set1_ps(dw * yb.d), ls);
            add_in_order(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)), &mut acc[r]);
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_tiles_match_reference, iq4_xs_weights, q8k_acts, seed,
    };

    use flint_core::GgmlType;

    /// Every tile size equals the scalar reference bit for bit.
    #[test]
    fn equals_the_scalar_reference_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2: IQ4_XS kernel not exercised");
            return;
        }
        let mut s = seed("iq4_xs");
        for nb in [1, 2, 3, 5, 11] {
            for _ in 0..8 {
                let w = iq4_xs_weights(nb, &mut s);
                let ys: Vec<Vec<BlockQ8K>> = (0..4).map(|_| q8k_acts(nb, &mut s)).collect();
                assert_tiles_match_reference!(GgmlType::IQ4_XS, dot_iq4xs, &w, &ys, nb * 256);
            }
        }
    }
}
