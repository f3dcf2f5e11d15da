//! `flint-hal-cpu`: the CPU backend.
//!
//! Below AVX-512 VNNI weights are not copied: a staged weight keeps the [`WeightSource`]
//! (the shared mmap or huge-page copy, and the tensor's byte range) and every matmul
//! reads the GGUF blocks where they lie. On AVX-512 VNNI CPUs a Q4_K, Q6_K, Q8_0 or Q5_0
//! weight whose rows per matrix are a multiple of 16 is repacked at staging into row
//! groups (`kernels::q4k_x16`, `kernels::q6k_x16`, `kernels::q0_x16`: sixteen rows of a
//! block side by side, the same bytes in another order), which the decode kernels
//! multiply without folding sums across lanes (one core, cache-resident: M = 1 about 2x
//! the file layout's speed, M = 4 1.5-3x) and the prompt-batch panels read without
//! transposes; any other weight of up to 64 MiB whose source can give its pages back is
//! copied as it is. Both go into the device's huge-page arena (`arena.rs` says why), and
//! the tensor's file pages are then handed back through the source's release hook, so
//! the memory is not doubled.
//! `FLINT_CPU_REPACK=0` keeps every weight in the file's layout and place (for
//! comparisons; the results are the same bits either way).
//! Activations are quantized once per call to the weight type's `vec_dot_type` (Q8_K for
//! the K-quants, Q8_0/Q8_1 for the legacy types, as ggml pairs them) and multiplied with
//! int8 SIMD kernels chosen at run time ([`SimdLevel`]; see [`kernels`] for which type has
//! which level). Every other block type uses `flint_core::dot::vec_dot`, the scalar
//! reference. The K-quants have AVX-512 VNNI kernels (`vpdpwssd`), the other block types
//! AVX-512 F/BW ones. No NEON kernels (no ARM machine or ARM toolchain here to test them
//! on); no AMX (the hypervisor of the development machine faults on it).
//!
//! Threads: `DeviceOptions::threads` (`FLINT_THREADS`) sizes a dedicated rayon pool. A
//! prompt batch (16 activation rows or more) of Q5_0/Q8_0/Q4_0 or Q4_K/Q6_K weights on an
//! AVX-512 VNNI CPU goes through a gemm that tiles weight rows and activation rows
//! together (`kernels::gemm`: the activation rows split over the threads, each task
//! writing its own rows of the result). One activation row (a decode) splits the output
//! rows into 4 chunks per thread, each chunk read as two streams half a chunk apart
//! (`kernels::vnni::q0_rows` says why); 2-15 rows (a decode of a few sequences) into 16
//! chunks per thread, each weight block decoded once for up to four rows
//! (`kernels::rows_small_batch`). `matmul_multi` (a layer's q/k/v, an MLP's gate and
//! up) and `expert_matmul` (all the experts of a call) make one parallel section of
//! (matrix, chunk of rows) tasks. The engine runs each forward step through
//! `Device::run_step`, which here runs it on pool worker 0 while the other workers stay
//! awake for the step (polling for its parallel work instead of sleeping through the
//! serial parts): ops start without a cross-thread hand-off or a wake-up.
//!
//! MXFP4 (gpt-oss's experts) has AVX2, AVX-512 and AVX-512 VNNI kernels in one file,
//! `kernels/mxfp4.rs`, for single rows, a few rows and prompt batches alike.
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

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flint_core::{FormatError, GgmlType};
use flint_hal::{
    BackendEntry, Device, DeviceCounters, DeviceOptions, DeviceRef, ExpertRow, HalError, KvBuffer,
    KvLayout, Op, PagedAttention, PlannedWeight, RopeParams, RoutingConfig, StagedInfo,
    StagingPlan, Tier, Weight, WeightDesc, WeightHandle, WeightSource,
};
use rayon::prelude::*;

/// Polls for work a waiting worker makes before it starts yielding its core to other
/// threads between polls (`CpuDevice::run_step`).
const SPIN_POLLS: u32 = 256;

/// How long a waiting worker stays awake without work during a step (longer than the
/// serial parts of a decode step: its attention, the norms) before it goes back to
/// rayon's sleep.
const SPIN_IDLE_LIMIT: std::time::Duration = std::time::Duration::from_micros(200);

mod arena;
pub mod kernels;
mod ops;
mod simd;

pub use ops::CpuKv;
pub use simd::SimdLevel;

use kernels::q4k_x16::X16_ROWS;
use kernels::{Acts, FloatKind, WeightRows, TILE};

/// The backends this crate registers: `cpu`.
pub fn backends() -> Vec<BackendEntry> {
    vec![BackendEntry {
        name: "cpu",
        summary: "host CPU: SIMD int8 kernels (AVX2/AVX-512) on the mmapped GGUF blocks, rayon",
        probe: || Ok(()),
        open: |o| Ok(Arc::new(CpuDevice::new(o)?) as DeviceRef),
    }]
}

/// The CPU device.
#[derive(Debug)]
pub struct CpuDevice {
    level: SimdLevel,
    threads: usize,
    pool: rayon::ThreadPool,
    block_dispatches: AtomicU64,
    float_dispatches: AtomicU64,
    /// The transposed results of the last batched matmul, kept for the next one: a
    /// fresh buffer of a few MiB per matmul costs page faults and zeroing.
    scratch: std::sync::Mutex<Vec<f32>>,
    /// The decoded weight blocks of the last weight-tiled gemm, kept for the next one.
    gemm_scratch: std::sync::Mutex<kernels::GemmScratch>,
    /// The RoPE angles of the last few distinct calls (positions, base, rotated size).
    rope_cache: std::sync::Mutex<Vec<Arc<ops::RopeTable>>>,
    /// The session running now (`run_session`), if any.
    session: std::sync::Mutex<Option<Arc<SessionState>>>,
    /// Where the weights the device keeps (repacked or copied) live.
    arena: arena::PackArena,
}

/// A `run_session` in progress: the worker running its body, and the other workers
/// kept awake for its steps.
#[derive(Debug)]
struct SessionState {
    /// The pool index of the worker that runs the session's body.
    owner: usize,
    /// Set when the body returns (or panics): the waiting workers leave.
    done: AtomicBool,
    /// Workers now waiting for the session's parallel work.
    waiting: std::sync::atomic::AtomicUsize,
}

/// Keeps a worker awake for parallel work until `done`, taking each op's tasks as soon
/// as they appear: left to rayon, workers fall asleep during the serial parts of a step
/// (a decode's attention, the norms) and the next matmul starts on one thread while
/// they wake up. Returns after `SPIN_IDLE_LIMIT` without work (a long serial stretch:
/// back to rayon, which sleeps and is woken for the next parallel work).
fn wait_for_work(done: &AtomicBool) {
    // Idle polls since the last work, and when the idling began.
    let mut idle = 0u32;
    let mut idle_since = std::time::Instant::now();
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        if idle == 0 {
            idle_since = std::time::Instant::now();
        }
        idle = idle.saturating_add(1);
        if idle < SPIN_POLLS {
            std::hint::spin_loop();
        } else if idle_since.elapsed() > SPIN_IDLE_LIMIT {
            break;
        } else {
            // Let any other runnable thread (a shared machine) have the core.
            std::thread::yield_now();
        }
    }
}

