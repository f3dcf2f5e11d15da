//! The CPU device: its state (SIMD level, thread pool, scratch buffers, arena) and its
//! `Device` implementation, which hands matmuls to `matmul.rs`, staging to `stage.rs`,
//! the forward steps to `worker.rs`, and the element-wise ops, routing and the KV cache
//! to `ops.rs`, `kv.rs` and the SIMD kernels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flint_core::{math, FormatError, GgmlType};
use flint_hal::{
    DeltaNetShape, Device, DeviceCounters, DeviceOptions, HalError, IndexView, IndexViewMut,
    KvBuffer, KvLayout, Op, PagedAttention, RopeParams, RoutingConfig, StagingPlan,
    TransferCounter, View, ViewMut, Weight, WeightDesc, WeightHandle,
};
use rayon::prelude::*;

use crate::kernels::{self, FloatKind};
use crate::kv::{CpuKv, FloatOrder};
use crate::simd::SimdLevel;
use crate::stage::{CpuWeight, WeightLayout};
use crate::worker::SessionState;
use crate::{arena, delta, kv, ops};

/// The CPU device.
#[derive(Debug)]
pub struct CpuDevice {
    pub(crate) level: SimdLevel,
    pub(crate) threads: usize,
    pub(crate) pool: rayon::ThreadPool,
    pub(crate) block_dispatches: AtomicU64,
    pub(crate) float_dispatches: AtomicU64,
    /// The transposed results of the last batched matmul, kept for the next one: a
    /// fresh buffer of a few MiB per matmul costs page faults and zeroing.
    pub(crate) scratch: std::sync::Mutex<Vec<f32>>,
    /// The decoded weight blocks of the last weight-tiled gemm, kept for the next one.
    pub(crate) gemm_scratch: std::sync::Mutex<kernels::GemmScratch>,
    /// The RoPE angles of the last few distinct calls (positions, base, rotated size).
    pub(crate) rope_cache: std::sync::Mutex<Vec<Arc<ops::RopeTable>>>,
    /// The session running now (`run_session`), if any.
    pub(crate) session: std::sync::Mutex<Option<Arc<SessionState>>>,
    /// Where the weights the device keeps (repacked or copied) live.
    pub(crate) arena: arena::PackArena,
    /// How quantized weights are kept on AVX-512 VNNI, and why.
    pub(crate) layout: WeightLayout,
    pub(crate) layout_reason: &'static str,
    /// Batch-invariant float orders, or llama.cpp's for the call's size.
    pub(crate) order: FloatOrder,
    /// Whether Q8_0, Q5_0, Q4_K and Q6_K matrices staged from now on are multiplied in
    /// the AMX orders (`kernels::amx`), and why.
    pub(crate) amx: bool,
    pub(crate) amx_reason: &'static str,
    /// Host-device traffic. The device's tensors are host memory (the trait's defaults
    /// for `alloc`, `upload`, `download`, `download_tensor` and `copy`): only `upload`,
    /// `download` and `download_tensor` count; ops read and write their views in place.
    pub(crate) transfers: TransferCounter,
}

/// RoPE angle tables kept (a step of a model with two kinds of layers uses two).
const ROPE_TABLES: usize = 4;

