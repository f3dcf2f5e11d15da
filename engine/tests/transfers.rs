//! Host-device traffic of a decode step (the device interface's transfer counters): on
//! every device the step uploads its index lists once (one packed index tensor: token,
//! positions, slot mappings, block tables) and downloads its logits row, and nothing
//! else crosses, whatever the layer count: no tensor, and no per-op host argument
//! (`arg_bytes`). On `tt` (the simulated adapter) the activations, the index lists and
//! the MoE layers' routing (the chosen experts and their weights) stay in device buffers.

mod tt_common;

use std::sync::Arc;

use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::load_model;
use flint_engine::synth::dense::{synth_dense, DenseRecipe, Family, VocabSource};
use flint_engine::synth::gemma4::{synth_gemma4, Gemma4Recipe};
use flint_engine::synth::moe::{synth_moe, MoeFamily, MoeRecipe};
use flint_engine::synth::qwen35moe::{synth_qwen35moe, Qwen35MoeRecipe};
use flint_hal::{DeviceOptions, DeviceRef, Transfers};
use flint_hal_tt::TtDevice;

/// A `tiny` file of dense `family` (f32 weights or the quantized mix) with `n_layers`
/// layers.
fn dense(family: Family) -> impl Fn(&std::path::Path, usize, bool) -> std::path::PathBuf {
    move |dir, n_layers, quantized| {
        let mut r = DenseRecipe::of(family, "tiny").expect("tiny preset");
        r.n_layers = n_layers;
        r.quantized = quantized;
        let (w, _) = synth_dense(&r, 7, VocabSource::Builtin, &|_, _| {}).expect("synth");
        let path = dir.join(format!("{}-{n_layers}-{quantized}.gguf", family.arch()));
        std::fs::write(&path, w.to_bytes()).expect("write");
        path
    }
}

/// A `tiny` file of MoE `family` (f32 weights or the quantized mix) with `n_layers`
/// trunk layers.
fn moe(family: MoeFamily) -> impl Fn(&std::path::Path, usize, bool) -> std::path::PathBuf {
    move |dir, n_layers, quantized| {
        let mut r = MoeRecipe::of(family, "tiny").expect("tiny preset");
        r.n_layers = n_layers;
        r.quantized = quantized;
        let (w, _) = synth_moe(&r, 7, VocabSource::Builtin, &|_, _| {}).expect("synth");
        let path = dir.join(format!("{}-{n_layers}-{quantized}.gguf", family.arch()));
        std::fs::write(&path, w.to_bytes()).expect("write");
        path
    }
}

/// Gemma 4's MoE `tiny` (its expert scale and the dense branch beside the experts), with
/// the preset's layers (`n_layers` is the preset's count, not varied).
fn gemma4(dir: &std::path::Path, _n_layers: usize, quantized: bool) -> std::path::PathBuf {
    let mut r = Gemma4Recipe::of("tiny").expect("tiny preset");
    r.quantized = quantized;
    let (w, _) = synth_gemma4(&r, 7, VocabSource::Builtin, &|_, _| {}).expect("synth");
    let path = dir.join(format!("gemma4-{quantized}.gguf"));
    std::fs::write(&path, w.to_bytes()).expect("write");
    path
}

/// Qwen 3.5 MoE `tiny` (Gated DeltaNet layers and their states, the gated attention, the
/// shared expert's gate) with `n_layers` layers.
fn qwen35moe(dir: &std::path::Path, n_layers: usize, quantized: bool) -> std::path::PathBuf {
    let mut r = Qwen35MoeRecipe::of("tiny").expect("tiny preset");
    r.n_layers = n_layers;
    r.quantized = quantized;
    let (w, _) = synth_qwen35moe(&r, 7, VocabSource::Builtin, &|_, _| {}).expect("synth");
    let path = dir.join(format!("qwen35moe-{n_layers}-{quantized}.gguf"));
    std::fs::write(&path, w.to_bytes()).expect("write");
    path
}

/// The traffic of each of `steps` decode steps after an 8-token prompt, and the vocab.
fn decode_traffic(path: &std::path::Path, dev: DeviceRef, steps: usize) -> (Vec<Transfers>, usize) {
    let model = load_model(path).expect("load");
    let dm = DeviceModel::stage(&model, dev.clone(), &mut |_, _| {}).expect("stage");
    let vocab = dm.spec().vocab;
    let mut s = Session::new(&dm, 8 + steps + 1).expect("session");
    let prompt: Vec<u32> = (0..8).map(|i| 10 + i as u32).collect();
    s.feed(&prompt, false).expect("prefill");
    let mut out = Vec::new();
    for i in 0..steps {
        let before = dev.transfers();
        s.feed(&[20 + i as u32], false).expect("decode");
        out.push(dev.transfers().since(&before));
    }
    (out, vocab)
}

