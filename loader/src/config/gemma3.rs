//! Gemma 3 as llama.cpp runs it (`src/models/gemma3.cpp`, `src/llama-hparams.cpp`,
//! `src/llama-model.cpp` of llama.cpp), in our words:
//!
//! - Layers: RMSNorm (`attn_norm`) -> Q/K/V -> per-head RMSNorm of Q and K
//!   (`attn_q_norm`, `attn_k_norm`) -> NeoX RoPE -> Q scaled by `attention_scale` ->
//!   attention -> RMSNorm (`post_attention_norm`) -> residual; RMSNorm (`ffn_norm`) ->
//!   GELU(tanh)-gated FFN -> RMSNorm (`post_ffw_norm`) -> residual.
//! - Input embeddings are multiplied by `sqrt(d)`; `output.weight` absent means the
//!   output projection is `token_embd.weight` (tied).
//! - Sliding window: when `attention.sliding_window` is present and non-zero, the
//!   pattern comes from `attention.sliding_window_pattern` (an array of bools, or a
//!   period `n`; default 6): with a period, layer `i` slides unless `i % n == n - 1`
//!   (every 6th layer, 5, 11, 17, ..., is global). Position `j` is visible from `p` on a
//!   sliding layer when `p - j < W`.
//! - RoPE base: `rope.freq_base` on global layers; `rope.freq_base_swa` on sliding
//!   layers, defaulting to 10000 (llama.cpp's default for this key; Gemma 3's local
//!   base) rather than to the global base.
//! - Attention scale: `1/sqrt(key_length)` (Gemma 3 270M: 1/16), except for the 27B
//!   model (62 layers), where llama.cpp uses `1/sqrt(d / H)` (Gemma's
//!   `query_pre_attn_scalar`).
//! - Optional final logit soft-capping (`final_logit_softcapping`): `c * tanh(x / c)`.
//! - The norm weights in a converted GGUF already include Gemma's `+1`.

use super::util::{embedding_and_output, nonzero, opt_size, positive, size, tensor};
use super::ConfigError;
use crate::gguf::{Array, GgufFile};

const ARCH: &str = "gemma3";

/// Local (sliding-layer) RoPE base when the file does not set `rope.freq_base_swa`.
pub const GEMMA3_ROPE_BASE_SWA_DEFAULT: f32 = 10_000.0;
/// Sliding-window period when the file sets none.
pub const GEMMA3_SWA_PERIOD_DEFAULT: usize = 6;

/// A validated Gemma 3 configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// `gemma3.context_length` (required).
    pub context_length: usize,
    /// Hidden size `d` (`embedding_length`).
    pub embedding_length: usize,
    /// Layers (`block_count`).
    pub block_count: usize,
    /// FFN width (`feed_forward_length`).
    pub feed_forward_length: usize,
    /// Query heads (`attention.head_count`).
    pub head_count: usize,
    /// Key/value heads (`attention.head_count_kv`, default `head_count`).
    pub head_count_kv: usize,
    /// Q/K head size (`attention.key_length`, default `d / H`).
    pub key_length: usize,
    /// V head size (`attention.value_length`, default `d / H`).
    pub value_length: usize,
    /// RMSNorm epsilon (`attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Sliding window `W` (`attention.sliding_window`); `None` = all layers global.
    pub sliding_window: Option<usize>,
    /// `true` = layer `i` is a sliding-window layer.
    pub swa_layers: Vec<bool>,
    /// RoPE base of global layers (`rope.freq_base`, default 10000).
    pub rope_freq_base: f32,
    /// RoPE base of sliding layers (`rope.freq_base_swa`, default 10000).
    pub rope_freq_base_swa: f32,
    /// Rotated dims (`rope.dimension_count`, default `key_length`).
    pub rope_dimension_count: usize,
    /// Factor applied to Q before `QK^T` (no further `1/sqrt(dk)`).
    pub attention_scale: f32,
    /// Factor applied to the input embeddings: `sqrt(d)`.
    pub embedding_scale: f32,
    /// Final logit soft-capping `c` (`final_logit_softcapping`), when set and non-zero.
    pub final_logit_softcapping: Option<f32>,
}

/// What [`Gemma3Config::check_tensors`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gemma3Tensors {
    /// `V`, from `token_embd.weight`.
    pub vocab_size: usize,
    /// `output.weight` absent: tied to `token_embd.weight`.
    pub tied_output: bool,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

impl Gemma3Config {
    /// Reads and validates the `gemma3.*` keys the way llama.cpp interprets them.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?;
        if arch != ARCH {
            return Err(ConfigError::WrongArchitecture {
                expected: ARCH,
                found: arch.to_string(),
            });
        }
        let context_length = size(f, &key("context_length"))?;
        let d = size(f, &key("embedding_length"))?;
        let l = size(f, &key("block_count"))?;
        let ff = size(f, &key("feed_forward_length"))?;
        let h = size(f, &key("attention.head_count"))?;
        let hkv_key = key("attention.head_count_kv");
        let hkv = opt_size(f, &hkv_key)?.unwrap_or(h);
        if h % hkv != 0 {
            return Err(ConfigError::invalid(
                &hkv_key,
                format!("head_count {h} is not a multiple of head_count_kv {hkv}"),
            ));
        }
        let dk_key = key("attention.key_length");
        let default_head = if d % h == 0 { Some(d / h) } else { None };
        let need_head = |k: &str| {
            default_head.ok_or_else(|| {
                ConfigError::invalid(
                    k,
                    format!("absent, and embedding_length {d} is not a multiple of head_count {h}"),
                )
            })
        };
        let dk = match opt_size(f, &dk_key)? {
            Some(v) => v,
            None => need_head(&dk_key)?,
        };
        let dv_key = key("attention.value_length");
        let dv = match opt_size(f, &dv_key)? {
            Some(v) => v,
            None => need_head(&dv_key)?,
        };
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;

