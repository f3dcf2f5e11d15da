//! MoE routing: scores, top-k selection with a selection bias, renormalised weights.

use core::fmt;

use super::act::sigmoid_ggml;
use super::attn_ggml::{soft_max_exp, soft_max_ggml, soft_max_sum, GgmlCpuBuild};

/// The most experts [`route_topk`] chooses per token. The selection buffer is a
/// fixed-capacity `heapless::Vec`, so this holds in `no_std` code without an allocator;
/// every published MoE design chooses far fewer (DeepSeek-V3 and MiMo-V2: 8).
pub const ROUTE_MAX_K: usize = 64;

/// How router logits become expert scores (GGUF `expert_gating_func`). The one
/// definition: `flint_hal` re-exports it for its routing op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gating {
    /// `s_e = sigmoid(logit_e)` per expert (GGUF value 2; Flint's own, DeepSeek-V3).
    Sigmoid,
    /// `s = softmax(logits)` over all experts (GGUF value 1).
    Softmax,
    /// The experts chosen on the raw logits, their weights the softmax over the chosen
    /// logits alone (llama.cpp's `SOFTMAX_WEIGHT`, GGUF value 3; gpt-oss).
    SoftmaxWeight,
}

/// Why [`route_topk`] refused its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// `k` exceeds [`ROUTE_MAX_K`].
    TooManyChosen {
        /// The `k` asked for.
        k: usize,
    },
    /// `k` is 0 or exceeds the number of experts.
    BadK {
        /// The `k` asked for.
        k: usize,
        /// The number of experts (logits).
        experts: usize,
    },
    /// An expert id that is not below the number of experts (or rows of a table
    /// indexed by expert).
    ExpertOutOfRange {
        /// The id.
        id: u32,
        /// The number of experts.
        experts: usize,
    },
    /// The bias, `ids_out` or `weights_out` has the wrong length.
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// The length it should have.
        expected: usize,
        /// The length it has.
        found: usize,
    },
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::TooManyChosen { k } => write!(
                f,
                "routing: {k} experts per token exceeds the supported maximum of {ROUTE_MAX_K}"
            ),
            RouteError::BadK { k, experts } => {
                write!(f, "routing: cannot choose {k} of {experts} experts")
            }
            RouteError::ExpertOutOfRange { id, experts } => {
                write!(f, "routing: expert id {id} out of {experts} experts")
            }
            RouteError::LengthMismatch {
                what,
                expected,
                found,
            } => write!(
                f,
                "routing: {what} has {found} entries, expected {expected}"
            ),
        }
    }
}

/// The smallest sum of chosen weights that renormalisation divides by, as in llama.cpp
/// (the smallest normal f16), so that all-zero scores give zero weights rather than NaN.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// Checks the arguments of a routing of `n` experts, `k` chosen, with a selection bias of
/// `bias` entries: what [`route_topk`] refuses, for devices that route elsewhere.
///
/// # Errors
/// `k` above [`ROUTE_MAX_K`], 0 or above `n`; a bias not `n` long.
pub fn check_route(n: usize, k: usize, bias: Option<usize>) -> Result<(), RouteError> {
    if k > ROUTE_MAX_K {
        return Err(RouteError::TooManyChosen { k });
    }
    if k == 0 || k > n {
        return Err(RouteError::BadK { k, experts: n });
    }
    match bias {
        Some(found) if found != n => Err(RouteError::LengthMismatch {
            what: "selection bias",
            expected: n,
            found,
        }),
        _ => Ok(()),
    }
}

