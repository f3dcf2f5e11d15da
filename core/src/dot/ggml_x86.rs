//! Dot products in the float order of llama.cpp's x86 CPU kernels (an AVX2 / AVX-512
//! build), for the weight types of the default model, next to the generic-C order of the
//! rest of this module.
//!
//! Why: quantized dot products are exact integer sums per block, but the way the block
//! results are scaled and accumulated in `f32` differs between ggml's generic C kernels
//! and the SIMD kernels llama.cpp actually runs, and on Gemma 3 (whose post-norms scale
//! small sums up) those last-bit differences decide top-1 choices. Matching llama.cpp's
//! logits to the bit where it is deterministic needs its order, which is:
//!
//! - **Q8_0 / Q5_0 weights**: llamafile's tinyBLAS (`tinyBLAS_Q0_AVX` in
//!   `ggml-cpu/llamafile/sgemm.cpp`) for two or more activation rows; a single row goes
//!   through `ggml_vec_dot_q8_0_q8_0` / `_q5_0_q8_0` (AVX2), whose order is the same. Eight `f32` lanes;
//!   lane `l` takes, per 32-element block, the integer sum of elements `4l..4l+4`
//!   (`updot`) and accumulates `fma(d_w * d_a, sum, lane)`; the lanes are added at the
//!   end as `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` ([`hsum8`]).
//! - **Q8_0 weights in llama.cpp's AMX buffers** (a build for a CPU with AMX-INT8, which
//!   `GGML_NATIVE` makes on such a CPU: `ggml-cpu/amx/mmq.cpp`, the AMX tiles for two or
//!   more activation rows and `tinygemm_kernel_vnni` for one, the same order): one `f32`
//!   accumulator per output, per 32-element block the exact integer dot product `sum`,
//!   then `acc = fma(sum, d_w * d_a, acc)` from zero ([`vec_dot_q8_0_q8_0_amx`]). Flint
//!   takes the same order for Q5_0 matrices on AMX ([`vec_dot_q5_0_q8_0_amx`]), for
//!   which llama.cpp has no AMX kernel.
//! - **Q4_K and Q6_K weights in llama.cpp's AMX buffers** (the same build, matrices of a
//!   multiple of 32 rows): per 256-element block exact integer sums with the sub-block
//!   scales (and Q4_K's mins) applied, then one FMA (Q6_K, [`vec_dot_q6_k_q8_k_amx`]) or
//!   two (Q4_K: scales, then mins, [`vec_dot_q4_k_q8_k_amx`]) into one `f32` accumulator.
//! - **F32 weights** (two or more activation rows, a matrix of a multiple of 4 rows):
//!   tinyBLAS's F32 kernel, sixteen lanes of FMA chains over the elements `l (mod 16)`,
//!   added as `_mm512_reduce_add_ps` (eight lanes and [`hsum8`] on an AVX2 build,
//!   [`BatchRow::build`]; [`vec_dot_f32_tinyblas`]). Other F32 matmuls
//!   (one row, `MUL_MAT_ID`, other row counts) go through `ggml_vec_dot_f32`
//!   ([`vec_dot_f32_ggml`]: four accumulators of sixteen lanes over steps of 64).
//! - **Q6_K weights, batches of 8 or more rows**: the tiled K-quant matmul
//!   (`ggml-cpu/tiled`, AVX-512 VNNI micro-kernel). Per 256-element block one exact
//!   integer `S = sum_g scale_g * (dot_g - 32 * bsum_g)` over the sixteen 16-element
//!   groups, then `acc = fma(S * d_w, d_a, acc)`, in block order
//!   ([`vec_dot_q6_k_q8_k_tiled`]). Fewer rows go through `ggml_vec_dot_q6_K_q8_K`'s
//!   AVX2 branch ([`vec_dot_q6_k_q8_k_avx2`]: eight `i32` lanes per block, lane `l` the
//!   elements `e` with `(e mod 32) / 4 == l` with the offset of 32 taken out as
//!   `32 * (bsum(2l) * scale(2l) + bsum(2l+1) * scale(2l+1))`, `fma(d, lane, acc_l)` per
//!   block and [`hsum8`] at the end).
//! - **Q5_K weights, batches of 8 or more rows**: the same tiled matmul with mins
//!   (`HAS_MIN`): per 256-element block the exact integers `S = sum_j sc_j * dot_j` and
//!   `M = sum_j m_j * bsum_j` over the eight 32-element sub-blocks, the block's value
//!   `r = fma(-dmin_w, M, S * d_w)` (the kernel's `fnmadd`), then `acc = fma(r, d_a, acc)`
//!   ([`vec_dot_q5_k_q8_k_tiled`]). Fewer rows go through `ggml_vec_dot_q5_K_q8_K`'s AVX2
//!   branch ([`vec_dot_q5_k_q8_k_avx2`]: eight `i32` lanes per block as for Q6_K, the
//!   mins apart in one `f32` sum added after the lanes).
//! - **Expert matmuls** (llama.cpp's `MUL_MAT_ID`, [`BatchRow::expert`]): a repacked Q4_K
//!   tower computes every routed row with the gemv kernel (`forward_mul_mat_id` in
//!   `repack.cpp` calls `gemv` row by row); Q5_K and Q6_K towers, which are not repacked,
//!   take the tiled matmul when 8 or more rows are routed to the expert.
//! - **Q4_K weights**: the repacked `q4_K_8x8` path (`ggml-cpu/arch/x86/repack.cpp`),
//!   which llama.cpp uses for every Q4_K matrix with a multiple of 8 rows. One `f32`
//!   accumulator per output for the scales and one for the mins:
//!   - activation rows in groups of four (`ggml_gemm_q4_K_8x8_q8_K`, every row of a batch
//!     but the last `n % 4`): per 64 elements (two sub-blocks),
//!     `acc = fma(sc0 * dot0 + sc1 * dot1, d_w * d_a, acc)` and
//!     `mins = fma(m0 * bsum0 + m1 * bsum1, dmin_w * d_a, mins)`;
//!   - the remaining rows (`ggml_gemv_q4_K_8x8_q8_K`): the same per 256-element block;
//!   - the result is `acc - mins`.
//! - **MXFP4 weights**: the repacked `mxfp4_8x8` path (`ggml_gemv_mxfp4_8x8_q8_0` and
//!   `ggml_gemm_mxfp4_8x8_q8_0`, `ggml-cpu/arch/x86/repack.cpp`), which llama.cpp uses
//!   for every MXFP4 matrix with a multiple of 8 rows, for single rows and batches alike:
//!   one `f32` accumulator per output, per 32-element block
//!   `acc = fma(sum, D(e) * d_a, acc)` with `sum` the exact integer dot product of the
//!   block ([`vec_dot_mxfp4_q8_0_repack`]; the order Flint computes MXFP4 in). A matrix
//!   whose row count is not a multiple of 8 goes through `ggml_vec_dot_mxfp4_q8_0` (AVX2
//!   branch, [`vec_dot_mxfp4_q8_0_avx2`]): two sets of eight lanes, one for the even
//!   blocks and one for the odd ones, lane `l` taking `fma(D(e) * d_a, sum_l, lane)` with
//!   `sum_l` the integer dot product of elements `4l..4l+4`; the two sets added lane by
//!   lane, then [`hsum8`]; a last unpaired block added as `fma(D(e) * d_a, sum, total)`.
//!
//! The integer sums are the same as in the generic kernels; only the float steps differ.
//! Activations are quantized as for the generic kernels (Q8_0: ggml's x86
//! `quantize_row_q8_0`; Q8_K: `quantize_row_q8_K`, which the repacked path's 4-row
//! quantizer matches except when a block holds both `+amax` and `-amax`).

