//! Element-wise ops with AVX2: GELU through its f16 table, RoPE rotation, and the f16
//! conversions of the KV cache. The caller must have checked AVX2, FMA and F16C at
//! device open.

use std::arch::x86_64::*;

/// `out[i] = gelu(gate[i]) * up[i]` with `gelu` read from `table` (indexed by the f16
/// bits of the input, rounded to nearest even as `half::f16::from_f32`), inputs at or
/// below -10 giving 0 and at or above 10 themselves: the rounding to f16 of eight inputs
/// at a time with F16C (the `half` crate, built without `std`, rounds in software).
/// NaN inputs give some NaN index either way, whose table entry is 0.
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn gelu_mul_table(table: &[f32], gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        table.len() > usize::from(u16::MAX),
        "gelu_mul_table: table size"
    );
    let n = out.len().min(gate.len()).min(up.len());
    let mut bits = [0u16; 8];
    for c in (0..n).step_by(8) {
        let len = 8.min(n - c);
        if len == 8 {
            // SAFETY: 8 readable f32 at `gate[c..]` and 8 writable u16 in `bits`.
            unsafe {
                let v = _mm256_loadu_ps(gate[c..].as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(bits.as_mut_ptr() as *mut __m128i, h);
            }
        } else {
            for (t, b) in bits.iter_mut().enumerate().take(len) {
                *b = half::f16::from_f32(gate[c + t]).to_bits();
            }
        }
        for t in 0..len {
            let x = gate[c + t];
            let g = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                table[usize::from(bits[t])]
            };
            out[c + t] = g * up[c + t];
        }
    }
}

/// One head's rotation by per-pair cosines and sines `cs` (the first `2 * cs.len()`
/// dims, paired as `kind` says), as `flint_core::math::rope_rotate` computes it (fused
/// multiply-adds where GCC contracts ggml's `rotate_pairs`), with the multiply-adds as
/// FMA instructions rather than calls.
#[target_feature(enable = "fma")]
pub(crate) fn rope_rotate(h: &mut [f32], kind: flint_core::math::RopeKind, cs: &[(f32, f32)]) {
    crate::ops::rope_rotate(h, kind, cs);
}

/// `dst[i]` = the f16 bits of `src[i]` (round to nearest even, as
/// `half::f16::from_f32`), eight at a time.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f16_bits_from(dst: &mut [u16], src: &[f32]) {
    let n = dst.len().min(src.len());
    let (mut d8, mut s8) = (dst[..n].chunks_exact_mut(8), src[..n].chunks_exact(8));
    for (d, s) in (&mut d8).zip(&mut s8) {
        // SAFETY: 8 readable f32 and 8 writable u16 (16 bytes); loadu/storeu are unaligned.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, h);
        }
    }
    for (d, &x) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

/// `dst[i]` = the f16 `src[i]` widened to f32 (exact), eight at a time.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f32_from_f16_bits(dst: &mut [f32], src: &[u16]) {
    let n = dst.len().min(src.len());
    let (mut d8, mut s8) = (dst[..n].chunks_exact_mut(8), src[..n].chunks_exact(8));
    for (d, s) in (&mut d8).zip(&mut s8) {
        // SAFETY: 8 readable u16 (16 bytes) and 8 writable f32; loadu/storeu are unaligned.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (d, &x) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = half::f16::from_bits(x).to_f32();
    }
}

#[cfg(test)]
mod tests {
    /// F16C's widening against `half`'s on every f16.
    #[test]
    fn f16_widening_matches_half() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            eprintln!("no F16C here: nothing to compare");
            return;
        }
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let mut got = vec![0f32; bits.len()];
        // SAFETY: F16C was detected above (AVX with it).
        unsafe { super::f32_from_f16_bits(&mut got, &bits) };
        for (&b, &g) in bits.iter().zip(&got) {
            let want = half::f16::from_bits(b).to_f32();
            if want.is_nan() {
                assert!(g.is_nan(), "{b:#06x}: {g:e} where half gives NaN");
            } else {
                assert_eq!(g.to_bits(), want.to_bits(), "{b:#06x}");
            }
        }
    }

    /// F16C's rounding against `half`'s on every 4099th f32 bit pattern (normals,
    /// subnormals, values that overflow to infinity, ties; NaN only as NaN).
    #[test]
    fn f16_conversions_match_half() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            eprintln!("no F16C here: nothing to compare");
            return;
        }
        let src: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i.wrapping_mul(4099)))
            .chain([
                65504.0,
                65519.0,
                65520.0,
                -65520.0,
                1.0 + f32::EPSILON,
                6.0e-8,
                2.9e-8,
            ])
            .collect();
        let mut bits = vec![0u16; src.len()];
        let mut got = vec![0f32; src.len()];
        // SAFETY: F16C was detected above (AVX with it).
        unsafe {
            super::f16_bits_from(&mut bits, &src);
            super::f32_from_f16_bits(&mut got, &bits);
        }
        for ((&x, &b), &g) in src.iter().zip(&bits).zip(&got) {
            let want = half::f16::from_f32(x).to_f32();
            if !want.is_nan() {
                assert_eq!(b, half::f16::from_f32(x).to_bits(), "{x:e}: f16 bits");
            }
            if want.is_nan() {
                assert!(g.is_nan(), "{x:e}: {g:e} where half gives NaN");
            } else {
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{x:e}: {g:e} vs half's {want:e}"
                );
            }
        }
    }
}
