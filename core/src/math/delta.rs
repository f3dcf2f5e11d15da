//! Qwen 3.5's linear-attention layers (Gated DeltaNet): the short causal convolution and
//! the gated delta rule, as llama.cpp computes them (`src/models/qwen35moe.cpp`,
//! `src/models/delta-net-base.cpp`, ggml's `ssm_conv` and `gated_delta_net` CPU ops).
//!
//! # The layer around these kernels (llama.cpp's order; not computed here)
//!
//! From the normed hidden row `x` of a token: `qkv = W_qkv x` (the `conv_dim =
//! 2 * heads_k * d + heads_v * d` channels: all of q, then all of k, then all of v),
//! `z = W_gate x` (`heads_v * d`), `beta = sigmoid(W_beta x)` and
//! `g = softplus(W_alpha x + dt_bias) * ssm_a` per value head ([`delta_net_gate`];
//! `ssm_a` holds `-exp(A_log)`, so `g < 0` and `exp(g)` is a decay in `(0, 1)`). Then:
//!
//! 1. [`ssm_conv`] over the channels of `qkv`, with the window of the previous
//!    `d_conv - 1` rows carried per sequence, and SiLU on every output;
//! 2. q and k of each head L2-normalised ([`l2_norm_heads`], llama.cpp's
//!    `build_gdn_l2_norm`: `rms_norm(x, eps / d) * (1 / sqrt(d))`, i.e.
//!    `x / sqrt(sum x^2 + eps)`, with the RMS norm's `eps`);
//! 3. [`gated_delta_net`] over the tokens, with the per-head state carried;
//! 4. `rms_norm(o) * w_norm * silu(z)` per head, then `W_out`.
//!
//! # The convolution ([`ssm_conv`])
//!
//! Depthwise over `channels`, kernel width `d_conv` (4 in Qwen 3.5), causal: with the
//! window `u = state ++ x` of one channel (`d_conv - 1` carried inputs, oldest first, then
//! the `n` new ones), output `t` is `sum_{i < d_conv} u[t + i] * w[i]`, summed from
//! `i = 0` in f32, each product rounded before the add (ggml's `ssm_conv_f32`).
//! The state becomes the last `d_conv - 1` entries of `u`.
//!
//! # The gated delta rule ([`gated_delta_net`])
//!
//! Per value head `h` (key head `h % heads_k`: ggml's fused op broadcasts key heads by
//! tiling, as `ggml_repeat_4d` does on the unfused path), a state `S` of `d x d`
//! (`S[i][j]`, `i` over the key dimension, `j` over the value dimension) and per token
//! `q, k` (`d`, L2-normalised), `v` (`d`), scalars `g` (log decay) and `beta`:
//!
//! ```text
//! S     <- exp(g) * S
//! delta  = beta * (v - S^T k)            // delta[j] = beta * (v[j] - sum_i S[i][j] k[i])
//! S     <- S + k delta^T                 // S[i][j] += k[i] * delta[j]
//! o      = (S^T q) / sqrt(d)             // o[j] = sum_i S[i][j] q[i], then scaled
//! ```
//!
//! The state is stored as ggml stores it, transposed: `state[h][j][i] = S[i][j]`, so that
//! row `j` (one value component, all keys) is contiguous. Each row is independent of the
//! others within a token (delta[j], the update and o[j] read row `j` only), which is what
//! lets [`gated_delta_net_head`] walk row by row and still give ggml's bits.
//!
//! Float order ([`gated_delta_net`]): that of ggml's fused `gated_delta_net` op in an AVX2
//! build, which llama.cpp's CPU backend runs for prompts and decode steps alike
//! (`fused_gdn_ar`, `fused_gdn_ch`): `exp(g)` is glibc's `expf` ([`super::expf_libc`]);
//! the decay one multiply per element; both dot products `ggml_vec_dot_f32`
//! ([`crate::dot::ggml_x86::vec_dot_f32_ggml`] of the AVX2 build); the update a fused multiply-add per element
//! (`ggml_vec_mad_f32`, its scalar tail included); `o[j]` the dot product times
//! `1 / sqrtf(d)` (q is not scaled first, unlike llama.cpp's unfused graphs).
//! `tests/delta_net_ggml.rs` holds it to ggml bit for bit. An AVX-512 build of llama.cpp
//! sums its dot products over 16 lanes (`GGML_F32_STEP` 64) and may differ in the last
//! bits.
//!
//! # The chunked form ([`gated_delta_net_chunked`])
//!
//! The same recurrence over chunks of `C` tokens (llama.cpp's `build_delta_net_chunking`,
//! `C = 64`), which reads the state once per chunk and turns the rest into products of
//! `C x C` and `C x d` matrices. Within a chunk starting from state `S0`, with
//! `G[r] = g[0] + ... + g[r]` (the cumulative log decay),
//! `L[r][s] = beta[r] exp(G[r] - G[s]) (k[r] . k[s])` for `s < r` and `T = (I + L)^-1`
//! (unit lower triangular, by forward substitution):
//!
//! ```text
//! U     = T (beta v)                     // C x d
//! W     = T (beta exp(G) k)              // C x d
//! Delta = U - W S0                       // row r: the delta of token r
//! o[r]  = (exp(G[r]) S0^T q[r] + sum_{s <= r} exp(G[r] - G[s]) (q[r] . k[s]) Delta[s]) / sqrt(d)
//! S1    = exp(G[C-1]) S0 + sum_s exp(G[C-1] - G[s]) k[s] Delta[s]^T
//! ```
//!
//! Expanding the recurrence token by token gives exactly these sums, so the two forms
//! agree up to float rounding (tested: `tests/math_delta.rs`). Splitting a sequence at any
//! token and carrying the state gives the recurrent form's bits exactly, and the chunked
//! form's results within that rounding: what chunked prefill relies on.

