//! Dequantization of every GGUF weight format that llama.cpp's `gguf` Python package
//! dequantizes, bit-exact with it.
//!
//! "Bit-exact" means the same f32 bit patterns as `gguf.quants.dequantize`. That
//! package is numpy code, and numpy evaluates every expression one operation at a time
//! in f32 (no fused multiply-add, left to right), so each formula below keeps the
//! package's grouping: for example Q4_K computes `(d * sc)` and `(dmin * m)` first, then
//! `(d * sc) * q - (dmin * m)` as a product followed by a subtraction. Reordering any of
//! these would change the last bit of some outputs; the golden-vector tests catch that.
//!
//! Blocks are read from byte slices with `bytemuck::pod_read_unaligned`, so a tensor
//! can start at any address; malformed input (any byte pattern) never panics, it only
//! decodes to whatever those bits mean.

pub mod grids;

use bytemuck::Pod;

use crate::blocks::*;
use crate::types::{FormatError, GgmlType, QK_K};

use grids::*;

/// IEEE half bits → f32, exact, as numpy's `astype(np.float32)` does it: a NaN keeps
/// its payload (shifted up 13 bits) and is not made quiet, unlike `half`'s software
/// path and the F16C instruction. Every other value widens exactly.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    if bits & 0x7c00 == 0x7c00 && bits & 0x03ff != 0 {
        let sign = ((bits & 0x8000) as u32) << 16;
        return f32::from_bits(sign | 0x7f80_0000 | (((bits & 0x03ff) as u32) << 13));
    }
    half::f16::from_bits(bits).to_f32()
}

/// The non-linear 4-bit code book shared by IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The FP4 (E2M1) code book of MXFP4, doubled so that it is integral; the block scale is
/// halved to compensate (see [`e8m0_to_f32_half`]).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Sign patterns of the IQ2/IQ3 formats: a 7-bit index selects eight signs (bit `j` set
/// means component `j` is negative); the eighth sign is implied, chosen so that the
/// number of negative signs is even.
pub const KSIGNS_IQ2XS: [u8; 128] = ksigns();

const fn ksigns() -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let parity = (i as u8).count_ones() as u8 & 1;
        t[i] = i as u8 | (parity << 7);
        i += 1;
    }
    t
}

/// Offset IQ1_S / IQ1_M add to every grid component (its sign is chosen per group).
pub const IQ1S_DELTA: f32 = 0.125;

/// An E8M0 exponent byte as `2^(e - 127) / 2`, the MXFP4 block scale paired with the
/// doubled [`KVALUES_MXFP4`]. Exact for every byte (0 and 1 give subnormals).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// A block format that can be dequantized on its own.
pub trait DequantBlock: Pod {
    /// The GGML type this block encodes.
    const TYPE: GgmlType;
    /// Elements per block.
    const ELEMS: usize;
    /// Writes the block's `ELEMS` values to `out[..ELEMS]`.
    ///
    /// # Panics
    /// When `out.len() < ELEMS` (a caller bug).
    fn dequantize_block(&self, out: &mut [f32]);
}

/// Dequantizes a slice of typed blocks.
///
/// # Panics
/// When `out.len() != blocks.len() * B::ELEMS` (a caller bug; [`dequantize`] is the
/// checked byte-level entry point).
pub fn dequantize_blocks<B: DequantBlock>(blocks: &[B], out: &mut [f32]) {
    assert_eq!(
        out.len(),
        blocks.len() * B::ELEMS,
        "dequantize_blocks::<{}>: {} outputs for {} blocks",
        B::TYPE,
        out.len(),
        blocks.len()
    );
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
        b.dequantize_block(o);
    }
}

fn decode_bytes<B: DequantBlock>(src: &[u8], dst: &mut [f32]) {
    // Aligned input (the usual case: GGUF aligns tensors to 32 bytes) is viewed in place;
    // anything else is copied out one block at a time.
    if let Ok(blocks) = bytemuck::try_cast_slice::<u8, B>(src) {
        return dequantize_blocks(blocks, dst);
    }
    let size = core::mem::size_of::<B>();
    for (chunk, o) in src.chunks_exact(size).zip(dst.chunks_exact_mut(B::ELEMS)) {
        let b: B = bytemuck::pod_read_unaligned(chunk);
        b.dequantize_block(o);
    }
}

