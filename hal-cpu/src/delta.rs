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

use crate::simd::SimdLevel;

/// `out = silu(ssm_conv(x))`, the window carried in `state` (see `Device::ssm_conv_silu`),
/// with the bits of `math::ssm_conv` then `math::silu`. The window (the state's rows,
/// then `x`'s) and the weights are laid out tap-major first, so each output row is
/// `d_conv` passes of multiply-then-add over whole rows (each output summed in the
/// reference's order from 0.0: no fused multiply-add, which would round once less),
/// then SiLU over the row (ggml's AVX-512 `exp` on 16 or 8 lanes at a time at the AVX-512
/// and AVX2 levels, else the scalar reference). Prompt rows are spread over the pool; the rows only read
/// the window.
pub(crate) fn ssm_conv_silu(
    pool: &rayon::ThreadPool,
    level: SimdLevel,
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
    if channels == 0 {
        return;
    }
    if n == 1 {
        // A decode step: each channel's window read where it lies (no transposes), the
        // same sums; the window then moves up by one, element by element (a `memmove`
        // call per channel of a few floats cost more than the channel's sums).
        for (c, ((o, wc), &xc)) in out
            .iter_mut()
            .zip(weight.chunks_exact(d_conv))
            .zip(x)
            .enumerate()
        {
            let st = &mut state[c * w..(c + 1) * w];
            let mut sum = 0.0f32;
            for (&s, &wi) in st.iter().zip(wc) {
                sum += s * wi;
            }
            sum += xc * wc[w];
            *o = sum;
            if let Some(last) = st.len().checked_sub(1) {
                for i in 0..last {
                    st[i] = st[i + 1];
                }
                st[last] = xc;
            }
        }
        silu_row(level, out);
        return;
    }
    // Tap-major weights `wt[i][c]` and the state's window rows `sw[m][c]`.
    let mut wt = vec![0f32; d_conv * channels];
    let mut sw = vec![0f32; w * channels];
    for c in 0..channels {
        for i in 0..d_conv {
            wt[i * channels + c] = weight[c * d_conv + i];
        }
        for m in 0..w {
            sw[m * channels + c] = state[c * w + m];
        }
    }
    // Row `m` of the window `state ++ x`.
    let row = |m: usize| {
        if m < w {
            &sw[m * channels..(m + 1) * channels]
        } else {
            &x[(m - w) * channels..(m - w + 1) * channels]
        }
    };
    let conv_rows = |t0: usize, o: &mut [f32]| {
        for (dt, orow) in o.chunks_exact_mut(channels).enumerate() {
            orow.fill(0.0);
            for i in 0..d_conv {
                let (src, wi) = (row(t0 + dt + i), &wt[i * channels..(i + 1) * channels]);
                for ((o, &a), &b) in orow.iter_mut().zip(src).zip(wi) {
                    *o += a * b;
                }
            }
            silu_row(level, orow);
        }
    };
    const ROWS_PER_TASK: usize = 8;
    if n > ROWS_PER_TASK {
        pool.install(|| {
            out.par_chunks_mut(ROWS_PER_TASK * channels)
                .enumerate()
                .for_each(|(b, o)| conv_rows(b * ROWS_PER_TASK, o));
        });
    } else {
        conv_rows(0, out);
    }
    // The new window: entry `m` is entry `n + m` of the old one.
    for m in 0..w {
        let src = row(n + m);
        for (c, &v) in src.iter().enumerate() {
            state[c * w + m] = v;
        }
    }
}

/// `v = silu(v)` element-wise, each element `math::silu`'s bits.
fn silu_row(level: SimdLevel, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            // SAFETY: the level was checked against the CPU at device open.
            unsafe { crate::kernels::elementwise::avx512::silu_in_place(v) };
            return;
        }
        if level == SimdLevel::Avx2 {
            // SAFETY: the level was checked against the CPU at device open.
            unsafe { crate::kernels::elementwise::avx2::silu_in_place(v) };
            return;
        }
    }
    let _ = level;
    for x in v {
        *x = math::silu(*x);
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

    /// `flint_core::dot::ggml_x86::vec_dot_f32_ggml` (AVX2 build) with its four 8-lane accumulators in registers.
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
