//! `flint-hal`: the device interface every Flint backend implements.
//!
//! # The contract
//!
//! A backend is a type implementing [`Device`]. The engine only ever holds it as
//! `Arc<dyn Device>` ([`DeviceRef`]), chosen at run time by name through a [`Registry`]
//! (`FLINT_DEVICE`, default `cpu`). The trait is object-safe and synchronous from the
//! caller's side: when a method returns, its outputs are what every later call on the
//! device sees, and host memory it was handed (a host view, a `download`'s destination,
//! routing outputs) is written. A device may queue work on its own tensors and finish it
//! before the next host-visible result, so one that records a whole step and replays it
//! (as CUDA graphs or Tenstorrent trace do) can do so inside [`Device::run_step`], which
//! the engine calls once per forward step.
//!
//! **Data.** Activations, scratch and recurrent states are row-major `f32`
//! [`Tensor`]s that the device allocates ([`Device::alloc`]): host memory on devices that
//! compute on the host, device buffers behind a handle on accelerators. Ops take
//! [`View`]s and [`ViewMut`]s of them; host memory is always a valid view, and an
//! accelerator handed one moves it in and out itself. Data crosses between host and
//! device only through [`Device::upload`] and [`Device::download`] (and such host
//! views), and every device counts it ([`Transfers`]). Per step the engine uploads the
//! step's index lists (token ids, positions, slot mappings, block tables) once, as one
//! [`IndexTensor`] ([`Device::upload_indices`]) that ops take [`IndexView`]s of, and
//! downloads the logits rows it samples from. MoE layers route on the device: the
//! chosen experts go into an index tensor of the device ([`Device::alloc_indices`]) and
//! their weights into a tensor, which the expert ops read there. Model constants that
//! ops take besides weights (norm weights, biases, attention sinks, RoPE frequency
//! factors) are tensors uploaded once at staging. Weights are *staged* once:
//! [`Device::stage`] receives the raw GGUF bytes of a tensor ([`WeightDesc`]) and returns
//! an opaque [`WeightHandle`]; the backend decides whether it keeps the block encoding
//! as it is ("keep-quant") or expands it, and reports what it holds resident and what it
//! must stream from the host ([`StagedInfo`]). A backend that keeps its own copy of a
//! tensor (repacked, say) may call [`WeightSource::release_resident`] so that the
//! owner of the file's bytes gives their pages back (the bytes stay readable, see
//! [`ReleaseHook`]). KV caches live in device-owned
//! [`KvBuffer`]s, written through a slot mapping and read by [`Device::paged_attention`]
//! through per-sequence block tables.
//!
//! **Shapes.** Dimensions are in GGUF order: the first is the contiguous one. A matrix
//! weight `[in, out]` is `out` rows of `in` values; `matmul` computes
//! `out[i][o] = sum_k W[o][k] * x[i][k]` for each of the `m` activation rows. An expert
//! tower is `[in, out, E]`: `E` such matrices one after another.
//!
//! **Errors.** Only what the caller cannot foresee is an error ([`HalError`]): a backend
//! that is unavailable, an op or encoding it does not support, memory it does not have,
//! a runtime failure. Misuse that the caller can check (slice lengths that do not match
//! the shapes it passed, a handle from another device) is a bug in the caller and
//! panics, as documented on each method.
//!
//! **Capabilities.** [`Device::supports`] says, per op and block type, what the backend
//! implements. "Not supported" is an answer, not a failure: the conformance suite skips
//! such cases and the engine can refuse a model up front with a clear error.
//!
//! **Numerics.** Results are checked against the scalar references of `flint-core` by
//! the `flint-conformance` suite with normalised-MSE bounds per block type. A backend may
//! quantize activations (as ggml pairs them: Q8_K for K-quants and IQ types, Q8_0/Q8_1
//! for legacy types) but must not be less accurate than that.

#![forbid(unsafe_code)]

pub mod ab_test;
mod device;
mod error;
mod ops;
mod registry;
mod tensor;
mod weights;

pub use device::{matmul_glu_composed, Device, DeviceCounters, DeviceRef};
pub use error::{HalError, HalErrorKind};
pub use ops::{
    bias_rows, fanout, AttnSeq, DeltaNetShape, Gating, Glu, KvBuffer, KvLayout, Op, PagedAttention,
    RopeConfig, RopeKind, RopeParams, RoutingConfig, Yarn, NO_BLOCK,
};
pub use registry::{Availability, BackendEntry, DeviceOptions, Registry};
pub use tensor::{
    DeviceBuffer, IndexTensor, IndexView, IndexViewMut, Tensor, TransferCounter, Transfers, View,
    ViewMut,
};
pub use weights::{
    PlannedWeight, ReleaseHook, SharedBytes, StagedInfo, StagingPlan, Tier, Weight, WeightDesc,
    WeightHandle, WeightKind, WeightSource,
};

pub use flint_core::GgmlType;