        let sliding_window = f
            .opt_usize(&key("attention.sliding_window"))?
            .filter(|&w| w > 0);
        let pat_key = key("attention.sliding_window_pattern");
        let swa_layers = match sliding_window {
            None => vec![false; l],
            Some(_) => match f.get(&pat_key) {
                Some(crate::gguf::Value::Array(Array::Bool(v))) => {
                    if v.len() != l {
                        return Err(ConfigError::invalid(
                            &pat_key,
                            format!("has {} entries, block_count is {l}", v.len()),
                        ));
                    }
                    v.clone()
                }
                Some(_) => {
                    let n = f.get_usize(&pat_key)?;
                    period_pattern(n, l)
                }
                None => period_pattern(GEMMA3_SWA_PERIOD_DEFAULT, l),
            },
        };

        let base_key = key("rope.freq_base");
        let rope_freq_base = match f.opt_f32(&base_key)? {
            Some(v) => positive(&base_key, v)?,
            None => 10_000.0,
        };
        let swa_base_key = key("rope.freq_base_swa");
        let rope_freq_base_swa = match f.opt_f32(&swa_base_key)? {
            Some(v) => positive(&swa_base_key, v)?,
            None => GEMMA3_ROPE_BASE_SWA_DEFAULT,
        };
        let rot_key = key("rope.dimension_count");
        let n_rot = opt_size(f, &rot_key)?.unwrap_or(dk);
        if n_rot % 2 != 0 || n_rot > dk {
            return Err(ConfigError::invalid(
                &rot_key,
                format!("is {n_rot}: it must be even and at most key_length {dk}"),
            ));
        }
        // llama.cpp: the 27B model (62 layers) scales by 1/sqrt(d/H), the rest by
        // 1/sqrt(key_length).
        let attention_scale = if l == 62 {
            1.0 / ((d / h) as f32).sqrt()
        } else {
            1.0 / (dk as f32).sqrt()
        };
        let cap = f
            .opt_f32(&key("final_logit_softcapping"))?
            .filter(|&c| c != 0.0);
        if let Some(c) = cap {
            positive(&key("final_logit_softcapping"), c)?;
        }
        nonzero(&dk_key, dk)?;
        Ok(Gemma3Config {
            context_length,
            embedding_length: d,
            block_count: l,
            feed_forward_length: ff,
            head_count: h,
            head_count_kv: hkv,
            key_length: dk,
            value_length: dv,
            rms_eps,
            sliding_window,
            swa_layers,
            rope_freq_base,
            rope_freq_base_swa,
            rope_dimension_count: n_rot,
            attention_scale,
            embedding_scale: (d as f32).sqrt(),
            final_logit_softcapping: cap,
        })
    }

    /// True when layer `i` is a sliding-window layer.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.swa_layers.get(layer).copied().unwrap_or(false)
    }

    /// RoPE base of layer `i`.
    pub fn rope_base(&self, layer: usize) -> f32 {
        if self.is_sliding(layer) {
            self.rope_freq_base_swa
        } else {
            self.rope_freq_base
        }
    }

    /// Checks the 2 + 13 per layer tensors llama.cpp loads for Gemma 3 (output optional).
    pub fn check_tensors(&self, f: &GgufFile) -> Result<Gemma3Tensors, ConfigError> {
        let d = self.embedding_length;
        let (h, hkv, dk, dv, ff) = (
            self.head_count,
            self.head_count_kv,
            self.key_length,
            self.value_length,
            self.feed_forward_length,
        );
        let (vocab_size, tied_output) = embedding_and_output(f, d)?;
        for i in 0..self.block_count {
            let n = |s: &str| format!("blk.{i}.{s}");
            tensor(f, &n("attn_norm.weight"), &[d])?;
            tensor(f, &n("attn_q.weight"), &[d, h * dk])?;
            tensor(f, &n("attn_k.weight"), &[d, hkv * dk])?;
            tensor(f, &n("attn_v.weight"), &[d, hkv * dv])?;
            tensor(f, &n("attn_output.weight"), &[h * dk, d])?;
            tensor(f, &n("post_attention_norm.weight"), &[d])?;
            tensor(f, &n("attn_q_norm.weight"), &[dk])?;
            tensor(f, &n("attn_k_norm.weight"), &[dk])?;
            tensor(f, &n("ffn_norm.weight"), &[d])?;
            tensor(f, &n("ffn_gate.weight"), &[d, ff])?;
            tensor(f, &n("ffn_up.weight"), &[d, ff])?;
            tensor(f, &n("ffn_down.weight"), &[ff, d])?;
            tensor(f, &n("post_ffw_norm.weight"), &[d])?;
        }
        Ok(Gemma3Tensors {
            vocab_size,
            tied_output,
        })
    }
}

/// llama.cpp's `set_swa_pattern(n, dense_first = false)`: layer `i` slides unless it is
/// the last of each group of `n`; `n = 0` makes every layer slide.
fn period_pattern(n: usize, layers: usize) -> Vec<bool> {
    (0..layers).map(|i| n == 0 || i % n < n - 1).collect()
}
