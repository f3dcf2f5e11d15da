//! Quantization: the activation formats (Q8_0, Q8_1, Q8_K) that the dot products consume,
//! and reference quantizers for writing model files.
//!
//! Every quantizer reproduces ggml's reference (`quantize_row_*_ref` in
//! `ggml/src/ggml-quants.c`) operation for operation in f32, including its rounding
//! rules, so that the bytes match what llama.cpp (and, for Q4_0 / Q5_0 / Q8_0, the
//! `gguf` Python package) writes for the same input.
//!
//! The typed row functions (`quantize_row_*`) take a slice of blocks and panic when the
//! lengths disagree: that is a caller bug, not bad input. The byte-level [`quantize`]
//! checks lengths and returns a [`FormatError`] instead.

mod kquants;

pub use kquants::{quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k};

use bytemuck::Pod;

use crate::blocks::{
    BlockMXFP4, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    QK4_0, QK8_0,
};
use crate::dequant::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::types::{FormatError, GgmlType, QK_K};

/// f32 → IEEE half bits, rounding to nearest even (what `GGML_FP32_TO_FP16` and numpy's
/// `astype(np.float16)` do; overflow gives infinity). A NaN keeps the top 10 bits of
/// its payload, or becomes payload 1 if those are zero, and is not made quiet: numpy's
/// rule, which `gguf.quants.quantize` follows.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let man = ((b & 0x007f_ffff) >> 13) as u16;
        return sign | 0x7c00 | if man == 0 { 1 } else { man };
    }
    half::f16::from_f32(x).to_bits()
}

/// C's `roundf`: round half away from zero. `core` has no `f32::round` without `std`,
/// so it is built from a truncating cast, which is exact below 2^23 (above it every f32
/// is already an integer).
#[inline]
pub(crate) fn round_away(x: f32) -> f32 {
    if x.is_nan() || x.abs() >= 8_388_608.0 {
        return x; // integers, infinities and NaN round to themselves
    }
    let t = (x as i32) as f32;
    let frac = x - t; // exact: x and t share the exponent range
    let r = if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    };
    // roundf keeps the sign of zero (-0.3 rounds to -0.0).
    r.copysign(x)
}

/// ggml's `nearest_int`: adds 1.5 * 2^23 so that the FPU's round-to-nearest-even puts the
/// integer into the low mantissa bits, then reads them back. Reproduced bit for bit
/// (valid for |x| < 2^22, which every caller guarantees; other inputs give garbage, never
/// a panic, as in C).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    ((v.to_bits() as i32) & 0x007f_ffff) - 0x0040_0000
}

/// Largest absolute value of a block, as ggml's `MAX(amax, fabsf(v))` loop computes it
/// (a NaN element is skipped, like C's `MAX` with the NaN on the right).
#[inline]
fn abs_max(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// Quantizes a row to Q8_0 (ggml `quantize_row_q8_0_ref`): per block of 32,
/// `d = amax / 127` (stored as f16) and `q = roundf(x / d)` computed as `x * (1/d)`.
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        out.len() * QK8_0,
        "quantize_row_q8_0: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK8_0).zip(out.iter_mut()) {
        let d = abs_max(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f32_to_f16(d);
        for (q, &v) in y.qs.iter_mut().zip(xb) {
            *q = round_away(v * id) as i8;
        }
    }
}

/// Quantizes a row to Q8_1 (ggml `quantize_row_q8_1_ref`): as Q8_0, plus
/// `s = d * sum(q)` (f32 product of the f32 `d` and the integer sum, stored as f16).
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        out.len() * QK8_0,
        "quantize_row_q8_1: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK8_0).zip(out.iter_mut()) {
        let d = abs_max(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f32_to_f16(d);
        let mut sum: i32 = 0;
        for (q, &v) in y.qs.iter_mut().zip(xb) {
            *q = round_away(v * id) as i8;
            sum += *q as i32;
        }
        y.s = f32_to_f16(sum as f32 * d);
    }
}

/// The scale and rounding of ggml's CPU activation quantizer for Q8_0 / Q8_1 on x86
/// (`quantize_row_q8_0` / `_q8_1` in `ggml-cpu/arch/x86/quants.c`, the AVX/AVX2 path that
/// every AVX-512 build takes): `d = amax / 127`, but the multiplier is `id = 127 / amax`
/// (not `1 / d`) and the product rounds half to even (`_mm256_round_ps`), not half away
/// from zero. The two differ only on rare ties and one-ulp multiplier differences, but the
/// Gemma 3 logits are sensitive enough for that to show; this is what llama.cpp's
/// logits are computed from, so matmuls quantize their activations with it.
#[inline]
fn q8_act_block(xb: &[f32], qs: &mut [i8]) -> f32 {
    let amax = abs_max(xb);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(xb) {
        // |v * id| <= 127 up to rounding; the clamp is the saturating pack of the SIMD code.
        *q = nearest_int(v * id).clamp(-128, 127) as i8;
    }
    d
}

