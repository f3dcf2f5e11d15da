//! The paged engine on the `tiny` Flint checkpoint: continuous arrival against the
//! reference forward, preemption against the same requests run alone, isolation of the
//! two KV groups (with the defect put in on purpose), the sliding group's block bound,
//! and every block back in the pools after finish and abort.
//!
//! `tiny` has a window of 8 and two full / three sliding layers; with blocks of 4
//! tokens the sliding group may hold at most `ceil(8 / 4) + 1 = 3` live blocks per
//! request between steps, and every prompt here is longer than the window.

mod flint_common;
use flint_common::*;

use std::collections::HashMap;

use flint_engine::forward::{Batch, BatchSeq, DeviceModel, RecurrentStates};
use flint_engine::kv::{GroupKind, KvCacheManager, RequestId};
use flint_engine::kv::{KvSizing, PagedModel};
use flint_engine::model::{Model, ModelError};
use flint_engine::sample::{SamplerConfig, StopConditions};
use flint_engine::sched::{EngineError, LLMEngine, RequestParams};
use flint_engine::sched::{Scheduler, SchedulerConfig, StepModel, StepSeq};
use flint_hal::KvBuffer;

const BS: usize = 4;

/// An engine over `model` on the cpu with exactly `blocks` blocks per group
/// (`[full, sliding]`), blocks of [`BS`] tokens.
fn engine_with(
    model: &Model,
    blocks: [usize; 2],
    max_seqs: usize,
    budget: usize,
) -> LLMEngine<PagedModel> {
    engine_wired(model, BS, blocks, max_seqs, budget)
}

/// As [`engine_with`], with blocks of `bs` tokens.
fn engine_wired(
    model: &Model,
    bs: usize,
    blocks: [usize; 2],
    max_seqs: usize,
    budget: usize,
) -> LLMEngine<PagedModel> {
    let (paged, kv) = PagedModel::with_pools(on_cpu(model), bs, &blocks).expect("paged model");
    assert_eq!(
        kv.group_specs().next().map(|g| g.kind),
        Some(GroupKind::Full)
    );
    engine_over(paged, kv, model, max_seqs, budget)
}

/// An engine over `step_model` and the KV cache manager `kv`.
fn engine_over<M: StepModel>(
    step_model: M,
    kv: KvCacheManager,
    model: &Model,
    max_seqs: usize,
    budget: usize,
) -> LLMEngine<M> {
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: max_seqs,
            max_num_batched_tokens: budget,
            max_model_len: model.spec.context_length,
        },
        kv,
    );
    LLMEngine::new(step_model, sched, None)
}

/// A way of handing one KV group's layers another group's block tables: the defect the
/// isolation tests must catch.
#[derive(Clone, Copy, Debug)]
enum Miswire {
    /// The full-attention layers read and write through the sliding group's tables.
    FullReadsSliding,
    /// The sliding layers read and write through the full group's tables.
    SlidingReadsFull,
}

/// The paged forward as [`PagedModel`] wires it (one KV buffer per layer, sized by its
/// group's pool), except that the layers of group `layers` get group `tables`' block
/// tables.
struct Miswired {
    model: DeviceModel,
    kv: Vec<Box<dyn KvBuffer>>,
    block_size: usize,
    layers: usize,
    tables: usize,
}

impl StepModel for Miswired {
    fn vocab_size(&self) -> usize {
        self.model.spec().vocab
    }

    fn step(&mut self, seqs: &[StepSeq<'_>], kv: &KvCacheManager) -> Result<Vec<f32>, ModelError> {
        let mut batch = Batch {
            seqs: Vec::with_capacity(seqs.len()),
            block_size: self.block_size,
        };
        for s in seqs {
            let mut tables: Vec<&[u32]> = (0..self.model.kv_groups().len())
                .map(|g| kv.block_table(s.id, g))
                .collect();
            tables[self.layers] = kv.block_table(s.id, self.tables);
            batch.seqs.push(BatchSeq {
                tokens: s.tokens,
                start_pos: u32::try_from(s.start).expect("position fits u32"),
                block_tables: tables,
                all_logits: false,
            });
        }
        let logits = self
            .model
            .forward(&mut self.kv, &mut RecurrentStates::default(), &batch)?;
        let vocab = self.vocab_size();
        Ok(seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.sample)
            .flat_map(|(i, _)| logits[i * vocab..(i + 1) * vocab].iter().copied())
            .collect())
    }
}

