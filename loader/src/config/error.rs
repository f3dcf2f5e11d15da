//! Errors of the model configurations.

use flint_core::GgmlType;
use thiserror::Error;

use crate::gguf::GgufError;

/// A model file that is not a valid instance of its architecture. Each variant names
/// the key or tensor at fault.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key is missing or has the wrong type (the GGUF error names it).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` names an architecture Flint does not run.
    #[error(
        "general.architecture '{found}' is not supported (supported: {})",
        super::Arch::ALL.map(super::Arch::name).join(", ")
    )]
    UnsupportedArchitecture {
        /// The one in the file.
        found: String,
    },
    /// A key whose value is out of range or inconsistent with others.
    #[error("metadata key '{key}': {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A required tensor is absent.
    #[error("tensor '{tensor}' is missing")]
    MissingTensor {
        /// The tensor.
        tensor: String,
    },
    /// A tensor whose shape differs from what the configuration implies.
    #[error("tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// The shape the configuration implies (GGUF order).
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor whose type is not allowed for it.
    #[error("tensor '{tensor}' has type {found}, expected {expected}")]
    TensorType {
        /// The tensor.
        tensor: String,
        /// The allowed type(s).
        expected: &'static str,
        /// The type in the file.
        found: GgmlType,
    },
    /// A tensor the architecture's description does not account for: Flint refuses it
    /// rather than ignore what the file asks for.
    #[error("tensor '{tensor}' is not part of a {arch} model as Flint runs it")]
    UnexpectedTensor {
        /// The tensor.
        tensor: String,
        /// The architecture.
        arch: &'static str,
    },
    /// Tensors that must come together (or not at all) are only partly present.
    #[error("tensor '{tensor}' is missing while '{present}' is present (they come as a set)")]
    IncompleteSet {
        /// The missing tensor.
        tensor: String,
        /// A present member of the set.
        present: String,
    },
}

impl ConfigError {
    /// An [`Invalid`](Self::Invalid) error.
    pub fn invalid(key: &str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}
