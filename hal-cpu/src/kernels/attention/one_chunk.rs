//! Paged attention for calls of fewer than `GGML_FA_TILE_Q` (64) query rows (decode
//! steps, short prompts), in the order of llama.cpp's CPU flash attention for such calls
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`), with AVX2, FMA and F16C:
//! bit for bit `flint_core::math::attend_ggml_one_chunk` (AVX-512 build) run on each
//! (row, head) alone.
//!
//! - **Scores**, keys in lanes: the query rounded to f16; for eight consecutive keys of
//!   a cache block (the cache stores keys transposed inside each block, `CpuKv`), the
//!   `ggml_vec_dot_f16` order: 64 accumulators (four of sixteen lanes), element `d` of
//!   the head into accumulator `d mod 64`, added as `(0 + 2) + (1 + 3)` per lane and
//!   then as `_mm512_reduce_add_ps`; the elements after the last step of 64 added in
//!   f64. A block size that is not a multiple of 16 gathers each key.
//! - **Softmax and output**, one key at a time in position order: the running maximum
//!   with glibc's `expf`, the output held **in f16** (`f16(fma(v, w, o))`, rescaled as
//!   `f16(o * ms)` when the maximum grows), the denominator `fma(S, ms, vs)`; the queries
//!   of a group advance together, key by key, so that their independent chains overlap.
//! - The sink and the normalisation as every kernel ([`super::finish_query`]).

use std::arch::x86_64::*;

use super::{finish_query, KvSource, LaneGroup, CHUNK};

/// Keys scored per vector.
const KL: usize = 8;

/// Eight f16 (bits) at `p`, widened to f32 (exact).
///
/// # Safety
/// `p` must point to 8 readable `u16`; the CPU must have F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_f16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable u16 (16 bytes); loadu is unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
}

/// `f16(x)` widened back to f32, lane by lane (round to nearest even, as ggml's
/// `GGML_CPU_FP32_TO_FP16` on x86).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_f16(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// `ggml_vec_dot_f16`'s lane sum of 64 accumulators (see the module docs): accumulator
/// `l` lane-wise `(a[l] + a[32 + l]) + (a[16 + l] + a[48 + l])`, then the sixteen sums as
/// `_mm512_reduce_add_ps` (halves added pairwise: 8, 4, 2, 1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce64(a: &[__m256; 64]) -> __m256 {
    let v: [__m256; 16] = std::array::from_fn(|l| {
        _mm256_add_ps(
            _mm256_add_ps(a[l], a[32 + l]),
            _mm256_add_ps(a[16 + l], a[48 + l]),
        )
    });
    let t: [__m256; 8] = std::array::from_fn(|i| _mm256_add_ps(v[i + 8], v[i]));
    let u: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(t[i + 4], t[i]));
    _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]))
}

/// The score of one key given as f32 values (`k`) against the f16-rounded query.
fn score_scalar(k: &[f32], q16: &[f32], scale: f32) -> f32 {
    let build = flint_core::math::GgmlCpuBuild::Avx512;
    let (np, blocks) = flint_core::dot::ggml_x86::vec_dot_f32_ggml_steps(build, k, q16);
    let mut sum = f64::from(blocks);
    for (a, b) in k[np..].iter().zip(&q16[np..]) {
        sum += f64::from(a * b);
    }
    sum as f32 * scale
}

/// Attends the queries of `g` over the keys and values of `kv` in llama.cpp's order for
/// calls of fewer than 64 query rows, writing `dv` values per query to `out`. Errors if
/// a visible position is not mapped.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (checked at device open).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn attend_one_chunk(
    g: &LaneGroup<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    out: &mut [f32],
) -> Result<(), ()> {
    let n = g.q.len();
    assert!(n > 0 && g.range.len() == n && g.sink.len() == n);
    assert_eq!(out.len(), n * dv, "attend_one_chunk: out length");
    let dk = g.q[0].len();
    let first = g.range.iter().map(|r| r.0).min().unwrap_or(0);
    let last = g.range.iter().map(|r| r.1).max().unwrap_or(0);
    let nk = last + 1 - first;
    let q16: Vec<Vec<f32>> =
        g.q.iter()
            .map(|q| q.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect())
            .collect();
    // Scores [query][position - first] and each position's value offset.
    let mut scores = vec![0f32; n * nk];
    let mut voff = vec![0usize; nk];
    let kp = kv.k.as_ptr();
    let np = dk - dk % 64;
    if kv.runs16 {
        let mut p0 = first / CHUNK * CHUNK;
        while p0 <= last {
            let (kb, vb) = kv.locate(p0, dk, dv, CHUNK).ok_or(())?;
            for half in 0..CHUNK / KL {
                let b = kb + half * KL;
                for (i, q) in q16.iter().enumerate() {
                    let mut acc = [_mm256_setzero_ps(); 64];
                    for (d, &qd) in q[..np].iter().enumerate() {
                        // SAFETY: `locate` checked that 16 keys' element d lie in `kv.k`.
                        let x = unsafe { load8_f16(kp.add(b + d * kv.k_stride)) };
                        acc[d % 64] = _mm256_fmadd_ps(x, _mm256_set1_ps(qd), acc[d % 64]);
                    }
                    let mut s = [0f32; KL];
                    // SAFETY: `s` is 8 writable f32; storeu is unaligned.
                    unsafe { _mm256_storeu_ps(s.as_mut_ptr(), reduce64(&acc)) };
                    for (j, &sj) in s.iter().enumerate() {
                        let p = p0 + half * KL + j;
                        if p < first || p > last {
                            continue;
                        }
                        let mut sum = f64::from(sj);
                        for (d, &qd) in q.iter().enumerate().skip(np) {
                            let kd = half::f16::from_bits(kv.k[b + d * kv.k_stride + j]).to_f32();
                            sum += f64::from(kd * qd);
                        }
                        scores[i * nk + p - first] = sum as f32 * scale;
                    }
                }
            }
            for j in 0..CHUNK {
                let p = p0 + j;
                if p >= first && p <= last {
                    voff[p - first] = vb + j * kv.v_stride;
                }
            }
            p0 += CHUNK;
        }
    } else {
        let mut kf = vec![0f32; dk];
        for p in first..=last {
            let (kb, vb) = kv.locate(p, dk, dv, 1).ok_or(())?;
            for (d, x) in kf.iter_mut().enumerate() {
                *x = half::f16::from_bits(kv.k[kb + d * kv.k_stride]).to_f32();
            }
            for (i, q) in q16.iter().enumerate() {
                scores[i * nk + p - first] = score_scalar(&kf, q, scale);
            }
            voff[p - first] = vb;
        }
    }
    // The output in f16 (as f32 values that are exactly f16), key by key.
    out.fill(0.0);
    let mut m = vec![f32::NEG_INFINITY; n];
    let mut denom = vec![0f32; n];
    let dv8 = dv - dv % KL;
    let expf = flint_core::math::expf_libc;
    let vp = kv.v.as_ptr();
    for p in first..=last {
        let vrow = voff[p - first];
        for i in 0..n {
            let (lo, hi) = g.range[i];
            if p < lo || p > hi {
                continue;
            }
            let s = scores[i * nk + p - first];
            let o = &mut out[i * dv..(i + 1) * dv];
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if s > m[i] {
                ms = expf(m[i] - s);
                m[i] = s;
                let msv = _mm256_set1_ps(ms);
                for c in (0..dv8).step_by(KL) {
                    // SAFETY: c + 8 <= dv = o.len(); unaligned loads and stores.
                    unsafe {
                        let x = _mm256_loadu_ps(o.as_ptr().add(c));
                        _mm256_storeu_ps(o.as_mut_ptr().add(c), round_f16(_mm256_mul_ps(x, msv)));
                    }
                }
                for x in &mut o[dv8..] {
                    *x = half::f16::from_f32(*x * ms).to_f32();
                }
            } else {
                vs = expf(s - m[i]);
            }
            let vsv = _mm256_set1_ps(vs);
            for c in (0..dv8).step_by(KL) {
                // SAFETY: `locate` checked that the value row's dv elements lie in `kv.v`;
                // c + 8 <= dv = o.len(); unaligned loads and stores.
                unsafe {
                    let v = load8_f16(vp.add(vrow + c));
                    let x = _mm256_loadu_ps(o.as_ptr().add(c));
                    _mm256_storeu_ps(o.as_mut_ptr().add(c), round_f16(_mm256_fmadd_ps(v, vsv, x)));
                }
            }
            for (c, x) in o.iter_mut().enumerate().skip(dv8) {
                let v = half::f16::from_bits(kv.v[vrow + c]).to_f32();
                *x = half::f16::from_f32(v.mul_add(vs, *x)).to_f32();
            }
            denom[i] = denom[i].mul_add(ms, vs);
        }
    }
    for i in 0..n {
        finish_query(&mut out[i * dv..(i + 1) * dv], m[i], denom[i], g.sink[i]);
    }
    Ok(())
}
