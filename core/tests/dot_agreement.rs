//! The reference dot products against the f32 dot product of dequantized rows.
//!
//! Two bounds are documented and tested:
//!
//! 1. Kernel exactness (`dot_matches_dequantized_*`): with a random *activation* block row
//!    (random Q8_0 / Q8_1 / Q8_K blocks with consistent sums), `vec_dot` must equal
//!    `sum_i w_i * a_i` (both sides dequantized, summed in f64) up to f32 rounding:
//!    `|err| <= 2^-16 * T` with `T = sum over blocks of max_i |w_i| * sum_i |a_i|`. Q4_1 /
//!    Q5_1 add the rounding of the activation's f16 block sum `s`:
//!    `sum_b |m_b| * |s_b| * 2^-10`. Any indexing or scale mistake in a kernel gives errors
//!    of the order of `sum |w_i a_i|`, far above this.
//! 2. End to end (`dot_row_f32_*`): against the unquantized activation `x`, the error is
//!    the activation quantization:
//!    `|err| <= sum_i |w_i| * amax(x over i's block) / 127 + sum_b |m_b| * sum_i |x_i| * 2^-10
//!    + 2^-16 * T`.

use flint_core::blocks::*;
use flint_core::dot::*;
use flint_core::{dequantize, quantize, FormatError, GgmlType, QK_K};
use half::{bf16, f16};
use proptest::prelude::*;

/// SplitMix64: a small deterministic generator, so failures reproduce from a seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn sym(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A finite f16 scale of random sign and magnitude in [2^-12, 2^-2).
    fn scale(&mut self) -> u16 {
        let mag = (2.0f32).powf(-12.0 + 10.0 * self.unit());
        let s = if self.next() & 1 == 0 { mag } else { -mag };
        f16::from_f32(s).to_bits()
    }
}

/// Byte offsets of the f16 scales (`d`, `dmin`, `m`) inside one block of each type.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S
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

