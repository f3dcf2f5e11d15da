//! Automatic prefix caching through the paged engine: on the `tiny` Flint checkpoint
//! (hybrid layers, a sliding window of 8, much shorter than the shared prefixes here) and
//! on the default model (Gemma 3 270M, a window of 512, a shared prefix of 1,000 tokens).
//! Greedy outputs are the same with the cache on and off; a request after a shared
//! prefix computes at most a fifth of the prompt tokens the first one did (counted from
//! the engine's step stats); a pool too small to keep every prefix evicts and keeps
//! serving every request correctly.

mod flint_common;
use flint_common::*;

use std::collections::HashMap;

use flint_engine::kv::{PagedModel, RequestId};
use flint_engine::model::Model;
use flint_engine::sample::{SamplerConfig, StopConditions};
use flint_engine::sched::{LLMEngine, RequestParams, Scheduler, SchedulerConfig, StepModel};

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        sampler: SamplerConfig::greedy(),
        max_tokens,
        stop: StopConditions::default(),
    }
}

/// An engine over the tiny model with `blocks` blocks of `bs` tokens per group.
fn tiny_engine(
    model: &Model,
    bs: usize,
    blocks: [usize; 2],
    max_seqs: usize,
    budget: usize,
    prefix_caching: bool,
) -> LLMEngine<PagedModel> {
    let (paged, mut kv) = PagedModel::with_pools(on_cpu(model), bs, &blocks).expect("paged");
    kv.set_prefix_caching(prefix_caching);
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: max_seqs,
            max_num_batched_tokens: budget,
            max_model_len: model.spec.context_length,
        },
        kv,
    );
    LLMEngine::new(paged, sched, None)
}

/// Runs until idle; returns every request's tokens.
fn drain<M: StepModel>(e: &mut LLMEngine<M>) -> HashMap<RequestId, Vec<u32>> {
    let mut out: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut guard = 0;
    while e.has_unfinished() {
        for o in e.step().expect("step") {
            out.entry(o.id).or_default().extend(o.token);
        }
        guard += 1;
        assert!(guard < 100_000, "the engine does not finish");
    }
    out
}

/// Runs one request alone to the end; returns its tokens and the tokens the engine
/// computed up to its first sampled token (its time to first token, in tokens).
fn alone<M: StepModel>(e: &mut LLMEngine<M>, prompt: &[u32], n: usize) -> (Vec<u32>, usize) {
    assert!(!e.has_unfinished());
    let id = e.add_request(prompt.to_vec(), greedy(n)).expect("admitted");
    let (mut toks, mut to_first) = (Vec::new(), None);
    let mut computed = 0;
    while e.has_unfinished() {
        for o in e.step().expect("step") {
            assert_eq!(o.id, id);
            toks.extend(o.token);
        }
        computed += e.last_step().num_tokens;
        if to_first.is_none() && !toks.is_empty() {
            to_first = Some(computed);
        }
    }
    (toks, to_first.expect("a first token"))
}

#[test]
fn tiny_shared_prefix_is_computed_once_with_the_same_outputs() {
    let model = tiny();
    let vocab = model.spec.vocab;
    let n = 12;
    // A shared prefix of 200 tokens (25 windows), then suffixes of 0 to 23 tokens.
    let system = prompt(600, 200, vocab);
    let prompts: Vec<Vec<u32>> = (0..6u64)
        .map(|i| {
            let mut p = system.clone();
            p.extend(prompt(610 + i, (i as usize * 9) % 24, vocab));
            p
        })
        .collect();
    let mut outs = Vec::new();
    for on in [true, false] {
        let mut e = tiny_engine(&model, 4, [512, 128], 4, 64, on);
        // The first request alone, then the second alone: its prefix is cached.
        let (a, first) = alone(&mut e, &prompts[1], n);
        let (b, second) = alone(&mut e, &prompts[2], n);
        eprintln!("cache {on}: tokens to the first token {first} then {second}");
        assert_eq!(first, prompts[1].len());
        if on {
            assert!(
                second * 5 <= first,
                "the second request computed {second} tokens, the first {first}"
            );
            let st = e.scheduler().kv().prefix_cache_stats();
            assert_eq!(st.hits, 200, "200 tokens of 4-token blocks hit");
        } else {
            assert_eq!(second, prompts[2].len());
            assert_eq!(e.scheduler().kv().prefix_cache_stats().cached_blocks, 0);
        }
        // The rest arrive together, the exact repeat of a prompt among them.
        let ids: Vec<RequestId> = prompts
            .iter()
            .chain([&prompts[1]])
            .map(|p| e.add_request(p.clone(), greedy(n)).expect("admitted"))
            .collect();
        let mut got = drain(&mut e);
        assert!(e.scheduler().kv().all_free(), "every block is back");
        let mut all = vec![a, b];
        all.extend(ids.iter().map(|id| got.remove(id).expect("output")));
        outs.push(all);
    }
    assert_eq!(
        outs[0], outs[1],
        "greedy outputs differ with the cache on and off"
    );
    // And the same as each request alone on the single-sequence forward.
    let dm = on_cpu(&model);
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(outs[0][2 + i], device_chain(&dm, p, n), "request {i}");
    }
}