/// An engine over `model` on the cpu with `blocks` blocks of [`BS`] tokens per group,
/// mis-wired as `miswire` says.
fn engine_miswired(
    model: &Model,
    blocks: [usize; 2],
    max_seqs: usize,
    budget: usize,
    miswire: Miswire,
) -> LLMEngine<Miswired> {
    let dm = on_cpu(model);
    let mut kv = KvCacheManager::new(dm.kv_groups().to_vec(), BS, &blocks);
    // As in `isolation_case`: freed sliding blocks are handed out again at once.
    kv.set_prefix_caching(false);
    let (fg, sg) = (full_group(&kv), sliding_group(&kv).0);
    let (layers, tables) = match miswire {
        Miswire::FullReadsSliding => (fg, sg),
        Miswire::SlidingReadsFull => (sg, fg),
    };
    let buffers = (0..dm.spec().n_layers())
        .map(|il| {
            let layout = dm.kv_layout(il, blocks[dm.layer_group(il)], BS);
            dm.device().alloc_kv(&layout).expect("KV buffer")
        })
        .collect();
    let step_model = Miswired {
        model: dm,
        kv: buffers,
        block_size: BS,
        layers,
        tables,
    };
    engine_over(step_model, kv, model, max_seqs, budget)
}

/// Index of the sliding group in the manager.
fn sliding_group(kv: &KvCacheManager) -> (usize, usize) {
    kv.group_specs()
        .enumerate()
        .find_map(|(g, s)| match s.kind {
            GroupKind::Sliding { window } => Some((g, window)),
            GroupKind::Full | GroupKind::Recurrent => None,
        })
        .expect("tiny has a sliding group")
}

fn full_group(kv: &KvCacheManager) -> usize {
    kv.group_specs()
        .position(|s| s.kind == GroupKind::Full)
        .expect("tiny has a full group")
}

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        sampler: SamplerConfig::greedy(),
        max_tokens,
        stop: StopConditions::default(),
    }
}

/// Tokens generated per request, and what the driver saw.
#[derive(Default)]
struct Run {
    out: HashMap<RequestId, Vec<u32>>,
    /// Most live sliding blocks any request held between steps.
    max_sliding_live: usize,
    /// Most requests in one step.
    max_batch: usize,
    /// Most preemptions seen on any request.
    max_preemptions: usize,
}

/// Runs one step, records its tokens, and checks the sliding bound for every request in
/// `ids` after it.
fn step<M: StepModel>(
    e: &mut LLMEngine<M>,
    ids: &[RequestId],
    run: &mut Run,
) -> Result<(), EngineError> {
    for o in e.step()? {
        if let Some(t) = o.token {
            run.out.entry(o.id).or_default().push(t);
        }
    }
    run.max_batch = run.max_batch.max(e.last_step().num_seqs);
    let kv = e.scheduler().kv();
    let (sg, window) = sliding_group(kv);
    let bound = window.div_ceil(kv.block_size()) + 1;
    for &id in ids {
        let live = kv.live_blocks(id, sg);
        assert!(
            live <= bound,
            "request {id} holds {live} live sliding blocks between steps (bound ceil({window}/{}) + 1 = {bound})",
            kv.block_size()
        );
        run.max_sliding_live = run.max_sliding_live.max(live);
        if let Some(s) = e.scheduler().get(id) {
            run.max_preemptions = run.max_preemptions.max(s.preemptions);
        }
    }
    Ok(())
}

