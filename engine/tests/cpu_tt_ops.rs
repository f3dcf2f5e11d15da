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
    DeltaNetShape, Device, DeviceCounters, DeviceOptions, DeviceRef, ExpertRow, GgmlType, HalError,
    KvBuffer, KvLayout, Op, PagedAttention, RopeParams, RoutingConfig, StagingPlan, Weight,
    WeightDesc, WeightHandle,
};
use flint_hal_tt::TtDevice;

/// Every op of a forward in call order: its name and shape, and the slices it read and
/// wrote.
type Log = Arc<Mutex<Vec<(String, Vec<Vec<f32>>)>>>;

/// A device that forwards every op to `inner` and records it in `log`.
#[derive(Debug)]
struct Rec {
    inner: DeviceRef,
    log: Log,
}

impl Rec {
    fn push(&self, op: &str, v: Vec<Vec<f32>>) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((op.to_string(), v));
    }
}

fn ids_f(ids: &[u32]) -> Vec<f32> {
    ids.iter().map(|&i| i as f32).collect()
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
    fn plan(&self, weights: &[WeightDesc]) -> Result<StagingPlan, HalError> {
        self.inner.plan(weights)
    }
    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        self.inner.stage(desc)
    }
    fn matmul(&self, w: &dyn Weight, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), HalError> {
        let r = self.inner.matmul(w, x, m, out);
        self.push(
            &format!("matmul {} m={m}", w.info().name),
            vec![x.to_vec(), out.to_vec()],
        );
        r
    }
    fn matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        let r = self.inner.matmul_multi(ws, x, m, outs);
        let names: Vec<String> = ws.iter().map(|w| w.info().name.clone()).collect();
        let mut v = vec![x.to_vec()];
        v.extend(outs.iter().map(|o| o.to_vec()));
        self.push(&format!("matmul_multi {names:?} m={m}"), v);
        r
    }
    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: &[f32],
        rows: &[ExpertRow],
        out: &mut [f32],
    ) -> Result<(), HalError> {
        let r = self.inner.expert_matmul(w, x, rows, out);
        let ex: Vec<f32> = rows.iter().map(|r| r.expert as f32).collect();
        let ir: Vec<f32> = rows.iter().map(|r| r.input_row as f32).collect();
        self.push(
            &format!("expert_matmul {}", w.info().name),
            vec![x.to_vec(), ex, ir, out.to_vec()],
        );
        r
    }
    fn expert_matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        rows: &[ExpertRow],
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        let r = self.inner.expert_matmul_multi(ws, x, rows, outs);
        let names: Vec<String> = ws.iter().map(|w| w.info().name.clone()).collect();
        let ex: Vec<f32> = rows.iter().map(|r| r.expert as f32).collect();
        let ir: Vec<f32> = rows.iter().map(|r| r.input_row as f32).collect();
        let mut v = vec![x.to_vec(), ex, ir];
        v.extend(outs.iter().map(|o| o.to_vec()));
        self.push(&format!("expert_matmul_multi {names:?}"), v);
        r
    }
    fn get_rows(&self, w: &dyn Weight, ids: &[u32], out: &mut [f32]) -> Result<(), HalError> {
        let r = self.inner.get_rows(w, ids, out);
        self.push("get_rows", vec![ids_f(ids), out.to_vec()]);
        r
    }
    fn rms_norm(
        &self,
        x: &[f32],
        weight: Option<&[f32]>,
        eps: f32,
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        let r = self.inner.rms_norm(x, weight, eps, dim, out);
        self.push(
            &format!("rms_norm dim={dim}"),
            vec![x.to_vec(), out.to_vec()],
        );
        r
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
        let before = residual.to_vec();
        let r = self
            .inner
            .add_rms_norm(residual, delta, weight, eps, dim, out);
        self.push(
            &format!("add_rms_norm dim={dim}"),
            vec![before, delta.to_vec(), residual.to_vec(), out.to_vec()],
        );
        r
    }
    fn rope(&self, x: &mut [f32], positions: &[u32], p: &RopeParams<'_>) -> Result<(), HalError> {
        let before = x.to_vec();
        let r = self.inner.rope(x, positions, p);
        self.push(&format!("rope {:?}", positions), vec![before, x.to_vec()]);
        r
    }
    fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        let r = self.inner.silu_mul(gate, up, out);
        self.push("silu_mul", vec![gate.to_vec(), up.to_vec(), out.to_vec()]);
        r
    }
    fn gelu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        let r = self.inner.gelu_mul(gate, up, out);
        self.push("gelu_mul", vec![out.to_vec()]);
        r
    }
    fn swiglu_oai_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), HalError> {
        let r = self.inner.swiglu_oai_mul(gate, up, out);
        self.push("swiglu", vec![out.to_vec()]);
        r
    }
    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), HalError> {
        let r = self.inner.add(acc, x);
        self.push("add", vec![acc.to_vec()]);
        r
    }
    fn add_bias(&self, x: &mut [f32], bias: &[f32]) -> Result<(), HalError> {
        let r = self.inner.add_bias(x, bias);
        self.push("add_bias", vec![x.to_vec()]);
        r
    }
    fn scale(&self, x: &mut [f32], s: f32) -> Result<(), HalError> {
        let r = self.inner.scale(x, s);
        self.push("scale", vec![x.to_vec()]);
        r
    }
    fn scatter_add_weighted(
        &self,
        acc: &mut [f32],
        x: &[f32],
        rows: &[u32],
        weights: &[f32],
        dim: usize,
    ) -> Result<(), HalError> {
        let before = acc.to_vec();
        let r = self.inner.scatter_add_weighted(acc, x, rows, weights, dim);
        self.push(
            "scatter_add_weighted",
            vec![
                before,
                x.to_vec(),
                ids_f(rows),
                weights.to_vec(),
                acc.to_vec(),
            ],
        );
        r
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
        let r = self
            .inner
            .route_topk(logits, n_experts, bias, cfg, ids, weights);
        self.push(
            &format!("route_topk {cfg:?}"),
            vec![logits.to_vec(), ids_f(ids), weights.to_vec()],
        );
        r
    }
    fn ssm_conv_silu(
        &self,
        x: &[f32],
        weight: &[f32],
        d_conv: usize,
        state: &mut [f32],
        out: &mut [f32],
    ) -> Result<(), HalError> {
        self.inner.ssm_conv_silu(x, weight, d_conv, state, out)
    }
    fn gated_delta_net(
        &self,
        shape: &DeltaNetShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        state: &mut [f32],
        out: &mut [f32],
    ) -> Result<(), HalError> {
        self.inner
            .gated_delta_net(shape, q, k, v, g, beta, state, out)
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
        k: &[f32],
        v: &[f32],
        slots: &[u32],
    ) -> Result<(), HalError> {
        let r = self.inner.write_kv(kv, k, v, slots);
        self.push("write_kv", vec![k.to_vec(), v.to_vec(), ids_f(slots)]);
        r
    }
    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        let r = self.inner.paged_attention(kv, p, out);
        self.push(
            &format!("paged_attention h={} w={:?}", p.n_heads, p.window),
            vec![p.q.to_vec(), out.to_vec()],
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
        assert_eq!(a.len(), b.len(), "{len}-token prompt: op counts");
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
        eprintln!(
            "{len}-token prompt: {} ops, every one the same bits",
            a.len()
        );
    }
}