#[test]
fn tiny_eviction_under_a_small_pool_keeps_serving() {
    let model = tiny();
    let vocab = model.spec.vocab;
    let n = 10;
    // Three families of a 60-token prefix, four requests each: 12 requests of 70-80
    // tokens, 30 full blocks of 4 per family prefix and 2-5 of its own per request.
    let prompts: Vec<Vec<u32>> = (0..12u64)
        .map(|i| {
            let mut p = prompt(700 + i % 3, 60, vocab);
            p.extend(prompt(720 + i, 10 + (i as usize % 4) * 3, vocab));
            p
        })
        .collect();
    // Each request run alone, with room to spare and no cache.
    let dm = on_cpu(&model);
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| device_chain(&dm, p, n)).collect();
    // A full-attention pool of 48 blocks (192 tokens): one family's prefix and a request
    // or two at a time, so cached prefixes are evicted for one another, and requests are
    // preempted.
    let mut e = tiny_engine(&model, 4, [48, 48], 4, 32, true);
    let mut got: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut ids = Vec::new();
    // Waves: requests arrive while others run.
    for wave in prompts.chunks(3) {
        for p in wave {
            ids.push(e.add_request(p.clone(), greedy(n)).expect("admitted"));
        }
        for _ in 0..15 {
            for o in e.step().expect("step") {
                got.entry(o.id).or_default().extend(o.token);
            }
        }
    }
    for (id, t) in drain(&mut e) {
        got.entry(id).or_default().extend(t);
    }
    let st = e.scheduler().kv().prefix_cache_stats();
    eprintln!("prefix cache: {st:?}");
    assert!(st.hits > 0, "no prefix was reused");
    assert!(
        st.evictions > 0,
        "the pools held every prefix: nothing was evicted"
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(got[id], want[i], "request {i}");
    }
    assert!(e.scheduler().kv().all_free());
}

#[test]
fn gemma_a_1000_token_system_prompt_is_computed_once() {
    let n = 8;
    let mut runs = Vec::new();
    for on in [true, false] {
        let mut e = gemma_engine(128 << 20, 4, 512, on);
        let vocab = e.model().model().spec().vocab;
        // 1,000 tokens of system prompt (longer than the window of 512), then questions.
        let system = prompt(800, 1000, vocab);
        let ask = |i: u64, len: usize| {
            let mut p = system.clone();
            p.extend(prompt(810 + i, len, vocab));
            p
        };
        let (a, first) = alone(&mut e, &ask(0, 30), n);
        let (b, second) = alone(&mut e, &ask(1, 40), n);
        eprintln!("cache {on}: tokens to the first token {first} then {second}");
        if on {
            assert!(
                second * 5 <= first,
                "the second request computed {second} tokens, the first {first}"
            );
        } else {
            assert_eq!(second, 1040);
        }
        assert!(e.scheduler().kv().all_free());
        runs.push(vec![a, b]);
    }
    assert_eq!(
        runs[0], runs[1],
        "greedy outputs differ with the cache on and off"
    );
}

#[test]
fn gemma_eviction_under_a_small_kv_memory_keeps_serving() {
    // About 13 MB: a sliding pool of 41 blocks of 16 (one window and a chunk of 128) and
    // a full pool of 59 blocks (944 tokens), while two system prompts of 500 tokens
    // and their questions need 68: serving one family evicts the other.
    let mut e = gemma_engine(13_000_000, 1, 128, true);
    let (full_blocks, sliding_blocks) = {
        let kv = e.scheduler().kv();
        (kv.num_blocks(0), kv.num_blocks(1))
    };
    eprintln!("pools: full {full_blocks}, sliding {sliding_blocks}");
    assert!(
        full_blocks * 16 < 2 * 540,
        "the full pool holds both families"
    );
    let vocab = e.model().model().spec().vocab;
    let n = 8;
    let system = [prompt(900, 500, vocab), prompt(901, 500, vocab)];
    let ask = |family: usize, q: u64| {
        let mut p = system[family].clone();
        p.extend(prompt(910 + q, 30, vocab));
        p
    };
    let (a1, _) = alone(&mut e, &ask(0, 1), n);
    let (a2, a2_cost) = alone(&mut e, &ask(0, 2), n);
    let (_, b1_cost) = alone(&mut e, &ask(1, 1), n);
    let (b2, b2_cost) = alone(&mut e, &ask(1, 2), n);
    // Family 0's prefix was evicted (in part) while family 1 ran: the first request
    // again, computed (in part) again.
    let (a3, a3_cost) = alone(&mut e, &ask(0, 1), n);
    let st = e.scheduler().kv().prefix_cache_stats();
    eprintln!("computed to the first token: {a2_cost} {b1_cost} {b2_cost} {a3_cost}; {st:?}");
    assert!(
        a2_cost * 5 <= 530 && b2_cost * 5 <= 530,
        "the prefix was reused"
    );
    assert!(st.evictions > 0, "nothing was evicted");
    assert!(a3_cost > a2_cost, "family 0 survived family 1 whole");
    assert_eq!(a3, a1, "the same prompt after eviction");
    let dm = e.model().model();
    assert_eq!(a2, device_chain(dm, &ask(0, 2), n));
    assert_eq!(b2, device_chain(dm, &ask(1, 2), n));
    assert!(e.scheduler().kv().all_free());
}
