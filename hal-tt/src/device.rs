//! [`TtDevice`]: the `flint_hal::Device` implementation over the runtime adapter.

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use flint_core::GgmlType;
use flint_hal::{
    DeltaNetShape, Device, DeviceBuffer, DeviceCounters, DeviceOptions, HalError, IndexTensor,
    IndexView, IndexViewMut, KvBuffer, KvLayout, Op, PagedAttention, RopeKind, RopeParams,
    RoutingConfig, StagedInfo, StagingPlan, Tensor, Tier, TransferCounter, View, ViewMut, Weight,
    WeightDesc, WeightHandle, WeightKind, WeightSource, Yarn,
};

use crate::ffi::{self, CAttnSeq, CCounters, CKvLayout, CWeightDesc, DevPtr, Runtime};
use crate::staging;

/// The opened device and the runtime it came from; closed when the last user drops it
/// (the device itself, its weights and KV buffers each hold one).
#[derive(Debug)]
struct Inner {
    rt: Arc<Runtime>,
    dev: DevPtr,
    name: String,
    dram_bytes: u64,
    cores: u32,
    /// Encodings the device admits as kept blocks, asked once at open.
    admitted: Vec<GgmlType>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.rt.close_device(self.dev);
    }
}

impl Inner {
    fn check(&self, st: i32, what: &str) -> Result<(), HalError> {
        self.rt.check(st, what)
    }

    fn admits(&self, ty: GgmlType) -> bool {
        self.admitted.contains(&ty)
    }

    fn alloc(&self, bytes: usize) -> Result<DevBuf<'_>, HalError> {
        let mut h = 0u64;
        // SAFETY: the device is open; `h` is a valid output.
        let st = unsafe { (self.rt.api().buffer_alloc)(self.dev.0, bytes as u64, &mut h) };
        self.check(st, &format!("allocating a buffer of {bytes} bytes"))?;
        Ok(DevBuf { inner: self, h })
    }

    fn alloc_f32(&self, n: usize) -> Result<DevBuf<'_>, HalError> {
        self.alloc(n * 4)
    }

    fn upload(&self, data: &[f32]) -> Result<DevBuf<'_>, HalError> {
        let b = self.alloc_f32(data.len())?;
        b.write(data)?;
        Ok(b)
    }

    /// Writes `data` into buffer `h` from value `offset`.
    fn write_at(&self, h: u64, offset: usize, data: &[f32]) -> Result<(), HalError> {
        self.write_bytes(h, offset, bytemuck::cast_slice(data))
    }

    /// Writes `bytes` (4-byte values: f32 or u32) into buffer `h` from value `offset`.
    fn write_bytes(&self, h: u64, offset: usize, bytes: &[u8]) -> Result<(), HalError> {
        // SAFETY: `bytes` is readable for its length; the buffer belongs to this device.
        let st = unsafe {
            (self.rt.api().buffer_write)(
                self.dev.0,
                h,
                4 * offset as u64,
                bytes.as_ptr(),
                bytes.len() as u64,
            )
        };
        self.check(st, "writing a buffer")
    }

    /// Reads `out.len()` values of buffer `h` from value `offset`.
    fn read_at(&self, h: u64, offset: usize, out: &mut [f32]) -> Result<(), HalError> {
        self.read_bytes(h, offset, bytemuck::cast_slice_mut(out))
    }

    /// Reads `bytes.len()` bytes (4-byte values: f32 or u32) of buffer `h` from value
    /// `offset`.
    fn read_bytes(&self, h: u64, offset: usize, bytes: &mut [u8]) -> Result<(), HalError> {
        // SAFETY: `bytes` is writable for its length; the buffer belongs to this device.
        let st = unsafe {
            (self.rt.api().buffer_read)(
                self.dev.0,
                h,
                4 * offset as u64,
                bytes.as_mut_ptr(),
                bytes.len() as u64,
            )
        };
        self.check(st, "reading a buffer")
    }

    /// Copies `len` values on the device: buffer `src` from value `src_off` to buffer
    /// `dst` from value `dst_off` (ranges that do not overlap).
    fn copy(
        &self,
        src: u64,
        src_off: usize,
        dst: u64,
        dst_off: usize,
        len: usize,
    ) -> Result<(), HalError> {
        // SAFETY: the device is open; both handles belong to it; the adapter checks the
        // ranges.
        let st = unsafe {
            (self.rt.api().buffer_copy)(
                self.dev.0,
                src,
                4 * src_off as u64,
                dst,
                4 * dst_off as u64,
                4 * len as u64,
            )
        };
        self.check(st, "copying between buffers on the device")
    }

    fn counters(&self) -> Result<CCounters, HalError> {
        let mut c = CCounters::default();
        // SAFETY: the device is open; `c` is a valid output.
        let st = unsafe { (self.rt.api().counters_get)(self.dev.0, &mut c) };
        self.check(st, "reading counters")?;
        Ok(c)
    }
}

/// A device buffer freed on drop.
struct DevBuf<'a> {
    inner: &'a Inner,
    h: u64,
}

impl DevBuf<'_> {
    fn write(&self, data: &[f32]) -> Result<(), HalError> {
        self.inner.write_at(self.h, 0, data)
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle was allocated on this device and is freed once, here.
        unsafe { (self.inner.rt.api().buffer_free)(self.inner.dev.0, self.h) };
    }
}

/// A tensor in the device's DRAM ([`Device::alloc`]): `len` f32 values behind an adapter
/// buffer handle, freed on drop. It holds the device open until then.
#[derive(Debug)]
pub struct TtBuffer {
    inner: Arc<Inner>,
    h: u64,
    len: usize,
}

impl TtBuffer {
    /// The adapter's buffer handle.
    pub fn handle(&self) -> u64 {
        self.h
    }
}

impl Drop for TtBuffer {
    fn drop(&mut self) {
        // SAFETY: the handle was allocated on this device and is freed once, here.
        unsafe { (self.inner.rt.api().buffer_free)(self.inner.dev.0, self.h) };
    }
}

