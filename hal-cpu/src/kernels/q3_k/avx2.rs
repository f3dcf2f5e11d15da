//! Q3_K weights · Q8_K activations on AVX2: `R` dot products of one weight row with `R`
//! activation rows, each weight block decoded once for all of them (`dot_q3k`, the tiles of
//! a batch), and four weight rows against one activation row (`dot_q3k_rows4`, the
//! decode matvec of this level). The caller must have checked AVX2, FMA and F16C at
//! device open.
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

use crate::kernels::x86::avx2::{f16c_to_f32, load32i, load32u, Aligned32};
use crate::kernels::x86::avx512::prefetch_stream;

/// The 32 bytes `v` reordered so that i32 lane `l` holds bytes `l, l + 8, l + 16,
/// l + 24`: dwords 0, 2, 4, 6 (bytes 0..4, 8..12, 16..20, 24..28) to the low 128-bit half
/// and 1, 3, 5, 7 to the high one (`t.halves`), then a 4x4 byte transposition within each
/// half (`t.bytes`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lanes_of_8(v: __m256i, t: Lanes8) -> __m256i {
    _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(v, t.halves), t.bytes)
}

/// The controls of [`lanes_of_8`], made once per kernel call. The dword permutation's
/// indices pass through `black_box`: with both controls known, LLVM rewrites the pair
/// into a lane swap, two byte shuffles and an OR (four shuffle-port operations where
/// these are two; the four-row kernel ran 15% slower so).
#[derive(Clone, Copy)]
pub(crate) struct Lanes8 {
    halves: __m256i,
    bytes: __m256i,
}

impl Lanes8 {
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn new() -> Self {
        let t = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        Lanes8 {
            halves: std::hint::black_box(_mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)),
            bytes: _mm256_broadcastsi128_si256(t),
        }
    }
}

/// The sixteen 6-bit scales of a block less 32, as i16 (ggml's unpacking of the 12
/// bytes: scale `i`'s low four bits are the low (`i < 8`) or high nibble of byte
/// `i % 8`, its two high bits bits `2 (i / 4)` of byte `8 + i % 4`), all in vector
/// registers: the sixteen nibbles side by side, the high-bit bytes repeated per dword
/// and shifted by `2k` in dword `k`.
#[inline]
#[target_feature(enable = "avx2")]
fn scales16(b: &BlockQ3K) -> __m256i {
    // The 16 bytes that end with the scales (the last four quant bytes first), shifted
    // down: a load inside the block.
    let bytes: &[u8] = bytemuck::bytes_of(b);
    // SAFETY: bytes 92..108 of the 110-byte block are readable; loadu is unaligned.
    let x = unsafe { _mm_loadu_si128(bytes[92..108].as_ptr() as *const __m128i) };
    let x = _mm_srli_si128::<4>(x);
    let m4 = _mm_set1_epi8(0x0F);
    let nib = _mm_unpacklo_epi64(
        _mm_and_si128(x, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(x), m4),
    );
    let hb = _mm_shuffle_epi8(
        x,
        _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11),
    );
    let hb = _mm_and_si128(
        _mm_srlv_epi32(hb, _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3),
    );
    // Each high pair at most 3: times 16 stays in its byte.
    let v = _mm_or_si128(nib, _mm_slli_epi16::<4>(hb));
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
    let t = Lanes8::new();
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let four = _mm256_set1_epi8(4);
    let mut lanes = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let sc = scales16(b);
        let h = lanes_of_8(load32u(&b.hmask), t);
        let qs = [
            lanes_of_8(load32u(&b.qs[..32]), t),
            lanes_of_8(load32u(&b.qs[32..]), t),
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
                let a = _mm256_sign_epi8(lanes_of_8(load32i(&yb.qs[32 * m..]), t), w[m]);
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

/// Blocks ahead of the current one that [`dot_q3k_rows4`] prefetches each weight row's
/// stream (110-byte blocks), past the row's end (as the AVX-512 VNNI kernel).
const PREFETCH_AHEAD: usize = 12;

/// Bit `m` of every byte of `h` moved to bit 2 (the rest cleared): run `m`'s high bits
/// as `4 hbit`. The 16-bit shifts move no bit of interest across a byte.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hbit4(h: __m256i, m: usize) -> __m256i {
    let v = match m {
        0 => _mm256_slli_epi16::<2>(h),
        1 => _mm256_slli_epi16::<1>(h),
        2 => h,
        3 => _mm256_srli_epi16::<1>(h),
        4 => _mm256_srli_epi16::<2>(h),
        5 => _mm256_srli_epi16::<3>(h),
        6 => _mm256_srli_epi16::<4>(h),
        _ => _mm256_srli_epi16::<5>(h),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(4))
}

