//! The `vk` device: the HAL's ops as compute-shader dispatches on device buffers.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use flint_core::{math, GgmlType};
use flint_hal::{
    bias_rows, fanout, Device, DeviceBuffer, DeviceCounters, DeviceOptions, HalError, IndexView,
    IndexViewMut, KvBuffer, KvLayout, Op, PagedAttention, PlannedWeight, RopeKind, RopeParams,
    RoutingConfig, StagedInfo, StagingPlan, Tensor, Tier, TransferCounter, View, ViewMut, Weight,
    WeightDesc, WeightHandle, WeightKind,
};

use crate::batch::{Bind, Recorder, Slice};
use crate::context::{Ctx, Limits, RawBuf};

/// Largest key or value head the attention shader takes.
pub const MAX_HEAD_DIM: usize = 512;

/// A tensor in device memory.
#[derive(Debug)]
pub struct VkBuffer {
    raw: Arc<RawBuf>,
    len: usize,
}

impl DeviceBuffer for VkBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One buffer of a staged weight: rows `first..first + count` of a matrix, or experts
/// `first..first + count` of a tower.
#[derive(Debug)]
struct Chunk {
    buf: Arc<RawBuf>,
    first: usize,
    count: usize,
}

/// A weight staged on the `vk` device: its encoding's blocks (or an expansion to F32)
/// in one or more buffers of whole rows (whole experts for a tower), each within the
/// device's largest storage binding.
#[derive(Debug)]
pub struct VkWeight {
    info: StagedInfo,
    ty: GgmlType,
    k: usize,
    n: usize,
    experts: usize,
    row_bytes: usize,
    chunks: Vec<Chunk>,
}

impl Weight for VkWeight {
    fn info(&self) -> &StagedInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One layer's KV cache: keys and values in two buffers, slot-major, f32.
#[derive(Debug)]
pub struct VkKv {
    layout: KvLayout,
    k: Arc<RawBuf>,
    v: Arc<RawBuf>,
}

impl KvBuffer for VkKv {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The Vulkan device (see the crate docs).
#[derive(Debug)]
pub struct VkDevice {
    ctx: Arc<Ctx>,
    rec: Mutex<Recorder>,
    transfers: TransferCounter,
    opts: DeviceOptions,
    block_dispatches: AtomicU64,
    float_dispatches: AtomicU64,
    kernel: MatmulKernel,
    gelu_table: OnceLock<Arc<RawBuf>>,
}

/// Which matmul shader the device dispatches (`FLINT_VK_MATMUL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// A workgroup per weight row, threads splitting the row and meeting in a tree
    /// (`matmul.wgsl`): GPUs.
    Groups,
    /// A thread per weight row, subgroups of 8 sharing the activations
    /// (`matmul_rows.wgsl`).
    Rows,
    /// As `Rows`, with the weight types of [`exact_acts`] and F32 in the cpu device's
    /// float order (`matmul_exact.wgsl`: integer dot products of weight and activation
    /// quants, each multiply-add rounded once): CPU implementations (lavapipe).
    Exact,
}

/// The weight types `matmul_exact.wgsl` computes (`shaders/exact/`), with their
/// activation block (`quant_xi.wgsl` mode, values and words per block).
fn exact_acts(ty: GgmlType) -> Option<(u32, usize, usize)> {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some((0, 256, 73)),
        GgmlType::Q8_0 | GgmlType::Q5_0 => Some((1, 32, 9)),
        _ => None,
    }
}

impl MatmulKernel {
    /// `FLINT_VK_MATMUL` (`groups`, `rows` or `exact`), else `Exact` on a CPU
    /// implementation and `Groups` on a GPU. `Rows` and `Exact` share activations across
    /// subgroups of 8 invocations by broadcast, so they need that subgroup size (lavapipe
    /// on 256-bit vectors has it).
    fn choose(cpu: bool, limits: &Limits) -> Result<MatmulKernel, HalError> {
        let rows_ok = limits.subgroup_broadcast == 8;
        let var = std::env::var("FLINT_VK_MATMUL");
        let kernel = match var.as_deref().map(str::trim) {
            Ok("groups") => MatmulKernel::Groups,
            Ok("rows") => MatmulKernel::Rows,
            Ok("exact") => MatmulKernel::Exact,
            Ok("") | Err(_) if cpu && rows_ok => MatmulKernel::Exact,
            Ok("") | Err(_) => MatmulKernel::Groups,
            Ok(other) => {
                return Err(HalError::invalid(format!(
                    "FLINT_VK_MATMUL={other:?} is not groups, rows or exact"
                )))
            }
        };
        if kernel != MatmulKernel::Groups && !rows_ok {
            return Err(HalError::unsupported(format!(
                "FLINT_VK_MATMUL={} needs subgroup broadcasts over 8 invocations in compute \
                 shaders; this device's subgroups: {} (0: no broadcast)",
                kernel.label(),
                limits.subgroup_broadcast
            )));
        }
        Ok(kernel)
    }

