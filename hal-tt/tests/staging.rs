//! The pure staging rules: arrangement per encoding and the expert-slice geometry check.

use flint_core::GgmlType;
use flint_hal::{HalErrorKind, WeightDesc, WeightKind, WeightSource};
use flint_hal_tt::staging::{arrangement, expert_slice, geometry, plan};

fn admits(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_K | GgmlType::Q6_K)
}

#[test]
fn arrangement_follows_keep_quant_and_admission() {
    let bf16 = Some(GgmlType::BF16);
    let small = 4096;
    let a = arrangement("t", GgmlType::Q4_K, small, true, None, admits).expect("kept");
    assert!(a.kept && a.staged_ty == GgmlType::Q4_K);
    // FLINT_TT_EXPAND does not touch what is kept.
    let a = arrangement("t", GgmlType::Q4_K, small, true, bf16, admits).expect("kept");
    assert!(a.kept && a.staged_ty == GgmlType::Q4_K);
    let a = arrangement("t", GgmlType::Q4_K, small, false, None, admits).expect("bf16");
    assert!(!a.kept && a.staged_ty == GgmlType::BF16);
    // Keep-quant arm, not admitted: expanded without loss (F32), unless told otherwise.
    let a = arrangement("t", GgmlType::Q5_K, small, true, None, admits).expect("not admitted");
    assert!(!a.kept && a.staged_ty == GgmlType::F32);
    let a = arrangement("t", GgmlType::Q8_0, small, true, bf16, admits).expect("forced");
    assert!(!a.kept && a.staged_ty == GgmlType::BF16);
    let a = arrangement("t", GgmlType::Q8_0, small, false, None, admits).expect("bf16 arm");
    assert!(!a.kept && a.staged_ty == GgmlType::BF16);
    // Float tensors: small ones keep their encoding in the keep-quant arm, large ones and
    // the BF16 arm take BF16.
    let limit = flint_hal_tt::staging::SMALL_FLOAT_BYTES;
    for ty in [GgmlType::F32, GgmlType::F16] {
        let a = arrangement("t", ty, limit, true, None, |_| true).expect("small float");
        assert!(!a.kept && a.staged_ty == ty);
        let a = arrangement("t", ty, limit + 1, true, None, |_| true).expect("large float");
        assert!(!a.kept && a.staged_ty == GgmlType::BF16);
        let a = arrangement("t", ty, small, false, None, |_| true).expect("bf16 arm");
        assert!(!a.kept && a.staged_ty == GgmlType::BF16);
    }
    let a = arrangement("t", GgmlType::BF16, small, true, None, admits).expect("bf16 source");
    assert!(!a.kept && a.staged_ty == GgmlType::BF16);
    let e = arrangement("blk.0.x", GgmlType::I32, small, true, None, admits).expect_err("refused");
    assert_eq!(e.kind, HalErrorKind::Unsupported);
    assert!(
        e.message.contains("I32") && e.message.contains("blk.0.x"),
        "{e}"
    );
}

#[test]
fn every_expert_slice_is_checked() {
    let ty = GgmlType::Q4_K;
    let per = 144 * 4; // [256, 4] of Q4_K
    let bytes = vec![0u8; per * 3];
    let geo = (256, 4, 3);
    for e in 0..3 {
        let s = expert_slice("tower", ty, geo, &bytes, e).expect("slice");
        assert_eq!(s.len(), per);
        assert_eq!(s.as_ptr(), bytes[e * per..].as_ptr());
    }
    // Past the last expert.
    let err = expert_slice("tower", ty, geo, &bytes, 3).expect_err("out of range");
    assert!(
        err.message.contains("tower") && err.message.contains("expert 3"),
        "{err}"
    );
    // A tower whose bytes are not E whole slices.
    let short = &bytes[..per * 3 - 1];
    let err = expert_slice("tower", ty, geo, short, 0).expect_err("short tower");
    assert_eq!(err.kind, HalErrorKind::InvalidInput);
    // A row that is not whole blocks.
    let err = expert_slice("tower", ty, (100, 4, 3), &bytes, 0).expect_err("partial block");
    assert!(err.message.contains("whole number"), "{err}");
    // A tower must be three-dimensional.
    let d = WeightDesc {
        name: "flat_exps".into(),
        ty,
        dims: vec![256, 12],
        kind: WeightKind::ExpertTower,
        data: WeightSource::from_vec(bytes.clone()),
    };
    let err = geometry(&d).expect_err("2-D tower");
    assert!(err.message.contains("flat_exps"), "{err}");
}

#[test]
fn plan_places_dense_first_then_experts() {
    let mk = |name: &str, dims: Vec<usize>, kind| WeightDesc {
        name: name.into(),
        ty: GgmlType::Q4_K,
        data: WeightSource::from_vec(vec![0u8; dims.iter().product::<usize>() / 256 * 144]),
        dims,
        kind,
    };
    // Kept: a 256x256 matrix is 36864 bytes, a 256x256x4 tower 147456.
    let ws = vec![
        mk("exps", vec![256, 256, 4], WeightKind::ExpertTower),
        mk("dense", vec![256, 256], WeightKind::Matrix),
    ];
    // Budget (15/16 of DRAM) fits the dense weight and not the tower.
    let dram = (36864 + 100_000) * 16 / 15;
    let p = plan(&ws, dram, 0, true, None, admits).expect("plan");
    assert_eq!(p.weights[0].name, "exps");
    assert_eq!(p.weights[0].tier, flint_hal::Tier::Streamed);
    assert_eq!(p.weights[1].tier, flint_hal::Tier::Resident);
    assert_eq!(p.streamed_bytes(), 147456);
    assert_eq!(p.resident_bytes(), 36864);
    // Memory the caller takes besides the weights (its norm and bias vectors) comes off
    // the budget first: 100001 bytes of vectors leave less than the dense weight.
    let p = plan(&ws, dram, 100_001, true, None, admits).expect("plan");
    assert_eq!(p.weights[1].tier, flint_hal::Tier::Streamed);
    assert_eq!(p.resident_bytes(), 0);
    let p = plan(&ws, dram, 100_000, true, None, admits).expect("plan");
    assert_eq!(p.weights[1].tier, flint_hal::Tier::Resident);
    // With room for both, the tower goes to the expert tier.
    let p = plan(&ws, 1 << 20, 0, true, None, admits).expect("plan");
    assert_eq!(p.weights[0].tier, flint_hal::Tier::ExpertResident);
    assert_eq!(p.expert_tier_bytes(), 147456);
    assert_eq!(p.streamed_bytes(), 0);
}
