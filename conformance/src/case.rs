//! The cases: plain data, one list for every backend.

use std::fmt;

use flint_hal::{DeltaNetShape, Gating, GgmlType, Op, RopeKind, Yarn};

use crate::rng::case_seed;

/// How a case's attention sinks are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sinks {
    /// No sinks.
    None,
    /// Sinks below the largest score of (almost) every row: the case that exposes a sink
    /// term seeded as `exp(0)` instead of `exp(sink - m_final)`.
    BelowMax,
    /// Sinks far above every score (the sink dominates the denominator).
    AboveMax,
}

/// One sequence of an attention case: `ctx` positions written, the last `n_q` queried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpec {
    /// Positions `0..ctx` hold keys and values.
    pub ctx: usize,
    /// Query rows: positions `ctx - n_q .. ctx`.
    pub n_q: usize,
}

/// The shape of an attention case (write_kv + paged_attention).
#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    /// Query heads.
    pub n_heads: usize,
    /// KV heads (GQA when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Key head size.
    pub head_dim_k: usize,
    /// Value head size.
    pub head_dim_v: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// The sequences, in the order they appear in the call.
    pub seqs: Vec<SeqSpec>,
    /// Sliding window.
    pub window: Option<usize>,
    /// Sinks.
    pub sinks: Sinks,
    /// Multiplier of `q . k / sqrt(head_dim_k)`: large values make the softmax peaked.
    pub sharpness: f32,
    /// Blocks wholly outside every query's window get `NO_BLOCK` in the table and are
    /// never written.
    pub drop_old_blocks: bool,
    /// KV-cache groups: each has its own buffer, its own pool and its own block tables
    /// for the same positions, written through its own slot mapping.
    pub groups: usize,
    /// Write some slots with wrong values first, then overwrite them (write_kv must
    /// replace, not accumulate), in several calls in shuffled order.
    pub overwrite: bool,
}

/// The shape and parameters of a RoPE case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    /// Rows (tokens).
    pub rows: usize,
    /// Query heads per row.
    pub heads: usize,
    /// When nonzero, the keys of the same rows (this many heads: GQA) are rotated by a
    /// second call with the same positions and parameters.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Rotated dims.
    pub n_rot: usize,
    /// Which dims are paired.
    pub kind: RopeKind,
    /// Frequency base.
    pub base: f32,
    /// Linear frequency scale.
    pub freq_scale: f32,
    /// Per-pair frequency factors (random, in `[1, 8]`, as Llama 3's).
    pub factors: bool,
    /// YaRN.
    pub yarn: Option<Yarn>,
    /// Positions up to 131071 rather than up to a few thousand.
    pub far: bool,
}

impl RopeSpec {
    /// Plain NeoX RoPE on `rows` rows of `heads` heads, positions up to a few thousand.
    pub fn neox(rows: usize, heads: usize, head_dim: usize, n_rot: usize, base: f32) -> Self {
        Self {
            rows,
            heads,
            kv_heads: 0,
            head_dim,
            n_rot,
            kind: RopeKind::Neox,
            base,
            freq_scale: 1.0,
            factors: false,
            yarn: None,
            far: false,
        }
    }
}

impl fmt::Display for RopeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        write!(
            f,
            "[{},{}x{}] n_rot={} base={}",
            r.rows, r.heads, r.head_dim, r.n_rot, r.base
        )?;
        if r.kv_heads > 0 {
            write!(f, " kv_heads={}", r.kv_heads)?;
        }
        if r.kind != RopeKind::Neox {
            write!(f, " {:?}", r.kind)?;
        }
        if r.freq_scale != 1.0 {
            write!(f, " scale={}", r.freq_scale)?;
        }
        if r.factors {
            write!(f, " factors")?;
        }
        if let Some(y) = r.yarn {
            write!(
                f,
                " yarn(ext={} attn={} beta={}/{} ctx={})",
                y.ext_factor, y.attn_factor, y.beta_fast, y.beta_slow, y.n_ctx_orig
            )?;
        }
        if r.far {
            write!(f, " far")?;
        }
        Ok(())
    }
}

