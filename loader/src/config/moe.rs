//! The mixture-of-experts families llama.cpp runs: `qwen3moe`, `glm4moe`, `mimo2`,
//! `gpt-oss`.
//!
//! [`read`] follows llama.cpp's `llama_model_base::load_hparams` (the keys every
//! architecture shares: `block_count` counts the NextN/MTP blocks too, and
//! `nextn_predict_layers` of them are not part of the trunk) and each family's
//! `load_arch_hparams` (`src/models/{qwen3moe,glm4-moe,mimo2,openai-moe}.cpp`), defaults
//! included.
//! [`check_tensors`] follows their `load_arch_tensors`: required tensors with the shapes
//! the description implies, the optional ones each family allows, the NextN/MTP blocks'
//! tensors accepted by name and marked skipped, anything else refused by name.

use flint_core::math::Gating;

use super::desc::{
    Activation, Arch, AttnBiases, FfnDesc, LayerDesc, Mixer, ModelDesc, MoeDesc, NormPlacement,
    RopeDesc, RopeKind,
};
use super::parse::{check_len, read_scaling, swa_pattern, Keys};
use super::tensors::Claims;
use super::util::{nonzero, positive};
use super::ConfigError;
use crate::gguf::{Array, GgufFile, Value};

/// llama.cpp's `rope.freq_base` default.
const ROPE_BASE_DEFAULT: f32 = 10_000.0;
/// llama.cpp's `rope_freq_base_train_swa` default (mimo2 without `rope.freq_base_swa`).
const ROPE_BASE_SWA_DEFAULT: f32 = 10_000.0;
/// gpt-oss's sliding-window period when the file sets no pattern (`load_swa_pattern(ml,
/// 2)`: even layers slide, odd ones attend to everything).
const GPT_OSS_SWA_PERIOD_DEFAULT: usize = 2;

/// A per-block count: a scalar for every block, or (mimo2, gpt-oss, gemma4, qwen35moe) an
/// array of `n_all` entries.
pub(super) fn per_block(
    ks: &Keys<'_>,
    s: &str,
    n_all: usize,
    default: usize,
) -> Result<Vec<usize>, ConfigError> {
    let key = ks.k(s);
    match ks.f.get(&key) {
        None => Ok(vec![default; n_all]),
        Some(Value::Array(_))
            if matches!(
                ks.arch,
                Arch::Mimo2 | Arch::GptOss | Arch::Gemma4 | Arch::Qwen35Moe
            ) =>
        {
            let v = ks.f.get_u32_array(&key)?;
            check_len(&key, v.len(), n_all)?;
            v.iter().map(|&x| nonzero(&key, x as usize)).collect()
        }
        Some(_) => Ok(vec![ks.size(s)?; n_all]),
    }
}

/// A per-block flag array (mimo2's `attention.sliding_window_pattern`, qwen35moe's
/// `attention.recurrent_layers`): one entry per block, bools or the integers 0/1 a
/// converter may write; true / nonzero = set.
pub(super) fn flag_per_block(
    f: &GgufFile,
    key: &str,
    n_all: usize,
) -> Result<Vec<bool>, ConfigError> {
    let v: Vec<bool> = match f.get_array(key)? {
        Array::Bool(v) => v.clone(),
        _ => f.get_u32_array(key)?.iter().map(|&x| x != 0).collect(),
    };
    check_len(key, v.len(), n_all)?;
    Ok(v)
}

