//! Q8_0 and Q5_0 weights staged for AMX against one to four activation rows (a decode
//! of a few sequences), on AVX-512 VNNI in the tiles' order (`q8_0.rs`): per block the
//! exact integer dot product, then `acc = fma(sum, d_w * d_a, acc)`. For so few rows a
//! matmul is bound by streaming the weight from memory, and the tiles, which read
//! sixteen adjacent rows a block at a time, stream it slower (`docs/benchmarks.md`);
//! this kernel reads its rows as the tinyBLAS-order row kernels do
//! (`q0::vnni::q0_rows_pairs`): rows far apart, each its own stream, prefetched ahead.
//!
//! Sixteen weight rows at a time, a sixteenth of the rows apart, two to a register
//! (rows `s` and `s + 8` in its halves); `vpdpbusd` of the quants taken unsigned
//! (`q + 128` for Q8_0, `q + 16` for Q5_0: [`Q0Pair`]) against the activation block,
//! from its lane sums times minus that offset, gives each row's eight exact lane sums; a
//! reduction tree adds each row's lanes, leaving the sixteen rows' block sums in one
//! register (lane `l` for row [`ROW_OF_LANE`]`[l]`), which one conversion, one scale
//! product and one FMA add to the sixteen outputs.

use std::arch::x86_64::*;

use crate::kernels::q0::vnni::{Q0Pair, Q8_0Side};

/// Weight rows per step.
const ROWS: usize = 16;

/// The weight row (of the sixteen) whose block sum the reduction leaves in lane `l`.
const ROW_OF_LANE: [usize; ROWS] = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15];

/// The sixteen rows' block sums of eight registers of lane sums (`v[p]`: row `p`'s
/// eight lanes in the low half, row `p + 8`'s in the high half): lane `l` of the
/// result is row `ROW_OF_LANE[l]`'s sum.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce8(v: [__m512i; 8]) -> __m512i {
    // Per 128-bit lane: pairs of registers interleaved and added (two lane sums each),
    // then pairs of pairs (four each), then the two 128-bit lanes of each half.
    let a: [__m512i; 4] = std::array::from_fn(|k| {
        let (x, y) = (v[2 * k], v[2 * k + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
    });
    let b: [__m512i; 2] = std::array::from_fn(|k| {
        let (x, y) = (a[2 * k], a[2 * k + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
    });
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(b[0], b[1]),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(b[0], b[1]),
    )
}

/// `put(r, a, weight row r · y[a])` for every row `r` of `w` (Q8_0 or Q5_0, `nb` blocks each, a
/// multiple of sixteen rows) and the `A` activation rows `y` (each row's blocks, their
/// scales as f32 and their `-16 x` lane sums), in llama.cpp's AMX order. `PF`: bytes
/// ahead of each row's stream to prefetch.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn rows<B: Q0Pair, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    mut put: impl FnMut(usize, usize, f32),
) {
    let n = w.len() / nb.max(1);
    assert!(
        nb > 0 && w.len() == n * nb && n.is_multiple_of(ROWS),
        "amx rows: whole groups of sixteen rows"
    );
    for (yb, ys, yl) in y {
        assert!(
            yb.len() >= nb && ys.len() >= nb && yl.len() >= nb,
            "amx rows: activation lengths"
        );
    }
    let run = n / ROWS;
    let row_bytes = nb * std::mem::size_of::<B>();
    for t in 0..run {
        // Row `t + s * run` for s < 16; the scales' byte offsets from the first, in the
        // reduction's lane order.
        let base = w[t * nb..].as_ptr();
        let offs: [i64; ROWS] = std::array::from_fn(|l| (ROW_OF_LANE[l] * run * row_bytes) as i64);
        // SAFETY: 64 readable bytes each.
        let (off_lo, off_hi) = unsafe {
            (
                _mm512_loadu_si512(offs.as_ptr() as *const __m512i),
                _mm512_loadu_si512(offs[8..].as_ptr() as *const __m512i),
            )
        };
        let mut acc = [_mm512_setzero_ps(); A];
        for i in 0..nb {
            // SAFETY (whole block): every row `t + s * run` has `nb` blocks inside `w`
            // (n = 16 run rows); `i < nb`; the activation slices have at least `nb`
            // entries (checked above); loads are unaligned; the gathers read 8 bytes at
            // each row's block `i` (its scale and six quants), inside `w`.
            unsafe {
                let blk = |s: usize| base.add(s * run * nb + i);
                let mut u = [_mm512_setzero_si512(); 8];
                for (p, u) in u.iter_mut().enumerate() {
                    let (b0, b1) = (blk(p), blk(p + 8));
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>(b0.cast::<i8>().wrapping_add(PF));
                        _mm_prefetch::<_MM_HINT_T0>(b1.cast::<i8>().wrapping_add(PF));
                    }
                    *u = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512((*b0).unsigned()),
                        (*b1).unsigned(),
                    );
                }
                // The sixteen rows' f16 scales in lane order, widened.
                let at = blk(0) as *const u8;
                let lo = _mm512_i64gather_epi64::<1>(off_lo, at as *const i64);
                let hi = _mm512_i64gather_epi64::<1>(off_hi, at as *const i64);
                let dw = _mm512_cvtph_ps(_mm256_set_m128i(
                    _mm512_cvtepi64_epi16(hi),
                    _mm512_cvtepi64_epi16(lo),
                ));
                for (a, acc) in acc.iter_mut().enumerate() {
                    let (yb, ys, yl) = y[a];
                    let yv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yb.get_unchecked(i).qs.as_ptr() as *const __m256i,
                    ));
                    // Minus the offset times the lane sums: the unsigned quants' offset
                    // taken out.
                    let init = _mm512_sll_epi32(
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            yl.get_unchecked(i).as_ptr() as *const __m256i
                        )),
                        _mm_cvtsi32_si128(B::SHIFT as i32),
                    );
                    let sums =
                        reduce8(std::array::from_fn(|p| _mm512_dpbusd_epi32(init, u[p], yv)));
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(*ys.get_unchecked(i)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), d, *acc);
                }
            }
        }
        for (a, acc) in acc.iter().enumerate() {
            let mut v = [0f32; ROWS];
            // SAFETY: 64 writable bytes; storeu is unaligned.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *acc) };
            for (l, x) in v.iter().enumerate() {
                put(t + ROW_OF_LANE[l] * run, a, *x);
            }
        }
    }
}
