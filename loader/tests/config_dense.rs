//! The dense families' descriptions (llama, qwen2, qwen3): keys, defaults, RoPE
//! scaling, biases, tensor checks, and one test per refusal, each error naming the key
//! or tensor. Files are made with our writer.

use flint_core::GgmlType;
use flint_loader::config::{
    Activation, Arch, ConfigError, FfnDesc, ModelDesc, NormPlacement, RopeKind,
};
use flint_loader::gguf::{GgufFile, GgufWriter, Value};

/// Shapes of the test models: d=32, H=4, Hkv=2, F=48, V=12, 2 layers; `dk` is
/// `key_length` when given, else d/H = 8.
struct Spec {
    arch: &'static str,
    keys: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<usize>, GgmlType)>,
}

fn spec(arch: &'static str) -> Spec {
    spec_dk(arch, None)
}

fn spec_dk(arch: &'static str, key_length: Option<usize>) -> Spec {
    let k = |s: &str| format!("{arch}.{s}");
    let mut keys = vec![("general.architecture".to_string(), Value::from(arch))];
    for (key, v) in [
        ("context_length", Value::U32(64)),
        ("embedding_length", Value::U32(32)),
        ("block_count", Value::U32(2)),
        ("feed_forward_length", Value::U32(48)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(2)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ] {
        keys.push((k(key), v));
    }
    if let Some(dk) = key_length {
        keys.push((k("attention.key_length"), Value::U32(dk as u32)));
        keys.push((k("attention.value_length"), Value::U32(dk as u32)));
    }
    let (d, v, dk, ff) = (32, 12, key_length.unwrap_or(8), 48);
    let f32 = GgmlType::F32;
    let mut t = vec![
        ("token_embd.weight".to_string(), vec![d, v], f32),
        ("output_norm.weight".into(), vec![d], f32),
        ("output.weight".into(), vec![d, v], f32),
    ];
    for i in 0..2 {
        let n = |s: &str| format!("blk.{i}.{s}");
        t.push((n("attn_norm.weight"), vec![d], f32));
        t.push((n("attn_q.weight"), vec![d, 4 * dk], f32));
        t.push((n("attn_k.weight"), vec![d, 2 * dk], f32));
        t.push((n("attn_v.weight"), vec![d, 2 * dk], f32));
        t.push((n("attn_output.weight"), vec![4 * dk, d], f32));
        if arch == "qwen3" {
            t.push((n("attn_q_norm.weight"), vec![dk], f32));
            t.push((n("attn_k_norm.weight"), vec![dk], f32));
        }
        if arch == "qwen2" {
            t.push((n("attn_q.bias"), vec![4 * dk], f32));
            t.push((n("attn_k.bias"), vec![2 * dk], f32));
            t.push((n("attn_v.bias"), vec![2 * dk], f32));
        }
        t.push((n("ffn_norm.weight"), vec![d], f32));
        t.push((n("ffn_gate.weight"), vec![d, ff], f32));
        t.push((n("ffn_up.weight"), vec![d, ff], f32));
        t.push((n("ffn_down.weight"), vec![ff, d], f32));
    }
    Spec {
        arch,
        keys,
        tensors: t,
    }
}

impl Spec {
    fn key(mut self, key: &str, v: Value) -> Self {
        let key = format!("{}.{key}", self.arch);
        self.keys.retain(|(n, _)| *n != key);
        self.keys.push((key, v));
        self
    }
    fn drop_key(mut self, key: &str) -> Self {
        let key = format!("{}.{key}", self.arch);
        self.keys.retain(|(n, _)| *n != key);
        self
    }
    fn tensor(mut self, name: &str, dims: &[usize], ty: GgmlType) -> Self {
        self.tensors.retain(|(n, _, _)| n != name);
        self.tensors.push((name.to_string(), dims.to_vec(), ty));
        self
    }
    fn drop_tensor(mut self, name: &str) -> Self {
        self.tensors.retain(|(n, _, _)| n != name);
        self
    }
    fn file(&self) -> GgufFile {
        let mut w = GgufWriter::new();
        for (key, v) in &self.keys {
            w.add(key, v.clone()).expect("key");
        }
        for (name, dims, ty) in &self.tensors {
            let n: usize = dims.iter().product();
            match ty {
                GgmlType::F32 => w.add_f32_tensor(name, dims, &vec![0.0; n]),
                GgmlType::F16 => w.add_tensor(name, GgmlType::F16, dims, vec![0u8; 2 * n]),
                other => panic!("test writer: {other}"),
            }
            .expect("tensor");
        }
        GgufFile::from_bytes(w.to_bytes()).expect("parse")
    }
    fn desc(&self) -> ModelDesc {
        ModelDesc::from_gguf(&self.file()).expect("description")
    }
    /// The refusal, asserting its message contains `needle`.
    fn refused(&self, needle: &str) -> ConfigError {
        let e = ModelDesc::from_gguf(&self.file()).expect_err("must be refused");
        assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
        e
    }
}

#[test]
fn llama_reads_and_checks() {
    let c = spec("llama").desc();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(c.arch.name(), "llama");
    assert_eq!(c.rope.kind, RopeKind::Normal);
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(c.norms, NormPlacement::Pre);
    assert_eq!((c.d, c.n_heads, c.n_kv_heads), (32, 4, 2));
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (8, 8, 8));
    assert_eq!(c.attn_scale, 1.0 / 8f32.sqrt());
    assert!(!c.q_prescaled);
    assert_eq!(c.embed_scale, 1.0);
    assert_eq!((c.vocab, c.tied_output), (12, false));
    assert_eq!((c.context_length, c.rms_eps), (64, 1e-5));
    assert!(c.layers.iter().all(|l| l.rope_base == 10_000.0
        && l.rope_freq_scale == 1.0
        && !l.sliding
        && !l.qk_norm
        && l.biases == Default::default()
        && l.ffn == FfnDesc::Dense { width: 48 }));
    assert!(!c.rope.freq_factors && c.rope.yarn.is_none());
    assert_eq!((c.window, c.moe, c.logit_softcap), (None, None, None));
    let c = spec("llama").drop_tensor("output.weight").desc();
    assert!(c.tied_output);
}

