//! Scalar reference dot products: one weight row against one activation row, for every
//! weight type in [`GgmlType::DEQUANTIZABLE`], with the activation in the type ggml pairs
//! it with ([`GgmlType::vec_dot_type`]).
//!
//! | weights | activation |
//! |---|---|
//! | Q2_K..Q6_K, TQ1_0, TQ2_0, IQ1_S, IQ1_M, IQ2_*, IQ3_*, IQ4_XS | Q8_K |
//! | Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 | Q8_0 |
//! | Q4_1, Q5_1 | Q8_1 |
//! | F32, F16, BF16 | f32 |
//!
//! The quantized kernels follow ggml's generic C kernels (`ggml-cpu/quants.c`): integer
//! products summed in `i32` within a block (or sub-block), the block scales applied in
//! `f32`, in ggml's order, and the same cross-block accumulation (for Q3_K..Q6_K, eight
//! `f32` lanes). Rust does not contract `a * b + c` into a fused multiply-add, so the
//! result is what a non-FMA build of ggml's generic path gives: tests/dot_agreement.rs
//! checks every quantized type bit for bit against ggml's `ggml_vec_dot_*_generic`, on
//! given activations and on f32 activations quantized by ggml's `quantize_row_q8_*_ref`.
//!
//! Accuracy against the f32 dot product of the dequantized row (tested): with the same
//! quantized activation, `|err| <= 2^-16 * sum_blocks(max|w| * sum|a|)` (float rounding
//! only; Q4_1/Q5_1 add the f16 rounding of the activation's block sum); against the
//! unquantized activation `x`, add `sum_i |w_i| * amax(x in i's block) / 127`.
//!
//! Float weights differ from ggml on purpose: ggml rounds the activation to the weight's
//! type (f16 or bf16) before the dot; here the activation stays f32, and products are
//! summed in `f64` as ggml's scalar path does. That makes the reference the more exact
//! of the two.
//!
//! Three ways in:
//! - typed: `vec_dot_<w>_<act>(&[BlockW], &[BlockAct]) -> f32` over block slices;
//! - [`vec_dot`]: by type over raw little-endian bytes (any alignment);
//! - [`dot_row_f32`]: quantizes an f32 activation to the paired type block by block
//!   (with [`crate::quant::quantize_act`]: ggml's x86 CPU activation quantizers, whose
//!   Q8_0 / Q8_1 rounding differs from the `_ref` ones on rare ties) and calls the kernel: the oracle for
//!   the device matmuls and the reference forward. Needs no allocator.
//! - [`matvec_f32`] (`alloc` feature): the same for many rows, quantizing once.
//! - [`matvec_f32_ggml_x86`] (`alloc` feature): as [`matvec_f32`], with Q8_0, Q5_0, Q6_K,
//!   Q4_K and MXFP4 rows summed in the float order of llama.cpp's x86 kernels for a prompt
//!   batch ([`ggml_x86`]; `docs/parity.md`).

pub mod ggml_x86;
mod iq;
mod kquants;
mod legacy;

use bytemuck::Pod;
use half::{bf16, f16 as F16};

use crate::blocks::*;
use crate::dequant::f16_to_f32;
use crate::quant::{quantize_row_q8_0_act, quantize_row_q8_1_act, quantize_row_q8_k};
use crate::types::{FormatError, GgmlType};

/// `sum_i w[i] * x[i]` for f32 weights: each product in f32, the sum in f64, as ggml's
/// scalar `ggml_vec_dot_f32` does.
pub fn vec_dot_f32(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vec_dot_f32: lengths differ");
    let mut s = 0.0f64;
    for (a, b) in w.iter().zip(x) {
        s += (a * b) as f64;
    }
    s as f32
}

