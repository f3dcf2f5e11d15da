//! The MoE families' descriptions (qwen3moe, glm4moe, mimo2, gpt-oss): keys as llama.cpp's
//! `load_hparams` reads them (defaults included), routing, per-layer KV heads, value
//! scale, NextN/MTP blocks skipped, tensor checks, and one test per refusal, each error
//! naming the key or tensor. Files are made with our writer.

use flint_core::math::Gating;
use flint_loader::config::{Arch, ConfigError, FfnDesc, ModelDesc, RopeKind};
use flint_loader::gguf::{Array, GgufFile, GgufWriter, Value};

/// d, query heads, vocabulary, experts, used, expert width, dense width.
const D: usize = 32;
const H: usize = 4;
const V: usize = 12;
const E: usize = 4;
const K: usize = 2;
const FE: usize = 16;
const FF: usize = 48;

struct Spec {
    arch: &'static str,
    keys: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<usize>)>,
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
    fn tensor(mut self, name: &str, dims: &[usize]) -> Self {
        self.tensors.retain(|(n, _)| n != name);
        self.tensors.push((name.to_string(), dims.to_vec()));
        self
    }
    fn drop_tensor(mut self, name: &str) -> Self {
        let before = self.tensors.len();
        self.tensors.retain(|(n, _)| n != name);
        assert!(self.tensors.len() < before, "no tensor {name} to drop");
        self
    }
    fn drop_prefix(mut self, prefix: &str) -> Self {
        self.tensors.retain(|(n, _)| !n.starts_with(prefix));
        self
    }
    fn file(&self) -> GgufFile {
        let mut w = GgufWriter::new();
        for (key, v) in &self.keys {
            w.add(key, v.clone()).expect("key");
        }
        for (name, dims) in &self.tensors {
            let n: usize = dims.iter().product();
            w.add_f32_tensor(name, dims, &vec![0.0; n]).expect("tensor");
        }
        GgufFile::from_bytes(w.to_bytes()).expect("parse")
    }
    fn desc(&self) -> ModelDesc {
        ModelDesc::from_gguf(&self.file()).expect("description")
    }
    fn refused(&self, needle: &str) -> ConfigError {
        let e = ModelDesc::from_gguf(&self.file()).expect_err("must be refused");
        assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
        e
    }
}

fn keys(arch: &str, kv: &[(&str, Value)]) -> Vec<(String, Value)> {
    let mut keys = vec![("general.architecture".to_string(), Value::from(arch))];
    for (k, v) in kv {
        keys.push((format!("{arch}.{k}"), v.clone()));
    }
    keys
}

/// Attention tensors of layer `i` with `hkv` KV heads.
fn attn(t: &mut Vec<(String, Vec<usize>)>, i: usize, hkv: usize, dk: usize, dv: usize) {
    let n = |s: &str| format!("blk.{i}.{s}");
    t.push((n("attn_norm.weight"), vec![D]));
    t.push((n("attn_q.weight"), vec![D, H * dk]));
    t.push((n("attn_k.weight"), vec![D, hkv * dk]));
    t.push((n("attn_v.weight"), vec![D, hkv * dv]));
    t.push((n("attn_output.weight"), vec![H * dv, D]));
}

fn experts(t: &mut Vec<(String, Vec<usize>)>, i: usize) {
    let n = |s: &str| format!("blk.{i}.{s}");
    t.push((n("ffn_gate_inp.weight"), vec![D, E]));
    t.push((n("ffn_gate_exps.weight"), vec![D, FE, E]));
    t.push((n("ffn_up_exps.weight"), vec![D, FE, E]));
    t.push((n("ffn_down_exps.weight"), vec![FE, D, E]));
}

fn dense(t: &mut Vec<(String, Vec<usize>)>, i: usize) {
    let n = |s: &str| format!("blk.{i}.{s}");
    t.push((n("ffn_gate.weight"), vec![D, FF]));
    t.push((n("ffn_up.weight"), vec![D, FF]));
    t.push((n("ffn_down.weight"), vec![FF, D]));
}

fn head(t: &mut Vec<(String, Vec<usize>)>, output: bool) {
    t.push(("token_embd.weight".into(), vec![D, V]));
    t.push(("output_norm.weight".into(), vec![D]));
    if output {
        t.push(("output.weight".into(), vec![D, V]));
    }
}

