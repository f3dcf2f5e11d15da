//! Assembling a [`Model`] from a GGUF file: hyper-parameters from the metadata, tensors
//! by name with their shapes checked, small vectors decoded to f32.

use std::path::Path;

use flint_hal::{Gating, WeightSource};
use flint_loader::gguf::{GgufError, GgufFile, TensorInfo};

use super::{
    Activation, Arch, Ffn, Layer, Mlp, Model, ModelError, ModelSpec, Moe, MoeSpec, TensorRef,
};
use crate::model::LayerSpec;

/// Opens and assembles the model in `path`.
pub fn load_model(path: &Path) -> Result<Model, ModelError> {
    let file = GgufFile::open(path).map_err(|source| ModelError::File {
        path: path.to_path_buf(),
        source,
    })?;
    model_from_gguf(&file)
}

fn key_err(e: GgufError) -> ModelError {
    ModelError::Gguf(e)
}

fn bad(key: &str, why: impl std::fmt::Display) -> ModelError {
    ModelError::new(format!("metadata key '{key}': {why}"))
}

fn nonzero(key: &str, v: usize) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(bad(key, "must not be 0"));
    }
    Ok(v)
}

/// Assembles the model of an opened GGUF file (Flint or Gemma 3).
pub fn model_from_gguf(file: &GgufFile) -> Result<Model, ModelError> {
    let arch = file.architecture().map_err(key_err)?.to_string();
    let spec = match arch.as_str() {
        "flint" => flint_spec(file)?,
        "gemma3" => gemma3_spec(file)?,
        other => {
            return Err(ModelError::new(format!(
                "architecture '{other}' is not supported (supported: flint, gemma3)"
            )))
        }
    };
    Tensors { file, spec }.assemble()
}

fn u(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    file.get_usize(key).map_err(key_err)
}

fn ou(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
    file.opt_usize(key).map_err(key_err)
}

fn flint_spec(file: &GgufFile) -> Result<ModelSpec, ModelError> {
    let k = |s: &str| format!("flint.{s}");
    let d = nonzero(&k("embedding_length"), u(file, &k("embedding_length"))?)?;
    let n_layers = nonzero(&k("block_count"), u(file, &k("block_count"))?)?;
    let h = nonzero(
        &k("attention.head_count"),
        u(file, &k("attention.head_count"))?,
    )?;
    let hkv = nonzero(
        &k("attention.head_count_kv"),
        u(file, &k("attention.head_count_kv"))?,
    )?;
    if h % hkv != 0 {
        return Err(bad(
            &k("attention.head_count_kv"),
            format!("{hkv} does not divide attention.head_count {h}"),
        ));
    }
    let dk = match ou(file, &k("attention.key_length"))? {
        Some(v) => nonzero(&k("attention.key_length"), v)?,
        None => d / h,
    };
    let dv = match ou(file, &k("attention.value_length"))? {
        Some(v) => nonzero(&k("attention.value_length"), v)?,
        None => dk,
    };
    let n_rot = ou(file, &k("rope.dimension_count"))?.unwrap_or(dk);
    if n_rot % 2 != 0 || n_rot > dk || n_rot == 0 {
        return Err(bad(
            &k("rope.dimension_count"),
            format!("{n_rot} must be even, non-zero and at most key_length {dk}"),
        ));
    }
    let eps = file
        .get_f32(&k("attention.layer_norm_rms_epsilon"))
        .map_err(key_err)?;
    let pattern = file
        .get_bool_array(&k("attention.sliding_window_pattern"))
        .map_err(key_err)?
        .to_vec();
    if pattern.len() != n_layers {
        return Err(bad(
            &k("attention.sliding_window_pattern"),
            format!("has {} entries, block_count is {n_layers}", pattern.len()),
        ));
    }
    let window = if pattern.iter().any(|&s| s) {
        Some(nonzero(
            &k("attention.sliding_window"),
            u(file, &k("attention.sliding_window"))?,
        )?)
    } else {
        ou(file, &k("attention.sliding_window"))?
    };
    let base = file.get_f32(&k("rope.freq_base")).map_err(key_err)?;
    let base_swa = file
        .opt_f32(&k("rope.freq_base_swa"))
        .map_err(key_err)?
        .unwrap_or(base);
    let n_dense = ou(file, &k("leading_dense_block_count"))?.unwrap_or(0);
    let moe = if n_dense < n_layers {
        let e = nonzero(&k("expert_count"), u(file, &k("expert_count"))?)?;
        let kk = nonzero(&k("expert_used_count"), u(file, &k("expert_used_count"))?)?;
        if kk > e {
            return Err(bad(
                &k("expert_used_count"),
                format!("{kk} is larger than expert_count {e}"),
            ));
        }
        let fe = nonzero(
            &k("expert_feed_forward_length"),
            u(file, &k("expert_feed_forward_length"))?,
        )?;
        let gating = match ou(file, &k("expert_gating_func"))?.unwrap_or(2) {
            2 => Gating::Sigmoid,
            1 => Gating::Softmax,
            other => {
                return Err(bad(
                    &k("expert_gating_func"),
                    format!("{other} is neither 1 (softmax) nor 2 (sigmoid)"),
                ))
            }
        };
        Some(MoeSpec {
            n_experts: e,
            k: kk,
            expert_ff: fe,
            gating,
            normalize: file
                .opt_bool(&k("expert_weights_norm"))
                .map_err(key_err)?
                .unwrap_or(true),
            scale: file
                .opt_f32(&k("expert_weights_scale"))
                .map_err(key_err)?
                .unwrap_or(1.0),
        })
    } else {
        None
    };
    Ok(ModelSpec {
        arch: Arch::Flint,
        d,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim_k: dk,
        head_dim_v: dv,
        n_rot,
        eps,
        vocab: 0,
        context_length: nonzero(&k("context_length"), u(file, &k("context_length"))?)?,
        window,
        attn_scale: 1.0 / (dk as f32).sqrt(),
        embed_scale: 1.0,
        activation: Activation::Silu,
        moe,
        layers: pattern
            .iter()
            .map(|&sliding| LayerSpec {
                sliding,
                rope_base: if sliding { base_swa } else { base },
            })
            .collect(),
    })
}

