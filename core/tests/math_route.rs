//! MoE routing: selection, tie-breaking, bias, renormalisation, errors.

use flint_core::math::{route_topk, sigmoid, Gating, RouteError, ROUTE_MAX_K};

fn route(
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    gating: Gating,
    normalize: bool,
    scale: f32,
) -> (Vec<u32>, Vec<f32>) {
    let mut ids = vec![0u32; k];
    let mut w = vec![0.0f32; k];
    route_topk(logits, bias, k, gating, normalize, scale, &mut ids, &mut w).expect("route");
    (ids, w)
}

#[test]
fn sigmoid_top2_known_values() {
    // numpy: sigmoid([0, 2, 1, 3]); top-2 = experts 3, 1; renormalised weights
    // 0.5195751544086155, 0.48042484559138454.
    let (ids, w) = route(&[0.0, 2.0, 1.0, 3.0], None, 2, Gating::Sigmoid, true, 1.0);
    assert_eq!(ids, [3, 1]);
    assert!((w[0] - 0.519_575_2).abs() < 1e-6 && (w[1] - 0.480_424_85).abs() < 1e-6);
    assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
    // Without renormalisation: the raw sigmoid scores, times the scale.
    let (_, w) = route(&[0.0, 2.0, 1.0, 3.0], None, 2, Gating::Sigmoid, false, 2.5);
    assert_eq!(w, [sigmoid(3.0) * 2.5, sigmoid(2.0) * 2.5]);
}

#[test]
fn ties_go_to_the_lower_index() {
    let (ids, _) = route(&[1.0, 1.0, 1.0, 1.0], None, 2, Gating::Sigmoid, true, 1.0);
    assert_eq!(ids, [0, 1]);
    let (ids, _) = route(
        &[0.0, 5.0, 2.0, 5.0, 2.0],
        None,
        3,
        Gating::Sigmoid,
        true,
        1.0,
    );
    assert_eq!(ids, [1, 3, 2]);
    // Ties created by the bias, too.
    let (ids, _) = route(
        &[0.0, 0.0, 1.0],
        Some(&[1.0, 1.0, 0.0]),
        1,
        Gating::Softmax,
        true,
        1.0,
    );
    // Softmax scores: e0 = e1 < e2, but e0 + 1 = e1 + 1 > e2: expert 0 (lower index) wins.
    assert_eq!(ids, [0]);
}

#[test]
fn bias_changes_selection_not_weights() {
    let logits = [2.0f32, 1.0, 0.5, -1.0];
    let (ids, _) = route(&logits, None, 2, Gating::Sigmoid, true, 1.0);
    assert_eq!(ids, [0, 1]);
    // A large bias on expert 3 puts it first; its weight is still its unbiased score.
    let bias = [0.0f32, 0.0, 0.0, 10.0];
    let (ids, w) = route(&logits, Some(&bias), 2, Gating::Sigmoid, true, 1.0);
    assert_eq!(ids, [3, 0]);
    let (s3, s0) = (sigmoid(-1.0), sigmoid(2.0));
    assert!((w[0] - s3 / (s3 + s0)).abs() < 1e-6, "{}", w[0]);
    assert!((w[1] - s0 / (s3 + s0)).abs() < 1e-6, "{}", w[1]);
    let (_, w) = route(&logits, Some(&bias), 2, Gating::Sigmoid, false, 1.0);
    assert_eq!(w, [s3, s0]);
}

#[test]
fn softmax_gating_weights_are_probabilities() {
    let logits = [1.0f32, 3.0, 0.0, 2.0];
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    let (ids, w) = route(&logits, None, 2, Gating::Softmax, false, 1.0);
    assert_eq!(ids, [1, 3]);
    assert!((w[0] - 3.0f32.exp() / z).abs() < 1e-6);
    assert!((w[1] - 2.0f32.exp() / z).abs() < 1e-6);
    let (_, w) = route(&logits, None, 2, Gating::Softmax, true, 1.0);
    assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
}

#[test]
fn large_k_matches_a_sort_and_sums_to_scale() {
    let n = 256;
    let logits: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 263) as f32 / 40.0 - 3.0)
        .collect();
    let bias: Vec<f32> = (0..n).map(|i| ((i * 31) % 17) as f32 / 50.0).collect();
    let k = ROUTE_MAX_K;
    let (ids, w) = route(&logits, Some(&bias), k, Gating::Sigmoid, true, 2.5);
    let mut order: Vec<usize> = (0..n).collect();
    let key = |e: usize| sigmoid(logits[e]) + bias[e];
    // Stable sort by key descending keeps lower indices first among equals.
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    let want: Vec<u32> = order[..k].iter().map(|&e| e as u32).collect();
    assert_eq!(ids, want);
    let sum: f32 = w.iter().sum();
    assert!((sum - 2.5).abs() < 1e-5, "{sum}");
}

