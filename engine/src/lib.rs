//! `flint-engine`: model assembly, the reference and device forwards, the KV cache
//! manager, the scheduler, the sampler, the server and the `flint` CLI.

#![forbid(unsafe_code)]

pub mod cli;
pub mod devices;
pub mod kv_cache;
pub mod logging;
pub mod model_path;
pub mod sampler;
pub mod model;
pub mod reference;
pub mod forward;
pub mod synth;
pub mod generate;
pub mod scheduler;
pub mod llm_engine;
pub mod server;
pub mod paged;
pub mod serving;
