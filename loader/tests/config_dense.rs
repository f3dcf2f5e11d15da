//! DenseConfig (llama, qwen3): keys, defaults, tensor checks, errors naming the key or
//! tensor. Files are made with our writer.

use flint_loader::config::{ConfigError, DenseArch, DenseConfig, ModelConfig};
use flint_loader::gguf::{GgufFile, GgufWriter, Value};

fn file(arch: &str, extra: &[(&str, Value)], qk_norm: bool, drop: &str) -> GgufFile {
    let k = |s: &str| format!("{arch}.{s}");
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch).expect("key");
    for (key, v) in [
        ("context_length", Value::U32(64)),
        ("embedding_length", Value::U32(32)),
        ("block_count", Value::U32(2)),
        ("feed_forward_length", Value::U32(48)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(2)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ] {
        if !extra.iter().any(|(e, _)| *e == key) && key != drop {
            w.add(&k(key), v).expect("key");
        }
    }
    for (key, v) in extra {
        w.add(&k(key), v.clone()).expect("key");
    }
    let (d, v, dk, ff) = (32, 12, 8, 48);
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![d, v]),
        ("output_norm.weight".into(), vec![d]),
        ("output.weight".into(), vec![d, v]),
    ];
    for i in 0..2 {
        let n = |s: &str| format!("blk.{i}.{s}");
        t.push((n("attn_norm.weight"), vec![d]));
        t.push((n("attn_q.weight"), vec![d, 4 * dk]));
        t.push((n("attn_k.weight"), vec![d, 2 * dk]));
        t.push((n("attn_v.weight"), vec![d, 2 * dk]));
        t.push((n("attn_output.weight"), vec![4 * dk, d]));
        if qk_norm {
            t.push((n("attn_q_norm.weight"), vec![dk]));
            t.push((n("attn_k_norm.weight"), vec![dk]));
        }
        t.push((n("ffn_norm.weight"), vec![d]));
        t.push((n("ffn_gate.weight"), vec![d, ff]));
        t.push((n("ffn_up.weight"), vec![d, ff]));
        t.push((n("ffn_down.weight"), vec![ff, d]));
    }
    for (name, dims) in t {
        if name == drop {
            continue;
        }
        let n: usize = dims.iter().product();
        w.add_f32_tensor(&name, &dims, &vec![0.0; n])
            .expect("tensor");
    }
    GgufFile::from_bytes(w.to_bytes()).expect("parse")
}

#[test]
fn llama_and_qwen3_read_and_check() {
    let f = file("llama", &[], false, "");
    let c = DenseConfig::from_gguf(&f).expect("llama");
    assert_eq!(c.arch, DenseArch::Llama);
    assert!(!c.arch.rope_neox() && !c.arch.qk_norm());
    assert_eq!(
        (c.key_length, c.value_length, c.rope_dimension_count),
        (8, 8, 8)
    );
    assert_eq!(c.rope_freq_base, 10_000.0);
    let t = c.check_tensors(&f).expect("tensors");
    assert_eq!(t.vocab_size, 12);
    assert!(!t.tied_output);
    let f = file("qwen3", &[("rope.freq_base", Value::F32(1e6))], true, "");
    let m = ModelConfig::from_gguf(&f).expect("qwen3");
    assert_eq!(m.architecture(), "qwen3");
    m.check_tensors(&f).expect("tensors");
    match m {
        ModelConfig::Dense(c) => {
            assert!(c.arch.rope_neox() && c.arch.qk_norm());
            assert_eq!(c.rope_freq_base, 1e6);
        }
        other => panic!("expected dense, got {other:?}"),
    }
}

#[test]
fn dense_errors_name_key_or_tensor() {
    let f = file("llama", &[], false, "context_length");
    let e = DenseConfig::from_gguf(&f).expect_err("missing");
    assert!(
        e.to_string().contains("'llama.context_length' is missing"),
        "{e}"
    );
    let f = file(
        "qwen3",
        &[("attention.head_count_kv", Value::U32(3))],
        true,
        "",
    );
    let e = DenseConfig::from_gguf(&f).expect_err("gqa");
    assert!(
        e.to_string().contains("'qwen3.attention.head_count_kv'"),
        "{e}"
    );
    let f = file(
        "llama",
        &[("rope.dimension_count", Value::U32(4))],
        false,
        "",
    );
    let e = DenseConfig::from_gguf(&f).expect_err("n_rot");
    assert!(
        e.to_string().contains("'llama.rope.dimension_count'"),
        "{e}"
    );
    let f = file("llama", &[("expert_count", Value::U32(8))], false, "");
    let e = DenseConfig::from_gguf(&f).expect_err("moe");
    assert!(e.to_string().contains("'llama.expert_count'"), "{e}");
    let f = file("qwen3", &[], false, "");
    let c = DenseConfig::from_gguf(&f).expect("config");
    let e = c.check_tensors(&f).expect_err("qk norm missing");
    assert!(
        e.to_string()
            .contains("'blk.0.attn_q_norm.weight' is missing"),
        "{e}"
    );
    let f = file("llama", &[], false, "blk.1.ffn_up.weight");
    let c = DenseConfig::from_gguf(&f).expect("config");
    let e = c.check_tensors(&f).expect_err("missing");
    assert!(matches!(e, ConfigError::MissingTensor { .. }));
    assert!(e.to_string().contains("'blk.1.ffn_up.weight'"), "{e}");
}
