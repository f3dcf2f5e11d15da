//! Properties of the case list itself.

use flint_conformance::{all_cases, Shape, DEFAULT_SEED};
use flint_hal::{GgmlType, Op};

#[test]
fn every_op_and_every_block_type_is_covered() {
    let cases = all_cases(DEFAULT_SEED);
    for op in Op::ALL {
        assert!(cases.iter().any(|c| c.op == op), "no case for {op}");
        if op.takes_weight() {
            for ty in GgmlType::DEQUANTIZABLE {
                assert!(
                    cases.iter().any(|c| c.op == op && c.ty == Some(ty)),
                    "no {op} case for {ty}"
                );
            }
        }
    }
    for label in [
        "sink<max",
        "kv-groups",
        "window+no-block+sinks",
        "multi-seq",
        "gqa-decode",
    ] {
        assert!(
            cases.iter().any(|c| c.label == label),
            "no attention case {label}"
        );
    }
    // Some matmul batch is not a multiple of common tiles.
    assert!(cases.iter().any(
        |c| matches!(c.shape, Shape::Weight { m, .. } if c.op == Op::Matmul && m % 4 != 0 && m > 1)
    ));
}

#[test]
fn seeds_replay_and_do_not_depend_on_the_filter() {
    let a = all_cases(7);
    let b = all_cases(7);
    assert_eq!(a, b);
    let c = all_cases(8);
    assert!(a.iter().zip(&c).all(|(x, y)| x.seed != y.seed));
    let mut seeds: Vec<u64> = a.iter().map(|c| c.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    assert_eq!(seeds.len(), a.len(), "two cases share a seed");
    let only: Vec<_> = a.iter().filter(|c| c.matches("matmul/Q6_K")).collect();
    assert!(!only.is_empty());
    assert!(only
        .iter()
        .all(|c| c.op == Op::Matmul && c.ty == Some(GgmlType::Q6_K)));
}