/// Reads the hyper-parameters of a MoE family (tensor facts left at their defaults).
pub(crate) fn read(f: &GgufFile, arch: Arch) -> Result<ModelDesc, ConfigError> {
    let ks = Keys { f, arch };
    let k = |s: &str| ks.k(s);
    let context_length = ks.size("context_length")?;
    let d = ks.size("embedding_length")?;
    let n_all = ks.size("block_count")?;
    let nextn_key = k("nextn_predict_layers");
    let nextn = f.opt_usize(&nextn_key)?.unwrap_or(0);
    if nextn > 0 && matches!(arch, Arch::Qwen3Moe | Arch::GptOss) {
        return Err(ConfigError::invalid(
            &nextn_key,
            format!("is {nextn}: {} has no NextN/MTP layers", arch.name()),
        ));
    }
    if nextn >= n_all {
        return Err(ConfigError::invalid(
            &nextn_key,
            format!("is {nextn}, block_count is {n_all}: no trunk layer would remain"),
        ));
    }
    let l = n_all - nextn;
    let h = ks.size("attention.head_count")?;
    let hkv_all = per_block(&ks, "attention.head_count_kv", n_all, h)?;
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
    // llama.cpp asserts equal head sizes in the qwen3moe and glm4moe graphs.
    if arch != Arch::Mimo2 {
        ks.check_equal_heads(dk, dv)?;
    }
    let eps_key = k("attention.layer_norm_rms_epsilon");
    let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;

    let n_rot = ks.opt_size("rope.dimension_count")?.unwrap_or(dk);
    // qwen3moe's graph asserts n_rot == head size; gpt-oss's takes n_rot as the head
    // size (its projections' shapes and the attention scale `1/sqrt(n_rot)`).
    ks.check_n_rot(n_rot, dk, matches!(arch, Arch::Qwen3Moe | Arch::GptOss))?;
    ks.check_swa_sizes(dk, dv, n_rot)?;
    // glm4moe reads M-RoPE sections; with two nonzero sections llama.cpp uses M-RoPE.
    if arch == Arch::Glm4Moe {
        let key = k("rope.dimension_sections");
        if f.get(&key).is_some() {
            let s = f.get_u32_array(&key)?;
            if s.len() >= 2 && s[0] > 0 && s[1] > 0 {
                return Err(ConfigError::invalid(
                    &key,
                    "has two nonzero sections: M-RoPE is not supported",
                ));
            }
        }
    }
    let rope_base = ks
        .opt_positive("rope.freq_base")?
        .unwrap_or(ROPE_BASE_DEFAULT);
    let scaling = read_scaling(&ks, context_length)?;

    // Sliding layers (mimo2, gpt-oss): window, pattern (one entry per block), base.
    let (window, sliding, rope_base_swa) = match arch {
        Arch::Mimo2 => {
            let window = ks.size("attention.sliding_window")?;
            let pattern = flag_per_block(f, &k("attention.sliding_window_pattern"), n_all)?;
            let base_swa = ks
                .opt_positive("rope.freq_base_swa")?
                .unwrap_or(ROPE_BASE_SWA_DEFAULT);
            (Some(window), pattern[..l].to_vec(), base_swa)
        }
        Arch::GptOss => {
            let window = ks.size("attention.sliding_window")?;
            let pattern = swa_pattern(
                f,
                &k("attention.sliding_window_pattern"),
                l,
                GPT_OSS_SWA_PERIOD_DEFAULT,
            )?;
            let base_swa = ks.opt_positive("rope.freq_base_swa")?.unwrap_or(rope_base);
            (Some(window), pattern, base_swa)
        }
        _ => (None, vec![false; l], rope_base),
    };
    // llama.cpp's `rope_freq_scale_train_swa`: 1 (no scaling on sliding layers), except
    // gpt-oss, whose sliding layers take the full layers' scale (YaRN on every layer).
    let swa_freq_scale = if arch == Arch::GptOss {
        scaling.freq_scale
    } else {
        1.0
    };
    let value_scale = if arch == Arch::Mimo2 {
        let key = k("attention.value_scale");
        match f.opt_f32(&key)? {
            Some(v) if !v.is_finite() => {
                return Err(ConfigError::invalid(
                    &key,
                    format!("must be finite, found {v}"),
                ))
            }
            Some(v) if v != 0.0 => v,
            _ => 1.0,
        }
    } else {
        1.0
    };

    let moe = read_routing(&ks, l)?;
    let dense_width = match arch {
        Arch::Glm4Moe if moe.leading_dense > 0 => Some(ks.size("feed_forward_length")?),
        _ => ks.opt_size("feed_forward_length")?,
    };
    let max_hkv = hkv_all[..l].iter().copied().max().unwrap_or(h);
    let layers = sliding
        .iter()
        .enumerate()
        .map(|(i, &sl)| LayerDesc {
            mixer: Mixer::Attention,
            attn_gate: false,
            sliding: sl,
            rope_base: if sl { rope_base_swa } else { rope_base },
            rope_freq_scale: if sl {
                swa_freq_scale
            } else {
                scaling.freq_scale
            },
            qk_norm: arch == Arch::Qwen3Moe,
            sinks: false,
            n_kv_heads: hkv_all[i],
            biases: AttnBiases::default(),
            ffn: if i < moe.leading_dense {
                FfnDesc::Dense {
                    width: dense_width.unwrap_or(0),
                }
            } else {
                FfnDesc::Moe {
                    selection_bias: false,
                    shared_expert: false,
                    parallel_dense: None,
                }
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
        n_kv_heads: max_hkv,
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
        activation: if arch == Arch::GptOss {
            Activation::SwigluOai
        } else {
            Activation::Silu
        },
        norms: NormPlacement::Pre,
        rope: RopeDesc {
            kind: RopeKind::Neox,
            n_rot,
            freq_factors: false,
            yarn: scaling.yarn,
        },
        window,
        moe: Some(moe),
        layers,
        skipped_layers: (l..n_all).collect(),
        value_scale,
        v_norm: false,
        delta_net: None,
        per_layer_input: 0,
        ffn_norm_tensor: if matches!(arch, Arch::Glm4Moe | Arch::GptOss) {
            "post_attention_norm"
        } else {
            "ffn_norm"
        },
    })
}

/// The routing of each family (see [`MoeDesc`]'s docs for the per-family rules).
fn read_routing(ks: &Keys<'_>, l: usize) -> Result<MoeDesc, ConfigError> {
    let f = ks.f;
    let arch = ks.arch;
    let (e, k) = ks.experts()?;
    let fe = match arch {
        // llama.cpp: `n_ff_exp` if set, else `n_ff / n_expert_used`.
        Arch::Qwen3Moe => match ks.opt_size("expert_feed_forward_length")? {
            Some(v) => v,
            None => {
                let ff = ks.size("feed_forward_length")?;
                nonzero(&ks.k("feed_forward_length"), ff / k)?
            }
        },
        // llama.cpp's `get_key_or_arr`: a scalar or one entry per block.
        Arch::GptOss => {
            let widths = per_block(ks, "expert_feed_forward_length", l, 0)?;
            let key = ks.k("expert_feed_forward_length");
            match widths.first() {
                Some(&w) if w > 0 && widths.iter().all(|&x| x == w) => w,
                Some(0) | None => return Err(ConfigError::invalid(&key, "missing")),
                Some(_) => {
                    return Err(ConfigError::invalid(
                        &key,
                        format!("differs between layers ({widths:?}): per-layer expert widths are not supported"),
                    ))
                }
            }
        }
        _ => ks.size("expert_feed_forward_length")?,
    };
    match arch {
        Arch::Glm4Moe => {
            let sc_key = ks.k("expert_shared_count");
            let shared = f.get_usize(&sc_key)?;
            let lead_key = ks.k("leading_dense_block_count");
            let lead = f.opt_usize(&lead_key)?.unwrap_or(0);
            if lead > l {
                return Err(ConfigError::invalid(
                    &lead_key,
                    format!("is {lead}, more than the {l} trunk layers"),
                ));
            }
            let scale_key = ks.k("expert_weights_scale");
            let scale = match f.opt_f32(&scale_key)? {
                None => 1.0,
                Some(0.0) => 1.0,
                Some(v) => positive(&scale_key, v)?,
            };
            let normalize = f.opt_bool(&ks.k("expert_weights_norm"))?.unwrap_or(false);
            let g_key = ks.k("expert_gating_func");
            let gating = match f.opt_u32(&g_key)?.unwrap_or(0) {
                0 | 2 => Gating::Sigmoid,
                1 => Gating::Softmax,
                other => {
                    return Err(ConfigError::invalid(
                        &g_key,
                        format!("is {other}: 1 (softmax) or 2 (sigmoid) expected"),
                    ))
                }
            };
            Ok(MoeDesc {
                experts: e,
                used: k,
                expert_width: fe,
                shared_count: usize::from(shared > 0),
                shared_width: fe * shared.max(1),
                gating,
                normalize,
                scale,
                leading_dense: lead,
                router_bias: false,
                expert_biases: false,
                router_input_scale: false,
                expert_out_scale: false,
                shared_gate: false,
            })
        }
        Arch::GptOss => Ok(MoeDesc {
            experts: e,
            used: k,
            expert_width: fe,
            shared_count: 0,
            shared_width: fe,
            gating: Gating::SoftmaxWeight,
            normalize: false,
            scale: 1.0,
            leading_dense: 0,
            router_bias: true,
            expert_biases: true,
            router_input_scale: false,
            expert_out_scale: false,
            shared_gate: false,
        }),
        _ => Ok(MoeDesc {
            experts: e,
            used: k,
            expert_width: fe,
            shared_count: 0,
            shared_width: fe,
            gating: if arch == Arch::Qwen3Moe {
                Gating::Softmax
            } else {
                Gating::Sigmoid
            },
            normalize: true,
            scale: 1.0,
            leading_dense: 0,
            router_bias: false,
            expert_biases: false,
            router_input_scale: false,
            expert_out_scale: false,
            shared_gate: false,
        }),
    }
}

/// The tensors llama.cpp may create for a NextN/MTP block of every MoE family with one
/// (`blk.N.` + these), besides [`nextn_extra`]'s.
const NEXTN_COMMON: &[&str] = &[
    "attn_norm.weight",
    "attn_qkv.weight",
    "attn_qkv.bias",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "ffn_gate_inp.weight",
    "exp_probs_b.bias",
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "nextn.eh_proj.weight",
    "nextn.enorm.weight",
    "nextn.hnorm.weight",
    "nextn.embed_tokens.weight",
    "nextn.shared_head_head.weight",
    "nextn.shared_head_norm.weight",
];

/// The NextN/MTP block tensors only `arch` has, besides [`NEXTN_COMMON`].
fn nextn_extra(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::Glm4Moe => &[
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
        ],
        Arch::Mimo2 => &[
            "attn_sinks.weight",
            "ffn_norm.weight",
            "layer_output_norm.weight",
        ],
        Arch::Qwen35Moe => &[
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "ffn_gate_inp_shexp.weight",
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
            "ffn_gate_up_exps.weight",
        ],
        _ => &[],
    }
}

