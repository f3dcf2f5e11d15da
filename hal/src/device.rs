use std::fmt;
use std::sync::Arc;

use flint_core::GgmlType;

use crate::ops::{
    DeltaNetShape, Glu, KvBuffer, KvLayout, Op, PagedAttention, RopeParams, RoutingConfig,
};
use crate::tensor::{
    IndexTensor, IndexView, IndexViewMut, Tensor, TransferCounter, Transfers, View, ViewMut,
};
use crate::weights::{PlannedWeight, StagingPlan, Tier, WeightDesc, WeightHandle};
use crate::{HalError, Weight};

/// A shared handle to a device, as the engine holds it.
pub type DeviceRef = Arc<dyn Device>;

/// Dispatch counters, for reachability tests and profiling. A backend that does not
/// count returns zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Matmuls (dense or expert) that computed directly from kept block encodings.
    pub block_dispatches: u64,
    /// Matmuls that computed from float (expanded or float-typed) weights.
    pub float_dispatches: u64,
}

/// The device interface. See the crate docs for the contract shared by all methods.
///
/// Tensors are row-major f32 [views](View) of tensors the device allocated
/// ([`alloc`](Device::alloc)), or of host memory. Every method documents the lengths it
/// expects; a call with other lengths is a caller bug and panics.
pub trait Device: Send + Sync + fmt::Debug {
    /// The registry name (`cpu`, `tt`, ...).
    fn name(&self) -> &str;

    /// One line for people: the hardware and the build (SIMD level, threads, DRAM).
    fn description(&self) -> String;

    /// Whether this device implements `op` for weights encoded as `ty` (`ty` is
    /// ignored for ops that take no weight; pass `None`).
    fn supports(&self, op: Op, ty: Option<GgmlType>) -> bool;

    /// A tensor of `len` f32 values in this device's memory, zeroed. The default
    /// allocates host memory (devices that compute on the host keep the default).
    fn alloc(&self, len: usize) -> Result<Tensor, HalError> {
        Ok(Tensor::Host(vec![0.0; len]))
    }

    /// The device's count of host-device traffic (see [`Transfers`]). Every device
    /// keeps one; [`upload`](Device::upload), [`download`](Device::download) and ops
    /// handed host views add to it.
    fn transfer_counter(&self) -> &TransferCounter;

    /// Host-device traffic since the device was opened.
    fn transfers(&self) -> Transfers {
        self.transfer_counter().get()
    }