#[test]
fn llama_rope_freqs_and_output_bias() {
    let c = spec("llama")
        .tensor("rope_freqs.weight", &[4], GgmlType::F32)
        .tensor("blk.1.attn_output.bias", &[32], GgmlType::F32)
        .desc();
    assert!(c.rope.freq_factors);
    assert!(!c.layers[0].biases.o && c.layers[1].biases.o);
    spec("llama")
        .tensor("rope_freqs.weight", &[8], GgmlType::F32)
        .refused("'rope_freqs.weight' has shape [8], expected [4]");
    spec("llama")
        .tensor("rope_freqs.weight", &[4], GgmlType::F16)
        .refused("'rope_freqs.weight' has type F16, expected F32");
    // Only llama loads rope_freqs.
    spec("qwen3")
        .tensor("rope_freqs.weight", &[4], GgmlType::F32)
        .refused("tensor 'rope_freqs.weight' is not part of a qwen3 model");
}

#[test]
fn linear_and_none_scaling() {
    let c = spec("llama")
        .key("rope.scaling.type", Value::from("linear"))
        .key("rope.scaling.factor", Value::F32(4.0))
        .key("rope.freq_base", Value::F32(5e5))
        .desc();
    assert!(c
        .layers
        .iter()
        .all(|l| l.rope_freq_scale == 0.25 && l.rope_base == 5e5));
    assert!(c.rope.yarn.is_none());
    // No type means linear, as in llama.cpp; the old key name is read too.
    let c = spec("llama")
        .key("rope.scale_linear", Value::F32(2.0))
        .desc();
    assert!(c.layers.iter().all(|l| l.rope_freq_scale == 0.5));
    let c = spec("llama")
        .key("rope.scaling.type", Value::from("none"))
        .key("rope.scaling.factor", Value::F32(4.0))
        .desc();
    assert!(c.layers.iter().all(|l| l.rope_freq_scale == 1.0));
}

#[test]
fn yarn_scaling_takes_llama_cpp_defaults() {
    let c = spec("qwen3")
        .key("rope.scaling.type", Value::from("yarn"))
        .key("rope.scaling.factor", Value::F32(4.0))
        .key("rope.scaling.original_context_length", Value::U32(16))
        .desc();
    assert!(c.layers.iter().all(|l| l.rope_freq_scale == 0.25));
    let y = c.rope.yarn.expect("yarn");
    assert_eq!(y.ext_factor, 1.0);
    assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
    assert_eq!(y.n_ctx_orig, 16);
    // llama.cpp's magnitude correction cancels the YaRN mscale for factor > 1.
    assert!((y.attn_factor - 1.0).abs() < 1e-6, "{}", y.attn_factor);
    let y = spec("qwen3")
        .key("rope.scaling.type", Value::from("yarn"))
        .key("rope.scaling.factor", Value::F32(4.0))
        .key("rope.scaling.attn_factor", Value::F32(2.0))
        .desc()
        .rope
        .yarn
        .expect("yarn");
    assert!((y.attn_factor - 2.0).abs() < 1e-6, "{}", y.attn_factor);
    assert_eq!(y.n_ctx_orig, 64);
}

#[test]
fn qwen2_biases() {
    let c = spec("qwen2").desc();
    assert_eq!(c.rope.kind, RopeKind::Neox);
    for l in &c.layers {
        assert!(l.biases.q && l.biases.k && l.biases.v && !l.biases.o);
        assert!(!l.qk_norm);
    }
    let c = spec("qwen2").drop_tensor("blk.1.attn_k.bias").desc();
    assert!(c.layers[0].biases.k && !c.layers[1].biases.k);
    spec("qwen2")
        .tensor("blk.0.attn_v.bias", &[16], GgmlType::F16)
        .refused("'blk.0.attn_v.bias' has type F16, expected F32");
    spec("qwen2")
        .tensor("blk.0.attn_q.bias", &[16], GgmlType::F32)
        .refused("'blk.0.attn_q.bias' has shape [16], expected [32]");
    spec("qwen2")
        .tensor("blk.0.attn_output.bias", &[32], GgmlType::F32)
        .refused("tensor 'blk.0.attn_output.bias' is not part of a qwen2 model");
    spec("qwen2")
        .tensor("output.bias", &[12], GgmlType::F32)
        .refused("tensor 'output.bias' is not part of a qwen2 model");
}

