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

use crate::kernels::x86::avx2::{
    f16c_to_f32, hsum8_i32, load32i, load32u, load_bsums, reduce8, Aligned32,
};
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

/// A Q8_K activation block arranged for [`dot_q2k_rows4`], once per matvec chunk: each
/// run of 32 quants (groups `2m` and `2m + 1`) with its 16-bit words interleaved, word
/// `2i` the first group's word `i` and word `2i + 1` the second group's, so that every
/// dword pairs one word of each group and a run's two scales are one broadcast dword.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Q8KWords {
    qs: [[i8; 32]; 8],
    bsums: [i16; 16],
    d: f32,
}

impl Q8KWords {
    /// `y`'s blocks arranged, into `out` (cleared first).
    pub(crate) fn arrange(y: &[BlockQ8K], out: &mut Vec<Q8KWords>) {
        out.clear();
        out.extend(y.iter().map(|b| {
            let mut qs = [[0i8; 32]; 8];
            for (m, run) in qs.iter_mut().enumerate() {
                let src = &b.qs[32 * m..32 * m + 32];
                for i in 0..8 {
                    run[4 * i..4 * i + 2].copy_from_slice(&src[2 * i..2 * i + 2]);
                    run[4 * i + 2..4 * i + 4].copy_from_slice(&src[16 + 2 * i..16 + 2 * i + 2]);
                }
            }
            Q8KWords {
                qs,
                bsums: b.bsums,
                d: b.d,
            }
        }));
    }
}

/// 32 weight bytes (a run's element order, groups `2m` in bytes 0..16 and `2m + 1` in
/// 16..32) in [`Q8KWords`]'s order: quadwords `0, 2, 1, 3` (each 128-bit half now holds
/// four words of each group), then the words interleaved within each half.
#[inline]
#[target_feature(enable = "avx2")]
fn words(v: __m256i, ctl: __m256i) -> __m256i {
    _mm256_shuffle_epi8(_mm256_permute4x64_epi64::<0b11_01_10_00>(v), ctl)
}

