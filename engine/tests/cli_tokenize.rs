//! `flint tokenize` end to end: every line of `shared/golden/gemma3-270m/tokenize.jsonl`
//! through the binary, with the model found by the default-model mechanism (no `-m`, no
//! `FLINT_MODEL`: the cache, fetched when fresh).

use std::path::PathBuf;
use std::process::Command;

fn golden_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_SHARED") {
        return PathBuf::from(p).join("golden/gemma3-270m/tokenize.jsonl");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/gemma3-270m/tokenize.jsonl")
}

fn flint(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(args)
        .env_remove("FLINT_MODEL")
        .output()
        .expect("run flint");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_tokenize_reproduces_golden() {
    let p = golden_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\n(the project's contracts live in `shared/` beside the repository; \
             set FLINT_SHARED to its path when the checkout is elsewhere)",
            p.display()
        )
    });
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let input = v["text"].as_str().expect("text");
        let want: Vec<u64> = v["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect();
        let (code, stdout, stderr) = flint(&["tokenize", "--json", "--", input]);
        assert_eq!(code, 0, "{input:?}: {stderr}");
        let got: Vec<u64> = serde_json::from_str(stdout.trim()).expect("json output");
        assert_eq!(got, want, "{input:?}");
        n += 1;
    }
    assert_eq!(n, 30);
}

#[test]
fn cli_tokenize_plain_and_bos() {
    let (code, stdout, stderr) = flint(&["tokenize", "Hello world", "--bos"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "2 9259 1902");
    let (code, stdout, _) = flint(&["tokenize", "Hello world"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), "9259 1902");
}

#[test]
fn cli_tokenize_missing_model_is_exit_1() {
    let (code, stdout, stderr) = flint(&["tokenize", "-m", "/nonexistent/model.gguf", "x"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("/nonexistent/model.gguf"), "{stderr}");
}
