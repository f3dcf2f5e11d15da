//! Synthetic checkpoints of the mixture-of-experts families llama.cpp runs: `qwen3moe`,
//! `glm4moe`, `mimo2`, `gpt-oss` (`flint synth --arch A`).
//!
//! Each file carries the keys, tensor names and shapes llama.cpp's converter writes for
//! the family (`conversion/{qwen,glm,mimo,gpt_oss}.py`), so llama.cpp loads it unchanged and
//! `llama-quantize` re-encodes it. Presets ([`MoeRecipe::of`]):
//! - `tiny` (every family): d = 256, f32 weights, expert and feed-forward widths of 256
//!   or 512 (whole 256-blocks, so `llama-quantize` makes real K-quants), and each
//!   family's features on, each visible in the logits:
//!   - `qwen3moe`: 3 layers, 4 heads of 128 with 2 KV heads, per-head QK norm, 8 experts
//!     of 256, top-4 by softmax over all 8, the chosen weights renormalised; untied output.
//!   - `glm4moe`: 3 layers (the first dense, width 512), 4 heads of 64 with 2 KV heads,
//!     partial RoPE (32 of 64 dims), q/k/v biases, 8 experts of 256, top-2 by sigmoid with
//!     a selection bias (`exp_probs_b`), the weights renormalised and scaled by 2.5, one
//!     shared expert of 256; untied output. Built-in byte-level BPE vocabulary written with
//!     `tokenizer.ggml.pre = glm4` (the converter's pre-tokenizer for GLM-4.5; the sdist
//!     has no GLM vocabulary).
//!   - `mimo2`: 4 layers [full, sliding, sliding, full], the first dense (width 512),
//!     window 64, 4 query heads, KV heads 1 on full and 2 on sliding layers (an array, as
//!     the converter writes), key heads of 96 and value heads of 64, partial RoPE (32 of
//!     96), RoPE base 5e6 on full and 1e4 on sliding layers, attention sinks on the
//!     sliding layers only, value scale 0.707, 8 experts of 256, top-2 by sigmoid with a
//!     selection bias; untied output.
//!   - `gpt-oss`: 4 layers [sliding, full, sliding, full] (llama.cpp's default period 2;
//!     the converter writes no pattern), window 64, 4 heads of 64 with 2 KV heads, sinks
//!     on every layer, q/k/v/o biases, YaRN (factor 32 over an original context of
//!     4096, as gpt-oss) on every layer, 8 experts of 256, top-4 on the raw router
//!     logits plus the router bias, weighted by the softmax over the chosen four, expert
//!     biases, the expert gate and up projections 4x larger than elsewhere so that the
//!     clamp at 7 of the SwiGLU variant bites; untied output.
//! - `tiny-nextn` (glm4moe, mimo2): `tiny` plus one NextN/MTP block as a converted file
//!   carries it (`nextn_predict_layers = 1`, `block_count` one more, the block's decoder
//!   tensors and `nextn.*`; mimo2's with a fused `attn_qkv`, a dense FFN and
//!   `layer_output_norm`, and the pattern and KV-head arrays extended as the converter
//!   extends them). llama.cpp skips the block unless asked for MTP.
//! - `tiny-bias` (qwen3moe, which has no NextN block): `tiny` plus q/k/v biases, which
//!   llama.cpp's loader accepts for every family.
//! - `bench` (every family): a real model's per-layer shapes with fewer layers and a
//!   Q4_K_M-like type mix: Qwen3-30B-A3B (d 2048, 32 heads of 128, 4 KV heads, 128
//!   experts of 768, top-8; 4 layers, 2.5B parameters), GLM-4.5-Air (d 4096, 96 heads
//!   of 128, 8 KV heads, partial RoPE 64, 128 experts of 1408, top-8, one shared expert;
//!   2 layers: the dense first one of 10944 and one MoE layer, 2.6B), MiMo-V2-Flash
//!   (d 4096, 64 heads, dk 192, dv 128, KV heads 4 full / 8 sliding, window 128, 256
//!   experts of 2048, top-8; 2 layers: the dense full first one of 16384 and one sliding
//!   MoE layer, 7.1B: one MoE layer of MiMo-V2-Flash alone has 6.4B); gpt-oss-20b (d
//!   2880, 64 heads of 64, 8 KV heads, window 128, 32 experts of 2880, top-4; 2 layers,
//!   a sliding and a full one, 1.7B) with `llama-quantize`'s MXFP4_MOE mix instead: the
//!   experts MXFP4, the other matrices Q8_0.
//! - `full` (qwen3moe): Qwen3-30B-A3B whole, the `bench` layers 48 times, with Qwen3's
//!   vocabulary size (151,936 built-in tokens, or `--vocab ggml-vocab-qwen2.gguf
//!   --vocab-size 151936` for the real Qwen2/3 tokenizer and its chat template, also
//!   151,936 tokens): 30,532,122,624 parameters, 19.8 GB (18.45 GiB) at the same mix.
//!   Its quantized matrices are drawn block by block from pools of quantized random
//!   blocks (`Fill::Pooled`, same spread), since quantizing 30 billion values one by one
//!   takes hours on two cores; `flint synth` streams it to disk (`SynthFile::write`) in
//!   about two minutes and half a gigabyte of memory.

