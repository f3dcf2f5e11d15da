//! [`ModelDesc`]: one architecture-neutral, validated description of a model, the only
//! place Flint reads hyper-parameters. Every per-architecture difference the forward
//! needs is a field here; the engine assembles the model from it.
//!
//! Keys are written without the `{arch}.` prefix (`embedding_length` means
//! `llama.embedding_length` in a llama file). Defaults are llama.cpp's
//! (`src/llama-model.cpp` `load_hparams`, `src/models/{arch}.cpp` `load_arch_hparams`,
//! `src/llama-context.cpp` for the RoPE scaling parameters).

pub use flint_core::math::{DeltaNetShape, Gating, RopeKind, Yarn};

/// The architectures Flint runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `flint`: `shared/spec/FLINT.md`.
    Flint,
    /// `gemma3`: Gemma 3 at every published size.
    Gemma3,
    /// `llama`: Llama 2 and 3.x (dense only).
    Llama,
    /// `qwen2`: Qwen 2 / 2.5 (q/k/v biases).
    Qwen2,
    /// `qwen3`: Qwen 3 dense (per-head QK RMSNorm).
    Qwen3,
    /// `qwen3moe`: Qwen 3 MoE (Qwen3-30B-A3B, 235B-A22B): per-head QK RMSNorm, softmax
    /// routing over every expert, the top-k weights renormalised, no shared expert.
    Qwen3Moe,
    /// `glm4moe`: GLM-4.5 / 4.6 / Air: sigmoid routing with a selection bias, a scale on
    /// the routed weights, one shared expert, leading dense layers, partial RoPE, q/k/v
    /// biases, the pre-FFN norm named `post_attention_norm`; NextN/MTP layers skipped.
    Glm4Moe,
    /// `mimo2`: MiMo-V2-Flash / V2.5: hybrid sliding/full layers, attention sinks, a RoPE
    /// base of their own on sliding layers, per-layer KV head counts, `dv != dk`, partial
    /// RoPE, a value scale, sigmoid routing; NextN/MTP layers skipped.
    Mimo2,
    /// `gpt-oss`: gpt-oss-20b / 120b: sliding-window layers alternating with full ones
    /// (the first sliding), attention sinks on every layer, q/k/v/o biases, YaRN on every
    /// layer, a router with a bias, expert biases, the experts chosen on the raw logits
    /// and weighted by the softmax over the chosen ones, the clamped SwiGLU
    /// ([`Activation::SwigluOai`]), the pre-FFN norm named `post_attention_norm`.
    GptOss,
    /// `gemma4`: Gemma 4 (E2B, E4B, 26B-A4B, 31B): sliding layers with head sizes and a
    /// RoPE of their own, full layers with proportional RoPE (`rope_freqs`), per-head
    /// Q/K norms and a weightless V norm, attention scale 1, the last
    /// `attention.shared_kv_layers` layers reading an earlier layer's KV, per-layer
    /// token embeddings (E2B/E4B), a scale on each layer's output, and (26B-A4B) MoE
    /// layers that run a dense MLP beside the experts, each branch with its own norms.
    Gemma4,
    /// `qwen35moe`: Qwen 3.5 MoE (35B-A3B, 122B-A10B, 397B-A17B): Gated DeltaNet layers
    /// ([`Mixer::DeltaNet`]) interleaved with gated full-attention layers (a per-head
    /// sigmoid gate from the query projection, [`LayerDesc::attn_gate`]), per-head QK
    /// RMSNorm, partial NeoX RoPE, softmax routing renormalised, a shared expert behind a
    /// sigmoid gate ([`MoeDesc::shared_gate`]), the pre-FFN norm named
    /// `post_attention_norm`; MTP layers skipped.
    Qwen35Moe,
}

