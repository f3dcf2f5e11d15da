//! Kernel speed (one thread unless told otherwise) on a cache-resident weight: the best of many calls, which
//! on a shared, noisy machine is a steadier measure of what a kernel can do than a mean.
//!
//! `cargo bench -p flint-hal-cpu --bench kernel_speed` (`KERNEL_ROWS` sets the number of
//! weight rows, default 1024; `KERNEL_K` their width, default 4096; `KERNEL_M` the
//! activation rows of the batched measure, default 4; `KERNEL_TYPES` e.g. `q5_0,q4_K`;
//! `KERNEL_ROUNDS` the calls timed, default 200; `KERNEL_THREADS` the threads, default 1;
//! `KERNEL_LEVEL` one SIMD level, e.g. `avx512vnni`).
//! A Gemma 3 270M prompt batch: `KERNEL_K=640 KERNEL_ROWS=2048 KERNEL_M=512`.
//!
//! Per SIMD level and type: M = 1 in GB/s of weight and GMAC/s, and M = `KERNEL_M` (each
//! weight block decoded once for several activation rows) in GMAC/s.

mod common;

use std::hint::black_box;
use std::time::Instant;

use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions, WeightDesc, WeightKind, WeightSource};
use flint_hal_cpu::{CpuDevice, SimdLevel};

fn main() {
    let env = common::env_usize;
    let k = env("KERNEL_K", 4096);
    // Activation rows of the batched measure (4: one tile; 512: a prompt batch).
    let mb = env("KERNEL_M", 4).max(1);
    let types: Vec<GgmlType> = match std::env::var("KERNEL_TYPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|t| GgmlType::from_name(t.trim()))
            .collect(),
        Err(_) => vec![
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::F16,
            GgmlType::F32,
        ],
    };
    let n: usize = std::env::var("KERNEL_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let best = SimdLevel::detect();
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| *l >= SimdLevel::Avx2 && *l <= best)
        .filter(|l| std::env::var("KERNEL_LEVEL").map_or(true, |v| v == l.name()))
        .collect();
    let threads: usize = std::env::var("KERNEL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let inside = std::env::var_os("KERNEL_INSIDE").is_some();
    let opts = DeviceOptions {
        threads: Some(threads),
        keep_quant: true,
    };
    for level in levels {
        let dev = CpuDevice::with_level(&opts, level).expect("open cpu");
        for &ty in &types {
            let Some(rb) = ty.row_bytes(k) else {
                println!(
                    "{:>6} {:>5}: k = {k} is not whole blocks",
                    level.name(),
                    ty.name()
                );
                continue;
            };
            let len = rb * n;
            let data = common::small_bytes(len, &mut 1u64);
            let d = WeightDesc {
                name: "w".into(),
                ty,
                dims: vec![k, n],
                kind: WeightKind::Matrix,
                data: WeightSource::from_vec(data),
            };
            let w = dev.stage(&d).expect("stage");
            let x: Vec<f32> = (0..k * mb).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0f32; n * mb];
            let rounds = env("KERNEL_ROUNDS", 200);
            let mut timed = || {
                let (mut b1, mut b4) = (f64::MAX, f64::MAX);
                for _ in 0..rounds {
                    let t = Instant::now();
                    dev.matmul(&*w, black_box(&x[..k]).into(), 1, (&mut out[..n]).into())
                        .expect("matmul");
                    b1 = b1.min(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    dev.matmul(&*w, black_box(&x).into(), mb, (&mut out).into())
                        .expect("matmul");
                    b4 = b4.min(t.elapsed().as_secs_f64());
                }
                (b1, b4)
            };
            // Called from a foreign thread (each call hands work to the pool and waits),
            // or from inside the pool as the engine does for a whole step.
            let (b1, b4) = if inside { dev.install(timed) } else { timed() };
            println!(
                "{:>6} {:>5}: M=1 {:6.2} GB/s {:6.2} GMAC/s | M={mb} {:6.2} GMAC/s",
                level.name(),
                ty.name(),
                len as f64 / b1 / 1e9,
                (k * n) as f64 / b1 / 1e9,
                (mb * k * n) as f64 / b4 / 1e9
            );
        }
    }
}
