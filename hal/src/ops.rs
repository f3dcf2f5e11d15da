use std::any::Any;
use std::fmt;

pub use flint_core::math::{DeltaNetShape, Gating, RopeConfig, RopeKind, Yarn};

use crate::HalError;

/// Every op of the [`Device`](crate::Device) trait, for capability queries and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`Device::stage`](crate::Device::stage) of a weight of a given encoding.
    Stage,
    /// [`Device::matmul`](crate::Device::matmul).
    Matmul,
    /// [`Device::matmul_glu`](crate::Device::matmul_glu).
    MatmulGlu,
    /// [`Device::expert_matmul`](crate::Device::expert_matmul).
    ExpertMatmul,
    /// [`Device::get_rows`](crate::Device::get_rows).
    GetRows,
    /// [`Device::rms_norm`](crate::Device::rms_norm).
    RmsNorm,
    /// [`Device::add_rms_norm`](crate::Device::add_rms_norm).
    AddRmsNorm,
    /// [`Device::post_norm_add_rms_norm`](crate::Device::post_norm_add_rms_norm).
    PostNormAddRmsNorm,
    /// [`Device::rope`](crate::Device::rope).
    Rope,
    /// [`Device::norm_rope`](crate::Device::norm_rope).
    NormRope,
    /// [`Device::silu_mul`](crate::Device::silu_mul).
    SiluMul,
    /// [`Device::gelu_mul`](crate::Device::gelu_mul).
    GeluMul,
    /// [`Device::swiglu_oai_mul`](crate::Device::swiglu_oai_mul).
    SwigluOaiMul,
    /// [`Device::add`](crate::Device::add).
    Add,
    /// [`Device::add_bias`](crate::Device::add_bias).
    AddBias,
    /// [`Device::scale`](crate::Device::scale).
    Scale,
    /// [`Device::add_id`](crate::Device::add_id).
    AddId,
    /// [`Device::scatter_add_weighted`](crate::Device::scatter_add_weighted).
    ScatterAddWeighted,
    /// [`Device::route_topk`](crate::Device::route_topk).
    RouteTopK,
    /// [`Device::write_kv`](crate::Device::write_kv).
    WriteKv,
    /// [`Device::paged_attention`](crate::Device::paged_attention).
    PagedAttention,
    /// [`Device::ssm_conv_silu`](crate::Device::ssm_conv_silu).
    SsmConvSilu,
    /// [`Device::gated_delta_net`](crate::Device::gated_delta_net).
    GatedDeltaNet,
    /// [`Device::sigmoid`](crate::Device::sigmoid).
    Sigmoid,
    /// [`Device::mul`](crate::Device::mul).
    Mul,
    /// [`Device::deinterleave`](crate::Device::deinterleave).
    Deinterleave,
    /// [`Device::delta_net_gate`](crate::Device::delta_net_gate).
    DeltaNetGate,
    /// [`Device::l2_norm`](crate::Device::l2_norm).
    L2Norm,
    /// [`Device::copy`](crate::Device::copy).
    Copy,
}

impl Op {
    /// Every op, in declaration order.
    pub const ALL: [Op; 29] = [
        Op::Stage,
        Op::Matmul,
        Op::MatmulGlu,
        Op::ExpertMatmul,
        Op::GetRows,
        Op::RmsNorm,
        Op::AddRmsNorm,
        Op::PostNormAddRmsNorm,
        Op::Rope,
        Op::NormRope,
        Op::SiluMul,
        Op::GeluMul,
        Op::SwigluOaiMul,
        Op::Add,
        Op::AddBias,
        Op::Scale,
        Op::AddId,
        Op::ScatterAddWeighted,
        Op::RouteTopK,
        Op::WriteKv,
        Op::PagedAttention,
        Op::SsmConvSilu,
        Op::GatedDeltaNet,
        Op::Sigmoid,
        Op::Mul,
        Op::Deinterleave,
        Op::DeltaNetGate,
        Op::L2Norm,
        Op::Copy,
    ];

    /// A short lower-case name (`matmul`, `paged_attention`, ...), used by
    /// `flint-conformance --filter`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Stage => "stage",
            Op::Matmul => "matmul",
            Op::MatmulGlu => "matmul_glu",
            Op::ExpertMatmul => "expert_matmul",
            Op::GetRows => "get_rows",
            Op::RmsNorm => "rms_norm",
            Op::AddRmsNorm => "add_rms_norm",
            Op::PostNormAddRmsNorm => "post_norm_add_rms_norm",
            Op::Rope => "rope",
            Op::NormRope => "norm_rope",
            Op::SiluMul => "silu_mul",
            Op::GeluMul => "gelu_mul",
            Op::SwigluOaiMul => "swiglu_oai_mul",
            Op::Add => "add",
            Op::AddBias => "add_bias",
            Op::Scale => "scale",
            Op::AddId => "add_id",
            Op::ScatterAddWeighted => "scatter_add_weighted",
            Op::RouteTopK => "route_topk",
            Op::WriteKv => "write_kv",
            Op::PagedAttention => "paged_attention",
            Op::SsmConvSilu => "ssm_conv_silu",
            Op::GatedDeltaNet => "gated_delta_net",
            Op::Sigmoid => "sigmoid",
            Op::Mul => "mul",
            Op::Deinterleave => "deinterleave",
            Op::DeltaNetGate => "delta_net_gate",
            Op::L2Norm => "l2_norm",
            Op::Copy => "copy",
        }
    }

    /// True for ops whose support depends on a weight's block encoding.
    pub fn takes_weight(self) -> bool {
        matches!(
            self,
            Op::Stage | Op::Matmul | Op::MatmulGlu | Op::ExpertMatmul | Op::GetRows
        )
    }
}

