//! `qwen35moe`: Qwen 3.5 MoE (35B-A3B and its larger siblings), as llama.cpp reads it
//! (`src/models/qwen35moe.cpp` `load_arch_hparams` / `load_arch_tensors`, the shared keys
//! of `llama_model_base::load_hparams`) and its converter writes it (`conversion/qwen.py`
//! `Qwen3_5MoeTextModel`).
//!
//! - Layers: `attention.recurrent_layers` (one flag per block) names the Gated DeltaNet
//!   layers; without it every layer `i` with `(i + 1) % full_attention_interval != 0`
//!   is one (interval default 4: three DeltaNet layers, then an attention layer).
//! - DeltaNet: `ssm.conv_kernel`, `ssm.state_size` (head size), `ssm.group_count` (key
//!   heads), `ssm.time_step_rank` (value heads), `ssm.inner_size` (must be value heads
//!   times head size), all required ([`DeltaNetDesc`]).
//! - Attention: the query projection holds a gate per head ([`LayerDesc::attn_gate`]),
//!   per-head Q/K RMSNorms, scale `1/sqrt(dk)`, `dk = dv`.
//! - RoPE: llama.cpp's interleaved multi-section RoPE (`IMROPE`) over `n_rot` dims with
//!   `rope.dimension_sections` (required). For text every token's position is
//!   `[p, p, p, 0]` (`llama_batch_allocr`), and ggml's `ggml_mrope_cache_init` turns pair
//!   `i` by the angle of section t, h or w (all `p`, each `theta` the same product
//!   `p * theta_scale^i`) unless the pair falls to the fourth section (position 0). The
//!   pairs are rotated NeoX-style (`rotate_pairs(n_dims, n_dims / 2)`, as NEOX). So when
//!   no rotated pair falls to the fourth section (Qwen 3.5's `[11, 11, 10, 0]` over 32
//!   pairs: none does), it is plain NeoX RoPE over `n_rot` dims, which is what Flint
//!   runs; sections that give some pair the fourth section are refused.
//! - FFN: routed experts on every layer (softmax over every expert, top-k,
//!   renormalised, no scale), `expert_feed_forward_length` (or `feed_forward_length /
//!   k`), and a shared expert of `expert_shared_feed_forward_length` (or
//!   `feed_forward_length`) whose output is multiplied by `sigmoid(ffn_gate_inp_shexp .
//!   x)`. The pre-FFN norm is `post_attention_norm`.
//! - MTP: the last `nextn_predict_layers` blocks are skipped (their tensors accepted by
//!   name, never read).

use flint_core::math::Gating;

use super::desc::{
    Activation, Arch, AttnBiases, DeltaNetDesc, DeltaNetShape, FfnDesc, LayerDesc, Mixer,
    ModelDesc, MoeDesc, NormPlacement, RopeDesc, RopeKind,
};
use super::moe::{flag_per_block, is_nextn_tensor, per_block};
use super::parse::{read_scaling, Keys};
use super::tensors::Claims;
use super::util::{nonzero, positive};
use super::ConfigError;
use crate::gguf::GgufFile;

/// llama.cpp's `rope.freq_base` default.
const ROPE_BASE_DEFAULT: f32 = 10_000.0;
/// llama.cpp's `full_attention_interval` default.
const FULL_ATTENTION_INTERVAL_DEFAULT: usize = 4;

/// Whether ggml's interleaved multi-section RoPE (`GGML_ROPE_TYPE_IMROPE`,
/// `ggml_mrope_cache_init`) gives rotated pair `i` the fourth section's position (0 for
/// text) rather than one of the first three (`p`).
fn imrope_pair_takes_fourth(sections: [usize; 4], i: usize) -> bool {
    let total: usize = sections.iter().sum();
    let sector = i % total;
    let first_three = (sector.is_multiple_of(3) && sector < 3 * sections[0])
        || (sector % 3 == 1 && sector < 3 * sections[1])
        || (sector % 3 == 2 && sector < 3 * sections[2]);
    !first_three
}