use super::GgmlCpuBuild;
use crate::dot::ggml_x86::vec_dot_f32_ggml;

/// The shape of one gated delta net layer: key heads (q and k), value heads (v, the
/// state and the output; a multiple of `heads_k`) and the head dimension, the same for
/// keys and values (ggml requires it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeltaNetShape {
    /// q and k heads (GGUF `ssm.group_count`).
    pub heads_k: usize,
    /// v heads, states and outputs (GGUF `ssm.time_step_rank`).
    pub heads_v: usize,
    /// Size of one head (GGUF `ssm.state_size`).
    pub head_dim: usize,
}

impl DeltaNetShape {
    /// Floats of one q (or k) row of a token: `heads_k * head_dim`.
    pub fn qk_len(&self) -> usize {
        self.heads_k * self.head_dim
    }

    /// Floats of one v (or output) row of a token: `heads_v * head_dim`.
    pub fn v_len(&self) -> usize {
        self.heads_v * self.head_dim
    }

    /// Floats of one head's state: `head_dim^2`.
    pub fn head_state_len(&self) -> usize {
        self.head_dim * self.head_dim
    }

    /// Floats of the whole state of one sequence: `heads_v * head_dim^2`.
    pub fn state_len(&self) -> usize {
        self.heads_v * self.head_state_len()
    }

    /// Whether the shape is usable: every size non-zero, `heads_v` a multiple of
    /// `heads_k`.
    pub fn is_valid(&self) -> bool {
        self.heads_k > 0
            && self.heads_v > 0
            && self.head_dim > 0
            && self.heads_v.is_multiple_of(self.heads_k)
    }

    /// The number of tokens in `q` (and the other per-token inputs), checking every
    /// length against the shape.
    fn tokens(&self, q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: &[f32]) -> usize {
        assert!(self.is_valid(), "gated_delta_net: invalid shape {self:?}");
        let n = q.len() / self.qk_len();
        assert_eq!(q.len(), n * self.qk_len(), "gated_delta_net: q length");
        assert_eq!(k.len(), q.len(), "gated_delta_net: k length");
        assert_eq!(v.len(), n * self.v_len(), "gated_delta_net: v length");
        assert_eq!(g.len(), n * self.heads_v, "gated_delta_net: g length");
        assert_eq!(beta.len(), n * self.heads_v, "gated_delta_net: beta length");
        n
    }
}

