//! `flint bench --concurrency`: the curve `shared/spec/CLI.md` promises, on the tiny
//! synthetic checkpoint (correctness of the shape and the counts; no speed is judged).

use std::process::Command;

fn flint() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flint"))
}

#[test]
fn bench_concurrency_curve_has_every_level() {
    let d = std::env::temp_dir().join(format!("flint-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let model = d.join("tiny.gguf");
    let out = flint()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(&model)
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = |json: bool| {
        let mut c = flint();
        c.args(["bench", "--decode-tokens", "3", "--aggregate-tokens", "3"])
            .args(["--concurrency", "1,4,16", "-m"])
            .arg(&model)
            .env("FLINT_DEVICE", "cpu");
        if json {
            c.arg("--json");
        }
        let out = c.output().expect("flint runs");
        assert!(
            out.status.success(),
            "bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let line = run(true)
        .lines()
        .find(|l| l.starts_with('{'))
        .map(str::to_owned)
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("json");
    // The keys of the run without the flag are all there.
    for key in ["prefill", "decode", "aggregate"] {
        assert!(v.get(key).is_some(), "no {key}: {v}");
    }
    assert_eq!(v["aggregate"]["concurrency"], 4);
    let curve = v["curve"].as_array().expect("a curve");
    let levels: Vec<u64> = curve
        .iter()
        .map(|l| l["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, [1, 4, 16]);
    for l in curve {
        assert_eq!(l["requests"], l["concurrency"]);
        assert_eq!(l["generated"], 3);
        for k in ["decode_tok_s", "tpot_ms", "output_tok_s", "wall_s"] {
            let x = l[k].as_f64().unwrap_or_else(|| panic!("{k}: {l}"));
            assert!(x.is_finite() && x > 0.0, "{k} = {x}: {l}");
        }
    }
    assert!((curve[0]["decode_speedup_vs_c1"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    // The table names each level.
    let table = run(false);
    for c in ["c=1 ", "c=4 ", "c=16"] {
        assert!(table.contains(&format!("curve      {c}")), "{table}");
    }
    let _ = std::fs::remove_dir_all(&d);
}
