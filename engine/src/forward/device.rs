//! The device forward: the model staged on a [`Device`](flint_hal::Device) and run
//! through the HAL, a batch of tokens from many sequences at a time.
//!
//! A step takes a [`Batch`]: for every sequence its new tokens, the position of the
//! first one, and its block table in each KV group (the groups of
//! [`groups_from_layers`], in its order; each layer carries the index of its own
//! group). All tokens of all sequences go through every
//! weight together as one `[n_tokens, d]` activation matrix; each layer writes its keys
//! and values through its own group's slot mapping
//! (`slot = table[pos / block_size] * block_size + pos % block_size`) and reads them back
//! with one `paged_attention` call over all sequences.
//!
//! A Gated DeltaNet layer (Qwen 3.5) keeps no keys and values but one recurrent state
//! per sequence ([`RecurrentStates`]): its KV group is the recurrent one, whose block
//! table is `[state slot]`; the forward zeroes a sequence's state at its position 0 and
//! carries it from step to step, sequence by sequence (`ssm_conv_silu`,
//! `gated_delta_net`).
//!
//! [`Session`] wraps this for one sequence with a trivial block table (the CLI, the
//! gates); the paged engine builds its batches itself.

use flint_core::math::{delta_net_gate, l2_norm_heads, sigmoid_ggml};
use flint_hal::{
    AttnSeq, DeviceRef, ExpertRow, KvBuffer, KvLayout, Op, PagedAttention, RopeParams,
    RoutingConfig, WeightDesc, WeightHandle, WeightKind,
};

use crate::forward::profile::timed;
use crate::kv::{groups_from_layers, GroupKind, KvGroupSpec, LayerCache};
use crate::model::{
    layer_rope, soft_cap, Activation, DeltaNetDesc, ExpertBiases, Ffn, Mixer, Mlp, Model,
    ModelDesc, ModelError, TensorRef,
};

/// Gemma 4's dense MLP beside the experts, staged, with both branches' norms.
#[derive(Debug)]
struct DevParallel {
    mlp: DevMlp,
    post_norm_1: Vec<f32>,
    pre_norm_2: Vec<f32>,
    post_norm_2: Vec<f32>,
}

/// Gemma 4's per-layer token embeddings, the model's part, staged.
#[derive(Debug)]
struct DevPerLayerInputs {
    token_embd: WeightHandle,
    model_proj: WeightHandle,
    proj_norm: Vec<f32>,
}

/// Gemma 4's per-layer input, a layer's part, staged.
#[derive(Debug)]
struct DevLayerInput {
    inp_gate: WeightHandle,
    proj: WeightHandle,
    post_norm: Vec<f32>,
}

/// The gate, up and hidden activations of an MLP or of the routed experts, and the
/// experts' outputs, kept across the layers of a step.
#[derive(Debug, Default)]
struct MlpBufs {
    gate: Vec<f32>,
    up: Vec<f32>,
    hidden: Vec<f32>,
    expert_out: Vec<f32>,
    /// The routing and branch buffers of an MoE layer, and a per-layer input's.
    moe: MoeBufs,
}

/// The buffers of an MoE layer besides its towers' activations (router input and
/// logits, the chosen experts and weights, the shared and parallel dense branches'
/// outputs, a norm scratch), and of Gemma 4's per-layer input; kept across the layers
/// of a step, grown when needed.
#[derive(Debug, Default)]
struct MoeBufs {
    expert_in: Vec<f32>,
    router_in: Vec<f32>,
    logits: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f32>,
    branch_out: Vec<f32>,
    scratch: Vec<f32>,
}

/// The first `len` values of `b`, grown (with zeros) when shorter.
fn grown<T: Copy + Default>(b: &mut Vec<T>, len: usize) -> &mut [T] {
    if b.len() < len {
        b.resize(len, T::default());
    }
    &mut b[..len]
}

impl MlpBufs {
    /// The gate, up and hidden buffers, `len` values each, and the expert output
    /// buffer, `out_len` values (grown when needed).
    fn take(&mut self, len: usize, out_len: usize) -> [&mut [f32]; 4] {
        [
            grown(&mut self.gate, len),
            grown(&mut self.up, len),
            grown(&mut self.hidden, len),
            grown(&mut self.expert_out, out_len),
        ]
    }
}

/// A step's buffers of the attention (and of every norm done in place), kept across
/// its layers.
#[derive(Debug)]
struct StepBufs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    /// Qwen 3.5's attention output gate, `sigmoid` of the query projection's gate half.
    q_gate: Vec<f32>,
    norm_src: Vec<f32>,
    mlp: MlpBufs,
    delta: DeltaBufs,
}

/// A step's buffers of the Gated DeltaNet layers, kept across its layers (every one is
/// written whole before it is read).
#[derive(Debug, Default)]
struct DeltaBufs {
    qkv: Vec<f32>,
    z: Vec<f32>,
    beta: Vec<f32>,
    alpha: Vec<f32>,
    conv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    normed: Vec<f32>,
}

#[derive(Debug)]
struct DevMlp {
    gate: WeightHandle,
    up: WeightHandle,
    down: WeightHandle,
    width: usize,
}

// One per layer, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum DevFfn {
    Dense(DevMlp),
    Moe {
        router: WeightHandle,
        bias: Option<Vec<f32>>,
        router_bias: Option<Vec<f32>>,
        experts: DevMlp,
        expert_biases: Option<ExpertBiases>,
        shared: Option<DevMlp>,
        /// Gemma 4's router input weight: `ffn_gate_inp.scale / sqrt(d)` (one product
        /// per element where llama.cpp scales, then multiplies: within an ulp).
        router_norm: Option<Vec<f32>>,
        expert_scale: Option<Vec<f32>>,
        parallel: Option<DevParallel>,
        /// Qwen 3.5's shared-expert gate `ffn_gate_inp_shexp` (one output row).
        shared_gate: Option<WeightHandle>,
    },
}

/// A layer's attention, staged.
#[derive(Debug)]
struct DevAttn {
    wq: WeightHandle,
    wk: WeightHandle,
    wv: WeightHandle,
    wo: WeightHandle,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    bo: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

/// A Gated DeltaNet layer, staged (the tensors of `model::DeltaNetLayer`).
#[derive(Debug)]
struct DevDeltaNet {
    qkv: WeightHandle,
    gate: WeightHandle,
    beta: WeightHandle,
    alpha: WeightHandle,
    out: WeightHandle,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    norm: Vec<f32>,
}

/// What mixes a layer's tokens.
// One per layer, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum DevMixer {
    Attention(DevAttn),
    DeltaNet(DevDeltaNet),
}

#[derive(Debug)]
struct DevLayer {
    /// Index of this layer's KV group in [`DeviceModel::kv_groups`]: the block table its
    /// keys and values (or, a Gated DeltaNet layer, its state slot) are reached through.
    kv_group: usize,
    attn_norm: Vec<f32>,
    mixer: DevMixer,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    ffn: DevFfn,
    post_ffn_norm: Option<Vec<f32>>,
    per_layer: Option<DevLayerInput>,
    out_scale: Option<f32>,
}

