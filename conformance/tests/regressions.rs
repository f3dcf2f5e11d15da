//! Each regression case of the suite, proven: a device broken in exactly that way must
//! make the suite fail, on that case.

mod common;

use common::{Broken, Defect};
use flint_conformance::{run_suite, DeviceReport, SuiteOptions, DEFAULT_SEED};
use flint_hal::{GgmlType, Op};

fn run_seeded(defect: Defect, filter: &str, seed: u64) -> DeviceReport {
    let dev = Broken::over_cpu(defect);
    run_suite(
        dev.as_ref(),
        &SuiteOptions {
            filter: Some(filter.to_string()),
            seed,
        },
    )
}

fn run(defect: Defect, filter: &str) -> DeviceReport {
    run_seeded(defect, filter, DEFAULT_SEED)
}

/// The default seed and a few others: a regression case must not catch its defect by
/// the luck of one seed.
const SEEDS: [u64; 4] = [DEFAULT_SEED, 1, 2, 0xdead_beef];

/// The suite fails for `defect`, and in particular on `case`; the control (the same
/// wrapper without a defect) passes the same cases.
fn assert_caught(defect: Defect, filter: &str, case: &str) {
    for seed in SEEDS {
        assert_caught_seeded(defect, filter, case, seed);
    }
}

fn assert_caught_seeded(defect: Defect, filter: &str, case: &str, seed: u64) {
    let control = run_seeded(Defect::None, filter, seed);
    assert_eq!(
        control.counts().failed,
        0,
        "control failed:\n{}",
        control.failure_details()
    );
    assert!(
        control.results.iter().any(|r| r.case.name() == case),
        "no case named {case} under filter {filter}"
    );
    let r = run_seeded(defect, filter, seed);
    print!("{}{}", r.table(), r.failure_details());
    assert!(
        r.failed(case),
        "{defect:?} was not caught by {case} with seed {seed}:\n{}",
        r.table()
    );
}

fn message(r: &DeviceReport, case: &str) -> String {
    r.results
        .iter()
        .find(|x| x.case.name() == case)
        .map(|x| format!("{:?}", x.outcome))
        .unwrap_or_default()
}

#[test]
fn sink_seeded_at_exp0_is_caught() {
    assert_caught(
        Defect::SinkExp0,
        "paged_attention",
        "paged_attention[sink<max]",
    );
    // The defect is invisible when the sink is the maximum (exp(0) is then right):
    // that is why the suite needs sinks below the score maximum.
    let r = run(Defect::SinkExp0, "paged_attention[sink>max]");
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.counts().failed, 0, "{}", r.failure_details());
}

#[test]
fn residual_added_twice_is_caught() {
    assert_caught(
        Defect::ResidualTwice,
        "add_rms_norm",
        "add_rms_norm[residual]",
    );
    // Only the check of the residual buffer sees it: the normed output is right.
    let r = run(Defect::ResidualTwice, "add_rms_norm");
    let m = message(&r, "add_rms_norm[residual]");
    assert!(m.contains("residual after the call"), "{m}");
}

#[test]
fn per_head_norm_corrupting_its_input_view_is_caught() {
    assert_caught(Defect::PerHeadNormView, "rms_norm", "rms_norm[per-head]");
    let m = message(
        &run(Defect::PerHeadNormView, "per-head"),
        "rms_norm[per-head]",
    );
    assert!(m.contains("head 1"), "{m}");
}

#[test]
fn one_slot_mapping_for_every_kv_group_is_caught() {
    assert_caught(
        Defect::SharedSlotMapping,
        "kv-groups",
        "paged_attention[kv-groups]",
    );
}

#[test]
fn one_block_table_for_every_kv_group_is_caught() {
    assert_caught(
        Defect::SharedBlockTable,
        "kv-groups",
        "paged_attention[kv-groups]",
    );
}

#[test]
fn q6k_scale_off_by_one_is_caught() {
    let cpu = common::cpu();
    assert!(
        cpu.supports(Op::Matmul, Some(GgmlType::Q6_K)),
        "the cpu backend must support Q6_K matmul for this test to mean anything"
    );
    assert_caught(Defect::Q6kScaleOffByOne, "matmul/Q6_K", "matmul/Q6_K");
    let r = run(Defect::Q6kScaleOffByOne, "get_rows/Q6_K");
    assert!(r.failed("get_rows/Q6_K"), "{}", r.table());
}

#[test]
fn unsupported_is_skipped_never_failed() {
    let r = run(Defect::SupportsNothing, "");
    let c = r.counts();
    assert_eq!((c.passed, c.failed), (0, 0), "{}", r.table());
    assert_eq!(c.skipped, r.results.len());
    assert!(r.table().contains("not supported"));
}

