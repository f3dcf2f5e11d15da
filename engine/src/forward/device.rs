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

use flint_hal::{
    AttnSeq, Device, DeviceRef, Glu, HalError, IndexTensor, IndexView, IndexViewMut, KvBuffer,
    KvLayout, Op, PagedAttention, RopeParams, RoutingConfig, Tensor, View, ViewMut, WeightDesc,
    WeightHandle, WeightKind,
};

use crate::forward::profile::timed;
use crate::kv::{groups_from_layers, GroupKind, KvGroupSpec, LayerCache};
use crate::model::{
    layer_rope, soft_cap, Activation, DeltaNetDesc, Ffn, Mixer, Mlp, Model, ModelDesc, ModelError,
    TensorRef,
};

/// Gemma 4's dense MLP beside the experts, staged, with both branches' norms.
#[derive(Debug)]
struct DevParallel {
    mlp: DevMlp,
    post_norm_1: Tensor,
    pre_norm_2: Tensor,
    post_norm_2: Tensor,
}

/// Gemma 4's per-layer token embeddings, the model's part, staged.
#[derive(Debug)]
struct DevPerLayerInputs {
    token_embd: WeightHandle,
    model_proj: WeightHandle,
    proj_norm: Tensor,
}

/// Gemma 4's per-layer input, a layer's part, staged.
#[derive(Debug)]
struct DevLayerInput {
    inp_gate: WeightHandle,
    proj: WeightHandle,
    post_norm: Tensor,
}

/// The gate, up and hidden activations of an MLP or of the routed experts, and the
/// experts' outputs, kept across the layers of a step.
#[derive(Debug, Default)]
struct MlpBufs {
    gate: Buf,
    up: Buf,
    hidden: Buf,
    expert_out: Buf,
    /// The routing and branch buffers of an MoE layer, and a per-layer input's.
    moe: MoeBufs,
}

/// The buffers of an MoE layer besides its towers' activations (router input and
/// logits, the chosen experts and weights, the shared and parallel dense branches'
/// outputs, a norm scratch), and of Gemma 4's per-layer input; kept across the layers
/// of a step, grown when needed.
#[derive(Debug, Default)]
struct MoeBufs {
    expert_in: Buf,
    router_in: Buf,
    logits: Buf,
    /// The chosen experts (`route_topk` writes them, the expert ops read them: they stay
    /// on the device).
    ids: IdxBuf,
    weights: Buf,
    branch_out: Buf,
    /// Qwen 3.5's shared-expert gate, one value per row.
    shared_gate_out: Buf,
    scratch: Buf,
    /// Zeros, for clearing a device buffer (see [`zero`]).
    zeros: Buf,
}

/// A device tensor kept across the layers of a step, grown when a layer needs more.
#[derive(Debug, Default)]
struct Buf(Option<Tensor>);

impl Buf {
    /// A buffer of `len` values from the device.
    fn new(dev: &dyn Device, len: usize) -> Result<Self, HalError> {
        Ok(Self(Some(dev.alloc(len)?)))
    }

    /// Its first `len` values, the tensor grown first when shorter (host memory keeps
    /// its values; a device buffer is replaced by a zeroed one).
    fn get(&mut self, dev: &dyn Device, len: usize) -> Result<ViewMut<'_>, HalError> {
        if self.0.as_ref().is_none_or(|t| t.len() < len) {
            match &mut self.0 {
                Some(Tensor::Host(v)) => v.resize(len, 0.0),
                t => *t = Some(dev.alloc(len)?),
            }
        }
        Ok(self.tensor().slice_mut(0..len))
    }

    /// Its first `len` values, to read (allocated before by [`Buf::new`] or
    /// [`Buf::get`]).
    fn view(&self, len: usize) -> View<'_> {
        self.0
            .as_ref()
            .expect("a step buffer read before it was allocated")
            .slice(0..len)
    }

    /// The tensor (allocated by [`Buf::new`] or [`Buf::get`]).
    fn tensor(&mut self) -> &mut Tensor {
        self.0
            .as_mut()
            .expect("a step buffer used before it was allocated")
    }
}

/// A device index tensor kept across the layers of a step (the chosen experts), grown
/// when a layer needs more.
#[derive(Debug, Default)]
struct IdxBuf(Option<IndexTensor>);

impl IdxBuf {
    /// Its first `len` indices, to write, the tensor grown first when shorter.
    fn get(&mut self, dev: &dyn Device, len: usize) -> Result<IndexViewMut<'_>, HalError> {
        if self.0.as_ref().is_none_or(|t| t.len() < len) {
            match &mut self.0 {
                Some(IndexTensor::Host(v)) => v.resize(len, 0),
                t => *t = Some(dev.alloc_indices(len)?),
            }
        }
        Ok(self
            .0
            .as_mut()
            .expect("allocated just above")
            .slice_mut(0..len))
    }

    /// Its first `len` indices, to read (written before through [`IdxBuf::get`]).
    fn view(&self, len: usize) -> IndexView<'_> {
        self.0
            .as_ref()
            .expect("an index buffer read before it was written")
            .slice(0..len)
    }
}

impl MlpBufs {
    /// The gate, up and hidden buffers, `len` values each, and the expert output
    /// buffer, `out_len` values (grown when needed).
    fn take(
        &mut self,
        dev: &dyn Device,
        len: usize,
        out_len: usize,
    ) -> Result<[ViewMut<'_>; 4], HalError> {
        Ok([
            self.gate.get(dev, len)?,
            self.up.get(dev, len)?,
            self.hidden.get(dev, len)?,
            self.expert_out.get(dev, out_len)?,
        ])
    }
}

/// A step's buffers of the attention (and of every norm done in place), kept across
/// its layers.
#[derive(Debug)]
struct StepBufs {
    q: Buf,
    k: Buf,
    v: Buf,
    o: Buf,
    /// Qwen 3.5's query projection: per head the queries, then the gate's logits.
    q_full: Buf,
    /// Qwen 3.5's attention output gate, `sigmoid` of the query projection's gate half.
    q_gate: Buf,
    norm_src: Buf,
    mlp: MlpBufs,
    delta: DeltaBufs,
}

