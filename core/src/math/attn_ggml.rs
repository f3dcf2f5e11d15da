//! Attention computed the way llama.cpp's CPU backend computes it for a prompt batch
//! (`ggml_compute_forward_flash_attn_ext_tiled` in `ggml-cpu/ops.cpp`, which is what
//! flash attention "auto" picks on CPU when at least 64 query rows are processed
//! together), operation for operation in f32, in the order of one of its x86 builds
//! ([`GgmlCpuBuild`]).
//!
//! Why: Gemma 3's attention is sharp and its post-attention norms rescale small outputs,
//! so one-ulp differences in a score or a softmax weight grow into logit differences of
//! 0.1 nats within a few positions. Matching llama.cpp's top-1 choice at 98% of the
//! positions needs the same roundings, not just the same maths. The steps:
//!
//! - keys are visited in tiles of 64 KV cells, aligned on absolute positions (cell `p` of
//!   a single sequence is position `p`); cells outside the visible range are masked;
//! - a score is one fused multiply-add chain over the head dimension, in order, from 0
//!   (`simd_gemm` keeps one accumulator per output, in every build), then multiplied by
//!   `scale`;
//! - per tile: the running maximum grows to the tile's maximum (rescaling the output
//!   and the denominator by `expf(old - new)` when it does), the weights are
//!   `ggml_vec_soft_max_f32`'s ([`soft_max_ggml`]: the build's `ggml_v_expf` of
//!   `s - max`, lane sums added to an f64 sum) and the tile's f64 sum is added to the
//!   denominator;
//! - the output accumulates `weight * v` as one fused multiply-add chain over the tile's
//!   keys, in order;
//! - a sink joins the denominator after the last tile; finally the output is multiplied
//!   by `1 / denominator`.
//!
//! The builds differ in the softmax only: the AVX-512 build takes 16 lanes at a time
//! ([`expf_ggml_avx512`], `_mm512_reduce_add_ps`), the AVX2 build 8 ([`expf_ggml_avx2`],
//! a 128-bit fold and two horizontal adds), each lane sum added to the f64 sum. For
//! fewer query rows ([`attend_ggml_one_chunk`]) they differ in the f16 dot product of
//! the scores.

/// The x86 build of llama.cpp's CPU backend whose float order a function follows: ggml
/// picks its vector width at compile time, and its softmax, `exp` and f16 dot products
/// sum their lanes in an order that depends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GgmlCpuBuild {
    /// Built with AVX2, FMA and F16C (no AVX-512): 8-lane vectors.
    Avx2,
    /// Built with AVX-512 F (and DQ): 16-lane vectors.
    #[default]
    Avx512,
}

impl GgmlCpuBuild {
    /// The `f32` lanes of the build's vectors: 8 (AVX2) or 16 (AVX-512).
    pub const fn f32_lanes(self) -> usize {
        match self {
            GgmlCpuBuild::Avx2 => 8,
            GgmlCpuBuild::Avx512 => 16,
        }
    }
}

/// `exp(x)` for the value at index `i` of a softmax row of `len` values, as the build's
/// `ggml_vec_soft_max_f32` takes it: through `ggml_v_expf` ([`expf_ggml_avx2`],
/// [`expf_ggml_avx512`]) inside the row's full vectors, through glibc's `expf` after
/// them.
pub fn soft_max_exp(build: GgmlCpuBuild, len: usize, i: usize, x: f32) -> f32 {
    let lanes = build.f32_lanes();
    if i < len - len % lanes {
        match build {
            GgmlCpuBuild::Avx2 => expf_ggml_avx2(x),
            GgmlCpuBuild::Avx512 => expf_ggml_avx512(x),
        }
    } else {
        super::libc::expf_libc(x)
    }
}

