//! Dot products of the lattice (IQ1/IQ2/IQ3) formats with Q8_K activations, following
//! ggml's generic kernels: integer sums per 32-element sub-block, weighted by the odd
//! sub-block scale `2s + 1`, one `f32` multiply-add per block, and the format's constant
//! factor (1/8 for IQ2, 1/4 for IQ3_XXS) applied once to the total.

use crate::blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockQ8K,
};
use crate::dequant::KSIGNS_IQ2XS;
use crate::types::QK_K;

use crate::dequant::f16_to_f32;
use crate::dequant::grids as g;

/// Expands one of the dequantizer's packed grids (component indices, `bits` each, into
/// a set of small integral values) into one `i8` per component, at compile time: ggml's
/// byte layout, so the kernels stay in integers.
const fn expand<const N: usize, const C: usize, const V: usize>(
    packed: &[u16; N],
    values: &[f32; V],
    bits: u32,
) -> [[i8; C]; N] {
    let mut out = [[0i8; C]; N];
    let mask = (1u16 << bits) - 1;
    let mut i = 0;
    while i < N {
        let mut c = 0;
        while c < C {
            out[i][c] = values[((packed[i] >> (bits * c as u32)) & mask) as usize] as i8;
            c += 1;
        }
        i += 1;
    }
    out
}

static IQ2XXS_GRID: [[i8; 8]; 256] = expand(&g::IQ2XXS_GRID, &g::IQ2XXS_VALUES, 2);
static IQ2XS_GRID: [[i8; 8]; 512] = expand(&g::IQ2XS_GRID, &g::IQ2XS_VALUES, 2);
static IQ2S_GRID: [[i8; 8]; 1024] = expand(&g::IQ2S_GRID, &g::IQ2S_VALUES, 2);
static IQ3XXS_GRID: [[i8; 4]; 256] = expand(&g::IQ3XXS_GRID, &g::IQ3XXS_VALUES, 3);
static IQ3S_GRID: [[i8; 4]; 512] = expand(&g::IQ3S_GRID, &g::IQ3S_VALUES, 3);
static IQ1S_GRID: [[i8; 8]; 2048] = expand(&g::IQ1S_GRID, &g::IQ1S_VALUES, 2);

/// `sum_j grid[j] * q8[j] * sign_j` with bit `j` of `signs` set meaning negative.
#[inline]
fn signed8(grid: &[i8], q8: &[i8], signs: u8) -> i32 {
    let mut s = 0i32;
    for j in 0..grid.len() {
        let v = grid[j] as i32 * q8[j] as i32;
        s += if signs & (1 << j) != 0 { -v } else { v };
    }
    s
}