/// Routes one token.
///
/// 1. Scores: `s_e = sigmoid(logits[e])` ([`Gating::Sigmoid`]), `s = softmax(logits)`
///    ([`Gating::Softmax`]) or `s_e = logits[e]` ([`Gating::SoftmaxWeight`]).
/// 2. Selection: the `k` experts with the largest `s_e + bias[e]` (bias 0 without one);
///    ties go to the lower expert index. A NaN key is never preferred to a number.
/// 3. Weights: the unbiased scores `s_e` of the chosen experts ([`Gating::SoftmaxWeight`]:
///    their softmax); with `normalize`, divided by their sum (clamped below at 2^-14, as
///    llama.cpp does); then multiplied by `scale`.
///
/// `ids_out[i]` / `weights_out[i]` (both `k` long) receive the chosen experts in order of
/// decreasing selection key.
///
/// Each step as llama.cpp's AVX-512 build computes it (the order the devices follow);
/// [`route_topk_in`] takes the build.
#[allow(clippy::too_many_arguments)]
pub fn route_topk(
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    gating: Gating,
    normalize: bool,
    scale: f32,
    ids_out: &mut [u32],
    weights_out: &mut [f32],
) -> Result<(), RouteError> {
    route_topk_in(
        GgmlCpuBuild::Avx512,
        logits,
        bias,
        k,
        gating,
        normalize,
        scale,
        ids_out,
        weights_out,
    )
}

/// [`route_topk`] as the given build of llama.cpp computes it: ggml's `sigmoid` (glibc's
/// `expf`), its `soft_max` ([`soft_max_ggml`](super::soft_max_ggml): the build's
/// `ggml_v_expf` over full vectors, glibc's `expf` after them, the sum in f64, every
/// value times the f32 reciprocal of the sum), the weights' sum for renormalising in f64
/// (`ggml_sum_rows`), then divided by it (`ggml_div`).
#[allow(clippy::too_many_arguments)]
pub fn route_topk_in(
    build: GgmlCpuBuild,
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    gating: Gating,
    normalize: bool,
    scale: f32,
    ids_out: &mut [u32],
    weights_out: &mut [f32],
) -> Result<(), RouteError> {
    let n = logits.len();
    check_route(n, k, bias.map(<[f32]>::len))?;
    if ids_out.len() != k {
        return Err(RouteError::LengthMismatch {
            what: "ids_out",
            expected: k,
            found: ids_out.len(),
        });
    }
    if weights_out.len() != k {
        return Err(RouteError::LengthMismatch {
            what: "weights_out",
            expected: k,
            found: weights_out.len(),
        });
    }

    // Softmax needs the maximum and the normaliser over all experts; scores are then
    // computed on demand so that no buffer of E scores is needed. As ggml's `soft_max`
    // computes a row in the given build ([`soft_max_exp`], [`soft_max_sum`]), then every
    // value times the f32 reciprocal of the sum.
    let expf_at = |e: usize, m: f32| soft_max_exp(build, n, e, logits[e] - m);
    let (smax, inv) = match gating {
        Gating::Sigmoid | Gating::SoftmaxWeight => (0.0, 1.0),
        Gating::Softmax => {
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            (m, (1.0 / soft_max_sum(build, n, |e| expf_at(e, m))) as f32)
        }
    };
    let score = |e: usize| -> f32 {
        match gating {
            Gating::Sigmoid => sigmoid_ggml(logits[e]),
            Gating::Softmax => expf_at(e, smax) * inv,
            Gating::SoftmaxWeight => logits[e],
        }
    };

    // Kept sorted best first. `beats` is strict, and experts arrive in index order, so an
    // equal key never displaces an earlier (lower) index.
    let beats = |a: f32, b: f32| a > b || (b.is_nan() && !a.is_nan());
    let mut top: heapless::Vec<(f32, u32), ROUTE_MAX_K> = heapless::Vec::new();
    for e in 0..n {
        let key = score(e) + bias.map_or(0.0, |b| b[e]);
        let full = top.len() == k;
        if full && !top.last().is_some_and(|&(worst, _)| beats(key, worst)) {
            continue;
        }
        if full {
            top.pop();
        }
        let at = top
            .iter()
            .position(|&(kk, _)| beats(key, kk))
            .unwrap_or(top.len());
        // Capacity: len < k <= ROUTE_MAX_K here, so the insert cannot fail.
        let _ = top.insert(at, (key, e as u32));
    }

    for (i, &(_, e)) in top.iter().enumerate() {
        ids_out[i] = e;
        weights_out[i] = score(e as usize);
    }
    if gating == Gating::SoftmaxWeight {
        let w = &mut weights_out[..top.len()];
        let m = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = (1.0 / soft_max_ggml(build, w, m)) as f32;
        for v in w.iter_mut() {
            *v *= inv;
        }
    }
    if normalize {
        let sum = weights_out[..top.len()]
            .iter()
            .fold(0.0f64, |a, &w| a + f64::from(w)) as f32;
        let d = sum.max(MIN_WEIGHT_SUM);
        for w in weights_out.iter_mut() {
            *w /= d;
        }
    }
    for w in weights_out.iter_mut() {
        *w *= scale;
    }
    Ok(())
}

