//! One test per Flint feature (sinks, window, QK norm, shared expert, selection bias,
//! renormalisation, the SWA RoPE base). Each has two parts:
//! - a hand-computed small case of the reference's building block;
//! - on the `tiny` checkpoint, the feature toggled or altered: the reference's logits must
//!   change materially (so a forward that ignored the feature would fail), and the device
//!   forward must follow the reference in both settings (so a device that ignored it would
//!   fail too).

mod flint_common;
use flint_common::*;

use flint_core::math::GgmlCpuBuild;
use flint_engine::forward::reference::{
    attend_head, matvec, rms_norm, rope_neox, route, Reference,
};
use flint_engine::model::{Ffn, Model};
use flint_hal::Gating;

/// Logits over a prompt longer than the window, for the original and the altered model:
/// asserts a material change on the reference, and that the device forward follows the
/// reference in both settings: its logits lie far closer to the reference of the same
/// setting than to the reference of the other. (Means, not maxima: the two forwards
/// agree bit for bit on most rows, but a last-bit difference in one op can flip an
/// activation's int8 rounding or a near-tied expert choice and move a few rows.)
/// How much closer to the same-setting reference the device must be than to the other
/// one. A device that ignored a feature sits about as far from both (ratio ~1).
///
/// The device and the reference forward both follow llama.cpp's arithmetic (f16 keys
/// and values, llama.cpp's matmul orders; docs/parity.md), so on a CPU with the AVX-512
/// VNNI kernels they agree to within a small fraction of what any feature changes.
const FOLLOW_RATIO: f32 = 0.1;

