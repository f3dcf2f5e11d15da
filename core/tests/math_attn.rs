//! Softmax with per-head sinks (two-pass and online) and the reference attention.

use flint_core::math::{
    attend_online, attend_two_pass, attention_ref, AttentionParams, OnlineSoftmax,
};
use proptest::prelude::*;

/// scores [2, 1], sink 0.5 < max score, values e0 and e1: the output is the two softmax
/// weights, `exp(s_j - 2) / (exp(0.5 - 2) + exp(0) + exp(-1))` = [0.62853172, 0.2312239]
/// (numpy). The defect that seeds the sink term as exp(0) and never rescales it gives
/// [0.4223188, 0.1553624] instead.
const SCORES: [f32; 2] = [2.0, 1.0];
const VALUES: [f32; 4] = [1.0, 0.0, 0.0, 1.0];
const SINK: f32 = 0.5;
const WANT: [f32; 2] = [0.628_531_7, 0.231_223_9];

fn assert_close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "[{i}] {x} vs {y}");
    }
}

#[test]
fn sink_smaller_than_max_two_pass() {
    let mut o = [0.0f32; 2];
    attend_two_pass(&SCORES, &VALUES, 2, Some(SINK), &mut o);
    assert_close(&o, &WANT, 1e-6);
}

/// The regression test for the sink defect: the online form must rescale the sink term
/// when the running maximum grows past it (here from 0.5 to 2), ending as
/// `exp(sink - m_final)`, not `exp(0)`.
#[test]
fn sink_smaller_than_max_online_is_rescaled() {
    let mut o = [0.0f32; 2];
    attend_online(&SCORES, &VALUES, 2, Some(SINK), &mut o);
    assert_close(&o, &WANT, 1e-6);

    // The state itself: maximum 2, denominator exp(-1.5) + 1 + exp(-1).
    let mut st = OnlineSoftmax::new(Some(SINK));
    let mut acc = [0.0f32; 2];
    st.push(SCORES[0], &VALUES[0..2], &mut acc);
    st.push(SCORES[1], &VALUES[2..4], &mut acc);
    assert_eq!(st.max(), 2.0);
    let want_l = (-1.5f64).exp() + 1.0 + (-1.0f64).exp();
    assert!((st.denominator() as f64 - want_l).abs() < 1e-6);
}

/// The same with scores arriving in increasing order, so that the maximum grows twice
/// after the sink (0.5 -> 1 -> 2).
#[test]
fn sink_rescaled_when_max_grows_repeatedly() {
    let mut o = [0.0f32; 2];
    attend_online(&[1.0, 2.0], &[0.0, 1.0, 1.0, 0.0], 2, Some(SINK), &mut o);
    assert_close(&o, &WANT, 1e-6);
}

#[test]
fn sink_larger_than_all_scores() {
    // Here m = sink and exp(sink - m) = 1: scores [-1, -2], sink 3.
    let want = {
        let e: Vec<f64> = [-1.0f64 - 3.0, -2.0 - 3.0]
            .iter()
            .map(|v| v.exp())
            .collect();
        let d = 1.0 + e[0] + e[1];
        [(e[0] / d) as f32, (e[1] / d) as f32]
    };
    for f in [attend_two_pass, attend_online] {
        let mut o = [0.0f32; 2];
        f(&[-1.0, -2.0], &VALUES, 2, Some(3.0), &mut o);
        assert_close(&o, &want, 1e-6);
    }
}

