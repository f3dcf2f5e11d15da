//! Matvec benches of the low-bit expert types whose SIMD kernels keep the scalar
//! reference's order (IQ4_NL, IQ4_XS, Q3_K, Q2_K), against the scalar path and a read
//! loop.
//!
//! `FLINT_THREADS=2 cargo bench -p flint-hal-cpu --bench lowbit`
//!
//! - `lowbit/<type>`: M = 1 on a 4096 x 4096 weight at the CPU's SIMD level (or
//!   `FLINT_CPU_SIMD`); throughput in weight bytes.
//! - `lowbit_scalar/<type>`: the same on the scalar path (`flint_core::dot::vec_dot`).
//! - `lowbit/read_loop`: a plain read of as many bytes as the IQ4_XS weight, same threads.
//! - A summary printed at the end, on a `K x SUMMARY_N` weight (44 to 75 MB: past a 32 MB
//!   last-level cache; a host with a larger one serves part of it from there, for the
//!   read loop alike): per type, `ROUNDS` alternating rounds of (SIMD
//!   matvec, scalar matvec, read loop over the weight's number of bytes), the SIMD and
//!   read timings each the median of three calls, the scalar one a single call; the
//!   medians over the rounds in GB/s, and SIMD over read loop. Q4_K's matvec (its own
//!   kernels) is printed with them as a yardstick.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions, WeightDesc, WeightHandle, WeightKind, WeightSource};
use flint_hal_cpu::{CpuDevice, SimdLevel};

const TYPES: [GgmlType; 4] = [
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
];

/// The matrix: 4096 x 4096 (7 to 9 MB in these types).
const K: usize = 4096;
const N: usize = 4096;

/// Rows of the summary's weight.
const SUMMARY_N: usize = 32768;

/// Alternating rounds of the summary.
const ROUNDS: usize = 7;

fn opts() -> DeviceOptions {
    DeviceOptions::from_env().expect("FLINT_THREADS / FLINT_KEEP_QUANT")
}

fn pool(dev: &CpuDevice) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(dev.threads())
        .build()
        .expect("pool")
}

/// A staged `K x n` weight of `ty` (small random bytes: finite scales), and its bytes.
fn stage(dev: &CpuDevice, ty: GgmlType, n: usize) -> (WeightHandle, usize) {
    let len = ty.row_bytes(K).expect("whole blocks") * n;
    let data = common::small_bytes(len, &mut 0x1234_5678u64);
    let d = WeightDesc {
        name: format!("bench.{ty}"),
        ty,
        dims: vec![K, n],
        kind: WeightKind::Matrix,
        data: WeightSource::from_vec(data),
    };
    (dev.stage(&d).expect("stage"), len)
}

fn input() -> Vec<f32> {
    (0..K)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect()
}

fn benches(c: &mut Criterion) {
    let simd = CpuDevice::new(&opts()).expect("open cpu");
    let scalar = CpuDevice::with_level(&opts(), SimdLevel::Scalar).expect("open scalar cpu");
    eprintln!("device: {}", simd.description());
    let x = input();
    let mut out = vec![0f32; N];
    for (group, dev) in [("lowbit", &simd), ("lowbit_scalar", &scalar)] {
        let mut g = c.benchmark_group(group);
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for ty in TYPES {
            let (w, bytes) = stage(dev, ty, N);
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(ty.name(), |b| {
                b.iter(|| {
                    dev.matmul(&*w, black_box(&x).into(), 1, (&mut out).into())
                        .expect("matmul")
                })
            });
        }
        if group == "lowbit" {
            let pool = pool(&simd);
            let buf = vec![1u64; GgmlType::IQ4_XS.row_bytes(K).expect("row") * N / 8];
            g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
            g.bench_function("read_loop", |b| {
                b.iter(|| common::read_loop(&pool, black_box(&buf)))
            });
        }
        g.finish();
    }
}

/// The median of `t`.
fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

/// The median seconds of `calls` calls of `f` (after one untimed call).
fn time<F: FnMut()>(calls: usize, mut f: F) -> f64 {
    f();
    median(
        (0..calls)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn summary(_: &mut Criterion) {
    let simd = CpuDevice::new(&opts()).expect("open cpu");
    let scalar = CpuDevice::with_level(&opts(), SimdLevel::Scalar).expect("open scalar cpu");
    let pool = pool(&simd);
    let x = input();
    let mut out = vec![0f32; SUMMARY_N];
    println!(
        "\n== low-bit matvec {K}x{SUMMARY_N} ({}; {} threads; {ROUNDS} alternating rounds, medians) ==",
        simd.description(),
        simd.threads()
    );
    for ty in TYPES.into_iter().chain([GgmlType::Q4_K]) {
        let (ws, bytes) = stage(&simd, ty, SUMMARY_N);
        let (wr, _) = stage(&scalar, ty, SUMMARY_N);
        let buf = vec![1u64; bytes / 8];
        let (mut ts, mut tr, mut tl) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            ts.push(time(3, || {
                simd.matmul(&*ws, (&x).into(), 1, (&mut out).into())
                    .expect("matmul");
            }));
            tr.push(time(1, || {
                scalar
                    .matmul(&*wr, (&x).into(), 1, (&mut out).into())
                    .expect("matmul");
            }));
            tl.push(time(3, || {
                black_box(common::read_loop(&pool, &buf));
            }));
        }
        let gbs = |t: Vec<f64>| bytes as f64 / median(t) / 1e9;
        let (s, r, l) = (gbs(ts), gbs(tr), gbs(tl));
        println!(
            "{:>6} ({:.1} MB): SIMD {s:6.2} GB/s, scalar {r:6.2} GB/s ({:.1}x), read loop {l:6.2} GB/s, SIMD / read {:.2}",
            ty.name(),
            bytes as f64 / 1e6,
            s / r,
            s / l
        );
    }
}

criterion_group!(lowbit, benches, summary);
criterion_main!(lowbit);
