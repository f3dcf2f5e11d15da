//! Model configurations read from GGUF metadata and checked against the file's tensors.
//!
//! - [`FlintConfig`]: the Flint MoE architecture (`shared/spec/FLINT.md`).
//! - [`Gemma3Config`]: Gemma 3 as llama.cpp runs it.
//! - [`DenseConfig`]: plain dense `llama` and `qwen3` files.
//! - [`ModelConfig`]: whichever of them `general.architecture` names.
//!
//! Every error names the key or tensor at fault ([`ConfigError`]).

mod dense;
mod error;
mod flint;
mod gemma3;

pub use dense::{DenseArch, DenseConfig, DenseTensors};
pub use error::ConfigError;
pub use flint::{FlintConfig, FlintLayerTensors, FlintTensors, GatingFunc, MoeConfig};
pub use gemma3::{
    Gemma3Config, Gemma3Tensors, GEMMA3_ROPE_BASE_SWA_DEFAULT, GEMMA3_SWA_PERIOD_DEFAULT,
};

use crate::gguf::GgufFile;

/// A model configuration of any supported architecture.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    /// `general.architecture = "flint"`.
    Flint(FlintConfig),
    /// `general.architecture = "gemma3"`.
    Gemma3(Gemma3Config),
    /// `general.architecture = "llama"` or `"qwen3"` (dense).
    Dense(DenseConfig),
}

impl ModelConfig {
    /// Reads the configuration of the architecture that `general.architecture` names.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?;
        match arch {
            "flint" => FlintConfig::from_gguf(f).map(ModelConfig::Flint),
            "gemma3" => Gemma3Config::from_gguf(f).map(ModelConfig::Gemma3),
            "llama" | "qwen3" => DenseConfig::from_gguf(f).map(ModelConfig::Dense),
            other => Err(ConfigError::UnsupportedArchitecture {
                found: other.to_string(),
            }),
        }
    }

    /// The architecture name.
    pub fn architecture(&self) -> &'static str {
        match self {
            ModelConfig::Flint(_) => "flint",
            ModelConfig::Gemma3(_) => "gemma3",
            ModelConfig::Dense(c) => c.arch.name(),
        }
    }

    /// Largest supported position count (`context_length`).
    pub fn context_length(&self) -> usize {
        match self {
            ModelConfig::Flint(c) => c.context_length,
            ModelConfig::Gemma3(c) => c.context_length,
            ModelConfig::Dense(c) => c.context_length,
        }
    }

    /// Number of layers.
    pub fn block_count(&self) -> usize {
        match self {
            ModelConfig::Flint(c) => c.block_count,
            ModelConfig::Gemma3(c) => c.block_count,
            ModelConfig::Dense(c) => c.block_count,
        }
    }

    /// Checks every tensor the architecture needs (names, shapes, required types).
    pub fn check_tensors(&self, f: &GgufFile) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Flint(c) => c.check_tensors(f).map(|_| ()),
            ModelConfig::Gemma3(c) => c.check_tensors(f).map(|_| ()),
            ModelConfig::Dense(c) => c.check_tensors(f).map(|_| ()),
        }
    }
}

/// Helpers shared by the architectures.
pub(crate) mod util {
    use flint_core::GgmlType;

    use super::ConfigError;
    use crate::gguf::{GgufFile, TensorInfo};

    /// A size key that must be present and non-zero.
    pub fn size(f: &GgufFile, key: &str) -> Result<usize, ConfigError> {
        let v = f.get_usize(key)?;
        nonzero(key, v)
    }

    /// An optional size key that, when present, must be non-zero.
    pub fn opt_size(f: &GgufFile, key: &str) -> Result<Option<usize>, ConfigError> {
        f.opt_usize(key)?.map(|v| nonzero(key, v)).transpose()
    }

    pub fn nonzero(key: &str, v: usize) -> Result<usize, ConfigError> {
        if v == 0 {
            Err(ConfigError::invalid(key, "must not be zero"))
        } else {
            Ok(v)
        }
    }

    /// A float that must be finite and positive.
    pub fn positive(key: &str, v: f32) -> Result<f32, ConfigError> {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(ConfigError::invalid(
                key,
                format!("must be a finite positive number, found {v}"),
            ))
        }
    }

    /// The tensor `name` with exactly `dims`.
    pub fn tensor<'a>(
        f: &'a GgufFile,
        name: &str,
        dims: &[usize],
    ) -> Result<&'a TensorInfo, ConfigError> {
        let t = f.tensor(name).ok_or_else(|| ConfigError::MissingTensor {
            tensor: name.to_string(),
        })?;
        shape(t, dims)?;
        Ok(t)
    }

    /// The tensor `name` if present, then with exactly `dims`.
    pub fn opt_tensor<'a>(
        f: &'a GgufFile,
        name: &str,
        dims: &[usize],
    ) -> Result<Option<&'a TensorInfo>, ConfigError> {
        match f.tensor(name) {
            None => Ok(None),
            Some(t) => shape(t, dims).map(|()| Some(t)),
        }
    }

    pub fn shape(t: &TensorInfo, dims: &[usize]) -> Result<(), ConfigError> {
        if t.dims != dims {
            return Err(ConfigError::TensorShape {
                tensor: t.name.clone(),
                expected: dims.to_vec(),
                found: t.dims.clone(),
            });
        }
        Ok(())
    }

    /// The tensors every decoder here shares outside its layers: `token_embd.weight`
    /// `[d, V]` (gives the vocabulary size), an f32 `output_norm.weight` `[d]`, and an
    /// optional `output.weight` `[d, V]`. Returns `(V, tied)`, `tied` when the output
    /// projection is absent and reuses the embedding.
    pub fn embedding_and_output(f: &GgufFile, d: usize) -> Result<(usize, bool), ConfigError> {
        let emb = f
            .tensor("token_embd.weight")
            .ok_or_else(|| ConfigError::MissingTensor {
                tensor: "token_embd.weight".into(),
            })?;
        let vocab_size = match emb.dims.as_slice() {
            [e, v] if *e == d && *v > 0 => *v,
            _ => {
                return Err(ConfigError::TensorShape {
                    tensor: emb.name.clone(),
                    expected: vec![d, emb.dims.get(1).copied().unwrap_or(0).max(1)],
                    found: emb.dims.clone(),
                })
            }
        };
        f32_type(tensor(f, "output_norm.weight", &[d])?)?;
        let tied_output = opt_tensor(f, "output.weight", &[d, vocab_size])?.is_none();
        Ok((vocab_size, tied_output))
    }

    /// Requires type F32 of a tensor.
    pub fn f32_type(t: &TensorInfo) -> Result<(), ConfigError> {
        if t.ty != GgmlType::F32 {
            return Err(ConfigError::TensorType {
                tensor: t.name.clone(),
                expected: "F32",
                found: t.ty,
            });
        }
        Ok(())
    }
}