use crate::blocks::{BlockMXFP4, BlockQ4K, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};
use crate::dequant::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::types::QK_K;

use crate::dequant::f16_to_f32;
use crate::math::GgmlCpuBuild;

/// Adds eight lanes as ggml's x86 `hsum_float_8` and tinyBLAS's `hsum` do: the high half
/// onto the low half, then `movehl`, then `movehdup`.
#[inline]
pub fn hsum8(v: [f32; 8]) -> f32 {
    let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

/// tinyBLAS's lane step for one 32-element block: `lanes[l] = fma(d, sum_l, lanes[l])`
/// with `sum_l` the integer dot product of elements `4l..4l+4`.
#[inline]
fn tinyblas_block(w: &[i32; 32], a: &[i8; 32], d: f32, lanes: &mut [f32; 8]) {
    for (l, lane) in lanes.iter_mut().enumerate() {
        let mut s = 0i32;
        for e in 4 * l..4 * l + 4 {
            s += w[e] * a[e] as i32;
        }
        *lane = libm::fmaf(d, s as f32, *lane);
    }
}

/// F32 weights · f32 activations in the order of llamafile's tinyBLAS in the given build
/// (`tinyBLAS<16, __m512, ...>` on AVX-512, `tinyBLAS<8, __m256, ...>` on AVX2, in
/// `ggml-cpu/llamafile/sgemm.cpp`), llama.cpp's F32 matmul for two or more activation
/// rows and a matrix of a multiple of 4 rows (a MoE router, an f32 file's projections):
/// sixteen (eight) lanes, lane `l` the FMA chain `lane = fma(w[e], x[e], lane)` over the
/// elements `e = l (mod 16)` (`mod 8`) in order, a partial last vector loaded with zeros;
/// the lanes added as `_mm512_reduce_add_ps` ([`crate::math::reduce_add_16`]) or as
/// tinyBLAS's `hsum(__m256)` ([`hsum8`]). The tile shape does not change this.
///
/// # Panics
/// If the rows differ in length.
pub fn vec_dot_f32_tinyblas(build: GgmlCpuBuild, w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vec_dot_f32_tinyblas: lengths");
    let mut lanes = [0.0f32; 16];
    let width = match build {
        GgmlCpuBuild::Avx512 => 16,
        GgmlCpuBuild::Avx2 => 8,
    };
    for (wc, xc) in w.chunks(width).zip(x.chunks(width)) {
        for (l, lane) in lanes[..width].iter_mut().enumerate() {
            let (a, b) = (wc.get(l).copied(), xc.get(l).copied());
            *lane = libm::fmaf(a.unwrap_or(0.0), b.unwrap_or(0.0), *lane);
        }
    }
    match build {
        GgmlCpuBuild::Avx512 => crate::math::reduce_add_16(&lanes),
        GgmlCpuBuild::Avx2 => hsum8(core::array::from_fn(|l| lanes[l])),
    }
}

/// The vector part of ggml's `ggml_vec_dot_f32` (and of `ggml_vec_dot_f16`, on values
/// widened from f16) in the given build: four accumulators of sixteen lanes (AVX-512,
/// `GGML_F32_STEP` 64) or eight (AVX2, step 32), accumulator `j` lane `l` the FMA chain
/// `acc = fma(x[e], y[e], acc)` over the elements `e = step + j * width + l` of the
/// whole steps in order; then the accumulators added per lane as `GGML_F32_VEC_REDUCE`
/// does, `(0 + 2) + (1 + 3)`, and the lanes as `_mm512_reduce_add_ps`
/// ([`crate::math::reduce_add_16`]) or the AVX2 build's `_mm_hadd_ps` pair
/// (`(l0 + l4 + (l1 + l5)) + (l2 + l6 + (l3 + l7))`). Returns how many leading elements
/// the steps cover and their sum; the caller adds the rest as its function does.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_f32_ggml_steps(build: GgmlCpuBuild, x: &[f32], y: &[f32]) -> (usize, f32) {
    assert_eq!(x.len(), y.len(), "vec_dot_f32_ggml: lengths differ");
    let width = match build {
        GgmlCpuBuild::Avx512 => 16,
        GgmlCpuBuild::Avx2 => 8,
    };
    let step = 4 * width;
    let np = x.len() - x.len() % step;
    let mut acc = [[0.0f32; 16]; 4];
    for (xs, ys) in x[..np].chunks_exact(step).zip(y[..np].chunks_exact(step)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, v) in a[..width].iter_mut().enumerate() {
                let e = j * width + l;
                *v = libm::fmaf(xs[e], ys[e], *v);
            }
        }
    }
    let v: [f32; 16] = core::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let sum = match build {
        GgmlCpuBuild::Avx512 => crate::math::reduce_add_16(&v),
        GgmlCpuBuild::Avx2 => {
            let t = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
            (t[0] + t[1]) + (t[2] + t[3])
        }
    };
    (np, sum)
}

