//! `flint run -p "The capital of France is" -n 16 --temperature 0` on the default model
//! prints llama.cpp's greedy text, or departs from it only at a near-tie (judged by the
//! margins llama.cpp measured, `shared/golden/gemma3-270m/greedy.jsonl`).

use std::process::Command;

#[test]
fn flint_run_prints_llama_cpp_greedy_text() {
    let golden = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/gemma3-270m/greedy.jsonl"
    ))
    .expect("golden greedy.jsonl");
    let prompt = "The capital of France is";
    let v: serde_json::Value = golden
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line"))
        .find(|v| v["prompt"] == prompt)
        .expect("the prompt is in the golden file");
    let steps = &v["steps"].as_array().expect("steps")[..16];
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args([
            "run",
            "-p",
            prompt,
            "-n",
            "16",
            "--temperature",
            "0",
            "--device",
            "cpu",
        ])
        .env_remove("FLINT_MODEL")
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    eprintln!("flint: {text:?}");
    let mut prefix = String::new();
    for (i, s) in steps.iter().enumerate() {
        let piece = s["piece"].as_str().expect("piece");
        let next = format!("{prefix}{piece}");
        if !text.starts_with(&next) {
            let margin = s["margin"].as_f64().expect("margin");
            eprintln!("departs at step {i} (llama.cpp margin {margin})");
            assert!(
                margin < 0.25,
                "departs from llama.cpp at step {i} where its margin is {margin}"
            );
            return;
        }
        prefix = next;
    }
    assert_eq!(text, prefix, "same 16 tokens but extra text");
}
