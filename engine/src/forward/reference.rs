//! The reference forward: the oracle every faster path is judged against.
//!
//! One sequence, one token at a time, a contiguous f32 KV cache, plain f32 math. It is
//! written to be read next to `shared/spec/FLINT.md` and llama.cpp's graphs
//! (`src/models/{llama,qwen2,qwen3,gemma3}.cpp`), not to be fast. Every architecture
//! goes through the same steps, each taken from the model ([`crate::model`]): biases
//! after the Q/K/V and output matmuls, per-head QK norm, RoPE with the layer's
//! parameters (`flint_core::math::rope`), a pre-scaled query or a scaled `q.k`,
//! sinks and a window, post-norms, the activation, and final logit soft-capping.
//! Qwen 3.5's Gated DeltaNet layers run through `flint_core::math::delta` token by token,
//! each layer's recurrent state (convolution window and delta-rule state) carried from
//! one position to the next as the KV of attention layers is; its attention layers
//! multiply their output by the query projection's sigmoid gate, and its shared expert
//! is scaled by its own sigmoid gate.
//!
//! **Matmuls** go through `flint_core::dot::matvec_f32_ggml_x86` on the weight rows as
//! they are stored: like ggml, that quantizes the activation to the weight type's
//! `vec_dot_type` (Q8_K for K-quants, Q8_0 for legacy types) before the integer dot, and
//! it scales and sums the block results in the order llama.cpp's x86 CPU backend uses for
//! a prompt batch (tinyBLAS for Q8_0/Q5_0, the tiled kernel for Q6_K, the repacked kernels
//! for Q4_K; other types in ggml's generic order). We chose this over dequantizing to f32
//! because the real-weights gate compares against llama.cpp, which computes exactly so.
//! Rows are spread over threads with rayon, which changes nothing in the result (every
//! row is one independent dot).
//!
//! More roundings of llama.cpp's CPU backend are kept for the same reason: the cache
//! holds keys and values rounded to f16 (its default cache types), attention follows the
//! order of operations of its CPU flash attention (`attend_head`, in the x86 build
//! given, AVX-512 by default), RoPE uses glibc's
//! `sinf`/`cosf` and GCC's fused multiply-adds, and GELU goes through ggml's f16 table
//! (`flint_core::math::gelu_tanh_ggml_f16`). Gemma 3's post-norms rescale tiny FFN
//! outputs to large ones, so one-ulp differences grow into 0.1-nat logit differences;
//! with all of these, the teacher-forced golden paragraph's logits equal llama.cpp's
//! (see `docs/parity.md`).
//!
//! The building blocks (norms, RoPE, attention with sinks and a window, routing) are
//! public so that tests can check each of them against a hand computation.

use std::cell::RefCell;

use rayon::prelude::*;

use flint_core::dot::ggml_x86::BatchRow;
use flint_core::math::{gelu_tanh_ggml_f16, sigmoid_ggml, silu, swiglu_oai, GgmlCpuBuild};
use flint_hal::Gating;

use crate::model::{
    layer_rope, soft_cap, Activation, DeltaNetLayer, ExpertBiases, Ffn, Layer, Mlp, Model,
    ModelError, PerLayerInputs, TensorRef,
};

/// How many times [`Reference::prefill`] runs an MoE prompt at most before it gives up
/// on the batch's routing settling.
pub const PREFILL_PASSES: usize = 4;

/// `out[o] = W[row_offset + o] . x` for `out.len()` rows of `w`, through
/// `flint_core::dot::matvec_f32_ggml_x86`: the activation quantized once per call, each
/// row in the float order llama.cpp's x86 CPU backend uses for the activation row `at`
/// of a matmul (see [`Reference::set_batch_len`]). Blocks of rows
/// go to rayon's threads; each row's result does not depend on the split.
pub fn matvec_rows_in(
    w: &TensorRef,
    row_offset: usize,
    x: &[f32],
    out: &mut [f32],
    at: BatchRow,
) -> Result<(), ModelError> {
    assert_eq!(x.len(), w.row_len(), "matvec on '{}': input length", w.name);
    // llama.cpp's tinyBLAS takes F32 matrices of a multiple of 4 rows only; the others go
    // through `ggml_vec_dot_f32`, as a single row does.
    let at = if w.ty == flint_core::GgmlType::F32 && !w.dims[1].is_multiple_of(4) {
        BatchRow::SINGLE.in_build(at.build)
    } else {
        at
    };
    const ROWS: usize = 256;
    let rb = w.row_bytes();
    let bytes = &w.bytes()[row_offset * rb..(row_offset + out.len()) * rb];
    out.par_chunks_mut(ROWS)
        .zip(bytes.par_chunks(ROWS * rb))
        .try_for_each(|(o, wb)| flint_core::dot::matvec_f32_ggml_x86(w.ty, wb, x, o, at))
        .map_err(|e| ModelError::new(format!("matmul on '{}': {e}", w.name)))
}

