//! The flint description (`ModelDesc`): every key, defaults, and one test per validation error (each error must
//! name the key or tensor at fault). Files are made with our writer.

use flint_core::math::Gating;
use flint_core::GgmlType;
use flint_loader::config::{
    Activation, Arch, ConfigError, FfnDesc, ModelDesc, NormPlacement, RopeKind,
};
use flint_loader::gguf::{GgufFile, GgufWriter, Value};

/// A tiny Flint model: d=64, L=3 (layer 0 dense, 1..2 MoE), H=4, Hkv=2, dk=16, dv=8,
/// E=4, k=2, Fe=32, shared expert Fs=24, V=40.
fn keys() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("flint")),
        ("flint.context_length", Value::U32(256)),
        ("flint.embedding_length", Value::U32(64)),
        ("flint.block_count", Value::U32(3)),
        ("flint.feed_forward_length", Value::U32(96)),
        ("flint.attention.head_count", Value::U32(4)),
        ("flint.attention.head_count_kv", Value::U32(2)),
        ("flint.attention.key_length", Value::U32(16)),
        ("flint.attention.value_length", Value::U32(8)),
        ("flint.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("flint.attention.sliding_window", Value::U32(32)),
        (
            "flint.attention.sliding_window_pattern",
            Value::from(vec![true, false, true]),
        ),
        ("flint.rope.freq_base", Value::F32(1e6)),
        ("flint.rope.freq_base_swa", Value::F32(1e4)),
        ("flint.rope.dimension_count", Value::U32(8)),
        ("flint.leading_dense_block_count", Value::U32(1)),
        ("flint.expert_count", Value::U32(4)),
        ("flint.expert_used_count", Value::U32(2)),
        ("flint.expert_feed_forward_length", Value::U32(32)),
        ("flint.expert_shared_count", Value::U32(1)),
        ("flint.expert_shared_feed_forward_length", Value::U32(24)),
        ("flint.expert_gating_func", Value::U32(2)),
        ("flint.expert_weights_norm", Value::Bool(true)),
        ("flint.expert_weights_scale", Value::F32(2.5)),
    ]
}

fn tensors() -> Vec<(String, Vec<usize>)> {
    let (d, v, h, hkv, dk, dv, f, e, fe, fs) = (64, 40, 4, 2, 16, 8, 96, 4, 32, 24);
    let mut t = vec![
        ("token_embd.weight".to_string(), vec![d, v]),
        ("output_norm.weight".to_string(), vec![d]),
    ];
    for i in 0..3 {
        let n = |s: &str| format!("blk.{i}.{s}");
        t.push((n("attn_norm.weight"), vec![d]));
        t.push((n("attn_q.weight"), vec![d, h * dk]));
        t.push((n("attn_k.weight"), vec![d, hkv * dk]));
        t.push((n("attn_v.weight"), vec![d, hkv * dv]));
        t.push((n("attn_q_norm.weight"), vec![dk]));
        t.push((n("attn_k_norm.weight"), vec![dk]));
        t.push((n("attn_sinks.weight"), vec![h]));
        t.push((n("attn_output.weight"), vec![h * dv, d]));
        t.push((n("ffn_norm.weight"), vec![d]));
        if i == 0 {
            t.push((n("ffn_gate.weight"), vec![d, f]));
            t.push((n("ffn_up.weight"), vec![d, f]));
            t.push((n("ffn_down.weight"), vec![f, d]));
        } else {
            t.push((n("ffn_gate_inp.weight"), vec![d, e]));
            t.push((n("exp_probs_b.bias"), vec![e]));
            t.push((n("ffn_gate_exps.weight"), vec![d, fe, e]));
            t.push((n("ffn_up_exps.weight"), vec![d, fe, e]));
            t.push((n("ffn_down_exps.weight"), vec![fe, d, e]));
            t.push((n("ffn_gate_shexp.weight"), vec![d, fs]));
            t.push((n("ffn_up_shexp.weight"), vec![d, fs]));
            t.push((n("ffn_down_shexp.weight"), vec![fs, d]));
        }
    }
    t
}

