//! Softmax attention with per-head sinks.
//!
//! For one query head with scores `s_j` over the visible keys and a sink logit `sink`
//! (`-inf`, or `None`, for no sink):
//!
//! ```text
//! m   = max(max_j s_j, sink)
//! o   = sum_j exp(s_j - m) v_j / ( exp(sink - m) + sum_j exp(s_j - m) )
//! ```
//!
//! The sink takes part in the denominator only. [`attend_two_pass`] computes this
//! literally (max first, then sums); [`OnlineSoftmax`] / [`attend_online`] compute it in
//! one pass with a running maximum, the form a paged or tiled kernel uses. In the online
//! form the sink term is seeded as `exp(sink - m0) = 1` with the running maximum
//! starting at `m0 = sink`, and it is rescaled with everything else each time the
//! maximum grows, so that it ends as `exp(sink - m_final)`. Seeding it as a constant
//! `exp(0)` that is never rescaled (or adding `1` at the end) is the defect the tests
//! guard against: it is right only when the sink is the largest logit.

/// The running state of an online (one-pass) softmax over weighted value rows, with an
/// optional sink logit. The weighted sum itself lives in a caller-provided accumulator
/// (`acc`, of the value width), so that this works without an allocator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnlineSoftmax {
    /// The running maximum of every logit seen so far, the sink included.
    m: f32,
    /// The running denominator, relative to `m`: `exp(sink - m) + sum_j exp(s_j - m)`.
    l: f32,
}

impl OnlineSoftmax {
    /// A fresh state. With a sink, the maximum starts at the sink and the denominator at
    /// `exp(sink - sink) = 1`; both are rescaled as scores arrive. `acc` must start zeroed.
    pub fn new(sink: Option<f32>) -> Self {
        match sink {
            Some(s) if s != f32::NEG_INFINITY => OnlineSoftmax { m: s, l: 1.0 },
            _ => OnlineSoftmax {
                m: f32::NEG_INFINITY,
                l: 0.0,
            },
        }
    }

    /// Adds one key: its score `s` and its value row `v`, accumulated into `acc`.
    /// A score of `-inf` (a masked key) contributes nothing.
    ///
    /// # Panics
    /// If `v` and `acc` differ in length.
    pub fn push(&mut self, s: f32, v: &[f32], acc: &mut [f32]) {
        assert_eq!(
            v.len(),
            acc.len(),
            "OnlineSoftmax: value and accumulator widths differ"
        );
        if s == f32::NEG_INFINITY {
            return;
        }
        if s > self.m {
            // The maximum grows: everything accumulated so far, the sink term included,
            // was relative to the old maximum and is scaled down to the new one.
            let r = libm::expf(self.m - s);
            self.l *= r;
            for a in acc.iter_mut() {
                *a *= r;
            }
            self.m = s;
        }
        let p = libm::expf(s - self.m);
        self.l += p;
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += p * x;
        }
    }

    /// Folds another partial state (with its accumulator) into this one, as a split-K
    /// (flash-decoding) kernel combines the partial softmaxes of key ranges: both sides
    /// are rescaled to the larger maximum, then added. The sink must be counted once:
    /// seed one partial state with it and the others with `new(None)`.
    ///
    /// # Panics
    /// If the two accumulators differ in length.
    pub fn merge(&mut self, acc: &mut [f32], other: &OnlineSoftmax, other_acc: &[f32]) {
        assert_eq!(
            acc.len(),
            other_acc.len(),
            "OnlineSoftmax::merge: accumulator widths differ"
        );
        if other.m == f32::NEG_INFINITY {
            return;
        }
        let m = self.m.max(other.m);
        // exp(-inf - m) = 0 handles an empty self; m is finite here.
        let a = libm::expf(self.m - m);
        let b = libm::expf(other.m - m);
        self.l = self.l * a + other.l * b;
        for (x, &y) in acc.iter_mut().zip(other_acc) {
            *x = *x * a + y * b;
        }
        self.m = m;
    }

    /// The running maximum (`-inf` before any key and without a sink).
    pub fn max(&self) -> f32 {
        self.m
    }

    /// The running denominator, relative to [`max`](Self::max).
    pub fn denominator(&self) -> f32 {
        self.l
    }

    /// Turns the accumulator into the output by dividing by the denominator. With no key
    /// and no sink the denominator is 0 and the output is all zeros.
    pub fn finish(&self, acc: &mut [f32]) {
        if self.l > 0.0 {
            let inv = 1.0 / self.l;
            for a in acc.iter_mut() {
                *a *= inv;
            }
        } else {
            acc.fill(0.0);
        }
    }
}