impl DeviceBuffer for TtBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What the host keeps alive for a streamed weight: the adapter reads it on every use.
#[derive(Debug)]
enum HostCopy {
    /// Nothing (resident weights).
    None,
    /// The file's bytes (kept blocks stream from the mapping itself).
    Source(#[allow(dead_code)] WeightSource),
    /// The float expansion, one vector per expert.
    Expanded(#[allow(dead_code)] Vec<Vec<u8>>),
}

/// A weight staged on a [`TtDevice`]: one adapter weight per expert (one for a matrix).
#[derive(Debug)]
pub struct TtWeight {
    inner: Arc<Inner>,
    info: StagedInfo,
    handles: Vec<u64>,
    in_f: usize,
    out_f: usize,
    // Declared after `handles` is irrelevant: `Drop` frees the handles before the fields
    // (and so this host copy) are dropped.
    _host: HostCopy,
}

impl Drop for TtWeight {
    fn drop(&mut self) {
        for &h in &self.handles {
            // SAFETY: `h` was staged on this device and is freed once, here, before the
            // host copy it may read from is dropped.
            unsafe { (self.inner.rt.api().weight_free)(self.inner.dev.0, h) };
        }
    }
}

impl Weight for TtWeight {
    fn info(&self) -> &StagedInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One layer's KV cache on a [`TtDevice`]: a K and a V buffer.
#[derive(Debug)]
pub struct TtKv {
    inner: Arc<Inner>,
    layout: KvLayout,
    k: u64,
    v: u64,
}

impl Drop for TtKv {
    fn drop(&mut self) {
        for h in [self.k, self.v] {
            // SAFETY: allocated on this device, freed once here.
            unsafe { (self.inner.rt.api().buffer_free)(self.inner.dev.0, h) };
        }
    }
}

impl KvBuffer for TtKv {
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

/// Counters of the adapter, beyond the HAL's [`DeviceCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TtCounters {
    /// Matmuls computed from kept block encodings.
    pub block_dispatches: u64,
    /// Matmuls computed from BF16 weights.
    pub float_dispatches: u64,
    /// Weight bytes read from host memory for streamed weights, summed over uses.
    pub streamed_bytes: u64,
    /// Device DRAM in use now.
    pub dram_used_bytes: u64,
    /// `flint_tt_buffer_write` calls (host to device), as the adapter counts them.
    pub host_writes: u64,
    /// Bytes they moved.
    pub host_write_bytes: u64,
    /// `flint_tt_buffer_read` calls (device to host), as the adapter counts them.
    pub host_reads: u64,
    /// Bytes they moved.
    pub host_read_bytes: u64,
    /// `flint_tt_buffer_copy` calls (on the device).
    pub device_copies: u64,
    /// Bytes they copied.
    pub device_copy_bytes: u64,
}

/// The Tenstorrent device, through the runtime adapter.
#[derive(Debug)]
pub struct TtDevice {
    inner: Arc<Inner>,
    opts: DeviceOptions,
    /// What non-kept weights are expanded to (`FLINT_TT_EXPAND`); `None`: each arm's
    /// rule ([`staging::arrangement`]).
    expand_to: Option<GgmlType>,
    /// Tiers decided by the last [`Device::plan`], by tensor name; `stage` follows them.
    planned: Mutex<HashMap<String, Tier>>,
    /// Host-device traffic (`Device::transfers`).
    xfer: TransferCounter,
}

impl TtDevice {
    /// Loads the adapter ([`Runtime::load_from_env`]) and opens device 0.
    pub fn open(opts: &DeviceOptions) -> Result<TtDevice, HalError> {
        Self::open_runtime(Runtime::load_from_env()?, opts)
    }

    /// Loads the adapter at `path` and opens device 0.
    pub fn open_path(path: &Path, opts: &DeviceOptions) -> Result<TtDevice, HalError> {
        Self::open_runtime(Runtime::load(path)?, opts)
    }

    fn open_runtime(rt: Runtime, opts: &DeviceOptions) -> Result<TtDevice, HalError> {
        let (dev, info) = rt.open_device(0)?;
        let admitted = GgmlType::ALL
            .iter()
            .copied()
            .filter(|t| {
                // SAFETY: the device is open; the call only answers a question.
                unsafe { (rt.api().admits_kept)(dev.0, t.id()) == 1 }
            })
            .collect();
        let inner = Inner {
            name: ffi::name_of(&info),
            dram_bytes: info.dram_bytes,
            cores: info.compute_cores,
            rt: Arc::new(rt),
            dev,
            admitted,
        };
        Ok(TtDevice {
            inner: Arc::new(inner),
            opts: opts.clone(),
            expand_to: staging::expansion_from_env()?,
            planned: Mutex::new(HashMap::new()),
            xfer: TransferCounter::default(),
        })
    }

    /// The adapter library in use.
    pub fn runtime_path(&self) -> &Path {
        self.inner.rt.path()
    }

    /// DRAM the device reports.
    pub fn dram_bytes(&self) -> u64 {
        self.inner.dram_bytes
    }

    /// Whether the device admits `ty` as kept blocks.
    pub fn admits_kept(&self, ty: GgmlType) -> bool {
        self.inner.admits(ty)
    }

    /// The float encoding weights that are not kept are expanded to, when one was set;
    /// `None`: each arm's rule ([`staging::arrangement`]).
    pub fn expansion(&self) -> Option<GgmlType> {
        self.expand_to
    }

    /// Sets the float encoding weights that are not kept are expanded to (BF16, F16 or
    /// F32) for weights planned or staged from now on; the default comes from
    /// `FLINT_TT_EXPAND`.
    pub fn set_expansion(&mut self, ty: GgmlType) -> Result<(), HalError> {
        if !staging::EXPANSION_TYPES.contains(&ty) {
            return Err(HalError::invalid(format!(
                "{ty} is not an expansion target (BF16, F16 or F32)"
            )));
        }
        self.expand_to = Some(ty);
        Ok(())
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DeviceOptions {
        &self.opts
    }

    /// All counters of the adapter.
    pub fn tt_counters(&self) -> Result<TtCounters, HalError> {
        let c = self.inner.counters()?;
        Ok(TtCounters {
            block_dispatches: c.block_dispatches,
            float_dispatches: c.float_dispatches,
            streamed_bytes: c.streamed_bytes,
            dram_used_bytes: c.dram_used_bytes,
            host_writes: c.host_writes,
            host_write_bytes: c.host_write_bytes,
            host_reads: c.host_reads,
            host_read_bytes: c.host_read_bytes,
            device_copies: c.device_copies,
            device_copy_bytes: c.device_copy_bytes,
        })
    }

    /// Waits for every queued operation.
    pub fn sync(&self) -> Result<(), HalError> {
        // SAFETY: the device is open.
        let st = unsafe { (self.inner.rt.api().sync)(self.inner.dev.0) };
        self.inner.check(st, "sync")
    }

    fn weight<'a>(&self, w: &'a dyn Weight) -> &'a TtWeight {
        match w.as_any().downcast_ref::<TtWeight>() {
            Some(t) if Arc::ptr_eq(&t.inner, &self.inner) => t,
            _ => panic!(
                "weight '{}' was not staged on this tt device",
                w.info().name
            ),
        }
    }

    fn kv<'a>(&self, kv: &'a dyn KvBuffer) -> &'a TtKv {
        match kv.as_any().downcast_ref::<TtKv>() {
            Some(t) if Arc::ptr_eq(&t.inner, &self.inner) => t,
            _ => panic!("KV buffer was not allocated on this tt device"),
        }
    }

    fn arrangement(&self, desc: &WeightDesc) -> Result<staging::Arrangement, HalError> {
        staging::arrangement(
            &desc.name,
            desc.ty,
            desc.data.len() as u64,
            self.opts.keep_quant,
            self.expand_to,
            |t| self.inner.admits(t),
        )
    }

    /// The tier for a weight about to be staged: the plan's when there is one, else
    /// resident while it fits the budget (less the reserve), else streamed.
    fn tier_for(&self, desc: &WeightDesc, bytes: u64) -> Result<Tier, HalError> {
        let planned = match self.planned.lock() {
            Ok(m) => m.get(&desc.name).copied(),
            Err(p) => p.into_inner().get(&desc.name).copied(),
        };
        if let Some(t) = planned {
            return Ok(t);
        }
        let used = self.inner.counters()?.dram_used_bytes;
        let dram = self.inner.dram_bytes;
        let budget = dram - dram / staging::RESERVE_DIVISOR;
        Ok(if used.saturating_add(bytes) <= budget {
            if desc.kind == WeightKind::ExpertTower {
                Tier::ExpertResident
            } else {
                Tier::Resident
            }
        } else {
            Tier::Streamed
        })
    }