/// Builds the file after letting `edit` change keys and tensors.
fn build(
    edit_keys: impl FnOnce(&mut Vec<(&'static str, Value)>),
    edit_tensors: impl FnOnce(&mut Vec<(String, Vec<usize>)>),
) -> GgufFile {
    let mut k = keys();
    edit_keys(&mut k);
    let mut t = tensors();
    edit_tensors(&mut t);
    let mut w = GgufWriter::new();
    for (key, v) in k {
        w.add(key, v).expect("key");
    }
    for (name, dims) in t {
        let n: usize = dims.iter().product();
        w.add_f32_tensor(&name, &dims, &vec![0.0; n])
            .expect("tensor");
    }
    GgufFile::from_bytes(w.to_bytes()).expect("parse")
}

fn without(key: &'static str) -> impl FnOnce(&mut Vec<(&'static str, Value)>) {
    move |k| k.retain(|(n, _)| *n != key)
}

fn with(key: &'static str, v: Value) -> impl FnOnce(&mut Vec<(&'static str, Value)>) {
    move |k| {
        for (n, val) in k.iter_mut() {
            if *n == key {
                *val = v.clone();
                return;
            }
        }
        k.push((key, v));
    }
}

fn same_tensors(_: &mut Vec<(String, Vec<usize>)>) {}

/// The description's error, asserting it mentions `needle`.
fn config_err(f: &GgufFile, needle: &str) -> ConfigError {
    let e = ModelDesc::from_gguf(f).expect_err("must be refused");
    assert!(
        e.to_string().contains(needle),
        "{e:?} / {e} lacks {needle:?}"
    );
    e
}

fn tensor_err(f: &GgufFile, needle: &str) -> ConfigError {
    config_err(f, needle)
}

#[test]
fn full_config_reads_every_key() {
    let f = build(|_| {}, same_tensors);
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert_eq!(c.arch, Arch::Flint);
    assert_eq!(c.context_length, 256);
    assert_eq!(c.d, 64);
    assert_eq!(c.n_layers(), 3);
    assert_eq!(c.layers[0].ffn, FfnDesc::Dense { width: 96 });
    assert_eq!((c.n_heads, c.n_kv_heads), (4, 2));
    assert_eq!((c.head_dim_k, c.head_dim_v), (16, 8));
    assert_eq!(c.rms_eps, 1e-6);
    assert_eq!(c.window, Some(32));
    let sliding: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sliding, vec![true, false, true]);
    assert_eq!(c.layer_window(0), Some(32));
    assert_eq!(c.layer_window(1), None);
    assert_eq!(c.layers[0].rope_base, 1e4);
    assert_eq!(c.layers[1].rope_base, 1e6);
    assert!(c.layers.iter().all(|l| l.rope_freq_scale == 1.0));
    assert_eq!(c.rope.n_rot, 8);
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert!(!c.rope.freq_factors && c.rope.yarn.is_none());
    assert_eq!(c.attn_scale, 0.25);
    assert!(!c.q_prescaled);
    assert_eq!(c.embed_scale, 1.0);
    assert_eq!(c.logit_softcap, None);
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(c.norms, NormPlacement::Pre);
    let m = c.moe.as_ref().expect("moe");
    assert_eq!(m.leading_dense, 1);
    assert_eq!((m.experts, m.used), (4, 2));
    assert_eq!(m.expert_width, 32);
    assert_eq!(m.shared_count, 1);
    assert_eq!(m.shared_width, 24);
    assert_eq!(m.gating, Gating::Sigmoid);
    assert!(m.normalize);
    assert_eq!(m.scale, 2.5);
    assert_eq!(c.vocab, 40);
    assert!(c.tied_output);
    assert!(c.layers.iter().all(|l| l.qk_norm && l.sinks));
    assert!(c.layers.iter().all(|l| l.biases == Default::default()));
    for l in &c.layers[1..] {
        assert_eq!(
            l.ffn,
            FfnDesc::Moe {
                selection_bias: true,
                shared_expert: true,
                parallel_dense: None,
            }
        );
    }
}