/// Bits `2s, 2s + 1` of every byte of `q` moved to bits 0, 1 (the rest cleared).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn low2(q: __m256i, s: usize) -> __m256i {
    let v = match s {
        0 => q,
        1 => _mm256_srli_epi16::<2>(q),
        2 => _mm256_srli_epi16::<4>(q),
        _ => _mm256_srli_epi16::<6>(q),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// A Q8_K activation block arranged for [`dot_q3k_rows4`], once per matvec chunk: each
/// run of 32 quants in [`lanes_of_8`]'s arrangement, and its pair sums times `4 F` as
/// i16 (`vpmaddubsw` of `4 F` against the run), the bias of the run's biased quants,
/// where `F` is the run's bit position factor in [`dot_q3k_rows4`]: 1 for the runs
/// `s = 0, 1` of each half block, 16 for `s = 2, 3`.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Q8KLanes {
    a: [[i8; 32]; 8],
    bias: [[i16; 16]; 8],
    d: f32,
}

/// The bit position factor `F` of run `m` (see [`Q8KLanes`]).
const fn run_factor(m: usize) -> i16 {
    if m % 4 < 2 {
        1
    } else {
        16
    }
}

impl Q8KLanes {
    /// `y`'s blocks arranged, into `out` (cleared first).
    pub(crate) fn arrange(y: &[BlockQ8K], out: &mut Vec<Q8KLanes>) {
        out.clear();
        out.extend(y.iter().map(|b| {
            let mut a = [[0i8; 32]; 8];
            let mut bias = [[0i16; 16]; 8];
            for m in 0..8 {
                let run = &b.qs[32 * m..32 * m + 32];
                // Byte 4l + t of the arrangement: element l + 8t of the run.
                for (p, v) in a[m].iter_mut().enumerate() {
                    *v = run[p / 4 + 8 * (p % 4)];
                }
                let f = 4 * run_factor(m);
                for (w, v) in bias[m].iter_mut().enumerate() {
                    *v = f * (i16::from(a[m][2 * w]) + i16::from(a[m][2 * w + 1]));
                }
            }
            Q8KLanes { a, bias, d: b.d }
        }));
    }
}

/// `vpshufb` tables from a nibble of high bits (bit `s` that of run `s` of a half block)
/// to bytes holding two runs' bits where [`dot_q3k_rows4`] merges them with the low
/// bits: the even runs' (`s` = 0, 2) at bits 2 and 6, the odd runs' (1, 3) likewise.
const SPREAD: [[i8; 16]; 2] = {
    let mut t = [[0i8; 16]; 2];
    let mut n = 0;
    while n < 16 {
        let mut k = 0;
        while k < 2 {
            let lo = (n >> k) & 1;
            let hi = (n >> (k + 2)) & 1;
            t[k][n] = ((lo << 2) | (hi << 6)) as i8;
            k += 1;
        }
        n += 1;
    }
    t
};

/// Four Q3_K weight rows (`x`, each `y.len()` blocks) · one arranged Q8_K activation row:
/// `out[r]` is row `r`'s dot product, bit for bit [`dot_q3k`]`::<1>` of that row (and so
/// the scalar reference's), the decode kernel of this level.
///
/// Per row and block the quant and high-bit bytes are transposed ([`lanes_of_8`]), the
/// activations came so ([`Q8KLanes`]). Each half block's four runs take their biased
/// quants `u = q + 4 = low | hbit << 2` (0..=7, unsigned) from two merged bytes: the
/// even runs' low bits masked in place (bits 0-1 and 4-5) with their high bits spread
/// to bits 2 and 6 by one `vpshufb` of the half block's high-bit nibble ([`SPREAD`]),
/// the odd runs' the same after a shift by 2; each run is then one mask of a merged
/// byte, `u` itself (runs `s` = 0, 1) or `16 u` (`s` = 2, 3). `vpmaddubsw` against the
/// arranged activations less the run's bias gives `F` times the exact signed pair sums,
/// `vpmaddwd` by the groups' scales (a pair broadcast from memory) adds them into the
/// row's eight i32 lanes, one sum for each factor, `A_l = S_1 + S_16 / 16` (exact); the
/// row's eight float lanes take `d * A_l` as in [`dot_q3k`]. The caller passes rows far
/// apart (each stream is prefetched [`PREFETCH_AHEAD`] blocks ahead, past the row's end).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q3k_rows4(x: [&[BlockQ3K]; 4], y: &[Q8KLanes], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q3k_rows4: lengths");
    }
    let t = Lanes8::new();
    // SAFETY: 16 readable bytes each; loadu is unaligned.
    let spread = SPREAD.map(|v| {
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(v.as_ptr() as *const __m128i) })
    });
    let m4 = _mm256_set1_epi8(0x0F);
    let m33 = _mm256_set1_epi8(0x33);
    let run_mask = [_mm256_set1_epi8(0x07), _mm256_set1_epi8(0x70)];
    let mut lanes = [_mm256_setzero_ps(); 4];
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        for r in 0..4 {
            let b = &x[r][i];
            // The scale pairs as dwords, each broadcast from memory below (a load, where
            // a permute would take the shuffle port). Aligned: a store split over two
            // cache lines does not forward to the broadcasts.
            let mut sc = Aligned32([0i32; 8]);
            // SAFETY: `sc` is 32 writable bytes, 32-byte aligned.
            unsafe { _mm256_store_si256(sc.0.as_mut_ptr() as *mut __m256i, scales16(b)) };
            // Kept in memory (LLVM would otherwise shuffle each pair out of the register).
            let sc = &std::hint::black_box(&sc).0;
            let h = lanes_of_8(load32u(&b.hmask), t);
            let nib = [
                _mm256_and_si256(h, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(h), m4),
            ];
            // Per factor, the sum of `F` times the runs' scaled pair sums.
            let mut sum = [_mm256_setzero_si256(); 2];
            for (j, nib) in nib.into_iter().enumerate() {
                let qs = lanes_of_8(load32u(&b.qs[32 * j..]), t);
                // Runs 4j, 4j + 2 (even) and 4j + 1, 4j + 3 (odd): low bits at 0-1 and
                // 4-5, high bits at 2 and 6.
                let merged = [
                    _mm256_or_si256(
                        _mm256_and_si256(qs, m33),
                        _mm256_shuffle_epi8(spread[0], nib),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qs), m33),
                        _mm256_shuffle_epi8(spread[1], nib),
                    ),
                ];
                for s in 0..4 {
                    let m = 4 * j + s;
                    let u = _mm256_and_si256(merged[s % 2], run_mask[s / 2]);
                    // SAFETY: 32 readable bytes each; loadu is unaligned.
                    let (a, bias) = unsafe {
                        (
                            _mm256_loadu_si256(yb.a[m].as_ptr() as *const __m256i),
                            _mm256_loadu_si256(yb.bias[m].as_ptr() as *const __m256i),
                        )
                    };
                    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), bias);
                    // Scales 2m and 2m + 1 in every dword.
                    let sp = _mm256_set1_epi32(sc[m]);
                    sum[s / 2] = _mm256_add_epi32(sum[s / 2], _mm256_madd_epi16(p, sp));
                }
            }
            let sumi = _mm256_add_epi32(sum[0], _mm256_srai_epi32::<4>(sum[1]));
            let d = _mm256_set1_ps(f16c_to_f32(b.d) * yb.d);
            lanes[r] = _mm256_add_ps(lanes[r], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        }
    }
    for (o, l) in out.iter_mut().zip(lanes) {
        let mut f = [0f32; 8];
        // SAFETY: `f` is 8 writable f32; storeu is unaligned.
        unsafe { _mm256_storeu_ps(f.as_mut_ptr(), l) };
        *o = f.iter().fold(0.0f32, |s, &v| s + v);
    }
}