    /// The name `FLINT_VK_MATMUL` takes.
    pub fn label(self) -> &'static str {
        match self {
            MatmulKernel::Groups => "groups",
            MatmulKernel::Rows => "rows",
            MatmulKernel::Exact => "exact",
        }
    }

    /// The matmul shader for `w`: `matmul_exact` where the kernel is `Exact` and it has
    /// the type (F32: rows of a multiple of 64 values), else the kernel's own template.
    fn shader(self, w: &VkWeight) -> String {
        let t = match self {
            MatmulKernel::Groups => "matmul",
            MatmulKernel::Exact if self.exact(w) => "matmul_exact",
            MatmulKernel::Rows | MatmulKernel::Exact => "matmul_rows",
        };
        shader_name(t, w.ty)
    }

    /// Activation rows per dense tile of `w`'s shader (its `MT`): one for F32 in
    /// `matmul_exact`, whose state per row is 64 floats; eight otherwise.
    fn tile(self, w: &VkWeight) -> usize {
        if w.ty == GgmlType::F32 && self.exact(w) {
            1
        } else {
            8
        }
    }

    /// Whether `w` goes through `matmul_exact`.
    fn exact(self, w: &VkWeight) -> bool {
        self == MatmulKernel::Exact
            && (exact_acts(w.ty).is_some() || (w.ty == GgmlType::F32 && w.k.is_multiple_of(64)))
    }

    /// Records the matmul dispatch over `n` weight rows by `tiles` activation tiles (dense)
    /// or routed rows (experts): a workgroup per pair for `Groups`, a workgroup of 64
    /// weight rows per tile for `Rows`.
    fn dispatch(
        self,
        rec: &mut Recorder,
        shader: &str,
        binds: &[Bind],
        push: &[u32],
        (n, tiles): (usize, usize),
    ) -> Result<(), HalError> {
        match self {
            MatmulKernel::Groups => rec.dispatch(shader, binds, push, (n * tiles) as u64),
            MatmulKernel::Rows | MatmulKernel::Exact => {
                rec.dispatch_grid(shader, binds, push, n.div_ceil(64) as u64, tiles as u64)
            }
        }
    }
}

/// An op's output: its binding, element offset, and for host memory the arena range to
/// read back into it once the work is done.
struct Out<'v> {
    bind: Bind,
    off: u32,
    back: Option<(Slice, &'v mut [f32])>,
}

