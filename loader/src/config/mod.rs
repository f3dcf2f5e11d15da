//! The model description: every hyper-parameter a model file sets, read once from the
//! GGUF metadata, validated, and checked against the file's tensors ([`ModelDesc`]).
//!
//! [`ModelDesc::from_gguf`] is the one entry point. It reads the keys of the
//! architecture `general.architecture` names ([`Arch`]: flint, gemma3, llama, qwen2,
//! qwen3, the MoE families qwen3moe, glm4moe, mimo2, gpt-oss in `moe.rs`, gemma4 in
//! `gemma4.rs`, qwen35moe in `qwen35moe.rs`) the way llama.cpp interprets them, then checks every tensor: required ones
//! present with the implied shapes, optional ones the architecture allows, and any other
//! tensor refused by name. A key Flint does not implement (an unknown
//! `rope.scaling.type`, a mixture-of-experts llama, per-layer head sizes) is refused by
//! name too. Every error names the key or tensor at fault ([`ConfigError`]).

mod desc;
mod error;
mod gemma4;
mod moe;
mod parse;
mod qwen35moe;
mod tensors;

pub use desc::{
    Activation, Arch, AttnBiases, DeltaNetDesc, DeltaNetShape, FfnDesc, LayerDesc, Mixer,
    ModelDesc, MoeDesc, NormPlacement, RopeDesc, RopeKind, Yarn,
};
pub use error::ConfigError;

use crate::gguf::GgufFile;

impl ModelDesc {
    /// Reads, validates and tensor-checks the model in `f`.
    pub fn from_gguf(f: &GgufFile) -> Result<ModelDesc, ConfigError> {
        let name = f.get_str("general.architecture")?;
        let arch = Arch::from_name(name).ok_or_else(|| ConfigError::UnsupportedArchitecture {
            found: name.to_string(),
        })?;
        if arch == Arch::Gemma4 {
            let mut desc = gemma4::read(f)?;
            gemma4::check_tensors(&mut desc, f)?;
            return Ok(desc);
        }
        if arch == Arch::Qwen35Moe {
            let mut desc = qwen35moe::read(f)?;
            qwen35moe::check_tensors(&mut desc, f)?;
            return Ok(desc);
        }
        if arch.is_moe_family() {
            let mut desc = moe::read(f, arch)?;
            moe::check_tensors(&mut desc, f)?;
            return Ok(desc);
        }
        let mut desc = parse::read(f, arch)?;
        tensors::check(&mut desc, f)?;
        Ok(desc)
    }
}

/// Value checks shared by the readers.
pub(crate) mod util {
    use super::ConfigError;

    /// `v`, refused when zero.
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
}
