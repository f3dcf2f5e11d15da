//! Dot products of the 32-element formats with their Q8_0 / Q8_1 activations, following
//! ggml's generic kernels: per block an `i32` sum of integer products, then one float
//! multiply-add per block into an `f32` total.

use crate::blocks::{
    BlockIQ4NL, BlockMXFP4, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1,
};
use crate::dequant::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};

use crate::dequant::f16_to_f32;

pub(crate) fn q4_0(pairs: impl Iterator<Item = (BlockQ4_0, BlockQ8_0)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sumi = 0i32;
        for j in 0..16 {
            let v0 = (x.qs[j] & 0x0f) as i32 - 8;
            let v1 = (x.qs[j] >> 4) as i32 - 8;
            sumi += v0 * y.qs[j] as i32 + v1 * y.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
    }
    sumf
}

pub(crate) fn q4_1(pairs: impl Iterator<Item = (BlockQ4_1, BlockQ8_1)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (x.qs[j] & 0x0f) as i32 * y.qs[j] as i32
                + (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        // The min term uses the activation's stored `s = d * sum(q)`.
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}

/// The 5-bit value `j` (0..32) of a Q5 block: nibble plus the high bit from `qh`.
#[inline]
fn q5_value(qs: &[u8; 16], qh: u32, j: usize) -> i32 {
    let nib = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    (nib as i32) | ((((qh >> j) & 1) as i32) << 4)
}

pub(crate) fn q5_0(pairs: impl Iterator<Item = (BlockQ5_0, BlockQ8_0)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let qh = u32::from_le_bytes(x.qh);
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += (q5_value(&x.qs, qh, j) - 16) * y.qs[j] as i32;
        }
        sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
    }
    sumf
}

pub(crate) fn q5_1(pairs: impl Iterator<Item = (BlockQ5_1, BlockQ8_1)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let qh = u32::from_le_bytes(x.qh);
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += q5_value(&x.qs, qh, j) * y.qs[j] as i32;
        }
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}

pub(crate) fn q8_0(pairs: impl Iterator<Item = (BlockQ8_0, BlockQ8_0)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += x.qs[j] as i32 * y.qs[j] as i32;
        }
        sumf += sumi as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sumf
}

/// Shared by IQ4_NL and MXFP4: 32 four-bit codes looked up in an integer code book.
#[inline]
fn codebook_sum(qs: &[u8; 16], book: &[i8; 16], y: &[i8; 32]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += y[j] as i32 * book[(qs[j] & 0x0f) as usize] as i32
            + y[j + 16] as i32 * book[(qs[j] >> 4) as usize] as i32;
    }
    s
}

pub(crate) fn iq4_nl(pairs: impl Iterator<Item = (BlockIQ4NL, BlockQ8_0)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        let d = f16_to_f32(y.d) * f16_to_f32(x.d);
        sumf += d * codebook_sum(&x.qs, &KVALUES_IQ4NL, &y.qs) as f32;
    }
    sumf
}

pub(crate) fn mxfp4(pairs: impl Iterator<Item = (BlockMXFP4, BlockQ8_0)>) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in pairs {
        // The code book is doubled to be integral, so the E8M0 scale is halved.
        let d = f16_to_f32(y.d) * e8m0_to_f32_half(x.e);
        sumf += d * codebook_sum(&x.qs, &KVALUES_MXFP4, &y.qs) as f32;
    }
    sumf
}
