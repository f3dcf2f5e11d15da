//! The Gemma 3 description: the real 270M file (when present) and synthetic files for
//! the sliding-window pattern forms, the sizes' query scale and RoPE scaling, defaults
//! and errors.

use flint_loader::config::{Activation, Arch, FfnDesc, ModelDesc, NormPlacement, RopeKind};
use flint_loader::gguf::{GgufFile, GgufWriter, Value};

fn gemma_path() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("FLINT_GEMMA_GGUF") {
        return Some(p.into());
    }
    let home = std::env::var_os("HOME")?;
    let p = std::path::Path::new(&home).join(".cache/flint/gemma-3-270m-q4_k_m.gguf");
    p.exists().then_some(p)
}

#[test]
fn gemma3_270m_as_llama_cpp_runs_it() {
    let Some(path) = gemma_path() else {
        eprintln!("SKIPPED: Gemma 3 270M GGUF not found (set FLINT_GEMMA_GGUF)");
        return;
    };
    let f = GgufFile::open(&path).expect("open");
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!(c.context_length, 32768);
    assert_eq!(c.d, 640);
    assert_eq!(c.n_layers(), 18);
    assert!(c
        .layers
        .iter()
        .all(|l| l.ffn == FfnDesc::Dense { width: 2048 }));
    assert_eq!((c.n_heads, c.n_kv_heads), (4, 1));
    assert_eq!((c.head_dim_k, c.head_dim_v), (256, 256));
    assert_eq!(c.window, Some(512));
    let global: Vec<usize> = (0..18).filter(|&i| !c.layers[i].sliding).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(c.layers[5].rope_base, 1e6);
    assert_eq!(c.layers[0].rope_base, 1e4);
    assert!(c.layers.iter().all(|l| l.rope_freq_scale == 1.0));
    assert_eq!(c.attn_scale, 1.0 / 16.0);
    assert!(c.q_prescaled);
    assert_eq!(c.embed_scale, 640f32.sqrt());
    assert_eq!(c.rope.n_rot, 256);
    assert_eq!(c.rope.kind, RopeKind::Neox);
    assert_eq!(c.logit_softcap, None);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.norms, NormPlacement::PrePost);
    assert!(c.layers.iter().all(|l| l.qk_norm));
    assert_eq!(c.vocab, 262144);
    assert!(c.tied_output);
}

fn base_keys(layers: u32) -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("gemma3")),
        ("gemma3.context_length", Value::U32(128)),
        ("gemma3.embedding_length", Value::U32(32)),
        ("gemma3.block_count", Value::U32(layers)),
        ("gemma3.feed_forward_length", Value::U32(64)),
        ("gemma3.attention.head_count", Value::U32(2)),
        ("gemma3.attention.head_count_kv", Value::U32(1)),
        ("gemma3.attention.key_length", Value::U32(16)),
        ("gemma3.attention.value_length", Value::U32(16)),
        ("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("gemma3.rope.freq_base", Value::F32(1e6)),
        ("gemma3.attention.sliding_window", Value::U32(8)),
    ]
}