/// Sets `done` however a step or session ends, a panic included.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// RoPE angle tables kept (a step of a model with two kinds of layers uses two).
const ROPE_TABLES: usize = 4;

/// The largest weight kept in the file's layout that the device copies into its arena
/// (`CpuDevice::stage`): a tensor this large keeps huge pages inside the loader's copy
/// anyway, and a tied embedding staged twice would be copied twice.
const ARENA_COPY_MAX: usize = 64 << 20;

/// The most results a matmul transposes back on the calling thread rather than in a
/// parallel section (a c = 4 decode's 1024-row matrix: 4096).
const SERIAL_TRANSPOSE_MAX: usize = 1 << 16;

/// The largest scratch buffer kept between matmuls (16 MiB of f32).
const SCRATCH_KEEP: usize = 4 << 20;

/// A weight staged on the CPU: the file's bytes, kept where they lie.
#[derive(Debug)]
pub struct CpuWeight {
    info: StagedInfo,
    src: WeightSource,
    ty: GgmlType,
    /// Elements per row.
    k: usize,
    /// Rows per matrix (per expert for a tower).
    n: usize,
    /// Experts (1 for a matrix).
    e: usize,
    row_bytes: usize,
    /// The rows repacked for the decode kernels (`kernels::q4k_x16`, `q6k_x16`,
    /// `q0_x16`), when the weight was staged so; the matmuls then read these, never
    /// `src`.
    x16: Option<Packed>,
}

/// A Q4_K, Q6_K, Q8_0 or Q5_0 weight's rows repacked at staging (`kernels::q4k_x16`,
/// `kernels::q6k_x16`, `kernels::q0_x16`), in the device's huge-page arena (`arena.rs`
/// says why).
struct Packed {
    region: arena::Region,
    ty: GgmlType,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("ty", &self.ty)
            .field("len", &self.region.as_slice().len())
            .finish()
    }
}

impl Packed {
    /// The whole weight's row groups.
    fn rows(&self) -> WeightRows<'_> {
        let bytes = self.region.as_slice();
        match self.ty {
            GgmlType::Q4_K => WeightRows::Q4Kx16(bytemuck::cast_slice(bytes)),
            GgmlType::Q8_0 => WeightRows::Q8_0x16(bytemuck::cast_slice(bytes)),
            GgmlType::Q5_0 => WeightRows::Q5_0x16(bytemuck::cast_slice(bytes)),
            _ => WeightRows::Q6Kx16(bytemuck::cast_slice(bytes)),
        }
    }

    /// A Q4_K, Q6_K, Q8_0 or Q5_0 tensor's bytes (whole rows of `k` elements, a
    /// multiple of 16 rows) repacked into `arena`; `None` for another type or when the
    /// memory cannot be had (the weight then stays in the file's layout).
    ///
    /// The source's bytes are handed back piece by piece as they are packed, then whole
    /// ([`WeightSource::release_resident_part`]): a weight as large as Gemma 3's output
    /// matrix (178 MB) would otherwise be in memory twice at once, in the loader's copy
    /// and in the arena (the peak resident set of a `flint run` went from 284 to 453 MB).
    fn pack(
        ty: GgmlType,
        src: &WeightSource,
        k: usize,
        pool: &rayon::ThreadPool,
        arena: &arena::PackArena,
    ) -> Option<Self> {
        let bytes = src.as_slice();
        let mut region = arena.alloc(bytes.len()).ok()?;
        let dst = region.as_mut_slice();
        let release = |r: std::ops::Range<usize>| src.release_resident_part(r);
        match ty {
            GgmlType::Q4_K => {
                pack_groups(bytes, k / 256, dst, pool, &release, kernels::q4k_x16::pack)
            }
            GgmlType::Q6_K => {
                pack_groups(bytes, k / 256, dst, pool, &release, kernels::q6k_x16::pack)
            }
            GgmlType::Q8_0 => pack_groups(
                bytes,
                k / 32,
                dst,
                pool,
                &release,
                kernels::q0_x16::pack_q8_0,
            ),
            GgmlType::Q5_0 => pack_groups(
                bytes,
                k / 32,
                dst,
                pool,
                &release,
                kernels::q0_x16::pack_q5_0,
            ),
            _ => return None,
        }
        Some(Self { region, ty })
    }
}

/// Source bytes packed between two hand-backs of [`pack_groups`].
const PACK_PIECE_BYTES: usize = 4 << 20;

/// Repacks whole rows of `nb` blocks `B` (the file's bytes `src`) into 16-row groups
/// `X` written over `dst` (the same length), 64 groups per task on `pool`, in pieces of
/// about [`PACK_PIECE_BYTES`], each piece's source bytes but the last passed to `release`
/// once packed (the caller hands back the whole range when done).
fn pack_groups<B: bytemuck::Pod + Send + Sync, X: bytemuck::Pod + Send>(
    src: &[u8],
    nb: usize,
    dst: &mut [u8],
    pool: &rayon::ThreadPool,
    release: &dyn Fn(std::ops::Range<usize>),
    pack: fn(&[B], usize, &mut [X]),
) {
    let src = kernels::view::<B>(src);
    let out: &mut [X] = bytemuck::cast_slice_mut(dst);
    let per = 64 * nb;
    // A packed block holds the same bytes as the sixteen file blocks it replaces, so
    // packed blocks `g0..g1` came from source bytes `g0..g1` times its size.
    let block_bytes = std::mem::size_of::<X>().max(1);
    // Whole tasks of 64 row groups per piece.
    let piece = (PACK_PIECE_BYTES / block_bytes).next_multiple_of(per.max(1));
    let total = out.len();
    let mut g0 = 0;
    for part in out.chunks_mut(piece) {
        let blocks = part.len();
        pool.install(|| {
            part.par_chunks_mut(per).enumerate().for_each(|(c, o)| {
                let r0 = (g0 + c * per) * X16_ROWS;
                pack(&src[r0..r0 + o.len() * X16_ROWS], nb, o)
            })
        });
        if g0 + blocks < total {
            release(g0 * block_bytes..(g0 + blocks) * block_bytes);
        }
        g0 += blocks;
    }
}

impl Weight for CpuWeight {
    fn info(&self) -> &StagedInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        self.src.as_slice()
    }

    /// Weight rows `row0..row0 + rows` (counted over all experts) as the kernels read
    /// them. With a packed weight both ends must be multiples of 16 (every packed
    /// weight's rows per expert are).
    fn rows(&self, row0: usize, rows: usize) -> WeightRows<'_> {
        match &self.x16 {
            Some(p) => {
                debug_assert!(row0.is_multiple_of(X16_ROWS) && rows.is_multiple_of(X16_ROWS));
                p.rows().packed_rows(self.k, row0, rows)
            }
            None => WeightRows::File(
                &self.bytes()[row0 * self.row_bytes..(row0 + rows) * self.row_bytes],
            ),
        }
    }
}

