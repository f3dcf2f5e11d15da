//! Deliberately broken devices: each delegates to a working device and injects exactly
//! one defect, so a test can check that the suite catches it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use flint_conformance::registry;
use flint_hal::{
    AttnSeq, DeltaNetShape, Device, DeviceOptions, DeviceRef, GgmlType, HalError, IndexView,
    IndexViewMut, KvBuffer, KvLayout, Op, PagedAttention, RopeKind, RopeParams, RoutingConfig,
    TransferCounter, View, ViewMut, Weight, WeightDesc, WeightHandle, WeightSource, NO_BLOCK,
};

/// The defect a [`Broken`] device injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// None: a transparent wrapper (the control).
    None,
    /// The attention sink contributes `exp(0)` instead of `exp(sink - m_final)`.
    SinkExp0,
    /// `add_rms_norm` leaves the residual with the old residual added a second time
    /// (the normed output stays right).
    ResidualTwice,
    /// A per-head `rms_norm` done in place whose input view of head `h > 0` starts one
    /// element early, inside the previous head's already-normalised output.
    PerHeadNormView,
    /// `write_kv` reuses the first slot mapping it saw for every later call of the same
    /// size, whichever KV buffer (group) it writes.
    SharedSlotMapping,
    /// `paged_attention` reuses the block tables of the first call for every later call,
    /// whichever KV buffer (group) it reads.
    SharedBlockTable,
    /// Q6_K sub-block `i` is scaled by `scales[i + 1]` (an off-by-one in the scale
    /// index).
    Q6kScaleOffByOne,
    /// `matmul` drops the remainder of a tile of 4 output features: when `out` is not
    /// a multiple of 4 wide, the last `out % 4` features of each row are never written.
    TileRemainder,
    /// `stage` reads the tensor from the start of the shared buffer instead of its
    /// range (a zero-copy backend that forgets the tensor's offset in the mmap).
    IgnoresRangeStart,
    /// `rope` pairs every head as NeoX, whatever the parameters ask.
    RopeAlwaysNeox,
    /// `rope` ignores the frequency factors.
    RopeIgnoresFactors,
    /// `rope` drops YaRN's magnitude correction (`mscale` stays `attn_factor`).
    RopeNoYarnMscale,
    /// `add_bias` adds the bias to the first row only.
    BiasFirstRowOnly,
    /// `gated_delta_net` starts every call from a zero state instead of the carried one
    /// (a backend that keeps no state between the calls of a chunked prefill).
    DeltaStateNotCarried,
    /// `scale` takes its tensor to the host and back (a device that computes an op on
    /// the host): a download and an upload for each call.
    ScaleOnHost,
    /// `upload` moves its values in two calls of half each.
    UploadInHalves,
    /// `copy` leaves the last value of the destination unwritten.
    CopyOneShort,
    /// `route_topk` drops the per-expert output scale.
    ExpertScaleIgnored,
    /// `scatter_add_weighted` sends routed row `i` to token `i % tokens` (interleaved)
    /// instead of `i / fanout` (each token's rows one after another).
    ScatterInterleaved,
    /// `expert_matmul` reads every routed row from the first token's row.
    ExpertFirstToken,
    /// `l2_norm` normalises each row of heads as one vector.
    L2NormWholeRow,
    /// `mul` multiplies element by element, reading a per-row `x` as if it were as long
    /// as `acc` (wrapping around).
    MulNoBroadcast,
    /// Claims nothing at all.
    SupportsNothing,
}

/// A device that delegates to `inner` except for its one [`Defect`]. Its tensors are
/// host memory (the trait's defaults), as the cpu device's are, so that the views it
/// hands on are the inner device's own; it counts its own transfers.
pub struct Broken {
    inner: DeviceRef,
    defect: Defect,
    transfers: TransferCounter,
    /// `SharedSlotMapping`: the first mapping seen, per number of tokens.
    slots: Mutex<HashMap<usize, Vec<u32>>>,
    /// `SharedBlockTable`: the first tables seen, per sequence index.
    tables: Mutex<HashMap<usize, Vec<u32>>>,
    /// `SinkExp0`: a host copy of the keys written to each buffer, by buffer address.
    keys: Mutex<HashMap<usize, Vec<f32>>>,
}

impl fmt::Debug for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Broken({:?} over {})", self.defect, self.inner.name())
    }
}

