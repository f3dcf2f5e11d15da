//! The tiny model's prompts through the cpu device and the simulated `tt` device, every
//! device op recorded: on AVX-512 VNNI, where the cpu device computes llama.cpp's float
//! orders as the reference forward and `tt` do (docs/parity.md), every op's inputs and
//! outputs are the same bits on both, in the same order. A failure names the first op
//! that differs, the place to look when the logits of the two part
//! (`tt_numerics.rs` compares only those).

mod flint_common;
mod tt_common;

use std::sync::{Arc, Mutex};

use flint_engine::forward::{DeviceModel, Session};
use flint_hal::{
    DeltaNetShape, Device, DeviceCounters, DeviceOptions, DeviceRef, GgmlType, HalError,
    IndexTensor, IndexView, IndexViewMut, KvBuffer, KvLayout, Op, PagedAttention, RopeParams,
    RoutingConfig, StagingPlan, Tensor, TransferCounter, Transfers, View, ViewMut, Weight,
    WeightDesc, WeightHandle,
};
use flint_hal_tt::TtDevice;

/// Every op of a forward in call order: its name and shape, and the slices it read and
/// wrote.
type Log = Arc<Mutex<Vec<(String, Vec<Vec<f32>>)>>>;

/// A device that forwards every op to `inner` and records it in `log`. Tensors are
/// `inner`'s (allocation, uploads, downloads and copies are forwarded); what it reads
/// back to record device tensors it counts apart, in `reads`, and leaves out of
/// [`transfers`](Device::transfers).
#[derive(Debug)]
struct Rec {
    inner: DeviceRef,
    log: Log,
    /// This wrapper's own traffic: the downloads that record device tensors.
    reads: TransferCounter,
}

impl Rec {
    fn push(&self, op: &str, v: Vec<Vec<f32>>) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((op.to_string(), v));
    }

    /// The values of a view, read back from `inner` when they live on it.
    fn read(&self, v: View<'_>) -> Vec<f32> {
        if let Some(h) = v.as_host() {
            return h.to_vec();
        }
        self.reads.download(v.len());
        let mut h = vec![0f32; v.len()];
        self.inner
            .download(v, &mut h)
            .expect("reading a device tensor back to record it");
        h
    }
}

impl Rec {
    /// An op's index list as floats, read back from `inner` when it lives there.
    fn ids_f(&self, ids: IndexView<'_>) -> Vec<f32> {
        let mut h = vec![0u32; ids.len()];
        match ids.as_host() {
            Some(s) => h.copy_from_slice(s),
            None => {
                self.reads.download(ids.len());
                self.inner
                    .download_indices(ids, &mut h)
                    .expect("reading a device index list back to record it");
            }
        }
        h.iter().map(|&i| i as f32).collect()
    }
}

