//! Gated DeltaNet kernels: the chunked form against the recurrent one, sequences split at
//! arbitrary tokens against one pass (what chunked prefill relies on), and the recurrent
//! form against the delta rule written out with plain matrices.

use flint_core::math::{
    delta_net_gate, gated_delta_net, gated_delta_net_chunked, l2_norm_heads, ssm_conv,
    DeltaNetShape, DELTA_NET_CHUNK,
};

/// splitmix64, floats in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn vec(&mut self, n: usize, f: impl Fn(f32) -> f32) -> Vec<f32> {
        (0..n).map(|_| f(self.next())).collect()
    }
}

/// Per-token inputs of `n` tokens as the layer produces them: q and k L2-normalised per
/// head, decays in (0.37, 1], beta in [0, 1).
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

fn l2_rows(x: &mut [f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        let n = row.iter().map(|a| a * a).sum::<f32>().sqrt();
        row.iter_mut().for_each(|a| *a /= n);
    }
}

fn inputs(seed: u64, s: &DeltaNetShape, n: usize) -> Inputs {
    let mut r = Rng(seed);
    let mut q = r.vec(n * s.qk_len(), |x| x);
    let mut k = r.vec(n * s.qk_len(), |x| x);
    l2_rows(&mut q, s.head_dim);
    l2_rows(&mut k, s.head_dim);
    Inputs {
        q,
        k,
        v: r.vec(n * s.v_len(), |x| x),
        g: r.vec(n * s.heads_v, |x| -(x + 1.0) * 0.5),
        beta: r.vec(n * s.heads_v, |x| (x + 1.0) * 0.5),
        state: r.vec(s.state_len(), |x| x * 0.5),
    }
}