/// A model staged on a device.
#[derive(Debug)]
pub struct DeviceModel {
    dev: DeviceRef,
    spec: ModelDesc,
    token_embd: WeightHandle,
    output: WeightHandle,
    rope_freqs: Option<Vec<f32>>,
    output_norm: Vec<f32>,
    per_layer: Option<DevPerLayerInputs>,
    layers: Vec<DevLayer>,
    kv_groups: Vec<KvGroupSpec>,
}

/// One sequence's part of a [`Batch`].
#[derive(Clone, Debug)]
pub struct BatchSeq<'a> {
    /// Its new tokens, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start_pos: u32,
    /// Its block table in each KV group, in the order of [`DeviceModel::kv_groups`].
    pub block_tables: Vec<&'a [u32]>,
    /// Logits wanted for every new token (teacher forcing) instead of the last only.
    pub all_logits: bool,
}

/// One forward step over many sequences.
#[derive(Clone, Debug)]
pub struct Batch<'a> {
    /// The sequences; their tokens are laid out one after another.
    pub seqs: Vec<BatchSeq<'a>>,
    /// Tokens per KV block.
    pub block_size: usize,
}

impl Batch<'_> {
    /// Rows of logits [`DeviceModel::forward`] returns: per sequence, all its tokens or
    /// its last (none for a sequence without new tokens).
    pub fn n_logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| {
                if s.all_logits {
                    s.tokens.len()
                } else {
                    s.tokens.len().min(1)
                }
            })
            .sum()
    }
}

fn desc(t: &TensorRef, kind: WeightKind) -> WeightDesc {
    WeightDesc {
        name: t.name.clone(),
        ty: t.ty,
        dims: t.dims.clone(),
        kind,
        data: t.data.clone(),
    }
}

fn stage_one(dev: &DeviceRef, t: &TensorRef, kind: WeightKind) -> Result<WeightHandle, ModelError> {
    dev.stage(&desc(t, kind))
        .map_err(|source| ModelError::Device {
            context: format!("staging '{}' on {}", t.name, dev.name()),
            source,
        })
}

/// What each layer keeps between steps (the key of its KV group).
pub fn layer_caches(spec: &ModelDesc) -> Vec<LayerCache> {
    spec.layers
        .iter()
        .map(|l| match (l.mixer, l.sliding) {
            (Mixer::DeltaNet, _) => LayerCache::Recurrent,
            (Mixer::Attention, true) => LayerCache::Sliding,
            (Mixer::Attention, false) => LayerCache::Full,
        })
        .collect()
}

/// The recurrent state of every Gated DeltaNet layer, `slots` sequences' worth: per
/// layer and slot the convolution window (`conv_dim` rows of `conv_kernel - 1` inputs)
/// then the delta-rule state (`heads_v` blocks of `head_dim^2`), as
/// `Device::ssm_conv_silu` and `Device::gated_delta_net` carry them. A sequence's slot
/// is its block in the recurrent KV group; the forward zeroes it at the sequence's
/// position 0. Held in host memory (the device interface takes the state per call).
#[derive(Debug, Default)]
pub struct RecurrentStates {
    conv_len: usize,
    delta_len: usize,
    slots: usize,
    /// Per layer (empty for attention layers): `slots` states one after another.
    layers: Vec<Vec<f32>>,
}

impl RecurrentStates {
    /// Zeroed states of `slots` sequences for every Gated DeltaNet layer of `spec` (none
    /// for a model without such layers).
    pub fn new(spec: &ModelDesc, slots: usize) -> Self {
        let Some(dn) = spec.delta_net else {
            return Self::default();
        };
        let (conv_len, delta_len) = Self::lens(&dn);
        let layers = spec
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::DeltaNet => vec![0.0; slots * (conv_len + delta_len)],
                Mixer::Attention => Vec::new(),
            })
            .collect();
        Self {
            conv_len,
            delta_len,
            slots,
            layers,
        }
    }

    fn lens(dn: &DeltaNetDesc) -> (usize, usize) {
        (
            dn.conv_dim() * dn.conv_kernel.saturating_sub(1),
            dn.shape.state_len(),
        )
    }

    /// Bytes of one sequence's state over every Gated DeltaNet layer of `spec`.
    pub fn bytes_per_slot(spec: &ModelDesc) -> u64 {
        let Some(dn) = spec.delta_net else {
            return 0;
        };
        let (c, d) = Self::lens(&dn);
        let n = spec
            .layers
            .iter()
            .filter(|l| l.mixer == Mixer::DeltaNet)
            .count();
        (n * (c + d) * std::mem::size_of::<f32>()) as u64
    }

    /// Slots held.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The convolution window and the delta-rule state of `slot` in layer `il`.
    fn slot_mut(&mut self, il: usize, slot: u32) -> Result<(&mut [f32], &mut [f32]), ModelError> {
        let len = self.conv_len + self.delta_len;
        let slot = slot as usize;
        let conv_len = self.conv_len;
        let slots = self.slots;
        let layer = self
            .layers
            .get_mut(il)
            .filter(|l| !l.is_empty())
            .ok_or_else(|| ModelError::new(format!("layer {il} has no recurrent state")))?;
        let state = layer.get_mut(slot * len..(slot + 1) * len).ok_or_else(|| {
            ModelError::new(format!(
                "state slot {slot} is outside the {slots} slots of layer {il}"
            ))
        })?;
        Ok(state.split_at_mut(conv_len))
    }
}

/// Every weight [`DeviceModel::stage`] stages, in its order: what it hands to
/// `Device::plan` first.
pub fn weight_descs(model: &Model) -> Vec<WeightDesc> {
    let mut v = vec![desc(&model.token_embd, WeightKind::Embedding)];
    if model.output.name != model.token_embd.name {
        v.push(desc(&model.output, WeightKind::Matrix));
    }
    let mlp = |v: &mut Vec<WeightDesc>, m: &Mlp, kind| {
        v.extend([&m.gate, &m.up, &m.down].map(|t| desc(t, kind)));
    };
    for l in &model.layers {
        match &l.ffn {
            Ffn::Dense(m) => mlp(&mut v, m, WeightKind::Matrix),
            Ffn::Moe(moe) => {
                mlp(&mut v, &moe.experts, WeightKind::ExpertTower);
                if let Some(s) = &moe.shared {
                    mlp(&mut v, s, WeightKind::Matrix);
                }
                if let Some(p) = &moe.parallel {
                    mlp(&mut v, &p.mlp, WeightKind::Matrix);
                }
                v.push(desc(&moe.router, WeightKind::Matrix));
                if let Some(g) = &moe.shared_gate {
                    v.push(desc(g, WeightKind::Matrix));
                }
            }
        }
        match &l.delta_net {
            Some(dn) => v.extend(
                [&dn.qkv, &dn.gate, &dn.beta, &dn.alpha, &dn.out]
                    .map(|t| desc(t, WeightKind::Matrix)),
            ),
            None => v.extend([&l.wq, &l.wk, &l.wv, &l.wo].map(|t| desc(t, WeightKind::Matrix))),
        }
        if let Some(pl) = &l.per_layer {
            v.extend([&pl.inp_gate, &pl.proj].map(|t| desc(t, WeightKind::Matrix)));
        }
    }
    if let Some(pl) = &model.per_layer {
        v.push(desc(&pl.token_embd, WeightKind::Embedding));
        v.push(desc(&pl.model_proj, WeightKind::Matrix));
    }
    v
}

