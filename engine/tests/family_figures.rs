//! Figures of every dense family against llama.cpp's goldens
//! (`engine/tests/data/families/CASE`), on the device forward (cpu) and, with
//! `FLINT_FIGURES_REFERENCE=1`, on the reference forward: teacher-forced top-1 agreement
//! and mean KL over llama.cpp's top 20 at the golden positions (the 2,048 ids as one
//! batch, as llama.cpp computed them), and the greedy chains. The f32 files are not
//! committed: `FLINT_FAMILIES_F32=DIR` names a folder holding `CASE.gguf` as the case's
//! manifest synthesises it (their sha256 is checked), else only the quantized files run.
//!
//! `FLINT_FIGURES_CASE=CASE` runs one case only.
//!
//! `cargo test -p flint-engine --test family_figures -- --ignored --nocapture` prints one
//! line per case and file type and fails on a miss of the targets (greedy ids equal,
//! top-1 >= 99%, mean KL <= 1e-3).

use std::path::{Path, PathBuf};

use flint_engine::forward::reference::Reference;
use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::{load_model, Model};
use flint_engine::sample::argmax;
use serde_json::Value;

const CASES: [&str; 6] = [
    "llama-tiny",
    "qwen2-tiny",
    "qwen3-tiny",
    "gemma3-tiny",
    "gemma3-tiny-4b",
    "gemma3-tiny-27b",
];

fn data(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/families/{case}"))
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("json")
}