/// A step's buffers of the Gated DeltaNet layers, kept across its layers (every one is
/// written whole before it is read).
#[derive(Debug, Default)]
struct DeltaBufs {
    qkv: Buf,
    z: Buf,
    beta: Buf,
    alpha: Buf,
    conv: Buf,
    q: Buf,
    k: Buf,
    v: Buf,
    o: Buf,
    normed: Buf,
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
        bias: Option<Tensor>,
        router_bias: Option<Tensor>,
        experts: DevMlp,
        /// gpt-oss's expert biases, one row per expert (`add_id` adds each routed row
        /// its expert's).
        expert_biases: Option<DevExpertBiases>,
        shared: Option<DevMlp>,
        /// Gemma 4's router input weight: `ffn_gate_inp.scale / sqrt(d)` (one product
        /// per element where llama.cpp scales, then multiplies: within an ulp).
        router_norm: Option<Tensor>,
        /// Gemma 4's per-expert output scale (`route_topk` folds it into the weights).
        expert_scale: Option<Tensor>,
        parallel: Option<DevParallel>,
        /// Qwen 3.5's shared-expert gate `ffn_gate_inp_shexp` (one output row).
        shared_gate: Option<WeightHandle>,
    },
}

/// [`ExpertBiases`](crate::model::ExpertBiases) as device tensors.
#[derive(Debug)]
struct DevExpertBiases {
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A layer's attention, staged.
#[derive(Debug)]
struct DevAttn {
    wq: WeightHandle,
    wk: WeightHandle,
    wv: WeightHandle,
    wo: WeightHandle,
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    bo: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    /// gpt-oss's and mimo2's per-head sink logits.
    sinks: Option<Tensor>,
}

/// A Gated DeltaNet layer, staged (the tensors of `model::DeltaNetLayer`).
#[derive(Debug)]
struct DevDeltaNet {
    qkv: WeightHandle,
    gate: WeightHandle,
    beta: WeightHandle,
    alpha: WeightHandle,
    out: WeightHandle,
    conv: Tensor,
    /// Per-head constants of the decay (`Device::delta_net_gate`).
    dt_bias: Tensor,
    a: Tensor,
    norm: Tensor,
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
    attn_norm: Tensor,
    mixer: DevMixer,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    ffn: DevFfn,
    post_ffn_norm: Option<Tensor>,
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
    /// Llama 3's `rope_freqs` factors (the layers that take them pass this tensor).
    rope_freqs: Option<Tensor>,
    output_norm: Tensor,
    /// Bytes of the norm weights and biases uploaded at staging.
    vector_bytes: u64,
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
/// position 0. Tensors of the model's device, one per Gated DeltaNet layer: the ops
/// update them where they are.
#[derive(Debug, Default)]
pub struct RecurrentStates {
    conv_len: usize,
    delta_len: usize,
    slots: usize,
    /// Per layer (`None` for attention layers): `slots` states one after another.
    layers: Vec<Option<Tensor>>,
    /// Zeros, for clearing a slot on the device's side (see [`zero`]).
    zeros: Buf,
}

impl RecurrentStates {
    /// Zeroed states of `slots` sequences for every Gated DeltaNet layer of `model` (none
    /// for a model without such layers), on its device.
    pub fn new(model: &DeviceModel, slots: usize) -> Result<Self, ModelError> {
        let spec = &model.spec;
        let Some(dn) = spec.delta_net else {
            return Ok(Self::default());
        };
        let (conv_len, delta_len) = Self::lens(&dn);
        let layers = spec
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::DeltaNet => model
                    .dev
                    .alloc(slots * (conv_len + delta_len))
                    .map(Some)
                    .map_err(|source| ModelError::Device {
                        context: format!(
                            "allocating the recurrent states of {slots} sequences on {}",
                            model.dev.name()
                        ),
                        source,
                    }),
                Mixer::Attention => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            conv_len,
            delta_len,
            slots,
            layers,
            zeros: Buf::default(),
        })
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

