//! Q8_0, Q4_0 and Q5_0 weights · Q8_0 activations on AVX2, in tinyBLAS's order
//! (`tinyblas.rs`): the blocks' quants as signed bytes. The caller must have checked
//! AVX2, FMA and F16C at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};

use crate::kernels::q0::tinyblas::dot_q0;
use crate::kernels::q0::vnni::{rows_checked, Q0Pair, Q8_0Side};
use crate::kernels::x86::avx2::{f16_bcast, hsum_ps, load32i, nibbles, Aligned32};

/// Q8_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q8_0<const R: usize>(
    x: &[BlockQ8_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features are the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q8_0_bytes(b), |b| b.d) }
}

/// Q4_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4_0<const R: usize>(
    x: &[BlockQ4_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q4_0_bytes(b), |b| b.d) }
}

/// 0xFF in byte `i` where bit `i` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits(bits: u32) -> __m256i {
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    // Byte i%8 of the mask has every bit but bit i%8 set.
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
}

/// The 32 quants of a Q4_0 block as i8 (`q - 8`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q4_0_bytes(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// The 32 quants of a Q5_0 block as i8 (`q - 16`): where the fifth bit is clear the high
/// nibble becomes 0xF (nibble - 16 as i8); where it is set the nibble alone is
/// (16 + nibble) - 16.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q5_0_bytes(b: &BlockQ5_0) -> __m256i {
    let hi = _mm256_andnot_si256(
        bytes_from_bits(u32::from_le_bytes(b.qh)),
        _mm256_set1_epi8(0xF0u8 as i8),
    );
    _mm256_or_si256(nibbles(&b.qs), hi)
}

/// The 32 quants of a Q8_0 block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q8_0_bytes(b: &BlockQ8_0) -> __m256i {
    load32i(&b.qs)
}

/// Q5_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5_0<const R: usize>(
    x: &[BlockQ5_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features are the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q5_0_bytes(b), |b| b.d) }
}

/// A legacy 32-quant weight type as [`q0_rows`] takes it: its quants decoded once per
/// block, and tinyBLAS's eight i32 lane sums (quants `4l..4l + 4`) of the decoded block
/// against an activation block (the f16 scale as the VNNI kernels take it).
pub(crate) trait Avx2Q0: Q0Pair {
    /// Whether [`Avx2Q0::lane_sums`] reads the second register of [`Avx2Q0::quants`]
    /// (Q8_0's signed quants); for the others it is a copy of the first.
    const SIGNS: bool;
    /// The block's quants as [`Avx2Q0::lane_sums`] takes them: for Q8_0 `|q|` and `q`
    /// (whose signs go onto the activation), for the others the quants plus their offset
    /// (unsigned) twice.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    unsafe fn quants(&self) -> (__m256i, __m256i);
    /// The lane sums of the decoded block `q` against the activation quants `y`, whose
    /// lane sums times -16 are `neg16`: exactly the integers tinyBLAS's `maddubs` /
    /// `madd` of sign-adjusted bytes gives.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    unsafe fn lane_sums(q: (__m256i, __m256i), y: __m256i, neg16: __m256i) -> __m256i;
}

impl Avx2Q0 for BlockQ8_0 {
    const SIGNS: bool = true;
    #[inline(always)]
    unsafe fn quants(&self) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let q = q8_0_bytes(self);
            (_mm256_sign_epi8(q, q), q)
        }
    }
    #[inline(always)]
    unsafe fn lane_sums(q: (__m256i, __m256i), y: __m256i, _neg16: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            // tinyBLAS's steps: |q| against y with q's signs (a pair of products stays
            // within i16: |q| <= 128, |y| <= 127).
            let p = _mm256_maddubs_epi16(q.0, _mm256_sign_epi8(y, q.1));
            _mm256_madd_epi16(p, _mm256_set1_epi16(1))
        }
    }
}

