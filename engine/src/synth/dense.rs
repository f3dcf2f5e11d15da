//! Synthetic checkpoints of the dense families llama.cpp runs: `llama`, `qwen2`, `qwen3`,
//! `gemma3` (`flint synth --arch A`).
//!
//! Each file carries the metadata keys, tensor names and shapes that llama.cpp's
//! `convert_hf_to_gguf.py` writes for the family (same key order: `general.*`, the
//! architecture's keys, `general.file_type`, `general.quantization_version`, then the
//! tokenizer), so llama.cpp loads it unchanged and `llama-quantize` re-encodes it.
//!
//! Presets ([`DenseRecipe::of`]):
//! - `tiny` (every family): d = 256, 4 query heads and 2 KV heads (GQA), feed-forward
//!   512 (rows of whole 256-blocks, so `llama-quantize` makes real K-quants), f32
//!   weights, and each family's features on:
//!   - `llama`: 3 layers, interleaved RoPE with base 500000 and a `rope_freqs` tensor of
//!     Llama 3.1 frequency factors (factor 8, low 1, high 4, original context 512: 21 of
//!     the 32 pairs slowed by 8, 3 blended, 8 unchanged, so the factors show in the
//!     logits from the first positions on), untied `output`.
//!   - `qwen2`: 3 layers, random Q/K/V biases `N(0, 1)` (as large as the projections
//!     they are added to), NeoX RoPE, untied `output`.
//!   - `qwen3`: 3 layers, per-head Q/K RMSNorm, heads of 128 (4 x 128 != d), tied output.
//!   - `gemma3`: 6 layers (llama.cpp's default pattern of period 6: five sliding layers,
//!     then a global one), window 128, RoPE base 1e6 global / 10000 local
//!     (`rope.freq_base_swa`), Q/K norms, post-attention and post-FFN norms, GELU,
//!     embeddings scaled by sqrt(d), tied output.
//! - `tiny-4b` (gemma3): `tiny` with the linear RoPE scaling (factor 8) the 4B, 12B and
//!   27B files carry; llama.cpp applies it to the global layers only.
//! - `tiny-27b` (gemma3): 62 layers (llama.cpp keys the 27B query scale
//!   `1/sqrt(d / n_head)` on that layer count), d = 256 with 2 heads of 64 and 1 KV head,
//!   so that scale (1/sqrt(128)) differs from `1/sqrt(head_dim)`; feed-forward 256.
//! - `bench` (every family): the proportions of a real model of about 1B parameters
//!   (Llama 3.2 1B, Qwen2.5 1.5B, Qwen3 1.7B, Gemma 3 1B) with a Q4_K_M-like type mix.
//!
//! Scales, beyond the shared rules of [`super`]: logits have a spread of about
//! [`OUTPUT_GAIN`] so the top-1 margin is usually clear. Untied files draw `output` as
//! `N(0, gain^2 / d)`. Tied files draw small embeddings (`N(0, 1/d)` per element after
//! Gemma's sqrt(d) input scale, `N(0, 1/d)` for Qwen3), so the current token's own row
//! does not dominate its logits, and set the logit spread with the final norm's weight.

use flint_core::GgmlType;
use flint_loader::gguf::{GgufFile, GgufWriter, Value};
use flint_loader::tokenizer::PreTokenizer;

use super::vocab::tokenizer_entries;
use super::{
    begin_file, file_type, finish_file, matrix_type, plan_layout, plan_params, writer_err, Fill,
    Planned, SynthError, SynthFile,
};

/// Spread (standard deviation) of the logits the recipes aim for.
pub const OUTPUT_GAIN: f32 = 4.0;

/// A dense model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama` (Llama 3.x).
    Llama,
    /// `qwen2` (Qwen2 / Qwen2.5).
    Qwen2,
    /// `qwen3`.
    Qwen3,
    /// `gemma3`.
    Gemma3,
}

impl Family {
    /// Every family, in the order the CLI lists them.
    pub const ALL: [Family; 4] = [Family::Llama, Family::Qwen2, Family::Qwen3, Family::Gemma3];

    /// Parses a `general.architecture` name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.arch() == name)
    }

    /// The `general.architecture` value (and key prefix).
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
        }
    }

    /// The presets of this family.
    pub fn presets(self) -> &'static [&'static str] {
        match self {
            Family::Gemma3 => &["tiny", "tiny-4b", "tiny-27b", "bench"],
            _ => &["tiny", "bench"],
        }
    }

    /// The pre-tokenizer of the built-in byte-level BPE vocabulary: the family's own
    /// (`llama-bpe`, `qwen2`); Gemma's real tokenizer is SentencePiece (bring it with
    /// `--vocab`), so its built-in BPE uses llama.cpp's `default` split.
    fn builtin_pre(self) -> PreTokenizer {
        match self {
            Family::Llama => PreTokenizer::Llama3,
            Family::Qwen2 | Family::Qwen3 => PreTokenizer::Qwen2,
            Family::Gemma3 => PreTokenizer::Default,
        }
    }
}