/// Whether `FLINT_CPU_REPACK` allows repacking weights at staging (default: yes; `0`
/// keeps every weight in the file's layout, for comparisons).
fn repack_enabled() -> bool {
    std::env::var("FLINT_CPU_REPACK").map_or(true, |v| v.trim() != "0")
}

/// Rows of a staged matmul chunk: a multiple of 16 when the weight is packed.
fn chunk_rows(per_task: usize, packed: bool, n: usize) -> usize {
    if packed {
        per_task.next_multiple_of(X16_ROWS).min(n.max(X16_ROWS))
    } else {
        per_task
    }
}

/// What `Acts::new` makes of a weight type: activations for one weight serve another of
/// the same form (`Acts::new` depends on the type only through these two).
fn act_form(ty: GgmlType) -> (bool, GgmlType) {
    (FloatKind::of(ty).is_some(), ty.vec_dot_type())
}

fn fmt_err(what: &str, e: FormatError) -> HalError {
    match e {
        FormatError::Unsupported(t) => HalError::unsupported(format!("cpu: {what}: {t} ({e})")),
        _ => HalError::invalid(format!("cpu: {what}: {e}")),
    }
}

/// Whether the scalar reference computes `ty`: probed once on a zero row of one block.
fn core_dot_supports(ty: GgmlType) -> bool {
    let vt = ty.vec_dot_type();
    if !matches!(vt, GgmlType::Q8_K | GgmlType::Q8_0 | GgmlType::Q8_1) {
        return false;
    }
    let n = ty.block_size().max(vt.block_size());
    let (Some(wb), Some(ab)) = (ty.row_bytes(n), vt.row_bytes(n)) else {
        return false;
    };
    crate::kernels::core_vec_dot(ty, &vec![0u8; wb], &vec![0u8; ab], n).is_ok()
}

/// Whether `flint_core::dequant::dequantize` decodes `ty` (probed on one zero block).
fn dequant_supports(ty: GgmlType) -> bool {
    let n = ty.block_size();
    let Some(b) = ty.row_bytes(n) else {
        return false;
    };
    let mut out = vec![0f32; n];
    flint_core::dequant::dequantize(ty, &vec![0u8; b], &mut out).is_ok()
}

impl CpuDevice {
    /// Opens the device with `opts`, at the level `FLINT_CPU_SIMD` asks for (default:
    /// the best this CPU has).
    pub fn new(opts: &DeviceOptions) -> Result<Self, HalError> {
        Self::with_level(opts, SimdLevel::from_env()?)
    }