fn drain<M: StepModel>(
    e: &mut LLMEngine<M>,
    ids: &[RequestId],
    run: &mut Run,
) -> Result<(), EngineError> {
    let mut guard = 0;
    while e.has_unfinished() {
        step(e, ids, run)?;
        guard += 1;
        assert!(guard < 10_000, "the engine does not finish");
    }
    Ok(())
}

fn generated(run: &Run, id: RequestId) -> usize {
    run.out.get(&id).map_or(0, Vec::len)
}

#[test]
fn continuous_arrival_matches_the_reference() {
    let model = tiny();
    let vocab = model.spec.vocab;
    let n = 24;
    let prompts = [
        prompt(11, 12, vocab),
        prompt(12, 20, vocab),
        prompt(13, 10, vocab),
    ];
    // A budget of 8 tokens: request 1's prompt of 20 is prefilled in chunks while
    // request 0 keeps decoding in the same steps.
    let mut e = engine_with(&model, [256, 256], 8, 8);
    let mut run = Run::default();
    let mut ids = vec![e
        .add_request(prompts[0].clone(), greedy(n))
        .expect("admitted")];
    // Request 0 alone until it has decoded 5 tokens.
    while generated(&run, ids[0]) < 5 {
        step(&mut e, &ids, &mut run).expect("step");
        assert_eq!(e.last_step().num_seqs, 1, "request 0 runs alone");
    }
    ids.push(
        e.add_request(prompts[1].clone(), greedy(n))
            .expect("admitted"),
    );
    step(&mut e, &ids, &mut run).expect("step");
    assert_eq!(
        e.last_step().num_seqs,
        2,
        "request 1 joins while request 0 decodes"
    );
    assert_eq!(
        e.last_step().num_tokens,
        8,
        "decode of 0 plus a 7-token chunk of 1"
    );
    while generated(&run, ids[1]) < 3 {
        step(&mut e, &ids, &mut run).expect("step");
    }
    assert!(
        generated(&run, ids[0]) < n,
        "request 0 is still running when 2 arrives"
    );
    ids.push(
        e.add_request(prompts[2].clone(), greedy(n))
            .expect("admitted"),
    );
    drain(&mut e, &ids, &mut run).expect("drain");
    assert_eq!(run.max_batch, 3, "all three requests shared a step");

    let mut identical = 0;
    for (i, p) in prompts.iter().enumerate() {
        let (r, margins) = reference_chain(&model, p, n);
        let got = &run.out[&ids[i]];
        assert_eq!(got.len(), n);
        // Batching, chunking and paging change nothing: the same request alone on the
        // single-sequence device forward gives the same tokens.
        assert_eq!(
            got,
            &device_chain(e.model().model(), p, n),
            "request {i}: the batched chain differs from the same request alone"
        );
        match check_chain(&format!("request {i}"), &r, &margins, got, 0.25) {
            None => identical += 1,
            Some(s) => eprintln!(
                "request {i}: first divergence at step {s}, reference margin {}",
                margins[s]
            ),
        }
    }
    eprintln!("{identical}/3 chains identical to the reference");
    assert!(
        e.scheduler().kv().all_free(),
        "finished requests returned every block"
    );
}

#[test]
fn preemption_recomputes_and_matches_requests_run_alone() {
    let model = tiny();
    let vocab = model.spec.vocab;
    let n = 16;
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|i| prompt(100 + i, 9 + (i as usize * 5) % 11, vocab))
        .collect();

    // Each request alone, in an engine with room to spare.
    let mut alone = Vec::new();
    {
        let mut e = engine_with(&model, [128, 64], 16, 64);
        for p in &prompts {
            let mut run = Run::default();
            let id = e.add_request(p.clone(), greedy(n)).expect("admitted");
            drain(&mut e, &[id], &mut run).expect("alone");
            assert_eq!(run.max_batch, 1);
            alone.push(run.out.remove(&id).expect("output"));
            assert!(e.scheduler().kv().all_free());
        }
    }

    // All 16 at once with a full-attention pool of 24 blocks (96 tokens): each request
    // reaches up to 35 tokens (9 blocks), so the pool holds a few of them at a time.
    let mut e = engine_with(&model, [24, 64], 16, 64);
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| e.add_request(p.clone(), greedy(n)).expect("admitted"))
        .collect();
    let mut run = Run::default();
    drain(&mut e, &ids, &mut run).expect("drain");
    assert!(
        run.max_preemptions > 0,
        "the pool was meant to be too small: no request was preempted"
    );
    eprintln!(
        "most preemptions of one request: {}, largest batch {}",
        run.max_preemptions, run.max_batch
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            run.out[id], alone[i],
            "request {i} differs from the same request run alone"
        );
    }
    assert!(
        e.scheduler().kv().all_free(),
        "every block is back after preemptions"
    );
}