/// qwen3moe: 2 layers, Hkv 2, dk = d/H = 8, QK norms, tied output.
fn qwen3moe() -> Spec {
    let keys = keys(
        "qwen3moe",
        &[
            ("context_length", Value::U32(64)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(2)),
            ("feed_forward_length", Value::U32(FF as u32)),
            ("attention.head_count", Value::U32(H as u32)),
            ("attention.head_count_kv", Value::U32(2)),
            ("rope.freq_base", Value::F32(1e6)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_count", Value::U32(E as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
        ],
    );
    let mut t = Vec::new();
    head(&mut t, false);
    for i in 0..2 {
        attn(&mut t, i, 2, 8, 8);
        t.push((format!("blk.{i}.attn_q_norm.weight"), vec![8]));
        t.push((format!("blk.{i}.attn_k_norm.weight"), vec![8]));
        t.push((format!("blk.{i}.ffn_norm.weight"), vec![D]));
        experts(&mut t, i);
    }
    Spec {
        arch: "qwen3moe",
        keys,
        tensors: t,
    }
}

/// glm4moe: block_count 3 with one NextN block (trunk of 2), layer 0 dense, dk 16 with
/// n_rot 8, q/k/v biases, one shared expert, selection bias, a NextN block's tensors.
fn glm4moe() -> Spec {
    let keys = keys(
        "glm4moe",
        &[
            ("context_length", Value::U32(64)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(3)),
            ("feed_forward_length", Value::U32(FF as u32)),
            ("attention.head_count", Value::U32(H as u32)),
            ("attention.head_count_kv", Value::U32(2)),
            ("rope.freq_base", Value::F32(1e6)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("attention.key_length", Value::U32(16)),
            ("attention.value_length", Value::U32(16)),
            ("rope.dimension_count", Value::U32(8)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_count", Value::U32(E as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
            ("expert_shared_count", Value::U32(1)),
            ("leading_dense_block_count", Value::U32(1)),
            ("expert_gating_func", Value::U32(2)),
            ("expert_weights_scale", Value::F32(2.5)),
            ("expert_weights_norm", Value::Bool(true)),
            ("nextn_predict_layers", Value::U32(1)),
        ],
    );
    let mut t = Vec::new();
    head(&mut t, true);
    for i in 0..3 {
        let n = |s: &str| format!("blk.{i}.{s}");
        attn(&mut t, i, 2, 16, 16);
        t.push((n("attn_q.bias"), vec![H * 16]));
        t.push((n("attn_k.bias"), vec![2 * 16]));
        t.push((n("attn_v.bias"), vec![2 * 16]));
        t.push((n("post_attention_norm.weight"), vec![D]));
        if i == 0 {
            dense(&mut t, i);
        } else {
            experts(&mut t, i);
            t.push((n("exp_probs_b.bias"), vec![E]));
            t.push((n("ffn_gate_shexp.weight"), vec![D, FE]));
            t.push((n("ffn_up_shexp.weight"), vec![D, FE]));
            t.push((n("ffn_down_shexp.weight"), vec![FE, D]));
        }
        if i == 2 {
            t.push((n("nextn.eh_proj.weight"), vec![2 * D, D]));
            t.push((n("nextn.enorm.weight"), vec![D]));
            t.push((n("nextn.hnorm.weight"), vec![D]));
            t.push((n("nextn.shared_head_norm.weight"), vec![D]));
        }
    }
    Spec {
        arch: "glm4moe",
        keys,
        tensors: t,
    }
}

/// mimo2: block_count 4 with one NextN block (trunk of 3); pattern [full, swa, swa |
/// swa] as the converter writes it (i32), KV heads [4, 2, 2 | 2], dk 16, dv 8, n_rot 8,
/// window 4, bases 5e6 / 1e4, value scale 0.5, sinks on the sliding layers, layer 0
/// dense, selection bias, untied output.
fn mimo2() -> Spec {
    let keys = keys(
        "mimo2",
        &[
            ("context_length", Value::U32(64)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(4)),
            ("feed_forward_length", Value::U32(FF as u32)),
            ("attention.head_count", Value::U32(H as u32)),
            (
                "attention.head_count_kv",
                Value::Array(Array::U32(vec![4, 2, 2, 2])),
            ),
            ("rope.freq_base", Value::F32(5e6)),
            ("rope.freq_base_swa", Value::F32(1e4)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("attention.key_length", Value::U32(16)),
            ("attention.value_length", Value::U32(8)),
            ("attention.sliding_window", Value::U32(4)),
            (
                "attention.sliding_window_pattern",
                Value::Array(Array::I32(vec![0, 1, 1, 1])),
            ),
            ("rope.dimension_count", Value::U32(8)),
            ("attention.value_scale", Value::F32(0.5)),
            ("expert_count", Value::U32(E as u32)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
            ("nextn_predict_layers", Value::U32(1)),
        ],
    );
    let hkv = [4, 2, 2, 2];
    let mut t = Vec::new();
    head(&mut t, true);
    for i in 0..4 {
        let n = |s: &str| format!("blk.{i}.{s}");
        attn(&mut t, i, hkv[i], 16, 8);
        if i > 0 {
            t.push((n("attn_sinks.weight"), vec![H]));
        }
        t.push((n("ffn_norm.weight"), vec![D]));
        if i == 0 || i == 3 {
            dense(&mut t, i);
        } else {
            experts(&mut t, i);
            t.push((n("exp_probs_b.bias"), vec![E]));
        }
        if i == 3 {
            t.push((n("nextn.eh_proj.weight"), vec![2 * D, D]));
            t.push((n("nextn.enorm.weight"), vec![D]));
            t.push((n("nextn.hnorm.weight"), vec![D]));
            t.push((n("layer_output_norm.weight"), vec![D]));
        }
    }
    Spec {
        arch: "mimo2",
        keys,
        tensors: t,
    }
}

#[test]
fn qwen3moe_reads_and_checks() {
    let c = qwen3moe().desc();
    assert_eq!(c.arch, Arch::Qwen3Moe);
    assert_eq!(Arch::from_name("qwen3moe"), Some(Arch::Qwen3Moe));
    assert_eq!((c.d, c.n_heads, c.n_kv_heads), (D, H, 2));
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (8, 8, 8));
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert_eq!((c.vocab, c.tied_output), (V, true));
    assert_eq!(c.window, None);
    assert!(c.skipped_layers.is_empty());
    assert_eq!((c.value_scale, c.ffn_norm_tensor), (1.0, "ffn_norm"));
    let m = c.moe.expect("moe");
    assert_eq!((m.experts, m.used, m.expert_width), (E, K, FE));
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::Softmax, true, 1.0)
    );
    assert_eq!((m.shared_count, m.leading_dense), (0, 0));
    assert_eq!(c.layers.len(), 2);
    for l in &c.layers {
        assert!(l.qk_norm && !l.sinks && !l.sliding);
        assert_eq!((l.n_kv_heads, l.rope_base), (2, 1e6));
        assert_eq!(
            l.ffn,
            FfnDesc::Moe {
                selection_bias: false,
                shared_expert: false,
                parallel_dense: None,
            }
        );
    }
}

#[test]
fn qwen3moe_defaults_as_llama_cpp() {
    // No expert width: feed_forward_length / expert_used_count. The routing keys
    // qwen3moe does not read change nothing.
    let c = qwen3moe()
        .drop_key("expert_feed_forward_length")
        .key("feed_forward_length", Value::U32(32))
        .drop_key("rope.freq_base")
        .key("expert_weights_norm", Value::Bool(false))
        .key("expert_gating_func", Value::U32(2))
        .desc();
    let m = c.moe.expect("moe");
    assert_eq!(m.expert_width, 16);
    assert_eq!((m.gating, m.normalize), (Gating::Softmax, true));
    assert_eq!(c.layers[0].rope_base, 10_000.0);
    let c = qwen3moe().tensor("output.weight", &[D, V]).desc();
    assert!(!c.tied_output);
}

#[test]
fn qwen3moe_refusals() {
    qwen3moe()
        .drop_key("expert_count")
        .refused("qwen3moe.expert_count");
    qwen3moe()
        .key("expert_used_count", Value::U32(5))
        .refused("'qwen3moe.expert_used_count': is 5, more than expert_count 4");
    qwen3moe()
        .key("rope.dimension_count", Value::U32(4))
        .refused("'qwen3moe.rope.dimension_count': is 4");
    qwen3moe()
        .key("nextn_predict_layers", Value::U32(1))
        .refused("'qwen3moe.nextn_predict_layers': is 1");
    qwen3moe()
        .drop_tensor("blk.1.attn_k_norm.weight")
        .refused("tensor 'blk.1.attn_k_norm.weight' is missing");
    qwen3moe()
        .tensor("blk.0.ffn_gate_exps.weight", &[D, FE, E + 1])
        .refused("'blk.0.ffn_gate_exps.weight' has shape [32, 16, 5], expected [32, 16, 4]");
    qwen3moe()
        .tensor("blk.0.exp_probs_b.bias", &[E])
        .refused("tensor 'blk.0.exp_probs_b.bias' is not part of a qwen3moe model");
    qwen3moe()
        .tensor("blk.0.ffn_gate_shexp.weight", &[D, FE])
        .refused("tensor 'blk.0.ffn_gate_shexp.weight' is not part of a qwen3moe model");
    qwen3moe()
        .key("attention.value_length", Value::U32(4))
        .refused("'qwen3moe.attention.value_length': is 4, key_length is 8");
}

#[test]
fn glm4moe_reads_and_checks() {
    let c = glm4moe().desc();
    assert_eq!(c.arch, Arch::Glm4Moe);
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (16, 16, 8));
    assert_eq!(c.attn_scale, 0.25);
    assert_eq!((c.vocab, c.tied_output), (V, false));
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.skipped_layers, vec![2]);
    assert_eq!(c.ffn_norm_tensor, "post_attention_norm");
    let m = c.moe.expect("moe");
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::Sigmoid, true, 2.5)
    );
    assert_eq!(
        (m.shared_count, m.shared_width, m.leading_dense),
        (1, FE, 1)
    );
    assert_eq!(c.layers[0].ffn, FfnDesc::Dense { width: FF });
    assert_eq!(
        c.layers[1].ffn,
        FfnDesc::Moe {
            selection_bias: true,
            shared_expert: true,
            parallel_dense: None,
        }
    );
    for l in &c.layers {
        assert!(l.biases.q && l.biases.k && l.biases.v && !l.biases.o);
        assert!(!l.qk_norm && !l.sinks && !l.sliding);
        assert_eq!(l.n_kv_heads, 2);
    }
    // Optional QK norms, as a pair.
    let c = glm4moe()
        .tensor("blk.0.attn_q_norm.weight", &[16])
        .tensor("blk.0.attn_k_norm.weight", &[16])
        .desc();
    assert!(c.layers[0].qk_norm && !c.layers[1].qk_norm);
    glm4moe().tensor("blk.0.attn_q_norm.weight", &[16]).refused(
        "'blk.0.attn_k_norm.weight' is missing while 'blk.0.attn_q_norm.weight' is present",
    );
}