impl DeviceModel {
    /// Stages every matrix of `model` on `dev`, after the device's staging plan for all
    /// of them (`Device::plan`: which stay resident, which stream; a weight the device
    /// cannot take fails here, before anything is staged; `stage` follows the plan).
    /// `progress(done, total)` is called after each tensor (for a progress bar).
    pub fn stage(
        model: &Model,
        dev: DeviceRef,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        if model.spec.delta_net.is_some() {
            for (op, what) in [
                (Op::SsmConvSilu, "ssm_conv_silu"),
                (Op::GatedDeltaNet, "gated_delta_net"),
            ] {
                if !dev.supports(op, None) {
                    return Err(ModelError::Device {
                        context: format!(
                            "staging a {} model on {}",
                            model.spec.arch.name(),
                            dev.name()
                        ),
                        source: flint_hal::HalError::unsupported(format!(
                            "the device has no {what} (Gated DeltaNet layers)"
                        )),
                    });
                }
            }
        }
        let tied = model.output.name == model.token_embd.name;
        if model.spec.activation == Activation::SwigluOai
            && !dev.supports(flint_hal::Op::SwigluOaiMul, None)
        {
            return Err(ModelError::Device {
                context: format!(
                    "staging a {} model on {}",
                    model.spec.arch.name(),
                    dev.name()
                ),
                source: flint_hal::HalError::unsupported(
                    "the device has no swiglu_oai_mul (gpt-oss's clamped SwiGLU)",
                ),
            });
        }
        let descs = weight_descs(model);
        let plan = dev.plan(&descs).map_err(|source| ModelError::Device {
            context: format!("planning the weights on {}", dev.name()),
            source,
        })?;
        tracing::debug!(
            resident = plan.resident_bytes(),
            expert_tier = plan.expert_tier_bytes(),
            streamed = plan.streamed_bytes(),
            "staging plan on {}",
            dev.name()
        );
        let total = descs.len();
        let mut done = 0usize;
        let mut st = |t: &TensorRef, kind: WeightKind| -> Result<WeightHandle, ModelError> {
            let h = stage_one(&dev, t, kind)?;
            done += 1;
            progress(done, total);
            Ok(h)
        };
        let token_embd = st(&model.token_embd, WeightKind::Embedding)?;
        let output = if tied {
            // Tied: one staged copy serves get_rows and the output matmul.
            token_embd.clone()
        } else {
            st(&model.output, WeightKind::Matrix)?
        };
        let kv_groups = groups_from_layers(&layer_caches(&model.spec), model.spec.window);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (il, l) in model.layers.iter().enumerate() {
            let kv_group = kv_groups
                .iter()
                .position(|g| g.layers.contains(&il))
                .ok_or_else(|| ModelError::new(format!("layer {il} belongs to no KV group")))?;
            let mut mlp = |m: &Mlp, kind: WeightKind| -> Result<DevMlp, ModelError> {
                Ok(DevMlp {
                    gate: st(&m.gate, kind)?,
                    up: st(&m.up, kind)?,
                    down: st(&m.down, kind)?,
                    width: m.gate.dims[1],
                })
            };
            let ffn = match &l.ffn {
                Ffn::Dense(m) => DevFfn::Dense(mlp(m, WeightKind::Matrix)?),
                Ffn::Moe(moe) => {
                    let experts = mlp(&moe.experts, WeightKind::ExpertTower)?;
                    let shared = match &moe.shared {
                        Some(s) => Some(mlp(s, WeightKind::Matrix)?),
                        None => None,
                    };
                    let parallel = match &moe.parallel {
                        Some(p) => Some(DevParallel {
                            mlp: mlp(&p.mlp, WeightKind::Matrix)?,
                            post_norm_1: p.post_norm_1.clone(),
                            pre_norm_2: p.pre_norm_2.clone(),
                            post_norm_2: p.post_norm_2.clone(),
                        }),
                        None => None,
                    };
                    let inv = 1.0 / (model.spec.d as f32).sqrt();
                    DevFfn::Moe {
                        router: st(&moe.router, WeightKind::Matrix)?,
                        bias: moe.bias.clone(),
                        router_bias: moe.router_bias.clone(),
                        experts,
                        expert_biases: moe.expert_biases.clone(),
                        shared,
                        router_norm: moe
                            .router_scale
                            .as_ref()
                            .map(|s| s.iter().map(|&w| inv * w).collect()),
                        expert_scale: moe.expert_scale.clone(),
                        parallel,
                        shared_gate: match &moe.shared_gate {
                            Some(g) => Some(st(g, WeightKind::Matrix)?),
                            None => None,
                        },
                    }
                }
            };
            let mixer = match &l.delta_net {
                Some(dn) => DevMixer::DeltaNet(DevDeltaNet {
                    qkv: st(&dn.qkv, WeightKind::Matrix)?,
                    gate: st(&dn.gate, WeightKind::Matrix)?,
                    beta: st(&dn.beta, WeightKind::Matrix)?,
                    alpha: st(&dn.alpha, WeightKind::Matrix)?,
                    out: st(&dn.out, WeightKind::Matrix)?,
                    conv: dn.conv.clone(),
                    dt_bias: dn.dt_bias.clone(),
                    a: dn.a.clone(),
                    norm: dn.norm.clone(),
                }),
                None => DevMixer::Attention(DevAttn {
                    wq: st(&l.wq, WeightKind::Matrix)?,
                    wk: st(&l.wk, WeightKind::Matrix)?,
                    wv: st(&l.wv, WeightKind::Matrix)?,
                    wo: st(&l.wo, WeightKind::Matrix)?,
                    bq: l.bq.clone(),
                    bk: l.bk.clone(),
                    bv: l.bv.clone(),
                    bo: l.bo.clone(),
                    q_norm: l.q_norm.clone(),
                    k_norm: l.k_norm.clone(),
                    sinks: l.sinks.clone(),
                }),
            };
            layers.push(DevLayer {
                kv_group,
                attn_norm: l.attn_norm.clone(),
                mixer,
                post_attn_norm: l.post_attn_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                ffn,
                post_ffn_norm: l.post_ffn_norm.clone(),
                per_layer: match &l.per_layer {
                    Some(pl) => Some(DevLayerInput {
                        inp_gate: st(&pl.inp_gate, WeightKind::Matrix)?,
                        proj: st(&pl.proj, WeightKind::Matrix)?,
                        post_norm: pl.post_norm.clone(),
                    }),
                    None => None,
                },
                out_scale: l.out_scale,
            });
        }
        let per_layer = match &model.per_layer {
            Some(pl) => Some(DevPerLayerInputs {
                token_embd: st(&pl.token_embd, WeightKind::Embedding)?,
                model_proj: st(&pl.model_proj, WeightKind::Matrix)?,
                proj_norm: pl.proj_norm.clone(),
            }),
            None => None,
        };
        Ok(Self {
            dev,
            spec: model.spec.clone(),
            token_embd,
            output,
            rope_freqs: model.rope_freqs.clone(),
            output_norm: model.output_norm.clone(),
            per_layer,
            layers,
            kv_groups,
        })
    }

    /// The hyper-parameters.
    pub fn spec(&self) -> &ModelDesc {
        &self.spec
    }

