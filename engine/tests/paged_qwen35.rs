//! The paged engine on a `qwen35moe` file (three Gated DeltaNet layers, then a gated
//! full-attention layer, experts): the recurrent state group of the KV manager through
//! the device forward. A prompt fed in chunks gives the logits of one pass; requests
//! preempted mid-generation (their state slots and KV blocks taken back, their tokens
//! recomputed) give the tokens of the same requests run alone; every block and state
//! slot is back in its pool after every request ends.
//!
//! The file is the committed `qwen35moe-tiny` Q8_0 golden model
//! (`engine/tests/data/families/qwen35moe-tiny`, made by `flint synth --arch qwen35moe`).

mod flint_common;
use flint_common::{device_chain, prompt};

use std::collections::HashMap;
use std::path::Path;

use flint_engine::forward::{DeviceModel, Session};
use flint_engine::kv::{GroupKind, PagedModel, RequestId};
use flint_engine::model::{load_model, Model};
use flint_engine::sample::{argmax, SamplerConfig, StopConditions};
use flint_engine::sched::{LLMEngine, RequestParams, Scheduler, SchedulerConfig};

fn model() -> Model {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/families/qwen35moe-tiny/model-q8_0.gguf");
    load_model(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn on_cpu(model: &Model) -> DeviceModel {
    let dev = flint_engine::model::devices::open(Some("cpu")).expect("cpu device opens");
    DeviceModel::stage(model, dev, &mut |_, _| {}).expect("stages on cpu")
}

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        sampler: SamplerConfig::greedy(),
        max_tokens,
        stop: StopConditions::default(),
    }
}

/// An engine with `full` blocks of 4 tokens in the full-attention pool and `slots`
/// state slots, `max_seqs` running at most, `budget` tokens a step.
fn engine(
    model: &Model,
    full: usize,
    slots: usize,
    max_seqs: usize,
    budget: usize,
) -> LLMEngine<PagedModel> {
    let dm = on_cpu(model);
    let kinds: Vec<GroupKind> = dm.kv_groups().iter().map(|g| g.kind).collect();
    assert_eq!(
        kinds,
        [GroupKind::Full, GroupKind::Recurrent],
        "qwen35moe-tiny: a full-attention group and a recurrent one"
    );
    let (paged, kv) = PagedModel::with_pools(dm, 4, &[full, slots]).expect("paged model");
    assert!(
        !kv.prefix_caching(),
        "no prefix caching beside recurrent state"
    );
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

/// Runs the engine until every request ends: the tokens per request, the most
/// preemptions of one request, the largest batch.
fn drain(
    e: &mut LLMEngine<PagedModel>,
    ids: &[RequestId],
) -> (HashMap<RequestId, Vec<u32>>, usize, usize) {
    let mut out: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let (mut preempted, mut batch) = (0, 0);
    let mut guard = 0;
    while e.has_unfinished() {
        for o in e.step().expect("step") {
            if let Some(t) = o.token {
                out.entry(o.id).or_default().push(t);
            }
        }
        batch = batch.max(e.last_step().num_seqs);
        for &id in ids {
            if let Some(s) = e.scheduler().get(id) {
                preempted = preempted.max(s.preemptions);
            }
        }
        guard += 1;
        assert!(guard < 10_000, "the engine does not finish");
    }
    (out, preempted, batch)
}

#[test]
fn a_prompt_in_chunks_gives_the_logits_of_one_pass() {
    let model = model();
    let dm = on_cpu(&model);
    let p = prompt(7, 40, model.spec.vocab);
    let mut one = Session::new(&dm, 64).expect("session");
    let whole = one.feed(&p, true).expect("one pass");
    let mut chunked = Session::new(&dm, 64).expect("session");
    let mut rows = Vec::new();
    for c in [&p[..7], &p[7..8], &p[8..29], &p[29..]] {
        rows.extend(chunked.feed(c, true).expect("chunk"));
    }
    assert_eq!(rows.len(), whole.len());
    let v = model.spec.vocab;
    let max_diff = rows
        .iter()
        .zip(&whole)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Every op gives a row the same bits whatever else is in the step, and the state
    // carried between chunks is the one a single pass carries from token to token.
    assert_eq!(
        max_diff, 0.0,
        "logits of the chunked prompt differ from one pass by up to {max_diff}"
    );
    // And the state matters: the last chunk alone on a fresh sequence differs.
    let mut fresh = Session::new(&dm, 64).expect("session");
    let alone = fresh.feed(&p[29..], false).expect("last chunk alone");
    let last = &whole[(p.len() - 1) * v..];
    assert_ne!(
        alone.as_slice(),
        last,
        "the last chunk without the state before it gives the same logits"
    );
    eprintln!(
        "one pass and chunks: top token {}; the last chunk alone: {}",
        argmax(last),
        argmax(&alone)
    );
}

#[test]
fn preemption_recomputes_the_state_and_matches_requests_run_alone() {
    let model = model();
    let vocab = model.spec.vocab;
    let n = 12;
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| prompt(200 + i, 6 + (i as usize * 5) % 9, vocab))
        .collect();

    // Each request alone, with room to spare.
    let mut alone = Vec::new();
    {
        let mut e = engine(&model, 64, 8, 8, 64);
        for p in &prompts {
            let id = e.add_request(p.clone(), greedy(n)).expect("admitted");
            let (mut out, _, batch) = drain(&mut e, &[id]);
            assert_eq!(batch, 1);
            alone.push(out.remove(&id).expect("output"));
            assert!(e.scheduler().kv().all_free(), "blocks and slots back");
        }
    }
    // The engine's chains are the single-sequence device forward's.
    let dm = on_cpu(&model);
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(a, &device_chain(&dm, &prompts[i], n), "request {i} alone");
    }

    // All 8 at once with 16 full-attention blocks (64 tokens; each request reaches up
    // to 26 tokens, 7 blocks) and 8 state slots: the pool holds a few at a time.
    let mut e = engine(&model, 16, 8, 8, 64);
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| e.add_request(p.clone(), greedy(n)).expect("admitted"))
        .collect();
    let (out, preempted, batch) = drain(&mut e, &ids);
    assert!(
        preempted > 0,
        "the pool was meant to be too small: no request was preempted"
    );
    eprintln!("most preemptions of one request: {preempted}, largest batch {batch}");
    assert!(batch > 1, "requests shared steps");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            out[id], alone[i],
            "request {i} differs from the same request run alone"
        );
    }
    assert!(
        e.scheduler().kv().all_free(),
        "every KV block and state slot is back after preemptions"
    );
}

#[test]
fn state_slots_bound_the_running_requests() {
    let model = model();
    let vocab = model.spec.vocab;
    // Two state slots, a roomy full-attention pool: at most two requests run at once.
    let mut e = engine(&model, 64, 2, 8, 64);
    let ids: Vec<RequestId> = (0..4)
        .map(|i| {
            e.add_request(prompt(300 + i, 5, vocab), greedy(6))
                .expect("admitted")
        })
        .collect();
    let (out, _, batch) = drain(&mut e, &ids);
    assert!(
        batch <= 2,
        "{batch} requests ran in one step with 2 state slots"
    );
    for id in &ids {
        assert_eq!(out[id].len(), 6, "request {id} finished");
    }
    assert!(e.scheduler().kv().all_free());
}