/// Quantizes an activation row to Q8_0 as ggml's x86 CPU backend does before a matmul
/// with Q8_0 / Q5_0 / Q4_0 / ... weights (see [`q8_act_block`] for how this differs from
/// [`quantize_row_q8_0`], the file-writing reference).
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q8_0_act(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        out.len() * QK8_0,
        "quantize_row_q8_0_act: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK8_0).zip(out.iter_mut()) {
        let d = q8_act_block(xb, &mut y.qs);
        y.d = f32_to_f16(d);
    }
}

/// Quantizes an activation row to Q8_1 as ggml's x86 CPU backend does (as
/// [`quantize_row_q8_0_act`], plus `s = d * sum(q)` stored as f16).
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q8_1_act(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        out.len() * QK8_0,
        "quantize_row_q8_1_act: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK8_0).zip(out.iter_mut()) {
        let d = q8_act_block(xb, &mut y.qs);
        y.d = f32_to_f16(d);
        let sum: i32 = y.qs.iter().map(|&q| q as i32).sum();
        y.s = f32_to_f16(sum as f32 * d);
    }
}

/// Quantizes an activation row to `ty` (Q8_0, Q8_1 or Q8_K, a `vec_dot_type`) as ggml's
/// CPU backend does before its matmuls: [`quantize_row_q8_0_act`],
/// [`quantize_row_q8_1_act`], or [`quantize_row_q8_k`] (ggml uses the reference there).
///
/// # Errors
/// [`FormatError::Unsupported`] for any other type; [`FormatError::PartialBlock`] /
/// [`FormatError::LengthMismatch`] as [`quantize`].
pub fn quantize_act(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), FormatError> {
    match ty {
        GgmlType::Q8_0 => {
            check_act(ty, src, dst)?;
            encode_blocks(src, dst, QK8_0, quantize_row_q8_0_act);
            Ok(())
        }
        GgmlType::Q8_1 => {
            check_act(ty, src, dst)?;
            encode_blocks(src, dst, QK8_0, quantize_row_q8_1_act);
            Ok(())
        }
        GgmlType::Q8_K => quantize(ty, src, dst),
        other => Err(FormatError::Unsupported(other)),
    }
}

/// Length checks for [`quantize_act`]'s byte rows.
fn check_act(ty: GgmlType, src: &[f32], dst: &[u8]) -> Result<(), FormatError> {
    let ts = ty.type_size();
    if !dst.len().is_multiple_of(ts) {
        return Err(FormatError::PartialBlock {
            ty,
            bytes: dst.len(),
        });
    }
    let n = dst.len() / ts * ty.block_size();
    if n != src.len() {
        return Err(FormatError::LengthMismatch {
            expected: n,
            found: src.len(),
        });
    }
    Ok(())
}

/// Quantizes a row to Q8_K (ggml `quantize_row_q8_K_ref`): per block of 256, with `max`
/// the element of largest magnitude (first one on ties), `iscale = -127 / max`,
/// `q = min(127, nearest_int(iscale * x))`, `d = 1 / iscale` (f32), and `bsums[j]` the sum
/// of quants `16j .. 16j+16`. An all-zero block gets `d = 0`, zero quants and zero sums.
///
/// # Panics
/// When `x.len() != out.len() * 256` (a caller bug).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q8_k: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; QK_K];
            y.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, group) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| q as i16).sum();
        }
        y.d = 1.0 / iscale;
    }
}

