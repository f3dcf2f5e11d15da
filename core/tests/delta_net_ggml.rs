//! The Gated DeltaNet kernels against ggml's own ops (`ggml_ssm_conv`, `ggml_silu`, the
//! fused `ggml_gated_delta_net`) in llama.cpp 11434's AVX2 build:
//! `data/delta_net/ggml.bin`, written by `tools/golden/delta_net_golden.sh`, whose C
//! harness documents the cases; the inputs are regenerated here with its generator. The
//! chunked form of the delta rule is held to the same results within float rounding.

use flint_core::math::{
    delta_net_gate, gated_delta_net, gated_delta_net_chunked, l2_norm_heads, silu, ssm_conv,
    DeltaNetShape,
};

const GOLDEN: &[u8] = include_bytes!("data/delta_net/ggml.bin");

mod ggml_harness;
use ggml_harness::{assert_bits, Golden, Rng};

fn conv_case(gold: &mut Golden<'_>, seed: u32, channels: usize, d_conv: usize, n: usize) {
    let mut r = Rng(seed);
    let w = d_conv - 1;
    let mut state = r.vec(channels * w, |x| x);
    let x = r.vec(n * channels, |x| x);
    let weight = r.vec(channels * d_conv, |x| x);
    let window: Vec<Vec<f32>> = (0..channels)
        .map(|c| {
            let mut u = state[c * w..(c + 1) * w].to_vec();
            u.extend((0..n).map(|t| x[t * channels + c]));
            u
        })
        .collect();
    let mut out = vec![0.0; n * channels];
    ssm_conv(&x, &weight, d_conv, &mut state, &mut out);
    assert_bits("ssm_conv", &out, &gold.take(n * channels));
    for (c, u) in window.iter().enumerate() {
        assert_eq!(
            &state[c * w..(c + 1) * w],
            &u[n..],
            "conv state of channel {c}"
        );
    }
    // ggml's AVX2 SiLU uses its 8-lane `ggml_v_expf`, `math::silu` the 16-lane AVX-512
    // one (the form the device kernels follow): two polynomials of about 1.5 ulp each, so
    // the quotients can differ by a few ulp; 4 ulp of the result is the bound.
    let want = gold.take(n * channels);
    for (i, (&y, &s)) in out.iter().zip(&want).enumerate() {
        let got = silu(y);
        let ulps = (got.to_bits() as i64 - s.to_bits() as i64).abs();
        assert!(
            ulps <= 4,
            "silu[{i}] of {y}: {got} vs ggml {s} ({ulps} ulp)"
        );
    }
}

fn delta_case(gold: &mut Golden<'_>, seed: u32, shape: DeltaNetShape, n: usize) {
    let mut r = Rng(seed);
    let q = r.vec(n * shape.qk_len(), |x| x * 0.25);
    let k = r.vec(n * shape.qk_len(), |x| x * 0.25);
    let v = r.vec(n * shape.v_len(), |x| x);
    let g = r.vec(n * shape.heads_v, |x| -(x + 1.0) * 0.5);
    let beta = r.vec(n * shape.heads_v, |x| (x + 1.0) * 0.5);
    let state0 = r.vec(shape.state_len(), |x| x * 0.5);
    let mut state = state0.clone();
    let mut out = vec![0.0; n * shape.v_len()];
    gated_delta_net(&shape, &q, &k, &v, &g, &beta, &mut state, &mut out);
    let (want_out, want_state) = (gold.take(out.len()), gold.take(state.len()));
    assert_bits("gated_delta_net out", &out, &want_out);
    assert_bits("gated_delta_net state", &state, &want_state);
    // The chunked form, chunks of 2 tokens: ggml's results within float rounding (values
    // of order 0.01-1; a few roundings of 6e-8 each).
    let mut state = state0;
    gated_delta_net_chunked(&shape, 2, &q, &k, &v, &g, &beta, &mut state, &mut out);
    for (what, got, want) in [("out", &out, &want_out), ("state", &state, &want_state)] {
        let e = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(e < 1e-6, "chunked {what}: {e} from ggml");
    }
}

fn prep_case(gold: &mut Golden<'_>, seed: u32, d: usize, rows: usize, nh: usize) {
    let mut r = Rng(seed);
    let mut x = r.vec(d * rows, |x| x);
    let alpha = r.vec(nh, |x| x * 24.0);
    let dt = r.vec(nh, |x| x);
    let a = r.vec(nh, |x| -(x + 1.0));
    l2_norm_heads(&mut x, d, 1e-6);
    assert_bits("l2_norm_heads", &x, &gold.take(d * rows));
    let want = gold.take(nh);
    assert!(
        alpha.iter().zip(&dt).any(|(a, b)| a + b > 20.0),
        "no head above 20"
    );
    for h in 0..nh {
        let got = delta_net_gate(alpha[h], dt[h], a[h]);
        // `libm`'s logf against glibc's: both within an ulp of the exact value (equal on
        // these 16 heads).
        let ulps = (got.to_bits() as i64 - want[h].to_bits() as i64).abs();
        assert!(
            ulps <= 1,
            "gate[{h}]: {got} vs ggml {} ({ulps} ulp)",
            want[h]
        );
    }
}

#[test]
fn kernels_equal_ggml_bit_for_bit() {
    let mut gold = Golden(GOLDEN);
    conv_case(&mut gold, 1, 24, 4, 5);
    let shape = |heads_k, heads_v, head_dim| DeltaNetShape {
        heads_k,
        heads_v,
        head_dim,
    };
    delta_case(&mut gold, 2, shape(1, 2, 32), 5);
    delta_case(&mut gold, 3, shape(1, 1, 36), 2);
    prep_case(&mut gold, 4, 32, 3, 16);
    assert!(
        gold.0.is_empty(),
        "{} bytes of the golden unread",
        gold.0.len()
    );
}
