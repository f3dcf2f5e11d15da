//! The tensor check of a [`ModelDesc`]: every tensor the architecture needs, with the
//! shape the description implies and F32 where the forward reads f32 vectors (norms,
//! biases, sinks, selection bias, RoPE factors); the optional ones the architecture
//! allows (as llama.cpp's `load_arch_tensors` does); and any other tensor refused by
//! name, so that nothing a file carries is silently ignored.

use std::collections::HashSet;

use flint_core::GgmlType;

use super::desc::{Arch, AttnBiases, FfnDesc, ModelDesc};
use super::ConfigError;
use crate::gguf::{GgufFile, TensorInfo};

/// Looks tensors up and remembers which ones the description accounts for.
pub(super) struct Claims<'f> {
    pub(super) f: &'f GgufFile,
    pub(super) claimed: HashSet<&'f str>,
}

impl<'f> Claims<'f> {
    /// The tensor `name` if present, then with exactly `dims` (and F32 when `f32`).
    pub(super) fn opt(
        &mut self,
        name: &str,
        dims: &[usize],
        f32: bool,
    ) -> Result<Option<&'f TensorInfo>, ConfigError> {
        let Some(t) = self.f.tensor(name) else {
            return Ok(None);
        };
        if t.dims != dims {
            return Err(ConfigError::TensorShape {
                tensor: t.name.clone(),
                expected: dims.to_vec(),
                found: t.dims.clone(),
            });
        }
        if f32 && t.ty != GgmlType::F32 {
            return Err(ConfigError::TensorType {
                tensor: t.name.clone(),
                expected: "F32",
                found: t.ty,
            });
        }
        self.claimed.insert(t.name.as_str());
        Ok(Some(t))
    }

    /// The tensor `name`, which must be present.
    pub(super) fn req(&mut self, name: &str, dims: &[usize], f32: bool) -> Result<(), ConfigError> {
        match self.opt(name, dims, f32)? {
            Some(_) => Ok(()),
            None => Err(ConfigError::MissingTensor {
                tensor: name.to_string(),
            }),
        }
    }

    /// `token_embd` (`[d, vocab]`) and `output_norm`; returns the vocabulary size.
    pub(super) fn embedding(&mut self, d: usize) -> Result<usize, ConfigError> {
        let emb = self
            .f
            .tensor("token_embd.weight")
            .ok_or_else(|| ConfigError::MissingTensor {
                tensor: "token_embd.weight".into(),
            })?;
        let vocab = match emb.dims.as_slice() {
            [e, v] if *e == d && *v > 0 => *v,
            _ => {
                return Err(ConfigError::TensorShape {
                    tensor: emb.name.clone(),
                    expected: vec![d, emb.dims.get(1).copied().unwrap_or(0).max(1)],
                    found: emb.dims.clone(),
                })
            }
        };
        self.req("token_embd.weight", &[d, vocab], false)?;
        self.req("output_norm.weight", &[d], true)?;
        Ok(vocab)
    }

    /// Layer `i`'s attention norm and Q, K, V, output projections.
    pub(super) fn attention(
        &mut self,
        i: usize,
        d: usize,
        h: usize,
        hkv: usize,
        dk: usize,
        dv: usize,
    ) -> Result<(), ConfigError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        self.req(&n("attn_norm.weight"), &[d], true)?;
        self.req(&n("attn_q.weight"), &[d, h * dk], false)?;
        self.req(&n("attn_k.weight"), &[d, hkv * dk], false)?;
        self.req(&n("attn_v.weight"), &[d, hkv * dv], false)?;
        self.req(&n("attn_output.weight"), &[h * dv, d], false)
    }

    /// Layer `i`'s optional Q, K, V biases, recorded in `biases`.
    pub(super) fn qkv_biases(
        &mut self,
        i: usize,
        h: usize,
        hkv: usize,
        dk: usize,
        dv: usize,
        biases: &mut AttnBiases,
    ) -> Result<(), ConfigError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        biases.q = self.opt(&n("attn_q.bias"), &[h * dk], true)?.is_some();
        biases.k = self.opt(&n("attn_k.bias"), &[hkv * dk], true)?.is_some();
        biases.v = self.opt(&n("attn_v.bias"), &[hkv * dv], true)?.is_some();
        Ok(())
    }

    /// Layer `i`'s dense feed-forward of width `w`.
    pub(super) fn dense_ffn(&mut self, i: usize, d: usize, w: usize) -> Result<(), ConfigError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        self.req(&n("ffn_gate.weight"), &[d, w], false)?;
        self.req(&n("ffn_up.weight"), &[d, w], false)?;
        self.req(&n("ffn_down.weight"), &[w, d], false)
    }

    /// Layer `i`'s `e` experts of width `fe`.
    pub(super) fn experts(
        &mut self,
        i: usize,
        d: usize,
        fe: usize,
        e: usize,
    ) -> Result<(), ConfigError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        self.req(&n("ffn_gate_exps.weight"), &[d, fe, e], false)?;
        self.req(&n("ffn_up_exps.weight"), &[d, fe, e], false)?;
        self.req(&n("ffn_down_exps.weight"), &[fe, d, e], false)
    }

    /// Refuses the first tensor nothing claimed: something the description cannot
    /// represent.
    pub(super) fn finish(&self, arch: Arch) -> Result<(), ConfigError> {
        if let Some(t) = self
            .f
            .tensors()
            .iter()
            .find(|t| !self.claimed.contains(t.name.as_str()))
        {
            return Err(ConfigError::UnexpectedTensor {
                tensor: t.name.clone(),
                arch: arch.name(),
            });
        }
        Ok(())
    }

    /// Optional tensors that come all together or not at all.
    pub(super) fn set(
        &mut self,
        members: &[(String, Vec<usize>, bool)],
    ) -> Result<bool, ConfigError> {
        let mut present = Vec::with_capacity(members.len());
        for (name, dims, f32) in members {
            present.push(self.opt(name, dims, *f32)?.is_some());
        }
        let Some(first) = present.iter().position(|&p| p) else {
            return Ok(false);
        };
        match present.iter().position(|&p| !p) {
            None => Ok(true),
            Some(missing) => Err(ConfigError::IncompleteSet {
                tensor: members[missing].0.clone(),
                present: members[first].0.clone(),
            }),
        }
    }
}