/// Dequantizes `src`, the GGUF bytes of a run of `ty` blocks, into `dst`.
///
/// `src` must be a whole number of blocks and `dst.len()` the number of elements they
/// hold. `src` needs no particular alignment.
///
/// # Errors
/// [`FormatError::PartialBlock`] when `src` is not a whole number of blocks,
/// [`FormatError::LengthMismatch`] when `dst` has the wrong length,
/// [`FormatError::Unsupported`] for the integer types, F64 and the activation-only
/// Q8_1 / Q8_K (the `gguf` package dequantizes none of them).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), FormatError> {
    let ts = ty.type_size();
    if !src.len().is_multiple_of(ts) {
        return Err(FormatError::PartialBlock {
            ty,
            bytes: src.len(),
        });
    }
    let expected = src.len() / ts * ty.block_size();
    if dst.len() != expected {
        return Err(FormatError::LengthMismatch {
            expected,
            found: dst.len(),
        });
    }
    use GgmlType as T;
    match ty {
        T::F32 => {
            for (c, o) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        T::F16 => {
            for (c, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        T::BF16 => {
            for (c, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        T::Q4_0 => decode_bytes::<BlockQ4_0>(src, dst),
        T::Q4_1 => decode_bytes::<BlockQ4_1>(src, dst),
        T::Q5_0 => decode_bytes::<BlockQ5_0>(src, dst),
        T::Q5_1 => decode_bytes::<BlockQ5_1>(src, dst),
        T::Q8_0 => decode_bytes::<BlockQ8_0>(src, dst),
        T::Q2_K => decode_bytes::<BlockQ2K>(src, dst),
        T::Q3_K => decode_bytes::<BlockQ3K>(src, dst),
        T::Q4_K => decode_bytes::<BlockQ4K>(src, dst),
        T::Q5_K => decode_bytes::<BlockQ5K>(src, dst),
        T::Q6_K => decode_bytes::<BlockQ6K>(src, dst),
        T::IQ2_XXS => decode_bytes::<BlockIQ2XXS>(src, dst),
        T::IQ2_XS => decode_bytes::<BlockIQ2XS>(src, dst),
        T::IQ2_S => decode_bytes::<BlockIQ2S>(src, dst),
        T::IQ3_XXS => decode_bytes::<BlockIQ3XXS>(src, dst),
        T::IQ3_S => decode_bytes::<BlockIQ3S>(src, dst),
        T::IQ1_S => decode_bytes::<BlockIQ1S>(src, dst),
        T::IQ1_M => decode_bytes::<BlockIQ1M>(src, dst),
        T::IQ4_NL => decode_bytes::<BlockIQ4NL>(src, dst),
        T::IQ4_XS => decode_bytes::<BlockIQ4XS>(src, dst),
        T::TQ1_0 => decode_bytes::<BlockTQ1_0>(src, dst),
        T::TQ2_0 => decode_bytes::<BlockTQ2_0>(src, dst),
        T::MXFP4 => decode_bytes::<BlockMXFP4>(src, dst),
        T::Q8_1 | T::Q8_K | T::I8 | T::I16 | T::I32 | T::I64 | T::F64 => {
            return Err(FormatError::Unsupported(ty))
        }
    }
    Ok(())
}

/// [`dequantize`] into a new vector of the right length.
///
/// # Errors
/// As [`dequantize`].
#[cfg(feature = "alloc")]
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<alloc::vec::Vec<f32>, FormatError> {
    let ts = ty.type_size();
    if !src.len().is_multiple_of(ts) {
        return Err(FormatError::PartialBlock {
            ty,
            bytes: src.len(),
        });
    }
    let mut out = alloc::vec![0.0f32; src.len() / ts * ty.block_size()];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

// ---- legacy 32-element formats -------------------------------------------------------

/// The 4-bit quant of element `j` (0..32) of a legacy block: elements 0..16 are the low
/// nibbles of `qs`, 16..32 the high nibbles.
#[inline]
fn nibble32(qs: &[u8; 16], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0f
}

impl DequantBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (j, o) in out[..32].iter_mut().enumerate() {
            *o = d * (nibble32(&self.qs, j) as i32 - 8) as f32;
        }
    }
}

impl DequantBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        for (j, o) in out[..32].iter_mut().enumerate() {
            *o = d * nibble32(&self.qs, j) as f32 + m;
        }
    }
}

impl DequantBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let qh = u32::from_le_bytes(self.qh);
        for (j, o) in out[..32].iter_mut().enumerate() {
            let q = nibble32(&self.qs, j) as u32 | (((qh >> j) & 1) << 4);
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

impl DequantBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        let qh = u32::from_le_bytes(self.qh);
        for (j, o) in out[..32].iter_mut().enumerate() {
            let q = nibble32(&self.qs, j) as u32 | (((qh >> j) & 1) << 4);
            *o = d * q as f32 + m;
        }
    }
}