pub(crate) fn iq2_xxs(pairs: impl Iterator<Item = (BlockIQ2XXS, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(x.d) * y.d;
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            // Four u16 = two u32: the first holds four grid indices (one per byte), the
            // second four 7-bit sign indices and the 4-bit scale on top.
            let a0 = x.qs[4 * ib] as u32 | (x.qs[4 * ib + 1] as u32) << 16;
            let a1 = x.qs[4 * ib + 2] as u32 | (x.qs[4 * ib + 3] as u32) << 16;
            let ls = 2 * (a1 >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let grid = &IQ2XXS_GRID[((a0 >> (8 * l)) & 0xff) as usize];
                let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                sumi += signed8(grid, &y.qs[32 * ib + 8 * l..][..8], signs);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(crate) fn iq2_xs(pairs: impl Iterator<Item = (BlockIQ2XS, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(x.d) * y.d;
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let ls = [
                2 * (x.scales[ib] & 0x0f) as i32 + 1,
                2 * (x.scales[ib] >> 4) as i32 + 1,
            ];
            for half in 0..2 {
                let mut sumi = 0i32;
                for l in 2 * half..2 * half + 2 {
                    let q = x.qs[4 * ib + l];
                    let grid = &IQ2XS_GRID[(q & 511) as usize];
                    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                    sumi += signed8(grid, &y.qs[32 * ib + 8 * l..][..8], signs);
                }
                bsum += sumi * ls[half];
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(crate) fn iq2_s(pairs: impl Iterator<Item = (BlockIQ2S, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(x.d) * y.d;
        // qs: 32 low index bytes, then 32 sign bytes.
        let (qs, signs) = x.qs.split_at(QK_K / 8);
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let ls1 = 1 + 2 * (x.scales[ib] & 0x0f) as i32;
            let ls2 = 1 + 2 * (x.scales[ib] >> 4) as i32;
            let mut s = [0i32; 2];
            for l in 0..4 {
                // Two more index bits per group from qh.
                let idx = qs[4 * ib + l] as usize | (((x.qh[ib] as usize) << (8 - 2 * l)) & 0x300);
                s[l / 2] += signed8(
                    &IQ2S_GRID[idx],
                    &y.qs[32 * ib + 8 * l..][..8],
                    signs[4 * ib + l],
                );
            }
            bsum += ls1 * s[0] + ls2 * s[1];
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(crate) fn iq3_xxs(pairs: impl Iterator<Item = (BlockIQ3XXS, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(x.d) * y.d;
        // qs: 64 grid index bytes, then one u32 per sub-block of signs and scale.
        let (q3, gas) = x.qs.split_at(QK_K / 4);
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let aux = u32::from_le_bytes([
                gas[4 * ib],
                gas[4 * ib + 1],
                gas[4 * ib + 2],
                gas[4 * ib + 3],
            ]);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let g1 = &IQ3XXS_GRID[q3[8 * ib + 2 * l] as usize];
                let g2 = &IQ3XXS_GRID[q3[8 * ib + 2 * l + 1] as usize];
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let q8 = &y.qs[32 * ib + 8 * l..][..8];
                sumi += signed8(g1, &q8[..4], signs) + signed8(g2, &q8[4..], signs >> 4);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

pub(crate) fn iq3_s(pairs: impl Iterator<Item = (BlockIQ3S, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(x.d) * y.d;
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let ls = 2 * ((x.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32 + 1;
            let qh = x.qh[ib] as usize;
            let mut sumi = 0i32;
            for l in 0..4 {
                // A ninth index bit per grid entry from qh.
                let i1 = x.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
                let i2 = x.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
                let signs = x.signs[4 * ib + l];
                let q8 = &y.qs[32 * ib + 8 * l..][..8];
                sumi += signed8(&IQ3S_GRID[i1], &q8[..4], signs)
                    + signed8(&IQ3S_GRID[i2], &q8[4..], signs >> 4);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    sumf
}

/// The integer sum of a grid row with eight activations (IQ1 grids hold -1, 0, 1).
#[inline]
fn plain8(grid: &[i8; 8], q8: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..8 {
        s += q8[j] as i32 * grid[j] as i32;
    }
    s
}

/// Offset IQ1_S and IQ1_M add to every grid value, with a sign per group.
const IQ1_DELTA: f32 = 0.125;

pub(crate) fn iq1_s(pairs: impl Iterator<Item = (BlockIQ1S, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sumi = 0i32;
        let mut sumi1 = 0i32;
        for ib in 0..QK_K / 32 {
            let qh = x.qh[ib] as usize;
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                let idx = x.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8);
                lsum += plain8(&IQ1S_GRID[idx], &y.qs[32 * ib + 8 * l..]);
            }
            sumi += ls * lsum;
            // The delta term only needs the activation sums, which Q8_K carries.
            sumi1 += ls * delta * (y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32);
        }
        sumf += f16_to_f32(x.d) * y.d * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

pub(crate) fn iq1_m(pairs: impl Iterator<Item = (BlockIQ1M, BlockQ8K)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let sc = [
            u16::from_le_bytes([x.scales[0], x.scales[1]]),
            u16::from_le_bytes([x.scales[2], x.scales[3]]),
            u16::from_le_bytes([x.scales[4], x.scales[5]]),
            u16::from_le_bytes([x.scales[6], x.scales[7]]),
        ];
        // The f16 super-block scale is spread over the top nibbles of the four u16.
        let scale =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for ib in 0..QK_K / 32 {
            let qh = &x.qh[2 * ib..2 * ib + 2];
            let delta = [
                if qh[0] & 0x08 != 0 { -1 } else { 1 },
                if qh[0] & 0x80 != 0 { -1 } else { 1 },
                if qh[1] & 0x08 != 0 { -1 } else { 1 },
                if qh[1] & 0x80 != 0 { -1 } else { 1 },
            ];
            let mut sum1 = [0i32; 2];
            let mut sum2 = [0i32; 2];
            for l in 0..4 {
                let idx = x.qs[4 * ib + l] as usize
                    | (((qh[l / 2] as usize) << (8 - 4 * (l % 2))) & 0x700);
                let q8 = &y.qs[32 * ib + 8 * l..][..8];
                sum1[l / 2] += plain8(&IQ1S_GRID[idx], q8);
                sum2[l / 2] += q8.iter().map(|&v| v as i32).sum::<i32>() * delta[l];
            }
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let ls1 = 2 * (s & 7) as i32 + 1;
            let ls2 = 2 * ((s >> 3) & 7) as i32 + 1;
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += f16_to_f32(scale) * y.d * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few entries checked against ggml-common.h's `iq*_grid` literals (byte `j` of the
    /// u64/u32 is component `j`).
    #[test]
    fn grids_match_ggml_literals() {
        let b8 = |v: u64| v.to_le_bytes().map(|b| b as i8);
        let b4 = |v: u32| v.to_le_bytes().map(|b| b as i8);
        assert_eq!(IQ2XXS_GRID[1], b8(0x080808080808082b));
        assert_eq!(IQ2XXS_GRID[252], b8(0x2b2b082b08080808));
        assert_eq!(IQ2XXS_GRID[255], b8(0x2b2b2b1908081908));
        assert_eq!(IQ2XS_GRID[7], b8(0x080808080819192b));
        assert_eq!(IQ3S_GRID[3], b4(0x0101010b));
        assert_eq!(IQ1S_GRID[0], b8(0xffffffffffffffff));
        assert_eq!(IQ1S_GRID[1], b8(0xffffffffffffff01));
    }
}
