//! Synthetic Flint checkpoints (`flint synth`, architecture `flint`).
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
//! Besides the shared rules of [`super`], sinks are `N(-0.5, 0.5)` (mostly below a
//! typical score maximum, but close enough to matter) and the selection bias `N(0, 0.2)`
//! (the size of the spread of sigmoid scores, so it changes the choice now and then).

use std::path::Path;

use flint_core::GgmlType;
use flint_loader::gguf::GgufWriter;
use flint_loader::tokenizer::{PreTokenizer, TokenizerConfig};

use super::vocab::build_vocab;
use super::{add_tensors, plan_params, write_file, Fill, Planned, SynthError};

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

fn plan(cfg: &SynthConfig) -> Vec<Planned> {
    let mut v = Vec::new();
    let mut add = |name, ty, dims, fill| v.push(Planned::new(name, ty, dims, fill));
    let mat = |inp: usize| Fill::Normal {
        mean: 0.0,
        std: 1.0 / (inp as f32).sqrt(),
    };
    let norm = || Fill::Normal {
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
    add("output_norm.weight".into(), GgmlType::F32, vec![d], norm());
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
        add(p("attn_norm.weight"), GgmlType::F32, vec![d], norm());
        add(p("attn_q.weight"), cfg.ty_main, vec![d, h * dh], mat(d));
        add(p("attn_k.weight"), cfg.ty_main, vec![d, hkv * dh], mat(d));
        add(p("attn_v.weight"), cfg.ty_hi, vec![d, hkv * dh], mat(d));
        add(p("attn_q_norm.weight"), GgmlType::F32, vec![dh], norm());
        add(p("attn_k_norm.weight"), GgmlType::F32, vec![dh], norm());
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
        add(p("ffn_norm.weight"), GgmlType::F32, vec![d], norm());
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

/// Counts parameters of a preset (all tensor elements).
pub fn param_count(preset: Preset) -> usize {
    plan_params(&plan(&SynthConfig::of(preset)))
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

    add_tensors(&mut w, &plan(&cfg), seed, &Default::default(), progress)?;
    Ok(w)
}

/// Writes the checkpoint of `preset` to `path`.
pub fn write_synth(
    preset: Preset,
    seed: u64,
    path: &Path,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), SynthError> {
    write_file(&synth(preset, seed, progress)?, path)
}

/// The checkpoint of `preset` assembled in memory, without touching the disk (tests).
pub fn synth_model(preset: Preset, seed: u64) -> Result<crate::model::Model, SynthError> {
    let w = synth(preset, seed, &|_, _| {})?;
    let file = flint_loader::gguf::GgufFile::from_bytes(w.to_bytes())
        .map_err(|e| SynthError(format!("reading back the synthetic checkpoint: {e}")))?;
    crate::model::model_from_gguf(&file).map_err(|e| SynthError(e.to_string()))
}
