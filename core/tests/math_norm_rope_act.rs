//! RMSNorm, NeoX RoPE and the activations against values computed independently with
//! numpy (float64 unless said otherwise).

use flint_core::math::{
    gelu_tanh, gelu_tanh_ggml_f16, rms_norm, rms_norm_in_place, rms_norm_rows, rope_neox,
    rope_neox_heads, sigmoid, silu, swiglu,
};

fn close(a: f32, b: f64, tol: f64) -> bool {
    ((a as f64) - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn rms_norm_known_values() {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let mut out = [0.0f32; 4];
    rms_norm(&x, None, 0.0, &mut out);
    let want = [0.36514837, 0.73029674, 1.09544512, 1.46059349];
    for (a, b) in out.iter().zip(want) {
        assert!(close(*a, b, 1e-6), "{a} vs {b}");
    }
    rms_norm(&x, Some(&[1.0, 0.5, 2.0, -1.0]), 0.0, &mut out);
    let want = [0.36514837, 0.36514837, 2.19089023, -1.46059349];
    for (a, b) in out.iter().zip(want) {
        assert!(close(*a, b, 1e-6), "{a} vs {b}");
    }
}

#[test]
fn rms_norm_eps_and_zero_row() {
    // A zero row stays zero (eps keeps the scale finite) instead of becoming NaN.
    let mut out = [1.0f32; 3];
    rms_norm(&[0.0; 3], None, 1e-6, &mut out);
    assert_eq!(out, [0.0; 3]);
    // eps enters under the root: x = [1], eps = 3 -> 1/sqrt(1 + 3) = 0.5.
    let mut o = [0.0f32];
    rms_norm(&[1.0], None, 3.0, &mut o);
    assert_eq!(o[0], 0.5);
}

#[test]
fn rms_norm_rows_and_in_place_agree() {
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let w: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 * 0.1).collect();
    let mut rows = vec![0.0f32; 24];
    rms_norm_rows(&x, Some(&w), 8, 1e-5, &mut rows);
    for r in 0..3 {
        let mut one = vec![0.0f32; 8];
        rms_norm(&x[r * 8..r * 8 + 8], Some(&w), 1e-5, &mut one);
        assert_eq!(&rows[r * 8..r * 8 + 8], &one[..]);
        let mut inplace = x[r * 8..r * 8 + 8].to_vec();
        rms_norm_in_place(&mut inplace, Some(&w), 1e-5);
        assert_eq!(inplace, one);
    }
    // Each normalised row (without weight) has mean square 1.
    rms_norm_rows(&x, None, 8, 0.0, &mut rows);
    for r in rows.chunks(8) {
        let ms: f32 = r.iter().map(|v| v * v).sum::<f32>() / 8.0;
        assert!((ms - 1.0).abs() < 1e-5, "{ms}");
    }
}

#[test]
fn rope_known_values_small_position() {
    // numpy, float64, angle = pos * base^(-2i/n).
    let mut h: Vec<f32> = (1..=8).map(|i| i as f32).collect();
    rope_neox(&mut h, 3, 8, 10000.0);
    let want = [
        -1.69559254,
        0.13755174,
        2.7886816,
        3.97598204,
        -4.80884247,
        6.32305935,
        7.08683674,
        8.01196398,
    ];
    for (a, b) in h.iter().zip(want) {
        assert!(close(*a, b, 2e-6), "{a} vs {b}");
    }
}

#[test]
fn rope_position_zero_is_identity_and_tail_passes_through() {
    let orig: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
    let mut h = orig.clone();
    rope_neox(&mut h, 0, 8, 10000.0);
    assert_eq!(h, orig);
    let mut h = orig.clone();
    rope_neox(&mut h, 17, 8, 10000.0);
    assert_eq!(&h[8..], &orig[8..], "dims >= n_rot must pass through");
    assert_ne!(&h[..8], &orig[..8]);
    // Rotation keeps the norm of every pair (i, i + n_rot/2).
    for i in 0..4 {
        let a = orig[i].hypot(orig[i + 4]);
        let b = h[i].hypot(h[i + 4]);
        assert!((a - b).abs() < 1e-5);
    }
}

/// The angles follow ggml: theta_scale = powf(base, -2/n_rot) and theta multiplied by it
/// step by step in f32. Expected values from a numpy float32 emulation of exactly that;
/// the same head computed with float64 angles `pos * base^(-2i/n)` differs by up to
/// 1.8e-4 at this position, so the tolerance below tells the two apart.
#[test]
fn rope_matches_ggml_iterative_theta_at_large_position() {
    let want: [f64; 64] = [
        1.6366180181503296,
        1.4951311349868774,
        -1.0599775314331055,
        -0.2258482575416565,
        0.5953012704849243,
        1.2414518594741821,
        -0.9813867211341858,
        -0.2718265652656555,
        -0.234261155128479,
        0.9404491782188416,
        1.6540638208389282,
        -0.5047727823257446,
        -0.8433440327644348,
        2.0636584758758545,
        -0.6878750324249268,
        0.178766667842865,
        1.6653738021850586,
        1.5976741313934326,
        -1.5444248914718628,
        -2.2142860889434814,
        -1.1183687448501587,
        2.198575019836426,
        -2.094545841217041,
        0.5628566741943359,
        2.1880173683166504,
        -0.061725735664367676,
        -1.9479265213012695,
        -2.378903865814209,
        -1.9522628784179688,
        -1.2641901969909668,
        -0.6033622026443481,
        -0.06075859069824219,
        -0.7559638023376465,
        -1.0455601215362549,
        -1.5115060806274414,
        -1.8541202545166016,
        -1.7933011054992676,
        -1.4531447887420654,
        -1.6652953624725342,
        1.9356939792633057,
        -1.9624912738800049,
        -1.7630174160003662,
        -1.1593753099441528,
        -1.9782975912094116,
        1.883237361907959,
        0.2990952134132385,
        1.9915523529052734,
        -2.1212687492370605,
        1.360709309577942,
        1.4719631671905518,
        -1.5585906505584717,
        -0.08707058429718018,
        -1.93831467628479,
        0.521752655506134,
        -0.9044087529182434,
        2.2334654331207275,
        -0.7866573929786682,
        -2.346165180206299,
        -1.3479281663894653,
        0.23695582151412964,
        1.4173856973648071,
        2.080406665802002,
        2.3809990882873535,
        2.477382183074951,
    ];
    let mut h: Vec<f32> = (0..72).map(|i| 1.0 + i as f32 / 64.0).collect();
    let tail = h[64..].to_vec();
    rope_neox(&mut h, 5000, 64, 10000.0);
    for (i, (a, b)) in h.iter().zip(want).enumerate() {
        assert!((*a as f64 - b).abs() <= 2e-6, "dim {i}: {a} vs {b}");
    }
    assert_eq!(&h[64..], &tail[..]);
}

#[test]
fn rope_scores_depend_on_relative_position_only() {
    let q0: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).cos()).collect();
    let k0: Vec<f32> = (0..16).map(|i| (i as f32 * 1.3).sin()).collect();
    let score = |pq: u32, pk: u32| {
        let (mut q, mut k) = (q0.clone(), k0.clone());
        rope_neox(&mut q, pq, 16, 500.0);
        rope_neox(&mut k, pk, 16, 500.0);
        q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>()
    };
    let a = score(7, 3);
    let b = score(104, 100);
    assert!((a - b).abs() < 1e-4, "{a} vs {b}");
}