#[test]
fn no_sink_is_plain_softmax_and_empty_is_zero() {
    let mut o = [0.0f32; 2];
    attend_online(&SCORES, &VALUES, 2, None, &mut o);
    let e = (-1.0f32).exp();
    assert_close(&o, &[1.0 / (1.0 + e), e / (1.0 + e)], 1e-6);
    // A sink of -inf is no sink.
    let mut o2 = [0.0f32; 2];
    attend_two_pass(&SCORES, &VALUES, 2, Some(f32::NEG_INFINITY), &mut o2);
    assert_close(&o2, &o, 1e-6);
    // No keys: zeros, with or without a sink, never NaN.
    for sink in [None, Some(1.0)] {
        let mut z = [7.0f32; 3];
        attend_online(&[], &[], 3, sink, &mut z);
        assert_eq!(z, [0.0; 3]);
        let mut z = [7.0f32; 3];
        attend_two_pass(&[], &[], 3, sink, &mut z);
        assert_eq!(z, [0.0; 3]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    /// Online and two-pass agree for any scores, sinks (present or not, above or below
    /// the scores) and values.
    #[test]
    fn online_matches_two_pass(
        scores in prop::collection::vec(-30.0f32..30.0, 1..40),
        sink in prop::option::of(-30.0f32..30.0),
        seed in any::<u32>(),
    ) {
        let dv = 3;
        let values: Vec<f32> = (0..scores.len() * dv)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let mut a = vec![0.0f32; dv];
        let mut b = vec![0.0f32; dv];
        attend_two_pass(&scores, &values, dv, sink, &mut a);
        attend_online(&scores, &values, dv, sink, &mut b);
        for (x, y) in a.iter().zip(&b) {
            prop_assert!((x - y).abs() <= 1e-5, "{} vs {}", x, y);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    /// Splitting the keys in two ranges, each with its own state (the sink in the first
    /// only), and merging gives the two-pass result.
    #[test]
    fn merged_partial_states_match_two_pass(
        scores in prop::collection::vec(-30.0f32..30.0, 0..40),
        split in 0usize..40,
        sink in prop::option::of(-30.0f32..30.0),
    ) {
        let dv = 2;
        let values: Vec<f32> = (0..scores.len() * dv).map(|i| (i as f32 * 0.37).sin()).collect();
        let split = split.min(scores.len());
        let mut want = vec![0.0f32; dv];
        attend_two_pass(&scores, &values, dv, sink, &mut want);
        let mut a = OnlineSoftmax::new(sink);
        let mut acc_a = vec![0.0f32; dv];
        for j in 0..split {
            a.push(scores[j], &values[j * dv..(j + 1) * dv], &mut acc_a);
        }
        let mut b = OnlineSoftmax::new(None);
        let mut acc_b = vec![0.0f32; dv];
        for j in split..scores.len() {
            b.push(scores[j], &values[j * dv..(j + 1) * dv], &mut acc_b);
        }
        // Merge in either direction.
        let (a2, acc_a2) = (a, acc_a.clone());
        a.merge(&mut acc_a, &b, &acc_b);
        a.finish(&mut acc_a);
        b.merge(&mut acc_b, &a2, &acc_a2);
        b.finish(&mut acc_b);
        for i in 0..dv {
            prop_assert!((acc_a[i] - want[i]).abs() <= 1e-5, "{} vs {}", acc_a[i], want[i]);
            prop_assert!((acc_b[i] - want[i]).abs() <= 1e-5, "{} vs {}", acc_b[i], want[i]);
        }
    }
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// An independent, literal rendering of the spec's formula for one query token.
fn naive(p: &AttentionParams<'_>, q: &[f32], pos: usize, k: &[f32], v: &[f32], out: &mut [f32]) {
    let n_kv = k.len() / (p.n_head_kv * p.dk);
    for h in 0..p.n_head {
        let g = h / (p.n_head / p.n_head_kv);
        let mut scores = Vec::new();
        let mut vals = Vec::new();
        for j in 0..n_kv {
            let visible = j <= pos && p.window.is_none_or(|w| j as i64 > pos as i64 - w as i64);
            if !visible {
                continue;
            }
            let kj = &k[(j * p.n_head_kv + g) * p.dk..][..p.dk];
            let qh = &q[h * p.dk..][..p.dk];
            scores.push(qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * p.scale);
            vals.extend_from_slice(&v[(j * p.n_head_kv + g) * p.dv..][..p.dv]);
        }
        let sink = p.sinks.map(|s| s[h]);
        attend_two_pass(&scores, &vals, p.dv, sink, &mut out[h * p.dv..][..p.dv]);
    }
}

#[test]
fn attention_ref_gqa_sinks_window_against_naive() {
    let mut seed = 7u64;
    let (h_n, hkv, dk, dv, n_kv) = (8, 2, 16, 8, 23);
    let k: Vec<f32> = (0..n_kv * hkv * dk).map(|_| lcg(&mut seed) * 2.0).collect();
    let v: Vec<f32> = (0..n_kv * hkv * dv).map(|_| lcg(&mut seed)).collect();
    // Sinks below most scores, so the sink term matters and must be rescaled.
    let sinks: Vec<f32> = (0..h_n).map(|i| -1.0 + 0.3 * i as f32).collect();
    let q_pos: Vec<u32> = vec![0, 1, 5, 11, 22];
    let q: Vec<f32> = (0..q_pos.len() * h_n * dk)
        .map(|_| lcg(&mut seed) * 2.0)
        .collect();
    for window in [None, Some(1), Some(4), Some(100)] {
        for s in [None, Some(&sinks[..])] {
            let p = AttentionParams {
                n_head: h_n,
                n_head_kv: hkv,
                dk,
                dv,
                scale: 1.0 / (dk as f32).sqrt(),
                sinks: s,
                window,
            };
            let mut out = vec![0.0f32; q_pos.len() * h_n * dv];
            attention_ref(&p, &q, &q_pos, &k, &v, &mut out);
            for (t, &pos) in q_pos.iter().enumerate() {
                let mut want = vec![0.0f32; h_n * dv];
                naive(
                    &p,
                    &q[t * h_n * dk..][..h_n * dk],
                    pos as usize,
                    &k,
                    &v,
                    &mut want,
                );
                assert_close(&out[t * h_n * dv..][..h_n * dv], &want, 1e-5);
            }
        }
    }
}

#[test]
fn attention_ref_hand_cases() {
    // One kv head, two query heads, dk = dv = 1.
    let k = [1.0f32, 2.0, 3.0];
    let v = [10.0f32, 20.0, 30.0];
    let q = [1.0f32, 0.0];
    let mut out = [0.0f32; 2];
    let p = AttentionParams {
        n_head: 2,
        n_head_kv: 1,
        dk: 1,
        dv: 1,
        scale: 1.0,
        sinks: None,
        window: Some(1),
    };
    // Window 1: position 2 sees only itself.
    attention_ref(&p, &q, &[2], &k, &v, &mut out);
    assert_eq!(out, [30.0, 30.0]);
    // Position 0, full attention: only key 0.
    let full = AttentionParams { window: None, ..p };
    attention_ref(&full, &q, &[0], &k, &v, &mut out);
    assert_eq!(out, [10.0, 10.0]);
    // With sinks: head 0 score 1 vs sink 0 -> weight e/(e+1); head 1 score 0 vs sink -inf.
    let sinks = [0.0f32, f32::NEG_INFINITY];
    let ps = AttentionParams {
        sinks: Some(&sinks),
        ..full
    };
    attention_ref(&ps, &q, &[0], &k, &v, &mut out);
    let e = 1.0f32.exp();
    assert!((out[0] - 10.0 * e / (e + 1.0)).abs() < 1e-5, "{}", out[0]);
    assert_eq!(out[1], 10.0);
    // Window 0 sees nothing: zeros.
    let p0 = AttentionParams {
        window: Some(0),
        ..p
    };
    attention_ref(&p0, &q, &[2], &k, &v, &mut out);
    assert_eq!(out, [0.0, 0.0]);
}