/// ggml's `ggml_vec_dot_f32` in the given build, llama.cpp's F32 matmul wherever tinyBLAS
/// declines it (one activation row, `MUL_MAT_ID`, a matrix whose row count is not a
/// multiple of 4), and the dot products of its chunked delta rule: the steps of
/// [`vec_dot_f32_ggml_steps`], then the elements after them added one by one in `f32`,
/// each product rounded before the add (`sumf += x[i]*y[i]`, built without contraction).
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_f32_ggml(build: GgmlCpuBuild, x: &[f32], y: &[f32]) -> f32 {
    let (np, mut sum) = vec_dot_f32_ggml_steps(build, x, y);
    for (a, b) in x[np..].iter().zip(&y[np..]) {
        sum += a * b;
    }
    sum
}

/// Q8_0 weights · Q8_0 activations in tinyBLAS's order (prompt batches).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q8_0_q8_0_tinyblas(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_0_q8_0_tinyblas: block counts");
    let mut lanes = [0.0f32; 8];
    for (w, a) in x.iter().zip(y) {
        let q: [i32; 32] = core::array::from_fn(|e| w.qs[e] as i32);
        tinyblas_block(&q, &a.qs, f16_to_f32(w.d) * f16_to_f32(a.d), &mut lanes);
    }
    hsum8(lanes)
}

/// Q8_0 weights · Q8_0 activations in the order of llama.cpp's AMX kernels (`acc_C` and
/// `tinygemm_kernel_vnni` for `block_q8_0` in `ggml-cpu/amx/mmq.cpp`): per block the
/// exact integer dot product, then `acc = fma(sum, d_w * d_a, acc)`, whatever the number
/// of activation rows.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q8_0_q8_0_amx(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_0_q8_0_amx: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let sum: i32 =
            w.qs.iter()
                .zip(&a.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        acc = libm::fmaf(sum as f32, f16_to_f32(w.d) * f16_to_f32(a.d), acc);
    }
    acc
}

