//! GGUF files: a validating zero-copy reader ([`GgufFile`]), a writer ([`GgufWriter`]),
//! metadata values ([`Value`], [`Array`]) and the errors of both ([`GgufError`]).
//!
//! What the reader checks, and why, is written up in `docs/gguf.md`.

mod error;
mod reader;
mod residence;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{
    GgufFile, ReleaseHook, SharedBytes, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC,
    MAX_ARRAY_DEPTH, MAX_DIMS,
};
pub use residence::{LoadMode, Residence};
pub use value::{Array, Summary, Value, ValueType};
pub use writer::GgufWriter;
