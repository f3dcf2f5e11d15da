//! llama.cpp's goldens and the one way every test compares Flint with them:
//! - the greedy chains of the default model, `shared/golden/gemma3-270m/greedy.jsonl`
//!   (see `shared/golden/README.md`), or of any file in that format ([`chains_from_jsonl`]);
//! - [`teacher_forced_figures`]: top-1 agreement, mean KL(llama.cpp || ours) estimated
//!   from llama.cpp's top 20 (plus the rest of the mass as one bucket) and the rms logit
//!   difference on those 20, over a logits golden (`tools/golden/README.md`);
//! - [`replay_greedy_on`]: greedy chains replayed on a forward (the device's, or the
//!   reference's following llama.cpp's decode arithmetic), allowed to leave llama.cpp's
//!   ids only at a near-tie.
#![allow(dead_code)]

use flint_core::math::GgmlCpuBuild;
use flint_engine::forward::reference::Reference;
use flint_engine::forward::{DeviceModel, Session};
use flint_engine::model::Model;
use flint_engine::sample::argmax;
use serde_json::Value;

/// One greedy chain: the prompt (text and ids), the tokens llama.cpp chose and, per
/// step, its top-2 margin in nats.
pub struct GreedyChain {
    pub prompt_text: String,
    pub prompt: Vec<u32>,
    pub ids: Vec<u32>,
    pub margins: Vec<f64>,
    /// Per step, llama.cpp's best ids and their logits.
    pub tops: Vec<Vec<(usize, f64)>>,
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("id fits u32"))
        .collect()
}

/// Every chain of a `greedy.jsonl`-format text, in order.
pub fn chains_from_jsonl(text: &str) -> Vec<GreedyChain> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("golden line is JSON");
            let steps = v["steps"].as_array().expect("steps");
            GreedyChain {
                prompt_text: v["prompt"].as_str().unwrap_or("?").to_string(),
                prompt: ids_of(&v["prompt_ids"]),
                ids: steps
                    .iter()
                    .map(|s| u32::try_from(s["id"].as_u64().expect("id")).expect("id fits u32"))
                    .collect(),
                margins: steps
                    .iter()
                    .map(|s| s["margin"].as_f64().expect("margin"))
                    .collect(),
                tops: steps
                    .iter()
                    .map(|s| {
                        s["top"]
                            .as_array()
                            .expect("top")
                            .iter()
                            .map(|p| {
                                (
                                    p[0].as_u64().expect("id") as usize,
                                    p[1].as_f64().expect("logit"),
                                )
                            })
                            .collect()
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Every chain of the default model's file, in order.
pub fn greedy_chains() -> Vec<GreedyChain> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/gemma3-270m/greedy.jsonl"
    );
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {p}: {e}"));
    chains_from_jsonl(&text)
}

/// The teacher-forced comparison with a llama.cpp logits golden.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    /// Positions compared.
    pub n: usize,
    /// Positions where our argmax is llama.cpp's top-1.
    pub agree: usize,
    /// `agree / n`.
    pub top1: f64,
    /// Mean KL(llama.cpp || ours), from llama.cpp's top 20 and the rest as one bucket.
    pub kl: f64,
    /// The rms logit difference on llama.cpp's top 20, each position's offset removed.
    pub rms: f64,
}

/// Top-1 agreement, mean KL(llama.cpp || ours) and the rms logit difference on
/// llama.cpp's top 20 (offset removed) over the logits golden `golden`; `row(pos)` gives
/// our logits at a position (the golden's `pos` field, or the index of the entry when
/// the golden keeps every position). Prints the first few disagreements.
pub fn teacher_forced_figures<'a>(golden: &Value, row: &dyn Fn(usize) -> &'a [f32]) -> Figures {
    const SHOWN: usize = 5;
    let positions = golden["positions"].as_array().expect("positions");
    let (mut agree, mut kl_sum) = (0usize, 0.0f64);
    // Logit differences on llama.cpp's top-20 ids, after removing each position's offset
    // (logits are defined up to a constant): their spread says how far apart the two
    // engines' distributions are, in nats.
    let (mut dev_sq, mut dev_n) = (0.0f64, 0usize);
    for (i, pos) in positions.iter().enumerate() {
        let at = pos["pos"].as_u64().map_or(i, |p| p as usize);
        let row = row(at);
        let lse_ref = pos["lse"].as_f64().expect("lse");
        let top: Vec<(usize, f64)> = pos["top"]
            .as_array()
            .expect("top")
            .iter()
            .map(|p| {
                (
                    p[0].as_u64().expect("id") as usize,
                    p[1].as_f64().expect("logit"),
                )
            })
            .collect();
        let ours = argmax(row);
        if ours == top[0].0 {
            agree += 1;
        } else if i + 1 - agree <= SHOWN {
            let gm = top[0].1 - top[1].1;
            let our_gap = row[ours] - row[top[0].0];
            eprintln!(
                "  disagreement at position {at}: llama.cpp top-1 {} (its margin {gm:.4}), ours {ours} ({our_gap:.4} above llama.cpp's choice)",
                top[0].0
            );
        }
        let diffs: Vec<f64> = top.iter().map(|&(id, l)| row[id] as f64 - l).collect();
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        for d in &diffs {
            dev_sq += (d - mean) * (d - mean);
            dev_n += 1;
        }
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse: f64 = m + row.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
        let (mut kl, mut ps, mut qs) = (0.0f64, 0.0f64, 0.0f64);
        for &(id, l) in &top {
            let lp = l - lse_ref;
            let lq = row[id] as f64 - lse;
            kl += lp.exp() * (lp - lq);
            ps += lp.exp();
            qs += lq.exp();
        }
        let (pt, qt) = ((1.0 - ps).max(1e-12), (1.0 - qs).max(1e-12));
        kl += pt * (pt / qt).ln();
        kl_sum += kl;
    }
    let n = positions.len();
    if n - agree > SHOWN {
        eprintln!("  ... {} disagreements in all", n - agree);
    }
    Figures {
        n,
        agree,
        top1: agree as f64 / n.max(1) as f64,
        kl: kl_sum / n.max(1) as f64,
        rms: (dev_sq / dev_n.max(1) as f64).sqrt(),
    }
}