/// One Q3_K row · one arranged Q8_K row in the same order: the rows of a chunk left over
/// beside [`dot_q3k_rows4`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q3k_row_lanes(x: [&[BlockQ3K]; 1], y: &[Q8KLanes], out: &mut [f32; 1]) {
    let mut o = [0f32; 4];
    dot_q3k_rows4([x[0]; 4], y, &mut o);
    out[0] = o[0];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        assert_rows4_match_reference, assert_tiles_match_reference, avx2_available,
        check_rows4_random, f16_scale, q3_k_weights, q8k_acts, q8k_uniform, seed,
    };

    use flint_core::GgmlType;

    /// [`dot_q3k_rows4`] against a plain activation row, arranged here.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn rows4_plain(x: [&[BlockQ3K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
        let mut a = Vec::new();
        Q8KLanes::arrange(y, &mut a);
        // SAFETY: the caller checked the features.
        unsafe { dot_q3k_rows4(x, &a, out) }
    }

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

    /// The four-row kernel: four random rows against one activation row.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        if !avx2_available() {
            eprintln!("no AVX2: Q3_K rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "q3_k avx2 rows4",
            GgmlType::Q3_K,
            rows4_plain,
            q3_k_weights,
            q8k_acts,
            256,
            &[1, 2, 3, 5, 11, 16],
            16,
        );
    }

    /// The four-row kernel at the extremes: quants all -4 or all 3 (every high bit clear
    /// or set), scales all -32 or all 31, activations all 127, -127 or -128.
    #[test]
    fn rows4_equal_the_scalar_reference_at_the_extremes() {
        if !avx2_available() {
            eprintln!("no AVX2: Q3_K rows4 kernel not exercised");
            return;
        }
        let mut s = seed("q3_k avx2 rows4 extremes");
        // Scale bytes giving every 6-bit scale 0 (-32 after the bias) or 63 (31).
        let block = |q: u8, sc: u8, s: &mut u64| BlockQ3K {
            hmask: [if q == 0 { 0x00 } else { 0xFF }; 32],
            qs: [q; 64],
            scales: [sc; 12],
            d: f16_scale(s),
        };
        for nb in [1, 3, 16] {
            for a in [127i8, -127, -128] {
                let y = q8k_uniform(nb, a);
                for (q, sc) in [(0x00, 0x00), (0xFF, 0xFF), (0x00, 0xFF), (0xFF, 0x00)] {
                    let x: [Vec<BlockQ3K>; 4] = std::array::from_fn(|r| {
                        if r == 1 {
                            q3_k_weights(nb, &mut s)
                        } else {
                            (0..nb).map(|_| block(q, sc, &mut s)).collect()
                        }
                    });
                    assert_rows4_match_reference(GgmlType::Q3_K, rows4_plain, &x, &y, nb * 256);
                }
            }
        }
    }
}