fn assert_feature_matters(name: &str, model: &Model, altered: &Model) {
    let toks = prompt(77, 16, model.spec.vocab);
    let base = reference_logits(model, &toks);
    let alt = reference_logits(altered, &toks);
    let std = logit_std(&base);
    let change = max_abs_diff(&base, &alt);
    eprintln!(
        "{name}: max logit change {change:.3}, mean {:.3} (logit std {std:.3})",
        mean_abs_diff(&base, &alt)
    );
    assert!(
        change > 0.25 * std,
        "{name}: altering the feature changed the reference logits by only {change} (std {std})"
    );
    for (what, m, same, other) in [
        ("original", model, &base, &alt),
        ("altered", altered, &alt, &base),
    ] {
        let d = device_logits(m, &toks);
        let (near, far) = (mean_abs_diff(same, &d), mean_abs_diff(other, &d));
        eprintln!("{name} ({what}): device vs same-setting reference {near:.4}, vs other {far:.4}");
        assert!(
            near < FOLLOW_RATIO * far,
            "{name} ({what}): the device is not following the reference ({near} vs {far})"
        );
    }
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn sinks() {
    // Hand case: scores [1, 0], sink 0.5: out = (v0 + e^-1 v1) / (1 + e^-1 + e^-0.5).
    let (k0, k1) = ([1.0f32, 0.0], [0.0f32, 1.0]);
    let keys: Vec<&[f32]> = vec![&k0, &k1];
    let o = attend_head(
        GgmlCpuBuild::Avx512,
        &[1.0, 0.0],
        &keys,
        &keys,
        1,
        1.0,
        Some(0.5),
        None,
    );
    let den = 1.0 + (-1.0f32).exp() + (-0.5f32).exp();
    assert!(
        close(&o, &[1.0 / den, (-1.0f32).exp() / den], 1e-6),
        "{o:?}"
    );
    // A sink above every score: the maximum is the sink's, e^(sink - m) = 1.
    let o = attend_head(
        GgmlCpuBuild::Avx512,
        &[1.0, 0.0],
        &keys,
        &keys,
        1,
        1.0,
        Some(3.0),
        None,
    );
    let den = (-2.0f32).exp() + (-3.0f32).exp() + 1.0;
    assert!(
        close(&o, &[(-2.0f32).exp() / den, (-3.0f32).exp() / den], 1e-6),
        "{o:?}"
    );
    // Without a sink: a plain softmax.
    let o = attend_head(
        GgmlCpuBuild::Avx512,
        &[1.0, 0.0],
        &keys,
        &keys,
        1,
        1.0,
        None,
        None,
    );
    let den = 1.0 + (-1.0f32).exp();
    assert!(
        close(&o, &[1.0 / den, (-1.0f32).exp() / den], 1e-6),
        "{o:?}"
    );

    let m = tiny();
    assert!(m.layers.iter().all(|l| l.sinks.is_some()));
    let mut alt = m.clone();
    for l in &mut alt.layers {
        l.sinks = None;
    }
    assert_feature_matters("sinks", &m, &alt);
}

#[test]
fn sliding_window() {
    // Hand case: 4 positions, window 2 at position 3 sees only positions 2 and 3.
    let rows: Vec<[f32; 2]> = vec![[5.0, 0.0], [4.0, 1.0], [0.0, 1.0], [1.0, 1.0]];
    let keys: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
    let o = attend_head(
        GgmlCpuBuild::Avx512,
        &[1.0, 2.0],
        &keys,
        &keys,
        3,
        1.0,
        None,
        Some(2),
    );
    let (s2, s3) = (2.0f32, 3.0f32);
    let (p2, p3) = ((s2 - s3).exp(), 1.0);
    let want = [
        (p2 * 0.0 + p3 * 1.0) / (p2 + p3),
        (p2 * 1.0 + p3 * 1.0) / (p2 + p3),
    ];
    assert!(close(&o, &want, 1e-6), "{o:?} vs {want:?}");
    let full = attend_head(
        GgmlCpuBuild::Avx512,
        &[1.0, 2.0],
        &keys,
        &keys,
        3,
        1.0,
        None,
        None,
    );
    assert!(!close(&o, &full, 1e-3));

    let m = tiny();
    assert_eq!(m.spec.window, Some(8));
    assert!(m.spec.layers.iter().filter(|l| l.sliding).count() >= 2);
    assert!(m.spec.layers.iter().filter(|l| !l.sliding).count() >= 2);
    let mut alt = m.clone();
    alt.spec.window = Some(m.spec.context_length);
    assert_feature_matters("window removed", &m, &alt);
    let mut alt = m.clone();
    alt.spec.window = Some(3);
    assert_feature_matters("window altered (8 -> 3)", &m, &alt);
}

#[test]
fn qk_norm() {
    // Hand case: rmsnorm([3, 4]) * [1, 2] = [3, 8] / sqrt(12.5).
    let r = 12.5f32.sqrt();
    assert!(close(
        &rms_norm(&[3.0, 4.0], Some(&[1.0, 2.0]), 0.0),
        &[3.0 / r, 8.0 / r],
        1e-6
    ));

    let m = tiny();
    assert!(m
        .layers
        .iter()
        .all(|l| l.q_norm.is_some() && l.k_norm.is_some()));
    let mut alt = m.clone();
    for l in &mut alt.layers {
        l.q_norm = None;
        l.k_norm = None;
    }
    assert_feature_matters("QK norm", &m, &alt);
}

#[test]
fn shared_expert() {
    let m = tiny();
    let il = m
        .layers
        .iter()
        .position(|l| matches!(l.ffn, Ffn::Moe(_)))
        .expect("a MoE layer");
    let Ffn::Moe(moe) = &m.layers[il].ffn else {
        unreachable!()
    };
    let shared = moe.shared.clone().expect("tiny has a shared expert");
    let mut alt = m.clone();
    if let Ffn::Moe(moe) = &mut alt.layers[il].ffn {
        moe.shared = None;
    }
    // Hand case: FFN(with) - FFN(without) = Wdown(silu(Wgate f) * (Wup f)), weight 1, no gate.
    let f: Vec<f32> = prompt(5, m.spec.d, 1000)
        .iter()
        .map(|&t| t as f32 / 500.0 - 1.0)
        .collect();
    let with = Reference::new(&m).layer_ffn(il, &f).expect("test value");
    let without = Reference::new(&alt).layer_ffn(il, &f).expect("test value");
    let g = matvec(&shared.gate, &f).expect("test value");
    let u = matvec(&shared.up, &f).expect("test value");
    let h: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let y = matvec(&shared.down, &h).expect("test value");
    let got: Vec<f32> = with.iter().zip(&without).map(|(a, b)| a - b).collect();
    assert!(
        close(&got, &y, 1e-4),
        "shared expert contribution differs from the hand computation"
    );

    let mut alt = m.clone();
    for l in &mut alt.layers {
        if let Ffn::Moe(moe) = &mut l.ffn {
            moe.shared = None;
        }
    }
    assert_feature_matters("shared expert", &m, &alt);
}

/// The top 2 of sigmoid-gated logits through the reference's routing (the devices'
/// AVX-512 statement): `(expert, weight)` in selection order.
fn top2_sigmoid(
    logits: &[f32],
    bias: Option<&[f32]>,
    normalize: bool,
    scale: f32,
) -> Vec<(usize, f32)> {
    route(
        GgmlCpuBuild::Avx512,
        logits,
        bias,
        2,
        Gating::Sigmoid,
        normalize,
        scale,
    )
    .expect("test value")
}

#[test]
fn selection_bias() {
    // Hand case: the bias chooses, the unbiased scores weigh.
    let logits = [0.0f32, 1.0, 2.0, 3.0];
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    let r = top2_sigmoid(&logits, Some(&[5.0, 0.0, 0.0, 0.0]), true, 1.0);
    let t = sig(0.0) + sig(3.0);
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 3]);
    assert!((r[0].1 - sig(0.0) / t).abs() < 1e-6 && (r[1].1 - sig(3.0) / t).abs() < 1e-6);
    let r = top2_sigmoid(&logits, None, true, 1.0);
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);

    let m = tiny();
    let mut alt = m.clone();
    let mut n = 0;
    for l in &mut alt.layers {
        if let Ffn::Moe(moe) = &mut l.ffn {
            assert!(moe.bias.is_some());
            moe.bias = None;
            n += 1;
        }
    }
    assert!(n >= 2);
    assert_feature_matters("selection bias", &m, &alt);
}