fn get(keys: &[(&'static str, Value)], key: &str) -> usize {
    keys.iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.as_i128())
        .unwrap_or(0) as usize
}

/// The file of `keys` with the tensors they imply (V = 10), after `edit`.
fn file_with(
    keys: Vec<(&'static str, Value)>,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>)>),
) -> GgufFile {
    let mut w = GgufWriter::new();
    let g = |k: &str| get(&keys, &format!("gemma3.{k}"));
    let (layers, d, h, hkv, dk, ff) = (
        g("block_count"),
        g("embedding_length"),
        g("attention.head_count"),
        g("attention.head_count_kv"),
        g("attention.key_length"),
        g("feed_forward_length"),
    );
    let v = 10;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![d, v]),
        ("output_norm.weight".into(), vec![d]),
    ];
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        for (name, dims) in [
            ("attn_norm.weight", vec![d]),
            ("attn_q.weight", vec![d, h * dk]),
            ("attn_k.weight", vec![d, hkv * dk]),
            ("attn_v.weight", vec![d, hkv * dk]),
            ("attn_output.weight", vec![h * dk, d]),
            ("post_attention_norm.weight", vec![d]),
            ("attn_q_norm.weight", vec![dk]),
            ("attn_k_norm.weight", vec![dk]),
            ("ffn_norm.weight", vec![d]),
            ("ffn_gate.weight", vec![d, ff]),
            ("ffn_up.weight", vec![d, ff]),
            ("ffn_down.weight", vec![ff, d]),
            ("post_ffw_norm.weight", vec![d]),
        ] {
            t.push((n(name), dims));
        }
    }
    edit(&mut t);
    for (k, v) in keys {
        w.add(k, v).expect("key");
    }
    for (name, dims) in t {
        let n: usize = dims.iter().product();
        w.add_f32_tensor(&name, &dims, &vec![0.0; n])
            .expect("tensor");
    }
    GgufFile::from_bytes(w.to_bytes()).expect("parse")
}

