//! `gemma4`: Gemma 4 (E2B, E4B, 26B-A4B, 31B), as llama.cpp reads it
//! (`src/models/gemma4.cpp` `load_arch_hparams` / `load_arch_tensors`, the shared keys of
//! `llama_model_base::load_hparams`) and its converter writes it
//! (`conversion/gemma.py` `Gemma4Model`).
//!
//! - Layers: `attention.sliding_window_pattern` (one bool per block, required) tells the
//!   sliding layers; they have their own head sizes (`attention.key_length_swa`,
//!   `value_length_swa`), rotated dims (`rope.dimension_count_swa`) and RoPE base
//!   (`rope.freq_base_swa`, default 10000). Full layers divide their frequencies by
//!   `rope_freqs` (the converter's "proportional" RoPE).
//! - KV: the last `attention.shared_kv_layers` layers write no KV; a sliding one reads
//!   layer `n - 2`'s, a full one layer `n - 1`'s, where `n` is the first shared layer
//!   (llama.cpp's `reuse` callback; those two layers must be sliding and full).
//! - Attention: per-head Q and K RMSNorms, V RMS-normed without a weight, scale 1; a
//!   layer without `attn_v` uses its keys as values (`attention_k_eq_v`).
//! - FFN: a dense GELU MLP of `feed_forward_length` (a scalar or one per block) on every
//!   layer; a layer with a router (`ffn_gate_inp`) also runs `expert_count` experts of
//!   `expert_feed_forward_length` beside it (see [`FfnDesc::Moe`]'s `parallel_dense`):
//!   softmax over every expert, top-k, weights renormalised, each expert's output scaled
//!   by `ffn_down_exps.scale`.
//! - Per-layer token embeddings when `embedding_length_per_layer_input` is nonzero, a
//!   scale on each layer's output (`layer_output_scale`), final logit soft-capping.

use flint_core::math::Gating;

use super::desc::{
    Activation, Arch, AttnBiases, FfnDesc, LayerDesc, Mixer, ModelDesc, MoeDesc, NormPlacement,
    RopeDesc, RopeKind,
};
use super::moe::per_block;
use super::parse::{check_len, read_scaling, Keys};
use super::tensors::Claims;
use super::util::positive;
use super::ConfigError;
use crate::gguf::GgufFile;

/// llama.cpp's `rope.freq_base` default.
const ROPE_BASE_DEFAULT: f32 = 10_000.0;
/// llama.cpp's `rope_freq_base_train_swa` default.
const ROPE_BASE_SWA_DEFAULT: f32 = 10_000.0;

