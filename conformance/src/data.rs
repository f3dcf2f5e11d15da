//! Random weights in valid GGUF encodings.

use flint_hal::GgmlType;

use crate::reference;
use crate::rng::CaseRng;

/// Byte offsets of the f16 scale fields inside one block of `ty`, for the types that
/// get random bytes: random bits there would give infinities, NaNs and absurd
/// magnitudes, so they are replaced by sane small scales.
fn f16_scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ4_NL
        | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        _ => &[],
    }
}

/// A random small positive f16 scale, as raw bits.
fn sane_f16(rng: &mut CaseRng) -> u16 {
    half::f16::from_f32(rng.uniform(0.002, 0.03)).to_bits()
}

/// Random bytes for `blocks` blocks of `ty` with every scale field made sane.
fn random_blocks(ty: GgmlType, blocks: usize, rng: &mut CaseRng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut bytes = rng.bytes(blocks * ts);
    for b in bytes.chunks_exact_mut(ts) {
        for &off in f16_scale_offsets(ty) {
            let s = sane_f16(rng);
            b[off..off + 2].copy_from_slice(&s.to_le_bytes());
        }
        match ty {
            GgmlType::IQ1_M => {
                // The super-block scale is the top nibble of each of the four u16 words
                // of `scales` (the last 8 bytes of the block), lowest word first.
                let s = sane_f16(rng);
                for w in 0..4 {
                    let at = ts - 8 + 2 * w + 1;
                    let nib = ((s >> (4 * w)) & 0xf) as u8;
                    b[at] = (b[at] & 0x0f) | (nib << 4);
                }
            }
            GgmlType::MXFP4 => {
                // E8M0 shared exponent: keep it near 2^0.
                b[0] = 120 + (rng.below(8) as u8);
            }
            _ => {}
        }
    }
    bytes
}

/// A random weight of `rows` rows of `k` values encoded as `ty`: random floats through
/// `flint-core`'s quantizer where it has one for `ty`, else random blocks with sane
/// scales. Returns the bytes and their dequantization by the reference.
pub fn random_weight(
    ty: GgmlType,
    k: usize,
    rows: usize,
    rng: &mut CaseRng,
) -> Result<(Vec<u8>, Vec<f32>), String> {
    let n = k * rows;
    let mut floats = rng.vec(n, -1.0, 1.0);
    // Every group of 16 gets its own magnitude (2^-3 .. 2^1), so that the sub-block
    // scales of a quantized weight differ a lot: a kernel that applies a neighbour's
    // scale or min is then far off, not within rounding.
    for g in floats.chunks_mut(16) {
        let m = rng.uniform(-3.0, 1.0).exp2();
        g.iter_mut().for_each(|v| *v *= m);
    }
    let bytes = match reference::quantize(ty, &floats) {
        Some(b) => b,
        None => {
            let blocks = n / ty.block_size();
            random_blocks(ty, blocks, rng)
        }
    };
    let deq = reference::dequantize(ty, &bytes, n)?;
    if let Some(i) = deq.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "generated {ty} weight dequantizes to a non-finite value at {i} (a bug in the suite)"
        ));
    }
    Ok((bytes, deq))
}
