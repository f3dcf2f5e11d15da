//! MXFP4 matmuls (`kernels/mxfp4.rs`) against the core reference in llama.cpp's order
//! (`flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack` on the activation quantized by
//! `quantize_row_q8_0_act`), bit for bit: random blocks with realistic E8M0 exponents,
//! every activation row count 1-35, several widths (one block, a few, whole chunks of
//! eight with and without a remainder, gpt-oss's 2880), every SIMD level this CPU has
//! and the scalar level (AVX-512 VNNI in both weight layouts); `matmul`, `matmul_multi`, `expert_matmul` and
//! `expert_matmul_multi`.

mod common;

use common::*;
use flint_core::blocks::{BlockMXFP4, BlockQ8_0};
use flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack;
use flint_core::quant::quantize_row_q8_0_act;
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions};
use flint_hal_cpu::kernels::native_kernel;
use flint_hal_cpu::{CpuDevice, SimdLevel, WeightLayout};

const TY: GgmlType = GgmlType::MXFP4;

/// Every level this CPU has, the scalar one included.
fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect()
}

fn device(level: SimdLevel) -> CpuDevice {
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    CpuDevice::with_level(&opts, level).expect("open cpu device")
}

/// A device at every level this CPU has, and at AVX-512 VNNI one per weight layout (the
/// file's rows and the repacked 16-row groups, `kernels/mxfp4/x16.rs`), whatever this
/// CPU's default layout.
fn devices() -> Vec<(String, CpuDevice)> {
    let mut out = Vec::new();
    for level in levels() {
        if level == SimdLevel::Avx512Vnni {
            for layout in [WeightLayout::File, WeightLayout::Packed] {
                out.push((
                    format!("{level:?} {layout:?}"),
                    device(level).with_layout(layout),
                ));
            }
        } else {
            out.push((format!("{level:?}"), device(level)));
        }
    }
    out
}

/// `rows` rows of `k` random MXFP4 values: random nibbles, E8M0 scales 2^-15..2^9 (codes
/// 112..136: weights up to 6 * 2^9, every product and sum finite).
fn weight(rng: &mut Rng, k: usize, rows: usize) -> Vec<u8> {
    let mut b = rng.bytes(rows * k / 32 * 17);
    for blk in b.chunks_exact_mut(17) {
        blk[0] = 112 + (rng.next_u64() % 25) as u8;
    }
    b
}

/// As [`weight`], with every value positive and large (codes 5..8: 6, 8, 12) so that the
/// block sums (with positive activations) need more than the 13 bits that keep
/// `sum * D(e) * d_a` exact: a fused and an unfused multiply-add differ there.
fn large_weight(rng: &mut Rng, k: usize, rows: usize) -> Vec<u8> {
    let mut b = weight(rng, k, rows);
    for blk in b.chunks_exact_mut(17) {
        for q in &mut blk[1..] {
            let (lo, hi) = (5 + (*q & 0x0f) % 3, 5 + (*q >> 4) % 3);
            *q = lo | (hi << 4);
        }
    }
    b
}

/// Activation rows with magnitudes spread over a few decades (per block scales differ).
fn acts(rng: &mut Rng, m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| rng.f() * [1.0, 0.01, 30.0, 0.3][(i / 32) % 4])
        .collect()
}

/// `out[i * n + o]` = the reference for weight row `o` of `w` and activation row `i`.
fn reference(w: &[u8], k: usize, n: usize, x: &[f32]) -> Vec<f32> {
    let wb: &[BlockMXFP4] = bytemuck::cast_slice(w);
    let nb = k / 32;
    let mut out = Vec::new();
    for xr in x.chunks_exact(k) {
        let mut a = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; nb];
        quantize_row_q8_0_act(xr, &mut a);
        out.extend((0..n).map(|o| vec_dot_mxfp4_q8_0_repack(&wb[o * nb..(o + 1) * nb], &a)));
    }
    out
}

fn assert_bits(what: &str, got: &[f32], want: &[f32], n: usize) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{what}: activation row {}, output {}: {g} vs {e}",
            i / n,
            i % n
        );
    }
}

#[test]
fn every_simd_level_has_an_mxfp4_kernel() {
    for level in levels() {
        let want = (level >= SimdLevel::Avx2).then_some(level);
        assert_eq!(native_kernel(level, TY), want, "{level:?}");
        assert!(device(level).supports(flint_hal::Op::Matmul, Some(TY)));
    }
}

#[test]
fn matmul_is_bit_exact_for_rows_1_to_35() {
    let mut rng = Rng(0x4d58);
    let devs = devices();
    // Widths: 1 block, 3 blocks (no whole chunk of eight), 9 (a chunk and one), 25, and
    // gpt-oss's 2880 (90); weight rows below, at and above the 64-row cache blocks.
    for (k, n) in [(32, 7), (96, 33), (288, 16), (800, 70), (2880, 5)] {
        let w = weight(&mut rng, k, n);
        let staged: Vec<_> = devs
            .iter()
            .map(|(_, d)| d.stage(&desc("w", TY, &[k, n], w.clone())).expect("stage"))
            .collect();
        for m in 1..=35 {
            let x = acts(&mut rng, m, k);
            let want = reference(&w, k, n, &x);
            for ((name, dev), h) in devs.iter().zip(&staged) {
                let mut got = vec![f32::NAN; m * n];
                dev.matmul(&**h, (&x).into(), m, (&mut got).into())
                    .expect("matmul");
                assert_bits(&format!("{name} k {k} n {n} m {m}"), &got, &want, n);
            }
        }
    }
}