#[test]
fn glm4moe_defaults_as_llama_cpp() {
    // No gating key: sigmoid; no norm key: false (glm4moe's default); scale 0: none.
    let c = glm4moe()
        .drop_key("expert_gating_func")
        .drop_key("expert_weights_norm")
        .key("expert_weights_scale", Value::F32(0.0))
        .desc();
    let m = c.moe.expect("moe");
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::Sigmoid, false, 1.0)
    );
    // Two shared experts are one of twice the width.
    let mut s = glm4moe().key("expert_shared_count", Value::U32(2));
    for i in 1..3 {
        s = s
            .tensor(&format!("blk.{i}.ffn_gate_shexp.weight"), &[D, 2 * FE])
            .tensor(&format!("blk.{i}.ffn_up_shexp.weight"), &[D, 2 * FE])
            .tensor(&format!("blk.{i}.ffn_down_shexp.weight"), &[2 * FE, D]);
    }
    let m = s.desc().moe.expect("moe");
    assert_eq!((m.shared_count, m.shared_width), (1, 2 * FE));
    // A trunk-only file (no NextN tensors) is accepted as llama.cpp does.
    let c = glm4moe().drop_prefix("blk.2.").desc();
    assert_eq!((c.layers.len(), c.skipped_layers.clone()), (2, vec![2]));
    // Without nextn_predict_layers block 2 is a trunk layer: its NextN tensors are refused.
    glm4moe()
        .drop_key("nextn_predict_layers")
        .refused("tensor 'blk.2.nextn.eh_proj.weight' is not part of a glm4moe model");
}

