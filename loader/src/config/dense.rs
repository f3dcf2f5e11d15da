//! Plain dense decoder configurations as llama.cpp runs them: `llama` (Llama 2/3 and
//! relatives, RoPE in the original interleaved "normal" pairing) and `qwen3` (NeoX RoPE
//! plus a per-head RMSNorm of Q and K). Mixture-of-experts llama files (Mixtral) are
//! refused.

use super::util::{embedding_and_output, opt_size, positive, size, tensor};
use super::ConfigError;
use crate::gguf::GgufFile;

/// Which dense architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseArch {
    /// `general.architecture = "llama"`.
    Llama,
    /// `general.architecture = "qwen3"`.
    Qwen3,
}

impl DenseArch {
    /// The architecture name in the file.
    pub fn name(self) -> &'static str {
        match self {
            DenseArch::Llama => "llama",
            DenseArch::Qwen3 => "qwen3",
        }
    }

    /// True when RoPE pairs `i` with `i + n_rot/2` (NeoX); false for llama's adjacent
    /// pairs `(2i, 2i+1)`.
    pub fn rope_neox(self) -> bool {
        matches!(self, DenseArch::Qwen3)
    }

    /// True when Q and K get a per-head RMSNorm (`attn_q_norm`, `attn_k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, DenseArch::Qwen3)
    }
}

/// A validated llama or qwen3 configuration. Keys are prefixed with the architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseConfig {
    /// The architecture.
    pub arch: DenseArch,
    /// `context_length` (required).
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
    /// RoPE base (`rope.freq_base`, default 10000).
    pub rope_freq_base: f32,
    /// Rotated dims (`rope.dimension_count`, default `key_length`; llama requires equal).
    pub rope_dimension_count: usize,
}

/// What [`DenseConfig::check_tensors`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseTensors {
    /// `V`, from `token_embd.weight`.
    pub vocab_size: usize,
    /// `output.weight` absent: tied to `token_embd.weight`.
    pub tied_output: bool,
}

impl DenseConfig {
    /// Reads and validates a `llama` or `qwen3` file.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let found = f.get_str("general.architecture")?;
        let arch = match found {
            "llama" => DenseArch::Llama,
            "qwen3" => DenseArch::Qwen3,
            other => {
                return Err(ConfigError::WrongArchitecture {
                    expected: "llama or qwen3",
                    found: other.to_string(),
                })
            }
        };
        let key = |k: &str| format!("{}.{k}", arch.name());
        if let Some(e) = f.opt_usize(&key("expert_count"))?.filter(|&e| e > 0) {
            return Err(ConfigError::invalid(
                &key("expert_count"),
                format!(
                    "is {e}: mixture-of-experts {} files are not supported",
                    arch.name()
                ),
            ));
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
        let head = |k: String| -> Result<usize, ConfigError> {
            match opt_size(f, &k)? {
                Some(v) => Ok(v),
                None if d % h == 0 => Ok(d / h),
                None => Err(ConfigError::invalid(
                    &k,
                    format!("absent, and embedding_length {d} is not a multiple of head_count {h}"),
                )),
            }
        };
        let dk = head(key("attention.key_length"))?;
        let dv = head(key("attention.value_length"))?;
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;
        let base_key = key("rope.freq_base");
        let rope_freq_base = match f.opt_f32(&base_key)? {
            Some(v) => positive(&base_key, v)?,
            None => 10_000.0,
        };
        let rot_key = key("rope.dimension_count");
        let n_rot = opt_size(f, &rot_key)?.unwrap_or(dk);
        if n_rot % 2 != 0 || n_rot > dk || (arch == DenseArch::Llama && n_rot != dk) {
            return Err(ConfigError::invalid(
                &rot_key,
                format!(
                    "is {n_rot}: it must be even and at most key_length {dk}{}",
                    if arch == DenseArch::Llama {
                        " (llama: equal to it)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(DenseConfig {
            arch,
            context_length,
            embedding_length: d,
            block_count: l,
            feed_forward_length: ff,
            head_count: h,
            head_count_kv: hkv,
            key_length: dk,
            value_length: dv,
            rms_eps,
            rope_freq_base,
            rope_dimension_count: n_rot,
        })
    }

    /// Checks the tensors llama.cpp loads for the architecture (output optional).
    pub fn check_tensors(&self, f: &GgufFile) -> Result<DenseTensors, ConfigError> {
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
            tensor(f, &n("attn_output.weight"), &[h * dv, d])?;
            if self.arch.qk_norm() {
                tensor(f, &n("attn_q_norm.weight"), &[dk])?;
                tensor(f, &n("attn_k_norm.weight"), &[dk])?;
            }
            tensor(f, &n("ffn_norm.weight"), &[d])?;
            tensor(f, &n("ffn_gate.weight"), &[d, ff])?;
            tensor(f, &n("ffn_up.weight"), &[d, ff])?;
            tensor(f, &n("ffn_down.weight"), &[ff, d])?;
        }
        Ok(DenseTensors {
            vocab_size,
            tied_output,
        })
    }
}