/// Q5_0 weights · Q8_0 activations in tinyBLAS's order (prompt batches).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q5_0_q8_0_tinyblas(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_0_q8_0_tinyblas: block counts");
    let mut lanes = [0.0f32; 8];
    for (w, a) in x.iter().zip(y) {
        let q = q5_0_quants(w);
        tinyblas_block(&q, &a.qs, f16_to_f32(w.d) * f16_to_f32(a.d), &mut lanes);
    }
    hsum8(lanes)
}

/// A Q5_0 block's 32 quants, `-16..=15`.
fn q5_0_quants(w: &BlockQ5_0) -> [i32; 32] {
    let qh = u32::from_le_bytes(w.qh);
    core::array::from_fn(|e| {
        let nib = if e < 16 {
            w.qs[e] & 0x0f
        } else {
            w.qs[e - 16] >> 4
        };
        ((nib as i32) | ((((qh >> e) & 1) as i32) << 4)) - 16
    })
}

/// Q5_0 weights · Q8_0 activations in the order [`vec_dot_q8_0_q8_0_amx`] states for
/// Q8_0 (per block the exact integer dot product, then `acc = fma(sum, d_w * d_a,
/// acc)`): Flint's order for Q5_0 matrices on AMX tiles (llama.cpp has no AMX kernel
/// for Q5_0).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q5_0_q8_0_amx(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_0_q8_0_amx: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let sum: i32 = q5_0_quants(w)
            .iter()
            .zip(&a.qs)
            .map(|(&p, &q)| p * q as i32)
            .sum();
        acc = libm::fmaf(sum as f32, f16_to_f32(w.d) * f16_to_f32(a.d), acc);
    }
    acc
}

/// The unsigned 6-bit value of element `e` of a Q6_K block.
#[inline]
fn q6_value(x: &BlockQ6K, e: usize) -> i32 {
    let (c, r, l) = (e / 128, (e % 128) / 32, e % 32);
    let lo = (x.ql[64 * c + 32 * (r % 2) + l] >> (4 * (r / 2))) & 0x0f;
    let hi = (x.qh[32 * c + l] >> (2 * r)) & 3;
    (lo | (hi << 4)) as i32
}

/// Q6_K weights · Q8_K activations in the order of ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`
/// (llama.cpp's path for fewer than 8 activation rows; see the module docs).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q6_k_q8_k_avx2(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q6_k_q8_k_avx2: block counts");
    let mut acc = [0.0f32; 8];
    for (w, a) in x.iter().zip(y) {
        let d = a.d * f16_to_f32(w.d);
        let mut lanes = [0i32; 8];
        for e in 0..QK_K {
            lanes[(e % 32) / 4] += w.scales[e / 16] as i32 * q6_value(w, e) * a.qs[e] as i32;
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let off = a.bsums[2 * l] as i32 * w.scales[2 * l] as i32
                + a.bsums[2 * l + 1] as i32 * w.scales[2 * l + 1] as i32;
            *lane -= off << 5;
        }
        for (s, &lane) in acc.iter_mut().zip(&lanes) {
            *s = libm::fmaf(d, lane as f32, *s);
        }
    }
    hsum8(acc)
}

/// Q6_K weights · Q8_K activations in the order of ggml's tiled K-quant matmul
/// (`ggml-cpu/tiled`, AVX-512 VNNI micro-kernel), which llama.cpp uses for batches of 8
/// or more activation rows: per 256-element block one exact integer
/// `s = sum_j scale_j * (dot_j - 32 * bsum_j)` over the sixteen 16-element groups, then
/// `acc = fma(s * d_w, d_a, acc)` (GCC contracts the kernel's `acc + (s * d_w) * d_a`).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q6_k_q8_k_tiled(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q6_k_q8_k_tiled: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let mut s = 0i32;
        for g in 0..16 {
            let mut raw = 0i32;
            for e in 16 * g..16 * g + 16 {
                raw += q6_value(w, e) * a.qs[e] as i32;
            }
            s += w.scales[g] as i32 * (raw - 32 * a.bsums[g] as i32);
        }
        let f = s as f32 * f16_to_f32(w.d);
        acc = libm::fmaf(f, a.d, acc);
    }
    acc
}