/// The log decay `g` of one value head: `softplus(alpha + dt_bias) * ssm_a`, with ggml's
/// `softplus(x) = x > 20 ? x : logf(1 + expf(x))` (glibc's `expf`,
/// [`super::expf_libc`]; `logf` from `libm`, within an ulp of glibc's).
pub fn delta_net_gate(alpha: f32, dt_bias: f32, ssm_a: f32) -> f32 {
    let x = alpha + dt_bias;
    let softplus = if x > 20.0 {
        x
    } else {
        libm::logf(1.0 + super::expf_libc(x))
    };
    softplus * ssm_a
}

/// L2-normalises every row of `head_dim` values of `x` (the q or k heads of a batch) as
/// llama.cpp's `build_gdn_l2_norm` does: [`super::rms_norm_in_place`] with
/// `eps / head_dim`, then a multiply by `1 / sqrtf(head_dim)`: `x / sqrt(sum x^2 + eps)`
/// within two roundings.
///
/// # Panics
/// If `head_dim` is 0 or does not divide `x.len()`.
pub fn l2_norm_heads(x: &mut [f32], head_dim: usize, eps: f32) {
    assert!(
        head_dim > 0 && x.len().is_multiple_of(head_dim),
        "l2_norm_heads: {} values are not rows of {head_dim}",
        x.len()
    );
    let n = head_dim as f32;
    let scale = 1.0 / libm::sqrtf(n);
    for row in x.chunks_exact_mut(head_dim) {
        super::rms_norm_in_place(row, None, eps / n);
        for v in row.iter_mut() {
            *v *= scale;
        }
    }
}

/// Chunk length of llama.cpp's chunked delta rule (`CS` in `build_delta_net_chunking`).
pub const DELTA_NET_CHUNK: usize = 64;

/// The short causal depthwise convolution of one sequence (ggml's `ssm_conv`, see the
/// module docs), carrying its window.
///
/// - `x`: `n` rows of `channels` (token-major: the `qkv` projection of each token);
/// - `weight`: `channels` rows of `d_conv` (GGUF `ssm_conv1d`, `{d_conv, conv_dim}`);
/// - `state`: `channels` rows of `d_conv - 1`, the previous inputs of each channel,
///   oldest first (zeros for a new sequence); on return, the last `d_conv - 1` inputs;
/// - `out`: `n` rows of `channels`.
///
/// No activation: Qwen 3.5 applies SiLU to every output.
///
/// # Panics
/// If `d_conv` is 0 or the lengths do not fit these shapes.
pub fn ssm_conv(x: &[f32], weight: &[f32], d_conv: usize, state: &mut [f32], out: &mut [f32]) {
    assert!(d_conv > 0, "ssm_conv: d_conv is 0");
    let channels = weight.len() / d_conv;
    assert_eq!(weight.len(), channels * d_conv, "ssm_conv: weight length");
    let w = d_conv - 1;
    assert_eq!(state.len(), channels * w, "ssm_conv: state length");
    let n = x.len().checked_div(channels).unwrap_or(0);
    assert_eq!(x.len(), n * channels, "ssm_conv: x length");
    assert_eq!(out.len(), x.len(), "ssm_conv: out length");
    for c in 0..channels {
        let st = &mut state[c * w..(c + 1) * w];
        let wc = &weight[c * d_conv..(c + 1) * d_conv];
        // Entry `m` of the window `state ++ x[.., c]`.
        let at = |st: &[f32], m: usize| {
            if m < w {
                st[m]
            } else {
                x[(m - w) * channels + c]
            }
        };
        for t in 0..n {
            let mut sum = 0.0f32;
            for (i, &wi) in wc.iter().enumerate() {
                sum += at(st, t + i) * wi;
            }
            out[t * channels + c] = sum;
        }
        // Entry `m` of the new window is entry `n + m` of the old one; `n + m > m`, so
        // walking up reads every old entry before it is overwritten.
        for m in 0..w {
            st[m] = at(st, n + m);
        }
    }
}

