//! `flint-hal-cpu`: the CPU backend.
//!
//! Where things live:
//!
//! - `device.rs`: [`CpuDevice`] (level, thread pool, scratch buffers, arena) and its
//!   `Device` implementation, which hands each op to the files below.
//! - `stage.rs`: staging ([`CpuWeight`]): a weight kept where it lies, repacked into
//!   16-row groups, or copied into the arena.
//! - `matmul.rs`: task scheduling of the matmuls (`matmul`, `matmul_multi`,
//!   `matmul_glu`, `expert_matmul`): how rows split into tasks on the pool, which kernel
//!   entry each task calls.
//! - `worker.rs`: the worker loop of `run_step` and `run_session`.
//! - `arena.rs`: huge-page memory for the weights the device keeps.
//! - `delta.rs`: Qwen 3.5's Gated DeltaNet ops (convolution, delta rule).
//! - `ops.rs`: norms, RoPE (and a projection's head norm, RoPE and pre-scale in one
//!   pass), bias, routing; `kv.rs`: the KV cache ([`CpuKv`]), its
//!   writes and scalar paged attention.
//! - `simd.rs`: [`SimdLevel`], the run-time choice of instruction set.
//! - `kernels/`: the SIMD kernels, one folder per block format (`q4_k/`, `q5_k/`,
//!   `q6_k/`, `q0/` for Q8_0/Q5_0/Q4_0, `mxfp4/`, `float/`), each with one file per
//!   level (`avx2.rs`, `avx512.rs`, `vnni.rs`), its repacked layout (`x16.rs`) and its
//!   prompt-batch panels (`panel.rs`); `kernels/dispatch.rs` picks the kernel,
//!   `kernels/x86/` holds the SIMD helpers several formats share. The Q4_K decode kernel
//!   on AVX-512 VNNI is `kernels/q4_k/vnni.rs` (file layout) and `kernels/q4_k/x16.rs`
//!   (repacked); `kernels/mod.rs` has the full map.
//!
//! Below AVX-512 VNNI, and on AVX-512 VNNI with the file layout ([`WeightLayout`]: the
//! default on Intel CPUs but Emerald Rapids), weights are not copied: a staged weight keeps the [`WeightSource`](flint_hal::WeightSource)
//! (the shared mmap or huge-page copy, and the tensor's byte range) and every matmul
//! reads the GGUF blocks where they lie. With the packed layout (`FLINT_CPU_REPACK=1`; by
//! size, the default on the other AVX-512 VNNI CPUs, `FLINT_CPU_REPACK=size`, repacks all
//! of these but the Q6_K tensors of 2 MiB or more) a Q4_K, Q6_K, Q8_0, Q5_0 or MXFP4
//! weight whose rows per matrix are a multiple of 16 is repacked at staging into row
//! groups (`kernels/{q4_k,q6_k,q0,mxfp4}/x16.rs`: sixteen rows of a
//! block side by side, the same bytes in another order), which the decode kernels
//! multiply without folding sums across lanes (one core, cache-resident: M = 1 about 2x
//! the file layout's speed, M = 4 1.5-3x) and the prompt-batch panels read without
//! transposes; any other weight whose source can give its pages back is
//! copied as it is. Both go into the device's huge-page arena (`arena.rs` says why), and
//! the tensor's file pages are then handed back through the source's release hook, so
//! the memory is not doubled.
//! `FLINT_CPU_REPACK=1|0|size` chooses the layout whatever the CPU (the results are the
//! same bits either way); [`WeightLayout::choose`] says which host measured faster with
//! which.
//! Activations are quantized once per call to the weight type's `vec_dot_type` (Q8_K for
//! the K-quants, Q8_0/Q8_1 for the legacy types, as ggml pairs them) and multiplied with
//! int8 SIMD kernels chosen at run time ([`SimdLevel`]; see [`kernels`] for which type has
//! which level). Every other block type uses `flint_core::dot::vec_dot`, the scalar
//! reference. The K-quants have AVX-512 VNNI kernels (`vpdpwssd`), the other block types
//! AVX-512 F/BW ones. With `FLINT_CPU_AMX=1` Q8_0, Q5_0, Q4_K and Q6_K matrices take
//! llama.cpp's AMX build's orders (`kernels::amx`: Q8_0 and Q5_0 on AMX tiles where a
//! child process's probe shows this process can run them, in the file's layout; else on
//! AVX-512 VNNI, from 16-row groups where the layout repacks). No NEON kernels (no ARM machine or ARM toolchain here to test them on).
//!
//! Threads: `DeviceOptions::threads` (`FLINT_THREADS`) sizes a dedicated rayon pool. A
//! prompt batch (16 activation rows or more) of Q5_0/Q8_0/Q4_0 or Q4_K/Q6_K weights on an
//! AVX-512 VNNI CPU, or (64 rows or more) of Q5_0/Q8_0/Q4_0 or Q4_K/Q6_K weights (a dense
//! matmul's) at the AVX2 and AVX-512 F levels, or (64 rows or more; an expert's 16 or
//! more) of Q2_K/Q3_K/IQ4_XS/Q5_K weights at any of these levels, goes through a gemm that
//! tiles weight rows and activation rows together (`kernels::dispatch::gemm`: the weight decoded once into panels, the activation
//! rows split over the threads, each task writing its own rows of the result). One activation row (a decode) splits the output
//! rows into 4 chunks per thread, each chunk read as two streams half a chunk apart
//! (`kernels::q0::vnni::q0_rows` says why); 2-15 rows (a decode of a few sequences) into 16
//! chunks per thread, each weight block decoded once for up to four rows
//! (`kernels::dispatch::rows_small_batch`). `matmul_multi` (a layer's q/k/v, an MLP's gate and
//! up) and `expert_matmul` (all the experts of a call) make one parallel section of
//! (matrix, chunk of rows) tasks. The engine runs each forward step through
//! `Device::run_step`, which here runs it on pool worker 0 while the other workers stay
//! awake for the step (polling for its parallel work instead of sleeping through the
//! serial parts): ops start without a cross-thread hand-off or a wake-up.
//!
//! MXFP4 (gpt-oss's experts) has AVX2, AVX-512 and AVX-512 VNNI kernels in one folder,
//! `kernels/mxfp4/`, for single rows, a few rows and prompt batches alike.
//!
//! Float orders: the Q8_0, Q5_0 and MXFP4 kernels (every SIMD level; MXFP4's scalar
//! level too) and, on AVX-512 VNNI CPUs, the Q4_K and Q6_K kernels sum in llama.cpp's
//! orders for a prompt batch
//! (docs/parity.md), the same for every row whatever the batch, so that a request's
//! numbers never depend on what it is batched with. Paged attention follows llama.cpp's tiled flash attention (bit-identical to
//! `flint_core::math::attend_ggml_tiled`).
//!
//! Float weights (F32/F16/BF16) multiply f32 activations directly, products in f32 and
//! sums in f64 as the core reference (ggml would round the activations to the weight's
//! type first); this is at least as accurate.
//!
//! `FLINT_CPU_SIMD=scalar|avx2|avx512|avx512vnni` (read when the device is opened) forces
//! a lower level, for tests and comparisons; [`CpuDevice::with_level`] does the same in
//! code.

mod arena;
mod delta;
mod device;
pub mod kernels;
mod kv;
mod matmul;
mod ops;
mod simd;
mod stage;
mod worker;

use std::sync::Arc;

use flint_hal::{BackendEntry, DeviceRef};

pub use device::CpuDevice;
pub use kv::{CpuKv, FloatOrder};
pub use simd::SimdLevel;
pub use stage::{CpuWeight, WeightLayout, Q6K_FILE_MIN_BYTES};

/// The backends this crate registers: `cpu`.
pub fn backends() -> Vec<BackendEntry> {
    vec![BackendEntry {
        name: "cpu",
        summary: "host CPU: SIMD int8 kernels (AVX2/AVX-512) on the mmapped GGUF blocks, rayon",
        probe: || Ok(None),
        open: |o| Ok(Arc::new(CpuDevice::new(o)?) as DeviceRef),
    }]
}