#[test]
fn qwen3_head_size_independent_of_width() {
    let c = spec_dk("qwen3", Some(16)).desc();
    assert_ne!(c.head_dim_k, c.d / c.n_heads);
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (16, 16, 16));
    assert_eq!(c.attn_scale, 0.25);
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert!(c.layers.iter().all(|l| l.qk_norm));
    spec_dk("qwen3", Some(16))
        .key("rope.freq_base", Value::F32(1e6))
        .tensor("blk.1.attn_output.weight", &[32, 32], GgmlType::F32)
        .refused("'blk.1.attn_output.weight' has shape [32, 32], expected [64, 32]");
    spec("qwen3")
        .drop_tensor("blk.0.attn_q_norm.weight")
        .refused("'blk.0.attn_q_norm.weight' is missing");
}

#[test]
fn key_errors_are_named() {
    spec("llama")
        .drop_key("context_length")
        .refused("'llama.context_length' is missing");
    spec("qwen3")
        .key("attention.head_count_kv", Value::U32(3))
        .refused("'qwen3.attention.head_count_kv'");
    spec("llama")
        .key("rope.dimension_count", Value::U32(4))
        .refused("'llama.rope.dimension_count': is 4");
    spec("qwen2")
        .key("rope.dimension_count", Value::U32(6))
        .refused("'qwen2.rope.dimension_count': is 6");
    spec("llama")
        .key("attention.value_length", Value::U32(4))
        .refused("'llama.attention.value_length': is 4, key_length is 8");
    spec_dk("qwen2", Some(16))
        .refused("'qwen2.attention.key_length': is 16: qwen2 needs head_count 4 x key_length");
    spec("llama")
        .key("rope.scaling.factor", Value::F32(-2.0))
        .refused("'llama.rope.scaling.factor'");
}

#[test]
fn unsupported_features_are_refused_by_name() {
    let e = spec("llama")
        .key("expert_count", Value::U32(8))
        .refused("'llama.expert_count': is 8: mixture-of-experts llama");
    assert!(matches!(e, ConfigError::Invalid { .. }));
    spec("llama")
        .key("rope.scaling.type", Value::from("longrope"))
        .refused("'llama.rope.scaling.type': is 'longrope'");
    spec("qwen2")
        .key("rope.scaling.type", Value::from("su"))
        .refused("'qwen2.rope.scaling.type': is 'su'");
    spec("llama")
        .key("rope.scaling.attn_factor", Value::F32(1.5))
        .refused("'llama.rope.scaling.attn_factor': is 1.5");
    spec("qwen3")
        .key("attention.key_length_swa", Value::U32(16))
        .refused("'qwen3.attention.key_length_swa': is 16");
    spec("qwen3")
        .key("rope.dimension_count_swa", Value::U32(4))
        .refused("'qwen3.rope.dimension_count_swa': is 4");
    let e = spec("llama")
        .tensor("blk.0.ffn_up.bias", &[48], GgmlType::F32)
        .refused("tensor 'blk.0.ffn_up.bias' is not part of a llama model");
    assert!(matches!(e, ConfigError::UnexpectedTensor { .. }));
    spec("llama")
        .tensor("blk.1.attn_q_norm.weight", &[8], GgmlType::F32)
        .refused("tensor 'blk.1.attn_q_norm.weight' is not part of a llama model");
    spec("qwen3")
        .tensor("cls.output.weight", &[32, 2], GgmlType::F32)
        .refused("tensor 'cls.output.weight' is not part of a qwen3 model");
    spec("qwen3")
        .tensor("blk.2.attn_norm.weight", &[32], GgmlType::F32)
        .refused("tensor 'blk.2.attn_norm.weight' is not part of a qwen3 model");
    let mut s = spec("llama");
    s.keys[0].1 = Value::from("phi3");
    let e = s.refused("'phi3' is not supported (supported: flint, gemma3, llama, qwen2, qwen3, qwen3moe, glm4moe, mimo2, gpt-oss, gemma4, qwen35moe)");
    assert!(matches!(e, ConfigError::UnsupportedArchitecture { .. }));
}

#[test]
fn tensor_errors_are_named() {
    let e = spec("llama")
        .drop_tensor("blk.1.ffn_up.weight")
        .refused("'blk.1.ffn_up.weight' is missing");
    assert!(matches!(e, ConfigError::MissingTensor { .. }));
    spec("llama")
        .tensor("blk.0.attn_norm.weight", &[32], GgmlType::F16)
        .refused("'blk.0.attn_norm.weight' has type F16, expected F32");
    spec("qwen2")
        .tensor("output.weight", &[32, 13], GgmlType::F32)
        .refused("'output.weight' has shape [32, 13], expected [32, 12]");
}
