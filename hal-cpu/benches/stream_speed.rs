//! Decode matmuls streamed from memory, by matrix size: how fast one M = 1 matmul reads
//! its weight when the weight is not in cache, as a decode step reads each of its
//! matrices once. Many distinct matrices of `STREAM_ROWS` rows (a list, default
//! `256,512,1024,2048,4096,32768`) by `STREAM_K` (default 1024), `STREAM_TYPE` (default
//! `q4_K`), `STREAM_MB` MB of them in all (default 256: far past the last-level cache),
//! are multiplied one after the other inside one device step, as the engine does;
//! `STREAM_PASSES` passes (default 5), `STREAM_M` activation rows (default 1). Prints per
//! size the median time per matmul and its weight bytes over that time.
//!
//! `cargo bench -p flint-hal-cpu --bench stream_speed` (`FLINT_THREADS` sets the threads,
//! default all).

mod common;

use std::hint::black_box;
use std::time::Instant;

use flint_core::GgmlType;
use flint_hal::{Device, WeightDesc, WeightKind, WeightSource};

fn main() {
    let env = common::env_usize;
    let k = env("STREAM_K", 1024);
    let total_mb = env("STREAM_MB", 256);
    let passes = env("STREAM_PASSES", 5).max(1);
    let ty = std::env::var("STREAM_TYPE")
        .ok()
        .and_then(|t| GgmlType::from_name(t.trim()))
        .unwrap_or(GgmlType::Q4_K);
    let sizes: Vec<usize> = std::env::var("STREAM_ROWS")
        .unwrap_or_else(|_| "256,512,1024,2048,4096,32768".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let dev = common::keep_quant_device();
    let Some(rb) = ty.row_bytes(k) else {
        eprintln!("stream_speed: k = {k} is not whole {ty} blocks");
        return;
    };
    println!(
        "{ty}, k = {k}, M = {}, {} threads, {total_mb} MB of matrices per size, median of {passes} passes",
        env("STREAM_M", 1).max(1),
        dev.threads()
    );
    // Activation rows per matmul (`STREAM_M`, default 1: a decode of one sequence).
    let m = env("STREAM_M", 1).max(1);
    let x: Vec<f32> = (0..k * m).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut seed = 1u64;
    for &rows in &sizes {
        let bytes = rb * rows;
        let count = (total_mb << 20).div_ceil(bytes).max(2);
        let ws: Vec<_> = (0..count)
            .map(|i| {
                let data = common::small_bytes(bytes, &mut seed);
                dev.stage(&WeightDesc {
                    name: format!("w{i}"),
                    ty,
                    dims: vec![k, rows],
                    kind: WeightKind::Matrix,
                    data: WeightSource::from_vec(data),
                })
                .expect("stage")
            })
            .collect();
        let mut out = vec![0f32; rows * m];
        let mut times: Vec<f64> = Vec::with_capacity(passes * count);
        for _ in 0..passes {
            dev.run_step(&mut || {
                for w in &ws {
                    let t = Instant::now();
                    dev.matmul(&**w, black_box(&x).into(), m, (&mut out).into())
                        .expect("matmul");
                    times.push(t.elapsed().as_secs_f64());
                }
            });
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "{rows:>6} rows ({:>8.1} KB): {:>8.1} us per matmul, {:>5.1} GB/s",
            bytes as f64 / 1e3,
            med * 1e6,
            bytes as f64 / med / 1e9
        );
    }
}
