//! `flint-engine`: model assembly, the reference and device forwards, the KV cache
//! manager, the scheduler, the sampler, the server and the `flint` CLI.
//!
//! The modules follow a request's stages: [`model`] (assembly from the loader's
//! description, staging on a device), [`forward`] (device and reference), [`kv`] (cache
//! manager, paged views), [`sched`] (scheduler, engine loop), [`sample`], [`serve`] (the
//! HTTP API) and [`cli`] (each `flint` subcommand; nothing else imports it).

#![forbid(unsafe_code)]

pub mod cli;
pub mod forward;
pub mod kv;
pub mod model;
pub mod sample;
pub mod sched;
pub mod serve;
pub mod synth;
