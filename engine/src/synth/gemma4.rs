//! Synthetic `gemma4` checkpoints (`flint synth --arch gemma4`), with the keys, tensor
//! names and shapes llama.cpp's converter writes (`conversion/gemma.py` `Gemma4Model`),
//! so llama.cpp loads them unchanged and `llama-quantize` re-encodes them. Presets
//! ([`Gemma4Recipe::of`]):
//! - `tiny`: the 26B-A4B layout at d = 256: 4 layers [sliding x3, full], window 64,
//!   4 query heads, sliding layers with 2 KV heads of 64 and RoPE base 1e4 over all 64
//!   dims, the full layer with 1 KV head of 128, RoPE base 1e6 and "proportional" RoPE
//!   (`rope_freqs`: a quarter of the pairs turn, the rest are held by factors of 1e30),
//!   no `attn_v` on the full layer (its keys are its values), a dense GELU MLP of 512
//!   beside 8 experts of 256 (top-2, softmax, renormalised; router scale, per-expert
//!   output scale), a scale on each layer's output, soft-capping at 30, tied output.
//! - `tiny-e2b`: the E2B layout at d = 256: 6 dense layers [S, S, F, S, S, F], the last
//!   3 reading the KV of layers 1 (sliding) and 2 (full) (`shared_kv_layers = 3`),
//!   per-layer token embeddings of 64, the shared layers' MLP twice as wide (the
//!   converter's `use_double_wide_mlp`), heads as `tiny` but 1 KV head everywhere.
//! - `bench`: the 26B-A4B proportions (d 2816, 16 heads; sliding layers 8 KV heads of
//!   256, full layers 2 KV heads of 512; dense MLP 2112 beside 128 experts of 704,
//!   top-8) with 2 layers [sliding, full] and a Q4_K_M-like type mix.

use flint_core::GgmlType;
use flint_loader::gguf::{Array, GgufWriter, Value};
use flint_loader::tokenizer::PreTokenizer;

use super::dense::VocabSource;
use super::vocab::tokenizer_entries;
use super::{
    begin_file, file_type, finish_file, matrix_type, plan_layout, plan_params, Fill, Planned,
    SynthError, SynthFile,
};

/// The hyper-parameters of a `gemma4` preset.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Recipe {
    /// The preset's name.
    pub preset: &'static str,
    /// Hidden size.
    pub d: usize,
    /// Sliding (true) and full layers.
    pub pattern: Vec<bool>,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads of sliding layers.
    pub n_kv_swa: usize,
    /// KV heads of full layers.
    pub n_kv_full: usize,
    /// Head size of sliding layers.
    pub head_swa: usize,
    /// Head size of full layers.
    pub head_full: usize,
    /// Turned fraction of the full layers' pairs (`partial_rotary_factor`).
    pub partial_rotary_full: f32,
    /// Dense MLP width.
    pub ff: usize,
    /// Routed experts (0: dense).
    pub experts: usize,
    /// Experts per token.
    pub used: usize,
    /// Expert width.
    pub expert_ff: usize,
    /// Layers reading an earlier layer's KV.
    pub shared_kv: usize,
    /// Per-layer token embedding width (0: none).
    pub per_layer: usize,
    /// The full layers have no `attn_v` (`attention_k_eq_v`).
    pub k_eq_v: bool,
    /// Sliding window.
    pub window: usize,
    /// Size of the built-in vocabulary.
    pub builtin_vocab: usize,
    /// Q4_K_M-like type mix; false: every tensor f32.
    pub quantized: bool,
}