#[test]
fn glm4moe_refusals() {
    glm4moe()
        .drop_key("expert_shared_count")
        .refused("glm4moe.expert_shared_count");
    glm4moe()
        .key("leading_dense_block_count", Value::U32(3))
        .refused("'glm4moe.leading_dense_block_count': is 3, more than the 2 trunk layers");
    glm4moe()
        .drop_key("feed_forward_length")
        .refused("glm4moe.feed_forward_length");
    glm4moe()
        .key("expert_gating_func", Value::U32(3))
        .refused("'glm4moe.expert_gating_func': is 3");
    glm4moe()
        .key("nextn_predict_layers", Value::U32(3))
        .refused("'glm4moe.nextn_predict_layers': is 3, block_count is 3");
    glm4moe()
        .key(
            "rope.dimension_sections",
            Value::Array(Array::I32(vec![8, 12, 12, 0])),
        )
        .refused("'glm4moe.rope.dimension_sections'");
    glm4moe()
        .drop_tensor("blk.1.exp_probs_b.bias")
        .refused("tensor 'blk.1.exp_probs_b.bias' is missing");
    glm4moe()
        .drop_tensor("blk.1.ffn_up_shexp.weight")
        .refused("tensor 'blk.1.ffn_up_shexp.weight' is missing");
    glm4moe()
        .drop_tensor("blk.0.post_attention_norm.weight")
        .refused("tensor 'blk.0.post_attention_norm.weight' is missing");
    glm4moe()
        .tensor("blk.0.ffn_norm.weight", &[D])
        .refused("tensor 'blk.0.ffn_norm.weight' is not part of a glm4moe model");
    glm4moe()
        .tensor("blk.1.attn_sinks.weight", &[H])
        .refused("tensor 'blk.1.attn_sinks.weight' is not part of a glm4moe model");
    // Only llama.cpp's names are accepted in a NextN block.
    glm4moe()
        .tensor("blk.2.nextn.bogus.weight", &[D])
        .refused("tensor 'blk.2.nextn.bogus.weight' is not part of a glm4moe model");
    glm4moe()
        .tensor("blk.1.attn_q.bias", &[H * 8])
        .refused("'blk.1.attn_q.bias' has shape [32], expected [64]");
}

#[test]
fn mimo2_reads_and_checks() {
    let c = mimo2().desc();
    assert_eq!(c.arch, Arch::Mimo2);
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (16, 8, 8));
    assert_eq!(c.attn_scale, 0.25);
    assert_eq!((c.n_kv_heads, c.window), (4, Some(4)));
    assert_eq!(c.value_scale, 0.5);
    assert_eq!(c.skipped_layers, vec![3]);
    assert_eq!(c.layers.len(), 3);
    assert!(!c.tied_output);
    let kv: Vec<usize> = c.layers.iter().map(|l| l.n_kv_heads).collect();
    assert_eq!(kv, vec![4, 2, 2]);
    let sl: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sl, vec![false, true, true]);
    let sinks: Vec<bool> = c.layers.iter().map(|l| l.sinks).collect();
    assert_eq!(sinks, vec![false, true, true]);
    let bases: Vec<f32> = c.layers.iter().map(|l| l.rope_base).collect();
    assert_eq!(bases, vec![5e6, 1e4, 1e4]);
    assert_eq!(c.layer_window(0), None);
    assert_eq!(c.layer_window(1), Some(4));
    let m = c.moe.expect("moe");
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::Sigmoid, true, 1.0)
    );
    assert_eq!((m.shared_count, m.leading_dense), (0, 1));
    assert_eq!(c.layers[0].ffn, FfnDesc::Dense { width: FF });
    assert_eq!(
        c.layers[1].ffn,
        FfnDesc::Moe {
            selection_bias: true,
            shared_expert: false,
            parallel_dense: None,
        }
    );
}

#[test]
fn mimo2_defaults_as_llama_cpp() {
    // A scalar KV head count and a bool pattern; no swa base: 10000; value scale 1 or
    // absent: none.
    let mut s = mimo2()
        .key("attention.head_count_kv", Value::U32(2))
        .key(
            "attention.sliding_window_pattern",
            Value::Array(Array::Bool(vec![false, true, true, true])),
        )
        .drop_key("rope.freq_base_swa")
        .key("attention.value_scale", Value::F32(1.0));
    s = s
        .tensor("blk.0.attn_k.weight", &[D, 2 * 16])
        .tensor("blk.0.attn_v.weight", &[D, 2 * 8]);
    let c = s.desc();
    assert!(c.layers.iter().all(|l| l.n_kv_heads == 2));
    assert_eq!(c.layers[1].rope_base, 10_000.0);
    assert_eq!(c.value_scale, 1.0);
    let c = mimo2().drop_key("attention.value_scale").desc();
    assert_eq!(c.value_scale, 1.0);
    // No sinks on a layer: none there.
    let c = mimo2().drop_tensor("blk.2.attn_sinks.weight").desc();
    assert!(c.layers[1].sinks && !c.layers[2].sinks);
}

#[test]
fn mimo2_refusals() {
    mimo2()
        .drop_key("attention.sliding_window")
        .refused("mimo2.attention.sliding_window");
    mimo2()
        .drop_key("attention.sliding_window_pattern")
        .refused("mimo2.attention.sliding_window_pattern");
    mimo2()
        .key(
            "attention.sliding_window_pattern",
            Value::Array(Array::I32(vec![0, 1, 1])),
        )
        .refused("'mimo2.attention.sliding_window_pattern': has 3 entries, block_count is 4");
    mimo2()
        .key(
            "attention.head_count_kv",
            Value::Array(Array::U32(vec![4, 2, 2])),
        )
        .refused("'mimo2.attention.head_count_kv': has 3 entries");
    mimo2()
        .key(
            "attention.head_count_kv",
            Value::Array(Array::U32(vec![3, 2, 2, 2])),
        )
        .refused("head_count 4 is not a multiple of head_count_kv 3");
    mimo2()
        .key("attention.value_length_swa", Value::U32(16))
        .refused("'mimo2.attention.value_length_swa': is 16");
    mimo2()
        .drop_tensor("output.weight")
        .refused("tensor 'output.weight' is missing");
    // The layer's own KV head count sets its K/V shapes.
    mimo2()
        .tensor("blk.1.attn_k.weight", &[D, 4 * 16])
        .refused("'blk.1.attn_k.weight' has shape [32, 64], expected [32, 32]");
    mimo2()
        .tensor("blk.1.attn_sinks.weight", &[H + 1])
        .refused("'blk.1.attn_sinks.weight' has shape [5], expected [4]");
    // A dense layer needs feed_forward_length.
    mimo2()
        .drop_key("feed_forward_length")
        .refused("'mimo2.feed_forward_length': missing, but layer 0 has no ffn_gate_inp");
    mimo2()
        .tensor("blk.1.attn_q_norm.weight", &[16])
        .refused("tensor 'blk.1.attn_q_norm.weight' is not part of a mimo2 model");
    mimo2()
        .tensor("blk.3.post_attention_norm.weight", &[D])
        .refused("tensor 'blk.3.post_attention_norm.weight' is not part of a mimo2 model");
}