/// The activation of a gated MLP ([`Device::matmul_glu`](crate::Device::matmul_glu)):
/// which of the element-wise ops combines the gate and up products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Glu {
    /// [`Device::silu_mul`](crate::Device::silu_mul).
    Silu,
    /// [`Device::gelu_mul`](crate::Device::gelu_mul).
    GeluTanh,
    /// [`Device::swiglu_oai_mul`](crate::Device::swiglu_oai_mul).
    SwigluOai,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many routed rows each input row has in a grouped expert op
/// ([`Device::expert_matmul`](crate::Device::expert_matmul),
/// [`Device::scatter_add_weighted`](crate::Device::scatter_add_weighted),
/// [`Device::add_id`](crate::Device::add_id)): `routed / inputs`, routed row `i`
/// belonging to input row `i / fanout`. A count of routed rows that is not a multiple of
/// the input rows is a caller bug (`op` names the call), which panics; no rows at all is
/// a fan-out of 1.
pub fn fanout(inputs: usize, routed: usize, op: &str) -> usize {
    if inputs == 0 {
        assert_eq!(routed, 0, "{op}: {routed} routed rows for no input row");
        return 1;
    }
    assert!(
        routed.is_multiple_of(inputs),
        "{op}: {routed} routed rows is not a multiple of {inputs} input rows"
    );
    routed / inputs
}

/// RoPE parameters, as ggml's `rope_ext` takes them: `n_rot` dims of each of the
/// `n_heads` heads of a row are rotated at the row's position, the rest pass through.
///
/// For pair `i < n_rot/2` the angle is `pos * base^(-2i/n_rot)`, divided by
/// `freq_factors[i]` when there are factors, multiplied by `freq_scale`, and, with
/// [`Yarn`] and a non-zero `ext_factor`, mixed with the unscaled angle over YaRN's ramp;
/// the cosine and sine are multiplied by YaRN's magnitude factor (1 without YaRN).
/// [`RopeKind::Normal`] rotates `(x[2i], x[2i+1])`, [`RopeKind::Neox`]
/// `(x[i], x[i + n_rot/2])`. The reference is [`flint_core::math::rope`], whose module
/// docs give every step in ggml's order; a backend matches it within the conformance
/// tolerance (the cpu device bit for bit).
///
/// A device refuses parameters that [`RopeConfig::check`] refuses (odd `n_rot` or
/// larger than `head_dim`, a base, scale or factor that is not a finite positive number,
/// a factor count other than `n_rot / 2`) with `InvalidInput`. The factors are a
/// tensor of the model (uploaded once, like the norm weights): a device reads them where
/// it keeps them.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams<'a> {
    /// Heads per row.
    pub n_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Which dims are paired.
    pub kind: RopeKind,
    /// Rotated dims (even, `<= head_dim`).
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Linear frequency scale (1, or `1 / factor` for linear and YaRN scaling).
    pub freq_scale: f32,
    /// Per-pair divisors of the angle, `n_rot / 2` values (Llama 3's `rope_freqs`).
    pub freq_factors: Option<crate::View<'a>>,
    /// YaRN; `None` is no extrapolation mix and magnitude 1.
    pub yarn: Option<Yarn>,
}

impl<'a> RopeParams<'a> {
    /// Plain NeoX RoPE (scale 1, no factors, no YaRN) on `n_heads` heads of `head_dim`.
    pub fn neox(n_heads: usize, head_dim: usize, n_rot: usize, base: f32) -> Self {
        Self {
            n_heads,
            head_dim,
            kind: RopeKind::Neox,
            n_rot,
            base,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        }
    }

    /// The rotation of one head, for [`flint_core::math::rope`] and its helpers, on a
    /// device that computes in host memory (factors in a device buffer are a caller bug
    /// there, which panics).
    pub fn config(&self) -> RopeConfig<'a> {
        RopeConfig {
            freq_factors: self.freq_factors.map(crate::View::host),
            ..self.config_without_factors()
        }
    }

    fn config_without_factors(&self) -> RopeConfig<'a> {
        RopeConfig {
            kind: self.kind,
            n_rot: self.n_rot,
            base: self.base,
            freq_scale: self.freq_scale,
            freq_factors: None,
            yarn: self.yarn,
        }
    }

    /// `Ok` when a device can apply these parameters; otherwise the `InvalidInput`
    /// error every device returns for them. Factors in a device buffer are checked for
    /// their count here; their values are the device's to check.
    pub fn check(&self) -> Result<(), HalError> {
        let invalid = |e: flint_core::math::RopeError| HalError::invalid(e.to_string());
        match self.freq_factors {
            Some(crate::View::Device { len, .. }) => {
                self.config_without_factors()
                    .check(self.head_dim)
                    .map_err(invalid)?;
                if len != self.n_rot / 2 {
                    return Err(HalError::invalid(format!(
                        "rope: {len} frequency factors for {} rotated dims (want n_rot / 2)",
                        self.n_rot
                    )));
                }
                Ok(())
            }
            _ => self.config().check(self.head_dim).map_err(invalid),
        }
    }
}