impl Arch {
    /// Every architecture, in the order the error messages list them.
    pub const ALL: [Arch; 11] = [
        Arch::Flint,
        Arch::Gemma3,
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Glm4Moe,
        Arch::Mimo2,
        Arch::GptOss,
        Arch::Gemma4,
        Arch::Qwen35Moe,
    ];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Flint => "flint",
            Arch::Gemma3 => "gemma3",
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Glm4Moe => "glm4moe",
            Arch::Mimo2 => "mimo2",
            Arch::GptOss => "gpt-oss",
            Arch::Gemma4 => "gemma4",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }

    /// The architecture a `general.architecture` value names, if Flint runs it.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The mixture-of-experts families of llama.cpp (`qwen3moe`, `glm4moe`, `mimo2`,
    /// `gpt-oss`), read by their own reader (`config/moe.rs`).
    pub fn is_moe_family(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe | Arch::Glm4Moe | Arch::Mimo2 | Arch::GptOss
        )
    }
}

/// The activation of the gated MLPs: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (flint, llama, qwen2, qwen3).
    Silu,
    /// GELU, tanh approximation (gemma3; llama.cpp `LLM_FFN_GELU`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (`flint_core::math::swiglu_oai`; llama.cpp
    /// `LLM_FFN_SWIGLU_OAI_MOE`): `min(gate, 7) * sigmoid(1.702 min(gate, 7)) *
    /// (clamp(up, -7, 7) + 1)`.
    SwigluOai,
}

/// Where the RMSNorms of a layer sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// `attn_norm` before attention, `ffn_norm` before the FFN (flint, llama, qwen).
    Pre,
    /// Gemma: as [`Pre`](Self::Pre), plus `post_attention_norm` on the attention output
    /// and `post_ffw_norm` on the FFN output, each before its residual add.
    PrePost,
}

/// The RoPE settings shared by every layer (the per-layer base and frequency scale are
/// in [`LayerDesc`]). These fill the HAL's `RopeParams`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeDesc {
    /// Pairing of the rotated dimensions (fixed per architecture, as llama.cpp's
    /// `llama_model_rope_type`: [`RopeKind::Normal`] for llama, [`RopeKind::Neox`] for
    /// flint, gemma3, qwen2 and qwen3).
    pub kind: RopeKind,
    /// Rotated dims `n_rot`, even, `<= head_dim_k` (`rope.dimension_count`, default
    /// `head_dim_k`; llama, qwen2 and qwen3 require it equal to `head_dim_k`).
    pub n_rot: usize,
    /// `rope_freqs.weight` (`[n_rot/2]`, f32) is present: its values divide each pair's
    /// frequency on every layer (Llama 3 rope scaling, as the converter writes it).
    pub freq_factors: bool,
    /// YaRN, when `rope.scaling.type = yarn`, as ggml's `ggml_rope_ext` takes it:
    /// `ext_factor` 1, `attn_factor` llama.cpp's `get_mscale(factor, 1) / (1 + 0.1 ln
    /// factor)` times `rope.scaling.attn_factor` (default 1), `beta_fast` 32 and
    /// `beta_slow` 1 (llama.cpp's defaults; these architectures read no
    /// `rope.scaling.yarn_*` key), `n_ctx_orig` `rope.scaling.original_context_length`
    /// (default `context_length`). It applies on every layer, each with its own
    /// [`LayerDesc::rope_freq_scale`] (1 on sliding layers, as in llama.cpp).
    pub yarn: Option<Yarn>,
}

/// Which attention projections carry a bias (`blk.N.attn_{q,k,v,output}.bias`, f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttnBiases {
    /// `attn_q.bias` `[H*dk]`.
    pub q: bool,
    /// `attn_k.bias` `[Hkv*dk]`.
    pub k: bool,
    /// `attn_v.bias` `[Hkv*dv]`.
    pub v: bool,
    /// `attn_output.bias` `[d]`.
    pub o: bool,
}

