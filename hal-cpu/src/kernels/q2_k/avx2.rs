//! Q2_K weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them (`dot_q2k`, the tiles of
//! a batch), and four weight rows against one activation row (`dot_q2k_rows4`, the
//! decode matvec of this level). The caller must have checked AVX2, FMA and F16C at
//! device open.
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

use crate::kernels::x86::avx2::{f16c_to_f32, hsum8_i32, load32i, load32u, load_bsums, reduce8};
use crate::kernels::x86::avx512::prefetch_stream;

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

/// Blocks ahead of the current one that [`dot_q2k_rows4`] prefetches each weight row's
/// stream (84-byte blocks), past the row's end (as the AVX-512 VNNI kernel).
const PREFETCH_AHEAD: usize = 12;

/// `vpshufb` controls of run `m` (see [`dot_q2k`]): scale byte `2m` zero-extended into
/// every i16 lane of the low 128-bit half, byte `2m + 1` into the high half.
const RUN_SCALES: [[i8; 32]; 8] = {
    let mut t = [[0i8; 32]; 8];
    let mut m = 0;
    while m < 8 {
        let mut b = 0;
        while b < 16 {
            let (lo, hi) = if b % 2 == 0 {
                ((2 * m) as i8, (2 * m + 1) as i8)
            } else {
                (-128, -128)
            };
            t[m][b] = lo;
            t[m][16 + b] = hi;
            b += 1;
        }
        m += 1;
    }
    t
};

/// Four Q2_K weight rows (`x`, each `y.len()` blocks) · one Q8_K activation row: `out[r]`
/// is row `r`'s dot product, bit for bit [`dot_q2k`]`::<1>` of that row (and so the
/// scalar reference's), the decode kernel of this level.
///
/// Per row and block: the 2-bit planes `j` = 1 and 3 are taken as `4q` (masked in place,
/// unshifted) and planes 0 and 2 weighted by their scales times 4, so that every run adds
/// `4 sc dot` (one shift and four masks decode 32 bytes); the mins against the block sums
/// in one `vpmaddwd`. The four rows' `4I` and `M` lanes are reduced together
/// ([`reduce8`]), `4I` shifted down (exact), and the float steps run in the lanes of one
/// vector, one row per lane. The caller passes rows far apart (each stream is
/// prefetched [`PREFETCH_AHEAD`] blocks ahead, past the row's end).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q2k_rows4(x: [&[BlockQ2K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q2k_rows4: lengths");
    }
    let m3 = _mm256_set1_epi8(3);
    let m12 = _mm256_set1_epi8(12);
    let m4 = _mm_set1_epi8(0x0F);
    let down = _mm256_setr_epi32(2, 2, 2, 2, 0, 0, 0, 0);
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        let bs = load_bsums(yb);
        let mut v = [_mm256_setzero_si256(); 8];
        for r in 0..4 {
            let b = &x[r][i];
            // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
            let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc8), m4));
            let s1 = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m4));
            // Each scale at most 15: times 4 stays in its byte.
            let s4 = _mm256_slli_epi16::<2>(s1);
            let mut sumi = _mm256_setzero_si256();
            for k in 0..2 {
                let q = load32u(&b.qs[32 * k..]);
                let q4 = _mm256_srli_epi16::<4>(q);
                // Planes 0..4 of this half: q, 4q, q, 4q.
                let planes = [
                    _mm256_and_si256(q, m3),
                    _mm256_and_si256(q, m12),
                    _mm256_and_si256(q4, m3),
                    _mm256_and_si256(q4, m12),
                ];
                for (j, plane) in planes.into_iter().enumerate() {
                    let m = 4 * k + j;
                    // SAFETY: 32 readable bytes; loadu is unaligned.
                    let ctl =
                        unsafe { _mm256_loadu_si256(RUN_SCALES[m].as_ptr() as *const __m256i) };
                    let sc = _mm256_shuffle_epi8(if j % 2 == 0 { s4 } else { s1 }, ctl);
                    let p = _mm256_maddubs_epi16(plane, load32i(&yb.qs[32 * m..]));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
                }
            }
            v[r] = sumi;
            v[4 + r] = _mm256_madd_epi16(bs, mins);
        }
        // [I_0..I_3 | M_0..M_3] (4I shifted down: exact).
        let im = _mm256_cvtepi32_ps(_mm256_srav_epi32(reduce8(v), down));
        let h = |r: usize| x[r][i].d as i16;
        let hm = |r: usize| x[r][i].dmin as i16;
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            hm(0),
            hm(1),
            hm(2),
            hm(3),
        ));
        // [dall_r * I_r | dmin_r * M_r].
        let p = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(yb.d), dw), im);
        let t = _mm_sub_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps::<1>(p));
        acc = _mm_add_ps(acc, t);
    }
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
}

/// One Q2_K row · one Q8_K row in the same order: the rows of a chunk left over beside
/// [`dot_q2k_rows4`] (and the AVX-512 VNNI four-row kernel).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q2k_row(x: [&[BlockQ2K]; 1], y: &[BlockQ8K], out: &mut [f32; 1]) {
    dot_q2k::<1>(x[0], &[y], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_tiles_match_reference, avx2_available, check_q2k_rows4_extremes, check_rows4_random,
        q2_k_weights, q8k_acts, seed,
    };

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

    /// The four-row kernel: four random rows against one activation row.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        if !avx2_available() {
            eprintln!("no AVX2: Q2_K rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "q2_k avx2 rows4",
            GgmlType::Q2_K,
            dot_q2k_rows4,
            q2_k_weights,
            q8k_acts,
            256,
            &[1, 2, 3, 5, 11, 16],
            16,
        );
    }

    /// The four-row kernel at the extremes of every integer.
    #[test]
    fn rows4_equal_the_scalar_reference_at_the_extremes() {
        if !avx2_available() {
            eprintln!("no AVX2: Q2_K rows4 kernel not exercised");
            return;
        }
        check_q2k_rows4_extremes("q2_k avx2 rows4 extremes", dot_q2k_rows4);
    }
}