/// The f64 sum `ggml_vec_soft_max_f32` forms in the build from a row's `len`
/// exponentials (`e(i)`, [`soft_max_exp`]): each full vector's lanes added in f32
/// ([`reduce_add_8`], [`reduce_add_16`]) and that sum added in f64, then the values
/// after the last full vector one by one in f64.
pub fn soft_max_sum(build: GgmlCpuBuild, len: usize, e: impl Fn(usize) -> f32) -> f64 {
    let lanes = build.f32_lanes();
    let full = len - len % lanes;
    let mut sum = 0.0f64;
    let mut v = [0.0f32; 16];
    for c in (0..full).step_by(lanes) {
        for (j, x) in v[..lanes].iter_mut().enumerate() {
            *x = e(c + j);
        }
        let lane_sum = match build {
            GgmlCpuBuild::Avx2 => reduce_add_8(&v[..8]),
            GgmlCpuBuild::Avx512 => reduce_add_16(&v),
        };
        sum += lane_sum as f64;
    }
    for i in full..len {
        sum += e(i) as f64;
    }
    sum
}

/// Keys per tile (`GGML_FA_TILE_KV`).
pub const GGML_FA_TILE: usize = 64;

/// ggml's AVX-512 `ggml_v_expf` for one lane: a degree-5 polynomial on the reduced
/// argument, scaled by `2^n`. Within a couple of ulp of `exp(x)`; 0 below about -133
/// (`|n| > 192` saturates to 0 or infinity as the SIMD code does).
pub fn expf_ggml_avx512(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23: rounds to an integer in the low mantissa bits
    let z = libm::fmaf(x, c(0x3fb8_aa3b), r);
    let n = z - r;
    // fnmadd(a, b, c) = c - a * b, one rounding.
    let b = libm::fmaf(-n, c(0x35bf_be8e), libm::fmaf(-n, c(0x3f31_7200), x));
    let u = b * b;
    let j = libm::fmaf(
        libm::fmaf(
            libm::fmaf(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            libm::fmaf(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        libm::fmaf(c(0x3f7f_fff6), b, 1.0),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // `_mm512_scalef_ps(j, n)`: n is already an integer.
    libm::scalbnf(j, n as i32)
}

/// ggml's AVX2 `ggml_v_expf` for one lane (`ggml-cpu/vec.h`): the same reduction as
/// [`expf_ggml_avx512`] and the same polynomial without its constant term, `j`, then
/// `2^n + j * 2^n` in one fused multiply-add, `2^n` made by adding `n` to the exponent
/// bits of 1.0. Where `|n| > 126` that `2^n` is not a normal float and the result is
/// built from two factors instead (`2^n` split as `s1 * s2`); where `|n| > 192` it is 0
/// or infinity (`s1 * s1`). Each lane's result depends on that lane alone.
pub fn expf_ggml_avx2(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = libm::fmaf(x, c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = libm::fmaf(-n, c(0x35bf_be8e), libm::fmaf(-n, c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = c(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = libm::fmaf(
        libm::fmaf(
            libm::fmaf(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            libm::fmaf(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        c(0x3f7f_fff6) * b,
    );
    if n.abs() <= 126.0 {
        return libm::fmaf(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = c(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = c(e.wrapping_sub(g));
    libm::fmaf(s2, j, s2) * s1
}

/// `ggml_vec_soft_max_f32(n, y, x, max)` in place on `x` (`ggml-cpu/vec.cpp`): each
/// value becomes `exp(value - max)`, and the return value is their sum in f64, as the
/// given build computes both. Full vectors (16 lanes for AVX-512, 8 for AVX2) go through
/// the build's `ggml_v_expf`, their lanes summed in f32 ([`reduce_add_16`],
/// [`reduce_add_8`]) and each vector's sum added to the f64 sum; the values after the
/// last full vector through glibc's `expf`, one at a time.
pub fn soft_max_ggml(build: GgmlCpuBuild, x: &mut [f32], max: f32) -> f64 {
    let len = x.len();
    for (i, s) in x.iter_mut().enumerate() {
        *s = soft_max_exp(build, len, i, *s - max);
    }
    soft_max_sum(build, len, |i| x[i])
}

/// The AVX2 softmax's sum of 8 lanes: the high four onto the low four
/// (`_mm256_extractf128_ps`), lanes 2 and 3 onto 0 and 1 (`_mm_movehl_ps`), then lane 1
/// onto lane 0 (`_mm_movehdup_ps`).
fn reduce_add_8(v: &[f32]) -> f32 {
    let t: [f32; 4] = core::array::from_fn(|i| v[i + 4] + v[i]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// `_mm512_reduce_add_ps` of 16 lanes (`v[..16]`) as GCC expands it: halves added
/// pairwise (8, 4, 2, 1), i.e. `((u0 + u2) + (u1 + u3))` with `u_i = t_{i+4} + t_i`,
/// `t_i = v_{i+8} + v_i`. ggml's AVX-512 reductions (flash attention, tinyBLAS's `hsum`)
/// add their lanes so.
pub fn reduce_add_16(v: &[f32]) -> f32 {
    let mut t = [0.0f32; 8];
    for i in 0..8 {
        t[i] = v[i + 8] + v[i];
    }
    let mut u = [0.0f32; 4];
    for i in 0..4 {
        u[i] = t[i + 4] + t[i];
    }
    let a = u[0] + u[2];
    let b = u[1] + u[3];
    a + b
}

/// One query head attending over the keys and values of positions
/// `first .. first + keys.len()` (`keys[i]`, `values[i]` for position `first + i`), with
/// an optional sink logit, as llama.cpp's tiled CPU flash attention computes it in the
/// given build (see the module docs). `out` (the value width) receives the result; with
/// no key and no sink it is zeros.
///
/// # Panics
/// If `keys` and `values` differ in length, a key is not as long as `q`, or a value is
/// not as long as `out`.
#[allow(clippy::too_many_arguments)]
pub fn attend_ggml_tiled(
    build: GgmlCpuBuild,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    first: usize,
    scale: f32,
    sink: Option<f32>,
    out: &mut [f32],
) {
    assert_eq!(
        keys.len(),
        values.len(),
        "attend_ggml_tiled: keys vs values"
    );
    out.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut denom = 0.0f32;
    let end = first + keys.len();
    let mut kq = [0.0f32; GGML_FA_TILE];
    let mut t0 = first / GGML_FA_TILE * GGML_FA_TILE;
    while t0 < end {
        let visible = |p: usize| p >= first && p < end;
        for (t, s) in kq.iter_mut().enumerate() {
            let p = t0 + t;
            *s = if visible(p) {
                let k = keys[p - first];
                assert_eq!(k.len(), q.len(), "attend_ggml_tiled: key length");
                let mut acc = 0.0f32;
                for (&a, &b) in q.iter().zip(k) {
                    acc = libm::fmaf(a, b, acc);
                }
                acc * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if tile_max == f32::NEG_INFINITY {
            t0 += GGML_FA_TILE;
            continue;
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = super::libc::expf_libc(m - m_new);
            for o in out.iter_mut() {
                *o *= ms;
            }
            denom *= ms;
        }
        m = m_new;
        let sum = soft_max_ggml(build, &mut kq, m);
        denom = (denom as f64 + sum) as f32;
        // Masked cells carry weight 0, which leaves a fused multiply-add chain unchanged.
        for (d, o) in out.iter_mut().enumerate() {
            let mut acc = *o;
            for (t, &w) in kq.iter().enumerate() {
                let p = t0 + t;
                if visible(p) {
                    acc = libm::fmaf(w, values[p - first][d], acc);
                }
            }
            *o = acc;
        }
        t0 += GGML_FA_TILE;
    }
    if let Some(s) = sink {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            ms = super::libc::expf_libc(m - s);
            for o in out.iter_mut() {
                *o *= ms;
            }
        } else {
            vs = super::libc::expf_libc(s - m);
        }
        // `S = S * ms + vs` in C; GCC fuses it.
        denom = libm::fmaf(denom, ms, vs);
    }
    let inv = if denom == 0.0 { 0.0 } else { 1.0 / denom };
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Query rows from which llama.cpp's CPU flash attention takes its tiled path
/// (`GGML_FA_TILE_Q`); smaller calls (a short prompt, every decode step) go through
/// [`attend_ggml_one_chunk`].
pub const GGML_FA_TILE_Q: usize = 64;

/// `f32` rounded to the nearest f16 (ties to even), back in `f32`: how ggml's f16
/// buffers (the KV cache, the f16 activations of its small-batch attention) hold values.
#[inline]
pub fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// ggml's `ggml_vec_dot_f16` of two rows of f16 values (given widened to f32), as the
/// given build computes it: four accumulators of 16 lanes (AVX-512) or 8 lanes (AVX2),
/// fused multiply-adds over blocks of 64 or 32 values, then the accumulators added
/// (0 + 2) + (1 + 3) per lane and the lanes summed (`_mm512_reduce_add_ps`; for AVX2
/// `GGML_F32x8_REDUCE`; [`crate::dot::ggml_x86::vec_dot_f32_ggml_steps`]). A tail that is not a
/// multiple of the block is added in f64 one product at a time.
fn dot_f16_ggml(build: GgmlCpuBuild, x: &[f32], y: &[f32]) -> f32 {
    let (np, blocks) = crate::dot::ggml_x86::vec_dot_f32_ggml_steps(build, x, y);
    let n = x.len();
    let mut sum = blocks as f64;
    for e in np..n {
        sum += (x[e] * y[e]) as f64;
    }
    sum as f32
}

/// One query head as llama.cpp's CPU flash attention computes it for calls of fewer than
/// [`GGML_FA_TILE_Q`] query rows (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`
/// in the given build, f16 K and V cache): the query rounded to f16; per key in order,
/// the score `ggml_vec_dot_f16(k, q) * scale` (the one step where the builds differ); an online softmax with glibc's `expf`, one key
/// at a time; the output accumulated **in f16** (`ggml_vec_mad_f16`: `f16(fma(v, w,
/// acc))`, a rescale `f16(acc * ms)` when the maximum grows); the sink after the last key;
/// then `* (1 / S)` in f32. Keys and values are given as f16 values widened to f32.
///
/// # Panics
/// As [`attend_ggml_tiled`].
pub fn attend_ggml_one_chunk(
    build: GgmlCpuBuild,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    sink: Option<f32>,
    out: &mut [f32],
) {
    assert_eq!(
        keys.len(),
        values.len(),
        "attend_ggml_one_chunk: keys vs values"
    );
    let expf = super::libc::expf_libc;
    let mut q16 = [0.0f32; 1024];
    assert!(q.len() <= q16.len(), "attend_ggml_one_chunk: head too wide");
    let q16 = &mut q16[..q.len()];
    for (d, &v) in q16.iter_mut().zip(q) {
        *d = f16_round(v);
    }
    out.fill(0.0);
    let (mut m, mut denom) = (f32::NEG_INFINITY, 0.0f32);
    for (k, v) in keys.iter().zip(values) {
        assert_eq!(k.len(), q.len(), "attend_ggml_one_chunk: key length");
        assert_eq!(v.len(), out.len(), "attend_ggml_one_chunk: value length");
        let s = dot_f16_ggml(build, k, q16) * scale;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            let m_old = m;
            m = s;
            ms = expf(m_old - m);
            for o in out.iter_mut() {
                *o = f16_round(*o * ms);
            }
        } else {
            vs = expf(s - m);
        }
        for (o, &x) in out.iter_mut().zip(v.iter()) {
            *o = f16_round(libm::fmaf(x, vs, *o));
        }
        // `S = S * ms + vs` in C; GCC fuses it.
        denom = libm::fmaf(denom, ms, vs);
    }
    if let Some(s) = sink {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            ms = expf(m - s);
            for o in out.iter_mut() {
                *o *= ms;
            }
        } else {
            vs = expf(s - m);
        }
        denom = libm::fmaf(denom, ms, vs);
    }
    let inv = if denom == 0.0 { 0.0 } else { 1.0 / denom };
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_ggml_is_close_to_exp() {
        for expf in [expf_ggml_avx512, expf_ggml_avx2] {
            for i in -2000..=800 {
                let x = i as f32 * 0.05;
                let want = libm::exp(x as f64);
                let got = expf(x) as f64;
                assert!(
                    (got - want).abs() <= 4e-7 * want + 1e-44, // subnormals: absolute
                    "x = {x}: {got} vs {want}"
                );
            }
            assert_eq!(expf(f32::NEG_INFINITY), 0.0);
            assert_eq!(expf(0.0), 1.0);
            assert_eq!(expf(200.0), f32::INFINITY);
        }
    }

    #[test]
    fn tiled_matches_two_pass_within_rounding() {
        // 150 keys from position 30: three tiles, the first one partly masked.
        let dk = 8;
        let n = 150;
        let q: [f32; 8] = core::array::from_fn(|i| (i as f32 * 0.7).sin());
        let kv: [[f32; 8]; 150] = core::array::from_fn(|j| {
            core::array::from_fn(|i| ((i * 31 + j * 7) as f32).cos() * 3.0)
        });
        let keys: [&[f32]; 150] = core::array::from_fn(|j| &kv[j][..]);
        for (sink, build) in [None, Some(0.5f32), Some(40.0)]
            .into_iter()
            .flat_map(|s| [(s, GgmlCpuBuild::Avx2), (s, GgmlCpuBuild::Avx512)])
        {
            let mut scores = [0.0f32; 150];
            for j in 0..n {
                scores[j] = q.iter().zip(&kv[j]).map(|(a, b)| a * b).sum::<f32>() * 0.25;
            }
            let mut vals = [0.0f32; 150 * 8];
            for j in 0..n {
                vals[j * dk..(j + 1) * dk].copy_from_slice(&kv[j]);
            }
            let mut want = [0.0f32; 8];
            crate::math::attend_two_pass(&scores, &vals, dk, sink, &mut want);
            let mut got = [0.0f32; 8];
            attend_ggml_tiled(build, &q, &keys, &keys, 30, 0.25, sink, &mut got);
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{got:?} vs {want:?}"
                );
            }
        }
        let mut none = [1.0f32; 8];
        attend_ggml_tiled(GgmlCpuBuild::Avx2, &q, &[], &[], 5, 0.25, None, &mut none);
        assert_eq!(none, [0.0; 8]);
    }

    #[test]
    fn one_chunk_matches_two_pass_within_f16_accumulation() {
        // 70 keys of width 64 (one 64-block for the f16 dot), f16-valued keys and values.
        let (dk, n) = (64usize, 70usize);
        let f16v = |x: f32| half::f16::from_f32(x).to_f32();
        let q: [f32; 64] = core::array::from_fn(|i| (i as f32 * 0.37).sin());
        let kv: [[f32; 64]; 70] = core::array::from_fn(|j| {
            core::array::from_fn(|i| f16v(((i * 13 + j * 5) as f32 * 0.1).cos()))
        });
        let keys: [&[f32]; 70] = core::array::from_fn(|j| &kv[j][..]);
        for (sink, build) in [None, Some(-1.0f32), Some(30.0)]
            .into_iter()
            .flat_map(|s| [(s, GgmlCpuBuild::Avx2), (s, GgmlCpuBuild::Avx512)])
        {
            let mut scores = [0.0f32; 70];
            for j in 0..n {
                let d: f32 = q.iter().zip(&kv[j]).map(|(a, b)| f16v(*a) * b).sum();
                scores[j] = d * 0.125;
            }
            let mut vals = [0.0f32; 70 * 64];
            for j in 0..n {
                vals[j * dk..(j + 1) * dk].copy_from_slice(&kv[j]);
            }
            let mut want = [0.0f32; 64];
            crate::math::attend_two_pass(&scores, &vals, dk, sink, &mut want);
            let mut got = [0.0f32; 64];
            attend_ggml_one_chunk(build, &q, &keys, &keys, 0.125, sink, &mut got);
            for (a, b) in got.iter().zip(&want) {
                // The running output is rounded to f16 after every key.
                assert!((a - b).abs() <= 4e-3 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn dot_f16_adds_lanes_in_ggml_order() {
        // Large values in accumulator 0 and 2 of lane 0 cancel before the small ones join.
        let mut x = [0.0f32; 64];
        let y = [1.0f32; 64];
        x[0] = 1e8;
        x[32] = -1e8;
        x[16] = 1.0;
        x[48] = 0.5;
        assert_eq!(dot_f16_ggml(GgmlCpuBuild::Avx512, &x, &y), 1.5);
        // AVX2: blocks of 32, so 0 and 32 share lane 0 of accumulator 0 (cancelling
        // first), 16 and 48 lane 0 of accumulator 2.
        assert_eq!(dot_f16_ggml(GgmlCpuBuild::Avx2, &x, &y), 1.5);
        // Across lanes (AVX2, two horizontal adds: lanes 0 and 1 meet before lane 2).
        let mut x = [0.0f32; 32];
        x[0] = 1e8;
        x[1] = -1e8;
        x[2] = 1.0;
        assert_eq!(dot_f16_ggml(GgmlCpuBuild::Avx2, &x, &x.map(|_| 1.0)), 1.0);
        x.swap(1, 2);
        assert_eq!(dot_f16_ggml(GgmlCpuBuild::Avx2, &x, &x.map(|_| 1.0)), 0.0);
        // A tail beyond the last block is added in f64.
        let mut x = [0.0f32; 40];
        x[32] = 1e8;
        x[33] = 1.0;
        x[34] = -1e8;
        assert_eq!(dot_f16_ggml(GgmlCpuBuild::Avx2, &x, &x.map(|_| 1.0)), 1.0);
    }

    #[test]
    fn soft_max_sums_lanes_per_build() {
        // The softmax's 8-lane fold meets lanes 0 and 2 first (unlike the dot product's).
        let mut w = [0.0f32; 8];
        w[0] = 1e8;
        w[1] = 1.0;
        w[2] = -1e8;
        assert_eq!(reduce_add_8(&w), 1.0);
        // Masked lanes weigh 0, the maximum 1.
        let mut x = [f32::NEG_INFINITY; 16];
        x[0] = 0.0;
        let mut a = x;
        assert_eq!(soft_max_ggml(GgmlCpuBuild::Avx2, &mut a, 0.0), 1.0);
        assert_eq!(a[0], 1.0);
        assert!(a[1..].iter().all(|&w| w == 0.0));
        // Values after the last full vector: glibc's expf.
        let mut b = [0.5f32; 9];
        let sum = soft_max_ggml(GgmlCpuBuild::Avx2, &mut b, 0.0);
        assert_eq!(b[8], crate::math::expf_libc(0.5));
        assert_eq!(b[0], expf_ggml_avx2(0.5));
        assert_eq!(sum, (reduce_add_8(&b[..8]) as f64) + b[8] as f64);
        let mut c = [0.5f32; 16];
        let sum = soft_max_ggml(GgmlCpuBuild::Avx512, &mut c, 0.0);
        assert_eq!(sum, reduce_add_16(&c) as f64);
    }
}