impl Device for Rec {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> String {
        self.inner.description()
    }
    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        self.inner.supports(op, ty)
    }
    fn alloc(&self, len: usize) -> Result<Tensor, HalError> {
        self.inner.alloc(len)
    }
    fn upload_indices(&self, src: Vec<u32>) -> Result<IndexTensor, HalError> {
        self.inner.upload_indices(src)
    }
    fn alloc_indices(&self, len: usize) -> Result<IndexTensor, HalError> {
        self.inner.alloc_indices(len)
    }
    fn download_indices(&self, src: IndexView<'_>, dst: &mut [u32]) -> Result<(), HalError> {
        self.inner.download_indices(src, dst)
    }
    /// `inner`'s counter: the uploads and downloads are `inner`'s.
    fn transfer_counter(&self) -> &TransferCounter {
        self.inner.transfer_counter()
    }
    /// `inner`'s traffic less the recording's own downloads (which go through `inner`):
    /// what the engine moved.
    fn transfers(&self) -> Transfers {
        self.inner.transfers().since(&self.reads.get())
    }
    fn upload(&self, src: &[f32], dst: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.upload(src, dst)
    }
    fn upload_new(&self, src: &[f32]) -> Result<Tensor, HalError> {
        self.inner.upload_new(src)
    }
    fn download(&self, src: View<'_>, dst: &mut [f32]) -> Result<(), HalError> {
        self.inner.download(src, dst)
    }
    fn download_tensor(&self, t: Tensor) -> Result<Vec<f32>, HalError> {
        self.inner.download_tensor(t)
    }
    /// Not recorded: the engine moves data with `copy` where a tensor lives on a device
    /// and in place where it is host memory (zeroing a buffer, say), so copies are not
    /// the same on both; what they move is checked as the next op's input.
    fn copy(&self, src: View<'_>, dst: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.copy(src, dst)
    }
    fn plan(&self, weights: &[WeightDesc], other_bytes: u64) -> Result<StagingPlan, HalError> {
        self.inner.plan(weights, other_bytes)
    }
    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        self.inner.stage(desc)
    }
    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.matmul(w, x, m, out.reborrow());
        self.push(
            &format!("matmul {} m={m}", w.info().name),
            vec![self.read(x), self.read(out.as_view())],
        );
        r
    }
    fn matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        m: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let r = self.inner.matmul_multi(ws, x, m, outs);
        let names: Vec<String> = ws.iter().map(|w| w.info().name.clone()).collect();
        let mut v = vec![self.read(x)];
        v.extend(outs.iter().map(|o| self.read(o.as_view())));
        self.push(&format!("matmul_multi {names:?} m={m}"), v);
        r
    }
    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.expert_matmul(w, x, ids, out.reborrow());
        self.push(
            &format!("expert_matmul {}", w.info().name),
            vec![self.read(x), self.ids_f(ids), self.read(out.as_view())],
        );
        r
    }
    fn expert_matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        ids: IndexView<'_>,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let r = self.inner.expert_matmul_multi(ws, x, ids, outs);
        let names: Vec<String> = ws.iter().map(|w| w.info().name.clone()).collect();
        let mut v = vec![self.read(x), self.ids_f(ids)];
        v.extend(outs.iter().map(|o| self.read(o.as_view())));
        self.push(&format!("expert_matmul_multi {names:?}"), v);
        r
    }
    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.get_rows(w, ids, out.reborrow());
        self.push("get_rows", vec![self.ids_f(ids), self.read(out.as_view())]);
        r
    }
    fn rms_norm(
        &self,
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.rms_norm(x, weight, eps, dim, out.reborrow());
        self.push(
            &format!("rms_norm dim={dim}"),
            vec![self.read(x), self.read(out.as_view())],
        );
        r
    }
    fn add_rms_norm(
        &self,
        mut residual: ViewMut<'_>,
        delta: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let before = self.read(residual.as_view());
        let r =
            self.inner
                .add_rms_norm(residual.reborrow(), delta, weight, eps, dim, out.reborrow());
        self.push(
            &format!("add_rms_norm dim={dim}"),
            vec![
                before,
                self.read(delta),
                self.read(residual.as_view()),
                self.read(out.as_view()),
            ],
        );
        r
    }
    fn rope(
        &self,
        mut x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let before = self.read(x.as_view());
        let r = self.inner.rope(x.reborrow(), positions, p);
        self.push(
            &format!("rope {:?}", self.ids_f(positions)),
            vec![before, self.read(x.as_view())],
        );
        r
    }
    fn silu_mul(&self, gate: View<'_>, up: View<'_>, mut out: ViewMut<'_>) -> Result<(), HalError> {
        let r = self.inner.silu_mul(gate, up, out.reborrow());
        self.push(
            "silu_mul",
            vec![self.read(gate), self.read(up), self.read(out.as_view())],
        );
        r
    }
    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, mut out: ViewMut<'_>) -> Result<(), HalError> {
        let r = self.inner.gelu_mul(gate, up, out.reborrow());
        self.push("gelu_mul", vec![self.read(out.as_view())]);
        r
    }
    fn swiglu_oai_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.swiglu_oai_mul(gate, up, out.reborrow());
        self.push("swiglu", vec![self.read(out.as_view())]);
        r
    }
    fn add(&self, mut acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        let r = self.inner.add(acc.reborrow(), x);
        self.push("add", vec![self.read(acc.as_view())]);
        r
    }
    fn add_bias(&self, mut x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        let r = self.inner.add_bias(x.reborrow(), bias);
        self.push("add_bias", vec![self.read(x.as_view())]);
        r
    }
    fn scale(&self, mut x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        let r = self.inner.scale(x.reborrow(), s);
        self.push("scale", vec![self.read(x.as_view())]);
        r
    }
    fn add_id(
        &self,
        mut x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        let before = self.read(x.as_view());
        let r = self.inner.add_id(x.reborrow(), table, ids, dim);
        self.push(
            "add_id",
            vec![
                before,
                self.read(table),
                self.ids_f(ids),
                self.read(x.as_view()),
            ],
        );
        r
    }
    fn scatter_add_weighted(
        &self,
        mut acc: ViewMut<'_>,
        x: View<'_>,
        weights: View<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        let before = self.read(acc.as_view());
        let r = self
            .inner
            .scatter_add_weighted(acc.reborrow(), x, weights, dim);
        self.push(
            "scatter_add_weighted",
            vec![
                before,
                self.read(x),
                self.read(weights),
                self.read(acc.as_view()),
            ],
        );
        r
    }
    #[allow(clippy::too_many_arguments)]
    fn route_topk(
        &self,
        logits: View<'_>,
        n_experts: usize,
        bias: Option<View<'_>>,
        expert_scale: Option<View<'_>>,
        cfg: &RoutingConfig,
        mut ids: IndexViewMut<'_>,
        mut weights: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.route_topk(
            logits,
            n_experts,
            bias,
            expert_scale,
            cfg,
            ids.reborrow(),
            weights.reborrow(),
        );
        self.push(
            &format!("route_topk {cfg:?}"),
            vec![
                self.read(logits),
                self.ids_f(ids.as_view()),
                self.read(weights.as_view()),
            ],
        );
        r
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
        state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        self.inner
            .gated_delta_net(shape, q, k, v, g, beta, state, out)
    }
    fn sigmoid(&self, x: ViewMut<'_>) -> Result<(), HalError> {
        self.inner.sigmoid(x)
    }
    fn mul(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
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
        self.inner.l2_norm(x, dim, eps)
    }
    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError> {
        self.inner.alloc_kv(layout)
    }
    fn kv_bytes_per_value(&self) -> usize {
        self.inner.kv_bytes_per_value()
    }
    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.write_kv(kv, k, v, slots);
        self.push(
            "write_kv",
            vec![self.read(k), self.read(v), self.ids_f(slots)],
        );
        r
    }
    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        mut out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let r = self.inner.paged_attention(kv, p, out.reborrow());
        self.push(
            &format!("paged_attention h={} w={:?}", p.n_heads, p.window),
            vec![self.read(p.q), self.read(out.as_view())],
        );
        r
    }
    fn counters(&self) -> DeviceCounters {
        self.inner.counters()
    }
}