/// [`matvec_rows_in`] for a row of a large batch ([`BatchRow::IN_BATCH`]).
pub fn matvec_rows(
    w: &TensorRef,
    row_offset: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    matvec_rows_in(w, row_offset, x, out, BatchRow::IN_BATCH)
}

/// `W x` for a matrix `[in, out]`.
pub fn matvec(w: &TensorRef, x: &[f32]) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0.0; w.dims[1]];
    matvec_rows(w, 0, x, &mut out)?;
    Ok(out)
}

/// `rmsnorm(x) * w` (no multiplication when `w` is None), through `flint_core`.
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    flint_core::math::rms_norm(x, w, eps, &mut out);
    out
}

/// NeoX RoPE in place on one head (`flint_core::math::rope_neox`): pairs
/// `(x[i], x[i + n_rot/2])` turned by `pos * base^(-2i/n_rot)`.
pub fn rope_neox(x: &mut [f32], pos: u32, n_rot: usize, base: f32) {
    flint_core::math::rope_neox(x, pos, n_rot, base);
}

/// One query head over the keys and values of positions `0..=pos` (contiguous,
/// `keys[j]`, `values[j]`), with an optional sink logit and window:
/// `o = sum_j e^(s_j - m) v_j / (e^(sink - m) + sum_j e^(s_j - m))`, `m` the max of the
/// scores and the sink, over `j <= pos` and (windowed) `j > pos - W`, `s_j = scale q.k_j`.
///
/// Computed with `flint_core::math::attend_ggml_tiled`, the order of operations of
/// llama.cpp's CPU flash attention for a prompt batch in the given build: on Gemma 3
/// one-ulp differences in the scores or weights grow into 0.1-nat logit differences, so
/// the oracle keeps the roundings of the engine it is checked against.
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    build: GgmlCpuBuild,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    pos: usize,
    scale: f32,
    sink: Option<f32>,
    window: Option<usize>,
) -> Vec<f32> {
    let first = flint_core::math::window_start(pos, window);
    let dv = values[pos].len();
    let mut out = vec![0.0f32; dv];
    flint_core::math::attend_ggml_tiled(
        build,
        q,
        &keys[first..=pos],
        &values[first..=pos],
        first,
        scale,
        sink,
        &mut out,
    );
    out
}

/// MoE routing of one token as the given build of llama.cpp computes it
/// (`flint_core::math::route_topk_in`): scores `gate(logits)`, the `k` experts with the
/// largest `score + bias` (ties: lower index first), their weights the scores
/// renormalised to sum 1 (when `normalize`) times `scale`. Returns `(expert, weight)` in
/// selection order.
pub fn route(
    build: GgmlCpuBuild,
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    gating: Gating,
    normalize: bool,
    scale: f32,
) -> Result<Vec<(usize, f32)>, ModelError> {
    let mut ids = vec![0u32; k];
    let mut w = vec![0.0f32; k];
    flint_core::math::route_topk_in(
        build, logits, bias, k, gating, normalize, scale, &mut ids, &mut w,
    )
    .map_err(|e| ModelError::new(e.to_string()))?;
    Ok(ids.into_iter().map(|e| e as usize).zip(w).collect())
}

