//! Synthetic `qwen35moe` checkpoints (`flint synth --arch qwen35moe`), with the keys,
//! tensor names and shapes llama.cpp's converter writes (`conversion/qwen.py`
//! `Qwen3_5MoeTextModel`: the fused `attn_qkv` in q, k, v order, `attn_gate`, `ssm_a` as
//! `-exp(A_log)`, `ssm_conv1d` squeezed to `[kernel, channels]`), so llama.cpp loads them
//! unchanged and `llama-quantize` re-encodes them. Presets ([`Qwen35MoeRecipe::of`]):
//! - `tiny`: d = 256, 4 layers [DeltaNet x3, attention] (`full_attention_interval` 4);
//!   DeltaNet layers with 2 key heads and 4 value heads of 64 (value heads tiled over the
//!   key heads, as ggml broadcasts them) and a convolution of 4 taps; the attention layer
//!   with 4 query heads of 64 (each with its output gate), 2 KV heads, QK norms, NeoX RoPE
//!   over 16 of 64 dims with sections [3, 3, 2, 0]; 8 experts of 256, top-2 by softmax,
//!   renormalised, and a shared expert of 256 behind its sigmoid gate; untied output.
//! - `bench`: the 35B-A3B proportions (d 2048; DeltaNet 16 key heads and 32 value heads
//!   of 128; attention 16 heads of 256, 2 KV heads, RoPE over 64 dims with sections
//!   [11, 11, 10, 0]; 256 experts of 512, top-8, a shared expert of 512) with 4 layers
//!   [DeltaNet x3, attention] and a Q4_K_M-like type mix.

use flint_core::GgmlType;
use flint_loader::gguf::{Array, GgufWriter, Value};
use flint_loader::tokenizer::PreTokenizer;

use super::dense::{VocabSource, OUTPUT_GAIN};
use super::vocab::tokenizer_entries;
use super::{
    begin_file, file_type, finish_file, matrix_type, plan_layout, plan_params, Fill, Planned,
    SynthError, SynthFile,
};

/// The hyper-parameters of a `qwen35moe` preset.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35MoeRecipe {
    /// The preset's name.
    pub preset: &'static str,
    /// Hidden size.
    pub d: usize,
    /// Layers.
    pub n_layers: usize,
    /// Every this many layers, one is full attention (the others Gated DeltaNet).
    pub full_attention_interval: usize,
    /// Attention query heads.
    pub n_heads: usize,
    /// Attention KV heads.
    pub n_kv_heads: usize,
    /// Attention head size.
    pub head_dim: usize,
    /// Rotated dims of the attention heads.
    pub n_rot: usize,
    /// `rope.dimension_sections`.
    pub rope_sections: [u32; 4],
    /// DeltaNet key heads (`ssm.group_count`).
    pub dn_heads_k: usize,
    /// DeltaNet value heads (`ssm.time_step_rank`).
    pub dn_heads_v: usize,
    /// DeltaNet head size (`ssm.state_size`).
    pub dn_head_dim: usize,
    /// Convolution taps (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub used: usize,
    /// Routed expert width.
    pub expert_ff: usize,
    /// Shared expert width.
    pub shared_ff: usize,
    /// Size of the built-in vocabulary.
    pub builtin_vocab: usize,
    /// Q4_K_M-like type mix; false: every tensor f32.
    pub quantized: bool,
}

impl Qwen35MoeRecipe {
    /// The presets.
    pub const PRESETS: [&'static str; 2] = ["tiny", "bench"];

    /// The recipe of `preset`, if there is one.
    pub fn of(preset: &str) -> Option<Self> {
        let tiny = Self {
            preset: "tiny",
            d: 256,
            n_layers: 4,
            full_attention_interval: 4,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            n_rot: 16,
            rope_sections: [3, 3, 2, 0],
            dn_heads_k: 2,
            dn_heads_v: 4,
            dn_head_dim: 64,
            conv_kernel: 4,
            experts: 8,
            used: 2,
            expert_ff: 256,
            shared_ff: 256,
            builtin_vocab: 2048,
            quantized: false,
        };
        match preset {
            "tiny" => Some(tiny),
            "bench" => Some(Self {
                preset: "bench",
                d: 2048,
                n_heads: 16,
                n_kv_heads: 2,
                head_dim: 256,
                n_rot: 64,
                rope_sections: [11, 11, 10, 0],
                dn_heads_k: 16,
                dn_heads_v: 32,
                dn_head_dim: 128,
                experts: 256,
                used: 8,
                expert_ff: 512,
                shared_ff: 512,
                builtin_vocab: 32_000,
                quantized: true,
                ..tiny
            }),
            _ => None,
        }
    }

    /// `general.name` of the file.
    pub fn model_name(&self) -> String {
        format!("flint-synth-qwen35moe-{}", self.preset)
    }

    /// Whether layer `il` is a Gated DeltaNet layer (llama.cpp's rule without
    /// `attention.recurrent_layers`).
    pub fn is_delta_net(&self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.full_attention_interval)
    }