/// The Mixture-of-Experts routing (flint, qwen3moe, glm4moe, mimo2, gpt-oss).
///
/// Per family, as llama.cpp reads it: `qwen3moe` softmax, normalised, scale 1 (it reads
/// neither `expert_gating_func`, `expert_weights_norm` nor `expert_weights_scale`), no
/// shared expert, no leading dense layer, `Fe` from `expert_feed_forward_length` or else
/// `feed_forward_length / k`; `glm4moe` reads `expert_gating_func` (absent or 0 means
/// sigmoid), `expert_weights_norm` (default **false**), `expert_weights_scale` (absent or
/// 0 means 1), `expert_shared_count` (required; `n` shared experts are one expert of
/// width `n * Fe`, so `shared_count` is 1 and `shared_width` `n * Fe`),
/// `leading_dense_block_count` (default 0); `mimo2` sigmoid, normalised, scale 1, no
/// shared expert, and which layers are dense is told by the tensors (a layer without
/// `ffn_gate_inp` is dense): `leading_dense` is then the count of dense layers before
/// the first MoE layer, and [`LayerDesc::ffn`] is authoritative; `gpt-oss`
/// [`Gating::SoftmaxWeight`], not normalised, scale 1 (it reads no routing key), a router
/// bias and expert biases, `Fe` from `expert_feed_forward_length` (a scalar, or one entry
/// per block, all equal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeDesc {
    /// Routed experts `E` (`expert_count`, required).
    pub experts: usize,
    /// Experts chosen per token, `1 <= k <= E` (`expert_used_count`, required).
    pub used: usize,
    /// Width `Fe` of one routed expert (`expert_feed_forward_length`, required).
    pub expert_width: usize,
    /// Shared experts, 0 or 1 (`expert_shared_count`, default 0).
    pub shared_count: usize,
    /// Width `Fs` of the shared expert (`expert_shared_feed_forward_length`, default
    /// `Fe`).
    pub shared_width: usize,
    /// Router score function (`expert_gating_func`: 1 softmax, 2 sigmoid; default 2).
    pub gating: Gating,
    /// Renormalise the chosen weights to sum 1 (`expert_weights_norm`, default true).
    pub normalize: bool,
    /// Factor on the chosen weights after renormalising (`expert_weights_scale`,
    /// default 1).
    pub scale: f32,
    /// Layers `i < n` use a dense FFN (`leading_dense_block_count`, default 0).
    pub leading_dense: usize,
    /// Every MoE layer's router has a bias, `ffn_gate_inp.bias` `[E]` (f32), added to
    /// its logits (gpt-oss).
    pub router_bias: bool,
    /// Every MoE layer's expert towers have biases, added to each chosen expert's
    /// projections: `ffn_{gate,up}_exps.bias` `[Fe, E]` and `ffn_down_exps.bias`
    /// `[d, E]` (f32; gpt-oss).
    pub expert_biases: bool,
    /// Gemma 4's router: it reads the residual stream (not the pre-FFN norm's output),
    /// RMS-normed without a weight, scaled by `1/sqrt(d)` and by `ffn_gate_inp.scale`
    /// `[d]` (f32).
    pub router_input_scale: bool,
    /// Each chosen expert's output is multiplied by its entry of `ffn_down_exps.scale`
    /// `[E]` (f32; Gemma 4's `per_expert_scale`) before its routing weight.
    pub expert_out_scale: bool,
    /// The shared expert's output is multiplied by `sigmoid(ffn_gate_inp_shexp . x)`,
    /// `x` the FFN's input and `ffn_gate_inp_shexp` `[d]` (f32; Qwen 3.5 MoE).
    pub shared_gate: bool,
}

/// A layer's FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnDesc {
    /// A dense gated MLP of width `F` (`feed_forward_length`): `ffn_gate`, `ffn_up`
    /// `[d, F]`, `ffn_down` `[F, d]`.
    Dense {
        /// `F`.
        width: usize,
    },
    /// A routed MoE layer ([`ModelDesc::moe`]): router `ffn_gate_inp` `[d, E]`, towers
    /// `ffn_{gate,up}_exps` `[d, Fe, E]`, `ffn_down_exps` `[Fe, d, E]`.
    Moe {
        /// `exp_probs_b.bias` `[E]` (f32) is present: added to the scores for selection.
        selection_bias: bool,
        /// `ffn_{gate,up,down}_shexp` (width `Fs`) are present.
        shared_expert: bool,
        /// Gemma 4: a dense MLP of this width (`ffn_gate`, `ffn_up`, `ffn_down`) runs
        /// beside the experts. Its input is the usual pre-FFN norm and its output goes
        /// through `post_ffw_norm_1`; the experts' input goes through `pre_ffw_norm_2`
        /// and their sum through `post_ffw_norm_2`; the two sums are added and the
        /// layer's `post_ffw_norm` applies to that.
        parallel_dense: Option<usize>,
    },
}