#[test]
fn renormalisation() {
    // Hand case: with renormalisation the chosen weights sum to 1 (times the scale);
    // without, they are the raw sigmoid scores.
    let logits = [0.5f32, -1.0, 2.0, 0.0];
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    let r = top2_sigmoid(&logits, None, true, 2.5);
    let s: f32 = r.iter().map(|x| x.1).sum();
    assert!((s - 2.5).abs() < 1e-5, "{r:?}");
    let r = top2_sigmoid(&logits, None, false, 1.0);
    assert!(
        (r[0].1 - sig(2.0)).abs() < 1e-6 && (r[1].1 - sig(0.5)).abs() < 1e-6,
        "{r:?}"
    );

    let m = tiny();
    let mut alt = m.clone();
    let moe = alt.spec.moe.as_mut().expect("tiny is MoE");
    assert!(moe.normalize && moe.gating == Gating::Sigmoid);
    moe.normalize = false;
    assert_feature_matters("renormalisation", &m, &alt);
}

#[test]
fn swa_rope_base() {
    // Hand case: n_rot = 4, pair i turns by pos * base^(-2i/4).
    for base in [10_000.0f32, 1_000_000.0] {
        let mut x = [1.0f32, 1.0, 0.0, 0.0];
        rope_neox(&mut x, 3, 4, base);
        let (a0, a1) = (3.0f32, 3.0 * base.powf(-0.5));
        let want = [a0.cos(), a1.cos(), a0.sin(), a1.sin()];
        assert!(close(&x, &want, 1e-5), "base {base}: {x:?} vs {want:?}");
    }

    let m = tiny();
    // The file's two bases reach the layers: sliding 1e4, full 1e6.
    for l in &m.spec.layers {
        let want = if l.sliding { 10_000.0 } else { 1_000_000.0 };
        assert_eq!(l.rope_base, want);
    }
    let mut alt = m.clone();
    for l in &mut alt.spec.layers {
        l.rope_base = 1_000_000.0;
    }
    assert_feature_matters("SWA RoPE base", &m, &alt);
}