/// An output element a kernel never writes is caught (the output starts as a NaN
/// sentinel), and only the awkward shapes expose a dropped tile remainder.
#[test]
fn dropped_tile_remainder_is_caught() {
    assert_caught(Defect::TileRemainder, "matmul/Q4_K", "matmul/Q4_K");
    let r = run(Defect::TileRemainder, "matmul/Q4_K");
    let fails: Vec<String> = r
        .results
        .iter()
        .filter_map(|x| match &x.outcome {
            flint_conformance::Outcome::Fail { message } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert!(
        fails.iter().all(|m| m.contains("never written")),
        "{fails:?}"
    );
    // W[.,16] is a whole number of tiles: that case alone would have missed it.
    assert_eq!(r.counts().passed, 1, "{}", r.table());
}

/// Weights arrive as a range of a shared buffer, as from a memory map: a backend that
/// ignores the range's start is caught on every weight op.
#[test]
fn ignoring_the_weight_range_is_caught() {
    assert_caught(Defect::IgnoresRangeStart, "matmul/Q8_0", "matmul/Q8_0");
    let r = run(Defect::IgnoresRangeStart, "get_rows/F16");
    assert!(r.failed("get_rows/F16"), "{}", r.table());
    let r = run(Defect::IgnoresRangeStart, "expert_matmul/Q4_K");
    assert!(r.failed("expert_matmul/Q4_K"), "{}", r.table());
}

/// Each RoPE parameter is seen by the case of the family that uses it.
#[test]
fn rope_parameters_a_device_ignores_are_caught() {
    assert_caught(Defect::RopeAlwaysNeox, "rope", "rope[normal-gqa]");
    assert_caught(Defect::RopeIgnoresFactors, "rope", "rope[llama3-factors]");
    assert_caught(Defect::RopeNoYarnMscale, "rope", "rope[yarn]");
    // The plain NeoX cases cannot see any of them.
    for d in [
        Defect::RopeAlwaysNeox,
        Defect::RopeIgnoresFactors,
        Defect::RopeNoYarnMscale,
    ] {
        let r = run(d, "rope[full]");
        assert_eq!(r.counts().failed, 0, "{d:?}: {}", r.failure_details());
    }
}

#[test]
fn bias_on_the_first_row_only_is_caught() {
    assert_caught(Defect::BiasFirstRowOnly, "add_bias", "add_bias");
    // One row is all there is in a decode: that case alone would have missed it.
    let r = run(Defect::BiasFirstRowOnly, "add_bias[decode]");
    assert_eq!(r.counts().failed, 0, "{}", r.failure_details());
}

#[test]
fn delta_state_not_carried_is_caught() {
    // A prompt in two calls: the second must start from the state the first left.
    assert_caught(
        Defect::DeltaStateNotCarried,
        "gated_delta_net",
        "gated_delta_net[split]",
    );
}

/// Copies are checked value by value, the last one of a range included.
#[test]
fn a_copy_one_value_short_is_caught() {
    assert_caught(Defect::CopyOneShort, "copy", "copy[between]");
    let r = run(Defect::CopyOneShort, "copy");
    assert!(r.failed("copy[whole]"), "{}", r.table());
    assert!(r.failed("copy[within]"), "{}", r.table());
}

/// Host-device traffic is counted exactly: an op that takes its tensor through the host,
/// or an upload in two calls, fails the transfer case.
#[test]
fn host_round_trips_and_split_uploads_are_caught() {
    assert_caught(Defect::ScaleOnHost, "copy", "copy[transfers]");
    let m = message(&run(Defect::ScaleOnHost, "transfers"), "copy[transfers]");
    assert!(m.contains("on device tensors"), "{m}");
    assert_caught(Defect::UploadInHalves, "transfers", "copy[transfers]");
    let m = message(&run(Defect::UploadInHalves, "transfers"), "copy[transfers]");
    assert!(m.contains("upload_new of x"), "{m}");
}

#[test]
fn moe_routing_defects_are_caught() {
    // Gemma 4's per-expert scale, dropped: only the case with a scale sees it.
    assert_caught(
        Defect::ExpertScaleIgnored,
        "route_topk",
        "route_topk[expert-scale]",
    );
    let r = run(Defect::ExpertScaleIgnored, "route_topk[sigmoid+bias]");
    assert_eq!(r.counts().failed, 0, "{}", r.failure_details());
    // Each token's routed rows one after another, not interleaved; a decode step's one
    // token cannot tell them apart.
    assert_caught(
        Defect::ScatterInterleaved,
        "scatter_add_weighted",
        "scatter_add_weighted",
    );
    let r = run(Defect::ScatterInterleaved, "scatter_add_weighted[decode]");
    assert_eq!(r.counts().failed, 0, "{}", r.failure_details());
    // Routed row `i` reads token `i / fanout`.
    assert_caught(
        Defect::ExpertFirstToken,
        "expert_matmul/Q4_K",
        "expert_matmul/Q4_K",
    );
}

#[test]
fn qwen35_gate_and_norm_defects_are_caught() {
    // Each head by its own norm (heads of very different sizes).
    assert_caught(Defect::L2NormWholeRow, "l2_norm", "l2_norm[decode]");
    // The shared expert's gate: one value per row, not one per element.
    assert_caught(Defect::MulNoBroadcast, "mul", "mul[per-row]");
    let r = run(Defect::MulNoBroadcast, "mul[decode]");
    assert_eq!(r.counts().failed, 0, "{}", r.failure_details());
}