/// What mixes a layer's tokens: attention over the KV cache, or a Gated DeltaNet layer
/// with a fixed-size recurrent state ([`ModelDesc::delta_net`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Attention (`attn_q`, `attn_k`, `attn_v`, `attn_output`).
    Attention,
    /// Qwen 3.5's Gated DeltaNet (linear attention): `attn_qkv` `[d, conv_dim]` (q, k,
    /// v), `attn_gate` `[d, heads_v * head_dim]` (z), `ssm_conv1d` `[conv_kernel,
    /// conv_dim]`, `ssm_dt.bias` and `ssm_a` `[heads_v]`, `ssm_beta` and `ssm_alpha`
    /// `[d, heads_v]`, `ssm_norm` `[head_dim]`, `ssm_out` `[heads_v * head_dim, d]`; the
    /// math is `flint_core::math::delta`'s.
    DeltaNet,
}

/// The Gated DeltaNet layers' sizes (`ssm.*` keys; Qwen 3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetDesc {
    /// Key heads (`ssm.group_count`), value heads (`ssm.time_step_rank`) and head size
    /// (`ssm.state_size`, the same for keys and values: `ssm.inner_size` must be
    /// `time_step_rank * state_size`).
    pub shape: DeltaNetShape,
    /// Width of the causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
}

impl DeltaNetDesc {
    /// Channels of the convolution: `2 * heads_k * head_dim + heads_v * head_dim` (all
    /// of q, then k, then v).
    pub fn conv_dim(&self) -> usize {
        2 * self.shape.qk_len() + self.shape.v_len()
    }
}

/// Per-layer facts.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerDesc {
    /// What mixes the tokens. On a [`Mixer::DeltaNet`] layer the attention fields
    /// below (heads, RoPE, window, norms, biases, sinks, KV source) describe nothing.
    pub mixer: Mixer,
    /// The query projection `attn_q` is `[d, 2 * H * dk]`: per head its query then a
    /// gate, and the attention output (before `attn_output`) is multiplied by
    /// `sigmoid(gate)` (Qwen 3.5).
    pub attn_gate: bool,
    /// A sliding-window layer: attends to the [`ModelDesc::window`] newest positions.
    pub sliding: bool,
    /// RoPE base: `rope.freq_base` (default 10000; required for flint) on full layers,
    /// `rope.freq_base_swa` on sliding ones (default 10000 for gemma3 as llama.cpp's
    /// `rope_freq_base_train_swa`; `rope.freq_base` for flint).
    pub rope_base: f32,
    /// RoPE frequency scale (ggml's `freq_scale`, `1 / rope.scaling.factor`): the file's
    /// linear or YaRN factor on full-attention layers, 1 on sliding layers (llama.cpp's
    /// `rope_freq_scale_train_swa`). 1 when `rope.scaling.type = none` or no factor.
    pub rope_freq_scale: f32,
    /// Per-head RMSNorm of Q and K (`attn_q_norm`, `attn_k_norm` `[dk]`, f32).
    pub qk_norm: bool,
    /// Attention sinks (`attn_sinks.weight` `[H]`, f32; flint, mimo2, gpt-oss).
    pub sinks: bool,
    /// KV heads of this layer. Equal to [`ModelDesc::n_kv_heads`] on every layer except
    /// in `mimo2`, whose `attention.head_count_kv` may be an array with one entry per
    /// block (the converter writes the sliding layers' count on sliding layers); `H` is a
    /// multiple of it. Shapes of this layer's `attn_k` / `attn_v` follow it.
    pub n_kv_heads: usize,
    /// Attention biases present on this layer.
    pub biases: AttnBiases,
    /// The FFN.
    pub ffn: FfnDesc,
    /// Key (and query) head size of this layer: [`ModelDesc::head_dim_k`] except on
    /// Gemma 4's sliding layers (`attention.key_length_swa`).
    pub head_dim_k: usize,
    /// Value head size of this layer: [`ModelDesc::head_dim_v`] except on Gemma 4's
    /// sliding layers (`attention.value_length_swa`).
    pub head_dim_v: usize,
    /// Rotated dims of this layer: [`RopeDesc::n_rot`] except on Gemma 4's sliding
    /// layers (`rope.dimension_count_swa`).
    pub n_rot: usize,
    /// `rope_freqs` divides this layer's RoPE frequencies (llama: every layer when the
    /// tensor is present; gemma4: the full-attention layers, whose "proportional" RoPE
    /// the converter writes as factors of 1e30 on the unrotated pairs).
    pub rope_freq_factors: bool,
    /// The layer whose KV this layer attends to, when not its own: Gemma 4's last
    /// `attention.shared_kv_layers` layers read the last earlier layer of their kind
    /// (sliding or full) and write no KV. `None`: its own.
    pub kv_source: Option<usize>,
    /// `layer_output_scale.weight` `[1]` (f32) is present: the layer's output (the
    /// residual stream after it) is multiplied by it (Gemma 4).
    pub out_scale: bool,
}