fn on_cpu(model: &Model) -> DeviceModel {
    let dev = flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    DeviceModel::stage(model, dev, &mut |_, _| {}).expect("stages on cpu")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Log-sum-exp of a row.
fn lse(row: &[f32]) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// Top-1 agreement and mean KL(llama.cpp || ours) over llama.cpp's top 20, and the
/// largest logit difference on them.
struct Tf {
    n: usize,
    top1: usize,
    kl: f64,
    max_diff: f32,
}

fn teacher_forced(golden: &Value, row_at: &dyn Fn(usize) -> Vec<f32>) -> Tf {
    let mut t = Tf {
        n: 0,
        top1: 0,
        kl: 0.0,
        max_diff: 0.0,
    };
    for p in golden["positions"].as_array().expect("positions") {
        let pos = p["pos"].as_u64().expect("pos") as usize;
        let row = row_at(pos);
        let our_lse = lse(&row);
        let their_lse = p["lse"].as_f64().expect("lse");
        let top = p["top"].as_array().expect("top");
        let best = top[0][0].as_u64().expect("id") as usize;
        t.top1 += usize::from(argmax(&row) == best);
        let mut kl = 0.0;
        for e in top {
            let id = e[0].as_u64().expect("id") as usize;
            let l = e[1].as_f64().expect("logit");
            let lp = l - their_lse;
            let lq = row[id] as f64 - our_lse;
            kl += lp.exp() * (lp - lq);
            t.max_diff = t.max_diff.max((row[id] - l as f32).abs());
        }
        t.kl += kl;
        t.n += 1;
    }
    t.kl /= t.n.max(1) as f64;
    t
}

/// The greedy chains of a golden file replayed on a forward, teacher-forced on
/// llama.cpp's ids: steps whose argmax is llama.cpp's, steps, the largest logit
/// difference on llama.cpp's top 5, and the smallest llama.cpp margin where the argmax
/// differs.
struct Greedy {
    agree: usize,
    steps: usize,
    max_diff: f32,
    miss_margin: f64,
}

/// `chain(prompt, steps)` gives the logits after the prompt and after each step's id.
fn greedy(chains: &str, mut chain: impl FnMut(&[u32], &[u32]) -> Vec<Vec<f32>>) -> Greedy {
    let mut g = Greedy {
        agree: 0,
        steps: 0,
        max_diff: 0.0,
        miss_margin: f64::INFINITY,
    };
    for line in chains.lines().filter(|l| !l.trim().is_empty()) {
        let c: Value = serde_json::from_str(line).expect("chain");
        let prompt = ids_of(&c["prompt_ids"]);
        let steps = c["steps"].as_array().expect("steps");
        let want: Vec<u32> = steps
            .iter()
            .map(|s| s["id"].as_u64().expect("id") as u32)
            .collect();
        let rows = chain(&prompt, &want);
        for (st, row) in steps.iter().zip(&rows) {
            g.steps += 1;
            if argmax(row) as u64 == st["id"].as_u64().expect("id") {
                g.agree += 1;
            } else {
                g.miss_margin = g.miss_margin.min(st["margin"].as_f64().expect("margin"));
            }
            for e in st["top"].as_array().expect("top") {
                let id = e[0].as_u64().expect("id") as usize;
                let l = e[1].as_f64().expect("logit") as f32;
                g.max_diff = g.max_diff.max((row[id] - l).abs());
            }
        }
    }
    g
}

fn device_chain(dm: &DeviceModel, prompt: &[u32], want: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(dm, prompt.len() + want.len() + 1).expect("session");
    let mut rows = vec![s.feed(prompt, false).expect("prefill")];
    for &w in &want[..want.len() - 1] {
        rows.push(s.feed(&[w], false).expect("decode"));
    }
    rows
}

/// The reference following llama.cpp's kernels for a prompt batch asking for its last
/// logits, then one token per call.
fn reference_chain(model: &Model, prompt: &[u32], want: &[u32]) -> Vec<Vec<f32>> {
    let mut r = Reference::new(model);
    r.set_prompt_batch(prompt.len());
    let mut last = Vec::new();
    for &t in prompt {
        last = r.forward(t).expect("reference");
    }
    let mut rows = vec![last];
    for &w in &want[..want.len() - 1] {
        rows.push(r.forward(w).expect("reference"));
    }
    rows
}

fn show(g: &Greedy) -> String {
    let miss = if g.agree == g.steps {
        String::new()
    } else {
        format!(
            ", smallest llama.cpp margin where ours differs {:.3e}",
            g.miss_margin
        )
    };
    format!(
        "greedy {}/{} (max |d logit| on llama.cpp's top 5 {:.3e}{miss})",
        g.agree, g.steps, g.max_diff
    )
}

fn f32_file(case: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("FLINT_FAMILIES_F32")?;
    let p = Path::new(&dir).join(format!("{case}.gguf"));
    p.exists().then_some(p)
}

#[test]
#[ignore = "measures every family against llama.cpp (minutes); run with --ignored --nocapture"]
fn families_against_llamacpp() {
    let reference = std::env::var("FLINT_FIGURES_REFERENCE").as_deref() == Ok("1");
    let only = std::env::var("FLINT_FIGURES_CASE").ok();
    let mut misses = Vec::new();
    for case in CASES {
        if only.as_deref().is_some_and(|o| o != case) {
            continue;
        }
        let dir = data(case);
        let ids = ids_of(&json(&dir.join("ids.json"))["ids"]);
        for ty in ["f32", "q8_0", "q4_k_m"] {
            let path = if ty == "f32" {
                match f32_file(case) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                dir.join(format!("model-{ty}.gguf"))
            };
            let golden_path = dir.join(format!("logits-{ty}.json"));
            if !path.exists() || !golden_path.exists() {
                continue;
            }
            let golden = json(&golden_path);
            assert_eq!(ids_of(&golden["ids"]), ids);
            let model = load_model(&path).expect("loads");
            let vocab = model.spec.vocab;
            let dm = on_cpu(&model);
            let mut s = Session::new(&dm, ids.len()).expect("session");
            let all = s.feed(&ids, true).expect("device forward");
            let dev = teacher_forced(&golden, &|p| all[p * vocab..(p + 1) * vocab].to_vec());
            let chains =
                std::fs::read_to_string(dir.join(format!("greedy-{ty}.jsonl"))).unwrap_or_default();
            let g = greedy(&chains, |p, w| device_chain(&dm, p, w));
            println!(
                "{case:16} {ty:7} device:    top-1 {}/{} ({:.2}%), mean KL {:.3e}, max |d logit| {:.3e}, {}",
                dev.top1,
                dev.n,
                100.0 * dev.top1 as f64 / dev.n as f64,
                dev.kl,
                dev.max_diff,
                show(&g)
            );
            if dev.top1 * 100 < dev.n * 99 || dev.kl > 1e-3 || g.agree != g.steps {
                misses.push(format!("{case} {ty} device"));
            }
            if reference {
                let mut r = Reference::new(&model);
                r.set_batch_len(ids.len());
                let rows: Vec<Vec<f32>> = ids
                    .iter()
                    .map(|&t| r.forward(t).expect("reference"))
                    .collect();
                let re = teacher_forced(&golden, &|p| rows[p].clone());
                let g = greedy(&chains, |p, w| reference_chain(&model, p, w));
                println!(
                    "{case:16} {ty:7} reference: top-1 {}/{} ({:.2}%), mean KL {:.3e}, max |d logit| {:.3e}, {}",
                    re.top1,
                    re.n,
                    100.0 * re.top1 as f64 / re.n as f64,
                    re.kl,
                    re.max_diff,
                    show(&g)
                );
                if re.top1 * 100 < re.n * 99 || re.kl > 1e-3 || g.agree != g.steps {
                    misses.push(format!("{case} {ty} reference"));
                }
            }
        }
    }
    // The split llama file, opened from its first shard, gives the single file's logits.
    let dir = data("llama-tiny");
    let ids = ids_of(&json(&dir.join("ids.json"))["ids"]);
    let logits = |p: &Path| {
        let m = load_model(p).expect("loads");
        let dm = on_cpu(&m);
        let mut s = Session::new(&dm, 256).expect("session");
        s.feed(&ids[..256], true).expect("forward")
    };
    let single = logits(&dir.join("model-q8_0.gguf"));
    let split = logits(&dir.join("model-q8_0-00001-of-00004.gguf"));
    let same = single == split;
    println!("llama-tiny q8_0 split (4 shards) against the single file: logits equal: {same}");
    if !same {
        misses.push("llama-tiny split".into());
    }
    assert!(misses.is_empty(), "targets missed: {misses:?}");
}