use flint_core::GgmlType;
use flint_loader::gguf::{Array, GgufWriter, Value};
use flint_loader::tokenizer::PreTokenizer;

use super::dense::{VocabSource, OUTPUT_GAIN};
use super::vocab::tokenizer_entries;
use super::{
    begin_file, file_type, finish_file, matrix_type, plan_layout, plan_params, Fill, Planned,
    SynthError, SynthFile,
};

/// A MoE family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeFamily {
    /// `qwen3moe`.
    Qwen3Moe,
    /// `glm4moe`.
    Glm4Moe,
    /// `mimo2`.
    Mimo2,
    /// `gpt-oss`.
    GptOss,
}

impl MoeFamily {
    /// Every family, in the order the CLI lists them.
    pub const ALL: [MoeFamily; 4] = [
        MoeFamily::Qwen3Moe,
        MoeFamily::Glm4Moe,
        MoeFamily::Mimo2,
        MoeFamily::GptOss,
    ];

    /// Parses a `general.architecture` name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.arch() == name)
    }

    /// The `general.architecture` value (and key prefix).
    pub fn arch(self) -> &'static str {
        match self {
            MoeFamily::Qwen3Moe => "qwen3moe",
            MoeFamily::Glm4Moe => "glm4moe",
            MoeFamily::Mimo2 => "mimo2",
            MoeFamily::GptOss => "gpt-oss",
        }
    }

    /// The presets of this family.
    pub fn presets(self) -> &'static [&'static str] {
        match self {
            MoeFamily::Qwen3Moe => &["tiny", "tiny-bias", "bench", "full"],
            MoeFamily::GptOss => &["tiny", "bench"],
            _ => &["tiny", "tiny-nextn", "bench"],
        }
    }

    /// `tokenizer.ggml.pre` of the built-in vocabulary: the converter's for the family
    /// (Qwen3 and MiMo use Qwen2's tokenizer; GLM-4.5 `glm4`; gpt-oss o200k's `gpt-4o`).
    pub fn builtin_pre(self) -> PreTokenizer {
        match self {
            MoeFamily::Glm4Moe => PreTokenizer::Glm4,
            MoeFamily::GptOss => PreTokenizer::Gpt4o,
            _ => PreTokenizer::Qwen2,
        }
    }
}

