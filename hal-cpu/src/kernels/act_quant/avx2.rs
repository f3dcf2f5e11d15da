//! The activation quantizers with AVX2 (the AVX2 level), lane for lane the operations of
//! the scalar `flint_core::quant` ones (the same bytes), as `avx512.rs` does with
//! sixteen lanes.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ8K, BlockQ8_0};

use crate::kernels::x86::avx2::f16c_to_f32;

/// The largest of the eight lanes of `v` (exact in any order).
#[inline]
#[target_feature(enable = "avx2")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// Whether a lane of `a` (magnitudes as bits) is NaN or infinite: an exponent of all ones.
#[inline]
#[target_feature(enable = "avx2")]
fn non_finite(a: __m256i) -> bool {
    _mm256_movemask_epi8(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7f_ffff))) != 0
}

/// 32 i32 (`q[0]` values 0-7 ... `q[3]` values 24-31) saturated to i8 and stored in order
/// at `dst`.
///
/// # Safety
/// `dst` must be 32 writable bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_i8x32(q: [__m256i; 4], dst: *mut i8) {
    // The packs work per 128-bit half: dword j of the result holds values 4j'.. of
    // vector j % 4, half j / 4; the permute puts the dwords back in element order.
    let b = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: the caller guarantees 32 writable bytes; storeu is unaligned.
    unsafe { _mm256_storeu_si256(dst as *mut __m256i, b) };
}

/// A quantized Q8_0 block's side data: its scale widened to f32 (`s`) and `-16 x` the
/// sums of its four-quant lanes (`l`), as `kernels::Acts::Q8_0` keeps them.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn side_data(y: &BlockQ8_0, s: &mut f32, l: &mut [i32; 8]) {
    *s = f16c_to_f32(y.d);
    // SAFETY: 32 readable quant bytes, 8 writable i32; loadu/storeu are unaligned.
    unsafe {
        let q = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
        let sums = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
            _mm256_set1_epi16(1),
        );
        let v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<4>(sums));
        _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, v);
    }
}

/// Quantizes one activation row to Q8_0 exactly as `flint_core::quant::quantize_row_q8_0_act`
/// (per block: `amax` the largest magnitude, `d = amax / 127` stored as f16,
/// `q = nearest_int(x * (127 / amax))` saturated to i8, round half to even), and writes
/// each block's scale widened back to f32 and its `-16 x` sums of four quants (the side
/// data of `kernels::Acts::Q8_0`). A block with a NaN or infinite value goes through the
/// core function.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_q8_0_act_row(
    x: &[f32],
    out: &mut [BlockQ8_0],
    scales: &mut [f32],
    neg16: &mut [[i32; 8]],
) {
    assert!(
        x.len() == out.len() * 32 && scales.len() == out.len() && neg16.len() == out.len(),
        "quantize_q8_0_act_row: lengths"
    );
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    for (((xb, y), s), l) in x
        .chunks_exact(32)
        .zip(out.iter_mut())
        .zip(scales.iter_mut())
        .zip(neg16.iter_mut())
    {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut a = [_mm256_setzero_si256(); 4];
        for (j, (vj, aj)) in v.iter_mut().zip(a.iter_mut()).enumerate() {
            // SAFETY: 8 readable f32 at `8j` of a 32-value block; loadu is unaligned.
            *vj = unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * j)) };
            *aj = _mm256_and_si256(_mm256_castps_si256(*vj), abs_mask);
        }
        // Magnitudes as bits order as the floats do (NaN above infinity).
        let bad = non_finite(_mm256_max_epi32(
            _mm256_max_epi32(a[0], a[1]),
            _mm256_max_epi32(a[2], a[3]),
        ));
        if bad {
            flint_core::quant::quantize_row_q8_0_act(xb, std::slice::from_mut(y));
        } else {
            // The maximum of finite magnitudes is exact in any order.
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_castsi256_ps(a[0]), _mm256_castsi256_ps(a[1])),
                _mm256_max_ps(_mm256_castsi256_ps(a[2]), _mm256_castsi256_ps(a[3])),
            );
            let amax = hmax(m);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let mut q = [_mm256_setzero_si256(); 4];
            for (qj, vj) in q.iter_mut().zip(v) {
                // Round half to even (the default rounding mode).
                *qj = _mm256_cvtps_epi32(_mm256_mul_ps(vj, idv));
            }
            // SAFETY: `qs` is 32 writable bytes.
            unsafe { store_i8x32(q, y.qs.as_mut_ptr()) };
            y.d = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d)))
                as u16;
        }
        // SAFETY: the caller's features include AVX2 and F16C.
        unsafe { side_data(y, s, l) };
    }
}

/// Quantizes one activation row to Q8_K exactly as `flint_core::quant::quantize_row_q8_k`
/// (per block of 256: `max` the first element of largest magnitude, `iscale = -127 / max`,
/// `q = min(127, nearest_int(iscale * x))` rounding half to even, `d = 1 / iscale`, the
/// sums of each 16 quants; an all-zero block all zeros). A block with a NaN or infinite
/// value goes through the core function.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_q8_k_row(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * 256, "quantize_q8_k_row: lengths");
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    for (xb, y) in x.chunks_exact(256).zip(out.iter_mut()) {
        let load = |j: usize| {
            // SAFETY: 8 readable f32 at `8j < 256` of a 256-value block; loadu is
            // unaligned.
            unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * j)) }
        };
        let mut m = _mm256_setzero_si256();
        for j in 0..32 {
            let a = _mm256_and_si256(_mm256_castps_si256(load(j)), abs_mask);
            // Magnitudes as bits order as the floats do (NaN above infinity).
            m = _mm256_max_epi32(m, a);
        }
        if non_finite(m) {
            flint_core::quant::quantize_row_q8_k(xb, std::slice::from_mut(y));
            continue;
        }
        // Finite magnitudes: their maximum is exact in any order.
        let amax = hmax(_mm256_castsi256_ps(m));
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; 256];
            y.bsums = [0; 16];
            continue;
        }
        // The first element of that magnitude, with its sign.
        let am = _mm256_set1_ps(amax);
        let mut max = amax;
        for j in 0..32 {
            let a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(load(j)), abs_mask));
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, am));
            if hit != 0 {
                max = xb[8 * j + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let sv = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        for g in 0..8 {
            let mut q = [_mm256_setzero_si256(); 4];
            for (i, qi) in q.iter_mut().enumerate() {
                *qi = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(sv, load(4 * g + i))), top);
            }
            for h in 0..2 {
                let s = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
                y.bsums[2 * g + h] = _mm_cvtsi128_si32(s) as i16;
            }
            // SAFETY: 32 writable quant bytes at `32g`.
            unsafe { store_i8x32(q, y.qs.as_mut_ptr().add(32 * g)) };
        }
        y.d = 1.0 / iscale;
    }
}
