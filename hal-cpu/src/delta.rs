//! Qwen 3.5's Gated DeltaNet ops on the CPU: the short causal convolution with SiLU and
//! the gated delta rule, through `flint_core::math`'s references (ggml's float order;
//! `flint_core::math::ssm_conv` and `gated_delta_net` document math and layouts).
//!
//! The delta rule runs token by token (the recurrent form) for prompts and decode steps
//! alike, as llama.cpp's CPU backend does (its fused `gated_delta_net` op): one head's
//! state (`head_dim^2` floats, 64 KiB at 128) stays in cache over the tokens, and the
//! value heads of a call are spread over the pool. From AVX2 up, each head runs
//! [`avx2::head`], ggml's AVX2 loops with the same bits as the core's scalar reference
//! (whose fused multiply-adds are software calls); below, the reference itself.

use flint_core::math::{self, DeltaNetShape};
use flint_hal::HalError;
use rayon::prelude::*;

/// `out = silu(ssm_conv(x))`, the window carried in `state` (see `Device::ssm_conv_silu`).
/// The convolution is `d_conv` multiply-adds per output: one thread does it, token by
/// token across the channels (rows of `x` and `out` are read and written whole, where
/// `math::ssm_conv` walks each channel down the tokens), each output summed in the
/// reference's order, so the bits are `math::ssm_conv`'s.
pub(crate) fn ssm_conv_silu(
    x: &[f32],
    weight: &[f32],
    d_conv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert!(d_conv > 0, "ssm_conv: d_conv is 0");
    let channels = weight.len() / d_conv;
    assert_eq!(weight.len(), channels * d_conv, "ssm_conv: weight length");
    let w = d_conv - 1;
    assert_eq!(state.len(), channels * w, "ssm_conv: state length");
    let n = x.len().checked_div(channels).unwrap_or(0);
    assert_eq!(x.len(), n * channels, "ssm_conv: x length");
    assert_eq!(out.len(), x.len(), "ssm_conv: out length");
    // Entry `m` of channel `c`'s window `state ++ x[.., c]`.
    let at = |state: &[f32], c: usize, m: usize| {
        if m < w {
            state[c * w + m]
        } else {
            x[(m - w) * channels + c]
        }
    };
    for (t, row) in out.chunks_exact_mut(channels.max(1)).enumerate() {
        for (c, (o, wc)) in row.iter_mut().zip(weight.chunks_exact(d_conv)).enumerate() {
            let mut sum = 0.0f32;
            for (i, &wi) in wc.iter().enumerate() {
                sum += at(state, c, t + i) * wi;
            }
            *o = math::silu(sum);
        }
    }
    // Entry `m` of the new window is entry `n + m` of the old one; `n + m > m`, so
    // walking up reads every old entry before it is overwritten.
    for c in 0..channels {
        for m in 0..w {
            state[c * w + m] = at(state, c, n + m);
        }
    }
}

/// The gated delta rule of one sequence (see `Device::gated_delta_net`), the value heads
/// in parallel on `pool`; each head's result equals `math::gated_delta_net_head` bit for
/// bit. `avx2`: the CPU has AVX2 and FMA (checked at device open).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_delta_net(
    pool: &rayon::ThreadPool,
    avx2: bool,
    shape: &DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), HalError> {
    if !shape.is_valid() {
        return Err(HalError::invalid(format!(
            "gated_delta_net: {} value heads on {} key heads of size {} (value heads must be \
             a non-zero multiple of key heads, sizes non-zero)",
            shape.heads_v, shape.heads_k, shape.head_dim
        )));
    }
    let (d, vl) = (shape.head_dim, shape.v_len());
    let n = q.len() / shape.qk_len();
    assert_eq!(
        state.len(),
        shape.state_len(),
        "gated_delta_net: state length"
    );
    assert_eq!(out.len(), n * vl, "gated_delta_net: out length");
    let head = |h: usize, sh: &mut [f32], oh: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the caller checked AVX2 and FMA against the CPU.
            unsafe { avx2::head(shape, h, q, k, v, g, beta, sh, oh) };
            return;
        }
        let _ = avx2;
        math::gated_delta_net_head(shape, h, q, k, v, g, beta, sh, oh);
    };
    if n == 1 {
        // One token: each head's output row is contiguous; no scatter.
        pool.install(|| {
            state
                .par_chunks_mut(d * d)
                .zip(out.par_chunks_mut(d))
                .enumerate()
                .for_each(|(h, (sh, oh))| head(h, sh, oh));
        });
        return Ok(());
    }
    let heads: Vec<Vec<f32>> = pool.install(|| {
        state
            .par_chunks_mut(d * d)
            .enumerate()
            .map(|(h, sh)| {
                let mut oh = vec![0.0f32; n * d];
                head(h, sh, &mut oh);
                oh
            })
            .collect()
    });
    for (h, oh) in heads.iter().enumerate() {
        for (t, row) in oh.chunks_exact(d).enumerate() {
            out[t * vl + h * d..t * vl + (h + 1) * d].copy_from_slice(row);
        }
    }
    Ok(())
}

