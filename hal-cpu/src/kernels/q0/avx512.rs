//! Q8_0, Q4_0 and Q5_0 weights · Q8_0 activations at the AVX-512 level: tinyBLAS's order
//! (`tinyblas.rs`) on the AVX2 byte decoders (`q0/avx2.rs`); the caller must have
//! checked AVX-512F/BW (and AVX2/FMA/F16C) at device open.

use flint_core::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};

use crate::kernels::q0::avx2::{q4_0_bytes, q5_0_bytes, q8_0_bytes};
use crate::kernels::q0::tinyblas::dot_q0;

/// Q8_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`; 256-bit lanes are
/// what fix that order, so there is no wider variant).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q8_0<const R: usize>(
    x: &[BlockQ8_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q8_0_bytes(b), |b| b.d) }
}

/// Q4_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q4_0<const R: usize>(
    x: &[BlockQ4_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q4_0_bytes(b), |b| b.d) }
}

/// Q5_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q5_0<const R: usize>(
    x: &[BlockQ5_0],
    y: &[&[BlockQ8_0]; R],
    s: &[&[f32]; R],
    out: &mut [f32; R],
) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { dot_q0(x, y, s, out, |b| q5_0_bytes(b), |b| b.d) }
}
