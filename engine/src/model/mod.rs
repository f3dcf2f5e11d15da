//! The model as both forwards see it: the loader's description ([`ModelDesc`], every
//! hyper-parameter and which optional tensors are present) and the tensors ([`Model`])
//! of a checkpoint of any architecture the description accepts (flint, gemma3, llama,
//! qwen2, qwen3).
//!
//! Matrices stay in their file encoding ([`TensorRef`], zero-copy bytes); the small f32
//! vectors (norm weights, biases, RoPE frequency factors, sinks, selection bias) are
//! decoded once at load. The reference forward reads the matrices row by row through
//! `flint-core`; the device forward stages them on a [`Device`](flint_hal::Device)
//! ([`crate::forward::DeviceModel`]).
//!
//! Both forwards take every per-architecture difference from [`Model`]: the description
//! in [`Model::spec`] for the scalars (attention scale and whether the query is
//! pre-scaled, each layer's RoPE base and frequency scale, YaRN, activation, logit
//! soft-capping, embedding scale, window) and the presence of a tensor for the optional
//! pieces (a bias, `rope_freqs`, a QK norm, a post-norm, sinks). Every field is public,
//! so a test drops or changes one feature by editing the assembled model before it runs
//! or stages it:
//!
//! ```text
//! model.rope_freqs = None;                          // no Llama 3 frequency factors
//! model.layers[i].bq = None;                        // no query bias on layer i
//! model.layers[i].post_ffn_norm = None;             // no Gemma post-FFN norm
//! model.spec.layers[i].rope_freq_scale = 1.0;       // no linear / YaRN scaling there
//! model.spec.rope.yarn = None;                      // no YaRN mix
//! model.spec.attn_scale = 1.0 / 8.0;                // another attention scale
//! model.spec.q_prescaled = false;                   // scale q.k instead of q
//! model.spec.logit_softcap = None;                  // no final soft-capping
//! model.output = model.token_embd.clone();          // tie the output projection
//! ```
//!
//! The forwards read the tensors, not the description's presence flags
//! (`spec.layers[i].biases`, `spec.rope.freq_factors`, `spec.tied_output`), which
//! describe the file.

pub mod devices;
pub mod load;
pub mod runtime;

pub use load::{load_model, model_from_gguf};
pub use runtime::{load_on_device, resolve_path, LoadedModel};

use std::path::PathBuf;

use flint_core::GgmlType;
use flint_hal::{HalError, HalErrorKind, WeightSource};
pub use flint_loader::config::{
    Activation, Arch, AttnBiases, ConfigError, DeltaNetDesc, FfnDesc, LayerDesc, Mixer, ModelDesc,
    MoeDesc, NormPlacement, RopeDesc, RopeKind, Yarn,
};
use flint_loader::fetch::FetchError;
use flint_loader::gguf::GgufError;
use flint_loader::tokenizer::TokenizerError;

/// Layer `il`'s RoPE, as both forwards apply it to every query and key head: the
/// description's pairing and YaRN, the layer's rotated dims, base and frequency scale,
/// and the model's `rope_freqs` factors (`freq_factors`) on the layers that take them
/// ([`LayerDesc::rope_freq_factors`]).
pub fn layer_rope<'a>(
    spec: &ModelDesc,
    il: usize,
    freq_factors: Option<&'a [f32]>,
) -> flint_core::math::RopeConfig<'a> {
    let l = &spec.layers[il];
    flint_core::math::RopeConfig {
        kind: spec.rope.kind,
        n_rot: l.n_rot,
        base: l.rope_base,
        freq_scale: l.rope_freq_scale,
        freq_factors: freq_factors.filter(|_| l.rope_freq_factors),
        yarn: spec.rope.yarn,
    }
}

/// Final logit soft-capping on rows of logits, as llama.cpp's graph computes it:
/// `x * (1 / c)` (one f32 reciprocal), `tanhf`, `* c`. Nothing without a cap.
pub fn soft_cap(logits: &mut [f32], cap: Option<f32>) {
    if let Some(c) = cap {
        let inv = 1.0 / c;
        for x in logits {
            *x = (*x * inv).tanh() * c;
        }
    }
}