/// Q6_K weights · Q8_K activations in the order of llama.cpp's AMX kernels (`acc_C` and
/// `tinygemm_kernel_vnni` for `block_q6_K` in `ggml-cpu/amx/mmq.cpp`, the same for any
/// number of activation rows): per 256-element block the exact integer
/// `s = sum_g scale_g * (dot_g - 32 * bsum_g)` over the sixteen 16-element groups, then
/// `acc = fma(s, d_w * d_a, acc)` from zero.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q6_k_q8_k_amx(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q6_k_q8_k_amx: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let mut s = 0i32;
        for g in 0..16 {
            let raw: i32 = (16 * g..16 * g + 16)
                .map(|e| q6_value(w, e) * a.qs[e] as i32)
                .sum();
            s += w.scales[g] as i32 * (raw - 32 * a.bsums[g] as i32);
        }
        acc = libm::fmaf(s as f32, f16_to_f32(w.d) * a.d, acc);
    }
    acc
}

/// Q4_K weights · Q8_K activations in the order of llama.cpp's AMX kernels (`acc_C` and
/// `tinygemm_kernel_vnni` for `block_q4_K` in `ggml-cpu/amx/mmq.cpp`, the same for any
/// number of activation rows): per 256-element block the exact integers
/// `s = sum_j sc_j * dot_j` and `m = sum_j min_j * (bsum_2j + bsum_2j+1)` over the eight
/// 32-element sub-blocks, then `acc = fma(s, d_w * d_a, acc)` and
/// `acc = fma(-m, dmin_w * d_a, acc)` (the kernels' `fnmadd`) from zero.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q4_k_q8_k_amx(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q4_k_q8_k_amx: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let (sc, mn) = super::kquants::scale_min_k4(&w.scales);
        let (mut s, mut m) = (0i32, 0i32);
        for j in 0..8 {
            // Sub-block j: elements 32j..32j+32, nibble (j % 2) of qs[32(j/2)..].
            let dot: i32 = (0..32)
                .map(|l| {
                    let q = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                    q as i32 * a.qs[32 * j + l] as i32
                })
                .sum();
            s += sc[j] * dot;
            m += mn[j] * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
        }
        acc = libm::fmaf(s as f32, f16_to_f32(w.d) * a.d, acc);
        acc = libm::fmaf(-(m as f32), f16_to_f32(w.dmin) * a.d, acc);
    }
    acc
}

/// Q5_K weights · Q8_K activations in the order of ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`
/// (llama.cpp's path for fewer than 8 activation rows; its x86 builds have no wider
/// branch): per block, eight `i32` lanes, lane `l` the exact sum over the sub-blocks `j`
/// of `sc_j * dot` over the elements `e` with `(e mod 32) / 4 == l`, then
/// `acc_l = fma(d_a * d_w, lane, acc_l)`; the mins apart as the exact integer
/// `m = sum_j min_j * bsum_j` and `summs = fma(-d_a * dmin_w, m, summs)` (GCC contracts
/// `summs += dmin * m`); the result is [`hsum8`] of the lanes plus `summs`.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q5_k_q8_k_avx2(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_k_q8_k_avx2: block counts");
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let d = a.d * f16_to_f32(w.d);
        let dmin = -a.d * f16_to_f32(w.dmin);
        let (sc, mn) = super::kquants::scale_min_k4(&w.scales);
        let mut m = 0i32;
        let mut lanes = [0i32; 8];
        for j in 0..8 {
            m += mn[j] * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
            for l in 0..32 {
                let lo = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                let hi = (w.qh[l] >> j) & 1;
                lanes[l / 4] += sc[j] * (lo | (hi << 4)) as i32 * a.qs[32 * j + l] as i32;
            }
        }
        summs = libm::fmaf(dmin, m as f32, summs);
        for (s, &lane) in acc.iter_mut().zip(&lanes) {
            *s = libm::fmaf(d, lane as f32, *s);
        }
    }
    hsum8(acc) + summs
}

/// Q5_K weights · Q8_K activations in the order of ggml's tiled K-quant matmul with mins
/// (`ggml-cpu/tiled`, AVX-512 VNNI micro-kernel, `HAS_MIN`), which llama.cpp uses for
/// batches of 8 or more activation rows: per 256-element block the exact integers
/// `s = sum_j sc_j * dot_j` and `m = sum_j min_j * bsum_j` over the eight 32-element
/// sub-blocks, `r = fma(-dmin_w, m, s * d_w)` (its `fnmadd`), then
/// `acc = fma(r, d_a, acc)` (GCC contracts the kernel's `acc + r * d_a`).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q5_k_q8_k_tiled(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_k_q8_k_tiled: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let (sc, mn) = super::kquants::scale_min_k4(&w.scales);
        let (mut s, mut m) = (0i32, 0i32);
        for j in 0..8 {
            // Sub-block j: elements 32j..32j+32; the low nibble (j even) or high nibble
            // (j odd) of qs[32(j/2)..], the fifth bit from qh bit j.
            let mut raw = 0i32;
            for l in 0..32 {
                let lo = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                let hi = (w.qh[l] >> j) & 1;
                raw += (lo | (hi << 4)) as i32 * a.qs[32 * j + l] as i32;
            }
            s += sc[j] * raw;
            m += mn[j] * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
        }
        let r = libm::fmaf(-f16_to_f32(w.dmin), m as f32, s as f32 * f16_to_f32(w.d));
        acc = libm::fmaf(r, a.d, acc);
    }
    acc
}

