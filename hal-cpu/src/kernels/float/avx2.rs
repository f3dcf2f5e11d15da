//! F32, F16 and BF16 weights · f32 activations with AVX2 and FMA. F32 in the orders of
//! llama.cpp's F32 matmul on an AVX-512 build: tinyBLAS's for two or more activation
//! rows (sixteen lanes of FMA chains, `flint_core::dot::ggml_x86::vec_dot_f32_tinyblas`,
//! here as two 8-lane halves; [`dot_float`]) and `ggml_vec_dot_f32`'s for one row and
//! expert matmuls (four accumulators of sixteen lanes,
//! `flint_core::dot::ggml_x86::vec_dot_f32_ggml`; [`dot_f32_vec`]); F16 and BF16 with products in f32 and sums in f64 as the core reference. The caller
//! must have checked AVX2, FMA and F16C at device open.

use std::arch::x86_64::*;

/// Loads 8 weights at element `j` of a float row (kind: 0 = F32, 1 = F16, 2 = BF16).
#[inline(always)]
fn load_w8<const KIND: u8>(w: &[u8], j: usize) -> __m256 {
    let es = if KIND == 0 { 4 } else { 2 };
    assert!(w.len() >= (j + 8) * es);
    let p = w[j * es..].as_ptr();
    // SAFETY: bytes j*es .. (j+8)*es lie inside `w` (asserted above); unaligned loads;
    // the enclosing kernel enables AVX2 and F16C.
    unsafe {
        match KIND {
            0 => _mm256_loadu_ps(p as *const f32),
            1 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p as *const __m128i),
            ))),
        }
    }
}

/// Float weights (F32, F16 or BF16 bytes, unaligned) x f32 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_float<const R: usize>(
    kind: super::FloatKind,
    w: &[u8],
    y: &[&[f32]; R],
    out: &mut [f32; R],
) {
    match kind {
        super::FloatKind::F32 => dot_f32_tinyblas::<R>(w, y, out),
        super::FloatKind::F16 => dot_float_k::<1, R>(w, y, out),
        super::FloatKind::BF16 => dot_float_k::<2, R>(w, y, out),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_float_k<const KIND: u8, const R: usize>(w: &[u8], y: &[&[f32]; R], out: &mut [f32; R]) {
    let n = y[0].len();
    for r in 0..R {
        assert!(y[r].len() >= n);
    }
    // Each product in f32, the sum in f64, as the core reference (`vec_dot_f32`) does:
    // the f64 partial sums differ from its single running sum only far below an f32 ulp,
    // so the rounded result matches it (these weights are small: routers, norms).
    let mut a0 = [_mm256_setzero_pd(); R];
    let mut a1 = [_mm256_setzero_pd(); R];
    let mut j = 0;
    while j + 8 <= n {
        let w0 = load_w8::<KIND>(w, j);
        for r in 0..R {
            // SAFETY: y[r] has at least n >= j + 8 values (asserted above).
            let y0 = unsafe { _mm256_loadu_ps(y[r].as_ptr().add(j)) };
            let p = _mm256_mul_ps(w0, y0);
            a0[r] = _mm256_add_pd(a0[r], _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
            a1[r] = _mm256_add_pd(a1[r], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(p)));
        }
        j += 8;
    }
    let kind = match KIND {
        0 => super::FloatKind::F32,
        1 => super::FloatKind::F16,
        _ => super::FloatKind::BF16,
    };
    for r in 0..R {
        let mut l = [0f64; 4];
        // SAFETY: `l` is 4 writable f64; storeu is unaligned.
        unsafe { _mm256_storeu_pd(l.as_mut_ptr(), _mm256_add_pd(a0[r], a1[r])) };
        let mut s = (l[0] + l[2]) + (l[1] + l[3]);
        for t in j..n {
            s += (kind.get(w, t) * y[r][t]) as f64;
        }
        out[r] = s as f32;
    }
}

/// F32 weights x f32 activations in tinyBLAS's AVX-512 order: lane `l` of sixteen is the
/// FMA chain over the elements `l (mod 16)`, lanes 0-7 in one register and 8-15 in
/// another; a partial last vector takes its elements into their lanes (the zeros
/// tinyBLAS loads there add nothing), then the lanes are added as
/// `_mm512_reduce_add_ps` (`flint_core::math::reduce_add_16`).
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_tinyblas<const R: usize>(w: &[u8], y: &[&[f32]; R], out: &mut [f32; R]) {
    let n = y[0].len();
    for r in 0..R {
        assert!(y[r].len() >= n);
    }
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let mut j = 0;
    while j + 16 <= n {
        let w0 = load_w8::<0>(w, j);
        let w1 = load_w8::<0>(w, j + 8);
        for r in 0..R {
            // SAFETY: y[r] has at least n >= j + 16 values (asserted above).
            let (y0, y1) = unsafe {
                (
                    _mm256_loadu_ps(y[r].as_ptr().add(j)),
                    _mm256_loadu_ps(y[r].as_ptr().add(j + 8)),
                )
            };
            lo[r] = _mm256_fmadd_ps(w0, y0, lo[r]);
            hi[r] = _mm256_fmadd_ps(w1, y1, hi[r]);
        }
        j += 16;
    }
    for r in 0..R {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` is 16 writable f32; storeu is unaligned.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), lo[r]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi[r]);
        }
        for t in j..n {
            let l = t - j;
            lanes[l] = super::FloatKind::F32.get(w, t).mul_add(y[r][t], lanes[l]);
        }
        out[r] = flint_core::math::reduce_add_16(&lanes);
    }
}

/// One F32 weight row (bytes, unaligned) · f32 activations in the order of
/// `ggml_vec_dot_f32` on an AVX-512 build (`flint_core::dot::ggml_x86::vec_dot_f32_ggml`):
/// four accumulators of sixteen lanes, here as eight 8-lane registers (accumulator `j`'s
/// lanes 0-7 in `lo[j]`, 8-15 in `hi[j]`), FMA chains over steps of 64 elements; the
/// accumulators added per lane as `(0 + 2) + (1 + 3)`, the lanes as
/// `_mm512_reduce_add_ps`, then the elements after the last whole step added one product
/// at a time in `f32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32_vec(w: &[u8], y: &[f32]) -> f32 {
    let n = y.len();
    assert!(w.len() >= 4 * n);
    let np = n - n % 64;
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let mut j = 0;
    while j < np {
        for a in 0..4 {
            let e = j + 16 * a;
            let (w0, w1) = (load_w8::<0>(w, e), load_w8::<0>(w, e + 8));
            // SAFETY: e + 16 <= np <= n = y.len().
            let (y0, y1) = unsafe {
                (
                    _mm256_loadu_ps(y.as_ptr().add(e)),
                    _mm256_loadu_ps(y.as_ptr().add(e + 8)),
                )
            };
            lo[a] = _mm256_fmadd_ps(w0, y0, lo[a]);
            hi[a] = _mm256_fmadd_ps(w1, y1, hi[a]);
        }
        j += 64;
    }
    let l = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
    let h = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` is 16 writable f32; storeu is unaligned.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), l);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), h);
    }
    let mut sum = flint_core::math::reduce_add_16(&lanes);
    for (t, &yv) in y.iter().enumerate().skip(np) {
        sum += super::FloatKind::F32.get(w, t) * yv;
    }
    sum
}