/// [`vec_dot_f32`] for f16 weights (widened exactly) against f32 activations.
pub fn vec_dot_f16_f32(w: &[F16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vec_dot_f16_f32: lengths differ");
    let mut s = 0.0f64;
    for (a, b) in w.iter().zip(x) {
        s += (a.to_f32() * b) as f64;
    }
    s as f32
}

/// [`vec_dot_f32`] for bf16 weights (widened exactly) against f32 activations.
pub fn vec_dot_bf16_f32(w: &[bf16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vec_dot_bf16_f32: lengths differ");
    let mut s = 0.0f64;
    for (a, b) in w.iter().zip(x) {
        s += (a.to_f32() * b) as f64;
    }
    s as f32
}

macro_rules! typed {
    ($($(#[$m:meta])* $name:ident, $W:ty, $A:ty, $k:path;)*) => {$(
        $(#[$m])*
        ///
        /// # Panics
        /// If the two rows hold different numbers of blocks.
        pub fn $name(x: &[$W], y: &[$A]) -> f32 {
            assert_eq!(x.len(), y.len(), concat!(stringify!($name), ": block counts differ"));
            $k(x.iter().copied().zip(y.iter().copied()))
        }
    )*};
}

typed! {
    /// Q4_0 weights · Q8_0 activations.
    vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0, legacy::q4_0;
    /// Q4_1 weights · Q8_1 activations (uses the activation's block sums `s`).
    vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1, legacy::q4_1;
    /// Q5_0 weights · Q8_0 activations.
    vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0, legacy::q5_0;
    /// Q5_1 weights · Q8_1 activations (uses the activation's block sums `s`).
    vec_dot_q5_1_q8_1, BlockQ5_1, BlockQ8_1, legacy::q5_1;
    /// Q8_0 weights · Q8_0 activations.
    vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0, legacy::q8_0;
    /// IQ4_NL weights · Q8_0 activations.
    vec_dot_iq4_nl_q8_0, BlockIQ4NL, BlockQ8_0, legacy::iq4_nl;
    /// MXFP4 weights · Q8_0 activations.
    vec_dot_mxfp4_q8_0, BlockMXFP4, BlockQ8_0, legacy::mxfp4;
    /// Q2_K weights · Q8_K activations (uses the activation's `bsums` for the mins).
    vec_dot_q2_k_q8_k, BlockQ2K, BlockQ8K, kquants::q2_k;
    /// Q3_K weights · Q8_K activations.
    vec_dot_q3_k_q8_k, BlockQ3K, BlockQ8K, kquants::q3_k;
    /// Q4_K weights · Q8_K activations (uses the activation's `bsums` for the mins).
    vec_dot_q4_k_q8_k, BlockQ4K, BlockQ8K, kquants::q4_k;
    /// Q5_K weights · Q8_K activations (uses the activation's `bsums` for the mins).
    vec_dot_q5_k_q8_k, BlockQ5K, BlockQ8K, kquants::q5_k;
    /// Q6_K weights · Q8_K activations.
    vec_dot_q6_k_q8_k, BlockQ6K, BlockQ8K, kquants::q6_k;
    /// TQ1_0 weights · Q8_K activations.
    vec_dot_tq1_0_q8_k, BlockTQ1_0, BlockQ8K, kquants::tq1_0;
    /// TQ2_0 weights · Q8_K activations.
    vec_dot_tq2_0_q8_k, BlockTQ2_0, BlockQ8K, kquants::tq2_0;
    /// IQ4_XS weights · Q8_K activations.
    vec_dot_iq4_xs_q8_k, BlockIQ4XS, BlockQ8K, kquants::iq4_xs;
    /// IQ2_XXS weights · Q8_K activations.
    vec_dot_iq2_xxs_q8_k, BlockIQ2XXS, BlockQ8K, iq::iq2_xxs;
    /// IQ2_XS weights · Q8_K activations.
    vec_dot_iq2_xs_q8_k, BlockIQ2XS, BlockQ8K, iq::iq2_xs;
    /// IQ2_S weights · Q8_K activations.
    vec_dot_iq2_s_q8_k, BlockIQ2S, BlockQ8K, iq::iq2_s;
    /// IQ3_XXS weights · Q8_K activations.
    vec_dot_iq3_xxs_q8_k, BlockIQ3XXS, BlockQ8K, iq::iq3_xxs;
    /// IQ3_S weights · Q8_K activations.
    vec_dot_iq3_s_q8_k, BlockIQ3S, BlockQ8K, iq::iq3_s;
    /// IQ1_S weights · Q8_K activations (uses the activation's `bsums` for the delta).
    vec_dot_iq1_s_q8_k, BlockIQ1S, BlockQ8K, iq::iq1_s;
    /// IQ1_M weights · Q8_K activations.
    vec_dot_iq1_m_q8_k, BlockIQ1M, BlockQ8K, iq::iq1_m;
}

/// Calls `$go!(WeightBlock, ActBlock, kernel)` for a quantized type, or runs `$float`
/// for the float types; anything else is unsupported.
macro_rules! dispatch {
    ($ty:expr, $go:ident, $float:expr) => {
        match $ty {
            GgmlType::Q4_0 => $go!(BlockQ4_0, BlockQ8_0, legacy::q4_0),
            GgmlType::Q4_1 => $go!(BlockQ4_1, BlockQ8_1, legacy::q4_1),
            GgmlType::Q5_0 => $go!(BlockQ5_0, BlockQ8_0, legacy::q5_0),
            GgmlType::Q5_1 => $go!(BlockQ5_1, BlockQ8_1, legacy::q5_1),
            GgmlType::Q8_0 => $go!(BlockQ8_0, BlockQ8_0, legacy::q8_0),
            GgmlType::IQ4_NL => $go!(BlockIQ4NL, BlockQ8_0, legacy::iq4_nl),
            GgmlType::MXFP4 => $go!(BlockMXFP4, BlockQ8_0, legacy::mxfp4),
            GgmlType::Q2_K => $go!(BlockQ2K, BlockQ8K, kquants::q2_k),
            GgmlType::Q3_K => $go!(BlockQ3K, BlockQ8K, kquants::q3_k),
            GgmlType::Q4_K => $go!(BlockQ4K, BlockQ8K, kquants::q4_k),
            GgmlType::Q5_K => $go!(BlockQ5K, BlockQ8K, kquants::q5_k),
            GgmlType::Q6_K => $go!(BlockQ6K, BlockQ8K, kquants::q6_k),
            GgmlType::TQ1_0 => $go!(BlockTQ1_0, BlockQ8K, kquants::tq1_0),
            GgmlType::TQ2_0 => $go!(BlockTQ2_0, BlockQ8K, kquants::tq2_0),
            GgmlType::IQ4_XS => $go!(BlockIQ4XS, BlockQ8K, kquants::iq4_xs),
            GgmlType::IQ2_XXS => $go!(BlockIQ2XXS, BlockQ8K, iq::iq2_xxs),
            GgmlType::IQ2_XS => $go!(BlockIQ2XS, BlockQ8K, iq::iq2_xs),
            GgmlType::IQ2_S => $go!(BlockIQ2S, BlockQ8K, iq::iq2_s),
            GgmlType::IQ3_XXS => $go!(BlockIQ3XXS, BlockQ8K, iq::iq3_xxs),
            GgmlType::IQ3_S => $go!(BlockIQ3S, BlockQ8K, iq::iq3_s),
            GgmlType::IQ1_S => $go!(BlockIQ1S, BlockQ8K, iq::iq1_s),
            GgmlType::IQ1_M => $go!(BlockIQ1M, BlockQ8K, iq::iq1_m),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => $float,
            other => Err(FormatError::Unsupported(other)),
        }
    };
}

/// Reads the blocks of a byte row at any alignment.
fn blocks<B: Pod>(bytes: &[u8]) -> impl Iterator<Item = B> + '_ {
    bytes
        .chunks_exact(core::mem::size_of::<B>())
        .map(bytemuck::pod_read_unaligned)
}

/// Checks that `bytes` is a whole number of `ty` blocks holding `n` elements.
fn check_row(ty: GgmlType, bytes: &[u8], n: usize) -> Result<(), FormatError> {
    let ts = ty.type_size();
    if !bytes.len().is_multiple_of(ts) {
        return Err(FormatError::PartialBlock {
            ty,
            bytes: bytes.len(),
        });
    }
    let elems = bytes.len() / ts * ty.block_size();
    if elems != n {
        return Err(FormatError::LengthMismatch {
            expected: elems,
            found: n,
        });
    }
    Ok(())
}

/// The elements of a float row (F32, F16 or BF16 little-endian bytes).
fn float_weights(ty: GgmlType, w: &[u8]) -> impl Iterator<Item = f32> + '_ {
    let step = ty.type_size();
    w.chunks_exact(step).map(move |c| match ty {
        GgmlType::F16 => f16_to_f32(u16::from_le_bytes([c[0], c[1]])),
        GgmlType::BF16 => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
        _ => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    })
}

/// Float weights · f32 activations, summed as [`vec_dot_f32`].
fn float_dot(w: impl Iterator<Item = f32>, x: impl Iterator<Item = f32>) -> f32 {
    let mut s = 0.0f64;
    for (a, b) in w.zip(x) {
        s += (a * b) as f64;
    }
    s as f32
}

/// The dot product of one weight row of `n` elements of type `ty` (raw little-endian
/// bytes, any alignment) with an activation row already quantized to
/// `ty.vec_dot_type()` (raw bytes; for F32/F16/BF16 weights, `n` f32 little-endian
/// values).
///
/// # Errors
/// [`FormatError::Unsupported`] for a type outside [`GgmlType::DEQUANTIZABLE`];
/// [`FormatError::PartialBlock`] when a row is not whole blocks;
/// [`FormatError::LengthMismatch`] when a row does not hold `n` elements.
pub fn vec_dot(ty: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> Result<f32, FormatError> {
    if !GgmlType::DEQUANTIZABLE.contains(&ty) {
        return Err(FormatError::Unsupported(ty));
    }
    check_row(ty, w_row, n)?;
    let act_ty = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => GgmlType::F32,
        _ => ty.vec_dot_type(),
    };
    check_row(act_ty, act, n)?;
    macro_rules! go {
        ($W:ty, $A:ty, $k:path) => {
            Ok($k(blocks::<$W>(w_row).zip(blocks::<$A>(act))))
        };
    }
    dispatch!(
        ty,
        go,
        Ok(float_dot(
            float_weights(ty, w_row),
            float_weights(GgmlType::F32, act)
        ))
    )
}

/// The dot product of one weight row (type `ty`, raw little-endian bytes, any
/// alignment) with an f32 activation row `x`, the activation quantized block by block to
/// `ty.vec_dot_type()` exactly as ggml's x86 CPU backend does before its matmuls
/// (`quantize_row_q8_0` / `_q8_1` / `_q8_k`: [`crate::quant::quantize_act`]); float
/// weights use `x` as is.
///
/// This is the oracle for device matmuls and the reference forward pass. It needs no
/// allocator: each activation block is quantized on the stack as the row is walked.
///
/// # Errors
/// As [`vec_dot`], with `n = x.len()`.
pub fn dot_row_f32(ty: GgmlType, w_row: &[u8], x: &[f32]) -> Result<f32, FormatError> {
    if !GgmlType::DEQUANTIZABLE.contains(&ty) {
        return Err(FormatError::Unsupported(ty));
    }
    check_row(ty, w_row, x.len())?;
    let bs = ty.block_size();
    macro_rules! go {
        ($W:ty, $A:ty, $k:path) => {
            Ok($k(blocks::<$W>(w_row)
                .zip(x.chunks_exact(bs))
                .map(|(w, xb)| (w, quantize_act::<$A>(xb)))))
        };
    }
    dispatch!(
        ty,
        go,
        Ok(float_dot(float_weights(ty, w_row), x.iter().copied()))
    )
}

/// The bytes of one weight row of a matvec of `x` into `out`, after checking that `x` is
/// whole blocks of `ty` and that `w` is exactly `out.len()` rows.
#[cfg(feature = "alloc")]
fn matvec_row_bytes(ty: GgmlType, w: &[u8], x: &[f32], out: &[f32]) -> Result<usize, FormatError> {
    let row = ty.row_bytes(x.len()).ok_or(FormatError::LengthMismatch {
        expected: x.len().next_multiple_of(ty.block_size()),
        found: x.len(),
    })?;
    let expected = row.saturating_mul(out.len());
    if w.len() != expected {
        return Err(FormatError::LengthMismatch {
            expected,
            found: w.len(),
        });
    }
    Ok(row)
}

/// Matrix-vector product over `out.len()` weight rows stored back to back in `w`
/// (type `ty`, `x.len()` elements each): `out[r] = dot_row_f32(ty, row r, x)`, bit for
/// bit, but with `x` quantized once instead of once per row.
///
/// # Errors
/// As [`vec_dot`]; [`FormatError::LengthMismatch`] (in bytes) when `w` is not
/// `out.len()` rows.
#[cfg(feature = "alloc")]
pub fn matvec_f32(ty: GgmlType, w: &[u8], x: &[f32], out: &mut [f32]) -> Result<(), FormatError> {
    if !GgmlType::DEQUANTIZABLE.contains(&ty) {
        return Err(FormatError::Unsupported(ty));
    }
    let row = matvec_row_bytes(ty, w, x, out)?;
    // With n = 0 every row is empty and its dot product 0.
    out.fill(0.0);
    if !ty.is_quantized() {
        for (o, wr) in out.iter_mut().zip(w.chunks_exact(row.max(1))) {
            *o = dot_row_f32(ty, wr, x)?;
        }
        return Ok(());
    }
    let act_ty = ty.vec_dot_type();
    let mut act = alloc::vec![0u8; act_ty.row_bytes(x.len()).unwrap_or(0)];
    crate::quant::quantize_act(act_ty, x, &mut act)?;
    for (o, wr) in out.iter_mut().zip(w.chunks_exact(row.max(1))) {
        *o = vec_dot(ty, wr, &act, x.len())?;
    }
    Ok(())
}

/// An activation block type and its ggml quantizer.
trait ActBlock: Pod {
    fn quantize(x: &[f32], out: &mut [Self]);
}
impl ActBlock for BlockQ8_0 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row_q8_0_act(x, out)
    }
}
impl ActBlock for BlockQ8_1 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row_q8_1_act(x, out)
    }
}
impl ActBlock for BlockQ8K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row_q8_k(x, out)
    }
}

