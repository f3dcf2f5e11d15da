//! The Flint architecture's configuration (`shared/spec/FLINT.md`, restated in
//! `docs/gguf.md`).

use super::util::{
    embedding_and_output, f32_type, nonzero, opt_size, opt_tensor, positive, size, tensor,
};
use super::ConfigError;
use crate::gguf::GgufFile;

const ARCH: &str = "flint";

/// How the router turns logits into expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatingFunc {
    /// `expert_gating_func = 1`.
    Softmax,
    /// `expert_gating_func = 2` (Flint's own).
    Sigmoid,
}

/// The Mixture-of-Experts part of a Flint configuration (present when any layer is MoE).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts `E` (`expert_count`).
    pub expert_count: usize,
    /// Experts chosen per token `k <= E` (`expert_used_count`).
    pub expert_used_count: usize,
    /// Width `Fe` of one routed expert (`expert_feed_forward_length`).
    pub expert_feed_forward_length: usize,
    /// Shared experts, 0 or 1 (`expert_shared_count`, default 0).
    pub expert_shared_count: usize,
    /// Width `Fs` of the shared expert (`expert_shared_feed_forward_length`, default `Fe`).
    pub expert_shared_feed_forward_length: usize,
    /// Router score function (`expert_gating_func`, default sigmoid).
    pub gating_func: GatingFunc,
    /// Renormalise the chosen weights to sum 1 (`expert_weights_norm`, default true).
    pub weights_norm: bool,
    /// Factor applied to the chosen weights after renormalising (`expert_weights_scale`,
    /// default 1).
    pub weights_scale: f32,
}

/// A validated Flint configuration. Field docs name the `flint.` key each comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct FlintConfig {
    /// Largest position count the model supports (`context_length`, required).
    pub context_length: usize,
    /// Hidden size `d` (`embedding_length`).
    pub embedding_length: usize,
    /// Layers `L` (`block_count`).
    pub block_count: usize,
    /// Dense FFN width `F` (`feed_forward_length`), present when any layer is dense.
    pub feed_forward_length: Option<usize>,
    /// Query heads `H` (`attention.head_count`).
    pub head_count: usize,
    /// Key/value heads `Hkv` (`attention.head_count_kv`), `H % Hkv == 0`.
    pub head_count_kv: usize,
    /// Q/K head size `dk` (`attention.key_length`, default `d / H`).
    pub key_length: usize,
    /// V head size `dv` (`attention.value_length`, default `dk`).
    pub value_length: usize,
    /// RMSNorm epsilon (`attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Window `W` of sliding layers (`attention.sliding_window`), present when any layer
    /// slides.
    pub sliding_window: Option<usize>,
    /// `true` = layer `i` is a sliding-window layer (`attention.sliding_window_pattern`,
    /// length `L`).
    pub sliding_window_pattern: Vec<bool>,
    /// RoPE base of full-attention layers (`rope.freq_base`).
    pub rope_freq_base: f32,
    /// RoPE base of sliding layers (`rope.freq_base_swa`, default `rope.freq_base`).
    pub rope_freq_base_swa: f32,
    /// Rotated dims `n_rot`, even, `<= dk` (`rope.dimension_count`, default `dk`).
    pub rope_dimension_count: usize,
    /// Layers `i < n` use a dense FFN (`leading_dense_block_count`, default 0).
    pub leading_dense_block_count: usize,
    /// The MoE settings, present when some layer is MoE.
    pub moe: Option<MoeConfig>,
}

/// Which optional tensors one layer has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlintLayerTensors {
    /// `attn_q_norm` and `attn_k_norm` present.
    pub qk_norm: bool,
    /// `attn_sinks` present.
    pub sinks: bool,
    /// `exp_probs_b` (router selection bias) present (MoE layers only).
    pub selection_bias: bool,
    /// The shared expert's three tensors present (MoE layers only).
    pub shared_expert: bool,
}

/// What [`FlintConfig::check_tensors`] found: vocabulary size and optional tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlintTensors {
    /// `V`, from `token_embd.weight`.
    pub vocab_size: usize,
    /// `output.weight` absent: the output projection is `token_embd.weight`.
    pub tied_output: bool,
    /// Per layer.
    pub layers: Vec<FlintLayerTensors>,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

impl FlintConfig {
    /// Reads and validates the `flint.*` keys.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?;
        if arch != ARCH {
            return Err(ConfigError::WrongArchitecture {
                expected: ARCH,
                found: arch.to_string(),
            });
        }
        let context_length = size(f, &key("context_length"))?;
        let d = size(f, &key("embedding_length"))?;
        let l = size(f, &key("block_count"))?;
        let h = size(f, &key("attention.head_count"))?;
        let hkv_key = key("attention.head_count_kv");
        let hkv = size(f, &hkv_key)?;
        if h % hkv != 0 {
            return Err(ConfigError::invalid(
                &hkv_key,
                format!("head_count {h} is not a multiple of head_count_kv {hkv}"),
            ));
        }
        let dk_key = key("attention.key_length");
        let dk = match opt_size(f, &dk_key)? {
            Some(v) => v,
            None => {
                if d % h != 0 {
                    return Err(ConfigError::invalid(
                        &dk_key,
                        format!(
                            "absent, and embedding_length {d} is not a multiple of head_count {h}"
                        ),
                    ));
                }
                d / h
            }
        };
        let dv = opt_size(f, &key("attention.value_length"))?.unwrap_or(dk);
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = positive(&eps_key, f.get_f32(&eps_key)?)?;