/// Runs a blocker request first (so the two pools hand out different ids), then the
/// probe request; returns the probe's tokens, or the error the engine stopped with.
fn run_probe<M: StepModel>(
    e: &mut LLMEngine<M>,
    blocker: &[u32],
    probe: &[u32],
    n: usize,
) -> Result<Vec<u32>, EngineError> {
    let mut run = Run::default();
    let a = e.add_request(blocker.to_vec(), greedy(n))?;
    // The blocker prefills and decodes a little: the full group keeps all its blocks,
    // the sliding group has already handed its early blocks back.
    for _ in 0..3 {
        step(e, &[a], &mut run)?;
    }
    let b = e.add_request(probe.to_vec(), greedy(n))?;
    let ids = [a, b];
    step(e, &ids, &mut run)?;
    // Same positions, different blocks in the two groups.
    let kv = e.scheduler().kv();
    let (sg, fg) = (sliding_group(kv).0, full_group(kv));
    let (tf, ts) = (kv.block_table(b, fg), kv.block_table(b, sg));
    let differ = tf
        .iter()
        .zip(ts)
        .any(|(&x, &y)| x != y && y != flint_hal::NO_BLOCK);
    assert!(
        differ,
        "the arrangement failed: full {tf:?} and sliding {ts:?} tables agree"
    );
    drain(e, &ids, &mut run)?;
    Ok(run.out.remove(&b).unwrap_or_default())
}

/// The group-isolation check for one way of mis-wiring (`None` = correct wiring):
/// `Ok(true)` if the probe's chain equals the reference (or diverges only at a near
/// tie), `Ok(false)` if it departs, `Err` if the engine failed.
fn isolation_case(miswire: Option<Miswire>, sliding_pool: usize) -> Result<bool, EngineError> {
    let model = tiny();
    let vocab = model.spec.vocab;
    let n = 16;
    let blocker = prompt(21, 24, vocab);
    let probe = prompt(22, 18, vocab);
    let (r, margins) = reference_chain(&model, &probe, n);
    let blocks = [64, sliding_pool];
    let got = match miswire {
        None => {
            // The arrangement needs the sliding group to hand the blocks it freed out
            // again at once, so that the two pools diverge; with prefix caching they
            // stay cached, fresh ids go first, and the pools stay in step.
            let (paged, mut kv) =
                PagedModel::with_pools(on_cpu(&model), BS, &blocks).expect("paged model");
            kv.set_prefix_caching(false);
            let mut e = engine_over(paged, kv, &model, 8, 64);
            let got = run_probe(&mut e, &blocker, &probe, n)?;
            assert!(e.scheduler().kv().all_free(), "every block is back");
            got
        }
        Some(m) => {
            let mut e = engine_miswired(&model, blocks, 8, 64, m);
            let got = run_probe(&mut e, &blocker, &probe, n)?;
            assert!(e.scheduler().kv().all_free(), "every block is back");
            got
        }
    };
    let first = r.iter().zip(&got).position(|(a, b)| a != b);
    Ok(match first {
        None => got.len() == n,
        Some(i) => margins[i] < 0.25,
    })
}

