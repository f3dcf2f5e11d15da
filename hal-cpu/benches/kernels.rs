//! Kernel benches of the CPU backend.
//!
//! `FLINT_THREADS=2 cargo bench -p flint-hal-cpu --bench kernels`
//!
//! - `matvec/<type>`: M = 1 on a 4096 x 4096 weight; throughput in weight bytes.
//! - `matmul512/<type>`: M = 512 on a 2048 x 2048 weight; throughput in elements =
//!   multiply-accumulates (int8 MACs for block types, f32 for float weights).
//! - `read_loop`: a read of a buffer with the same threads (four prefetched streams a
//!   thread, from huge pages as the weights), for comparison.
//! - A summary printed at the end: the target, Q4_K matvec on 14336 x 4096 with
//!   the device threads, against a read loop over a buffer of the same size, measured
//!   interleaved in the same run: GB/s of both and the ratio; and GB/s + GMAC/s per type.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions, WeightDesc, WeightHandle, WeightKind, WeightSource};
use flint_hal_cpu::CpuDevice;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::MXFP4,
    GgmlType::F16,
    GgmlType::F32,
];

fn opts() -> DeviceOptions {
    DeviceOptions::from_env().expect("FLINT_THREADS / FLINT_KEEP_QUANT")
}

fn threads() -> usize {
    opts()
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Deterministic pseudo-random bytes with sane f16 scales (a fixed 0.01 in every f16
/// scale slot of the block layouts used here, 2^0 as every MXFP4 exponent; the quant bits
/// are arbitrary).
fn weight_bytes(ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let len = ty.row_bytes(k).expect("whole blocks") * n;
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut b: Vec<u8> = (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let h = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    if ty.is_quantized() {
        for blk in b.chunks_exact_mut(ty.type_size()) {
            for &o in fields {
                blk[o..o + 2].copy_from_slice(&h);
            }
            if ty == GgmlType::MXFP4 {
                blk[0] = 127;
            }
        }
    } else {
        // Finite floats: small f16 / f32 values.
        let es = ty.type_size();
        for (i, e) in b.chunks_exact_mut(es).enumerate() {
            let v = ((i % 17) as f32 - 8.0) * 0.01;
            match ty {
                GgmlType::F32 => e.copy_from_slice(&v.to_le_bytes()),
                _ => e.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
            }
        }
    }
    b
}

fn stage(dev: &CpuDevice, ty: GgmlType, k: usize, n: usize) -> (WeightHandle, usize) {
    let data = weight_bytes(ty, k, n);
    let len = data.len();
    let d = WeightDesc {
        name: format!("bench.{ty}"),
        ty,
        dims: vec![k, n],
        kind: WeightKind::Matrix,
        data: WeightSource::from_vec(data),
    };
    (dev.stage(&d).expect("stage"), len)
}

fn input(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect()
}

fn benches(c: &mut Criterion) {
    let dev = CpuDevice::new(&opts()).expect("open cpu");
    eprintln!("device: {}", dev.description());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads())
        .build()
        .expect("pool");

    let mut g = c.benchmark_group("matvec");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let (k, n) = (4096, 4096);
    let x = input(k);
    let mut out = vec![0f32; n];
    for ty in TYPES {
        let (w, bytes) = stage(&dev, ty, k, n);
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(ty.name(), |b| {
            b.iter(|| {
                dev.matmul(&*w, black_box(&x).into(), 1, (&mut out).into())
                    .expect("matmul")
            })
        });
    }
    let buf = common::ReadBuf::new(GgmlType::Q4_K.row_bytes(k).expect("row") * n / 8);
    g.throughput(Throughput::Bytes((buf.words().len() * 8) as u64));
    g.bench_function("read_loop", |b| {
        b.iter(|| common::read_loop(&pool, black_box(buf.words())))
    });
    g.finish();

    let mut g = c.benchmark_group("matmul512");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    let (k, n, m) = (2048, 2048, 512);
    let x = input(m * k);
    let mut out = vec![0f32; m * n];
    for ty in TYPES {
        let (w, _) = stage(&dev, ty, k, n);
        // Elements = multiply-accumulates, so criterion's "elem/s" reads as MAC/s.
        g.throughput(Throughput::Elements((k * n * m) as u64));
        g.bench_function(ty.name(), |b| {
            b.iter(|| {
                dev.matmul(&*w, black_box(&x).into(), m, (&mut out).into())
                    .expect("matmul")
            })
        });
    }
    g.finish();
}

/// Median seconds of `runs` calls of `f`.
fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    t[t.len() / 2]
}

fn time<F: FnMut()>(mut f: F) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn summary(_: &mut Criterion) {
    let dev = CpuDevice::new(&opts()).expect("open cpu");
    let th = threads();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(th)
        .build()
        .expect("pool");
    println!(
        "\n== summary ({}; read loop on {th} threads) ==",
        dev.description()
    );

    // The target: Q4_K matvec 14336 x 4096 vs a read loop over the same bytes, interleaved.
    let (k, n) = (4096, 14336);
    let (w, bytes) = stage(&dev, GgmlType::Q4_K, k, n);
    let buf = Arc::new(common::ReadBuf::new(bytes / 8));
    let x = input(k);
    let mut out = vec![0f32; n];
    for _ in 0..5 {
        dev.matmul(&*w, (&x).into(), 1, (&mut out).into())
            .expect("matmul");
        black_box(common::read_loop(&pool, buf.words()));
    }
    // Alternating blocks of 10 runs, with a pause between blocks so that the idle
    // threads of one pool have gone to sleep (rayon workers spin for a while after a
    // job) before the other pool runs: neither side is measured against the other's
    // spinning threads, and load drift hits both alike.
    let (mut tm, mut tr) = (Vec::new(), Vec::new());
    let pause = || std::thread::sleep(Duration::from_millis(30));
    for _ in 0..4 {
        pause();
        for _ in 0..10 {
            tm.push(time(|| {
                dev.matmul(&*w, (&x).into(), 1, (&mut out).into())
                    .expect("matmul")
            }));
        }
        pause();
        for i in 0..10 {
            tr.push(common::fastest_read_secs(&pool, buf.words(), i % 2 == 0));
        }
    }
    if std::env::var_os("FLINT_BENCH_DUMP").is_some() {
        let gbs = |t: &[f64]| {
            t.iter()
                .map(|s| format!("{:.1}", bytes as f64 / s / 1e9))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("matvec GB/s in run order: {}", gbs(&tm));
        println!("read   GB/s in run order: {}", gbs(&tr));
    }
    let best = |t: &[f64]| t.iter().copied().fold(f64::MAX, f64::min);
    let (bm, br) = (
        bytes as f64 / best(&tm) / 1e9,
        bytes as f64 / best(&tr) / 1e9,
    );
    let (gm, gr) = (
        bytes as f64 / median(tm) / 1e9,
        bytes as f64 / median(tr) / 1e9,
    );
    println!(
        "Q4_K matvec 14336x4096 ({:.1} MB), 40 runs each in alternating blocks (target ratio >= 0.80):",
        bytes as f64 / 1e6
    );
    println!(
        "  median: matvec {gm:.2} GB/s, read loop {gr:.2} GB/s, ratio {:.2}",
        gm / gr
    );
    println!(
        "  best:   matvec {bm:.2} GB/s, read loop {br:.2} GB/s, ratio {:.2}",
        bm / br
    );

    if std::env::var_os("FLINT_BENCH_DUMP").is_some() {
        let (k, n) = (4096, 4096);
        let (w, bytes) = stage(&dev, GgmlType::Q4_K, k, n);
        let x = input(k);
        let mut out = vec![0f32; n];
        for round in 0..3 {
            let outside = median(
                (0..50)
                    .map(|_| {
                        time(|| {
                            dev.matmul(&*w, (&x).into(), 1, (&mut out).into())
                                .expect("matmul")
                        })
                    })
                    .collect(),
            );
            let inside = dev.install(|| {
                median(
                    (0..50)
                        .map(|_| {
                            time(|| {
                                dev.matmul(&*w, (&x).into(), 1, (&mut out).into())
                                    .expect("matmul")
                            })
                        })
                        .collect(),
                )
            });
            println!("round {round}: Q4_K 4096x4096 matvec from outside the pool {:.2} GB/s, from inside {:.2} GB/s", bytes as f64 / outside / 1e9, bytes as f64 / inside / 1e9);
        }
    }
    // Per type: GB/s and int8 MAC/s (f32 MAC/s for float weights).
    for (label, k, n, m, runs) in [
        ("matvec", 4096, 4096, 1, 20),
        ("matmul M=512", 2048, 2048, 512, 5),
    ] {
        let x = input(m * k);
        let mut out = vec![0f32; m * n];
        for ty in TYPES {
            let (w, bytes) = stage(&dev, ty, k, n);
            dev.matmul(&*w, (&x).into(), m, (&mut out).into())
                .expect("matmul");
            let t = median(
                (0..runs)
                    .map(|_| {
                        time(|| {
                            dev.matmul(&*w, (&x).into(), m, (&mut out).into())
                                .expect("matmul")
                        })
                    })
                    .collect(),
            );
            let macs = (k * n * m) as f64;
            if m == 1 {
                println!(
                    "{label:>13} {:>5} {k}x{n}: {:8.3} ms  {:6.2} GB/s  {:7.2} GMAC/s",
                    ty.name(),
                    t * 1e3,
                    bytes as f64 / t / 1e9,
                    macs / t / 1e9
                );
            } else {
                // The weight is read once per call: GB/s would say nothing here.
                println!(
                    "{label:>13} {:>5} {k}x{n}: {:8.3} ms  {:7.2} GMAC/s",
                    ty.name(),
                    t * 1e3,
                    macs / t / 1e9
                );
            }
        }
    }
}

criterion_group!(kernels, benches, summary);
criterion_main!(kernels);