/// The shape of a case.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// A weight `[k, n]`; `m` activation rows (matmul) or `m` gathered ids (get_rows).
    Weight {
        /// Input features (contiguous).
        k: usize,
        /// Output features (rows of the weight).
        n: usize,
        /// Activation rows / ids.
        m: usize,
    },
    /// An expert tower `[k, n, experts]`, `tokens` activation rows, `routed` output rows
    /// (a multiple of `tokens`: each token's row goes to `routed / tokens` experts).
    Tower {
        /// Input features.
        k: usize,
        /// Output features.
        n: usize,
        /// Experts.
        experts: usize,
        /// Activation rows.
        tokens: usize,
        /// Routed rows.
        routed: usize,
    },
    /// `rows` rows of `dim` values (`heads` chunks per row for per-head norms).
    Rows {
        /// Rows.
        rows: usize,
        /// Values per normalised chunk (the op's `dim`).
        dim: usize,
        /// Chunks per row (1 unless per-head).
        heads: usize,
    },
    /// A flat vector (element-wise ops).
    Flat {
        /// Elements.
        n: usize,
    },
    /// RoPE on `[rows, heads * head_dim]`.
    Rope(RopeSpec),
    /// `add_bias`: `rows` rows of `dim` values plus a bias of `dim`.
    Bias {
        /// Rows.
        rows: usize,
        /// Row length (the bias's).
        dim: usize,
    },
    /// MoE combine: `src` rows of `dim` into `dst` accumulator rows (`src` a multiple of
    /// `dst`: each token's routed rows one after another).
    Scatter {
        /// Accumulator rows.
        dst: usize,
        /// Source rows.
        src: usize,
        /// Row length.
        dim: usize,
    },
    /// `add_id`: `rows` rows of `dim`, each plus the row of a `table` of rows its id
    /// names.
    AddId {
        /// Rows.
        rows: usize,
        /// Rows of the table (experts).
        table: usize,
        /// Row length.
        dim: usize,
    },
    /// Top-k routing of `rows` rows of `experts` logits.
    Route {
        /// Rows.
        rows: usize,
        /// Experts.
        experts: usize,
        /// Chosen per row.
        k: usize,
        /// Score function.
        gating: Gating,
        /// With a selection bias.
        bias: bool,
        /// Renormalise.
        normalize: bool,
        /// Multiplier.
        scale: f32,
        /// With a per-expert output scale (Gemma 4).
        expert_scale: bool,
    },
    /// KV write + paged attention.
    Attn(AttnSpec),
    /// Gated DeltaNet convolution: `tokens` rows of `channels`, kernel width `d_conv`,
    /// a carried window; `split` > 0 runs the tokens as two calls (`split`, the rest)
    /// with the window carried between them.
    Conv {
        /// Tokens.
        tokens: usize,
        /// Channels.
        channels: usize,
        /// Kernel width.
        d_conv: usize,
        /// Tokens of the first call (0: one call).
        split: usize,
    },
    /// Gated delta rule over `tokens` tokens with a carried state; `split` as for
    /// [`Shape::Conv`].
    Delta {
        /// Tokens.
        tokens: usize,
        /// Heads and head size.
        shape: DeltaNetShape,
        /// Tokens of the first call (0: one call).
        split: usize,
    },
    /// Qwen 3.5's element-wise steps (`sigmoid`, `mul`, `deinterleave`,
    /// `delta_net_gate`, `l2_norm`) on `rows` rows of `heads` heads of `dim` values.
    Heads {
        /// Rows (tokens).
        rows: usize,
        /// Heads per row.
        heads: usize,
        /// Values per head.
        dim: usize,
    },
    /// A short chain of ops on device tensors, for the count of host-device transfers:
    /// `rms_norm` of `rows` rows of `k`, `matmul` by an F32 weight `[k, n]`, `add`,
    /// `scale`.
    Chain {
        /// Rows.
        rows: usize,
        /// Input features (the norm's `dim`).
        k: usize,
        /// Output features.
        n: usize,
    },
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Weight { k, n, m } => write!(f, "W[{k},{n}] m={m}"),
            Shape::Tower {
                k,
                n,
                experts,
                tokens,
                routed,
            } => write!(f, "W[{k},{n},{experts}] tokens={tokens} rows={routed}"),
            Shape::Rows { rows, dim, heads } => {
                if *heads > 1 {
                    write!(f, "[{rows},{heads}x{dim}] dim={dim}")
                } else {
                    write!(f, "[{rows},{dim}]")
                }
            }
            Shape::Flat { n } => write!(f, "[{n}]"),
            Shape::Rope(r) => write!(f, "{r}"),
            Shape::Bias { rows, dim } => write!(f, "[{rows},{dim}] + bias[{dim}]"),
            Shape::Scatter { dst, src, dim } => write!(f, "acc[{dst},{dim}] x[{src},{dim}]"),
            Shape::Heads { rows, heads, dim } => write!(f, "[{rows},{heads}x{dim}]"),
            Shape::AddId { rows, table, dim } => {
                write!(f, "x[{rows},{dim}] + table[{table},{dim}][ids]")
            }
            Shape::Route {
                rows,
                experts,
                k,
                gating,
                bias,
                normalize,
                scale,
                expert_scale,
            } => {
                write!(
                    f,
                    "[{rows},{experts}] k={k} {gating:?} bias={bias} norm={normalize} \
                     scale={scale}"
                )?;
                if *expert_scale {
                    write!(f, " expert-scale")?;
                }
                Ok(())
            }
            Shape::Conv {
                tokens,
                channels,
                d_conv,
                split,
            } => write!(f, "[{tokens},{channels}] d_conv={d_conv} split={split}"),
            Shape::Delta {
                tokens,
                shape,
                split,
            } => write!(
                f,
                "tokens={tokens} Hk={} Hv={} d={} split={split}",
                shape.heads_k, shape.heads_v, shape.head_dim
            ),
            Shape::Chain { rows, k, n } => write!(f, "x[{rows},{k}] W[{k},{n}]"),
            Shape::Attn(a) => {
                write!(
                    f,
                    "H={} Hkv={} dk={} dv={} bs={} seqs=",
                    a.n_heads, a.n_kv_heads, a.head_dim_k, a.head_dim_v, a.block_size
                )?;
                for (i, s) in a.seqs.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{}/{}", s.n_q, s.ctx)?;
                }
                if let Some(w) = a.window {
                    write!(f, " window={w}")?;
                }
                if a.sinks != Sinks::None {
                    write!(f, " sinks={:?}", a.sinks)?;
                }
                if a.groups > 1 {
                    write!(f, " groups={}", a.groups)?;
                }
                Ok(())
            }
        }
    }
}

