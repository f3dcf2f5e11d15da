//! Deterministic synthetic Flint checkpoints (`flint synth`).
//!
//! - [`Preset::Tiny`]: small and quick, every Flint feature on (sinks mostly below the
//!   score maximum, a window shorter than the test prompts, two full and three sliding
//!   layers, a leading dense layer, a shared expert, a selection bias, renormalised
//!   sigmoid routing, K-quant weights, Q/K norms, a separate SWA RoPE base).
//! - [`Preset::Bench`]: about 0.8B parameters for performance work (d = 1024, 8 layers
//!   with 1 leading dense, 16 query / 4 KV heads of 64, 3 sliding : 1 full, W = 512,
//!   64 experts of 512, top-4, a shared expert of 1024, ~32k byte-level BPE vocabulary,
//!   a Q4_K_M-style type mix).
//!
//! Weights are random but scaled so activations stay in a realistic range: matrices
//! `N(0, 1/in)` (unit-variance outputs for unit-variance inputs), norm weights
//! `1 + N(0, 0.05)`, embeddings `N(0, 1)`, sinks `N(-0.5, 0.5)` (mostly below a typical
//! score maximum, but close enough to matter), selection bias `N(0, 0.2)` (the size of
//! the spread of sigmoid scores, so it changes the choice now and then). Every tensor has
//! its own PRNG stream seeded from the seed and the tensor's name, so the output is the
//! same byte for byte whatever the thread count.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use flint_core::GgmlType;
use flint_loader::gguf::GgufWriter;
use flint_loader::tokenizer::{PreTokenizer, TokenizerConfig};
use rayon::prelude::*;

use crate::sample::Rng;

/// A synthetic checkpoint recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Small, every feature on (tests).
    Tiny,
    /// ~0.8B parameters (benchmarks).
    Bench,
}

impl Preset {
    /// Parses `tiny` / `bench`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Preset::Tiny),
            "bench" => Some(Preset::Bench),
            _ => None,
        }
    }
}

/// A synthesis failure (writer or quantizer), with what was being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthError(pub String);

impl std::fmt::Display for SynthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SynthError {}

/// The hyper-parameters of a preset.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// Hidden size.
    pub d: usize,
    /// Sliding (true) / full (false) per layer.
    pub pattern: Vec<bool>,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Head size (Q, K and V).
    pub head_dim: usize,
    /// Sliding window.
    pub window: usize,
    /// Leading dense layers.
    pub n_dense: usize,
    /// Dense FFN width.
    pub dense_ff: usize,
    /// Routed experts.
    pub n_experts: usize,
    /// Experts per token.
    pub k: usize,
    /// Routed expert width.
    pub expert_ff: usize,
    /// Shared expert width.
    pub shared_ff: usize,
    /// Target vocabulary size (specials + 256 bytes + merges).
    pub vocab: usize,
    /// Context length.
    pub context_length: usize,
    /// RoPE base of full layers.
    pub rope_base: f32,
    /// RoPE base of sliding layers.
    pub rope_base_swa: f32,
    /// Encoding of most matrices.
    pub ty_main: GgmlType,
    /// Encoding of `attn_v` and the `ffn_down*` matrices.
    pub ty_hi: GgmlType,
    /// Encoding of `token_embd`.
    pub ty_embd: GgmlType,
    /// Encoding of `output` (None: tied to `token_embd`).
    pub ty_output: Option<GgmlType>,
    /// Scale of the output projection (larger = sharper next-token distributions).
    pub output_gain: f32,
}

