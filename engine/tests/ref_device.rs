//! The engine on the reference backend (`ref`, `flint-hal-ref`): `flint run` gives the
//! cpu device's greedy tokens on an f32 file, whether `ref` is chosen by `--device` or by
//! `FLINT_DEVICE`; and on the quantized Flint `tiny` checkpoint (MoE, sinks, sliding
//! windows) its device forward follows the reference forward's greedy chain under the
//! near-tie rule.

mod flint_common;
use flint_common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

use flint_engine::forward::DeviceModel;

fn flint() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flint"));
    c.env_remove("FLINT_DEVICE");
    c
}

/// A tiny llama-family checkpoint with every tensor in F32.
fn f32_file(dir: &Path) -> PathBuf {
    let p = dir.join("llama-tiny-f32.gguf");
    let out = flint()
        .args([
            "synth", "--arch", "llama", "--preset", "tiny", "--seed", "3", "--out",
        ])
        .arg(&p)
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "synth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = flint().arg("inspect").arg(&p).output().expect("flint runs");
    let listing = String::from_utf8_lossy(&out.stdout);
    for q in ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "F16", "BF16"] {
        assert!(
            !listing.contains(q),
            "the tiny llama preset is no longer all F32 ({q}):\n{listing}"
        );
    }
    p
}

/// `flint run` greedy on `model`: (stdout, stderr).
fn greedy(model: &Path, device: Option<&str>, env_device: Option<&str>) -> (Vec<u8>, String) {
    let mut c = flint();
    c.arg("run")
        .arg("-m")
        .arg(model)
        .args(["-p", "Once upon a time there was", "-n", "24"])
        .args(["--temperature", "0"]);
    if let Some(d) = device {
        c.args(["--device", d]);
    }
    if let Some(d) = env_device {
        c.env("FLINT_DEVICE", d);
    }
    let out = c.output().expect("flint runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "run failed: {err}");
    (out.stdout, err)
}

#[test]
fn flint_run_on_ref_gives_the_cpu_greedy_tokens_on_an_f32_file() {
    let dir = std::env::temp_dir().join(format!("flint-ref-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = f32_file(&dir);
    let (cpu, cpu_err) = greedy(&model, Some("cpu"), None);
    assert!(cpu_err.contains("device cpu"), "{cpu_err}");
    assert!(!cpu.is_empty(), "cpu generated nothing");
    for (flag, env) in [(Some("ref"), None), (None, Some("ref"))] {
        let (got, err) = greedy(&model, flag, env);
        assert!(err.contains("device ref"), "not run on ref: {err}");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&cpu),
            "ref (--device {flag:?}, FLINT_DEVICE {env:?}) and cpu generate different text"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ref_device_forward_follows_the_reference_on_the_quantized_tiny() {
    let model = tiny();
    let dev = flint_engine::model::devices::open(Some("ref")).expect("ref device opens");
    let dm = DeviceModel::stage(&model, dev, &mut |_, _| {}).expect("stages on ref");
    let vocab = model.spec.vocab;
    // Longer than the sliding window (8): sliding layers drop keys.
    let p = prompt(4, 14, vocab);
    let (r, margins) = reference_chain(&model, &p, 24);
    let d = device_chain(&dm, &p, 24);
    check_chain("ref", &r, &margins, &d, 0.25);
    // The quantized matrices were computed from their blocks, the norms' F32 vectors
    // never through a matmul: the counters say which path the matmuls took.
    let c = dm.device().counters();
    assert!(c.block_dispatches > 0, "{c:?}");
}
