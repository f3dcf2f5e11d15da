//! Shared helpers of the Flint tests: the tiny checkpoint, greedy chains on both
//! forwards, the near-tie rule, and a paged engine over the default model.
#![allow(dead_code)]

use flint_engine::forward::reference::Reference;
use flint_engine::forward::{DeviceModel, Session};
use flint_engine::kv::{KvSizing, PagedModel, DEFAULT_BLOCK_SIZE};
use flint_engine::model::{load_on_device, resolve_path, Model};
use flint_engine::sample::argmax;
use flint_engine::sched::{LLMEngine, Scheduler, SchedulerConfig};
use flint_engine::synth::{synth_model, Preset};

/// The tiny preset, seed 0.
pub fn tiny() -> Model {
    synth_model(Preset::Tiny, 0).expect("tiny synthesises")
}

/// The model staged on the cpu device.
pub fn on_cpu(model: &Model) -> DeviceModel {
    let dev = flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    DeviceModel::stage(model, dev, &mut |_, _| {}).expect("stages on cpu")
}

/// Top-1 minus top-2 logit.
pub fn margin(l: &[f32]) -> f32 {
    let a = argmax(l);
    let second = l
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != a)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    l[a] - second
}

/// A greedy chain on the reference: the tokens and the margin at each step.
pub fn reference_chain(model: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let (toks, margins, _) = reference_chain_with_logits(model, prompt, n);
    (toks, margins)
}

/// [`reference_chain`] and the logits of the first generated token.
pub fn reference_chain_with_logits(
    model: &Model,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let mut r = Reference::new(model);
    let mut logits = Vec::new();
    for &t in prompt {
        logits = r.forward(t).expect("reference forward");
    }
    let first = logits.clone();
    let (mut toks, mut margins) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = argmax(&logits) as u32;
        toks.push(t);
        margins.push(margin(&logits));
        if i + 1 < n {
            logits = r.forward(t).expect("reference forward");
        }
    }
    (toks, margins, first)
}

/// A greedy chain on the device forward (prompt in one step, then one token a step).
pub fn device_chain(dm: &DeviceModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(dm, prompt.len() + n + 1).expect("session");
    let mut logits = s.feed(prompt, false).expect("device forward");
    let mut toks = Vec::new();
    for i in 0..n {
        let t = argmax(&logits) as u32;
        toks.push(t);
        if i + 1 < n {
            logits = s.feed(&[t], false).expect("device forward");
        }
    }
    toks
}

/// Reference logits of every position of `tokens`.
pub fn reference_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut r = Reference::new(model);
    tokens
        .iter()
        .map(|&t| r.forward(t).expect("reference forward"))
        .collect()
}

/// Device logits of every position of `tokens`, fed in one step.
pub fn device_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let dm = on_cpu(model);
    let mut s = Session::new(&dm, tokens.len()).expect("session");
    let l = s.feed(tokens, true).expect("device forward");
    l.chunks(model.spec.vocab).map(<[f32]>::to_vec).collect()
}

/// Largest absolute difference between two sets of logits.
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Mean absolute difference between two sets of logits.
pub fn mean_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let (mut s, mut n) = (0.0f64, 0usize);
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        s += (x - y).abs() as f64;
        n += 1;
    }
    (s / n.max(1) as f64) as f32
}

/// Standard deviation of all logits (the scale "material" differences are judged by).
pub fn logit_std(a: &[Vec<f32>]) -> f32 {
    let v: Vec<f32> = a.iter().flatten().copied().collect();
    let m = v.iter().sum::<f32>() / v.len() as f32;
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / v.len() as f32).sqrt()
}

/// Deterministic pseudo-random prompt of `n` tokens (ids >= 3, no specials).
pub fn prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut r = flint_engine::sample::Rng::new(seed);
    (0..n)
        .map(|_| 3 + (r.next_u64() % (vocab as u64 - 3)) as u32)
        .collect()
}

/// Compares two greedy chains under the near-tie rule: equal, or the first difference at
/// a step where the reference's own top-2 margin is below `tol` nats. Returns the index
/// of the first difference, if any.
pub fn check_chain(
    name: &str,
    reference: &[u32],
    margins: &[f32],
    other: &[u32],
    tol: f32,
) -> Option<usize> {
    let first = reference.iter().zip(other).position(|(a, b)| a != b);
    if let Some(i) = first {
        assert!(
            margins[i] < tol,
            "{name}: chains diverge at step {i} where the reference margin is {} (>= {tol}): ref {:?} vs {:?}",
            margins[i],
            &reference[..=i],
            &other[..=i]
        );
    }
    first
}

/// An engine over the default model on the cpu, its KV cache sized as `flint serve` does.
pub fn gemma_engine(
    memory_bytes: u64,
    max_num_seqs: usize,
    budget: usize,
    prefix_caching: bool,
) -> LLMEngine<PagedModel> {
    let path = resolve_path(None).expect("the default model is needed by this test");
    let loaded = load_on_device(&path, Some("cpu"), false).expect("the default model loads");
    let ctx = loaded.device_model.spec().context_length;
    let (paged, mut kv) = PagedModel::new(
        loaded.device_model,
        &KvSizing {
            memory_bytes,
            block_size: DEFAULT_BLOCK_SIZE,
            max_num_seqs,
            max_num_batched_tokens: budget,
        },
    )
    .expect("paged model");
    kv.set_prefix_caching(prefix_caching);
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: budget,
            max_model_len: ctx,
        },
        kv,
    );
    LLMEngine::new(paged, sched, None)
}