/// Reads the hyper-parameters of a `gemma4` file (tensor facts left at their defaults).
pub(crate) fn read(f: &GgufFile) -> Result<ModelDesc, ConfigError> {
    let arch = Arch::Gemma4;
    let ks = Keys { f, arch };
    let k = |s: &str| ks.k(s);
    let context_length = ks.size("context_length")?;
    let d = ks.size("embedding_length")?;
    let l = ks.size("block_count")?;
    if let Some(n) = f.opt_usize(&k("nextn_predict_layers"))?.filter(|&n| n > 0) {
        return Err(ConfigError::invalid(
            &k("nextn_predict_layers"),
            format!("is {n}: gemma4 has no NextN/MTP layers"),
        ));
    }
    let heads = per_block(&ks, "attention.head_count", l, 0)?;
    let h = heads[0];
    if heads.iter().any(|&x| x != h) {
        return Err(ConfigError::invalid(
            &k("attention.head_count"),
            format!(
                "differs between layers ({heads:?}): per-layer query head counts are not supported"
            ),
        ));
    }
    let hkv_all = per_block(&ks, "attention.head_count_kv", l, h)?;
    for &hkv in &hkv_all {
        ks.check_kv_heads(h, hkv)?;
    }
    let dk = match ks.opt_size("attention.key_length")? {
        Some(v) => v,
        None => ks.default_head("attention.key_length", d, h)?,
    };
    let dv = match ks.opt_size("attention.value_length")? {
        Some(v) => v,
        None => ks.default_head("attention.value_length", d, h)?,
    };
    // llama.cpp: "Gemma 4 requires n_embd_head_k == n_embd_head_v", on both kinds.
    ks.check_equal_heads(dk, dv)?;
    let dk_swa = ks.opt_size("attention.key_length_swa")?.unwrap_or(dk);
    let dv_swa = ks.opt_size("attention.value_length_swa")?.unwrap_or(dv);
    if dv_swa != dk_swa {
        return Err(ConfigError::invalid(
            &k("attention.value_length_swa"),
            format!("is {dv_swa}, key_length_swa is {dk_swa}: gemma4 needs equal head sizes"),
        ));
    }
    let eps_key = k("attention.layer_norm_rms_epsilon");
    let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;
    let n_rot = ks.opt_size("rope.dimension_count")?.unwrap_or(dk);
    ks.check_n_rot(n_rot, dk, false)?;
    let n_rot_swa = ks.opt_size("rope.dimension_count_swa")?.unwrap_or(n_rot);
    if !n_rot_swa.is_multiple_of(2) || n_rot_swa > dk_swa {
        return Err(ConfigError::invalid(
            &k("rope.dimension_count_swa"),
            format!("is {n_rot_swa}: it must be even and at most key_length_swa {dk_swa}"),
        ));
    }
    let rope_base = ks
        .opt_positive("rope.freq_base")?
        .unwrap_or(ROPE_BASE_DEFAULT);
    let rope_base_swa = ks
        .opt_positive("rope.freq_base_swa")?
        .unwrap_or(ROPE_BASE_SWA_DEFAULT);
    let scaling = read_scaling(&ks, context_length)?;
    let window = ks.size("attention.sliding_window")?;
    let pat_key = k("attention.sliding_window_pattern");
    let sliding = f.get_bool_array(&pat_key)?.to_vec();
    check_len(&pat_key, sliding.len(), l)?;

    // Shared KV: llama.cpp's `n_layer_kv_from_start` and `reuse` callback.
    let shared_key = k("attention.shared_kv_layers");
    let shared = f.opt_usize(&shared_key)?.unwrap_or(0);
    let from = l.saturating_sub(shared);
    if shared > 0 && (shared > l || from < 2 || !sliding[from - 2] || sliding[from - 1]) {
        return Err(ConfigError::invalid(
            &shared_key,
            format!(
                "is {shared} of {l} layers: the two layers before the first shared one must \
                 exist and be a sliding then a full layer (they hold the shared KV)"
            ),
        ));
    }
    let kv_source = |i: usize, sl: bool| {
        (shared > 0 && i >= from).then(|| if sl { from - 2 } else { from - 1 })
    };

    let ple_key = k("embedding_length_per_layer_input");
    let per_layer_input = f.get_usize(&ple_key)?;
    let softcap_key = k("final_logit_softcapping");
    let logit_softcap = match f.opt_f32(&softcap_key)?.filter(|&c| c != 0.0) {
        Some(c) => Some(positive(&softcap_key, c)?),
        None => None,
    };
    let ff = per_block(&ks, "feed_forward_length", l, 0)?;
    if let Some(i) = ff.iter().position(|&w| w == 0) {
        return Err(ConfigError::invalid(
            &k("feed_forward_length"),
            format!("missing or zero for layer {i}"),
        ));
    }
    let moe = match f.opt_usize(&k("expert_count"))?.filter(|&e| e > 0) {
        None => None,
        Some(_) => {
            let (e, used) = ks.experts()?;
            let widths = per_block(&ks, "expert_feed_forward_length", l, 0)?;
            let fe_key = k("expert_feed_forward_length");
            let fe = match widths.first() {
                Some(&w) if w > 0 && widths.iter().all(|&x| x == w) => w,
                Some(0) | None => return Err(ConfigError::invalid(&fe_key, "missing")),
                Some(_) => {
                    return Err(ConfigError::invalid(
                        &fe_key,
                        format!("differs between layers ({widths:?}): per-layer expert widths are not supported"),
                    ))
                }
            };
            Some(MoeDesc {
                experts: e,
                used,
                expert_width: fe,
                shared_count: 0,
                shared_width: fe,
                gating: Gating::Softmax,
                normalize: true,
                scale: 1.0,
                leading_dense: 0,
                router_bias: false,
                expert_biases: false,
                router_input_scale: true,
                expert_out_scale: false,
                shared_gate: false,
            })
        }
    };
    let layers = sliding
        .iter()
        .enumerate()
        .map(|(i, &sl)| LayerDesc {
            mixer: Mixer::Attention,
            attn_gate: false,
            sliding: sl,
            rope_base: if sl { rope_base_swa } else { rope_base },
            rope_freq_scale: if sl { 1.0 } else { scaling.freq_scale },
            qk_norm: true,
            sinks: false,
            n_kv_heads: hkv_all[i],
            biases: AttnBiases::default(),
            // Which layers route is told by the tensors (`check_tensors`).
            ffn: match moe {
                Some(_) => FfnDesc::Moe {
                    selection_bias: false,
                    shared_expert: false,
                    parallel_dense: Some(ff[i]),
                },
                None => FfnDesc::Dense { width: ff[i] },
            },
            head_dim_k: if sl { dk_swa } else { dk },
            head_dim_v: if sl { dv_swa } else { dv },
            n_rot: if sl { n_rot_swa } else { n_rot },
            rope_freq_factors: false,
            kv_source: kv_source(i, sl),
            out_scale: false,
        })
        .collect();
    Ok(ModelDesc {
        arch,
        d,
        n_heads: h,
        n_kv_heads: hkv_all.iter().copied().max().unwrap_or(h),
        head_dim_k: dk,
        head_dim_v: dv,
        rms_eps,
        vocab: 0,
        tied_output: false,
        context_length,
        embed_scale: (d as f32).sqrt(),
        attn_scale: 1.0,
        q_prescaled: false,
        logit_softcap,
        activation: Activation::GeluTanh,
        norms: NormPlacement::PrePost,
        rope: RopeDesc {
            kind: RopeKind::Neox,
            n_rot,
            freq_factors: false,
            yarn: scaling.yarn,
        },
        window: Some(window),
        moe,
        layers,
        skipped_layers: Vec::new(),
        value_scale: 1.0,
        v_norm: true,
        delta_net: None,
        per_layer_input,
        ffn_norm_tensor: "ffn_norm",
    })
}

