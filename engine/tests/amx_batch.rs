//! The default model with `FLINT_CPU_AMX=1` (its Q8_0, Q5_0, Q4_K and Q6_K matrices in
//! the AMX orders: Q8_0/Q5_0 on AMX tiles from five activation rows where this process
//! can run them, AVX-512 VNNI below, elsewhere and for the K-quants): six requests
//! decoded together in the paged engine (every step's matmuls on the tiles or the
//! AMX-order panels) give each request the greedy chain it gets alone on the
//! single-sequence forward (one row a step, the decode kernels), token for token, and a
//! chain that follows llama.cpp's golden one for its first tokens. Below AVX-512 VNNI
//! the test says so and checks nothing else.
//! Its own test binary: it sets `FLINT_CPU_AMX` for the whole process.

mod flint_common;
mod golden_common;

use std::collections::HashMap;

use flint_common::device_chain;
use flint_engine::kv::RequestId;
use flint_engine::sample::{SamplerConfig, StopConditions};
use flint_engine::sched::RequestParams;
use flint_hal_cpu::SimdLevel;
use golden_common::greedy_chains;

/// Tokens generated per request.
const N_GEN: usize = 10;
/// Requests decoded together.
const REQUESTS: usize = 6;

#[test]
fn a_request_decodes_the_same_batched_and_alone_in_the_amx_order() {
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!("no AVX-512 VNNI on this CPU: the AMX order is not used here");
        return;
    }
    // Before the device is opened (this binary's only test).
    std::env::set_var("FLINT_CPU_AMX", "1");
    let mut e = flint_common::gemma_engine(64 << 20, 8, 1024, true);
    let chains = greedy_chains();
    let prompts: Vec<Vec<u32>> = (0..REQUESTS)
        .map(|i| chains[i % chains.len()].prompt.clone())
        .collect();
    let params = RequestParams {
        sampler: SamplerConfig::greedy(),
        max_tokens: N_GEN,
        stop: StopConditions::default(),
    };
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| e.add_request(p.clone(), params.clone()).expect("admitted"))
        .collect();
    let mut out: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut max_batch = 0;
    while e.has_unfinished() {
        for o in e.step().expect("step") {
            if let Some(t) = o.token {
                out.entry(o.id).or_default().push(t);
            }
        }
        max_batch = max_batch.max(e.last_step().num_seqs);
    }
    assert_eq!(max_batch, REQUESTS, "every request shared the decode steps");
    for (i, (id, p)) in ids.iter().zip(&prompts).enumerate() {
        let alone = device_chain(e.model().model(), p, N_GEN);
        assert_eq!(
            out[id], alone,
            "request {i}: the batched chain differs from the same request alone"
        );
    }
    // The order changes last bits, not the model: the first tokens of chain 0 (France,
    // a wide top-1 margin) are llama.cpp's.
    let g = &chains[0];
    assert_eq!(out[&ids[0]][..3], g.ids[..3], "the first tokens of chain 0");
}