/// Everything the forward needs besides the tensors' bytes, validated against the file's
/// keys and tensors ([`ModelDesc::from_gguf`](super::ModelDesc::from_gguf)).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelDesc {
    /// The architecture (`general.architecture`).
    pub arch: Arch,
    /// Hidden size `d` (`embedding_length`, required).
    pub d: usize,
    /// Query heads `H` (`attention.head_count`, required).
    pub n_heads: usize,
    /// KV heads `Hkv`, dividing `H` (`attention.head_count_kv`, default `H`; required
    /// for flint). Where layers differ (`mimo2` with a per-layer array) this is the
    /// largest count over the layers (the size a per-token KV buffer needs); the layer's
    /// own count is [`LayerDesc::n_kv_heads`].
    pub n_kv_heads: usize,
    /// Head size `dk` of Q and K (`attention.key_length`, default `d / H`).
    pub head_dim_k: usize,
    /// Head size `dv` of V (`attention.value_length`, default `d / H`; `dk` for flint).
    /// Only flint and mimo2 allow `dv != dk` (mimo2: 128 and 192 in MiMo-V2-Flash). Every
    /// layer has these sizes except Gemma 4's sliding layers ([`LayerDesc::head_dim_k`]);
    /// other architectures refuse llama.cpp's `*_swa` head sizes when they differ.
    pub head_dim_v: usize,
    /// Epsilon of every RMSNorm (`attention.layer_norm_rms_epsilon`, required).
    pub rms_eps: f32,
    /// Vocabulary size `V` (from `token_embd.weight` `[d, V]`).
    pub vocab: usize,
    /// `output.weight` is absent: the output projection is `token_embd.weight`.
    pub tied_output: bool,
    /// Largest position count (`context_length`, required).
    pub context_length: usize,
    /// Multiplier of the embedding rows: `sqrt(d)` for gemma3, else 1.
    pub embed_scale: f32,
    /// The attention (query) scale, as llama.cpp computes it: `1/sqrt(dk)`, except
    /// Gemma 3 27B (62 layers), where it is `1/sqrt(d / H)` (`query_pre_attn_scalar`).
    pub attn_scale: f32,
    /// The query is multiplied by [`attn_scale`](Self::attn_scale) after RoPE and the
    /// attention then scales `q.k` by 1 (gemma3: llama.cpp's `ggml_scale` on Q); when
    /// false the attention scales `q.k` by `attn_scale`.
    pub q_prescaled: bool,
    /// Final logit soft-capping `c * tanh(x / c)` (`final_logit_softcapping`, gemma3;
    /// absent or 0 = none).
    pub logit_softcap: Option<f32>,
    /// The gated-MLP activation.
    pub activation: Activation,
    /// Norm placement.
    pub norms: NormPlacement,
    /// RoPE settings shared by every layer.
    pub rope: RopeDesc,
    /// Sliding window `W` of the sliding layers (`attention.sliding_window`; gemma3:
    /// absent or 0 = no sliding layer).
    pub window: Option<usize>,
    /// MoE routing, when some layer is MoE (flint, qwen3moe, glm4moe, mimo2, gpt-oss).
    pub moe: Option<MoeDesc>,
    /// One entry per layer the forward runs: `block_count` minus `nextn_predict_layers`
    /// (llama.cpp's `n_layer`; `block_count` is required).
    pub layers: Vec<LayerDesc>,
    /// Blocks the file describes but the forward never runs: the NextN / MTP
    /// (multi-token prediction) blocks `blk.N` with `layers.len() <= N < block_count`
    /// (`nextn_predict_layers` of them; glm4moe and mimo2 only, empty elsewhere). Their
    /// tensors, when present, are accepted by name (llama.cpp's names for that block:
    /// a decoder layer's plus `nextn.*` and `layer_output_norm`) and never read; their
    /// shapes are not checked. A file may also lack them (llama.cpp's "trunk only").
    pub skipped_layers: Vec<usize>,
    /// Factor on each layer's attention output, after `attn_output`
    /// (`attention.value_scale`, mimo2 only: llama.cpp's `ggml_scale` after `build_attn`;
    /// the same as scaling V). 1 when absent, 1 or 0 (llama.cpp applies it only when it is
    /// neither), and for every other architecture.
    pub value_scale: f32,
    /// V is RMS-normed per head without a weight before it is cached (Gemma 4).
    pub v_norm: bool,
    /// The Gated DeltaNet layers' sizes, when some layer is [`Mixer::DeltaNet`].
    pub delta_net: Option<DeltaNetDesc>,
    /// Width of Gemma 4's per-layer token embeddings (`embedding_length_per_layer_input`;
    /// 0: none). When nonzero, `per_layer_token_embd` `[P * L, V]`,
    /// `per_layer_model_proj` `[d, P * L]` and `per_layer_proj_norm` `[P]` make a
    /// `[P]` input per layer, which each layer gates (`inp_gate` `[d, P]`, GELU),
    /// projects (`proj` `[P, d]`), norms (`post_norm`) and adds to its output.
    pub per_layer_input: usize,
    /// The name of each layer's pre-FFN RMSNorm weight, `blk.N.{ffn_norm_tensor}.weight`:
    /// `ffn_norm` everywhere but glm4moe and gpt-oss, whose converters write that norm as
    /// `post_attention_norm` (llama.cpp's `attn_post_norm`, applied to the residual
    /// stream before the FFN, exactly where the others apply `ffn_norm`). Not Gemma's post
    /// norms: those are [`NormPlacement::PrePost`].
    pub ffn_norm_tensor: &'static str,
}

impl ModelDesc {
    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The largest key and value head sizes over the layers (the size a per-token
    /// buffer of any layer needs).
    pub fn max_head_dims(&self) -> (usize, usize) {
        self.layers
            .iter()
            .fold((self.head_dim_k, self.head_dim_v), |(k, v), l| {
                (k.max(l.head_dim_k), v.max(l.head_dim_v))
            })
    }

    /// The layer whose KV cache layer `il` reads: its own, or (Gemma 4's shared-KV
    /// layers) [`LayerDesc::kv_source`].
    pub fn kv_layer(&self, il: usize) -> usize {
        self.layers.get(il).and_then(|l| l.kv_source).unwrap_or(il)
    }

    /// The window of layer `il` (`None` on full-attention layers or out of range).
    pub fn layer_window(&self, il: usize) -> Option<usize> {
        match self.layers.get(il) {
            Some(l) if l.sliding => self.window,
            _ => None,
        }
    }
}