pub(crate) fn fmt_err(what: &str, e: FormatError) -> HalError {
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
        let (layout, layout_reason) = WeightLayout::choose()?;
        let order = FloatOrder::choose()?;
        let (amx, amx_reason) = amx_choose(level)?;
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
            layout,
            layout_reason,
            order,
            amx,
            amx_reason,
            transfers: TransferCounter::default(),
        })
    }

    /// The same device multiplying the Q8_0, Q5_0, Q4_K and Q6_K matrices it stages from
    /// now on in the AMX orders (`on`, at the AVX-512 VNNI level: see [`CpuDevice::amx`])
    /// or not.
    pub fn with_amx(mut self, on: bool) -> Self {
        self.amx = on && self.level == SimdLevel::Avx512Vnni;
        self.amx_reason = "set by the caller";
        self
    }

    /// Whether Q8_0, Q5_0, Q4_K and Q6_K matrices are multiplied in the AMX orders
    /// (llama.cpp's AMX kernels' for Q8_0, Q4_K and Q6_K,
    /// `flint_core::dot::ggml_x86::vec_dot_q8_0_q8_0_amx` and its neighbours, and Q8_0's
    /// for Q5_0) for every number of activation rows (Q8_0 and Q5_0 on AMX tiles from five
    /// rows where this process can run them, else on AVX-512 VNNI; the K-quants on
    /// AVX-512 VNNI: `kernels::amx`), and why: with `FLINT_CPU_AMX=1` (an error below the
    /// AVX-512 VNNI level). Off by default: the golden files
    /// and the reference forward hold the non-AMX (tinyBLAS) order, which the device
    /// then follows for every weight type (`docs/benchmarks.md` has what AMX gains).
    pub fn amx(&self) -> (bool, &'static str) {
        (self.amx, self.amx_reason)
    }

    /// The same device keeping its weights in `layout` (tests of each layout; the
    /// default comes from [`WeightLayout::choose`]). Weights staged before keep theirs.
    pub fn with_layout(mut self, layout: WeightLayout) -> Self {
        self.layout = layout;
        self.layout_reason = "set by the caller";
        self
    }

    /// The same device computing in `order` (the default comes from
    /// [`FloatOrder::choose`]).
    pub fn with_float_order(mut self, order: FloatOrder) -> Self {
        self.order = order;
        self
    }

    /// Batch-invariant float orders, or llama.cpp's for the call's size.
    pub fn float_order(&self) -> FloatOrder {
        self.order
    }

    /// How quantized weights are kept (it matters on AVX-512 VNNI only).
    pub fn layout(&self) -> WeightLayout {
        self.layout
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
    pub(crate) fn check_usable(&self, w: &WeightDesc) -> Result<(), HalError> {
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

    pub(crate) fn weight<'a>(&self, w: &'a dyn Weight) -> &'a CpuWeight {
        w.as_any()
            .downcast_ref::<CpuWeight>()
            .expect("weight was not staged by the cpu device")
    }

    pub(crate) fn count(&self, ty: GgmlType) {
        if FloatKind::of(ty).is_some() {
            self.float_dispatches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.block_dispatches.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `gelu_tanh_ggml_f16` of every f16 value (by its bits), built once (65536 entries).
pub(crate) fn gelu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(flint_core::math::gelu_f16_table_entry)
            .collect()
    })
}