#[test]
fn defaults_apply() {
    let f = build(
        |k| {
            for key in [
                "flint.attention.key_length",
                "flint.attention.value_length",
                "flint.rope.freq_base_swa",
                "flint.rope.dimension_count",
                "flint.leading_dense_block_count",
                "flint.feed_forward_length",
                "flint.expert_shared_count",
                "flint.expert_shared_feed_forward_length",
                "flint.expert_gating_func",
                "flint.expert_weights_norm",
                "flint.expert_weights_scale",
                "flint.attention.sliding_window",
            ] {
                k.retain(|(n, _)| *n != key);
            }
            with(
                "flint.attention.sliding_window_pattern",
                Value::from(vec![false, false, false]),
            )(k);
        },
        |t| {
            // Shapes for dk = dv = 16, all layers MoE, no shared expert.
            t.retain(|(n, _)| {
                !n.contains("shexp")
                    && ![
                        "blk.0.ffn_gate.weight",
                        "blk.0.ffn_up.weight",
                        "blk.0.ffn_down.weight",
                    ]
                    .contains(&n.as_str())
            });
            for (n, d) in t.iter_mut() {
                if n.ends_with("attn_v.weight") {
                    *d = vec![64, 32];
                } else if n.ends_with("attn_output.weight") {
                    *d = vec![64, 64];
                }
            }
            t.push(("blk.0.ffn_gate_inp.weight".into(), vec![64, 4]));
            t.push(("blk.0.ffn_gate_exps.weight".into(), vec![64, 32, 4]));
            t.push(("blk.0.ffn_up_exps.weight".into(), vec![64, 32, 4]));
            t.push(("blk.0.ffn_down_exps.weight".into(), vec![32, 64, 4]));
        },
    );
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert_eq!((c.head_dim_k, c.head_dim_v), (16, 16));
    assert!(c.layers.iter().all(|l| l.rope_base == 1e6));
    assert_eq!(c.rope.n_rot, 16);
    assert_eq!(c.window, None);
    assert!(c.layers.iter().all(|l| !l.sliding));
    let m = c.moe.expect("moe");
    assert_eq!(m.leading_dense, 0);
    assert_eq!(m.shared_count, 0);
    assert_eq!(m.shared_width, 32);
    assert_eq!(m.gating, Gating::Sigmoid);
    assert!(m.normalize);
    assert_eq!(m.scale, 1.0);
    assert_eq!(
        c.layers[0].ffn,
        FfnDesc::Moe {
            selection_bias: false,
            shared_expert: false,
            parallel_dense: None,
        }
    );
    assert!(c.layers[1..].iter().all(|l| matches!(
        l.ffn,
        FfnDesc::Moe {
            selection_bias: true,
            shared_expert: false,
            parallel_dense: None,
        }
    )));
}

#[test]
fn softmax_gating_is_read() {
    let f = build(
        with("flint.expert_gating_func", Value::U32(1)),
        same_tensors,
    );
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert_eq!(c.moe.expect("moe").gating, Gating::Softmax);
}

#[test]
fn missing_context_length_is_an_error() {
    let f = build(without("flint.context_length"), same_tensors);
    let e = config_err(&f, "'flint.context_length' is missing");
    assert!(matches!(e, ConfigError::Gguf(_)));
}

#[test]
fn every_required_key_is_named_when_missing() {
    for key in [
        "flint.embedding_length",
        "flint.block_count",
        "flint.attention.head_count",
        "flint.attention.head_count_kv",
        "flint.attention.layer_norm_rms_epsilon",
        "flint.attention.sliding_window_pattern",
        "flint.rope.freq_base",
        "flint.expert_count",
        "flint.expert_used_count",
        "flint.expert_feed_forward_length",
        "flint.feed_forward_length",
        "flint.attention.sliding_window",
    ] {
        let f = build(without(key), same_tensors);
        config_err(&f, key);
    }
}

#[test]
fn wrong_architecture() {
    let f = build(
        with("general.architecture", Value::from("mamba")),
        same_tensors,
    );
    let e = config_err(&f, "'mamba' is not supported");
    assert!(matches!(e, ConfigError::UnsupportedArchitecture { .. }));
}

#[test]
fn wrong_type_names_the_key() {
    let f = build(
        with("flint.block_count", Value::from("three")),
        same_tensors,
    );
    config_err(&f, "'flint.block_count' has type string");
    let f = build(
        with("flint.rope.freq_base", Value::U32(10000)),
        same_tensors,
    );
    config_err(&f, "'flint.rope.freq_base'");
    let f = build(
        with(
            "flint.attention.sliding_window_pattern",
            Value::from(vec![1u32, 0, 1]),
        ),
        same_tensors,
    );
    config_err(&f, "'flint.attention.sliding_window_pattern'");
}