impl SynthConfig {
    /// The recipe of `preset`.
    pub fn of(preset: Preset) -> Self {
        match preset {
            Preset::Tiny => Self {
                d: 256,
                // dense full, then S S F S: two full and three sliding layers.
                pattern: vec![false, true, true, false, true],
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 64,
                window: 8,
                n_dense: 1,
                dense_ff: 512,
                n_experts: 8,
                k: 2,
                expert_ff: 256,
                shared_ff: 256,
                vocab: 512,
                context_length: 1024,
                rope_base: 1_000_000.0,
                rope_base_swa: 10_000.0,
                ty_main: GgmlType::Q4_K,
                ty_hi: GgmlType::Q6_K,
                ty_embd: GgmlType::Q8_0,
                ty_output: Some(GgmlType::Q6_K),
                output_gain: 3.0,
            },
            Preset::Bench => Self {
                d: 1024,
                pattern: vec![true, true, true, false, true, true, true, false],
                n_heads: 16,
                n_kv_heads: 4,
                head_dim: 64,
                window: 512,
                n_dense: 1,
                dense_ff: 4096,
                n_experts: 64,
                k: 4,
                expert_ff: 512,
                shared_ff: 1024,
                vocab: 32_000,
                context_length: 32_768,
                rope_base: 1_000_000.0,
                rope_base_swa: 10_000.0,
                ty_main: GgmlType::Q4_K,
                ty_hi: GgmlType::Q6_K,
                ty_embd: GgmlType::Q4_K,
                ty_output: Some(GgmlType::Q6_K),
                output_gain: 3.0,
            },
        }
    }
}

/// FNV-1a of the name, mixed with the seed: one PRNG stream per tensor.
fn tensor_rng(seed: u64, name: &str) -> Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// How to fill one tensor.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// `N(mean, std)`.
    Normal { mean: f32, std: f32 },
}

struct Planned {
    name: String,
    ty: GgmlType,
    dims: Vec<usize>,
    fill: Fill,
}

fn plan(cfg: &SynthConfig) -> Vec<Planned> {
    let mut v = Vec::new();
    let mut add = |name: String, ty: GgmlType, dims: Vec<usize>, fill: Fill| {
        v.push(Planned {
            name,
            ty,
            dims,
            fill,
        })
    };
    let mat = |inp: usize| Fill::Normal {
        mean: 0.0,
        std: 1.0 / (inp as f32).sqrt(),
    };
    let norm = Fill::Normal {
        mean: 1.0,
        std: 0.05,
    };
    let d = cfg.d;
    let (h, hkv, dh) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    add(
        "token_embd.weight".into(),
        cfg.ty_embd,
        vec![d, cfg.vocab],
        Fill::Normal {
            mean: 0.0,
            std: 1.0,
        },
    );
    add("output_norm.weight".into(), GgmlType::F32, vec![d], norm);
    if let Some(ty) = cfg.ty_output {
        add(
            "output.weight".into(),
            ty,
            vec![d, cfg.vocab],
            Fill::Normal {
                mean: 0.0,
                std: cfg.output_gain / (d as f32).sqrt(),
            },
        );
    }
    for il in 0..cfg.pattern.len() {
        let p = |s: &str| format!("blk.{il}.{s}");
        add(p("attn_norm.weight"), GgmlType::F32, vec![d], norm);
        add(p("attn_q.weight"), cfg.ty_main, vec![d, h * dh], mat(d));
        add(p("attn_k.weight"), cfg.ty_main, vec![d, hkv * dh], mat(d));
        add(p("attn_v.weight"), cfg.ty_hi, vec![d, hkv * dh], mat(d));
        add(p("attn_q_norm.weight"), GgmlType::F32, vec![dh], norm);
        add(p("attn_k_norm.weight"), GgmlType::F32, vec![dh], norm);
        add(
            p("attn_sinks.weight"),
            GgmlType::F32,
            vec![h],
            Fill::Normal {
                mean: -0.5,
                std: 0.5,
            },
        );
        add(
            p("attn_output.weight"),
            cfg.ty_main,
            vec![h * dh, d],
            mat(h * dh),
        );
        add(p("ffn_norm.weight"), GgmlType::F32, vec![d], norm);
        if il < cfg.n_dense {
            let f = cfg.dense_ff;
            add(p("ffn_gate.weight"), cfg.ty_main, vec![d, f], mat(d));
            add(p("ffn_up.weight"), cfg.ty_main, vec![d, f], mat(d));
            add(p("ffn_down.weight"), cfg.ty_hi, vec![f, d], mat(f));
        } else {
            let (e, fe, fs) = (cfg.n_experts, cfg.expert_ff, cfg.shared_ff);
            add(p("ffn_gate_inp.weight"), GgmlType::F32, vec![d, e], mat(d));
            add(
                p("exp_probs_b.bias"),
                GgmlType::F32,
                vec![e],
                Fill::Normal {
                    mean: 0.0,
                    std: 0.2,
                },
            );
            add(
                p("ffn_gate_exps.weight"),
                cfg.ty_main,
                vec![d, fe, e],
                mat(d),
            );
            add(p("ffn_up_exps.weight"), cfg.ty_main, vec![d, fe, e], mat(d));
            add(
                p("ffn_down_exps.weight"),
                cfg.ty_hi,
                vec![fe, d, e],
                mat(fe),
            );
            add(p("ffn_gate_shexp.weight"), cfg.ty_main, vec![d, fs], mat(d));
            add(p("ffn_up_shexp.weight"), cfg.ty_main, vec![d, fs], mat(d));
            add(p("ffn_down_shexp.weight"), cfg.ty_hi, vec![fs, d], mat(fs));
        }
    }
    v
}