    /// `general.file_type`: 0 (all f32) or 15 (mostly Q4_K_M).
    pub fn file_type(&self) -> u32 {
        file_type(self.quantized)
    }

    fn plan(&self, n_vocab: usize) -> Vec<Planned> {
        let mut v = Vec::new();
        let mut add = |name, ty, dims, fill| v.push(Planned::new(name, ty, dims, fill));
        let f32_ = GgmlType::F32;
        let mat = |row: usize, hi: bool| matrix_type(self.quantized, row, hi);
        let (d, h, hkv, hd) = (self.d, self.n_heads, self.n_kv_heads, self.head_dim);
        let (hk, hv, dd) = (self.dn_heads_k, self.dn_heads_v, self.dn_head_dim);
        let (key_dim, value_dim) = (hk * dd, hv * dd);
        let conv_dim = 2 * key_dim + value_dim;
        let (e, fe, fs) = (self.experts, self.expert_ff, self.shared_ff);
        add(
            "token_embd.weight".into(),
            mat(d, false),
            vec![d, n_vocab],
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
        );
        for il in 0..self.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}");
            add(n("attn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            if self.is_delta_net(il) {
                add(
                    n("attn_qkv.weight"),
                    mat(d, false),
                    vec![d, conv_dim],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("attn_gate.weight"),
                    mat(d, false),
                    vec![d, value_dim],
                    Fill::matrix(d, 1.0),
                );
                // Four taps of spread 0.5: unit-variance channels stay near unit
                // variance through the convolution.
                add(
                    n("ssm_conv1d.weight"),
                    f32_,
                    vec![self.conv_kernel, conv_dim],
                    Fill::Normal {
                        mean: 0.0,
                        std: 1.0 / (self.conv_kernel as f32).sqrt(),
                    },
                );
                add(
                    n("ssm_dt.bias"),
                    f32_,
                    vec![hv],
                    Fill::Normal {
                        mean: 0.0,
                        std: 0.5,
                    },
                );
                // `-exp(A_log)`: per head decay rates from slow to fast, so that
                // `exp(g)` spreads over (0.3, 0.97) and the state remembers.
                let a = (0..hv)
                    .map(|i| -(0.05 + 0.6 * i as f32 / hv.max(2).saturating_sub(1) as f32))
                    .collect();
                add(n("ssm_a"), f32_, vec![hv], Fill::Values(a));
                add(
                    n("ssm_beta.weight"),
                    mat(d, false),
                    vec![d, hv],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("ssm_alpha.weight"),
                    mat(d, false),
                    vec![d, hv],
                    Fill::matrix(d, 1.0),
                );
                add(n("ssm_norm.weight"), f32_, vec![dd], Fill::norm(1.0));
                add(
                    n("ssm_out.weight"),
                    mat(value_dim, true),
                    vec![value_dim, d],
                    Fill::matrix(value_dim, 1.0),
                );
            } else {
                add(
                    n("attn_q.weight"),
                    mat(d, false),
                    vec![d, 2 * h * hd],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("attn_k.weight"),
                    mat(d, false),
                    vec![d, hkv * hd],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("attn_v.weight"),
                    mat(d, true),
                    vec![d, hkv * hd],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("attn_output.weight"),
                    mat(h * hd, false),
                    vec![h * hd, d],
                    Fill::matrix(h * hd, 1.0),
                );
                add(n("attn_q_norm.weight"), f32_, vec![hd], Fill::norm(1.0));
                add(n("attn_k_norm.weight"), f32_, vec![hd], Fill::norm(1.0));
            }
            add(
                n("post_attention_norm.weight"),
                f32_,
                vec![d],
                Fill::norm(1.0),
            );
            // Router logits of spread ~2: the routing is decided, not a coin toss.
            add(
                n("ffn_gate_inp.weight"),
                f32_,
                vec![d, e],
                Fill::matrix(d, 2.0),
            );
            add(
                n("ffn_gate_exps.weight"),
                mat(d, false),
                vec![d, fe, e],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_up_exps.weight"),
                mat(d, false),
                vec![d, fe, e],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_down_exps.weight"),
                mat(fe, true),
                vec![fe, d, e],
                Fill::matrix(fe, 1.0),
            );
            add(
                n("ffn_gate_inp_shexp.weight"),
                f32_,
                vec![d],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_gate_shexp.weight"),
                mat(d, false),
                vec![d, fs],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_up_shexp.weight"),
                mat(d, false),
                vec![d, fs],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_down_shexp.weight"),
                mat(fs, true),
                vec![fs, d],
                Fill::matrix(fs, 1.0),
            );
        }
        add("output_norm.weight".into(), f32_, vec![d], Fill::norm(1.0));
        add(
            "output.weight".into(),
            mat(d, true),
            vec![d, n_vocab],
            Fill::matrix(d, OUTPUT_GAIN),
        );
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
        let sections = self.rope_sections.iter().map(|&s| s as i32).collect();
        vec![
            ("block_count", u(self.n_layers)),
            ("context_length", u(262_144)),
            ("embedding_length", u(self.d)),
            ("attention.head_count", u(self.n_heads)),
            ("attention.head_count_kv", u(self.n_kv_heads)),
            ("rope.freq_base", Value::F32(10_000_000.0)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("expert_count", u(self.experts)),
            ("expert_used_count", u(self.used)),
            ("attention.key_length", u(self.head_dim)),
            ("attention.value_length", u(self.head_dim)),
            ("expert_feed_forward_length", u(self.expert_ff)),
            ("expert_shared_feed_forward_length", u(self.shared_ff)),
            ("ssm.conv_kernel", u(self.conv_kernel)),
            ("ssm.state_size", u(self.dn_head_dim)),
            ("ssm.group_count", u(self.dn_heads_k)),
            ("ssm.time_step_rank", u(self.dn_heads_v)),
            ("ssm.inner_size", u(self.dn_heads_v * self.dn_head_dim)),
            ("full_attention_interval", u(self.full_attention_interval)),
            ("rope.dimension_count", u(self.n_rot)),
            (
                "rope.dimension_sections",
                Value::Array(Array::I32(sections)),
            ),
        ]
    }
}