fn desc(keys: Vec<(&'static str, Value)>) -> ModelDesc {
    ModelDesc::from_gguf(&file_with(keys, |_| {})).expect("description")
}

fn refused(f: &GgufFile, needle: &str) {
    let e = ModelDesc::from_gguf(f).expect_err("must be refused");
    assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
}

fn set(keys: &mut Vec<(&'static str, Value)>, key: &'static str, v: Value) {
    keys.retain(|(k, _)| *k != key);
    keys.push((key, v));
}

fn sliding(c: &ModelDesc) -> Vec<bool> {
    c.layers.iter().map(|l| l.sliding).collect()
}

#[test]
fn default_pattern_is_every_sixth_layer_global() {
    let c = desc(base_keys(13));
    let global: Vec<usize> = (0..13).filter(|&i| !c.layers[i].sliding).collect();
    assert_eq!(global, vec![5, 11]);
    assert_eq!(c.layers[0].rope_base, 1e4);
    assert_eq!(c.layers[5].rope_base, 1e6);
    assert_eq!(c.attn_scale, 0.25);
}

#[test]
fn pattern_as_period_and_as_bools() {
    let mut k = base_keys(5);
    k.push(("gemma3.attention.sliding_window_pattern", Value::U32(2)));
    assert_eq!(sliding(&desc(k)), vec![true, false, true, false, true]);
    let mut k = base_keys(3);
    k.push((
        "gemma3.attention.sliding_window_pattern",
        Value::from(vec![false, true, true]),
    ));
    assert_eq!(sliding(&desc(k)), vec![false, true, true]);
    let mut k = base_keys(3);
    k.push((
        "gemma3.attention.sliding_window_pattern",
        Value::from(vec![false, true]),
    ));
    refused(
        &file_with(k, |_| {}),
        "'gemma3.attention.sliding_window_pattern': has 2 entries",
    );
}

#[test]
fn no_window_means_all_global_and_swa_base_is_read() {
    let mut k = base_keys(4);
    k.retain(|(n, _)| *n != "gemma3.attention.sliding_window");
    let c = desc(k);
    assert_eq!(c.window, None);
    assert!(c.layers.iter().all(|l| !l.sliding && l.rope_base == 1e6));
    let mut k = base_keys(4);
    k.push(("gemma3.rope.freq_base_swa", Value::F32(5e4)));
    k.push(("gemma3.final_logit_softcapping", Value::F32(30.0)));
    let c = desc(k);
    assert_eq!(c.layers[0].rope_base, 5e4);
    assert_eq!(c.logit_softcap, Some(30.0));
}

/// Gemma 3 27B: 62 layers, query scale 1/sqrt(d / H) (`query_pre_attn_scalar`), not
/// 1/sqrt(key_length); every other size (here with key_length != d / H, as the 4B's
/// 256 vs 2560 / 8) keeps 1/sqrt(key_length).
#[test]
fn query_scale_of_27b_and_the_other_sizes() {
    let wide = |layers| {
        let mut k = base_keys(layers);
        set(&mut k, "gemma3.embedding_length", Value::U32(128));
        k
    };
    let c = desc(wide(62));
    assert_eq!(c.d / c.n_heads, 64);
    assert_eq!(c.attn_scale, 1.0 / 8.0);
    assert!(c.q_prescaled);
    let c = desc(wide(34));
    assert_eq!(c.attn_scale, 1.0 / 4.0);
}

/// Gemma 3 4B/12B/27B: `rope.scaling.type = linear`, factor 8, scales the global layers
/// only; the sliding layers keep scale 1 (llama.cpp's `rope_freq_scale_train_swa`).
#[test]
fn linear_scaling_applies_on_global_layers_only() {
    let mut k = base_keys(34);
    k.push(("gemma3.rope.scaling.type", Value::from("linear")));
    k.push(("gemma3.rope.scaling.factor", Value::F32(8.0)));
    let c = desc(k);
    for (i, l) in c.layers.iter().enumerate() {
        let global = i % 6 == 5;
        assert_eq!(l.sliding, !global, "layer {i}");
        let scale = if global { 0.125 } else { 1.0 };
        assert_eq!(l.rope_freq_scale, scale, "layer {i}");
    }
    assert!(c.rope.yarn.is_none());
}

#[test]
fn gemma3_errors_name_the_key() {
    let mut k = base_keys(4);
    k.retain(|(n, _)| *n != "gemma3.context_length");
    refused(&file_with(k, |_| {}), "'gemma3.context_length' is missing");
    let mut k = base_keys(4);
    set(&mut k, "gemma3.attention.head_count_kv", Value::U32(3));
    refused(&file_with(k, |_| {}), "'gemma3.attention.head_count_kv'");
    let mut k = base_keys(4);
    set(&mut k, "gemma3.block_count", Value::U32(0));
    refused(
        &file_with(k, |_| {}),
        "'gemma3.block_count': must not be zero",
    );
    let mut k = base_keys(4);
    set(&mut k, "gemma3.rope.scaling.type", Value::from("longrope"));
    refused(
        &file_with(k, |_| {}),
        "'gemma3.rope.scaling.type': is 'longrope'",
    );
    let mut k = base_keys(4);
    set(&mut k, "gemma3.attention.value_length", Value::U32(8));
    refused(
        &file_with(k, |_| {}),
        "'gemma3.attention.value_length': is 8, key_length is 16",
    );
}

#[test]
fn gemma3_tensors_checked() {
    let c = desc(base_keys(2));
    assert_eq!(c.vocab, 10);
    assert!(c.tied_output);
    let f = file_with(base_keys(2), |t| {
        for (n, d) in t.iter_mut() {
            if n.ends_with("ffn_gate.weight") {
                d[1] = 48;
            }
        }
    });
    refused(
        &f,
        "tensor 'blk.0.ffn_gate.weight' has shape [32, 48], expected [32, 64]",
    );
    let f = file_with(base_keys(2), |t| {
        t.retain(|(n, _)| n != "blk.1.post_ffw_norm.weight")
    });
    refused(&f, "'blk.1.post_ffw_norm.weight' is missing");
    let f = file_with(base_keys(2), |t| {
        t.push(("dense_2.weight".into(), vec![32, 8]))
    });
    refused(&f, "tensor 'dense_2.weight' is not part of a gemma3 model");
    let f = file_with(base_keys(2), |t| {
        t.push(("blk.0.attn_output.bias".into(), vec![32]))
    });
    refused(
        &f,
        "tensor 'blk.0.attn_output.bias' is not part of a gemma3 model",
    );
    // q/k/v biases are optional for gemma3, as llama.cpp's create_tensor_qkv has them.
    let f = file_with(base_keys(2), |t| {
        t.push(("blk.1.attn_k.bias".into(), vec![16]))
    });
    let c = ModelDesc::from_gguf(&f).expect("description");
    assert!(!c.layers[0].biases.k && c.layers[1].biases.k);
}