#[test]
fn unsupported_arch_lists_the_moe_families() {
    let s = Spec {
        arch: "deepseek2",
        keys: keys("deepseek2", &[]),
        tensors: vec![],
    };
    let e = s.refused("general.architecture 'deepseek2' is not supported");
    assert!(e.to_string().contains("qwen3moe, glm4moe, mimo2"), "{e}");
}

/// gpt-oss: 4 layers (llama.cpp's default pattern: even layers slide), window 8, dk 8 =
/// n_rot, YaRN factor 32 over 16 positions, sinks, q/k/v/o biases, router and expert
/// biases, untied output, as the converter writes it (no pattern key).
fn gpt_oss() -> Spec {
    let keys = keys(
        "gpt-oss",
        &[
            ("context_length", Value::U32(512)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(4)),
            ("feed_forward_length", Value::U32(FF as u32)),
            ("attention.head_count", Value::U32(H as u32)),
            ("attention.head_count_kv", Value::U32(2)),
            ("rope.freq_base", Value::F32(150_000.0)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("attention.key_length", Value::U32(8)),
            ("attention.value_length", Value::U32(8)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_count", Value::U32(E as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
            ("attention.sliding_window", Value::U32(8)),
            ("rope.scaling.type", Value::from("yarn")),
            ("rope.scaling.factor", Value::F32(32.0)),
            ("rope.scaling.original_context_length", Value::U32(16)),
        ],
    );
    let mut t = Vec::new();
    head(&mut t, true);
    for i in 0..4 {
        let n = |s: &str| format!("blk.{i}.{s}");
        attn(&mut t, i, 2, 8, 8);
        t.push((n("attn_q.bias"), vec![H * 8]));
        t.push((n("attn_k.bias"), vec![2 * 8]));
        t.push((n("attn_v.bias"), vec![2 * 8]));
        t.push((n("attn_output.bias"), vec![D]));
        t.push((n("attn_sinks.weight"), vec![H]));
        t.push((n("post_attention_norm.weight"), vec![D]));
        experts(&mut t, i);
        t.push((n("ffn_gate_inp.bias"), vec![E]));
        t.push((n("ffn_gate_exps.bias"), vec![FE, E]));
        t.push((n("ffn_up_exps.bias"), vec![FE, E]));
        t.push((n("ffn_down_exps.bias"), vec![D, E]));
    }
    Spec {
        arch: "gpt-oss",
        keys,
        tensors: t,
    }
}

#[test]
fn gpt_oss_reads_and_checks() {
    use flint_loader::config::Activation;
    let c = gpt_oss().desc();
    assert_eq!(c.arch, Arch::GptOss);
    assert_eq!(Arch::from_name("gpt-oss"), Some(Arch::GptOss));
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (8, 8, 8));
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert_eq!(c.attn_scale, 1.0 / 8f32.sqrt());
    assert_eq!((c.vocab, c.tied_output), (V, false));
    assert_eq!(c.window, Some(8));
    assert_eq!(c.activation, Activation::SwigluOai);
    assert_eq!(c.ffn_norm_tensor, "post_attention_norm");
    let y = c.rope.yarn.expect("yarn");
    assert_eq!((y.ext_factor, y.n_ctx_orig), (1.0, 16));
    let m = c.moe.expect("moe");
    assert_eq!((m.experts, m.used, m.expert_width), (E, K, FE));
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::SoftmaxWeight, false, 1.0)
    );
    assert!(m.router_bias && m.expert_biases);
    let sliding: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sliding, [true, false, true, false]);
    for l in &c.layers {
        // YaRN on every layer, sliding ones included.
        assert_eq!((l.rope_base, l.rope_freq_scale), (150_000.0, 1.0 / 32.0));
        assert!(l.sinks && l.biases.q && l.biases.k && l.biases.v && l.biases.o);
        assert!(!l.qk_norm);
    }
    // A pattern key overrides the default period.
    let c = gpt_oss()
        .key("attention.sliding_window_pattern", Value::U32(4))
        .desc();
    let sliding: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sliding, [true, true, true, false]);
}

#[test]
fn gpt_oss_refusals_name_the_culprit() {
    gpt_oss()
        .drop_tensor("blk.1.ffn_up_exps.bias")
        .refused("blk.1.ffn_up_exps.bias");
    gpt_oss()
        .drop_tensor("blk.2.attn_sinks.weight")
        .refused("blk.2.attn_sinks.weight");
    gpt_oss()
        .drop_tensor("blk.0.ffn_gate_inp.bias")
        .refused("blk.0.ffn_gate_inp.bias");
    gpt_oss()
        .drop_tensor("output.weight")
        .refused("output.weight");
    gpt_oss()
        .key("rope.dimension_count", Value::U32(4))
        .refused("'gpt-oss.rope.dimension_count': is 4");
    gpt_oss()
        .key(
            "expert_feed_forward_length",
            Value::Array(Array::U32(vec![16, 16, 32, 16])),
        )
        .refused("'gpt-oss.expert_feed_forward_length': differs between layers");
    gpt_oss()
        .key("nextn_predict_layers", Value::U32(1))
        .refused("gpt-oss has no NextN/MTP layers");
    gpt_oss()
        .tensor("blk.0.exp_probs_b.bias", &[E])
        .refused("tensor 'blk.0.exp_probs_b.bias' is not part of a gpt-oss model");
}

