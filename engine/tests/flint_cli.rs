//! The `flint run` / `synth` / `logits` / `perplexity` commands on the tiny checkpoint,
//! and the device selection error.

use std::process::Command;

fn flint() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flint"))
}

fn tiny_file(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("tiny.gguf");
    let out = flint()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(&p)
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "synth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    p
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("flint-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn unknown_device_exits_1_and_lists_devices() {
    let out = flint()
        .args(["run", "-p", "hello", "-n", "1"])
        .env("FLINT_DEVICE", "nonsense")
        .env("FLINT_MODEL", "/nonexistent/model.gguf")
        .output()
        .expect("flint runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nonsense") && err.contains("cpu"),
        "stderr: {err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn synth_is_deterministic() {
    let d = tmpdir("synth");
    let a = tiny_file(&d);
    let b = d.join("tiny2.gguf");
    let out = flint()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(&b)
        .output()
        .expect("flint runs");
    assert!(out.status.success());
    assert_eq!(
        std::fs::read(&a).expect("test value"),
        std::fs::read(&b).expect("test value")
    );
    let c = d.join("tiny3.gguf");
    let out = flint()
        .args(["synth", "--preset", "tiny", "--seed", "1", "--out"])
        .arg(&c)
        .output()
        .expect("flint runs");
    assert!(out.status.success());
    assert_ne!(
        std::fs::read(&a).expect("test value"),
        std::fs::read(&c).expect("test value")
    );
    let out = flint()
        .args(["synth", "--preset", "huge", "--out"])
        .arg(d.join("x.gguf"))
        .output()
        .expect("flint runs");
    assert_eq!(out.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn run_streams_text_and_stats_on_tiny() {
    let d = tmpdir("run");
    let m = tiny_file(&d);
    let run = |extra: &[&str]| {
        let out = flint()
            .arg("run")
            .arg("-m")
            .arg(&m)
            .args(["-p", "Once upon a time", "-n", "12"])
            .args(extra)
            .output()
            .expect("flint runs");
        assert!(
            out.status.success(),
            "run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (g1, err) = run(&["--temperature", "0"]);
    let (g2, _) = run(&["--temperature", "0"]);
    assert_eq!(g1, g2, "greedy is deterministic");
    assert!(!g1.trim().is_empty());
    assert!(
        err.contains("tok/s") && err.contains("load"),
        "stats line: {err}"
    );
    let (s1, _) = run(&["--temperature", "1.0", "--seed", "5"]);
    let (s2, _) = run(&["--temperature", "1.0", "--seed", "5"]);
    assert_eq!(s1, s2, "seeded sampling is reproducible");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn logits_and_perplexity_on_tiny() {
    let d = tmpdir("logits");
    let m = tiny_file(&d);
    let text = d.join("t.txt");
    std::fs::write(&text, "The capital of France is Paris. ".repeat(8)).expect("test value");
    let out = flint()
        .arg("logits")
        .arg("-m")
        .arg(&m)
        .arg("--text-file")
        .arg(&text)
        .args(["--top", "5", "--json"])
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let n = v["ids"].as_array().expect("test value").len();
    assert_eq!(v["positions"].as_array().expect("test value").len(), n);
    assert_eq!(
        v["positions"][0]["top"]
            .as_array()
            .expect("test value")
            .len(),
        5
    );
    // One chunk per batch, and four chunks as sequences of one batch: the same figure.
    let ppl = |batch: &str| -> (String, String) {
        let out = flint()
            .arg("perplexity")
            .arg("-m")
            .arg(&m)
            .arg("-f")
            .arg(&text)
            .args(["--ctx", "16", "--batch", batch])
            .output()
            .expect("flint runs");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), err)
    };
    let (one, _) = ppl("16");
    let (four, err) = ppl("64");
    assert!(err.contains("4 per batch"), "{err}");
    let p: f64 = one.parse().expect("a number");
    assert!(p.is_finite() && p > 1.0, "perplexity {p}");
    assert_eq!(one, four, "batching chunks changes the perplexity");
    let _ = std::fs::remove_dir_all(&d);
}

/// `FLINT_LOAD`: the mapped and the copied file give the same tokens; a value that is
/// none of the modes is refused with a message naming the variable.
#[test]
fn load_modes_agree_and_a_bad_mode_is_refused() {
    let d = tmpdir("load-mode");
    let m = tiny_file(&d);
    let run = |mode: &str| {
        flint()
            .arg("run")
            .arg("-m")
            .arg(&m)
            .args(["-p", "Once upon a time", "-n", "12", "--temperature", "0"])
            .env("FLINT_LOAD", mode)
            .output()
            .expect("flint runs")
    };
    let mapped = run("map");
    let copied = run("copy");
    assert!(mapped.status.success() && copied.status.success());
    assert!(!mapped.stdout.is_empty());
    assert_eq!(mapped.stdout, copied.stdout, "map and copy differ");
    let bad = run("sometimes");
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("FLINT_LOAD") && err.contains("sometimes"),
        "stderr: {err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `flint bench --depth`: the prefill and decode tests continue a context that the
/// prefix cache holds (the bench fails when the measured requests do not find it there).
#[test]
fn bench_at_depth_continues_a_cached_context() {
    let d = tmpdir("bench-depth");
    let model = tiny_file(&d);
    let out = flint()
        .args(["bench", "--json", "--depth", "100"])
        .args(["--decode-tokens", "3", "--aggregate-tokens", "1", "-m"])
        .arg(&model)
        .env("FLINT_DEVICE", "cpu")
        .output()
        .expect("flint runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    let v = bench_json(&out.stdout);
    assert_eq!(v["depth"], 100, "{v}");
    assert!(
        v["decode"]["tok_s"].as_f64().is_some_and(|x| x > 0.0),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `flint bench --json` on the tiny checkpoint: the keys `shared/spec/CLI.md` promises,
/// with the counts the flags asked for and positive rates.
#[test]
fn bench_json_has_the_spec_keys_on_tiny() {
    let d = tmpdir("bench");
    let model = tiny_file(&d);
    let out = flint()
        .args([
            "bench",
            "--json",
            "--decode-tokens",
            "5",
            "--aggregate-tokens",
            "3",
            "-m",
        ])
        .arg(&model)
        .env("FLINT_DEVICE", "cpu")
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = bench_json(&out.stdout);
    for key in ["model", "device", "threads"] {
        assert!(v.get(key).is_some(), "no {key}: {v}");
    }
    let num = |path: &[&str]| {
        let mut x = &v;
        for p in path {
            x = x.get(*p).unwrap_or_else(|| panic!("no {path:?}: {v}"));
        }
        x.as_f64()
            .unwrap_or_else(|| panic!("{path:?} is not a number: {v}"))
    };
    assert_eq!(num(&["prefill", "prompt_tokens"]), 512.0);
    assert_eq!(num(&["decode", "prompt_tokens"]), 8.0);
    assert_eq!(num(&["decode", "generated"]), 5.0);
    assert_eq!(num(&["aggregate", "requests"]), 8.0);
    assert_eq!(num(&["aggregate", "concurrency"]), 4.0);
    assert_eq!(num(&["aggregate", "prompt_tokens"]), 128.0);
    assert_eq!(num(&["aggregate", "generated"]), 3.0);
    for path in [
        &["prefill", "tok_s"][..],
        &["decode", "tok_s"],
        &["decode", "tpot_ms"],
        &["aggregate", "output_tok_s"],
        &["aggregate", "decode_tok_s"],
        &["aggregate", "wall_s"],
    ] {
        let x = num(path);
        assert!(x.is_finite() && x > 0.0, "{path:?} = {x}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// `flint devices` opens the selected backend as a run would: its description (for cpu,
/// the weight layout in use and why) on its own line, and a setting it refuses
/// (`FLINT_CPU_REPACK=x`) shown as the reason it is unavailable; one line per backend.
#[test]
fn devices_describes_the_selected_backend_and_its_refusals() {
    let lines = |repack: &str| devices_lines(&[("FLINT_CPU_REPACK", repack)]);
    for (repack, layout) in [("1", "16-row groups"), ("0", "file's layout")] {
        let l = lines(repack);
        let cpu = l.iter().find(|s| s.starts_with("* cpu")).expect("cpu line");
        assert!(
            cpu.contains("available    ") && cpu.contains("opened: host CPU"),
            "{cpu}"
        );
        if cpu.contains("avx512vnni") {
            assert!(cpu.contains(layout), "FLINT_CPU_REPACK={repack}: {cpu}");
        }
        assert!(l.iter().any(|s| s.contains(" ref ")), "{l:?}");
    }
    let l = lines("x");
    let cpu = l.iter().find(|s| s.starts_with("* cpu")).expect("cpu line");
    assert!(
        cpu.contains("unavailable") && cpu.contains("FLINT_CPU_REPACK=\"x\" is not 0, 1 or size"),
        "{cpu}"
    );
}

/// The lines `flint devices` prints with the cpu backend selected and `env` set.
fn devices_lines(env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = flint();
    cmd.arg("devices").env("FLINT_DEVICE", "cpu");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("flint runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `FLINT_CPU_AMX=1`: at the AVX-512 VNNI level the cpu line names llama.cpp's AMX
/// orders and the units they run on (AMX tiles where the process can run them, AVX-512
/// VNNI elsewhere); below it, and for a value other than 0 or 1, the backend is
/// unavailable with the reason.
#[test]
fn devices_names_the_amx_orders_and_their_units() {
    let cpu_line = |simd: Option<&str>, amx: &str| {
        let mut env = vec![("FLINT_CPU_AMX", amx)];
        env.extend(simd.map(|s| ("FLINT_CPU_SIMD", s)));
        devices_lines(&env)
            .into_iter()
            .find(|l| l.starts_with("* cpu"))
            .expect("cpu line")
    };
    if flint_hal_cpu::SimdLevel::detect() >= flint_hal_cpu::SimdLevel::Avx512Vnni {
        let cpu = cpu_line(None, "1");
        let units = if flint_hal_cpu::kernels::amx::available() {
            "on AMX tiles"
        } else {
            "on AVX-512 VNNI (this process cannot run AMX tiles)"
        };
        assert!(
            cpu.contains("available    ")
                && cpu.contains("in llama.cpp's AMX orders")
                && cpu.contains(units),
            "{cpu}"
        );
    }
    let cpu = cpu_line(Some("avx2"), "1");
    assert!(
        cpu.contains("unavailable")
            && cpu.contains("FLINT_CPU_AMX=1 needs the avx512vnni SIMD level"),
        "{cpu}"
    );
    let cpu = cpu_line(None, "2");
    assert!(
        cpu.contains("unavailable") && cpu.contains("FLINT_CPU_AMX=\"2\" is not 0 or 1"),
        "{cpu}"
    );
}

/// The JSON line `flint bench --json` printed to `stdout`.
fn bench_json(stdout: &[u8]) -> serde_json::Value {
    let line = String::from_utf8_lossy(stdout)
        .lines()
        .find(|l| l.starts_with('{'))
        .map(str::to_owned)
        .expect("a JSON line");
    serde_json::from_str(&line).expect("json")
}

/// A reader that closes the pipe before `flint devices` writes (`flint devices | head -0`)
/// ends the command quietly: exit 0, no panic message. The read end is closed before
/// the child has started its output (opening the backends takes milliseconds); had the
/// child written first, its output would sit in the pipe buffer and the test pass
/// without the check.
#[test]
fn devices_into_a_closed_pipe_exits_quietly() {
    for json in [false, true] {
        let mut cmd = flint();
        cmd.arg("devices")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd.spawn().expect("spawn flint devices");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "flint devices (json {json}) into a closed pipe: {:?}, stderr: {stderr}",
            out.status
        );
    }
}