    /// The device.
    pub fn device(&self) -> &DeviceRef {
        &self.dev
    }

    /// The KV layout of layer `il` for a pool of `num_blocks` blocks of `block_size`,
    /// with the layer's own KV heads and head sizes. A layer that keeps no keys and
    /// values of its own (gemma4's shared-KV layers, which read an earlier layer's; Gated
    /// DeltaNet layers, whose state is in [`RecurrentStates`]) gets one block: a
    /// placeholder never written or read.
    pub fn kv_layout(&self, il: usize, num_blocks: usize, block_size: usize) -> KvLayout {
        let l = &self.spec.layers[il];
        let own = l.kv_source.is_none() && l.mixer == Mixer::Attention;
        KvLayout {
            num_blocks: if own { num_blocks } else { 1 },
            block_size,
            n_kv_heads: l.n_kv_heads,
            head_dim_k: l.head_dim_k,
            head_dim_v: l.head_dim_v,
        }
    }

    /// Allocates one KV buffer per layer, each with its layer's KV heads.
    pub fn alloc_kv(
        &self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Vec<Box<dyn KvBuffer>>, ModelError> {
        (0..self.layers.len())
            .map(|il| {
                let layout = self.kv_layout(il, num_blocks, block_size);
                self.dev.alloc_kv(&layout).map_err(ModelError::from)
            })
            .collect()
    }

    /// The KV groups, as [`groups_from_layers`] derives them from what each layer keeps
    /// (the full group first, the recurrent one last). A [`BatchSeq`] carries one block table per group, in
    /// this order.
    pub fn kv_groups(&self) -> &[KvGroupSpec] {
        &self.kv_groups
    }

    /// The index in [`DeviceModel::kv_groups`] of layer `il`'s KV group.
    pub fn layer_group(&self, il: usize) -> usize {
        self.layers[il].kv_group
    }

    /// Runs one step: every token of every sequence of `batch` through all layers,
    /// writing their KV into `kv` (one buffer per layer). Returns the logits rows
    /// ([`Batch::n_logit_rows`] x vocab), sequence by sequence.
    pub fn forward(
        &self,
        kv: &mut [Box<dyn KvBuffer>],
        states: &mut RecurrentStates,
        batch: &Batch<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        // One hand-off to the device's workers per step, not one per op.
        let mut result = None;
        self.dev.run_step(&mut || {
            result = Some(timed!("step", self.forward_in_step(kv, states, batch)))
        });
        result.unwrap_or_else(|| Err(ModelError::new("the device did not run the step")))
    }

    fn forward_in_step(
        &self,
        kv: &mut [Box<dyn KvBuffer>],
        states: &mut RecurrentStates,
        batch: &Batch<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let spec = &self.spec;
        let dev = &self.dev;
        // Buffers take the largest head sizes (gemma4's differ between sliding and full
        // layers); each layer uses its own.
        let (dk_max, dv_max) = spec.max_head_dims();
        let (d, h, hkv) = (spec.d, spec.n_heads, spec.n_kv_heads);
        assert_eq!(kv.len(), self.layers.len(), "one KV buffer per layer");
        let bs = batch.block_size;

        // Flatten the batch: tokens, positions, per-group slots, per-seq row ranges.
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let n_groups = self.kv_groups.len();
        let mut slots: Vec<Vec<u32>> = vec![Vec::new(); n_groups];
        let mut starts = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            if s.block_tables.len() != n_groups {
                return Err(ModelError::new(format!(
                    "a sequence carries {} block tables for the model's {n_groups} KV groups",
                    s.block_tables.len()
                )));
            }
            starts.push(tokens.len());
            for (i, &t) in s.tokens.iter().enumerate() {
                if t as usize >= spec.vocab {
                    return Err(ModelError::new(format!(
                        "token id {t} is outside the vocabulary of {}",
                        spec.vocab
                    )));
                }
                let p = s.start_pos + i as u32;
                if p as usize >= spec.context_length {
                    return Err(ModelError::new(format!(
                        "position {p} is beyond the model's context length {}",
                        spec.context_length
                    )));
                }
                tokens.push(t);
                positions.push(p);
                for (g, slot) in slots.iter_mut().enumerate() {
                    // A recurrent group's table is the sequence's state slot.
                    if self.kv_groups[g].kind == GroupKind::Recurrent {
                        continue;
                    }
                    let table = s.block_tables[g];
                    let b = (p as usize) / bs;
                    let Some(&blk) = table.get(b) else {
                        // A table too short for the position leaves the slot unset.
                        slot.push(u32::MAX);
                        continue;
                    };
                    slot.push(blk.wrapping_mul(bs as u32).wrapping_add(p % bs as u32));
                }
            }
        }
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let attn_seqs: Vec<Vec<AttnSeq<'_>>> = (0..n_groups)
            .map(|g| {
                batch
                    .seqs
                    .iter()
                    .zip(&starts)
                    .map(|(s, &q_start)| AttnSeq {
                        q_start,
                        positions: &positions[q_start..q_start + s.tokens.len()],
                        block_table: s.block_tables[g],
                    })
                    .collect()
            })
            .collect();

        // The rows whose logits are wanted (per sequence all its tokens or its last), in
        // order. After the last layer's keys and values are written, only these rows go
        // on: on a row-invariant device (`Device::row_invariant`) every op gives a row
        // the same bits whatever else is in the batch, so their logits are unchanged and
        // a prompt skips the last layer's attention and MLP for all but one row. On
        // another device they go on after the last layer's attention, where llama.cpp's
        // `inp_out_ids` leaves the other rows out.
        let wanted: Vec<std::ops::Range<usize>> = batch
            .seqs
            .iter()
            .zip(&starts)
            .map(|(s, &st)| {
                if s.all_logits {
                    st..st + s.tokens.len()
                } else {
                    st + s.tokens.len().saturating_sub(1)..st + s.tokens.len()
                }
            })
            .collect();
        let n_out: usize = wanted.iter().map(|r| r.len()).sum();
        let out_positions: Vec<u32> = wanted
            .iter()
            .flat_map(|r| positions[r.clone()].iter().copied())
            .collect();
        let out_attn_seqs: Vec<Vec<AttnSeq<'_>>> = (0..n_groups)
            .map(|g| {
                let mut q_start = 0;
                batch
                    .seqs
                    .iter()
                    .zip(&wanted)
                    .map(|(s, r)| {
                        let seq = AttnSeq {
                            q_start,
                            positions: &out_positions[q_start..q_start + r.len()],
                            block_table: s.block_tables[g],
                        };
                        q_start += r.len();
                        seq
                    })
                    .collect()
            })
            .collect();

        let mut x = vec![0.0f32; n * d];
        timed!("embed", dev.get_rows(&*self.token_embd, &tokens, &mut x))?;
        if spec.embed_scale != 1.0 {
            timed!("scale", dev.scale(&mut x, spec.embed_scale))?;
        }
        let per_layer_inputs = match &self.per_layer {
            Some(pl) => Some(self.per_layer_inputs(pl, &tokens, &x)?),
            None => None,
        };
        // The rows each layer computes: all of them, then (last layer) the wanted ones.
        let all_rows: Vec<usize> = (0..n).collect();
        let out_rows: Vec<usize> = wanted.iter().flat_map(|r| r.clone()).collect();
        let mut a = vec![0.0f32; n * d];
        timed!(
            "rms_norm",
            dev.rms_norm(&x, Some(&self.layers[0].attn_norm), spec.rms_eps, d, &mut a)
        )?;

        let mut tmp = vec![0.0f32; n * d];
        let mut f = vec![0.0f32; n * d];
        // Buffers reused by every layer: fresh multi-MiB vectors per op cost a prompt
        // batch page faults and zeroing (about 5% of a Gemma prefill).
        let mut bufs = StepBufs {
            q: vec![0.0f32; n * h * dk_max],
            k: vec![0.0f32; n * hkv * dk_max],
            v: vec![0.0f32; n * hkv * dv_max],
            o: vec![0.0f32; n * h * dv_max],
            q_gate: Vec::new(),
            norm_src: vec![0.0f32; (n * h * dk_max).max(n * hkv * dk_max).max(n * d)],
            mlp: MlpBufs::default(),
            delta: DeltaBufs::default(),
        };
        // A device whose results follow each call's size computes the last layer's
        // attention over every row, as llama.cpp's graph does, and leaves the other
        // rows out after it (`Device::row_invariant`).
        let shrink_attention = dev.row_invariant();
        for (il, layer) in self.layers.iter().enumerate() {
            let g = self.layer_group(il);
            let last = il + 1 == self.layers.len() && n_out < n;
            // The last layer goes on with the wanted rows only (see `wanted`).
            let (rows, row_ids) = if last {
                (n_out, &out_rows)
            } else {
                (n, &all_rows)
            };
            match &layer.mixer {
                DevMixer::Attention(at) => {
                    // The last layer's attention for the wanted rows only, or over
                    // every row with the others left out after it.
                    let shrink = last && shrink_attention;
                    let (seqs, out_rows) = if shrink {
                        (&out_attn_seqs[g], rows)
                    } else {
                        (&attn_seqs[g], n)
                    };
                    self.attention(
                        il,
                        at,
                        kv,
                        &slots[g],
                        &positions,
                        seqs,
                        shrink.then_some(&wanted[..]),
                        &a[..n * d],
                        &mut x,
                        &mut tmp[..out_rows * d],
                        &mut bufs,
                    )?;
                    if last && !shrink {
                        keep_rows(&wanted, d, &mut tmp, &mut x);
                    }
                }
                DevMixer::DeltaNet(dn) => {
                    let seqs: Vec<(usize, usize, bool, u32)> = batch
                        .seqs
                        .iter()
                        .zip(&starts)
                        .map(|(s, &st)| {
                            let slot = s.block_tables[g].first().copied().unwrap_or(u32::MAX);
                            (st, s.tokens.len(), s.start_pos == 0, slot)
                        })
                        .collect();
                    self.delta_net(
                        il,
                        dn,
                        &seqs,
                        &a[..n * d],
                        states,
                        &mut tmp[..n * d],
                        &mut bufs.delta,
                    )?;
                    if last {
                        keep_rows(&wanted, d, &mut tmp, &mut x);
                    }
                }
            }
            let (tmp, f, a, x) = (
                &mut tmp[..rows * d],
                &mut f[..rows * d],
                &mut a[..rows * d],
                &mut x[..rows * d],
            );
            let mlp_bufs = &mut bufs.mlp;
            let norm_src = &mut bufs.norm_src;
            if let Some(w) = &layer.post_attn_norm {
                self.norm_in_place(tmp, Some(w), d, norm_src)?;
            }
            timed!(
                "add_rms_norm",
                dev.add_rms_norm(x, tmp, &layer.ffn_norm, spec.rms_eps, d, f)
            )?;
            self.ffn(layer, f, x, rows, tmp, mlp_bufs)?;
            if let Some(w) = &layer.post_ffn_norm {
                self.norm_in_place(tmp, Some(w), d, norm_src)?;
            }
            let next_norm = match self.layers.get(il + 1) {
                Some(next) => &next.attn_norm,
                None => &self.output_norm,
            };
            if layer.per_layer.is_none() && layer.out_scale.is_none() {
                timed!(
                    "add_rms_norm",
                    dev.add_rms_norm(x, tmp, next_norm, spec.rms_eps, d, a)
                )?;
                continue;
            }
            timed!("add", dev.add(x, tmp))?;
            if let (Some(li), Some(inputs)) = (&layer.per_layer, &per_layer_inputs) {
                self.layer_input(li, il, inputs, row_ids, x, tmp, mlp_bufs)?;
                timed!("add", dev.add(x, tmp))?;
            }
            if let Some(s) = layer.out_scale {
                timed!("scale", dev.scale(x, s))?;
            }
            timed!(
                "rms_norm",
                dev.rms_norm(x, Some(next_norm), spec.rms_eps, d, a)
            )?;
        }
        // `a` now holds rmsnorm(x) * output_norm of the wanted rows, in order (the last
        // layer kept only those).
        let rows = &a[..n_out * d];
        let mut logits = vec![0.0f32; n_out * spec.vocab];
        timed!(
            "output",
            dev.matmul(&*self.output, rows, n_out, &mut logits)
        )?;
        soft_cap(&mut logits, spec.logit_softcap);
        Ok(logits)
    }

