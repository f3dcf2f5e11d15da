//! IQ4_XS weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them (`dot_iq4xs`, the tiles of
//! a batch), and four weight rows against one activation row (`dot_iq4xs_rows4`, the
//! decode matvec of this level). The caller must have checked AVX2, FMA and F16C at
//! device open.
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

use crate::kernels::iq4_nl::avx2::{book_lanes, nibbles_bcast};
use crate::kernels::x86::avx2::{
    add_in_order, codebook, f16c_to_f32, load32i, nibbles, reduce8, signed_lanes,
};
use crate::kernels::x86::avx512::prefetch_stream;

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

/// Blocks ahead of the current one that [`dot_iq4xs_rows4`] prefetches each weight row's
/// stream (136-byte blocks), past the row's end (as the AVX-512 VNNI kernel).
const PREFETCH_AHEAD: usize = 8;

/// The 4 x 8 transpose of four rows' sub-block scales (`ls[r]` lane `ib`): result `k`
/// holds sub-block `k` of rows 0..4 in lanes 0..4 and sub-block `k + 4` in lanes 4..8.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pairs(ls: [__m256; 4]) -> [__m256; 4] {
    let t0 = _mm256_unpacklo_ps(ls[0], ls[1]);
    let t1 = _mm256_unpacklo_ps(ls[2], ls[3]);
    let t2 = _mm256_unpackhi_ps(ls[0], ls[1]);
    let t3 = _mm256_unpackhi_ps(ls[2], ls[3]);
    [
        _mm256_shuffle_ps::<0x44>(t0, t1),
        _mm256_shuffle_ps::<0xEE>(t0, t1),
        _mm256_shuffle_ps::<0x44>(t2, t3),
        _mm256_shuffle_ps::<0xEE>(t2, t3),
    ]
}

/// Four IQ4_XS weight rows (`x`, each `y.len()` blocks) · one Q8_K activation row:
/// `out[r]` is row `r`'s dot product, bit for bit [`dot_iq4xs`]`::<1>` of that row (and
/// so the scalar reference's), the decode kernel of this level. Per block, sub-blocks
/// `k` and `k + 4` of the four rows are reduced together into one vector laid out as
/// their scales ([`scale_pairs`]), their products formed eight at a time, and the four
/// rows' chains (the lanes of one vector) take sub-blocks 0..8 in order. The caller
/// passes rows far apart (each stream is prefetched [`PREFETCH_AHEAD`] blocks ahead).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4xs_rows4(x: [&[BlockIQ4XS]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_iq4xs_rows4: lengths");
    }
    let lut = codebook(&KVALUES_IQ4NL);
    let m4 = _mm256_set1_epi8(0x0F);
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        let b: [&BlockIQ4XS; 4] = std::array::from_fn(|r| &x[r][i]);
        // d_w * d_a of the four rows, in both 128-bit lanes.
        let dw = _mm_cvtph_ps(_mm_setr_epi16(
            b[0].d as i16,
            b[1].d as i16,
            b[2].d as i16,
            b[3].d as i16,
            0,
            0,
            0,
            0,
        ));
        let dwa = _mm_mul_ps(dw, _mm_set1_ps(yb.d));
        let dwa = _mm256_set_m128(dwa, dwa);
        let ls = scale_pairs(b.map(|b| sub_scales(b)));
        let mut prod = [_mm256_setzero_ps(); 4];
        for (k, p) in prod.iter_mut().enumerate() {
            let mut v = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let ib = k + 4 * h;
                let a = load32i(&yb.qs[32 * ib..]);
                let aa = _mm256_abs_epi8(a);
                for r in 0..4 {
                    let (qs, _) = b[r].qs.as_chunks::<16>();
                    let w = _mm256_shuffle_epi8(lut, nibbles_bcast(&qs[ib], shift, m4));
                    v[4 * h + r] = book_lanes(w, a, aa);
                }
            }
            // Lanes 0..4: S of sub-block k of rows 0..4; 4..8: of sub-block k + 4.
            let s = reduce8(v);
            *p = _mm256_mul_ps(_mm256_mul_ps(dwa, ls[k]), _mm256_cvtepi32_ps(s));
        }
        for p in prod {
            acc = _mm_add_ps(acc, _mm256_castps256_ps128(p));
        }
        for p in prod {
            acc = _mm_add_ps(acc, _mm256_extractf128_ps::<1>(p));
        }
    }
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
}

/// One IQ4_XS row · one Q8_K row in the same order: the rows of a chunk left over beside
/// [`dot_iq4xs_rows4`] (and the AVX-512 VNNI four-row kernel).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4xs_row(x: [&[BlockIQ4XS]; 1], y: &[BlockQ8K], out: &mut [f32; 1]) {
    dot_iq4xs::<1>(x[0], &[y], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_tiles_match_reference, avx2_available, check_rows4_random, iq4_xs_weights, q8k_acts,
        seed,
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

    /// The four-row kernel: four random rows against one activation row.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        if !avx2_available() {
            eprintln!("no AVX2: IQ4_XS rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "iq4_xs avx2 rows4",
            GgmlType::IQ4_XS,
            dot_iq4xs_rows4,
            iq4_xs_weights,
            q8k_acts,
            256,
            &[1, 2, 3, 5, 11, 16],
            16,
        );
    }
}