#[test]
fn rope_heads_applies_each_head() {
    let mut x: Vec<f32> = (0..32).map(|i| i as f32 * 0.1).collect();
    let mut y = x.clone();
    rope_neox_heads(&mut x, 16, 9, 8, 1e4);
    for h in y.chunks_mut(16) {
        rope_neox(h, 9, 8, 1e4);
    }
    assert_eq!(x, y);
}

#[test]
fn activations_known_values() {
    assert!(close(silu(1.0), 0.7310585786300049, 1e-6));
    assert!(close(silu(-2.0), -0.2384058440442351, 1e-6));
    assert!(close(silu(5.0), 4.966535745378576, 1e-6));
    assert!(close(sigmoid(0.0), 0.5, 0.0));
    assert!(close(sigmoid(2.0), 0.8807970779778823, 1e-6));
    assert!(close(sigmoid(-3.0), 0.04742587317756678, 1e-6));
    assert!(close(gelu_tanh(1.0), 0.8411919906082768, 1e-6));
    assert!(close(gelu_tanh(-1.0), -0.1588080093917233, 1e-6));
    assert!(close(gelu_tanh(0.5), 0.34571400982514394, 1e-6));
    assert!(close(gelu_tanh(3.0), 2.996362607918227, 1e-6));
    // Saturation without NaN or overflow.
    assert_eq!(silu(100.0), 100.0);
    assert!(silu(-100.0).abs() < 1e-40);
    assert_eq!(sigmoid(-200.0), 0.0);
    assert_eq!(gelu_tanh(20.0), 20.0);
    assert_eq!(gelu_tanh(-20.0), -0.0);
}