/// Checks the tensors of `f` against `desc` and fills in what they tell: vocabulary
/// size, tied output, RoPE frequency factors, and per layer QK norm, sinks, biases,
/// selection bias and shared expert.
pub(crate) fn check(desc: &mut ModelDesc, f: &GgufFile) -> Result<(), ConfigError> {
    let arch = desc.arch;
    let mut c = Claims {
        f,
        claimed: HashSet::new(),
    };
    let d = desc.d;
    let vocab = c.embedding(d)?;
    desc.vocab = vocab;
    desc.tied_output = c.opt("output.weight", &[d, vocab], false)?.is_none();
    // llama.cpp loads `rope_freqs` for llama once and shares it with every layer.
    if arch == Arch::Llama {
        let n = desc.rope.n_rot / 2;
        desc.rope.freq_factors = c.opt("rope_freqs.weight", &[n], true)?.is_some();
        for l in &mut desc.layers {
            l.rope_freq_factors = desc.rope.freq_factors;
        }
    }

    let (h, hkv, dk, dv) = (
        desc.n_heads,
        desc.n_kv_heads,
        desc.head_dim_k,
        desc.head_dim_v,
    );
    // Which optional attention biases llama.cpp loads for the architecture
    // (`create_tensor_qkv`, and `attn_output.bias` for llama).
    let qkv_bias_allowed = arch != Arch::Flint;
    let o_bias_allowed = arch == Arch::Llama;
    let moe = desc.moe;
    for (i, layer) in desc.layers.iter_mut().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        c.attention(i, d, h, hkv, dk, dv)?;
        if qkv_bias_allowed {
            c.qkv_biases(i, h, hkv, dk, dv, &mut layer.biases)?;
        }
        if o_bias_allowed {
            layer.biases.o = c.opt(&n("attn_output.bias"), &[d], true)?.is_some();
        }
        let qk = [
            (n("attn_q_norm.weight"), vec![dk], true),
            (n("attn_k_norm.weight"), vec![dk], true),
        ];
        match arch {
            Arch::Gemma3 | Arch::Qwen3 => {
                for (name, dims, f32) in &qk {
                    c.req(name, dims, *f32)?;
                }
            }
            Arch::Flint => {
                layer.qk_norm = c.set(&qk)?;
                layer.sinks = c.opt(&n("attn_sinks.weight"), &[h], true)?.is_some();
            }
            _ => {}
        }
        if arch == Arch::Gemma3 {
            c.req(&n("post_attention_norm.weight"), &[d], true)?;
            c.req(&n("post_ffw_norm.weight"), &[d], true)?;
        }
        c.req(&n("ffn_norm.weight"), &[d], true)?;
        match &mut layer.ffn {
            FfnDesc::Dense { width } => {
                c.dense_ffn(i, d, *width)?;
            }
            FfnDesc::Moe {
                selection_bias,
                shared_expert,
                ..
            } => {
                let Some(m) = moe else {
                    return Err(ConfigError::invalid(
                        &format!("{}.expert_count", arch.name()),
                        format!("missing, but layer {i} is a mixture-of-experts layer"),
                    ));
                };
                let (e, fe, fs) = (m.experts, m.expert_width, m.shared_width);
                c.req(&n("ffn_gate_inp.weight"), &[d, e], false)?;
                *selection_bias = c.opt(&n("exp_probs_b.bias"), &[e], true)?.is_some();
                c.experts(i, d, fe, e)?;
                let shexp = [
                    (n("ffn_gate_shexp.weight"), vec![d, fs], false),
                    (n("ffn_up_shexp.weight"), vec![d, fs], false),
                    (n("ffn_down_shexp.weight"), vec![fs, d], false),
                ];
                let present = c.set(&shexp)?;
                if !present && m.shared_count == 1 {
                    return Err(ConfigError::MissingTensor {
                        tensor: shexp[0].0.clone(),
                    });
                }
                if present && m.shared_count == 0 {
                    return Err(ConfigError::invalid(
                        &format!("{}.expert_shared_count", arch.name()),
                        format!("is 0, but layer {i} has shared-expert tensors"),
                    ));
                }
                *shared_expert = present;
            }
        }
    }
    c.finish(arch)
}