// How the defect shows. Every layer writes and reads its keys through one and the same
// table within a step, so a layer fed the other group's table is wrong only where that
// table cannot back the positions the layer needs: a full layer given the sliding table
// finds the early blocks freed (`NO_BLOCK`) once the window has moved past them, and a
// sliding layer given the full table addresses blocks beyond its own buffer, which is
// sized for the sliding pool. The cpu device refuses both (the step fails); a device that
// did not check would read freed or foreign memory. Either way the chain cannot silently
// match the reference, which is what these tests require, alongside the correct wiring
// matching it in the same arrangement.

#[test]
fn full_layers_reading_the_sliding_table_is_caught() {
    // Correct wiring: the probe follows the reference.
    assert!(
        isolation_case(None, 32).expect("correct engine runs"),
        "the correct engine must match the reference"
    );
    // Full-attention layers fed the sliding group's tables: their early positions are
    // freed (or belong to other requests) there.
    match isolation_case(Some(Miswire::FullReadsSliding), 32) {
        Ok(matches) => assert!(
            !matches,
            "full layers read the sliding table and nothing noticed"
        ),
        Err(err) => eprintln!("mis-wired engine failed as it must: {err}"),
    }
}

#[test]
fn sliding_layers_reading_the_full_table_is_caught() {
    // A sliding pool of 12 blocks: the full group's ids (the blocker holds the first
    // ones) run past the sliding layers' buffers.
    assert!(
        isolation_case(None, 12).expect("correct engine runs"),
        "the correct engine must match the reference"
    );
    match isolation_case(Some(Miswire::SlidingReadsFull), 12) {
        Ok(matches) => assert!(
            !matches,
            "sliding layers read the full table and nothing noticed"
        ),
        Err(err) => eprintln!("mis-wired engine failed as it must: {err}"),
    }
}

#[test]
fn sliding_group_stays_within_its_bound_with_long_prompts() {
    let model = tiny();
    let vocab = model.spec.vocab;
    // Prompts of 30-45 tokens (the window is 8), prefilled in chunks of at most 16
    // tokens, four at a time, then 20 decode steps each; blocks of 4 (dividing the
    // window), 3 (not dividing it) and 16 (larger than it).
    let n = 20;
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| prompt(300 + i, 30 + 3 * i as usize, vocab))
        .collect();
    let mut chains: Vec<Vec<Vec<u32>>> = Vec::new();
    for bs in [4usize, 3, 16] {
        let mut e = engine_wired(&model, bs, [1024 / bs, 256 / bs + 8], 4, 16);
        let window = sliding_group(e.scheduler().kv()).1;
        assert!(prompts.iter().all(|p| p.len() > window));
        let ids: Vec<RequestId> = prompts
            .iter()
            .map(|p| e.add_request(p.clone(), greedy(n)).expect("admitted"))
            .collect();
        let mut run = Run::default();
        let mut max_full_live = 0;
        // `step` asserts the bound for every request after every step.
        while e.has_unfinished() {
            step(&mut e, &ids, &mut run).expect("step");
            let kv = e.scheduler().kv();
            let fg = full_group(kv);
            for &id in &ids {
                max_full_live = max_full_live.max(kv.live_blocks(id, fg));
            }
        }
        let bound = window.div_ceil(bs) + 1;
        eprintln!(
            "bs {bs}: most live sliding blocks {} (bound {bound}), most live full blocks {max_full_live}",
            run.max_sliding_live
        );
        // The bound is reached, not trivially met, while the full group keeps everything.
        assert!(
            run.max_sliding_live >= bound - 1,
            "bs {bs}: the sliding group never filled its window"
        );
        assert!(
            // The longest request holds 45 + n - 2 positions before its last step.
            max_full_live >= (45 + n - 2).div_ceil(bs),
            "bs {bs}: the full group keeps every position"
        );
        assert!(e.scheduler().kv().all_free());
        chains.push(ids.iter().map(|id| run.out[id].clone()).collect());
    }
    // The block size changes where keys live, never what attention sees.
    assert_eq!(chains[0], chains[1], "blocks of 3 change the outputs");
    assert_eq!(chains[0], chains[2], "blocks of 16 change the outputs");
    for (i, p) in prompts.iter().enumerate() {
        let (r, margins) = reference_chain(&model, p, n);
        check_chain(&format!("request {i}"), &r, &margins, &chains[0][i], 0.25);
    }
}

