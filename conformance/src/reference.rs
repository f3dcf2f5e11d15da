//! The reference side of every comparison: thin adapters over the `flint-core` scalar
//! kernels. This is the only module that calls them, so the suite has one place where
//! "what is right" is decided, and it is `flint-core`'s, not ours.

use flint_core::math;
use flint_hal::{GgmlType, RoutingConfig};

/// Dequantizes `n` elements of `ty` from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![0.0f32; n];
    flint_core::dequant::dequantize(ty, bytes, &mut out)
        .map_err(|e| format!("reference dequantize of {ty}: {e}"))?;
    Ok(out)
}

/// Encodes `src` as `ty` with `flint-core`'s quantizer, or `None` when it has none for
/// `ty`.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Option<Vec<u8>> {
    let bytes = ty.row_bytes(src.len())?;
    let mut dst = vec![0u8; bytes];
    flint_core::quant::quantize(ty, src, &mut dst).ok()?;
    Some(dst)
}

/// `out[i][o] = sum_k W[o][k] * x[i][k]` on the dequantized weight `w` (`n` rows of
/// `k`), accumulated in f64: the exact product the device's result is measured against.
pub fn matmul_f32(w: &[f32], k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let n = w.len() / k;
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        for o in 0..n {
            let wo = &w[o * k..(o + 1) * k];
            let s: f64 = wo.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
            out[i * n + o] = s as f32;
        }
    }
    out
}

/// RMSNorm of every row of `dim` values.
pub fn rms_norm_rows(x: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    math::rms_norm_rows(x, weight, dim, eps, &mut out);
    out
}

/// RoPE of `x = [rows, heads * head_dim]`, row `i` at `positions[i]`, in place.
pub fn rope(x: &mut [f32], positions: &[u32], head_dim: usize, cfg: &math::RopeConfig<'_>) {
    let row = x.len() / positions.len().max(1);
    for (r, &p) in x.chunks_exact_mut(row).zip(positions) {
        math::rope_heads(r, head_dim, p, cfg);
    }
}

/// `bias` added to every row of `x`.
pub fn add_bias(x: &[f32], bias: &[f32]) -> Vec<f32> {
    x.iter()
        .zip(bias.iter().cycle())
        .map(|(&v, &b)| v + b)
        .collect()
}

/// `silu(gate) * up`.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| math::silu(g) * u)
        .collect()
}

/// `gelu_tanh(gate) * up`.
pub fn gelu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| math::gelu_tanh(g) * u)
        .collect()
}

/// gpt-oss's clamped SwiGLU (`math::swiglu_oai`).
pub fn swiglu_oai_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| math::swiglu_oai(g, u))
        .collect()
}

/// Gated DeltaNet's convolution then SiLU (`math::ssm_conv`, `math::silu`) of `x` on a
/// copy of `state`: `(out, new state)`.
pub fn ssm_conv_silu(
    x: &[f32],
    weight: &[f32],
    d_conv: usize,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut st = state.to_vec();
    let mut out = vec![0.0; x.len()];
    math::ssm_conv(x, weight, d_conv, &mut st, &mut out);
    out.iter_mut().for_each(|o| *o = math::silu(*o));
    (out, st)
}

/// The gated delta rule (`math::gated_delta_net`, the recurrent form) on a copy of
/// `state`: `(out, new state)`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    shape: &math::DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut st = state.to_vec();
    let mut out = vec![0.0; v.len()];
    math::gated_delta_net(shape, q, k, v, g, beta, &mut st, &mut out);
    (out, st)
}

/// Top-k routing of every row: `(ids, weights)`, `k` per row; with `expert_scale`, each
/// weight then times its expert's value.
pub fn route_topk(
    logits: &[f32],
    n_experts: usize,
    bias: Option<&[f32]>,
    expert_scale: Option<&[f32]>,
    cfg: &RoutingConfig,
) -> Result<(Vec<u32>, Vec<f32>), String> {
    let rows = logits.len() / n_experts;
    let mut ids = vec![0u32; rows * cfg.k];
    let mut w = vec![0.0f32; rows * cfg.k];
    for r in 0..rows {
        math::route_topk(
            &logits[r * n_experts..(r + 1) * n_experts],
            bias,
            cfg.k,
            cfg.gating,
            cfg.normalize,
            cfg.scale,
            &mut ids[r * cfg.k..(r + 1) * cfg.k],
            &mut w[r * cfg.k..(r + 1) * cfg.k],
        )
        .map_err(|e| format!("reference routing: {e}"))?;
    }
    if let Some(s) = expert_scale {
        for (w, &e) in w.iter_mut().zip(&ids) {
            *w *= s[e as usize];
        }
    }
    Ok((ids, w))
}

/// Attention of one sequence over contiguous keys/values of positions `0..n_kv`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    n_heads: usize,
    n_kv_heads: usize,
    dk: usize,
    dv: usize,
    scale: f32,
    sinks: Option<&[f32]>,
    window: Option<usize>,
    q: &[f32],
    positions: &[u32],
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    let p = math::AttentionParams {
        n_head: n_heads,
        n_head_kv: n_kv_heads,
        dk,
        dv,
        scale,
        sinks,
        window,
    };
    let mut out = vec![0.0f32; positions.len() * n_heads * dv];
    math::attention_ref(&p, q, positions, k, v, &mut out);
    out
}