/// The checkpoint of `recipe`, described, to be generated in memory or streamed to disk
/// ([`SynthFile`]).
pub fn qwen35moe_file(
    recipe: &Qwen35MoeRecipe,
    seed: u64,
    vocab: VocabSource<'_>,
) -> Result<SynthFile, SynthError> {
    let (tokenizer, n_vocab) =
        tokenizer_entries(vocab, recipe.builtin_vocab, PreTokenizer::Qwen2, seed)?;
    let w = begin_file(
        "qwen35moe",
        recipe.model_name().as_str(),
        recipe.hparams(),
        recipe.file_type(),
    )?;
    finish_file(w, tokenizer, recipe.plan(n_vocab), seed)
}

/// Builds the checkpoint of `recipe` in memory; returns it with its parameter count.
/// `progress(done, total)` after each tensor.
pub fn synth_qwen35moe(
    recipe: &Qwen35MoeRecipe,
    seed: u64,
    vocab: VocabSource<'_>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(GgufWriter, usize), SynthError> {
    qwen35moe_file(recipe, seed, vocab)?.into_writer(progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench preset has the 35B-A3B per-layer shapes, every quantized row in whole
    /// blocks of its type, and the tiny preset's layer kinds follow the interval.
    #[test]
    fn bench_has_the_35b_a3b_shapes_in_whole_blocks() {
        let r = Qwen35MoeRecipe::of("bench").expect("bench");
        let layout = r.layout(32_000);
        let dims = |name: &str| {
            layout
                .iter()
                .find(|(n, _, _)| n == name)
                .unwrap_or_else(|| panic!("{name} in the layout"))
                .2
                .clone()
        };
        assert_eq!(dims("blk.0.attn_qkv.weight"), vec![2048, 8192]);
        assert_eq!(dims("blk.0.attn_gate.weight"), vec![2048, 4096]);
        assert_eq!(dims("blk.0.ssm_conv1d.weight"), vec![4, 8192]);
        assert_eq!(dims("blk.3.attn_q.weight"), vec![2048, 8192]);
        assert_eq!(dims("blk.3.attn_k.weight"), vec![2048, 512]);
        assert_eq!(dims("blk.3.ffn_gate_exps.weight"), vec![2048, 512, 256]);
        assert_eq!(dims("blk.3.ffn_down_shexp.weight"), vec![512, 2048]);
        for (name, ty, d) in &layout {
            assert!(
                ty.row_bytes(d[0]).is_some(),
                "{name}: rows of {} in {ty}",
                d[0]
            );
        }
        assert!(layout.iter().any(|(_, ty, _)| *ty == GgmlType::Q4_K));
        let tiny = Qwen35MoeRecipe::of("tiny").expect("tiny");
        let kinds: Vec<bool> = (0..tiny.n_layers).map(|i| tiny.is_delta_net(i)).collect();
        assert_eq!(kinds, [true, true, true, false]);
        assert!(Qwen35MoeRecipe::of("huge").is_none());
    }
}