/// The hyper-parameters of a MoE preset.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeRecipe {
    /// The family.
    pub family: MoeFamily,
    /// The preset's name.
    pub preset: &'static str,
    /// Hidden size.
    pub d: usize,
    /// Trunk layers (the NextN block comes on top).
    pub n_layers: usize,
    /// NextN/MTP blocks (0 or 1).
    pub nextn: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads of full-attention layers.
    pub n_kv_heads: usize,
    /// KV heads of sliding layers (mimo2).
    pub n_kv_heads_swa: usize,
    /// Key (and query) head size.
    pub head_dim_k: usize,
    /// Value head size.
    pub head_dim_v: usize,
    /// Rotated dims.
    pub n_rot: usize,
    /// Dense feed-forward width (`feed_forward_length`).
    pub ff: usize,
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub used: usize,
    /// Expert width.
    pub expert_ff: usize,
    /// One shared expert (glm4moe).
    pub shared: bool,
    /// Leading dense layers.
    pub leading_dense: usize,
    /// `expert_weights_scale` (glm4moe).
    pub weights_scale: f32,
    /// `context_length`.
    pub context_length: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base (full layers).
    pub rope_base: f32,
    /// RoPE base of sliding layers (mimo2).
    pub rope_base_swa: f32,
    /// Sliding window (mimo2).
    pub window: usize,
    /// Sliding layers of the trunk (mimo2).
    pub pattern: Vec<bool>,
    /// `attention.value_scale` (mimo2).
    pub value_scale: Option<f32>,
    /// Q/K/V biases.
    pub qkv_bias: bool,
    /// YaRN rope scaling: `(factor, original context length)` (gpt-oss).
    pub yarn: Option<(f32, usize)>,
    /// Gain of the expert gate and up projections (`Fill::matrix`).
    pub expert_gain: f32,
    /// Size of the built-in vocabulary.
    pub builtin_vocab: usize,
    /// Q4_K_M-like type mix; false: every tensor f32.
    pub quantized: bool,
    /// Quantized matrices drawn block by block from pools of quantized blocks
    /// (`Fill::Pooled`) instead of quantized value by value (the `full` preset).
    pub pooled: bool,
}

impl MoeRecipe {
    /// The recipe of `preset` for `family`, if the family has that preset.
    pub fn of(family: MoeFamily, preset: &str) -> Option<Self> {
        let base = Self {
            family,
            preset: "tiny",
            d: 256,
            n_layers: 3,
            nextn: 0,
            n_heads: 4,
            n_kv_heads: 2,
            n_kv_heads_swa: 2,
            head_dim_k: 64,
            head_dim_v: 64,
            n_rot: 64,
            ff: 512,
            experts: 8,
            used: 2,
            expert_ff: 256,
            shared: false,
            leading_dense: 0,
            weights_scale: 1.0,
            context_length: 8192,
            eps: 1e-6,
            rope_base: 1_000_000.0,
            rope_base_swa: 10_000.0,
            window: 0,
            pattern: vec![],
            value_scale: None,
            qkv_bias: false,
            yarn: None,
            expert_gain: 1.0,
            builtin_vocab: 2048,
            quantized: false,
            pooled: false,
        };
        let tiny = match family {
            MoeFamily::Qwen3Moe => Self {
                head_dim_k: 128,
                head_dim_v: 128,
                n_rot: 128,
                ff: 768,
                used: 4,
                context_length: 40_960,
                ..base.clone()
            },
            MoeFamily::Glm4Moe => Self {
                n_rot: 32,
                shared: true,
                leading_dense: 1,
                weights_scale: 2.5,
                context_length: 131_072,
                eps: 1e-5,
                qkv_bias: true,
                ..base.clone()
            },
            MoeFamily::Mimo2 => Self {
                n_layers: 4,
                n_kv_heads: 1,
                n_kv_heads_swa: 2,
                head_dim_k: 96,
                head_dim_v: 64,
                n_rot: 32,
                leading_dense: 1,
                context_length: 262_144,
                eps: 1e-5,
                rope_base: 5_000_000.0,
                window: 64,
                pattern: vec![false, true, true, false],
                value_scale: Some(0.707),
                ..base.clone()
            },
            MoeFamily::GptOss => Self {
                n_layers: 4,
                used: 4,
                context_length: 131_072,
                eps: 1e-5,
                rope_base: 150_000.0,
                window: 64,
                qkv_bias: true,
                yarn: Some((32.0, 4096)),
                expert_gain: 4.0,
                ..base.clone()
            },
        };
        let r = match (family, preset) {
            (_, "tiny") => tiny,
            (MoeFamily::Qwen3Moe, "tiny-bias") => Self {
                preset: "tiny-bias",
                qkv_bias: true,
                ..tiny
            },
            (MoeFamily::Glm4Moe | MoeFamily::Mimo2, "tiny-nextn") => Self {
                preset: "tiny-nextn",
                nextn: 1,
                ..tiny
            },
            (_, "bench") => Self::bench(family, base),
            // Qwen3-30B-A3B whole: the bench preset's layers, all 48 of them, and Qwen3's
            // vocabulary size (the embedding and output rows of the real model).
            (MoeFamily::Qwen3Moe, "full") => Self {
                preset: "full",
                n_layers: 48,
                builtin_vocab: 151_936,
                pooled: true,
                ..Self::bench(family, base)
            },
            _ => return None,
        };
        Some(r)
    }

