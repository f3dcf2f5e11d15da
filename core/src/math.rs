//! Kernel math: the scalar reference for every non-matmul step of the Flint forward pass
//! (`../shared/spec/FLINT.md`), written to agree closely with llama.cpp's CPU backend.
//!
//! - [`rms_norm`], [`rms_norm_rows`], [`rms_norm_in_place`]: RMSNorm with an optional weight.
//! - [`rope`], [`rope_heads`] ([`RopeConfig`]): rotary embedding on the first `n_rot` dims
//!   of a head, normal or NeoX pairs, with linear scaling, frequency factors and YaRN as
//!   ggml computes them; [`rope_neox`], [`rope_neox_heads`] for the plain NeoX case.
//! - [`silu`], [`sigmoid`], [`gelu_tanh`], [`gelu_tanh_ggml_f16`], [`swiglu`]: activations.
//! - [`OnlineSoftmax`], [`attend_two_pass`], [`attend_online`], [`attention_ref`]:
//!   softmax attention with per-head sinks, GQA and an optional sliding window.
//! - [`route_topk`]: MoE routing (sigmoid or softmax scores, top-k with a selection bias,
//!   renormalisation over the chosen experts).
//! - [`ssm_conv`], [`gated_delta_net`] ([`DeltaNetShape`]), [`gated_delta_net_chunked`],
//!   [`l2_norm_heads`], [`delta_net_gate`]: Qwen 3.5's linear-attention layers (Gated
//!   DeltaNet): the short causal convolution and the gated delta rule with their carried
//!   states, in ggml's float order, and the steps that feed them.
//!
//! Everything is `f32` and `no_std`; the transcendental functions come from the `libm`
//! crate (a port of musl's libm). glibc's `expf`/`sinf`/`cosf`/`tanhf`, which llama.cpp
//! calls, are correctly rounded or within 1 ulp, as is musl's, so results agree with
//! llama.cpp to about 1 ulp per call rather than bit for bit.

mod act;
mod attn;
mod attn_ggml;
mod delta;
mod libc;
mod norm;
mod rope;
mod route;

pub use act::{
    deinterleave, gelu_f16_table_entry, gelu_tanh, gelu_tanh_ggml_f16, mul_rows, sigmoid,
    sigmoid_ggml, sigmoid_ggml_in_place, silu, swiglu, swiglu_oai, SWIGLU_OAI_ALPHA,
    SWIGLU_OAI_LIMIT,
};
pub use attn::{
    attend_online, attend_two_pass, attention_ref, window_start, AttentionParams, OnlineSoftmax,
};
pub use attn_ggml::{
    attend_ggml_one_chunk, attend_ggml_tiled, expf_ggml_avx2, expf_ggml_avx512, f16_round,
    reduce_add_16, soft_max_ggml, GgmlCpuBuild, GGML_FA_TILE, GGML_FA_TILE_Q,
};
#[cfg(feature = "alloc")]
pub use delta::gated_delta_net_chunked;
pub use delta::{
    delta_net_gate, delta_net_gates, gated_delta_net, gated_delta_net_head, l2_norm_heads,
    ssm_conv, DeltaNetShape, DELTA_NET_CHUNK,
};
pub use libc::{
    cosf_glibc, expf_libc, sinf_glibc, EXP2F_TAB, EXPF_INV_LN2_N, EXPF_POLY, EXPF_SHIFT,
    EXPF_SPECIAL_ABSTOP,
};
pub use norm::{rms_norm, rms_norm_in_place, rms_norm_rows, rms_scale_of_sum};
pub use rope::{
    rope, rope_heads, rope_neox, rope_neox_heads, rope_rotate, yarn_corr_dims, RopeConfig,
    RopeError, RopeKind, Yarn,
};
pub use route::{
    add_id, add_id_rows, check_route, route_topk, route_topk_in, scale_by_expert,
    scatter_add_weighted, Gating, RouteError, ROUTE_MAX_K,
};