/// The reference forward of one sequence: feed tokens one by one, get logits.
#[derive(Debug)]
pub struct Reference<'m> {
    model: &'m Model,
    /// Per layer, per position: the rotated key row `[Hkv * dk]`.
    keys: Vec<Vec<Vec<f32>>>,
    /// Per layer, per position: the value row `[Hkv * dv]`.
    values: Vec<Vec<Vec<f32>>>,
    /// Per Gated DeltaNet layer (empty elsewhere): the recurrent state carried from one
    /// position to the next.
    recurrent: Vec<RecurrentState>,
    /// Tokens fed so far.
    pos: usize,
    /// The length of the llama.cpp prompt batch whose arithmetic is followed, if known
    /// ([`Reference::set_batch_len`]).
    batch_len: Option<usize>,
    /// Whether that batch asks for the logits of its last token only (a generation
    /// prefill) rather than of every token ([`Reference::set_prompt_batch`]).
    last_only: bool,
    /// Where the position being computed sits in llama.cpp's matmuls.
    cur_row: BatchRow,
    /// The llama.cpp CPU build whose attention order is followed
    /// ([`Reference::set_llamacpp_build`]).
    build: GgmlCpuBuild,
    /// The layer being computed.
    cur_layer: usize,
    /// Whether the current layer's FFN is a matmul over the whole prompt batch (not a
    /// decode step, nor the last layer of a prompt that keeps only its output row).
    batch_ffn: bool,
    /// Per layer, per expert: how many rows of the prompt batch llama.cpp routes to the
    /// expert, where known ([`Reference::prefill`]).
    expert_rows: Option<Vec<Vec<usize>>>,
    /// Per layer, per expert: the prompt rows routed so far (counted where `batch_ffn`).
    routed: RefCell<Vec<Vec<usize>>>,
}

impl<'m> Reference<'m> {
    /// An empty sequence.
    pub fn new(model: &'m Model) -> Self {
        let n = model.layers.len();
        let recurrent = model
            .layers
            .iter()
            .map(|l| match (&l.delta_net, model.spec.delta_net) {
                (Some(_), Some(dn)) => RecurrentState::new(&dn),
                _ => RecurrentState::default(),
            })
            .collect();
        Self {
            model,
            keys: vec![Vec::new(); n],
            values: vec![Vec::new(); n],
            recurrent,
            pos: 0,
            batch_len: None,
            last_only: false,
            cur_row: BatchRow::IN_BATCH,
            build: GgmlCpuBuild::Avx512,
            cur_layer: 0,
            batch_ffn: false,
            expert_rows: None,
            routed: RefCell::new(vec![Vec::new(); n]),
        }
    }

    /// Follows the attention and F32 matmul orders of the given build of llama.cpp's CPU
    /// backend (its softmax, f16 dot products and tinyBLAS's F32 kernel sum their lanes by
    /// the build's vector width; see `flint_core::math::attend_ggml_tiled` and
    /// `flint_core::dot::ggml_x86::vec_dot_f32_tinyblas`). Without it, the AVX-512 build's.
    pub fn set_llamacpp_build(&mut self, build: GgmlCpuBuild) {
        self.build = build;
    }

    /// Follows llama.cpp's arithmetic for a prompt batch of `n` tokens starting at
    /// position 0, then one token per decode step: llama.cpp picks its kernels by the
    /// number of tokens in a call and a row's place in it (its repacked Q4_K matmul
    /// computes the last `n % 4` rows of a batch with its gemv kernel, one rounding per
    /// 256 values instead of per 64; Q6_K goes through its tiled matmul from 8 rows up;
    /// flash attention takes its tiled path from 64 rows, below that it goes one key at
    /// a time and accumulates the output in f16).
    /// Without it every position is computed as a row of a large batch
    /// ([`BatchRow::IN_BATCH`]).
    pub fn set_batch_len(&mut self, n: usize) {
        self.batch_len = Some(n);
        self.last_only = false;
    }

    /// As [`Self::set_batch_len`] for a generation prefill, which asks llama.cpp for the
    /// logits of the last prompt token only: llama.cpp then computes the last layer
    /// after its attention output projection for that one row (a matmul of one row, not
    /// of the batch), which changes its kernels there.
    pub fn set_prompt_batch(&mut self, n: usize) {
        self.batch_len = Some(n);
        self.last_only = true;
    }

