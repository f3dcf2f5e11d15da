//! Q6_K weights · Q8_K activations on AVX-512 (F + BW), as `q4_k/avx512.rs`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::x86::avx2::{bcast16, f16c_to_f32, load32u, load_bsums};
use crate::kernels::x86::avx512::{join, load64};

/// Q6_K x Q8_K (unsigned quants, offset of 32 taken off through the block sums).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q6k<const R: usize>(x: &[BlockQ6K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    // Shuffle masks: 128-bit lane L of a 64-quant group takes sub-block scale L.
    let masks = [
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16(bcast16(1)),
                _mm_set1_epi16(bcast16(0)),
            )),
            _mm256_set_m128i(_mm_set1_epi16(bcast16(3)), _mm_set1_epi16(bcast16(2))),
        ),
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16(bcast16(5)),
                _mm_set1_epi16(bcast16(4)),
            )),
            _mm256_set_m128i(_mm_set1_epi16(bcast16(7)), _mm_set1_epi16(bcast16(6))),
        ),
    ];
    let mut acc = [_mm512_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let d = f16c_to_f32(b.d);
        // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
        let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let halves = [
            _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)),
            _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16)),
        ];
        let mut sumi = [_mm512_setzero_si512(); R];
        for n in 0..2 {
            let ql0 = load32u(&b.ql[64 * n..]);
            let ql1 = load32u(&b.ql[64 * n + 32..]);
            let h = load32u(&b.qh[32 * n..]);
            let q1 = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
            );
            let q2 = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(h), m3)),
            );
            let q3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(h), m3)),
            );
            let q4 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(h), m3)),
            );
            let groups = [join(q1, q2), join(q3, q4)];
            for (k, qv) in groups.iter().enumerate() {
                let s = _mm512_shuffle_epi8(halves[n], masks[k]);
                for r in 0..R {
                    let yv = load64(&y[r][i].qs[128 * n + 64 * k..]);
                    let p = _mm512_madd_epi16(_mm512_maddubs_epi16(*qv, yv), s);
                    sumi[r] = _mm512_add_epi32(sumi[r], p);
                }
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            // 32 * sum_k scale_k * bsum_k: the offset of the unsigned quants.
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, load_bsums(yb)));
            acc[r] = _mm512_fmadd_ps(
                _mm512_set1_ps(d * yb.d),
                // The offset sits in the low half; the high half subtracts zero.
                _mm512_cvtepi32_ps(_mm512_sub_epi32(
                    sumi[r],
                    _mm512_inserti64x4::<0>(_mm512_setzero_si512(), off),
                )),
                acc[r],
            );
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}