    fn stage_one(
        &self,
        ty: GgmlType,
        source_ty: GgmlType,
        streamed: bool,
        in_f: usize,
        out_f: usize,
        data: &[u8],
        name: &str,
    ) -> Result<u64, HalError> {
        let d = CWeightDesc {
            ggml_type: ty.id(),
            residency: if streamed {
                ffi::STREAMED
            } else {
                ffi::RESIDENT
            },
            in_features: in_f as u64,
            out_features: out_f as u64,
            data: data.as_ptr(),
            len: data.len() as u64,
            source_type: source_ty.id(),
            reserved: 0,
        };
        let mut h = 0u64;
        // SAFETY: `d.data` points at `d.len` readable bytes. For a streamed weight the
        // caller keeps those bytes alive and unchanged in the `TtWeight` (`HostCopy`)
        // until the handle is freed in its `Drop`, as the ABI requires.
        let st = unsafe { (self.inner.rt.api().weight_stage)(self.inner.dev.0, &d, &mut h) };
        self.inner.check(st, &format!("staging tensor '{name}'"))?;
        Ok(h)
    }
}

fn kv_layout(l: &KvLayout) -> CKvLayout {
    CKvLayout {
        num_blocks: l.num_blocks as u64,
        block_size: l.block_size as u64,
        n_kv_heads: l.n_kv_heads as u64,
        head_dim_k: l.head_dim_k as u64,
        head_dim_v: l.head_dim_v as u64,
    }
}

impl Device for TtDevice {
    fn name(&self) -> &str {
        "tt"
    }