/// gemma4: 6 layers [S, S, F, S, S, F], the last 3 sharing the KV of layers 1 and 2,
/// sliding heads of 8 with 2 KV heads, full heads of 16 with 1 KV head, per-layer
/// inputs of 4, MoE on every layer (a dense MLP beside), the full layer without
/// `attn_v`, tied output.
fn gemma4() -> Spec {
    const P: usize = 4;
    let pattern = vec![true, true, false, true, true, false];
    let keys = keys(
        "gemma4",
        &[
            ("context_length", Value::U32(512)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(6)),
            ("feed_forward_length", Value::U32(FF as u32)),
            ("attention.head_count", Value::U32(H as u32)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("attention.key_length", Value::U32(16)),
            ("attention.value_length", Value::U32(16)),
            ("attention.key_length_swa", Value::U32(8)),
            ("attention.value_length_swa", Value::U32(8)),
            ("rope.dimension_count", Value::U32(16)),
            ("rope.dimension_count_swa", Value::U32(8)),
            ("rope.freq_base", Value::F32(1e6)),
            ("rope.freq_base_swa", Value::F32(1e4)),
            ("final_logit_softcapping", Value::F32(30.0)),
            ("attention.sliding_window", Value::U32(8)),
            ("attention.shared_kv_layers", Value::U32(3)),
            ("embedding_length_per_layer_input", Value::U32(P as u32)),
            (
                "attention.sliding_window_pattern",
                Value::Array(Array::Bool(pattern.clone())),
            ),
            (
                "attention.head_count_kv",
                Value::Array(Array::I32(vec![2, 2, 1, 2, 2, 1])),
            ),
            ("expert_count", Value::U32(E as u32)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
        ],
    );
    let mut t = Vec::new();
    head(&mut t, false);
    t.push(("rope_freqs.weight".into(), vec![8]));
    t.push(("per_layer_token_embd.weight".into(), vec![P * 6, V]));
    t.push(("per_layer_model_proj.weight".into(), vec![D, P * 6]));
    t.push(("per_layer_proj_norm.weight".into(), vec![P]));
    for (i, &sl) in pattern.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (hd, hkv) = if sl { (8, 2) } else { (16, 1) };
        attn(&mut t, i, hkv, hd, hd);
        if !sl {
            t.retain(|(name, _)| *name != n("attn_v.weight"));
        }
        t.push((n("attn_q_norm.weight"), vec![hd]));
        t.push((n("attn_k_norm.weight"), vec![hd]));
        for s in ["post_attention_norm", "ffn_norm", "post_ffw_norm"] {
            t.push((n(&format!("{s}.weight")), vec![D]));
        }
        dense(&mut t, i);
        experts(&mut t, i);
        t.push((n("ffn_gate_inp.scale"), vec![D]));
        t.push((n("ffn_down_exps.scale"), vec![E]));
        for s in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
            t.push((n(&format!("{s}.weight")), vec![D]));
        }
        t.push((n("inp_gate.weight"), vec![D, P]));
        t.push((n("proj.weight"), vec![P, D]));
        t.push((n("post_norm.weight"), vec![D]));
        t.push((n("layer_output_scale.weight"), vec![1]));
    }
    Spec {
        arch: "gemma4",
        keys,
        tensors: t,
    }
}

#[test]
fn gemma4_reads_and_checks() {
    let c = gemma4().desc();
    assert_eq!(c.arch, Arch::Gemma4);
    assert_eq!((c.head_dim_k, c.max_head_dims()), (16, (16, 16)));
    let dims: Vec<_> = c
        .layers
        .iter()
        .map(|l| (l.head_dim_k, l.n_rot, l.n_kv_heads, l.rope_freq_factors))
        .collect();
    assert_eq!(
        dims,
        [
            (8, 8, 2, false),
            (8, 8, 2, false),
            (16, 16, 1, true),
            (8, 8, 2, false),
            (8, 8, 2, false),
            (16, 16, 1, true)
        ]
    );
    let sources: Vec<_> = c.layers.iter().map(|l| l.kv_source).collect();
    assert_eq!(sources, [None, None, None, Some(1), Some(1), Some(2)]);
    assert_eq!((c.kv_layer(4), c.kv_layer(5), c.kv_layer(0)), (1, 2, 0));
    assert_eq!(c.attn_scale, 1.0);
    assert!(c.v_norm && !c.q_prescaled && c.tied_output);
    assert_eq!(c.per_layer_input, 4);
    assert_eq!(c.logit_softcap, Some(30.0));
    assert_eq!(c.layers[4].rope_base, 1e4);
    assert_eq!(c.layers[5].rope_base, 1e6);
    let m = c.moe.expect("moe");
    assert!(m.router_input_scale && m.expert_out_scale && m.normalize);
    assert_eq!(m.gating, Gating::Softmax);
    assert!(c.layers.iter().all(|l| l.out_scale
        && matches!(
            l.ffn,
            FfnDesc::Moe {
                parallel_dense: Some(FF),
                ..
            }
        )));
    // A layer without a router is a dense Gemma 4 layer; without any, no MoE at all.
    let mut s = gemma4();
    for i in 0..6 {
        for suffix in [
            "ffn_gate_inp.weight",
            "ffn_gate_inp.scale",
            "ffn_down_exps.scale",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_exps.weight",
            "pre_ffw_norm_2.weight",
            "post_ffw_norm_1.weight",
            "post_ffw_norm_2.weight",
        ] {
            s = s.drop_tensor(&format!("blk.{i}.{suffix}"));
        }
    }
    let c = s.desc();
    assert!(c.moe.is_none());
    assert!(c
        .layers
        .iter()
        .all(|l| l.ffn == FfnDesc::Dense { width: FF }));
}

