//! Error bounds of the quantizers: quantize → dequantize round trips on random data
//! (proptest) and measured RMSE on Gaussian data (bounds documented in docs/formats.md).

use flint_core::blocks::BlockQ8K;
use flint_core::dequant::dequantize;
use flint_core::quant::{quantize, quantize_row_q8_k};
use flint_core::{GgmlType, QK_K};
use proptest::prelude::*;

/// Deterministic standard-normal samples (xorshift64* + Box–Muller), so the RMSE
/// figures are reproducible.
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let bytes = ty.row_bytes(x.len()).expect("whole blocks");
    let mut q = vec![0u8; bytes];
    quantize(ty, x, &mut q).expect("quantize");
    let mut y = vec![0.0f32; x.len()];
    dequantize(ty, &q, &mut y).expect("dequantize");
    y
}

fn rmse(x: &[f32], y: &[f32]) -> f64 {
    let s: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    (s / x.len() as f64).sqrt()
}

/// Measured RMSE on N(0, 1) data, 64 Ki elements, and the bound asserted (the measured
/// figure plus about 5 % margin). Keep in sync with docs/formats.md.
const RMSE_BOUNDS: [(GgmlType, f64); 6] = [
    (GgmlType::Q4_0, 0.0896), // measured 0.085350
    (GgmlType::Q5_0, 0.0446), // measured 0.042451
    (GgmlType::Q8_0, 0.0056), // measured 0.005322
    (GgmlType::Q4_K, 0.0745), // measured 0.070976
    (GgmlType::Q5_K, 0.0377), // measured 0.035898
    (GgmlType::Q6_K, 0.0186), // measured 0.017660
];

#[test]
fn rmse_on_gaussian_data_within_documented_bounds() {
    let x = gaussian(64 * 1024, 7);
    for (ty, bound) in RMSE_BOUNDS {
        let e = rmse(&x, &round_trip(ty, &x));
        println!("{ty}: rmse {e:.6}");
        assert!(e <= bound, "{ty}: rmse {e} above bound {bound}");
    }
}

/// Every element of a symmetric legacy block (d = amax / `div`, stored as f16) comes
/// back within `k * |d|`: half a step for round-to-nearest, a full step for Q4_0/Q5_0
/// at the end of the range that has one level fewer, plus the f16 rounding of `d`
/// (relative 2^-11, times at most 128 levels).
fn check_legacy(ty: GgmlType, x: &[f32], div: f32, k: f32) {
    let y = round_trip(ty, x);
    for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bound = amax / div * k + 1e-30;
        for (a, b) in xb.iter().zip(yb) {
            assert!((a - b).abs() <= bound, "{ty}: {a} -> {b}, bound {bound}");
        }
    }
}

/// A 256-element super-block whose eight sub-blocks have scales spread over four
/// decades, some with an offset: what weight rows look like, and hard for K-quants.
fn superblock() -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(-1.0f32..1.0, QK_K),
        prop::collection::vec((-3.0f32..1.0, -1.0f32..1.0, any::<bool>()), 8),
    )
        .prop_map(|(v, subs)| {
            v.iter()
                .enumerate()
                .map(|(i, &u)| {
                    let (e, off, shifted) = subs[i / 32];
                    let sc = 10f32.powf(e);
                    u * sc + if shifted { off * sc } else { 0.0 }
                })
                .collect()
        })
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let rms = (x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
    if rms == 0.0 {
        0.0
    } else {
        rmse(x, y) / rms
    }
}

proptest! {
    #[test]
    fn q8_0_round_trip_within_half_step(x in prop::collection::vec(-1000.0f32..1000.0, 32..=128)) {
        let n = x.len() / 32 * 32;
        check_legacy(GgmlType::Q8_0, &x[..n], 127.0, 0.5 + 128.0 / 2048.0);
    }

    #[test]
    fn q4_0_round_trip_within_one_step(x in prop::collection::vec(-1000.0f32..1000.0, 32..=128)) {
        let n = x.len() / 32 * 32;
        check_legacy(GgmlType::Q4_0, &x[..n], 8.0, 1.0 + 8.0 / 2048.0);
    }

    #[test]
    fn q5_0_round_trip_within_one_step(x in prop::collection::vec(-1000.0f32..1000.0, 32..=128)) {
        let n = x.len() / 32 * 32;
        check_legacy(GgmlType::Q5_0, &x[..n], 16.0, 1.0 + 16.0 / 2048.0);
    }

    /// Relative RMSE per super-block; worst seen over 3000 such blocks: Q4_K 0.104,
    /// Q5_K 0.066, Q6_K 0.029. Bounds documented in docs/formats.md.
    #[test]
    fn k_quants_relative_rmse_bounded(x in superblock()) {
        for (ty, bound) in [(GgmlType::Q4_K, 0.15), (GgmlType::Q5_K, 0.10), (GgmlType::Q6_K, 0.045)] {
            let e = rel_rmse(&x, &round_trip(ty, &x));
            prop_assert!(e <= bound, "{}: relative rmse {} above {}", ty, e, bound);
        }
    }

    #[test]
    fn q8_k_bsums_are_group_sums_and_error_within_half_step(
        x in prop::collection::vec(-1e4f32..1e4, QK_K..=2 * QK_K)
    ) {
        let nb = x.len() / QK_K;
        let x = &x[..nb * QK_K];
        let mut blocks = vec![bytemuck::Zeroable::zeroed(); nb];
        quantize_row_q8_k(x, &mut blocks);
        for (b, xb) in blocks.iter().zip(x.chunks(QK_K)) {
            let b: &BlockQ8K = b;
            for j in 0..QK_K / 16 {
                let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                prop_assert_eq!(b.bsums[j] as i32, s);
            }
            // d is kept in f32, so only the two f32 roundings add to the half step.
            let bound = b.d.abs() * (0.5 + 1e-4);
            for (i, &v) in xb.iter().enumerate() {
                let y = b.d * b.qs[i] as f32;
                prop_assert!((v - y).abs() <= bound, "{} -> {} bound {}", v, y, bound);
            }
        }
    }

    #[test]
    fn q8_1_sum_field_is_d_times_sum(x in prop::collection::vec(-100.0f32..100.0, 32..=64)) {
        use flint_core::blocks::BlockQ8_1;
        let x = &x[..32];
        let mut b = [<BlockQ8_1 as bytemuck::Zeroable>::zeroed()];
        flint_core::quant::quantize_row_q8_1(x, &mut b);
        let d = half::f16::from_bits(b[0].d).to_f32();
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        // s is f16(d_f32 * sum) with the unrounded d; allow the f16 rounding of d.
        let s = half::f16::from_bits(b[0].s).to_f32();
        prop_assert!((s - d * sum as f32).abs() <= (d * sum as f32).abs() / 512.0 + 1e-6);
        check_legacy(GgmlType::Q8_0, x, 127.0, 0.5 + 128.0 / 2048.0);
    }

    /// Any byte pattern decodes without panicking, at any alignment.
    #[test]
    fn dequantize_accepts_any_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..700),
        offset in 0usize..4,
        which in 0usize..25,
    ) {
        let ty = GgmlType::DEQUANTIZABLE[which];
        let ts = ty.type_size();
        let offset = offset.min(bytes.len());
        let avail = bytes.len() - offset;
        let src = &bytes[offset..offset + avail / ts * ts];
        let mut out = vec![0.0f32; src.len() / ts * ty.block_size()];
        prop_assert_eq!(dequantize(ty, src, &mut out), Ok(()));
    }
}