/// One value head of [`gated_delta_net`]: head `h` of `shape`, its state `state_h`
/// (`head_dim^2`, `state_h[j * head_dim + i] = S[i][j]`) carried, its outputs written to
/// `out_h` (`n` rows of `head_dim`, token-major). `q`, `k`, `v`, `g`, `beta` are the
/// whole per-token inputs, as [`gated_delta_net`] takes them.
///
/// # Panics
/// As [`gated_delta_net`]; also if `h >= heads_v`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net_head(
    shape: &DeltaNetShape,
    h: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state_h: &mut [f32],
    out_h: &mut [f32],
) {
    let n = shape.tokens(q, k, v, g, beta);
    let d = shape.head_dim;
    assert!(h < shape.heads_v, "gated_delta_net: head {h} out of range");
    assert_eq!(state_h.len(), d * d, "gated_delta_net: head state length");
    assert_eq!(out_h.len(), n * d, "gated_delta_net: head output length");
    let hk = h % shape.heads_k;
    let scale = 1.0 / libm::sqrtf(d as f32);
    for t in 0..n {
        let qk = (t * shape.heads_k + hk) * d;
        let (qt, kt) = (&q[qk..qk + d], &k[qk..qk + d]);
        let vt = &v[(t * shape.heads_v + h) * d..][..d];
        let decay = super::expf_libc(g[t * shape.heads_v + h]);
        let b = beta[t * shape.heads_v + h];
        let ot = &mut out_h[t * d..(t + 1) * d];
        for (j, row) in state_h.chunks_exact_mut(d).enumerate() {
            for s in row.iter_mut() {
                *s *= decay;
            }
            let delta = (vt[j] - vec_dot_f32_ggml(GgmlCpuBuild::Avx2, row, kt)) * b;
            for (s, &ki) in row.iter_mut().zip(kt) {
                *s = libm::fmaf(ki, delta, *s);
            }
            ot[j] = vec_dot_f32_ggml(GgmlCpuBuild::Avx2, row, qt) * scale;
        }
    }
}

/// The gated delta rule of one sequence, token by token (the recurrent form; see the
/// module docs for the math and the float order).
///
/// - `q`, `k`: `n` rows of `heads_k * head_dim` (L2-normalised per head);
/// - `v`: `n` rows of `heads_v * head_dim`;
/// - `g` (log decay, `<= 0`), `beta`: `n` rows of `heads_v`;
/// - `state`: `heads_v` blocks of `head_dim^2` (`[h][j][i] = S_h[i][j]`), zeros for a new
///   sequence; on return, the state after the last token;
/// - `out`: `n` rows of `heads_v * head_dim`.
///
/// # Panics
/// If the shape is not [valid](DeltaNetShape::is_valid) or a length does not fit it.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    shape: &DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let n = shape.tokens(q, k, v, g, beta);
    let d = shape.head_dim;
    assert_eq!(
        state.len(),
        shape.state_len(),
        "gated_delta_net: state length"
    );
    assert_eq!(out.len(), n * shape.v_len(), "gated_delta_net: out length");
    // Token by token, so that each call writes one contiguous output row of head `h`
    // (the output is token-major) and no buffer is needed.
    let (ql, vl, hv) = (shape.qk_len(), shape.v_len(), shape.heads_v);
    for (h, sh) in state.chunks_exact_mut(d * d).enumerate() {
        for t in 0..n {
            gated_delta_net_head(
                shape,
                h,
                &q[t * ql..(t + 1) * ql],
                &k[t * ql..(t + 1) * ql],
                &v[t * vl..(t + 1) * vl],
                &g[t * hv..(t + 1) * hv],
                &beta[t * hv..(t + 1) * hv],
                sh,
                &mut out[t * vl + h * d..t * vl + (h + 1) * d],
            );
        }
    }
}

