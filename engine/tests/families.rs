//! Every dense and mixture-of-experts family against llama.cpp, on synthetic files of
//! each architecture
//! (`engine/tests/data/families/CASE`, made by `tools/golden/dense_goldens.sh`; see
//! `tools/golden/README.md`):
//! - **files**: the f32 file is synthesised here, once per test binary, with the
//!   manifest's `flint synth` command (through `flint_engine::synth`) and the manifest's
//!   vocabulary (llama.cpp's `ggml-vocab-*.gguf` from its sdist, `FLINT_LLAMACPP_SRC`;
//!   the default model for Gemma 3), and its sha256 must be the manifest's: otherwise
//!   synth changed and the goldens must be regenerated. The committed Q8_0 / Q4_K_M files
//!   (llama.cpp's `llama-quantize`) are checked against their sha256 too;
//! - **per case and file type** (f32, Q8_0, Q4_K_M; gemma3-tiny-27b f32 only; the MoE
//!   variants with NextN layers or biases f32 and Q4_K_M): the 2,048 golden ids
//!   teacher-forced in one `Session::feed` on the cpu device, compared at llama.cpp's
//!   positions (every 8th): top-1 agreement >= 99% and mean KL over llama.cpp's top 20
//!   <= 1e-3 (`golden_common::teacher_forced_figures`, the formula of the Gemma 3 270M
//!   gate), where the device computes in llama.cpp's float order
//!   ([`device_follows_llamacpp`]: the K-quants only with the AVX-512 VNNI kernels, and
//!   not yet the MoE expert towers in K-quants); elsewhere the reference forward meets
//!   those targets on the first [`REFERENCE_IDS`] ids and the device
//!   [`DEVICE_SANITY_TOP1`];
//! - **greedy chains** (prefixes of 8, 32, 128 ids, 32 steps): on the dense families
//!   every chain generated on the device gives llama.cpp's ids, or first leaves them at a
//!   step where llama.cpp's margin is below [`NEAR_TIE`] (f32) or [`NEAR_TIE_DEVICE`]
//!   (Q8_0, Q4_K_M), and so do the MoE files whose orders the device follows (the
//!   others' device chains are printed: see [`compare`]); the reference forward, which
//!   follows llama.cpp's short-batch and decode arithmetic, replays them within
//!   [`NEAR_TIE`] on the quantized files and on every MoE file;
//! - **each feature is needed**: the same comparison with one feature dropped from the
//!   assembled model (rope_freqs, linear RoPE scaling, q/k/v biases, QK norms, the untied
//!   output, the 27B query scale, the sliding window) misses the targets;
//! - **split files**: llama-tiny's Q8_0 in 4 shards (`llama-gguf-split`), opened from
//!   its first shard, gives the single file's logits bit for bit;
//! - the reference forward meets the same targets on llama-tiny f32 (its first 512 ids);
//! - **llama.cpp's AMX build** (`tools/golden/amx_goldens.sh`): on the Q8_0 and Q4_K_M
//!   files of llama-tiny, gemma3-tiny and qwen3-tiny, the device with the AMX path
//!   (`FLINT_CPU_AMX=1`'s) gives that build's teacher-forced and greedy logits to
//!   [`DECODE_LOGIT_DIFF`] ([`compare_amx`]; where the process can run AMX).

mod common;
mod golden_common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flint_core::math::GgmlCpuBuild;
use flint_engine::forward::reference::Reference;
use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::{load_model, model_from_gguf, Model};
use flint_engine::synth::dense::{synth_dense, DenseRecipe, Family, VocabSource};
use flint_engine::synth::gemma4::{synth_gemma4, Gemma4Recipe};
use flint_engine::synth::moe::{synth_moe, MoeFamily, MoeRecipe};
use flint_engine::synth::qwen35moe::{synth_qwen35moe, Qwen35MoeRecipe};
use flint_loader::gguf::GgufFile;
use golden_common::{
    chains_from_jsonl, replay_greedy, replay_greedy_on, teacher_forced_figures, Figures,
    OnReference,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The targets of issue 25: top-1 agreement with llama.cpp, and mean KL over its top 20.
const TOP1_TARGET: f64 = 0.99;
const KL_TARGET: f64 = 1e-3;
/// On the reference forward, which follows llama.cpp's arithmetic for the prompt batch
/// and each decode step (`Reference::set_prompt_batch`), a greedy chain may first leave
/// llama.cpp's ids only where llama.cpp's own top-2 margin is below this (nats): a
/// near-tie that a last-bit difference decides. Measured: no chain leaves them, and on
/// every quantized file with an AVX-512-made golden its chain logits are llama.cpp's to
/// [`DECODE_LOGIT_DIFF`] (asserted).
/// The device forward on f32 files is held to it too.
const NEAR_TIE: f64 = 0.05;
/// The device forward keeps one matmul order per quantized type whatever the batch
/// (llama.cpp's order for a long batch), while llama.cpp switches the K-quant kernels for
/// short prompts and single rows (docs/parity.md); the device does follow llama.cpp's
/// switches for F32 matrices and for attention (the one-key-at-a-time path below 64
/// rows). On the K-quant files the device's prefill and decode logits differ from
/// llama.cpp's by up to 0.3 nats on its top 5 here (the reference, following llama.cpp
/// there, replays every chain to 1e-6; the Q8_0 files' to 1e-6 on the device as well,
/// [`DECODE_LOGIT_DIFF`]), so a chain may first leave
/// llama.cpp's ids where llama.cpp's margin is below this (largest measured: 0.38,
/// qwen3-tiny Q4_K_M).
const NEAR_TIE_DEVICE: f64 = 0.5;

/// The cases with a synthesised f32 file, in the order of [`F32`].
const CASES: [&str; 16] = [
    "llama-tiny",
    "qwen2-tiny",
    "qwen3-tiny",
    "gemma3-tiny",
    "gemma3-tiny-4b",
    "gemma3-tiny-27b",
    "qwen3moe-tiny",
    "qwen3moe-tiny-bias",
    "glm4moe-tiny",
    "glm4moe-tiny-nextn",
    "mimo2-tiny",
    "mimo2-tiny-nextn",
    "gpt-oss-tiny",
    "gemma4-tiny",
    "gemma4-tiny-e2b",
    "qwen35moe-tiny",
];

fn data(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/families/{case}"))
}

fn read_json(p: &Path) -> Value {
    let text =
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn manifest(case: &str) -> Value {
    read_json(&data(case).join("manifest.json"))
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("id fits u32"))
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The vocabulary GGUF a manifest's `vocab` names.
fn vocab_path(vocab: &str) -> PathBuf {
    let file = match vocab {
        "llama-bpe" => "ggml-vocab-llama-bpe.gguf",
        "qwen2" => "ggml-vocab-qwen2.gguf",
        "gemma-4" => "ggml-vocab-gemma-4.gguf",
        "qwen35" => "ggml-vocab-qwen35.gguf",
        "gemma3" => {
            return flint_loader::fetch::default_model_path().unwrap_or_else(|e| {
                panic!(
                    "the Gemma 3 cases take their vocabulary from the default model \
                     (gemma-3-270m-q4_k_m.gguf), which could not be fetched: {e}"
                )
            })
        }
        other => panic!("unknown vocabulary '{other}' in a family manifest"),
    };
    let p = common::llamacpp_src().join("models").join(file);
    assert!(
        p.is_file(),
        "{} is missing: run `tools/llamacpp_sdist.sh` (it fetches llama.cpp's sdist) or point \
         FLINT_LLAMACPP_SRC at its llama.cpp directory",
        p.display()
    );
    p
}

/// The value after `flag` in the manifest's synth command.
fn flag<'a>(cmd: &[&'a str], flag: &str) -> &'a str {
    let i = cmd
        .iter()
        .position(|w| *w == flag)
        .unwrap_or_else(|| panic!("the synth command {cmd:?} has no {flag}"));
    cmd.get(i + 1)
        .unwrap_or_else(|| panic!("the synth command {cmd:?} has no value after {flag}"))
}