    /// Layer `il`'s attention on the normed rows `a` (every token of the step): its keys
    /// and values written through `slots`, the attention of the rows `seqs` describes
    /// (all of them, or on the last layer the `wanted` ones, whose queries and residuals
    /// in `x` move to the front, in order), through `attn_output` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        il: usize,
        at: &DevAttn,
        kv: &mut [Box<dyn KvBuffer>],
        slots: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        wanted: Option<&[std::ops::Range<usize>]>,
        a: &[f32],
        x: &mut [f32],
        out: &mut [f32],
        bufs: &mut StepBufs,
    ) -> Result<(), ModelError> {
        let spec = &self.spec;
        let dev = &self.dev;
        let (d, h, n) = (spec.d, spec.n_heads, positions.len());
        let ld = &spec.layers[il];
        // This layer's KV heads and head sizes (mimo2's KV heads and gemma4's head
        // sizes differ per layer; the buffers hold the largest).
        let (hkv_l, dk, dv) = (ld.n_kv_heads, ld.head_dim_k, ld.head_dim_v);
        let own_kv = ld.kv_source.is_none();
        let StepBufs {
            q,
            k,
            v,
            o,
            q_gate,
            norm_src,
            ..
        } = bufs;
        let q = &mut q[..n * h * dk];
        let (k, v) = (&mut k[..n * hkv_l * dk], &mut v[..n * hkv_l * dv]);
        // Qwen 3.5's gated attention: the query projection gives per head `dk` query
        // values then `dk` gate values; the gate's sigmoid multiplies the attention
        // output (llama.cpp's `ggml_sigmoid` then `ggml_mul`).
        let mut qg = if ld.attn_gate {
            vec![0.0f32; n * 2 * h * dk]
        } else {
            Vec::new()
        };
        let q_out: &mut [f32] = if ld.attn_gate { &mut qg } else { &mut *q };
        if own_kv {
            timed!(
                "qkv",
                dev.matmul_multi(
                    &[&*at.wq, &*at.wk, &*at.wv],
                    a,
                    n,
                    &mut [&mut *q_out, &mut *k, &mut *v],
                )
            )?;
        } else {
            // gemma4's shared-KV layers: queries only.
            timed!("qkv", dev.matmul(&*at.wq, a, n, q_out))?;
        }
        if ld.attn_gate {
            let gate = grown(q_gate, n * h * dk);
            for ((src, qd), gd) in qg
                .chunks_exact(2 * dk)
                .zip(q.chunks_exact_mut(dk))
                .zip(gate.chunks_exact_mut(dk))
            {
                qd.copy_from_slice(&src[..dk]);
                for (g, &s) in gd.iter_mut().zip(&src[dk..]) {
                    *g = sigmoid_ggml(s);
                }
            }
        }
        for (t, b) in [(&mut q[..], &at.bq), (&mut *k, &at.bk), (&mut *v, &at.bv)] {
            if t.is_empty() {
                continue;
            }
            if let Some(b) = b {
                timed!("add_bias", dev.add_bias(t, b))?;
            }
        }
        if let Some(w) = &at.q_norm {
            self.norm_in_place(q, Some(w), dk, norm_src)?;
        }
        if own_kv {
            if let Some(w) = &at.k_norm {
                self.norm_in_place(k, Some(w), dk, norm_src)?;
            }
            if spec.v_norm {
                self.norm_in_place(v, None, dv, norm_src)?;
            }
        }
        let rope = layer_rope(spec, il, self.rope_freqs.as_deref());
        let rp = |n_heads| RopeParams {
            n_heads,
            head_dim: dk,
            kind: rope.kind,
            n_rot: rope.n_rot,
            base: rope.base,
            freq_scale: rope.freq_scale,
            freq_factors: rope.freq_factors,
            yarn: rope.yarn,
        };
        timed!("rope", dev.rope(q, positions, &rp(h)))?;
        if own_kv {
            timed!("rope", dev.rope(k, positions, &rp(hkv_l)))?;
            timed!("write_kv", dev.write_kv(&mut *kv[il], k, v, slots))?;
        }
        // A pre-scaled query (Gemma 3 in llama.cpp: `ggml_scale` on the rotated
        // queries, attention scale 1): the f16 rounding of the queries in its
        // small-batch attention sees the scaled values, so the order matters to the
        // bit.
        let attn_scale = if spec.q_prescaled {
            timed!("scale", dev.scale(q, spec.attn_scale))?;
            1.0
        } else {
            spec.attn_scale
        };
        let mut rows = n;
        if let Some(wanted) = wanted {
            let qw = h * dk;
            let mut to = 0;
            for r in wanted {
                for from in r.clone() {
                    q.copy_within(from * qw..(from + 1) * qw, to * qw);
                    x.copy_within(from * d..(from + 1) * d, to * d);
                    if ld.attn_gate {
                        q_gate.copy_within(from * qw..(from + 1) * qw, to * qw);
                    }
                    to += 1;
                }
            }
            rows = to;
        }
        let o = &mut o[..rows * h * dv];
        let pa = PagedAttention {
            q: &q[..rows * h * dk],
            seqs,
            n_heads: h,
            scale: attn_scale,
            sinks: at.sinks.as_deref(),
            window: spec.layer_window(il),
        };
        timed!(
            "attention",
            dev.paged_attention(&*kv[spec.kv_layer(il)], &pa, o)
        )?;
        if ld.attn_gate {
            for (v, &g) in o.iter_mut().zip(&q_gate[..rows * h * dk]) {
                *v *= g;
            }
        }
        timed!("attn_out", dev.matmul(&*at.wo, o, rows, out))?;
        if let Some(b) = &at.bo {
            timed!("add_bias", dev.add_bias(out, b))?;
        }
        // mimo2's value scale, on the attention output after `attn_output`.
        if spec.value_scale != 1.0 {
            timed!("scale", dev.scale(out, spec.value_scale))?;
        }
        Ok(())
    }

    /// Layer `il`'s Gated DeltaNet on the normed rows `a` of the step into `out`, as
    /// llama.cpp's `qwen35moe` graph computes it (`build_layer_attn_linear`; the math is
    /// `flint_core::math::delta`'s): the projections of every row at once, then per
    /// sequence (`seqs`: first row, row count, whether it starts at position 0, state
    /// slot) the causal convolution with SiLU and the gated delta rule over its state,
    /// then the per-head RMSNorm times `silu(z)` and `ssm_out`.
    fn delta_net(
        &self,
        il: usize,
        dn: &DevDeltaNet,
        seqs: &[(usize, usize, bool, u32)],
        a: &[f32],
        states: &mut RecurrentStates,
        out: &mut [f32],
        bufs: &mut DeltaBufs,
    ) -> Result<(), ModelError> {
        let spec = &self.spec;
        let dev = &self.dev;
        let Some(desc) = spec.delta_net else {
            return Err(ModelError::new(format!(
                "layer {il} is a Gated DeltaNet layer in a model without DeltaNet sizes"
            )));
        };
        let (shape, eps) = (desc.shape, spec.rms_eps);
        let n = a.len() / spec.d;
        let (cd, qk, vl, hv) = (
            desc.conv_dim(),
            shape.qk_len(),
            shape.v_len(),
            shape.heads_v,
        );
        let DeltaBufs {
            qkv,
            z,
            beta,
            alpha,
            conv,
            q,
            k,
            v,
            o,
            normed,
        } = bufs;
        let (qkv, z, beta, alpha) = (
            grown(qkv, n * cd),
            grown(z, n * vl),
            grown(beta, n * hv),
            grown(alpha, n * hv),
        );
        timed!(
            "delta_in",
            dev.matmul_multi(
                &[&*dn.qkv, &*dn.gate, &*dn.beta, &*dn.alpha],
                a,
                n,
                &mut [&mut *qkv, &mut *z, &mut *beta, &mut *alpha],
            )
        )?;
        for b in beta.iter_mut() {
            *b = sigmoid_ggml(*b);
        }
        // The log decay of each row and head, in `alpha`'s place.
        for row in alpha.chunks_exact_mut(hv) {
            for ((al, &dt), &sa) in row.iter_mut().zip(&dn.dt_bias).zip(&dn.a) {
                *al = delta_net_gate(*al, dt, sa);
            }
        }
        let (conv, q, k, v, o) = (
            grown(conv, n * cd),
            grown(q, n * qk),
            grown(k, n * qk),
            grown(v, n * vl),
            grown(o, n * vl),
        );
        for &(r0, len, fresh, slot) in seqs {
            if len == 0 {
                continue;
            }
            let (conv_state, delta_state) = states.slot_mut(il, slot)?;
            if fresh {
                conv_state.fill(0.0);
                delta_state.fill(0.0);
            }
            let rows = r0..r0 + len;
            let c = &mut conv[rows.start * cd..rows.end * cd];
            timed!(
                "ssm_conv",
                dev.ssm_conv_silu(
                    &qkv[rows.start * cd..rows.end * cd],
                    &dn.conv,
                    desc.conv_kernel,
                    conv_state,
                    c,
                )
            )?;
            // Each row's q, k and v apart, the heads of q and k L2-normed.
            for (t, row) in rows.clone().zip(c.chunks_exact(cd)) {
                q[t * qk..(t + 1) * qk].copy_from_slice(&row[..qk]);
                k[t * qk..(t + 1) * qk].copy_from_slice(&row[qk..2 * qk]);
                v[t * vl..(t + 1) * vl].copy_from_slice(&row[2 * qk..]);
            }
            let (qs, ks) = (
                &mut q[rows.start * qk..rows.end * qk],
                &mut k[rows.start * qk..rows.end * qk],
            );
            l2_norm_heads(qs, shape.head_dim, eps);
            l2_norm_heads(ks, shape.head_dim, eps);
            timed!(
                "delta_rule",
                dev.gated_delta_net(
                    &shape,
                    qs,
                    ks,
                    &v[rows.start * vl..rows.end * vl],
                    &alpha[rows.start * hv..rows.end * hv],
                    &beta[rows.start * hv..rows.end * hv],
                    delta_state,
                    &mut o[rows.start * vl..rows.end * vl],
                )
            )?;
        }
        // Per head: RMSNorm with `ssm_norm`, times `silu(z)`.
        let normed = grown(normed, n * vl);
        timed!(
            "rms_norm",
            dev.rms_norm(o, Some(&dn.norm), eps, shape.head_dim, normed)
        )?;
        timed!("silu_mul", dev.silu_mul(z, normed, o))?;
        timed!("delta_out", dev.matmul(&*dn.out, o, n, out))?;
        Ok(())
    }

    /// `buf = rms_norm(buf) * w` (no weight when `w` is None) in chunks of `dim` (the
    /// device op reads one buffer and writes another: `buf` is copied to `scratch`
    /// first, grown when needed).
    fn norm_in_place(
        &self,
        buf: &mut [f32],
        w: Option<&[f32]>,
        dim: usize,
        scratch: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let src = grown(scratch, buf.len());
        src.copy_from_slice(buf);
        timed!(
            "rms_norm",
            self.dev.rms_norm(src, w, self.spec.rms_eps, dim, buf)
        )?;
        Ok(())
    }

    /// Gemma 4's per-layer inputs of every token, `[n][L][P]`, as llama.cpp's
    /// `build_inp_per_layer` and `project_per_layer_inputs` compute them from the tokens
    /// and their scaled embeddings `x`.
    fn per_layer_inputs(
        &self,
        pl: &DevPerLayerInputs,
        tokens: &[u32],
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let dev = &self.dev;
        let spec = &self.spec;
        let (p, n) = (spec.per_layer_input, tokens.len());
        let width = p * spec.n_layers();
        let mut emb = vec![0.0f32; n * width];
        timed!("embed", dev.get_rows(&*pl.token_embd, tokens, &mut emb))?;
        timed!("scale", dev.scale(&mut emb, (p as f32).sqrt()))?;
        let mut proj = vec![0.0f32; n * width];
        timed!(
            "per_layer_proj",
            dev.matmul(&*pl.model_proj, x, n, &mut proj)
        )?;
        timed!("scale", dev.scale(&mut proj, 1.0 / (spec.d as f32).sqrt()))?;
        let mut out = vec![0.0f32; n * width];
        timed!(
            "rms_norm",
            dev.rms_norm(&proj, Some(&pl.proj_norm), spec.rms_eps, p, &mut out)
        )?;
        timed!("add", dev.add(&mut out, &emb))?;
        timed!("scale", dev.scale(&mut out, 1.0 / 2f32.sqrt()))?;
        Ok(out)
    }

    /// Gemma 4's per-layer input of layer `il` for the rows `row_ids` of the step:
    /// `out = post_norm(proj(gelu(inp_gate x) * input))`, `x` those rows' residuals.
    #[allow(clippy::too_many_arguments)]
    fn layer_input(
        &self,
        li: &DevLayerInput,
        il: usize,
        inputs: &[f32],
        row_ids: &[usize],
        x: &[f32],
        out: &mut [f32],
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &self.dev;
        let spec = &self.spec;
        let (p, rows) = (spec.per_layer_input, row_ids.len());
        let width = p * spec.n_layers();
        let [gate, input, hidden, _] = bufs.take(rows * p, 0);
        for (dst, &r) in input.chunks_exact_mut(p).zip(row_ids) {
            dst.copy_from_slice(&inputs[r * width + il * p..r * width + (il + 1) * p]);
        }
        timed!("per_layer_gate", dev.matmul(&*li.inp_gate, x, rows, gate))?;
        timed!("gelu_mul", dev.gelu_mul(gate, input, hidden))?;
        timed!("per_layer_proj", dev.matmul(&*li.proj, hidden, rows, out))?;
        self.norm_in_place(out, Some(&li.post_norm), spec.d, &mut bufs.moe.scratch)?;
        Ok(())
    }

    fn mlp(
        &self,
        mlp: &DevMlp,
        f: &[f32],
        n: usize,
        out: &mut [f32],
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &self.dev;
        let [g, u, hdn, _] = bufs.take(n * mlp.width, 0);
        timed!(
            "gate_up",
            dev.matmul_multi(&[&*mlp.gate, &*mlp.up], f, n, &mut [g, u])
        )?;
        self.activation(g, u, hdn)?;
        timed!("ffn_down", dev.matmul(&*mlp.down, hdn, n, out))?;
        Ok(())
    }

    /// `hidden = act(gate, up)` with the model's activation.
    fn activation(&self, g: &[f32], u: &[f32], hdn: &mut [f32]) -> Result<(), ModelError> {
        let dev = &self.dev;
        match self.spec.activation {
            Activation::Silu => timed!("silu_mul", dev.silu_mul(g, u, hdn))?,
            Activation::GeluTanh => timed!("gelu_mul", dev.gelu_mul(g, u, hdn))?,
            Activation::SwigluOai => timed!("swiglu_oai_mul", dev.swiglu_oai_mul(g, u, hdn))?,
        }
        Ok(())
    }

    /// The FFN of `layer` on the pre-FFN norm's output `f` of `n` rows; `resid` is the
    /// residual stream it came from (Gemma 4's router and expert branch read it).
    fn ffn(
        &self,
        layer: &DevLayer,
        f: &[f32],
        resid: &[f32],
        n: usize,
        out: &mut [f32],
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &self.dev;
        let d = self.spec.d;
        match &layer.ffn {
            DevFfn::Dense(m) => self.mlp(m, f, n, out, bufs),
            DevFfn::Moe {
                router,
                bias,
                router_bias,
                experts,
                expert_biases,
                shared,
                router_norm,
                expert_scale,
                parallel,
                shared_gate,
            } => {
                let Some(ms) = self.spec.moe else {
                    return Err(ModelError::new("MoE layer in a model without MoE settings"));
                };
                let e = ms.experts;
                let k = ms.used;
                let eps = self.spec.rms_eps;
                // The routing buffers leave `bufs` for the layer (the towers and the
                // shared expert take its other buffers meanwhile) and go back after.
                let mut mb = std::mem::take(&mut bufs.moe);
                let MoeBufs {
                    expert_in,
                    router_in,
                    logits,
                    ids,
                    weights,
                    branch_out,
                    scratch,
                } = &mut mb;
                // Gemma 4: the experts read `pre_ffw_norm_2` of the residual stream, the
                // router its weightless norm times `scale / sqrt(d)`.
                let f_exp = match parallel {
                    Some(p) => {
                        let b = grown(expert_in, n * d);
                        timed!(
                            "rms_norm",
                            dev.rms_norm(resid, Some(&p.pre_norm_2), eps, d, b)
                        )?;
                        &*b
                    }
                    None => f,
                };
                let logits = grown(logits, n * e);
                match router_norm {
                    Some(w) => {
                        let r = grown(router_in, n * d);
                        timed!("rms_norm", dev.rms_norm(resid, Some(w), eps, d, r))?;
                        timed!("router", dev.matmul(&**router, r, n, logits))?;
                    }
                    None => timed!("router", dev.matmul(&**router, f_exp, n, logits))?,
                }
                if let Some(rb) = router_bias {
                    timed!("router_bias", dev.add_bias(logits, rb))?;
                }
                let ids = grown(ids, n * k);
                let weights = grown(weights, n * k);
                let cfg = RoutingConfig {
                    k,
                    gating: ms.gating,
                    normalize: ms.normalize,
                    scale: ms.scale,
                };
                timed!(
                    "route",
                    dev.route_topk(logits, e, bias.as_deref(), &cfg, ids, weights)
                )?;
                // Gemma 4's per-expert output scale, folded into the routing weights.
                if let Some(s) = expert_scale {
                    for (w, &ex) in weights.iter_mut().zip(ids.iter()) {
                        *w *= s[ex as usize];
                    }
                }
                let rows: Vec<ExpertRow> = ids
                    .iter()
                    .enumerate()
                    .map(|(r, &ex)| ExpertRow {
                        input_row: (r / k) as u32,
                        expert: ex,
                    })
                    .collect();
                let w = experts.width;
                let [g, u, hdn, y] = bufs.take(n * k * w, n * k * d);
                timed!(
                    "expert_gate_up",
                    dev.expert_matmul_multi(
                        &[&*experts.gate, &*experts.up],
                        f_exp,
                        &rows,
                        &mut [g, u]
                    )
                )?;
                // Each chosen expert's biases, gathered into one matrix of its rows.
                let gather = |table: &[f32], width: usize| -> Vec<f32> {
                    let mut m = Vec::with_capacity(rows.len() * width);
                    for r in &rows {
                        let e = r.expert as usize;
                        m.extend_from_slice(&table[e * width..(e + 1) * width]);
                    }
                    m
                };
                if let Some(b) = expert_biases {
                    timed!("expert_bias", dev.add(g, &gather(&b.gate, w)))?;
                    timed!("expert_bias", dev.add(u, &gather(&b.up, w)))?;
                }
                self.activation(g, u, hdn)?;
                let down_rows: Vec<ExpertRow> = rows
                    .iter()
                    .enumerate()
                    .map(|(r, row)| ExpertRow {
                        input_row: r as u32,
                        expert: row.expert,
                    })
                    .collect();
                timed!(
                    "expert_down",
                    dev.expert_matmul(&*experts.down, hdn, &down_rows, y)
                )?;
                if let Some(b) = expert_biases {
                    timed!("expert_bias", dev.add(y, &gather(&b.down, d)))?;
                }
                out.fill(0.0);
                let token_rows: Vec<u32> = rows.iter().map(|r| r.input_row).collect();
                timed!(
                    "scatter",
                    dev.scatter_add_weighted(out, y, &token_rows, weights, d)
                )?;
                if let Some(s) = shared {
                    let ys = grown(branch_out, n * d);
                    self.mlp(s, f, n, ys, bufs)?;
                    // Qwen 3.5: the shared expert's output times `sigmoid(gate . f)`.
                    if let Some(gw) = shared_gate {
                        let mut gl = vec![0.0f32; n];
                        timed!("shared_gate", dev.matmul(&**gw, f, n, &mut gl))?;
                        for (row, &g) in ys.chunks_exact_mut(d).zip(&gl) {
                            let g = sigmoid_ggml(g);
                            for v in row {
                                *v *= g;
                            }
                        }
                    }
                    timed!("add", dev.add(out, ys))?;
                }
                if let Some(p) = parallel {
                    // Both branches' post-norms, then dense + experts.
                    self.norm_in_place(out, Some(&p.post_norm_2), d, scratch)?;
                    let yd = grown(branch_out, n * d);
                    self.mlp(&p.mlp, f, n, yd, bufs)?;
                    self.norm_in_place(yd, Some(&p.post_norm_1), d, scratch)?;
                    timed!("add", dev.add(yd, out))?;
                    out.copy_from_slice(yd);
                }
                bufs.moe = mb;
                Ok(())
            }
        }
    }
}

