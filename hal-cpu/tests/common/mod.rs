//! Shared helpers for the hal-cpu tests: a seeded generator and random GGUF blocks.

#![allow(dead_code)]

use flint_core::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use flint_core::quant::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};
use flint_core::GgmlType;
use flint_hal::{WeightDesc, WeightKind, WeightSource};

/// SplitMix64: small, seeded, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn f16b(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Byte offsets of the f16 scale fields inside one block of `ty`.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_K | Q5_K | Q4_1 | Q5_1 => &[0, 2],
        Q6_K => &[208],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        _ => &[],
    }
}

/// `rows` random rows of `k` elements encoded as `ty`: every quant bit pattern is
/// random, the f16 scales are sane (finite, of either sign for the legacy types).
pub fn random_weight(rng: &mut Rng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    let n = k * rows;
    match ty {
        GgmlType::F32 => return rng.vec(n).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => return rng.vec(n).iter().flat_map(|&v| f16b(v)).collect(),
        GgmlType::BF16 => {
            return rng
                .vec(n)
                .iter()
                .flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let ts = ty.type_size();
    let nb = n / ty.block_size();
    let mut b = rng.bytes(nb * ts);
    for blk in b.chunks_exact_mut(ts) {
        for &off in f16_fields(ty) {
            let v = 0.001 + 0.02 * rng.f().abs();
            blk[off..off + 2].copy_from_slice(&f16b(v));
        }
    }
    b
}

/// A weight descriptor over `data` (`[k, n]`, or `[k, n, e]`).
pub fn desc(name: &str, ty: GgmlType, dims: &[usize], data: Vec<u8>) -> WeightDesc {
    WeightDesc {
        name: name.to_string(),
        ty,
        dims: dims.to_vec(),
        kind: if dims.len() == 3 {
            WeightKind::ExpertTower
        } else {
            WeightKind::Matrix
        },
        data: WeightSource::from_vec(data),
    }
}

/// The activation row `x` as the dot product of `ty` sees it: quantized to
/// `vec_dot_type` and dequantized (float weights: `x` itself).
pub fn act_as_seen(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    match ty.vec_dot_type() {
        GgmlType::Q8_K => {
            let mut b = vec![bytemuck::Zeroable::zeroed(); x.len() / 256];
            quantize_row_q8_k(x, &mut b);
            b.iter()
                .flat_map(|b: &BlockQ8K| b.qs.iter().map(move |&q| b.d * q as f32))
                .collect()
        }
        GgmlType::Q8_0 => {
            let mut b = vec![bytemuck::Zeroable::zeroed(); x.len() / 32];
            quantize_row_q8_0(x, &mut b);
            b.iter()
                .flat_map(|b: &BlockQ8_0| {
                    let d = half::f16::from_bits(b.d).to_f32();
                    b.qs.iter().map(move |&q| d * q as f32)
                })
                .collect()
        }
        GgmlType::Q8_1 => {
            let mut b = vec![bytemuck::Zeroable::zeroed(); x.len() / 32];
            quantize_row_q8_1(x, &mut b);
            b.iter()
                .flat_map(|b: &BlockQ8_1| {
                    let d = half::f16::from_bits(b.d).to_f32();
                    b.qs.iter().map(move |&q| d * q as f32)
                })
                .collect()
        }
        _ => x.to_vec(),
    }
}

/// Reference `out[i][o] = sum_j W[o][j] * a[i][j]` in f64 over the dequantized weight
/// and the activations as the kernel sees them, and the sum of |terms| per output (for
/// a tolerance relative to the magnitude of what was summed).
pub fn reference_matmul(
    ty: GgmlType,
    w: &[u8],
    k: usize,
    n: usize,
    x: &[f32],
    m: usize,
) -> (Vec<f32>, Vec<f32>) {
    let wf = flint_core::dequant::dequantize_to_vec(ty, w).expect("dequantize weight");
    assert_eq!(wf.len(), k * n);
    let mut out = vec![0f32; m * n];
    let mut mag = vec![0f32; m * n];
    for i in 0..m {
        let a = act_as_seen(ty, &x[i * k..(i + 1) * k]);
        for o in 0..n {
            let (mut s, mut t) = (0f64, 0f64);
            for j in 0..k {
                let p = wf[o * k + j] as f64 * a[j] as f64;
                s += p;
                t += p.abs();
            }
            out[i * n + o] = s as f32;
            mag[i * n + o] = t as f32;
        }
    }
    (out, mag)
}

/// Asserts `got` is within `rel * mag + 1e-6` of `want`, element by element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], mag: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = rel * m + 1e-6;
        assert!(
            (g - w).abs() <= tol && g.is_finite(),
            "{what}: element {i}: got {g}, want {w} (|terms| {m}, tol {tol})"
        );
    }
}
