//! IQ4_NL weights · Q8_0 activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them. The caller must have
//! checked AVX2, FMA and F16C at device open.
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_iq4_nl_q8_0`), bit for bit: per 32-element block the exact integer sum
//! `S` of the code-book values times the activation quants, then
//! `sum = sum + (d_a * d_w) * S` in block order, one `f32` product and one `f32` add (no
//! `fma`), from `sum = 0`. Only `S` is computed in SIMD (exactly: the code book's
//! magnitudes are at most 127, the activation quants in -127..=127); the products of
//! eight blocks are formed in one vector (the same roundings lane by lane) and added in
//! block order. llama.cpp's own AVX2 kernel (two sets of eight `fma` lanes) and its
//! repacked `iq4_nl_4x4` path sum in other orders.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4NL, BlockQ8_0};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::x86::avx2::{
    add_in_order, codebook, f16c_to_f32, f16x8, hsum8_i32, load32i, nibbles, reduce8, signed_lanes,
};

/// IQ4_NL x Q8_0 (activation quants in -127..=127, as every Flint quantizer writes them).
///
/// # Panics
/// If an activation row is shorter than the weight row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4nl<const R: usize>(
    x: &[BlockIQ4NL],
    y: &[&[BlockQ8_0]; R],
    out: &mut [f32; R],
) {
    let nb = x.len();
    for yr in y {
        assert!(yr.len() >= nb, "iq4_nl: short activation row");
    }
    let lut = codebook(&KVALUES_IQ4NL);
    let mut acc = [0f32; R];
    let mut b = 0;
    while b + 8 <= nb {
        let xw = &x[b..b + 8];
        let v: [__m256i; 8] = std::array::from_fn(|j| _mm256_shuffle_epi8(lut, nibbles(&xw[j].qs)));
        let av = v.map(|q| _mm256_sign_epi8(q, q));
        let dw = f16x8(std::array::from_fn(|j| xw[j].d));
        for r in 0..R {
            let yw = &y[r][b..b + 8];
            let sums = reduce8(std::array::from_fn(|j| {
                signed_lanes(v[j], av[j], load32i(&yw[j].qs))
            }));
            let d = _mm256_mul_ps(f16x8(std::array::from_fn(|j| yw[j].d)), dw);
            add_in_order(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)), &mut acc[r]);
        }
        b += 8;
    }
    for (xb, i) in x[b..].iter().zip(b..) {
        let v = _mm256_shuffle_epi8(lut, nibbles(&xb.qs));
        let av = _mm256_sign_epi8(v, v);
        let dw = f16c_to_f32(xb.d);
        for r in 0..R {
            let yb = &y[r][i];
            let s = hsum8_i32(signed_lanes(v, av, load32i(&yb.qs)));
            acc[r] += (f16c_to_f32(yb.d) * dw) * s as f32;
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_tiles_match_reference, iq4_nl_weights, q8_0_acts, seed,
    };

    use flint_core::GgmlType;

    /// Every tile size equals the scalar reference bit for bit, at lengths around the
    /// kernel's groups of eight blocks.
    #[test]
    fn equals_the_scalar_reference_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2: IQ4_NL kernel not exercised");
            return;
        }
        let mut s = seed("iq4_nl");
        for nb in [1, 3, 7, 8, 9, 15, 17, 33] {
            for _ in 0..5 {
                let w = iq4_nl_weights(nb, &mut s);
                let ys: Vec<Vec<BlockQ8_0>> = (0..4).map(|_| q8_0_acts(nb, &mut s)).collect();
                assert_tiles_match_reference!(GgmlType::IQ4_NL, dot_iq4nl, &w, &ys, nb * 32);
            }
        }
    }
}