impl CpuDevice {
    /// The rotation table of `positions` under `cfg`: the q and k of every layer of a
    /// step share their positions (and, per kind of layer, their parameters), so the
    /// angles are computed once and kept for the next calls.
    fn rope_table(
        &self,
        positions: &[u32],
        cfg: &flint_hal::RopeConfig<'_>,
    ) -> Arc<ops::RopeTable> {
        let cached = {
            let cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.iter().find(|t| t.matches(positions, cfg)).cloned()
        };
        match cached {
            Some(t) => t,
            None => {
                let t = Arc::new(self.pool.install(|| ops::RopeTable::new(positions, cfg)));
                let mut cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= ROPE_TABLES {
                    cache.remove(0);
                }
                cache.push(Arc::clone(&t));
                t
            }
        }
    }
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }

    fn description(&self) -> String {
        // Q3_K blocks are arranged for the VBMI matvec wherever weights are repacked.
        let q3k = if crate::simd::has_vbmi_gfni() {
            ", Q3_K blocks arranged"
        } else {
            ""
        };
        let layout = match (self.level, self.layout) {
            (SimdLevel::Avx512Vnni, WeightLayout::Packed) => {
                format!(
                    ", weights repacked in 16-row groups{q3k} ({})",
                    self.layout_reason
                )
            }
            (SimdLevel::Avx512Vnni, WeightLayout::BySize) => format!(
                ", weights repacked in 16-row groups{q3k} but Q6_K tensors of {} MiB or more \
                 in the file's layout ({})",
                crate::stage::Q6K_FILE_MIN_BYTES >> 20,
                self.layout_reason
            ),
            (SimdLevel::Avx512Vnni, WeightLayout::File) => {
                format!(", weights in the file's layout ({})", self.layout_reason)
            }
            _ => String::new(),
        };
        let order = match self.order {
            FloatOrder::BatchInvariant => "",
            FloatOrder::LlamaCpp => ", llama.cpp's float orders for each call's size",
        };
        let amx = if self.amx {
            let tiles = if crate::kernels::amx::available() {
                "Q8_0/Q5_0 on AMX tiles"
            } else {
                "on AVX-512 VNNI (this process cannot run AMX tiles)"
            };
            format!(
                ", Q8_0/Q5_0/Q4_K/Q6_K in llama.cpp's AMX orders, {tiles} ({})",
                self.amx_reason
            )
        } else {
            format!(" (AMX not used: {})", self.amx_reason)
        };
        // A sub-feature some kernels of the level take where the CPU has it.
        let vbmi = match self.level == SimdLevel::Avx512Vnni {
            true if crate::simd::has_vbmi_gfni() => {
                " + VBMI (IQ4_NL, Q3_K decode) + GFNI (Q3_K decode)"
            }
            true if crate::simd::has_vbmi() => " + VBMI (IQ4_NL decode)",
            _ => "",
        };
        format!(
            "host CPU, {} threads, SIMD {}{vbmi}{layout}{order}{amx}, no NEON",
            self.threads, self.level
        )
    }

    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        match op {
            Op::Stage | Op::Matmul | Op::MatmulGlu | Op::ExpertMatmul => {
                ty.is_some_and(|t| self.matmul_supports(t))
            }
            Op::GetRows => ty.is_some_and(dequant_supports),
            Op::RmsNorm
            | Op::AddRmsNorm
            | Op::PostNormAddRmsNorm
            | Op::Rope
            | Op::NormRope
            | Op::SiluMul
            | Op::GeluMul
            | Op::SwigluOaiMul
            | Op::Add
            | Op::AddBias
            | Op::Scale
            | Op::AddId
            | Op::ScatterAddWeighted
            | Op::RouteTopK
            | Op::WriteKv
            | Op::PagedAttention
            | Op::SsmConvSilu
            | Op::GatedDeltaNet
            | Op::Sigmoid
            | Op::Mul
            | Op::Deinterleave
            | Op::DeltaNetGate
            | Op::L2Norm
            | Op::Copy => true,
        }
    }

    fn transfer_counter(&self) -> &TransferCounter {
        &self.transfers
    }

    fn plan(&self, weights: &[WeightDesc], _other_bytes: u64) -> Result<StagingPlan, HalError> {
        self.plan_weights(weights)
    }

    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        self.stage_weight(desc)
    }

    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, out) = (x.host(), out.host());
        let w = self.weight(w);
        self.count(w.ty);
        self.matmul_bytes(w.ty, w.rows(0, w.n), w.k, w.n, w.row_bytes, x, None, m, out)
            .map_err(|e| HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name)))
    }

    fn matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        m: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.reborrow().host()).collect();
        self.matmul_shared(ws, x.host(), m, &mut outs)
    }

    fn matmul_glu(
        &self,
        gate: &dyn Weight,
        up: &dyn Weight,
        x: View<'_>,
        m: usize,
        glu: flint_hal::Glu,
        scratch: [ViewMut<'_>; 2],
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let mut out = out;
        if self.matmul_glu_fused(gate, up, x.host(), m, glu, out.reborrow().host())? {
            return Ok(());
        }
        flint_hal::matmul_glu_composed(self, gate, up, x, m, glu, scratch, out)
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.expert_matmuls(&[w], x.host(), ids.host(), &mut [out.host()])
    }

    fn expert_matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        ids: IndexView<'_>,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.reborrow().host()).collect();
        self.expert_matmuls(ws, x.host(), ids.host(), &mut outs)
    }

    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let ids = ids.host();
        let out = out.host();
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
            // A packed weight's row comes back from its unit of the layout.
            let unpacked = w.packed_row(id);
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
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, weight, out) = (x.host(), weight.map(View::host), out.host());
        self.pool
            .install(|| ops::rms_norm(x, weight, eps, dim, out, self.level));
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: ViewMut<'_>,
        delta: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (residual, delta) = (residual.host(), delta.host());
        let (weight, out) = (weight.host(), out.host());
        self.pool.install(|| {
            ops::add_rms_norm(residual, delta, Some(weight), eps, dim, out, self.level)
        });
        Ok(())
    }

    fn post_norm_add_rms_norm(
        &self,
        residual: ViewMut<'_>,
        delta: View<'_>,
        delta_weight: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        _scratch: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (residual, delta, out) = (residual.host(), delta.host(), out.host());
        let (delta_weight, weight) = (delta_weight.host(), weight.host());
        self.pool.install(|| {
            ops::post_norm_add_rms_norm(
                residual,
                delta,
                delta_weight,
                weight,
                eps,
                dim,
                out,
                self.level,
            )
        });
        Ok(())
    }

    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let positions = positions.host();
        let x = x.host();
        p.check()?;
        let table = self.rope_table(positions, &p.config());
        // FMA comes with every SIMD level.
        let fma = self.level >= SimdLevel::Avx2;
        self.pool
            .install(|| ops::rope(x, &table, p.kind, p.n_heads, p.head_dim, fma));
        Ok(())
    }

    fn norm_rope(
        &self,
        x: ViewMut<'_>,
        weight: View<'_>,
        eps: f32,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
        scale: f32,
        _scratch: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, weight, positions) = (x.host(), weight.host(), positions.host());
        p.check()?;
        let table = self.rope_table(positions, &p.config());
        let fma = self.level >= SimdLevel::Avx2;
        let heads = ops::Heads {
            n_heads: p.n_heads,
            head_dim: p.head_dim,
            kind: p.kind,
        };
        self.pool
            .install(|| ops::norm_rope(x, weight, eps, &table, heads, scale, self.level, fma));
        Ok(())
    }

    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "silu_mul: lengths"
        );
        if out.len() <= SILU_CHUNK {
            silu_mul_at(self.level, gate, up, out);
            return Ok(());
        }
        // Element-wise, so the chunks over the threads change no bit (a prompt's MoE
        // layer: 512 tokens x 8 experts x 768 values).
        self.pool.install(|| {
            out.par_chunks_mut(SILU_CHUNK)
                .zip(gate.par_chunks(SILU_CHUNK).zip(up.par_chunks(SILU_CHUNK)))
                .for_each(|(o, (g, u))| silu_mul_at(self.level, g, u, o));
        });
        Ok(())
    }

    fn swiglu_oai_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "swiglu_oai_mul: lengths"
        );
        // ggml computes it with C's scalar `expf` at every SIMD level; so does the core,
        // and the AVX-512 kernel lane for lane.
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx512 {
            self.pool.install(|| {
                out.par_chunks_mut(4096)
                    .zip(gate.par_chunks(4096).zip(up.par_chunks(4096)))
                    .for_each(|(o, (g, u))| {
                        // SAFETY: the level was checked against the CPU's features at
                        // device open.
                        unsafe { kernels::elementwise::avx512::swiglu_oai_mul(g, u, o) }
                    });
            });
            return Ok(());
        }
        self.pool.install(|| {
            out.par_chunks_mut(4096)
                .zip(gate.par_chunks(4096).zip(up.par_chunks(4096)))
                .for_each(|(o, (g, u))| {
                    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                        *o = flint_core::math::swiglu_oai(g, u);
                    }
                });
        });
        Ok(())
    }

    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
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
                        unsafe { kernels::elementwise::avx512::gelu_mul_table(table, g, u, o) };
                        return;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if level >= SimdLevel::Avx2 {
                        // SAFETY: AVX2 and F16C were checked at device open.
                        unsafe { kernels::elementwise::avx2::gelu_mul_table(table, g, u, o) };
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

    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        let (acc, x) = (acc.host(), x.host());
        assert_eq!(acc.len(), x.len(), "add: lengths");
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v;
        }
        Ok(())
    }

    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        let (x, bias) = (x.host(), bias.host());
        flint_hal::bias_rows(x.len(), bias.len())?;
        ops::add_bias(x, bias);
        Ok(())
    }

    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        for v in x.host() {
            *v *= s;
        }
        Ok(())
    }

    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        math::add_id(x.host(), table.host(), ids.host(), dim)
            .map_err(|e| HalError::invalid(format!("add_id: {e}")))
    }

    fn scatter_add_weighted(
        &self,
        acc: ViewMut<'_>,
        x: View<'_>,
        weights: View<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        math::scatter_add_weighted(acc.host(), x.host(), weights.host(), dim);
        Ok(())
    }

    fn route_topk(
        &self,
        logits: View<'_>,
        n_experts: usize,
        bias: Option<View<'_>>,
        expert_scale: Option<View<'_>>,
        cfg: &RoutingConfig,
        ids: IndexViewMut<'_>,
        weights: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (logits, bias) = (logits.host(), bias.map(View::host));
        let (ids, weights) = (ids.host(), weights.host());
        ops::route_topk(logits, n_experts, bias, cfg, ids, weights)?;
        if let Some(s) = expert_scale {
            math::scale_by_expert(weights, ids, s.host())
                .map_err(|e| HalError::invalid(format!("route_topk: expert scale: {e}")))?;
        }
        Ok(())
    }

    fn ssm_conv_silu(
        &self,
        x: View<'_>,
        weight: View<'_>,
        d_conv: usize,
        state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, weight) = (x.host(), weight.host());
        let (state, out) = (state.host(), out.host());
        delta::ssm_conv_silu(&self.pool, self.level, x, weight, d_conv, state, out);
        Ok(())
    }

    fn gated_delta_net(
        &self,
        shape: &DeltaNetShape,
        q: View<'_>,
        k: View<'_>,
        v: View<'_>,
        g: View<'_>,
        beta: View<'_>,
        state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (q, k, v) = (q.host(), k.host(), v.host());
        let (g, beta) = (g.host(), beta.host());
        let (state, out) = (state.host(), out.host());
        let avx2 = self.level >= SimdLevel::Avx2;
        delta::gated_delta_net(&self.pool, avx2, shape, q, k, v, g, beta, state, out)
    }

    fn sigmoid(&self, x: ViewMut<'_>) -> Result<(), HalError> {
        math::sigmoid_ggml_in_place(x.host());
        Ok(())
    }

    fn mul(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        math::mul_rows(acc.host(), x.host());
        Ok(())
    }

    fn deinterleave(
        &self,
        src: View<'_>,
        chunk: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.reborrow().host()).collect();
        math::deinterleave(src.host(), chunk, &mut outs);
        Ok(())
    }

    fn delta_net_gate(
        &self,
        alpha: ViewMut<'_>,
        dt_bias: View<'_>,
        a: View<'_>,
    ) -> Result<(), HalError> {
        math::delta_net_gates(alpha.host(), dt_bias.host(), a.host());
        Ok(())
    }

    fn l2_norm(&self, x: ViewMut<'_>, dim: usize, eps: f32) -> Result<(), HalError> {
        math::l2_norm_heads(x.host(), dim, eps);
        Ok(())
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
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError> {
        let slots = slots.host();
        let (k, v) = (k.host(), v.host());
        let kv = kv
            .as_any_mut()
            .downcast_mut::<CpuKv>()
            .expect("KV buffer was not allocated by the cpu device");
        kv::write_kv(kv, k, v, slots, self.level >= SimdLevel::Avx2)
    }

    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let out = out.host();
        let kv = kv
            .as_any()
            .downcast_ref::<CpuKv>()
            .expect("KV buffer was not allocated by the cpu device");
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx2 && self.order.one_chunk(p, kv.layout().head_dim_k) {
            // SAFETY: the level was checked against the CPU's features at device open
            // (AVX2 includes FMA and F16C here).
            return self
                .pool
                .install(|| unsafe { kernels::attention::paged_attention_one_chunk(kv, p, out) });
        }
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx512 {
            // SAFETY: the level was checked against the CPU's features at device open.
            return self
                .pool
                .install(|| unsafe { kernels::attention::avx512::paged_attention(kv, p, out) });
        }
        #[cfg(target_arch = "x86_64")]
        if self.level >= SimdLevel::Avx2 {
            // SAFETY: as above (AVX2 includes FMA and F16C here).
            return self
                .pool
                .install(|| unsafe { kernels::attention::avx2::paged_attention(kv, p, out) });
        }
        self.pool
            .install(|| kv::paged_attention(kv, p, self.order, out))
    }

    fn run_step(&self, step: &mut (dyn FnMut() + Send)) {
        self.step_on_workers(step)
    }

    fn run_session(&self, body: &mut (dyn FnMut() + Send)) {
        self.session_on_workers(body)
    }

    /// Batch-invariant order: yes. llama.cpp's order switches with the call's size (the
    /// one-key attention below 64 query rows, single-row F32 dot products).
    fn row_invariant(&self) -> bool {
        self.order == FloatOrder::BatchInvariant
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            block_dispatches: self.block_dispatches.load(Ordering::Relaxed),
            float_dispatches: self.float_dispatches.load(Ordering::Relaxed),
        }
    }
}