/// Runs the manifest's `flint synth --arch A --preset P --seed S --vocab VOCAB
/// --vocab-size N` through the library and checks the bytes' sha256.
fn synthesise(case: &str) -> GgufFile {
    let m = manifest(case);
    let cmd_text = m["synth"].as_str().expect("manifest synth command");
    let cmd: Vec<&str> = cmd_text.split_whitespace().collect();
    assert_eq!(&cmd[..2], ["flint", "synth"], "{case}: {cmd_text}");
    let arch = flag(&cmd, "--arch");
    let preset = flag(&cmd, "--preset");
    let seed: u64 = flag(&cmd, "--seed").parse().expect("seed");
    let vocab_name = m["vocab"].as_str().expect("manifest vocab");
    // A real vocabulary (`--vocab VOCAB`, the manifest's `vocab`) or the recipe's
    // built-in one (`vocab: builtin`, no `--vocab`).
    let vocab_file = (vocab_name != "builtin").then(|| {
        assert_eq!(flag(&cmd, "--vocab"), "VOCAB", "{case}: {cmd_text}");
        let vp = vocab_path(vocab_name);
        GgufFile::open(&vp).unwrap_or_else(|e| panic!("vocabulary {}: {e}", vp.display()))
    });
    let vocab = match &vocab_file {
        Some(f) => {
            let n_vocab: usize = flag(&cmd, "--vocab-size").parse().expect("vocab size");
            VocabSource::File(f, n_vocab)
        }
        None => VocabSource::Builtin,
    };
    let w = if let Some(family) = Family::from_name(arch) {
        let recipe =
            DenseRecipe::of(family, preset).unwrap_or_else(|| panic!("{case}: preset {preset}"));
        synth_dense(&recipe, seed, vocab, &|_, _| {})
    } else if arch == "gemma4" {
        let recipe = Gemma4Recipe::of(preset).unwrap_or_else(|| panic!("{case}: preset {preset}"));
        synth_gemma4(&recipe, seed, vocab, &|_, _| {})
    } else if arch == "qwen35moe" {
        let recipe =
            Qwen35MoeRecipe::of(preset).unwrap_or_else(|| panic!("{case}: preset {preset}"));
        synth_qwen35moe(&recipe, seed, vocab, &|_, _| {})
    } else {
        let family = MoeFamily::from_name(arch).unwrap_or_else(|| panic!("{case}: arch {arch}"));
        let recipe =
            MoeRecipe::of(family, preset).unwrap_or_else(|| panic!("{case}: preset {preset}"));
        synth_moe(&recipe, seed, vocab, &|_, _| {})
    }
    .unwrap_or_else(|e| panic!("{case}: synth: {e}"))
    .0;
    let bytes = w.to_bytes();
    let want = m["models"]["f32"]["sha256"].as_str().expect("f32 sha256");
    let got = sha256_hex(&bytes);
    assert_eq!(
        got, want,
        "{case}: `{cmd_text}` now writes another file than the one llama.cpp's goldens were \
         computed on (sha256 {got}, manifest {want}): synth changed; rerun \
         `tools/golden/dense_goldens.sh {case}` and commit the new goldens"
    );
    GgufFile::from_bytes(bytes).expect("the synthesised file parses")
}

/// Each case's f32 file, synthesised once per test binary.
static F32: [OnceLock<GgufFile>; CASES.len()] = [const { OnceLock::new() }; CASES.len()];

fn f32_file(case: &str) -> &'static GgufFile {
    let i = CASES
        .iter()
        .position(|c| *c == case)
        .expect("a case with an f32 file");
    F32[i].get_or_init(|| synthesise(case))
}

/// A committed file of a case, checked against its manifest's sha256.
fn committed(case: &str, file: &str, sha256: &str) -> PathBuf {
    let p = data(case).join(file);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    assert_eq!(
        sha256_hex(&bytes),
        sha256,
        "{}: not the file of the manifest (regenerate with `tools/golden/dense_goldens.sh {case}`)",
        p.display()
    );
    p
}

