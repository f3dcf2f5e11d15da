//! `flint-hal-ref`: Flint's reference backend, `ref`.
//!
//! Every op of the [`Device`](flint_hal::Device) interface is computed here by the
//! `flint-core` scalar kernels, the same functions the conformance suite
//! (`conformance/src/reference.rs`) and the engine's reference forward
//! (`engine/src/forward/reference.rs`) compare against. No SIMD, no threads, no
//! `unsafe`: it is the slowest correct device, and the worked example of
//! `docs/porting.md`. A port to a new accelerator can start from a copy of this crate
//! and replace one op at a time, running `flint-conformance --device NAME` after each.
//!
//! Where things live:
//!
//! - `device.rs`: [`RefDevice`] and its `Device` implementation, one method per op, each
//!   commented with what it computes and which `flint-core` function computes it.
//! - `weight.rs`: staging ([`RefWeight`]): which encodings the device can compute with,
//!   and the weight as it keeps it.
//! - `kv.rs`: the KV cache ([`RefKv`]), its writes through a slot mapping, and paged
//!   attention through per-sequence block tables.
//!
//! **Weights are kept as blocks.** A staged weight holds the tensor's bytes exactly as
//! in the file (a shared reference to the loader's buffer, no copy), and every matmul
//! reads them through `flint_core::dot::matvec_f32`, which quantizes each activation row
//! to the weight type's `vec_dot_type` (Q8_K, Q8_0 or Q8_1, as ggml pairs them) and
//! takes the scalar block dot products. We chose this over dequantizing to f32 at
//! staging because it keeps a model's memory at its file size (f32 would be 4-8x the
//! bytes of a quantized file), it is the numerics of a ggml CPU build that the engine's
//! reference forward has too, and it shows a porter the keep-quant path, the one a
//! device with block kernels takes. Float weights (F32, F16, BF16) multiply the f32
//! activations directly, sums in f64.
//!
//! **KV caches are host memory**, f32, one row of `n_kv_heads * head_dim` per slot for
//! keys and one for values ([`Device::kv_bytes_per_value`](flint_hal::Device) is 4).
//!
//! **What it does not do.** Nothing is skipped for lack of math: `flint-core` has a
//! scalar form of every op, so [`supports`](flint_hal::Device::supports) says yes to
//! every op and to every block encoding whose dot product (matmuls) or dequantization
//! (`get_rows`) `flint-core` computes. `run_step` and `run_session` keep the default
//! (the caller's thread).

#![forbid(unsafe_code)]

mod device;
mod kv;
mod weight;

use std::sync::Arc;

use flint_hal::{BackendEntry, DeviceRef};

pub use device::RefDevice;
pub use kv::RefKv;
pub use weight::RefWeight;

/// The backends this crate registers: `ref`.
pub fn backends() -> Vec<BackendEntry> {
    vec![BackendEntry {
        name: "ref",
        summary:
            "reference: the flint-core scalar kernels, one thread (slowest; the porting example)",
        probe: || Ok(None),
        open: |o| Ok(Arc::new(RefDevice::new(o)) as DeviceRef),
    }]
}