/// Runs the recurrent form (`chunk` `None`) or the chunked one over tokens `a..b` of
/// `x`, on `state`.
fn run(
    chunk: Option<usize>,
    s: &DeltaNetShape,
    x: &Inputs,
    (a, b): (usize, usize),
    state: &mut [f32],
) -> Vec<f32> {
    let (ql, vl, hv) = (s.qk_len(), s.v_len(), s.heads_v);
    let mut out = vec![0.0; (b - a) * vl];
    let (q, k) = (&x.q[a * ql..b * ql], &x.k[a * ql..b * ql]);
    let v = &x.v[a * vl..b * vl];
    let (g, beta) = (&x.g[a * hv..b * hv], &x.beta[a * hv..b * hv]);
    match chunk {
        None => gated_delta_net(s, q, k, v, g, beta, state, &mut out),
        Some(c) => gated_delta_net_chunked(s, c, q, k, v, g, beta, state, &mut out),
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const SHAPE: DeltaNetShape = DeltaNetShape {
    heads_k: 2,
    heads_v: 4,
    head_dim: 16,
};

/// Float tolerance between the forms: the outputs are O(0.1), the state O(1); the two
/// forms round in different orders (sums of up to 64 terms per chunk against one token
/// at a time), each step within a few ulp, and the decay keeps errors from growing.
/// Observed over 150 tokens: 1.2e-7 on the outputs, 1.8e-7 on the state; 10x margin.
const TOL: f32 = 2e-6;

#[test]
fn chunked_equals_recurrent() {
    let n = 150; // two full chunks of 64 and a partial one
    let x = inputs(1, &SHAPE, n);
    let mut s_rec = x.state.clone();
    let o_rec = run(None, &SHAPE, &x, (0, n), &mut s_rec);
    for chunk in [DELTA_NET_CHUNK, 1, 7] {
        let mut s_ch = x.state.clone();
        let o_ch = run(Some(chunk), &SHAPE, &x, (0, n), &mut s_ch);
        let (eo, es) = (max_diff(&o_rec, &o_ch), max_diff(&s_rec, &s_ch));
        assert!(eo < TOL && es < TOL, "chunk {chunk}: out {eo}, state {es}");
    }
    // The inputs are not degenerate: the state moved and the outputs are not tiny.
    assert!(max_diff(&s_rec, &x.state) > 0.1);
    assert!(o_rec.iter().any(|o| o.abs() > 0.05));
}

#[test]
fn split_sequences_equal_one_pass() {
    let n = 150;
    let x = inputs(2, &SHAPE, n);
    let mut s_one = x.state.clone();
    let o_one = run(None, &SHAPE, &x, (0, n), &mut s_one);
    for cuts in [&[1usize][..], &[63, 64, 65], &[17, 100, 149], &[70]] {
        // The recurrent form: bit for bit.
        let mut st = x.state.clone();
        let mut o = Vec::new();
        let mut a = 0;
        for &b in cuts.iter().chain([n].iter()) {
            o.extend(run(None, &SHAPE, &x, (a, b), &mut st));
            a = b;
        }
        assert_eq!(o, o_one, "recurrent, cuts {cuts:?}: outputs");
        assert_eq!(st, s_one, "recurrent, cuts {cuts:?}: state");
        // The chunked form: within float rounding of one pass.
        let mut st = x.state.clone();
        let mut o = Vec::new();
        let mut a = 0;
        for &b in cuts.iter().chain([n].iter()) {
            o.extend(run(Some(DELTA_NET_CHUNK), &SHAPE, &x, (a, b), &mut st));
            a = b;
        }
        let (eo, es) = (max_diff(&o, &o_one), max_diff(&st, &s_one));
        assert!(
            eo < TOL && es < TOL,
            "chunked, cuts {cuts:?}: out {eo}, state {es}"
        );
    }
}

#[test]
fn recurrent_equals_the_delta_rule_in_f64() {
    // S <- exp(g) S; S <- S + beta k (v - S^T k)^T; o = S^T q / sqrt(d), with S[i][j]
    // held as a plain d x d matrix in f64, value head h on key head h % heads_k.
    let n = 20;
    let x = inputs(3, &SHAPE, n);
    let d = SHAPE.head_dim;
    let mut st = x.state.clone();
    let out = run(None, &SHAPE, &x, (0, n), &mut st);
    for h in 0..SHAPE.heads_v {
        let hk = h % SHAPE.heads_k;
        let mut s = vec![vec![0.0f64; d]; d];
        for (i, row) in s.iter_mut().enumerate() {
            for (j, e) in row.iter_mut().enumerate() {
                *e = x.state[h * d * d + j * d + i] as f64;
            }
        }
        for t in 0..n {
            let qv = &x.q[(t * SHAPE.heads_k + hk) * d..][..d];
            let kv = &x.k[(t * SHAPE.heads_k + hk) * d..][..d];
            let vv = &x.v[(t * SHAPE.heads_v + h) * d..][..d];
            let decay = (x.g[t * SHAPE.heads_v + h] as f64).exp();
            let b = x.beta[t * SHAPE.heads_v + h] as f64;
            s.iter_mut().flatten().for_each(|e| *e *= decay);
            let delta: Vec<f64> = (0..d)
                .map(|j| b * (vv[j] as f64 - (0..d).map(|i| s[i][j] * kv[i] as f64).sum::<f64>()))
                .collect();
            for i in 0..d {
                for j in 0..d {
                    s[i][j] += kv[i] as f64 * delta[j];
                }
            }
            for j in 0..d {
                let o = (0..d).map(|i| s[i][j] * qv[i] as f64).sum::<f64>() / (d as f64).sqrt();
                let got = out[(t * SHAPE.heads_v + h) * d + j] as f64;
                assert!(
                    (got - o).abs() < 1e-5,
                    "head {h} token {t} o[{j}]: {got} vs {o}"
                );
            }
        }
        for (i, row) in s.iter().enumerate() {
            for (j, e) in row.iter().enumerate() {
                let got = st[h * d * d + j * d + i] as f64;
                assert!((got - e).abs() < 1e-5, "head {h} S[{i}][{j}]: {got} vs {e}");
            }
        }
    }
}

#[test]
fn conv_split_equals_one_pass_and_windows_carry() {
    let (channels, d_conv, n) = (10, 4, 9);
    let mut r = Rng(4);
    let x = r.vec(n * channels, |v| v);
    let weight = r.vec(channels * d_conv, |v| v);
    let state0 = r.vec(channels * (d_conv - 1), |v| v);
    let mut s_one = state0.clone();
    let mut o_one = vec![0.0; n * channels];
    ssm_conv(&x, &weight, d_conv, &mut s_one, &mut o_one);
    // Output t of channel c: sum_i window[t + i] * w[i], the window starting with the
    // carried inputs.
    for c in 0..channels {
        let u: Vec<f32> = state0[c * 3..c * 3 + 3]
            .iter()
            .copied()
            .chain((0..n).map(|t| x[t * channels + c]))
            .collect();
        for t in 0..n {
            let want: f32 = (0..d_conv).map(|i| u[t + i] * weight[c * d_conv + i]).sum();
            assert!((o_one[t * channels + c] - want).abs() < 1e-6);
        }
        assert_eq!(&s_one[c * 3..c * 3 + 3], &u[n..]);
    }
    // Splits, including pieces shorter than the window: the same bits.
    for cuts in [&[1usize, 2][..], &[3], &[4, 8], &[2, 3, 4, 5, 6, 7, 8]] {
        let mut st = state0.clone();
        let mut o = Vec::new();
        let mut a = 0;
        for &b in cuts.iter().chain([n].iter()) {
            let mut piece = vec![0.0; (b - a) * channels];
            ssm_conv(
                &x[a * channels..b * channels],
                &weight,
                d_conv,
                &mut st,
                &mut piece,
            );
            o.extend(piece);
            a = b;
        }
        assert_eq!(o, o_one, "cuts {cuts:?}");
        assert_eq!(st, s_one, "cuts {cuts:?}");
    }
}

#[test]
fn l2_norm_and_gate() {
    let mut x = vec![3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    l2_norm_heads(&mut x, 4, 1e-6);
    // 1 / sqrt(25 + eps), 1 / sqrt(4 + eps).
    let want = [0.6, 0.8, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5];
    for (a, b) in x.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{x:?}");
    }
    // A zero head stays zero (eps keeps it finite).
    let mut z = vec![0.0f32; 4];
    l2_norm_heads(&mut z, 4, 1e-6);
    assert_eq!(z, [0.0; 4]);
    // softplus(0.5 + 0.25) * -2 = -2 ln(1 + e^0.75); above 20 softplus is the identity.
    let g = delta_net_gate(0.5, 0.25, -2.0);
    assert!(
        (g as f64 + 2.0 * (1.0 + 0.75f64.exp()).ln()).abs() < 1e-6,
        "{g}"
    );
    assert_eq!(delta_net_gate(30.0, 1.0, -0.5), -15.5);
    assert!(delta_net_gate(-40.0, 0.0, -1.0) <= 0.0);
}

#[test]
fn qwen35_gates_split_and_broadcast() {
    use flint_core::math::{
        deinterleave, delta_net_gate, delta_net_gates, mul_rows, sigmoid_ggml,
        sigmoid_ggml_in_place,
    };
    // Two heads of 2 queries then 2 gate values each.
    let src = [1.0f32, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
    let (mut q, mut g) = ([0.0f32; 4], [0.0f32; 4]);
    deinterleave(&src, 2, &mut [&mut q, &mut g]);
    assert_eq!((q, g), ([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]));
    // One value per row, then one per element.
    let mut acc = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    mul_rows(&mut acc, &[2.0, -1.0]);
    assert_eq!(acc, [2.0, 4.0, 6.0, -4.0, -5.0, -6.0]);
    mul_rows(&mut acc, &[0.5; 6]);
    assert_eq!(acc, [1.0, 2.0, 3.0, -2.0, -2.5, -3.0]);
    let mut s = [-1.0f32, 0.0, 3.0];
    sigmoid_ggml_in_place(&mut s);
    assert_eq!(s, [sigmoid_ggml(-1.0), 0.5, sigmoid_ggml(3.0)]);
    // Per head of each row, its own bias and rate.
    let mut al = [0.1f32, 0.2, 0.3, 0.4];
    delta_net_gates(&mut al, &[1.0, -1.0], &[-2.0, -0.5]);
    assert_eq!(
        al,
        [
            delta_net_gate(0.1, 1.0, -2.0),
            delta_net_gate(0.2, -1.0, -0.5),
            delta_net_gate(0.3, 1.0, -2.0),
            delta_net_gate(0.4, -1.0, -0.5),
        ]
    );
}
