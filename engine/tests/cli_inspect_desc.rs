//! `flint inspect` says whether Flint runs a file and, when it does not, which key or
//! tensor is the reason; `flint run` refuses such a file with exit 1 and the same
//! reason; a split model is inspected from its first shard.

use std::path::{Path, PathBuf};
use std::process::Command;

use flint_loader::gguf::{GgufWriter, Value};

/// A scratch directory of this test process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("flint-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes at `path` a 1-layer llama: its keys when `keys` (plus `extra`), and the
/// tensors in `range` of its tensor list (plus `extra_tensors`).
fn write_llama(
    path: &Path,
    keys: bool,
    extra: &[(&str, Value)],
    extra_tensors: &[(&str, usize)],
    range: std::ops::Range<usize>,
) {
    let mut w = GgufWriter::new();
    if keys {
        w.add("general.architecture", "llama").expect("key");
        for (k, v) in [
            ("context_length", Value::U32(64)),
            ("embedding_length", Value::U32(32)),
            ("block_count", Value::U32(1)),
            ("feed_forward_length", Value::U32(48)),
            ("attention.head_count", Value::U32(4)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ] {
            w.add(&format!("llama.{k}"), v).expect("key");
        }
    }
    for (k, v) in extra {
        w.add(k, v.clone()).expect("key");
    }
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![32, 8]),
        ("output_norm.weight".into(), vec![32]),
    ];
    for (n, dims) in [
        ("attn_norm.weight", vec![32]),
        ("attn_q.weight", vec![32, 32]),
        ("attn_k.weight", vec![32, 32]),
        ("attn_v.weight", vec![32, 32]),
        ("attn_output.weight", vec![32, 32]),
        ("ffn_norm.weight", vec![32]),
        ("ffn_gate.weight", vec![32, 48]),
        ("ffn_up.weight", vec![32, 48]),
        ("ffn_down.weight", vec![48, 32]),
    ] {
        t.push((format!("blk.0.{n}"), dims));
    }
    for (n, len) in extra_tensors {
        t.push((n.to_string(), vec![*len]));
    }
    for (name, dims) in &t[range] {
        let n: usize = dims.iter().product();
        w.add_f32_tensor(name, dims, &vec![0.5; n]).expect("tensor");
    }
    w.write_file(path).expect("write");
}

/// The verdict for a file whose description is valid: it runs.
fn valid_description(text: &str, arch: &str) -> bool {
    text.contains(&format!("runs: yes ({arch} model"))
}

/// `flint run` on `path`: its exit code and stderr.
fn run(path: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["run", "-n", "1", "-p", "x", "-m"])
        .arg(path)
        .env("FLINT_DEVICE", "cpu")
        .output()
        .expect("run flint");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn inspect(path: &Path, json: bool) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flint"));
    cmd.arg("inspect").arg(path);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("run flint");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn inspect_names_the_key_or_tensor_that_stops_a_file() {
    let dir = Scratch::new("inspect-desc");
    let ok = dir.0.join("ok.gguf");
    write_llama(&ok, true, &[], &[], 0..11);
    let text = inspect(&ok, false);
    assert!(valid_description(&text, "llama"), "{text}");
    assert!(text.contains("rope: normal, 8 dims"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&inspect(&ok, true)).expect("json");
    assert_eq!(v["model"]["description_valid"], true);

    let key = dir.0.join("longrope.gguf");
    let longrope = [("llama.rope.scaling.type", Value::from("longrope"))];
    write_llama(&key, true, &longrope, &[], 0..11);
    let text = inspect(&key, false);
    assert!(
        text.contains("runs: no: metadata key 'llama.rope.scaling.type': is 'longrope'"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&inspect(&key, true)).expect("json");
    assert_eq!(v["model"]["valid"], false);
    assert_eq!(v["model"]["description_valid"], false);
    let err = v["model"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("llama.rope.scaling.type"), "{err}");

    let tensor = dir.0.join("ffn-bias.gguf");
    write_llama(&tensor, true, &[], &[("blk.0.ffn_up.bias", 48)], 0..12);
    let text = inspect(&tensor, false);
    assert!(
        text.contains("runs: no: tensor 'blk.0.ffn_up.bias' is not part of a llama model"),
        "{text}"
    );
}

#[test]
fn inspect_opens_a_split_model_from_its_first_shard() {
    let dir = Scratch::new("inspect-split");
    let split = |no: u16| {
        [
            ("split.no", Value::U16(no)),
            ("split.count", Value::U16(2)),
            ("split.tensors.count", Value::I32(11)),
        ]
    };
    let first = dir.0.join("m-00001-of-00002.gguf");
    write_llama(&first, true, &split(0), &[], 0..5);
    write_llama(
        &dir.0.join("m-00002-of-00002.gguf"),
        false,
        &split(1),
        &[],
        5..11,
    );
    let text = inspect(&first, false);
    assert!(text.contains("split model: 2 shards"), "{text}");
    assert!(valid_description(&text, "llama"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&inspect(&first, true)).expect("json");
    assert_eq!(v["shards"], 2);
    assert_eq!(v["tensor_count"], 11);
    assert_eq!(v["tensors"][10]["shard"], 1);
    assert_eq!(v["model"]["description_valid"], true);
}

#[test]
fn run_refuses_what_flint_lacks_with_exit_1_naming_it() {
    let dir = Scratch::new("run-refusals");
    // (file, extra keys, extra tensors, what the error must say)
    type Case = (
        &'static str,
        Vec<(&'static str, Value)>,
        Vec<(&'static str, usize)>,
    );
    let cases: [(Case, &str); 3] = [
        (
            (
                "longrope.gguf",
                vec![("llama.rope.scaling.type", Value::from("longrope"))],
                vec![],
            ),
            "metadata key 'llama.rope.scaling.type': is 'longrope'",
        ),
        (
            ("ffn-bias.gguf", vec![], vec![("blk.0.ffn_up.bias", 48)]),
            "tensor 'blk.0.ffn_up.bias' is not part of a llama model",
        ),
        (
            (
                "moe.gguf",
                vec![("llama.expert_count", Value::U32(4))],
                vec![],
            ),
            "'llama.expert_count': is 4: mixture-of-experts llama files are not supported",
        ),
    ];
    for ((name, keys, tensors), why) in cases {
        let path = dir.0.join(name);
        let n = 11 + tensors.len();
        write_llama(&path, true, &keys, &tensors, 0..n);
        let (code, err) = run(&path);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.starts_with("error: "), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err:?} lacks {why:?}");
    }
}