/// A file maker: `(dir, n_layers, quantized) -> path`.
type Maker<'a> = &'a dyn Fn(&std::path::Path, usize, bool) -> std::path::PathBuf;

fn check(name: &str, open: &dyn Fn() -> DeviceRef, quantized: bool) {
    check_family(
        name,
        open,
        quantized,
        "gemma3",
        &dense(Family::Gemma3),
        &[2, 5],
    );
    // Llama 3's RoPE frequency factors, a tensor of the device like the norm weights.
    check_family(
        name,
        open,
        quantized,
        "llama",
        &dense(Family::Llama),
        &[2, 5],
    );
}

/// The traffic of a decode step of the files `make` writes with each of `layer_counts`
/// layers: the index upload and the logits download, nothing else, the same for every
/// layer count.
fn check_family(
    name: &str,
    open: &dyn Fn() -> DeviceRef,
    quantized: bool,
    family: &str,
    make: Maker<'_>,
    layer_counts: &[usize],
) {
    let dir = std::env::temp_dir().join(format!(
        "flint-transfers-{name}-{family}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut per_layers = Vec::new();
    for &n_layers in layer_counts {
        let (steps, vocab) = decode_traffic(&make(&dir, n_layers, quantized), open(), 3);
        for t in &steps {
            // The step's index lists: one upload of a few indices (one token, its
            // position twice, a slot and a one-block table per KV group). The logits
            // row of the sampled token: one download. No per-op arguments.
            assert_eq!(
                (t.uploads, t.downloads, t.download_bytes, t.arg_bytes),
                (1, 1, 4 * vocab as u64, 0),
                "{name}, {family}, {n_layers} layers: a decode step moved {t:?}"
            );
            assert!(
                (12..=64).contains(&t.upload_bytes),
                "{name}, {family}, {n_layers} layers: the index upload of a decode step is {} bytes",
                t.upload_bytes
            );
        }
        eprintln!(
            "{name} {family} ({}), {n_layers} layers: per decode step {} copies, {} bytes, {} bytes of op arguments",
            if quantized { "quantized" } else { "f32" },
            steps[0].calls(),
            steps[0].bytes(),
            steps[0].arg_bytes
        );
        per_layers.push(steps[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let last = per_layers.len() - 1;
    assert_eq!(
        (
            per_layers[0].calls(),
            per_layers[0].bytes(),
            per_layers[0].arg_bytes
        ),
        (
            per_layers[last].calls(),
            per_layers[last].bytes(),
            per_layers[last].arg_bytes
        ),
        "{name}, {family}: the traffic of a decode step follows the layer count"
    );
}

/// The MoE families a device runs: routing, expert matmuls, biases and the combine on
/// the device's tensors, nothing of them crossing to the host.
fn check_moe(name: &str, open: &dyn Fn() -> DeviceRef, quantized: bool, gpt_oss: bool) {
    for family in [MoeFamily::Qwen3Moe, MoeFamily::Glm4Moe, MoeFamily::Mimo2] {
        check_family(name, open, quantized, family.arch(), &moe(family), &[2, 4]);
    }
    if gpt_oss {
        let make = moe(MoeFamily::GptOss);
        check_family(name, open, quantized, "gpt-oss", &make, &[2, 4]);
    }
    let layers = Gemma4Recipe::of("tiny").expect("tiny preset").pattern.len();
    check_family(name, open, quantized, "gemma4", &gemma4, &[layers]);
    // Two and three periods of three Gated DeltaNet layers and a full-attention one.
    check_family(name, open, quantized, "qwen35moe", &qwen35moe, &[8, 12]);
}

#[test]
fn cpu_decode_step_moves_its_indices_and_logits_only() {
    let open = || flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    check("cpu", &open, false);
    check("cpu", &open, true);
    check_moe("cpu", &open, true, true);
}

#[test]
fn ref_decode_step_moves_its_indices_and_logits_only() {
    let open = || flint_engine::model::devices::open(Some("ref")).expect("ref device opens");
    check("ref", &open, false);
    check_moe("ref", &open, false, true);
}

#[test]
fn tt_decode_step_keeps_activations_on_the_device() {
    let Some(lib) = tt_common::sim_library() else {
        return;
    };
    let open = || -> DeviceRef {
        let opts = DeviceOptions {
            keep_quant: true,
            ..DeviceOptions::default()
        };
        Arc::new(TtDevice::open_path(&lib, &opts).expect("the simulated tt device opens"))
    };
    check("tt", &open, false);
    check("tt", &open, true);
    // gpt-oss's clamped SwiGLU is not in tt's ABI: it cannot run there.
    check_moe("tt", &open, false, false);
    check_moe("tt", &open, true, false);
}
