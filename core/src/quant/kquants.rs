//! Reference quantizers for the K-quant weight formats Q4_K, Q5_K and Q6_K, following
//! ggml's `quantize_row_q{4,5,6}_K_ref` (no importance weights) step for step in f32.
//!
//! These are what Flint uses to write model files. The `gguf` package has no K-quant
//! quantizer, so the golden tests compare against ggml's C reference itself, compiled
//! without FMA contraction (`tools/golden/kquant_ref.c`): the bytes are identical. A
//! llama.cpp build that contracts `a * b + c` into FMAs may differ in rare last bits; the
//! proptests bound the error independently (see docs/formats.md).

use super::{f32_to_f16, nearest_int};
use crate::blocks::{BlockQ4K, BlockQ5K, BlockQ6K};
use crate::dequant::f16_to_f32;
use crate::types::QK_K;

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this are all-zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Correctly rounded square root of a non-negative f32 (C's `sqrtf`), which `core`
/// lacks without `std`. Newton's method in f64 gets within an ulp; the final step picks
/// the correctly rounded neighbour by squaring the midpoints exactly in f64 (a 25-bit
/// significand squared fits in 53 bits).
pub(crate) fn sqrt_f32(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 || x.is_infinite() {
        return x;
    }
    let xd = x as f64;
    // Start from a power of two near the root, then Newton-iterate.
    let e = ((xd.to_bits() >> 52) as i64 - 1023) / 2;
    let mut y = f64::from_bits(((e + 1023) as u64) << 52);
    for _ in 0..8 {
        y = 0.5 * (y + xd / y);
    }
    let mut r = y as f32;
    loop {
        let up = f32::from_bits(r.to_bits() + 1);
        let mid = (r as f64 + up as f64) * 0.5;
        if mid * mid < xd {
            r = up;
            continue;
        }
        let down = f32::from_bits(r.to_bits() - 1);
        let mid = (r as f64 + down as f64) * 0.5;
        if mid * mid > xd {
            r = down;
            continue;
        }
        return r;
    }
}

/// ggml `make_qkx2_quants`: fits `x ≈ scale * L + min` (min ≤ 0) with `L` in
/// `0..=nmax`, minimising the weighted squared error over a small search of scales.
/// Returns `(scale, -min)` and writes the levels to `l`.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, lf) = (weights[i], q as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `make_qx_quants` with `rmse_type = 1` and no importance weights: a symmetric
/// fit `x ≈ scale * (L - nmax)`, `L` in `0..2 nmax`, weighted by `x²`, trying 19 scales.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = quant(iscale, v);
        l[i] = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = quant(iscale, v);
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l[i] = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The shared first half of Q4_K / Q5_K: per sub-block of 32, an asymmetric fit with
/// `nmax` levels, then the 6-bit scales and mins quantized against the super-block
/// maxima and packed as `BlockQ4K::scales`. Returns `(d, dmin, packed scales, levels)`.
fn quantize_k_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = sqrt_f32(sum_x2 / 32.0);
        let weights: [f32; 32] = core::array::from_fn(|l| av_x + xs[l].abs());
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // ggml stores the rounded value in a uint8_t before clamping; keep that wrap.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    // Re-quantize every element against the scales as they will be decoded.
    let (sc, mn) = crate::dequant::k4_scale_min(&packed);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let dl = df * sc[j] as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = dminf * mn[j] as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + ml) / dl).clamp(0, nmax);
            levels[32 * j + ii] = q as u8;
        }
    }
    (d, dmin, packed, levels)
}

/// Quantizes a row to Q4_K (ggml `quantize_row_q4_K_ref`).
///
/// # Panics
/// When `x.len() != out.len() * 256` (a caller bug).
pub fn quantize_row_q4_k(x: &[f32], out: &mut [BlockQ4K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q4_k: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (d, dmin, scales, l) = quantize_k_scales(xb, 15, -1.0, 20);
        y.d = d;
        y.dmin = dmin;
        y.scales = scales;
        for c in 0..4 {
            for m in 0..32 {
                y.qs[32 * c + m] = l[64 * c + m] | (l[64 * c + 32 + m] << 4);
            }
        }
    }
}

/// Quantizes a row to Q5_K (ggml `quantize_row_q5_K_ref`).
///
/// # Panics
/// When `x.len() != out.len() * 256` (a caller bug).
pub fn quantize_row_q5_k(x: &[f32], out: &mut [BlockQ5K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q5_k: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (d, dmin, scales, l) = quantize_k_scales(xb, 31, -0.5, 15);
        y.d = d;
        y.dmin = dmin;
        y.scales = scales;
        y.qh = [0; QK_K / 8];
        for c in 0..4 {
            for m in 0..32 {
                let (l1, l2) = (l[64 * c + m], l[64 * c + 32 + m]);
                y.qh[m] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                y.qs[32 * c + m] = (l1 & 0x0f) | ((l2 & 0x0f) << 4);
            }
        }
    }
}

/// Quantizes a row to Q6_K (ggml `quantize_row_q6_K_ref`).
///
/// # Panics
/// When `x.len() != out.len() * 256` (a caller bug).
pub fn quantize_row_q6_k(x: &[f32], out: &mut [BlockQ6K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q6_k: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let s = make_qx_quants(
                32,
                &xb[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
            );
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *y = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        y.d = f32_to_f16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            y.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        let d = f16_to_f32(y.d);
        for j in 0..QK_K / 16 {
            let dl = d * y.scales[j] as f32;
            if dl == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / dl).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        for half in 0..2 {
            let (lb, ql, qh) = (
                &l[128 * half..],
                &mut y.ql[64 * half..],
                &mut y.qh[32 * half..],
            );
            for m in 0..32 {
                let q = [
                    lb[m] as u8,
                    lb[m + 32] as u8,
                    lb[m + 64] as u8,
                    lb[m + 96] as u8,
                ];
                ql[m] = (q[0] & 0x0f) | ((q[2] & 0x0f) << 4);
                ql[m + 32] = (q[1] & 0x0f) | ((q[3] & 0x0f) << 4);
                qh[m] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqrt_is_correctly_rounded() {
        for &x in &[1.0f32, 2.0, 0.25, 3.0, 1e-30, 7e30, 1e-40, 123_456.79] {
            let r = sqrt_f32(x);
            let rd = (x as f64).sqrt();
            // r must be the f32 nearest to the exact root.
            let up = f32::from_bits(r.to_bits() + 1) as f64;
            let down = f32::from_bits(r.to_bits() - 1) as f64;
            assert!((r as f64 - rd).abs() <= (up - rd).abs(), "{x}");
            assert!((r as f64 - rd).abs() <= (down - rd).abs(), "{x}");
        }
        assert_eq!(sqrt_f32(4.0), 2.0);
        assert_eq!(sqrt_f32(0.0), 0.0);
    }
}
