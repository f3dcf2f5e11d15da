//! Q8_0, Q5_0 and Q4_0 weights · Q8_0 activations on AVX-512 VNNI, in tinyBLAS's order
//! (`tinyblas.rs`): the decode matvecs (`q0_rows`, `q0_rows_pairs`) and Q5_0's tiles
//! (`q5_0_rows`). The caller must have checked AVX-512 F/BW/VNNI (and AVX2/FMA/F16C) at
//! device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5_0, BlockQ8_0};

use crate::kernels::x86::avx2::{f16c_to_f32, hsum_ps};
use crate::kernels::x86::avx512::hi256;

/// One activation row's Q8_0 blocks with their f32 scales and `-16 x` lane sums.
pub(crate) type Q8_0Side<'a> = (&'a [BlockQ8_0], &'a [f32], &'a [[i32; 8]]);

/// Q5_0 x Q8_0 in tinyBLAS's order (as `tinyblas::dot_q0`: per block, eight i32 lanes of
/// four quants each, `lane = fma(d_w * d_a, lane sum, lane)`, `hsum_ps` at the end), on
/// the quants taken unsigned (`q + 16`, the fifth bit from a mask register): `vpdpbusd`
/// starting from the activation block's `-16 x` lane sums gives exactly the signed lane
/// sums, with no sign juggling and no f16 conversion of activation scales per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q5_0<const R: usize>(x: &[BlockQ5_0], y: &[Q8_0Side<'_>; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let bit5 = _mm256_set1_epi8(0x10);
    for r in 0..R {
        assert!(y[r].0.len() >= x.len() && y[r].1.len() >= x.len() && y[r].2.len() >= x.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + 8) {
            _mm_prefetch::<_MM_HINT_T0>((ahead as *const BlockQ5_0).cast::<i8>());
        }
        // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
        let t = unsafe { _mm_loadu_si128(b.qs.as_ptr() as *const __m128i) };
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), m4);
        let u = _mm256_or_si256(nib, _mm256_maskz_mov_epi8(u32::from_le_bytes(b.qh), bit5));
        let d = _mm256_set1_ps(f16c_to_f32(b.d));
        for r in 0..R {
            let (yb, ys, yl) = (&y[r].0[i], y[r].1[i], &y[r].2[i]);
            // SAFETY: 32 quant bytes and 8 i32 are readable; loadu is unaligned.
            let (yv, init) = unsafe {
                (
                    _mm256_loadu_si256(yb.qs.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(yl.as_ptr() as *const __m256i),
                )
            };
            let s = _mm256_dpbusd_epi32(init, u, yv);
            let dd = _mm256_mul_ps(d, _mm256_set1_ps(ys));
            acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
}

/// `out[t] = dot(Q5_0 weight row x, activation row rows[t])` for up to 4 rows, each
/// row's side data from `side`.
pub(crate) fn q5_0_rows<'a>(
    x: &[BlockQ5_0],
    rows: &[usize],
    side: &dyn Fn(usize) -> Q8_0Side<'a>,
    out: &mut [f32],
) {
    // SAFETY (each call): the VNNI level (AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C) was
    // checked against the CPU at device open.
    match rows.len() {
        4 => {
            let ys = [side(rows[0]), side(rows[1]), side(rows[2]), side(rows[3])];
            let mut o = [0f32; 4];
            unsafe { dot_q5_0::<4>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        3 => {
            let ys = [side(rows[0]), side(rows[1]), side(rows[2])];
            let mut o = [0f32; 3];
            unsafe { dot_q5_0::<3>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        2 => {
            let ys = [side(rows[0]), side(rows[1])];
            let mut o = [0f32; 2];
            unsafe { dot_q5_0::<2>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        _ => {
            for (t, &r) in rows.iter().enumerate() {
                let mut o = [0f32; 1];
                unsafe { dot_q5_0::<1>(x, &[side(r)], &mut o) };
                out[t] = o[0];
            }
        }
    }
}

/// A legacy 32-quant weight type as the VNNI kernels take it: its quants made unsigned by
/// an offset `o` (16 for Q5_0: the fifth bit as is; 128 for the others: the sign bit
/// flipped), which the activation block's `-16 x` lane sums, shifted left by `SHIFT`
/// (`log2(o / 16)`), take back out exactly.
pub(crate) trait Q0Pair: bytemuck::Pod + Sync {
    /// `log2(o / 16)`.
    const SHIFT: u32;
    /// The f16 scale bits.
    fn scale_bits(&self) -> u16;
    /// The 32 quants plus the offset, as u8.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL and AVX2.
    unsafe fn unsigned(&self) -> __m256i;
}

impl Q0Pair for BlockQ5_0 {
    const SHIFT: u32 = 0;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            _mm256_or_si256(
                nibbles(&self.qs),
                _mm256_maskz_mov_epi8(u32::from_le_bytes(self.qh), _mm256_set1_epi8(0x10)),
            )
        }
    }
}

impl Q0Pair for BlockQ8_0 {
    const SHIFT: u32 = 3;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees AVX2; `qs` is 32 readable bytes.
        unsafe {
            let q = _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i);
            _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
        }
    }
}

impl Q0Pair for flint_core::blocks::BlockQ4_0 {
    const SHIFT: u32 = 3;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees AVX2. q - 8 + 128 = nibble + 120.
        unsafe { _mm256_add_epi8(nibbles(&self.qs), _mm256_set1_epi8(120)) }
    }
}

/// The 32 nibbles of 16 quant bytes as bytes, in element order (low nibbles, then high).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: the caller guarantees AVX2; `qs` is 16 readable bytes, loadu is unaligned.
    unsafe {
        // A broadcast load and a per-lane shift: no 128-bit insert on the shuffle port.
        let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr() as *const __m128i));
        _mm256_and_si256(
            _mm256_srlv_epi64(t, _mm256_setr_epi64x(0, 0, 4, 4)),
            _mm256_set1_epi8(0x0F),
        )
    }
}

