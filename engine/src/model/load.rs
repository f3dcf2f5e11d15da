//! Assembling a [`Model`] from a GGUF file: the loader's description
//! ([`ModelDesc::from_gguf`], which reads every key and checks every tensor's presence,
//! shape and type), then the tensors it names, the small vectors decoded to f32.

use std::path::Path;

use flint_hal::WeightSource;
use flint_loader::gguf::{GgufFile, TensorInfo};

use super::{
    DeltaNetLayer, ExpertBiases, Ffn, FfnDesc, Layer, LayerInput, Mixer, Mlp, Model, ModelDesc,
    ModelError, Moe, NormPlacement, ParallelDense, PerLayerInputs, TensorRef,
};

/// Opens and assembles the model in `path`.
pub fn load_model(path: &Path) -> Result<Model, ModelError> {
    let file = GgufFile::open(path).map_err(|source| ModelError::File {
        path: path.to_path_buf(),
        source,
    })?;
    model_from_gguf(&file)
}

/// Assembles the model of an opened GGUF file, of any architecture [`ModelDesc`]
/// accepts.
pub fn model_from_gguf(file: &GgufFile) -> Result<Model, ModelError> {
    let spec = ModelDesc::from_gguf(file)?;
    Tensors { file, spec }.assemble()
}

struct Tensors<'f> {
    file: &'f GgufFile,
    spec: ModelDesc,
}