/// The ops of `model`'s forward over `prompt` (one prefill step, one decode step) on `dev`.
fn record(dev: DeviceRef, model: &flint_engine::model::Model, prompt: &[u32]) -> Log {
    let log: Log = Arc::default();
    let rec: DeviceRef = Arc::new(Rec {
        inner: dev,
        log: log.clone(),
        reads: TransferCounter::default(),
    });
    let dm = DeviceModel::stage(model, rec, &mut |_, _| {}).expect("the model stages");
    let mut s = Session::new(&dm, prompt.len() + 2).expect("session");
    let logits = s.feed(prompt, false).expect("prefill");
    let next = flint_engine::sample::argmax(&logits) as u32;
    s.feed(&[next], false).expect("decode");
    log
}

#[test]
fn cpu_and_tt_agree_op_by_op_on_tiny() {
    let Some(lib) = tt_common::sim_library() else {
        return;
    };
    if flint_hal_cpu::SimdLevel::from_env().expect("FLINT_CPU_SIMD")
        != flint_hal_cpu::SimdLevel::Avx512Vnni
    {
        eprintln!("the cpu device is below AVX-512 VNNI: its sums are its own, not compared");
        return;
    }
    let model = flint_common::tiny();
    let vocab = model.spec.vocab;
    let opts = DeviceOptions {
        keep_quant: true,
        ..DeviceOptions::default()
    };
    // The prompts of `tt_numerics.rs` (the Flint gate's): 20 tokens route 13 rows to one
    // expert, 12 and 9 fewer.
    for (seed, len) in [(1, 12), (2, 20), (3, 9)] {
        let p = flint_common::prompt(seed, len, vocab);
        let cpu = flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
        let tt: DeviceRef =
            Arc::new(TtDevice::open_path(&lib, &opts).expect("the simulated tt device opens"));
        let a = record(cpu, &model, &p);
        let b = record(tt, &model, &p);
        let a = a.lock().unwrap_or_else(|e| e.into_inner());
        let b = b.lock().unwrap_or_else(|e| e.into_inner());
        for (i, ((na, va), (nb, vb))) in a.iter().zip(b.iter()).enumerate() {
            assert_eq!(na, nb, "{len}-token prompt, op {i}: different ops");
            for (j, (x, y)) in va.iter().zip(vb).enumerate() {
                assert_eq!(
                    x.len(),
                    y.len(),
                    "{len}-token prompt, op {i} {na}: part {j} length"
                );
                let diff: Vec<usize> = (0..x.len())
                    .filter(|&k| x[k].to_bits() != y[k].to_bits())
                    .collect();
                if let Some(&k) = diff.first() {
                    panic!(
                        "{len}-token prompt: op {i} {na} (part {j}) differs at {} of {} \
                         values, first [{k}]: cpu {:e}, tt {:e}",
                        diff.len(),
                        x.len(),
                        x[k],
                        y[k]
                    );
                }
            }
        }
        // After the common prefix, so that a missing or extra op is named above.
        assert_eq!(a.len(), b.len(), "{len}-token prompt: op counts");
        eprintln!(
            "{len}-token prompt: {} ops, every one the same bits",
            a.len()
        );
    }
}
