//! The model as both forwards see it: an architecture-neutral description
//! ([`ModelSpec`]) and the raw tensors ([`Model`]) of a Flint or Gemma 3 checkpoint.
//!
//! Matrices stay in their file encoding ([`TensorRef`], zero-copy bytes); the small f32
//! vectors (norm weights, sinks, selection bias) are decoded once at load. The reference
//! forward reads the matrices row by row through `flint-core`; the device forward stages
//! them on a [`Device`](flint_hal::Device) ([`crate::forward::DeviceModel`]).

pub mod devices;
pub mod load;
pub mod runtime;

pub use load::{load_model, model_from_gguf};
pub use runtime::{load_on_device, resolve_path, LoadedModel};

use std::path::PathBuf;

use flint_core::GgmlType;
use flint_hal::{Gating, HalError, HalErrorKind, WeightSource};
use flint_loader::fetch::FetchError;
use flint_loader::gguf::GgufError;
use flint_loader::tokenizer::TokenizerError;

/// The architectures the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Flint (`shared/spec/FLINT.md`).
    Flint,
    /// Gemma 3, as llama.cpp runs it.
    Gemma3,
}

/// The FFN activation of the gated MLPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (Flint).
    Silu,
    /// `gelu_tanh(gate) * up` (Gemma 3).
    GeluTanh,
}

/// Routing of a MoE layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    /// Routed experts `E`.
    pub n_experts: usize,
    /// Experts chosen per token `k`.
    pub k: usize,
    /// Width `Fe` of one routed expert.
    pub expert_ff: usize,
    /// Score function.
    pub gating: Gating,
    /// Renormalise the chosen weights to sum 1.
    pub normalize: bool,
    /// Multiplier of the chosen weights after renormalising.
    pub scale: f32,
}

/// Per-layer facts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// A sliding-window layer (attends to the `W` newest positions only).
    pub sliding: bool,
    /// RoPE base of this layer.
    pub rope_base: f32,
}

/// Everything the forwards need to know besides the tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Which architecture.
    pub arch: Arch,
    /// Hidden size `d`.
    pub d: usize,
    /// Query heads `H`.
    pub n_heads: usize,
    /// KV heads `Hkv`.
    pub n_kv_heads: usize,
    /// Head size of Q and K.
    pub head_dim_k: usize,
    /// Head size of V.
    pub head_dim_v: usize,
    /// Rotated dims.
    pub n_rot: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Largest supported position + 1.
    pub context_length: usize,
    /// Sliding window `W` (used by sliding layers only).
    pub window: Option<usize>,
    /// Multiplier of `q . k`.
    pub attn_scale: f32,
    /// Multiplier of the embedding rows (`sqrt(d)` for Gemma, 1 for Flint).
    pub embed_scale: f32,
    /// Gated-MLP activation.
    pub activation: Activation,
    /// MoE routing, when any layer is MoE.
    pub moe: Option<MoeSpec>,
    /// One entry per layer.
    pub layers: Vec<LayerSpec>,
}

impl ModelSpec {
    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The window of layer `il` (None on full-attention layers).
    pub fn layer_window(&self, il: usize) -> Option<usize> {
        if self.layers[il].sliding {
            self.window
        } else {
            None
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
    /// Expert towers.
    pub experts: Mlp,
    /// The always-on shared expert, when present.
    pub shared: Option<Mlp>,
}

/// One layer's tensors.
#[derive(Clone, Debug)]
pub struct Layer {
    /// `attn_norm`.
    pub attn_norm: Vec<f32>,
    /// `attn_q`.
    pub wq: TensorRef,
    /// `attn_k`.
    pub wk: TensorRef,
    /// `attn_v`.
    pub wv: TensorRef,
    /// `attn_output`.
    pub wo: TensorRef,
    /// `attn_q_norm` (per head, over `dk`).
    pub q_norm: Option<Vec<f32>>,
    /// `attn_k_norm`.
    pub k_norm: Option<Vec<f32>>,
    /// `attn_sinks` (`[H]`).
    pub sinks: Option<Vec<f32>>,
    /// Gemma's `post_attention_norm`.
    pub post_attn_norm: Option<Vec<f32>>,
    /// `ffn_norm`.
    pub ffn_norm: Vec<f32>,
    /// The FFN.
    pub ffn: Ffn,
    /// Gemma's `post_ffw_norm`.
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A whole checkpoint, ready for either forward.
#[derive(Clone, Debug)]
pub struct Model {
    /// The hyper-parameters.
    pub spec: ModelSpec,
    /// `token_embd` `[d, V]`.
    pub token_embd: TensorRef,
    /// `output` `[d, V]` (the embedding itself when tied).
    pub output: TensorRef,
    /// `output_norm`.
    pub output_norm: Vec<f32>,
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
