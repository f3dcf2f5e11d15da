//! `flint-hal-vk`: Flint's Vulkan backend (`vk`).
//!
//! **Loading.** The Vulkan loader (`libvulkan.so.1`) is opened at run time through
//! `ash`'s loader feature; nothing links against it. A machine without the loader, without
//! a driver, or without a device with a compute queue lists `vk` as unavailable with the
//! reason ([`probe`]); it never fails to start. `FLINT_VK_DEVICE=<index>` picks a device;
//! otherwise the first discrete GPU, else an integrated one, else any (Mesa's lavapipe,
//! a CPU implementation, runs the same shaders in CI).
//!
//! **Shaders.** WGSL compute shaders in `shaders/`, compiled to SPIR-V at build time by
//! naga (`build.rs`): matmul and get_rows per block encoding (`shaders/blocks/`, the
//! encoding's blocks read as they are in the file), RMSNorm, RoPE, the element-wise
//! activations, paged attention with sinks and windows, KV writes through slot mappings,
//! and the MoE ops (routing, the combine, `add_id`). `docs/hal-vk.md` says why WGSL, naga and ash.
//!
//! **Tensors.** [`Device::alloc`](flint_hal::Device::alloc) returns [`VkBuffer`]s in
//! device memory. Ops are recorded into one command buffer, with a barrier between them,
//! and submitted when the host needs a result: a download, the MoE routing, an op handed
//! host memory to write. Index tensors stay in host memory (the default
//! [`Device::upload_indices`](flint_hal::Device::upload_indices) and
//! [`Device::alloc_indices`](flint_hal::Device::alloc_indices): the routing reads the
//! chosen experts back into one): each op's index lists (positions, slots, block tables,
//! expert ids as (input row, expert) pairs, RoPE's cosines and sines computed from the
//! positions) travel in host-visible arena buffers and are counted as `arg_bytes`. Where
//! device memory is host-visible (lavapipe, unified memory) buffers are
//! mapped; otherwise uploads and downloads go through staging copies
//! (`FLINT_VK_STAGING=1` forces that path).
//!
//! **Weights.** Encodings with shaders of their own (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q2_K-Q6_K) are staged as they are in the file (with `FLINT_KEEP_QUANT=0`,
//! the block encodings are expanded); every other encoding the host decodes is expanded
//! to F32 when staged, without loss, and the staging census says so. A weight larger than
//! the device's largest storage binding is split into buffers of whole rows (whole experts
//! for a tower).
//!
//! **Not here.** The Gated DeltaNet ops (Qwen 3.5) are not supported
//! ([`Device::supports`](flint_hal::Device::supports) says so).

mod batch;
mod context;
mod device;
mod shaders {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

pub use context::Adapter;
pub use device::{MatmulKernel, VkBuffer, VkDevice, VkKv, VkWeight, MAX_HEAD_DIM};

use flint_hal::{BackendEntry, DeviceOptions, DeviceRef, HalError};

/// Checks that the Vulkan loader opens and a device with a compute queue exists; returns
/// the device [`VkDevice::open`] would choose. The error says why not.
pub fn probe() -> Result<Adapter, HalError> {
    context::probe()
}

fn probe_entry() -> Result<Option<String>, HalError> {
    probe().map(|a| {
        Some(format!(
            "{} ({}, {:.1} GiB)",
            a.name,
            a.kind,
            a.memory_bytes as f64 / (1u64 << 30) as f64
        ))
    })
}

fn open(opts: &DeviceOptions) -> Result<DeviceRef, HalError> {
    Ok(std::sync::Arc::new(VkDevice::open(opts)?))
}

/// The backends this crate registers: `vk`.
pub fn backends() -> Vec<BackendEntry> {
    vec![BackendEntry {
        name: "vk",
        summary: "Vulkan compute (any Vulkan 1.1 device; FLINT_VK_DEVICE picks one)",
        probe: probe_entry,
        open,
    }]
}
