//! `flint-core`: the GGUF block formats and the kernel math, with scalar reference kernels.
//!
//! This crate is `#![no_std]` (with an `alloc` feature for the few functions that return
//! owned buffers) and contains no `unsafe`. Every other crate checks its kernels against
//! the scalar references here.
//!
//! Layout:
//! - [`types`]: the [`GgmlType`] enum (GGUF ids, elements per block, bytes per block).
//! - [`blocks`]: one `#[repr(C)]` bytemuck `Pod` struct per block format, size-asserted.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "alloc")]
#[allow(unused_extern_crates)]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod blocks;
pub mod dequant;
pub mod dot;
pub mod math;
pub mod quant;
pub mod types;

#[cfg(feature = "alloc")]
pub use dequant::dequantize_to_vec;
pub use dequant::{dequantize, dequantize_blocks, DequantBlock};
#[cfg(feature = "alloc")]
pub use dot::matvec_f32;
pub use dot::{dot_row_f32, vec_dot};
pub use quant::{
    quantize, quantize_act, quantize_row_q8_0, quantize_row_q8_0_act, quantize_row_q8_1,
    quantize_row_q8_1_act, quantize_row_q8_k,
};
pub use types::{FormatError, GgmlType, TypeError, QK_K};