    /// Opens the device at a given SIMD level; `Unavailable` when the CPU lacks it.
    pub fn with_level(opts: &DeviceOptions, level: SimdLevel) -> Result<Self, HalError> {
        let level = level.check()?;
        let threads = opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("flint-cpu-{i}"))
            .build()
            .map_err(|e| HalError::runtime(format!("cpu: cannot start {threads} threads: {e}")))?;
        Ok(Self {
            level,
            threads,
            pool,
            block_dispatches: AtomicU64::new(0),
            float_dispatches: AtomicU64::new(0),
            scratch: std::sync::Mutex::new(Vec::new()),
            gemm_scratch: std::sync::Mutex::new(kernels::GemmScratch::default()),
            rope_cache: std::sync::Mutex::new(Vec::new()),
            session: std::sync::Mutex::new(None),
            arena: arena::PackArena::default(),
        })
    }

    /// The SIMD level in use.
    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// Runs `f` on one of the device's worker threads: the device's own ops called
    /// from inside run inline on that worker instead of handing work over from a
    /// foreign thread (a wake-up and a sleep per op).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether matmuls with weights of `ty` can be computed at this device's level
    /// (a native kernel, or the scalar reference).
    fn matmul_supports(&self, ty: GgmlType) -> bool {
        FloatKind::of(ty).is_some()
            || kernels::native_kernel(self.level, ty).is_some()
            || core_dot_supports(ty)
    }

    /// `Unsupported` (naming tensor and type) when this device cannot compute with `w`.
    fn check_usable(&self, w: &WeightDesc) -> Result<(), HalError> {
        let ty = w.ty;
        let usable = match w.kind {
            flint_hal::WeightKind::Embedding => dequant_supports(ty) || self.matmul_supports(ty),
            _ => self.matmul_supports(ty),
        };
        if usable {
            Ok(())
        } else {
            Err(HalError::unsupported(format!(
                "cpu: tensor '{}' has type {ty}, which the cpu backend cannot compute",
                w.name
            )))
        }
    }

    fn weight<'a>(&self, w: &'a dyn Weight) -> &'a CpuWeight {
        w.as_any()
            .downcast_ref::<CpuWeight>()
            .expect("weight was not staged by the cpu device")
    }

    fn count(&self, ty: GgmlType) {
        if FloatKind::of(ty).is_some() {
            self.float_dispatches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.block_dispatches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `out[i][o] = W[o] . x[i]` for the `n` rows of `w_bytes` (one matrix), the
    /// activation rows `x` quantized for `ty` here, or already (`pre`).
    #[allow(clippy::too_many_arguments)]
    fn matmul_bytes(
        &self,
        ty: GgmlType,
        w: WeightRows<'_>,
        k: usize,
        n: usize,
        row_bytes: usize,
        x: &[f32],
        pre: Option<&Acts>,
        m: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        assert_eq!(
            x.len(),
            m * k,
            "matmul: x has {} values, expected {m} x {k}",
            x.len()
        );
        assert_eq!(
            out.len(),
            m * n,
            "matmul: out has {} values, expected {m} x {n}",
            out.len()
        );
        if m == 0 || n == 0 {
            return Ok(());
        }
        let level = self.level;
        self.pool.install(|| {
            let owned;
            let acts = match pre {
                Some(a) => a,
                None => {
                    owned = Acts::new(level, ty, x, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    &owned
                }
            };
            // Enough rows per task to amortise dispatch (16 rows of a 4096-wide Q4_K row
            // are ~2 us of work against ~0.2 us for a rayon task), and 16 tasks per
            // thread so that the others can take over a thread that stalls or is
            // descheduled on a shared machine; for a few decode rows, four per thread,
            // as for one (each task's rows are a stream the prefetcher picks up again).
            let tasks_per_thread = if m < kernels::GEMM_MIN_ROWS { 4 } else { 16 };
            let per_task = n.div_ceil(self.threads * tasks_per_thread).max(16).min(n);
            let packed = w.is_packed();
            let per_task = chunk_rows(per_task, packed, n);
            let w_bytes = match w {
                WeightRows::File(b) => b,
                _ => &[][..],
            };
            // Packed rows `o0..o0 + rows` (whole groups).
            let groups = |o0: usize, rows: usize| w.packed_rows(k, o0, rows);
            let row_dot = |o: usize, rows: &[usize], dst: &mut [f32]| {
                dot_rows_checked(
                    level,
                    ty,
                    &w_bytes[o * row_bytes..(o + 1) * row_bytes],
                    acts,
                    k,
                    rows,
                    dst,
                )
            };
            if m == 1 {
                // Four tasks per thread, not sixteen: each task's weight rows are a
                // stream the hardware prefetcher has to pick up again, and a decode's
                // matrices are small.
                let per_task = chunk_rows(n.div_ceil(self.threads * 4).max(16).min(n), packed, n);
                return out
                    .par_chunks_mut(per_task)
                    .enumerate()
                    .try_for_each(|(c, dst)| {
                        let o0 = c * per_task;
                        if packed {
                            return kernels::x16_rows(groups(o0, dst.len()), k, acts, &[0], dst)
                                .map_err(|e| fmt_err("matmul", e));
                        }
                        let wb = &w_bytes[o0 * row_bytes..(o0 + dst.len()) * row_bytes];
                        kernels::matvec_rows(level, ty, wb, acts, k, 0, dst)
                            .map_err(|e| fmt_err("matmul", e))
                    });
            }
            // Weight and activation rows tiled together, where there is such a kernel:
            // the weight decoded once, the activation rows split over the threads (a
            // multiple of 4 rows per task, about 4 tasks per thread).
            let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
            let mut gs =
                std::mem::take(&mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()));
            let done = kernels::gemm(level, ty, w, acts, k, n, m, per_rows, &mut gs, out)
                .map_err(|e| fmt_err("matmul", e))?;
            *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
            if done {
                return Ok(());
            }
            // Transposed result [n][m]: each task owns whole weight rows. Every value is
            // written before it is read, so a kept buffer needs no clearing.
            let mut buf =
                std::mem::take(&mut *self.scratch.lock().unwrap_or_else(|e| e.into_inner()));
            if buf.len() < n * m {
                buf = vec![0f32; n * m];
            }
            let t_out = &mut buf[..n * m];
            // Weight rows per sub-tile: small enough to stay in L1/L2 while every
            // activation tile passes over them.
            const ROW_TILE: usize = 16;
            let all_rows: Vec<usize> = (0..m).collect();
            t_out
                .par_chunks_mut(per_task * m)
                .enumerate()
                .try_for_each(|(c, dst)| {
                    let o0 = c * per_task;
                    let rows_here = dst.len() / m;
                    if packed {
                        return kernels::x16_rows(groups(o0, rows_here), k, acts, &all_rows, dst)
                            .map_err(|e| fmt_err("matmul", e));
                    }
                    let wb = &w_bytes[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    if kernels::rows_small_batch(level, ty, wb, acts, k, m, dst) {
                        return Ok(());
                    }
                    let mut tmp = [0f32; TILE];
                    let mut idx = [0usize; TILE];
                    for rb in (0..rows_here).step_by(ROW_TILE) {
                        let re = (rb + ROW_TILE).min(rows_here);
                        for i0 in (0..m).step_by(TILE) {
                            let len = TILE.min(m - i0);
                            for (t, v) in idx.iter_mut().enumerate().take(len) {
                                *v = i0 + t;
                            }
                            for r in rb..re {
                                row_dot(o0 + r, &idx[..len], &mut tmp[..len])?;
                                dst[r * m + i0..r * m + i0 + len].copy_from_slice(&tmp[..len]);
                            }
                        }
                    }
                    Ok::<(), HalError>(())
                })?;
            // Back to [m][n]: a few decode rows' worth here (a parallel section costs
            // more than the copy), else in parallel over blocks of 16 activation rows
            // (each weight row's 16 values are one cache line of `t_out`).
            let t_out = &*t_out;
            if n * m <= SERIAL_TRANSPOSE_MAX {
                for (j, row) in t_out.chunks_exact(m).enumerate() {
                    for (r, &v) in row.iter().enumerate() {
                        out[r * n + j] = v;
                    }
                }
            } else {
                out.par_chunks_mut(16 * n).enumerate().for_each(|(c, o)| {
                    let i0 = 16 * c;
                    let rows = o.len() / n;
                    for j in 0..n {
                        let src = &t_out[j * m + i0..j * m + i0 + rows];
                        for (t, &v) in src.iter().enumerate() {
                            o[t * n + j] = v;
                        }
                    }
                });
            }
            if buf.len() <= SCRATCH_KEEP {
                *self.scratch.lock().unwrap_or_else(|e| e.into_inner()) = buf;
            }
            Ok(())
        })
    }
}

/// `gelu_tanh_ggml_f16` of every f16 value (by its bits), built once (65536 entries).
fn gelu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| {
                let x = half::f16::from_bits(b).to_f32();
                if !x.is_finite() {
                    return 0.0;
                }
                // An input strictly inside (-10, 10) rounds to +-10 at most; for those two
                // entries ask the core function with an f32 just inside, which rounds
                // to the same f16 (the cut-off itself is applied before the lookup).
                let inside = if x.abs() >= 10.0 {
                    f32::from_bits(x.to_bits() - 1)
                } else {
                    x
                };
                flint_core::math::gelu_tanh_ggml_f16(inside)
            })
            .collect()
    })
}