/// One conformance case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The op under test (for attention cases that need `write_kv`, the op whose
    /// behaviour the case targets).
    pub op: Op,
    /// The weight's block type, for ops that take a weight.
    pub ty: Option<GgmlType>,
    /// A short name for the variant (`gqa`, `sink<max`, `per-head`, ...).
    pub label: &'static str,
    /// Shapes and parameters.
    pub shape: Shape,
    /// The seed of its random data.
    pub seed: u64,
    /// NMSE bound.
    pub tolerance: f64,
}

impl Case {
    /// `op`, `op/TYPE` or `op[label]`: how reports name the case.
    pub fn name(&self) -> String {
        let mut s = self.op.name().to_string();
        if let Some(t) = self.ty {
            s.push('/');
            s.push_str(t.name());
        }
        if !self.label.is_empty() {
            s.push('[');
            s.push_str(self.label);
            s.push(']');
        }
        s
    }

    /// The block type of the weight of `op` (an op that [takes one](Op::takes_weight))
    /// in this case: the case's type; F32 for the transfer chain's matmul.
    pub fn weight_type(&self) -> Option<GgmlType> {
        match self.shape {
            Shape::Chain { .. } => Some(GgmlType::F32),
            _ => self.ty,
        }
    }

    /// The ops a device must support for this case to run.
    pub fn required_ops(&self) -> &'static [Op] {
        if let Shape::Chain { .. } = self.shape {
            return &[Op::RmsNorm, Op::Matmul, Op::Add, Op::Scale];
        }
        match self.op {
            Op::WriteKv | Op::PagedAttention => &[Op::WriteKv, Op::PagedAttention],
            Op::Stage => &[Op::Stage],
            // Staging the weight is part of these ops: a device that claims them must
            // stage the weights they take (of that kind), whatever `supports(Stage)`
            // says about plain matrices.
            Op::Matmul => &[Op::Matmul],
            Op::MatmulGlu => &[Op::MatmulGlu],
            Op::ExpertMatmul => &[Op::ExpertMatmul],
            Op::GetRows => &[Op::GetRows],
            Op::RmsNorm => &[Op::RmsNorm],
            Op::AddRmsNorm => &[Op::AddRmsNorm],
            Op::PostNormAddRmsNorm => &[Op::PostNormAddRmsNorm],
            Op::Rope => &[Op::Rope],
            Op::NormRope => &[Op::NormRope],
            Op::SiluMul => &[Op::SiluMul],
            Op::GeluMul => &[Op::GeluMul],
            Op::SwigluOaiMul => &[Op::SwigluOaiMul],
            Op::Add => &[Op::Add],
            Op::AddBias => &[Op::AddBias],
            Op::Scale => &[Op::Scale],
            Op::AddId => &[Op::AddId],
            Op::ScatterAddWeighted => &[Op::ScatterAddWeighted],
            Op::RouteTopK => &[Op::RouteTopK],
            Op::SsmConvSilu => &[Op::SsmConvSilu],
            Op::GatedDeltaNet => &[Op::GatedDeltaNet],
            Op::Sigmoid => &[Op::Sigmoid],
            Op::Mul => &[Op::Mul],
            Op::Deinterleave => &[Op::Deinterleave],
            Op::DeltaNetGate => &[Op::DeltaNetGate],
            Op::L2Norm => &[Op::L2Norm],
            Op::Copy => &[Op::Copy],
        }
    }

    /// True when `filter` selects this case (case-insensitive): the op's name
    /// (`matmul`), a prefix of [`name`](Self::name) (`matmul/Q6_K`,
    /// `paged_attention[sink<max]`), or part of the label (`sink`, `kv-groups`).
    pub fn matches(&self, filter: &str) -> bool {
        let f = filter.to_ascii_lowercase();
        self.op.name() == f
            || self.name().to_ascii_lowercase().starts_with(&f)
            || (!self.label.is_empty() && self.label.to_ascii_lowercase().contains(&f))
    }
}

