//! Gemma3Config: the real 270M file (when present) and synthetic files for the
//! sliding-window pattern forms, defaults and errors.

use flint_loader::config::{ConfigError, Gemma3Config, ModelConfig};
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
    let c = Gemma3Config::from_gguf(&f).expect("config");
    assert_eq!(c.context_length, 32768);
    assert_eq!(c.embedding_length, 640);
    assert_eq!(c.block_count, 18);
    assert_eq!(c.feed_forward_length, 2048);
    assert_eq!((c.head_count, c.head_count_kv), (4, 1));
    assert_eq!((c.key_length, c.value_length), (256, 256));
    assert_eq!(c.sliding_window, Some(512));
    let global: Vec<usize> = (0..18).filter(|&i| !c.is_sliding(i)).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(c.rope_base(5), 1e6);
    assert_eq!(c.rope_base(0), 1e4);
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(c.embedding_scale, 640f32.sqrt());
    assert_eq!(c.rope_dimension_count, 256);
    assert_eq!(c.final_logit_softcapping, None);
    let t = c.check_tensors(&f).expect("tensors");
    assert_eq!(t.vocab_size, 262144);
    assert!(t.tied_output);
    let m = ModelConfig::from_gguf(&f).expect("model");
    assert_eq!(m.architecture(), "gemma3");
    assert_eq!(m.block_count(), 18);
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

fn file(keys: Vec<(&'static str, Value)>, tensors: bool) -> GgufFile {
    let mut w = GgufWriter::new();
    let layers = keys
        .iter()
        .find(|(k, _)| *k == "gemma3.block_count")
        .and_then(|(_, v)| v.as_i128())
        .unwrap_or(0) as usize;
    for (k, v) in keys {
        w.add(k, v).expect("key");
    }
    if tensors {
        let (d, v, h, hkv, dk, ff) = (32, 10, 2, 1, 16, 64);
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
        for (name, dims) in t {
            let n: usize = dims.iter().product();
            w.add_f32_tensor(&name, &dims, &vec![0.0; n])
                .expect("tensor");
        }
    }
    GgufFile::from_bytes(w.to_bytes()).expect("parse")
}

#[test]
fn default_pattern_is_every_sixth_layer_global() {
    let c = Gemma3Config::from_gguf(&file(base_keys(13), false)).expect("config");
    let global: Vec<usize> = (0..13).filter(|&i| !c.is_sliding(i)).collect();
    assert_eq!(global, vec![5, 11]);
    assert_eq!(c.rope_freq_base_swa, 1e4);
    assert_eq!(c.attention_scale, 0.25);
}

#[test]
fn pattern_as_period_and_as_bools() {
    let mut k = base_keys(5);
    k.push(("gemma3.attention.sliding_window_pattern", Value::U32(2)));
    let c = Gemma3Config::from_gguf(&file(k, false)).expect("config");
    assert_eq!(c.swa_layers, vec![true, false, true, false, true]);
    let mut k = base_keys(3);
    k.push((
        "gemma3.attention.sliding_window_pattern",
        Value::from(vec![false, true, true]),
    ));
    let c = Gemma3Config::from_gguf(&file(k, false)).expect("config");
    assert_eq!(c.swa_layers, vec![false, true, true]);
    let mut k = base_keys(3);
    k.push((
        "gemma3.attention.sliding_window_pattern",
        Value::from(vec![false, true]),
    ));
    let e = Gemma3Config::from_gguf(&file(k, false)).expect_err("length");
    assert!(e.to_string().contains("sliding_window_pattern"), "{e}");
}

#[test]
fn no_window_means_all_global_and_swa_base_is_read() {
    let mut k = base_keys(4);
    k.retain(|(n, _)| *n != "gemma3.attention.sliding_window");
    let c = Gemma3Config::from_gguf(&file(k, false)).expect("config");
    assert_eq!(c.sliding_window, None);
    assert!(c.swa_layers.iter().all(|s| !s));
    let mut k = base_keys(4);
    k.push(("gemma3.rope.freq_base_swa", Value::F32(5e4)));
    k.push(("gemma3.final_logit_softcapping", Value::F32(30.0)));
    let c = Gemma3Config::from_gguf(&file(k, false)).expect("config");
    assert_eq!(c.rope_freq_base_swa, 5e4);
    assert_eq!(c.final_logit_softcapping, Some(30.0));
}

#[test]
fn gemma3_errors_name_the_key() {
    let mut k = base_keys(4);
    k.retain(|(n, _)| *n != "gemma3.context_length");
    let e = Gemma3Config::from_gguf(&file(k, false)).expect_err("missing");
    assert!(
        e.to_string().contains("'gemma3.context_length' is missing"),
        "{e}"
    );
    let mut k = base_keys(4);
    k[6] = ("gemma3.attention.head_count_kv", Value::U32(3));
    let e = Gemma3Config::from_gguf(&file(k, false)).expect_err("gqa");
    assert!(
        e.to_string().contains("'gemma3.attention.head_count_kv'"),
        "{e}"
    );
    let mut k = base_keys(4);
    k[3] = ("gemma3.block_count", Value::U32(0));
    let e = Gemma3Config::from_gguf(&file(k, false)).expect_err("zero");
    assert!(
        e.to_string()
            .contains("'gemma3.block_count': must not be zero"),
        "{e}"
    );
    let mut k = base_keys(4);
    k[0] = ("general.architecture", Value::from("flint"));
    let e = Gemma3Config::from_gguf(&file(k, false)).expect_err("arch");
    assert!(matches!(e, ConfigError::WrongArchitecture { .. }));
}

#[test]
fn gemma3_tensors_checked() {
    let f = file(base_keys(2), true);
    let c = Gemma3Config::from_gguf(&f).expect("config");
    let t = c.check_tensors(&f).expect("tensors");
    assert_eq!(t.vocab_size, 10);
    assert!(t.tied_output);
    let mut k = base_keys(2);
    k[4] = ("gemma3.feed_forward_length", Value::U32(48));
    let f = file(k, true);
    let c = Gemma3Config::from_gguf(&f).expect("config");
    let e = c.check_tensors(&f).expect_err("shape");
    assert!(
        e.to_string()
            .contains("tensor 'blk.0.ffn_gate.weight' has shape [32, 64], expected [32, 48]"),
        "{e}"
    );
    let mut k = base_keys(3);
    k[3] = ("gemma3.block_count", Value::U32(3));
    let f = file(base_keys(2), true);
    let c3 = Gemma3Config::from_gguf(&file(k, false)).expect("config");
    let e = c3.check_tensors(&f).expect_err("missing");
    assert!(
        e.to_string()
            .contains("'blk.2.attn_norm.weight' is missing"),
        "{e}"
    );
}