fn check_shapes(scores: &[f32], values: &[f32], dv: usize, out: &[f32]) {
    assert_eq!(out.len(), dv, "attend: out length is not dv");
    assert_eq!(
        values.len(),
        scores.len() * dv,
        "attend: values is not one row of dv per score"
    );
}

/// The two-pass reference: `out = sum_j exp(s_j - m) v_j / (exp(sink - m) + sum_j
/// exp(s_j - m))` with `m = max(max_j s_j, sink)`; `values` holds one row of `dv` per
/// score. With no visible key and no sink, `out` is zeros.
///
/// # Panics
/// If `values.len() != scores.len() * dv` or `out.len() != dv`.
pub fn attend_two_pass(
    scores: &[f32],
    values: &[f32],
    dv: usize,
    sink: Option<f32>,
    out: &mut [f32],
) {
    check_shapes(scores, values, dv, out);
    out.fill(0.0);
    let sink = sink.unwrap_or(f32::NEG_INFINITY);
    let m = scores.iter().copied().fold(sink, f32::max);
    if m == f32::NEG_INFINITY {
        return;
    }
    let mut denom = libm::expf(sink - m);
    for (j, &s) in scores.iter().enumerate() {
        let p = libm::expf(s - m);
        denom += p;
        for (o, &x) in out.iter_mut().zip(&values[j * dv..(j + 1) * dv]) {
            *o += p * x;
        }
    }
    let inv = 1.0 / denom;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// The same result as [`attend_two_pass`], computed in one pass with [`OnlineSoftmax`].
///
/// # Panics
/// As [`attend_two_pass`].
pub fn attend_online(
    scores: &[f32],
    values: &[f32],
    dv: usize,
    sink: Option<f32>,
    out: &mut [f32],
) {
    check_shapes(scores, values, dv, out);
    out.fill(0.0);
    let mut st = OnlineSoftmax::new(sink);
    for (j, &s) in scores.iter().enumerate() {
        st.push(s, &values[j * dv..(j + 1) * dv], out);
    }
    st.finish(out);
}

/// The first position a query at `pos` sees: `pos + 1 - window` under a sliding window
/// of `window` positions (the query and the `window - 1` before it; 0 while the window
/// still reaches back past the start), 0 without one. Keys `window_start(pos, w)..=pos`
/// are visible. Every forward, kernel and KV-cache manager asks this one function.
#[inline]
pub fn window_start(pos: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    }
}

/// Shape and options of [`attention_ref`].
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams<'a> {
    /// Query heads `H`.
    pub n_head: usize,
    /// Key/value heads `Hkv`; `H % Hkv == 0`, query head `h` reads kv head
    /// `h / (H / Hkv)`.
    pub n_head_kv: usize,
    /// Head size of Q and K.
    pub dk: usize,
    /// Head size of V.
    pub dv: usize,
    /// Multiplies `q . k`; Flint uses `1 / sqrt(dk)`.
    pub scale: f32,
    /// One sink logit per query head, or none.
    pub sinks: Option<&'a [f32]>,
    /// Sliding window `W`: a query at position `p` sees keys `j` with `p - W < j <= p`.
    /// `None` for full (causal) attention. `Some(0)` sees nothing.
    pub window: Option<usize>,
}

