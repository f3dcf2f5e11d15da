//! Activation rows quantized once per call to the weight type's `vec_dot_type` (Q8_K for
//! the K-quants, Q8_0/Q8_1 for the legacy types, as ggml pairs them; float weights keep
//! f32), with AVX-512 (`avx512.rs`) or AVX2 (`avx2.rs`) quantizers where the device's
//! level has them.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use bytemuck::Pod;
use flint_core::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use flint_core::quant::{quantize_row_q8_0_act, quantize_row_q8_1_act, quantize_row_q8_k};
use flint_core::{FormatError, GgmlType};

use crate::kernels::f16_to_f32;
use crate::kernels::float::FloatKind;
use crate::kernels::mxfp4;
#[cfg(target_arch = "x86_64")]
use crate::kernels::q0::vnni;
use crate::simd::SimdLevel;

/// Activation rows in the encoding a weight type's dot product consumes.
#[derive(Debug)]
pub(crate) enum Acts {
    Q8K(Vec<BlockQ8K>),
    /// Q8_0 blocks, with per block the scale widened to f32 and, per group of 4 quants
    /// (the 8 lanes of tinyBLAS's order), `-16 x` their sum: what a Q5_0 kernel on
    /// unsigned 5-bit quants (`q + 16`) needs to take the offset back out exactly.
    Q8_0 {
        blocks: Vec<BlockQ8_0>,
        scales: Vec<f32>,
        neg16_lanes: Vec<[i32; 8]>,
    },
    Q8_1(Vec<BlockQ8_1>),
    F32(Vec<f32>),
}

/// Rows of `k` values one task of the activation quantizers takes at least: about 16K
/// values, so that a decode step's few rows (the four expert rows of a token) are
/// quantized on the calling thread instead of being split over the pool for a fraction
/// of a microsecond of work each.
fn min_rows_per_task(k: usize) -> usize {
    (16384 / k.max(1)).max(1)
}

