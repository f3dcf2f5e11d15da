//! `flint-engine`: model assembly, the reference and device forwards, the KV cache
//! manager, the scheduler, the sampler, the server and the `flint` CLI.

#![forbid(unsafe_code)]

pub mod cli;
pub mod devices;
pub mod forward;
pub mod generate;
pub mod kv_cache;
pub mod llm_engine;
pub mod logging;
pub mod model;
pub mod model_path;
pub mod paged;
pub mod profile;
pub mod reference;
pub mod sampler;
pub mod scheduler;
pub mod server;
pub mod serving;
pub mod synth;