impl Avx2Q0 for BlockQ5_0 {
    const SIGNS: bool = false;
    #[inline(always)]
    unsafe fn quants(&self) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let bit5 = _mm256_and_si256(
                bytes_from_bits(u32::from_le_bytes(self.qh)),
                _mm256_set1_epi8(0x10),
            );
            let u = _mm256_or_si256(nibbles(&self.qs), bit5);
            (u, u)
        }
    }
    #[inline(always)]
    unsafe fn lane_sums(q: (__m256i, __m256i), y: __m256i, neg16: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            // The quants plus 16 (0..=31) against y: a pair of products stays within i16
            // (2 x 31 x 128), and -16 x the lane's activation sum takes the offset back
            // out exactly.
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q.0, y), _mm256_set1_epi16(1));
            _mm256_add_epi32(p, neg16)
        }
    }
}

impl Avx2Q0 for BlockQ4_0 {
    const SIGNS: bool = false;
    #[inline(always)]
    unsafe fn quants(&self) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let u = nibbles(&self.qs);
            (u, u)
        }
    }
    #[inline(always)]
    unsafe fn lane_sums(q: (__m256i, __m256i), y: __m256i, neg16: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            // The quants plus 8 (the nibbles) against y; -8 x the lane's activation sum
            // (half of `neg16`, exact: a multiple of 16) takes the offset back out.
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q.0, y), _mm256_set1_epi16(1));
            _mm256_add_epi32(p, _mm256_srai_epi32::<1>(neg16))
        }
    }
}

/// [`q0_rows`] for two weight rows against two to four activation rows, the eight
/// products `d_w * d_a` of a block taken with one multiply: the two rows' f16 scales
/// widened as `[d_0 x 4, d_1 x 4]`, times the activation rows' scales of the block
/// arranged once as `[d_a0, .., d_a3]` twice, written to an aligned buffer and broadcast
/// back from it one product a chain (a load, where a multiply a chain takes a port of
/// the two the integer and float steps share). The same products as `q0_rows`'s, so the
/// same sums bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
fn q0_rows_pairs<B: Avx2Q0, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    ys: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
    n: usize,
) {
    assert!(
        (2..=4).contains(&A),
        "q0_rows_pairs: two to four activation rows"
    );
    // The activation scales of each block, four lanes (the rows past `A` zero).
    let dy: Vec<Aligned32<[f32; 4]>> = (0..nb)
        .map(|i| {
            Aligned32(std::array::from_fn(
                |a| if a < A { ys[a].1[i] } else { 0.0 },
            ))
        })
        .collect();
    let dy = &dy[..nb];
    // Words 0, 1 (the first row's f16 scale) to lanes 0..4, words 2, 3 to lanes 4..8.
    let spread = _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);
    // Each row's blocks as slices of length `nb`, so the loop's indexing needs no checks.
    let yq: [&[BlockQ8_0]; A] = std::array::from_fn(|a| &ys[a].0[..nb]);
    let yl: [&[[i32; 8]]; A] = std::array::from_fn(|a| &ys[a].2[..nb]);
    let mut prod = Aligned32([0f32; 8]);
    let run = n / 2;
    for t in 0..run {
        let xr: [&[B]; 2] = std::array::from_fn(|s| &w[(s * run + t) * nb..][..nb]);
        let mut acc = [[_mm256_setzero_ps(); A]; 2];
        for i in 0..nb {
            // SAFETY: 32 quant bytes, 8 i32 and 4 f32 (aligned) are readable, loadu is
            // unaligned, `prod` is 32 aligned writable bytes; this function's features
            // include what `quants` and `lane_sums` need.
            unsafe {
                let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 2];
                for s in 0..2 {
                    let b = &xr[s][i];
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    q[s] = b.quants();
                }
                let bits = xr[0][i].scale_bits() as u32 | (xr[1][i].scale_bits() as u32) << 16;
                let dw = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_cvtsi32_si128(bits as i32), spread));
                let da = _mm256_broadcast_ps(&*(dy[i].0.as_ptr() as *const __m128));
                _mm256_store_ps(prod.0.as_mut_ptr(), _mm256_mul_ps(dw, da));
                // Read back from memory (LLVM would otherwise shuffle each product out of
                // the register it stored).
                let prod = &std::hint::black_box(&prod).0;
                for a in 0..A {
                    let yv = _mm256_loadu_si256(yq[a][i].qs.as_ptr() as *const __m256i);
                    let neg16 = _mm256_loadu_si256(yl[a][i].as_ptr() as *const __m256i);
                    for s in 0..2 {
                        let sum = B::lane_sums(q[s], yv, neg16);
                        let dd = _mm256_broadcast_ss(&prod[4 * s + a]);
                        acc[s][a] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc[s][a]);
                    }
                }
            }
        }
        for s in 0..2 {
            for a in 0..A {
                out[(s * run + t) * stride + a] = hsum_ps(acc[s][a]);
            }
        }
    }
    for r in 2 * run..n {
        q0_rows::<B, 1, A, PF>(
            &w[r * nb..(r + 1) * nb],
            nb,
            ys,
            &mut out[r * stride..],
            stride,
        );
    }
}