    /// Copies host values into a tensor of this device: `dst = src`
    /// (`src.len() == dst.len()`). Counted as one upload.
    fn upload(&self, src: &[f32], dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "upload: lengths differ");
        self.transfer_counter().upload(src.len());
        dst.host().copy_from_slice(src);
        Ok(())
    }

    /// A new tensor holding `src` (an [`alloc`](Device::alloc) and an
    /// [`upload`](Device::upload)).
    fn upload_new(&self, src: &[f32]) -> Result<Tensor, HalError> {
        let mut t = self.alloc(src.len())?;
        self.upload(src, t.view_mut())?;
        Ok(t)
    }

    /// Copies a tensor's values to host memory: `dst = src` (`src.len() == dst.len()`).
    /// Counted as one download.
    fn download(&self, src: View<'_>, dst: &mut [f32]) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "download: lengths differ");
        self.transfer_counter().download(src.len());
        dst.copy_from_slice(src.host());
        Ok(())
    }

    /// A tensor's values as a host vector, consuming it: a host tensor is handed over
    /// without a copy. Counted as one download either way.
    fn download_tensor(&self, t: Tensor) -> Result<Vec<f32>, HalError> {
        match t {
            Tensor::Host(v) => {
                self.transfer_counter().download(v.len());
                Ok(v)
            }
            Tensor::Device(_) => {
                let mut v = vec![0.0; t.len()];
                self.download(t.view(), &mut v)?;
                Ok(v)
            }
        }
    }

    /// A step's index lists (token ids, positions, slot mappings, block tables, packed
    /// one after another by the caller) as one tensor of this device, which ops then
    /// take [`IndexView`]s of. Counted as one upload of `4 * src.len()` bytes. The
    /// default keeps them in host memory (the vector is moved in, not copied): devices
    /// that compute on the host, and devices that pass index lists to each kernel as
    /// arguments, keep it.
    fn upload_indices(&self, src: Vec<u32>) -> Result<IndexTensor, HalError> {
        self.transfer_counter().upload(src.len());
        Ok(IndexTensor::Host(src))
    }

    /// An index tensor of `len` zeros in this device's memory, for an op to write (the
    /// experts [`route_topk`](Device::route_topk) chooses). The default allocates host
    /// memory.
    fn alloc_indices(&self, len: usize) -> Result<IndexTensor, HalError> {
        Ok(IndexTensor::Host(vec![0; len]))
    }

    /// Copies indices to host memory: `dst = src` (`src.len() == dst.len()`). Counted as
    /// one download.
    fn download_indices(&self, src: IndexView<'_>, dst: &mut [u32]) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "download_indices: lengths differ");
        self.transfer_counter().download(src.len());
        dst.copy_from_slice(src.host());
        Ok(())
    }

    /// `dst = src` between two tensors of this device (`src.len() == dst.len()`), on
    /// the device's side.
    fn copy(&self, src: View<'_>, dst: ViewMut<'_>) -> Result<(), HalError> {
        assert_eq!(src.len(), dst.len(), "copy: lengths differ");
        dst.host().copy_from_slice(src.host());
        Ok(())
    }

    /// What staging each of `weights` would do, decided against the device's memory,
    /// without staging anything. `other_bytes` is the memory the caller takes besides
    /// these weights before its first step (the engine's norm weights and biases, uploaded
    /// as tensors): a device that places weights against its memory leaves room for it.
    /// The default: everything resident, kept as it is.
    fn plan(&self, weights: &[WeightDesc], other_bytes: u64) -> Result<StagingPlan, HalError> {
        let _ = other_bytes;
        Ok(StagingPlan {
            weights: weights
                .iter()
                .map(|w| PlannedWeight {
                    name: w.name.clone(),
                    source_ty: w.ty,
                    staged_ty: w.ty,
                    kept_quant: w.ty.is_quantized(),
                    tier: Tier::Resident,
                    resident_bytes: w.data.len() as u64,
                    streamed_bytes: 0,
                })
                .collect(),
        })
    }

    /// Makes a weight usable by this device. Fails with `Unsupported` when the encoding
    /// can be neither kept nor expanded (the message names tensor and encoding), with
    /// `InvalidInput` when the bytes do not match type and shape, with `OutOfMemory`
    /// when it does not fit.
    fn stage(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError>;

    /// `out[i][o] = sum_k W[o][k] * x[i][k]` for a weight `[in, out]`.
    ///
    /// `x.len() == m * in`, `out.len() == m * out`; `m >= 1`.
    fn matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        m: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// [`Device::matmul`] of several weights on the same input (a layer's query, key and
    /// value projections; an MLP's gate and up): `outs[i] = matmul(ws[i], x)`, each
    /// `outs[i]` of length `m * out_i`. One call, so that a backend can prepare `x` once
    /// and spread all the matrices over its workers in one go; the results must equal
    /// separate `matmul` calls bit for bit. The default makes those calls.
    fn matmul_multi(
        &self,
        ws: &[&dyn Weight],
        x: View<'_>,
        m: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        assert_eq!(ws.len(), outs.len(), "matmul_multi: one output per weight");
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(*w, x, m, out.reborrow())?;
        }
        Ok(())
    }

    /// A gated MLP's first half: `out = act(matmul(gate, x), matmul(up, x))` with `act`
    /// the element-wise op `glu` names: the results of
    /// [`matmul_multi`](Device::matmul_multi) of the two weights into `scratch` (two
    /// tensors of `m` rows of gate's output width) and of that op from them, bit for bit.
    /// One call, so that a backend can apply the activation to each tile of the two
    /// products while it is in its caches. The default makes those calls
    /// ([`matmul_glu_composed`]).
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &self,
        gate: &dyn Weight,
        up: &dyn Weight,
        x: View<'_>,
        m: usize,
        glu: Glu,
        scratch: [ViewMut<'_>; 2],
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        matmul_glu_composed(self, gate, up, x, m, glu, scratch, out)
    }

    /// Grouped expert matmul on a tower `[in, out, E]`. `x` holds `r` rows of `in`,
    /// `ids` holds `r * f` expert ids (a [`fanout`](crate::fanout) `f`: the `k` experts
    /// routed to each token for the gate and up projections, 1 for the down projection,
    /// whose `x` already has a row per routed row): `out[i] = W[ids[i]] * x[i / f]`. One
    /// call per projection per layer; a backend should read each expert's blocks once
    /// for all its rows. The ids may live on the device
    /// ([`route_topk`](Device::route_topk) writes them there); an id `>= E` is
    /// `InvalidInput`.
    ///
    /// `x.len() % in == 0`, `ids.len() % (x.len() / in) == 0`,
    /// `out.len() == ids.len() * out`.
    fn expert_matmul(
        &self,
        w: &dyn Weight,
        x: View<'_>,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// [`expert_matmul`](Device::expert_matmul) of several towers (the gate and up
    /// projections of a layer's experts) on the same `x` and `ids`, `outs[i]` of length
    /// `ids.len() * out_i`. One call, so that a backend can prepare `x` once and spread
    /// all the towers over its workers in one go; the results must equal separate
    /// `expert_matmul` calls bit for bit. The default makes those calls.
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
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.expert_matmul(*w, x, ids, out.reborrow())?;
        }
        Ok(())
    }

    /// Embedding gather: `out[i] = dequant(W row ids[i])` for a weight `[d, V]`.
    /// `out.len() == ids.len() * d`. An id `>= V` is `InvalidInput`.
    fn get_rows(
        &self,
        w: &dyn Weight,
        ids: IndexView<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// RMSNorm of every row of `dim` values: `out = x / sqrt(mean(x^2) + eps) * weight`
    /// (no multiplication when `weight` is `None`). Used per head with `dim = head_dim`.
    /// `x.len() == out.len()`, a multiple of `dim`; `weight.len() == dim`.
    fn rms_norm(
        &self,
        x: View<'_>,
        weight: Option<View<'_>>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// Fused residual add and RMSNorm: `residual += delta` (exactly once), then
    /// `out = rmsnorm(residual) * weight` row by row.
    fn add_rms_norm(
        &self,
        residual: ViewMut<'_>,
        delta: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// A sublayer's output through its post-norm into the residual stream, then the next
    /// norm (Gemma's sandwich norms): `residual += rmsnorm(delta) * delta_weight`
    /// (exactly once), then `out = rmsnorm(residual) * weight`, row by row: the results
    /// of [`rms_norm`](Device::rms_norm) into `scratch` (`delta`'s length) and
    /// [`add_rms_norm`](Device::add_rms_norm) from it, bit for bit. One call, so that a
    /// backend can take each row through the steps while it is in its caches. The
    /// default makes the two calls.
    #[allow(clippy::too_many_arguments)]
    fn post_norm_add_rms_norm(
        &self,
        residual: ViewMut<'_>,
        delta: View<'_>,
        delta_weight: View<'_>,
        weight: View<'_>,
        eps: f32,
        dim: usize,
        scratch: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let mut scratch = scratch;
        self.rms_norm(delta, Some(delta_weight), eps, dim, scratch.reborrow())?;
        self.add_rms_norm(residual, scratch.as_view(), weight, eps, dim, out)
    }

    /// RoPE in place on `x = [rows, n_heads * head_dim]`, row `i` at `positions[i]` (see
    /// [`RopeParams`]). Parameters that [`RopeParams::check`] refuses are `InvalidInput`.
    fn rope(
        &self,
        x: ViewMut<'_>,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
    ) -> Result<(), HalError>;

    /// A layer's query or key heads from their projection to the attention: in place on
    /// `x = [rows, n_heads * head_dim]`, per head the RMSNorm times `weight` (`head_dim`
    /// values), then RoPE at the row's position (`p`, as [`rope`](Device::rope)), then
    /// times `scale`: the results of [`rms_norm`](Device::rms_norm) (`dim = head_dim`),
    /// [`rope`](Device::rope) and [`scale`](Device::scale) one after another, bit for
    /// bit (Qwen 3's and Gemma 3's query and key norms, Gemma 3's pre-scaled queries).
    /// One call, so that a backend can take each row through the three steps while it
    /// is in its caches. The default makes the three calls, the norm from a copy of `x`
    /// in `scratch` (`x`'s length).
    #[allow(clippy::too_many_arguments)]
    fn norm_rope(
        &self,
        x: ViewMut<'_>,
        weight: View<'_>,
        eps: f32,
        positions: IndexView<'_>,
        p: &RopeParams<'_>,
        scale: f32,
        scratch: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let (mut x, mut src) = (x, scratch);
        self.copy(x.as_view(), src.reborrow())?;
        self.rms_norm(src.as_view(), Some(weight), eps, p.head_dim, x.reborrow())?;
        self.rope(x.reborrow(), positions, p)?;
        if scale != 1.0 {
            self.scale(x, scale)?;
        }
        Ok(())
    }

    /// `out = silu(gate) * up`, element-wise.
    fn silu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError>;

    /// `out = gelu_tanh(gate) * up`, element-wise.
    fn gelu_mul(&self, gate: View<'_>, up: View<'_>, out: ViewMut<'_>) -> Result<(), HalError>;

    /// gpt-oss's clamped SwiGLU, element-wise: `out = swiglu_oai(gate, up)`
    /// (`flint_core::math::swiglu_oai`: the gate clamped above and the up branch on both
    /// sides at 7, `x * sigmoid(1.702 x) * (y + 1)`). A device without it says so in
    /// [`supports`](Self::supports) and returns `Unsupported` (the default): models with
    /// this activation then cannot be staged on it.
    fn swiglu_oai_mul(
        &self,
        gate: View<'_>,
        up: View<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let _ = (gate, up, out);
        Err(HalError::unsupported(format!(
            "{}: swiglu_oai_mul (gpt-oss's activation)",
            self.name()
        )))
    }

    /// `acc += x`, element-wise.
    fn add(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError>;

    /// `x[r * bias.len() + j] += bias[j]`: `bias` added to every row of `x` (a projection's
    /// bias on a batch of rows). `InvalidInput` when `bias` is empty or its length does
    /// not divide `x.len()` (a bias tensor that does not match its projection).
    fn add_bias(&self, x: ViewMut<'_>, bias: View<'_>) -> Result<(), HalError>;

    /// `x *= s`, element-wise.
    fn scale(&self, x: ViewMut<'_>, s: f32) -> Result<(), HalError>;

    /// ggml's `add_id`: `x[i] += table[ids[i]]` for rows of `dim` values, `table` holding
    /// one row per id (gpt-oss adds each routed row its expert's bias this way). An id
    /// beyond `table`'s rows is `InvalidInput`.
    ///
    /// `x.len() == ids.len() * dim`, `table.len() % dim == 0`.
    fn add_id(
        &self,
        x: ViewMut<'_>,
        table: View<'_>,
        ids: IndexView<'_>,
        dim: usize,
    ) -> Result<(), HalError>;

    /// MoE combine: `acc[i / f] += weights[i] * x[i]` for rows of `dim` values, in
    /// order of `i`, where `acc` holds `r` rows and `x` holds `r * f` (the
    /// [`fanout`](crate::fanout): each token's `k` routed rows, one after another).
    ///
    /// `x.len() == weights.len() * dim`, `acc.len() % dim == 0`,
    /// `weights.len() % (acc.len() / dim) == 0`.
    fn scatter_add_weighted(
        &self,
        acc: ViewMut<'_>,
        x: View<'_>,
        weights: View<'_>,
        dim: usize,
    ) -> Result<(), HalError>;

    /// Top-k routing of each row of `n_experts` router logits (see [`RoutingConfig`]).
    /// `bias.len() == n_experts`; `ids` and `weights` get `k` entries per row, in
    /// descending order of `score + bias`. With `expert_scale` (`n_experts` values:
    /// Gemma 4's per-expert output scale) each weight is then multiplied by its expert's
    /// value. Ids and weights stay where the device put them: the expert ops read them
    /// there.
    #[allow(clippy::too_many_arguments)]
    fn route_topk(
        &self,
        logits: View<'_>,
        n_experts: usize,
        bias: Option<View<'_>>,
        expert_scale: Option<View<'_>>,
        cfg: &RoutingConfig,
        ids: IndexViewMut<'_>,
        weights: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// Qwen 3.5's short causal convolution of one sequence, then SiLU on every output:
    /// `out = silu(ssm_conv(x))` with the window carried in `state`
    /// (`flint_core::math::ssm_conv`, whose docs give the layouts and the float order;
    /// SiLU is `flint_core::math::silu`). `x` and `out` are `n` rows of `channels`,
    /// `weight` is `channels` rows of `d_conv`, `state` is `channels` rows of
    /// `d_conv - 1` (the previous inputs, oldest first; zeros for a new sequence), updated
    /// to the last `d_conv - 1` inputs. A device without it says so in
    /// [`supports`](Self::supports) and returns `Unsupported` (the default).
    fn ssm_conv_silu(
        &self,
        x: View<'_>,
        weight: View<'_>,
        d_conv: usize,
        state: ViewMut<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError> {
        let _ = (x, weight, d_conv, state, out);
        Err(HalError::unsupported(format!(
            "{}: ssm_conv_silu (Gated DeltaNet convolution)",
            self.name()
        )))
    }

    /// The gated delta rule of one sequence over its `n` tokens, the per-head state
    /// carried in `state` (`flint_core::math::gated_delta_net`, whose docs give the math,
    /// the layouts and ggml's float order): `q`, `k` are `n` rows of
    /// `heads_k * head_dim`, `v` and `out` `n` rows of `heads_v * head_dim`, `g` (log
    /// decay) and `beta` `n` rows of `heads_v`, `state` `heads_v` blocks of
    /// `head_dim^2` (`[h][j][i] = S_h[i][j]`; zeros for a new sequence). A shape that is
    /// not [valid](DeltaNetShape::is_valid) is `InvalidInput`. A device without it says so
    /// in [`supports`](Self::supports) and returns `Unsupported` (the default).
    #[allow(clippy::too_many_arguments)]
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
        let _ = (shape, q, k, v, g, beta, state, out);
        Err(HalError::unsupported(format!(
            "{}: gated_delta_net (Gated DeltaNet delta rule)",
            self.name()
        )))
    }

    /// Qwen 3.5's gates: `x = sigmoid(x)` element by element
    /// (`flint_core::math::sigmoid_ggml`). Optional, as [`ssm_conv_silu`]: a device
    /// without it says so in [`supports`](Self::supports) and returns `Unsupported` (the
    /// default).
    ///
    /// [`ssm_conv_silu`]: Self::ssm_conv_silu
    fn sigmoid(&self, x: ViewMut<'_>) -> Result<(), HalError> {
        let _ = x;
        Err(HalError::unsupported(format!("{}: sigmoid", self.name())))
    }

    /// `acc[i] *= x[i / (acc.len() / x.len())]` (`flint_core::math::mul_rows`): `x` as
    /// long as `acc`, or one value per row of `acc` (Qwen 3.5's gated attention output and
    /// its shared expert's gate). Optional (see [`sigmoid`](Self::sigmoid)).
    ///
    /// `x` not empty (unless `acc` is), its length dividing `acc`'s.
    fn mul(&self, acc: ViewMut<'_>, x: View<'_>) -> Result<(), HalError> {
        let _ = (acc, x);
        Err(HalError::unsupported(format!("{}: mul", self.name())))
    }

    /// Splits `src`, groups of `outs.len()` chunks of `chunk` values, by chunk: chunk `j`
    /// of group `g` to `outs[j][g * chunk..]` (`flint_core::math::deinterleave`; Qwen
    /// 3.5's query projection gives each head its queries, then its gate). Optional (see
    /// [`sigmoid`](Self::sigmoid)).
    ///
    /// `src.len()` a multiple of `chunk * outs.len()`, each output one chunk per group.
    fn deinterleave(
        &self,
        src: View<'_>,
        chunk: usize,
        outs: &mut [ViewMut<'_>],
    ) -> Result<(), HalError> {
        let _ = (src, chunk, outs);
        Err(HalError::unsupported(format!(
            "{}: deinterleave",
            self.name()
        )))
    }

    /// The log decay of Gated DeltaNet, in place on rows of `dt_bias.len()` heads:
    /// `alpha = softplus(alpha + dt_bias[h]) * a[h]`
    /// (`flint_core::math::delta_net_gates`). Optional (see [`sigmoid`](Self::sigmoid)).
    ///
    /// `a.len() == dt_bias.len()`, `alpha` whole rows of it.
    fn delta_net_gate(
        &self,
        alpha: ViewMut<'_>,
        dt_bias: View<'_>,
        a: View<'_>,
    ) -> Result<(), HalError> {
        let _ = (alpha, dt_bias, a);
        Err(HalError::unsupported(format!(
            "{}: delta_net_gate",
            self.name()
        )))
    }

    /// L2 norm of every row of `dim` values, in place, as llama.cpp's Gated DeltaNet
    /// normalises its query and key heads (`flint_core::math::l2_norm_heads`). Optional
    /// (see [`sigmoid`](Self::sigmoid)).
    ///
    /// `x.len()` a multiple of `dim > 0`.
    fn l2_norm(&self, x: ViewMut<'_>, dim: usize, eps: f32) -> Result<(), HalError> {
        let _ = (x, dim, eps);
        Err(HalError::unsupported(format!("{}: l2_norm", self.name())))
    }

    /// Allocates one layer's KV cache.
    fn alloc_kv(&self, layout: &KvLayout) -> Result<Box<dyn KvBuffer>, HalError>;

    /// Bytes one stored key or value element takes in this device's KV buffers (the
    /// engine sizes its block pools from a memory budget with it). The default is 4 (f32);
    /// a device that stores f16 says 2.
    fn kv_bytes_per_value(&self) -> usize {
        4
    }

    /// The most bytes one buffer of this device may hold (a tensor, or the keys or the
    /// values of one layer's KV cache), where that is less than its memory: Vulkan's
    /// `maxStorageBufferRange`, for one. The engine sizes each layer's KV pool so that its
    /// keys and its values each fit. `None` (the default): no limit beneath memory.
    fn max_buffer_bytes(&self) -> Option<u64> {
        None
    }

    /// Writes keys and values of `slots.len()` tokens: `k = [n, n_kv_heads * head_dim_k]`,
    /// `v = [n, n_kv_heads * head_dim_v]`; token `i` goes to slot `slots[i]`.
    fn write_kv(
        &self,
        kv: &mut dyn KvBuffer,
        k: View<'_>,
        v: View<'_>,
        slots: IndexView<'_>,
    ) -> Result<(), HalError>;

    /// Paged attention for many sequences at once (see [`PagedAttention`]);
    /// `out = [n_rows, n_heads * head_dim_v]`, rows laid out as in `q`.
    fn paged_attention(
        &self,
        kv: &dyn KvBuffer,
        p: &PagedAttention<'_>,
        out: ViewMut<'_>,
    ) -> Result<(), HalError>;

    /// Whether every op gives a row the same bits whatever other rows share its call.
    /// The engine relies on it to leave rows out of a call early: a prompt's last layer
    /// computes attention only for the rows whose logits are wanted. A device whose
    /// arithmetic follows the size of each call, as llama.cpp's kernels do (the cpu
    /// device in llama.cpp's float order), answers `false`, and the engine then keeps
    /// llama.cpp's graph shape (the last layer's attention over every row, the rows
    /// left out after it). The default is `true`.
    fn row_invariant(&self) -> bool {
        true
    }

    /// Dispatch counters since the device was opened.
    fn counters(&self) -> DeviceCounters {
        DeviceCounters::default()
    }

    /// Runs `step` (a whole forward step: many calls into this device) in the device's
    /// own execution context. A device whose ops hand work to worker threads runs the
    /// step on one of them, so that each op starts on a worker instead of waking one and
    /// putting the caller to sleep. Ops may also be called outside `run_step`; this is
    /// only about speed. The default calls `step` on the caller's thread.
    fn run_step(&self, step: &mut (dyn FnMut() + Send)) {
        step()
    }

    /// Runs `body` (a serving loop: many steps, with the sampling and bookkeeping
    /// between them) in the device's own execution context, so that each
    /// [`run_step`](Device::run_step) inside it starts and ends without handing the
    /// step to another thread and back. Only about speed, as `run_step`; a body that
    /// waits for a long time (for requests to arrive) should not run inside. The
    /// default calls `body` on the caller's thread.
    fn run_session(&self, body: &mut (dyn FnMut() + Send)) {
        body()
    }
}

/// [`Device::matmul_glu`] as separate ops: [`Device::matmul_multi`] of `gate` and `up`
/// into `scratch`, then the element-wise op `glu` names into `out` (the trait's default;
/// a backend that fuses some cases calls it for the others).
#[allow(clippy::too_many_arguments)]
pub fn matmul_glu_composed<D: Device + ?Sized>(
    dev: &D,
    gate: &dyn Weight,
    up: &dyn Weight,
    x: View<'_>,
    m: usize,
    glu: Glu,
    scratch: [ViewMut<'_>; 2],
    out: ViewMut<'_>,
) -> Result<(), HalError> {
    let [mut g, mut u] = scratch;
    dev.matmul_multi(&[gate, up], x, m, &mut [g.reborrow(), u.reborrow()])?;
    match glu {
        Glu::Silu => dev.silu_mul(g.as_view(), u.as_view(), out),
        Glu::GeluTanh => dev.gelu_mul(g.as_view(), u.as_view(), out),
        Glu::SwigluOai => dev.swiglu_oai_mul(g.as_view(), u.as_view(), out),
    }
}