/// `FLINT_CPU_AMX` (`1`: on, at the AVX-512 VNNI level, an error below it; the tiles
/// where this process can run AMX-INT8 ([`crate::kernels::amx::available`]), else the
/// same orders on AVX-512 VNNI; `0` or unset: off).
fn amx_choose(level: SimdLevel) -> Result<(bool, &'static str), HalError> {
    match std::env::var("FLINT_CPU_AMX") {
        Ok(v) => match v.trim() {
            "0" => Ok((false, "FLINT_CPU_AMX=0")),
            "1" if level == SimdLevel::Avx512Vnni => Ok((true, "FLINT_CPU_AMX=1")),
            "1" => Err(HalError::unavailable(format!(
                "FLINT_CPU_AMX=1 needs the avx512vnni SIMD level, and the device runs at {level}"
            ))),
            other => Err(HalError::invalid(format!(
                "FLINT_CPU_AMX={other:?} is not 0 or 1"
            ))),
        },
        Err(_) => Ok((false, "off unless FLINT_CPU_AMX=1")),
    }
}

/// Values per task of `silu_mul` (a decode's few thousand stay on one thread).
const SILU_CHUNK: usize = 16 << 10;

/// `out = silu(gate) * up` with the kernel of `level`, each element bit for bit
/// `flint_core::math::silu(g) * u`.
pub(crate) fn silu_mul_at(level: SimdLevel, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            // SAFETY: the level was checked against the CPU's features at device open.
            unsafe { kernels::elementwise::avx512::silu_mul(gate, up, out) };
            return;
        }
        if level == SimdLevel::Avx2 {
            // SAFETY: the level was checked against the CPU's features at device open.
            unsafe { kernels::elementwise::avx2::silu_mul(gate, up, out) };
            return;
        }
    }
    let _ = level;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = flint_core::math::silu(g) * u;
    }
}