#[test]
fn gemma4_refusals_name_the_culprit() {
    gemma4()
        .key("attention.shared_kv_layers", Value::U32(4))
        .refused("'gemma4.attention.shared_kv_layers': is 4 of 6 layers");
    gemma4()
        .key("attention.value_length_swa", Value::U32(16))
        .refused("gemma4.attention.value_length_swa");
    gemma4()
        .key("rope.dimension_count_swa", Value::U32(10))
        .refused("'gemma4.rope.dimension_count_swa': is 10");
    gemma4()
        .drop_key("attention.sliding_window_pattern")
        .refused("gemma4.attention.sliding_window_pattern");
    gemma4()
        .drop_key("embedding_length_per_layer_input")
        .refused("gemma4.embedding_length_per_layer_input");
    gemma4()
        .drop_tensor("blk.0.ffn_gate_inp.scale")
        .refused("blk.0.ffn_gate_inp.scale");
    gemma4()
        .drop_tensor("blk.2.attn_k.weight")
        .refused("blk.2.attn_k.weight");
    gemma4()
        .drop_tensor("blk.3.ffn_down_exps.scale")
        .refused("present on some MoE layers and absent on others");
    gemma4()
        .drop_tensor("blk.1.proj.weight")
        .refused("blk.1.proj.weight");
    gemma4()
        .tensor("blk.0.ffn_gate_up_exps.weight", &[D, 2 * FE, E])
        .refused("tensor 'blk.0.ffn_gate_up_exps.weight' is not part of a gemma4 model");
    // Shared-KV layers need no K projection or K norm.
    let c = gemma4()
        .drop_tensor("blk.4.attn_k.weight")
        .drop_tensor("blk.4.attn_k_norm.weight")
        .desc();
    assert_eq!(c.layers[4].kv_source, Some(1));
}

/// qwen35moe: block_count 5 with one MTP block (trunk of 4: DeltaNet x3, attention, by
/// the default `full_attention_interval`), attention dk 8 with n_rot 4 and sections
/// [1, 1, 0, 0], Hkv 2; DeltaNet 2 key heads, 4 value heads of 4, kernel 4; a gated
/// shared expert of 24; untied output.
fn qwen35moe() -> Spec {
    let keys = keys(
        "qwen35moe",
        &[
            ("context_length", Value::U32(64)),
            ("embedding_length", Value::U32(D as u32)),
            ("block_count", Value::U32(5)),
            ("nextn_predict_layers", Value::U32(1)),
            ("attention.head_count", Value::U32(H as u32)),
            ("attention.head_count_kv", Value::U32(2)),
            ("attention.key_length", Value::U32(8)),
            ("attention.value_length", Value::U32(8)),
            ("rope.freq_base", Value::F32(1e7)),
            ("rope.dimension_count", Value::U32(4)),
            (
                "rope.dimension_sections",
                Value::Array(Array::I32(vec![1, 1, 0, 0])),
            ),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("expert_count", Value::U32(E as u32)),
            ("expert_used_count", Value::U32(K as u32)),
            ("expert_feed_forward_length", Value::U32(FE as u32)),
            ("expert_shared_feed_forward_length", Value::U32(24)),
            ("ssm.conv_kernel", Value::U32(4)),
            ("ssm.state_size", Value::U32(4)),
            ("ssm.group_count", Value::U32(2)),
            ("ssm.time_step_rank", Value::U32(4)),
            ("ssm.inner_size", Value::U32(16)),
        ],
    );
    let (conv_dim, v_len) = (2 * 2 * 4 + 16, 16);
    let mut t = Vec::new();
    head(&mut t, true);
    for i in 0..5 {
        let n = |s: &str| format!("blk.{i}.{s}");
        t.push((n("attn_norm.weight"), vec![D]));
        t.push((n("post_attention_norm.weight"), vec![D]));
        if i < 3 {
            t.push((n("attn_qkv.weight"), vec![D, conv_dim]));
            t.push((n("attn_gate.weight"), vec![D, v_len]));
            t.push((n("ssm_conv1d.weight"), vec![4, conv_dim]));
            t.push((n("ssm_dt.bias"), vec![4]));
            t.push((n("ssm_a"), vec![4]));
            t.push((n("ssm_beta.weight"), vec![D, 4]));
            t.push((n("ssm_alpha.weight"), vec![D, 4]));
            t.push((n("ssm_norm.weight"), vec![4]));
            t.push((n("ssm_out.weight"), vec![v_len, D]));
        } else {
            t.push((n("attn_q.weight"), vec![D, 2 * H * 8]));
            t.push((n("attn_k.weight"), vec![D, 2 * 8]));
            t.push((n("attn_v.weight"), vec![D, 2 * 8]));
            t.push((n("attn_output.weight"), vec![H * 8, D]));
            t.push((n("attn_q_norm.weight"), vec![8]));
            t.push((n("attn_k_norm.weight"), vec![8]));
        }
        experts(&mut t, i);
        t.push((n("ffn_gate_inp_shexp.weight"), vec![D]));
        t.push((n("ffn_gate_shexp.weight"), vec![D, 24]));
        t.push((n("ffn_up_shexp.weight"), vec![D, 24]));
        t.push((n("ffn_down_shexp.weight"), vec![24, D]));
        if i == 4 {
            t.push((n("nextn.eh_proj.weight"), vec![2 * D, D]));
            t.push((n("nextn.enorm.weight"), vec![D]));
            t.push((n("nextn.hnorm.weight"), vec![D]));
            t.push((n("nextn.shared_head_norm.weight"), vec![D]));
        }
    }
    Spec {
        arch: "qwen35moe",
        keys,
        tensors: t,
    }
}