        let pat_key = key("attention.sliding_window_pattern");
        let pattern = f.get_bool_array(&pat_key)?.to_vec();
        if pattern.len() != l {
            return Err(ConfigError::invalid(
                &pat_key,
                format!("has {} entries, block_count is {l}", pattern.len()),
            ));
        }
        let sw_key = key("attention.sliding_window");
        let sliding_window = opt_size(f, &sw_key)?;
        if pattern.iter().any(|&s| s) && sliding_window.is_none() {
            return Err(ConfigError::invalid(
                &sw_key,
                "missing, but the pattern has sliding-window layers",
            ));
        }

        let base_key = key("rope.freq_base");
        let rope_freq_base = positive(&base_key, f.get_f32(&base_key)?)?;
        let swa_key = key("rope.freq_base_swa");
        let rope_freq_base_swa = match f.opt_f32(&swa_key)? {
            Some(v) => positive(&swa_key, v)?,
            None => rope_freq_base,
        };
        let rot_key = key("rope.dimension_count");
        let n_rot = opt_size(f, &rot_key)?.unwrap_or(dk);
        if n_rot % 2 != 0 || n_rot > dk {
            return Err(ConfigError::invalid(
                &rot_key,
                format!("is {n_rot}: it must be even and at most key_length {dk}"),
            ));
        }

        let lead_key = key("leading_dense_block_count");
        let lead = f.opt_usize(&lead_key)?.unwrap_or(0);
        if lead > l {
            return Err(ConfigError::invalid(
                &lead_key,
                format!("is {lead}, more than block_count {l}"),
            ));
        }
        let ff_key = key("feed_forward_length");
        let feed_forward_length = if lead > 0 {
            Some(size(f, &ff_key)?)
        } else {
            opt_size(f, &ff_key)?
        };
        let moe = if lead < l { Some(read_moe(f)?) } else { None };
        Ok(FlintConfig {
            context_length,
            embedding_length: d,
            block_count: l,
            feed_forward_length,
            head_count: h,
            head_count_kv: hkv,
            key_length: dk,
            value_length: dv,
            rms_eps,
            sliding_window,
            sliding_window_pattern: pattern,
            rope_freq_base,
            rope_freq_base_swa,
            rope_dimension_count: n_rot,
            leading_dense_block_count: lead,
            moe,
        })
    }

    /// True when layer `i` uses a dense FFN (else MoE).
    pub fn is_dense(&self, layer: usize) -> bool {
        layer < self.leading_dense_block_count
    }

    /// True when layer `i` is a sliding-window layer.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window_pattern
            .get(layer)
            .copied()
            .unwrap_or(false)
    }

    /// RoPE base of layer `i`.
    pub fn rope_base(&self, layer: usize) -> f32 {
        if self.is_sliding(layer) {
            self.rope_freq_base_swa
        } else {
            self.rope_freq_base
        }
    }

    /// Checks every tensor of the Flint schema: required ones present with the shapes the
    /// configuration implies, optional ones (output, QK norm, sinks, selection bias,
    /// shared expert) either absent or right, f32 where the schema says so.
    pub fn check_tensors(&self, f: &GgufFile) -> Result<FlintTensors, ConfigError> {
        let d = self.embedding_length;
        let (h, hkv, dk, dv) = (
            self.head_count,
            self.head_count_kv,
            self.key_length,
            self.value_length,
        );
        let (vocab_size, tied_output) = embedding_and_output(f, d)?;

        let mut layers = Vec::with_capacity(self.block_count);
        for i in 0..self.block_count {
            let n = |s: &str| format!("blk.{i}.{s}");
            tensor(f, &n("attn_norm.weight"), &[d])?;
            tensor(f, &n("attn_q.weight"), &[d, h * dk])?;
            tensor(f, &n("attn_k.weight"), &[d, hkv * dk])?;
            tensor(f, &n("attn_v.weight"), &[d, hkv * dv])?;
            tensor(f, &n("attn_output.weight"), &[h * dv, d])?;
            let qn = opt_tensor(f, &n("attn_q_norm.weight"), &[dk])?;
            let kn = opt_tensor(f, &n("attn_k_norm.weight"), &[dk])?;
            let qk_norm = pair(
                qn.is_some(),
                kn.is_some(),
                &n("attn_q_norm.weight"),
                &n("attn_k_norm.weight"),
            )?;
            let sinks = match opt_tensor(f, &n("attn_sinks.weight"), &[h])? {
                Some(t) => {
                    f32_type(t)?;
                    true
                }
                None => false,
            };
            tensor(f, &n("ffn_norm.weight"), &[d])?;
            let mut lt = FlintLayerTensors {
                qk_norm,
                sinks,
                selection_bias: false,
                shared_expert: false,
            };
            if self.is_dense(i) {
                let ff = self.feed_forward_length.unwrap_or(0);
                tensor(f, &n("ffn_gate.weight"), &[d, ff])?;
                tensor(f, &n("ffn_up.weight"), &[d, ff])?;
                tensor(f, &n("ffn_down.weight"), &[ff, d])?;
            } else if let Some(m) = &self.moe {
                let (e, fe, fs) = (
                    m.expert_count,
                    m.expert_feed_forward_length,
                    m.expert_shared_feed_forward_length,
                );
                tensor(f, &n("ffn_gate_inp.weight"), &[d, e])?;
                if let Some(t) = opt_tensor(f, &n("exp_probs_b.bias"), &[e])? {
                    f32_type(t)?;
                    lt.selection_bias = true;
                }
                tensor(f, &n("ffn_gate_exps.weight"), &[d, fe, e])?;
                tensor(f, &n("ffn_up_exps.weight"), &[d, fe, e])?;
                tensor(f, &n("ffn_down_exps.weight"), &[fe, d, e])?;
                let names = [
                    n("ffn_gate_shexp.weight"),
                    n("ffn_up_shexp.weight"),
                    n("ffn_down_shexp.weight"),
                ];
                let shapes = [[d, fs], [d, fs], [fs, d]];
                let mut present = Vec::new();
                for (name, dims) in names.iter().zip(shapes) {
                    present.push(opt_tensor(f, name, &dims)?.is_some());
                }
                let any = present.iter().any(|&p| p);
                if any || m.expert_shared_count == 1 {
                    for (name, p) in names.iter().zip(&present) {
                        if !p {
                            return Err(match names.iter().zip(&present).find(|(_, p)| **p) {
                                Some((other, _)) => ConfigError::IncompleteSet {
                                    tensor: name.clone(),
                                    present: other.clone(),
                                },
                                None => ConfigError::MissingTensor {
                                    tensor: name.clone(),
                                },
                            });
                        }
                    }
                }
                if any && m.expert_shared_count == 0 {
                    return Err(ConfigError::invalid(
                        &key("expert_shared_count"),
                        format!("is 0, but layer {i} has shared-expert tensors"),
                    ));
                }
                lt.shared_expert = any;
            }
            layers.push(lt);
        }
        Ok(FlintTensors {
            vocab_size,
            tied_output,
            layers,
        })
    }
}