/// Gemma 4's per-expert output scale on routed weights: `weights[i] *= scale[ids[i]]`
/// (`ids.len() == weights.len()`; lengths are the caller's to match).
///
/// # Errors
/// An id not below `scale.len()`; the weights before it are scaled.
pub fn scale_by_expert(weights: &mut [f32], ids: &[u32], scale: &[f32]) -> Result<(), RouteError> {
    for (w, &id) in weights.iter_mut().zip(ids) {
        let s = scale.get(id as usize).ok_or(RouteError::ExpertOutOfRange {
            id,
            experts: scale.len(),
        })?;
        *w *= *s;
    }
    Ok(())
}

/// The rows of the table of an [`add_id`] of `x_len` values by `n_ids` ids in rows of
/// `dim` (0 when `dim` is 0).
///
/// # Panics
/// When `x` is not `n_ids` rows of `dim`, or the table not whole rows of it.
pub fn add_id_rows(x_len: usize, table_len: usize, n_ids: usize, dim: usize) -> usize {
    assert!(
        x_len == n_ids * dim && (dim == 0 || table_len.is_multiple_of(dim)),
        "add_id: x is {x_len} values for {n_ids} ids of {dim}, table {table_len} values"
    );
    table_len.checked_div(dim).unwrap_or(0)
}

/// ggml's `add_id`: `x[i] += table[ids[i]]` for rows of `dim` values (gpt-oss's
/// per-expert biases on routed rows). `x` has `ids.len()` rows, `table` one row per
/// expert.
///
/// # Errors
/// An id beyond `table`'s rows; the rows before it are added.
///
/// # Panics
/// When `x` is not `ids.len()` rows of `dim`, or `table` not whole rows of it.
pub fn add_id(x: &mut [f32], table: &[f32], ids: &[u32], dim: usize) -> Result<(), RouteError> {
    let rows = add_id_rows(x.len(), table.len(), ids.len(), dim);
    if dim == 0 {
        return Ok(());
    }
    for (row, &id) in x.chunks_exact_mut(dim).zip(ids) {
        let e = id as usize;
        if e >= rows {
            return Err(RouteError::ExpertOutOfRange { id, experts: rows });
        }
        for (v, &b) in row.iter_mut().zip(&table[e * dim..(e + 1) * dim]) {
            *v += b;
        }
    }
    Ok(())
}

/// MoE combine: `acc[i / f] += weights[i] * x[i]` for rows of `dim` values, in order of
/// `i`, where `acc` holds `r` rows and `x` holds `r * f` (each token's `f` routed rows one
/// after another).
///
/// # Panics
/// When the lengths do not fit that shape.
pub fn scatter_add_weighted(acc: &mut [f32], x: &[f32], weights: &[f32], dim: usize) {
    assert!(
        dim > 0 && acc.len().is_multiple_of(dim) && x.len() == weights.len() * dim,
        "scatter_add_weighted: acc {} values, x {} values, {} weights, rows of {dim}",
        acc.len(),
        x.len(),
        weights.len()
    );
    let rows = acc.len() / dim;
    if rows == 0 {
        assert!(
            weights.is_empty(),
            "scatter_add_weighted: rows for no token"
        );
        return;
    }
    assert!(
        weights.len().is_multiple_of(rows),
        "scatter_add_weighted: {} routed rows for {rows} tokens",
        weights.len()
    );
    let f = weights.len() / rows;
    for (i, (&wt, xr)) in weights.iter().zip(x.chunks_exact(dim)).enumerate() {
        let r = i / f;
        for (a, &v) in acc[r * dim..(r + 1) * dim].iter_mut().zip(xr) {
            *a += wt * v;
        }
    }
}