    /// The convolution window and the delta-rule state of `slot` in layer `il`, zeroed
    /// first when `fresh` (a sequence at its position 0).
    fn slot_mut(
        &mut self,
        dev: &dyn Device,
        il: usize,
        slot: u32,
        fresh: bool,
    ) -> Result<(ViewMut<'_>, ViewMut<'_>), ModelError> {
        let len = self.conv_len + self.delta_len;
        let slot = slot as usize;
        let (conv_len, slots) = (self.conv_len, self.slots);
        if slot >= slots {
            return Err(ModelError::new(format!(
                "state slot {slot} is outside the {slots} slots of layer {il}"
            )));
        }
        let layer = self
            .layers
            .get_mut(il)
            .and_then(Option::as_mut)
            .ok_or_else(|| ModelError::new(format!("layer {il} has no recurrent state")))?;
        let mut state = layer.slice_mut(slot * len..(slot + 1) * len);
        if fresh {
            zero(dev, state.reborrow(), &mut self.zeros)?;
        }
        Ok(state.split_at(conv_len))
    }
}

/// Bytes of the norm weights and biases that [`DeviceModel::stage`] uploads as device
/// tensors: the `other_bytes` it hands [`Device::plan`], so that a device placing weights
/// against its memory leaves room for them. [`DeviceModel::vector_bytes`] is what staging
/// uploaded; `tests/families.rs` checks that the two agree for every family.
pub fn vector_bytes(model: &Model) -> u64 {
    let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, Vec::len);
    let mut n = model.output_norm.len() + opt(&model.rope_freqs);
    if let Some(pl) = &model.per_layer {
        n += pl.proj_norm.len();
    }
    for l in &model.layers {
        n += l.attn_norm.len() + l.ffn_norm.len();
        n += opt(&l.post_attn_norm) + opt(&l.post_ffn_norm);
        if let Some(pl) = &l.per_layer {
            n += pl.post_norm.len();
        }
        n += match &l.delta_net {
            Some(dn) => dn.conv.len() + dn.norm.len() + dn.dt_bias.len() + dn.a.len(),
            None => [&l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm, &l.sinks]
                .into_iter()
                .map(opt)
                .sum(),
        };
        if let Ffn::Moe(moe) = &l.ffn {
            n += opt(&moe.bias) + opt(&moe.router_bias) + opt(&moe.router_scale);
            n += opt(&moe.expert_scale);
            if let Some(b) = &moe.expert_biases {
                n += b.gate.len() + b.up.len() + b.down.len();
            }
            if let Some(p) = &moe.parallel {
                n += p.post_norm_1.len() + p.pre_norm_2.len() + p.post_norm_2.len();
            }
        }
    }
    4 * n as u64
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
        let plan = dev
            .plan(&descs, vector_bytes(model))
            .map_err(|source| ModelError::Device {
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
        // The norms' weights and the biases: device tensors, uploaded once here.
        let vector_bytes = std::cell::Cell::new(0u64);
        let up = |v: &[f32]| -> Result<Tensor, ModelError> {
            vector_bytes.set(vector_bytes.get() + 4 * v.len() as u64);
            dev.upload_new(v).map_err(|source| ModelError::Device {
                context: format!("uploading a norm or bias vector to {}", dev.name()),
                source,
            })
        };
        let up_opt = |v: &Option<Vec<f32>>| v.as_deref().map(up).transpose();
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
                            post_norm_1: up(&p.post_norm_1)?,
                            pre_norm_2: up(&p.pre_norm_2)?,
                            post_norm_2: up(&p.post_norm_2)?,
                        }),
                        None => None,
                    };
                    let inv = 1.0 / (model.spec.d as f32).sqrt();
                    DevFfn::Moe {
                        router: st(&moe.router, WeightKind::Matrix)?,
                        bias: up_opt(&moe.bias)?,
                        router_bias: up_opt(&moe.router_bias)?,
                        experts,
                        expert_biases: match &moe.expert_biases {
                            Some(b) => Some(DevExpertBiases {
                                gate: up(&b.gate)?,
                                up: up(&b.up)?,
                                down: up(&b.down)?,
                            }),
                            None => None,
                        },
                        shared,
                        router_norm: match &moe.router_scale {
                            Some(s) => Some(up(&s.iter().map(|&w| inv * w).collect::<Vec<_>>())?),
                            None => None,
                        },
                        expert_scale: up_opt(&moe.expert_scale)?,
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
                    conv: up(&dn.conv)?,
                    dt_bias: up(&dn.dt_bias)?,
                    a: up(&dn.a)?,
                    norm: up(&dn.norm)?,
                }),
                None => DevMixer::Attention(DevAttn {
                    wq: st(&l.wq, WeightKind::Matrix)?,
                    wk: st(&l.wk, WeightKind::Matrix)?,
                    wv: st(&l.wv, WeightKind::Matrix)?,
                    wo: st(&l.wo, WeightKind::Matrix)?,
                    bq: up_opt(&l.bq)?,
                    bk: up_opt(&l.bk)?,
                    bv: up_opt(&l.bv)?,
                    bo: up_opt(&l.bo)?,
                    q_norm: up_opt(&l.q_norm)?,
                    k_norm: up_opt(&l.k_norm)?,
                    sinks: up_opt(&l.sinks)?,
                }),
            };
            layers.push(DevLayer {
                kv_group,
                attn_norm: up(&l.attn_norm)?,
                mixer,
                post_attn_norm: up_opt(&l.post_attn_norm)?,
                ffn_norm: up(&l.ffn_norm)?,
                ffn,
                post_ffn_norm: up_opt(&l.post_ffn_norm)?,
                per_layer: match &l.per_layer {
                    Some(pl) => Some(DevLayerInput {
                        inp_gate: st(&pl.inp_gate, WeightKind::Matrix)?,
                        proj: st(&pl.proj, WeightKind::Matrix)?,
                        post_norm: up(&pl.post_norm)?,
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
                proj_norm: up(&pl.proj_norm)?,
            }),
            None => None,
        };
        let output_norm = up(&model.output_norm)?;
        let rope_freqs = up_opt(&model.rope_freqs)?;
        let vector_bytes = vector_bytes.get();
        Ok(Self {
            vector_bytes,
            dev,
            spec: model.spec.clone(),
            token_embd,
            output,
            rope_freqs,
            output_norm,
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

    /// Bytes of the vectors (norm weights, biases) staged as device tensors besides the
    /// weights `Device::plan` saw.
    pub fn vector_bytes(&self) -> u64 {
        self.vector_bytes
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

        // The step's index lists cross to the device once, packed in one tensor: the
        // tokens, their positions, the wanted rows' positions, each group's slots, then
        // every sequence's block table of every group. Ops take views of it.
        let mut packed = Vec::with_capacity(
            3 * n
                + n_groups * n
                + batch
                    .seqs
                    .iter()
                    .flat_map(|s| s.block_tables.iter().map(|t| t.len()))
                    .sum::<usize>(),
        );
        packed.extend_from_slice(&tokens);
        packed.extend_from_slice(&positions);
        packed.extend_from_slice(&out_positions);
        let mut slot_at = Vec::with_capacity(n_groups);
        for s in &slots {
            slot_at.push(packed.len()..packed.len() + s.len());
            packed.extend_from_slice(s);
        }
        // `table_at[g][i]`: where sequence `i`'s block table of group `g` is.
        let mut table_at = vec![Vec::with_capacity(batch.seqs.len()); n_groups];
        for (g, at) in table_at.iter_mut().enumerate() {
            for s in &batch.seqs {
                at.push(packed.len()..packed.len() + s.block_tables[g].len());
                packed.extend_from_slice(s.block_tables[g]);
            }
        }
        let idx = dev.upload_indices(packed)?;
        let tokens_v = idx.slice(0..n);
        let positions_v = idx.slice(n..2 * n);
        let out_positions_v = idx.slice(2 * n..2 * n + n_out);
        let attn_seqs: Vec<Vec<AttnSeq<'_>>> = (0..n_groups)
            .map(|g| {
                batch
                    .seqs
                    .iter()
                    .zip(&starts)
                    .zip(&table_at[g])
                    .map(|((s, &q_start), table)| AttnSeq {
                        q_start,
                        positions: positions_v.slice(q_start..q_start + s.tokens.len()),
                        block_table: idx.slice(table.clone()),
                    })
                    .collect()
            })
            .collect();
        let out_attn_seqs: Vec<Vec<AttnSeq<'_>>> = (0..n_groups)
            .map(|g| {
                let mut q_start = 0;
                wanted
                    .iter()
                    .zip(&table_at[g])
                    .map(|(r, table)| {
                        let seq = AttnSeq {
                            q_start,
                            positions: out_positions_v.slice(q_start..q_start + r.len()),
                            block_table: idx.slice(table.clone()),
                        };
                        q_start += r.len();
                        seq
                    })
                    .collect()
            })
            .collect();

        let dv_ = &**dev;
        let mut x = dev.alloc(n * d)?;
        timed!(
            "embed",
            dev.get_rows(&*self.token_embd, tokens_v, x.view_mut())
        )?;
        if spec.embed_scale != 1.0 {
            timed!("scale", dev.scale(x.view_mut(), spec.embed_scale))?;
        }
        let per_layer_inputs = match &self.per_layer {
            Some(pl) => Some(self.per_layer_inputs(pl, tokens_v, x.view())?),
            None => None,
        };
        // The rows each layer computes: all of them, then (last layer) the wanted ones.
        let all_rows: Vec<usize> = (0..n).collect();
        let out_rows: Vec<usize> = wanted.iter().flat_map(|r| r.clone()).collect();
        let mut a = dev.alloc(n * d)?;
        timed!(
            "rms_norm",
            dev.rms_norm(
                x.view(),
                Some(self.layers[0].attn_norm.view()),
                spec.rms_eps,
                d,
                a.view_mut()
            )
        )?;

        let mut tmp = dev.alloc(n * d)?;
        let mut f = dev.alloc(n * d)?;
        // Buffers reused by every layer: fresh multi-MiB tensors per op cost a prompt
        // batch page faults and zeroing (about 5% of a Gemma prefill).
        let mut bufs = StepBufs {
            q: Buf::new(dv_, n * h * dk_max)?,
            k: Buf::new(dv_, n * hkv * dk_max)?,
            v: Buf::new(dv_, n * hkv * dv_max)?,
            o: Buf::new(dv_, n * h * dv_max)?,
            q_full: Buf::default(),
            q_gate: Buf::default(),
            norm_src: Buf::new(dv_, (n * h * dk_max).max(n * hkv * dk_max).max(n * d))?,
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
                        idx.slice(slot_at[g].clone()),
                        positions_v,
                        seqs,
                        shrink.then_some(&wanted[..]),
                        a.slice(0..n * d),
                        &mut x,
                        tmp.slice_mut(0..out_rows * d),
                        &mut bufs,
                    )?;
                    if last && !shrink {
                        keep_rows(dv_, &wanted, d, &mut tmp, &mut x)?;
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
                        a.slice(0..n * d),
                        states,
                        tmp.slice_mut(0..n * d),
                        &mut bufs.delta,
                    )?;
                    if last {
                        keep_rows(dv_, &wanted, d, &mut tmp, &mut x)?;
                    }
                }
            }
            let (mut tmp, mut f, mut a, mut x) = (
                tmp.slice_mut(0..rows * d),
                f.slice_mut(0..rows * d),
                a.slice_mut(0..rows * d),
                x.slice_mut(0..rows * d),
            );
            let mlp_bufs = &mut bufs.mlp;
            let norm_src = &mut bufs.norm_src;
            self.residual_norm(
                &layer.post_attn_norm,
                tmp.as_view(),
                x.reborrow(),
                layer.ffn_norm.view(),
                f.reborrow(),
                norm_src,
            )?;
            self.ffn(
                layer,
                f.as_view(),
                x.as_view(),
                rows,
                tmp.reborrow(),
                mlp_bufs,
            )?;
            let next_norm = match self.layers.get(il + 1) {
                Some(next) => &next.attn_norm,
                None => &self.output_norm,
            };
            if layer.per_layer.is_none() && layer.out_scale.is_none() {
                self.residual_norm(
                    &layer.post_ffn_norm,
                    tmp.as_view(),
                    x.reborrow(),
                    next_norm.view(),
                    a.reborrow(),
                    norm_src,
                )?;
                continue;
            }
            let delta = self.post_norm(&layer.post_ffn_norm, tmp.as_view(), norm_src)?;
            timed!("add", dev.add(x.reborrow(), delta))?;
            if let (Some(li), Some(inputs)) = (&layer.per_layer, &per_layer_inputs) {
                self.layer_input(
                    li,
                    il,
                    inputs,
                    row_ids,
                    x.as_view(),
                    tmp.reborrow(),
                    mlp_bufs,
                )?;
                timed!("add", dev.add(x.reborrow(), tmp.as_view()))?;
            }
            if let Some(s) = layer.out_scale {
                timed!("scale", dev.scale(x.reborrow(), s))?;
            }
            timed!(
                "rms_norm",
                dev.rms_norm(
                    x.as_view(),
                    Some(next_norm.view()),
                    spec.rms_eps,
                    d,
                    a.reborrow()
                )
            )?;
        }
        // `a` now holds rmsnorm(x) * output_norm of the wanted rows, in order (the last
        // layer kept only those). Their logits are the one download of the step, or one
        // download per group of rows where all of them would not fit one device buffer
        // (every row's logits of a long prompt on Vulkan).
        let rows_per = dev
            .max_buffer_bytes()
            .map_or(n_out, |max| (max / (4 * spec.vocab as u64)).max(1) as usize);
        let mut out = if rows_per >= n_out {
            let mut logits = dev.alloc(n_out * spec.vocab)?;
            timed!(
                "output",
                dev.matmul(
                    &*self.output,
                    a.slice(0..n_out * d),
                    n_out,
                    logits.view_mut()
                )
            )?;
            dev.download_tensor(logits)?
        } else {
            let mut host = vec![0.0f32; n_out * spec.vocab];
            let mut part = dev.alloc(rows_per * spec.vocab)?;
            for r0 in (0..n_out).step_by(rows_per) {
                let rows = rows_per.min(n_out - r0);
                let len = rows * spec.vocab;
                timed!(
                    "output",
                    dev.matmul(
                        &*self.output,
                        a.slice(r0 * d..(r0 + rows) * d),
                        rows,
                        part.slice_mut(0..len)
                    )
                )?;
                dev.download(part.slice(0..len), &mut host[r0 * spec.vocab..][..len])?;
            }
            host
        };
        soft_cap(&mut out, spec.logit_softcap);
        Ok(out)
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
        slots: IndexView<'_>,
        positions: IndexView<'_>,
        seqs: &[AttnSeq<'_>],
        wanted: Option<&[std::ops::Range<usize>]>,
        a: View<'_>,
        x: &mut Tensor,
        mut out: ViewMut<'_>,
        bufs: &mut StepBufs,
    ) -> Result<(), ModelError> {
        let spec = &self.spec;
        let dev = &*self.dev;
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
            q_full,
            q_gate,
            norm_src,
            ..
        } = bufs;
        let (qn, kn, vn) = (n * h * dk, n * hkv_l * dk, n * hkv_l * dv);
        // Qwen 3.5's gated attention: the query projection gives per head `dk` query
        // values then `dk` gate values; the gate's sigmoid multiplies the attention
        // output (llama.cpp's `ggml_sigmoid` then `ggml_mul`).
        {
            let q_out = if ld.attn_gate {
                q_full.get(dev, 2 * qn)?
            } else {
                q.get(dev, qn)?
            };
            if own_kv {
                timed!(
                    "qkv",
                    dev.matmul_multi(
                        &[&*at.wq, &*at.wk, &*at.wv],
                        a,
                        n,
                        &mut [q_out, k.get(dev, kn)?, v.get(dev, vn)?],
                    )
                )?;
            } else {
                // gemma4's shared-KV layers: queries only.
                timed!("qkv", dev.matmul(&*at.wq, a, n, q_out))?;
            }
        }
        if ld.attn_gate {
            // Each head's queries, then its gate; the gate through the sigmoid.
            timed!(
                "attn_gate",
                dev.deinterleave(
                    q_full.view(2 * qn),
                    dk,
                    &mut [q.get(dev, qn)?, q_gate.get(dev, qn)?]
                )
            )?;
            timed!("attn_gate", dev.sigmoid(q_gate.get(dev, qn)?))?;
        }
        // A shared-KV layer projects queries only.
        for (t, len, b, computed) in [
            (&mut *q, qn, &at.bq, true),
            (&mut *k, kn, &at.bk, own_kv),
            (&mut *v, vn, &at.bv, own_kv),
        ] {
            if len == 0 || !computed {
                continue;
            }
            if let Some(b) = b {
                timed!("add_bias", dev.add_bias(t.get(dev, len)?, b.view()))?;
            }
        }
        let rope = layer_rope(spec, il, None);
        let factors = self.rope_freqs.as_ref().map(Tensor::view);
        let rp = |n_heads| RopeParams {
            n_heads,
            head_dim: dk,
            kind: rope.kind,
            n_rot: rope.n_rot,
            base: rope.base,
            freq_scale: rope.freq_scale,
            freq_factors: factors.filter(|_| spec.layers[il].rope_freq_factors),
            yarn: rope.yarn,
        };
        // A pre-scaled query (Gemma 3 in llama.cpp: `ggml_scale` on the rotated
        // queries, attention scale 1): the f16 rounding of the queries in its
        // small-batch attention sees the scaled values, so the order matters to the
        // bit.
        let (q_scale, attn_scale) = if spec.q_prescaled {
            (spec.attn_scale, 1.0)
        } else {
            (1.0, spec.attn_scale)
        };
        let eps = spec.rms_eps;
        // Queries and keys: the head norm, the rotation and the pre-scale in one op
        // where the model norms them.
        match &at.q_norm {
            Some(w) => timed!(
                "norm_rope",
                dev.norm_rope(
                    q.get(dev, qn)?,
                    w.view(),
                    eps,
                    positions,
                    &rp(h),
                    q_scale,
                    norm_src.get(dev, qn)?
                )
            )?,
            None => {
                timed!("rope", dev.rope(q.get(dev, qn)?, positions, &rp(h)))?;
                if q_scale != 1.0 {
                    timed!("scale", dev.scale(q.get(dev, qn)?, q_scale))?;
                }
            }
        }
        if own_kv {
            match &at.k_norm {
                Some(w) => timed!(
                    "norm_rope",
                    dev.norm_rope(
                        k.get(dev, kn)?,
                        w.view(),
                        eps,
                        positions,
                        &rp(hkv_l),
                        1.0,
                        norm_src.get(dev, kn)?
                    )
                )?,
                None => timed!("rope", dev.rope(k.get(dev, kn)?, positions, &rp(hkv_l)))?,
            }
            if spec.v_norm {
                self.norm_swap(v, vn, None, dv, norm_src)?;
            }
            timed!(
                "write_kv",
                dev.write_kv(&mut *kv[il], k.view(kn), v.view(vn), slots)
            )?;
        }
        let mut rows = n;
        if let Some(wanted) = wanted {
            let qw = h * dk;
            let mut to = 0;
            for r in wanted {
                for from in r.clone() {
                    copy_within(dev, q.tensor(), from * qw, to * qw, qw)?;
                    copy_within(dev, x, from * d, to * d, d)?;
                    if ld.attn_gate {
                        copy_within(dev, q_gate.tensor(), from * qw, to * qw, qw)?;
                    }
                    to += 1;
                }
            }
            rows = to;
        }
        let pa = PagedAttention {
            q: q.view(rows * h * dk),
            seqs,
            n_heads: h,
            scale: attn_scale,
            sinks: at.sinks.as_ref().map(Tensor::view),
            window: spec.layer_window(il),
        };
        timed!(
            "attention",
            dev.paged_attention(&*kv[spec.kv_layer(il)], &pa, o.get(dev, rows * h * dv)?)
        )?;
        if ld.attn_gate {
            timed!(
                "attn_gate",
                dev.mul(o.get(dev, rows * h * dv)?, q_gate.view(rows * h * dk))
            )?;
        }
        timed!(
            "attn_out",
            dev.matmul(&*at.wo, o.view(rows * h * dv), rows, out.reborrow())
        )?;
        if let Some(b) = &at.bo {
            timed!("add_bias", dev.add_bias(out.reborrow(), b.view()))?;
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
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        il: usize,
        dn: &DevDeltaNet,
        seqs: &[(usize, usize, bool, u32)],
        a: View<'_>,
        states: &mut RecurrentStates,
        out: ViewMut<'_>,
        bufs: &mut DeltaBufs,
    ) -> Result<(), ModelError> {
        let spec = &self.spec;
        let dev = &*self.dev;
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
        timed!(
            "delta_in",
            dev.matmul_multi(
                &[&*dn.qkv, &*dn.gate, &*dn.beta, &*dn.alpha],
                a,
                n,
                &mut [
                    qkv.get(dev, n * cd)?,
                    z.get(dev, n * vl)?,
                    beta.get(dev, n * hv)?,
                    alpha.get(dev, n * hv)?
                ],
            )
        )?;
        timed!("delta_gates", dev.sigmoid(beta.get(dev, n * hv)?))?;
        // The log decay of each row and head, in `alpha`'s place.
        timed!(
            "delta_gates",
            dev.delta_net_gate(alpha.get(dev, n * hv)?, dn.dt_bias.view(), dn.a.view())
        )?;
        conv.get(dev, n * cd)?;
        q.get(dev, n * qk)?;
        k.get(dev, n * qk)?;
        v.get(dev, n * vl)?;
        o.get(dev, n * vl)?;
        for &(r0, len, fresh, slot) in seqs {
            if len == 0 {
                continue;
            }
            let (conv_state, delta_state) = states.slot_mut(dev, il, slot, fresh)?;
            let rows = r0..r0 + len;
            timed!(
                "ssm_conv",
                dev.ssm_conv_silu(
                    qkv.view(n * cd).slice(rows.start * cd..rows.end * cd),
                    dn.conv.view(),
                    desc.conv_kernel,
                    conv_state,
                    conv.tensor().slice_mut(rows.start * cd..rows.end * cd),
                )
            )?;
            // Each row's q, k and v apart, the heads of q and k L2-normed.
            for t in rows.clone() {
                let row = conv.view(n * cd).slice(t * cd..(t + 1) * cd);
                dev.copy(row.slice(0..qk), q.tensor().slice_mut(t * qk..(t + 1) * qk))?;
                dev.copy(
                    row.slice(qk..2 * qk),
                    k.tensor().slice_mut(t * qk..(t + 1) * qk),
                )?;
                dev.copy(
                    row.slice(2 * qk..cd),
                    v.tensor().slice_mut(t * vl..(t + 1) * vl),
                )?;
            }
            let (qr, kr) = (
                rows.start * qk..rows.end * qk,
                rows.start * qk..rows.end * qk,
            );
            timed!(
                "l2_norm",
                dev.l2_norm(q.tensor().slice_mut(qr.clone()), shape.head_dim, eps)
            )?;
            timed!(
                "l2_norm",
                dev.l2_norm(k.tensor().slice_mut(kr.clone()), shape.head_dim, eps)
            )?;
            timed!(
                "delta_rule",
                dev.gated_delta_net(
                    &shape,
                    q.view(n * qk).slice(qr),
                    k.view(n * qk).slice(kr),
                    v.view(n * vl).slice(rows.start * vl..rows.end * vl),
                    alpha.view(n * hv).slice(rows.start * hv..rows.end * hv),
                    beta.view(n * hv).slice(rows.start * hv..rows.end * hv),
                    delta_state,
                    o.tensor().slice_mut(rows.start * vl..rows.end * vl),
                )
            )?;
        }
        // Per head: RMSNorm with `ssm_norm`, times `silu(z)`.
        timed!(
            "rms_norm",
            dev.rms_norm(
                o.view(n * vl),
                Some(dn.norm.view()),
                eps,
                shape.head_dim,
                normed.get(dev, n * vl)?
            )
        )?;
        timed!(
            "silu_mul",
            dev.silu_mul(z.view(n * vl), normed.view(n * vl), o.get(dev, n * vl)?)
        )?;
        timed!("delta_out", dev.matmul(&*dn.out, o.view(n * vl), n, out))?;
        Ok(())
    }

    /// The first `len` values of `buf` normed (`rms_norm(buf) * w`, no weight when `w`
    /// is None, in chunks of `dim`) into `scratch`, then the two buffers swapped: `buf`
    /// holds the normed values, with no copy (the device op reads one tensor and writes
    /// another).
    fn norm_swap(
        &self,
        buf: &mut Buf,
        len: usize,
        w: Option<View<'_>>,
        dim: usize,
        scratch: &mut Buf,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
        let out = scratch.get(dev, len)?;
        timed!(
            "rms_norm",
            dev.rms_norm(buf.view(len), w, self.spec.rms_eps, dim, out)
        )?;
        std::mem::swap(buf, scratch);
        Ok(())
    }

    /// A sublayer's output `t` (rows of `d`) into the residual stream `x` (through the
    /// post-norm `post` where the model has one), then `out = rmsnorm(x) * next`: one op
    /// either way (`scratch` holds the normed output where the device needs it).
    fn residual_norm(
        &self,
        post: &Option<Tensor>,
        t: View<'_>,
        x: ViewMut<'_>,
        next: View<'_>,
        out: ViewMut<'_>,
        scratch: &mut Buf,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
        let (eps, d) = (self.spec.rms_eps, self.spec.d);
        match post {
            Some(w) => {
                let s = scratch.get(dev, t.len())?;
                timed!(
                    "post_norm_add_rms_norm",
                    dev.post_norm_add_rms_norm(x, t, w.view(), next, eps, d, s, out)
                )?;
            }
            None => timed!("add_rms_norm", dev.add_rms_norm(x, t, next, eps, d, out))?,
        }
        Ok(())
    }

    /// A sublayer's output `t` (rows of `d`) as the residual stream takes it: through
    /// the post-norm `w` into `scratch` where the model has one, else `t` itself.
    fn post_norm<'s>(
        &self,
        w: &Option<Tensor>,
        t: View<'s>,
        scratch: &'s mut Buf,
    ) -> Result<View<'s>, ModelError> {
        let Some(w) = w else {
            return Ok(t);
        };
        let dev = &*self.dev;
        let len = t.len();
        let out = scratch.get(dev, len)?;
        timed!(
            "rms_norm",
            dev.rms_norm(t, Some(w.view()), self.spec.rms_eps, self.spec.d, out)
        )?;
        Ok(scratch.view(len))
    }

    /// `buf = rms_norm(buf) * w` (no weight when `w` is None) in chunks of `dim` (the
    /// device op reads one tensor and writes another: `buf` is copied to `scratch`
    /// first, grown when needed).
    fn norm_in_place(
        &self,
        buf: ViewMut<'_>,
        w: Option<View<'_>>,
        dim: usize,
        scratch: &mut Buf,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
        let len = buf.len();
        dev.copy(buf.as_view(), scratch.get(dev, len)?)?;
        timed!(
            "rms_norm",
            dev.rms_norm(scratch.view(len), w, self.spec.rms_eps, dim, buf)
        )?;
        Ok(())
    }

    /// Gemma 4's per-layer inputs of every token, `[n][L][P]`, as llama.cpp's
    /// `build_inp_per_layer` and `project_per_layer_inputs` compute them from the tokens
    /// and their scaled embeddings `x`.
    fn per_layer_inputs(
        &self,
        pl: &DevPerLayerInputs,
        tokens: IndexView<'_>,
        x: View<'_>,
    ) -> Result<Tensor, ModelError> {
        let dev = &self.dev;
        let spec = &self.spec;
        let (p, n) = (spec.per_layer_input, tokens.len());
        let width = p * spec.n_layers();
        let mut emb = dev.alloc(n * width)?;
        timed!(
            "embed",
            dev.get_rows(&*pl.token_embd, tokens, emb.view_mut())
        )?;
        timed!("scale", dev.scale(emb.view_mut(), (p as f32).sqrt()))?;
        let mut proj = dev.alloc(n * width)?;
        timed!(
            "per_layer_proj",
            dev.matmul(&*pl.model_proj, x, n, proj.view_mut())
        )?;
        timed!(
            "scale",
            dev.scale(proj.view_mut(), 1.0 / (spec.d as f32).sqrt())
        )?;
        let mut out = dev.alloc(n * width)?;
        timed!(
            "rms_norm",
            dev.rms_norm(
                proj.view(),
                Some(pl.proj_norm.view()),
                spec.rms_eps,
                p,
                out.view_mut()
            )
        )?;
        timed!("add", dev.add(out.view_mut(), emb.view()))?;
        timed!("scale", dev.scale(out.view_mut(), 1.0 / 2f32.sqrt()))?;
        Ok(out)
    }

    /// Gemma 4's per-layer input of layer `il` for the rows `row_ids` of the step:
    /// `out = post_norm(proj(gelu(inp_gate x) * input))`, `x` those rows' residuals.
    #[allow(clippy::too_many_arguments)]
    fn layer_input(
        &self,
        li: &DevLayerInput,
        il: usize,
        inputs: &Tensor,
        row_ids: &[usize],
        x: View<'_>,
        mut out: ViewMut<'_>,
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
        let spec = &self.spec;
        let (p, rows) = (spec.per_layer_input, row_ids.len());
        let width = p * spec.n_layers();
        let [mut gate, mut input, mut hidden, _] = bufs.take(dev, rows * p, 0)?;
        for (i, &r) in row_ids.iter().enumerate() {
            let from = r * width + il * p;
            dev.copy(
                inputs.slice(from..from + p),
                input.slice_mut(i * p..(i + 1) * p),
            )?;
        }
        timed!(
            "per_layer_gate",
            dev.matmul(&*li.inp_gate, x, rows, gate.reborrow())
        )?;
        timed!(
            "gelu_mul",
            dev.gelu_mul(gate.as_view(), input.as_view(), hidden.reborrow())
        )?;
        timed!(
            "per_layer_proj",
            dev.matmul(&*li.proj, hidden.as_view(), rows, out.reborrow())
        )?;
        self.norm_in_place(
            out,
            Some(li.post_norm.view()),
            spec.d,
            &mut bufs.moe.scratch,
        )?;
        Ok(())
    }

    fn mlp(
        &self,
        mlp: &DevMlp,
        f: View<'_>,
        n: usize,
        out: ViewMut<'_>,
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
        let [g, u, mut hdn, _] = bufs.take(dev, n * mlp.width, 0)?;
        let glu = match self.spec.activation {
            Activation::Silu => Glu::Silu,
            Activation::GeluTanh => Glu::GeluTanh,
            Activation::SwigluOai => Glu::SwigluOai,
        };
        // Gate, up and the activation in one op (`g` and `u` hold the two products where
        // the device computes them apart).
        timed!(
            "gate_up_act",
            dev.matmul_glu(&*mlp.gate, &*mlp.up, f, n, glu, [g, u], hdn.reborrow())
        )?;
        timed!("ffn_down", dev.matmul(&*mlp.down, hdn.as_view(), n, out))?;
        Ok(())
    }

    /// `hidden = act(gate, up)` with the model's activation.
    fn activation(&self, g: View<'_>, u: View<'_>, hdn: ViewMut<'_>) -> Result<(), ModelError> {
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
        f: View<'_>,
        resid: View<'_>,
        n: usize,
        mut out: ViewMut<'_>,
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let dev = &*self.dev;
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
                    shared_gate_out,
                    scratch,
                    zeros,
                } = &mut mb;
                // Gemma 4: the experts read `pre_ffw_norm_2` of the residual stream, the
                // router its weightless norm times `scale / sqrt(d)`.
                let f_exp = match parallel {
                    Some(p) => {
                        timed!(
                            "rms_norm",
                            dev.rms_norm(
                                resid,
                                Some(p.pre_norm_2.view()),
                                eps,
                                d,
                                expert_in.get(dev, n * d)?
                            )
                        )?;
                        expert_in.view(n * d)
                    }
                    None => f,
                };
                match router_norm {
                    Some(w) => {
                        timed!(
                            "rms_norm",
                            dev.rms_norm(resid, Some(w.view()), eps, d, router_in.get(dev, n * d)?)
                        )?;
                        timed!(
                            "router",
                            dev.matmul(
                                &**router,
                                router_in.view(n * d),
                                n,
                                logits.get(dev, n * e)?
                            )
                        )?;
                    }
                    None => timed!(
                        "router",
                        dev.matmul(&**router, f_exp, n, logits.get(dev, n * e)?)
                    )?,
                }
                if let Some(rb) = router_bias {
                    timed!(
                        "router_bias",
                        dev.add_bias(logits.get(dev, n * e)?, rb.view())
                    )?;
                }
                let cfg = RoutingConfig {
                    k,
                    gating: ms.gating,
                    normalize: ms.normalize,
                    scale: ms.scale,
                };
                // The chosen experts and their weights stay on the device: the expert
                // matmuls, the biases and the combine read them there.
                timed!(
                    "route",
                    dev.route_topk(
                        logits.view(n * e),
                        e,
                        bias.as_ref().map(Tensor::view),
                        expert_scale.as_ref().map(Tensor::view),
                        &cfg,
                        ids.get(dev, n * k)?,
                        weights.get(dev, n * k)?
                    )
                )?;
                let ids = ids.view(n * k);
                let w = experts.width;
                let [g, u, mut hdn, mut y] = bufs.take(dev, n * k * w, n * k * d)?;
                let mut gu = [g, u];
                // Gate and up: each token's row times its `k` experts (a fan-out of `k`).
                timed!(
                    "expert_gate_up",
                    dev.expert_matmul_multi(&[&*experts.gate, &*experts.up], f_exp, ids, &mut gu)
                )?;
                let [mut g, mut u] = gu;
                if let Some(b) = expert_biases {
                    timed!(
                        "expert_bias",
                        dev.add_id(g.reborrow(), b.gate.view(), ids, w)
                    )?;
                    timed!("expert_bias", dev.add_id(u.reborrow(), b.up.view(), ids, w))?;
                }
                self.activation(g.as_view(), u.as_view(), hdn.reborrow())?;
                // Down: a row per routed row already (a fan-out of 1).
                timed!(
                    "expert_down",
                    dev.expert_matmul(&*experts.down, hdn.as_view(), ids, y.reborrow())
                )?;
                if let Some(b) = expert_biases {
                    timed!(
                        "expert_bias",
                        dev.add_id(y.reborrow(), b.down.view(), ids, d)
                    )?;
                }
                zero(dev, out.reborrow(), zeros)?;
                timed!(
                    "scatter",
                    dev.scatter_add_weighted(out.reborrow(), y.as_view(), weights.view(n * k), d)
                )?;
                if let Some(s) = shared {
                    self.mlp(s, f, n, branch_out.get(dev, n * d)?, bufs)?;
                    // Qwen 3.5: the shared expert's output times `sigmoid(gate . f)`.
                    if let Some(gw) = shared_gate {
                        timed!(
                            "shared_gate",
                            dev.matmul(&**gw, f, n, shared_gate_out.get(dev, n)?)
                        )?;
                        timed!("shared_gate", dev.sigmoid(shared_gate_out.get(dev, n)?))?;
                        timed!(
                            "shared_gate",
                            dev.mul(branch_out.get(dev, n * d)?, shared_gate_out.view(n))
                        )?;
                    }
                    timed!("add", dev.add(out.reborrow(), branch_out.view(n * d)))?;
                }
                if let Some(p) = parallel {
                    // Both branches' post-norms, then dense + experts.
                    self.norm_in_place(out.reborrow(), Some(p.post_norm_2.view()), d, scratch)?;
                    self.mlp(&p.mlp, f, n, branch_out.get(dev, n * d)?, bufs)?;
                    self.norm_in_place(
                        branch_out.get(dev, n * d)?,
                        Some(p.post_norm_1.view()),
                        d,
                        scratch,
                    )?;
                    timed!("add", dev.add(branch_out.get(dev, n * d)?, out.as_view()))?;
                    dev.copy(branch_out.view(n * d), out)?;
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
            states: RecurrentStates::new(model, 1)?,
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
fn keep_rows(
    dev: &dyn Device,
    wanted: &[std::ops::Range<usize>],
    d: usize,
    out: &mut Tensor,
    x: &mut Tensor,
) -> Result<(), HalError> {
    let mut to = 0;
    for r in wanted {
        for from in r.clone() {
            copy_within(dev, out, from * d, to * d, d)?;
            copy_within(dev, x, from * d, to * d, d)?;
            to += 1;
        }
    }
    Ok(())
}

/// `t[dst..dst + len] = t[src..src + len]` on the device; the ranges do not overlap
/// (or are the same).
fn copy_within(
    dev: &dyn Device,
    t: &mut Tensor,
    src: usize,
    dst: usize,
    len: usize,
) -> Result<(), HalError> {
    if src == dst || len == 0 {
        return Ok(());
    }
    match t {
        Tensor::Host(v) => {
            v.copy_within(src..src + len, dst);
            Ok(())
        }
        Tensor::Device(b) => {
            let buf = &**b;
            dev.copy(
                View::Device {
                    buf,
                    offset: src,
                    len,
                },
                ViewMut::Device {
                    buf,
                    offset: dst,
                    len,
                },
            )
        }
    }
}

/// `t = 0`: in place in host memory, else a device-side copy from `zeros`, a tensor
/// that is only ever grown (so all zeros).
fn zero(dev: &dyn Device, t: ViewMut<'_>, zeros: &mut Buf) -> Result<(), HalError> {
    match t {
        ViewMut::Host(s) => {
            s.fill(0.0);
            Ok(())
        }
        t => {
            let len = t.len();
            zeros.get(dev, len)?;
            dev.copy(zeros.view(len), t)
        }
    }
}
