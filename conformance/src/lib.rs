//! `flint-conformance`: one suite, run unchanged against every Flint backend.
//!
//! The suite is data: [`all_cases`] lists [`Case`]s (op, block type, shape, seed, NMSE
//! bound) covering every [`Op`](flint_hal::Op) of the HAL and every block type of
//! [`GgmlType::DEQUANTIZABLE`](flint_hal::GgmlType::DEQUANTIZABLE). [`run_suite`] runs
//! them on a [`Device`](flint_hal::Device): a case the device does not claim
//! ([`Device::supports`](flint_hal::Device::supports)) is skipped, never failed; every
//! other case is compared against the `flint-core` scalar references ([`reference`])
//! with an NMSE bound, checked for NaN/Inf, for writes outside its outputs (guard
//! regions, [`check::Guarded`]) and for panics.
//!
//! Cases run the way the engine does: every input is uploaded into a tensor of the
//! device under test ([`Device::upload_new`](flint_hal::Device::upload_new)), index
//! lists into its index tensors
//! ([`Device::upload_indices`](flint_hal::Device::upload_indices); `get_rows` also
//! from host ids), every
//! output is a view inside a tensor it [allocated](flint_hal::Device::alloc) (between
//! guard regions, [`check::DeviceGuarded`]), and results are downloaded to be checked.
//! `copy[whole]`, `copy[between]` and `copy[within]` check device-side copies bit for
//! bit (sub-ranges at offsets, between tensors and inside one); `copy[transfers]` checks
//! the count of host-device traffic ([`Transfers`](flint_hal::Transfers)): each upload
//! and download of n values one call of 4n bytes (an index upload too), and nothing
//! moved by a chain of ops on device tensors (`rms_norm`, `matmul`, `add`, `scale`,
//! `rope` at positions from an index tensor), nor any host argument passed when the
//! index tensor lives in the device's memory.
//!
//! Some cases are regressions for defects engines of this kind have shipped; each has
//! a label and a test in `tests/regressions.rs` that breaks a working device in exactly
//! that way and checks the suite catches it:
//! - `paged_attention[sink<max]`: sinks below the score maximum (a sink term seeded as
//!   `exp(0)` instead of `exp(sink - m_final)`);
//! - `add_rms_norm[residual]`: the residual is checked after the call, not only the
//!   normed output (a residual added twice);
//! - `rms_norm[per-head]`: a per-head norm over `[rows, heads * head_dim]`, every head
//!   checked on its own (a norm that corrupts its own input view);
//! - `paged_attention[kv-groups]`: two KV groups with different block ids for the same
//!   positions, each written through its own slot mapping.

#![forbid(unsafe_code)]

pub mod case;
pub mod check;
pub mod data;
pub mod exec;
pub mod reference;
pub mod rng;
pub mod suite;

pub use case::{all_cases, AttnSpec, Case, SeqSpec, Shape, Sinks};
pub use exec::{run_case, Outcome};
pub use suite::{run_suite, CaseResult, Counts, DeviceReport, SuiteOptions, DEFAULT_SEED};

/// The registry of this build, from [`flint_backends`]: every backend it links (`cpu`,
/// `ref`, `tt`). The suite takes it from there, not from the engine, so that it depends
/// on nothing above the HAL and the backends.
pub use flint_backends::registry;
