//! The real-weights gate on Gemma 3 270M Q4_K_M (the default model) against llama.cpp's
//! outputs in `shared/golden/gemma3-270m`:
//! - every greedy chain of `greedy.jsonl` replays token for token, or first diverges at a
//!   step whose llama.cpp margin is below 0.25 nats (device forward, cpu); the reference
//!   forward replays them all exactly;
//! - teacher-forced over `logits-top20.json`: top-1 agreement >= 98% and mean KL
//!   (estimated from llama.cpp's top 20) <= 0.01, on both forwards: the reference
//!   (`gemma_top1_gate_98_percent`) and the device forward on cpu
//!   (`gemma_top1_gate_98_percent_on_device`). Both follow llama.cpp's CPU arithmetic
//!   (docs/parity.md; on the device, the AVX-512 VNNI kernels) and measure 100% / KL 0.

mod golden_common;

use std::path::PathBuf;

use flint_engine::forward::reference::Reference;
use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::{load_model, Model};
use flint_engine::sample::argmax;
use golden_common::{greedy_chains, replay_greedy};
use serde_json::Value;

const NEAR_TIE: f64 = 0.25;

fn golden_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/gemma3-270m"
    ))
}

fn default_model() -> Model {
    let path = flint_loader::fetch::default_model_path()
        .expect("the default model (gemma-3-270m-q4_k_m.gguf) is needed by the real-weights gate");
    load_model(&path).expect("the default model loads")
}

fn on_cpu(model: &Model) -> DeviceModel {
    let dev = flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    DeviceModel::stage(model, dev, &mut |_, _| {}).expect("stages on cpu")
}

fn read_json(name: &str) -> String {
    let p = golden_dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn gemma_greedy_chains_replay_on_device() {
    let model = default_model();
    let dm = on_cpu(&model);
    let r = replay_greedy(&dm, &greedy_chains(), NEAR_TIE).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "greedy: {}/{} chains identical, the rest diverge at near-ties",
        r.identical, r.chains
    );
}

/// The reference forward replays every greedy chain of `greedy.jsonl` token for token
/// (llama.cpp produced them with the prompt as one batch asking for the last token's
/// logits, then one token per step),
/// following llama.cpp's arithmetic for a prompt batch (logits of its last token only)
/// and then one token per step (`Reference::set_prompt_batch`); prints the largest logit difference on llama.cpp's
/// top 5 over all steps.
#[test]
fn gemma_greedy_chains_replay_on_reference() {
    let model = default_model();
    let text = read_json("greedy.jsonl");
    let t0 = std::time::Instant::now();
    let mut worst = 0.0f64;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("golden line is JSON");
        let prompt = ids(&v["prompt_ids"]);
        let steps = v["steps"].as_array().expect("steps");
        let mut r = Reference::new(&model);
        r.set_prompt_batch(prompt.len());
        let mut logits = Vec::new();
        for &t in &prompt {
            logits = r.forward(t).expect("prefill");
        }
        for (i, step) in steps.iter().enumerate() {
            let want = step["id"].as_u64().expect("id") as u32;
            for p in step["top"].as_array().expect("top") {
                let (id, l) = (
                    p[0].as_u64().expect("id") as usize,
                    p[1].as_f64().expect("logit"),
                );
                worst = worst.max((logits[id] as f64 - l).abs());
            }
            let got = argmax(&logits) as u32;
            assert_eq!(
                got,
                want,
                "{:?}: step {i}: reference {got}, llama.cpp {want} (its margin {})",
                v["prompt"].as_str().unwrap_or("?"),
                step["margin"]
            );
            if i + 1 < steps.len() {
                logits = r.forward(got).expect("decode");
            }
        }
    }
    eprintln!(
        "reference: every greedy chain replays; max logit difference on llama.cpp's top 5: {worst:.2e} ({:.1}s)",
        t0.elapsed().as_secs_f64()
    );
}

/// The shared figures ([`golden_common::teacher_forced_figures`]) of one logits row
/// per position of the golden, with the rms logit difference printed.
fn teacher_forced_figures(rows: &[Vec<f32>], golden: &Value) -> (f64, f64, f64) {
    let positions = golden["positions"].as_array().expect("positions");
    assert_eq!(rows.len(), positions.len());
    let f = golden_common::teacher_forced_figures(golden, &|p| rows[p].as_slice());
    eprintln!(
        "rms logit difference on llama.cpp's top-20 (offset removed): {:.6} nats",
        f.rms
    );
    (f.top1, f.kl, f.rms)
}

