//! The activation quantizers with AVX-512, lane for lane the operations of the scalar
//! `flint_core::quant` ones (the same bytes).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ8K, BlockQ8_0};

use super::avx2::side_data;

/// Quantizes one activation row to Q8_0 exactly as `flint_core::quant::quantize_row_q8_0_act`
/// (per block: `amax` the largest magnitude, `d = amax / 127` stored as f16,
/// `q = nearest_int(x * (127 / amax))` saturated to i8, round half to even), and writes
/// each block's scale widened back to f32 and its `-16 x` sums of four quants (the side
/// data of `kernels::Acts::Q8_0`). A block with a NaN or infinite value goes through the
/// core function (whose NaN handling the vector code does not copy).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let inf = _mm512_set1_epi32(0x7f80_0000);
    for (((xb, y), s), l) in x
        .chunks_exact(32)
        .zip(out.iter_mut())
        .zip(scales.iter_mut())
        .zip(neg16.iter_mut())
    {
        // SAFETY: `xb` is 32 readable f32; loadu is unaligned.
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(xb.as_ptr()),
                _mm512_loadu_ps(xb.as_ptr().add(16)),
            )
        };
        let (aa, ab) = (
            _mm512_and_si512(_mm512_castps_si512(a), abs_mask),
            _mm512_and_si512(_mm512_castps_si512(b), abs_mask),
        );
        // NaN or infinity: an exponent of all ones.
        let bad = _mm512_cmpge_epi32_mask(aa, inf) | _mm512_cmpge_epi32_mask(ab, inf);
        if bad != 0 {
            flint_core::quant::quantize_row_q8_0_act(xb, std::slice::from_mut(y));
        } else {
            // The maximum of finite magnitudes is exact in any order.
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_castsi512_ps(aa),
                _mm512_castsi512_ps(ab),
            ));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            // Round half to even (the default rounding mode), then saturate to i8.
            let qa = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, idv)));
            let qb = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, idv)));
            // SAFETY: `qs` is 32 writable bytes; storeu is unaligned.
            unsafe {
                _mm_storeu_si128(y.qs.as_mut_ptr() as *mut __m128i, qa);
                _mm_storeu_si128(y.qs.as_mut_ptr().add(16) as *mut __m128i, qb);
            }
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
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn quantize_q8_k_row(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * 256, "quantize_q8_k_row: lengths");
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let inf = _mm512_set1_epi32(0x7f80_0000);
    for (xb, y) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut v = [_mm512_setzero_ps(); 16];
        let mut m = _mm512_setzero_ps();
        let mut bad = 0u16;
        for (j, vj) in v.iter_mut().enumerate() {
            // SAFETY: 16 readable f32 at `16j` of a 256-value block; loadu is unaligned.
            *vj = unsafe { _mm512_loadu_ps(xb.as_ptr().add(16 * j)) };
            let a = _mm512_and_si512(_mm512_castps_si512(*vj), abs_mask);
            bad |= _mm512_cmpge_epi32_mask(a, inf);
            m = _mm512_max_ps(m, _mm512_castsi512_ps(a));
        }
        if bad != 0 {
            flint_core::quant::quantize_row_q8_k(xb, std::slice::from_mut(y));
            continue;
        }
        // Finite magnitudes: their maximum is exact in any order.
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; 256];
            y.bsums = [0; 16];
            continue;
        }
        // The first element of that magnitude, with its sign.
        let am = _mm512_set1_ps(amax);
        let mut max = amax;
        for (j, vj) in v.iter().enumerate() {
            let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(*vj), abs_mask));
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, am);
            if hit != 0 {
                max = xb[16 * j + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let sv = _mm512_set1_ps(iscale);
        let top = _mm512_set1_epi32(127);
        for (j, vj) in v.iter().enumerate() {
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(sv, *vj)), top);
            y.bsums[j] = _mm512_reduce_add_epi32(q) as i16;
            // SAFETY: 16 writable quant bytes at `16j`; storeu is unaligned.
            unsafe {
                _mm_storeu_si128(
                    y.qs.as_mut_ptr().add(16 * j) as *mut __m128i,
                    _mm512_cvtsepi32_epi8(q),
                )
            };
        }
        y.d = 1.0 / iscale;
    }
}