/// The element of largest magnitude (the first one on ties), with its sign, as ggml's
/// legacy quantizers and numpy's `argmax(abs(x))` pick it.
#[inline]
fn signed_abs_max(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// C's `truncf` (toward zero), built on a truncating cast for the same reason as
/// [`round_away`].
#[inline]
fn trunc(x: f32) -> f32 {
    if x.is_nan() || x.abs() >= 8_388_608.0 {
        return x;
    }
    ((x as i32) as f32).copysign(x)
}

/// Quantizes a row to Q4_0 (ggml `quantize_row_q4_0_ref`, byte-identical with
/// `gguf.quants.quantize`): `d = max / -8` where `max` is the element of largest
/// magnitude, `q = min(15, trunc(x * (1/d) + 8.5))`.
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q4_0(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(
        x.len(),
        out.len() * QK4_0,
        "quantize_row_q4_0: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK4_0).zip(out.iter_mut()) {
        let d = signed_abs_max(xb) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f32_to_f16(d);
        let q = |v: f32| (trunc(v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..QK4_0 / 2 {
            y.qs[j] = q(xb[j]) | (q(xb[j + QK4_0 / 2]) << 4);
        }
    }
}

/// Quantizes a row to MXFP4 (ggml `quantize_row_mxfp4_ref`, byte-identical with
/// `llama-quantize`'s MXFP4 tensors): the shared exponent `e = floor(log2(amax)) - 2 + 127`
/// (0 for an all-zero block), and each value the E2M1 code whose
/// `KVALUES_MXFP4[i] * e8m0_half(e)` is nearest (the lower code on a tie), the first 16
/// values in the low nibbles.
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_mxfp4(x: &[f32], out: &mut [BlockMXFP4]) {
    assert_eq!(
        x.len(),
        out.len() * QK4_0,
        "quantize_row_mxfp4: {} values for {} blocks",
        x.len(),
        out.len()
    );
    let best = |v: f32, d: f32| -> u8 {
        let mut best = 0u8;
        let mut best_err = (KVALUES_MXFP4[0] as f32 * d - v).abs();
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (k as f32 * d - v).abs();
            if err < best_err {
                best = i as u8;
                best_err = err;
            }
        }
        best
    };
    for (xb, y) in x.chunks_exact(QK4_0).zip(out.iter_mut()) {
        let amax = xb
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        // As C converts the float to `uint8_t` on x86: through a 32-bit integer.
        let e = if amax > 0.0 {
            (libm::floorf(libm::log2f(amax)) - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        y.e = e;
        for j in 0..QK4_0 / 2 {
            y.qs[j] = best(xb[j], d) | (best(xb[j + QK4_0 / 2], d) << 4);
        }
    }
}

/// Quantizes a row to Q5_0 (ggml `quantize_row_q5_0_ref`, byte-identical with
/// `gguf.quants.quantize`): `d = max / -16`, `q = min(31, trunc(x * (1/d) + 16.5))`, the
/// fifth bit of element `j` in bit `j` of `qh`.
///
/// # Panics
/// When `x.len() != out.len() * 32` (a caller bug).
pub fn quantize_row_q5_0(x: &[f32], out: &mut [BlockQ5_0]) {
    assert_eq!(
        x.len(),
        out.len() * QK4_0,
        "quantize_row_q5_0: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK4_0).zip(out.iter_mut()) {
        let d = signed_abs_max(xb) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f32_to_f16(d);
        let mut qh = 0u32;
        for (j, &v) in xb.iter().enumerate() {
            let q = (trunc(v * id + 16.5) as i32).clamp(0, 31) as u32;
            qh |= (q >> 4) << j;
            if j < QK4_0 / 2 {
                y.qs[j] = (q & 0x0f) as u8;
            } else {
                y.qs[j - QK4_0 / 2] |= ((q & 0x0f) as u8) << 4;
            }
        }
        y.qh = qh.to_le_bytes();
    }
}

/// Encodes `src` as blocks of `B` into `dst` with a typed row quantizer.
fn encode_blocks<B: Pod>(src: &[f32], dst: &mut [u8], block: usize, f: impl Fn(&[f32], &mut [B])) {
    let mut tmp = [B::zeroed()];
    for (xb, out) in src
        .chunks_exact(block)
        .zip(dst.chunks_exact_mut(core::mem::size_of::<B>()))
    {
        f(xb, &mut tmp);
        out.copy_from_slice(bytemuck::bytes_of(&tmp[0]));
    }
}

/// Quantizes `src` into the GGUF byte encoding of `ty`.
///
/// `dst` must be a whole number of `ty` blocks holding exactly `src.len()` elements.
/// Supported: F32, F16, BF16 (rounded as ggml/`gguf` do), Q4_0, Q5_0, Q8_0 (byte-identical
/// with `gguf.quants.quantize`), Q4_K, Q5_K, Q6_K, MXFP4 (ggml's reference quantizers) and the
/// activation formats Q8_1, Q8_K.
///
/// # Errors
/// [`FormatError::PartialBlock`] when `dst` is not a whole number of blocks,
/// [`FormatError::LengthMismatch`] when the element counts differ,
/// [`FormatError::Unsupported`] for a type without a quantizer.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), FormatError> {
    let ts = ty.type_size();
    if !dst.len().is_multiple_of(ts) {
        return Err(FormatError::PartialBlock {
            ty,
            bytes: dst.len(),
        });
    }
    let expected = dst.len() / ts * ty.block_size();
    if src.len() != expected {
        return Err(FormatError::LengthMismatch {
            expected,
            found: src.len(),
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, &v) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, &v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, &v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&bf16_bits(v).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => encode_blocks(src, dst, QK4_0, quantize_row_q4_0),
        GgmlType::Q5_0 => encode_blocks(src, dst, QK4_0, quantize_row_q5_0),
        GgmlType::Q4_K => encode_blocks::<BlockQ4K>(src, dst, QK_K, quantize_row_q4_k),
        GgmlType::Q5_K => encode_blocks::<BlockQ5K>(src, dst, QK_K, quantize_row_q5_k),
        GgmlType::Q6_K => encode_blocks::<BlockQ6K>(src, dst, QK_K, quantize_row_q6_k),
        GgmlType::Q8_0 => encode_blocks(src, dst, QK8_0, quantize_row_q8_0),
        GgmlType::Q8_1 => encode_blocks(src, dst, QK8_0, quantize_row_q8_1),
        GgmlType::Q8_K => encode_blocks(src, dst, QK_K, quantize_row_q8_k),
        GgmlType::MXFP4 => encode_blocks(src, dst, QK4_0, quantize_row_mxfp4),
        other => return Err(FormatError::Unsupported(other)),
    }
    Ok(())
}

/// f32 → bf16 bits as ggml's `ggml_compute_fp32_to_bf16`: NaN is made quiet, everything
/// else rounds to nearest even.
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    #[test]
    fn round_away_matches_roundf() {
        let cases = [
            (0.5, 1.0),
            (-0.5, -1.0),
            (1.5, 2.0),
            (2.5, 3.0),
            (-2.5, -3.0),
            (0.49999997, 0.0),
            (126.6, 127.0),
            (-0.0, -0.0),
            (1e10, 1e10),
        ];
        for (x, want) in cases {
            assert_eq!(round_away(x).to_bits(), f32::to_bits(want), "{x}");
        }
    }

    #[test]
    fn nearest_int_rounds_half_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-127.2), -127);
        assert_eq!(nearest_int(3.7), 4);
    }

    #[test]
    fn q8_0_act_rounds_half_to_even_with_127_over_amax() {
        // amax = 127 makes the multiplier exactly 1, so 2.5 and -3.5 are ties.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 0.5;
        let mut act = [BlockQ8_0::zeroed()];
        let mut refq = [BlockQ8_0::zeroed()];
        quantize_row_q8_0_act(&x, &mut act);
        quantize_row_q8_0(&x, &mut refq);
        assert_eq!(&act[0].qs[..4], &[127, 2, -4, 0]);
        assert_eq!(&refq[0].qs[..4], &[127, 3, -4, 1]);
        assert_eq!(act[0].d, refq[0].d);
        // Q8_1: same quants, and s = d * sum(q).
        let mut a1 = [BlockQ8_1::zeroed()];
        quantize_row_q8_1_act(&x, &mut a1);
        assert_eq!(a1[0].qs, act[0].qs);
        assert_eq!(a1[0].s, f32_to_f16(125.0 * 1.0));
        // The byte-level entry point agrees with the typed one.
        let mut bytes = [0u8; 34];
        quantize_act(GgmlType::Q8_0, &x, &mut bytes).unwrap();
        assert_eq!(&bytes[..], bytemuck::bytes_of(&act[0]));
        assert!(quantize_act(GgmlType::Q4_0, &x, &mut bytes).is_err());
    }

    #[test]
    fn q8_k_known_block() {
        let x: [f32; QK_K] = core::array::from_fn(|i| i as f32 - 100.0);
        let mut b = [BlockQ8K::zeroed()];
        quantize_row_q8_k(&x, &mut b);
        // max magnitude element is 155 (positive), so iscale = -127/155 and quants flip sign.
        assert_eq!(b[0].qs[255], -127);
        assert_eq!(b[0].d, 1.0 / (-127.0f32 / 155.0));
        for j in 0..16 {
            let s: i32 = b[0].qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b[0].bsums[j] as i32, s);
        }
    }

    #[test]
    fn quantize_checks_lengths() {
        let src = [0.0f32; 32];
        let mut dst = [0u8; 33];
        assert_eq!(
            quantize(GgmlType::Q8_0, &src, &mut dst),
            Err(FormatError::PartialBlock {
                ty: GgmlType::Q8_0,
                bytes: 33
            })
        );
        let mut dst = [0u8; 68];
        assert_eq!(
            quantize(GgmlType::Q8_0, &src, &mut dst),
            Err(FormatError::LengthMismatch {
                expected: 64,
                found: 32
            })
        );
        let mut dst = [0u8; 18];
        assert_eq!(
            quantize(GgmlType::IQ2_XXS, &src[..0], &mut dst[..0]),
            Err(FormatError::Unsupported(GgmlType::IQ2_XXS))
        );
    }
}
