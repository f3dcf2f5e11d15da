//! Reading the hyper-parameters of each architecture into a [`ModelDesc`] (the tensor
//! facts are filled in afterwards by `tensors::check`).
//!
//! One reader serves every architecture; the differences are the few `match`es on
//! [`Arch`] below, each following llama.cpp's `load_hparams` / `load_arch_hparams`.

use flint_core::math::Gating;

use super::desc::{
    Activation, Arch, AttnBiases, FfnDesc, LayerDesc, Mixer, ModelDesc, MoeDesc, NormPlacement,
    RopeDesc, RopeKind, Yarn,
};
use super::util::{nonzero, positive};
use super::ConfigError;
use crate::gguf::{Array, GgufFile, Value};

/// Gemma 3's local RoPE base when `rope.freq_base_swa` is absent (llama.cpp's
/// `rope_freq_base_train_swa` default).
const GEMMA3_ROPE_BASE_SWA_DEFAULT: f32 = 10_000.0;
/// Gemma 3's sliding-window period when the file sets no pattern.
const GEMMA3_SWA_PERIOD_DEFAULT: usize = 6;
/// llama.cpp's `rope.freq_base` default.
const ROPE_BASE_DEFAULT: f32 = 10_000.0;

/// The keys of one architecture: `k("x")` is `{arch}.x`.
pub(super) struct Keys<'f> {
    pub(super) f: &'f GgufFile,
    pub(super) arch: Arch,
}