/// Llama 3.1 RoPE frequency scaling (`rope_scaling` of type `llama3`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f32,
    /// `low_freq_factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`.
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings`.
    pub original_context: usize,
}

impl Llama3Rope {
    /// The per-pair frequency factors `convert_hf_to_gguf.py` writes as `rope_freqs.weight`
    /// (f32 arithmetic, as its torch code does): 1 for short wavelengths, `factor` for long
    /// ones, a smooth blend between.
    pub fn factors(&self, base: f32, head_dim: usize) -> Vec<f32> {
        let old = self.original_context as f32;
        let low_wavelen = old / self.low_freq_factor;
        let high_wavelen = old / self.high_freq_factor;
        (0..head_dim)
            .step_by(2)
            .map(|i| {
                let freq = 1.0 / base.powf(i as f32 / head_dim as f32);
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (old / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

/// The hyper-parameters of a dense preset.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseRecipe {
    /// The family.
    pub family: Family,
    /// The preset's name (`tiny`, `tiny-4b`, ...).
    pub preset: &'static str,
    /// Hidden size.
    pub d: usize,
    /// Layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Head size (Q, K and V).
    pub head_dim: usize,
    /// Whether `attention.key_length` / `value_length` are written (the converter writes
    /// them when the Hugging Face config has `head_dim`).
    pub head_dim_keys: bool,
    /// Feed-forward width.
    pub ff: usize,
    /// `context_length`.
    pub context_length: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base (global layers).
    pub rope_base: f32,
    /// RoPE base of sliding layers (`rope.freq_base_swa`).
    pub rope_base_swa: Option<f32>,
    /// Sliding window (`attention.sliding_window`).
    pub window: Option<usize>,
    /// Linear RoPE scaling factor (`rope.scaling.type = linear`).
    pub rope_linear: Option<f32>,
    /// Llama 3.1 frequency factors (`rope_freqs.weight`).
    pub llama3_rope: Option<Llama3Rope>,
    /// Q/K/V biases.
    pub qkv_bias: bool,
    /// Per-head Q/K RMSNorm.
    pub qk_norm: bool,
    /// Gemma's post-attention and post-FFN norms.
    pub post_norms: bool,
    /// Output tied to the token embedding (no `output.weight`).
    pub tied: bool,
    /// Size of the built-in vocabulary.
    pub builtin_vocab: usize,
    /// Q4_K_M-like type mix; `None`: every tensor f32.
    pub quantized: bool,
}

impl DenseRecipe {
    /// The recipe of `preset` for `family`, if the family has that preset.
    pub fn of(family: Family, preset: &str) -> Option<Self> {
        let tiny = Self {
            family,
            preset: "tiny",
            d: 256,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            head_dim_keys: true,
            ff: 512,
            context_length: 8192,
            eps: 1e-6,
            rope_base: 1_000_000.0,
            rope_base_swa: None,
            window: None,
            rope_linear: None,
            llama3_rope: None,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            tied: false,
            builtin_vocab: 8192,
            quantized: false,
        };
        let r = match (family, preset) {
            (Family::Llama, "tiny") => Self {
                eps: 1e-5,
                rope_base: 500_000.0,
                llama3_rope: Some(Llama3Rope {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 512,
                }),
                ..tiny
            },
            (Family::Qwen2, "tiny") => Self {
                head_dim_keys: false,
                context_length: 32_768,
                qkv_bias: true,
                ..tiny
            },
            (Family::Qwen3, "tiny") => Self {
                head_dim: 128,
                context_length: 40_960,
                qk_norm: true,
                tied: true,
                ..tiny
            },
            (Family::Gemma3, "tiny") => Self::gemma3_tiny(tiny),
            (Family::Gemma3, "tiny-4b") => Self {
                preset: "tiny-4b",
                rope_linear: Some(8.0),
                ..Self::gemma3_tiny(tiny)
            },
            (Family::Gemma3, "tiny-27b") => Self {
                preset: "tiny-27b",
                n_layers: 62,
                n_heads: 2,
                n_kv_heads: 1,
                ff: 256,
                builtin_vocab: 2048,
                ..Self::gemma3_tiny(tiny)
            },
            (_, "bench") => Self::bench(family),
            _ => return None,
        };
        Some(r)
    }

    fn gemma3_tiny(tiny: Self) -> Self {
        Self {
            n_layers: 6,
            context_length: 32_768,
            rope_base_swa: Some(10_000.0),
            window: Some(128),
            qk_norm: true,
            post_norms: true,
            tied: true,
            ..tiny
        }
    }

    /// Proportions of a ~1B model of the family; built-in vocabulary of 32k.
    fn bench(family: Family) -> Self {
        let base = Self {
            family,
            preset: "bench",
            d: 2048,
            n_layers: 16,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 64,
            head_dim_keys: true,
            ff: 8192,
            context_length: 131_072,
            eps: 1e-5,
            rope_base: 500_000.0,
            rope_base_swa: None,
            window: None,
            rope_linear: None,
            llama3_rope: None,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            tied: true,
            builtin_vocab: 32_000,
            quantized: true,
        };
        match family {
            // Llama 3.2 1B.
            Family::Llama => Self {
                llama3_rope: Some(Llama3Rope {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 8192,
                }),
                ..base
            },
            // Qwen2.5 1.5B.
            Family::Qwen2 => Self {
                d: 1536,
                n_layers: 28,
                n_heads: 12,
                n_kv_heads: 2,
                head_dim: 128,
                head_dim_keys: false,
                ff: 8960,
                context_length: 32_768,
                eps: 1e-6,
                rope_base: 1_000_000.0,
                qkv_bias: true,
                ..base
            },
            // Qwen3 1.7B.
            Family::Qwen3 => Self {
                n_layers: 28,
                n_heads: 16,
                head_dim: 128,
                ff: 6144,
                context_length: 40_960,
                eps: 1e-6,
                rope_base: 1_000_000.0,
                qk_norm: true,
                ..base
            },
            // Gemma 3 1B.
            Family::Gemma3 => Self {
                d: 1152,
                n_layers: 26,
                n_heads: 4,
                n_kv_heads: 1,
                head_dim: 256,
                ff: 6912,
                context_length: 32_768,
                eps: 1e-6,
                rope_base: 1_000_000.0,
                rope_base_swa: Some(10_000.0),
                window: Some(512),
                qk_norm: true,
                post_norms: true,
                ..base
            },
        }
    }

    /// `general.name` of the file.
    pub fn model_name(&self) -> String {
        format!("flint-synth-{}-{}", self.family.arch(), self.preset)
    }

    /// `general.file_type`: 0 (all f32) or 15 (mostly Q4_K_M).
    pub fn file_type(&self) -> u32 {
        file_type(self.quantized)
    }

    /// Standard deviation of the token embedding.
    fn embd_std(&self) -> f32 {
        match (self.tied, self.family) {
            (false, _) => 1.0,
            // The input is scaled by sqrt(d): N(0, 1/d) per element after it.
            (true, Family::Gemma3) => 1.0 / self.d as f32,
            (true, _) => 1.0 / (self.d as f32).sqrt(),
        }
    }

    /// The encoding of a matrix whose rows have `row` elements: `hi` picks the
    /// higher-precision half of the mix. K-quants need rows of whole 256-blocks; other
    /// rows fall back as llama-quantize does (Q4_K to Q5_0, Q6_K to Q8_0).
    fn matrix_type(&self, row: usize, hi: bool) -> GgmlType {
        matrix_type(self.quantized, row, hi)
    }

    fn plan(&self, n_vocab: usize) -> Vec<Planned> {
        let mut v = Vec::new();
        let mut add = |name, ty, dims, fill| v.push(Planned::new(name, ty, dims, fill));
        let f32_ = GgmlType::F32;
        let (d, ff, dh) = (self.d, self.ff, self.head_dim);
        let (q, kv) = (self.n_heads * dh, self.n_kv_heads * dh);
        if let Some(r) = &self.llama3_rope {
            add(
                "rope_freqs.weight".into(),
                f32_,
                vec![dh / 2],
                Fill::Values(r.factors(self.rope_base, dh)),
            );
        }
        add(
            "token_embd.weight".into(),
            self.matrix_type(d, self.tied),
            vec![d, n_vocab],
            Fill::Normal {
                mean: 0.0,
                std: self.embd_std(),
            },
        );
        for il in 0..self.n_layers {
            let p = |s: &str| format!("blk.{il}.{s}");
            let mat = |row: usize, hi: bool| self.matrix_type(row, hi);
            add(p("attn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            add(
                p("attn_q.weight"),
                mat(d, false),
                vec![d, q],
                Fill::matrix(d, 1.0),
            );
            add(
                p("attn_k.weight"),
                mat(d, false),
                vec![d, kv],
                Fill::matrix(d, 1.0),
            );
            add(
                p("attn_v.weight"),
                mat(d, true),
                vec![d, kv],
                Fill::matrix(d, 1.0),
            );
            if self.qkv_bias {
                for (name, n) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                    add(
                        p(name),
                        f32_,
                        vec![n],
                        Fill::Normal {
                            mean: 0.0,
                            std: 1.0,
                        },
                    );
                }
            }
            if self.qk_norm {
                add(p("attn_q_norm.weight"), f32_, vec![dh], Fill::norm(1.0));
                add(p("attn_k_norm.weight"), f32_, vec![dh], Fill::norm(1.0));
            }
            add(
                p("attn_output.weight"),
                mat(q, false),
                vec![q, d],
                Fill::matrix(q, 1.0),
            );
            if self.post_norms {
                add(
                    p("post_attention_norm.weight"),
                    f32_,
                    vec![d],
                    Fill::norm(1.0),
                );
            }
            add(p("ffn_norm.weight"), f32_, vec![d], Fill::norm(1.0));
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
            if self.post_norms {
                add(p("post_ffw_norm.weight"), f32_, vec![d], Fill::norm(1.0));
            }
        }
        // Tied: the final norm sets the logit spread (the embedding rows are small).
        let out_norm = if self.tied {
            OUTPUT_GAIN / (self.embd_std() * (d as f32).sqrt())
        } else {
            1.0
        };
        add(
            "output_norm.weight".into(),
            f32_,
            vec![d],
            Fill::norm(out_norm),
        );
        if !self.tied {
            add(
                "output.weight".into(),
                self.matrix_type(d, true),
                vec![d, n_vocab],
                Fill::matrix(d, OUTPUT_GAIN),
            );
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

    /// The architecture's metadata, in the converter's order.
    fn hparams(&self) -> Vec<(&'static str, Value)> {
        let u = |x: usize| Value::U32(x as u32);
        let mut kv: Vec<(&'static str, Value)> = vec![
            ("block_count", u(self.n_layers)),
            ("context_length", u(self.context_length)),
            ("embedding_length", u(self.d)),
            ("feed_forward_length", u(self.ff)),
            ("attention.head_count", u(self.n_heads)),
            ("attention.head_count_kv", u(self.n_kv_heads)),
        ];
        if let Some(f) = self.rope_linear {
            kv.push(("rope.scaling.type", Value::String("linear".into())));
            kv.push(("rope.scaling.factor", Value::F32(f)));
        }
        kv.push(("rope.freq_base", Value::F32(self.rope_base)));
        if let Some(b) = self.rope_base_swa {
            kv.push(("rope.freq_base_swa", Value::F32(b)));
        }
        kv.push(("attention.layer_norm_rms_epsilon", Value::F32(self.eps)));
        if self.head_dim_keys {
            kv.push(("attention.key_length", u(self.head_dim)));
            kv.push(("attention.value_length", u(self.head_dim)));
        }
        if let Some(w) = self.window {
            kv.push(("attention.sliding_window", u(w)));
        }
        kv
    }
}

/// Where the tokenizer of a dense checkpoint comes from.
#[derive(Clone, Copy, Debug)]
pub enum VocabSource<'a> {
    /// The built-in byte-level BPE of the recipe's size.
    Builtin,
    /// A real vocabulary: this file's tokenizer cut to this many ordinary tokens.
    File(&'a GgufFile, usize),
}

/// The checkpoint of `recipe`, described, to be generated in memory or streamed to disk
/// ([`SynthFile`]).
pub fn dense_file(
    recipe: &DenseRecipe,
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
    let mut w = begin_file(
        arch,
        recipe.model_name().as_str(),
        recipe.hparams(),
        recipe.file_type(),
    )?;
    if recipe.family == Family::Llama {
        w.add(&format!("{arch}.vocab_size"), n_vocab as u32)
            .map_err(writer_err)?;
        w.add(
            &format!("{arch}.rope.dimension_count"),
            recipe.head_dim as u32,
        )
        .map_err(writer_err)?;
    }
    finish_file(w, tokenizer, recipe.plan(n_vocab), seed)
}

/// Builds the checkpoint of `recipe` in memory; returns it with its parameter count.
/// `progress(done, total)` after each tensor.
pub fn synth_dense(
    recipe: &DenseRecipe,
    seed: u64,
    vocab: VocabSource<'_>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(GgufWriter, usize), SynthError> {
    dense_file(recipe, seed, vocab)?.into_writer(progress)
}
