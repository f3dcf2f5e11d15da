//! [`TtDevice`]: the `flint_hal::Device` implementation over the runtime adapter.

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use flint_core::GgmlType;
use flint_hal::{
    Device, DeviceCounters, DeviceOptions, ExpertRow, HalError, KvBuffer, KvLayout, Op,
    PagedAttention, RopeKind, RopeParams, RoutingConfig, StagedInfo, StagingPlan, Tier, Weight,
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
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // SAFETY: `bytes` is readable for its length; the buffer belongs to this device.
        let st = unsafe {
            (self.inner.rt.api().buffer_write)(
                self.inner.dev.0,
                self.h,
                0,
                bytes.as_ptr(),
                bytes.len() as u64,
            )
        };
        self.inner.check(st, "writing a buffer")
    }

    fn read(&self, out: &mut [f32]) -> Result<(), HalError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        // SAFETY: `bytes` is writable for its length; the buffer belongs to this device.
        let st = unsafe {
            (self.inner.rt.api().buffer_read)(
                self.inner.dev.0,
                self.h,
                0,
                bytes.as_mut_ptr(),
                bytes.len() as u64,
            )
        };
        self.inner.check(st, "reading a buffer")
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle was allocated on this device and is freed once, here.
        unsafe { (self.inner.rt.api().buffer_free)(self.inner.dev.0, self.h) };
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
        // ABI 1 has no entry point for gpt-oss's activation nor for Gated DeltaNet's ops.
        if matches!(op, Op::SwigluOaiMul | Op::SsmConvSilu | Op::GatedDeltaNet) {
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

    fn plan(&self, weights: &[WeightDesc]) -> Result<StagingPlan, HalError> {
        let plan = staging::plan(
            weights,
            self.inner.dram_bytes,
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

    fn matmul(&self, w: &dyn Weight, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), HalError> {
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
        let xb = inner.upload(x)?;
        let ob = inner.alloc_f32(out.len())?;
        // SAFETY: device open; all handles belong to it.
        let st =
            unsafe { (inner.rt.api().matmul)(inner.dev.0, w.handles[0], xb.h, m as u64, ob.h) };
        inner.check(st, &format!("matmul with '{}'", w.info.name))?;
        ob.read(out)
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: &[f32],
        rows: &[ExpertRow],
        out: &mut [f32],
    ) -> Result<(), HalError> {
        let w = self.weight(w);
        assert!(
            w.in_f > 0 && x.len().is_multiple_of(w.in_f),
            "expert_matmul: x is not rows of in"
        );
        assert_eq!(
            out.len(),
            rows.len() * w.out_f,
            "expert_matmul: out is not rows * out"
        );
        if rows.is_empty() {
            return Ok(());
        }
        let x_rows = x.len() / w.in_f;
        for r in rows {
            assert!(
                (r.input_row as usize) < x_rows && (r.expert as usize) < w.handles.len(),
                "expert_matmul: row {r:?} outside {x_rows} rows / {} experts",
                w.handles.len()
            );
        }
        let pairs: Vec<u32> = rows.iter().flat_map(|r| [r.input_row, r.expert]).collect();
        let inner = &*self.inner;
        let xb = inner.upload(x)?;
        let ob = inner.alloc_f32(out.len())?;
        // SAFETY: device open; `handles` and `pairs` are readable for the counts passed.
        let st = unsafe {
            (inner.rt.api().expert_matmul)(
                inner.dev.0,
                w.handles.as_ptr(),
                w.handles.len() as u32,
                xb.h,
                x_rows as u64,
                pairs.as_ptr(),
                rows.len() as u64,
                ob.h,
            )
        };
        inner.check(st, &format!("expert matmul with '{}'", w.info.name))?;
        ob.read(out)
    }

    fn get_rows(&self, w: &dyn Weight, ids: &[u32], out: &mut [f32]) -> Result<(), HalError> {
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
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= w.out_f) {
            return Err(HalError::invalid(format!(
                "get_rows: id {bad} outside '{}' of {} rows",
                w.info.name, w.out_f
            )));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let ob = inner.alloc_f32(out.len())?;
        // SAFETY: device open; `ids` readable for its length.
        let st = unsafe {
            (inner.rt.api().get_rows)(
                inner.dev.0,
                w.handles[0],
                ids.as_ptr(),
                ids.len() as u64,
                ob.h,
            )
        };
        inner.check(st, &format!("get_rows from '{}'", w.info.name))?;
        ob.read(out)
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: Option<&[f32]>,
        eps: f32,
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        assert!(
            dim > 0 && x.len().is_multiple_of(dim),
            "rms_norm: x is not rows of dim"
        );
        assert_eq!(x.len(), out.len(), "rms_norm: out length");
        if let Some(w) = weight {
            assert_eq!(w.len(), dim, "rms_norm: weight is not dim long");
        }
        let inner = &*self.inner;
        let xb = inner.upload(x)?;
        let wb = weight.map(|w| inner.upload(w)).transpose()?;
        let ob = inner.alloc_f32(out.len())?;
        // SAFETY: device open; handles belong to it (0 = no weight).
        let st = unsafe {
            (inner.rt.api().rms_norm)(
                inner.dev.0,
                xb.h,
                x.len() as u64,
                wb.as_ref().map_or(0, |b| b.h),
                eps,
                dim as u64,
                ob.h,
            )
        };
        inner.check(st, "rms_norm")?;
        ob.read(out)
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
        let n = residual.len();
        assert!(
            dim > 0 && n.is_multiple_of(dim),
            "add_rms_norm: residual is not rows of dim"
        );
        assert!(delta.len() == n && out.len() == n, "add_rms_norm: lengths");
        assert_eq!(weight.len(), dim, "add_rms_norm: weight is not dim long");
        let inner = &*self.inner;
        let rb = inner.upload(residual)?;
        let db = inner.upload(delta)?;
        let wb = inner.upload(weight)?;
        let ob = inner.alloc_f32(n)?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe {
            (inner.rt.api().add_rms_norm)(
                inner.dev.0,
                rb.h,
                db.h,
                n as u64,
                wb.h,
                eps,
                dim as u64,
                ob.h,
            )
        };
        inner.check(st, "add_rms_norm")?;
        rb.read(residual)?;
        ob.read(out)
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], p: &RopeParams<'_>) -> Result<(), HalError> {
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
        let cp = ffi::CRopeParams {
            n_heads: to_u32(p.n_heads, "n_heads")?,
            head_dim: to_u32(p.head_dim, "head_dim")?,
            n_rot: to_u32(p.n_rot, "n_rot")?,
            kind: match p.kind {
                RopeKind::Normal => ffi::ROPE_NORMAL,
                RopeKind::Neox => ffi::ROPE_NEOX,
            },
            base: p.base,
            freq_scale: p.freq_scale,
            freq_factors: p.freq_factors.map_or(std::ptr::null(), |f| f.as_ptr()),
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
        let xb = inner.upload(x)?;
        // SAFETY: device open; `positions` readable for its length; `cp` and the factors
        // it points to (`n_rot / 2` values, checked above) live across the call.
        let st = unsafe {
            (inner.rt.api().rope)(
                inner.dev.0,
                xb.h,
                positions.len() as u64,
                positions.as_ptr(),
                &cp,
            )
        };
        inner.check(st, "rope")?;
        xb.read(x)
    }

    fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        self.act_mul(gate, up, out, false)
    }

    fn gelu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        self.act_mul(gate, up, out, true)
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), HalError> {
        assert_eq!(acc.len(), x.len(), "add: lengths");
        let inner = &*self.inner;
        let ab = inner.upload(acc)?;
        let xb = inner.upload(x)?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe { (inner.rt.api().add)(inner.dev.0, ab.h, xb.h, acc.len() as u64) };
        inner.check(st, "add")?;
        ab.read(acc)
    }

    fn add_bias(&self, x: &mut [f32], bias: &[f32]) -> Result<(), HalError> {
        flint_hal::bias_rows(x.len(), bias.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let xb = inner.upload(x)?;
        let bb = inner.upload(bias)?;
        // SAFETY: device open; handles belong to it.
        let st = unsafe {
            (inner.rt.api().add_bias)(inner.dev.0, xb.h, x.len() as u64, bb.h, bias.len() as u64)
        };
        inner.check(st, "add_bias")?;
        xb.read(x)
    }

    fn scale(&self, x: &mut [f32], s: f32) -> Result<(), HalError> {
        let inner = &*self.inner;
        let xb = inner.upload(x)?;
        // SAFETY: device open; the handle belongs to it.
        let st = unsafe { (inner.rt.api().scale)(inner.dev.0, xb.h, x.len() as u64, s) };
        inner.check(st, "scale")?;
        xb.read(x)
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
            dim > 0 && acc.len().is_multiple_of(dim),
            "scatter_add_weighted: acc is not rows of dim"
        );
        assert!(
            x.len() == rows.len() * dim && weights.len() == rows.len(),
            "scatter_add_weighted: lengths"
        );
        let acc_rows = acc.len() / dim;
        assert!(
            rows.iter().all(|&r| (r as usize) < acc_rows),
            "scatter_add_weighted: row outside acc"
        );
        if rows.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let ab = inner.upload(acc)?;
        let xb = inner.upload(x)?;
        // SAFETY: device open; `rows` and `weights` readable for `rows.len()` entries.
        let st = unsafe {
            (inner.rt.api().scatter_add_weighted)(
                inner.dev.0,
                ab.h,
                acc_rows as u64,
                xb.h,
                rows.as_ptr(),
                weights.as_ptr(),
                rows.len() as u64,
                dim as u64,
            )
        };
        inner.check(st, "scatter_add_weighted")?;
        ab.read(acc)
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
        if n_rows == 0 {
            return Ok(());
        }
        let inner = &*self.inner;
        let lb = inner.upload(logits)?;
        let gating = match cfg.gating {
            flint_hal::Gating::Softmax => 0,
            flint_hal::Gating::Sigmoid => 1,
            flint_hal::Gating::SoftmaxWeight => 2,
        };
        // SAFETY: device open; `bias` is NULL or `n_experts` floats; `ids`/`weights` hold
        // `n_rows * k` writable entries each.
        let st = unsafe {
            (inner.rt.api().route_topk)(
                inner.dev.0,
                lb.h,
                n_rows as u64,
                n_experts as u32,
                bias.map_or(std::ptr::null(), |b| b.as_ptr()),
                cfg.k as u32,
                gating,
                u32::from(cfg.normalize),
                cfg.scale,
                ids.as_mut_ptr(),
                weights.as_mut_ptr(),
            )
        };
        inner.check(st, "route_topk")
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
        k: &[f32],
        v: &[f32],
        slots: &[u32],
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
        assert!(
            slots.iter().all(|&s| (s as usize) < l.num_slots()),
            "write_kv: slot outside the cache"
        );
        if slots.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let kb = inner.upload(k)?;
        let vb = inner.upload(v)?;
        let cl = kv_layout(&l);
        // SAFETY: device open; `cl` and `slots` readable.
        let st = unsafe {
            (inner.rt.api().write_kv)(
                inner.dev.0,
                &cl,
                kv.k,
                kv.v,
                kb.h,
                vb.h,
                slots.as_ptr(),
                slots.len() as u64,
            )
        };
        inner.check(st, "write_kv")
    }

    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: &mut [f32],
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
            // "no window", so this case never reaches the adapter).
            out.fill(0.0);
            return Ok(());
        }
        let seqs: Vec<CAttnSeq> = p
            .seqs
            .iter()
            .map(|s| CAttnSeq {
                q_start: s.q_start as u64,
                positions: s.positions.as_ptr(),
                n_positions: s.positions.len() as u64,
                block_table: s.block_table.as_ptr(),
                n_blocks: s.block_table.len() as u64,
            })
            .collect();
        let inner = &*self.inner;
        let qb = inner.upload(p.q)?;
        let ob = inner.alloc_f32(out.len())?;
        let cl = kv_layout(&l);
        // SAFETY: device open; `seqs` (and the slices its pointers come from, borrowed
        // from `p` for this call), `cl` and `sinks` are readable for the counts passed.
        let st = unsafe {
            (inner.rt.api().paged_attention)(
                inner.dev.0,
                &cl,
                kv.k,
                kv.v,
                qb.h,
                q_rows as u64,
                seqs.as_ptr(),
                seqs.len() as u64,
                p.n_heads as u32,
                p.scale,
                p.sinks.map_or(std::ptr::null(), |s| s.as_ptr()),
                p.window.map_or(0, |w| w as u64),
                ob.h,
            )
        };
        inner.check(st, "paged_attention")?;
        ob.read(out)
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
        gate: &[f32],
        up: &[f32],
        out: &mut [f32],
        gelu: bool,
    ) -> Result<(), HalError> {
        assert!(
            gate.len() == up.len() && up.len() == out.len(),
            "act_mul: lengths"
        );
        let inner = &*self.inner;
        let gb = inner.upload(gate)?;
        let ub = inner.upload(up)?;
        let ob = inner.alloc_f32(out.len())?;
        let f = if gelu {
            inner.rt.api().gelu_mul
        } else {
            inner.rt.api().silu_mul
        };
        // SAFETY: device open; handles belong to it.
        let st = unsafe { f(inner.dev.0, gb.h, ub.h, out.len() as u64, ob.h) };
        inner.check(st, if gelu { "gelu_mul" } else { "silu_mul" })?;
        ob.read(out)
    }
}