/// Rows of a legacy 32-quant weight `w` (`nb` blocks each) against `A` Q8_0 activation
/// rows `y` (decode: one, or a few sequences), in tinyBLAS's order as [`dot_q8_0`] /
/// [`dot_q5_0`] / [`dot_q4_0`] (bit for bit): `out[r * stride + a]` is weight row `r`
/// against `y[a]`. Each weight block is decoded once for the `A` rows; `S` weight rows go
/// side by side, far apart (row `t` of each of `S` equal runs, as `vnni::q0_rows` takes
/// them: separate streams for the prefetchers), `S x A` chains for the out-of-order core;
/// `PF` bytes ahead of each weight stream asked for (0: none). The rows past `S` equal
/// runs one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q0_rows<B: Avx2Q0, const S: usize, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
) {
    let n = rows_checked(w.len(), nb, y, out.len(), stride, "q0::avx2::q0_rows");
    let ys: [Q8_0Side<'_>; A] =
        std::array::from_fn(|a| (&y[a].0[..nb], &y[a].1[..nb], &y[a].2[..nb]));
    if S == 2 && (2..=4).contains(&A) {
        q0_rows_pairs::<B, A, PF>(w, nb, &ys, out, stride, n);
        return;
    }
    let run = n / S;
    for t in 0..run {
        let xr: [&[B]; S] = std::array::from_fn(|s| &w[(s * run + t) * nb..][..nb]);
        let mut acc = [[_mm256_setzero_ps(); A]; S];
        for i in 0..nb {
            // SAFETY: 32 quant bytes and 8 i32 are readable, loadu is unaligned; this
            // function's features include what `quants` and `lane_sums` need.
            unsafe {
                let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); S];
                let mut d = [_mm256_setzero_ps(); S];
                for s in 0..S {
                    let b = &xr[s][i];
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    q[s] = b.quants();
                    d[s] = f16_bcast(b.scale_bits());
                }
                for a in 0..A {
                    let (yb, ysc, yl) = ys[a];
                    let yv = _mm256_loadu_si256(yb[i].qs.as_ptr() as *const __m256i);
                    let neg16 = _mm256_loadu_si256(yl[i].as_ptr() as *const __m256i);
                    let dy = _mm256_set1_ps(ysc[i]);
                    for s in 0..S {
                        let sum = B::lane_sums(q[s], yv, neg16);
                        let dd = _mm256_mul_ps(d[s], dy);
                        acc[s][a] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc[s][a]);
                    }
                }
            }
        }
        for s in 0..S {
            for a in 0..A {
                out[(s * run + t) * stride + a] = hsum_ps(acc[s][a]);
            }
        }
    }
    if S > 1 {
        for r in S * run..n {
            q0_rows::<B, 1, A, PF>(
                &w[r * nb..(r + 1) * nb],
                nb,
                y,
                &mut out[r * stride..],
                stride,
            );
        }
    }
}