/// NMSE bounds. Matmuls follow ggml's test-backend-ops (5e-4: activations may be
/// quantized to Q8 as ggml pairs them, and float weights may be held as BF16);
/// gathers allow BF16 storage; element-wise and norm ops allow a few ulp of f32 math
/// (fast exp/tanh approximations) but nothing a logic error stays under.
pub mod tol {
    use flint_hal::GgmlType;

    /// matmul, expert_matmul on block-quantized weights.
    pub const MATMUL: f64 = 5e-4;
    /// matmul, expert_matmul on float weights: BF16 rounding of weights and
    /// activations (about 3e-6) is allowed, Q8-level error is not.
    pub const MATMUL_FLOAT: f64 = 2e-5;

    /// The matmul bound for weights of type `ty`.
    pub fn matmul(ty: GgmlType) -> f64 {
        if ty.is_quantized() {
            MATMUL
        } else {
            MATMUL_FLOAT
        }
    }
    /// get_rows.
    pub const GATHER: f64 = 1e-5;
    /// norms, rope, activations, add, scale, scatter, routing weights.
    pub const ELEMENTWISE: f64 = 1e-5;
    /// copy: exact.
    pub const EXACT: f64 = 0.0;
    /// paged attention (ggml's flash-attention bound; KV may be held as BF16/F16).
    pub const ATTENTION: f64 = 5e-4;
    /// Gated DeltaNet convolution and delta rule, outputs and carried states: f32
    /// recurrences whose rounding the decay keeps from growing; the chunked form, another
    /// float order, differs from the recurrent one by 2e-7 at most on values of 0.1-1
    /// (`core/tests/math_delta.rs`), an NMSE near 1e-13.
    pub const RECURRENT: f64 = 1e-8;
}

/// Matrix shapes per block type: `(k in blocks-units, n, m)`. Row counts and batch
/// sizes are deliberately not multiples of common tiles.
fn weight_shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    // The unit keeps float types on awkward, non-power-of-two widths too.
    let u = if ty.block_size() == 1 {
        40
    } else {
        ty.block_size().max(32)
    };
    // Small and odd; a batch above common M tiles; a wide one that spans several
    // row chunks per thread.
    vec![(2 * u, 16, 1), (3 * u, 37, 7), (u, 5, 33), (8 * u, 131, 9)]
}