fn make_tensor(seed: u64, t: &Planned) -> Result<Vec<u8>, SynthError> {
    let n: usize = t.dims.iter().product();
    let mut rng = tensor_rng(seed, &t.name);
    let Fill::Normal { mean, std } = t.fill;
    let vals: Vec<f32> = (0..n).map(|_| mean + std * rng.normal()).collect();
    let row = t.dims[0];
    let row_bytes = t.ty.row_bytes(row).ok_or_else(|| {
        SynthError(format!(
            "{}: rows of {row} are not whole {} blocks",
            t.name, t.ty
        ))
    })?;
    let mut out = vec![0u8; row_bytes * (n / row)];
    // Quantize a few hundred rows per task: rows are independent.
    let chunk_rows = 256;
    out.par_chunks_mut(row_bytes * chunk_rows)
        .zip(vals.par_chunks(row * chunk_rows))
        .try_for_each(|(dst, src)| flint_core::quant::quantize(t.ty, src, dst))
        .map_err(|e| SynthError(format!("quantizing {} as {}: {e}", t.name, t.ty)))?;
    Ok(out)
}

/// Counts parameters of a preset (all tensor elements).
pub fn param_count(preset: Preset) -> usize {
    plan(&SynthConfig::of(preset))
        .iter()
        .map(|t| t.dims.iter().product::<usize>())
        .sum()
}

/// English text the BPE merges are learnt from (our own words; any text would do).
const CORPUS: &str = "The capital of France is Paris. The engine reads a model file, \
stages the weights on a device and runs the forward pass one token after another. \
A tokenizer splits the text into words and merges the most frequent pairs of symbols. \
Once upon a time there was a small model that wanted to write stories about the sea, \
the mountains and the people who lived between them. It learned numbers like 1, 2, 3, \
10, 42 and 2024, and punctuation such as commas, periods, questions? and answers! \
Every layer has attention and a feed forward network; some layers look at the whole \
context while others only see a sliding window of recent positions. Experts are chosen \
by a router, and a shared expert is always on. This is the end of the text, and the \
beginning of another one: hello world, good morning, thank you very much.";