    fn description(&self) -> String {
        format!(
            "{}, {:.1} GiB DRAM, {} cores, keep-quant {}, expands to {}, runtime {}",
            self.inner.name,
            self.inner.dram_bytes as f64 / (1u64 << 30) as f64,
            self.inner.cores,
            if self.opts.keep_quant { "on" } else { "off" },
            match (self.expand_to, self.opts.keep_quant) {
                (Some(t), _) => t.name(),
                (None, true) => "F32 (lossless)",
                (None, false) => "BF16",
            },
            self.inner.rt.path().display()
        )
    }

    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        // The ABI has no entry point for gpt-oss's activation and expert biases (Gated
        // DeltaNet's ops have theirs since ABI 6).
        if matches!(op, Op::SwigluOaiMul | Op::AddId) {
            return false;
        }
        if !op.takes_weight() {
            return true;
        }
        match ty {
            None => true,
            Some(t) => {
                (self.opts.keep_quant && t.is_quantized() && self.inner.admits(t))
                    || staging::expandable(t)
            }
        }
    }

    fn plan(&self, weights: &[WeightDesc], other_bytes: u64) -> Result<StagingPlan, HalError> {
        let plan = staging::plan(
            weights,
            self.inner.dram_bytes,
            other_bytes,
            self.opts.keep_quant,
            self.expand_to,
            |t| self.inner.admits(t),
        )?;
        let mut m = match self.planned.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.clear();
        m.extend(plan.weights.iter().map(|w| (w.name.clone(), w.tier)));
        Ok(plan)
    }

    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        desc.validate()?;
        let geo = staging::geometry(desc)?;
        let (in_f, out_f, experts) = geo;
        let arr = self.arrangement(desc)?;
        let bytes = staging::staged_bytes(desc, arr)?;
        let tier = self.tier_for(desc, bytes)?;
        let streamed = tier == Tier::Streamed;
        let src = desc.data.as_slice();

        // Declared before `w`: on a failure part-way, `w` frees the staged handles before
        // the expansions a streamed handle could read are dropped.
        let mut expanded: Vec<Vec<u8>> = Vec::new();
        // Build the weight as handles are staged, so a failure part-way frees them.
        let mut w = TtWeight {
            inner: self.inner.clone(),
            info: StagedInfo {
                name: desc.name.clone(),
                source_ty: desc.ty,
                staged_ty: arr.staged_ty,
                dims: desc.dims.clone(),
                kept_quant: arr.kept,
                tier,
                resident_bytes: if streamed { 0 } else { bytes },
                streamed_bytes: if streamed { bytes } else { 0 },
            },
            handles: Vec::with_capacity(experts),
            in_f,
            out_f,
            _host: HostCopy::None,
        };
        for e in 0..experts {
            // Every slice's geometry is checked, a plain matrix being a tower of one.
            let slice = staging::expert_slice(&desc.name, desc.ty, geo, src, e)?;
            let h = if arr.kept {
                self.stage_one(desc.ty, desc.ty, streamed, in_f, out_f, slice, &desc.name)?
            } else {
                let v = staging::expand(&desc.name, desc.ty, in_f, slice, arr.staged_ty)?;
                let h = self.stage_one(
                    arr.staged_ty,
                    desc.ty,
                    streamed,
                    in_f,
                    out_f,
                    &v,
                    &desc.name,
                );
                if streamed {
                    // The adapter reads this vector on every use: keep it (its heap
                    // allocation does not move when the outer vector grows).
                    expanded.push(v);
                }
                h?
            };
            w.handles.push(h);
        }
        if streamed {
            w._host = if arr.kept {
                HostCopy::Source(desc.data.clone())
            } else {
                HostCopy::Expanded(expanded)
            };
        }
        Ok(Arc::new(w))
    }

    fn alloc(&self, len: usize) -> Result<Tensor, HalError> {
        Ok(Tensor::Device(self.keep(self.inner.alloc_f32(len)?, len)))
    }

    fn transfer_counter(&self) -> &TransferCounter {
        &self.xfer
    }

    /// The step's index lists in one adapter buffer of `u32` values (ABI 5): one
    /// upload, then every op names its lists by buffer and offset.
    fn upload_indices(&self, src: Vec<u32>) -> Result<IndexTensor, HalError> {
        self.xfer.upload(src.len());
        let b = self.inner.alloc(4 * src.len().max(1))?;
        self.inner.write_bytes(b.h, 0, bytemuck::cast_slice(&src))?;
        Ok(IndexTensor::Device(self.keep(b, src.len())))
    }

    /// An adapter buffer of `len` zero indices (the adapter zeroes new buffers), for
    /// [`route_topk`](Device::route_topk) to write the experts it chooses into.
    fn alloc_indices(&self, len: usize) -> Result<IndexTensor, HalError> {
        let b = self.inner.alloc(4 * len.max(1))?;
        Ok(IndexTensor::Device(self.keep(b, len)))
    }

    fn download_indices(&self, src: IndexView<'_>, dst: &mut [u32]) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "download_indices: lengths differ");
        self.xfer.download(src.len());
        match src {
            IndexView::Host(s) => dst.copy_from_slice(s),
            IndexView::Device { buf, offset, .. } => {
                let t = self.buffer(buf);
                self.inner
                    .read_bytes(t.h, offset, bytemuck::cast_slice_mut(dst))?;
            }
        }
        Ok(())
    }

    fn upload(&self, src: &[f32], dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "upload: lengths differ");
        self.xfer.upload(src.len());
        match dst {
            ViewMut::Host(d) => d.copy_from_slice(src),
            ViewMut::Device { buf, offset, .. } => {
                let t = self.buffer(buf);
                self.inner.write_at(t.h, offset, src)?;
            }
        }
        Ok(())
    }

    fn download(&self, src: View<'_>, dst: &mut [f32]) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "download: lengths differ");
        self.xfer.download(src.len());
        match src {
            View::Host(s) => dst.copy_from_slice(s),
            View::Device { buf, offset, .. } => {
                let t = self.buffer(buf);
                self.inner.read_at(t.h, offset, dst)?;
            }
        }
        Ok(())
    }

    fn copy(&self, src: View<'_>, dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "copy: lengths differ");
        match (src, dst) {
            (View::Host(s), ViewMut::Host(d)) => d.copy_from_slice(s),
            (View::Host(s), d @ ViewMut::Device { .. }) => self.upload(s, d)?,
            (s @ View::Device { .. }, ViewMut::Host(d)) => self.download(s, d)?,
            (
                View::Device {
                    buf: sb,
                    offset: so,
                    len,
                },
                ViewMut::Device {
                    buf: db,
                    offset: doff,
                    ..
                },
            ) => {
                let (s, d) = (self.buffer(sb), self.buffer(db));
                if len == 0 || (s.h == d.h && so == doff) {
                    return Ok(());
                }
                if s.h == d.h && so < doff + len && doff < so + len {
                    // Overlapping ranges of one buffer: through a scratch buffer (the ABI
                    // refuses overlapping copies).
                    let tmp = self.inner.alloc_f32(len)?;
                    self.inner.copy(s.h, so, tmp.h, 0, len)?;
                    self.inner.copy(tmp.h, 0, d.h, doff, len)?;
                } else {
                    self.inner.copy(s.h, so, d.h, doff, len)?;
                }
            }
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let w = self.weight(w);
        assert_eq!(
            w.handles.len(),
            1,
            "matmul on expert tower '{}'",
            w.info.name
        );
        assert_eq!(x.len(), m * w.in_f, "matmul: x is not m * in");
        assert_eq!(out.len(), m * w.out_f, "matmul: out is not m * out");
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let o = self.output(out, false, &[xa.h()])?;
        // SAFETY: device open; all handles belong to it.
        let st = unsafe {
            (inner.rt.api().matmul)(inner.dev.0, w.handles[0], xa.h(), m as u64, o.arg.h())
        };
        inner.check(st, &format!("matmul with '{}'", w.info.name))?;
        self.finish(o)
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.expert_matmul_multi(&[w], x, ids, &mut [out])
    }

    /// The ids and `x` are handed to the adapter once (a host list or a view at an
    /// offset would otherwise move or be copied per tower), then one
    /// `flint_tt_expert_matmul` per tower.
    fn expert_matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        ids: IndexView<'_>,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        assert_eq!(
            ws.len(),
            outs.len(),
            "expert_matmul_multi: one output per weight"
        );
        let ws: Vec<&TtWeight> = ws.iter().map(|&w| self.weight(w)).collect();
        let Some(in_f) = ws.first().map(|w| w.in_f) else {
            return Ok(());
        };
        assert!(
            in_f > 0 && x.len().is_multiple_of(in_f),
            "expert_matmul: x is not rows of in"
        );
        let x_rows = x.len() / in_f;
        flint_hal::fanout(x_rows, ids.len(), "expert_matmul");
        for (w, out) in ws.iter().zip(outs.iter()) {
            assert_eq!(
                w.in_f, in_f,
                "expert_matmul_multi: towers of different inputs"
            );
            assert_eq!(
                out.len(),
                ids.len() * w.out_f,
                "expert_matmul: out is not ids * out"
            );
        }
        if ids.is_empty() {
            return Ok(());
        }
        // Expert ids are checked by the adapter, wherever they live.
        let inner = &*self.inner;
        let ia = self.indices(ids)?;
        let xa = self.input(x)?;
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let o = self.output(out.reborrow(), false, &[xa.h(), ia.h])?;
            // SAFETY: device open; `handles` is readable for the count passed; every
            // buffer handle is a live buffer of this device.
            let st = unsafe {
                (inner.rt.api().expert_matmul)(
                    inner.dev.0,
                    w.handles.as_ptr(),
                    w.handles.len() as u32,
                    xa.h(),
                    x_rows as u64,
                    ia.h,
                    ia.offset,
                    ids.len() as u64,
                    o.arg.h(),
                )
            };
            inner.check(st, &format!("expert matmul with '{}'", w.info.name))?;
            self.finish(o)?;
        }
        Ok(())
    }

    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let w = self.weight(w);
        assert_eq!(
            w.handles.len(),
            1,
            "get_rows on expert tower '{}'",
            w.info.name
        );
        assert_eq!(
            out.len(),
            ids.len() * w.in_f,
            "get_rows: out is not ids * d"
        );
        // Host ids are checked here; ids in a device buffer by the adapter.
        if let Some(&bad) = ids
            .as_host()
            .and_then(|ids| ids.iter().find(|&&i| i as usize >= w.out_f))
        {
            return Err(HalError::invalid(format!(
                "get_rows: id {bad} outside '{}' of {} rows",
                w.info.name, w.out_f
            )));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let ia = self.indices(ids)?;
        let o = self.output(out, false, &[])?;
        // SAFETY: device open; every handle is a live buffer of this device.
        let st = unsafe {
            (inner.rt.api().get_rows)(
                inner.dev.0,
                w.handles[0],
                ia.h,
                ia.offset,
                ids.len() as u64,
                o.arg.h(),
            )
        };
        inner.check(st, &format!("get_rows from '{}'", w.info.name))?;
        self.finish(o)
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
            "rms_norm: x is not rows of dim"
        );
        assert_eq!(x.len(), out.len(), "rms_norm: out length");
        if let Some(w) = weight {
            assert_eq!(w.len(), dim, "rms_norm: weight is not dim long");
        }
        let n = x.len();
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let wa = weight.map(|w| self.input(w)).transpose()?;
        let wh = wa.as_ref().map_or(0, Arg::h);
        let o = self.output(out, false, &[xa.h(), wh])?;
        // SAFETY: device open; handles belong to it (0 = no weight).
        let st = unsafe {
            (inner.rt.api().rms_norm)(
                inner.dev.0,
                xa.h(),
                n as u64,
                wh,
                eps,
                dim as u64,
                o.arg.h(),
            )
        };
        inner.check(st, "rms_norm")?;
        self.finish(o)
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
        let n = residual.len();
        assert!(
            dim > 0 && n.is_multiple_of(dim),
            "add_rms_norm: residual is not rows of dim"
        );
        assert!(delta.len() == n && out.len() == n, "add_rms_norm: lengths");
        assert_eq!(weight.len(), dim, "add_rms_norm: weight is not dim long");
        let inner = &*self.inner;
        let da = self.input(delta)?;
        let wa = self.input(weight)?;
        let r = self.output(residual, true, &[da.h(), wa.h()])?;
        let o = self.output(out, false, &[da.h(), wa.h(), r.arg.h()])?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe {
            (inner.rt.api().add_rms_norm)(
                inner.dev.0,
                r.arg.h(),
                da.h(),
                n as u64,
                wa.h(),
                eps,
                dim as u64,
                o.arg.h(),
            )
        };
        inner.check(st, "add_rms_norm")?;
        self.finish(r)?;
        self.finish(o)
    }

    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let row = p.n_heads * p.head_dim;
        assert_eq!(
            x.len(),
            positions.len() * row,
            "rope: x is not rows * heads * head_dim"
        );
        p.check()?;
        let to_u32 = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| HalError::invalid(format!("rope: {what} {v} exceeds u32")))
        };
        let yarn = p.yarn.unwrap_or(Yarn {
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
            n_ctx_orig: 0,
        });
        let mut cp = ffi::CRopeParams {
            n_heads: to_u32(p.n_heads, "n_heads")?,
            head_dim: to_u32(p.head_dim, "head_dim")?,
            n_rot: to_u32(p.n_rot, "n_rot")?,
            kind: match p.kind {
                RopeKind::Normal => ffi::ROPE_NORMAL,
                RopeKind::Neox => ffi::ROPE_NEOX,
            },
            base: p.base,
            freq_scale: p.freq_scale,
            freq_factors: 0,
            freq_factors_offset: 0,
            ext_factor: yarn.ext_factor,
            attn_factor: yarn.attn_factor,
            beta_fast: yarn.beta_fast,
            beta_slow: yarn.beta_slow,
            n_ctx_orig: yarn.n_ctx_orig,
            reserved: 0,
        };
        if x.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let pa = self.indices(positions)?;
        // The factors (a model tensor) are read on the device: a device view where it
        // is, host values through a scratch buffer (an upload). Their count was checked
        // above; the adapter checks their values.
        let fa = p.freq_factors.map(|f| self.floats_at(f)).transpose()?;
        if let Some(f) = &fa {
            cp.freq_factors = f.h;
            cp.freq_factors_offset = f.offset;
        }
        let xa = self.output(x, true, &[cp.freq_factors])?;
        // SAFETY: device open; every handle is a live buffer of this device (0 = no
        // factors); `cp` lives across the call.
        let st = unsafe {
            (inner.rt.api().rope)(
                inner.dev.0,
                xa.arg.h(),
                positions.len() as u64,
                pa.h,
                pa.offset,
                &cp,
            )
        };
        inner.check(st, "rope")?;
        self.finish(xa)
    }

    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        self.act_mul(gate, up, out, false)
    }

    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        self.act_mul(gate, up, out, true)
    }

    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        assert_eq!(acc.len(), x.len(), "add: lengths");
        let n = acc.len();
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let a = self.output(acc, true, &[xa.h()])?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe { (inner.rt.api().add)(inner.dev.0, a.arg.h(), xa.h(), n as u64) };
        inner.check(st, "add")?;
        self.finish(a)
    }

    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        flint_hal::bias_rows(x.len(), bias.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let (n, bl) = (x.len(), bias.len());
        let inner = &*self.inner;
        let ba = self.input(bias)?;
        let xa = self.output(x, true, &[ba.h()])?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe {
            (inner.rt.api().add_bias)(inner.dev.0, xa.arg.h(), n as u64, ba.h(), bl as u64)
        };
        inner.check(st, "add_bias")?;
        self.finish(xa)
    }

    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        let n = x.len();
        let inner = &*self.inner;
        let xa = self.output(x, true, &[])?;
        // SAFETY: device open; the handle belongs to it.
        let st = unsafe { (inner.rt.api().scale)(inner.dev.0, xa.arg.h(), n as u64, s) };
        inner.check(st, "scale")?;
        self.finish(xa)
    }

    /// gpt-oss's expert biases: the ABI has no entry for them (nor for its activation,
    /// so gpt-oss is refused on `tt` before this is reached).
    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        let _ = (x, table, ids, dim);
        Err(HalError::unsupported(format!(
            "{}: add_id (gpt-oss's expert biases) has no entry in the tt adapter ABI",
            self.name()
        )))
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
            "scatter_add_weighted: acc is not rows of dim"
        );
        assert_eq!(
            x.len(),
            weights.len() * dim,
            "scatter_add_weighted: x is not weights * dim"
        );
        let acc_rows = acc.len() / dim;
        flint_hal::fanout(acc_rows, weights.len(), "scatter_add_weighted");
        if weights.is_empty() {
            return Ok(());
        }
        let n = weights.len();
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let wa = self.floats_at(weights)?;
        let a = self.output(acc, true, &[xa.h(), wa.h])?;
        // SAFETY: device open; every handle is a live buffer of this device.
        let st = unsafe {
            (inner.rt.api().scatter_add_weighted)(
                inner.dev.0,
                a.arg.h(),
                acc_rows as u64,
                xa.h(),
                wa.h,
                wa.offset,
                n as u64,
                dim as u64,
            )
        };
        inner.check(st, "scatter_add_weighted")?;
        self.finish(a)
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
        assert!(
            n_experts > 0 && logits.len().is_multiple_of(n_experts),
            "route_topk: logits"
        );
        let n_rows = logits.len() / n_experts;
        assert!(
            ids.len() == n_rows * cfg.k && weights.len() == n_rows * cfg.k,
            "route_topk: ids/weights are not rows * k"
        );
        if let Some(b) = bias {
            assert_eq!(b.len(), n_experts, "route_topk: bias is not n_experts long");
        }
        if let Some(s) = expert_scale {
            assert_eq!(
                s.len(),
                n_experts,
                "route_topk: expert_scale is not n_experts long"
            );
        }
        if n_rows == 0 {
            return Ok(());
        }
        let inner = &*self.inner;
        let la = self.input(logits)?;
        let ba = bias.map(|b| self.input(b)).transpose()?;
        let sa = expert_scale.map(|s| self.input(s)).transpose()?;
        let gating = match cfg.gating {
            flint_hal::Gating::Softmax => 0,
            flint_hal::Gating::Sigmoid => 1,
            flint_hal::Gating::SoftmaxWeight => 2,
        };
        // Where the results go: a device view in place, at its offset; host memory
        // through a scratch buffer read back after the call.
        let (ids_h, ids_off, ids_scratch, ids_host) = match ids {
            IndexViewMut::Device { buf, offset, .. } => (self.buffer(buf).h, offset, None, None),
            IndexViewMut::Host(s) => {
                let b = inner.alloc(4 * s.len().max(1))?;
                (b.h, 0, Some(b), Some(s))
            }
        };
        let (w_h, w_off, w_scratch, w_host) = match weights {
            ViewMut::Device { buf, offset, .. } => (self.buffer(buf).h, offset, None, None),
            ViewMut::Host(s) => {
                let b = inner.alloc_f32(s.len())?;
                (b.h, 0, Some(b), Some(s))
            }
        };
        // SAFETY: device open; every handle is a live buffer of this device (0 = none
        // for the bias and the expert scale).
        let st = unsafe {
            (inner.rt.api().route_topk)(
                inner.dev.0,
                la.h(),
                n_rows as u64,
                n_experts as u32,
                ba.as_ref().map_or(0, Arg::h),
                sa.as_ref().map_or(0, Arg::h),
                cfg.k as u32,
                gating,
                u32::from(cfg.normalize),
                cfg.scale,
                ids_h,
                ids_off as u64,
                w_h,
                w_off as u64,
            )
        };
        inner.check(st, "route_topk")?;
        if let Some(s) = ids_host {
            self.xfer.download(s.len());
            inner.read_bytes(ids_h, 0, bytemuck::cast_slice_mut(s))?;
        }
        if let Some(s) = w_host {
            self.xfer.download(s.len());
            inner.read_at(w_h, 0, s)?;
        }
        drop((ids_scratch, w_scratch));
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
        assert!(d_conv > 0, "ssm_conv_silu: d_conv is 0");
        let channels = weight.len() / d_conv;
        assert_eq!(
            weight.len(),
            channels * d_conv,
            "ssm_conv_silu: weight is not channels * d_conv"
        );
        assert_eq!(
            state.len(),
            channels * (d_conv - 1),
            "ssm_conv_silu: state is not channels * (d_conv - 1)"
        );
        let n = x.len().checked_div(channels).unwrap_or(0);
        assert_eq!(
            x.len(),
            n * channels,
            "ssm_conv_silu: x is not rows of channels"
        );
        assert_eq!(out.len(), x.len(), "ssm_conv_silu: out length");
        if x.is_empty() {
            // No input: the window stays as it is.
            return Ok(());
        }
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let wa = self.input(weight)?;
        // The state is read and written in place at its offset (ABI 6).
        let (sa, s_off) = self.in_place_at(state)?;
        let o = self.output(out, false, &[xa.h(), wa.h(), sa.arg.h()])?;
        // SAFETY: device open; every handle is a live buffer of this device.
        let st = unsafe {
            (inner.rt.api().ssm_conv_silu)(
                inner.dev.0,
                xa.h(),
                n as u64,
                channels as u64,
                wa.h(),
                d_conv as u64,
                sa.arg.h(),
                s_off,
                o.arg.h(),
            )
        };
        inner.check(st, "ssm_conv_silu")?;
        self.finish(sa)?;
        self.finish(o)
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
        if !shape.is_valid() {
            return Err(HalError::invalid(format!(
                "gated_delta_net: {} value heads on {} key heads of size {} (value heads \
                 must be a non-zero multiple of key heads, sizes non-zero)",
                shape.heads_v, shape.heads_k, shape.head_dim
            )));
        }
        let (ql, vl, hv) = (shape.qk_len(), shape.v_len(), shape.heads_v);
        let n = q.len() / ql;
        assert_eq!(q.len(), n * ql, "gated_delta_net: q length");
        assert_eq!(k.len(), n * ql, "gated_delta_net: k length");
        assert_eq!(v.len(), n * vl, "gated_delta_net: v length");
        assert_eq!(g.len(), n * hv, "gated_delta_net: g length");
        assert_eq!(beta.len(), n * hv, "gated_delta_net: beta length");
        assert_eq!(
            state.len(),
            shape.state_len(),
            "gated_delta_net: state length"
        );
        assert_eq!(out.len(), n * vl, "gated_delta_net: out length");
        if n == 0 {
            return Ok(());
        }
        let inner = &*self.inner;
        let qa = self.input(q)?;
        let ka = self.input(k)?;
        let va = self.input(v)?;
        let ga = self.input(g)?;
        let ba = self.input(beta)?;
        let (sa, s_off) = self.in_place_at(state)?;
        let o = self.output(
            out,
            false,
            &[qa.h(), ka.h(), va.h(), ga.h(), ba.h(), sa.arg.h()],
        )?;
        // SAFETY: device open; every handle is a live buffer of this device.
        let st = unsafe {
            (inner.rt.api().gated_delta_net)(
                inner.dev.0,
                shape.heads_k as u64,
                shape.heads_v as u64,
                shape.head_dim as u64,
                n as u64,
                qa.h(),
                ka.h(),
                va.h(),
                ga.h(),
                ba.h(),
                sa.arg.h(),
                s_off,
                o.arg.h(),
            )
        };
        inner.check(st, "gated_delta_net")?;
        self.finish(sa)?;
        self.finish(o)
    }

    fn sigmoid(&self, x: ViewMut<'_>) -> Result<(), HalError> {
        if x.is_empty() {
            return Ok(());
        }
        let n = x.len();
        let inner = &*self.inner;
        let xa = self.output(x, true, &[])?;
        // SAFETY: device open; the handle belongs to it.
        let st = unsafe { (inner.rt.api().sigmoid)(inner.dev.0, xa.arg.h(), n as u64) };
        inner.check(st, "sigmoid")?;
        self.finish(xa)
    }

    fn mul(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        if acc.is_empty() {
            return Ok(());
        }
        assert!(
            !x.is_empty() && acc.len().is_multiple_of(x.len()),
            "mul: {} values by {} values",
            acc.len(),
            x.len()
        );
        let (n, xl) = (acc.len(), x.len());
        let inner = &*self.inner;
        let xa = self.input(x)?;
        let a = self.output(acc, true, &[xa.h()])?;
        // SAFETY: device open; handles belong to it.
        let st =
            unsafe { (inner.rt.api().mul)(inner.dev.0, a.arg.h(), n as u64, xa.h(), xl as u64) };
        inner.check(st, "mul")?;
        self.finish(a)
    }

    /// One `flint_tt_deinterleave` for all the parts (the adapter reads `src` once), the
    /// output handles passed as an array.
    fn deinterleave(
        &self,
        src: View<'_>,
        chunk: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let parts = outs.len();
        assert!(
            chunk > 0 && parts > 0 && src.len().is_multiple_of(chunk * parts),
            "deinterleave: {} values are not groups of {parts} chunks of {chunk}",
            src.len()
        );
        let per = src.len() / parts;
        for o in outs.iter() {
            assert_eq!(o.len(), per, "deinterleave: output length");
        }
        if src.is_empty() {
            return Ok(());
        }
        let n_outs = u32::try_from(parts)
            .map_err(|_| HalError::invalid(format!("deinterleave: {parts} outputs")))?;
        let inner = &*self.inner;
        let sa = self.input(src)?;
        // Distinct buffers for the outputs and the source (the ABI refuses others): a
        // second view of one buffer goes through a scratch buffer.
        let mut avoid = vec![sa.h()];
        let mut os = Vec::with_capacity(parts);
        for o in outs.iter_mut() {
            let oa = self.output(o.reborrow(), false, &avoid)?;
            avoid.push(oa.arg.h());
            os.push(oa);
        }
        let hs: Vec<u64> = os.iter().map(|o| o.arg.h()).collect();
        // SAFETY: device open; `hs` is readable for the count passed; every handle is a
        // live buffer of this device.
        let st = unsafe {
            (inner.rt.api().deinterleave)(
                inner.dev.0,
                sa.h(),
                (per * parts) as u64,
                chunk as u64,
                hs.as_ptr(),
                n_outs,
            )
        };
        inner.check(st, "deinterleave")?;
        for o in os {
            self.finish(o)?;
        }
        Ok(())
    }

    fn delta_net_gate(
        &self,
        alpha: ViewMut<'_>,
        dt_bias: View<'_>,
        a: View<'_>,
    ) -> Result<(), HalError> {
        let heads = dt_bias.len();
        assert!(
            heads > 0 && a.len() == heads && alpha.len().is_multiple_of(heads),
            "delta_net_gate: {} values, {heads} dt biases, {} decay rates",
            alpha.len(),
            a.len()
        );
        if alpha.is_empty() {
            return Ok(());
        }
        let n = alpha.len();
        let inner = &*self.inner;
        let da = self.input(dt_bias)?;
        let aa = self.input(a)?;
        let al = self.output(alpha, true, &[da.h(), aa.h()])?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe {
            (inner.rt.api().delta_net_gate)(
                inner.dev.0,
                al.arg.h(),
                n as u64,
                da.h(),
                aa.h(),
                heads as u64,
            )
        };
        inner.check(st, "delta_net_gate")?;
        self.finish(al)
    }

    fn l2_norm(&self, x: ViewMut<'_>, dim: usize, eps: f32) -> Result<(), HalError> {
        assert!(
            dim > 0 && x.len().is_multiple_of(dim),
            "l2_norm: {} values are not rows of {dim}",
            x.len()
        );
        if x.is_empty() {
            return Ok(());
        }
        let n = x.len();
        let inner = &*self.inner;
        let xa = self.output(x, true, &[])?;
        // SAFETY: device open; the handle belongs to it.
        let st =
            unsafe { (inner.rt.api().l2_norm)(inner.dev.0, xa.arg.h(), n as u64, dim as u64, eps) };
        inner.check(st, "l2_norm")?;
        self.finish(xa)
    }

    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError> {
        let slots = layout.num_slots() * layout.n_kv_heads;
        let k = self.inner.alloc_f32(slots * layout.head_dim_k)?;
        let v = self.inner.alloc_f32(slots * layout.head_dim_v)?;
        // The TtKv takes over both handles and frees them on drop.
        let (kh, vh) = (k.h, v.h);
        std::mem::forget(k);
        std::mem::forget(v);
        Ok(Box::new(TtKv {
            inner: self.inner.clone(),
            layout: *layout,
            k: kh,
            v: vh,
        }))
    }

    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError> {
        let kv = self.kv(kv);
        let l = kv.layout;
        assert_eq!(
            k.len(),
            slots.len() * l.n_kv_heads * l.head_dim_k,
            "write_kv: k"
        );
        assert_eq!(
            v.len(),
            slots.len() * l.n_kv_heads * l.head_dim_v,
            "write_kv: v"
        );
        // Host slots are checked here; slots in a device buffer by the adapter.
        assert!(
            slots
                .as_host()
                .is_none_or(|s| s.iter().all(|&s| (s as usize) < l.num_slots())),
            "write_kv: slot outside the cache"
        );
        if slots.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let sa = self.indices(slots)?;
        let ka = self.input(k)?;
        let va = self.input(v)?;
        let cl = kv_layout(&l);
        // SAFETY: device open; `cl` readable; every handle is a live buffer of this
        // device.
        let st = unsafe {
            (inner.rt.api().write_kv)(
                inner.dev.0,
                &cl,
                kv.k,
                kv.v,
                ka.h(),
                va.h(),
                sa.h,
                sa.offset,
                slots.len() as u64,
            )
        };
        inner.check(st, "write_kv")
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
            "paged_attention: n_heads is not a multiple of n_kv_heads"
        );
        let qrow = p.n_heads * l.head_dim_k;
        assert!(
            qrow > 0 && p.q.len().is_multiple_of(qrow),
            "paged_attention: q is not rows"
        );
        let q_rows = p.q.len() / qrow;
        assert_eq!(
            out.len(),
            q_rows * p.n_heads * l.head_dim_v,
            "paged_attention: out"
        );
        if let Some(s) = p.sinks {
            assert_eq!(
                s.len(),
                p.n_heads,
                "paged_attention: sinks is not n_heads long"
            );
        }
        if q_rows == 0 {
            return Ok(());
        }
        if p.window == Some(0) {
            // A window of 0 sees no key: every output is 0 (the ABI's window 0 means
            // "no window", so this case never reaches the adapter). Zeros are written on
            // the device's side for a device view.
            return match out {
                ViewMut::Host(o) => {
                    o.fill(0.0);
                    Ok(())
                }
                ViewMut::Device { buf, offset, len } => {
                    let t = self.buffer(buf);
                    let z = self.inner.alloc_f32(len)?;
                    self.inner.copy(z.h, 0, t.h, offset, len)
                }
            };
        }
        // Each sequence's lists: where they are in device buffers (host lists uploaded
        // into scratch buffers that live until the call returns).
        let mut lists = Vec::with_capacity(2 * p.seqs.len());
        for s in p.seqs {
            lists.push(self.indices(s.positions)?);
            lists.push(self.indices(s.block_table)?);
        }
        let seqs: Vec<CAttnSeq> = p
            .seqs
            .iter()
            .zip(lists.chunks_exact(2))
            .map(|(s, l)| CAttnSeq {
                q_start: s.q_start as u64,
                positions: l[0].h,
                positions_offset: l[0].offset,
                n_positions: s.positions.len() as u64,
                block_table: l[1].h,
                block_table_offset: l[1].offset,
                n_blocks: s.block_table.len() as u64,
            })
            .collect();
        let inner = &*self.inner;
        let qa = self.input(p.q)?;
        // The sinks (a model tensor) are read on the device: a device view where it is,
        // host values through a scratch buffer (an upload).
        let sa = p.sinks.map(|s| self.floats_at(s)).transpose()?;
        let (sinks_h, sinks_off) = sa.as_ref().map_or((0, 0), |s| (s.h, s.offset));
        let o = self.output(out, false, &[qa.h(), sinks_h])?;
        let cl = kv_layout(&l);
        // SAFETY: device open; `seqs` (whose handles `lists` keeps alive) and `cl` are
        // readable for the counts passed; every handle is a live buffer of this device
        // (0 = no sinks).
        let st = unsafe {
            (inner.rt.api().paged_attention)(
                inner.dev.0,
                &cl,
                kv.k,
                kv.v,
                qa.h(),
                q_rows as u64,
                seqs.as_ptr(),
                seqs.len() as u64,
                p.n_heads as u32,
                p.scale,
                sinks_h,
                sinks_off,
                p.window.map_or(0, |w| w as u64),
                o.arg.h(),
            )
        };
        inner.check(st, "paged_attention")?;
        self.finish(o)
    }

    fn counters(&self) -> DeviceCounters {
        match self.inner.counters() {
            Ok(c) => DeviceCounters {
                block_dispatches: c.block_dispatches,
                float_dispatches: c.float_dispatches,
            },
            Err(_) => DeviceCounters::default(),
        }
    }
}