fn dot_rows_checked(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    rows: &[usize],
    out: &mut [f32],
) -> Result<(), HalError> {
    kernels::dot_rows(level, ty, w, acts, k, rows, out).map_err(|e| fmt_err("matmul", e))
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }

    fn description(&self) -> String {
        format!(
            "host CPU, {} threads, SIMD {} (AMX not used, no NEON)",
            self.threads, self.level
        )
    }

    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        match op {
            Op::Stage | Op::Matmul | Op::ExpertMatmul => {
                ty.is_some_and(|t| self.matmul_supports(t))
            }
            Op::GetRows => ty.is_some_and(dequant_supports),
            Op::RmsNorm
            | Op::AddRmsNorm
            | Op::Rope
            | Op::SiluMul
            | Op::GeluMul
            | Op::Add
            | Op::AddBias
            | Op::Scale
            | Op::ScatterAddWeighted
            | Op::RouteTopK
            | Op::WriteKv
            | Op::PagedAttention => true,
        }
    }

    fn plan(&self, weights: &[WeightDesc]) -> Result<StagingPlan, HalError> {
        // Everything stays where it lies in the file: resident, encoding kept.
        let mut plan = StagingPlan::default();
        for w in weights {
            self.check_usable(w)?;
            plan.weights.push(PlannedWeight {
                name: w.name.clone(),
                source_ty: w.ty,
                staged_ty: w.ty,
                kept_quant: true,
                tier: Tier::Resident,
                resident_bytes: w.data.len() as u64,
                streamed_bytes: 0,
            });
        }
        Ok(plan)
    }

    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        desc.validate()?;
        self.check_usable(desc)?;
        let ty = desc.ty;
        let k = desc.in_features();
        let row_bytes = ty.row_bytes(k).ok_or_else(|| {
            HalError::invalid(format!(
                "tensor '{}': {k} is not a whole number of {ty} blocks",
                desc.name
            ))
        })?;
        let bytes = desc.data.len() as u64;
        let (n, e) = (desc.out_features(), desc.experts());
        // Q4_K, Q6_K, Q8_0 and Q5_0 rows repacked sixteen at a time for the VNNI decode
        // kernels (`q4k_x16` and `q0_x16` say why); the same bytes in another order.
        let packable = self.level == SimdLevel::Avx512Vnni
            && match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => k.is_multiple_of(256),
                GgmlType::Q8_0 | GgmlType::Q5_0 => k.is_multiple_of(32),
                _ => false,
            }
            && n.is_multiple_of(X16_ROWS)
            && n * e > 0
            && repack_enabled();
        let x16 = if packable {
            Packed::pack(ty, &desc.data, k, &self.pool, &self.arena)
        } else {
            None
        };
        if x16.is_some() {
            // The file's bytes of this tensor are not read again here.
            desc.data.release_resident();
        }
        // Where weights are repacked, the file's pages of each are handed back, and those
        // holes split the loader's huge-page copy: what lies between them (a Gemma 3
        // layer's Q5_0 and Q8_0 matrices, a MoE router) ends up on small pages. A weight
        // kept in the file's layout is copied into the arena too, its pages handed back
        // the same way (Gemma 3: 85 MB of anonymous memory on small pages before).
        let copied = if x16.is_none()
            && self.level == SimdLevel::Avx512Vnni
            && repack_enabled()
            && desc.data.can_release()
            && desc.data.len() <= ARENA_COPY_MAX
        {
            self.arena
                .alloc(desc.data.len())
                .ok()
                .and_then(|mut region| {
                    region.as_mut_slice().copy_from_slice(desc.data.as_slice());
                    let len = desc.data.len();
                    let src =
                        WeightSource::new(Arc::new(arena::RegionBytes(region)), 0..len).ok()?;
                    desc.data.release_resident();
                    Some(src)
                })
        } else {
            None
        };
        Ok(Arc::new(CpuWeight {
            info: StagedInfo {
                name: desc.name.clone(),
                source_ty: ty,
                staged_ty: ty,
                dims: desc.dims.clone(),
                kept_quant: true,
                tier: Tier::Resident,
                resident_bytes: bytes,
                streamed_bytes: 0,
            },
            src: copied.unwrap_or_else(|| desc.data.clone()),
            ty,
            k,
            n: desc.out_features(),
            e: desc.experts(),
            row_bytes,
            x16,
        }))
    }

    fn matmul(&self, w: &dyn Weight, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), HalError> {
        let w = self.weight(w);
        self.count(w.ty);
        self.matmul_bytes(w.ty, w.rows(0, w.n), w.k, w.n, w.row_bytes, x, None, m, out)
            .map_err(|e| HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name)))
    }

    fn matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        assert_eq!(ws.len(), outs.len(), "matmul_multi: one output per weight");
        let ws: Vec<&CpuWeight> = ws.iter().map(|w| self.weight(*w)).collect();
        let (Some(first), level) = (ws.first(), self.level) else {
            return Ok(());
        };
        // One parallel section for decode rows (one, or a few with the small-batch
        // kernels) whose weights take the same activation encoding and have a native
        // kernel: the rows quantized once, the threads sharing every matrix's rows (as
        // `expert_matmul` does for experts).
        let small = (2..kernels::GEMM_MIN_ROWS).contains(&m);
        let shared = (m == 1 || small)
            && ws.iter().all(|w| {
                w.k == first.k
                    && w.ty.vec_dot_type() == first.ty.vec_dot_type()
                    && FloatKind::of(w.ty).is_none()
                    && kernels::native_kernel(level, w.ty).is_some()
                    && (!small || kernels::has_small_batch_kernel(level, w.ty))
            });
        // Otherwise, a prompt batch: the input rows quantized once for every weight that
        // takes the same activation form (Gemma 3's q, k and v, or gate and up), then
        // one matmul after the other; or simply
        // one matmul after the other.
        let one_form = ws
            .iter()
            .all(|w| w.k == first.k && act_form(w.ty) == act_form(first.ty));
        let batch =
            !shared && one_form && m >= kernels::GEMM_MIN_ROWS && FloatKind::of(first.ty).is_none();
        if !shared && !batch {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(*w, x, m, out)?;
            }
            return Ok(());
        }
        let k = first.k;
        assert_eq!(
            x.len(),
            m * k,
            "matmul_multi: x has {} values, expected {m} x {k}",
            x.len()
        );
        if batch {
            let acts = self
                .pool
                .install(|| Acts::new(level, first.ty, x, k))
                .map_err(|e| fmt_err("quantizing activations", e))?;
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.count(w.ty);
                self.matmul_bytes(
                    w.ty,
                    w.rows(0, w.n),
                    w.k,
                    w.n,
                    w.row_bytes,
                    x,
                    Some(&acts),
                    m,
                    out,
                )
                .map_err(|e| {
                    HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                })?;
            }
            return Ok(());
        }
        for (i, (w, out)) in ws.iter().zip(outs.iter()).enumerate() {
            assert_eq!(
                out.len(),
                m * w.n,
                "matmul_multi: out {i} has {} values, expected {m} x {}",
                out.len(),
                w.n
            );
            self.count(w.ty);
        }
        // Several rows: each matrix's results as [weight row][m], transposed back after.
        let mut t_bufs: Vec<Vec<f32>> = if small {
            ws.iter().map(|w| vec![0f32; w.n * m]).collect()
        } else {
            Vec::new()
        };
        let total_rows: usize = ws.iter().map(|w| w.n).sum();
        // Four tasks per thread over all the matrices (see `matmul_bytes`); whole row
        // groups of packed weights.
        let per_task = total_rows.div_ceil(self.threads * 4).max(16);
        let per_task = chunk_rows(per_task, ws.iter().any(|w| w.x16.is_some()), usize::MAX);
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
        if small {
            for (i, t) in t_bufs.iter_mut().enumerate() {
                for (c, dst) in t.chunks_mut(per_task * m).enumerate() {
                    tasks.push((i, c * per_task, dst));
                }
            }
        } else {
            for (i, out) in outs.iter_mut().enumerate() {
                for (c, dst) in out.chunks_mut(per_task).enumerate() {
                    tasks.push((i, c * per_task, dst));
                }
            }
        }
        self.pool.install(|| {
            let acts = Acts::new(level, first.ty, x, k)
                .map_err(|e| fmt_err("quantizing activations", e))?;
            let all_rows: Vec<usize> = (0..m).collect();
            tasks.into_par_iter().try_for_each(|(i, o0, dst)| {
                let w = ws[i];
                let rows = dst.len() / m;
                let wr = w.rows(o0, rows);
                if wr.is_packed() {
                    return kernels::x16_rows(wr, k, &acts, &all_rows, dst).map_err(|e| {
                        let e = fmt_err("matmul", e);
                        HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                    });
                }
                let wb = &w.bytes()[o0 * w.row_bytes..(o0 + rows) * w.row_bytes];
                if small {
                    return match kernels::rows_small_batch(level, w.ty, wb, &acts, k, m, dst) {
                        true => Ok(()),
                        false => Err(HalError::runtime(format!(
                            "matmul_multi: no small-batch kernel for {} (tensor '{}')",
                            w.ty, w.info.name
                        ))),
                    };
                }
                kernels::matvec_rows(level, w.ty, wb, &acts, k, 0, dst).map_err(|e| {
                    let e = fmt_err("matmul", e);
                    HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                })
            })
        })?;
        for ((w, out), t) in ws.iter().zip(outs.iter_mut()).zip(&t_bufs) {
            for (j, row) in t.chunks_exact(m).enumerate() {
                for (r, &v) in row.iter().enumerate() {
                    out[r * w.n + j] = v;
                }
            }
        }
        Ok(())
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: &[f32],
        rows: &[ExpertRow],
        out: &mut [f32],
    ) -> Result<(), HalError> {
        self.expert_matmul_multi(&[w], x, rows, &mut [out])
    }

    fn expert_matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        rows: &[ExpertRow],
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        assert_eq!(
            ws.len(),
            outs.len(),
            "expert_matmul_multi: one output per weight"
        );
        let ws: Vec<&CpuWeight> = ws.iter().map(|w| self.weight(*w)).collect();
        let Some(k) = ws.first().map(|w| w.k) else {
            return Ok(());
        };
        assert!(
            k > 0 && x.len().is_multiple_of(k),
            "expert_matmul: x length {} vs in {k}",
            x.len()
        );
        let n_in = x.len() / k;
        for (w, out) in ws.iter().zip(outs.iter()) {
            assert_eq!(w.k, k, "expert_matmul_multi: weights of different inputs");
            assert_eq!(out.len(), rows.len() * w.n, "expert_matmul: out length");
            self.count(w.ty);
        }
        let n_experts = ws.iter().map(|w| w.e).min().unwrap_or(0);
        // Group rows by expert so each expert's blocks are read once for all its rows.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_experts];
        for (i, r) in rows.iter().enumerate() {
            let e = r.expert as usize;
            if e >= n_experts {
                let w = ws.iter().find(|w| e >= w.e).unwrap_or(&ws[0]);
                return Err(HalError::invalid(format!(
                    "expert_matmul: expert {e} of tensor '{}' with {} experts",
                    w.info.name, w.e
                )));
            }
            assert!(
                (r.input_row as usize) < n_in,
                "expert_matmul: input row {} of {n_in}",
                r.input_row
            );
            by_expert[e].push(i);
        }
        let active: Vec<(usize, Vec<usize>)> = by_expert
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.is_empty())
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let level = self.level;
        // Experts with a prompt's worth of tokens (a prefill routes ~k/E of its tokens to
        // each): the weight-tiled gemm of `matmul`, one expert and weight at a time, each
        // parallel inside (the bench preset's prefill: 32 tokens per expert). The rest:
        // (weight, expert) pairs for the one parallel section below.
        let mut small: Vec<(usize, usize, &[usize])> = Vec::new();
        for (e, list) in &active {
            let m = list.len();
            if m < kernels::GEMM_MIN_ROWS {
                small.extend((0..ws.len()).map(|wi| (wi, *e, &list[..])));
                continue;
            }
            let gathered: Vec<f32> = list
                .iter()
                .flat_map(|&i| {
                    let r = rows[i].input_row as usize;
                    x[r * k..(r + 1) * k].iter().copied()
                })
                .collect();
            // The expert's rows quantized once per activation form (gate and up: once).
            let mut subs: Vec<(GgmlType, Acts)> = Vec::new();
            for (wi, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
                let (n, ty) = (w.n, w.ty);
                if n == 0 {
                    continue;
                }
                let mat = w.rows(e * n, n);
                let mut tmp = vec![0f32; m * n];
                let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
                if !subs.iter().any(|(t, _)| act_form(*t) == act_form(ty)) {
                    let sub = self
                        .pool
                        .install(|| Acts::new(level, ty, &gathered, k))
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    subs.push((ty, sub));
                }
                let Some((_, sub)) = subs.iter().find(|(t, _)| act_form(*t) == act_form(ty)) else {
                    return Err(HalError::runtime(
                        "expert matmul: activations not quantized",
                    ));
                };
                let done = self.pool.install(|| {
                    let mut gs = std::mem::take(
                        &mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    let done =
                        kernels::gemm(level, ty, mat, sub, k, n, m, per_rows, &mut gs, &mut tmp)
                            .map_err(|e| fmt_err("expert matmul", e));
                    *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
                    done
                })?;
                if !done {
                    small.push((wi, *e, &list[..]));
                    continue;
                }
                for (t, &i) in list.iter().enumerate() {
                    out[i * n..(i + 1) * n].copy_from_slice(&tmp[t * n..(t + 1) * n]);
                }
            }
        }
        small.retain(|&(wi, _, _)| ws[wi].n > 0);
        if small.is_empty() {
            return Ok(());
        }
        // One parallel section for the whole call: every input row is quantized once per
        // activation type, and the tasks are (weight, expert, chunk of its weight rows)
        // triples, so the threads share all the weights' and experts' rows instead of
        // meeting at a barrier after each (the gate and up projections of a layer's
        // experts in one call: one section, not two).
        let total_rows: usize = small.iter().map(|&(wi, _, _)| ws[wi].n).sum();
        // Four tasks per thread, as a decode's matmuls (`matmul_bytes`): fewer, longer
        // weight streams for the prefetcher.
        let per_task_of = |w: &CpuWeight| {
            chunk_rows(
                total_rows.div_ceil(self.threads * 4).max(16).min(w.n),
                w.x16.is_some(),
                w.n,
            )
        };
        // Results per (weight, expert) as [weight row][its tokens], split into per-task
        // chunks.
        let mut buf = vec![0f32; small.iter().map(|&(wi, _, l)| l.len() * ws[wi].n).sum()];
        let mut tasks = Vec::new();
        let mut rest: &mut [f32] = &mut buf;
        for (si, &(wi, _, list)) in small.iter().enumerate() {
            let (m, n) = (list.len(), ws[wi].n);
            let per_task = per_task_of(ws[wi]);
            let (mut region, tail) = rest.split_at_mut(m * n);
            rest = tail;
            let mut o0 = 0;
            while !region.is_empty() {
                let take = (per_task * m).min(region.len());
                let (chunk, r) = region.split_at_mut(take);
                region = r;
                tasks.push((si, o0, chunk));
                o0 += take / m;
            }
        }
        self.pool.install(|| {
            // The input rows quantized once for each activation form the weights need.
            let mut acts: Vec<(GgmlType, Acts)> = Vec::new();
            for w in &ws {
                if !acts.iter().any(|(t, _)| act_form(*t) == act_form(w.ty)) {
                    let a = Acts::new(level, w.ty, x, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    acts.push((w.ty, a));
                }
            }
            let acts_of = |ty: GgmlType| {
                acts.iter()
                    .find(|(t, _)| act_form(*t) == act_form(ty))
                    .map(|(_, a)| a)
            };
            tasks.into_par_iter().try_for_each(|(si, o0, dst)| {
                let (wi, e, list) = small[si];
                let w = ws[wi];
                let (n, ty, row_bytes) = (w.n, w.ty, w.row_bytes);
                let Some(acts) = acts_of(ty) else {
                    return Err(HalError::runtime(
                        "expert matmul: activations not quantized",
                    ));
                };
                let m = list.len();
                let rows_here = dst.len() / m;
                let wr = w.rows(e * n + o0, rows_here);
                if wr.is_packed() {
                    let inputs: Vec<usize> =
                        list.iter().map(|&i| rows[i].input_row as usize).collect();
                    return kernels::x16_rows(wr, k, acts, &inputs, dst)
                        .map_err(|e| fmt_err("expert matmul", e));
                }
                let mat_bytes = n * row_bytes;
                let mat = &w.bytes()[e * mat_bytes..(e + 1) * mat_bytes];
                if m == 1 {
                    let r = rows[list[0]].input_row as usize;
                    let wb = &mat[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    return kernels::matvec_rows(level, ty, wb, acts, k, r, dst)
                        .map_err(|e| fmt_err("expert matmul", e));
                }
                let inputs: Vec<usize> = list.iter().map(|&i| rows[i].input_row as usize).collect();
                if kernels::has_small_batch_kernel(level, ty) {
                    // The expert's few tokens gathered and quantized apart (row by row,
                    // as in the whole batch's `acts`: the same bytes), then each weight
                    // block decoded once for all of them (`kernels::rows_small_batch`),
                    // not a dispatch per weight row: at c = 4 on the bench preset, about
                    // one expert in eight gets two tokens.
                    let gathered: Vec<f32> = inputs
                        .iter()
                        .flat_map(|&r| x[r * k..(r + 1) * k].iter().copied())
                        .collect();
                    let sub = Acts::new(level, ty, &gathered, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    let wb = &mat[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    if kernels::rows_small_batch(level, ty, wb, &sub, k, m, dst) {
                        return Ok(());
                    }
                }
                let mut tmp = [0f32; TILE];
                for r in 0..rows_here {
                    let o = o0 + r;
                    let wrow = &mat[o * row_bytes..(o + 1) * row_bytes];
                    for (t0, idx) in inputs.chunks(TILE).enumerate() {
                        let t0 = t0 * TILE;
                        dot_rows_checked(level, ty, wrow, acts, k, idx, &mut tmp[..idx.len()])?;
                        dst[r * m + t0..r * m + t0 + idx.len()].copy_from_slice(&tmp[..idx.len()]);
                    }
                }
                Ok::<(), HalError>(())
            })
        })?;
        let mut off = 0;
        for &(wi, _, list) in &small {
            let (m, n) = (list.len(), ws[wi].n);
            let out = &mut outs[wi];
            if let [i] = list {
                // One row for this expert (most of a decode's): a plain copy.
                out[i * n..(i + 1) * n].copy_from_slice(&buf[off..off + n]);
            } else {
                for o in 0..n {
                    for (t, &i) in list.iter().enumerate() {
                        out[i * n + o] = buf[off + o * m + t];
                    }
                }
            }
            off += m * n;
        }
        Ok(())
    }

    fn get_rows(&self, w: &dyn Weight, ids: &[u32], out: &mut [f32]) -> Result<(), HalError> {
        let w = self.weight(w);
        let d = w.k;
        assert_eq!(out.len(), ids.len() * d, "get_rows: out length");
        let rows_total = w.n * w.e;
        let bytes = w.bytes();
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(d.max(1))) {
            let id = id as usize;
            if id >= rows_total {
                return Err(HalError::invalid(format!(
                    "get_rows: id {id} beyond the {rows_total} rows of tensor '{}'",
                    w.info.name
                )));
            }
            // A packed weight's row comes back from its group of sixteen.
            let unpacked = match w.x16 {
                Some(_) => w
                    .rows(id / X16_ROWS * X16_ROWS, X16_ROWS)
                    .packed_row_bytes(id % X16_ROWS),
                None => None,
            };
            let src = match &unpacked {
                Some(row) => &row[..],
                None => &bytes[id * w.row_bytes..(id + 1) * w.row_bytes],
            };
            match FloatKind::of(w.ty) {
                Some(kind) => {
                    for (j, v) in o.iter_mut().enumerate() {
                        *v = kind.get(src, j);
                    }
                }
                None => flint_core::dequant::dequantize(w.ty, src, o)
                    .map_err(|e| fmt_err(&format!("get_rows of '{}'", w.info.name), e))?,
            }
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: Option<&[f32]>,
        eps: f32,
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        self.pool
            .install(|| ops::rms_norm(x, weight, eps, dim, out));
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: &mut [f32],
        delta: &[f32],
        weight: &[f32],
        eps: f32,
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        self.pool
            .install(|| ops::add_rms_norm(residual, delta, Some(weight), eps, dim, out));
        Ok(())
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], p: &RopeParams<'_>) -> Result<(), HalError> {
        p.check()?;
        let cfg = p.config();
        // The q and k of every layer of a step share their positions (and, per kind of
        // layer, their parameters): the angles are computed once and kept for the next
        // calls.
        let cached = {
            let cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.iter().find(|t| t.matches(positions, &cfg)).cloned()
        };
        let table = match cached {
            Some(t) => t,
            None => {
                let t = Arc::new(self.pool.install(|| ops::RopeTable::new(positions, &cfg)));
                let mut cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= ROPE_TABLES {
                    cache.remove(0);
                }
                cache.push(Arc::clone(&t));
                t
            }
        };
        // FMA comes with every SIMD level.
        let fma = self.level >= SimdLevel::Avx2;
        self.pool
            .install(|| ops::rope(x, &table, p.kind, p.n_heads, p.head_dim, fma));
        Ok(())
    }

    fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "silu_mul: lengths"
        );
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx512 {
            // SAFETY: the level was checked against the CPU's features at device open.
            unsafe { kernels::act::silu_mul(gate, up, out) };
            return Ok(());
        }
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = flint_core::math::silu(g) * u;
        }
        Ok(())
    }

    fn gelu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "gelu_mul: lengths"
        );
        // ggml's CPU backend computes GELU through its f16 table (`GGML_GELU_FP16`):
        // the input and the result are rounded to f16. Gemma 3's logits are sensitive
        // to that rounding, and llama.cpp's logits are made with it, so the cpu device
        // does the same (within the HAL's tolerance of `gelu_tanh(gate) * up`).
        // Like ggml, from a table indexed by the f16 input: the same values as
        // `gelu_tanh_ggml_f16` (which depends only on f16(x) inside (-10, 10)).
        let table = gelu_f16_table();
        let gelu = |x: f32| {
            if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                table[usize::from(half::f16::from_f32(x).to_bits())]
            }
        };
        let level = self.level;
        self.pool.install(|| {
            out.par_chunks_mut(4096)
                .zip(gate.par_chunks(4096).zip(up.par_chunks(4096)))
                .for_each(|(o, (g, u))| {
                    #[cfg(target_arch = "x86_64")]
                    if level >= SimdLevel::Avx512 {
                        // SAFETY: AVX-512F, AVX2 and F16C were checked at device open.
                        unsafe { kernels::act::gelu_mul_table(table, g, u, o) };
                        return;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if level >= SimdLevel::Avx2 {
                        // SAFETY: AVX2 and F16C were checked at device open.
                        unsafe { kernels::avx2::gelu_mul_table(table, g, u, o) };
                        return;
                    }
                    let _ = level;
                    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                        *o = gelu(g) * u;
                    }
                });
        });
        Ok(())
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), HalError> {
        assert_eq!(acc.len(), x.len(), "add: lengths");
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v;
        }
        Ok(())
    }

    fn add_bias(&self, x: &mut [f32], bias: &[f32]) -> Result<(), HalError> {
        flint_hal::bias_rows(x.len(), bias.len())?;
        ops::add_bias(x, bias);
        Ok(())
    }

    fn scale(&self, x: &mut [f32], s: f32) -> Result<(), HalError> {
        for v in x.iter_mut() {
            *v *= s;
        }
        Ok(())
    }

    fn scatter_add_weighted(
        &self,
        acc: &mut [f32],
        x: &[f32],
        rows: &[u32],
        weights: &[f32],
        dim: usize,
    ) -> Result<(), HalError> {
        assert!(
            x.len() == rows.len() * dim && rows.len() == weights.len(),
            "scatter_add_weighted: lengths"
        );
        for ((&r, &wt), xr) in rows.iter().zip(weights).zip(x.chunks_exact(dim.max(1))) {
            let r = r as usize;
            assert!(
                (r + 1) * dim <= acc.len(),
                "scatter_add_weighted: row {r} beyond acc"
            );
            for (a, &v) in acc[r * dim..(r + 1) * dim].iter_mut().zip(xr) {
                *a += wt * v;
            }
        }
        Ok(())
    }

    fn route_topk(
        &self,
        logits: &[f32],
        n_experts: usize,
        bias: Option<&[f32]>,
        cfg: &RoutingConfig,
        ids: &mut [u32],
        weights: &mut [f32],
    ) -> Result<(), HalError> {
        ops::route_topk(logits, n_experts, bias, cfg, ids, weights)
    }

    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError> {
        Ok(Box::new(CpuKv::new(layout)?))
    }

    fn kv_bytes_per_value(&self) -> usize {
        // f16, as llama.cpp's default cache types (`CpuKv`).
        2
    }

    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: &[f32],
        v: &[f32],
        slots: &[u32],
    ) -> Result<(), HalError> {
        let kv = kv
            .as_any_mut()
            .downcast_mut::<CpuKv>()
            .expect("KV buffer was not allocated by the cpu device");
        ops::write_kv(kv, k, v, slots, self.level >= SimdLevel::Avx2)
    }

    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        let kv = kv
            .as_any()
            .downcast_ref::<CpuKv>()
            .expect("KV buffer was not allocated by the cpu device");
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx512 {
            // SAFETY: the level was checked against the CPU's features at device open.
            return self
                .pool
                .install(|| unsafe { kernels::attn::paged_attention(kv, p, out) });
        }
        let f16c = self.level >= SimdLevel::Avx2;
        self.pool.install(|| ops::paged_attention(kv, p, out, f16c))
    }

    fn run_step(&self, step: &mut (dyn FnMut() + Send)) {
        // Every op inside runs on a pool worker (`install` from a worker is a plain
        // call), its parallel parts spread to the other workers by work stealing.
        if self.threads < 2 {
            return self.pool.install(|| flint_hal::ab_test::timed_step(step));
        }
        if let Some(me) = self.pool.current_thread_index() {
            // Already on a worker: inside `run_session`, or a caller's own `install`.
            let session = self
                .session
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(s) = session.filter(|s| s.owner == me) {
                // The session's waiting workers leave after a long idle stretch (the
                // body waited between steps); send them back.
                if s.waiting.load(Ordering::Acquire) == 0 {
                    s.waiting.store(self.threads - 1, Ordering::Release);
                    self.pool.spawn_broadcast(move |ctx| {
                        if ctx.index() != s.owner {
                            wait_for_work(&s.done);
                            s.waiting.fetch_sub(1, Ordering::AcqRel);
                        }
                    });
                }
            }
            return flint_hal::ab_test::timed_step(step);
        }
        // From a foreign thread: the step runs on worker 0 while the others stay awake
        // for its parallel work.
        let done = AtomicBool::new(false);
        let step = std::sync::Mutex::new(step);
        self.pool.broadcast(|ctx| {
            if ctx.index() == 0 {
                let _done = SetOnDrop(&done);
                let mut step = step.lock().unwrap_or_else(|e| e.into_inner());
                flint_hal::ab_test::timed_step(&mut **step);
            } else {
                wait_for_work(&done);
            }
        });
    }

    fn run_session(&self, body: &mut (dyn FnMut() + Send)) {
        if self.threads < 2 || self.pool.current_thread_index().is_some() {
            return self.pool.install(body);
        }
        // The body runs on one worker, and every `run_step` inside it is a plain call
        // there: no hand-off from the caller's thread at the start of each step, no
        // wake-up of the caller at its end (tens of microseconds each, on the order of
        // a small model's whole decode step).
        self.pool.install(|| {
            let Some(owner) = self.pool.current_thread_index() else {
                return body();
            };
            let state = Arc::new(SessionState {
                owner,
                done: AtomicBool::new(false),
                waiting: std::sync::atomic::AtomicUsize::new(0),
            });
            *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(state.clone());
            // However the body ends, a panic included: the waiting workers leave and the
            // session is over.
            struct End<'a>(&'a CpuDevice, &'a SessionState);
            impl Drop for End<'_> {
                fn drop(&mut self) {
                    self.1.done.store(true, Ordering::Release);
                    *self.0.session.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
            }
            let _end = End(self, &state);
            body();
        })
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            block_dispatches: self.block_dispatches.load(Ordering::Relaxed),
            float_dispatches: self.float_dispatches.load(Ordering::Relaxed),
        }
    }
}