/// Where an activation row sits in a llama.cpp matmul: the number of activation rows of
/// the call (`batch`) and the row's index, which together pick llama.cpp's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    /// Activation rows in the matmul (tokens in the llama.cpp batch; for an expert
    /// matmul, the rows routed to the expert).
    pub batch: usize,
    /// This row's index, `0..batch`.
    pub row: usize,
    /// A row of an expert matmul (llama.cpp's `MUL_MAT_ID`), where a repacked Q4_K
    /// tower computes every row with its gemv kernel.
    pub expert: bool,
    /// The llama.cpp build whose vector width sets the F32 order
    /// ([`vec_dot_f32_tinyblas`]); AVX-512 unless set ([`BatchRow::in_build`]).
    pub build: GgmlCpuBuild,
}

impl BatchRow {
    /// A row of a large batch outside the Q4_K tail: Q4_K gemm, Q5_K / Q6_K tiled (and,
    /// for attention, llama.cpp's tiled flash attention, from 64 rows).
    pub const IN_BATCH: Self = Self::at(64, 0);
    /// The single row of a one-token decode step: Q4_K gemv, Q6_K `ggml_vec_dot`.
    pub const SINGLE: Self = Self::at(1, 0);

    /// Row `row` of a dense matmul of `batch` activation rows.
    pub const fn at(batch: usize, row: usize) -> Self {
        Self {
            batch,
            row,
            expert: false,
            build: GgmlCpuBuild::Avx512,
        }
    }

    /// Whether an F32 matrix takes tinyBLAS's F32 kernel for this row
    /// ([`vec_dot_f32_tinyblas`]): two or more activation rows, not an expert matmul.
    /// `tinyBLAS::matmul` also declines matrices whose row count is not a multiple of 4;
    /// a caller that knows the whole matrix passes [`BatchRow::SINGLE`] for those.
    pub const fn f32_tinyblas(self) -> bool {
        self.batch >= 2 && !self.expert
    }

    /// A row of an expert matmul that routes `rows` activation rows to the expert.
    pub const fn expert(rows: usize) -> Self {
        Self {
            batch: rows,
            row: 0,
            expert: true,
            build: GgmlCpuBuild::Avx512,
        }
    }

    /// This row in the given llama.cpp build (its F32 order; the quantized orders
    /// stated here are the same in both builds, or AVX-512 VNNI's).
    pub const fn in_build(self, build: GgmlCpuBuild) -> Self {
        Self { build, ..self }
    }

    /// The repacked Q4_K kernel of this row: gemv for the last `batch % 4` rows of a
    /// dense matmul and for every row of an expert matmul.
    pub fn q4k(self) -> Q4kPath {
        if self.expert || self.row >= self.batch - self.batch % 4 {
            Q4kPath::Gemv
        } else {
            Q4kPath::Gemm
        }
    }

    /// Whether Q5_K and Q6_K (weights llama.cpp does not repack) go through the tiled
    /// matmul (8 rows or more) rather than `ggml_vec_dot`.
    pub fn kq_tiled(self) -> bool {
        self.batch >= 8
    }
}

/// Which of the repacked Q4_K kernels computes an activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q4kPath {
    /// `ggml_gemm_q4_K_8x8_q8_K`: rows of a batch taken four at a time.
    Gemm,
    /// `ggml_gemv_q4_K_8x8_q8_K`: the last `n % 4` rows of a batch (and single rows).
    Gemv,
}

/// Q4_K weights · Q8_K activations in the order of ggml's repacked `q4_K_8x8` kernels.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_q4_k_q8_k_repack(x: &[BlockQ4K], y: &[BlockQ8K], path: Q4kPath) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q4_k_q8_k_repack: block counts");
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (w, a) in x.iter().zip(y) {
        let (sc, mn) = super::kquants::scale_min_k4(&w.scales);
        let dd = f16_to_f32(w.d) * a.d;
        let dm = f16_to_f32(w.dmin) * a.d;
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            // Sub-block j: elements 32j..32j+32, nibble (j % 2) of qs[32(j/2)..].
            let mut s = 0i32;
            for l in 0..32 {
                let q = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                s += q as i32 * a.qs[32 * j + l] as i32;
            }
            isum += sc[j] * s;
            imin += mn[j] * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
            if path == Q4kPath::Gemm && j % 2 == 1 {
                acc = libm::fmaf(isum as f32, dd, acc);
                acc_min = libm::fmaf(imin as f32, dm, acc_min);
                (isum, imin) = (0, 0);
            }
        }
        if path == Q4kPath::Gemv {
            acc = libm::fmaf(isum as f32, dd, acc);
            acc_min = libm::fmaf(imin as f32, dm, acc_min);
        }
    }
    acc - acc_min
}