#[test]
fn abort_and_finish_return_every_block() {
    let model = tiny();
    let vocab = model.spec.vocab;
    // Two may run at once; the third waits. Budget 8: prompts prefill in chunks.
    let mut e = engine_with(&model, [64, 32], 2, 8);
    let a = e
        .add_request(prompt(41, 20, vocab), greedy(30))
        .expect("admitted");
    let b = e
        .add_request(prompt(42, 14, vocab), greedy(4))
        .expect("admitted");
    let c = e
        .add_request(prompt(43, 12, vocab), greedy(30))
        .expect("admitted");
    let ids = [a, b, c];
    let mut run = Run::default();
    // a is mid-prefill after one step of 8 tokens.
    step(&mut e, &ids, &mut run).expect("step");
    assert!(
        e.scheduler()
            .kv()
            .live_blocks(a, full_group(e.scheduler().kv()))
            > 0
    );
    // Abort a mid-prefill: b and then c take its place.
    assert!(e.abort(a));
    assert_eq!(e.scheduler().kv().block_table(a, 0), &[] as &[u32]);
    // b finishes (max_tokens 4); c runs and decodes a few tokens.
    while generated(&run, c) < 3 {
        step(&mut e, &ids, &mut run).expect("step");
    }
    assert!(e.scheduler().get(b).is_none(), "b finished");
    assert_eq!(generated(&run, b), 4);
    // Abort c mid-decode.
    assert!(e.abort(c));
    assert!(!e.abort(c), "aborting twice is refused");
    assert!(!e.has_unfinished());
    assert!(
        e.scheduler().kv().all_free(),
        "abort and finish returned every block"
    );
    // Aborting a waiting request that never held blocks.
    let mut e = engine_with(&model, [64, 32], 1, 8);
    let x = e
        .add_request(prompt(44, 10, vocab), greedy(5))
        .expect("admitted");
    let y = e
        .add_request(prompt(45, 10, vocab), greedy(5))
        .expect("admitted");
    step(&mut e, &[x, y], &mut run).expect("step");
    assert_eq!(e.scheduler().num_waiting(), 1);
    assert!(e.abort(y));
    drain(&mut e, &[x], &mut run).expect("drain");
    assert!(e.scheduler().kv().all_free());
}

#[test]
fn kv_budget_counts_the_devices_bytes_per_value() {
    // The CPU stores keys and values as f16: a budget buys twice the blocks of f32.
    let model = tiny();
    let dm = on_cpu(&model);
    let per_value = dm.device().kv_bytes_per_value();
    assert_eq!(per_value, 2, "the cpu keeps f16 keys and values");
    let spec = dm.spec().clone();
    let budget: u64 = 4 << 20;
    let (_, kv) = PagedModel::new(
        dm,
        &KvSizing {
            memory_bytes: budget,
            block_size: BS,
            max_num_seqs: 1,
            max_num_batched_tokens: 16,
        },
    )
    .expect("paged model");
    let per_layer_block = (BS * spec.n_kv_heads * (spec.head_dim_k + spec.head_dim_v)) as u64 * 2;
    let used: u64 = kv
        .group_specs()
        .enumerate()
        .map(|(g, s)| kv.num_free(g) as u64 * s.layers.len() as u64 * per_layer_block)
        .sum();
    assert!(
        used <= budget,
        "{used} bytes of blocks for a budget of {budget}"
    );
    // Sized as f32 the pools would fill at most half the budget.
    assert!(
        used > budget * 9 / 10,
        "{used} bytes of blocks for a budget of {budget}: the pools are sized as f32"
    );
}