/// A random, valid weight row of `nb` blocks: random bits everywhere, with every scale
/// a finite, moderate number.
fn random_weights(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    match ty {
        GgmlType::F32 => return (0..nb).flat_map(|_| rng.sym().to_le_bytes()).collect(),
        GgmlType::F16 => {
            return (0..nb)
                .flat_map(|_| f16::from_f32(rng.sym()).to_bits().to_le_bytes())
                .collect()
        }
        GgmlType::BF16 => {
            return (0..nb)
                .flat_map(|_| bf16::from_f32(rng.sym()).to_bits().to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let mut out = rng.bytes(nb * ts);
    for b in out.chunks_mut(ts) {
        for &o in scale_offsets(ty) {
            b[o..o + 2].copy_from_slice(&rng.scale().to_le_bytes());
        }
        match ty {
            // E8M0 exponent near 2^0.
            GgmlType::MXFP4 => b[0] = 118 + (rng.next() % 12) as u8,
            // IQ1_M: the f16 scale lives in the top nibbles of the four scale u16s.
            GgmlType::IQ1_M => {
                let s = rng.scale();
                for k in 0..4 {
                    let byte = 48 + 2 * k + 1;
                    b[byte] = (b[byte] & 0x0f) | ((((s >> (4 * k)) & 0xf) as u8) << 4);
                }
            }
            _ => {}
        }
    }
    out
}

/// A random activation row in the type paired with `ty`, and its f32 values.
fn random_activation(ty: GgmlType, n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let q8 = |rng: &mut Rng| -> i8 { (rng.next() % 255) as i8 };
    match ty.vec_dot_type() {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let q8_1 = ty.vec_dot_type() == GgmlType::Q8_1;
            let mut bytes = Vec::new();
            let mut vals = Vec::new();
            for _ in 0..n / 32 {
                let d = f16::from_f32(rng.unit() * 0.05 + 1e-3);
                let qs: Vec<i8> = (0..32).map(|_| q8(rng)).collect();
                bytes.extend_from_slice(&d.to_bits().to_le_bytes());
                if q8_1 {
                    let sum: i32 = qs.iter().map(|&q| q as i32).sum();
                    let s = f16::from_f32(sum as f32 * d.to_f32());
                    bytes.extend_from_slice(&s.to_bits().to_le_bytes());
                }
                bytes.extend(qs.iter().map(|&q| q as u8));
                vals.extend(qs.iter().map(|&q| q as f32 * d.to_f32()));
            }
            (bytes, vals)
        }
        GgmlType::Q8_K => {
            let mut blocks = Vec::new();
            let mut vals = Vec::new();
            for _ in 0..n / QK_K {
                let mut b = BlockQ8K {
                    d: rng.unit() * 0.05 + 1e-3,
                    qs: [0; QK_K],
                    bsums: [0; 16],
                };
                for q in b.qs.iter_mut() {
                    *q = q8(rng);
                }
                for j in 0..16 {
                    b.bsums[j] = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
                }
                vals.extend(b.qs.iter().map(|&q| q as f32 * b.d));
                blocks.push(b);
            }
            (bytemuck::cast_slice(&blocks).to_vec(), vals)
        }
        _ => {
            let vals: Vec<f32> = (0..n).map(|_| rng.sym()).collect();
            (vals.iter().flat_map(|v| v.to_le_bytes()).collect(), vals)
        }
    }
}

fn dequant(ty: GgmlType, w: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        _ => dequantize(ty, w, &mut out).expect("dequantize"),
    }
    out
}

/// `T = sum over blocks of max |w| * sum |a|`, the magnitude float rounding scales with.
fn magnitude(ty: GgmlType, w: &[f32], a: &[f32]) -> f64 {
    let bs = if ty.is_quantized() {
        ty.block_size()
    } else {
        32
    };
    w.chunks(bs)
        .zip(a.chunks(bs))
        .map(|(wb, ab)| {
            let wmax = wb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            wmax * ab.iter().map(|v| v.abs() as f64).sum::<f64>()
        })
        .sum()
}

/// `sum_b |m_b| * |s_b| * 2^-10` for Q4_1 / Q5_1 (0 otherwise): the f16 rounding of the
/// Q8_1 block sums.
fn q8_1_sum_slack(ty: GgmlType, w: &[u8], act: &[u8]) -> f64 {
    if ty.vec_dot_type() != GgmlType::Q8_1 {
        return 0.0;
    }
    w.chunks(ty.type_size())
        .zip(act.chunks(36))
        .map(|(wb, ab)| {
            let m = f16::from_bits(u16::from_le_bytes([wb[2], wb[3]]))
                .to_f32()
                .abs() as f64;
            let s = f16::from_bits(u16::from_le_bytes([ab[2], ab[3]]))
                .to_f32()
                .abs() as f64;
            m * s / 1024.0
        })
        .sum()
}

fn check_kernel(ty: GgmlType, nb: usize, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let n = nb * ty.block_size().max(if ty.is_quantized() { 1 } else { 32 });
    let wn = if ty.is_quantized() { nb } else { n };
    let w = random_weights(ty, wn, &mut rng);
    let (act, a) = random_activation(ty, n, &mut rng);
    let got = vec_dot(ty, &w, &act, n).map_err(|e| format!("{ty}: {e}"))? as f64;
    let wf = dequant(ty, &w, n);
    let want: f64 = wf.iter().zip(&a).map(|(x, y)| *x as f64 * *y as f64).sum();
    let bound = magnitude(ty, &wf, &a) / 65536.0 + q8_1_sum_slack(ty, &w, &act) + 1e-30;
    if (got - want).abs() > bound {
        return Err(format!(
            "{ty} seed {seed}: got {got}, dequantized dot {want}, |err| {} > bound {bound}",
            (got - want).abs()
        ));
    }
    // The typed and byte paths agree bit for bit (spot check through the byte path at an
    // odd address: blocks are read unaligned).
    let mut shifted = vec![0u8; w.len() + 1];
    shifted[1..].copy_from_slice(&w);
    let again = vec_dot(ty, &shifted[1..], &act, n).map_err(|e| e.to_string())? as f64;
    if again.to_bits() != got.to_bits() {
        return Err(format!("{ty}: unaligned read changed the result"));
    }
    Ok(())
}

#[test]
fn dot_matches_dequantized_every_type() {
    for ty in GgmlType::DEQUANTIZABLE {
        for (nb, seed) in [(1usize, 1u64), (3, 2), (8, 3)] {
            check_kernel(ty, nb, seed * 1000 + ty.id() as u64).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn dot_matches_dequantized_random(t in 0usize..25, nb in 1usize..5, seed in any::<u64>()) {
        let ty = GgmlType::DEQUANTIZABLE[t];
        if let Err(e) = check_kernel(ty, nb, seed) {
            prop_assert!(false, "{}", e);
        }
    }
}

fn check_end_to_end(ty: GgmlType, nb: usize, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let bs = if ty.is_quantized() {
        ty.block_size()
    } else {
        32
    };
    let n = nb * bs;
    let wn = if ty.is_quantized() { nb } else { n };
    let w = random_weights(ty, wn, &mut rng);
    let x: Vec<f32> = (0..n).map(|_| rng.sym() * 3.0).collect();
    let got = dot_row_f32(ty, &w, &x).map_err(|e| format!("{ty}: {e}"))?;
    let wf = dequant(ty, &w, n);
    let want: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
    let mut quant_err = 0.0f64;
    let mut m_slack = 0.0f64;
    let abs = ty.is_quantized(); // the activation is quantized too
    for (b, (wb, xb)) in wf.chunks(bs).zip(x.chunks(bs)).enumerate() {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        if abs {
            quant_err += wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 127.0;
        }
        if ty.vec_dot_type() == GgmlType::Q8_1 {
            let o = b * ty.type_size();
            let m = f16::from_bits(u16::from_le_bytes([w[o + 2], w[o + 3]]))
                .to_f32()
                .abs();
            m_slack += m as f64 * xb.iter().map(|v| v.abs() as f64).sum::<f64>() / 1024.0;
        }
    }
    let bound = quant_err + m_slack + magnitude(ty, &wf, &x) / 65536.0 + 1e-30;
    if (got as f64 - want).abs() > bound {
        return Err(format!(
            "{ty} seed {seed}: dot_row_f32 {got}, f32 dot {want}, |err| {} > bound {bound}",
            (got as f64 - want).abs()
        ));
    }
    // dot_row_f32 quantizes block by block exactly as the row quantizer does.
    if ty.is_quantized() {
        let act_ty = ty.vec_dot_type();
        let mut act = vec![0u8; act_ty.row_bytes(n).expect("row bytes")];
        quantize(act_ty, &x, &mut act).map_err(|e| e.to_string())?;
        let via = vec_dot(ty, &w, &act, n).map_err(|e| e.to_string())?;
        if via.to_bits() != got.to_bits() {
            return Err(format!(
                "{ty}: dot_row_f32 {got} != vec_dot of quantized row {via}"
            ));
        }
    }
    Ok(())
}

#[test]
fn dot_row_f32_every_type_within_quantization_bound() {
    for ty in GgmlType::DEQUANTIZABLE {
        for (nb, seed) in [(1usize, 11u64), (4, 12)] {
            check_end_to_end(ty, nb, seed * 1000 + ty.id() as u64)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
    #[test]
    fn dot_row_f32_random(t in 0usize..25, nb in 1usize..4, seed in any::<u64>()) {
        let ty = GgmlType::DEQUANTIZABLE[t];
        if let Err(e) = check_end_to_end(ty, nb, seed) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn hand_computed_values() {
    // Q8_0 · Q8_0: d = 1 and q = 1..=32 against d = 0.5 and q = 2: sum q = 528.
    let mut w = BlockQ8_0 {
        d: f16::from_f32(1.0).to_bits(),
        qs: [0; 32],
    };
    for (i, q) in w.qs.iter_mut().enumerate() {
        *q = i as i8 + 1;
    }
    let a = BlockQ8_0 {
        d: f16::from_f32(0.5).to_bits(),
        qs: [2; 32],
    };
    assert_eq!(vec_dot_q8_0_q8_0(&[w], &[a]), 528.0);
    // Q4_0: every nibble 9 means weight d * (9 - 8) = 2 with d = 2; activations q = 1..=32
    // with d = 1: 2 * 528.
    let w4 = BlockQ4_0 {
        d: f16::from_f32(2.0).to_bits(),
        qs: [0x99; 16],
    };
    let mut a1 = BlockQ8_0 {
        d: f16::from_f32(1.0).to_bits(),
        qs: [0; 32],
    };
    for (i, q) in a1.qs.iter_mut().enumerate() {
        *q = i as i8 + 1;
    }
    assert_eq!(vec_dot_q4_0_q8_0(&[w4], &[a1]), 1056.0);
    // Q4_1: nibbles 0, min m = 3: weights all 3; Q8_1 activation with s = d * sum(q).
    let w41 = BlockQ4_1 {
        d: f16::from_f32(1.0).to_bits(),
        m: f16::from_f32(3.0).to_bits(),
        qs: [0; 16],
    };
    let a81 = BlockQ8_1 {
        d: f16::from_f32(1.0).to_bits(),
        s: f16::from_f32(528.0).to_bits(),
        qs: a1.qs,
    };
    assert_eq!(vec_dot_q4_1_q8_1(&[w41], &[a81]), 1584.0);
    // Float rows.
    assert_eq!(vec_dot_f32(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
    let h: Vec<f16> = [0.5f32, -1.0].iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(vec_dot_f16_f32(&h, &[2.0, 3.0]), -2.0);
    let b: Vec<bf16> = [0.5f32, -1.0].iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(vec_dot_bf16_f32(&b, &[2.0, 3.0]), -2.0);
}

#[test]
fn matvec_is_dot_row_per_row() {
    for ty in GgmlType::DEQUANTIZABLE {
        let mut rng = Rng(500 + ty.id() as u64);
        let bs = if ty.is_quantized() {
            ty.block_size()
        } else {
            32
        };
        let n = 2 * bs;
        let rows = 3;
        let per_row = if ty.is_quantized() { 2 } else { n };
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_weights(ty, per_row, &mut rng))
            .collect();
        let x: Vec<f32> = (0..n).map(|_| rng.sym()).collect();
        let mut out = vec![0.0f32; rows];
        matvec_f32(ty, &w, &x, &mut out).expect("matvec");
        let rb = w.len() / rows;
        for r in 0..rows {
            let want = dot_row_f32(ty, &w[r * rb..(r + 1) * rb], &x).expect("dot_row_f32");
            assert_eq!(out[r].to_bits(), want.to_bits(), "{ty} row {r}");
        }
        let mut short = vec![0.0f32; rows + 1];
        assert!(matches!(
            matvec_f32(ty, &w, &x, &mut short),
            Err(FormatError::LengthMismatch { .. })
        ));
    }
}

#[test]
fn typed_and_byte_paths_agree() {
    let mut rng = Rng(99);
    let w = random_weights(GgmlType::Q4_K, 3, &mut rng);
    let (act, _) = random_activation(GgmlType::Q4_K, 3 * QK_K, &mut rng);
    let wb: Vec<BlockQ4K> = w.chunks(144).map(bytemuck::pod_read_unaligned).collect();
    let ab: Vec<BlockQ8K> = act.chunks(292).map(bytemuck::pod_read_unaligned).collect();
    let typed = vec_dot_q4_k_q8_k(&wb, &ab);
    let bytes = vec_dot(GgmlType::Q4_K, &w, &act, 3 * QK_K).expect("vec_dot");
    assert_eq!(typed.to_bits(), bytes.to_bits());
}

#[test]
fn errors() {
    let w = vec![0u8; 144];
    let act = vec![0u8; 292];
    assert_eq!(
        vec_dot(GgmlType::Q8_K, &act, &act, 256),
        Err(FormatError::Unsupported(GgmlType::Q8_K))
    );
    assert_eq!(
        vec_dot(GgmlType::Q4_K, &w[..143], &act, 256),
        Err(FormatError::PartialBlock {
            ty: GgmlType::Q4_K,
            bytes: 143
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q4_K, &w, &act, 512),
        Err(FormatError::LengthMismatch {
            expected: 256,
            found: 512
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q4_K, &w, &act[..100], 256),
        Err(FormatError::PartialBlock {
            ty: GgmlType::Q8_K,
            bytes: 100
        })
    );
    assert_eq!(
        dot_row_f32(GgmlType::Q4_K, &w, &[0.0; 255]),
        Err(FormatError::LengthMismatch {
            expected: 256,
            found: 255
        })
    );
    assert_eq!(
        dot_row_f32(GgmlType::I32, &[0; 4], &[0.0]),
        Err(FormatError::Unsupported(GgmlType::I32))
    );
    // F16 weights take f32 activations.
    let one = f16::from_f32(1.0).to_bits().to_le_bytes();
    assert_eq!(
        vec_dot(GgmlType::F16, &one, &2.5f32.to_le_bytes(), 1),
        Ok(2.5)
    );
}

/// The fixed cases compared with ggml's own generic kernels: every quantized type, one
/// and three blocks. Returns (type, weights, activation bytes, f32 activation).
/// One comparison case: type, weight bytes, activation bytes, f32 activation.
type Case = (GgmlType, Vec<u8>, Vec<u8>, Vec<f32>);

fn ggml_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for ty in GgmlType::DEQUANTIZABLE {
        if !ty.is_quantized() {
            continue;
        }
        for nb in [1usize, 3] {
            let mut rng = Rng(0xF11E7 + 17 * ty.id() as u64 + nb as u64);
            let n = nb * ty.block_size();
            let w = random_weights(ty, nb, &mut rng);
            let (act, _) = random_activation(ty, n, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.sym() * 3.0).collect();
            out.push((ty, w, act, x));
        }
    }
    out
}

/// Bits of ggml's generic `ggml_vec_dot_<type>` (llama.cpp's `ggml-cpu/quants.c`,
/// compiled with `-DGGML_CPU_GENERIC -ffp-contract=off`) for each of [`ggml_cases`], in
/// order: first on the case's activation bytes, then on `x` quantized by ggml's
/// `quantize_row_q8_{0,1,K}_ref`. Produced by a small C harness over the bytes that
/// `dump_ggml_cases` writes (run it with `FLINT_DOT_DUMP=<file>` and `--ignored`).
const GGML_BITS: &[(u32, u32)] = &[
    (0xbeacde3d, 0x3e656f5d),
    (0x3d6103b6, 0x3d6414bf),
    (0xbefece18, 0x3f282c5a),
    (0x3f832a3a, 0x3ebf8fd5),
    (0xbdbbbc03, 0x3d09d912),
    (0x3f845af8, 0xbf34d2ae),
    (0xc0f303e6, 0xc0cd5990),
    (0xbf299ed1, 0x3faae3a0),
    (0x3fa4be1b, 0x40fd4c88),
    (0x42330a59, 0xc1f7c3d0),
    (0x42cdd502, 0x42c5cce9),
    (0xc1c1ffb7, 0xc14ad92d),
    (0xc0b613a0, 0x424d3fe4),
    (0x403aa3a0, 0x401c7fbc),
    (0x4325782e, 0x4309bf15),
    (0xc3101c50, 0x449adaf0),
    (0x452086fa, 0xc4be43c3),
    (0xc50d718b, 0xc37a92ae),
    (0xbfe15960, 0x3f6a0940),
    (0x42e41858, 0x4486d8a2),
    (0x417ce42e, 0x4288d6d2),
    (0xc3a4fdc0, 0x43138ab7),
    (0xc3b3d83f, 0x4339d77d),
    (0xc19c2e87, 0xbffb2dc8),
    (0xbe21d644, 0x3f0b29cc),
    (0xc339165c, 0x43d037e4),
    (0x4103949e, 0xc101b74d),
    (0xc000840d, 0xc099e079),
    (0x446bdfa5, 0x43ae8b4a),
    (0x438d07fb, 0x443d0890),
    (0x3e84526e, 0x3ca879fe),
    (0xbea132ec, 0xc03a4571),
    (0xc22ef6e7, 0x423d5d60),
    (0xc0ac6084, 0xc0d96b14),
    (0xc220e884, 0xc25f5455),
    (0x4203285a, 0xc2adbff7),
    (0x4371c00f, 0xc461dafb),
    (0x447fd8d4, 0x45723093),
    (0x3c6898af, 0x3da8415e),
    (0xc0e9b08e, 0xc0df1f10),
    (0xbe0b0d87, 0x3e124569),
    (0x400a64b1, 0x40001807),
    (0x3e3aa018, 0xbeb77168),
    (0xbee26ba8, 0x418bd58c),
];

#[test]
fn bit_exact_with_ggml_generic_kernels() {
    let cases = ggml_cases();
    assert_eq!(cases.len(), GGML_BITS.len(), "one ggml result per case");
    for ((ty, w, act, x), &(want_act, want_x)) in cases.iter().zip(GGML_BITS) {
        let n = x.len();
        let got = vec_dot(*ty, w, act, n).expect("vec_dot");
        assert_eq!(
            got.to_bits(),
            want_act,
            "{ty} x{}: {got} vs ggml {}",
            n,
            f32::from_bits(want_act)
        );
        let got = dot_row_f32(*ty, w, x).expect("dot_row_f32");
        assert_eq!(
            got.to_bits(),
            want_x,
            "{ty} x{} (f32 row): {got} vs ggml {}",
            n,
            f32::from_bits(want_x)
        );
    }
}

/// Writes [`ggml_cases`] for the C harness: per case u32 type id, u32 n, u32 weight
/// bytes, weights, u32 activation bytes, activation, n f32.
#[test]
#[ignore = "generator for GGML_BITS, not a check"]
fn dump_ggml_cases() {
    let Ok(path) = std::env::var("FLINT_DOT_DUMP") else {
        return;
    };
    let mut buf = Vec::new();
    for (ty, w, act, x) in ggml_cases() {
        buf.extend(ty.id().to_le_bytes());
        buf.extend((x.len() as u32).to_le_bytes());
        buf.extend((w.len() as u32).to_le_bytes());
        buf.extend(&w);
        buf.extend((act.len() as u32).to_le_bytes());
        buf.extend(&act);
        buf.extend(x.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(path, buf).expect("write dump");
}

// GGML_BITS comes from the C harness `tools/golden/ggml_vec_dot.c` (its header says how
// to build and run it) on the records this file dumps.