/// The number of weight rows of `w_len` blocks in rows of `nb`, after checking the
/// lengths a [`q0_rows`]-style kernel indexes without bounds checks: whole rows, every
/// activation row at least `nb` blocks, room in `out` for `[row][stride]` results.
pub(crate) fn rows_checked<const A: usize>(
    w_len: usize,
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out_len: usize,
    stride: usize,
    what: &str,
) -> usize {
    let n = w_len / nb.max(1);
    assert!(
        nb > 0 && A > 0 && w_len == nb * n && stride >= A && out_len >= (n.max(1) - 1) * stride + A,
        "{what}: lengths"
    );
    for (yb, ys, yl) in y {
        assert!(
            yb.len() >= nb && ys.len() >= nb && yl.len() >= nb,
            "{what}: activation lengths"
        );
    }
    n
}

/// Rows of a legacy 32-quant weight `w` (`nb` blocks each) against `A` Q8_0
/// activation rows `y` (decode: one, or a few sequences), in tinyBLAS's order as
/// [`dot_q5_0`] and `tinyblas::dot_q0` (bit for bit): `out[r * stride + a]` is weight row
/// `r` against `y[a]`. `vpdpbusd` on the quants taken unsigned, starting from the
/// activation block's `-16 x` lane sums shifted by `B::SHIFT`, gives the signed lane sums
/// in one instruction; each weight block is decoded once for the `A` rows.
///
/// `PF`: bytes ahead of each weight stream to prefetch (0: none).
///
/// `S` weight rows go side by side (`S x A` independent chains for the out-of-order
/// core), and they are rows far apart: row `t` of each of `S` equal runs of the rows.
/// Two *adjacent* rows read side by side stream from memory far slower than one (the
/// hardware prefetcher does not follow two streams a row apart), while rows half a
/// matrix apart are two clean streams.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q0_rows<B: Q0Pair, const S: usize, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
) {
    let n = rows_checked(w.len(), nb, y, out.len(), stride, "q0_rows");
    let run = n / S;
    for t in 0..run {
        let xr: [&[B]; S] = std::array::from_fn(|s| &w[(s * run + t) * nb..(s * run + t + 1) * nb]);
        let mut acc = [[_mm256_setzero_ps(); A]; S];
        for i in 0..nb {
            // SAFETY: `i < nb`; every activation slice has at least `nb` entries (checked
            // above) and every `xr[s]` exactly `nb`; 32 quant bytes and 8 i32 are
            // readable, loadu is unaligned; this function's features include what
            // `unsigned` needs.
            unsafe {
                let mut u = [_mm256_setzero_si256(); S];
                let mut d = [_mm256_setzero_ps(); S];
                for s in 0..S {
                    let b = xr[s].get_unchecked(i);
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    u[s] = b.unsigned();
                    d[s] = _mm256_cvtph_ps(_mm_set1_epi16(b.scale_bits() as i16));
                }
                for a in 0..A {
                    let (yb, ys, yl) = y[a];
                    let yv = _mm256_loadu_si256(yb.get_unchecked(i).qs.as_ptr() as *const __m256i);
                    let init = _mm256_loadu_si256(yl.get_unchecked(i).as_ptr() as *const __m256i);
                    let init = if B::SHIFT == 0 {
                        init
                    } else {
                        _mm256_sll_epi32(init, _mm_cvtsi32_si128(B::SHIFT as i32))
                    };
                    let dy = _mm256_set1_ps(*ys.get_unchecked(i));
                    for s in 0..S {
                        let sum = _mm256_dpbusd_epi32(init, u[s], yv);
                        acc[s][a] = _mm256_fmadd_ps(
                            _mm256_mul_ps(d[s], dy),
                            _mm256_cvtepi32_ps(sum),
                            acc[s][a],
                        );
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
    // The rows past `S` equal runs, one at a time.
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

/// [`q0_rows`] for several activation rows in 512-bit registers, `P` pairs of weight rows
/// at a time: the two rows of a pair in the two halves of each register, so that one
/// `vpdpbusd`, one scale product, one conversion and one fused multiply-add serve both,
/// and each activation block loaded, shifted and broadcast once for all `2P` rows. All
/// `2P` rows far apart (row
/// `t + s * run` for `s < 2P`; [`q0_rows`] says why). The same arithmetic per lane as
/// [`q0_rows`]; `PF` as there. The last `n % 2P` rows: pairs again one at a time, then an
/// odd row alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q0_rows_pairs<B: Q0Pair, const P: usize, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
) {
    let n = rows_checked(w.len(), nb, y, out.len(), stride, "q0_rows_pairs");
    let run = n / (2 * P);
    for t in 0..run {
        let xs: [&[B]; 6] = std::array::from_fn(|s| {
            let r = (s.min(2 * P - 1)) * run + t;
            &w[r * nb..(r + 1) * nb]
        });
        let mut acc = [[_mm512_setzero_ps(); A]; P];
        for i in 0..nb {
            // SAFETY: `i < nb`; every activation slice has at least `nb` entries and every
            // `xs[s]` exactly `nb` (checked above); 32 quant bytes and 8 i32 are readable,
            // loadu is unaligned; this function's features include what `unsigned` needs.
            unsafe {
                let mut u = [_mm512_setzero_si512(); P];
                let mut d = [_mm512_setzero_ps(); P];
                for p in 0..P {
                    let (b0, b1) = (xs[2 * p].get_unchecked(i), xs[2 * p + 1].get_unchecked(i));
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b0 as *const B).cast::<i8>().wrapping_add(PF));
                        _mm_prefetch::<_MM_HINT_T0>((b1 as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    u[p] = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(b0.unsigned()),
                        b1.unsigned(),
                    );
                    d[p] = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_cvtph_ps(_mm_set1_epi16(
                            b0.scale_bits() as i16,
                        )))),
                        _mm256_castps_pd(_mm256_cvtph_ps(_mm_set1_epi16(b1.scale_bits() as i16))),
                    ));
                }
                for a in 0..A {
                    let (yb, ys, yl) = y[a];
                    let yv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yb.get_unchecked(i).qs.as_ptr() as *const __m256i,
                    ));
                    let init = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yl.get_unchecked(i).as_ptr() as *const __m256i,
                    ));
                    let init = if B::SHIFT == 0 {
                        init
                    } else {
                        _mm512_sll_epi32(init, _mm_cvtsi32_si128(B::SHIFT as i32))
                    };
                    let dy = _mm512_set1_ps(*ys.get_unchecked(i));
                    for p in 0..P {
                        let sum = _mm512_dpbusd_epi32(init, u[p], yv);
                        acc[p][a] = _mm512_fmadd_ps(
                            _mm512_mul_ps(d[p], dy),
                            _mm512_cvtepi32_ps(sum),
                            acc[p][a],
                        );
                    }
                }
            }
        }
        for p in 0..P {
            for a in 0..A {
                out[(2 * p * run + t) * stride + a] = hsum_ps(_mm512_castps512_ps256(acc[p][a]));
                out[((2 * p + 1) * run + t) * stride + a] = hsum_ps(hi256(acc[p][a]));
            }
        }
    }
    let done = 2 * P * run;
    if done == n {
        return;
    }
    let (rest, o) = (&w[done * nb..], &mut out[done * stride..]);
    if P > 1 {
        q0_rows_pairs::<B, 1, A, PF>(rest, nb, y, o, stride);
    } else {
        q0_rows::<B, 1, A, 0>(rest, nb, y, o, stride);
    }
}