/// ggml's AVX2 loops of the fused `gated_delta_net` op (`ggml_vec_scale_f32`,
/// `ggml_vec_dot_f32`, `ggml_vec_mad_f32`), one head at a time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use flint_core::math::{self, DeltaNetShape};

    /// `math::vec_dot_f32_ggml_avx2` with its four 8-lane accumulators in registers.
    #[target_feature(enable = "avx2,fma")]
    fn dot(x: &[f32], y: &[f32]) -> f32 {
        let np = x.len() & !31;
        let mut acc = [_mm256_setzero_ps(); 4];
        for (xs, ys) in x[..np].chunks_exact(32).zip(y[..np].chunks_exact(32)) {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `xs` and `ys` hold 32 floats; lanes 8j..8j+8 are in bounds.
                let (xv, yv) = unsafe {
                    (
                        _mm256_loadu_ps(xs.as_ptr().add(8 * j)),
                        _mm256_loadu_ps(ys.as_ptr().add(8 * j)),
                    )
                };
                *a = _mm256_fmadd_ps(xv, yv, *a);
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
        for i in np..x.len() {
            sum += x[i] * y[i];
        }
        sum
    }

    /// `math::gated_delta_net_head`, the same arguments and bits.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn head(
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
        let d = shape.head_dim;
        let n = q.len() / shape.qk_len();
        assert!(h < shape.heads_v, "gated_delta_net: head {h} out of range");
        assert_eq!(state_h.len(), d * d, "gated_delta_net: head state length");
        assert_eq!(out_h.len(), n * d, "gated_delta_net: head output length");
        assert!(
            k.len() == q.len()
                && v.len() == n * shape.v_len()
                && g.len() == n * shape.heads_v
                && beta.len() == g.len(),
            "gated_delta_net: input lengths"
        );
        let (hk, np) = (h % shape.heads_k, d & !7);
        let scale = 1.0 / (d as f32).sqrt();
        for t in 0..n {
            let qk = (t * shape.heads_k + hk) * d;
            let (qt, kt) = (&q[qk..qk + d], &k[qk..qk + d]);
            let vt = &v[(t * shape.heads_v + h) * d..][..d];
            let decay = math::expf_libc(g[t * shape.heads_v + h]);
            let b = beta[t * shape.heads_v + h];
            let ot = &mut out_h[t * d..(t + 1) * d];
            let dv = _mm256_set1_ps(decay);
            for (j, row) in state_h.chunks_exact_mut(d).enumerate() {
                for c in (0..np).step_by(8) {
                    // SAFETY: `c + 8 <= np <= d == row.len()`.
                    unsafe {
                        let p = row.as_mut_ptr().add(c);
                        _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), dv));
                    }
                }
                for s in &mut row[np..] {
                    *s *= decay;
                }
                let delta = (vt[j] - dot(row, kt)) * b;
                let del = _mm256_set1_ps(delta);
                for c in (0..np).step_by(8) {
                    // SAFETY: `c + 8 <= np <= d`, the length of `row` and `kt`.
                    unsafe {
                        let p = row.as_mut_ptr().add(c);
                        let kv = _mm256_loadu_ps(kt.as_ptr().add(c));
                        _mm256_storeu_ps(p, _mm256_fmadd_ps(kv, del, _mm256_loadu_ps(p)));
                    }
                }
                for (s, &ki) in row[np..].iter_mut().zip(&kt[np..]) {
                    *s = ki.mul_add(delta, *s);
                }
                ot[j] = dot(row, qt) * scale;
            }
        }
    }
}
