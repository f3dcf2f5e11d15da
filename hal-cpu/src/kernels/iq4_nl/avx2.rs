//! IQ4_NL weights · Q8_0 activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them (`dot_iq4nl`, the tiles of
//! a batch), and four weight rows against one activation row (`dot_iq4nl_rows4`, the
//! decode matvec of this level). The caller must have checked AVX2, FMA and F16C at
//! device open.
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
use crate::kernels::x86::avx512::prefetch_stream_bytes;

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

/// Blocks ahead of the current group that [`dot_iq4nl_rows4`] prefetches each weight
/// row's stream (18-byte blocks), the group's 144 bytes each time, past the row's end
/// (as the AVX-512 VNNI kernel; 16 blocks streamed 22.4-22.7 GB/s on the 2-core Xeon
/// host's `lowbit` summary, 768 MiB, 2 threads; 64 blocks 26.0-26.1).
const PREFETCH_AHEAD: usize = 64;

/// `[0, 0, 0, 0, 4, 4, 4, 4]`: a block's 16 quant bytes broadcast to both 128-bit lanes,
/// shifted by this per dword and masked, give its 32 codes in element order.
#[inline]
#[target_feature(enable = "avx2")]
fn nibble_shift() -> __m256i {
    _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)
}

/// The 32 codes of a block in element order (low nibbles in the low 128-bit lane, high in
/// the high), from its quant bytes broadcast-loaded: one shift and one mask, where
/// [`nibbles`] takes a shift, an insert and a mask.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn nibbles_bcast(qs: &[u8; 16], shift: __m256i, m4: __m256i) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
    let q = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) });
    _mm256_and_si256(_mm256_srlv_epi32(q, shift), m4)
}

/// `sum_{e in 4l..4l+4} w[e] * a[e]` in i32 lane `l`, for code-book values `w`
/// (magnitudes at most 127) and any i8 activations `a`, given `aa = |a|` (as unsigned
/// bytes: 128 for -128): `|a|` times `w` with `a`'s sign, summed in pairs by
/// `vpmaddubsw` (at most 2 x 128 x 127 in magnitude: no saturation), then in fours.
/// The activation's magnitude is shared by every weight row that meets it, so a row
/// costs one sign, where [`signed_lanes`] takes two.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn book_lanes(w: __m256i, a: __m256i, aa: __m256i) -> __m256i {
    let sw = _mm256_sign_epi8(w, a);
    _mm256_madd_epi16(_mm256_maddubs_epi16(aa, sw), _mm256_set1_epi16(1))
}

/// The f16 `d` of four rows' block `i` and `j` as eight f32: lanes 0..4 block `i` of
/// rows 0..4, lanes 4..8 block `j`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn d_pair(x: &[&[BlockIQ4NL]; 4], i: usize, j: usize) -> __m256 {
    let h = |r: usize, b: usize| x[r][b].d as i16;
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0, i),
        h(1, i),
        h(2, i),
        h(3, i),
        h(0, j),
        h(1, j),
        h(2, j),
        h(3, j),
    ))
}

/// Four IQ4_NL weight rows (`x`, each `y.len()` blocks) · one Q8_0 activation row: `out[r]`
/// is row `r`'s dot product, bit for bit [`dot_iq4nl`]`::<1>` of that row (and so the
/// scalar reference's), the decode kernel of this level. The four rows' chains run in
/// the lanes of one vector; per group of eight blocks the 32 (row, block) integers come
/// from four reductions of eight vectors, each holding two blocks of the four rows in
/// the layout of their scales ([`d_pair`]), so that the products are formed eight at a
/// time and added to the chains block by block. The caller passes rows far apart
/// (each stream is prefetched [`PREFETCH_AHEAD`] blocks ahead, past the row's end).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4nl_rows4(x: [&[BlockIQ4NL]; 4], y: &[BlockQ8_0], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_iq4nl_rows4: lengths");
    }
    let lut = codebook(&KVALUES_IQ4NL);
    let m4 = _mm256_set1_epi8(0x0F);
    let shift = nibble_shift();
    // The S of (row r, block i) as i32 lanes of vector 4h + r, for the pair's block h.
    let lanes = |i: usize, a: __m256i, aa: __m256i, v: &mut [__m256i], h: usize| {
        for r in 0..4 {
            let w = _mm256_shuffle_epi8(lut, nibbles_bcast(&x[r][i].qs, shift, m4));
            v[4 * h + r] = book_lanes(w, a, aa);
        }
    };
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        for xs in &x {
            prefetch_stream_bytes(
                xs,
                b + PREFETCH_AHEAD,
                8 * std::mem::size_of::<BlockIQ4NL>(),
            );
        }
        let dy = f16x8(std::array::from_fn(|j| y[b + j].d));
        for p in 0..4 {
            let mut v = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let i = b + 2 * p + h;
                let a = load32i(&y[i].qs);
                lanes(i, a, _mm256_abs_epi8(a), &mut v, h);
            }
            // Lanes 0..4: S of block 2p's rows, 4..8: block 2p + 1's.
            let s = reduce8(v);
            let dyp = _mm256_permutevar8x32_ps(
                dy,
                _mm256_setr_epi32(
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                ),
            );
            let d = _mm256_mul_ps(dyp, d_pair(&x, b + 2 * p, b + 2 * p + 1));
            let prod = _mm256_mul_ps(d, _mm256_cvtepi32_ps(s));
            acc = _mm_add_ps(acc, _mm256_castps256_ps128(prod));
            acc = _mm_add_ps(acc, _mm256_extractf128_ps::<1>(prod));
        }
        b += 8;
    }
    // The last `nb % 8` blocks one at a time, in the same order.
    for i in b..nb {
        let a = load32i(&y[i].qs);
        let mut v = [_mm256_setzero_si256(); 8];
        lanes(i, a, _mm256_abs_epi8(a), &mut v, 0);
        let s = _mm256_castsi256_si128(reduce8(v));
        let d = _mm_mul_ps(
            _mm_set1_ps(f16c_to_f32(y[i].d)),
            _mm256_castps256_ps128(d_pair(&x, i, i)),
        );
        acc = _mm_add_ps(acc, _mm_mul_ps(d, _mm_cvtepi32_ps(s)));
    }
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
}

/// One IQ4_NL row · one Q8_0 row in the same order: the rows of a chunk left over beside
/// [`dot_iq4nl_rows4`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_iq4nl_row(x: [&[BlockIQ4NL]; 1], y: &[BlockQ8_0], out: &mut [f32; 1]) {
    dot_iq4nl::<1>(x[0], &[y], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_tiles_match_reference, avx2_available, check_iq4nl_rows4_extremes,
        check_rows4_random, iq4_nl_weights, q8_0_acts, seed,
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

    /// The four-row kernel: four random rows against one activation row, at lengths
    /// around its groups of eight blocks.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        if !avx2_available() {
            eprintln!("no AVX2: IQ4_NL rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "iq4_nl avx2 rows4",
            GgmlType::IQ4_NL,
            dot_iq4nl_rows4,
            iq4_nl_weights,
            q8_0_acts,
            32,
            &[1, 2, 3, 7, 8, 9, 16, 17, 128],
            8,
        );
    }

    /// The four-row kernel at the code book's extremes.
    #[test]
    fn rows4_extremes_equal_the_scalar_reference() {
        if !avx2_available() {
            eprintln!("no AVX2: IQ4_NL rows4 kernel not exercised");
            return;
        }
        check_iq4nl_rows4_extremes("iq4_nl avx2 rows4 extremes", dot_iq4nl_rows4);
    }
}