/// Four Q2_K weight rows (`x`, each `y.len()` blocks) · one arranged Q8_K activation
/// row: `out[r]` is row `r`'s dot product, bit for bit [`dot_q2k`]`::<1>` of that row
/// (and so the scalar reference's), the decode kernel of this level.
///
/// Per row and block: the 64 quant bytes put in [`Q8KWords`]'s order ([`words`], two
/// shuffles a row-block, where a scale vector per run took eight), the 2-bit planes
/// `j` = 1 and 3 taken as `4q` (masked in place, unshifted) and planes 0 and 2 weighted
/// by their scales times 4, so that every run adds `4 sc dot`; each run's scale pair is
/// one dword broadcast from memory (a load, not a shuffle). The mins against the block
/// sums in one `vpmaddwd`. The four rows' `4I` and `M` lanes are reduced together
/// ([`reduce8`]) as `[4I_0, M_0, 4I_1, M_1, ..]`, against the rows' `[d, dmin]` pairs
/// (one dword each: LLVM makes the blends of their broadcasts one load and three dword
/// inserts, where eight separate halves took one load and seven inserts), each row's
/// float steps in an even lane. The caller passes rows far apart (each stream is prefetched
/// [`PREFETCH_AHEAD`] blocks ahead, past the row's end).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q2k_rows4(x: [&[BlockQ2K]; 4], y: &[Q8KWords], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q2k_rows4: lengths");
    }
    let m3 = _mm256_set1_epi8(3);
    let m12 = _mm256_set1_epi8(12);
    let m4 = _mm256_set1_epi16(0x0F);
    let ctl = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
    ));
    let down = _mm256_setr_epi32(2, 0, 2, 0, 2, 0, 2, 0);
    // Lane 2r: row r's sum.
    let mut acc = _mm256_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        // SAFETY: `bsums` is 16 i16 = 32 readable bytes; loadu is unaligned.
        let bs = unsafe { _mm256_loadu_si256(yb.bsums.as_ptr() as *const __m256i) };
        let mut v = [_mm256_setzero_si256(); 8];
        for r in 0..4 {
            let b = &x[r][i];
            // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
            let w16 = _mm256_cvtepu8_epi16(unsafe {
                _mm_loadu_si128(b.scales.as_ptr() as *const __m128i)
            });
            let s1 = _mm256_and_si256(w16, m4);
            let mins = _mm256_srli_epi16::<4>(w16);
            // The scales as i16 (`sc[..8]`), and times 4 (`sc[8..]`; each at most 15),
            // dword `m` the pair of run `m`.
            // (Aligned: a store split over two cache lines does not forward to the
            // broadcasts.)
            let mut sc = Aligned32([0i32; 16]);
            // SAFETY: `sc` is 64 writable bytes, 32-byte aligned.
            unsafe {
                _mm256_store_si256(sc.0.as_mut_ptr() as *mut __m256i, s1);
                _mm256_store_si256(
                    sc.0.as_mut_ptr().add(8) as *mut __m256i,
                    _mm256_slli_epi16::<2>(s1),
                );
            }
            // Kept in memory: each pair is then a broadcast load (LLVM would otherwise
            // shuffle each pair out of the register).
            let sc = &std::hint::black_box(&sc).0;
            let mut sumi = _mm256_setzero_si256();
            for k in 0..2 {
                let q = words(load32u(&b.qs[32 * k..]), ctl);
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
                    let s = _mm256_set1_epi32(sc[if j % 2 == 0 { 8 + m } else { m }]);
                    let p = _mm256_maddubs_epi16(plane, load32i(&yb.qs[m]));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
                }
            }
            v[2 * r] = sumi;
            v[2 * r + 1] = _mm256_madd_epi16(bs, mins);
        }
        // [4I_0, M_0, .., 4I_3, M_3] -> [I_0, M_0, ..] (4I shifted down: exact).
        let im = _mm256_cvtepi32_ps(_mm256_srav_epi32(reduce8(v), down));
        // Each row's `[d, dmin]` halves (adjacent in the block) as one dword.
        let dm = |r: usize| {
            let p = (&x[r][i].d as *const u16).cast::<i32>();
            // SAFETY: `d` and `dmin` are adjacent u16 fields (4 readable bytes);
            // read_unaligned has no alignment requirement.
            _mm_set1_epi32(unsafe { p.read_unaligned() })
        };
        let h = _mm_blend_epi32::<0b1100>(
            _mm_blend_epi32::<0b0010>(dm(0), dm(1)),
            _mm_blend_epi32::<0b1000>(dm(2), dm(3)),
        );
        // [dall_r * I_r, dmin_r * M_r] in lanes 2r, 2r + 1.
        let p = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(yb.d), _mm256_cvtph_ps(h)), im);
        acc = _mm256_add_ps(acc, _mm256_sub_ps(p, _mm256_movehdup_ps(p)));
    }
    let mut f = [0f32; 8];
    // SAFETY: `f` is 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(f.as_mut_ptr(), acc) };
    *out = [f[0], f[2], f[4], f[6]];
}

/// One Q2_K row · one arranged Q8_K row in the same order: the rows of a chunk left over
/// beside [`dot_q2k_rows4`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q2k_row_words(x: [&[BlockQ2K]; 1], y: &[Q8KWords], out: &mut [f32; 1]) {
    let mut o = [0f32; 4];
    dot_q2k_rows4([x[0]; 4], y, &mut o);
    out[0] = o[0];
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

    /// [`dot_q2k_rows4`] against a plain activation row, arranged here.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn rows4_plain(x: [&[BlockQ2K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
        let mut a = Vec::new();
        Q8KWords::arrange(y, &mut a);
        // SAFETY: the caller checked the features.
        unsafe { dot_q2k_rows4(x, &a, out) }
    }

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
            rows4_plain,
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
        check_q2k_rows4_extremes("q2_k avx2 rows4 extremes", rows4_plain);
    }
}