impl Acts {
    /// Quantizes `m` rows of `k` values to `ty.vec_dot_type()` (float weights keep f32).
    pub(crate) fn new(
        level: SimdLevel,
        ty: GgmlType,
        x: &[f32],
        k: usize,
    ) -> Result<Self, FormatError> {
        use rayon::prelude::*;
        fn q<B: Pod + Send>(x: &[f32], k: usize, bs: usize, f: fn(&[f32], &mut [B])) -> Vec<B> {
            let nb = k / bs;
            let mut v = vec![B::zeroed(); x.len() / bs];
            v.par_chunks_mut(nb.max(1))
                .zip(x.par_chunks(k.max(1)))
                .for_each(|(o, xr)| f(xr, o));
            v
        }
        if FloatKind::of(ty).is_some() {
            return Ok(Acts::F32(x.to_vec()));
        }
        match ty.vec_dot_type() {
            #[cfg(target_arch = "x86_64")]
            GgmlType::Q8_K if level >= SimdLevel::Avx2 && k.is_multiple_of(256) && k > 0 => {
                let mut v = vec![<BlockQ8K as bytemuck::Zeroable>::zeroed(); x.len() / 256];
                v.par_chunks_mut(k / 256)
                    .zip(x.par_chunks(k))
                    .with_min_len(min_rows_per_task(k))
                    // SAFETY: the level's features (AVX-512 F/BW for the first, AVX2, FMA
                    // and F16C for both) were checked at device open.
                    .for_each(|(o, xr)| unsafe {
                        if level >= SimdLevel::Avx512 {
                            avx512::quantize_q8_k_row(xr, o)
                        } else {
                            avx2::quantize_q8_k_row(xr, o)
                        }
                    });
                Ok(Acts::Q8K(v))
            }
            GgmlType::Q8_K => Ok(Acts::Q8K(q(x, k, 256, quantize_row_q8_k))),
            #[cfg(target_arch = "x86_64")]
            GgmlType::Q8_0 if level >= SimdLevel::Avx2 && k.is_multiple_of(32) && k > 0 => {
                // Blocks, scales and side data in one pass per row.
                let nb = k / 32;
                let n = x.len() / 32;
                let mut blocks = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); n];
                let mut scales = vec![0f32; n];
                let mut neg16_lanes = vec![[0i32; 8]; n];
                blocks
                    .par_chunks_mut(nb)
                    .zip(scales.par_chunks_mut(nb))
                    .zip(neg16_lanes.par_chunks_mut(nb))
                    .zip(x.par_chunks(k))
                    .with_min_len(min_rows_per_task(k))
                    .for_each(|(((b, s), l), xr)| {
                        // SAFETY: the level's features (AVX-512 F/BW for the first,
                        // AVX2, FMA and F16C for both) were checked at device open.
                        unsafe {
                            if level >= SimdLevel::Avx512 {
                                avx512::quantize_q8_0_act_row(xr, b, s, l)
                            } else {
                                avx2::quantize_q8_0_act_row(xr, b, s, l)
                            }
                        }
                    });
                Ok(Acts::Q8_0 {
                    blocks,
                    scales,
                    neg16_lanes,
                })
            }
            GgmlType::Q8_0 => {
                let blocks = q(x, k, 32, quantize_row_q8_0_act);
                let scales = blocks.par_iter().map(|b| f16_to_f32(b.d)).collect();
                let neg16_lanes = blocks
                    .par_iter()
                    .map(|b| {
                        std::array::from_fn(|l| {
                            -16 * b.qs[4 * l..4 * l + 4]
                                .iter()
                                .map(|&v| i32::from(v))
                                .sum::<i32>()
                        })
                    })
                    .collect();
                Ok(Acts::Q8_0 {
                    blocks,
                    scales,
                    neg16_lanes,
                })
            }
            GgmlType::Q8_1 => Ok(Acts::Q8_1(q(x, k, 32, quantize_row_q8_1_act))),
            _ => Err(FormatError::Unsupported(ty)),
        }
    }

    /// Row `i` (of `nb` blocks) of Q8_0 activations with its side data.
    ///
    /// # Panics
    /// If the activations are not Q8_0.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn q8_0_side(&self, i: usize, nb: usize) -> vnni::Q8_0Side<'_> {
        let Acts::Q8_0 {
            blocks,
            scales,
            neg16_lanes,
        } = self
        else {
            panic!("Q8_0 side data of activations that are not Q8_0");
        };
        let r = i * nb..(i + 1) * nb;
        (&blocks[r.clone()], &scales[r.clone()], &neg16_lanes[r])
    }

    /// Every row of Q8_0 activations with its side data.
    ///
    /// # Panics
    /// If the activations are not Q8_0.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn q8_0_all(&self) -> vnni::Q8_0Side<'_> {
        match self {
            Acts::Q8_0 {
                blocks,
                scales,
                neg16_lanes,
            } => (blocks, scales, neg16_lanes),
            _ => panic!("Q8_0 side data of activations that are not Q8_0"),
        }
    }

    /// Q8_0 activations as the MXFP4 kernels read them (`nb` blocks per row).
    pub(crate) fn mxfp4_act(&self, nb: usize) -> Option<mxfp4::Act<'_>> {
        match self {
            Acts::Q8_0 { blocks, scales, .. } => Some(mxfp4::Act { blocks, scales, nb }),
            _ => None,
        }
    }

    /// Row `i` (of `nb` blocks) as bytes, for the scalar reference.
    pub(crate) fn row_bytes(&self, i: usize, nb: usize) -> &[u8] {
        match self {
            Acts::Q8K(v) => bytemuck::cast_slice(&v[i * nb..(i + 1) * nb]),
            Acts::Q8_0 { blocks: v, .. } => bytemuck::cast_slice(&v[i * nb..(i + 1) * nb]),
            Acts::Q8_1(v) => bytemuck::cast_slice(&v[i * nb..(i + 1) * nb]),
            Acts::F32(v) => bytemuck::cast_slice(&v[i * nb..(i + 1) * nb]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values in [-1, 1) from a xorshift generator seeded with `seed`.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// The SIMD levels this CPU has that quantize activations with their own kernels.
    fn quantizer_levels() -> Vec<SimdLevel> {
        [SimdLevel::Avx2, SimdLevel::Avx512]
            .into_iter()
            .filter(|&l| l <= SimdLevel::detect())
            .collect()
    }

    /// The AVX2 and AVX-512 Q8_K activation quantizers equal `quantize_row_q8_k` bit for
    /// bit: ordinary blocks, a tie of magnitudes of opposite signs (the first one sets the
    /// sign of the scale), exact rounding ties, a zero block, tiny and huge values, NaN
    /// and infinities.
    #[test]
    fn q8_k_activation_quantizer_equals_core() {
        let k = 256 * 3;
        let mut x = values(0x0fed_cba9_8765_4321, 4 * k);
        x[10] = -3.0;
        x[20] = 3.0;
        x[300] = 127.0;
        for (i, v) in x[301..400].iter_mut().enumerate() {
            *v = (i % 50) as f32 - 24.5;
        }
        x[512..768].fill(0.0);
        for v in &mut x[768..1024] {
            *v *= 1e-30;
        }
        for v in &mut x[1024..1280] {
            *v *= 1e30;
        }
        x[1300] = f32::NAN;
        x[1600] = f32::INFINITY;
        x[1900] = -0.0;
        x[2000] = -5.0;
        x[2001] = 5.0;
        let mut want = vec![<BlockQ8K as bytemuck::Zeroable>::zeroed(); x.len() / 256];
        for (xr, o) in x.chunks(k).zip(want.chunks_mut(k / 256)) {
            quantize_row_q8_k(xr, o);
        }
        for level in quantizer_levels() {
            let Acts::Q8K(got) = Acts::new(level, GgmlType::Q4_K, &x, k).expect("acts") else {
                panic!("not Q8_K");
            };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.d.to_bits(), w.d.to_bits(), "{level:?} block {i} d");
                assert_eq!(g.qs, w.qs, "{level:?} block {i} qs");
                assert_eq!(g.bsums, w.bsums, "{level:?} block {i} bsums");
            }
        }
    }

    /// The AVX2 and AVX-512 Q8_0 activation quantizers equal `quantize_row_q8_0_act`
    /// (blocks, f32 scales, `-16 x` lane sums) bit for bit: ordinary values, exact ties of
    /// the rounding, zero blocks, scales that are f16 subnormals or overflow, NaN and
    /// infinities.
    #[test]
    fn q8_0_activation_quantizer_equals_core() {
        let k = 32 * 9;
        let mut x = values(0x1234_5678_9abc_def0, 3 * k);
        // Block 1: amax 127, so the multiplier is 1 and x.5 values are ties.
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) + 0.5;
        }
        x[32] = 127.0;
        // Block 2 zero; block 3 tiny (subnormal f16 scale); block 4 huge (inf scale).
        x[64..96].fill(0.0);
        for v in &mut x[96..128] {
            *v *= 1e-6;
        }
        for v in &mut x[128..160] {
            *v *= 1e8;
        }
        x[170] = f32::NAN;
        x[200] = f32::INFINITY;
        x[230] = f32::NEG_INFINITY;
        x[300] = -0.0;
        let mut want = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); x.len() / 32];
        for (xr, o) in x.chunks(k).zip(want.chunks_mut(k / 32)) {
            quantize_row_q8_0_act(xr, o);
        }
        for level in quantizer_levels() {
            let acts = Acts::new(level, GgmlType::Q8_0, &x, k).expect("acts");
            let Acts::Q8_0 {
                blocks,
                scales,
                neg16_lanes,
            } = acts
            else {
                panic!("not Q8_0");
            };
            for (i, (g, w)) in blocks.iter().zip(&want).enumerate() {
                assert_eq!((g.d, g.qs), (w.d, w.qs), "{level:?} block {i}");
                assert_eq!(scales[i].to_bits(), f16_to_f32(w.d).to_bits(), "scale {i}");
                let lanes: [i32; 8] = std::array::from_fn(|l| {
                    -16 * w.qs[4 * l..4 * l + 4]
                        .iter()
                        .map(|&v| i32::from(v))
                        .sum::<i32>()
                });
                assert_eq!(neg16_lanes[i], lanes, "{level:?} lanes {i}");
            }
        }
    }
}