impl Keys<'_> {
    pub(super) fn k(&self, s: &str) -> String {
        format!("{}.{s}", self.arch.name())
    }
    pub(super) fn size(&self, s: &str) -> Result<usize, ConfigError> {
        let key = self.k(s);
        nonzero(&key, self.f.get_usize(&key)?)
    }
    pub(super) fn opt_size(&self, s: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.k(s);
        self.f
            .opt_usize(&key)?
            .map(|v| nonzero(&key, v))
            .transpose()
    }
    pub(super) fn opt_positive(&self, s: &str) -> Result<Option<f32>, ConfigError> {
        let key = self.k(s);
        self.f.opt_f32(&key)?.map(|v| positive(&key, v)).transpose()
    }

    /// `head_count` must be a multiple of `head_count_kv`.
    pub(super) fn check_kv_heads(&self, h: usize, hkv: usize) -> Result<(), ConfigError> {
        if !h.is_multiple_of(hkv) {
            return Err(ConfigError::invalid(
                &self.k("attention.head_count_kv"),
                format!("head_count {h} is not a multiple of head_count_kv {hkv}"),
            ));
        }
        Ok(())
    }

    /// The head size llama.cpp assumes when the key `s` is absent: `d / h`.
    pub(super) fn default_head(&self, s: &str, d: usize, h: usize) -> Result<usize, ConfigError> {
        if d.is_multiple_of(h) {
            Ok(d / h)
        } else {
            Err(ConfigError::invalid(
                &self.k(s),
                format!("absent, and embedding_length {d} is not a multiple of head_count {h}"),
            ))
        }
    }

    /// Key and value head sizes must be equal (llama.cpp asserts it in these graphs).
    pub(super) fn check_equal_heads(&self, dk: usize, dv: usize) -> Result<(), ConfigError> {
        if dv != dk {
            return Err(ConfigError::invalid(
                &self.k("attention.value_length"),
                format!(
                    "is {dv}, key_length is {dk}: {} needs equal head sizes",
                    self.arch.name()
                ),
            ));
        }
        Ok(())
    }

    /// `rope.dimension_count`: even, at most the key head size (equal to it when
    /// `rot_equal`).
    pub(super) fn check_n_rot(
        &self,
        n_rot: usize,
        dk: usize,
        rot_equal: bool,
    ) -> Result<(), ConfigError> {
        if !n_rot.is_multiple_of(2) || n_rot > dk || (rot_equal && n_rot != dk) {
            return Err(ConfigError::invalid(
                &self.k("rope.dimension_count"),
                format!(
                    "is {n_rot}: it must be even and at most key_length {dk}{}",
                    if rot_equal {
                        " (here: equal to it)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(())
    }

    /// Sliding layers with their own head sizes: llama.cpp reads these, Flint has one
    /// head size for every layer.
    pub(super) fn check_swa_sizes(
        &self,
        dk: usize,
        dv: usize,
        n_rot: usize,
    ) -> Result<(), ConfigError> {
        for (s, full) in [
            ("attention.key_length_swa", dk),
            ("attention.value_length_swa", dv),
            ("rope.dimension_count_swa", n_rot),
        ] {
            if let Some(v) = self.opt_size(s)?.filter(|&v| v != full) {
                return Err(ConfigError::invalid(
                    &self.k(s),
                    format!("is {v}, unlike the full layers' {full}: per-layer head sizes are not supported"),
                ));
            }
        }
        Ok(())
    }

    /// `expert_count` and `expert_used_count`, the latter at most the former.
    pub(super) fn experts(&self) -> Result<(usize, usize), ConfigError> {
        let e = self.size("expert_count")?;
        let k = self.size("expert_used_count")?;
        if k > e {
            return Err(ConfigError::invalid(
                &self.k("expert_used_count"),
                format!("is {k}, more than expert_count {e}"),
            ));
        }
        Ok((e, k))
    }
}

/// The RoPE scaling a file asks for (`rope.scaling.*`).
pub(super) struct Scaling {
    /// ggml's `freq_scale` of the full-attention layers.
    pub(super) freq_scale: f32,
    pub(super) yarn: Option<Yarn>,
}

/// Reads the hyper-parameters of `arch` (tensor facts left at their defaults).
pub(crate) fn read(f: &GgufFile, arch: Arch) -> Result<ModelDesc, ConfigError> {
    let ks = Keys { f, arch };
    let k = |s: &str| ks.k(s);
    if arch != Arch::Flint {
        if let Some(e) = f.opt_usize(&k("expert_count"))?.filter(|&e| e > 0) {
            return Err(ConfigError::invalid(
                &k("expert_count"),
                format!(
                    "is {e}: mixture-of-experts {} files are not supported",
                    arch.name()
                ),
            ));
        }
    }
    let context_length = ks.size("context_length")?;
    let d = ks.size("embedding_length")?;
    let l = ks.size("block_count")?;
    let h = ks.size("attention.head_count")?;
    let hkv = match arch {
        Arch::Flint => ks.size("attention.head_count_kv")?,
        _ => ks.opt_size("attention.head_count_kv")?.unwrap_or(h),
    };
    ks.check_kv_heads(h, hkv)?;
    let dk = match ks.opt_size("attention.key_length")? {
        Some(v) => v,
        None => ks.default_head("attention.key_length", d, h)?,
    };
    let dv = match (ks.opt_size("attention.value_length")?, arch) {
        (Some(v), _) => v,
        (None, Arch::Flint) => dk,
        (None, _) => ks.default_head("attention.value_length", d, h)?,
    };
    if arch != Arch::Flint {
        ks.check_equal_heads(dk, dv)?;
    }
    // llama.cpp's qwen2 projects Q to `d` and back (`attn_q` `[d, d]`).
    if arch == Arch::Qwen2 && h * dk != d {
        return Err(ConfigError::invalid(
            &k("attention.key_length"),
            format!("is {dk}: qwen2 needs head_count {h} x key_length = embedding_length {d}"),
        ));
    }
    let eps_key = k("attention.layer_norm_rms_epsilon");
    let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;

    let n_rot = ks.opt_size("rope.dimension_count")?.unwrap_or(dk);
    let rot_equal = matches!(arch, Arch::Llama | Arch::Qwen2 | Arch::Qwen3);
    ks.check_n_rot(n_rot, dk, rot_equal)?;
    ks.check_swa_sizes(dk, dv, n_rot)?;

    let rope_base = match arch {
        Arch::Flint => {
            let key = k("rope.freq_base");
            positive(&key, f.get_f32(&key)?)?
        }
        _ => ks
            .opt_positive("rope.freq_base")?
            .unwrap_or(ROPE_BASE_DEFAULT),
    };
    let scaling = read_scaling(&ks, context_length)?;

    // Sliding layers and their window.
    let (window, sliding, rope_base_swa) = match arch {
        Arch::Flint => {
            let pat_key = k("attention.sliding_window_pattern");
            let pattern = f.get_bool_array(&pat_key)?.to_vec();
            check_len(&pat_key, pattern.len(), l)?;
            let window = ks.opt_size("attention.sliding_window")?;
            if pattern.iter().any(|&s| s) && window.is_none() {
                return Err(ConfigError::invalid(
                    &k("attention.sliding_window"),
                    "missing, but the pattern has sliding-window layers",
                ));
            }
            let base_swa = ks.opt_positive("rope.freq_base_swa")?.unwrap_or(rope_base);
            (window, pattern, base_swa)
        }
        Arch::Gemma3 => {
            let window = f
                .opt_usize(&k("attention.sliding_window"))?
                .filter(|&w| w > 0);
            match window {
                None => (None, vec![false; l], rope_base),
                Some(_) => {
                    let pattern = swa_pattern(
                        f,
                        &k("attention.sliding_window_pattern"),
                        l,
                        GEMMA3_SWA_PERIOD_DEFAULT,
                    )?;
                    let base_swa = ks
                        .opt_positive("rope.freq_base_swa")?
                        .unwrap_or(GEMMA3_ROPE_BASE_SWA_DEFAULT);
                    (window, pattern, base_swa)
                }
            }
        }
        // llama.cpp gives these architectures no sliding layers (the MoE families are
        // read by `moe::read`, never here).
        Arch::Llama
        | Arch::Qwen2
        | Arch::Qwen3
        | Arch::Qwen3Moe
        | Arch::Glm4Moe
        | Arch::Mimo2
        | Arch::GptOss
        | Arch::Gemma4
        | Arch::Qwen35Moe => (None, vec![false; l], rope_base),
    };

    let (moe, dense_width) = match arch {
        Arch::Flint => {
            let lead_key = k("leading_dense_block_count");
            let lead = f.opt_usize(&lead_key)?.unwrap_or(0);
            if lead > l {
                return Err(ConfigError::invalid(
                    &lead_key,
                    format!("is {lead}, more than block_count {l}"),
                ));
            }
            let ff = if lead > 0 {
                Some(ks.size("feed_forward_length")?)
            } else {
                ks.opt_size("feed_forward_length")?
            };
            let moe = if lead < l {
                Some(read_moe(&ks, lead)?)
            } else {
                None
            };
            (moe, ff)
        }
        _ => (None, Some(ks.size("feed_forward_length")?)),
    };

    let softcap = match arch {
        Arch::Gemma3 => {
            let key = k("final_logit_softcapping");
            match f.opt_f32(&key)?.filter(|&c| c != 0.0) {
                Some(c) => Some(positive(&key, c)?),
                None => None,
            }
        }
        _ => None,
    };
    // llama.cpp: Gemma 3 27B (62 layers) scales by 1/sqrt(d/H)
    // (`query_pre_attn_scalar`), every other size and architecture by 1/sqrt(dk).
    let attn_scale = if arch == Arch::Gemma3 && l == 62 {
        1.0 / ((d / h) as f32).sqrt()
    } else {
        1.0 / (dk as f32).sqrt()
    };
    let gemma = arch == Arch::Gemma3;
    let layers = sliding
        .iter()
        .enumerate()
        .map(|(i, &sl)| LayerDesc {
            mixer: Mixer::Attention,
            attn_gate: false,
            sliding: sl,
            rope_base: if sl { rope_base_swa } else { rope_base },
            rope_freq_scale: if sl { 1.0 } else { scaling.freq_scale },
            qk_norm: matches!(arch, Arch::Gemma3 | Arch::Qwen3),
            sinks: false,
            n_kv_heads: hkv,
            biases: AttnBiases::default(),
            ffn: match (&moe, dense_width) {
                (Some(m), _) if i >= m.leading_dense => FfnDesc::Moe {
                    selection_bias: false,
                    shared_expert: false,
                    parallel_dense: None,
                },
                (_, w) => FfnDesc::Dense {
                    width: w.unwrap_or(0),
                },
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
        embed_scale: if gemma { (d as f32).sqrt() } else { 1.0 },
        attn_scale,
        q_prescaled: gemma,
        logit_softcap: softcap,
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        norms: if gemma {
            NormPlacement::PrePost
        } else {
            NormPlacement::Pre
        },
        rope: RopeDesc {
            kind: match arch {
                Arch::Llama => RopeKind::Normal,
                _ => RopeKind::Neox,
            },
            n_rot,
            freq_factors: false,
            yarn: scaling.yarn,
        },
        window,
        moe,
        layers,
        skipped_layers: Vec::new(),
        value_scale: 1.0,
        v_norm: false,
        delta_net: None,
        per_layer_input: 0,
        ffn_norm_tensor: "ffn_norm",
    })
}

pub(super) fn check_len(key: &str, n: usize, l: usize) -> Result<(), ConfigError> {
    if n != l {
        return Err(ConfigError::invalid(
            key,
            format!("has {n} entries, block_count is {l}"),
        ));
    }
    Ok(())
}

/// llama.cpp's `load_swa_pattern(ml, period)` (gemma3: 6, gpt-oss: 2): an array of
/// bools, else a period `n` (default `period`) where layer `i` slides unless
/// `i % n == n - 1`; `n = 0` makes every layer slide.
pub(super) fn swa_pattern(
    f: &GgufFile,
    key: &str,
    l: usize,
    period: usize,
) -> Result<Vec<bool>, ConfigError> {
    let n = match f.get(key) {
        Some(Value::Array(Array::Bool(v))) => {
            check_len(key, v.len(), l)?;
            return Ok(v.clone());
        }
        Some(_) => f.get_usize(key)?,
        None => period,
    };
    Ok((0..l).map(|i| n == 0 || i % n < n - 1).collect())
}

/// `rope.scaling.*` as llama.cpp reads it (`load_hparams`, `llama_context`): type
/// `none`, `linear` (the default) or `yarn`; anything else is refused by name.
pub(super) fn read_scaling(ks: &Keys<'_>, context_length: usize) -> Result<Scaling, ConfigError> {
    let f = ks.f;
    let type_key = ks.k("rope.scaling.type");
    let kind = f.opt_str(&type_key)?.unwrap_or("linear");
    let factor_key = ks.k("rope.scaling.factor");
    let old_key = ks.k("rope.scale_linear");
    let (fk, factor) = match f.opt_f32(&factor_key)? {
        Some(v) => (factor_key, v),
        None => (old_key.clone(), f.opt_f32(&old_key)?.unwrap_or(0.0)),
    };
    let factor = if factor == 0.0 {
        1.0
    } else {
        positive(&fk, factor)?
    };
    let attn_key = ks.k("rope.scaling.attn_factor");
    let rope_attn_factor = match f.opt_f32(&attn_key)? {
        Some(v) => positive(&attn_key, v)?,
        None => 1.0,
    };
    let no_attn_factor = |what: &str| {
        if rope_attn_factor != 1.0 {
            Err(ConfigError::invalid(
                &attn_key,
                format!("is {rope_attn_factor}: a magnitude factor without YaRN ({what}) is not supported"),
            ))
        } else {
            Ok(())
        }
    };
    match kind {
        "none" => {
            no_attn_factor("rope.scaling.type = none")?;
            Ok(Scaling {
                freq_scale: 1.0,
                yarn: None,
            })
        }
        "linear" => {
            no_attn_factor("rope.scaling.type = linear")?;
            Ok(Scaling {
                freq_scale: 1.0 / factor,
                yarn: None,
            })
        }
        "yarn" => {
            let ctx_key = ks.k("rope.scaling.original_context_length");
            let n_ctx_orig = match f.opt_usize(&ctx_key)? {
                Some(0) | None => context_length,
                Some(v) => v,
            };
            let n_ctx_orig = u32::try_from(n_ctx_orig).map_err(|_| {
                ConfigError::invalid(&ctx_key, format!("{n_ctx_orig} does not fit in 32 bits"))
            })?;
            // llama_context: mscale(factor) / (1 + 0.1 ln factor), times the file's
            // rope.scaling.attn_factor.
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                0.1 * factor.ln() + 1.0
            };
            let attn_factor = mscale / (1.0 + 0.1 * factor.ln()) * rope_attn_factor;
            Ok(Scaling {
                freq_scale: 1.0 / factor,
                yarn: Some(Yarn {
                    ext_factor: 1.0,
                    attn_factor,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    n_ctx_orig,
                }),
            })
        }
        other => Err(ConfigError::invalid(
            &type_key,
            format!("is '{other}': Flint implements none, linear and yarn"),
        )),
    }
}

fn read_moe(ks: &Keys<'_>, leading_dense: usize) -> Result<MoeDesc, ConfigError> {
    let f = ks.f;
    let (e, k) = ks.experts()?;
    let fe = ks.size("expert_feed_forward_length")?;
    let sc_key = ks.k("expert_shared_count");
    let shared = f.opt_usize(&sc_key)?.unwrap_or(0);
    if shared > 1 {
        return Err(ConfigError::invalid(
            &sc_key,
            format!("is {shared}: Flint has 0 or 1 shared expert"),
        ));
    }
    let fs = ks
        .opt_size("expert_shared_feed_forward_length")?
        .unwrap_or(fe);
    let g_key = ks.k("expert_gating_func");
    let gating = match f.opt_u32(&g_key)?.unwrap_or(2) {
        1 => Gating::Softmax,
        2 => Gating::Sigmoid,
        other => {
            return Err(ConfigError::invalid(
                &g_key,
                format!("is {other}: 1 (softmax) or 2 (sigmoid) expected"),
            ))
        }
    };
    let normalize = f.opt_bool(&ks.k("expert_weights_norm"))?.unwrap_or(true);
    let scale = ks.opt_positive("expert_weights_scale")?.unwrap_or(1.0);
    Ok(MoeDesc {
        experts: e,
        used: k,
        expert_width: fe,
        shared_count: shared,
        shared_width: fs,
        gating,
        normalize,
        scale,
        leading_dense,
        router_bias: false,
        expert_biases: false,
        router_input_scale: false,
        expert_out_scale: false,
        shared_gate: false,
    })
}