/// The RoPE cases: every pairing and frequency adjustment a model family uses, with
/// GQA (queries and keys of different head counts rotated at the same positions).
fn rope_specs() -> Vec<(&'static str, RopeSpec)> {
    let gpt_oss_yarn = Yarn {
        ext_factor: 1.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    };
    vec![
        ("full", RopeSpec::neox(5, 4, 64, 64, 10000.0)),
        ("partial", RopeSpec::neox(3, 2, 48, 32, 1_000_000.0)),
        // Llama 2: adjacent pairs, 32 query heads over 8 KV heads (fewer here).
        (
            "normal-gqa",
            RopeSpec {
                kv_heads: 2,
                kind: RopeKind::Normal,
                ..RopeSpec::neox(6, 8, 64, 64, 10000.0)
            },
        ),
        (
            "normal-partial",
            RopeSpec {
                kind: RopeKind::Normal,
                ..RopeSpec::neox(4, 3, 48, 32, 10000.0)
            },
        ),
        // Llama 3.x: rope_freqs.weight divides the low frequencies.
        (
            "llama3-factors",
            RopeSpec {
                kv_heads: 1,
                kind: RopeKind::Normal,
                factors: true,
                ..RopeSpec::neox(5, 4, 128, 128, 500_000.0)
            },
        ),
        // Gemma 3's global layers: linear scaling by 8.
        (
            "linear",
            RopeSpec {
                kv_heads: 1,
                freq_scale: 0.125,
                ..RopeSpec::neox(5, 4, 256, 256, 1_000_000.0)
            },
        ),
        // gpt-oss: YaRN over a 4096-token original context, factor 32.
        (
            "yarn",
            RopeSpec {
                kv_heads: 1,
                freq_scale: 1.0 / 32.0,
                yarn: Some(gpt_oss_yarn),
                ..RopeSpec::neox(5, 8, 64, 64, 150_000.0)
            },
        ),
        (
            "yarn-normal-factors",
            RopeSpec {
                kind: RopeKind::Normal,
                freq_scale: 0.25,
                factors: true,
                yarn: Some(Yarn {
                    ext_factor: 0.5,
                    attn_factor: 0.8,
                    ..gpt_oss_yarn
                }),
                ..RopeSpec::neox(4, 2, 80, 64, 10000.0)
            },
        ),
        // A magnitude factor alone (YaRN's attn_factor without extrapolation).
        (
            "attn-factor",
            RopeSpec {
                freq_scale: 0.5,
                yarn: Some(Yarn {
                    ext_factor: 0.0,
                    attn_factor: 1.25,
                    ..gpt_oss_yarn
                }),
                ..RopeSpec::neox(3, 2, 32, 32, 10000.0)
            },
        ),
        // Long contexts: at positions in the tens of thousands an angle computed in
        // another order than ggml's drifts by a few ulp of the position, which these
        // cases see.
        (
            "far",
            RopeSpec {
                kv_heads: 2,
                far: true,
                ..RopeSpec::neox(8, 4, 64, 64, 1_000_000.0)
            },
        ),
        (
            "far-yarn",
            RopeSpec {
                kind: RopeKind::Normal,
                freq_scale: 1.0 / 32.0,
                yarn: Some(gpt_oss_yarn),
                far: true,
                ..RopeSpec::neox(8, 4, 64, 64, 150_000.0)
            },
        ),
    ]
}