/// The 32 code-book values of an MXFP4 block in element order (low nibbles of `qs` for
/// elements 0..16, high nibbles for 16..32).
#[inline]
fn mxfp4_values(x: &BlockMXFP4) -> [i32; 32] {
    core::array::from_fn(|e| {
        let nib = if e < 16 {
            x.qs[e] & 0x0f
        } else {
            x.qs[e - 16] >> 4
        };
        KVALUES_MXFP4[nib as usize] as i32
    })
}

/// The exact integer dot product of an MXFP4 block with a Q8_0 block.
#[inline]
pub fn mxfp4_block_sum(x: &BlockMXFP4, y: &BlockQ8_0) -> i32 {
    mxfp4_values(x)
        .iter()
        .zip(&y.qs)
        .map(|(&w, &a)| w * a as i32)
        .sum()
}

/// MXFP4 weights · Q8_0 activations in the order of ggml's repacked `mxfp4_8x8` gemv and
/// gemm (llama.cpp's path for MXFP4 matrices with a multiple of 8 rows, any batch): per
/// block `acc = fma(sum, D(e) * d_a, acc)`.
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_mxfp4_q8_0_repack(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_mxfp4_q8_0_repack: block counts");
    let mut acc = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let d = e8m0_to_f32_half(w.e) * f16_to_f32(a.d);
        acc = libm::fmaf(mxfp4_block_sum(w, a) as f32, d, acc);
    }
    acc
}