#[test]
fn group_tables_route_to_their_own_kind() {
    // The wiring the engine uses by default: full layers' table from the full group.
    let model = tiny();
    let e = engine_with(&model, [8, 8], 1, 8);
    let kv = e.scheduler().kv();
    let fg = full_group(kv);
    let (sg, _) = sliding_group(kv);
    for (il, l) in model.spec.layers.iter().enumerate() {
        let want = if l.sliding { sg } else { fg };
        assert_eq!(kv.group_of_layer(il), Some(want), "layer {il}");
        assert_eq!(e.model().model().layer_group(il), want, "layer {il}");
    }
}

#[test]
fn prompts_beyond_max_model_len_or_the_cache_are_refused_at_once() {
    let model = tiny();
    let vocab = model.spec.vocab;
    let ctx = model.spec.context_length;
    // A full pool of 8 blocks of 4: at most 32 tokens fit.
    let mut e = engine_with(&model, [8, 16], 4, 64);
    let err = e
        .add_request(prompt(51, ctx + 1, vocab), greedy(4))
        .expect_err("too long for the model");
    let msg = err.to_string();
    assert!(
        msg.contains(&(ctx + 1).to_string()) && msg.contains(&ctx.to_string()),
        "the error names both numbers: {msg}"
    );
    let err = e
        .add_request(prompt(52, 40, vocab), greedy(4))
        .expect_err("too large for the KV cache");
    assert!(err.to_string().contains("40"), "{err}");
    assert!(!e.has_unfinished(), "refused requests leave nothing behind");
    assert!(e.scheduler().kv().all_free());
    // A prompt that fits still runs.
    let id = e
        .add_request(prompt(53, 20, vocab), greedy(4))
        .expect("fits");
    let mut run = Run::default();
    drain(&mut e, &[id], &mut run).expect("drain");
    assert_eq!(generated(&run, id), 4);
    assert!(e.scheduler().kv().all_free());
}

#[test]
fn kv_pools_fit_the_devices_largest_buffer() {
    // vk's buffers are capped by `maxStorageBufferRange` (128 MiB on lavapipe): a budget
    // that would give a layer more than that gets pools whose every layer's keys and
    // values each fit one buffer, and the cache allocates.
    let dev = match flint_engine::model::devices::open(Some("vk")) {
        Ok(d) => d,
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI: the vk device must be available (.ci/run installs lavapipe): {e}");
            }
            eprintln!("!!! SKIPPED: no Vulkan device here ({e})");
            return;
        }
    };
    let max = dev.max_buffer_bytes().expect("vk says its largest buffer");
    let model = tiny();
    let dm = DeviceModel::stage(&model, dev, &mut |_, _| {}).expect("stages on vk");
    let spec = dm.spec().clone();
    let per_value = dm.device().kv_bytes_per_value() as u64;
    let layers = spec.layers.len() as u64;
    // Twice what every layer's keys and values could hold in buffers of `max` bytes.
    let budget = 4 * layers * max;
    let (paged, kv) = PagedModel::new(
        dm,
        &KvSizing {
            memory_bytes: budget,
            block_size: BS,
            max_num_seqs: 1,
            max_num_batched_tokens: 16,
        },
    )
    .expect("the pools are sized to the device's buffers");
    for (g, s) in kv.group_specs().enumerate() {
        // One block of the group's widest layer's keys or values.
        let block = s
            .layers
            .iter()
            .map(|&il| {
                let l = &spec.layers[il];
                (BS * l.n_kv_heads * l.head_dim_k.max(l.head_dim_v)) as u64 * per_value
            })
            .max()
            .expect("a group has layers");
        let bytes = kv.num_free(g) as u64 * block;
        assert!(bytes <= max, "group {g}: {bytes} bytes > {max}");
        if s.kind == GroupKind::Full {
            // The cap is what bounds the full pool: one more block would not fit.
            assert!(
                bytes + block > max,
                "group {g}: the pool is not capped by the buffer"
            );
        }
    }
    drop(paged);
}