/// Greedy chains replayed on a device model.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    /// Chains replayed.
    pub chains: usize,
    /// Chains whose every id is llama.cpp's.
    pub identical: usize,
    /// The others: (chain, first diverging step, llama.cpp's margin there).
    pub near_ties: Vec<(usize, usize, f64)>,
    /// The largest difference from llama.cpp's logits on its best ids (offset removed),
    /// over the steps replayed up to the first divergence.
    pub max_diff: f64,
}

/// A forward that replays a greedy chain: the prompt, then one token per step.
pub trait Stepper {
    /// Starts a chain of up to `steps` steps: the logits of the prompt's last token.
    fn prefill(&mut self, prompt: &[u32], steps: usize) -> Vec<f32>;
    /// The logits after one more token.
    fn step(&mut self, token: u32) -> Vec<f32>;
}

/// The device forward: the prompt as one batch, then one token per step.
pub struct OnDevice<'m> {
    dm: &'m DeviceModel,
    session: Option<Session<'m>>,
}

impl<'m> OnDevice<'m> {
    pub fn new(dm: &'m DeviceModel) -> Self {
        Self { dm, session: None }
    }
}

impl Stepper for OnDevice<'_> {
    fn prefill(&mut self, prompt: &[u32], steps: usize) -> Vec<f32> {
        let mut s = Session::new(self.dm, prompt.len() + steps + 1).expect("session");
        let logits = s.feed(prompt, false).expect("prefill");
        self.session = Some(s);
        logits
    }

    fn step(&mut self, token: u32) -> Vec<f32> {
        let s = self.session.as_mut().expect("prefill first");
        s.feed(&[token], false).expect("decode")
    }
}

/// The reference forward following llama.cpp's arithmetic for a prompt batch asking for
/// its last token's logits, then one token per step (`Reference::set_prompt_batch`).
pub struct OnReference<'m> {
    model: &'m Model,
    build: GgmlCpuBuild,
    r: Option<Reference<'m>>,
}

impl<'m> OnReference<'m> {
    /// The reference forward in the attention order of llama.cpp's AVX-512 build.
    pub fn new(model: &'m Model) -> Self {
        Self {
            model,
            build: GgmlCpuBuild::Avx512,
            r: None,
        }
    }

    /// The same in the attention order of the given build
    /// (`Reference::set_llamacpp_build`).
    pub fn with_build(self, build: GgmlCpuBuild) -> Self {
        Self { build, ..self }
    }
}

impl Stepper for OnReference<'_> {
    fn prefill(&mut self, prompt: &[u32], _steps: usize) -> Vec<f32> {
        let mut r = Reference::new(self.model);
        r.set_llamacpp_build(self.build);
        let mut rows = r.prefill(prompt, true).expect("reference prefill");
        self.r = Some(r);
        rows.pop().expect("the prompt's last logits")
    }

    fn step(&mut self, token: u32) -> Vec<f32> {
        let r = self.r.as_mut().expect("prefill first");
        r.forward(token).expect("reference decode")
    }
}

/// Replays every chain on the device model `dm` ([`replay_greedy_on`]).
pub fn replay_greedy(
    dm: &DeviceModel,
    chains: &[GreedyChain],
    near_tie: f64,
) -> Result<Replay, String> {
    replay_greedy_on(&mut OnDevice::new(dm), chains, near_tie)
}

/// Replays every chain on a forward (our argmax fed back): each must give llama.cpp's
/// ids, or first diverge at a step whose llama.cpp margin is below `near_tie` nats.
/// `Err` names the first chain that diverged elsewhere.
pub fn replay_greedy_on(
    fwd: &mut dyn Stepper,
    chains: &[GreedyChain],
    near_tie: f64,
) -> Result<Replay, String> {
    let mut r = Replay::default();
    for (c, g) in chains.iter().enumerate() {
        r.chains += 1;
        let (prompt, want, margins) = (&g.prompt, &g.ids, &g.margins);
        let mut logits = fwd.prefill(prompt, want.len());
        let mut got = Vec::new();
        for i in 0..want.len() {
            let diffs: Vec<f64> = g.tops[i]
                .iter()
                .map(|&(id, l)| logits[id] as f64 - l)
                .collect();
            let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
            for d in diffs {
                r.max_diff = r.max_diff.max((d - mean).abs());
            }
            let t = argmax(&logits) as u32;
            got.push(t);
            if t != want[i] {
                break;
            }
            if i + 1 < want.len() {
                logits = fwd.step(t);
            }
        }
        let prompt_text = &g.prompt_text;
        match got.iter().zip(want).position(|(a, b)| a != b) {
            None => r.identical += 1,
            Some(i) => {
                eprintln!(
                    "{prompt_text:?}: first divergence at step {i} (ours {}, llama.cpp {}, llama.cpp margin {:.4})",
                    got[i], want[i], margins[i]
                );
                if margins[i] >= near_tie {
                    return Err(format!(
                        "{prompt_text:?}: diverged at step {i} (ours {}, llama.cpp {}) where llama.cpp's margin is {} >= {near_tie}",
                        got[i], want[i], margins[i]
                    ));
                }
                r.near_ties.push((c, i, margins[i]));
            }
        }
    }
    Ok(r)
}