impl Tensors<'_> {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.file.tensor(name)
    }

    fn get(&self, name: &str, dims: &[usize]) -> Result<TensorRef, ModelError> {
        let info = self
            .info(name)
            .ok_or_else(|| ModelError::new(format!("required tensor '{name}' is missing")))?;
        self.make(info, dims)
    }

    fn make(&self, info: &TensorInfo, dims: &[usize]) -> Result<TensorRef, ModelError> {
        if info.dims != dims {
            return Err(ModelError::new(format!(
                "tensor '{}' has shape {:?}, expected {:?}",
                info.name, info.dims, dims
            )));
        }
        if !dims[0].is_multiple_of(info.ty.block_size()) {
            return Err(ModelError::new(format!(
                "tensor '{}': rows of {} values are not whole {} blocks",
                info.name, dims[0], info.ty
            )));
        }
        let src = self.file.tensor_bytes(info);
        let mut data = WeightSource::new(src.bytes, src.range)?;
        if let Some(hook) = src.release {
            data = data.with_release(hook);
        }
        Ok(TensorRef {
            name: info.name.clone(),
            ty: info.ty,
            dims: dims.to_vec(),
            data,
        })
    }

    fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        self.get(name, &[len])?.to_f32()
    }

    fn mlp(
        &self,
        prefix: &str,
        suffix: &str,
        d: usize,
        f: usize,
        e: Option<usize>,
    ) -> Result<Mlp, ModelError> {
        let dims = |a: usize, b: usize| match e {
            Some(e) => vec![a, b, e],
            None => vec![a, b],
        };
        Ok(Mlp {
            gate: self.get(&format!("{prefix}ffn_gate{suffix}.weight"), &dims(d, f))?,
            up: self.get(&format!("{prefix}ffn_up{suffix}.weight"), &dims(d, f))?,
            down: self.get(&format!("{prefix}ffn_down{suffix}.weight"), &dims(f, d))?,
        })
    }

    fn assemble(self) -> Result<Model, ModelError> {
        let spec = &self.spec;
        let (d, vocab) = (spec.d, spec.vocab);
        let token_embd = self.get("token_embd.weight", &[d, vocab])?;
        let output = if spec.tied_output {
            token_embd.clone()
        } else {
            self.get("output.weight", &[d, vocab])?
        };
        let output_norm = self.vec("output_norm.weight", d)?;
        let rope_freqs = if spec.rope.freq_factors {
            // `[n_rot / 2]` for llama; gemma4's is `[key_length / 2]`, equal to it.
            let info = self
                .info("rope_freqs.weight")
                .ok_or_else(|| ModelError::new("required tensor 'rope_freqs.weight' is missing"))?;
            Some(self.make(info, &info.dims.clone())?.to_f32()?)
        } else {
            None
        };
        let h = spec.n_heads;
        let post = spec.norms == NormPlacement::PrePost;
        let p = spec.per_layer_input;
        let n_layers = spec.n_layers();
        let per_layer = if p > 0 {
            Some(PerLayerInputs {
                token_embd: self.get("per_layer_token_embd.weight", &[p * n_layers, vocab])?,
                model_proj: self.get("per_layer_model_proj.weight", &[d, p * n_layers])?,
                proj_norm: self.vec("per_layer_proj_norm.weight", p)?,
            })
        } else {
            None
        };
        let mut layers = Vec::with_capacity(n_layers);
        for (il, ld) in spec.layers.iter().enumerate() {
            let (hkv, dk, dv) = (ld.n_kv_heads, ld.head_dim_k, ld.head_dim_v);
            let pre = format!("blk.{il}.");
            let name = |s: &str| format!("{pre}{s}");
            let opt_vec = |present: bool, s: &str, len: usize| {
                if present {
                    self.vec(&name(s), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            let ffn = match ld.ffn {
                FfnDesc::Dense { width } => Ffn::Dense(self.mlp(&pre, "", d, width, None)?),
                FfnDesc::Moe {
                    selection_bias,
                    shared_expert,
                    parallel_dense,
                } => {
                    let ms = spec.moe.ok_or_else(|| {
                        ModelError::new(format!(
                            "layer {il} is a mixture-of-experts layer in a model without MoE settings"
                        ))
                    })?;
                    let e = ms.experts;
                    let fe = ms.expert_width;
                    let expert_biases = if ms.expert_biases {
                        Some(ExpertBiases {
                            gate: self.get(&name("ffn_gate_exps.bias"), &[fe, e])?.to_f32()?,
                            up: self.get(&name("ffn_up_exps.bias"), &[fe, e])?.to_f32()?,
                            down: self.get(&name("ffn_down_exps.bias"), &[d, e])?.to_f32()?,
                        })
                    } else {
                        None
                    };
                    Ffn::Moe(Box::new(Moe {
                        router: self.get(&name("ffn_gate_inp.weight"), &[d, e])?,
                        bias: opt_vec(selection_bias, "exp_probs_b.bias", e)?,
                        router_bias: opt_vec(ms.router_bias, "ffn_gate_inp.bias", e)?,
                        experts: self.mlp(&pre, "_exps", d, fe, Some(e))?,
                        expert_biases,
                        shared: if shared_expert {
                            Some(self.mlp(&pre, "_shexp", d, ms.shared_width, None)?)
                        } else {
                            None
                        },
                        router_scale: opt_vec(ms.router_input_scale, "ffn_gate_inp.scale", d)?,
                        expert_scale: opt_vec(ms.expert_out_scale, "ffn_down_exps.scale", e)?,
                        parallel: match parallel_dense {
                            Some(width) => Some(ParallelDense {
                                mlp: self.mlp(&pre, "", d, width, None)?,
                                post_norm_1: self.vec(&name("post_ffw_norm_1.weight"), d)?,
                                pre_norm_2: self.vec(&name("pre_ffw_norm_2.weight"), d)?,
                                post_norm_2: self.vec(&name("post_ffw_norm_2.weight"), d)?,
                            }),
                            None => None,
                        },
                        shared_gate: if ms.shared_gate {
                            // A `[d]` vector applied as a matrix of one output row.
                            let mut t = self.get(&name("ffn_gate_inp_shexp.weight"), &[d])?;
                            t.dims = vec![d, 1];
                            Some(t)
                        } else {
                            None
                        },
                    }))
                }
            };
            if ld.mixer == Mixer::DeltaNet {
                let dn = spec.delta_net.ok_or_else(|| {
                    ModelError::new(format!(
                        "layer {il} is a Gated DeltaNet layer in a model without DeltaNet sizes"
                    ))
                })?;
                let (conv_dim, v_len, hv) = (dn.conv_dim(), dn.shape.v_len(), dn.shape.heads_v);
                let delta = DeltaNetLayer {
                    qkv: self.get(&name("attn_qkv.weight"), &[d, conv_dim])?,
                    gate: self.get(&name("attn_gate.weight"), &[d, v_len])?,
                    conv: self
                        .get(&name("ssm_conv1d.weight"), &[dn.conv_kernel, conv_dim])?
                        .to_f32()?,
                    dt_bias: self.vec(&name("ssm_dt.bias"), hv)?,
                    a: self.vec(&name("ssm_a"), hv)?,
                    beta: self.get(&name("ssm_beta.weight"), &[d, hv])?,
                    alpha: self.get(&name("ssm_alpha.weight"), &[d, hv])?,
                    norm: self.vec(&name("ssm_norm.weight"), dn.shape.head_dim)?,
                    out: self.get(&name("ssm_out.weight"), &[v_len, d])?,
                };
                layers.push(Layer {
                    attn_norm: self.vec(&name("attn_norm.weight"), d)?,
                    wq: delta.qkv.clone(),
                    wk: delta.qkv.clone(),
                    wv: delta.gate.clone(),
                    wo: delta.out.clone(),
                    delta_net: Some(delta),
                    bq: None,
                    bk: None,
                    bv: None,
                    bo: None,
                    q_norm: None,
                    k_norm: None,
                    sinks: None,
                    post_attn_norm: opt_vec(post, "post_attention_norm.weight", d)?,
                    ffn_norm: self.vec(&name(&format!("{}.weight", spec.ffn_norm_tensor)), d)?,
                    ffn,
                    post_ffn_norm: opt_vec(post, "post_ffw_norm.weight", d)?,
                    per_layer: None,
                    out_scale: None,
                });
                continue;
            }
            // Qwen 3.5's gated attention: the query projection holds a gate per head.
            let q_rows = if ld.attn_gate { 2 * h * dk } else { h * dk };
            let wq = self.get(&name("attn_q.weight"), &[d, q_rows])?;
            // A layer reading another layer's KV (gemma4) needs no K/V projection: any it
            // carries is kept, else the query's stands in (never read).
            let own_kv = ld.kv_source.is_none();
            let wk = match self.info(&name("attn_k.weight")) {
                Some(_) => self.get(&name("attn_k.weight"), &[d, hkv * dk])?,
                None if !own_kv => wq.clone(),
                None => {
                    return Err(ModelError::new(format!(
                        "required tensor '{}' is missing",
                        name("attn_k.weight")
                    )))
                }
            };
            // gemma4's `attention_k_eq_v`: without `attn_v` the keys serve as values.
            let wv = match self.info(&name("attn_v.weight")) {
                Some(_) => self.get(&name("attn_v.weight"), &[d, hkv * dv])?,
                None if spec.arch == super::Arch::Gemma4 => wk.clone(),
                None => {
                    return Err(ModelError::new(format!(
                        "required tensor '{}' is missing",
                        name("attn_v.weight")
                    )))
                }
            };
            let k_norm_present = ld.qk_norm && self.info(&name("attn_k_norm.weight")).is_some();
            let out_scale = if ld.out_scale {
                Some(self.vec(&name("layer_output_scale.weight"), 1)?[0])
            } else {
                None
            };
            let per_layer_l = if p > 0 {
                Some(LayerInput {
                    inp_gate: self.get(&name("inp_gate.weight"), &[d, p])?,
                    proj: self.get(&name("proj.weight"), &[p, d])?,
                    post_norm: self.vec(&name("post_norm.weight"), d)?,
                })
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: self.vec(&name("attn_norm.weight"), d)?,
                delta_net: None,
                wq,
                wk,
                wv,
                wo: self.get(&name("attn_output.weight"), &[h * dv, d])?,
                bq: opt_vec(ld.biases.q, "attn_q.bias", h * dk)?,
                bk: opt_vec(ld.biases.k, "attn_k.bias", hkv * dk)?,
                bv: opt_vec(ld.biases.v, "attn_v.bias", hkv * dv)?,
                bo: opt_vec(ld.biases.o, "attn_output.bias", d)?,
                q_norm: opt_vec(ld.qk_norm, "attn_q_norm.weight", dk)?,
                k_norm: opt_vec(k_norm_present, "attn_k_norm.weight", dk)?,
                sinks: opt_vec(ld.sinks, "attn_sinks.weight", h)?,
                post_attn_norm: opt_vec(post, "post_attention_norm.weight", d)?,
                ffn_norm: self.vec(&name(&format!("{}.weight", spec.ffn_norm_tensor)), d)?,
                ffn,
                post_ffn_norm: opt_vec(post, "post_ffw_norm.weight", d)?,
                per_layer: per_layer_l,
                out_scale,
            });
        }
        Ok(Model {
            spec: self.spec,
            token_embd,
            output,
            rope_freqs,
            output_norm,
            per_layer,
            layers,
        })
    }
}
