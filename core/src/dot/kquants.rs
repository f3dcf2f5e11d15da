//! Dot products of the 256-element K-quant formats (and TQ1_0, TQ2_0, IQ4_XS) with Q8_K
//! activations, following ggml's generic kernels, including where they accumulate:
//! Q3_K..Q6_K keep eight `f32` lane sums across blocks (lane `l` collects element `l`
//! of every group of eight) and add them up at the end; the others add one `f32` per
//! block (or sub-block, IQ4_XS). Within a block everything is integer.

use crate::blocks::{BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::blocks::{BlockTQ1_0, BlockTQ2_0};
use crate::dequant::KVALUES_IQ4NL;
use crate::types::QK_K;

use crate::dequant::f16_to_f32;

/// The eight 6-bit scales and mins of a Q4_K / Q5_K block from their 12-byte packing.
pub(super) fn scale_min_k4(s: &[u8; 12]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = (s[j] & 63) as i32;
            mn[j] = (s[j + 4] & 63) as i32;
        } else {
            sc[j] = ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4)) as i32;
            mn[j] = ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32;
        }
    }
    (sc, mn)
}

/// The sixteen 6-bit scales of a Q3_K block, already offset by -32.
fn q3k_scales(s: &[u8; 12]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for i in 0..16 {
        let (group, j) = (i / 4, i % 4);
        let low = match group {
            0 => s[j] & 0x0f,
            1 => s[4 + j] & 0x0f,
            2 => s[j] >> 4,
            _ => s[4 + j] >> 4,
        };
        let high = (s[8 + j] >> (2 * group)) & 3;
        out[i] = (low | (high << 4)) as i32 - 32;
    }
    out
}

/// `lanes[l] += d * sum over groups g of scale(g) * a[8g + l] * q8[8g + l]`: the
/// per-block step of ggml's lane-accumulating kernels, with `scale` per 8-element group.
#[inline]
fn lane_block(
    a: &[i32; QK_K],
    q8: &[i8; QK_K],
    scale: impl Fn(usize) -> i32,
    d: f32,
    lanes: &mut [f32; 8],
) {
    let mut aux = [0i32; 8];
    for g in 0..QK_K / 8 {
        let s = scale(g);
        for l in 0..8 {
            aux[l] += s * (q8[8 * g + l] as i32 * a[8 * g + l]);
        }
    }
    for l in 0..8 {
        lanes[l] += d * aux[l] as f32;
    }
}

pub(crate) fn q2_k(pairs: impl Iterator<Item = (BlockQ2K, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut summs = 0i32;
        for j in 0..16 {
            summs += y.bsums[j] as i32 * (x.scales[j] >> 4) as i32;
        }
        let dall = y.d * f16_to_f32(x.d);
        let dmin = y.d * f16_to_f32(x.dmin);
        let mut isum = 0i32;
        for e0 in (0..QK_K).step_by(16) {
            // Element e = 128k + 32j + l holds bits 2j of qs[32k + l].
            let mut s = 0i32;
            for e in e0..e0 + 16 {
                let (k, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = (x.qs[32 * k + l] >> (2 * j)) & 3;
                s += y.qs[e] as i32 * q as i32;
            }
            isum += (x.scales[e0 / 16] & 0x0f) as i32 * s;
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(crate) fn q3_k(pairs: impl Iterator<Item = (BlockQ3K, BlockQ8K)>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (x, y) in pairs {
        let mut a = [0i32; QK_K];
        for (e, v) in a.iter_mut().enumerate() {
            // Element e = 128j + 32s + l: bits 2s of qs[32j + l], high bit (4j + s) of
            // hmask[l]; a clear high bit subtracts 4.
            let (j, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = ((x.qs[32 * j + l] >> (2 * s)) & 3) as i32;
            let hi = x.hmask[l] & (1 << (4 * j + s)) != 0;
            *v = low - if hi { 0 } else { 4 };
        }
        let sc = q3k_scales(&x.scales);
        lane_block(&a, &y.qs, |g| sc[g / 2], f16_to_f32(x.d) * y.d, &mut lanes);
    }
    lanes.iter().fold(0.0f32, |s, &v| s + v)
}

/// Q4_K and Q5_K share everything but the fifth bit.
fn q45_k(
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    a: &[i32; QK_K],
    y: &BlockQ8K,
    lanes: &mut [f32; 8],
    sumf: &mut f32,
) {
    let (sc, mn) = scale_min_k4(scales);
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += y.bsums[j] as i32 * mn[j / 2];
    }
    lane_block(a, &y.qs, |g| sc[g / 4], f16_to_f32(d) * y.d, lanes);
    *sumf -= f16_to_f32(dmin) * y.d * sumi as f32;
}

pub(crate) fn q4_k(pairs: impl Iterator<Item = (BlockQ4K, BlockQ8K)>) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut a = [0i32; QK_K];
        for (e, v) in a.iter_mut().enumerate() {
            // Element e = 64j + l: low nibble of qs[32j + l]; 64j + 32 + l: high nibble.
            let (j, h, l) = (e / 64, (e % 64) / 32, e % 32);
            *v = ((x.qs[32 * j + l] >> (4 * h)) & 0x0f) as i32;
        }
        q45_k(x.d, x.dmin, &x.scales, &a, &y, &mut lanes, &mut sumf);
    }
    lanes.iter().fold(sumf, |s, &v| s + v)
}

pub(crate) fn q5_k(pairs: impl Iterator<Item = (BlockQ5K, BlockQ8K)>) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut a = [0i32; QK_K];
        for (e, v) in a.iter_mut().enumerate() {
            let (j, h, l) = (e / 64, (e % 64) / 32, e % 32);
            let low = ((x.qs[32 * j + l] >> (4 * h)) & 0x0f) as i32;
            let hi = x.qh[l] & (1 << (2 * j + h)) != 0;
            *v = low + if hi { 16 } else { 0 };
        }
        q45_k(x.d, x.dmin, &x.scales, &a, &y, &mut lanes, &mut sumf);
    }
    lanes.iter().fold(sumf, |s, &v| s + v)
}

