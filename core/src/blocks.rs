//! One `#[repr(C)]` plain-old-data struct per GGML block format, laid out byte for byte
//! as ggml writes it (`ggml-common.h`). Each has a compile-time size assert, so a layout
//! mistake fails the build rather than a test.
//!
//! Half-precision scales are kept as raw `u16` bit patterns (`half::f16::from_bits`
//! reads them) so that every block has an alignment of at most 2 and can be viewed
//! directly inside a 32-byte aligned GGUF tensor.

use bytemuck::{Pod, Zeroable};

use crate::types::QK_K;

macro_rules! block {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
        #[repr(C)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
    };
}

/// Elements per block of the legacy formats.
pub const QK4_0: usize = 32;
/// Elements per block of Q8_0 / Q8_1.
pub const QK8_0: usize = 32;

block!(
    /// Q4_0: 32 weights `d * (q - 8)`, q in 0..16; low nibbles are elements 0..16.
    BlockQ4_0, 18, { pub d: u16, pub qs: [u8; QK4_0 / 2] });
block!(
    /// Q4_1: 32 weights `d * q + m`.
    BlockQ4_1, 20, { pub d: u16, pub m: u16, pub qs: [u8; QK4_0 / 2] });
block!(
    /// Q5_0: 32 weights `d * (q - 16)`, q 5 bits: nibble plus one bit from `qh`.
    BlockQ5_0, 22, { pub d: u16, pub qh: [u8; 4], pub qs: [u8; QK4_0 / 2] });
block!(
    /// Q5_1: 32 weights `d * q + m`, q 5 bits.
    BlockQ5_1, 24, { pub d: u16, pub m: u16, pub qh: [u8; 4], pub qs: [u8; QK4_0 / 2] });
block!(
    /// Q8_0: 32 weights `d * q`, q an i8.
    BlockQ8_0, 34, { pub d: u16, pub qs: [i8; QK8_0] });
block!(
    /// Q8_1: Q8_0 plus `s = d * sum(q)`, the activation pair of Q4_1 / Q5_1.
    BlockQ8_1, 36, { pub d: u16, pub s: u16, pub qs: [i8; QK8_0] });
block!(
    /// Q2_K: 16 sub-blocks of 16, 4-bit scale and min per sub-block, 2-bit quants.
    BlockQ2K, 84, { pub scales: [u8; QK_K / 16], pub qs: [u8; QK_K / 4], pub d: u16, pub dmin: u16 });
block!(
    /// Q3_K: 16 sub-blocks of 16, 6-bit scales packed in 12 bytes, 3-bit quants (2 low
    /// bits in `qs`, the high bit in `hmask`).
    BlockQ3K, 110, { pub hmask: [u8; QK_K / 8], pub qs: [u8; QK_K / 4], pub scales: [u8; 12], pub d: u16 });
block!(
    /// Q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes, 4-bit quants.
    BlockQ4K, 144, { pub d: u16, pub dmin: u16, pub scales: [u8; 12], pub qs: [u8; QK_K / 2] });
block!(
    /// Q5_K: Q4_K plus a fifth bit per weight in `qh`.
    BlockQ5K, 176, { pub d: u16, pub dmin: u16, pub scales: [u8; 12], pub qh: [u8; QK_K / 8], pub qs: [u8; QK_K / 2] });
block!(
    /// Q6_K: 16 sub-blocks of 16, i8 scales, 6-bit quants (4 low bits in `ql`, 2 high in `qh`).
    BlockQ6K, 210, { pub ql: [u8; QK_K / 2], pub qh: [u8; QK_K / 4], pub scales: [i8; QK_K / 16], pub d: u16 });
block!(
    /// Q8_K: the activation format of the K-quant and IQ dot products: f32 scale, i8
    /// quants and the sums of each group of 16 quants (`bsums`).
    BlockQ8K, 292, { pub d: f32, pub qs: [i8; QK_K], pub bsums: [i16; QK_K / 16] });
block!(
    /// IQ2_XXS: 2.0625 bpw, grid indices and signs packed in u16 pairs.
    BlockIQ2XXS, 66, { pub d: u16, pub qs: [u16; QK_K / 8] });
block!(
    /// IQ2_XS: 2.3125 bpw.
    BlockIQ2XS, 74, { pub d: u16, pub qs: [u16; QK_K / 8], pub scales: [u8; QK_K / 32] });
block!(
    /// IQ2_S: 2.5625 bpw.
    BlockIQ2S, 82, { pub d: u16, pub qs: [u8; QK_K / 4], pub qh: [u8; QK_K / 32], pub scales: [u8; QK_K / 32] });
block!(
    /// IQ3_XXS: 3.0625 bpw.
    BlockIQ3XXS, 98, { pub d: u16, pub qs: [u8; 3 * QK_K / 8] });
block!(
    /// IQ3_S: 3.4375 bpw.
    BlockIQ3S, 110, { pub d: u16, pub qs: [u8; QK_K / 4], pub qh: [u8; QK_K / 32], pub signs: [u8; QK_K / 8], pub scales: [u8; QK_K / 64] });
block!(
    /// IQ1_S: 1.5625 bpw.
    BlockIQ1S, 50, { pub d: u16, pub qs: [u8; QK_K / 8], pub qh: [u16; QK_K / 32] });
block!(
    /// IQ1_M: 1.75 bpw; the super-block scale is spread over the top nibbles of `scales`.
    BlockIQ1M, 56, { pub qs: [u8; QK_K / 8], pub qh: [u8; QK_K / 16], pub scales: [u8; QK_K / 32] });
block!(
    /// IQ4_NL: 32 weights, 4-bit indices into a non-linear table.
    BlockIQ4NL, 18, { pub d: u16, pub qs: [u8; QK4_0 / 2] });
block!(
    /// IQ4_XS: IQ4_NL's table on 256-weight super-blocks with 6-bit sub-block scales.
    BlockIQ4XS, 136, { pub d: u16, pub scales_h: u16, pub scales_l: [u8; QK_K / 64], pub qs: [u8; QK_K / 2] });
block!(
    /// TQ1_0: ternary, 1.6875 bpw (five trits per byte in `qs`, four in `qh`).
    BlockTQ1_0, 54, { pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5], pub qh: [u8; QK_K / 64], pub d: u16 });
block!(
    /// TQ2_0: ternary, 2.0625 bpw (2 bits per weight).
    BlockTQ2_0, 66, { pub qs: [u8; QK_K / 4], pub d: u16 });
block!(
    /// MXFP4: 32 FP4 (E2M1) weights sharing one E8M0 exponent.
    BlockMXFP4, 17, { pub e: u8, pub qs: [u8; QK4_0 / 2] });