    fn bench(family: MoeFamily, base: Self) -> Self {
        let b = Self {
            preset: "bench",
            n_layers: 4,
            builtin_vocab: 32_000,
            quantized: true,
            ..base
        };
        match family {
            // Qwen3-30B-A3B.
            MoeFamily::Qwen3Moe => Self {
                d: 2048,
                n_heads: 32,
                n_kv_heads: 4,
                head_dim_k: 128,
                head_dim_v: 128,
                n_rot: 128,
                ff: 6144,
                experts: 128,
                used: 8,
                expert_ff: 768,
                context_length: 40_960,
                ..b
            },
            // GLM-4.5-Air.
            MoeFamily::Glm4Moe => Self {
                d: 4096,
                n_heads: 96,
                n_kv_heads: 8,
                head_dim_k: 128,
                head_dim_v: 128,
                n_rot: 64,
                ff: 10_944,
                experts: 128,
                used: 8,
                n_layers: 2,
                expert_ff: 1408,
                shared: true,
                leading_dense: 1,
                weights_scale: 1.0,
                context_length: 131_072,
                eps: 1e-5,
                qkv_bias: true,
                ..b
            },
            // MiMo-V2-Flash.
            MoeFamily::Mimo2 => Self {
                d: 4096,
                n_heads: 64,
                n_kv_heads: 4,
                n_kv_heads_swa: 8,
                head_dim_k: 192,
                head_dim_v: 128,
                n_rot: 64,
                ff: 16_384,
                experts: 256,
                used: 8,
                expert_ff: 2048,
                leading_dense: 1,
                context_length: 262_144,
                eps: 1e-5,
                rope_base: 5_000_000.0,
                n_layers: 2,
                window: 128,
                pattern: vec![false, true],
                value_scale: Some(0.707),
                ..b
            },
            // gpt-oss-20b.
            MoeFamily::GptOss => Self {
                d: 2880,
                n_heads: 64,
                n_kv_heads: 8,
                n_kv_heads_swa: 8,
                head_dim_k: 64,
                head_dim_v: 64,
                n_rot: 64,
                ff: 2880,
                experts: 32,
                used: 4,
                expert_ff: 2880,
                context_length: 131_072,
                eps: 1e-5,
                rope_base: 150_000.0,
                n_layers: 2,
                window: 128,
                qkv_bias: true,
                yarn: Some((32.0, 4096)),
                ..b
            },
        }
    }

    /// `general.name` of the file.
    pub fn model_name(&self) -> String {
        format!("flint-synth-{}-{}", self.family.arch(), self.preset)
    }

    /// Blocks in the file (`block_count`): the trunk and the NextN block.
    pub fn block_count(&self) -> usize {
        self.n_layers + self.nextn
    }

    /// Whether block `il` (the NextN block included, always sliding) is a sliding layer.
    fn sliding(&self, il: usize) -> bool {
        match self.family {
            MoeFamily::Mimo2 => self.pattern.get(il).copied().unwrap_or(true),
            // llama.cpp's default pattern for gpt-oss (period 2), which the recipes follow.
            MoeFamily::GptOss => il.is_multiple_of(2),
            _ => false,
        }
    }

    /// KV heads of block `il`.
    pub fn kv_heads(&self, il: usize) -> usize {
        if self.sliding(il) {
            self.n_kv_heads_swa
        } else {
            self.n_kv_heads
        }
    }

    /// `general.file_type`: 0 (all f32), 15 (mostly Q4_K_M) or, for gpt-oss, 38
    /// (llama.cpp's `MOSTLY_MXFP4_MOE`).
    pub fn file_type(&self) -> u32 {
        if self.quantized && self.family == MoeFamily::GptOss {
            38
        } else {
            file_type(self.quantized)
        }
    }