fn bytes_of(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn u32s(v: &[u32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn off32(v: usize) -> u32 {
    u32::try_from(v).expect("vk: offsets fit in u32 (buffers are within the binding limit)")
}

impl VkDevice {
    /// Opens the device `FLINT_VK_DEVICE` selects (else the first discrete GPU, else
    /// integrated, else any, lavapipe included).
    pub fn open(opts: &DeviceOptions) -> Result<VkDevice, HalError> {
        let ctx = Ctx::new()?;
        let kernel = MatmulKernel::choose(ctx.adapter.kind.starts_with("CPU"), &ctx.limits)?;
        let rec = Recorder::new(ctx.clone())?;
        Ok(VkDevice {
            ctx,
            rec: Mutex::new(rec),
            transfers: TransferCounter::default(),
            opts: opts.clone(),
            block_dispatches: AtomicU64::new(0),
            float_dispatches: AtomicU64::new(0),
            kernel,
            gelu_table: OnceLock::new(),
        })
    }

    /// ggml's GELU table (`gelu.wgsl`), uploaded on first use.
    fn gelu_table(&self) -> Result<Arc<RawBuf>, HalError> {
        if let Some(t) = self.gelu_table.get() {
            return Ok(t.clone());
        }
        let vals: Vec<f32> = (0..=u16::MAX)
            .map(flint_core::math::gelu_f16_table_entry)
            .collect();
        let raw = Arc::new(self.ctx.buffer(4 * vals.len() as u64, false)?);
        self.fill_new(&raw, bytes_of(&vals))?;
        Ok(self.gelu_table.get_or_init(|| raw).clone())
    }

    /// The matmul shader in use.
    pub fn matmul_kernel(&self) -> MatmulKernel {
        self.kernel
    }

    /// Whether the device has shaderFloat64, which the shaders that follow the cpu
    /// device's order use for once-rounded multiply-adds and ggml's f64 sums.
    pub fn has_f64(&self) -> bool {
        self.ctx.limits.float64
    }

    /// The physical device in use.
    pub fn adapter(&self) -> &crate::context::Adapter {
        &self.ctx.adapter
    }

    /// Whether storage buffers are host-visible and written directly (else through
    /// staging copies).
    pub fn storage_mapped(&self) -> bool {
        self.ctx.storage_mapped
    }

    /// Submissions and dispatches so far.
    pub fn submissions(&self) -> (u64, u64) {
        let r = self.lock();
        (r.submissions, r.dispatches)
    }

    /// Whether block encoding `ty` has its own shaders (kept as blocks when staged).
    pub fn native(&self, ty: GgmlType) -> bool {
        self.ctx.has_pipeline(&shader_name("matmul", ty))
    }

    fn lock(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn weight<'a>(&self, w: &'a dyn Weight) -> &'a VkWeight {
        w.as_any()
            .downcast_ref::<VkWeight>()
            .expect("a weight staged on another device passed to vk")
    }

    fn kv<'a>(&self, kv: &'a dyn KvBuffer) -> &'a VkKv {
        kv.as_any()
            .downcast_ref::<VkKv>()
            .expect("a KV buffer of another device passed to vk")
    }

    fn buffer<'b>(&self, b: &'b dyn DeviceBuffer) -> &'b VkBuffer {
        b.as_any()
            .downcast_ref::<VkBuffer>()
            .expect("a tensor of another device passed to vk")
    }

    /// A view as a binding and element offset; host memory goes through the arena
    /// (counted as an upload).
    fn input(&self, rec: &mut Recorder, v: View<'_>) -> Result<(Bind, u32), HalError> {
        match v {
            View::Device { buf, offset, .. } => {
                Ok((Bind::Whole(self.buffer(buf).raw.clone()), off32(offset)))
            }
            View::Host(s) => {
                self.transfers.upload(s.len());
                Ok((Bind::Slice(rec.arena(bytes_of(s))?), 0))
            }
        }
    }

    /// A writable view as a binding; host memory goes through the arena, filled with its
    /// values first when `init` (the op reads them) and read back by [`finish`].
    fn output<'v>(
        &self,
        rec: &mut Recorder,
        v: ViewMut<'v>,
        init: bool,
    ) -> Result<Out<'v>, HalError> {
        match v {
            ViewMut::Device { buf, offset, .. } => Ok(Out {
                bind: Bind::Whole(self.buffer(buf).raw.clone()),
                off: off32(offset),
                back: None,
            }),
            ViewMut::Host(s) => {
                let slice = if init {
                    self.transfers.upload(s.len());
                    rec.arena(bytes_of(s))?
                } else {
                    rec.arena_alloc(4 * s.len() as u64)?
                };
                Ok(Out {
                    bind: Bind::Slice(slice.clone()),
                    off: 0,
                    back: Some((slice, s)),
                })
            }
        }
    }

    /// Reads host outputs back (submitting the recorded work first).
    fn finish(&self, rec: &mut Recorder, outs: Vec<Out<'_>>) -> Result<(), HalError> {
        if outs.iter().all(|o| o.back.is_none()) {
            return Ok(());
        }
        rec.flush()?;
        for o in outs {
            if let Some((slice, dst)) = o.back {
                slice.read(bytemuck::cast_slice_mut(dst));
                self.transfers.download(dst.len());
            }
        }
        Ok(())
    }

    /// Per-op index data in the arena, counted as argument bytes.
    fn args(&self, rec: &mut Recorder, bytes: &[u8]) -> Result<Slice, HalError> {
        self.transfers.args(bytes.len());
        rec.arena(bytes)
    }

    /// Rounds the activations `x` (`len` values at element `off` of `b`) as ggml's CPU
    /// backend quantizes them for `w`'s encoding (its `vec_dot_type`: Q8_K, Q8_0/Q8_1,
    /// F16, BF16; shaders/quant_x.wgsl), into scratch memory; F32 weights take `x` as it
    /// is. This keeps the device's logits with llama.cpp's (and the cpu device's) rather
    /// than a quantization step away from them.
    fn round_activations(
        &self,
        rec: &mut Recorder,
        w: &VkWeight,
        (b, off): (Bind, u32),
        len: usize,
    ) -> Result<(Bind, u32), HalError> {
        if let Some((mode, block, words)) = exact_acts(w.ty).filter(|_| self.kernel.exact(w)) {
            let n_blocks = len / block;
            let scratch = rec.scratch(4 * (n_blocks * words) as u64)?;
            let push = [off32(n_blocks), mode, off];
            rec.dispatch(
                "quant_xi",
                &[b, Bind::Whole(scratch.clone())],
                &push,
                n_blocks.div_ceil(64) as u64,
            )?;
            return Ok((Bind::Whole(scratch), 0));
        }
        let (mode, block) = match w.info.source_ty.vec_dot_type() {
            GgmlType::Q8_K => (0, 256),
            GgmlType::Q8_0 | GgmlType::Q8_1 => (1, 32),
            GgmlType::F16 => (2, 1),
            GgmlType::BF16 => (3, 1),
            _ => return Ok((b, off)),
        };
        if !len.is_multiple_of(block) {
            return Ok((b, off));
        }
        let scratch = rec.scratch(4 * len as u64)?;
        let n_blocks = len / block;
        let push = [off32(n_blocks), off32(block), mode, off];
        rec.dispatch(
            "quant_x",
            &[b, Bind::Whole(scratch.clone())],
            &push,
            n_blocks.div_ceil(64) as u64,
        )?;
        Ok((Bind::Whole(scratch), 0))
    }

    fn count(&self, w: &VkWeight) {
        if w.info.kept_quant {
            self.block_dispatches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.float_dispatches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The encoding `ty` is staged as, and whether its blocks are kept.
    fn arrangement(&self, desc: &WeightDesc) -> Result<(GgmlType, bool), HalError> {
        let ty = desc.ty;
        if self.native(ty) && (self.opts.keep_quant || !ty.is_quantized()) {
            return Ok((ty, ty.is_quantized()));
        }
        if GgmlType::DEQUANTIZABLE.contains(&ty) {
            return Ok((GgmlType::F32, false));
        }
        Err(HalError::unsupported(format!(
            "tensor '{}': encoding {ty} can be neither kept on the vk device nor expanded",
            desc.name
        )))
    }

    /// Writes `bytes` into a fresh storage buffer.
    fn fill_new(&self, raw: &Arc<RawBuf>, bytes: &[u8]) -> Result<(), HalError> {
        if raw.is_mapped() {
            raw.write(0, bytes);
            return Ok(());
        }
        let mut rec = self.lock();
        let slice = rec.arena(bytes)?;
        rec.copy(&slice.buf, slice.offset, raw, 0, bytes.len() as u64)?;
        rec.flush()
    }

    fn eltwise(
        &self,
        mode: u32,
        a: (Bind, u32),
        b: (Bind, u32),
        o: (Bind, u32),
        n: usize,
        nb: usize,
        s: f32,
        rec: &mut Recorder,
    ) -> Result<(), HalError> {
        let push = [off32(n), mode, a.1, b.1, o.1, off32(nb), s.to_bits()];
        rec.dispatch("eltwise", &[a.0, b.0, o.0], &push, n.div_ceil(256) as u64)
    }

    fn act_mul(
        &self,
        mode: u32,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && out.len() == gate.len(),
            "vk: activation lengths differ"
        );
        if gate.is_empty() {
            return Ok(());
        }
        let n = gate.len();
        let mut rec = self.lock();
        let a = self.input(&mut rec, gate)?;
        let b = self.input(&mut rec, up)?;
        let o = self.output(&mut rec, out, false)?;
        self.eltwise(mode, a, b, (o.bind.clone(), o.off), n, 1, 0.0, &mut rec)?;
        self.finish(&mut rec, vec![o])
    }
}