pub(crate) fn q6_k(pairs: impl Iterator<Item = (BlockQ6K, BlockQ8K)>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (x, y) in pairs {
        let mut a = [0i32; QK_K];
        for (e, v) in a.iter_mut().enumerate() {
            // Element e = 128c + 32r + l, r in 0..4: low nibble (r < 2) or high nibble
            // (r >= 2) of ql[64c + 32(r % 2) + l], top two bits (2r) of qh[32c + l].
            let (c, r, l) = (e / 128, (e % 128) / 32, e % 32);
            let lo = (x.ql[64 * c + 32 * (r % 2) + l] >> (4 * (r / 2))) & 0x0f;
            let hi = (x.qh[32 * c + l] >> (2 * r)) & 3;
            *v = (lo | (hi << 4)) as i32 - 32;
        }
        lane_block(
            &a,
            &y.qs,
            |g| x.scales[g / 2] as i32,
            f16_to_f32(x.d) * y.d,
            &mut lanes,
        );
    }
    lanes.iter().fold(0.0f32, |s, &v| s + v)
}

/// Trit `l` (0..5) of a TQ1_0 byte: the byte is a base-3 fixed-point fraction, so
/// multiplying by 3^l (mod 256) and taking the top of `3 * q` extracts digit `l`.
#[inline]
fn trit(byte: u8, l: u32) -> i32 {
    let q = byte.wrapping_mul(3u8.pow(l));
    (((q as u16) * 3) >> 8) as i32 - 1
}

pub(crate) fn tq1_0(pairs: impl Iterator<Item = (BlockTQ1_0, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sum = 0i32;
        // qs[0..32]: five trits each, activations in rows of 32.
        for l in 0..5 {
            for m in 0..32 {
                sum += trit(x.qs[m], l) * y.qs[l as usize * 32 + m] as i32;
            }
        }
        // qs[32..48]: five trits each, rows of 16 after the first 160.
        for l in 0..5 {
            for m in 0..16 {
                sum += trit(x.qs[32 + m], l) * y.qs[160 + l as usize * 16 + m] as i32;
            }
        }
        // qh[0..4]: four trits each, the last 16 activations.
        for l in 0..4 {
            for j in 0..4 {
                sum += trit(x.qh[j], l) * y.qs[240 + l as usize * 4 + j] as i32;
            }
        }
        sumf += sum as f32 * (f16_to_f32(x.d) * y.d);
    }
    sumf
}

pub(crate) fn tq2_0(pairs: impl Iterator<Item = (BlockTQ2_0, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sumi = 0i32;
        for j in (0..64).step_by(32) {
            for l in 0..4 {
                for k in 0..32 {
                    let q = ((x.qs[j + k] >> (2 * l)) & 3) as i32 - 1;
                    sumi += y.qs[j * 4 + l * 32 + k] as i32 * q;
                }
            }
        }
        sumf += sumi as f32 * (y.d * f16_to_f32(x.d));
    }
    sumf
}

pub(crate) fn iq4_xs(pairs: impl Iterator<Item = (BlockIQ4XS, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d4d8 = f16_to_f32(x.d) * y.d;
        for ib in 0..8 {
            // 6-bit sub-block scale: low nibble from scales_l, two high bits from scales_h.
            let low = (x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let high = ((x.scales_h >> (2 * ib)) & 3) as u8;
            let d = d4d8 * ((low | (high << 4)) as i32 - 32) as f32;
            let qs = &x.qs[16 * ib..16 * ib + 16];
            let q8 = &y.qs[32 * ib..32 * ib + 32];
            let mut s1 = 0i32;
            let mut s2 = 0i32;
            for j in 0..16 {
                s1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as i32;
                s2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += d * (s1 + s2) as f32;
        }
    }
    sumf
}