    /// Feeds `prompt` as one llama.cpp batch from position 0 ([`Self::set_prompt_batch`]
    /// when `last_only`, else [`Self::set_batch_len`]) and returns the logits of every
    /// position, or of the last one only when `last_only`.
    ///
    /// llama.cpp's expert matmul (`MUL_MAT_ID`) picks an expert's Q5_K / Q6_K kernel by
    /// the number of the batch's rows routed to that expert, which the routing of the
    /// whole batch decides, while this forward computes one position at a time. So a
    /// prompt of an MoE model runs again with the per-expert counts the previous pass
    /// routed, until the counts a pass assumed are the counts it routed (two passes
    /// unless a last bit moved a routing choice); one that has not settled after
    /// [`PREFILL_PASSES`] passes is an error.
    pub fn prefill(
        &mut self,
        prompt: &[u32],
        last_only: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if !self.is_empty() {
            return Err(ModelError::new(format!(
                "prefill needs an empty sequence, this one holds {} tokens",
                self.len()
            )));
        }
        let moe = self
            .model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, Ffn::Moe(_)));
        let mut assumed: Option<Vec<Vec<usize>>> = None;
        for _ in 0..PREFILL_PASSES {
            self.clear();
            if last_only {
                self.set_prompt_batch(prompt.len());
            } else {
                self.set_batch_len(prompt.len());
            }
            self.expert_rows = assumed.clone();
            for r in self.routed.get_mut().iter_mut() {
                r.clear();
            }
            let mut out = Vec::with_capacity(if last_only { 1 } else { prompt.len() });
            for (i, &t) in prompt.iter().enumerate() {
                let logits = self.forward(t)?;
                if !last_only || i + 1 == prompt.len() {
                    out.push(logits);
                }
            }
            let routed = self.routed.get_mut().clone();
            if !moe || assumed.as_ref() == Some(&routed) {
                return Ok(out);
            }
            assumed = Some(routed);
        }
        Err(ModelError::new(format!(
            "the prompt's expert routing did not settle in {PREFILL_PASSES} passes"
        )))
    }

    /// `W x` for the position being computed.
    fn mv(&self, w: &TensorRef, x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0.0; w.dims[1]];
        matvec_rows_in(w, 0, x, &mut out, self.cur_row)?;
        Ok(out)
    }

    /// Where position `pos` sits in llama.cpp's matmuls (see [`Self::set_batch_len`]).
    fn batch_row(&self, pos: usize) -> BatchRow {
        match self.batch_len {
            Some(n) if pos < n => BatchRow::at(n, pos),
            Some(_) => BatchRow::SINGLE,
            None => BatchRow::IN_BATCH,
        }
        .in_build(self.build)
    }

    /// Tokens fed so far (= the position of the next token).
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the sequence.
    pub fn clear(&mut self) {
        for k in &mut self.keys {
            k.clear();
        }
        for v in &mut self.values {
            v.clear();
        }
        for r in &mut self.recurrent {
            r.conv.fill(0.0);
            r.delta.fill(0.0);
        }
        self.pos = 0;
    }

    /// Feeds `token` at the next position and returns the logits predicting the one
    /// after it.
    pub fn forward(&mut self, token: u32) -> Result<Vec<f32>, ModelError> {
        let m = self.model;
        let spec = &m.spec;
        if token as usize >= spec.vocab {
            return Err(ModelError::new(format!(
                "token id {token} is outside the vocabulary of {}",
                spec.vocab
            )));
        }
        let pos = self.len();
        self.cur_row = self.batch_row(pos);
        if pos >= spec.context_length {
            return Err(ModelError::new(format!(
                "position {pos} is beyond the model's context length {}",
                spec.context_length
            )));
        }
        let mut x = vec![0.0f32; spec.d];
        flint_core::dequant::dequantize(m.token_embd.ty, m.token_embd.row(token as usize), &mut x)
            .map_err(|e| ModelError::new(format!("token_embd row {token}: {e}")))?;
        if spec.embed_scale != 1.0 {
            for v in &mut x {
                *v *= spec.embed_scale;
            }
        }
        let per_layer = match &m.per_layer {
            Some(pl) => Some(self.per_layer_inputs(pl, token, &x)?),
            None => None,
        };
        let last = m.layers.len().saturating_sub(1);
        self.pos += 1;
        let in_batch = self.batch_len.is_some_and(|n| pos < n);
        for (il, layer) in m.layers.iter().enumerate() {
            self.cur_layer = il;
            self.batch_ffn = in_batch;
            let attn = match &layer.delta_net {
                Some(dn) => self.delta_net(il, layer, dn, &x)?,
                None => self.attention(il, layer, &x, pos)?,
            };
            if il == last && self.last_only && self.batch_len.is_some_and(|n| pos < n) {
                // llama.cpp keeps only the output row from here on (`inp_out_ids`).
                self.cur_row = BatchRow::SINGLE.in_build(self.build);
                self.batch_ffn = false;
            }
            let attn = match &layer.post_attn_norm {
                Some(w) => rms_norm(&attn, Some(w), spec.rms_eps),
                None => attn,
            };
            add(&mut x, &attn);
            let f = rms_norm(&x, Some(&layer.ffn_norm), spec.rms_eps);
            let y = self.ffn_of(&layer.ffn, &f, &x)?;
            let y = match &layer.post_ffn_norm {
                Some(w) => rms_norm(&y, Some(w), spec.rms_eps),
                None => y,
            };
            add(&mut x, &y);
            if let (Some(li), Some(inputs)) = (&layer.per_layer, &per_layer) {
                let p = spec.per_layer_input;
                let input = &inputs[il * p..(il + 1) * p];
                let gate = self.mv(&li.inp_gate, &x)?;
                let g: Vec<f32> = gate
                    .iter()
                    .zip(input)
                    .map(|(&g, &i)| gelu_tanh_ggml_f16(g) * i)
                    .collect();
                let y = self.mv(&li.proj, &g)?;
                let y = rms_norm(&y, Some(&li.post_norm), spec.rms_eps);
                add(&mut x, &y);
            }
            if let Some(s) = layer.out_scale {
                for v in &mut x {
                    *v *= s;
                }
            }
        }
        let h = rms_norm(&x, Some(&m.output_norm), spec.rms_eps);
        let mut logits = self.mv(&m.output, &h)?;
        soft_cap(&mut logits, spec.logit_softcap);
        Ok(logits)
    }

    /// Gemma 4's per-layer inputs of one token, `[L][P]` flattened, as llama.cpp's
    /// `build_inp_per_layer` and `project_per_layer_inputs` compute them from the token
    /// and its scaled embedding `x`.
    fn per_layer_inputs(
        &self,
        pl: &PerLayerInputs,
        token: u32,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let spec = &self.model.spec;
        let p = spec.per_layer_input;
        let mut emb = vec![0.0f32; pl.token_embd.row_len()];
        flint_core::dequant::dequantize(
            pl.token_embd.ty,
            pl.token_embd.row(token as usize),
            &mut emb,
        )
        .map_err(|e| ModelError::new(format!("per_layer_token_embd row {token}: {e}")))?;
        let emb_scale = (p as f32).sqrt();
        let mut proj = self.mv(&pl.model_proj, x)?;
        let proj_scale = 1.0 / (spec.d as f32).sqrt();
        for v in &mut proj {
            *v *= proj_scale;
        }
        let input_scale = 1.0 / 2f32.sqrt();
        let mut out = Vec::with_capacity(proj.len());
        for (chunk, e) in proj.chunks(p).zip(emb.chunks(p)) {
            let n = rms_norm(chunk, Some(&pl.proj_norm), spec.rms_eps);
            out.extend(
                n.iter()
                    .zip(e)
                    .map(|(&a, &b)| (a + b * emb_scale) * input_scale),
            );
        }
        Ok(out)
    }

    fn attention(
        &mut self,
        il: usize,
        layer: &Layer,
        x: &[f32],
        pos: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let spec = &self.model.spec;
        let ld = &spec.layers[il];
        let (h, hkv, dk, dv) = (spec.n_heads, ld.n_kv_heads, ld.head_dim_k, ld.head_dim_v);
        let rope = layer_rope(spec, il, self.model.rope_freqs.as_deref());
        let a = rms_norm(x, Some(&layer.attn_norm), spec.rms_eps);
        let mut q = self.mv(&layer.wq, &a)?;
        // Qwen 3.5's gated attention: per head, `dk` query values then `dk` gate values.
        let gate = if ld.attn_gate {
            let (mut qs, mut gs) = (Vec::with_capacity(h * dk), Vec::with_capacity(h * dk));
            for head in q.chunks_exact(2 * dk) {
                qs.extend_from_slice(&head[..dk]);
                gs.extend(head[dk..].iter().map(|&g| sigmoid_ggml(g)));
            }
            q = qs;
            Some(gs)
        } else {
            None
        };
        // A layer reading another layer's KV (gemma4's shared-KV layers) computes only
        // its queries.
        let own_kv = ld.kv_source.is_none();
        let (mut k, mut v) = if own_kv {
            (self.mv(&layer.wk, &a)?, self.mv(&layer.wv, &a)?)
        } else {
            (Vec::new(), Vec::new())
        };
        for (t, b) in [
            (&mut q, &layer.bq),
            (&mut k, &layer.bk),
            (&mut v, &layer.bv),
        ] {
            if let Some(b) = b {
                add(t, b);
            }
        }
        for head in q.chunks_mut(dk) {
            if let Some(w) = &layer.q_norm {
                let n = rms_norm(head, Some(w), spec.rms_eps);
                head.copy_from_slice(&n);
            }
            flint_core::math::rope(head, pos as u32, &rope);
        }
        // A pre-scaled query (Gemma 3 in llama.cpp: `ggml_scale` on the rotated queries,
        // attention scale 1): its small-batch attention rounds the queries to f16 after
        // that, so the order matters to the bit.
        let attn_scale = if spec.q_prescaled {
            for v in q.iter_mut() {
                *v *= spec.attn_scale;
            }
            1.0
        } else {
            spec.attn_scale
        };
        for head in k.chunks_mut(dk) {
            if let Some(w) = &layer.k_norm {
                let n = rms_norm(head, Some(w), spec.rms_eps);
                head.copy_from_slice(&n);
            }
            flint_core::math::rope(head, pos as u32, &rope);
        }
        if spec.v_norm {
            for head in v.chunks_mut(dv) {
                let n = rms_norm(head, None, spec.rms_eps);
                head.copy_from_slice(&n);
            }
        }
        // The cache holds keys and values rounded to f16, as llama.cpp's default cache
        // types (`type_k`, `type_v` F16) do: part of what its logits are.
        let v: Vec<f32> = v
            .into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect();
        let k: Vec<f32> = k
            .into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect();
        let kl = spec.kv_layer(il);
        if own_kv {
            self.keys[il].push(k);
            self.values[il].push(v);
        }
        let window = spec.layer_window(il);
        let group = h / hkv;
        let mut o = Vec::with_capacity(h * dv);
        for hq in 0..h {
            let g = hq / group;
            let ks: Vec<&[f32]> = self.keys[kl]
                .iter()
                .map(|r| &r[g * dk..(g + 1) * dk])
                .collect();
            let vs: Vec<&[f32]> = self.values[kl]
                .iter()
                .map(|r| &r[g * dv..(g + 1) * dv])
                .collect();
            let sink = layer.sinks.as_ref().map(|s| s[hq]);
            let qh = &q[hq * dk..(hq + 1) * dk];
            if self.cur_row.batch >= flint_core::math::GGML_FA_TILE_Q {
                o.extend(attend_head(
                    self.build, qh, &ks, &vs, pos, attn_scale, sink, window,
                ));
            } else {
                // A llama.cpp call of fewer query rows: its one-key-at-a-time path, the
                // output accumulated in f16.
                let first = flint_core::math::window_start(pos, window);
                let mut out = vec![0.0f32; dv];
                flint_core::math::attend_ggml_one_chunk(
                    self.build,
                    qh,
                    &ks[first..=pos],
                    &vs[first..=pos],
                    attn_scale,
                    sink,
                    &mut out,
                );
                o.extend(out);
            }
        }
        if let Some(g) = gate {
            for (v, g) in o.iter_mut().zip(&g) {
                *v *= g;
            }
        }
        let mut out = self.mv(&layer.wo, &o)?;
        if let Some(b) = &layer.bo {
            add(&mut out, b);
        }
        if spec.value_scale != 1.0 {
            for v in &mut out {
                *v *= spec.value_scale;
            }
        }
        Ok(out)
    }

    /// A Gated DeltaNet layer on the residual row `x` of the position being computed,
    /// as llama.cpp's `qwen35moe` graph computes it (`build_layer_attn_linear`; the math
    /// and float order are `flint_core::math::delta`'s): the projections, the causal
    /// convolution with SiLU over the carried window, the L2-normed q and k, the gated
    /// delta rule over the carried state, the per-head RMSNorm times `silu(z)`, `ssm_out`.
    fn delta_net(
        &mut self,
        il: usize,
        layer: &Layer,
        dn: &DeltaNetLayer,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let spec = &self.model.spec;
        let Some(desc) = spec.delta_net else {
            return Err(ModelError::new(format!(
                "layer {il} is a Gated DeltaNet layer in a model without DeltaNet sizes"
            )));
        };
        let shape = desc.shape;
        let eps = spec.rms_eps;
        let a = rms_norm(x, Some(&layer.attn_norm), eps);
        let qkv = self.mv(&dn.qkv, &a)?;
        let z = self.mv(&dn.gate, &a)?;
        let beta: Vec<f32> = self
            .mv(&dn.beta, &a)?
            .into_iter()
            .map(sigmoid_ggml)
            .collect();
        let alpha = self.mv(&dn.alpha, &a)?;
        let g: Vec<f32> = alpha
            .iter()
            .zip(dn.dt_bias.iter().zip(&dn.a))
            .map(|(&al, (&dt, &sa))| flint_core::math::delta_net_gate(al, dt, sa))
            .collect();
        let st = &mut self.recurrent[il];
        let mut conv = vec![0.0f32; qkv.len()];
        flint_core::math::ssm_conv(&qkv, &dn.conv, desc.conv_kernel, &mut st.conv, &mut conv);
        for v in &mut conv {
            *v = silu(*v);
        }
        let qk = shape.qk_len();
        let (q, rest) = conv.split_at_mut(qk);
        let (k, v) = rest.split_at_mut(qk);
        flint_core::math::l2_norm_heads(q, shape.head_dim, eps);
        flint_core::math::l2_norm_heads(k, shape.head_dim, eps);
        let mut o = vec![0.0f32; shape.v_len()];
        flint_core::math::gated_delta_net(&shape, q, k, v, &g, &beta, &mut st.delta, &mut o);
        for (oh, zh) in o
            .chunks_exact_mut(shape.head_dim)
            .zip(z.chunks_exact(shape.head_dim))
        {
            flint_core::math::rms_norm_in_place(oh, Some(&dn.norm), eps);
            for (v, &zv) in oh.iter_mut().zip(zh) {
                *v *= silu(zv);
            }
        }
        self.mv(&dn.out, &o)
    }

    /// Layer `il`'s FFN on one normed row `f` (for tests of the MoE pieces; Gemma 4's
    /// router and expert branch read `f` as the residual stream).
    pub fn layer_ffn(&self, il: usize, f: &[f32]) -> Result<Vec<f32>, ModelError> {
        self.ffn_of(&self.model.layers[il].ffn, f, f)
    }

    /// Where the position being computed sits in llama.cpp's matmuls of `mlp`: an expert
    /// tower (`[in, out, E]`) is a `MUL_MAT_ID`, whose rows take the expert kernels
    /// ([`BatchRow::expert`]) by the number of the batch's rows routed to `expert`. A
    /// prompt run by [`Self::prefill`] knows those counts; elsewhere the batch's row count
    /// stands for them (exact for single rows).
    fn mlp_row(&self, mlp: &Mlp, expert: usize) -> BatchRow {
        if mlp.gate.dims.len() == 3 {
            let routed = self.expert_rows.as_ref().filter(|_| self.batch_ffn);
            let rows = routed
                .and_then(|c| c.get(self.cur_layer)?.get(expert).copied())
                .unwrap_or(self.cur_row.batch);
            BatchRow::expert(rows).in_build(self.build)
        } else {
            self.cur_row
        }
    }

    /// A gated MLP (expert `expert` of a tower, or 0 for a plain matrix set) on `f`.
    pub fn mlp(&self, mlp: &Mlp, expert: usize, f: &[f32]) -> Result<Vec<f32>, ModelError> {
        self.mlp_biased(mlp, None, expert, f)
    }

    /// [`mlp`](Self::mlp) with the towers' biases of expert `expert` added to its gate,
    /// up and down projections (gpt-oss; llama.cpp's `ggml_add_id` after each
    /// `MUL_MAT_ID`).
    fn mlp_biased(
        &self,
        mlp: &Mlp,
        biases: Option<&ExpertBiases>,
        expert: usize,
        f: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let width = mlp.gate.dims[1];
        let d_out = mlp.down.dims[1];
        let mut g = vec![0.0; width];
        let mut u = vec![0.0; width];
        let at = self.mlp_row(mlp, expert);
        matvec_rows_in(&mlp.gate, expert * width, f, &mut g, at)?;
        matvec_rows_in(&mlp.up, expert * width, f, &mut u, at)?;
        if let Some(b) = biases {
            add(&mut g, &b.gate[expert * width..(expert + 1) * width]);
            add(&mut u, &b.up[expert * width..(expert + 1) * width]);
        }
        let act = self.model.spec.activation;
        let hidden: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| match act {
                Activation::Silu => silu(g) * u,
                Activation::GeluTanh => gelu_tanh_ggml_f16(g) * u,
                Activation::SwigluOai => swiglu_oai(g, u),
            })
            .collect();
        let mut y = vec![0.0; d_out];
        matvec_rows_in(&mlp.down, expert * d_out, &hidden, &mut y, at)?;
        if let Some(b) = biases {
            add(&mut y, &b.down[expert * d_out..(expert + 1) * d_out]);
        }
        Ok(y)
    }

    /// The FFN on the pre-FFN norm's output `f`; `resid` is the residual stream it came
    /// from (Gemma 4's router and expert branch read it).
    fn ffn_of(&self, ffn: &Ffn, f: &[f32], resid: &[f32]) -> Result<Vec<f32>, ModelError> {
        match ffn {
            Ffn::Dense(mlp) => self.mlp(mlp, 0, f),
            Ffn::Moe(moe) => {
                let Some(ms) = self.model.spec.moe else {
                    return Err(ModelError::new("MoE layer in a model without MoE settings"));
                };
                let eps = self.model.spec.rms_eps;
                // Gemma 4: the experts' input is `pre_ffw_norm_2` of the residual stream.
                let expert_in = match &moe.parallel {
                    Some(p) => rms_norm(resid, Some(&p.pre_norm_2), eps),
                    None => f.to_vec(),
                };
                let resid_f = f;
                let f = expert_in.as_slice();
                let mut logits = match &moe.router_scale {
                    // llama.cpp's gemma4 graph: rms_norm, scale by 1/sqrt(d), mul.
                    Some(s) => {
                        let mut r = rms_norm(resid, None, eps);
                        let inv = 1.0 / (r.len() as f32).sqrt();
                        for (v, w) in r.iter_mut().zip(s) {
                            *v = *v * inv * w;
                        }
                        self.mv(&moe.router, &r)?
                    }
                    None => self.mv(&moe.router, f)?,
                };
                if let Some(rb) = &moe.router_bias {
                    add(&mut logits, rb);
                }
                let chosen = route(
                    self.build,
                    &logits,
                    moe.bias.as_deref(),
                    ms.used,
                    ms.gating,
                    ms.normalize,
                    ms.scale,
                )?;
                if self.batch_ffn {
                    let mut routed = self.routed.borrow_mut();
                    let counts = &mut routed[self.cur_layer];
                    counts.resize(moe.experts.gate.dims[2], 0);
                    for &(e, _) in &chosen {
                        counts[e] += 1;
                    }
                }
                let mut y = vec![0.0f32; f.len()];
                for (e, w) in chosen {
                    let ye = self.mlp_biased(&moe.experts, moe.expert_biases.as_ref(), e, f)?;
                    let s = moe.expert_scale.as_ref().map_or(1.0, |s| s[e]);
                    // `b * 1.0` is `b`: without a per-expert scale this is `w * b`.
                    for (a, b) in y.iter_mut().zip(&ye) {
                        *a += w * (b * s);
                    }
                }
                if let Some(sh) = &moe.shared {
                    let mut ys = self.mlp(sh, 0, f)?;
                    if let Some(gw) = &moe.shared_gate {
                        let g = sigmoid_ggml(self.mv(gw, f)?[0]);
                        for v in &mut ys {
                            *v *= g;
                        }
                    }
                    add(&mut y, &ys);
                }
                if let Some(p) = &moe.parallel {
                    // The dense branch on the usual pre-FFN norm's output, then both
                    // branches' post-norms, then their sum.
                    let dense = self.mlp(&p.mlp, 0, resid_f)?;
                    let mut out = rms_norm(&dense, Some(&p.post_norm_1), eps);
                    add(&mut out, &rms_norm(&y, Some(&p.post_norm_2), eps));
                    return Ok(out);
                }
                Ok(y)
            }
        }
    }
}

/// The recurrent state of one Gated DeltaNet layer for one sequence (zeros at its
/// start): the convolution window (`conv_dim` rows of `conv_kernel - 1` inputs, as
/// `flint_core::math::ssm_conv` carries it) and the delta-rule state (`heads_v` blocks of
/// `head_dim^2`, as `flint_core::math::gated_delta_net` carries it).
#[derive(Clone, Debug, Default)]
struct RecurrentState {
    conv: Vec<f32>,
    delta: Vec<f32>,
}

impl RecurrentState {
    fn new(desc: &crate::model::DeltaNetDesc) -> Self {
        Self {
            conv: vec![0.0; desc.conv_dim() * desc.conv_kernel.saturating_sub(1)],
            delta: vec![0.0; desc.shape.state_len()],
        }
    }
}

fn add(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}