/// MXFP4 weights · Q8_0 activations in the order of the AVX2 branch of ggml's
/// `ggml_vec_dot_mxfp4_q8_0` (llama.cpp's path for MXFP4 matrices whose row count is not
/// a multiple of 8; see the module docs).
///
/// # Panics
/// If the rows hold different numbers of blocks.
pub fn vec_dot_mxfp4_q8_0_avx2(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_mxfp4_q8_0_avx2: block counts");
    let mut acc = [[0.0f32; 8]; 2];
    let pairs = x.len() / 2;
    for (i, (w, a)) in x.iter().zip(y).take(2 * pairs).enumerate() {
        let d = f16_to_f32(a.d) * e8m0_to_f32_half(w.e);
        let q = mxfp4_values(w);
        for (l, lane) in acc[i % 2].iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4).map(|e| q[e] * a.qs[e] as i32).sum();
            *lane = libm::fmaf(d, s as f32, *lane);
        }
    }
    let mut sum = hsum8(core::array::from_fn(|l| acc[0][l] + acc[1][l]));
    if let (Some(w), Some(a)) = (x.get(2 * pairs), y.get(2 * pairs)) {
        let d = f16_to_f32(a.d) * e8m0_to_f32_half(w.e);
        sum = libm::fmaf(d, mxfp4_block_sum(w, a) as f32, sum);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_row_q5_k, quantize_row_q8_k};
    use bytemuck::Zeroable;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> alloc::vec::Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The tiled Q5_K order reads the same codes, scales and mins as ggml's generic
    /// kernel: the two agree to float rounding on every length (the order itself is
    /// checked end to end against llama.cpp's logits, `engine/tests/families.rs`).
    #[test]
    fn q5_k_tiled_agrees_with_the_generic_kernel() {
        for (blocks, seed) in [(1usize, 3u32), (4, 7), (16, 11)] {
            let n = blocks * QK_K;
            let (w, a) = (values(n, seed), values(n, seed + 100));
            let mut wq = alloc::vec![BlockQ5K::zeroed(); blocks];
            let mut aq = alloc::vec![BlockQ8K::zeroed(); blocks];
            quantize_row_q5_k(&w, &mut wq);
            quantize_row_q8_k(&a, &mut aq);
            let got = vec_dot_q5_k_q8_k_tiled(&wq, &aq);
            let want = crate::dot::vec_dot(
                crate::types::GgmlType::Q5_K,
                bytemuck::cast_slice(&wq),
                bytemuck::cast_slice(&aq),
                n,
            )
            .expect("generic vec_dot");
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{blocks} blocks: tiled {got}, generic {want}"
            );
            assert_ne!(got, 0.0);
        }
    }

    /// The AMX order on hand-made blocks: per block the exact sum, one FMA each.
    #[test]
    fn amx_order_scales_each_block_sum_once() {
        let one = 0x3C00; // f16 1.0
        let half = 0x3800; // f16 0.5
        let q8 = |d: u16, q: i8| BlockQ8_0 { d, qs: [q; 32] };
        let w = [q8(one, 1), q8(half, -3)];
        let a = [q8(half, 2), q8(one, 1)];
        // Block 0: 64 * (1 * 0.5) = 32; block 1: -96 * (0.5 * 1) = -48.
        assert_eq!(vec_dot_q8_0_q8_0_amx(&w, &a), -16.0);
        // Q5_0: quants 17 - 16 = 1 (low nibble 1, high bit set) against 2s.
        let w5 = [BlockQ5_0 {
            d: one,
            qh: [0xff; 4],
            qs: [0x11; 16],
        }];
        assert_eq!(vec_dot_q5_0_q8_0_amx(&w5, &a[..1]), 32.0);
    }

    /// The AMX order and tinyBLAS's sum the same integers: they agree to float
    /// rounding on random rows.
    #[test]
    fn amx_order_agrees_with_tinyblas_to_rounding() {
        let n = 64 * 32;
        let (x, y) = (values(n, 5), values(n, 9));
        let mut w8 = alloc::vec![BlockQ8_0::zeroed(); n / 32];
        let mut w5 = alloc::vec![BlockQ5_0::zeroed(); n / 32];
        let mut a = alloc::vec![BlockQ8_0::zeroed(); n / 32];
        crate::quant::quantize_row_q8_0(&x, &mut w8);
        crate::quant::quantize_row_q5_0(&x, &mut w5);
        crate::quant::quantize_row_q8_0_act(&y, &mut a);
        for (amx, tiny) in [
            (
                vec_dot_q8_0_q8_0_amx(&w8, &a),
                vec_dot_q8_0_q8_0_tinyblas(&w8, &a),
            ),
            (
                vec_dot_q5_0_q8_0_amx(&w5, &a),
                vec_dot_q5_0_q8_0_tinyblas(&w5, &a),
            ),
        ] {
            assert!(
                (amx - tiny).abs() <= 1e-4 * tiny.abs().max(1.0),
                "{amx} vs {tiny}"
            );
        }
    }

    /// The K-quants' AMX order sums the same integers as llama.cpp's other orders for
    /// them (the repacked gemv order for Q4_K, the tiled order for Q6_K): the results
    /// agree to rounding; and on hand-made blocks (every quant 1, every activation 1) the
    /// integers are the block's scales and mins exactly.
    #[test]
    fn kquant_amx_order_agrees_with_the_other_orders_to_rounding() {
        let n = 8 * 256;
        let (x, y) = (values(n, 11), values(n, 13));
        let mut w4 = alloc::vec![BlockQ4K::zeroed(); n / 256];
        let mut w6 = alloc::vec![BlockQ6K::zeroed(); n / 256];
        let mut a = alloc::vec![BlockQ8K::zeroed(); n / 256];
        crate::quant::quantize_row_q4_k(&x, &mut w4);
        crate::quant::quantize_row_q6_k(&x, &mut w6);
        quantize_row_q8_k(&y, &mut a);
        for (amx, other) in [
            (
                vec_dot_q4_k_q8_k_amx(&w4, &a),
                vec_dot_q4_k_q8_k_repack(&w4, &a, Q4kPath::Gemv),
            ),
            (
                vec_dot_q6_k_q8_k_amx(&w6, &a),
                vec_dot_q6_k_q8_k_tiled(&w6, &a),
            ),
        ] {
            assert!(
                (amx - other).abs() <= 1e-4 * other.abs().max(1.0),
                "{amx} vs {other}"
            );
        }
        // Q6_K: quants 33 (value 1), scales 2, d = 1; activations 1 with d = 0.5: the
        // block's integer is 256 x 2 = 512, times d x d_a.
        let mut b6 = BlockQ6K::zeroed();
        b6.ql = [0x11; 128];
        b6.qh = [0xAA; 64];
        b6.scales = [2; 16];
        b6.d = 0x3c00;
        let mut one = BlockQ8K::zeroed();
        one.d = 0.5;
        one.qs = [1; 256];
        one.bsums = [16; 16];
        assert_eq!(vec_dot_q6_k_q8_k_amx(&[b6], &[one]), 256.0);
        // Q4_K: quants 1, scales 3 and mins 1 (sub-blocks 0-3 only: bytes 0-7 carry
        // sub-blocks 0-3's; 4-7 stay 0), d = 1, dmin = 1: s = 4 x 32 x 3 = 384, m = 4 x 32.
        let mut b4 = BlockQ4K::zeroed();
        b4.qs = [0x11; 128];
        b4.scales = [3, 3, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0];
        b4.d = 0x3c00;
        b4.dmin = 0x3c00;
        assert_eq!(vec_dot_q4_k_q8_k_amx(&[b4], &[one]), 0.5 * (384.0 - 128.0));
    }
}