/// The working device the broken ones wrap: `cpu`, which every build has.
pub fn cpu() -> DeviceRef {
    registry()
        .open("cpu", &DeviceOptions::default())
        .expect("the cpu backend opens in every build")
}

impl Broken {
    /// `defect` over the cpu device.
    pub fn over_cpu(defect: Defect) -> Arc<Self> {
        Arc::new(Self {
            inner: cpu(),
            defect,
            transfers: TransferCounter::default(),
            slots: Mutex::new(HashMap::new()),
            tables: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
        })
    }
}

fn buffer_id(kv: &dyn KvBuffer) -> usize {
    kv.as_any() as *const dyn std::any::Any as *const u8 as usize
}

impl Device for Broken {
    fn name(&self) -> &str {
        "broken"
    }

    fn description(&self) -> String {
        format!("{self:?}")
    }

    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        self.defect != Defect::SupportsNothing && self.inner.supports(op, ty)
    }

    fn transfer_counter(&self) -> &TransferCounter {
        &self.transfers
    }

    fn upload(&self, src: &[f32], dst: ViewMut<'_>) -> Result<(), HalError> {
        if self.defect == Defect::UploadInHalves && src.len() > 1 {
            let h = src.len() / 2;
            let (a, b) = dst.split_at(h);
            self.transfers.upload(h);
            self.transfers.upload(src.len() - h);
            a.host().copy_from_slice(&src[..h]);
            b.host().copy_from_slice(&src[h..]);
            return Ok(());
        }
        self.transfers.upload(src.len());
        dst.host().copy_from_slice(src);
        Ok(())
    }

    fn copy(&self, src: View<'_>, dst: ViewMut<'_>) -> Result<(), HalError> {
        if self.defect == Defect::CopyOneShort && !src.is_empty() {
            let n = src.len() - 1;
            return self.inner.copy(src.slice(0..n), dst.into_slice(0..n));
        }
        self.inner.copy(src, dst)
    }

    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        if self.defect == Defect::Q6kScaleOffByOne && desc.ty == GgmlType::Q6_K {
            // Rewrite every block so that sub-block i carries scale i + 1: exactly what
            // a kernel reading `scales[is + 1]` computes.
            let mut bytes = desc.data.as_slice().to_vec();
            let ts = GgmlType::Q6_K.type_size();
            if bytes.len().is_multiple_of(ts) {
                for b in bytes.chunks_exact_mut(ts) {
                    let sc = &mut b[192..208];
                    for i in 0..15 {
                        sc[i] = sc[i + 1];
                    }
                }
            }
            let mut d = desc.clone();
            d.data = WeightSource::from_vec(bytes);
            return self.inner.stage(&d);
        }
        if self.defect == Defect::IgnoresRangeStart {
            let len = desc.data.len();
            let mut d = desc.clone();
            d.data = WeightSource::new(desc.data.shared().clone(), 0..len)?;
            return self.inner.stage(&d);
        }
        self.inner.stage(desc)
    }

    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::TileRemainder {
            let out = out.host();
            let mut tmp = vec![0.0f32; out.len()];
            self.inner.matmul(w, x, m, (&mut tmp[..]).into())?;
            let n = out.len() / m;
            let whole = n - n % 4;
            for (o, t) in out.chunks_exact_mut(n).zip(tmp.chunks_exact(n)) {
                o[..whole].copy_from_slice(&t[..whole]);
            }
            return Ok(());
        }
        self.inner.matmul(w, x, m, out)
    }

    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::ExpertFirstToken {
            // Every token's row replaced by the first token's.
            let (x, k) = (x.host(), w.info().dims[0]);
            let first: Vec<f32> = x[..k].repeat(x.len() / k);
            return self.inner.expert_matmul(w, (&first[..]).into(), ids, out);
        }
        self.inner.expert_matmul(w, x, ids, out)
    }

    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        self.inner.add_id(x, table, ids, dim)
    }

    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.inner.get_rows(w, ids, out)
    }

    fn rms_norm(
        &self,
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::PerHeadNormView && x.len() > dim {
            let (x, out) = (x.host(), out.host());
            out.copy_from_slice(x);
            for h in 0..x.len() / dim {
                let start = h * dim;
                let view = if h == 0 { 0 } else { start - 1 };
                let input = out[view..view + dim].to_vec();
                self.inner.rms_norm(
                    (&input[..]).into(),
                    weight,
                    eps,
                    dim,
                    (&mut out[start..start + dim]).into(),
                )?;
            }
            return Ok(());
        }
        self.inner.rms_norm(x, weight, eps, dim, out)
    }

    fn add_rms_norm(
        &self,
        mut residual: ViewMut<'_>,
        delta: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::ResidualTwice {
            let old = residual.as_view().host().to_vec();
            self.inner
                .add_rms_norm(residual.reborrow(), delta, weight, eps, dim, out)?;
            // The output is right (and rmsnorm would hide a doubled residual anyway);
            // only the live residual buffer shows the defect.
            return self.inner.add(residual, (&old[..]).into());
        }
        self.inner
            .add_rms_norm(residual, delta, weight, eps, dim, out)
    }

    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let mut q = *p;
        match self.defect {
            Defect::RopeAlwaysNeox => q.kind = RopeKind::Neox,
            Defect::RopeIgnoresFactors => q.freq_factors = None,
            Defect::RopeNoYarnMscale => {
                // Folding the correction 1 + 0.1 ln(1/s) back out of attn_factor.
                if let Some(y) = q.yarn.as_mut().filter(|y| y.ext_factor != 0.0) {
                    y.attn_factor /= 1.0 + 0.1 * (1.0 / q.freq_scale).ln();
                }
            }
            _ => {}
        }
        self.inner.rope(x, positions, &q)
    }

    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        if self.defect == Defect::BiasFirstRowOnly && x.len() > bias.len() {
            return self.inner.add_bias(x.into_slice(0..bias.len()), bias);
        }
        self.inner.add_bias(x, bias)
    }

    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.silu_mul(gate, up, out)
    }

    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.gelu_mul(gate, up, out)
    }

    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        self.inner.add(acc, x)
    }

    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        if self.defect == Defect::ScaleOnHost {
            self.transfers.download(x.len());
            self.transfers.upload(x.len());
        }
        self.inner.scale(x, s)
    }

    fn scatter_add_weighted(
        &self,
        acc: ViewMut<'_>,
        x: View<'_>,
        weights: View<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        if self.defect == Defect::ScatterInterleaved {
            let (acc, x, w) = (acc.host(), x.host(), weights.host());
            let tokens = acc.len() / dim;
            for (i, (&wt, xr)) in w.iter().zip(x.chunks_exact(dim)).enumerate() {
                let r = i % tokens;
                for (a, &v) in acc[r * dim..(r + 1) * dim].iter_mut().zip(xr) {
                    *a += wt * v;
                }
            }
            return Ok(());
        }
        self.inner.scatter_add_weighted(acc, x, weights, dim)
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
        let expert_scale = if self.defect == Defect::ExpertScaleIgnored {
            None
        } else {
            expert_scale
        };
        self.inner
            .route_topk(logits, n_experts, bias, expert_scale, cfg, ids, weights)
    }

    fn ssm_conv_silu(
        &self,
        x: View<'_>,
        weight: View<'_>,
        d_conv: usize,
        state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.inner.ssm_conv_silu(x, weight, d_conv, state, out)
    }

    fn gated_delta_net(
        &self,
        shape: &DeltaNetShape,
        q: View<'_>,
        k: View<'_>,
        v: View<'_>,
        g: View<'_>,
        beta: View<'_>,
        mut state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::DeltaStateNotCarried {
            state.reborrow().host().fill(0.0);
        }
        self.inner
            .gated_delta_net(shape, q, k, v, g, beta, state, out)
    }

    fn sigmoid(&self, x: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.sigmoid(x)
    }
    fn mul(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        if self.defect == Defect::MulNoBroadcast && x.len() < acc.len() {
            let x = x.host();
            let wrapped: Vec<f32> = (0..acc.len()).map(|i| x[i % x.len()]).collect();
            return self.inner.mul(acc, (&wrapped[..]).into());
        }
        self.inner.mul(acc, x)
    }
    fn deinterleave(
        &self,
        src: View<'_>,
        chunk: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        self.inner.deinterleave(src, chunk, outs)
    }
    fn delta_net_gate(
        &self,
        alpha: ViewMut<'_>,
        dt_bias: View<'_>,
        a: View<'_>,
    ) -> Result<(), HalError> {
        self.inner.delta_net_gate(alpha, dt_bias, a)
    }
    fn l2_norm(&self, x: ViewMut<'_>, dim: usize, eps: f32) -> Result<(), HalError> {
        if self.defect == Defect::L2NormWholeRow {
            let len = x.len();
            return self.inner.l2_norm(x, len, eps);
        }
        self.inner.l2_norm(x, dim, eps)
    }
    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError> {
        self.inner.alloc_kv(layout)
    }

    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError> {
        let slots = slots.host();
        match self.defect {
            Defect::SharedSlotMapping => {
                let used = self
                    .slots
                    .lock()
                    .expect("slot cache")
                    .entry(slots.len())
                    .or_insert_with(|| slots.to_vec())
                    .clone();
                self.inner.write_kv(kv, k, v, (&used).into())
            }
            Defect::SinkExp0 => {
                let l = *kv.layout();
                let row = l.n_kv_heads * l.head_dim_k;
                let mut keys = self.keys.lock().expect("key shadow");
                let shadow = keys
                    .entry(buffer_id(kv))
                    .or_insert_with(|| vec![0.0; l.num_slots() * row]);
                for (i, &s) in slots.iter().enumerate() {
                    let s = s as usize;
                    shadow[s * row..(s + 1) * row]
                        .copy_from_slice(&k.host()[i * row..(i + 1) * row]);
                }
                drop(keys);
                self.inner.write_kv(kv, k, v, slots.into())
            }
            _ => self.inner.write_kv(kv, k, v, slots.into()),
        }
    }

    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        if self.defect == Defect::SharedBlockTable {
            let tables: Vec<Vec<u32>> = {
                let mut cache = self.tables.lock().expect("table cache");
                p.seqs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        cache
                            .entry(i)
                            .or_insert_with(|| s.block_table.host().to_vec())
                            .clone()
                    })
                    .collect()
            };
            let seqs: Vec<AttnSeq<'_>> = p
                .seqs
                .iter()
                .zip(&tables)
                .map(|(s, t)| AttnSeq {
                    block_table: t.into(),
                    ..*s
                })
                .collect();
            let q = PagedAttention { seqs: &seqs, ..*p };
            return self.inner.paged_attention(kv, &q, out);
        }
        let sinks = match (self.defect, p.sinks) {
            (Defect::SinkExp0, Some(s)) => s.host(),
            _ => return self.inner.paged_attention(kv, p, out),
        };
        // The defect: the sink term is exp(0) = 1 instead of exp(sink - m_final).
        // Handing the working kernel a sink equal to m_final (the largest of the sink
        // and the visible scores) for each row gives exactly that denominator.
        let l = *kv.layout();
        let (hq, dk, dv, bs) = (p.n_heads, l.head_dim_k, l.head_dim_v, l.block_size);
        let group = hq / l.n_kv_heads;
        let keys = self.keys.lock().expect("key shadow");
        let shadow = keys
            .get(&buffer_id(kv))
            .ok_or_else(|| HalError::runtime("broken device: attention before any write"))?;
        for seq in p.seqs {
            for (r, &pos) in seq.positions.host().iter().enumerate() {
                let row = seq.q_start + r;
                let q = p.q.slice(row * hq * dk..(row + 1) * hq * dk);
                let qs = q.host();
                let lo = flint_core::math::window_start(pos as usize, p.window);
                let mut m_final = sinks.to_vec();
                for (h, m) in m_final.iter_mut().enumerate() {
                    let g = h / group;
                    for j in lo..=pos as usize {
                        let block = seq.block_table.host()[j / bs];
                        if block == NO_BLOCK {
                            continue;
                        }
                        let slot = block as usize * bs + j % bs;
                        let kj = &shadow[(slot * l.n_kv_heads + g) * dk..][..dk];
                        let qh = &qs[h * dk..(h + 1) * dk];
                        let s: f32 = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * p.scale;
                        *m = m.max(s);
                    }
                }
                let one = [AttnSeq {
                    q_start: 0,
                    positions: std::slice::from_ref(&seq.positions.host()[r]).into(),
                    block_table: seq.block_table,
                }];
                let single = PagedAttention {
                    q,
                    seqs: &one,
                    sinks: Some((&m_final[..]).into()),
                    ..*p
                };
                self.inner.paged_attention(
                    kv,
                    &single,
                    out.slice_mut(row * hq * dv..(row + 1) * hq * dv),
                )?;
            }
        }
        Ok(())
    }
}