#[test]
fn pattern_length_must_equal_block_count() {
    let f = build(
        with(
            "flint.attention.sliding_window_pattern",
            Value::from(vec![true, false]),
        ),
        same_tensors,
    );
    config_err(
        &f,
        "sliding_window_pattern': has 2 entries, block_count is 3",
    );
}

#[test]
fn head_count_must_divide() {
    let f = build(
        with("flint.attention.head_count_kv", Value::U32(3)),
        same_tensors,
    );
    config_err(
        &f,
        "'flint.attention.head_count_kv': head_count 4 is not a multiple",
    );
}

#[test]
fn k_must_not_exceed_e() {
    let f = build(with("flint.expert_used_count", Value::U32(5)), same_tensors);
    config_err(
        &f,
        "'flint.expert_used_count': is 5, more than expert_count 4",
    );
}

#[test]
fn n_rot_must_be_even_and_fit() {
    let f = build(
        with("flint.rope.dimension_count", Value::U32(7)),
        same_tensors,
    );
    config_err(&f, "'flint.rope.dimension_count': is 7");
    let f = build(
        with("flint.rope.dimension_count", Value::U32(18)),
        same_tensors,
    );
    config_err(&f, "at most key_length 16");
}

#[test]
fn zero_sizes_are_refused() {
    for key in [
        "flint.context_length",
        "flint.embedding_length",
        "flint.block_count",
        "flint.attention.head_count",
        "flint.attention.head_count_kv",
        "flint.attention.key_length",
        "flint.expert_count",
        "flint.expert_used_count",
        "flint.expert_feed_forward_length",
        "flint.attention.sliding_window",
    ] {
        let f = build(with(key, Value::U32(0)), same_tensors);
        config_err(&f, &format!("'{key}': must not be zero"));
    }
}

#[test]
fn bad_values_are_refused() {
    let f = build(
        with("flint.expert_gating_func", Value::U32(3)),
        same_tensors,
    );
    config_err(&f, "'flint.expert_gating_func': is 3");
    let f = build(
        with("flint.expert_shared_count", Value::U32(2)),
        same_tensors,
    );
    config_err(&f, "'flint.expert_shared_count': is 2");
    let f = build(
        with("flint.leading_dense_block_count", Value::U32(4)),
        same_tensors,
    );
    config_err(&f, "'flint.leading_dense_block_count': is 4");
    let f = build(
        with("flint.attention.layer_norm_rms_epsilon", Value::F32(-1.0)),
        same_tensors,
    );
    config_err(&f, "'flint.attention.layer_norm_rms_epsilon'");
    let f = build(
        with("flint.rope.freq_base", Value::F32(f32::NAN)),
        same_tensors,
    );
    config_err(&f, "'flint.rope.freq_base'");
    let f = build(
        with("flint.expert_weights_scale", Value::F32(0.0)),
        same_tensors,
    );
    config_err(&f, "'flint.expert_weights_scale'");
}

#[test]
fn all_dense_model_needs_no_moe_keys() {
    let f = build(
        |k| {
            with("flint.leading_dense_block_count", Value::U32(3))(k);
            k.retain(|(n, _)| !n.starts_with("flint.expert_"));
        },
        |t| {
            t.retain(|(n, _)| {
                !n.contains("exps")
                    && !n.contains("shexp")
                    && !n.contains("gate_inp")
                    && !n.contains("exp_probs")
            });
            for i in 1..3 {
                t.push((format!("blk.{i}.ffn_gate.weight"), vec![64, 96]));
                t.push((format!("blk.{i}.ffn_up.weight"), vec![64, 96]));
                t.push((format!("blk.{i}.ffn_down.weight"), vec![96, 64]));
            }
        },
    );
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert!(c.moe.is_none());
    assert!(c
        .layers
        .iter()
        .all(|l| l.ffn == FfnDesc::Dense { width: 96 }));
}