/// One sequence on a device with a trivial block table (block `i` holds positions
/// `i * block_size ..`), for the CLI and the gates.
#[derive(Debug)]
pub struct Session<'m> {
    model: &'m DeviceModel,
    kv: Vec<Box<dyn KvBuffer>>,
    states: RecurrentStates,
    table: Vec<u32>,
    block_size: usize,
    pos: usize,
    max_len: usize,
}

impl<'m> Session<'m> {
    /// Block size of the session's KV.
    pub const BLOCK_SIZE: usize = 16;

    /// A session able to hold `max_len` tokens (capped at the context length).
    pub fn new(model: &'m DeviceModel, max_len: usize) -> Result<Self, ModelError> {
        let max_len = max_len.clamp(1, model.spec.context_length);
        let bs = Self::BLOCK_SIZE;
        let nb = max_len.div_ceil(bs);
        let kv = model.alloc_kv(nb, bs)?;
        Ok(Self {
            model,
            kv,
            // One sequence: state slot 0, the first entry of its table in every group.
            states: RecurrentStates::new(&model.spec, 1),
            table: (0..nb as u32).collect(),
            block_size: bs,
            pos: 0,
            max_len,
        })
    }

    /// Tokens fed so far.
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// Forgets the sequence (the KV is overwritten by the next tokens).
    pub fn clear(&mut self) {
        self.pos = 0;
    }

