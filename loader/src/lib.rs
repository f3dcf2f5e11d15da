//! `flint-loader`: GGUF reading and writing, model configurations, tokenizers, chat
//! templates and the default-model fetch.

pub mod chat;
pub mod config;
pub mod fetch;
pub mod gguf;
pub mod tokenizer;

pub use config::{ConfigError, ModelDesc};
pub use gguf::{Array, GgufError, GgufFile, GgufWriter, SharedBytes, TensorInfo, Value, ValueType};
