//! GGUF files: a validating zero-copy reader ([`GgufFile`]), a writer ([`GgufWriter`]),
//! metadata values ([`Value`], [`Array`]) and the errors of both ([`GgufError`]). A model
//! split into shards by llama.cpp's `gguf-split` opens from its first shard as one file.
//!
//! What the reader checks, and why, is written up in `docs/gguf.md`.

mod error;
mod reader;
mod residence;
pub mod split;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{
    GgufFile, ReleaseHook, SharedBytes, TensorBytes, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT,
    GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
pub use residence::{LoadMode, Residence};
pub use value::{Array, Summary, Value, ValueType};
pub use writer::{GgufStream, GgufWriter};