/// The number of rows of a [`Device::add_bias`](crate::Device::add_bias) call: `x_len /
/// bias_len`, or the `InvalidInput` error every device returns when `bias_len` is 0 or
/// does not divide `x_len`.
pub fn bias_rows(x_len: usize, bias_len: usize) -> Result<usize, HalError> {
    if bias_len == 0 || !x_len.is_multiple_of(bias_len) {
        return Err(HalError::invalid(format!(
            "add_bias: a bias of {bias_len} values does not fit rows of x ({x_len} values)"
        )));
    }
    Ok(x_len / bias_len)
}

/// Top-k routing: `score = gate(logits)`; the `k` experts with the largest
/// `score + bias` are chosen (ties: lower index first); their weights are the *scores*
/// (without bias), renormalised to sum 1 when `normalize`, then multiplied by `scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoutingConfig {
    /// Experts chosen per token.
    pub k: usize,
    /// Score function.
    pub gating: Gating,
    /// Renormalise the chosen weights to sum 1.
    pub normalize: bool,
    /// Multiplier applied after renormalising.
    pub scale: f32,
}

/// Block id meaning "no block here" in a block table (a sliding-window block that was
/// handed back to the pool). Attention never reads positions that map to it.
pub const NO_BLOCK: u32 = u32::MAX;

/// Shape of one layer's paged KV cache: `num_blocks * block_size` slots, each holding
/// `n_kv_heads` keys of `head_dim_k` and values of `head_dim_v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Blocks in the pool this layer's group draws from.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Key head size.
    pub head_dim_k: usize,
    /// Value head size.
    pub head_dim_v: usize,
}

impl KvLayout {
    /// Total slots.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Bytes of keys and values this layout needs at `bytes_per_value` each (see
    /// [`Device::kv_bytes_per_value`](crate::Device::kv_bytes_per_value)).
    pub fn bytes(&self, bytes_per_value: usize) -> usize {
        self.num_slots() * self.n_kv_heads * (self.head_dim_k + self.head_dim_v) * bytes_per_value
    }
}

/// One layer's KV cache, allocated by [`Device::alloc_kv`](crate::Device::alloc_kv) and
/// only usable with the device that made it.
pub trait KvBuffer: Send + Sync + fmt::Debug {
    /// Its shape.
    fn layout(&self) -> &KvLayout;
    /// For the owning device to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
    /// For the owning device to recover its concrete type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Makes the buffer's memory resident now rather than at its first writes, so that no
    /// step pays the first touch of its pages (the kernel zeroing a fresh huge page takes
    /// longer than a decode step's writes to it, and a prefix-caching pool hands out its
    /// never-used blocks before its cached ones). A paged engine calls it once on the pool
    /// it allocates; a device whose allocations are resident from the start keeps this
    /// default, which does nothing.
    fn make_resident(&mut self) {}
}

/// One sequence in a [`PagedAttention`] call.
#[derive(Clone, Copy, Debug)]
pub struct AttnSeq<'a> {
    /// First row of this sequence's queries in `q` (and of its outputs).
    pub q_start: usize,
    /// Positions of its query rows (`q_start..q_start + positions.len()`). A query at
    /// position `p` attends to keys at `j <= p` (and `j > p - window` when windowed),
    /// which must all have been written with [`Device::write_kv`](crate::Device::write_kv).
    pub positions: crate::IndexView<'a>,
    /// Its block table in the group this layer belongs to: position `j` lives in slot
    /// `block_table[j / block_size] * block_size + j % block_size`.
    pub block_table: crate::IndexView<'a>,
}

/// A batched paged-attention call over many sequences (one layer).
#[derive(Clone, Copy, Debug)]
pub struct PagedAttention<'a> {
    /// Queries, `[n_rows, n_heads * head_dim_k]`, already normed and rotated.
    pub q: crate::View<'a>,
    /// The sequences; their query rows must not overlap.
    pub seqs: &'a [AttnSeq<'a>],
    /// Query heads; a multiple of the layout's `n_kv_heads` (GQA: head `h` reads KV head
    /// `h / (n_heads / n_kv_heads)`).
    pub n_heads: usize,
    /// Multiplier of `q . k` (usually `1/sqrt(head_dim_k)`).
    pub scale: f32,
    /// Per-head sink logits (`[n_heads]`, a tensor of the model): a term
    /// `exp(sink_h - m)` in the softmax denominator that contributes nothing to the
    /// output.
    pub sinks: Option<crate::View<'a>>,
    /// Sliding window `W`: a query at `p` sees only `j > p - W`.
    pub window: Option<usize>,
}