#[test]
fn missing_tensor_is_named() {
    let f = build(|_| {}, |t| t.retain(|(n, _)| n != "blk.2.attn_v.weight"));
    let e = tensor_err(&f, "tensor 'blk.2.attn_v.weight' is missing");
    assert!(matches!(e, ConfigError::MissingTensor { .. }));
    let f = build(
        |_| {},
        |t| t.retain(|(n, _)| n != "blk.1.ffn_down_exps.weight"),
    );
    tensor_err(&f, "'blk.1.ffn_down_exps.weight' is missing");
    let f = build(|_| {}, |t| t.retain(|(n, _)| n != "output_norm.weight"));
    tensor_err(&f, "'output_norm.weight' is missing");
}

#[test]
fn wrong_shape_names_tensor_expected_and_found() {
    let f = build(
        |_| {},
        |t| {
            for (n, d) in t.iter_mut() {
                if n == "blk.1.attn_q.weight" {
                    *d = vec![64, 32];
                }
            }
        },
    );
    tensor_err(
        &f,
        "tensor 'blk.1.attn_q.weight' has shape [64, 32], expected [64, 64]",
    );
    let f = build(
        |_| {},
        |t| {
            for (n, d) in t.iter_mut() {
                if n == "blk.2.ffn_gate_exps.weight" {
                    *d = vec![64, 4, 32];
                }
            }
        },
    );
    tensor_err(
        &f,
        "'blk.2.ffn_gate_exps.weight' has shape [64, 4, 32], expected [64, 32, 4]",
    );
    let f = build(|_| {}, |t| t.push(("output.weight".into(), vec![64, 41])));
    tensor_err(&f, "'output.weight' has shape [64, 41], expected [64, 40]");
}

#[test]
fn optional_sets_must_be_complete() {
    let f = build(
        |_| {},
        |t| t.retain(|(n, _)| n != "blk.0.attn_k_norm.weight"),
    );
    tensor_err(
        &f,
        "'blk.0.attn_k_norm.weight' is missing while 'blk.0.attn_q_norm.weight'",
    );
    let f = build(
        |_| {},
        |t| t.retain(|(n, _)| n != "blk.1.ffn_up_shexp.weight"),
    );
    tensor_err(&f, "'blk.1.ffn_up_shexp.weight' is missing while");
    let f = build(
        with("flint.expert_shared_count", Value::U32(0)),
        same_tensors,
    );
    tensor_err(
        &f,
        "'flint.expert_shared_count': is 0, but layer 1 has shared-expert tensors",
    );
    let f = build(|_| {}, |t| t.retain(|(n, _)| !n.contains("shexp")));
    tensor_err(&f, "'blk.1.ffn_gate_shexp.weight' is missing");
}

#[test]
fn f32_only_tensors_are_checked() {
    let mut k = keys();
    k.retain(|_| true);
    let mut w = GgufWriter::new();
    for (key, v) in k {
        w.add(key, v).expect("key");
    }
    for (name, dims) in tensors() {
        let n: usize = dims.iter().product();
        if name == "blk.1.attn_sinks.weight" {
            w.add_tensor(&name, GgmlType::F16, &dims, vec![0u8; n * 2])
                .expect("f16");
        } else {
            w.add_f32_tensor(&name, &dims, &vec![0.0; n])
                .expect("tensor");
        }
    }
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    tensor_err(&f, "'blk.1.attn_sinks.weight' has type F16, expected F32");
}

#[test]
fn unknown_tensors_are_refused_by_name() {
    for name in [
        "blk.1.attn_q.bias",
        "blk.0.ffn_gate_inp.weight",
        "rope_freqs.weight",
        "extra.weight",
    ] {
        let f = build(|_| {}, |t| t.push((name.to_string(), vec![64])));
        let e = tensor_err(&f, &format!("tensor '{name}' is not part of a flint model"));
        assert!(matches!(e, ConfigError::UnexpectedTensor { .. }));
    }
}

#[test]
fn norms_must_be_f32() {
    let mut w = GgufWriter::new();
    for (key, v) in keys() {
        w.add(key, v).expect("key");
    }
    for (name, dims) in tensors() {
        let n: usize = dims.iter().product();
        if name == "blk.2.ffn_norm.weight" {
            w.add_tensor(&name, GgmlType::F16, &dims, vec![0u8; n * 2])
                .expect("f16");
        } else {
            w.add_f32_tensor(&name, &dims, &vec![0.0; n])
                .expect("tensor");
        }
    }
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    tensor_err(&f, "'blk.2.ffn_norm.weight' has type F16, expected F32");
}
