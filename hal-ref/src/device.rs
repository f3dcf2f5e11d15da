//! The reference device and its `Device` implementation: one method per op, each
//! computed by the `flint-core` scalar kernel named in its comment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flint_core::math;
use flint_core::GgmlType;
use flint_hal::{
    fanout, DeltaNetShape, Device, DeviceCounters, DeviceOptions, HalError, IndexView,
    IndexViewMut, KvBuffer, KvLayout, Op, PagedAttention, RopeParams, RoutingConfig, StagingPlan,
    TransferCounter, View, ViewMut, Weight, WeightDesc, WeightHandle,
};

use crate::kv::{self, RefKv};
use crate::weight::{self, fmt_err, RefWeight};

/// The reference device: no state but its dispatch and transfer counters. Its tensors
/// are host memory (the trait's defaults for `alloc`, `upload`, `download`, `download_tensor`
/// and `copy`); ops read and write their views in place.
#[derive(Debug, Default)]
pub struct RefDevice {
    block_dispatches: AtomicU64,
    float_dispatches: AtomicU64,
    transfers: TransferCounter,
}

impl RefDevice {
    /// Opens the device. It has one thread and keeps every encoding as it is, so
    /// neither `threads` nor `keep_quant` of `opts` changes anything.
    pub fn new(opts: &DeviceOptions) -> Self {
        let _ = opts;
        Self::default()
    }

