//! The arithmetic of the simulated device. Everything numeric goes through the scalar
//! references of `flint-core` (dequantization, f32 dot product, kernel math); this module
//! only arranges them per row, per head and per expert.

use flint_core::GgmlType;

/// Decodes one row of `n` elements stored as `ty` (a kept block encoding or BF16) into
/// `out`. The error names the encoding.
pub fn dequant_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    flint_core::dequant::dequantize(ty, bytes, out)
        .map_err(|e| format!("cannot decode a {ty} row of {} values: {e}", out.len()))
}

/// The activation encoding a weight of `ty` is paired with, as ggml pairs them: Q8_K
/// for the K-quants and IQ types, Q8_0/Q8_1 for the legacy types, f32 for BF16.
pub fn act_type(ty: GgmlType) -> GgmlType {
    if ty.is_quantized() {
        ty.vec_dot_type()
    } else {
        GgmlType::F32
    }
}

/// Activation rows of `in_f` values encoded for weights of `ty` (core quantizers),
/// `rows * row_bytes(act_type(ty), in_f)` bytes.
pub fn encode_acts(ty: GgmlType, x: &[f32], in_f: usize) -> Result<Vec<u8>, String> {
    let at = act_type(ty);
    if at == GgmlType::F32 {
        return Ok(bytemuck::cast_slice(x).to_vec());
    }
    let rb = at
        .row_bytes(in_f)
        .ok_or_else(|| format!("{in_f} values are not whole {at} blocks"))?;
    let rows = x.len().checked_div(in_f).unwrap_or(0);
    let mut out = vec![0u8; rows * rb];
    for (xr, or) in x.chunks_exact(in_f).zip(out.chunks_exact_mut(rb)) {
        // The activation quantizers of ggml's x86 build, as the CPU backend uses them.
        flint_core::quant::quantize_act(at, xr, or)
            .map_err(|e| format!("quantizing activations to {at}: {e}"))?;
    }
    Ok(out)
}

/// A BF16 weight row (little-endian bytes) against f32 activations: each product in f32,
/// the sum in f64, as `flint_core::vec_dot` computes BF16 rows, but with four partial
/// sums (the f64 sums differ from the core's single running sum only in their rounding
/// order, far below f32 precision). The hot loop of the BF16 arm.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let widen = |lo: u8, hi: u8| f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16);
    let mut acc = [0.0f64; 4];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(4));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (c, xs) in wc.zip(xc) {
        for k in 0..4 {
            acc[k] += f64::from(widen(c[2 * k], c[2 * k + 1]) * xs[k]);
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (c, &xv) in wr.chunks_exact(2).zip(xr) {
        s += f64::from(widen(c[0], c[1]) * xv);
    }
    s as f32
}

/// An F32 weight row (little-endian bytes) against f32 activations, computed as
/// `flint_core::vec_dot` computes F32 rows (each product in f32, the sum in f64) but with
/// eight partial sums: f64 sums of f32 products are exact unless their magnitudes span
/// more than 29 bits, so the result is the core's except in rare last-bit cases. The hot
/// loop of weights expanded to F32.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f64; 8];
    let (wc, xc) = (w.chunks_exact(32), x.chunks_exact(8));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (c, xs) in wc.zip(xc) {
        for k in 0..8 {
            let wv = f32::from_le_bytes([c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]]);
            acc[k] += f64::from(wv * xs[k]);
        }
    }
    let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (c, &xv) in wr.chunks_exact(4).zip(xr) {
        s += f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * xv);
    }
    s as f32
}

/// One weight row of `ty` against one encoded activation row of `n` values. Q4_K, Q6_K,
/// Q8_0 and Q5_0 sum in llama.cpp's prompt-batch float orders
/// (`flint_core::dot::ggml_x86`, docs/parity.md), as the reference forward and the CPU
/// backend do, so that the simulated device computes what the project's oracle
/// computes; every other type through the core `vec_dot` reference.
pub fn vec_dot(ty: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) -> Result<f32, String> {
    use flint_core::blocks::{BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};
    use flint_core::dot::ggml_x86 as x86;
    fn blocks<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }
    let same = |a: usize, b: usize| -> Result<(), String> {
        if a == b {
            Ok(())
        } else {
            Err(format!(
                "{ty} dot product: {a} weight blocks against {b} activation blocks"
            ))
        }
    };
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let a: Vec<BlockQ8K> = blocks(act_row);
            if ty == GgmlType::Q4_K {
                let w: Vec<BlockQ4K> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q4_k_q8_k_repack(&w, &a, x86::Q4kPath::Gemm))
            } else {
                let w: Vec<BlockQ6K> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q6_k_q8_k_tiled(&w, &a))
            }
        }
        GgmlType::Q8_0 | GgmlType::Q5_0 => {
            let a: Vec<BlockQ8_0> = blocks(act_row);
            if ty == GgmlType::Q8_0 {
                let w: Vec<BlockQ8_0> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q8_0_q8_0_tinyblas(&w, &a))
            } else {
                let w: Vec<BlockQ5_0> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q5_0_q8_0_tinyblas(&w, &a))
            }
        }
        _ => {
            flint_core::vec_dot(ty, w_row, act_row, n).map_err(|e| format!("{ty} dot product: {e}"))
        }
    }
}

/// `x` rounded to the nearest fp16 (ties to even), widened back to f32: how the V cache
/// holds values.
pub fn round_fp16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// RMSNorm of each row of `dim` (core reference).
pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        flint_core::math::rms_norm(xr, weight, eps, or);
    }
}

/// NeoX RoPE in place for each head of each row (core reference).
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    base: f32,
) {
    let row = n_heads * head_dim;
    for (xr, &p) in x.chunks_exact_mut(row).zip(positions) {
        for h in xr.chunks_exact_mut(head_dim) {
            flint_core::math::rope_neox(h, p, n_rot, base);
        }
    }
}

/// `silu(x)` (core reference).
pub fn silu(x: f32) -> f32 {
    flint_core::math::silu(x)
}

/// GELU (tanh form) on fp16 operands: the input and the result rounded to fp16 (the
/// device's Float16 format), computed by the core routine the CPU backend and the
/// reference forward use (`gelu_tanh_ggml_f16`).
pub fn gelu(x: f32) -> f32 {
    flint_core::math::gelu_tanh_ggml_f16(x)
}

/// Top-k routing of one row of logits into `ids`/`weights` (`k` entries each), the
/// core reference.
pub fn route_topk_row(
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    sigmoid: bool,
    normalize: bool,
    scale: f32,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<(), String> {
    let gating = if sigmoid {
        flint_core::math::Gating::Sigmoid
    } else {
        flint_core::math::Gating::Softmax
    };
    flint_core::math::route_topk(logits, bias, k, gating, normalize, scale, ids, weights)
        .map_err(|e| e.to_string())
}

/// Attention of one query head `q` over the keys and values of positions
/// `first .. first + keys.len()`, with an optional sink logit, into `out`: a softmax
/// computed online over tiles of 64 keys (the way a Tenstorrent SDPA kernel walks the
/// KV cache in chunks), with the core's tiled routine, whose order of operations is the
/// one the CPU backend and the reference forward use as well.
pub fn attend_head(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    first: usize,
    scale: f32,
    sink: Option<f32>,
    out: &mut [f32],
) {
    flint_core::math::attend_ggml_tiled(q, keys, values, first, scale, sink, out);
}