/// Where a weight lives: every weight is resident, expert towers in the expert tier.
fn tier_of(desc: &WeightDesc) -> Tier {
    if desc.kind == WeightKind::ExpertTower {
        Tier::ExpertResident
    } else {
        Tier::Resident
    }
}

/// The shader of template `t` for encoding `ty` (`matmul_q4_k`).
fn shader_name(t: &str, ty: GgmlType) -> String {
    format!("{t}_{}", ty.name().to_ascii_lowercase())
}

impl Device for VkDevice {
    fn name(&self) -> &str {
        "vk"
    }

    fn description(&self) -> String {
        let a = &self.ctx.adapter;
        format!(
            "Vulkan {}.{}.{}: {} ({}), {}, {:.1} GiB device memory, {}, {} matmul, {}",
            a.api.0,
            a.api.1,
            a.api.2,
            a.name,
            a.kind,
            a.driver,
            a.memory_bytes as f64 / (1u64 << 30) as f64,
            if self.ctx.storage_mapped {
                "host-visible buffers"
            } else {
                "staging copies"
            },
            self.kernel.label(),
            if self.ctx.limits.float64 {
                "f64 sums"
            } else {
                "f32 sums (no shaderFloat64)"
            }
        )
    }

    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        match op {
            Op::Stage | Op::Matmul | Op::MatmulGlu | Op::ExpertMatmul | Op::GetRows => match ty {
                Some(t) => self.native(t) || GgmlType::DEQUANTIZABLE.contains(&t),
                None => true,
            },
            // Qwen 3.5's Gated DeltaNet and its gates: no shaders yet.
            Op::SsmConvSilu
            | Op::GatedDeltaNet
            | Op::Sigmoid
            | Op::Mul
            | Op::Deinterleave
            | Op::DeltaNetGate
            | Op::L2Norm => false,
            _ => true,
        }
    }

    fn alloc(&self, len: usize) -> Result<Tensor, HalError> {
        let raw = Arc::new(self.ctx.buffer(4 * len as u64, false)?);
        if raw.is_mapped() {
            raw.zero(0, raw.size as usize);
        } else {
            self.lock().fill_zero(&raw, 0, raw.size)?;
        }
        Ok(Tensor::Device(Box::new(VkBuffer { raw, len })))
    }

    fn transfer_counter(&self) -> &TransferCounter {
        &self.transfers
    }

    fn upload(&self, src: &[f32], dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "upload: lengths differ");
        self.transfers.upload(src.len());
        match dst {
            ViewMut::Host(d) => d.copy_from_slice(src),
            ViewMut::Device { buf, offset, .. } => {
                let raw = &self.buffer(buf).raw;
                let mut rec = self.lock();
                if raw.is_mapped() && rec.is_idle() {
                    raw.write(4 * offset, bytes_of(src));
                } else if !src.is_empty() {
                    let s = rec.arena(bytes_of(src))?;
                    rec.copy(
                        &s.buf,
                        s.offset,
                        raw,
                        4 * offset as u64,
                        4 * src.len() as u64,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn download(&self, src: View<'_>, dst: &mut [f32]) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "download: lengths differ");
        self.transfers.download(src.len());
        match src {
            View::Host(s) => dst.copy_from_slice(s),
            View::Device { buf, offset, len } => {
                let raw = &self.buffer(buf).raw;
                let mut rec = self.lock();
                if raw.is_mapped() {
                    rec.flush()?;
                    raw.read(4 * offset, bytemuck::cast_slice_mut(dst));
                } else if len > 0 {
                    let s = rec.arena_alloc(4 * len as u64)?;
                    rec.copy(raw, 4 * offset as u64, &s.buf, s.offset, 4 * len as u64)?;
                    rec.flush()?;
                    s.read(bytemuck::cast_slice_mut(dst));
                }
            }
        }
        Ok(())
    }

    fn copy(&self, src: View<'_>, dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "copy: lengths differ");
        match (src, dst) {
            (View::Host(s), d) => self.upload(s, d),
            (s, ViewMut::Host(d)) => self.download(s, d),
            (
                View::Device {
                    buf: sb,
                    offset: so,
                    len,
                },
                ViewMut::Device {
                    buf: db,
                    offset: dof,
                    ..
                },
            ) => {
                let (s, d) = (&self.buffer(sb).raw, &self.buffer(db).raw);
                self.lock()
                    .copy(s, 4 * so as u64, d, 4 * dof as u64, 4 * len as u64)
            }
        }
    }

    fn plan(&self, weights: &[WeightDesc], _other_bytes: u64) -> Result<StagingPlan, HalError> {
        let mut plan = StagingPlan::default();
        for desc in weights {
            let (ty, kept) = self.arrangement(desc)?;
            let rows = desc.out_features() * desc.experts();
            let bytes = ty.row_bytes(desc.in_features()).unwrap_or(0) * rows;
            plan.weights.push(PlannedWeight {
                name: desc.name.clone(),
                source_ty: desc.ty,
                staged_ty: ty,
                kept_quant: kept,
                tier: tier_of(desc),
                resident_bytes: bytes as u64,
                streamed_bytes: 0,
            });
        }
        Ok(plan)
    }

    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        desc.validate()?;
        let (ty, kept) = self.arrangement(desc)?;
        let (k, n, experts) = (desc.in_features(), desc.out_features(), desc.experts());
        let row_bytes = ty.row_bytes(k).ok_or_else(|| {
            HalError::invalid(format!(
                "tensor '{}': a row of {k} values is not whole {ty} blocks",
                desc.name
            ))
        })?;
        let max = self.ctx.limits.max_range as usize;
        // A chunk holds whole experts of a tower, whole rows otherwise.
        let (unit_bytes, units, unit_rows) = if desc.kind == WeightKind::ExpertTower {
            (row_bytes * n, experts, n)
        } else {
            (row_bytes, n * experts, 1)
        };
        if unit_bytes > max || unit_bytes == 0 && units > 0 {
            return Err(HalError::out_of_memory(format!(
                "tensor '{}': one {} of {unit_bytes} bytes exceeds the device's largest \
                 storage binding ({max} bytes)",
                desc.name,
                if unit_rows > 1 { "expert" } else { "row" }
            )));
        }
        let per_chunk = (max / unit_bytes.max(1)).max(1);
        let src = desc.data.as_slice();
        let src_row = desc.ty.row_bytes(k).unwrap_or(0);
        let mut chunks = Vec::new();
        let mut first = 0;
        while first < units.max(1) {
            let count = per_chunk.min(units - first);
            if count == 0 {
                break;
            }
            let rows = first * unit_rows..(first + count) * unit_rows;
            let raw = Arc::new(self.ctx.buffer((count * unit_bytes) as u64, false)?);
            let part = &src[rows.start * src_row..rows.end * src_row];
            if kept || ty == desc.ty {
                self.fill_new(&raw, part)?;
            } else {
                let vals = flint_core::dequant::dequantize_to_vec(desc.ty, part)
                    .map_err(|e| HalError::invalid(format!("tensor '{}': {e}", desc.name)))?;
                self.fill_new(&raw, bytes_of(&vals))?;
            }
            chunks.push(Chunk {
                buf: raw,
                first,
                count,
            });
            first += count;
        }
        let resident: u64 = chunks.iter().map(|c| c.buf.size).sum();
        Ok(Arc::new(VkWeight {
            info: StagedInfo {
                name: desc.name.clone(),
                source_ty: desc.ty,
                staged_ty: ty,
                dims: desc.dims.clone(),
                kept_quant: kept,
                tier: tier_of(desc),
                resident_bytes: resident,
                streamed_bytes: 0,
            },
            ty,
            k,
            n,
            experts,
            row_bytes,
            chunks,
        }))
    }

    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let w = self.weight(w);
        assert_eq!(x.len(), m * w.k, "matmul: x length");
        assert_eq!(out.len(), m * w.n, "matmul: out length");
        if m == 0 || w.n == 0 {
            return Ok(());
        }
        self.count(w);
        let shader = self.kernel.shader(w);
        let mut rec = self.lock();
        let x_len = x.len();
        let xi = self.input(&mut rec, x)?;
        let (xb, xo) = self.round_activations(&mut rec, w, xi, x_len)?;
        let o = self.output(&mut rec, out, false)?;
        for c in &w.chunks {
            let push = [
                off32(w.k),
                off32(c.count),
                off32(m),
                off32(w.row_bytes),
                xo,
                o.off,
                off32(w.n),
                off32(c.first),
                0,
                0,
                0,
                0,
                0,
            ];
            self.kernel.dispatch(
                &mut rec,
                &shader,
                &[
                    Bind::Whole(c.buf.clone()),
                    xb.clone(),
                    o.bind.clone(),
                    xb.clone(),
                ],
                &push,
                (c.count, m.div_ceil(self.kernel.tile(w))),
            )?;
        }
        self.finish(&mut rec, vec![o])
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let ids = ids.host();
        let w = self.weight(w);
        assert!(
            w.k > 0 && x.len().is_multiple_of(w.k),
            "expert_matmul: x length"
        );
        assert_eq!(out.len(), ids.len() * w.n, "expert_matmul: out length");
        let f = fanout(x.len() / w.k, ids.len(), "expert_matmul");
        if let Some(bad) = ids.iter().find(|&&e| e as usize >= w.experts) {
            return Err(HalError::invalid(format!(
                "expert_matmul: expert {bad} is outside '{}' ({} experts)",
                w.info.name, w.experts
            )));
        }
        if ids.is_empty() || w.n == 0 {
            return Ok(());
        }
        self.count(w);
        let shader = self.kernel.shader(w);
        // The shaders' expert mode reads (input row, expert) pairs: routed row i is
        // W[ids[i]] * x[i / f].
        let pairs: Vec<u32> = ids
            .iter()
            .enumerate()
            .flat_map(|(i, &e)| [off32(i / f), e])
            .collect();
        let mut rec = self.lock();
        let x_len = x.len();
        let xi = self.input(&mut rec, x)?;
        let (xb, xo) = self.round_activations(&mut rec, w, xi, x_len)?;
        let o = self.output(&mut rec, out, false)?;
        let r = self.args(&mut rec, u32s(&pairs))?;
        for c in &w.chunks {
            let push = [
                off32(w.k),
                off32(w.n),
                0,
                off32(w.row_bytes),
                xo,
                o.off,
                off32(w.n),
                0,
                1,
                off32(ids.len()),
                off32(w.row_bytes * w.n),
                off32(c.first),
                off32(c.count),
            ];
            self.kernel.dispatch(
                &mut rec,
                &shader,
                &[
                    Bind::Whole(c.buf.clone()),
                    xb.clone(),
                    o.bind.clone(),
                    Bind::Slice(r.clone()),
                ],
                &push,
                (w.n, ids.len()),
            )?;
        }
        self.finish(&mut rec, vec![o])
    }

    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let ids = ids.host();
        let w = self.weight(w);
        assert_eq!(out.len(), ids.len() * w.k, "get_rows: out length");
        let vocab = w.n * w.experts;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(HalError::invalid(format!(
                "get_rows: id {bad} is outside '{}' ({vocab} rows)",
                w.info.name
            )));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let shader = shader_name("get_rows", w.ty);
        let mut rec = self.lock();
        let o = self.output(&mut rec, out, false)?;
        for c in &w.chunks {
            let pairs: Vec<u32> = ids
                .iter()
                .enumerate()
                .filter(|(_, &id)| (c.first..c.first + c.count).contains(&(id as usize)))
                .flat_map(|(i, &id)| [i as u32, id - c.first as u32])
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let r = self.args(&mut rec, u32s(&pairs))?;
            let push = [
                off32(w.k),
                off32(w.row_bytes),
                off32(pairs.len() / 2),
                o.off,
            ];
            rec.dispatch(
                &shader,
                &[Bind::Whole(c.buf.clone()), o.bind.clone(), Bind::Slice(r)],
                &push,
                (pairs.len() / 2) as u64,
            )?;
        }
        self.finish(&mut rec, vec![o])
    }

    fn rms_norm(
        &self,
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        assert!(
            dim > 0 && x.len().is_multiple_of(dim),
            "rms_norm: x is not whole rows"
        );
        assert_eq!(out.len(), x.len(), "rms_norm: out length");
        if let Some(w) = &weight {
            assert_eq!(w.len(), dim, "rms_norm: weight length");
        }
        if x.is_empty() {
            return Ok(());
        }
        let rows = x.len() / dim;
        let mut rec = self.lock();
        let (xb, xo) = self.input(&mut rec, x)?;
        let (wb, wo, has_w) = match weight {
            Some(w) => {
                let (b, o) = self.input(&mut rec, w)?;
                (b, o, 1)
            }
            None => (xb.clone(), 0, 0),
        };
        let o = self.output(&mut rec, out, false)?;
        let push = [
            off32(dim),
            off32(rows),
            eps.to_bits(),
            0,
            has_w,
            xo,
            0,
            wo,
            o.off,
        ];
        rec.dispatch(
            "norm",
            &[xb.clone(), xb, wb, o.bind.clone()],
            &push,
            rows as u64,
        )?;
        self.finish(&mut rec, vec![o])
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
        assert!(
            dim > 0 && residual.len().is_multiple_of(dim),
            "add_rms_norm: residual is not whole rows"
        );
        assert!(
            delta.len() == residual.len() && out.len() == residual.len(),
            "add_rms_norm: lengths differ"
        );
        assert_eq!(weight.len(), dim, "add_rms_norm: weight length");
        if residual.is_empty() {
            return Ok(());
        }
        let rows = residual.len() / dim;
        let mut rec = self.lock();
        let (db, dof) = self.input(&mut rec, delta)?;
        let (wb, wo) = self.input(&mut rec, weight)?;
        let r = self.output(&mut rec, residual, true)?;
        let o = self.output(&mut rec, out, false)?;
        let push = [
            off32(dim),
            off32(rows),
            eps.to_bits(),
            1,
            1,
            r.off,
            dof,
            wo,
            o.off,
        ];
        rec.dispatch(
            "norm",
            &[r.bind.clone(), db, wb, o.bind.clone()],
            &push,
            rows as u64,
        )?;
        self.finish(&mut rec, vec![r, o])
    }

    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let positions = positions.host();
        p.check()?;
        let row = p.n_heads * p.head_dim;
        assert_eq!(x.len(), positions.len() * row, "rope: x length");
        let half = p.n_rot / 2;
        if positions.is_empty() || half == 0 {
            return Ok(());
        }
        // The angles are computed here, on the host (the cpu device's sines and cosines
        // bit for bit), so factors held in a device buffer are read back (counted).
        let factors: Option<Vec<f32>> = match p.freq_factors {
            Some(View::Device { .. }) => {
                let f = p.freq_factors.expect("matched above");
                let mut h = vec![0f32; f.len()];
                self.download(f, &mut h)?;
                Some(h)
            }
            _ => None,
        };
        let cfg = match &factors {
            Some(f) => RopeParams {
                freq_factors: Some(View::Host(f)),
                ..*p
            }
            .config(),
            None => p.config(),
        };
        let mut pairs = vec![(0.0f32, 0.0f32); half];
        let mut cs = Vec::with_capacity(positions.len() * half * 2);
        for &pos in positions {
            cfg.angles(pos, &mut pairs);
            for &(c, s) in &pairs {
                cs.push(c);
                cs.push(s);
            }
        }
        let mut rec = self.lock();
        let t = self.args(&mut rec, bytes_of(&cs))?;
        let o = self.output(&mut rec, x, true)?;
        let kind = match p.kind {
            RopeKind::Normal => 0,
            RopeKind::Neox => 1,
        };
        let push = [
            off32(positions.len()),
            off32(p.n_heads),
            off32(p.head_dim),
            off32(p.n_rot),
            kind,
            o.off,
        ];
        let threads = positions.len() * p.n_heads * half;
        rec.dispatch(
            "rope",
            &[o.bind.clone(), Bind::Slice(t)],
            &push,
            threads.div_ceil(256) as u64,
        )?;
        self.finish(&mut rec, vec![o])
    }

    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        self.act_mul(3, gate, up, out)
    }

    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && out.len() == gate.len(),
            "vk: activation lengths differ"
        );
        if gate.is_empty() {
            return Ok(());
        }
        let table = self.gelu_table()?;
        let n = gate.len();
        let mut rec = self.lock();
        let a = self.input(&mut rec, gate)?;
        let b = self.input(&mut rec, up)?;
        let o = self.output(&mut rec, out, false)?;
        let push = [off32(n), a.1, b.1, o.off];
        rec.dispatch(
            "gelu",
            &[a.0, b.0, o.bind.clone(), Bind::Whole(table)],
            &push,
            n.div_ceil(256) as u64,
        )?;
        self.finish(&mut rec, vec![o])
    }

    fn swiglu_oai_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.act_mul(5, gate, up, out)
    }

    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        assert_eq!(acc.len(), x.len(), "add: lengths differ");
        if x.is_empty() {
            return Ok(());
        }
        let n = x.len();
        let mut rec = self.lock();
        let b = self.input(&mut rec, x)?;
        let a = self.output(&mut rec, acc, true)?;
        let ab = (a.bind.clone(), a.off);
        self.eltwise(0, ab.clone(), b, ab, n, 1, 0.0, &mut rec)?;
        self.finish(&mut rec, vec![a])
    }

    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        bias_rows(x.len(), bias.len())?;
        let (n, nb) = (x.len(), bias.len());
        let mut rec = self.lock();
        let b = self.input(&mut rec, bias)?;
        let a = self.output(&mut rec, x, true)?;
        let ab = (a.bind.clone(), a.off);
        self.eltwise(1, ab.clone(), b, ab, n, nb, 0.0, &mut rec)?;
        self.finish(&mut rec, vec![a])
    }

    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        if x.is_empty() {
            return Ok(());
        }
        let n = x.len();
        let mut rec = self.lock();
        let a = self.output(&mut rec, x, true)?;
        let ab = (a.bind.clone(), a.off);
        self.eltwise(2, ab.clone(), ab.clone(), ab, n, 1, s, &mut rec)?;
        self.finish(&mut rec, vec![a])
    }

    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        let ids = ids.host();
        let rows = math::add_id_rows(x.len(), table.len(), ids.len(), dim);
        if dim == 0 {
            return Ok(());
        }
        if let Some(bad) = ids.iter().find(|&&e| e as usize >= rows) {
            return Err(HalError::invalid(format!(
                "add_id: id {bad} is outside the table ({rows} rows of {dim})"
            )));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let n = x.len();
        let mut rec = self.lock();
        let (tb, to) = self.input(&mut rec, table)?;
        let r = self.args(&mut rec, u32s(ids))?;
        let a = self.output(&mut rec, x, true)?;
        let push = [off32(n), off32(dim), a.off, to];
        rec.dispatch(
            "add_id",
            &[a.bind.clone(), tb, Bind::Slice(r)],
            &push,
            n.div_ceil(256) as u64,
        )?;
        self.finish(&mut rec, vec![a])
    }

    fn scatter_add_weighted(
        &self,
        acc: ViewMut<'_>,
        x: View<'_>,
        weights: View<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        assert!(
            dim > 0 && acc.len().is_multiple_of(dim),
            "scatter_add_weighted: acc is not whole rows of {dim}"
        );
        assert_eq!(
            x.len(),
            weights.len() * dim,
            "scatter_add_weighted: x is not a row per weight"
        );
        let n = weights.len();
        let f = fanout(acc.len() / dim, n, "scatter_add_weighted");
        if n == 0 {
            return Ok(());
        }
        let mut rec = self.lock();
        let (xb, xo) = self.input(&mut rec, x)?;
        let (wb, wo) = self.input(&mut rec, weights)?;
        let a = self.output(&mut rec, acc, true)?;
        let push = [off32(n), off32(dim), a.off, xo, wo, off32(f)];
        rec.dispatch(
            "scatter",
            &[a.bind.clone(), xb, wb],
            &push,
            dim.div_ceil(256) as u64,
        )?;
        self.finish(&mut rec, vec![a])
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
        let ids = ids.host();
        assert!(
            n_experts > 0 && logits.len().is_multiple_of(n_experts),
            "route_topk: logits length"
        );
        let (rows, k) = (logits.len() / n_experts, cfg.k);
        assert!(
            ids.len() == rows * k && weights.len() == rows * k,
            "route_topk: output lengths"
        );
        math::check_route(n_experts, k, bias.as_ref().map(View::len))
            .map_err(|e| HalError::invalid(format!("vk: route_topk: {e}")))?;
        if let Some(s) = &expert_scale {
            if s.len() != n_experts {
                return Err(HalError::invalid(format!(
                    "vk: route_topk: expert scale of {} values for {n_experts} experts",
                    s.len()
                )));
            }
        }
        if rows == 0 {
            return Ok(());
        }
        // Routed on the device (shaders/route.wgsl): the weights stay where `weights` is,
        // the ids come back to the host, where the expert ops build their kernels'
        // arguments from them.
        let gating = match cfg.gating {
            math::Gating::Sigmoid => 0,
            math::Gating::Softmax => 1,
            math::Gating::SoftmaxWeight => 2,
        };
        let mut rec = self.lock();
        let l = self.input(&mut rec, logits)?;
        let b = match bias {
            Some(b) => Some(self.input(&mut rec, b)?),
            None => None,
        };
        let es = match expert_scale {
            Some(s) => Some(self.input(&mut rec, s)?),
            None => None,
        };
        let id_out = rec.arena_alloc(4 * (rows * k) as u64)?;
        let w = self.output(&mut rec, weights, false)?;
        let push = [
            off32(rows),
            off32(n_experts),
            off32(k),
            gating,
            u32::from(cfg.normalize),
            cfg.scale.to_bits(),
            u32::from(b.is_some()),
            l.1,
            b.as_ref().map_or(0, |b| b.1),
            u32::from(es.is_some()),
            es.as_ref().map_or(0, |s| s.1),
            w.off,
        ];
        let bias_bind = b.map_or_else(|| l.0.clone(), |b| b.0);
        let es_bind = es.map_or_else(|| l.0.clone(), |s| s.0);
        rec.dispatch(
            "route",
            &[
                l.0,
                bias_bind,
                es_bind,
                Bind::Slice(id_out.clone()),
                w.bind.clone(),
            ],
            &push,
            rows.div_ceil(64) as u64,
        )?;
        rec.flush()?;
        id_out.read(bytemuck::cast_slice_mut(ids));
        self.transfers.download(ids.len());
        self.finish(&mut rec, vec![w])
    }

    fn max_buffer_bytes(&self) -> Option<u64> {
        Some(self.ctx.limits.max_range)
    }

    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError> {
        let slots = layout.num_slots() * layout.n_kv_heads;
        let k = Arc::new(
            self.ctx
                .buffer((4 * slots * layout.head_dim_k) as u64, false)?,
        );
        let v = Arc::new(
            self.ctx
                .buffer((4 * slots * layout.head_dim_v) as u64, false)?,
        );
        for b in [&k, &v] {
            if b.is_mapped() {
                b.zero(0, b.size as usize);
            } else {
                self.lock().fill_zero(b, 0, b.size)?;
            }
        }
        Ok(Box::new(VkKv {
            layout: *layout,
            k,
            v,
        }))
    }

    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError> {
        let slots = slots.host();
        let kv = self.kv(kv);
        let l = kv.layout;
        let (row_k, row_v) = (l.n_kv_heads * l.head_dim_k, l.n_kv_heads * l.head_dim_v);
        assert_eq!(k.len(), slots.len() * row_k, "write_kv: k length");
        assert_eq!(v.len(), slots.len() * row_v, "write_kv: v length");
        assert!(
            slots.iter().all(|&s| (s as usize) < l.num_slots()),
            "write_kv: slot out of range"
        );
        if slots.is_empty() {
            return Ok(());
        }
        let mut rec = self.lock();
        let (kb, ko) = self.input(&mut rec, k)?;
        let (vb, vo) = self.input(&mut rec, v)?;
        let s = self.args(&mut rec, u32s(slots))?;
        let push = [off32(slots.len()), off32(row_k), off32(row_v), ko, vo];
        let threads = slots.len() * row_k.max(row_v);
        rec.dispatch(
            "write_kv",
            &[
                kb,
                vb,
                Bind::Whole(kv.k.clone()),
                Bind::Whole(kv.v.clone()),
                Bind::Slice(s),
            ],
            &push,
            threads.div_ceil(256) as u64,
        )
    }

    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let kv = self.kv(kv);
        let l = kv.layout;
        assert!(
            l.n_kv_heads > 0 && p.n_heads.is_multiple_of(l.n_kv_heads),
            "paged_attention: heads"
        );
        let q_stride = p.n_heads * l.head_dim_k;
        let o_stride = p.n_heads * l.head_dim_v;
        assert!(
            q_stride > 0 && p.q.len().is_multiple_of(q_stride),
            "paged_attention: q"
        );
        let n_rows = p.q.len() / q_stride;
        assert_eq!(out.len(), n_rows * o_stride, "paged_attention: out length");
        if l.head_dim_k > MAX_HEAD_DIM || l.head_dim_v > MAX_HEAD_DIM {
            return Err(HalError::unsupported(format!(
                "vk: paged_attention with heads of {}/{} values (at most {MAX_HEAD_DIM})",
                l.head_dim_k, l.head_dim_v
            )));
        }
        if let Some(s) = p.sinks {
            assert_eq!(s.len(), p.n_heads, "paged_attention: sinks");
        }
        // Entries (query row, position, block-table offset), then the block tables.
        let n_entries: usize = p.seqs.iter().map(|s| s.positions.len()).sum();
        if n_entries == 0 {
            return Ok(());
        }
        let mut a: Vec<u32> = Vec::with_capacity(3 * n_entries);
        let mut tables: Vec<u32> = Vec::new();
        let base = 3 * n_entries;
        for s in p.seqs {
            let bt = off32(base + tables.len());
            tables.extend_from_slice(s.block_table.host());
            for (i, &pos) in s.positions.host().iter().enumerate() {
                assert!(s.q_start + i < n_rows, "paged_attention: query row");
                let need = pos as usize / l.block_size;
                assert!(need < s.block_table.len(), "paged_attention: block table");
                a.extend_from_slice(&[off32(s.q_start + i), pos, bt]);
            }
        }
        a.extend_from_slice(&tables);
        let mut rec = self.lock();
        let (qb, qo) = self.input(&mut rec, p.q)?;
        let args = self.args(&mut rec, u32s(&a))?;
        let sinks = match p.sinks {
            Some(s) => self.input(&mut rec, s)?,
            None => (Bind::Slice(self.args(&mut rec, &[0u8; 4])?), 0),
        };
        let (sinks, sinks_off) = sinks;
        let o = self.output(&mut rec, out, true)?;
        let push = [
            off32(p.n_heads),
            off32(l.n_kv_heads),
            off32(l.head_dim_k),
            off32(l.head_dim_v),
            off32(l.block_size),
            p.scale.to_bits(),
            off32(p.window.unwrap_or(0)),
            u32::from(p.sinks.is_some()),
            qo,
            o.off,
            off32(n_entries),
            off32(q_stride),
            off32(o_stride),
            sinks_off,
        ];
        rec.dispatch(
            "attention",
            &[
                qb,
                Bind::Whole(kv.k.clone()),
                Bind::Whole(kv.v.clone()),
                o.bind.clone(),
                Bind::Slice(args),
                sinks,
            ],
            &push,
            (n_entries * p.n_heads) as u64,
        )?;
        self.finish(&mut rec, vec![o])
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            block_dispatches: self.block_dispatches.load(Ordering::Relaxed),
            float_dispatches: self.float_dispatches.load(Ordering::Relaxed),
        }
    }
}