/// A tensor in its file encoding: name, type, GGUF-order dims and the bytes.
#[derive(Clone, Debug)]
pub struct TensorRef {
    /// GGUF name.
    pub name: String,
    /// Encoding.
    pub ty: GgmlType,
    /// Dims, first contiguous.
    pub dims: Vec<usize>,
    /// The bytes (usually a slice of the memory-mapped file).
    pub data: WeightSource,
}

impl TensorRef {
    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims[0]
    }

    /// Rows over all experts (product of the other dims).
    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.bytes().len() / self.n_rows().max(1)
    }

    /// Row `i` (over all experts: expert `e` row `o` is `e * dims[1] + o`).
    pub fn row(&self, i: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[i * rb..(i + 1) * rb]
    }

    /// The whole tensor decoded to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let n: usize = self.dims.iter().product();
        let mut out = vec![0.0f32; n];
        flint_core::dequant::dequantize(self.ty, self.bytes(), &mut out)
            .map_err(|e| ModelError::new(format!("cannot decode tensor '{}': {e}", self.name)))?;
        Ok(out)
    }
}

/// The three projections of a gated MLP (dense FFN, shared expert, or expert towers).
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[in, F]` (or `[in, Fe, E]`).
    pub gate: TensorRef,
    /// `[in, F]` (or `[in, Fe, E]`).
    pub up: TensorRef,
    /// `[F, in]` (or `[Fe, in, E]`).
    pub down: TensorRef,
}

/// A layer's FFN.
// One per layer, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Ffn {
    /// A dense gated MLP.
    Dense(Mlp),
    /// A routed MoE.
    Moe(Box<Moe>),
}

/// A MoE FFN's tensors.
#[derive(Clone, Debug)]
pub struct Moe {
    /// Router `[d, E]`.
    pub router: TensorRef,
    /// Selection bias `[E]` (`exp_probs_b`), when present.
    pub bias: Option<Vec<f32>>,
    /// Router bias `[E]` (`ffn_gate_inp.bias`, gpt-oss), added to the logits.
    pub router_bias: Option<Vec<f32>>,
    /// Expert towers.
    pub experts: Mlp,
    /// The expert towers' biases (gpt-oss).
    pub expert_biases: Option<ExpertBiases>,
    /// The always-on shared expert, when present.
    pub shared: Option<Mlp>,
    /// `ffn_gate_inp.scale` `[d]` (Gemma 4): the router reads the residual stream,
    /// RMS-normed, times `1/sqrt(d)`, times this.
    pub router_scale: Option<Vec<f32>>,
    /// `ffn_down_exps.scale` `[E]` (Gemma 4): each expert's output times its entry.
    pub expert_scale: Option<Vec<f32>>,
    /// Gemma 4's dense MLP beside the experts, with the norms of both branches.
    pub parallel: Option<ParallelDense>,
    /// `ffn_gate_inp_shexp` (Qwen 3.5), held as a matrix of one output row `[d, 1]`:
    /// the shared expert's output is multiplied by `sigmoid` of its product with the
    /// FFN's input.
    pub shared_gate: Option<TensorRef>,
}

/// A Gated DeltaNet layer's tensors (Qwen 3.5; [`Mixer::DeltaNet`], sizes in
/// [`ModelDesc::delta_net`]).
#[derive(Clone, Debug)]
pub struct DeltaNetLayer {
    /// `attn_qkv` `[d, conv_dim]`: q, k and v of every head, before the convolution.
    pub qkv: TensorRef,
    /// `attn_gate` `[d, heads_v * head_dim]`: the output gate `z`.
    pub gate: TensorRef,
    /// `ssm_conv1d` `[conv_kernel, conv_dim]`: one row of `conv_kernel` taps per channel.
    pub conv: Vec<f32>,
    /// `ssm_dt.bias` `[heads_v]`.
    pub dt_bias: Vec<f32>,
    /// `ssm_a` `[heads_v]` (`-exp(A_log)`).
    pub a: Vec<f32>,
    /// `ssm_beta` `[d, heads_v]`.
    pub beta: TensorRef,
    /// `ssm_alpha` `[d, heads_v]`.
    pub alpha: TensorRef,
    /// `ssm_norm` `[head_dim]`: the per-head RMSNorm of the output.
    pub norm: Vec<f32>,
    /// `ssm_out` `[heads_v * head_dim, d]`.
    pub out: TensorRef,
}

/// Gemma 4's MoE layer beside its experts ([`FfnDesc::Moe`]'s `parallel_dense`): the
/// dense MLP on the pre-FFN norm's output, normed by `post_norm_1`; the experts on
/// `pre_norm_2` of the residual stream, their sum normed by `post_norm_2`; the layer's
/// FFN output is the sum of the two.
#[derive(Clone, Debug)]
pub struct ParallelDense {
    /// The dense MLP (`ffn_gate`, `ffn_up`, `ffn_down`).
    pub mlp: Mlp,
    /// `post_ffw_norm_1`.
    pub post_norm_1: Vec<f32>,
    /// `pre_ffw_norm_2`.
    pub pre_norm_2: Vec<f32>,
    /// `post_ffw_norm_2`.
    pub post_norm_2: Vec<f32>,
}

/// Gemma 4's per-layer token embeddings, the model's part: each token's `[P]` input per
/// layer is `(rms_norm(proj x / sqrt(d)) * proj_norm + sqrt(P) embd[token]) / sqrt(2)`,
/// `x` the scaled token embedding.
#[derive(Clone, Debug)]
pub struct PerLayerInputs {
    /// `per_layer_token_embd` `[P * L, V]`.
    pub token_embd: TensorRef,
    /// `per_layer_model_proj` `[d, P * L]`.
    pub model_proj: TensorRef,
    /// `per_layer_proj_norm` `[P]`.
    pub proj_norm: Vec<f32>,
}

/// Gemma 4's per-layer token embeddings, a layer's part: after the FFN's residual add,
/// `x += post_norm(proj(gelu(inp_gate x) * input))`.
#[derive(Clone, Debug)]
pub struct LayerInput {
    /// `inp_gate` `[d, P]`.
    pub inp_gate: TensorRef,
    /// `proj` `[P, d]`.
    pub proj: TensorRef,
    /// `post_norm` `[d]`.
    pub post_norm: Vec<f32>,
}

/// Per-expert biases of the towers: expert `e`'s rows are `[e * width .. (e + 1) * width]`.
#[derive(Clone, Debug)]
pub struct ExpertBiases {
    /// `ffn_gate_exps.bias` `[Fe, E]`.
    pub gate: Vec<f32>,
    /// `ffn_up_exps.bias` `[Fe, E]`.
    pub up: Vec<f32>,
    /// `ffn_down_exps.bias` `[d, E]`.
    pub down: Vec<f32>,
}

/// One layer's tensors.
///
/// On a Gated DeltaNet layer ([`Layer::delta_net`] set) the attention projections
/// `wq`, `wk`, `wv`, `wo` hold that layer's `attn_qkv`, `attn_qkv`, `attn_gate` and
/// `ssm_out` so that every layer has them; no forward reads them there (both forwards
/// run the layer's [`DeltaNetLayer`], and the device stages only its tensors).
#[derive(Clone, Debug)]
pub struct Layer {
    /// `attn_norm`.
    pub attn_norm: Vec<f32>,
    /// The Gated DeltaNet mixer of a [`Mixer::DeltaNet`] layer (instead of attention).
    pub delta_net: Option<DeltaNetLayer>,
    /// `attn_q`.
    pub wq: TensorRef,
    /// `attn_k`.
    pub wk: TensorRef,
    /// `attn_v`.
    pub wv: TensorRef,
    /// `attn_output`.
    pub wo: TensorRef,
    /// `attn_q.bias` `[H * dk]`, added after the Q matmul.
    pub bq: Option<Vec<f32>>,
    /// `attn_k.bias` `[Hkv * dk]`.
    pub bk: Option<Vec<f32>>,
    /// `attn_v.bias` `[Hkv * dv]`.
    pub bv: Option<Vec<f32>>,
    /// `attn_output.bias` `[d]`, added after the output matmul.
    pub bo: Option<Vec<f32>>,
    /// `attn_q_norm` (per head, over `dk`).
    pub q_norm: Option<Vec<f32>>,
    /// `attn_k_norm`.
    pub k_norm: Option<Vec<f32>>,
    /// `attn_sinks` (`[H]`).
    pub sinks: Option<Vec<f32>>,
    /// `post_attention_norm` ([`NormPlacement::PrePost`]), on the attention output
    /// before the residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    /// `ffn_norm`.
    pub ffn_norm: Vec<f32>,
    /// The FFN.
    pub ffn: Ffn,
    /// `post_ffw_norm` ([`NormPlacement::PrePost`]), on the FFN output before the
    /// residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Gemma 4's per-layer input of this layer.
    pub per_layer: Option<LayerInput>,
    /// `layer_output_scale` (Gemma 4): the residual stream after the layer times this.
    pub out_scale: Option<f32>,
}

/// A whole checkpoint, ready for either forward.
#[derive(Clone, Debug)]
pub struct Model {
    /// The description: every hyper-parameter.
    pub spec: ModelDesc,
    /// `token_embd` `[d, V]`.
    pub token_embd: TensorRef,
    /// `output` `[d, V]` (the embedding itself when tied: the same name).
    pub output: TensorRef,
    /// `rope_freqs` `[n_rot / 2]`: per-pair divisors of every layer's RoPE angles
    /// (Llama 3 rope scaling).
    pub rope_freqs: Option<Vec<f32>>,
    /// `output_norm`.
    pub output_norm: Vec<f32>,
    /// Gemma 4's per-layer token embeddings.
    pub per_layer: Option<PerLayerInputs>,
    /// The layers.
    pub layers: Vec<Layer>,
}

/// A model that cannot be loaded or run. Every variant's message names what was wrong
/// (the file, key, tensor or device); the device and loader variants keep the error they
/// came from, so that a caller can tell a device out of memory from a bad file.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A device operation failed.
    #[error("{0}")]
    Hal(#[from] HalError),
    /// A device operation failed while doing `context` (planning or staging a weight).
    #[error("{context}: {source}")]
    Device {
        /// What was being done, naming the tensor and the device.
        context: String,
        /// The device's error.
        #[source]
        source: HalError,
    },
    /// The GGUF file cannot be opened or read.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The loader's error.
        #[source]
        source: GgufError,
    },
    /// A metadata key or a loader setting is missing or invalid.
    #[error("{0}")]
    Gguf(#[from] GgufError),
    /// The file's description is refused: a key or tensor Flint does not implement or
    /// that is invalid (the error names it).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The file's tokenizer cannot be built.
    #[error("tokenizer of {}: {source}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The loader's error.
        #[source]
        source: TokenizerError,
    },
    /// The default model cannot be found or fetched.
    #[error("{0}")]
    Fetch(#[from] FetchError),
    /// The file does not describe a model the engine runs, or a request the model
    /// cannot compute (a token outside the vocabulary, a position beyond the context).
    #[error("{0}")]
    Invalid(String),
}

impl ModelError {
    /// An [`ModelError::Invalid`] with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }

    /// The kind of the device error behind this one, if a device failed.
    pub fn hal_kind(&self) -> Option<HalErrorKind> {
        match self {
            Self::Hal(e) | Self::Device { source: e, .. } => Some(e.kind),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::soft_cap;

    #[test]
    fn soft_cap_is_c_tanh_x_over_c() {
        let mut x = [0.0f32, 1.0, -30.0, 300.0];
        soft_cap(&mut x, Some(30.0));
        let want = [
            0.0f32,
            30.0 * (1.0f32 / 30.0).tanh(),
            -30.0 * 1.0f32.tanh(),
            30.0 * 10.0f32.tanh(),
        ];
        for (a, b) in x.iter().zip(want) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{x:?} vs {want:?}"
            );
        }
        let mut y = [5.0f32, -7.0];
        soft_cap(&mut y, None);
        assert_eq!(y, [5.0, -7.0]);
    }
}
