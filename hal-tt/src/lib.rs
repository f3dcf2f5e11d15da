//! `flint-hal-tt`: Flint's Tenstorrent backend.
//!
//! Tenstorrent's runtime (TT-Metalium / TT-NN) is C++ and is not on every machine, so this
//! crate links nothing of it: it loads a small *runtime adapter* library at run time with
//! `libloading` and talks to it through the versioned C ABI written down in
//! `docs/hal-tt/flint_tt.h` (see `docs/hal-tt/README.md`). A machine without the adapter
//! still runs Flint on the CPU; `flint devices` lists `tt` as unavailable with the reason.
//!
//! **Finding the adapter.** `FLINT_TT_RUNTIME` names the library file; when it is set
//! nothing else is tried. Otherwise [`search_list`]: `libflint_tt.so` next to the running
//! executable, `/opt/tenstorrent/lib/libflint_tt.so`, `/usr/local/lib/libflint_tt.so`, then
//! `libflint_tt.so` through the dynamic loader (`LD_LIBRARY_PATH`, the ld.so cache). The
//! simulated adapter of `hal-tt/sim` builds as `libflint_tt_sim.so`; point
//! `FLINT_TT_RUNTIME` at it.
//!
//! **Failures.** A missing library, a library missing ABI symbols (all missing names are
//! listed), a different ABI version and a device that fails to open are each
//! [`HalErrorKind::Unavailable`](flint_hal::HalErrorKind::Unavailable) with the reason;
//! the registry's probe reports the same error, so `flint devices` and `FLINT_DEVICE=tt`
//! say the same thing.
//!
//! **Tensors** (HAL v2): [`Device::alloc`](flint_hal::Device::alloc) returns
//! [`TtBuffer`]s, adapter buffers freed on drop. Ops hand a device view that starts at
//! its tensor's first value to the adapter as it is, copy one at an offset through a
//! scratch buffer on the device (`flint_tt_buffer_copy`, ABI 4), and upload host views
//! (and read host outputs back), counting each in
//! [`Device::transfers`](flint_hal::Device::transfers): a forward on device tensors moves
//! nothing over the bus but the step's index upload. Index lists (ABI 5) live in adapter
//! buffers too: [`Device::upload_indices`] writes a step's packed lists into one buffer,
//! and ops pass the adapter that buffer's handle and each list's offset (a host index
//! list is uploaded for the op, counted). MoE routing stays on the device (ABI 6):
//! `route_topk` writes the expert ids into an index tensor ([`Device::alloc_indices`])
//! and the weights into a tensor, which `expert_matmul` and `scatter_add_weighted` read
//! there; host views for them go through scratch buffers, counted. RoPE frequency
//! factors and attention sinks (tensors of the model) are read from adapter buffers as
//! well (ABI 6): a device view is passed by handle and offset, a host view is uploaded
//! into a scratch buffer for the op (counted as an upload), so `tt` counts no
//! `arg_bytes`. Qwen 3.5's Gated DeltaNet layers run on the device too (ABI 6):
//! `ssm_conv_silu` and `gated_delta_net` pass their recurrent state (a device view) by
//! buffer handle and offset, and the adapter updates it in place; `sigmoid`, `mul`,
//! `deinterleave` (one call, its outputs as an array of handles), `delta_net_gate` and
//! `l2_norm` take tensors as the other element-wise ops do. `add_id` (gpt-oss's expert
//! biases) has no entry in the ABI and is `Unsupported`. The adapter's own count of the
//! traffic is in [`TtCounters`].
//!
//! [`Device::upload_indices`]: flint_hal::Device::upload_indices
//! [`Device::alloc_indices`]: flint_hal::Device::alloc_indices
//!
//! **Keep-quant staging** (on by default; `FLINT_KEEP_QUANT=0` selects the BF16 arm):
//! block encodings the device admits ([`TtDevice::admits_kept`]) are staged verbatim;
//! everything else that the host can decode is expanded on the host, without loss in the
//! keep-quant arm (other block encodings to F32, small F32/F16 tensors such as routers as
//! they are, see [`staging::arrangement`]) and to BF16 in the BF16 arm; an encoding that
//! is neither is refused naming encoding and tensor. Expert towers
//! `[in, out, E]` are staged as `E` matrices, each slice's geometry checked.
//! [`Device::plan`](flint_hal::Device::plan) decides against the device's DRAM (less a
//! 1/16 reserve for KV caches and activations, and less the norm and bias vectors the
//! caller says it will upload) which weights stay resident (dense weights
//! first, then expert towers in the expert tier) and which stream from host memory on
//! every use; [`Device::stage`](flint_hal::Device::stage) follows the last plan, or
//! decides greedily when there was none.

mod device;
mod ffi;
pub mod staging;

pub use device::{TtBuffer, TtCounters, TtDevice, TtKv, TtWeight};
pub use ffi::{search_list, Runtime, ABI_VERSION, RUNTIME_ENV, RUNTIME_FILE, SYMBOLS};
pub use staging::{expandable, RESERVE_DIVISOR};

use flint_hal::{BackendEntry, DeviceOptions, DeviceRef, HalError};

/// Checks that the adapter loads, speaks this ABI version and that device 0 opens (and
/// closes it again). The error says why not.
pub fn probe() -> Result<Option<String>, HalError> {
    let rt = Runtime::load_from_env()?;
    let (dev, _) = rt.open_device(0)?;
    rt.close_device(dev);
    Ok(None)
}

fn open(opts: &DeviceOptions) -> Result<DeviceRef, HalError> {
    Ok(std::sync::Arc::new(TtDevice::open(opts)?))
}

/// The backends this crate registers: `tt`.
pub fn backends() -> Vec<BackendEntry> {
    vec![BackendEntry {
        name: "tt",
        summary: "Tenstorrent (Blackhole) through a runtime adapter library (FLINT_TT_RUNTIME)",
        probe,
        open,
    }]
}
