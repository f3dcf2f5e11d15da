//! Q8_0, Q4_0 and Q5_0 weights · Q8_0 activations on AVX2, in tinyBLAS's order
//! (`tinyblas.rs`): the blocks' quants as signed bytes. The caller must have checked
//! AVX2, FMA and F16C at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};

use crate::kernels::q0::tinyblas::dot_q0;
use crate::kernels::x86::avx2::{load32i, nibbles};

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
