//! Q8_0 / Q5_0 (and Q4_0) dot products in the float order of llama.cpp's tinyBLAS
//! (`tinyBLAS_Q0_AVX` in `ggml-cpu/llamafile/sgemm.cpp`), which llama.cpp's x86 CPU
//! backend uses for these weights whenever a matmul has two or more activation rows.
//!
//! Per output: eight f32 lanes; lane `l` takes, for each 32-quant block in order, the
//! integer dot product of quants `4l..4l+4` and accumulates `fma(d_w * d_a, sum, lane)`;
//! the lanes are added at the end as `hsum_ps` does. Bit for bit
//! `flint_core::dot::ggml_x86::vec_dot_*_tinyblas` (tests/tinyblas_order.rs). One
//! dependency chain per output: the rows of a tile give the out-of-order core its
//! parallelism.

use std::arch::x86_64::*;

use flint_core::blocks::BlockQ8_0;

use crate::kernels::x86::avx2::{f16_bcast, hsum_ps};

/// The tinyBLAS loop for a legacy 32-quant type against Q8_0: `dec` gives a block's
/// quants as i8, `scale` its f16 scale bits; `s[r]` holds the scales of `y[r]`'s blocks
/// widened to f32 (`Acts::Q8_0`'s `scales`: the same values the f16 conversion gives, so
/// a broadcast load replaces a conversion per block and row).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
pub(crate) unsafe fn dot_q0<B, const R: usize>(
    x: &[B],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
    dec: impl Fn(&B) -> __m256i,
    scale: impl Fn(&B) -> u16,
) {
    // SAFETY (whole body): the caller guarantees AVX2/FMA/F16C; the loads read 32 bytes
    // from 32-byte quant arrays.
    unsafe {
        for r in 0..R {
            assert!(
                y[r].len() >= x.len() && s[r].len() >= x.len(),
                "dot_q0: short activation row"
            );
        }
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, b) in x.iter().enumerate() {
            let q = dec(b);
            let ax = _mm256_sign_epi8(q, q);
            let d = f16_bcast(scale(b));
            for r in 0..R {
                let yb = &y[r][i];
                let yv = _mm256_loadu_si256(yb.qs.as_ptr() as *const __m256i);
                let sy = _mm256_sign_epi8(yv, q);
                // Lane l: quants 4l..4l+4 (maddubs pairs, madd pairs of pairs): exact.
                let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
                let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(&s[r][i]));
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc[r]);
            }
        }
        for r in 0..R {
            out[r] = hsum_ps(acc[r]);
        }
    }
}