/// Whether llama.cpp may create `blk.N.{rest}` for a NextN/MTP block of `arch`.
pub(super) fn is_nextn_tensor(arch: Arch, rest: &str) -> bool {
    matches!(arch, Arch::Glm4Moe | Arch::Mimo2 | Arch::Qwen35Moe)
        && (NEXTN_COMMON.contains(&rest) || nextn_extra(arch).contains(&rest))
}

/// Checks the tensors of a MoE-family file against `desc` and fills in what they tell:
/// vocabulary size, tied output, per layer QK norm, sinks, biases, selection bias, shared
/// expert, and (mimo2) which layers are dense.
pub(crate) fn check_tensors(desc: &mut ModelDesc, f: &GgufFile) -> Result<(), ConfigError> {
    let arch = desc.arch;
    let mut c = Claims {
        f,
        claimed: Default::default(),
    };
    let d = desc.d;
    let vocab = c.embedding(d)?;
    desc.vocab = vocab;
    // mimo2 and gpt-oss require `output`; the others tie it to the embedding when absent.
    if matches!(arch, Arch::Mimo2 | Arch::GptOss) {
        c.req("output.weight", &[d, vocab], false)?;
        desc.tied_output = false;
    } else {
        desc.tied_output = c.opt("output.weight", &[d, vocab], false)?.is_none();
    }

    let (h, dk, dv) = (desc.n_heads, desc.head_dim_k, desc.head_dim_v);
    let Some(m) = desc.moe else {
        return Err(ConfigError::invalid(
            &format!("{}.expert_count", arch.name()),
            "missing",
        ));
    };
    let (e, fe, fs) = (m.experts, m.expert_width, m.shared_width);
    let ffn_norm = desc.ffn_norm_tensor;
    let ff_key = format!("{}.feed_forward_length", arch.name());
    let ff = f.opt_usize(&ff_key)?.unwrap_or(0);
    for (i, layer) in desc.layers.iter_mut().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        let hkv = layer.n_kv_heads;
        c.attention(i, d, h, hkv, dk, dv)?;
        c.qkv_biases(i, h, hkv, dk, dv, &mut layer.biases)?;
        let qk = [
            (n("attn_q_norm.weight"), vec![dk], true),
            (n("attn_k_norm.weight"), vec![dk], true),
        ];
        match arch {
            Arch::Qwen3Moe => {
                for (name, dims, f32) in &qk {
                    c.req(name, dims, *f32)?;
                }
                layer.qk_norm = true;
            }
            Arch::Glm4Moe => layer.qk_norm = c.set(&qk)?,
            Arch::GptOss => {
                c.req(&n("attn_sinks.weight"), &[h], true)?;
                layer.sinks = true;
                c.req(&n("attn_output.bias"), &[d], true)?;
                layer.biases.o = true;
            }
            _ => {
                layer.sinks = c.opt(&n("attn_sinks.weight"), &[h], true)?.is_some();
            }
        }
        c.req(&n(&format!("{ffn_norm}.weight")), &[d], true)?;
        // mimo2: a layer without a router is dense (llama.cpp's graph tests
        // `ffn_gate_inp == nullptr`).
        if arch == Arch::Mimo2 && f.tensor(&n("ffn_gate_inp.weight")).is_none() {
            if ff == 0 {
                return Err(ConfigError::invalid(
                    &ff_key,
                    format!("missing, but layer {i} has no ffn_gate_inp (a dense layer)"),
                ));
            }
            layer.ffn = FfnDesc::Dense { width: ff };
        }
        match &mut layer.ffn {
            FfnDesc::Dense { width } => {
                c.dense_ffn(i, d, *width)?;
            }
            FfnDesc::Moe {
                selection_bias,
                shared_expert,
                ..
            } => {
                c.req(&n("ffn_gate_inp.weight"), &[d, e], false)?;
                *selection_bias = match arch {
                    Arch::Glm4Moe => {
                        c.req(&n("exp_probs_b.bias"), &[e], true)?;
                        true
                    }
                    Arch::Mimo2 => c.opt(&n("exp_probs_b.bias"), &[e], true)?.is_some(),
                    _ => false,
                };
                c.experts(i, d, fe, e)?;
                if m.router_bias {
                    c.req(&n("ffn_gate_inp.bias"), &[e], true)?;
                }
                if m.expert_biases {
                    c.req(&n("ffn_gate_exps.bias"), &[fe, e], true)?;
                    c.req(&n("ffn_up_exps.bias"), &[fe, e], true)?;
                    c.req(&n("ffn_down_exps.bias"), &[d, e], true)?;
                }
                if m.shared_count == 1 {
                    c.req(&n("ffn_gate_shexp.weight"), &[d, fs], false)?;
                    c.req(&n("ffn_up_shexp.weight"), &[d, fs], false)?;
                    c.req(&n("ffn_down_shexp.weight"), &[fs, d], false)?;
                    *shared_expert = true;
                }
            }
        }
    }
    if arch == Arch::Mimo2 {
        let lead = desc
            .layers
            .iter()
            .take_while(|l| matches!(l.ffn, FfnDesc::Dense { .. }))
            .count();
        if let Some(m) = desc.moe.as_mut() {
            m.leading_dense = lead;
        }
    }
    // The NextN/MTP blocks: accepted by name, never read.
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
