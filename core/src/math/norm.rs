//! RMSNorm: `y = x / sqrt(mean(x*x) + eps) * w`.

/// The scale `1 / sqrt(mean(x*x) + eps)` of one row.
///
/// The sum of squares is accumulated in `f64`, and the mean is rounded to `f32` before
/// `eps` is added, the way ggml's CPU `rms_norm` does it, so that long rows keep their
/// precision and the result agrees with llama.cpp.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    rms_scale_of_sum(sum, x.len(), eps)
}

/// The scale `1 / sqrt(mean + eps)` of a row of `n` values whose squares (each rounded
/// to `f32`, then widened) add up to `sum` in `f64`: the mean rounded to `f32` before
/// `eps` is added, as ggml does. Kernels that form the sums of several rows at once
/// finish each row with this.
pub fn rms_scale_of_sum(sum: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum / n as f64) as f32;
    1.0 / libm::sqrtf(mean + eps)
}

/// RMSNorm of one row: `out[i] = x[i] * scale * weight[i]` with
/// `scale = 1 / sqrt(mean(x*x) + eps)`; without a weight, `out[i] = x[i] * scale`.
///
/// An empty row is left empty (nothing to normalise).
///
/// # Panics
/// If `out` (or `weight`) is not as long as `x`: a caller bug, not a data error.
pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    assert_eq!(out.len(), x.len(), "rms_norm: out and x lengths differ");
    if x.is_empty() {
        return;
    }
    let scale = rms_scale(x, eps);
    match weight {
        Some(w) => {
            assert_eq!(w.len(), x.len(), "rms_norm: weight and x lengths differ");
            for i in 0..x.len() {
                // (x * scale) * w, in that order, as ggml's fused rms_norm+mul does.
                out[i] = x[i] * scale * w[i];
            }
        }
        None => {
            for i in 0..x.len() {
                out[i] = x[i] * scale;
            }
        }
    }
}

/// [`rms_norm`] in place.
///
/// # Panics
/// If `weight` is given and is not as long as `x`.
pub fn rms_norm_in_place(x: &mut [f32], weight: Option<&[f32]>, eps: f32) {
    if x.is_empty() {
        return;
    }
    let scale = rms_scale(x, eps);
    match weight {
        Some(w) => {
            assert_eq!(w.len(), x.len(), "rms_norm: weight and x lengths differ");
            for i in 0..x.len() {
                x[i] = x[i] * scale * w[i];
            }
        }
        None => {
            for v in x.iter_mut() {
                *v *= scale;
            }
        }
    }
}

/// [`rms_norm`] applied to each row of `dim` elements of `x` (for example every token of
/// a batch, or every head of a token for the per-head Q/K norm), with the same `weight`
/// (of length `dim`) for every row.
///
/// # Panics
/// If `dim` is 0, `x.len()` is not a multiple of `dim`, or `out`/`weight` lengths are wrong.
pub fn rms_norm_rows(x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
    assert!(dim > 0, "rms_norm_rows: dim is 0");
    assert_eq!(
        x.len() % dim,
        0,
        "rms_norm_rows: x is not whole rows of dim"
    );
    assert_eq!(
        out.len(),
        x.len(),
        "rms_norm_rows: out and x lengths differ"
    );
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        rms_norm(xr, weight, eps, or);
    }
}