/// Reads the hyper-parameters of a `qwen35moe` file (tensor facts left at their
/// defaults).
pub(crate) fn read(f: &GgufFile) -> Result<ModelDesc, ConfigError> {
    let arch = Arch::Qwen35Moe;
    let ks = Keys { f, arch };
    let k = |s: &str| ks.k(s);
    let context_length = ks.size("context_length")?;
    let d = ks.size("embedding_length")?;
    let n_all = ks.size("block_count")?;
    let nextn_key = k("nextn_predict_layers");
    let nextn = f.opt_usize(&nextn_key)?.unwrap_or(0);
    if nextn >= n_all {
        return Err(ConfigError::invalid(
            &nextn_key,
            format!("is {nextn}, block_count is {n_all}: no trunk layer would remain"),
        ));
    }
    let l = n_all - nextn;
    let h = ks.size("attention.head_count")?;
    let hkv = ks.opt_size("attention.head_count_kv")?.unwrap_or(h);
    ks.check_kv_heads(h, hkv)?;
    let dk = match ks.opt_size("attention.key_length")? {
        Some(v) => v,
        None => ks.default_head("attention.key_length", d, h)?,
    };
    let dv = match ks.opt_size("attention.value_length")? {
        Some(v) => v,
        None => ks.default_head("attention.value_length", d, h)?,
    };
    ks.check_equal_heads(dk, dv)?;
    let eps_key = k("attention.layer_norm_rms_epsilon");
    let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;
    let n_rot = ks.opt_size("rope.dimension_count")?.unwrap_or(dk);
    ks.check_n_rot(n_rot, dk, false)?;
    ks.check_swa_sizes(dk, dv, n_rot)?;

    // Multi-section RoPE: plain NeoX for text when no rotated pair takes the fourth
    // section (module docs).
    let sec_key = k("rope.dimension_sections");
    let raw = f.get_u32_array(&sec_key)?;
    if raw.len() > 4 {
        return Err(ConfigError::invalid(
            &sec_key,
            format!("has {} entries, at most 4 expected", raw.len()),
        ));
    }
    let mut sections = [0usize; 4];
    for (s, &v) in sections.iter_mut().zip(raw.iter()) {
        *s = v as usize;
    }
    if sections[..3].iter().all(|&s| s == 0) {
        return Err(ConfigError::invalid(
            &sec_key,
            "has no nonzero section among the first three",
        ));
    }
    if let Some(i) = (0..n_rot / 2).find(|&i| imrope_pair_takes_fourth(sections, i)) {
        return Err(ConfigError::invalid(
            &sec_key,
            format!(
                "is {sections:?}: rotated pair {i} of {} takes the fourth section's position \
                 (0 for text), which Flint's NeoX RoPE does not implement",
                n_rot / 2
            ),
        ));
    }
    let rope_base = ks
        .opt_positive("rope.freq_base")?
        .unwrap_or(ROPE_BASE_DEFAULT);
    let scaling = read_scaling(&ks, context_length)?;

    // The Gated DeltaNet sizes.
    let conv_kernel = ks.size("ssm.conv_kernel")?;
    let head_dim = ks.size("ssm.state_size")?;
    let heads_k = ks.size("ssm.group_count")?;
    let heads_v = ks.size("ssm.time_step_rank")?;
    let inner = ks.size("ssm.inner_size")?;
    if inner != heads_v * head_dim {
        return Err(ConfigError::invalid(
            &k("ssm.inner_size"),
            format!(
                "is {inner}, but time_step_rank {heads_v} x state_size {head_dim} = {}: the \
                 value heads must be state_size wide",
                heads_v * head_dim
            ),
        ));
    }
    let shape = DeltaNetShape {
        heads_k,
        heads_v,
        head_dim,
    };
    if !shape.is_valid() {
        return Err(ConfigError::invalid(
            &k("ssm.time_step_rank"),
            format!("is {heads_v}: it must be a multiple of group_count {heads_k}"),
        ));
    }

    // Which layers are Gated DeltaNet layers.
    let rec_key = k("attention.recurrent_layers");
    let recurrent: Vec<bool> = if f.get(&rec_key).is_some() {
        flag_per_block(f, &rec_key, n_all)?[..l].to_vec()
    } else {
        let int_key = k("full_attention_interval");
        let interval = match f.opt_usize(&int_key)? {
            Some(v) => nonzero(&int_key, v)?,
            None => FULL_ATTENTION_INTERVAL_DEFAULT,
        };
        (0..l).map(|i| !(i + 1).is_multiple_of(interval)).collect()
    };

    // Experts: routed on every layer, one gated shared expert.
    let (e, used) = ks.experts()?;
    let ff = ks.opt_size("feed_forward_length")?;
    let fe_key = k("expert_feed_forward_length");
    let widths = per_block(&ks, "expert_feed_forward_length", n_all, 0)?;
    let fe = match widths.first() {
        Some(&w) if w > 0 && widths[..l].iter().all(|&x| x == w) => w,
        Some(0) | None => match ff {
            // llama.cpp: `n_ff / n_expert_used` when the expert width is absent.
            Some(ff) => nonzero(&k("feed_forward_length"), ff / used)?,
            None => {
                return Err(ConfigError::invalid(
                    &fe_key,
                    "missing, and so is feed_forward_length",
                ))
            }
        },
        Some(_) => {
            return Err(ConfigError::invalid(
                &fe_key,
                format!(
                "differs between layers ({widths:?}): per-layer expert widths are not supported"
            ),
            ))
        }
    };
    let fs_key = k("expert_shared_feed_forward_length");
    let fs = match (ks.opt_size("expert_shared_feed_forward_length")?, ff) {
        (Some(v), _) | (None, Some(v)) => v,
        (None, None) => {
            return Err(ConfigError::invalid(
                &fs_key,
                "missing, and so is feed_forward_length (the shared expert's width)",
            ))
        }
    };
    let moe = MoeDesc {
        experts: e,
        used,
        expert_width: fe,
        shared_count: 1,
        shared_width: fs,
        gating: Gating::Softmax,
        normalize: true,
        scale: 1.0,
        leading_dense: 0,
        router_bias: false,
        expert_biases: false,
        router_input_scale: false,
        expert_out_scale: false,
        shared_gate: true,
    };
    let layers = recurrent
        .iter()
        .map(|&rec| LayerDesc {
            mixer: if rec {
                Mixer::DeltaNet
            } else {
                Mixer::Attention
            },
            attn_gate: !rec,
            sliding: false,
            rope_base,
            rope_freq_scale: scaling.freq_scale,
            qk_norm: !rec,
            sinks: false,
            n_kv_heads: hkv,
            biases: AttnBiases::default(),
            ffn: FfnDesc::Moe {
                selection_bias: false,
                shared_expert: true,
                parallel_dense: None,
            },
            head_dim_k: dk,
            head_dim_v: dv,
            n_rot,
            rope_freq_factors: false,
            kv_source: None,
            out_scale: false,
        })
        .collect();
    Ok(ModelDesc {
        arch,
        d,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim_k: dk,
        head_dim_v: dv,
        rms_eps,
        vocab: 0,
        tied_output: false,
        context_length,
        embed_scale: 1.0,
        attn_scale: 1.0 / (dk as f32).sqrt(),
        q_prescaled: false,
        logit_softcap: None,
        activation: Activation::Silu,
        norms: NormPlacement::Pre,
        rope: RopeDesc {
            kind: RopeKind::Neox,
            n_rot,
            freq_factors: false,
            yarn: scaling.yarn,
        },
        window: None,
        moe: Some(moe),
        layers,
        skipped_layers: (l..n_all).collect(),
        value_scale: 1.0,
        v_norm: false,
        delta_net: Some(DeltaNetDesc { shape, conv_kernel }),
        per_layer_input: 0,
        ffn_norm_tensor: "post_attention_norm",
    })
}