/// Every case of the suite, with seeds derived from `master_seed`.
pub fn all_cases(master_seed: u64) -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    let mut push = |op: Op, ty: Option<GgmlType>, label: &'static str, shape: Shape, tol: f64| {
        let mut c = Case {
            op,
            ty,
            label,
            shape,
            seed: 0,
            tolerance: tol,
        };
        c.seed = case_seed(master_seed, &format!("{} {}", c.name(), c.shape));
        v.push(c);
    };

    for ty in GgmlType::DEQUANTIZABLE {
        let u = if ty.block_size() == 1 {
            40
        } else {
            ty.block_size().max(32)
        };
        push(
            Op::Stage,
            Some(ty),
            "",
            Shape::Weight {
                k: 2 * u,
                n: 3,
                m: 0,
            },
            0.0,
        );
        for (k, n, m) in weight_shapes(ty) {
            push(
                Op::Matmul,
                Some(ty),
                "",
                Shape::Weight { k, n, m },
                tol::matmul(ty),
            );
        }
        push(
            Op::Matmul,
            Some(ty),
            "tied",
            Shape::Weight {
                k: 2 * u,
                n: 50,
                m: 3,
            },
            tol::matmul(ty),
        );
        // Several weights on one input (`matmul_multi`): one decode row, a few, and a
        // prompt batch (its input quantized once for all the weights).
        for m in [1, 4, 17] {
            push(
                Op::Matmul,
                Some(ty),
                "multi",
                Shape::Weight { k: 3 * u, n: 37, m },
                tol::matmul(ty),
            );
        }
        // A gated MLP's first half (`matmul_glu`): a few rows, and a prompt batch (the
        // CPU backend's fused gemm from 64 rows).
        for m in [3, 70] {
            push(
                Op::MatmulGlu,
                Some(ty),
                "",
                Shape::Weight { k: 3 * u, n: 37, m },
                tol::matmul(ty),
            );
        }
        push(
            Op::ExpertMatmul,
            Some(ty),
            "",
            Shape::Tower {
                k: 2 * u,
                n: 9,
                experts: 4,
                tokens: 3,
                routed: 6,
            },
            tol::matmul(ty),
        );
        push(
            Op::GetRows,
            Some(ty),
            "",
            Shape::Weight {
                k: 2 * u,
                n: 11,
                m: 6,
            },
            tol::GATHER,
        );
    }

    let e = tol::ELEMENTWISE;
    push(
        Op::RmsNorm,
        None,
        "weighted",
        Shape::Rows {
            rows: 4,
            dim: 96,
            heads: 1,
        },
        e,
    );
    push(
        Op::RmsNorm,
        None,
        "no-weight",
        Shape::Rows {
            rows: 3,
            dim: 257,
            heads: 1,
        },
        e,
    );
    // Regression: per-head norm over q laid out [rows, heads*head_dim]; heads of very
    // different magnitudes, so a head normalised with anything but its own values shows.
    push(
        Op::RmsNorm,
        None,
        "per-head",
        Shape::Rows {
            rows: 3,
            dim: 16,
            heads: 8,
        },
        e,
    );
    // Regression: a live residual buffer must get `delta` exactly once.
    push(
        Op::AddRmsNorm,
        None,
        "residual",
        Shape::Rows {
            rows: 4,
            dim: 128,
            heads: 1,
        },
        e,
    );
    // Gemma's sandwich norms: more rows than a task takes, a width that is not a
    // multiple of 16.
    push(
        Op::PostNormAddRmsNorm,
        None,
        "residual",
        Shape::Rows {
            rows: 37,
            dim: 120,
            heads: 1,
        },
        e,
    );
    for (label, spec) in rope_specs() {
        push(Op::Rope, None, label, Shape::Rope(spec), e);
        push(Op::NormRope, None, label, Shape::Rope(spec), e);
    }
    push(Op::SiluMul, None, "", Shape::Flat { n: 1003 }, e);
    push(Op::GeluMul, None, "", Shape::Flat { n: 1003 }, e);
    push(Op::SwigluOaiMul, None, "", Shape::Flat { n: 1003 }, e);
    push(Op::Add, None, "", Shape::Flat { n: 1003 }, e);
    // Qwen 2's q/k/v biases on a prompt batch and on one decode row; an odd width.
    push(Op::AddBias, None, "", Shape::Bias { rows: 7, dim: 96 }, e);
    push(
        Op::AddBias,
        None,
        "decode",
        Shape::Bias { rows: 1, dim: 40 },
        e,
    );
    push(
        Op::AddBias,
        None,
        "odd",
        Shape::Bias { rows: 5, dim: 37 },
        e,
    );
    push(Op::Scale, None, "", Shape::Flat { n: 1003 }, e);
    push(
        Op::ScatterAddWeighted,
        None,
        "",
        Shape::Scatter {
            dst: 5,
            src: 15,
            dim: 72,
        },
        e,
    );
    // A decode step's combine: one token, its 8 experts.
    push(
        Op::ScatterAddWeighted,
        None,
        "decode",
        Shape::Scatter {
            dst: 1,
            src: 8,
            dim: 40,
        },
        e,
    );
    // gpt-oss's expert biases on a prefill's routed rows; an odd width.
    push(
        Op::AddId,
        None,
        "",
        Shape::AddId {
            rows: 12,
            table: 5,
            dim: 37,
        },
        e,
    );
    push(
        Op::RouteTopK,
        None,
        "sigmoid+bias",
        Shape::Route {
            rows: 7,
            experts: 16,
            k: 4,
            gating: Gating::Sigmoid,
            bias: true,
            normalize: true,
            scale: 2.5,
            expert_scale: false,
        },
        e,
    );
    push(
        Op::RouteTopK,
        None,
        "softmax",
        Shape::Route {
            rows: 5,
            experts: 8,
            k: 2,
            gating: Gating::Softmax,
            bias: false,
            normalize: false,
            scale: 1.0,
            expert_scale: false,
        },
        e,
    );
    // Gemma 4: softmax routing, renormalised, each weight times its expert's scale.
    push(
        Op::RouteTopK,
        None,
        "expert-scale",
        Shape::Route {
            rows: 5,
            experts: 16,
            k: 4,
            gating: Gating::Softmax,
            bias: false,
            normalize: true,
            scale: 1.0,
            expert_scale: true,
        },
        e,
    );
    // gpt-oss: top-4 of 32 on the raw logits, the softmax over the chosen ones.
    push(
        Op::RouteTopK,
        None,
        "softmax-weight",
        Shape::Route {
            rows: 5,
            experts: 32,
            k: 4,
            gating: Gating::SoftmaxWeight,
            bias: false,
            normalize: false,
            scale: 1.0,
            expert_scale: false,
        },
        e,
    );
    push(
        Op::RouteTopK,
        None,
        "wide",
        Shape::Route {
            rows: 3,
            experts: 64,
            k: 8,
            gating: Gating::Sigmoid,
            bias: false,
            normalize: true,
            scale: 1.0,
            expert_scale: false,
        },
        e,
    );

    // Qwen 3.5's gates and norms around the delta rule: a prompt's rows and one decode
    // row; `mul` by a same-length tensor (the gated attention) and by one value per row
    // (the shared expert's gate).
    for (label, rows) in [("", 7), ("decode", 1)] {
        let heads = Shape::Heads {
            rows,
            heads: 4,
            dim: 24,
        };
        for op in [Op::Sigmoid, Op::Deinterleave, Op::DeltaNetGate, Op::L2Norm] {
            push(op, None, label, heads.clone(), e);
        }
        push(Op::Mul, None, label, heads.clone(), e);
    }
    push(
        Op::Mul,
        None,
        "per-row",
        Shape::Heads {
            rows: 5,
            heads: 1,
            dim: 40,
        },
        e,
    );
    // Gated DeltaNet (Qwen 3.5): the convolution on a prompt, a decode step and a prompt
    // in two calls; the delta rule likewise, past one 64-token chunk, with two value
    // heads per key head, and a head size with a scalar tail.
    let r = tol::RECURRENT;
    for (label, tokens, split) in [("prefill", 9, 0), ("decode", 1, 0), ("split", 9, 2)] {
        let shape = Shape::Conv {
            tokens,
            channels: 40,
            d_conv: 4,
            split,
        };
        push(Op::SsmConvSilu, None, label, shape, r);
    }
    let dn = |heads_k, heads_v, head_dim| DeltaNetShape {
        heads_k,
        heads_v,
        head_dim,
    };
    for (label, tokens, shape, split) in [
        ("prefill", 70, dn(2, 4, 32), 0),
        ("decode", 1, dn(2, 4, 32), 0),
        ("split", 70, dn(2, 4, 32), 29),
        ("tail", 3, dn(1, 1, 36), 0),
    ] {
        let shape = Shape::Delta {
            tokens,
            shape,
            split,
        };
        push(Op::GatedDeltaNet, None, label, shape, r);
    }

    let base = AttnSpec {
        n_heads: 4,
        n_kv_heads: 4,
        head_dim_k: 32,
        head_dim_v: 32,
        block_size: 16,
        seqs: vec![SeqSpec { ctx: 20, n_q: 20 }],
        window: None,
        sinks: Sinks::None,
        sharpness: 1.0,
        drop_old_blocks: false,
        groups: 1,
        overwrite: false,
    };
    let a = tol::ATTENTION;
    let attn = |f: &dyn Fn(&mut AttnSpec)| {
        let mut s = base.clone();
        f(&mut s);
        Shape::Attn(s)
    };
    push(
        Op::WriteKv,
        None,
        "scatter+overwrite",
        attn(&|s| {
            s.seqs = vec![SeqSpec { ctx: 23, n_q: 3 }, SeqSpec { ctx: 9, n_q: 2 }];
            s.block_size = 4;
            s.overwrite = true;
        }),
        a,
    );
    push(Op::PagedAttention, None, "prefill", attn(&|_| {}), a);
    push(
        Op::PagedAttention,
        None,
        "gqa-decode",
        attn(&|s| {
            s.n_heads = 8;
            s.n_kv_heads = 2;
            s.head_dim_k = 64;
            s.head_dim_v = 64;
            s.seqs = vec![SeqSpec { ctx: 37, n_q: 1 }];
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "dv!=dk",
        attn(&|s| {
            s.n_heads = 6;
            s.n_kv_heads = 3;
            s.head_dim_k = 40;
            s.head_dim_v = 24;
            s.block_size = 8;
            s.seqs = vec![SeqSpec { ctx: 19, n_q: 4 }];
        }),
        a,
    );
    // Regression: sinks below the score maximum expose an `exp(0)` sink seed.
    push(
        Op::PagedAttention,
        None,
        "sink<max",
        attn(&|s| {
            s.n_kv_heads = 2;
            s.sinks = Sinks::BelowMax;
            s.sharpness = 6.0;
            s.seqs = vec![SeqSpec { ctx: 24, n_q: 4 }, SeqSpec { ctx: 7, n_q: 1 }];
            s.block_size = 8;
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "sink>max",
        attn(&|s| {
            s.n_kv_heads = 2;
            s.sinks = Sinks::AboveMax;
            s.seqs = vec![SeqSpec { ctx: 12, n_q: 3 }];
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "window",
        attn(&|s| {
            s.window = Some(8);
            s.block_size = 4;
            s.sharpness = 3.0;
            s.seqs = vec![SeqSpec { ctx: 50, n_q: 5 }];
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "window+no-block+sinks",
        attn(&|s| {
            s.n_heads = 8;
            s.n_kv_heads = 2;
            s.window = Some(6);
            s.block_size = 4;
            s.sinks = Sinks::BelowMax;
            s.sharpness = 3.0;
            s.drop_old_blocks = true;
            s.seqs = vec![SeqSpec { ctx: 41, n_q: 2 }, SeqSpec { ctx: 30, n_q: 1 }];
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "multi-seq",
        attn(&|s| {
            s.n_heads = 4;
            s.n_kv_heads = 1;
            s.block_size = 4;
            s.seqs = vec![
                SeqSpec { ctx: 30, n_q: 1 },
                SeqSpec { ctx: 13, n_q: 13 },
                SeqSpec { ctx: 5, n_q: 2 },
                SeqSpec { ctx: 1, n_q: 1 },
            ];
        }),
        a,
    );
    // Long contexts: many blocks per sequence, so key chunking and block lookups in a
    // tiled kernel are exercised.
    push(
        Op::PagedAttention,
        None,
        "long",
        attn(&|s| {
            s.n_heads = 8;
            s.n_kv_heads = 2;
            s.head_dim_k = 64;
            s.head_dim_v = 64;
            s.sinks = Sinks::BelowMax;
            s.sharpness = 2.0;
            s.seqs = vec![SeqSpec { ctx: 300, n_q: 3 }, SeqSpec { ctx: 129, n_q: 1 }];
        }),
        a,
    );
    push(
        Op::PagedAttention,
        None,
        "long-window+no-block",
        attn(&|s| {
            s.n_heads = 4;
            s.n_kv_heads = 2;
            s.head_dim_k = 64;
            s.head_dim_v = 64;
            s.window = Some(128);
            s.drop_old_blocks = true;
            s.sharpness = 2.0;
            s.seqs = vec![SeqSpec { ctx: 400, n_q: 2 }, SeqSpec { ctx: 140, n_q: 16 }];
        }),
        a,
    );
    // Regression: two KV groups whose pools hand out different block ids for the same
    // positions; each must be written through its own slot mapping.
    push(
        Op::PagedAttention,
        None,
        "kv-groups",
        attn(&|s| {
            s.n_kv_heads = 2;
            s.block_size = 4;
            s.groups = 2;
            s.sharpness = 2.0;
            s.seqs = vec![SeqSpec { ctx: 14, n_q: 2 }, SeqSpec { ctx: 9, n_q: 9 }];
        }),
        a,
    );

    // Device-side copies, checked bit for bit: a whole tensor; sub-ranges at offsets
    // between two tensors; disjoint sub-ranges of one tensor, both ways, the second
    // reading what the first wrote.
    for label in ["whole", "between", "within"] {
        push(Op::Copy, None, label, Shape::Flat { n: 1003 }, tol::EXACT);
    }
    // Host-device traffic: inputs uploaded once, a chain of ops on device tensors that
    // moves nothing between host and device, the result downloaded once; each upload
    // and download of n values one call of 4n bytes.
    push(
        Op::Copy,
        None,
        "transfers",
        Shape::Chain {
            rows: 3,
            k: 64,
            n: 40,
        },
        tol::MATMUL_FLOAT,
    );
    v
}