impl DequantBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out[..32].iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

// ---- K-quants ------------------------------------------------------------------------

/// The 2-bit field of element `e` (0..256) in the layout shared by Q2_K, Q3_K and
/// TQ2_0: each half of the block (128 elements) uses 32 bytes, and element
/// `32k + m` of a half sits at bits `2k..2k+2` of byte `m`.
#[inline]
fn crumb256(qs: &[u8; 64], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3
}

/// The 4-bit field of element `e` (0..256) in the Q4_K / Q5_K layout: 64-element
/// chunks use 32 bytes, low nibbles first.
#[inline]
fn nibble256(qs: &[u8; 128], e: usize) -> u8 {
    let (chunk, r) = (e / 64, e % 64);
    (qs[32 * chunk + r % 32] >> (4 * (r / 32))) & 0x0f
}

impl DequantBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let sc = self.scales[e / 16];
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            *o = dl * crumb256(&self.qs, e) as f32 - ml;
        }
    }
}

/// The sixteen 6-bit scales of Q3_K, unpacked (still offset by 32).
pub fn q3k_scales(s: &[u8; 12]) -> [u8; 16] {
    core::array::from_fn(|i| {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        low | (high << 4)
    })
}

impl DequantBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * (scales[e / 16] as i32 - 32) as f32;
            // The high bit set means "no offset"; clear means subtract 4.
            let h = (self.hmask[e % 32] >> (e / 32)) & 1;
            let q = crumb256(&self.qs, e) as i32 - if h == 0 { 4 } else { 0 };
            *o = dl * q as f32;
        }
    }
}

/// The eight (scale, min) pairs of Q4_K / Q5_K, 6 bits each: the first four sit in the
/// low 6 bits of bytes 0..4 (scales) and 4..8 (mins); the last four take their low
/// nibbles from bytes 8..12 and their top 2 bits from the top of bytes 0..8.
pub fn k4_scale_min(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

impl DequantBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
        let (sc, mn) = k4_scale_min(&self.scales);
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * sc[e / 32] as f32;
            let ml = dmin * mn[e / 32] as f32;
            *o = dl * nibble256(&self.qs, e) as f32 - ml;
        }
    }
}

impl DequantBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
        let (sc, mn) = k4_scale_min(&self.scales);
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * sc[e / 32] as f32;
            let ml = dmin * mn[e / 32] as f32;
            let h = (self.qh[e % 32] >> (e / 32)) & 1;
            let q = nibble256(&self.qs, e) | (h << 4);
            *o = dl * q as f32 - ml;
        }
    }
}

impl DequantBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let (half, r) = (e / 128, e % 128);
            // Low 4 bits: 64 bytes per half, low nibbles for r < 64, high nibbles after.
            let lo = (self.ql[64 * half + r % 64] >> (4 * (r / 64))) & 0x0f;
            // High 2 bits: 32 bytes per half, four 2-bit fields per byte.
            let hi = (self.qh[32 * half + r % 32] >> (2 * (r / 32))) & 0x03;
            let q = (lo | (hi << 4)) as i32 - 32;
            let dl = d * self.scales[e / 16] as f32;
            *o = dl * q as f32;
        }
    }
}