fn pair(a: bool, b: bool, an: &str, bn: &str) -> Result<bool, ConfigError> {
    match (a, b) {
        (true, false) => Err(ConfigError::IncompleteSet {
            tensor: bn.to_string(),
            present: an.to_string(),
        }),
        (false, true) => Err(ConfigError::IncompleteSet {
            tensor: an.to_string(),
            present: bn.to_string(),
        }),
        (x, _) => Ok(x),
    }
}

fn read_moe(f: &GgufFile) -> Result<MoeConfig, ConfigError> {
    let e = size(f, &key("expert_count"))?;
    let k_key = key("expert_used_count");
    let k = size(f, &k_key)?;
    if k > e {
        return Err(ConfigError::invalid(
            &k_key,
            format!("is {k}, more than expert_count {e}"),
        ));
    }
    let fe = size(f, &key("expert_feed_forward_length"))?;
    let sc_key = key("expert_shared_count");
    let shared = f.opt_usize(&sc_key)?.unwrap_or(0);
    if shared > 1 {
        return Err(ConfigError::invalid(
            &sc_key,
            format!("is {shared}: Flint has 0 or 1 shared expert"),
        ));
    }
    let fs = opt_size(f, &key("expert_shared_feed_forward_length"))?.unwrap_or(fe);
    let g_key = key("expert_gating_func");
    let gating_func = match f.opt_u32(&g_key)?.unwrap_or(2) {
        1 => GatingFunc::Softmax,
        2 => GatingFunc::Sigmoid,
        other => {
            return Err(ConfigError::invalid(
                &g_key,
                format!("is {other}: 1 (softmax) or 2 (sigmoid) expected"),
            ))
        }
    };
    let weights_norm = f.opt_bool(&key("expert_weights_norm"))?.unwrap_or(true);
    let ws_key = key("expert_weights_scale");
    let weights_scale = match f.opt_f32(&ws_key)? {
        Some(v) => positive(&ws_key, v)?,
        None => 1.0,
    };
    nonzero(&k_key, k)?;
    Ok(MoeConfig {
        expert_count: e,
        expert_used_count: k,
        expert_feed_forward_length: fe,
        expert_shared_count: shared,
        expert_shared_feed_forward_length: fs,
        gating_func,
        weights_norm,
        weights_scale,
    })
}
