//! MXFP4 decode matmuls streamed from memory, as gpt-oss's experts run them: expert
//! towers `[MX_K, MX_N, MX_E]` (defaults 2880, 2880, 16: the bench preset's gate and up
//! projections) of pseudo-random MXFP4 bytes, and per call
//!
//! - `gate_up M=1`: `expert_matmul_multi` over the gate and up towers for one input row
//!   routed to 4 experts (a decode step's `expert_gate_up`);
//! - `gate_up M=4`: four input rows, 4 experts each, consecutive rows sharing one
//!   expert (13 distinct experts: the c = 4 case, some experts with two tokens);
//! - `down M=1`: `expert_matmul` over one tower for one row and 4 experts;
//! - `matmul M=1`: a plain `matmul` of one `[MX_K, MX_N]` expert matrix.
//!
//! Each call takes experts not read for the last `MX_E / 4` calls, so the weights come
//! from memory (2 towers of 16 experts: 141 MB). `MX_ITERS` calls per case (default
//! 200), each call its own device step (so that `flint_hal::ab_test` alternates its two
//! sides call by call); `MX_CASES` picks cases (`gu1,gu4,down,mm`, default all). Prints
//! the median time per call and the distinct weight bytes over it.
//!
//! `cargo bench -p flint-hal-cpu --bench mxfp4_speed` (`FLINT_THREADS` sets the threads,
//! default all).

mod common;

use std::hint::black_box;
use std::time::Instant;

use flint_core::GgmlType;
use flint_hal::{Device, WeightDesc, WeightKind, WeightSource};

fn main() {
    let env = common::env_usize;
    let k = env("MX_K", 2880);
    let n = env("MX_N", 2880);
    let e = env("MX_E", 16).max(1);
    let iters = env("MX_ITERS", 200).max(1);
    let ty = GgmlType::MXFP4;
    let Some(rb) = ty.row_bytes(k) else {
        eprintln!("mxfp4_speed: k = {k} is not whole MXFP4 blocks");
        return;
    };
    let dev = common::keep_quant_device();
    let mat = rb * n;
    println!(
        "MXFP4 [{k}, {n}, {e}], {} threads, {:.1} MB per expert matrix, median of {iters} calls",
        dev.threads(),
        mat as f64 / 1e6
    );
    let mut seed = 7u64;
    let mut tower = |name: &str| {
        dev.stage(&WeightDesc {
            name: name.into(),
            ty,
            dims: vec![k, n, e],
            kind: WeightKind::ExpertTower,
            data: WeightSource::from_vec(common::small_bytes(mat * e, &mut seed)),
        })
        .expect("stage")
    };
    let gate = tower("gate");
    let up = tower("up");
    let mats: Vec<_> = (0..e)
        .map(|i| {
            dev.stage(&WeightDesc {
                name: format!("m{i}"),
                ty,
                dims: vec![k, n],
                kind: WeightKind::Matrix,
                data: WeightSource::from_vec(common::small_bytes(mat, &mut seed)),
            })
            .expect("stage")
        })
        .collect();
    let x: Vec<f32> = (0..4 * k)
        .map(|i| ((i * 7919) % 29) as f32 * 0.03 - 0.4)
        .collect();
    // The 4 experts of each of `m` input rows in call `c`: rows `i` and `i + 1` share one.
    let route = |c: usize, m: usize| -> Vec<u32> {
        let base = c * (3 * m + 1);
        (0..m)
            .flat_map(|i| (0..4).map(move |j| ((base + 3 * i + j) % e) as u32))
            .collect()
    };
    let distinct = |rows: &[u32]| {
        let mut v: Vec<u32> = rows.to_vec();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let report = |name: &str, times: &mut Vec<f64>, bytes: usize| {
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "{name:<12}: {:>8.1} us per call, {:>6.1} MB, {:>5.2} GB/s",
            med * 1e6,
            bytes as f64 / 1e6,
            bytes as f64 / med / 1e9
        );
    };
    let cases = std::env::var("MX_CASES").unwrap_or_else(|_| "gu1,gu4,down,mm".into());
    let want = |c: &str| cases.split(',').any(|x| x.trim() == c);
    for m in [1usize, 4] {
        if !want(&format!("gu{m}")) {
            continue;
        }
        let mut outs = [vec![0f32; 4 * m * n], vec![0f32; 4 * m * n]];
        let mut times = Vec::with_capacity(iters);
        let mut bytes = 0;
        for c in 0..iters {
            dev.run_step(&mut || {
                let rows = route(c, m);
                bytes = 2 * distinct(&rows) * mat;
                let [g, u] = &mut outs;
                let t = Instant::now();
                dev.expert_matmul_multi(
                    &[&*gate, &*up],
                    black_box(&x[..m * k]).into(),
                    (&rows).into(),
                    &mut [(&mut g[..]).into(), (&mut u[..]).into()],
                )
                .expect("expert matmul");
                times.push(t.elapsed().as_secs_f64());
            });
        }
        report(&format!("gate_up M={m}"), &mut times, bytes);
    }
    let mut out = vec![0f32; 4 * n];
    if want("down") {
        let mut times = Vec::with_capacity(iters);
        for c in 0..iters {
            dev.run_step(&mut || {
                let rows = route(c, 1);
                let t = Instant::now();
                dev.expert_matmul(
                    &*gate,
                    black_box(&x[..k]).into(),
                    (&rows).into(),
                    (&mut out).into(),
                )
                .expect("expert matmul");
                times.push(t.elapsed().as_secs_f64());
            });
        }
        report("down M=1", &mut times, 4 * mat);
    }
    if want("mm") {
        let mut times = Vec::with_capacity(iters);
        for c in 0..iters {
            dev.run_step(&mut || {
                let t = Instant::now();
                dev.matmul(
                    &*mats[c % e],
                    black_box(&x[..k]).into(),
                    1,
                    (&mut out[..n]).into(),
                )
                .expect("matmul");
                times.push(t.elapsed().as_secs_f64());
            });
        }
        report("matmul M=1", &mut times, mat);
    }
}