// ---- ternary ------------------------------------------------------------------------

/// The trit at position `n` (0..5) of a TQ1_0 byte: the byte is a base-3 fixed-point
/// fraction, so multiplying by 3^n (wrapping in 8 bits) brings trit `n` to the top and
/// `(x * 3) >> 8` reads it.
#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let x = byte.wrapping_mul(POW3[n]) as u32;
    ((x * 3) >> 8) as i32 - 1
}

impl DequantBlock for BlockTQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let out = &mut out[..QK_K];
        // Elements 0..160: bytes 0..32, five trits each, trit-major.
        for n in 0..5 {
            for m in 0..32 {
                out[32 * n + m] = d * trit(self.qs[m], n) as f32;
            }
        }
        // Elements 160..240: bytes 32..48.
        for n in 0..5 {
            for m in 0..16 {
                out[160 + 16 * n + m] = d * trit(self.qs[32 + m], n) as f32;
            }
        }
        // Elements 240..256: four trits from each of the four `qh` bytes.
        for n in 0..4 {
            for m in 0..4 {
                out[240 + 4 * n + m] = d * trit(self.qh[m], n) as f32;
            }
        }
    }
}

impl DequantBlock for BlockTQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            *o = d * (crumb256(&self.qs, e) as i32 - 1) as f32;
        }
    }
}

// ---- IQ formats ----------------------------------------------------------------------

/// Component `c` of entry `idx` of a packed grid (see `grids.rs`).
#[inline]
fn grid_value<const N: usize, const V: usize>(
    grid: &[u16; N],
    values: &[f32; V],
    bits: u32,
    idx: usize,
    c: usize,
) -> f32 {
    let mask = (1u16 << bits) - 1;
    values[((grid[idx] >> (bits * c as u32)) & mask) as usize]
}

#[inline]
fn sign(negative: bool) -> f32 {
    if negative {
        -1.0
    } else {
        1.0
    }
}

impl DequantBlock for BlockIQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // Eight groups of 32: four grid indices (bytes of the first u32) and, in the
        // second u32, four 7-bit sign indices plus a 4-bit scale at the top.
        for ib in 0..8 {
            let idx = (self.qs[4 * ib] as u32) | ((self.qs[4 * ib + 1] as u32) << 16);
            let aux = (self.qs[4 * ib + 2] as u32) | ((self.qs[4 * ib + 3] as u32) << 16);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let g = ((idx >> (8 * l)) & 0xff) as usize;
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    let v = grid_value(&IQ2XXS_GRID, &IQ2XXS_VALUES, 2, g, j);
                    out[32 * ib + 8 * l + j] = db * v * sign(signs >> j & 1 != 0);
                }
            }
        }
    }
}

impl DequantBlock for BlockIQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // 32 u16 entries of 8 elements: 9-bit grid index, 7-bit sign index. One 4-bit
        // scale per pair of entries.
        for (i, &q) in self.qs.iter().enumerate() {
            let s = (self.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0f;
            let db = d * (0.5 + s as f32) * 0.25;
            let g = (q & 511) as usize;
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            for j in 0..8 {
                let v = grid_value(&IQ2XS_GRID, &IQ2XS_VALUES, 2, g, j);
                out[8 * i + j] = db * v * sign(signs >> j & 1 != 0);
            }
        }
    }
}

impl DequantBlock for BlockIQ2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // `qs[0..32]`: low 8 bits of 32 grid indices; `qh`: their top 2 bits; `qs[32..64]`:
        // one explicit sign byte per entry.
        for i in 0..32 {
            let s = (self.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0f;
            let db = d * (0.5 + s as f32) * 0.25;
            let g = self.qs[i] as usize | ((((self.qh[i / 4] >> (2 * (i % 4))) & 3) as usize) << 8);
            let signs = self.qs[32 + i];
            for j in 0..8 {
                let v = grid_value(&IQ2S_GRID, &IQ2S_VALUES, 2, g, j);
                out[8 * i + j] = db * v * sign(signs >> j & 1 != 0);
            }
        }
    }
}