    /// The concrete weight behind a handle; a handle from another device is a caller
    /// bug and panics (as the HAL documents).
    fn weight<'a>(&self, w: &'a dyn Weight) -> &'a RefWeight {
        w.as_any()
            .downcast_ref::<RefWeight>()
            .expect("weight was not staged by the ref device")
    }

    /// Counts one matmul: from block encodings or from float weights
    /// ([`DeviceCounters`]).
    fn count(&self, ty: GgmlType) {
        let c = if ty.is_quantized() {
            &self.block_dispatches
        } else {
            &self.float_dispatches
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Asserts that the three slices of an element-wise op have one length.
fn same_len(op: &str, a: &[f32], b: &[f32], out: &[f32]) {
    assert!(
        a.len() == b.len() && b.len() == out.len(),
        "{op}: lengths {}, {}, {}",
        a.len(),
        b.len(),
        out.len()
    );
}

impl Device for RefDevice {
    fn name(&self) -> &str {
        "ref"
    }

    fn description(&self) -> String {
        "reference: flint-core scalar kernels, 1 thread, weights kept as blocks, f32 KV".into()
    }

    /// Every op: `flint-core` has a scalar form of each. Ops on weights: the encodings
    /// core's dot product (matmuls, staging) or dequantization (`get_rows`) computes.
    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool {
        match op {
            Op::Stage | Op::Matmul | Op::MatmulGlu | Op::ExpertMatmul => {
                ty.is_some_and(weight::dot_supports)
            }
            Op::GetRows => ty.is_some_and(weight::dequant_supports),
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

    /// Everything resident, encodings kept; a weight core cannot compute is refused up
    /// front, before anything is staged.
    fn plan(&self, weights: &[WeightDesc], _other_bytes: u64) -> Result<StagingPlan, HalError> {
        let mut plan = StagingPlan::default();
        for w in weights {
            weight::check_usable(w)?;
            plan.weights.push(weight::planned(w));
        }
        Ok(plan)
    }

    /// Keeps a reference to the tensor's bytes (`weight.rs`).
    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        Ok(Arc::new(weight::stage(desc)?))
    }

    /// `out[i][o] = sum_k W[o][k] * x[i][k]`, row by row with
    /// `flint_core::dot::matvec_f32`: the activation row quantized once to the weight's
    /// `vec_dot_type`, then one scalar block dot product per weight row (float weights:
    /// f32 products summed in f64).
    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, out) = (x.host(), out.host());
        let w = self.weight(w);
        assert_eq!(x.len(), m * w.k, "matmul: x length");
        assert_eq!(out.len(), m * w.n, "matmul: out length");
        self.count(w.ty);
        let bytes = w.matrix(0);
        for (xi, oi) in x
            .chunks_exact(w.k.max(1))
            .zip(out.chunks_exact_mut(w.n.max(1)))
        {
            flint_core::dot::matvec_f32(w.ty, bytes, xi, oi)
                .map_err(|e| fmt_err(&format!("matmul of '{}'", w.info.name), e))?;
        }
        Ok(())
    }

    /// `out[i] = W[ids[i]] * x[i / f]` on a tower `[in, out, E]` (`f` the
    /// [`fanout`](flint_hal::fanout)): [`matmul`](Device::matmul)'s `matvec_f32` on
    /// expert `e`'s matrix, one routed row at a time. An expert beyond the tower is
    /// `InvalidInput`.
    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, ids, out) = (x.host(), ids.host(), out.host());
        let w = self.weight(w);
        let k = w.k.max(1);
        assert_eq!(x.len() % k, 0, "expert_matmul: x length");
        assert_eq!(out.len(), ids.len() * w.n, "expert_matmul: out length");
        self.count(w.ty);
        let f = fanout(x.len() / k, ids.len(), "expert_matmul");
        for (r, (&e, oi)) in ids.iter().zip(out.chunks_exact_mut(w.n.max(1))).enumerate() {
            let (e, i) = (e as usize, r / f);
            if e >= w.e {
                return Err(HalError::invalid(format!(
                    "ref: expert_matmul: expert {e} of tensor '{}' with {} experts",
                    w.info.name, w.e
                )));
            }
            flint_core::dot::matvec_f32(w.ty, w.matrix(e), &x[i * k..(i + 1) * k], oi)
                .map_err(|err| fmt_err(&format!("expert_matmul of '{}'", w.info.name), err))?;
        }
        Ok(())
    }

    /// `out[i] = dequant(row ids[i])` with `flint_core::dequant::dequantize` (rows are
    /// counted over all matrices of the weight). An id beyond them is `InvalidInput`.
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
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(d.max(1))) {
            let id = id as usize;
            if id >= rows_total {
                return Err(HalError::invalid(format!(
                    "ref: get_rows: id {id} beyond the {rows_total} rows of tensor '{}'",
                    w.info.name
                )));
            }
            flint_core::dequant::dequantize(w.ty, w.row(id), o)
                .map_err(|e| fmt_err(&format!("get_rows of '{}'", w.info.name), e))?;
        }
        Ok(())
    }

    /// `out = x / sqrt(mean(x^2) + eps) * weight` per row of `dim`:
    /// `flint_core::math::rms_norm_rows` (sum of squares in f64, as ggml).
    fn rms_norm(
        &self,
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (x, weight, out) = (x.host(), weight.map(View::host), out.host());
        math::rms_norm_rows(x, weight, dim, eps, out);
        Ok(())
    }

    /// `residual += delta` (element by element, once), then
    /// `out = rms_norm_rows(residual) * weight` (`flint_core::math::rms_norm_rows`).
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
        assert_eq!(residual.len(), delta.len(), "add_rms_norm: delta length");
        for (r, &d) in residual.iter_mut().zip(delta) {
            *r += d;
        }
        math::rms_norm_rows(residual, Some(weight), dim, eps, out);
        Ok(())
    }

    /// RoPE in place, row `i` at `positions[i]`: `flint_core::math::rope_heads` on each
    /// row's `n_heads` heads (ggml's `rope_ext`: NeoX or normal pairs, frequency factors,
    /// YaRN). Parameters `RopeParams::check` refuses are `InvalidInput`.
    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError> {
        let positions = positions.host();
        let x = x.host();
        p.check()?;
        let row = p.n_heads * p.head_dim;
        assert_eq!(x.len(), positions.len() * row, "rope: x length");
        let cfg = p.config();
        for (r, &pos) in x.chunks_exact_mut(row.max(1)).zip(positions) {
            math::rope_heads(r, p.head_dim, pos, &cfg);
        }
        Ok(())
    }

    /// `out = silu(gate) * up` with `flint_core::math::silu`.
    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
        same_len("silu_mul", gate, up, out);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = math::silu(g) * u;
        }
        Ok(())
    }

    /// `out = gelu_tanh(gate) * up` with `flint_core::math::gelu_tanh` (in f32; the cpu
    /// device rounds through f16 as ggml's CPU backend does).
    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
        same_len("gelu_mul", gate, up, out);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = math::gelu_tanh(g) * u;
        }
        Ok(())
    }

    /// gpt-oss's clamped SwiGLU: `out = flint_core::math::swiglu_oai(gate, up)`.
    fn swiglu_oai_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (gate, up, out) = (gate.host(), up.host(), out.host());
        same_len("swiglu_oai_mul", gate, up, out);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = math::swiglu_oai(g, u);
        }
        Ok(())
    }

    /// `acc += x` (plain f32 addition; core has no function for it).
    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        let (acc, x) = (acc.host(), x.host());
        assert_eq!(acc.len(), x.len(), "add: lengths");
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v;
        }
        Ok(())
    }

    /// `x[r][j] += bias[j]` for every row `r`; a bias that does not fit the rows is
    /// `InvalidInput` (`flint_hal::bias_rows`).
    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError> {
        let (x, bias) = (x.host(), bias.host());
        flint_hal::bias_rows(x.len(), bias.len())?;
        for row in x.chunks_exact_mut(bias.len()) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
        Ok(())
    }

    /// `x *= s`.
    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError> {
        for v in x.host() {
            *v *= s;
        }
        Ok(())
    }

    /// `flint_core::math::add_id`; an id beyond the table is `InvalidInput`.
    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError> {
        math::add_id(x.host(), table.host(), ids.host(), dim)
            .map_err(|e| HalError::invalid(format!("ref: add_id: {e}")))
    }

    /// MoE combine, `flint_core::math::scatter_add_weighted`:
    /// `acc[i / f] += weights[i] * x[i]`, rows of `dim`.
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

    /// Top-k routing of each row of `n_experts` logits with
    /// `flint_core::math::route_topk` (gating, selection with the bias, weights without
    /// it, renormalised and scaled), then `flint_core::math::scale_by_expert` with an
    /// expert scale. What core refuses (`k` of 0 or above the experts, a bias of another
    /// length) is `InvalidInput`.
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
        assert!(
            n_experts > 0 && logits.len().is_multiple_of(n_experts),
            "route_topk: logits length"
        );
        let (rows, k) = (logits.len() / n_experts, cfg.k);
        assert!(
            ids.len() == rows * k && weights.len() == rows * k,
            "route_topk: output lengths"
        );
        for r in 0..rows {
            math::route_topk(
                &logits[r * n_experts..(r + 1) * n_experts],
                bias,
                k,
                cfg.gating,
                cfg.normalize,
                cfg.scale,
                &mut ids[r * k..(r + 1) * k],
                &mut weights[r * k..(r + 1) * k],
            )
            .map_err(|e| HalError::invalid(format!("ref: route_topk: {e}")))?;
        }
        if let Some(s) = expert_scale {
            math::scale_by_expert(weights, ids, s.host())
                .map_err(|e| HalError::invalid(format!("ref: route_topk: expert scale: {e}")))?;
        }
        Ok(())
    }

    /// Qwen 3.5's causal convolution, then SiLU: `flint_core::math::ssm_conv` (the
    /// window carried in `state`), then `flint_core::math::silu` on every output.
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
        math::ssm_conv(x, weight, d_conv, state, out);
        for o in out.iter_mut() {
            *o = math::silu(*o);
        }
        Ok(())
    }

    /// The gated delta rule, token by token: `flint_core::math::gated_delta_net` (the
    /// recurrent form). A shape that is not valid is `InvalidInput`.
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
        if !shape.is_valid() {
            return Err(HalError::invalid(format!(
                "ref: gated_delta_net: {} value heads on {} key heads of size {} (value heads \
                 must be a non-zero multiple of key heads, sizes non-zero)",
                shape.heads_v, shape.heads_k, shape.head_dim
            )));
        }
        assert_eq!(
            state.len(),
            shape.state_len(),
            "gated_delta_net: state length"
        );
        assert_eq!(out.len(), v.len(), "gated_delta_net: out length");
        math::gated_delta_net(shape, q, k, v, g, beta, state, out);
        Ok(())
    }

    /// A zeroed f32 cache in host memory (`kv.rs`).
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
        Ok(Box::new(RefKv::new(layout)?))
    }

    /// Token `i`'s key and value rows into slot `slots[i]` (`kv.rs`).
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
            .downcast_mut::<RefKv>()
            .expect("KV buffer was not allocated by the ref device");
        kv::write_kv(kv, k, v, slots)
    }

    /// Attention of every query row over its sequence's visible keys, through the block
    /// tables, with `flint_core::math::attention_ref` (`kv.rs`).
    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let out = out.host();
        let kv = kv
            .as_any()
            .downcast_ref::<RefKv>()
            .expect("KV buffer was not allocated by the ref device");
        kv::paged_attention(kv, p, out)
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            block_dispatches: self.block_dispatches.load(Ordering::Relaxed),
            float_dispatches: self.float_dispatches.load(Ordering::Relaxed),
        }
    }
}