/// Checks the tensors of a `gemma4` file against `desc` and fills in what they tell:
/// vocabulary size, tied output, the full layers' RoPE factors, which layers route,
/// the experts' output scale, the layers' output scales.
pub(crate) fn check_tensors(desc: &mut ModelDesc, f: &GgufFile) -> Result<(), ConfigError> {
    let arch = desc.arch;
    let mut c = Claims {
        f,
        claimed: Default::default(),
    };
    let (d, h, l) = (desc.d, desc.n_heads, desc.layers.len());
    let vocab = c.embedding(d)?;
    desc.vocab = vocab;
    desc.tied_output = c.opt("output.weight", &[d, vocab], false)?.is_none();
    let p = desc.per_layer_input;
    if p > 0 {
        c.req("per_layer_token_embd.weight", &[p * l, vocab], false)?;
        c.req("per_layer_model_proj.weight", &[d, p * l], false)?;
        c.req("per_layer_proj_norm.weight", &[p], true)?;
    }
    // The full layers' factors, `[key_length / 2]` (llama.cpp creates it with the head
    // size; ggml reads `n_rot / 2` of it).
    let factors = c
        .opt("rope_freqs.weight", &[desc.head_dim_k / 2], true)?
        .is_some();
    if factors && desc.rope.n_rot != desc.head_dim_k {
        return Err(ConfigError::invalid(
            &format!("{}.rope.dimension_count", arch.name()),
            format!(
                "is {}, key_length is {}: rope_freqs needs them equal",
                desc.rope.n_rot, desc.head_dim_k
            ),
        ));
    }
    desc.rope.freq_factors = factors;
    let ms = desc.moe;
    let mut expert_scale: Option<bool> = None;
    for (i, layer) in desc.layers.iter_mut().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (hkv, dk, dv) = (layer.n_kv_heads, layer.head_dim_k, layer.head_dim_v);
        layer.rope_freq_factors = factors && !layer.sliding;
        let own_kv = layer.kv_source.is_none();
        c.req(&n("attn_norm.weight"), &[d], true)?;
        c.req(&n("attn_q.weight"), &[d, h * dk], false)?;
        c.req(&n("attn_q_norm.weight"), &[dk], true)?;
        // Shared-KV layers may carry K/V projections (the converter keeps them); they
        // are accepted and never read.
        if own_kv {
            c.req(&n("attn_k.weight"), &[d, hkv * dk], false)?;
            c.req(&n("attn_k_norm.weight"), &[dk], true)?;
        } else {
            c.opt(&n("attn_k.weight"), &[d, hkv * dk], false)?;
            c.opt(&n("attn_k_norm.weight"), &[dk], true)?;
        }
        c.opt(&n("attn_v.weight"), &[d, hkv * dv], false)?;
        c.req(&n("attn_output.weight"), &[h * dv, d], false)?;
        c.req(&n("post_attention_norm.weight"), &[d], true)?;
        layer.out_scale = c
            .opt(&n("layer_output_scale.weight"), &[1], true)?
            .is_some();
        c.req(&n("ffn_norm.weight"), &[d], true)?;
        c.req(&n("post_ffw_norm.weight"), &[d], true)?;
        let routed = f.tensor(&n("ffn_gate_inp.weight")).is_some();
        match (&mut layer.ffn, ms) {
            (FfnDesc::Moe { parallel_dense, .. }, Some(m)) if routed => {
                let width = parallel_dense.unwrap_or(0);
                c.dense_ffn(i, d, width)?;
                c.req(&n("ffn_gate_inp.weight"), &[d, m.experts], false)?;
                c.req(&n("ffn_gate_inp.scale"), &[d], true)?;
                for s in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
                    c.req(&n(&format!("{s}.weight")), &[d], true)?;
                }
                c.experts(i, d, m.expert_width, m.experts)?;
                let scaled = c
                    .opt(&n("ffn_down_exps.scale"), &[m.experts], true)?
                    .is_some();
                match expert_scale {
                    None => expert_scale = Some(scaled),
                    Some(s) if s != scaled => {
                        return Err(ConfigError::invalid(
                            &n("ffn_down_exps.scale"),
                            "is present on some MoE layers and absent on others",
                        ))
                    }
                    Some(_) => {}
                }
            }
            (ffn, _) => {
                let width = match *ffn {
                    FfnDesc::Dense { width } => width,
                    FfnDesc::Moe { parallel_dense, .. } => parallel_dense.unwrap_or(0),
                };
                *ffn = FfnDesc::Dense { width };
                c.dense_ffn(i, d, width)?;
            }
        }
        if p > 0 {
            c.req(&n("inp_gate.weight"), &[d, p], false)?;
            c.req(&n("proj.weight"), &[p, d], false)?;
            c.req(&n("post_norm.weight"), &[d], true)?;
        }
    }
    match (desc.moe.as_mut(), expert_scale) {
        (Some(m), Some(s)) => m.expert_out_scale = s,
        // `expert_count` set but no layer routes: a dense model.
        (Some(_), None) => desc.moe = None,
        _ => {}
    }
    c.finish(arch)
}