impl Gemma4Recipe {
    /// The presets.
    pub const PRESETS: [&'static str; 3] = ["tiny", "tiny-e2b", "bench"];

    /// The recipe of `preset`, if there is one.
    pub fn of(preset: &str) -> Option<Self> {
        let tiny = Self {
            preset: "tiny",
            d: 256,
            pattern: vec![true, true, true, false],
            n_heads: 4,
            n_kv_swa: 2,
            n_kv_full: 1,
            head_swa: 64,
            head_full: 128,
            partial_rotary_full: 0.25,
            ff: 512,
            experts: 8,
            used: 2,
            expert_ff: 256,
            shared_kv: 0,
            per_layer: 0,
            k_eq_v: true,
            window: 64,
            builtin_vocab: 2048,
            quantized: false,
        };
        match preset {
            "tiny" => Some(tiny),
            "tiny-e2b" => Some(Self {
                preset: "tiny-e2b",
                pattern: vec![true, true, false, true, true, false],
                n_kv_swa: 1,
                experts: 0,
                used: 0,
                shared_kv: 3,
                per_layer: 64,
                k_eq_v: false,
                ..tiny
            }),
            "bench" => Some(Self {
                preset: "bench",
                d: 2816,
                pattern: vec![true, false],
                n_heads: 16,
                n_kv_swa: 8,
                n_kv_full: 2,
                head_swa: 256,
                head_full: 512,
                ff: 2112,
                experts: 128,
                used: 8,
                expert_ff: 704,
                window: 1024,
                builtin_vocab: 32_000,
                quantized: true,
                ..tiny
            }),
            _ => None,
        }
    }

    /// `general.name` of the file.
    pub fn model_name(&self) -> String {
        format!("flint-synth-gemma4-{}", self.preset)
    }

    fn n_layers(&self) -> usize {
        self.pattern.len()
    }

    /// The first layer reading another layer's KV.
    fn first_shared(&self) -> usize {
        self.n_layers() - self.shared_kv
    }

    /// Dense MLP width of layer `il` (twice `ff` on the shared-KV layers of a per-layer
    /// embedding model, as the converter's `use_double_wide_mlp`).
    fn ff_of(&self, il: usize) -> usize {
        if self.shared_kv > 0 && il >= self.first_shared() {
            2 * self.ff
        } else {
            self.ff
        }
    }

    fn head(&self, il: usize) -> (usize, usize) {
        if self.pattern[il] {
            (self.head_swa, self.n_kv_swa)
        } else {
            (self.head_full, self.n_kv_full)
        }
    }

    /// `general.file_type`: 0 (all f32) or 15 (mostly Q4_K_M).
    pub fn file_type(&self) -> u32 {
        file_type(self.quantized)
    }

    fn plan(&self, n_vocab: usize) -> Vec<Planned> {
        let mut v = Vec::new();
        let mut add = |name, ty, dims, fill| v.push(Planned::new(name, ty, dims, fill));
        let f32_ = GgmlType::F32;
        let q = self.quantized;
        let mat = |row: usize, hi: bool| matrix_type(q, row, hi);
        let (d, h, l, p) = (self.d, self.n_heads, self.n_layers(), self.per_layer);
        // The full layers' proportional RoPE, as the converter writes it.
        let pairs = self.head_full / 2;
        let turned = (self.head_full as f32 * self.partial_rotary_full / 2.0) as usize;
        let factors = (0..pairs)
            .map(|i| if i < turned { 1.0 } else { 1e30 })
            .collect();
        add(
            "rope_freqs.weight".into(),
            f32_,
            vec![pairs],
            Fill::Values(factors),
        );
        // Tied output: small embeddings (times sqrt(d) at the input); the final norm
        // sets the logit spread.
        add(
            "token_embd.weight".into(),
            mat(d, true),
            vec![d, n_vocab],
            Fill::Normal {
                mean: 0.0,
                std: 1.0 / d as f32,
            },
        );
        if p > 0 {
            add(
                "per_layer_token_embd.weight".into(),
                mat(p * l, false),
                vec![p * l, n_vocab],
                Fill::Normal {
                    mean: 0.0,
                    std: 1.0 / (p as f32).sqrt(),
                },
            );
            add(
                "per_layer_model_proj.weight".into(),
                mat(d, false),
                vec![d, p * l],
                Fill::matrix(d, 1.0),
            );
            add(
                "per_layer_proj_norm.weight".into(),
                f32_,
                vec![p],
                Fill::norm(1.0),
            );
        }
        for il in 0..l {
            let n = |s: &str| format!("blk.{il}.{s}");
            let (hd, hkv) = self.head(il);
            let ff = self.ff_of(il);
            add(n("attn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            add(
                n("attn_q.weight"),
                mat(d, false),
                vec![d, h * hd],
                Fill::matrix(d, 1.0),
            );
            add(
                n("attn_k.weight"),
                mat(d, false),
                vec![d, hkv * hd],
                Fill::matrix(d, 1.0),
            );
            if !self.k_eq_v || self.pattern[il] {
                add(
                    n("attn_v.weight"),
                    mat(d, true),
                    vec![d, hkv * hd],
                    Fill::matrix(d, 1.0),
                );
            }
            add(
                n("attn_output.weight"),
                mat(h * hd, false),
                vec![h * hd, d],
                Fill::matrix(h * hd, 1.0),
            );
            // Normed queries and keys have unit rms and the scores scale 1: a query norm
            // weight of 1.5/sqrt(dk) gives scores of spread ~1.5, like a trained model's.
            add(
                n("attn_q_norm.weight"),
                f32_,
                vec![hd],
                Fill::norm(1.5 / (hd as f32).sqrt()),
            );
            add(n("attn_k_norm.weight"), f32_, vec![hd], Fill::norm(1.0));
            add(
                n("post_attention_norm.weight"),
                f32_,
                vec![d],
                Fill::norm(1.0),
            );
            add(n("ffn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            add(
                n("ffn_gate.weight"),
                mat(d, false),
                vec![d, ff],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_up.weight"),
                mat(d, false),
                vec![d, ff],
                Fill::matrix(d, 1.0),
            );
            add(
                n("ffn_down.weight"),
                mat(ff, true),
                vec![ff, d],
                Fill::matrix(ff, 1.0),
            );
            add(n("post_ffw_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            if self.experts > 0 {
                let (e, fe) = (self.experts, self.expert_ff);
                // The router reads a unit-rms row times 1/sqrt(d): a gain of 2 sqrt(d)
                // gives logits of spread ~2, so the routing is decided, not a coin toss.
                add(
                    n("ffn_gate_inp.weight"),
                    f32_,
                    vec![d, e],
                    Fill::matrix(d, 2.0 * (d as f32).sqrt()),
                );
                add(n("ffn_gate_inp.scale"), f32_, vec![d], Fill::norm(1.0));
                for s in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
                    add(n(&format!("{s}.weight")), f32_, vec![d], Fill::norm(1.0));
                }
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
                    n("ffn_down_exps.scale"),
                    f32_,
                    vec![e],
                    Fill::Normal {
                        mean: 1.0,
                        std: 0.3,
                    },
                );
            }
            if p > 0 {
                add(
                    n("inp_gate.weight"),
                    mat(d, false),
                    vec![d, p],
                    Fill::matrix(d, 1.0),
                );
                add(
                    n("proj.weight"),
                    mat(p, false),
                    vec![p, d],
                    Fill::matrix(p, 1.0),
                );
                add(n("post_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            }
            add(
                n("layer_output_scale.weight"),
                f32_,
                vec![1],
                Fill::Normal {
                    mean: 0.8,
                    std: 0.1,
                },
            );
        }
        // Tied output: the final norm's weight sets the logit spread.
        add(
            "output_norm.weight".into(),
            f32_,
            vec![d],
            Fill::norm(4.0 * (d as f32).sqrt()),
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
        let l = self.n_layers();
        let mut kv: Vec<(&'static str, Value)> = vec![
            ("block_count", u(l)),
            ("context_length", u(131_072)),
            ("embedding_length", u(self.d)),
        ];
        if self.shared_kv > 0 {
            let arr = (0..l).map(|i| self.ff_of(i) as i32).collect();
            kv.push(("feed_forward_length", Value::Array(Array::I32(arr))));
        } else {
            kv.push(("feed_forward_length", u(self.ff)));
        }
        kv.extend([
            ("attention.head_count", u(self.n_heads)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("rope.freq_base", Value::F32(1_000_000.0)),
            ("final_logit_softcapping", Value::F32(30.0)),
            ("attention.sliding_window", u(self.window)),
            ("rope.freq_base_swa", Value::F32(10_000.0)),
            ("attention.shared_kv_layers", u(self.shared_kv)),
            ("embedding_length_per_layer_input", u(self.per_layer)),
            (
                "attention.sliding_window_pattern",
                Value::Array(Array::Bool(self.pattern.clone())),
            ),
            ("attention.key_length", u(self.head_full)),
            ("attention.value_length", u(self.head_full)),
            ("attention.key_length_swa", u(self.head_swa)),
            ("attention.value_length_swa", u(self.head_swa)),
        ]);
        if self.experts > 0 {
            kv.push(("expert_feed_forward_length", u(self.expert_ff)));
            kv.push(("expert_count", u(self.experts)));
            kv.push(("expert_used_count", u(self.used)));
        }
        let hkv = self
            .pattern
            .iter()
            .map(|&s| if s { self.n_kv_swa } else { self.n_kv_full } as i32)
            .collect();
        kv.push(("attention.head_count_kv", Value::Array(Array::I32(hkv))));
        kv.push(("rope.dimension_count", u(self.head_full)));
        kv.push(("rope.dimension_count_swa", u(self.head_swa)));
        kv
    }
}

/// The checkpoint of `recipe`, described, to be generated in memory or streamed to disk
/// ([`SynthFile`]).
pub fn gemma4_file(
    recipe: &Gemma4Recipe,
    seed: u64,
    vocab: VocabSource<'_>,
) -> Result<SynthFile, SynthError> {
    let (tokenizer, n_vocab) =
        tokenizer_entries(vocab, recipe.builtin_vocab, PreTokenizer::Default, seed)?;
    let w = begin_file(
        "gemma4",
        recipe.model_name().as_str(),
        recipe.hparams(),
        recipe.file_type(),
    )?;
    finish_file(w, tokenizer, recipe.plan(n_vocab), seed)
}

/// Builds the checkpoint of `recipe` in memory; returns it with its parameter count.
/// `progress(done, total)` after each tensor.
pub fn synth_gemma4(
    recipe: &Gemma4Recipe,
    seed: u64,
    vocab: VocabSource<'_>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(GgufWriter, usize), SynthError> {
    gemma4_file(recipe, seed, vocab)?.into_writer(progress)
}