#[test]
fn matmul_rounds_once_per_block_with_large_sums() {
    let mut rng = Rng(0x4d5b);
    let (k, n) = (288, 16);
    let w = large_weight(&mut rng, k, n);
    for (name, dev) in devices() {
        let h = dev
            .stage(&desc("w", TY, &[k, n], w.clone()))
            .expect("stage");
        for m in 1..=35 {
            let x: Vec<f32> = acts(&mut rng, m, k).iter().map(|v| v.abs() + 0.5).collect();
            let want = reference(&w, k, n, &x);
            let mut got = vec![f32::NAN; m * n];
            dev.matmul(&*h, (&x).into(), m, (&mut got).into())
                .expect("matmul");
            assert_bits(&format!("{name} large sums m {m}"), &got, &want, n);
        }
    }
}

#[test]
fn matmul_multi_is_bit_exact_for_rows_1_to_35() {
    let mut rng = Rng(0x4d59);
    let k = 288;
    let (n0, n1) = (16, 9);
    let w0 = weight(&mut rng, k, n0);
    let w1 = weight(&mut rng, k, n1);
    for (name, dev) in devices() {
        let h0 = dev
            .stage(&desc("gate", TY, &[k, n0], w0.clone()))
            .expect("stage");
        let h1 = dev
            .stage(&desc("up", TY, &[k, n1], w1.clone()))
            .expect("stage");
        for m in 1..=35 {
            let x = acts(&mut rng, m, k);
            let mut o0 = vec![f32::NAN; m * n0];
            let mut o1 = vec![f32::NAN; m * n1];
            dev.matmul_multi(
                &[&*h0, &*h1],
                (&x).into(),
                m,
                &mut [(&mut o0).into(), (&mut o1).into()],
            )
            .expect("matmul_multi");
            let what = format!("{name} m {m}");
            assert_bits(&format!("{what} gate"), &o0, &reference(&w0, k, n0, &x), n0);
            assert_bits(&format!("{what} up"), &o1, &reference(&w1, k, n1, &x), n1);
        }
    }
}

#[test]
fn expert_matmuls_are_bit_exact_for_rows_1_to_35() {
    let mut rng = Rng(0x4d5a);
    let (k, n, e) = (288, 16, 4);
    let tower0 = weight(&mut rng, k, n * e);
    let tower1 = weight(&mut rng, k, n * e);
    let row_bytes = k / 32 * 17;
    let expert = |t: &[u8], ex: usize| t[ex * n * row_bytes..(ex + 1) * n * row_bytes].to_vec();
    for (name, dev) in devices() {
        let t0 = dev
            .stage(&desc("gate_exps", TY, &[k, n, e], tower0.clone()))
            .expect("stage");
        let t1 = dev
            .stage(&desc("up_exps", TY, &[k, n, e], tower1.clone()))
            .expect("stage");
        // 1-35 tokens, two experts each: expert 0 gets every token (16 and more of them
        // from 16 tokens: the prompt-batch path), the others a share (1, a few, more).
        for n_in in 1..=35usize {
            let x = acts(&mut rng, n_in, k);
            // Two experts per token (a fan-out of 2): routed row `r` reads input row `r / 2`.
            let rows: Vec<u32> = (0..n_in)
                .flat_map(|i| [0, (1 + (i * 7 + n_in) % 3) as u32])
                .collect();
            let want = |t: &[u8]| -> Vec<f32> {
                rows.iter()
                    .enumerate()
                    .flat_map(|(r, &ex)| {
                        let i = r / 2;
                        reference(&expert(t, ex as usize), k, n, &x[i * k..(i + 1) * k])
                    })
                    .collect()
            };
            let (want0, want1) = (want(&tower0), want(&tower1));
            let what = format!("{name} tokens {n_in}");
            let mut o = vec![f32::NAN; rows.len() * n];
            dev.expert_matmul(&*t0, (&x).into(), (&rows).into(), (&mut o).into())
                .expect("expert_matmul");
            assert_bits(&format!("{what} expert_matmul"), &o, &want0, n);
            let mut o0 = vec![f32::NAN; rows.len() * n];
            let mut o1 = vec![f32::NAN; rows.len() * n];
            dev.expert_matmul_multi(
                &[&*t0, &*t1],
                (&x).into(),
                (&rows).into(),
                &mut [(&mut o0).into(), (&mut o1).into()],
            )
            .expect("expert_matmul_multi");
            assert_bits(&format!("{what} multi gate"), &o0, &want0, n);
            assert_bits(&format!("{what} multi up"), &o1, &want1, n);
        }
    }
}
