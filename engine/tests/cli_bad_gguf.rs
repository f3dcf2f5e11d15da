//! Every damaged GGUF of `loader/tests/data/bad/` makes `flint inspect` and `flint dump`
//! exit 1 with a one-paragraph error naming the problem (no panic, no hang); a valid
//! sample and a missing tensor behave as documented.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../loader/tests/data")
}

fn flint(args: &[&std::ffi::OsStr]) -> Output {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(args)
        .output()
        .expect("run flint");
    // Not a performance assertion: a hang shows up as minutes, not milliseconds.
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "flint {args:?} hung"
    );
    out
}

#[test]
fn damaged_files_exit_1_naming_the_problem() {
    let dir = data_dir().join("bad");
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("manifest");
    let mut n = 0;
    for line in manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (file, fragment) = line.split_once('\t').expect("tab-separated");
        let path = dir.join(file);
        for args in [
            vec!["inspect".as_ref(), path.as_os_str()],
            vec!["inspect".as_ref(), path.as_os_str(), "--json".as_ref()],
            vec!["dump".as_ref(), path.as_os_str(), "w".as_ref()],
        ] {
            let out = flint(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{file} {args:?}: {err}");
            assert!(!err.contains("panicked"), "{file}: {err}");
            assert!(err.starts_with("error: "), "{file}: {err}");
            assert!(err.contains(fragment), "{file}: {err:?} lacks {fragment:?}");
            assert!(
                err.contains(file),
                "{file}: error does not name the file: {err}"
            );
            assert!(out.stdout.is_empty(), "{file}: printed a result");
        }
        n += 1;
    }
    assert!(n >= 30, "only {n} corpus files");
}

#[test]
fn sample_inspects_and_dumps() {
    let sample = data_dir().join("sample.gguf");
    let out = flint(&["inspect".as_ref(), sample.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("q4_k.weight") && text.contains("Q4_K"),
        "{text}"
    );
    assert!(text.contains("9 tensors"), "{text}");
    let out = flint(&["inspect".as_ref(), sample.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["tensor_count"], 9);
    assert_eq!(v["metadata"]["t.u32"]["value"], 4_000_000_000u64);
    assert_eq!(v["metadata"]["general.architecture"]["value"], "test");
    assert_eq!(v["bytes_per_type"]["Q8_0"]["tensors"], 1);

    let out = flint(&["dump".as_ref(), sample.as_os_str(), "i32.weight".as_ref()]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 12);
    let out = flint(&["dump".as_ref(), sample.as_os_str(), "nope".as_ref()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tensor named 'nope'"), "{err}");
    let missing = data_dir().join("does-not-exist.gguf");
    let out = flint(&["inspect".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does-not-exist.gguf"));
}

#[test]
fn gemma_inspect_lists_236_tensors() {
    let path = std::env::var_os("FLINT_GEMMA_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from(std::env::var_os("HOME")?)
                .join(".cache/flint/gemma-3-270m-q4_k_m.gguf");
            p.exists().then_some(p)
        });
    let Some(path) = path else {
        eprintln!("SKIPPED: Gemma 3 270M GGUF not found (set FLINT_GEMMA_GGUF)");
        return;
    };
    let out = flint(&["inspect".as_ref(), path.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["tensor_count"], 236);
    assert_eq!(v["tensors"].as_array().map(Vec::len), Some(236));
    assert_eq!(v["model"]["valid"], true);
    assert_eq!(v["bytes_per_type"]["Q8_0"]["tensors"], 10);
    assert_eq!(v["metadata"]["tokenizer.ggml.tokens"]["len"], 262144);
    let out = flint(&["inspect".as_ref(), path.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("236 tensors"));
    assert_eq!(text.lines().filter(|l| l.contains(".weight")).count(), 236);
}