/// Checks the tensors of a `qwen35moe` file against `desc`: every trunk layer's mixer
/// (attention or Gated DeltaNet), experts and gated shared expert; the MTP blocks'
/// tensors accepted by name.
pub(crate) fn check_tensors(desc: &mut ModelDesc, f: &GgufFile) -> Result<(), ConfigError> {
    let arch = desc.arch;
    let mut c = Claims {
        f,
        claimed: Default::default(),
    };
    let d = desc.d;
    let vocab = c.embedding(d)?;
    desc.vocab = vocab;
    desc.tied_output = c.opt("output.weight", &[d, vocab], false)?.is_none();
    let (h, hkv, dk, dv) = (
        desc.n_heads,
        desc.n_kv_heads,
        desc.head_dim_k,
        desc.head_dim_v,
    );
    let (Some(m), Some(dn)) = (desc.moe, desc.delta_net) else {
        return Err(ConfigError::invalid(
            &format!("{}.expert_count", arch.name()),
            "missing",
        ));
    };
    let (e, fe, fs) = (m.experts, m.expert_width, m.shared_width);
    let (conv_dim, v_len, hv) = (dn.conv_dim(), dn.shape.v_len(), dn.shape.heads_v);
    for (i, layer) in desc.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        c.req(&n("attn_norm.weight"), &[d], true)?;
        c.req(&n("post_attention_norm.weight"), &[d], true)?;
        match layer.mixer {
            Mixer::Attention => {
                c.req(&n("attn_q.weight"), &[d, 2 * h * dk], false)?;
                c.req(&n("attn_k.weight"), &[d, hkv * dk], false)?;
                c.req(&n("attn_v.weight"), &[d, hkv * dv], false)?;
                c.req(&n("attn_output.weight"), &[h * dv, d], false)?;
                c.req(&n("attn_q_norm.weight"), &[dk], true)?;
                c.req(&n("attn_k_norm.weight"), &[dk], true)?;
            }
            Mixer::DeltaNet => {
                c.req(&n("attn_qkv.weight"), &[d, conv_dim], false)?;
                c.req(&n("attn_gate.weight"), &[d, v_len], false)?;
                c.req(&n("ssm_conv1d.weight"), &[dn.conv_kernel, conv_dim], true)?;
                c.req(&n("ssm_dt.bias"), &[hv], true)?;
                c.req(&n("ssm_a"), &[hv], true)?;
                c.req(&n("ssm_beta.weight"), &[d, hv], false)?;
                c.req(&n("ssm_alpha.weight"), &[d, hv], false)?;
                c.req(&n("ssm_norm.weight"), &[dn.shape.head_dim], true)?;
                c.req(&n("ssm_out.weight"), &[v_len, d], false)?;
            }
        }
        c.req(&n("ffn_gate_inp.weight"), &[d, e], false)?;
        c.experts(i, d, fe, e)?;
        c.req(&n("ffn_gate_inp_shexp.weight"), &[d], true)?;
        c.req(&n("ffn_gate_shexp.weight"), &[d, fs], false)?;
        c.req(&n("ffn_up_shexp.weight"), &[d, fs], false)?;
        c.req(&n("ffn_down_shexp.weight"), &[fs, d], false)?;
    }
    // The MTP blocks: accepted by name, never read.
    for &il in &desc.skipped_layers {
        let prefix = format!("blk.{il}.");
        for t in f.tensors() {
            if let Some(rest) = t.name.strip_prefix(&prefix) {
                if is_nextn_tensor(arch, rest) {
                    c.claimed.insert(t.name.as_str());
                }
            }
        }
    }
    c.finish(arch)
}