#[test]
fn gelu_f16_form_is_f16_rounded_reference() {
    use half::f16;
    // Inside (-10, 10), where ggml uses the table.
    for i in -969..969 {
        let x = i as f32 / 97.0;
        let g = gelu_tanh_ggml_f16(x);
        let want = f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32();
        assert_eq!(g.to_bits(), want.to_bits(), "x = {x}");
        // And close to the exact form: f16 keeps 11 significant bits.
        assert!(
            (g - gelu_tanh(x)).abs() <= 4e-3 * (1.0 + x.abs()),
            "x = {x}"
        );
    }
    assert_eq!(gelu_tanh_ggml_f16(-10.0), 0.0);
    assert_eq!(gelu_tanh_ggml_f16(12.5), 12.5);
}

#[test]
fn swiglu_is_silu_times_up() {
    let g = [1.0f32, -2.0, 0.0];
    let u = [2.0f32, 3.0, 4.0];
    let mut o = [0.0f32; 3];
    swiglu(&g, &u, &mut o);
    assert_eq!(o, [silu(1.0) * 2.0, silu(-2.0) * 3.0, 0.0]);
}

#[test]
fn swiglu_oai_known_values_and_clamps() {
    use flint_core::math::swiglu_oai;
    // Python: x * (1 / (1 + exp(-1.702 x))) * (y + 1) with x = min(g, 7),
    // y = clip(u, -7, 7).
    let want = |g: f64, u: f64| {
        let x = g.min(7.0);
        let y = u.clamp(-7.0, 7.0);
        x / (1.0 + (-1.702 * x).exp()) * (y + 1.0)
    };
    for &(g, u) in &[
        (0.5, 2.0),
        (-3.0, 0.25),
        (6.5, -6.5),
        (9.0, 1.0),
        (2.0, 12.0),
        (1.0, -30.0),
        (-20.0, 3.0),
    ] {
        assert!(
            close(swiglu_oai(g, u), want(g as f64, u as f64), 1e-5),
            "swiglu_oai({g}, {u}) = {}",
            swiglu_oai(g, u)
        );
    }
    // The gate is clamped above only, the up branch on both sides.
    assert_eq!(swiglu_oai(9.0, 1.0), swiglu_oai(7.0, 1.0));
    assert_eq!(swiglu_oai(2.0, 12.0), swiglu_oai(2.0, 7.0));
    assert_eq!(swiglu_oai(2.0, -12.0), swiglu_oai(2.0, -7.0));
    assert_ne!(swiglu_oai(-9.0, 1.0), swiglu_oai(-7.0, 1.0));
}