    /// Feeds `tokens` in one step; returns the logits of the last token, or of every
    /// token when `all_logits` (`rows x vocab`).
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        if self.pos + tokens.len() > self.max_len {
            return Err(ModelError::new(format!(
                "the sequence would reach {} tokens, beyond this session's {} (context length {})",
                self.pos + tokens.len(),
                self.max_len,
                self.model.spec.context_length
            )));
        }
        let batch = Batch {
            seqs: vec![BatchSeq {
                tokens,
                start_pos: self.pos as u32,
                block_tables: vec![self.table.as_slice(); self.model.kv_groups.len()],
                all_logits,
            }],
            block_size: self.block_size,
        };
        let logits = self.model.forward(&mut self.kv, &mut self.states, &batch)?;
        self.pos += tokens.len();
        Ok(logits)
    }
}

/// Moves the `wanted` rows (of width `d`) of a layer's output `out` and of the residual
/// stream `x` to the front, in order: the rows the last layer goes on with.
fn keep_rows(wanted: &[std::ops::Range<usize>], d: usize, out: &mut [f32], x: &mut [f32]) {
    let mut to = 0;
    for r in wanted {
        for from in r.clone() {
            out.copy_within(from * d..(from + 1) * d, to * d);
            x.copy_within(from * d..(from + 1) * d, to * d);
            to += 1;
        }
    }
}
