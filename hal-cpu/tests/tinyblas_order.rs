//! The Q8_0 and Q5_0 kernels follow llama.cpp's tinyBLAS float order bit for bit: at
//! every SIMD level this CPU has, every output equals
//! `flint_core::dot::matvec_f32_ggml_x86` (the scalar statement of that order) exactly,
//! for single rows and for tiles.

mod common;

use common::*;
use flint_core::dot::ggml_x86::Q4kPath;
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions};
use flint_hal_cpu::{CpuDevice, SimdLevel};

#[test]
fn q8_0_and_q5_0_kernels_are_bit_exact_in_tinyblas_order() {
    let levels: Vec<SimdLevel> = [SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: SIMD kernels not exercised");
        return;
    }
    let mut rng = Rng(7);
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
        for (k, n) in [(640, 9), (2048, 5), (96, 3)] {
            let w = random_weight(&mut rng, ty, k, n);
            let rb = ty.row_bytes(k).expect("row size");
            for m in [1usize, 2, 5, 9] {
                let x = rng.vec(m * k);
                let mut want = vec![0f32; m * n];
                for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
                    flint_core::dot::matvec_f32_ggml_x86(ty, &w[..n * rb], xr, o, Q4kPath::Gemm)
                        .expect("core");
                }
                for &level in &levels {
                    let opts = DeviceOptions {
                        threads: Some(2),
                        keep_quant: true,
                    };
                    let dev = CpuDevice::with_level(&opts, level).expect("device");
                    let h = dev
                        .stage(&desc("w", ty, &[k, n], w.clone()))
                        .expect("stage");
                    let mut got = vec![f32::NAN; m * n];
                    dev.matmul(&*h, &x, m, &mut got).expect("matmul");
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{ty} {level:?} k {k} n {n} m {m} value {i}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}
