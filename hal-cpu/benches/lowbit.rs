//! Matvec benches of the low-bit expert types whose SIMD kernels keep the scalar
//! reference's order (IQ4_NL, IQ4_XS, Q3_K, Q2_K), against the scalar path and a read
//! loop.
//!
//! `FLINT_THREADS=2 cargo bench -p flint-hal-cpu --bench lowbit`
//!
//! - `lowbit/<type>`: M = 1 on a 4096 x 4096 weight at the CPU's SIMD level (or
//!   `FLINT_CPU_SIMD`); throughput in weight bytes.
//! - `lowbit_scalar/<type>`: the same on the scalar path (`flint_core::dot::vec_dot`).
//! - `lowbit/read_loop`: a read of as many bytes as the IQ4_XS weight, same threads, in
//!   four prefetched streams a thread (`common::read_loop`), from huge pages as the weights.
//! - A summary printed at the end, on a `K`-wide weight of about `LOWBIT_MB` MiB (1024:
//!   twice the last-level cache of the host it was written on, so both the weight and the
//!   read loop's buffer come from memory): per type, `PAIRS` pairs of one SIMD matvec and
//!   one read loop over the weight's number of bytes (the faster of one stream and four
//!   prefetched streams a thread, both timed: `common::fastest_read_secs`), each timed alone, which of the two
//!   goes first alternating from pair to pair; the medians (and quartiles) of each in GB/s
//!   and of the pairs' ratios. A pair spans tens of milliseconds, so a host whose memory
//!   bandwidth drifts from minute to minute moves both halves of a ratio together. Q4_K's
//!   matvec (its own kernels) is printed with them as a yardstick.

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

/// The summary's weight size in MiB (`LOWBIT_MB`): twice the 480 MiB last-level cache
/// the Intel Xeon VM reports, so neither the weight nor the read loop's buffer is served
/// from it.
const SUMMARY_MB: usize = 1024;

/// Pairs of (matvec, read loop) in the summary.
const PAIRS: usize = 15;

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
            let buf = common::ReadBuf::new(GgmlType::IQ4_XS.row_bytes(K).expect("row") * N / 8);
            g.throughput(Throughput::Bytes((buf.words().len() * 8) as u64));
            g.bench_function("read_loop", |b| {
                b.iter(|| common::read_loop(&pool, black_box(buf.words())))
            });
        }
        g.finish();
    }
}

/// The median and the quartiles of `t`.
fn quartiles(mut t: Vec<f64>) -> [f64; 3] {
    t.sort_by(|a, b| a.total_cmp(b));
    let at = |q: usize| t[(t.len() - 1) * q / 4];
    [at(1), at(2), at(3)]
}

/// The seconds one call of `f` takes.
fn time<F: FnMut()>(mut f: F) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn summary(_: &mut Criterion) {
    let simd = CpuDevice::new(&opts()).expect("open cpu");
    let pool = pool(&simd);
    let x = input();
    let target = common::env_usize("LOWBIT_MB", SUMMARY_MB) << 20;
    println!(
        "\n== low-bit matvec, {K} wide, ~{} MB a weight ({}; {} threads; {PAIRS} pairs of \
         one matvec and one read loop over as many bytes, alternating which goes first) ==",
        target >> 20,
        simd.description(),
        simd.threads()
    );
    for ty in TYPES.into_iter().chain([GgmlType::Q4_K]) {
        let rows = (target / ty.row_bytes(K).expect("whole blocks")).next_multiple_of(256);
        let (ws, bytes) = stage(&simd, ty, rows);
        let buf = common::ReadBuf::new(bytes / 8);
        let mut out = vec![0f32; rows];
        let mut matvec = || {
            simd.matmul(&*ws, (&x).into(), 1, (&mut out).into())
                .expect("matmul");
        };
        // The faster of the two read patterns (`common::fastest_read_secs`).
        let read = |p: usize| common::fastest_read_secs(&pool, buf.words(), p % 4 < 2);
        // First touches (page faults) and the pool's threads, untimed.
        matvec();
        read(0);
        let (mut ts, mut tl, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for p in 0..PAIRS {
            let (s, l) = if p % 2 == 0 {
                let s = time(&mut matvec);
                (s, read(p))
            } else {
                let l = read(p);
                (time(&mut matvec), l)
            };
            ts.push(bytes as f64 / s / 1e9);
            tl.push(bytes as f64 / l / 1e9);
            ratio.push(l / s);
        }
        let ([s0, s, s1], [l0, l, l1], [r0, r, r1]) =
            (quartiles(ts), quartiles(tl), quartiles(ratio));
        println!(
            "{:>6} ({:.0} MB): SIMD {s:5.1} GB/s ({s0:.1}-{s1:.1}), read loop {l:5.1} GB/s \
             ({l0:.1}-{l1:.1}), SIMD / read loop {r:.2} ({r0:.2}-{r1:.2})",
            ty.name(),
            bytes as f64 / 1e6,
        );
    }
}

criterion_group!(lowbit, benches, summary);
criterion_main!(lowbit);