#[test]
fn zero_scores_do_not_divide_by_zero() {
    let (_, w) = route(&[-200.0, -200.0], None, 2, Gating::Sigmoid, true, 1.0);
    assert_eq!(w, [0.0, 0.0]);
}

#[test]
fn errors_name_the_problem() {
    let mut ids = [0u32; 2];
    let mut w = [0.0f32; 2];
    let l = [0.0f32; 4];
    let r = |k, bias: Option<&[f32]>, ids: &mut [u32], w: &mut [f32]| {
        route_topk(&l, bias, k, Gating::Sigmoid, true, 1.0, ids, w)
    };
    assert_eq!(
        r(0, None, &mut [], &mut []),
        Err(RouteError::BadK { k: 0, experts: 4 })
    );
    assert_eq!(
        r(5, None, &mut [0; 5], &mut [0.0; 5]),
        Err(RouteError::BadK { k: 5, experts: 4 })
    );
    assert!(matches!(
        r(2, Some(&[0.0; 3]), &mut ids, &mut w),
        Err(RouteError::LengthMismatch {
            what: "selection bias",
            expected: 4,
            found: 3
        })
    ));
    assert!(matches!(
        r(2, None, &mut ids[..1], &mut w),
        Err(RouteError::LengthMismatch {
            what: "ids_out",
            ..
        })
    ));
    let big = vec![0.0f32; 100];
    let mut ids = vec![0u32; 65];
    let mut w = vec![0.0f32; 65];
    let e = route_topk(&big, None, 65, Gating::Sigmoid, true, 1.0, &mut ids, &mut w);
    assert_eq!(e, Err(RouteError::TooManyChosen { k: 65 }));
    assert!(e.unwrap_err().to_string().contains("64"));
}

#[test]
fn softmax_weight_chooses_on_logits_and_weights_the_chosen() {
    // gpt-oss: top-2 of the raw logits [0.5, 3, -1, 2] = experts 1, 3; weights
    // softmax([3, 2]) = numpy 0.7310585786300049, 0.2689414213699951.
    let (ids, w) = route(
        &[0.5, 3.0, -1.0, 2.0],
        None,
        2,
        Gating::SoftmaxWeight,
        false,
        1.0,
    );
    assert_eq!(ids, [1, 3]);
    assert!((w[0] - 0.731_058_6).abs() < 1e-6 && (w[1] - 0.268_941_4).abs() < 1e-6);
    // A selection bias moves the choice, not the weights' source.
    let (ids, w) = route(
        &[0.5, 3.0, -1.0, 2.0],
        Some(&[2.0, 0.0, 0.0, 0.0]),
        2,
        Gating::SoftmaxWeight,
        false,
        1.0,
    );
    assert_eq!(ids, [1, 0]);
    // softmax([3, 0.5]): 0.9241418199787566, 0.07585818002124355.
    assert!((w[0] - 0.924_141_8).abs() < 1e-6 && (w[1] - 0.075_858_18).abs() < 1e-6);
}

#[test]
fn moe_combine_steps() {
    use flint_core::math::{add_id, scale_by_expert, scatter_add_weighted};
    // Each weight times its expert's scale; an id beyond the scale is refused.
    let mut w = [0.5f32, 0.25, 2.0];
    scale_by_expert(&mut w, &[2, 0, 1], &[3.0, 5.0, 7.0]).expect("in range");
    assert_eq!(w, [3.5, 0.75, 10.0]);
    assert_eq!(
        scale_by_expert(&mut w, &[3], &[1.0; 3]),
        Err(RouteError::ExpertOutOfRange { id: 3, experts: 3 })
    );
    // Rows of a table by id; an id beyond its rows is refused.
    let mut x = [1.0f32, 2.0, 3.0, 4.0];
    add_id(&mut x, &[10.0, 20.0, 30.0, 40.0], &[1, 0], 2).expect("in range");
    assert_eq!(x, [31.0, 42.0, 13.0, 24.0]);
    assert_eq!(
        add_id(&mut x, &[0.0; 4], &[0, 2], 2),
        Err(RouteError::ExpertOutOfRange { id: 2, experts: 2 })
    );
    // Two tokens, two routed rows each: token t gets rows 2t and 2t + 1.
    let mut acc = [0.0f32; 2];
    scatter_add_weighted(
        &mut acc,
        &[1.0, 2.0, 3.0, 4.0],
        &[1.0, 10.0, 100.0, 1000.0],
        1,
    );
    assert_eq!(acc, [21.0, 4300.0]);
}