fn gemma3_spec(file: &GgufFile) -> Result<ModelSpec, ModelError> {
    let k = |s: &str| format!("gemma3.{s}");
    let d = nonzero(&k("embedding_length"), u(file, &k("embedding_length"))?)?;
    let n_layers = nonzero(&k("block_count"), u(file, &k("block_count"))?)?;
    let h = nonzero(
        &k("attention.head_count"),
        u(file, &k("attention.head_count"))?,
    )?;
    let hkv = nonzero(
        &k("attention.head_count_kv"),
        u(file, &k("attention.head_count_kv"))?,
    )?;
    if h % hkv != 0 {
        return Err(bad(
            &k("attention.head_count_kv"),
            format!("{hkv} does not divide attention.head_count {h}"),
        ));
    }
    let dk = ou(file, &k("attention.key_length"))?.unwrap_or(d / h);
    let dv = ou(file, &k("attention.value_length"))?.unwrap_or(dk);
    let window = ou(file, &k("attention.sliding_window"))?.filter(|&w| w > 0);
    // llama.cpp: an explicit per-layer pattern, else every 6th layer is global.
    let pattern: Vec<bool> = match file
        .opt_bool_array(&k("attention.sliding_window_pattern"))
        .map_err(key_err)?
    {
        Some(p) if p.len() == n_layers => p.to_vec(),
        Some(p) => {
            return Err(bad(
                &k("attention.sliding_window_pattern"),
                format!("has {} entries, block_count is {n_layers}", p.len()),
            ))
        }
        None => (0..n_layers)
            .map(|il| window.is_some() && il % 6 < 5)
            .collect(),
    };
    let base = file.get_f32(&k("rope.freq_base")).map_err(key_err)?;
    // llama.cpp's default for the local layers when the key is absent.
    let base_swa = file
        .opt_f32(&k("rope.freq_base_swa"))
        .map_err(key_err)?
        .unwrap_or(10_000.0);
    Ok(ModelSpec {
        arch: Arch::Gemma3,
        d,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim_k: dk,
        head_dim_v: dv,
        n_rot: ou(file, &k("rope.dimension_count"))?.unwrap_or(dk),
        eps: file
            .get_f32(&k("attention.layer_norm_rms_epsilon"))
            .map_err(key_err)?,
        vocab: 0,
        context_length: u(file, &k("context_length"))?,
        window,
        // Gemma 3 (all but 27B) scales queries by 1/sqrt(head_dim).
        attn_scale: 1.0 / (dk as f32).sqrt(),
        embed_scale: (d as f32).sqrt(),
        activation: Activation::GeluTanh,
        moe: None,
        layers: pattern
            .iter()
            .map(|&sliding| LayerSpec {
                sliding,
                rope_base: if sliding { base_swa } else { base },
            })
            .collect(),
    })
}