/// Quantizes one block of activations.
fn quantize_act<A: ActBlock>(x: &[f32]) -> A {
    let mut b = A::zeroed();
    A::quantize(x, core::slice::from_mut(&mut b));
    b
}

/// [`matvec_f32`] in the float order of llama.cpp's x86 kernels ([`ggml_x86`]) for
/// Q8_0, Q5_0, Q5_K, Q6_K, Q4_K, MXFP4 and F32 weights
/// (tinyBLAS's order where it computes the matmul, [`ggml_x86::BatchRow::f32_tinyblas`];
/// `ggml_vec_dot_f32`'s elsewhere), for the activation row `at` of a llama.cpp
/// matmul (its batch size and row pick the kernels); any other type exactly as
/// [`matvec_f32`]. Q4_K and MXFP4 rows take llama.cpp's repacked orders, which it uses
/// for matrices of a multiple of 8 rows.
/// The activation is quantized as there.
///
/// # Errors
/// As [`matvec_f32`].
#[cfg(feature = "alloc")]
pub fn matvec_f32_ggml_x86(
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    out: &mut [f32],
    at: ggml_x86::BatchRow,
) -> Result<(), FormatError> {
    use alloc::vec::Vec;
    if ty == GgmlType::F32 {
        let row = matvec_row_bytes(ty, w, x, out)?;
        let mut wr = alloc::vec![0.0f32; x.len()];
        for (o, wb) in out.iter_mut().zip(w.chunks_exact(row.max(1))) {
            for (v, c) in wr.iter_mut().zip(wb.chunks_exact(4)) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            *o = if at.f32_tinyblas() {
                ggml_x86::vec_dot_f32_tinyblas(at.build, &wr, x)
            } else {
                ggml_x86::vec_dot_f32_ggml(at.build, &wr, x)
            };
        }
        return Ok(());
    }
    if !matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q4_K
            | GgmlType::MXFP4
    ) {
        return matvec_f32(ty, w, x, out);
    }
    let row = matvec_row_bytes(ty, w, x, out)?;
    out.fill(0.0);
    if x.is_empty() {
        return Ok(());
    }
    let act_ty = ty.vec_dot_type();
    let mut act = alloc::vec![0u8; act_ty.row_bytes(x.len()).unwrap_or(0)];
    crate::quant::quantize_act(act_ty, x, &mut act)?;
    macro_rules! rows {
        ($W:ty, $A:ty, $f:expr) => {{
            let a: Vec<$A> = blocks::<$A>(&act).collect();
            for (o, wr) in out.iter_mut().zip(w.chunks_exact(row)) {
                let wb: Vec<$W> = blocks::<$W>(wr).collect();
                *o = $f(&wb, &a);
            }
        }};
    }
    match ty {
        GgmlType::Q8_0 => rows!(BlockQ8_0, BlockQ8_0, ggml_x86::vec_dot_q8_0_q8_0_tinyblas),
        GgmlType::Q5_0 => rows!(BlockQ5_0, BlockQ8_0, ggml_x86::vec_dot_q5_0_q8_0_tinyblas),
        GgmlType::Q5_K if at.kq_tiled() => {
            rows!(BlockQ5K, BlockQ8K, ggml_x86::vec_dot_q5_k_q8_k_tiled)
        }
        GgmlType::Q5_K => rows!(BlockQ5K, BlockQ8K, ggml_x86::vec_dot_q5_k_q8_k_avx2),
        GgmlType::Q6_K if at.kq_tiled() => {
            rows!(BlockQ6K, BlockQ8K, ggml_x86::vec_dot_q6_k_q8_k_tiled)
        }
        GgmlType::Q6_K => rows!(BlockQ6K, BlockQ8K, ggml_x86::vec_dot_q6_k_q8_k_avx2),
        // As for Q4_K: the repacked order, llama.cpp's for matrices of a multiple of 8
        // rows (`mxfp4_8x8`), whatever the rows passed here.
        GgmlType::MXFP4 => rows!(BlockMXFP4, BlockQ8_0, ggml_x86::vec_dot_mxfp4_q8_0_repack),
        _ => rows!(BlockQ4K, BlockQ8K, |wb: &[BlockQ4K], a: &[BlockQ8K]| {
            ggml_x86::vec_dot_q4_k_q8_k_repack(wb, a, at.q4k())
        }),
    }
    Ok(())
}