impl DequantBlock for BlockIQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // `qs[0..64]`: grid indices (4 elements each); `qs[64..96]`: eight u32 holding
        // four 7-bit sign indices and a 4-bit scale per group of 32.
        for ib in 0..8 {
            let a = &self.qs[64 + 4 * ib..64 + 4 * ib + 4];
            let aux = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    let g = self.qs[8 * ib + 2 * l + j / 4] as usize;
                    let v = grid_value(&IQ3XXS_GRID, &IQ3XXS_VALUES, 3, g, j % 4);
                    out[32 * ib + 8 * l + j] = db * v * sign(signs >> j & 1 != 0);
                }
            }
        }
    }
}

impl DequantBlock for BlockIQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // 64 grid indices of 9 bits (low 8 in `qs`, the 9th in `qh`), explicit sign
        // bits, one odd scale `1 + 2s` per group of 32.
        for ib in 0..8 {
            let s = (self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let db = d * (1 + 2 * s as u32) as f32;
            for k in 0..32 {
                let e = 32 * ib + k;
                let i = e / 4;
                let g = self.qs[i] as usize | ((((self.qh[i / 8] >> (i % 8)) & 1) as usize) << 8);
                let v = grid_value(&IQ3S_GRID, &IQ3S_VALUES, 3, g, e % 4);
                out[e] = db * v * sign(self.signs[e / 8] >> (e % 8) & 1 != 0);
            }
        }
    }
}

impl DequantBlock for BlockIQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        // Eight groups of 32; `qh[ib]` holds four 3-bit index extensions, a 3-bit scale
        // (bits 12..15) and the sign of the delta (bit 15).
        for ib in 0..8 {
            let qh = self.qh[ib];
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 == 0 {
                IQ1S_DELTA
            } else {
                -IQ1S_DELTA
            };
            for l in 0..4 {
                let g = self.qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
                for j in 0..8 {
                    let v = grid_value(&IQ1S_GRID, &IQ1S_VALUES, 2, g, j);
                    out[32 * ib + 8 * l + j] = dl * (v + delta);
                }
            }
        }
    }
}

impl DequantBlock for BlockIQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let sc: [u16; 4] = core::array::from_fn(|k| {
            u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]])
        });
        // The f16 super-block scale is the top nibbles of the four scale words.
        let d = f16_to_f32(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
        );
        // 32 grid entries of 8; entry i takes 8 bits from qs[i] and a nibble of qh
        // (3 index bits + the delta sign); each pair of entries shares a 3-bit scale.
        for i in 0..32 {
            let s = (sc[i / 8] >> (3 * ((i / 2) % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let nib = (self.qh[i / 2] >> (4 * (i % 2))) & 0x0f;
            let g = self.qs[i] as usize | (((nib & 7) as usize) << 8);
            let delta = if nib & 8 == 0 {
                IQ1S_DELTA
            } else {
                -IQ1S_DELTA
            };
            for j in 0..8 {
                let v = grid_value(&IQ1S_GRID, &IQ1S_VALUES, 2, g, j);
                out[8 * i + j] = dl * (v + delta);
            }
        }
    }
}

impl DequantBlock for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (j, o) in out[..32].iter_mut().enumerate() {
            *o = d * KVALUES_IQ4NL[nibble32(&self.qs, j) as usize] as f32;
        }
    }
}

impl DequantBlock for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const ELEMS: usize = QK_K;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for ib in 0..8 {
            let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let high = ((self.scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
            for k in 0..32 {
                let q = (self.qs[16 * ib + k % 16] >> (4 * (k / 16))) & 0x0f;
                out[32 * ib + k] = dl * KVALUES_IQ4NL[q as usize] as f32;
            }
        }
    }
}

impl DequantBlock for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const ELEMS: usize = 32;
    fn dequantize_block(&self, out: &mut [f32]) {
        let d = e8m0_to_f32_half(self.e);
        for (j, o) in out[..32].iter_mut().enumerate() {
            *o = d * KVALUES_MXFP4[nibble32(&self.qs, j) as usize] as f32;
        }
    }
}