/// A byte-level BPE vocabulary: the tokens (in GPT-2's printable byte stand-ins) and
/// the merges in rank order.
#[derive(Clone, Debug)]
pub struct SynthVocab {
    /// Token texts; ids are indices.
    pub tokens: Vec<String>,
    /// llama.cpp token types (1 normal, 3 control).
    pub types: Vec<i32>,
    /// `"a b"` merge rules by rank.
    pub merges: Vec<String>,
    /// BOS id.
    pub bos: u32,
    /// EOS id.
    pub eos: u32,
}

/// GPT-2's byte → printable char mapping.
fn byte_char(b: u8) -> char {
    let printable =
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    // Non-printable bytes map, in order, to U+0100 and up.
    let mut n = 0u32;
    for c in 0u8..b {
        let p =
            (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap_or('?')
}

/// Builds a byte-level BPE vocabulary of `size` tokens: 3 specials, 256 bytes, merges
/// learnt from [`CORPUS`] by pair frequency, then (to reach the size) merges of pairs of
/// earlier tokens drawn by a seeded PRNG. Every merge joins two existing tokens into a
/// new one, so the tokenizer built from it is a valid BPE.
pub fn build_vocab(size: usize, seed: u64) -> SynthVocab {
    let mut tokens: Vec<String> = vec!["<pad>".into(), "<bos>".into(), "<eos>".into()];
    let mut types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    // Words as GPT-2 sees them: a leading space belongs to the word.
    let mut words: HashMap<Vec<String>, usize> = HashMap::new();
    for (i, w) in CORPUS.split(' ').enumerate() {
        let text = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let syms: Vec<String> = text.bytes().map(|b| byte_char(b).to_string()).collect();
        *words.entry(syms).or_insert(0) += 1;
    }
    let mut words: Vec<(Vec<String>, usize)> = words.into_iter().collect();
    words.sort();
    while tokens.len() < size {
        let mut counts: HashMap<(String, String), usize> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_insert(0) += n;
            }
        }
        // Most frequent pair; ties broken by the pair's text for determinism.
        let Some(best) = counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(p, _)| p)
        else {
            break;
        };
        let joined = format!("{}{}", best.0, best.1);
        for (w, _) in words.iter_mut() {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == best.0 && w[i + 1] == best.1 {
                    w[i] = joined.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push(format!("{} {}", best.0, best.1));
        if known.insert(joined.clone()) {
            tokens.push(joined);
            types.push(1);
        }
    }
    let mut rng = Rng::new(seed ^ 0x5eed_b0c5);
    let first_normal = 3;
    let mut tries = 0usize;
    while tokens.len() < size && tries < size * 100 {
        tries += 1;
        let n = tokens.len() - first_normal;
        let a = first_normal + (rng.next_u64() % n as u64) as usize;
        let b = first_normal + (rng.next_u64() % n as u64) as usize;
        let joined = format!("{}{}", tokens[a], tokens[b]);
        if joined.chars().count() > 16 || known.contains(&joined) {
            continue;
        }
        merges.push(format!("{} {}", tokens[a], tokens[b]));
        known.insert(joined.clone());
        tokens.push(joined);
        types.push(1);
    }
    SynthVocab {
        tokens,
        types,
        merges,
        bos: 1,
        eos: 2,
    }
}

/// Builds the checkpoint of `preset` in memory. `progress(done, total)` after each tensor.
pub fn synth(
    preset: Preset,
    seed: u64,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<GgufWriter, SynthError> {
    let cfg = SynthConfig::of(preset);
    let vocab = build_vocab(cfg.vocab, seed);
    let mut cfg = cfg;
    cfg.vocab = vocab.tokens.len();
    let we = |e: flint_loader::gguf::GgufError| SynthError(e.to_string());
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("flint.{s}");
    let name = match preset {
        Preset::Tiny => "flint-synth-tiny",
        Preset::Bench => "flint-synth-bench",
    };
    w.add("general.architecture", "flint").map_err(we)?;
    w.add("general.name", name).map_err(we)?;
    w.add(&k("context_length"), cfg.context_length as u32)
        .map_err(we)?;
    w.add(&k("embedding_length"), cfg.d as u32).map_err(we)?;
    w.add(&k("block_count"), cfg.pattern.len() as u32)
        .map_err(we)?;
    w.add(&k("feed_forward_length"), cfg.dense_ff as u32)
        .map_err(we)?;
    w.add(&k("attention.head_count"), cfg.n_heads as u32)
        .map_err(we)?;
    w.add(&k("attention.head_count_kv"), cfg.n_kv_heads as u32)
        .map_err(we)?;
    w.add(&k("attention.key_length"), cfg.head_dim as u32)
        .map_err(we)?;
    w.add(&k("attention.value_length"), cfg.head_dim as u32)
        .map_err(we)?;
    w.add(&k("attention.layer_norm_rms_epsilon"), 1e-6f32)
        .map_err(we)?;
    w.add(&k("attention.sliding_window"), cfg.window as u32)
        .map_err(we)?;
    w.add(&k("attention.sliding_window_pattern"), cfg.pattern.clone())
        .map_err(we)?;
    w.add(&k("rope.freq_base"), cfg.rope_base).map_err(we)?;
    w.add(&k("rope.freq_base_swa"), cfg.rope_base_swa)
        .map_err(we)?;
    w.add(&k("leading_dense_block_count"), cfg.n_dense as u32)
        .map_err(we)?;
    w.add(&k("expert_count"), cfg.n_experts as u32)
        .map_err(we)?;
    w.add(&k("expert_used_count"), cfg.k as u32).map_err(we)?;
    w.add(&k("expert_feed_forward_length"), cfg.expert_ff as u32)
        .map_err(we)?;
    w.add(&k("expert_shared_count"), 1u32).map_err(we)?;
    w.add(
        &k("expert_shared_feed_forward_length"),
        cfg.shared_ff as u32,
    )
    .map_err(we)?;
    w.add(&k("expert_gating_func"), 2u32).map_err(we)?;
    w.add(&k("expert_weights_norm"), true).map_err(we)?;
    w.add(&k("expert_weights_scale"), 1.0f32).map_err(we)?;
    let mut tcfg = TokenizerConfig::bpe(
        PreTokenizer::Gpt2,
        vocab.tokens.clone(),
        vocab.merges.clone(),
        Some(vocab.bos),
        Some(vocab.eos),
    );
    tcfg.token_types = Some(vocab.types.clone());
    tcfg.pad = Some(0);
    for (key, value) in tcfg.to_metadata() {
        w.add(&key, value).map_err(we)?;
    }

    let planned = plan(&cfg);
    let total = planned.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    // Tensors are independent; generate them in parallel, add them in plan order.
    let datas: Vec<Result<Vec<u8>, SynthError>> = planned
        .par_iter()
        .map(|t| {
            let r = make_tensor(seed, t);
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress(n, total);
            r
        })
        .collect();
    for (t, data) in planned.iter().zip(datas) {
        w.add_tensor(&t.name, t.ty, &t.dims, data?).map_err(we)?;
    }
    Ok(w)
}

/// Writes the checkpoint of `preset` to `path`.
pub fn write_synth(
    preset: Preset,
    seed: u64,
    path: &Path,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), SynthError> {
    let w = synth(preset, seed, progress)?;
    w.write_file(path)
        .map_err(|e| SynthError(format!("writing {}: {e}", path.display())))
}

/// The checkpoint of `preset` assembled in memory, without touching the disk (tests).
pub fn synth_model(preset: Preset, seed: u64) -> Result<crate::model::Model, SynthError> {
    let w = synth(preset, seed, &|_, _| {})?;
    let file = flint_loader::gguf::GgufFile::from_bytes(w.to_bytes())
        .map_err(|e| SynthError(format!("reading back the synthetic checkpoint: {e}")))?;
    crate::model::model_from_gguf(&file).map_err(|e| SynthError(e.to_string()))
}