#[test]
fn qwen35moe_reads_and_checks() {
    use flint_loader::config::{DeltaNetShape, Mixer};
    let c = qwen35moe().desc();
    assert_eq!(c.arch, Arch::Qwen35Moe);
    assert_eq!(Arch::from_name("qwen35moe"), Some(Arch::Qwen35Moe));
    assert_eq!((c.d, c.n_heads, c.n_kv_heads), (D, H, 2));
    assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (8, 8, 4));
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert_eq!((c.vocab, c.tied_output), (V, false));
    assert_eq!(c.skipped_layers, vec![4]);
    assert_eq!(c.ffn_norm_tensor, "post_attention_norm");
    let dn = c.delta_net.expect("delta net sizes");
    assert_eq!(
        dn.shape,
        DeltaNetShape {
            heads_k: 2,
            heads_v: 4,
            head_dim: 4
        }
    );
    assert_eq!((dn.conv_kernel, dn.conv_dim()), (4, 32));
    let m = c.moe.expect("moe");
    assert_eq!((m.experts, m.used, m.expert_width), (E, K, FE));
    assert_eq!(
        (m.gating, m.normalize, m.scale),
        (Gating::Softmax, true, 1.0)
    );
    assert_eq!(
        (m.shared_count, m.shared_width, m.shared_gate),
        (1, 24, true)
    );
    let mixers: Vec<Mixer> = c.layers.iter().map(|l| l.mixer).collect();
    assert_eq!(
        mixers,
        [
            Mixer::DeltaNet,
            Mixer::DeltaNet,
            Mixer::DeltaNet,
            Mixer::Attention
        ]
    );
    let l3 = &c.layers[3];
    assert!(l3.attn_gate && l3.qk_norm && !l3.sliding);
    assert_eq!(l3.rope_base, 1e7);
    for l in &c.layers {
        assert_eq!(
            l.ffn,
            FfnDesc::Moe {
                selection_bias: false,
                shared_expert: true,
                parallel_dense: None,
            }
        );
    }
    // `attention.recurrent_layers` overrides the interval: layer 0 attention here.
    let mut s = qwen35moe().key(
        "attention.recurrent_layers",
        Value::Array(Array::Bool(vec![false, true, true, true, false])),
    );
    for i in [0, 3] {
        let n = |x: &str| format!("blk.{i}.{x}");
        s = s.drop_prefix(&format!("blk.{i}."));
        s = s
            .tensor(&n("attn_norm.weight"), &[D])
            .tensor(&n("post_attention_norm.weight"), &[D]);
        if i == 0 {
            s = s
                .tensor(&n("attn_q.weight"), &[D, 2 * H * 8])
                .tensor(&n("attn_k.weight"), &[D, 16])
                .tensor(&n("attn_v.weight"), &[D, 16])
                .tensor(&n("attn_output.weight"), &[H * 8, D])
                .tensor(&n("attn_q_norm.weight"), &[8])
                .tensor(&n("attn_k_norm.weight"), &[8]);
        } else {
            s = s
                .tensor(&n("attn_qkv.weight"), &[D, 32])
                .tensor(&n("attn_gate.weight"), &[D, 16])
                .tensor(&n("ssm_conv1d.weight"), &[4, 32])
                .tensor(&n("ssm_dt.bias"), &[4])
                .tensor(&n("ssm_a"), &[4])
                .tensor(&n("ssm_beta.weight"), &[D, 4])
                .tensor(&n("ssm_alpha.weight"), &[D, 4])
                .tensor(&n("ssm_norm.weight"), &[4])
                .tensor(&n("ssm_out.weight"), &[16, D]);
        }
        s = s
            .tensor(&n("ffn_gate_inp.weight"), &[D, E])
            .tensor(&n("ffn_gate_exps.weight"), &[D, FE, E])
            .tensor(&n("ffn_up_exps.weight"), &[D, FE, E])
            .tensor(&n("ffn_down_exps.weight"), &[FE, D, E])
            .tensor(&n("ffn_gate_inp_shexp.weight"), &[D])
            .tensor(&n("ffn_gate_shexp.weight"), &[D, 24])
            .tensor(&n("ffn_up_shexp.weight"), &[D, 24])
            .tensor(&n("ffn_down_shexp.weight"), &[24, D]);
    }
    let c = s.desc();
    let mixers: Vec<Mixer> = c.layers.iter().map(|l| l.mixer).collect();
    assert_eq!(
        mixers,
        [
            Mixer::Attention,
            Mixer::DeltaNet,
            Mixer::DeltaNet,
            Mixer::DeltaNet
        ]
    );
}

#[test]
fn qwen35moe_refusals_name_the_culprit() {
    qwen35moe()
        .key("ssm.inner_size", Value::U32(20))
        .refused("'qwen35moe.ssm.inner_size': is 20, but time_step_rank 4 x state_size 4 = 16");
    qwen35moe()
        .key("ssm.group_count", Value::U32(3))
        .refused("'qwen35moe.ssm.time_step_rank': is 4: it must be a multiple of group_count 3");
    qwen35moe()
        .drop_key("ssm.conv_kernel")
        .refused("qwen35moe.ssm.conv_kernel");
    qwen35moe()
        .drop_key("rope.dimension_sections")
        .refused("qwen35moe.rope.dimension_sections");
    // Pair 1 (sector 1) needs sections[1] > 0 to take a position of the first three.
    qwen35moe()
        .key(
            "rope.dimension_sections",
            Value::Array(Array::I32(vec![2, 0, 0, 0])),
        )
        .refused("rotated pair 1 of 2 takes the fourth section's position");
    qwen35moe()
        .key("full_attention_interval", Value::U32(0))
        .refused("qwen35moe.full_attention_interval");
    qwen35moe()
        .tensor("blk.0.attn_qkv.weight", &[D, 30])
        .refused("tensor 'blk.0.attn_qkv.weight' has shape [32, 30], expected [32, 32]");
    qwen35moe()
        .tensor("blk.3.attn_q.weight", &[D, H * 8])
        .refused("tensor 'blk.3.attn_q.weight' has shape [32, 32], expected [32, 64]");
    qwen35moe()
        .drop_tensor("blk.1.ssm_a")
        .refused("tensor 'blk.1.ssm_a' is missing");
    qwen35moe()
        .drop_tensor("blk.2.ffn_gate_inp_shexp.weight")
        .refused("tensor 'blk.2.ffn_gate_inp_shexp.weight' is missing");
    qwen35moe()
        .tensor("blk.0.ssm_conv1d.weight", &[3, 32])
        .refused("tensor 'blk.0.ssm_conv1d.weight' has shape [3, 32], expected [4, 32]");
    // A DeltaNet layer with attention tensors: refused by name.
    qwen35moe()
        .tensor("blk.1.attn_q.weight", &[D, 2 * H * 8])
        .refused("tensor 'blk.1.attn_q.weight' is not part of a qwen35moe model");
}
