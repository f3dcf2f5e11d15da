//! Qwen 3.5's Gated DeltaNet ops on the CPU: the short causal convolution with SiLU and
//! the gated delta rule, through `flint_core::math`'s references (ggml's float order;
//! `flint_core::math::ssm_conv` and `gated_delta_net` document math and layouts).
//!
//! The delta rule runs token by token (the recurrent form) for prompts and decode steps
//! alike, as llama.cpp's CPU backend does (its fused `gated_delta_net` op): one head's
//! state (`head_dim^2` floats, 64 KiB at 128) stays in cache over the tokens, and the
//! value heads of a call are spread over the pool.

use flint_core::math::{self, DeltaNetShape};
use flint_hal::HalError;
use rayon::prelude::*;

/// `out = silu(ssm_conv(x))`, the window carried in `state` (see `Device::ssm_conv_silu`).
/// The convolution is `d_conv` multiply-adds per output: one thread does it.
pub(crate) fn ssm_conv_silu(
    x: &[f32],
    weight: &[f32],
    d_conv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    math::ssm_conv(x, weight, d_conv, state, out);
    for o in out.iter_mut() {
        *o = math::silu(*o);
    }
}

/// The gated delta rule of one sequence (see `Device::gated_delta_net`), the value heads
/// in parallel on `pool`; each head's result equals `math::gated_delta_net_head` bit for
/// bit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_delta_net(
    pool: &rayon::ThreadPool,
    shape: &DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), HalError> {
    if !shape.is_valid() {
        return Err(HalError::invalid(format!(
            "gated_delta_net: {} value heads on {} key heads of size {} (value heads must be \
             a non-zero multiple of key heads, sizes non-zero)",
            shape.heads_v, shape.heads_k, shape.head_dim
        )));
    }
    let (d, vl) = (shape.head_dim, shape.v_len());
    let n = q.len() / shape.qk_len();
    assert_eq!(
        state.len(),
        shape.state_len(),
        "gated_delta_net: state length"
    );
    assert_eq!(out.len(), n * vl, "gated_delta_net: out length");
    if n == 1 {
        // One token: each head's output row is contiguous; no scatter.
        pool.install(|| {
            state
                .par_chunks_mut(d * d)
                .zip(out.par_chunks_mut(d))
                .enumerate()
                .for_each(|(h, (sh, oh))| {
                    math::gated_delta_net_head(shape, h, q, k, v, g, beta, sh, oh);
                });
        });
        return Ok(());
    }
    let heads: Vec<Vec<f32>> = pool.install(|| {
        state
            .par_chunks_mut(d * d)
            .enumerate()
            .map(|(h, sh)| {
                let mut oh = vec![0.0f32; n * d];
                math::gated_delta_net_head(shape, h, q, k, v, g, beta, sh, &mut oh);
                oh
            })
            .collect()
    });
    for (h, oh) in heads.iter().enumerate() {
        for (t, row) in oh.chunks_exact(d).enumerate() {
            out[t * vl + h * d..t * vl + (h + 1) * d].copy_from_slice(row);
        }
    }
    Ok(())
}
