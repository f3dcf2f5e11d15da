//! The engine plans before it stages: `DeviceModel::stage` hands every weight to
//! `Device::plan` first, and the `tt` device then stages each weight in the plan's tier.
//! Checked on `tiny` through the simulated adapter under a DRAM budget that holds every
//! dense weight and only part of the expert towers: the plan puts dense weights first, so
//! all of them stay resident and some experts stream, whereas staging without a plan
//! (resident while it fits, in staging order) would let early expert towers crowd out
//! later dense weights.
//!
//! Its own test binary: it sets `FLINT_TT_SIM_DRAM_BYTES`, which the adapter reads when a
//! device opens.

mod flint_common;

mod tt_common;

use tt_common::sim_library;

use flint_engine::forward::{vector_bytes, weight_descs, DeviceModel};
use flint_hal::{Device, DeviceOptions, Tier, WeightKind};
use flint_hal_tt::{TtDevice, RESERVE_DIVISOR};

#[test]
fn engine_stages_by_the_devices_plan() {
    let Some(lib) = sim_library() else { return };
    let model = flint_common::tiny();
    let descs = weight_descs(&model);
    let opts = DeviceOptions::default();

    // Sizes from a plan with room for everything.
    let roomy = TtDevice::open_path(&lib, &opts).expect("tt opens");
    let vectors = vector_bytes(&model);
    let full = roomy.plan(&descs, vectors).expect("plan");
    assert_eq!(full.streamed_bytes(), 0);
    let dense = full.resident_bytes();
    let experts = full.expert_tier_bytes();
    assert!(experts > 0, "tiny has expert towers");
    drop(roomy);

    // A budget (DRAM less the reserve) for the norm and bias vectors, the dense weights
    // and half the experts.
    let budget = vectors + dense + experts / 2;
    let dram = (budget * RESERVE_DIVISOR).div_ceil(RESERVE_DIVISOR - 1);
    std::env::set_var("FLINT_TT_SIM_DRAM_BYTES", dram.to_string());
    // The plan, from a device of its own: the one the model is staged on must get its
    // plan from the engine.
    let planner = TtDevice::open_path(&lib, &opts).expect("tt opens");
    assert_eq!(planner.dram_bytes(), dram);
    let want = planner.plan(&descs, vectors).expect("plan");
    drop(planner);
    // The plan keeps every dense weight resident and streams some experts.
    for (w, d) in want.weights.iter().zip(&descs) {
        if d.kind != WeightKind::ExpertTower {
            assert_eq!(w.tier, Tier::Resident, "{}", w.name);
        }
    }
    assert!(want.streamed_bytes() > 0);
    let tt = std::sync::Arc::new(TtDevice::open_path(&lib, &opts).expect("tt opens"));
    let dm = DeviceModel::stage(&model, tt.clone(), &mut |_, _| {}).expect("tiny stages");
    let used = tt.tt_counters().expect("counters").dram_used_bytes;
    eprintln!(
        "DRAM {dram}: plan resident {} + expert tier {} = {} bytes, streamed {}; vectors {}; staged: {used} bytes in DRAM",
        want.resident_bytes(),
        want.expert_tier_bytes(),
        want.resident_bytes() + want.expert_tier_bytes(),
        want.streamed_bytes(),
        dm.vector_bytes()
    );
    // Besides the planned weights, the norms' weights and the biases live in DRAM as
    // device tensors.
    assert_eq!(
        used,
        want.resident_bytes() + want.expert_tier_bytes() + dm.vector_bytes(),
        "the staged model does not follow the plan"
    );
    // And it stays within the budget: the plan left room for the vectors.
    assert!(used <= budget, "staged {used} bytes, budget {budget}");
    drop(dm);
    drop(tt);

    // A budget that holds the dense weights only if the vectors are forgotten: the
    // engine tells the plan what the vectors take, so a dense weight streams instead of
    // the staged model overrunning the budget.
    let budget = dense + vectors / 2;
    let dram = (budget * RESERVE_DIVISOR).div_ceil(RESERVE_DIVISOR - 1);
    std::env::set_var("FLINT_TT_SIM_DRAM_BYTES", dram.to_string());
    let tt = std::sync::Arc::new(TtDevice::open_path(&lib, &opts).expect("tt opens"));
    let dm = DeviceModel::stage(&model, tt.clone(), &mut |_, _| {}).expect("tiny stages");
    let used = tt.tt_counters().expect("counters").dram_used_bytes;
    eprintln!("DRAM {dram}, budget {budget}: staged {used} bytes in DRAM");
    assert!(used <= budget, "staged {used} bytes, budget {budget}");
    assert!(used < dense + vectors, "a dense weight streams");
    drop(dm);
    std::env::remove_var("FLINT_TT_SIM_DRAM_BYTES");
}