/// [`gated_delta_net`] in the chunked form (module docs), `chunk` tokens at a time
/// ([`DELTA_NET_CHUNK`] in llama.cpp), each head's chunk from the state at its start.
/// The same arguments and results as [`gated_delta_net`], within float rounding (the
/// float order is plain: sums in index order, `libm`'s `expf`).
///
/// # Panics
/// As [`gated_delta_net`]; also if `chunk` is 0.
#[cfg(feature = "alloc")]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net_chunked(
    shape: &DeltaNetShape,
    chunk: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    use alloc::vec;

    assert!(chunk > 0, "gated_delta_net_chunked: chunk is 0");
    let n = shape.tokens(q, k, v, g, beta);
    let d = shape.head_dim;
    assert_eq!(
        state.len(),
        shape.state_len(),
        "gated_delta_net: state length"
    );
    assert_eq!(out.len(), n * shape.v_len(), "gated_delta_net: out length");
    let (hv, scale) = (shape.heads_v, 1.0 / libm::sqrtf(d as f32));
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0.0f32, |s, (x, y)| s + x * y);
    // Scratch for one chunk: cumulative log decay, L, then U, W and Delta (C x d each).
    let mut gc = vec![0.0f32; chunk];
    let mut l = vec![0.0f32; chunk * chunk];
    let mut u = vec![0.0f32; chunk * d];
    let mut w = vec![0.0f32; chunk * d];
    for (h, s0) in state.chunks_exact_mut(d * d).enumerate() {
        let hk = h % shape.heads_k;
        let qr = |t: usize| &q[(t * shape.heads_k + hk) * d..][..d];
        let kr = |t: usize| &k[(t * shape.heads_k + hk) * d..][..d];
        let mut c0 = 0;
        while c0 < n {
            let c = chunk.min(n - c0);
            let mut acc = 0.0f32;
            for r in 0..c {
                acc += g[(c0 + r) * hv + h];
                gc[r] = acc;
            }
            // L[r][s] for s < r, and U, W by forward substitution through (I + L).
            for r in 0..c {
                let b = beta[(c0 + r) * hv + h];
                for s in 0..r {
                    l[r * chunk + s] = b * libm::expf(gc[r] - gc[s]) * dot(kr(c0 + r), kr(c0 + s));
                }
                let bg = b * libm::expf(gc[r]);
                let vt = &v[((c0 + r) * hv + h) * d..][..d];
                for i in 0..d {
                    let mut ur = b * vt[i];
                    let mut wr = bg * kr(c0 + r)[i];
                    for s in 0..r {
                        ur -= l[r * chunk + s] * u[s * d + i];
                        wr -= l[r * chunk + s] * w[s * d + i];
                    }
                    u[r * d + i] = ur;
                    w[r * d + i] = wr;
                }
            }
            // Delta = U - W S0, kept in U.
            for r in 0..c {
                for j in 0..d {
                    u[r * d + j] -= dot(&w[r * d..(r + 1) * d], &s0[j * d..(j + 1) * d]);
                }
            }
            // Outputs from the chunk's starting state and the deltas up to each token.
            for r in 0..c {
                let gamma = libm::expf(gc[r]);
                let o = &mut out[((c0 + r) * hv + h) * d..][..d];
                for (j, oj) in o.iter_mut().enumerate() {
                    let mut sum = gamma * dot(&s0[j * d..(j + 1) * d], qr(c0 + r));
                    for s in 0..=r {
                        let a = libm::expf(gc[r] - gc[s]) * dot(qr(c0 + r), kr(c0 + s));
                        sum += a * u[s * d + j];
                    }
                    *oj = sum * scale;
                }
            }
            // The state at the chunk's end.
            let last = gc[c - 1];
            let gamma = libm::expf(last);
            for j in 0..d {
                for i in 0..d {
                    let mut sum = gamma * s0[j * d + i];
                    for s in 0..c {
                        sum += libm::expf(last - gc[s]) * kr(c0 + s)[i] * u[s * d + j];
                    }
                    s0[j * d + i] = sum;
                }
            }
            c0 += c;
        }
    }
}

/// [`delta_net_gate`] of every row of `alpha` (`dt_bias.len()` heads per row), in place:
/// the log decay of each row and head.
///
/// # Panics
/// When `dt_bias` and `a` differ in length or `alpha` is not whole rows of it.
pub fn delta_net_gates(alpha: &mut [f32], dt_bias: &[f32], a: &[f32]) {
    let h = dt_bias.len();
    assert!(
        h > 0 && a.len() == h && alpha.len().is_multiple_of(h),
        "delta_net_gates: {} values, {h} dt biases, {} decay rates",
        alpha.len(),
        a.len()
    );
    for row in alpha.chunks_exact_mut(h) {
        for ((al, &dt), &sa) in row.iter_mut().zip(dt_bias).zip(a) {
            *al = delta_net_gate(*al, dt, sa);
        }
    }
}
