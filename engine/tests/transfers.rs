//! Host-device traffic of a decode step (the device interface's transfer counters): on
//! every device the step uploads its index lists once (one packed index tensor: token,
//! positions, slot mappings, block tables) and downloads its logits row, and nothing
//! else crosses, whatever the layer count: no tensor, and no per-op host argument
//! (`arg_bytes`). On `tt` (the simulated adapter) the activations and the index lists
//! stay in device buffers.

mod tt_common;

use std::sync::Arc;

use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::load_model;
use flint_engine::synth::dense::{synth_dense, DenseRecipe, Family, VocabSource};
use flint_hal::{DeviceOptions, DeviceRef, Transfers};
use flint_hal_tt::TtDevice;

/// A Gemma 3 `tiny` file (f32 weights or the quantized mix) with `n_layers` layers.
fn gemma3(dir: &std::path::Path, n_layers: usize, quantized: bool) -> std::path::PathBuf {
    let mut r = DenseRecipe::of(Family::Gemma3, "tiny").expect("gemma3 tiny");
    r.n_layers = n_layers;
    r.quantized = quantized;
    let (w, _) = synth_dense(&r, 7, VocabSource::Builtin, &|_, _| {}).expect("synth");
    let path = dir.join(format!("gemma3-{n_layers}-{quantized}.gguf"));
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

fn check(name: &str, open: &dyn Fn() -> DeviceRef, quantized: bool) {
    let dir = std::env::temp_dir().join(format!("flint-transfers-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut per_layers = Vec::new();
    for n_layers in [2, 5] {
        let (steps, vocab) = decode_traffic(&gemma3(&dir, n_layers, quantized), open(), 3);
        for t in &steps {
            // The step's index lists: one upload of a few indices (one token, its
            // position twice, a slot and a one-block table per KV group). The logits
            // row of the sampled token: one download. No per-op arguments.
            assert_eq!(
                (t.uploads, t.downloads, t.download_bytes, t.arg_bytes),
                (1, 1, 4 * vocab as u64, 0),
                "{name}, {n_layers} layers: a decode step moved {t:?}"
            );
            assert!(
                (12..=64).contains(&t.upload_bytes),
                "{name}, {n_layers} layers: the index upload of a decode step is {} bytes",
                t.upload_bytes
            );
        }
        eprintln!(
            "{name} ({}), {n_layers} layers: per decode step {} copies, {} bytes, {} bytes of op arguments",
            if quantized { "quantized" } else { "f32" },
            steps[0].calls(),
            steps[0].bytes(),
            steps[0].arg_bytes
        );
        per_layers.push(steps[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (
            per_layers[0].calls(),
            per_layers[0].bytes(),
            per_layers[0].arg_bytes
        ),
        (
            per_layers[1].calls(),
            per_layers[1].bytes(),
            per_layers[1].arg_bytes
        ),
        "{name}: the traffic of a decode step follows the layer count"
    );
}

#[test]
fn cpu_decode_step_moves_its_indices_and_logits_only() {
    let open = || flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    check("cpu", &open, false);
    check("cpu", &open, true);
}

#[test]
fn ref_decode_step_moves_its_indices_and_logits_only() {
    let open = || flint_engine::model::devices::open(Some("ref")).expect("ref device opens");
    check("ref", &open, false);
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
}