/// Reference attention for one sequence over contiguous K/V: the oracle for the paged
/// kernels.
///
/// - `q`: `q_pos.len()` tokens, each `n_head * dk` values (head-major within a token).
/// - `q_pos[t]`: the position of query token `t`.
/// - `k`: one row of `n_head_kv * dk` per position `0, 1, ..., n_kv - 1`.
/// - `v`: one row of `n_head_kv * dv` per position, the same `n_kv` rows.
/// - `out`: `q_pos.len()` tokens, each `n_head * dv` values.
///
/// A query at `p` attends to the positions `j < n_kv` with `j <= p` (causal) and, with a
/// window `W`, `j > p - W`. Scores are `scale * (q_h . k_{g,j})`, then the sink softmax of
/// [`attend_two_pass`]. Computed in two passes over the keys (max, then sums), so it
/// needs no scratch memory.
///
/// # Panics
/// If a slice length disagrees with the shape, `n_head_kv` is 0 or does not divide
/// `n_head`, or `sinks` is not `n_head` long.
pub fn attention_ref(
    p: &AttentionParams<'_>,
    q: &[f32],
    q_pos: &[u32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) {
    let (h_n, hkv, dk, dv) = (p.n_head, p.n_head_kv, p.dk, p.dv);
    assert!(
        hkv > 0 && h_n.is_multiple_of(hkv),
        "attention_ref: n_head {h_n} is not a multiple of n_head_kv {hkv}"
    );
    assert!(dk > 0 && dv > 0, "attention_ref: zero head size");
    let n_q = q_pos.len();
    assert_eq!(
        q.len(),
        n_q * h_n * dk,
        "attention_ref: q is not n_q * n_head * dk"
    );
    assert_eq!(
        out.len(),
        n_q * h_n * dv,
        "attention_ref: out is not n_q * n_head * dv"
    );
    assert_eq!(
        k.len() % (hkv * dk),
        0,
        "attention_ref: k is not whole rows"
    );
    let n_kv = k.len() / (hkv * dk);
    assert_eq!(
        v.len(),
        n_kv * hkv * dv,
        "attention_ref: v rows do not match k rows"
    );
    if let Some(s) = p.sinks {
        assert_eq!(s.len(), h_n, "attention_ref: sinks is not n_head long");
    }
    let group = h_n / hkv;

    for (t, &pos) in q_pos.iter().enumerate() {
        let pos = pos as usize;
        // Visible keys: [lo, hi).
        let hi = (pos + 1).min(n_kv);
        let lo = window_start(pos, p.window);
        for h in 0..h_n {
            let g = h / group;
            let qh = &q[(t * h_n + h) * dk..(t * h_n + h + 1) * dk];
            let oh = &mut out[(t * h_n + h) * dv..(t * h_n + h + 1) * dv];
            oh.fill(0.0);
            let score = |j: usize| -> f32 {
                let kj = &k[(j * hkv + g) * dk..(j * hkv + g + 1) * dk];
                let mut acc = 0.0f32;
                for i in 0..dk {
                    acc += qh[i] * kj[i];
                }
                acc * p.scale
            };
            let sink = p.sinks.map_or(f32::NEG_INFINITY, |s| s[h]);
            let mut m = sink;
            for j in lo..hi {
                m = m.max(score(j));
            }
            if m == f32::NEG_INFINITY {
                continue;
            }
            let mut denom = libm::expf(sink - m);
            for j in lo..hi {
                let e = libm::expf(score(j) - m);
                denom += e;
                let vj = &v[(j * hkv + g) * dv..(j * hkv + g + 1) * dv];
                for (o, &x) in oh.iter_mut().zip(vj) {
                    *o += e * x;
                }
            }
            let inv = 1.0 / denom;
            for o in oh.iter_mut() {
                *o *= inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::window_start;

    #[test]
    fn window_start_keeps_exactly_the_window() {
        // A window of 8 holds the query and the 7 positions before it.
        assert_eq!(window_start(0, Some(8)), 0);
        assert_eq!(
            window_start(7, Some(8)),
            0,
            "positions 0..=7 are 8: all visible"
        );
        assert_eq!(window_start(8, Some(8)), 1, "position 8 no longer sees 0");
        assert_eq!(window_start(100, Some(8)), 93);
        // A window of 1 sees only the query itself.
        assert_eq!(window_start(5, Some(1)), 5);
        // Without a window everything is visible.
        assert_eq!(window_start(100, None), 0);
    }
}