struct Tensors<'f> {
    file: &'f GgufFile,
    spec: ModelSpec,
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

    fn opt(&self, name: &str, dims: &[usize]) -> Result<Option<TensorRef>, ModelError> {
        match self.info(name) {
            Some(info) => self.make(info, dims).map(Some),
            None => Ok(None),
        }
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

    fn opt_vec(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        match self.opt(name, &[len])? {
            Some(t) => t.to_f32().map(Some),
            None => Ok(None),
        }
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
        let mut spec = self.spec.clone();
        let d = spec.d;
        let embd_info = self
            .info("token_embd.weight")
            .ok_or_else(|| ModelError::new("required tensor 'token_embd.weight' is missing"))?;
        let vocab = embd_info.dims.get(1).copied().unwrap_or(0);
        if vocab == 0 {
            return Err(ModelError::new(format!(
                "tensor 'token_embd.weight' has shape {:?}, expected [{d}, vocab]",
                embd_info.dims
            )));
        }
        spec.vocab = vocab;
        let token_embd = self.get("token_embd.weight", &[d, vocab])?;
        let output = self
            .opt("output.weight", &[d, vocab])?
            .unwrap_or_else(|| token_embd.clone());
        let output_norm = self.vec("output_norm.weight", d)?;
        let (h, hkv, dk, dv) = (
            spec.n_heads,
            spec.n_kv_heads,
            spec.head_dim_k,
            spec.head_dim_v,
        );
        let gemma = spec.arch == Arch::Gemma3;
        let n_dense = if gemma {
            spec.n_layers()
        } else {
            self.file
                .opt_usize("flint.leading_dense_block_count")
                .map_err(key_err)?
                .unwrap_or(0)
        };
        let dense_ff = if n_dense > 0 {
            let key = if gemma {
                "gemma3.feed_forward_length"
            } else {
                "flint.feed_forward_length"
            };
            nonzero(key, u(self.file, key)?)?
        } else {
            0
        };
        let mut layers = Vec::with_capacity(spec.n_layers());
        for il in 0..spec.n_layers() {
            let p = format!("blk.{il}.");
            let q_norm = self.opt_vec(&format!("{p}attn_q_norm.weight"), dk)?;
            let k_norm = self.opt_vec(&format!("{p}attn_k_norm.weight"), dk)?;
            if q_norm.is_some() != k_norm.is_some() {
                return Err(ModelError::new(format!(
                    "layer {il}: attn_q_norm and attn_k_norm must both be present or both absent"
                )));
            }
            let ffn = if il < n_dense {
                Ffn::Dense(self.mlp(&p, "", d, dense_ff, None)?)
            } else {
                let ms = spec
                    .moe
                    .ok_or_else(|| ModelError::new("MoE layer without MoE metadata"))?;
                let e = ms.n_experts;
                let router = self.get(&format!("{p}ffn_gate_inp.weight"), &[d, e])?;
                let bias = self.opt_vec(&format!("{p}exp_probs_b.bias"), e)?;
                let experts = self.mlp(&p, "_exps", d, ms.expert_ff, Some(e))?;
                let shared = if self.info(&format!("{p}ffn_gate_shexp.weight")).is_some() {
                    let fs = self
                        .file
                        .opt_usize("flint.expert_shared_feed_forward_length")
                        .map_err(key_err)?
                        .unwrap_or(ms.expert_ff);
                    Some(self.mlp(&p, "_shexp", d, fs, None)?)
                } else {
                    None
                };
                Ffn::Moe(Box::new(Moe {
                    router,
                    bias,
                    experts,
                    shared,
                }))
            };
            layers.push(Layer {
                attn_norm: self.vec(&format!("{p}attn_norm.weight"), d)?,
                wq: self.get(&format!("{p}attn_q.weight"), &[d, h * dk])?,
                wk: self.get(&format!("{p}attn_k.weight"), &[d, hkv * dk])?,
                wv: self.get(&format!("{p}attn_v.weight"), &[d, hkv * dv])?,
                wo: self.get(&format!("{p}attn_output.weight"), &[h * dv, d])?,
                q_norm,
                k_norm,
                sinks: self.opt_vec(&format!("{p}attn_sinks.weight"), h)?,
                post_attn_norm: if gemma {
                    Some(self.vec(&format!("{p}post_attention_norm.weight"), d)?)
                } else {
                    None
                },
                ffn_norm: self.vec(&format!("{p}ffn_norm.weight"), d)?,
                ffn,
                post_ffn_norm: if gemma {
                    Some(self.vec(&format!("{p}post_ffw_norm.weight"), d)?)
                } else {
                    None
                },
            });
        }
        Ok(Model {
            spec,
            token_embd,
            output,
            output_norm,
            layers,
        })
    }
}