impl TtDevice {
    fn act_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
        gelu: bool,
    ) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "act_mul: lengths"
        );
        let n = out.len();
        let inner = &*self.inner;
        let ga = self.input(gate)?;
        let ua = self.input(up)?;
        let o = self.output(out, false, &[ga.h(), ua.h()])?;
        let f = if gelu {
            inner.rt.api().gelu_mul
        } else {
            inner.rt.api().silu_mul
        };
        // SAFETY: device open; handles belong to it.
        let st = unsafe { f(inner.dev.0, ga.h(), ua.h(), n as u64, o.arg.h()) };
        inner.check(st, if gelu { "gelu_mul" } else { "silu_mul" })?;
        self.finish(o)
    }

    /// A tensor of `len` values that takes over scratch buffer `b` (and frees it on
    /// drop).
    fn keep(&self, b: DevBuf<'_>, len: usize) -> Box<TtBuffer> {
        let h = b.h;
        std::mem::forget(b);
        Box::new(TtBuffer {
            inner: self.inner.clone(),
            h,
            len,
        })
    }

    /// The [`TtBuffer`] behind a device view. A buffer of another device is a caller bug
    /// and panics, as weights and KV buffers of another device do.
    fn buffer<'b>(&self, buf: &'b dyn DeviceBuffer) -> &'b TtBuffer {
        match buf.as_any().downcast_ref::<TtBuffer>() {
            Some(t) if Arc::ptr_eq(&t.inner, &self.inner) => t,
            _ => panic!("a device buffer that was not allocated on this tt device"),
        }
    }

    /// Where an op reads an index list from: an index tensor's buffer and the list's
    /// first index in it, or a scratch buffer the host list is uploaded into (counted).
    fn indices(&self, v: IndexView<'_>) -> Result<AtArg<'_>, HalError> {
        match v {
            IndexView::Host(s) => {
                self.xfer.upload(s.len());
                let b = self.inner.alloc(4 * s.len().max(1))?;
                self.inner.write_bytes(b.h, 0, bytemuck::cast_slice(s))?;
                Ok(AtArg {
                    h: b.h,
                    offset: 0,
                    _scratch: Some(b),
                })
            }
            IndexView::Device { buf, offset, .. } => Ok(AtArg {
                h: self.buffer(buf).h,
                offset: offset as u64,
                _scratch: None,
            }),
        }
    }

    /// Where an op reads a float list given by buffer and offset (routing weights, RoPE
    /// factors, attention sinks) from: a tensor's buffer and the view's first value in
    /// it, or a scratch buffer the host values are uploaded into (counted as an upload).
    fn floats_at(&self, v: View<'_>) -> Result<AtArg<'_>, HalError> {
        match v {
            View::Host(s) => {
                self.xfer.upload(s.len());
                let b = self.inner.upload(s)?;
                Ok(AtArg {
                    h: b.h,
                    offset: 0,
                    _scratch: Some(b),
                })
            }
            View::Device { buf, offset, .. } => Ok(AtArg {
                h: self.buffer(buf).h,
                offset: offset as u64,
                _scratch: None,
            }),
        }
    }

    /// Where an op reads and updates a state in place by buffer and offset (ABI 6: the
    /// Gated DeltaNet states): a tensor's buffer and the view's first value in it, written
    /// there by the op; host values through a scratch buffer (an upload, and a download
    /// in [`finish`](Self::finish)). Returns the argument and the offset in floats.
    fn in_place_at<'v>(&self, v: ViewMut<'v>) -> Result<(OutArg<'_, 'v>, u64), HalError> {
        match v {
            ViewMut::Device { buf, offset, .. } => Ok((
                OutArg {
                    arg: Arg::Direct(self.buffer(buf).h),
                    back: Back::None,
                },
                offset as u64,
            )),
            host @ ViewMut::Host(_) => Ok((self.output(host, true, &[])?, 0)),
        }
    }

    /// The buffer an op reads `v` from: a tensor's own handle when the view starts at its
    /// first value (counts are explicit in the ABI, so a prefix is fine), else a scratch
    /// copy made on the device; host values are uploaded into a scratch buffer (counted).
    fn input(&self, v: View<'_>) -> Result<Arg<'_>, HalError> {
        match v {
            View::Host(s) => {
                self.xfer.upload(s.len());
                Ok(Arg::Scratch(self.inner.upload(s)?))
            }
            View::Device { buf, offset, len } => {
                let t = self.buffer(buf);
                if offset == 0 {
                    Ok(Arg::Direct(t.h))
                } else {
                    let b = self.inner.alloc_f32(len)?;
                    self.inner.copy(t.h, offset, b.h, 0, len)?;
                    Ok(Arg::Scratch(b))
                }
            }
        }
    }

    /// The buffer an op writes `v` through, and where its values go after the call
    /// ([`finish`](Self::finish)). A device view at offset 0 is written in place unless
    /// its buffer is also one of the op's inputs (`avoid`: the ABI refuses an output that
    /// is an input); otherwise a scratch buffer, holding `v`'s values first when `init`
    /// (ops that update in place), copied back on the device's side. Host values go
    /// through a scratch buffer (an upload when `init`, and a download after).
    fn output<'v>(
        &self,
        v: ViewMut<'v>,
        init: bool,
        avoid: &[u64],
    ) -> Result<OutArg<'_, 'v>, HalError> {
        match v {
            ViewMut::Host(s) => {
                let b = if init {
                    self.xfer.upload(s.len());
                    self.inner.upload(s)?
                } else {
                    self.inner.alloc_f32(s.len())?
                };
                Ok(OutArg {
                    arg: Arg::Scratch(b),
                    back: Back::Host(s),
                })
            }
            ViewMut::Device { buf, offset, len } => {
                let t = self.buffer(buf);
                if offset == 0 && !avoid.contains(&t.h) {
                    return Ok(OutArg {
                        arg: Arg::Direct(t.h),
                        back: Back::None,
                    });
                }
                let b = self.inner.alloc_f32(len)?;
                if init {
                    self.inner.copy(t.h, offset, b.h, 0, len)?;
                }
                Ok(OutArg {
                    arg: Arg::Scratch(b),
                    back: Back::Device {
                        h: t.h,
                        offset,
                        len,
                    },
                })
            }
        }
    }

    /// Moves an output's values where they belong after the op: back to the host
    /// (counted) or into the tensor's range on the device.
    fn finish(&self, o: OutArg<'_, '_>) -> Result<(), HalError> {
        match o.back {
            Back::None => Ok(()),
            Back::Host(s) => {
                self.xfer.download(s.len());
                self.inner.read_at(o.arg.h(), 0, s)
            }
            Back::Device { h, offset, len } => self.inner.copy(o.arg.h(), 0, h, offset, len),
        }
    }
}

/// A buffer handed to the adapter for one op: a tensor's own handle, or a scratch buffer
/// freed after the op.
enum Arg<'a> {
    Direct(u64),
    Scratch(DevBuf<'a>),
}

impl Arg<'_> {
    fn h(&self) -> u64 {
        match self {
            Arg::Direct(h) => *h,
            Arg::Scratch(b) => b.h,
        }
    }
}

/// A list handed to the adapter by buffer and offset (index lists, routing weights):
/// buffer `h` from value `offset`, and the scratch buffer (freed after the op) when the
/// list came from the host.
struct AtArg<'a> {
    h: u64,
    offset: u64,
    _scratch: Option<DevBuf<'a>>,
}

/// Where an op's output goes after the call.
enum Back<'v> {
    /// Written in place.
    None,
    /// Copied on the device into `len` values of buffer `h` from `offset`.
    Device { h: u64, offset: usize, len: usize },
    /// Read back to host memory.
    Host(&'v mut [f32]),
}

/// An op's output: the buffer it writes and where the values go after.
struct OutArg<'a, 'v> {
    arg: Arg<'a>,
    back: Back<'v>,
}