/// The gate: top-1 agreement with llama.cpp over `logits-top20.json`.
const TOP1_GATE: f64 = 0.98;
/// A regression floor for the device forward on a CPU without the AVX-512 VNNI kernels,
/// whose Q4_K and Q6_K matmuls sum in their own order rather than llama.cpp's
/// (docs/parity.md) and agree on about 96% of the positions; with the VNNI kernels
/// `gemma_top1_gate_98_percent_on_device` holds the device to the gate itself.
const TOP1_FLOOR: f64 = 0.95;
/// The bound on the mean KL divergence (estimated from the top 20).
const KL_GATE: f64 = 0.01;
/// The reference forward follows llama.cpp's CPU arithmetic operation for operation
/// (docs/parity.md), so its logits equal llama.cpp's up to the printing precision of the
/// golden file (0.000000 nats rms). A step away from that parity shows here
/// long before it moves the top-1 figure.
const PARITY_RMS: f64 = 1e-3;

fn device_figures() -> (f64, f64) {
    let model = default_model();
    let dm = on_cpu(&model);
    let golden: Value = serde_json::from_str(&read_json("logits-top20.json")).expect("JSON");
    let toks = ids(&golden["ids"]);
    let mut s = Session::new(&dm, toks.len()).expect("session");
    let all = s.feed(&toks, true).expect("teacher-forced forward");
    let rows: Vec<Vec<f32>> = all.chunks(model.spec.vocab).map(<[f32]>::to_vec).collect();
    let (top1, kl, _) = teacher_forced_figures(&rows, &golden);
    eprintln!(
        "device (cpu): top-1 agreement {:.2}% over {} positions (gate {:.0}%: {}), mean KL {kl:.5}",
        top1 * 100.0,
        rows.len(),
        TOP1_GATE * 100.0,
        if top1 >= TOP1_GATE { "met" } else { "NOT met" }
    );
    (top1, kl)
}

/// The device forward's gate. Its parity with llama.cpp comes from the AVX-512 VNNI
/// kernels (docs/parity.md); on a CPU without them the kernels sum in other orders, so
/// there only a regression floor is asserted (loudly).
#[test]
fn gemma_top1_gate_98_percent_on_device() {
    let (top1, kl) = device_figures();
    assert!(kl <= KL_GATE, "mean KL {kl} > {KL_GATE}");
    if flint_hal_cpu::SimdLevel::detect() >= flint_hal_cpu::SimdLevel::Avx512Vnni {
        assert!(top1 >= TOP1_GATE, "top-1 agreement {top1} < {TOP1_GATE}");
    } else {
        eprintln!(
            "!!! this CPU has no AVX-512 VNNI: the device forward does not follow llama.cpp's \
             order here; only the floor {TOP1_FLOOR} is checked"
        );
        assert!(
            top1 >= TOP1_FLOOR,
            "top-1 agreement {top1} fell below the floor {TOP1_FLOOR}"
        );
    }
}

/// The CI gate: the reference forward, teacher-forced over the golden paragraph as one
/// llama.cpp batch, against llama.cpp's logits: top-1 agreement >= 98%, mean KL <= 0.01,
/// and logits equal to llama.cpp's (rms difference below [`PARITY_RMS`]).
#[test]
fn gemma_top1_gate_98_percent() {
    let model = default_model();
    let golden: Value = serde_json::from_str(&read_json("logits-top20.json")).expect("JSON");
    let toks = ids(&golden["ids"]);
    let t0 = std::time::Instant::now();
    let mut r = Reference::new(&model);
    r.set_batch_len(toks.len());
    let rows: Vec<Vec<f32>> = toks
        .iter()
        .map(|&t| r.forward(t).expect("reference forward"))
        .collect();
    let (top1, kl, rms) = teacher_forced_figures(&rows, &golden);
    eprintln!(
        "reference: top-1 agreement {:.2}% over {} positions (gate {:.0}%: {}), mean KL {kl:.5} ({:.1}s)",
        top1 * 100.0,
        rows.len(),
        TOP1_GATE * 100.0,
        if top1 >= TOP1_GATE { "met" } else { "NOT met" },
        t0.elapsed().as_secs_f64()
    );
    assert!(kl <= KL_GATE, "mean KL {kl} > {KL_GATE}");
    assert!(top1 >= TOP1_GATE, "top-1 agreement {top1} < {TOP1_GATE}");
    assert!(
        rms < PARITY_RMS,
        "the reference's logits left llama.cpp's: rms difference {rms} nats on its top 20"
    );
}