/// The model of a case in a file type (`f32`, `q8_0`, `q4_k_m`).
fn model(case: &str, ty: &str) -> Model {
    if ty == "f32" {
        return model_from_gguf(f32_file(case)).expect("the f32 file assembles");
    }
    let m = manifest(case);
    let entry = &m["models"][ty];
    let p = committed(
        case,
        entry["file"].as_str().expect("file"),
        entry["sha256"].as_str().expect("sha256"),
    );
    load_model(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The model staged on the cpu device (its SIMD level and layout from the environment,
/// as `flint` opens it), computing attention in llama.cpp's order for the call's size
/// (`flint_hal_cpu::FloatOrder::LlamaCpp`: the one-key-at-a-time path for the
/// chains' short prompts and decode steps, as llama.cpp computed them).
fn on_cpu(model: &Model) -> DeviceModel {
    let opts = flint_hal::DeviceOptions::from_env().expect("device options");
    let dev = flint_hal_cpu::CpuDevice::new(&opts)
        .expect("cpu device opens")
        .with_float_order(flint_hal_cpu::FloatOrder::LlamaCpp);
    let dm =
        DeviceModel::stage(model, std::sync::Arc::new(dev), &mut |_, _| {}).expect("stages on cpu");
    // What the plan was told the vectors take is what staging uploaded.
    assert_eq!(
        flint_engine::forward::vector_bytes(model),
        dm.vector_bytes(),
        "forward::vector_bytes misses vectors that staging uploads"
    );
    dm
}

fn golden_ids(case: &str) -> Vec<u32> {
    let ids = ids_of(&read_json(&data(case).join("ids.json"))["ids"]);
    assert_eq!(ids.len(), 2048, "{case}: ids.json");
    ids
}

/// The teacher-forced figures of `model` over the golden of `ty`: all the ids in one
/// batch on the cpu device, as llama.cpp computed them. Also returns the staged model.
fn teacher_forced(case: &str, ty: &str, model: &Model) -> (Figures, DeviceModel) {
    let golden = read_json(&data(case).join(format!("logits-{ty}.json")));
    let ids = golden_ids(case);
    assert_eq!(ids_of(&golden["ids"]), ids, "{case} {ty}: the golden's ids");
    let dm = on_cpu(model);
    let mut s = Session::new(&dm, ids.len()).expect("session");
    let all = s.feed(&ids, true).expect("teacher-forced forward");
    let v = model.spec.vocab;
    assert_eq!(all.len(), ids.len() * v);
    let f = teacher_forced_figures(&golden, &|p| &all[p * v..(p + 1) * v]);
    (f, dm)
}

fn show(f: &Figures) -> String {
    format!(
        "top-1 {}/{} ({:.2}%), mean KL {:.3e}, rms logit diff {:.3e}",
        f.agree,
        f.n,
        100.0 * f.top1,
        f.kl,
        f.rms
    )
}

fn meets(f: &Figures) -> bool {
    f.top1 >= TOP1_TARGET && f.kl <= KL_TARGET
}

/// Whether the cpu device computes every matrix of `model` in llama.cpp's float order
/// (docs/parity.md): F32, F16, Q8_0, Q5_0 and MXFP4 at every SIMD level; Q4_K, Q5_K and
/// Q6_K at every SIMD level but the scalar one; nothing for a mixture-of-experts file with
/// K-quant expert towers, which llama.cpp computes in its `MUL_MAT_ID` orders (gemv for a
/// repacked Q4_K tower, the tiled matmul for Q5_K and Q6_K) that the device does not
/// follow yet; nothing for a golden made by llama.cpp's AVX2 build.
fn device_follows_llamacpp(case: &str, model: &Model) -> bool {
    use flint_core::GgmlType::{Q4_K, Q5_K, Q6_K};
    // The orders the device follows are those of llama.cpp's AVX-512 build; a golden
    // made by its AVX2 build (`llamacpp_simd`, written by dense_goldens.sh; the older
    // manifests without it were made on AVX-512 hosts) sums in other orders.
    if manifest(case)["llamacpp_simd"].as_str() == Some("avx2") {
        return false;
    }
    let simd = flint_hal_cpu::SimdLevel::from_env().expect("FLINT_CPU_SIMD")
        != flint_hal_cpu::SimdLevel::Scalar;
    let (types, expert_types) = matrix_types(model);
    types
        .iter()
        .chain(&expert_types)
        .all(|&t| any_order(t) || (simd && matches!(t, Q4_K | Q5_K | Q6_K)))
        && expert_types.iter().all(|&t| any_order(t))
}

/// The block types llama.cpp computes in one order whatever the call's size, and the
/// device with it at every SIMD level: F32, F16, Q8_0, Q5_0, MXFP4.
fn any_order(t: flint_core::GgmlType) -> bool {
    use flint_core::GgmlType::*;
    matches!(t, F32 | F16 | Q8_0 | Q5_0 | MXFP4)
}

/// The types of `model`'s matrices: those of every token's path, and the expert towers'.
fn matrix_types(model: &Model) -> (Vec<flint_core::GgmlType>, Vec<flint_core::GgmlType>) {
    let mut types = vec![model.token_embd.ty, model.output.ty];
    let mut expert_types = Vec::new();
    for l in &model.layers {
        types.extend([l.wq.ty, l.wk.ty, l.wv.ty, l.wo.ty]);
        match &l.ffn {
            flint_engine::model::Ffn::Dense(m) => types.extend([m.gate.ty, m.up.ty, m.down.ty]),
            flint_engine::model::Ffn::Moe(moe) => {
                types.push(moe.router.ty);
                let e = &moe.experts;
                expert_types.extend([e.gate.ty, e.up.ty, e.down.ty]);
                if let Some(s) = &moe.shared {
                    types.extend([s.gate.ty, s.up.ty, s.down.ty]);
                }
            }
        }
    }
    (types, expert_types)
}

/// Whether the device follows llama.cpp's order in the greedy chains' short prompts and
/// single-row decode steps as well: every matrix of a type with one order
/// ([`any_order`]; llama.cpp switches its K-quant kernels for short calls, the device
/// does not), on a golden of llama.cpp's AVX-512 build. There its logits are llama.cpp's
/// to the last bits ([`DECODE_LOGIT_DIFF`]).
fn device_decode_follows_llamacpp(case: &str, model: &Model) -> bool {
    let (types, expert_types) = matrix_types(model);
    device_follows_llamacpp(case, model) && types.iter().chain(&expert_types).all(|&t| any_order(t))
}

/// Where [`device_decode_follows_llamacpp`], the largest difference allowed between the
/// device's and llama.cpp's logits on llama.cpp's top 5 over the greedy chains (or the
/// reference forward's, where that is larger: a difference both forwards share is one of
/// their common statement, not of the device). Measured 5.8e-7 to 7.4e-7.
const DECODE_LOGIT_DIFF: f64 = 1e-5;

/// Ids the reference forward is teacher-forced on where the device does not follow
/// llama.cpp's order (the reference is a token-at-a-time scalar forward).
const REFERENCE_IDS: usize = 512;

/// Below this top-1 agreement the device is broken, not merely in another float order:
/// where it does not follow llama.cpp's order, these small random models turn last-bit
/// differences into logit differences (a routing choice or a near-tie flips; measured on
/// an AVX2 host: 95.3-97.7% on the Q4_K_M files), so only this bound is asserted for the
/// device there, beside the reference forward's full comparison.
const DEVICE_SANITY_TOP1: f64 = 0.9;

/// Comparisons that miss the targets by a known, measured margin, with what they must
/// still reach (the reference forward does not state every last bit of the llama.cpp
/// build that made these goldens, and these small random models turn a last-bit
/// difference into a flipped routing choice or near-tie).
struct KnownGap {
    case: &'static str,
    ty: &'static str,
    /// Top-1 the reference forward's teacher-forced comparison must reach (instead of
    /// [`TOP1_TARGET`]; the KL target stands).
    reference_top1: f64,
    /// The near-tie allowance of the reference forward's greedy chains (instead of
    /// [`NEAR_TIE`]).
    reference_near_tie: f64,
    /// Mean KL the reference forward's teacher-forced comparison must stay under (instead
    /// of [`KL_TARGET`]).
    reference_kl: f64,
    /// What was measured.
    why: &'static str,
}

const KNOWN_GAPS: [KnownGap; 2] = [
    // The qwen35moe comparisons that miss the targets by a measured margin. Traced with
    // `tools/golden/dump_ops.sh` on the Q8_0 file: the reference's logits equal llama.cpp's
    // to the golden's precision (5e-7) up to position 329 and leave them between 329 and
    // 336, where a last-bit difference first flips a Q8_0 rounding of a matmul's
    // activation. The last-bit differences, op by op against llama.cpp's own inputs: its
    // AVX2 build's SiLU (`ggml_v_silu` with the AVX2 `ggml_v_expf`, 1 ulp off the AVX-512
    // form the reference states on ~12% of the convolution outputs) and glibc's `logf` in
    // the softplus of the DeltaNet gate (`libm`'s differs by 1 ulp on ~6% of them); the
    // sigmoids, the L2 norms and the delta rule's inputs equal llama.cpp's bit for bit.
    KnownGap {
        case: "qwen35moe-tiny",
        ty: "q8_0",
        reference_top1: 0.95,
        reference_near_tie: NEAR_TIE,
        reference_kl: KL_TARGET,
        why: "reference teacher-forced top-1 63/64 (98.4%; the miss at a 0.035-nat \
              near-tie), mean KL 1.3e-4 (AVX2-made goldens: SiLU and logf last bits)",
    },
    KnownGap {
        case: "qwen35moe-tiny",
        ty: "q4_k_m",
        reference_top1: 0.95,
        reference_near_tie: NEAR_TIE,
        reference_kl: KL_TARGET,
        why: "reference teacher-forced top-1 63/64 (98.4%; the miss at a 0.027-nat \
              near-tie), mean KL 5.8e-4 (AVX2-made goldens: SiLU and logf last bits)",
    },
];

/// The llama.cpp CPU build that made a case's goldens, whose attention order the
/// reference forward follows: the manifest's `llamacpp_simd` (`avx2`; `avx512`,
/// `avx512_vnni` or none, for the older manifests made on AVX-512 hosts: AVX-512).
fn llamacpp_build(case: &str) -> GgmlCpuBuild {
    match manifest(case)["llamacpp_simd"].as_str() {
        Some("avx2") => GgmlCpuBuild::Avx2,
        None | Some("avx512" | "avx512_vnni") => GgmlCpuBuild::Avx512,
        Some(other) => panic!("{case}: unknown llamacpp_simd {other:?}"),
    }
}

fn known_gap(case: &str, ty: &str) -> Option<&'static KnownGap> {
    KNOWN_GAPS.iter().find(|g| g.case == case && g.ty == ty)
}

/// The reference forward teacher-forced on the first [`REFERENCE_IDS`] golden ids, as
/// rows of one llama.cpp batch: its figures over llama.cpp's positions among them.
fn reference_teacher_forced(case: &str, ty: &str, model: &Model) -> Figures {
    let golden = read_json(&data(case).join(format!("logits-{ty}.json")));
    let ids = golden_ids(case);
    let n = REFERENCE_IDS.min(ids.len());
    let mut r = Reference::new(model);
    r.set_llamacpp_build(llamacpp_build(case));
    let v = model.spec.vocab;
    let mut all = vec![0f32; n * v];
    for (p, &t) in ids[..n].iter().enumerate() {
        let l = r.forward(t).expect("reference forward");
        all[p * v..(p + 1) * v].copy_from_slice(&l);
    }
    let mut head = golden.clone();
    let kept: Vec<Value> = golden["positions"]
        .as_array()
        .expect("positions")
        .iter()
        .filter(|p| (p["pos"].as_u64().expect("pos") as usize) < n)
        .cloned()
        .collect();
    assert!(
        !kept.is_empty(),
        "{case} {ty}: no golden position below {n}"
    );
    head["positions"] = Value::Array(kept);
    teacher_forced_figures(&head, &|p| &all[p * v..(p + 1) * v])
}

/// The comparison of one case and file type: teacher-forced figures and greedy chains.
///
/// Teacher-forced: the device must meet the targets where it computes in llama.cpp's
/// float order ([`device_follows_llamacpp`]); elsewhere the reference forward (Flint's
/// scalar statement of llama.cpp's arithmetic, host-independent) must meet them on the
/// first [`REFERENCE_IDS`] ids, and the device only [`DEVICE_SANITY_TOP1`].
///
/// Greedy chains: the device replays them on the dense families, and on the MoE files
/// whose every matrix it computes in llama.cpp's order ([`device_follows_llamacpp`]:
/// F32, Q8_0 and MXFP4 towers; its decode steps take llama.cpp's single-row F32 order and
/// its attention path for calls of fewer than 64 rows). On the other MoE files a decode
/// step routes on logits that differ from llama.cpp's in the last bits (K-quant towers
/// whose `MUL_MAT_ID` orders the device does not follow), and a flipped routing choice
/// moves the logits far beyond a near-tie: the device's chains are printed there, not
/// asserted. The reference forward, which follows llama.cpp's decode arithmetic, must
/// replay them on every quantized and every MoE file.
fn compare(case: &str, ty: &str) {
    let t0 = std::time::Instant::now();
    let model = model(case, ty);
    let moe = model.spec.moe.is_some();
    let follows = device_follows_llamacpp(case, &model);
    let (f, dm) = teacher_forced(case, ty, &model);
    let t_device_tf = t0.elapsed().as_secs_f64();
    let reference_tf = (!follows).then(|| reference_teacher_forced(case, ty, &model));
    let t_reference_tf = t0.elapsed().as_secs_f64() - t_device_tf;
    let text = std::fs::read_to_string(data(case).join(format!("greedy-{ty}.jsonl")))
        .expect("greedy golden");
    let chains = chains_from_jsonl(&text);
    assert_eq!(chains.len(), 3, "{case} {ty}: three greedy chains");
    let near_tie = if ty == "f32" {
        NEAR_TIE
    } else {
        NEAR_TIE_DEVICE
    };
    let t1 = std::time::Instant::now();
    let greedy = replay_greedy(&dm, &chains, near_tie);
    let t_device_greedy = t1.elapsed().as_secs_f64();
    let gap = known_gap(case, ty);
    let (reference_top1, reference_near_tie, reference_kl) = match gap {
        Some(g) => {
            println!("{case} {ty}: known gap: {}", g.why);
            (g.reference_top1, g.reference_near_tie, g.reference_kl)
        }
        None => (TOP1_TARGET, NEAR_TIE, KL_TARGET),
    };
    // The reference follows llama.cpp's decode arithmetic on the quantized files (where
    // the device's differs most) and on the MoE families; on dense f32 the device replays
    // every chain itself, and the reference would take minutes on the 62-layer case.
    let t2 = std::time::Instant::now();
    let reference = (ty != "f32" || moe).then(|| {
        let mut on = OnReference::new(&model).with_build(llamacpp_build(case));
        replay_greedy_on(&mut on, &chains, reference_near_tie)
    });
    let t_reference_greedy = t2.elapsed().as_secs_f64();
    let greedy_text = match &greedy {
        Ok(r) => format!(
            "greedy {}/{} chains identical, {} first diverging at a near-tie {:?}, max logit diff on llama.cpp's top 5 {:.2e}",
            r.identical,
            r.chains,
            r.near_ties.len(),
            r.near_ties,
            r.max_diff
        ),
        Err(e) => format!("greedy diverged: {e}"),
    };
    let reference_text = match &reference {
        None => "reference greedy not run on dense f32".to_string(),
        Some(Ok(r)) => format!(
            "reference greedy {}/{} chains identical, {} first diverging at a near-tie {:?}, max logit diff on llama.cpp's top 5 {:.2e}",
            r.identical,
            r.chains,
            r.near_ties.len(),
            r.near_ties,
            r.max_diff
        ),
        Some(Err(e)) => format!("reference greedy FAILED: {e}"),
    };
    let reference_tf_text = match &reference_tf {
        None => String::new(),
        Some(rf) => format!(
            "; the device does not follow llama.cpp's order here: reference on the first {REFERENCE_IDS} ids: {}",
            show(rf)
        ),
    };
    println!(
        "{case} {ty} (device, cpu): {}{reference_tf_text}; {greedy_text}{}; {reference_text} ({:.1}s: device teacher-forced {t_device_tf:.1}s, reference teacher-forced {t_reference_tf:.1}s, device greedy {t_device_greedy:.1}s, reference greedy {t_reference_greedy:.1}s)",
        show(&f),
        if moe && !follows {
            " (device chains not asserted: a MoE file whose orders the device does not follow)"
        } else {
            ""
        },
        t0.elapsed().as_secs_f64()
    );
    match &reference_tf {
        None => assert!(
            meets(&f),
            "{case} {ty}: {} (targets: top-1 >= {TOP1_TARGET}, mean KL <= {KL_TARGET})",
            show(&f)
        ),
        Some(rf) => {
            assert!(
                rf.top1 >= reference_top1 && rf.kl <= reference_kl,
                "{case} {ty}, reference forward: {} (targets: top-1 >= {reference_top1}, mean KL <= {reference_kl})",
                show(rf)
            );
            assert!(
                f.top1 >= DEVICE_SANITY_TOP1,
                "{case} {ty}, device: {} (below the sanity bound {DEVICE_SANITY_TOP1})",
                show(&f)
            );
        }
    }
    if !moe || follows {
        match &greedy {
            Err(e) => panic!("{case} {ty}, device: {e}"),
            Ok(g) if device_decode_follows_llamacpp(case, &model) => {
                let shared = match &reference {
                    Some(Ok(r)) => r.max_diff,
                    _ => 0.0,
                };
                let bound = DECODE_LOGIT_DIFF.max(shared);
                assert!(
                    g.max_diff <= bound,
                    "{case} {ty}, device: greedy logits {:.2e} from llama.cpp's on its top 5 (bound {bound:.1e})",
                    g.max_diff
                );
            }
            Ok(_) => {}
        }
    }
    match &reference {
        Some(Err(e)) => panic!("{case} {ty}, reference: {e}"),
        // On a quantized file and a golden of llama.cpp's AVX-512 build the reference
        // states llama.cpp's decode arithmetic: every kernel switch by call size (Q5_K and
        // Q6_K single rows, the rows routed to each expert) to the last bits.
        Some(Ok(r))
            if ty != "f32" && gap.is_none() && llamacpp_build(case) == GgmlCpuBuild::Avx512 =>
        {
            assert!(
                r.max_diff <= DECODE_LOGIT_DIFF,
                "{case} {ty}, reference: greedy logits {:.2e} from llama.cpp's on its top 5 (bound {DECODE_LOGIT_DIFF:.1e})",
                r.max_diff
            );
        }
        _ => {}
    }
}

macro_rules! compare_tests {
    ($($name:ident: $case:literal $ty:literal;)*) => {
        $(
            #[test]
            fn $name() {
                compare($case, $ty);
            }
        )*
    };
}

compare_tests! {
    llama_tiny_f32: "llama-tiny" "f32";
    llama_tiny_q8_0: "llama-tiny" "q8_0";
    llama_tiny_q4_k_m: "llama-tiny" "q4_k_m";
    qwen2_tiny_f32: "qwen2-tiny" "f32";
    qwen2_tiny_q8_0: "qwen2-tiny" "q8_0";
    qwen2_tiny_q4_k_m: "qwen2-tiny" "q4_k_m";
    qwen3_tiny_f32: "qwen3-tiny" "f32";
    qwen3_tiny_q8_0: "qwen3-tiny" "q8_0";
    qwen3_tiny_q4_k_m: "qwen3-tiny" "q4_k_m";
    gemma3_tiny_f32: "gemma3-tiny" "f32";
    gemma3_tiny_q8_0: "gemma3-tiny" "q8_0";
    gemma3_tiny_q4_k_m: "gemma3-tiny" "q4_k_m";
    gemma3_tiny_4b_f32: "gemma3-tiny-4b" "f32";
    gemma3_tiny_4b_q8_0: "gemma3-tiny-4b" "q8_0";
    gemma3_tiny_4b_q4_k_m: "gemma3-tiny-4b" "q4_k_m";
    gemma3_tiny_27b_f32: "gemma3-tiny-27b" "f32";
    qwen3moe_tiny_f32: "qwen3moe-tiny" "f32";
    qwen3moe_tiny_q8_0: "qwen3moe-tiny" "q8_0";
    qwen3moe_tiny_q4_k_m: "qwen3moe-tiny" "q4_k_m";
    qwen3moe_tiny_bias_f32: "qwen3moe-tiny-bias" "f32";
    qwen3moe_tiny_bias_q4_k_m: "qwen3moe-tiny-bias" "q4_k_m";
    glm4moe_tiny_f32: "glm4moe-tiny" "f32";
    glm4moe_tiny_q8_0: "glm4moe-tiny" "q8_0";
    glm4moe_tiny_q4_k_m: "glm4moe-tiny" "q4_k_m";
    glm4moe_tiny_nextn_f32: "glm4moe-tiny-nextn" "f32";
    glm4moe_tiny_nextn_q4_k_m: "glm4moe-tiny-nextn" "q4_k_m";
    mimo2_tiny_f32: "mimo2-tiny" "f32";
    mimo2_tiny_q8_0: "mimo2-tiny" "q8_0";
    mimo2_tiny_q4_k_m: "mimo2-tiny" "q4_k_m";
    mimo2_tiny_nextn_f32: "mimo2-tiny-nextn" "f32";
    mimo2_tiny_nextn_q4_k_m: "mimo2-tiny-nextn" "q4_k_m";
    gpt_oss_tiny_f32: "gpt-oss-tiny" "f32";
    gpt_oss_tiny_q8_0: "gpt-oss-tiny" "q8_0";
    gpt_oss_tiny_mxfp4_moe: "gpt-oss-tiny" "mxfp4_moe";
    gemma4_tiny_f32: "gemma4-tiny" "f32";
    gemma4_tiny_q8_0: "gemma4-tiny" "q8_0";
    gemma4_tiny_q4_k_m: "gemma4-tiny" "q4_k_m";
    gemma4_tiny_e2b_f32: "gemma4-tiny-e2b" "f32";
    gemma4_tiny_e2b_q8_0: "gemma4-tiny-e2b" "q8_0";
    gemma4_tiny_e2b_q4_k_m: "gemma4-tiny-e2b" "q4_k_m";
}

/// The f32 model of `case` with one feature dropped by `drop` misses the targets.
fn dropping_fails(case: &str, feature: &str, drop: impl FnOnce(&mut Model)) {
    let mut m = model(case, "f32");
    drop(&mut m);
    let (f, _) = teacher_forced(case, "f32", &m);
    println!("{case} f32 without {feature}: {}", show(&f));
    assert!(
        !meets(&f),
        "{case}: dropping {feature} still meets the targets ({}): the comparison cannot see it",
        show(&f)
    );
}

#[test]
fn dropping_rope_freqs_fails_llama() {
    dropping_fails("llama-tiny", "rope_freqs (Llama 3 rope scaling)", |m| {
        assert!(m.rope_freqs.is_some(), "llama-tiny has rope_freqs");
        m.rope_freqs = None;
    });
}

#[test]
fn dropping_linear_rope_scaling_fails_gemma3_4b() {
    dropping_fails("gemma3-tiny-4b", "the linear RoPE scaling", |m| {
        let mut scaled = 0;
        for l in &mut m.spec.layers {
            if l.rope_freq_scale != 1.0 {
                scaled += 1;
                l.rope_freq_scale = 1.0;
            }
        }
        assert!(
            scaled > 0,
            "gemma3-tiny-4b has layers with a frequency scale"
        );
    });
}

#[test]
fn dropping_qkv_biases_fails_qwen2() {
    dropping_fails("qwen2-tiny", "the q/k/v biases", |m| {
        for l in &mut m.layers {
            assert!(l.bq.is_some() && l.bk.is_some() && l.bv.is_some());
            (l.bq, l.bk, l.bv) = (None, None, None);
        }
    });
}

#[test]
fn dropping_qk_norm_fails_qwen3() {
    dropping_fails("qwen3-tiny", "the QK norms", |m| {
        for l in &mut m.layers {
            assert!(l.q_norm.is_some() && l.k_norm.is_some());
            (l.q_norm, l.k_norm) = (None, None);
        }
    });
}

#[test]
fn tying_the_untied_output_fails_llama() {
    dropping_fails("llama-tiny", "its own output matrix (tied instead)", |m| {
        assert!(!m.spec.tied_output);
        assert_eq!(m.output.name, "output.weight");
        m.output = m.token_embd.clone();
    });
}

/// A tied model (no `output.weight`) is assembled with the embedding as its output
/// projection; its comparisons (qwen3, gemma3) show the forward uses it.
#[test]
fn tied_models_load_with_the_embedding_as_output() {
    for case in ["qwen3-tiny", "gemma3-tiny"] {
        let f = f32_file(case);
        assert!(f.tensor("output.weight").is_none(), "{case} is tied");
        let m = model(case, "f32");
        assert!(m.spec.tied_output, "{case}: tied_output");
        assert_eq!(m.output.name, "token_embd.weight", "{case}");
        assert_eq!(m.output.bytes(), m.token_embd.bytes(), "{case}");
    }
}

#[test]
fn dropping_the_27b_query_scale_fails() {
    dropping_fails(
        "gemma3-tiny-27b",
        "the 27B query scale (1/sqrt(head_dim) instead)",
        |m| {
            let usual = 1.0 / (m.spec.head_dim_k as f32).sqrt();
            assert_ne!(m.spec.attn_scale, usual, "the 27B query scale is its own");
            m.spec.attn_scale = usual;
        },
    );
}

#[test]
fn dropping_the_window_fails_gemma3() {
    dropping_fails("gemma3-tiny", "the sliding window", |m| {
        assert!(m.spec.window.is_some() && m.spec.layers.iter().any(|l| l.sliding));
        m.spec.window = None;
    });
}

#[test]
fn dropping_the_window_fails_gpt_oss() {
    dropping_fails("gpt-oss-tiny", "the sliding window", |m| {
        assert!(m.spec.window.is_some() && m.spec.layers.iter().any(|l| l.sliding));
        m.spec.window = None;
    });
}

#[test]
fn dropping_the_sinks_fails_gpt_oss() {
    dropping_fails("gpt-oss-tiny", "the attention sinks", |m| {
        for l in &mut m.layers {
            assert!(l.sinks.is_some(), "gpt-oss has sinks on every layer");
            l.sinks = None;
        }
    });
}

#[test]
fn dropping_the_biases_fails_gpt_oss() {
    use flint_engine::model::Ffn;
    dropping_fails(
        "gpt-oss-tiny",
        "the q/k/v/o, router and expert biases",
        |m| {
            for l in &mut m.layers {
                assert!(l.bq.is_some() && l.bk.is_some() && l.bv.is_some() && l.bo.is_some());
                (l.bq, l.bk, l.bv, l.bo) = (None, None, None, None);
                let Ffn::Moe(moe) = &mut l.ffn else {
                    panic!("gpt-oss layers are MoE layers")
                };
                assert!(moe.router_bias.is_some() && moe.expert_biases.is_some());
                (moe.router_bias, moe.expert_biases) = (None, None);
            }
        },
    );
}

#[test]
fn dropping_yarn_fails_gpt_oss() {
    dropping_fails("gpt-oss-tiny", "YaRN (plain linear scaling instead)", |m| {
        assert!(m.spec.rope.yarn.is_some());
        m.spec.rope.yarn = None;
    });
}

#[test]
fn dropping_the_clamped_swiglu_fails_gpt_oss() {
    use flint_engine::model::Activation;
    dropping_fails(
        "gpt-oss-tiny",
        "the clamped SwiGLU (plain SwiGLU instead)",
        |m| {
            assert_eq!(m.spec.activation, Activation::SwigluOai);
            m.spec.activation = Activation::Silu;
        },
    );
}

/// `llama-quantize`'s MXFP4 expert towers in the committed MXFP4_MOE file are Flint's
/// MXFP4 quantization of the f32 file's towers, byte for byte.
#[test]
fn mxfp4_towers_are_flints_quantization_gpt_oss() {
    let case = "gpt-oss-tiny";
    let f32f = f32_file(case);
    let entry = &manifest(case)["models"]["mxfp4_moe"];
    let p = committed(
        case,
        entry["file"].as_str().expect("file"),
        entry["sha256"].as_str().expect("sha256"),
    );
    let q = GgufFile::open(&p).expect("the MXFP4_MOE file opens");
    let mut checked = 0;
    for t in q.tensors() {
        if t.ty != flint_core::GgmlType::MXFP4 {
            continue;
        }
        let src = f32f.tensor(&t.name).expect("the f32 file has the tensor");
        let values: Vec<f32> = f32f
            .tensor_data(src)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let want = q.tensor_data(t);
        let mut got = vec![0u8; want.len()];
        flint_core::quant::quantize(flint_core::GgmlType::MXFP4, &values, &mut got)
            .expect("MXFP4 quantization");
        assert!(
            got == want,
            "{}: Flint's MXFP4 differs from llama-quantize's",
            t.name
        );
        checked += 1;
    }
    assert_eq!(checked, 12, "three towers on each of the 4 layers");
}

/// llama-tiny's Q8_0 split in 4 shards by `llama-gguf-split`, opened from its first
/// shard, gives the single file's logits bit for bit over the 2,048 ids.
#[test]
fn split_q8_0_gives_the_single_files_logits() {
    let case = "llama-tiny";
    let m = manifest(case);
    let split = &m["split"];
    assert_eq!(split["of"], "q8_0");
    let shards: Vec<PathBuf> = split["files"]
        .as_array()
        .expect("split files")
        .iter()
        .map(|f| {
            committed(
                case,
                f["file"].as_str().expect("file"),
                f["sha256"].as_str().expect("sha256"),
            )
        })
        .collect();
    assert_eq!(shards.len(), 4);
    let ids = golden_ids(case);
    let logits = |model: &Model| {
        let dm = on_cpu(model);
        let mut s = Session::new(&dm, ids.len()).expect("session");
        s.feed(&ids, true).expect("forward")
    };
    let from_split = load_model(&shards[0]).expect("the split model loads from its first shard");
    let single = model(case, "q8_0");
    assert_eq!(from_split.layers.len(), single.layers.len());
    let (a, b) = (logits(&single), logits(&from_split));
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    println!(
        "{case} q8_0 in 4 shards: {differing} of {} logits differ from the single file's",
        a.len()
    );
    assert_eq!(a.len(), b.len());
    assert_eq!(
        differing, 0,
        "the split file's logits are not the single file's"
    );
}

/// The reference forward (the oracle, `flint-core`'s scalar kernels) meets the same
/// targets on llama-tiny f32 at the golden positions of the first [`REFERENCE_LEN`] ids,
/// run with llama.cpp's batch of 2,048 (`set_batch_len`: causal, so those rows are the
/// whole batch's); all 2,048 would take a minute on one core.
#[test]
fn reference_forward_llama_tiny_f32() {
    const REFERENCE_LEN: usize = 512;
    let case = "llama-tiny";
    let t0 = std::time::Instant::now();
    let model = model(case, "f32");
    let mut golden = read_json(&data(case).join("logits-f32.json"));
    let ids = golden_ids(case);
    let positions = golden["positions"].as_array_mut().expect("positions");
    positions.retain(|p| (p["pos"].as_u64().expect("pos") as usize) < REFERENCE_LEN);
    assert_eq!(positions.len(), REFERENCE_LEN / 8);
    let mut r = Reference::new(&model);
    r.set_batch_len(ids.len());
    let rows: Vec<Vec<f32>> = ids[..REFERENCE_LEN]
        .iter()
        .map(|&t| r.forward(t).expect("reference forward"))
        .collect();
    let f = teacher_forced_figures(&golden, &|p| rows[p].as_slice());
    println!(
        "{case} f32 (reference, first {REFERENCE_LEN} ids): {} ({:.1}s)",
        show(&f),
        t0.elapsed().as_secs_f64()
    );
    assert!(meets(&f), "{case} f32 reference: {}", show(&f));
}

#[test]
fn dropping_the_value_norm_and_proportional_rope_fails_gemma4() {
    dropping_fails("gemma4-tiny", "the weightless V norm", |m| {
        assert!(m.spec.v_norm, "gemma4 norms V");
        m.spec.v_norm = false;
    });
    dropping_fails("gemma4-tiny", "the full layers' rope_freqs", |m| {
        assert!(m.rope_freqs.is_some(), "gemma4-tiny has rope_freqs");
        m.rope_freqs = None;
    });
}

#[test]
fn dropping_the_expert_output_scale_fails_gemma4() {
    dropping_fails("gemma4-tiny", "ffn_down_exps.scale", |m| {
        for l in &mut m.layers {
            let flint_engine::model::Ffn::Moe(moe) = &mut l.ffn else {
                panic!("gemma4-tiny routes on every layer")
            };
            assert!(
                moe.expert_scale.is_some(),
                "gemma4-tiny scales expert outputs"
            );
            moe.expert_scale = None;
        }
    });
}

#[test]
fn dropping_shared_kv_or_per_layer_inputs_fails_gemma4_e2b() {
    dropping_fails("gemma4-tiny-e2b", "the shared KV", |m| {
        let shared = m
            .spec
            .layers
            .iter()
            .filter(|l| l.kv_source.is_some())
            .count();
        assert_eq!(
            shared, 3,
            "gemma4-tiny-e2b shares the KV of its last 3 layers"
        );
        for l in &mut m.spec.layers {
            l.kv_source = None;
        }
    });
    dropping_fails("gemma4-tiny-e2b", "the per-layer token embeddings", |m| {
        assert!(
            m.per_layer.is_some(),
            "gemma4-tiny-e2b has per-layer inputs"
        );
        m.per_layer = None;
        for l in &mut m.layers {
            l.per_layer = None;
        }
    });
}

#[test]
fn qwen35moe_tiny_f32() {
    compare("qwen35moe-tiny", "f32");
}

#[test]
fn qwen35moe_tiny_q8_0() {
    compare("qwen35moe-tiny", "q8_0");
}

#[test]
fn qwen35moe_tiny_q4_k_m() {
    compare("qwen35moe-tiny", "q4_k_m");
}

/// The reference forward's recurrent state is carried across calls and reset by
/// `clear`: a prompt fed after another sequence was cleared gives a fresh reference's
/// logits; and the shared-expert gate and the attention output gate are each needed to
/// meet the targets (on the Q8_0 file, whose reference run is the quickest).
#[test]
fn qwen35moe_state_is_carried_and_each_gate_is_needed() {
    let (case, ty) = ("qwen35moe-tiny", "q8_0");
    let model = model(case, ty);
    let ids = golden_ids(case);
    let n = 24;
    let mut fresh = Reference::new(&model);
    let want: Vec<Vec<f32>> = ids[..n]
        .iter()
        .map(|&t| fresh.forward(t).expect("forward"))
        .collect();
    let mut reused = Reference::new(&model);
    for &t in &ids[100..117] {
        reused.forward(t).expect("forward");
    }
    reused.clear();
    assert!(reused.is_empty());
    for (p, &t) in ids[..n].iter().enumerate() {
        assert_eq!(
            reused.forward(t).expect("forward"),
            want[p],
            "position {p} after clear()"
        );
    }
    let mut no_shared_gate = model.clone();
    for l in &mut no_shared_gate.layers {
        if let flint_engine::model::Ffn::Moe(moe) = &mut l.ffn {
            assert!(
                moe.shared_gate.take().is_some(),
                "every layer gates its shared expert"
            );
        }
    }
    let f = reference_teacher_forced(case, ty, &no_shared_gate);
    println!("{case} {ty} without the shared-expert gate: {}", show(&f));
    assert!(
        !meets(&f),
        "dropping the shared-expert gate still meets the targets: {}",
        show(&f)
    );
    // The attention layers' gate: their query projections keep only the query rows
    // (whole rows of blocks, whatever the type).
    let mut no_attn_gate = model.clone();
    let (h, dk) = (model.spec.n_heads, model.spec.head_dim_k);
    let mut gated = 0;
    for (l, ld) in no_attn_gate
        .layers
        .iter_mut()
        .zip(no_attn_gate.spec.layers.iter_mut())
    {
        if ld.attn_gate {
            let rb = l.wq.row_bytes();
            let kept: Vec<u8> = (0..h)
                .flat_map(|hq| l.wq.bytes()[2 * hq * dk * rb..(2 * hq + 1) * dk * rb].to_vec())
                .collect();
            l.wq.dims = vec![l.wq.dims[0], h * dk];
            l.wq.data = flint_hal::WeightSource::from_vec(kept);
            ld.attn_gate = false;
            gated += 1;
        }
    }
    assert!(gated > 0, "{case} has gated attention layers");
    let f = reference_teacher_forced(case, ty, &no_attn_gate);
    println!(
        "{case} {ty} without the attention output gate: {}",
        show(&f)
    );
    assert!(
        !meets(&f),
        "dropping the attention gate still meets the targets: {}",
        show(&f)
    );
}

/// `flint run` and `flint inspect` on a qwen35moe file: the device forward runs it (its
/// Gated DeltaNet layers' state in the KV manager's recurrent group), and inspect lists
/// the layers' mixers.
#[test]
fn qwen35moe_runs_on_the_device_and_inspect_lists_its_mixers() {
    let case = "qwen35moe-tiny";
    let entry = &manifest(case)["models"]["q8_0"];
    let p = committed(
        case,
        entry["file"].as_str().expect("file"),
        entry["sha256"].as_str().expect("sha256"),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["run", "-m"])
        .arg(&p)
        .args(["-p", "hello", "-n", "4", "--temperature", "0"])
        .output()
        .expect("flint runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "flint run fails: {stderr}");
    assert!(stderr.contains("generation 4 tok"), "{stderr}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flint"))
        .arg("inspect")
        .arg(&p)
        .output()
        .expect("flint inspect runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("runs: yes (qwen35moe model")
            && stdout.contains("mixers: 3 Gated DeltaNet layers (2 key heads, 4 value heads of 64, convolution of 4), 1 attention layers (1 with an output gate)"),
        "{stdout}"
    );
}

/// The largest difference between `row(pos)` and llama.cpp's logits on its top 20 at
/// each position of the logits golden `golden` (each position's offset removed, as in
/// [`golden_common::teacher_forced_figures`]).
fn max_top_diff<'a>(golden: &Value, row: &dyn Fn(usize) -> &'a [f32]) -> f64 {
    let mut worst = 0.0f64;
    for (i, pos) in golden["positions"]
        .as_array()
        .expect("positions")
        .iter()
        .enumerate()
    {
        let at = pos["pos"].as_u64().map_or(i, |p| p as usize);
        let r = row(at);
        let diffs: Vec<f64> = pos["top"]
            .as_array()
            .expect("top")
            .iter()
            .map(|p| r[p[0].as_u64().expect("id") as usize] as f64 - p[1].as_f64().expect("logit"))
            .collect();
        let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
        worst = diffs.iter().fold(worst, |w, d| w.max((d - mean).abs()));
    }
    worst
}

/// The largest difference between two logits goldens of the same ids on the first's top
/// 20 (the second's logits looked up by id).
fn golden_gap(a: &Value, b: &Value) -> f64 {
    let (pa, pb) = (
        a["positions"].as_array().expect("positions"),
        b["positions"].as_array().expect("positions"),
    );
    assert_eq!(pa.len(), pb.len(), "two goldens of the same positions");
    let mut worst = 0.0f64;
    for (x, y) in pa.iter().zip(pb) {
        let of = |p: &Value| -> Vec<(u64, f64)> {
            p["top"]
                .as_array()
                .expect("top")
                .iter()
                .map(|e| (e[0].as_u64().expect("id"), e[1].as_f64().expect("logit")))
                .collect()
        };
        let (tx, ty) = (of(x), of(y));
        let shared: Vec<f64> = tx
            .iter()
            .filter_map(|(id, l)| ty.iter().find(|(j, _)| j == id).map(|(_, m)| l - m))
            .collect();
        let mean = shared.iter().sum::<f64>() / shared.len().max(1) as f64;
        worst = shared.iter().fold(worst, |w, d| w.max((d - mean).abs()));
    }
    worst
}

/// `FLINT_CPU_AMX=1` on a Q8_0 or Q4_K_M file (`ty`) against llama.cpp's AMX build
/// (`tools/golden/amx_goldens.sh`: its Q8_0, Q4_K and Q6_K matrices on AMX tiles for a
/// batch, its VNNI kernels for one row, one order for both): the 2,048 ids teacher-forced
/// in one batch (the tiles) and every greedy chain (one row a step) give llama.cpp's
/// logits on its top 20 / top 5 to [`DECODE_LOGIT_DIFF`], while the non-AMX golden of
/// the same file lies further from it than that (so the comparison tells the two orders
/// apart). The device takes the tiles where this process can run AMX-INT8, the same
/// orders on AVX-512 VNNI elsewhere; below AVX-512 VNNI the test says so and checks
/// nothing else.
fn compare_amx(case: &str, ty: &str) {
    let dir = data(case);
    let meta = read_json(&dir.join("amx.json"));
    assert_eq!(
        meta["models"][ty]["sha256"],
        manifest(case)["models"][ty]["sha256"],
        "{case} {ty}: amx.json was made from another model file (rerun tools/golden/amx_goldens.sh {case})"
    );
    let golden = read_json(&dir.join(format!("logits-{ty}-amx.json")));
    let plain = read_json(&dir.join(format!("logits-{ty}.json")));
    let gap = golden_gap(&golden, &plain);
    assert!(
        gap > DECODE_LOGIT_DIFF,
        "{case} {ty}: llama.cpp's AMX and non-AMX goldens agree to {gap:.2e}: the comparison would not tell the orders apart"
    );
    let level = flint_hal_cpu::SimdLevel::detect();
    if level < flint_hal_cpu::SimdLevel::Avx512Vnni {
        eprintln!("{case} {ty}: no AVX-512 VNNI on this CPU: the AMX order is not checked here");
        return;
    }
    let model = model(case, ty);
    let opts = flint_hal::DeviceOptions::from_env().expect("device options");
    let dev = flint_hal_cpu::CpuDevice::with_level(&opts, flint_hal_cpu::SimdLevel::Avx512Vnni)
        .expect("cpu device opens")
        .with_float_order(flint_hal_cpu::FloatOrder::LlamaCpp)
        .with_amx(true);
    assert!(dev.amx().0, "{case} {ty}: the device takes the AMX path");
    let dm = DeviceModel::stage(&model, std::sync::Arc::new(dev), &mut |_, _| {})
        .expect("stages on cpu");
    let ids = golden_ids(case);
    assert_eq!(
        ids_of(&golden["ids"]),
        ids,
        "{case} {ty}: the AMX golden's ids"
    );
    let mut s = Session::new(&dm, ids.len()).expect("session");
    let all = s.feed(&ids, true).expect("teacher-forced forward");
    let v = model.spec.vocab;
    let tf = max_top_diff(&golden, &|p| &all[p * v..(p + 1) * v]);
    let tf_plain = max_top_diff(&plain, &|p| &all[p * v..(p + 1) * v]);
    let text =
        std::fs::read_to_string(dir.join(format!("greedy-{ty}-amx.jsonl"))).expect("greedy golden");
    let chains = chains_from_jsonl(&text);
    assert_eq!(chains.len(), 3, "{case} {ty}: three greedy chains");
    let greedy = replay_greedy(&dm, &chains, NEAR_TIE);
    println!(
        "{case} {ty} with FLINT_CPU_AMX=1 ({}): teacher-forced max logit diff on llama.cpp's top 20 {tf:.2e} from its AMX build ({tf_plain:.2e} from its non-AMX build; the two goldens {gap:.2e} apart); greedy {greedy:?}",
        if flint_hal_cpu::kernels::amx::available() {
            "Q8_0 on AMX tiles"
        } else {
            "on AVX-512 VNNI"
        }
    );
    assert!(
        tf <= DECODE_LOGIT_DIFF,
        "{case} {ty}: teacher-forced logits {tf:.2e} from llama.cpp's AMX build (bound {DECODE_LOGIT_DIFF:.0e})"
    );
    let g = greedy.unwrap_or_else(|e| panic!("{case} {ty}: {e}"));
    assert_eq!(
        g.identical, g.chains,
        "{case} {ty}: every chain is llama.cpp's"
    );
    assert!(
        g.max_diff <= DECODE_LOGIT_DIFF,
        "{case} {ty}: greedy logits {:.2e} from llama.cpp's AMX build (bound {DECODE_LOGIT_DIFF:.0e})",
        g.max_diff
    );
}

macro_rules! amx_tests {
    ($($name:ident: $case:literal $ty:literal;)*) => {
        $(
            #[test]
            fn $name() {
                compare_amx($case, $ty);
            }
        )*
    };
}

amx_tests! {
    llama_tiny_q8_0_amx: "llama-tiny" "q8_0";
    llama_tiny_q4_k_m_amx: "llama-tiny" "q4_k_m";
    gemma3_tiny_q8_0_amx: "gemma3-tiny" "q8_0";
    gemma3_tiny_q4_k_m_amx: "gemma3-tiny" "q4_k_m";
    qwen3_tiny_q8_0_amx: "qwen3-tiny" "q8_0";
    qwen3_tiny_q4_k_m_amx: "qwen3-tiny" "q4_k_m";
}