    fn matrix_type(&self, row: usize, hi: bool) -> GgmlType {
        if self.quantized && self.family == MoeFamily::GptOss {
            GgmlType::Q8_0
        } else {
            matrix_type(self.quantized, row, hi)
        }
    }

    /// The encoding of an expert tower: MXFP4 in a quantized gpt-oss file.
    fn expert_type(&self, row: usize, hi: bool) -> GgmlType {
        if self.quantized && self.family == MoeFamily::GptOss {
            GgmlType::MXFP4
        } else {
            self.matrix_type(row, hi)
        }
    }

    fn plan(&self, n_vocab: usize) -> Vec<Planned> {
        let mut v = Vec::new();
        let mut add = |name, ty, dims, fill| v.push(Planned::new(name, ty, dims, fill));
        let f32_ = GgmlType::F32;
        let normal = |std: f32| Fill::Normal { mean: 0.0, std };
        let (d, h, dk, dv) = (self.d, self.n_heads, self.head_dim_k, self.head_dim_v);
        let (e, fe, ff) = (self.experts, self.expert_ff, self.ff);
        let mat = |row: usize, hi: bool| self.matrix_type(row, hi);
        let exp = |row: usize, hi: bool| self.expert_type(row, hi);
        let gpt_oss = self.family == MoeFamily::GptOss;
        add(
            "token_embd.weight".into(),
            mat(d, false),
            vec![d, n_vocab],
            normal(1.0),
        );
        for il in 0..self.block_count() {
            let p = |s: &str| format!("blk.{il}.{s}");
            let nextn = il >= self.n_layers;
            let hkv = self.kv_heads(il);
            let (q, kd, vd) = (h * dk, hkv * dk, hkv * dv);
            add(p("attn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            if nextn && self.family == MoeFamily::Mimo2 {
                add(
                    p("attn_qkv.weight"),
                    mat(d, false),
                    vec![d, q + kd + vd],
                    Fill::matrix(d, 1.0),
                );
            } else {
                add(
                    p("attn_q.weight"),
                    mat(d, false),
                    vec![d, q],
                    Fill::matrix(d, 1.0),
                );
                add(
                    p("attn_k.weight"),
                    mat(d, false),
                    vec![d, kd],
                    Fill::matrix(d, 1.0),
                );
                add(
                    p("attn_v.weight"),
                    mat(d, true),
                    vec![d, vd],
                    Fill::matrix(d, 1.0),
                );
            }
            if self.qkv_bias {
                for (name, n) in [("attn_q.bias", q), ("attn_k.bias", kd), ("attn_v.bias", vd)] {
                    add(p(name), f32_, vec![n], normal(0.5));
                }
            }
            if self.family == MoeFamily::Qwen3Moe {
                add(p("attn_q_norm.weight"), f32_, vec![dk], Fill::norm(1.0));
                add(p("attn_k_norm.weight"), f32_, vec![dk], Fill::norm(1.0));
            }
            add(
                p("attn_output.weight"),
                mat(h * dv, false),
                vec![h * dv, d],
                Fill::matrix(h * dv, 1.0),
            );
            if gpt_oss {
                add(p("attn_output.bias"), f32_, vec![d], normal(0.5));
            }
            // Sinks on the sliding layers only (MiMo-V2's
            // `add_swa_attention_sink_bias`; gpt-oss on every layer), large enough to
            // take visible weight.
            if self.sliding(il) || gpt_oss {
                add(
                    p("attn_sinks.weight"),
                    f32_,
                    vec![h],
                    Fill::Normal {
                        mean: 1.0,
                        std: 1.0,
                    },
                );
            }
            let norm = if matches!(self.family, MoeFamily::Glm4Moe | MoeFamily::GptOss) {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            };
            add(p(norm), f32_, vec![d], Fill::norm(1.0));
            // mimo2's NextN block has a dense FFN (llama.cpp's MTP graph asserts it).
            let dense = il < self.leading_dense || (nextn && self.family == MoeFamily::Mimo2);
            if dense {
                add(
                    p("ffn_gate.weight"),
                    mat(d, false),
                    vec![d, ff],
                    Fill::matrix(d, 1.0),
                );
                add(
                    p("ffn_up.weight"),
                    mat(d, false),
                    vec![d, ff],
                    Fill::matrix(d, 1.0),
                );
                add(
                    p("ffn_down.weight"),
                    mat(ff, true),
                    vec![ff, d],
                    Fill::matrix(ff, 1.0),
                );
            } else {
                // Router logits of spread ~2, so the routing is decided, not a coin toss.
                add(
                    p("ffn_gate_inp.weight"),
                    f32_,
                    vec![d, e],
                    Fill::matrix(d, 2.0),
                );
                match self.family {
                    MoeFamily::Qwen3Moe => {}
                    MoeFamily::GptOss => {
                        add(p("ffn_gate_inp.bias"), f32_, vec![e], normal(0.5));
                    }
                    _ => add(p("exp_probs_b.bias"), f32_, vec![e], normal(0.2)),
                }
                add(
                    p("ffn_gate_exps.weight"),
                    exp(d, false),
                    vec![d, fe, e],
                    Fill::matrix(d, self.expert_gain),
                );
                add(
                    p("ffn_up_exps.weight"),
                    exp(d, false),
                    vec![d, fe, e],
                    Fill::matrix(d, self.expert_gain),
                );
                add(
                    p("ffn_down_exps.weight"),
                    exp(fe, true),
                    vec![fe, d, e],
                    Fill::matrix(fe, 1.0),
                );
                if gpt_oss {
                    add(p("ffn_gate_exps.bias"), f32_, vec![fe, e], normal(0.5));
                    add(p("ffn_up_exps.bias"), f32_, vec![fe, e], normal(0.5));
                    add(p("ffn_down_exps.bias"), f32_, vec![d, e], normal(0.5));
                }
                if self.shared {
                    add(
                        p("ffn_gate_shexp.weight"),
                        mat(d, false),
                        vec![d, fe],
                        Fill::matrix(d, 1.0),
                    );
                    add(
                        p("ffn_up_shexp.weight"),
                        mat(d, false),
                        vec![d, fe],
                        Fill::matrix(d, 1.0),
                    );
                    add(
                        p("ffn_down_shexp.weight"),
                        mat(fe, true),
                        vec![fe, d],
                        Fill::matrix(fe, 1.0),
                    );
                }
            }
            if nextn {
                add(
                    p("nextn.eh_proj.weight"),
                    mat(2 * d, false),
                    vec![2 * d, d],
                    Fill::matrix(2 * d, 1.0),
                );
                add(p("nextn.enorm.weight"), f32_, vec![d], Fill::norm(1.0));
                add(p("nextn.hnorm.weight"), f32_, vec![d], Fill::norm(1.0));
                add(
                    p("nextn.shared_head_norm.weight"),
                    f32_,
                    vec![d],
                    Fill::norm(1.0),
                );
                if self.family == MoeFamily::Mimo2 {
                    add(
                        p("layer_output_norm.weight"),
                        f32_,
                        vec![d],
                        Fill::norm(1.0),
                    );
                }
            }
        }
        add("output_norm.weight".into(), f32_, vec![d], Fill::norm(1.0));
        add(
            "output.weight".into(),
            mat(d, true),
            vec![d, n_vocab],
            Fill::matrix(d, OUTPUT_GAIN),
        );
        if self.pooled {
            for t in v.iter_mut().filter(|t| t.ty != GgmlType::F32) {
                if let Fill::Normal { mean, std } = t.fill {
                    t.fill = Fill::Pooled { mean, std };
                }
            }
        }
        v
    }

    /// The tensors of the file with a vocabulary of `n_vocab` tokens: name, encoding and
    /// dims (GGUF order), in file order.
    pub fn layout(&self, n_vocab: usize) -> Vec<(String, GgmlType, Vec<usize>)> {
        plan_layout(self.plan(n_vocab))
    }

    /// Parameters (all tensor elements) with a vocabulary of `n_vocab` tokens.
    pub fn param_count(&self, n_vocab: usize) -> usize {
        plan_params(&self.plan(n_vocab))
    }

    /// The architecture's metadata, as the converter writes it.
    fn hparams(&self) -> Vec<(&'static str, Value)> {
        let u = |x: usize| Value::U32(x as u32);
        let n_all = self.block_count();
        let mut kv: Vec<(&'static str, Value)> = vec![
            ("block_count", u(n_all)),
            ("context_length", u(self.context_length)),
            ("embedding_length", u(self.d)),
            ("feed_forward_length", u(self.ff)),
            ("attention.head_count", u(self.n_heads)),
        ];
        if self.family == MoeFamily::Mimo2 {
            let arr = (0..n_all).map(|i| self.kv_heads(i) as i32).collect();
            kv.push(("attention.head_count_kv", Value::Array(Array::I32(arr))));
        } else {
            kv.push(("attention.head_count_kv", u(self.n_kv_heads)));
        }
        kv.push(("rope.freq_base", Value::F32(self.rope_base)));
        kv.push(("attention.layer_norm_rms_epsilon", Value::F32(self.eps)));
        kv.push(("expert_used_count", u(self.used)));
        kv.push(("attention.key_length", u(self.head_dim_k)));
        kv.push(("attention.value_length", u(self.head_dim_v)));
        kv.push(("expert_count", u(self.experts)));
        kv.push(("expert_feed_forward_length", u(self.expert_ff)));
        if self.n_rot != self.head_dim_k {
            kv.push(("rope.dimension_count", u(self.n_rot)));
        }
        match self.family {
            MoeFamily::Qwen3Moe => {}
            MoeFamily::Glm4Moe => {
                kv.push(("expert_shared_count", u(usize::from(self.shared))));
                kv.push(("leading_dense_block_count", u(self.leading_dense)));
                kv.push(("expert_gating_func", u(2)));
                kv.push(("expert_weights_scale", Value::F32(self.weights_scale)));
                kv.push(("expert_weights_norm", Value::Bool(true)));
            }
            MoeFamily::GptOss => {
                kv.push(("attention.sliding_window", u(self.window)));
            }
            MoeFamily::Mimo2 => {
                kv.push(("rope.freq_base_swa", Value::F32(self.rope_base_swa)));
                kv.push(("attention.sliding_window", u(self.window)));
                let pat = (0..n_all).map(|i| i32::from(self.sliding(i))).collect();
                kv.push((
                    "attention.sliding_window_pattern",
                    Value::Array(Array::I32(pat)),
                ));
                if let Some(s) = self.value_scale {
                    kv.push(("attention.value_scale", Value::F32(s)));
                }
            }
        }
        if let Some((factor, orig)) = self.yarn {
            kv.push(("rope.scaling.type", Value::String("yarn".into())));
            kv.push(("rope.scaling.factor", Value::F32(factor)));
            kv.push(("rope.scaling.original_context_length", u(orig)));
        }
        if self.nextn > 0 {
            kv.push(("nextn_predict_layers", u(self.nextn)));
        }
        kv
    }
}

/// The checkpoint of `recipe`, described, to be generated in memory or streamed to disk
/// ([`SynthFile`]).
pub fn moe_file(
    recipe: &MoeRecipe,
    seed: u64,
    vocab: VocabSource<'_>,
) -> Result<SynthFile, SynthError> {
    let (tokenizer, n_vocab) = tokenizer_entries(
        vocab,
        recipe.builtin_vocab,
        recipe.family.builtin_pre(),
        seed,
    )?;
    let arch = recipe.family.arch();
    let w = begin_file(
        arch,
        recipe.model_name().as_str(),
        recipe.hparams(),
        recipe.file_type(),
    )?;
    finish_file(w, tokenizer, recipe.plan(n_vocab), seed)
}

/// Builds the checkpoint of `recipe` in memory; returns it with its parameter count.
/// `progress(done, total)` after each tensor.
pub fn synth_moe(
    recipe: &MoeRecipe,
    seed: u64,
    vocab: VocabSource<'_>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(GgufWriter, usize), SynthError> {
    moe_file(recipe, seed, vocab)?.into_writer(progress)
}
