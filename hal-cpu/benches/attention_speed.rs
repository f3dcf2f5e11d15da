//! Attention speed: one paged-attention call for `ATTN_SEQS` sequences of `ATTN_CTX`
//! cached tokens each, with the last `ATTN_ROWS` positions of each as query rows (1, a
//! decode step, by default; `ATTN_ROWS=ATTN_CTX` is a causal prompt), the bench
//! preset's shape by default (16 query heads on 4 KV heads of 64, blocks of 16 slots
//! scattered over the pool), timed inside a device step as the engine calls it. Gemma
//! 3's prompt of 512: `ATTN_CTX=512 ATTN_ROWS=512 ATTN_HEADS=4 ATTN_KV_HEADS=1
//! ATTN_HEAD_DIM=256`.
//!
//! `cargo bench -p flint-hal-cpu --bench attention_speed` (`ATTN_CTX`, default 1000;
//! `ATTN_ROWS`, default 1; `ATTN_SEQS`, default 1; `ATTN_HEADS` / `ATTN_KV_HEADS` / `ATTN_HEAD_DIM`, default
//! 16 / 4 / 64; `ATTN_ROUNDS`, default 200; `ATTN_THREADS`, default 2; `ATTN_COLD=1`
//! reads 64 MiB between calls, as a step's weights push the cache out of the CPU caches;
//! `FLINT_CPU_SIMD` picks the SIMD level, as it does for the device).
//! Prints the median and the best call in microseconds, and the cache bytes read per
//! microsecond at the median.

mod common;

use std::time::Instant;

use rayon::prelude::*;

use flint_hal::{AttnSeq, Device, DeviceOptions, KvLayout, PagedAttention};
use flint_hal_cpu::{CpuDevice, SimdLevel};

fn main() {
    let env = common::env_usize;
    let ctx = env("ATTN_CTX", 1000).max(1);
    let rows = env("ATTN_ROWS", 1).clamp(1, ctx);
    let seqs = env("ATTN_SEQS", 1).max(1);
    let (nh, hkv, hd) = (
        env("ATTN_HEADS", 16),
        env("ATTN_KV_HEADS", 4),
        env("ATTN_HEAD_DIM", 64),
    );
    let rounds = env("ATTN_ROUNDS", 200).max(1);
    let cold = std::env::var_os("ATTN_COLD").is_some();
    let opts = DeviceOptions {
        threads: Some(env("ATTN_THREADS", 2)),
        keep_quant: true,
    };
    let level = SimdLevel::from_env().expect("FLINT_CPU_SIMD");
    let dev = CpuDevice::with_level(&opts, level).expect("open cpu");
    let bs = 16;
    let per_seq = ctx.div_ceil(bs);
    let layout = KvLayout {
        num_blocks: per_seq * seqs * 2,
        block_size: bs,
        n_kv_heads: hkv,
        head_dim_k: hd,
        head_dim_v: hd,
    };
    let mut kv = dev.alloc_kv(&layout).expect("alloc kv");
    // Every other block of the pool, the sequences interleaved: scattered, as a pool
    // that has served many requests hands them out.
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| (0..per_seq).map(|b| (2 * (b * seqs + s)) as u32).collect())
        .collect();
    let mut seed = 1u64;
    let mut rnd = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    for t in &tables {
        let slots: Vec<u32> = (0..ctx)
            .map(|j| t[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        let (k, v) = (rnd(ctx * hkv * hd), rnd(ctx * hkv * hd));
        dev.write_kv(&mut *kv, (&k).into(), (&v).into(), (&slots).into())
            .expect("write kv");
    }
    let q = rnd(seqs * rows * nh * hd);
    let pos: Vec<u32> = ((ctx - rows) as u32..ctx as u32).collect();
    let attn: Vec<AttnSeq<'_>> = tables
        .iter()
        .enumerate()
        .map(|(s, t)| AttnSeq {
            q_start: s * rows,
            positions: (&pos).into(),
            block_table: t.into(),
        })
        .collect();
    let p = PagedAttention {
        q: (&q).into(),
        seqs: &attn,
        n_heads: nh,
        scale: 1.0 / (hd as f32).sqrt(),
        sinks: None,
        window: None,
    };
    let mut out = vec![0f32; seqs * rows * nh * hd];
    let junk = vec![1u8; 64 << 20];
    let mut times = Vec::with_capacity(rounds);
    let mut step = || {
        for _ in 0..rounds {
            if cold {
                // On the pool, as the step's matmuls: the workers stay awake.
                let s: u64 = junk
                    .par_chunks(1 << 20)
                    .map(|c| c.iter().step_by(64).map(|&b| u64::from(b)).sum::<u64>())
                    .sum();
                std::hint::black_box(s);
            } else {
                dev.paged_attention(&*kv, &p, (&mut out).into())
                    .expect("attention");
            }
            let t = Instant::now();
            dev.paged_attention(&*kv, &p, (&mut out).into())
                .expect("attention");
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    };
    // Inside a step, as the engine runs it: the other workers are awake.
    dev.run_step(&mut step);
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let bytes = seqs * ctx * hkv * 2 * hd * dev.kv_bytes_per_value();
    // Multiply-adds of the visible (query, key) pairs: scores and the weighted values.
    let visible: usize = (ctx - rows + 1..=ctx).sum();
    let macs = 2 * seqs * nh * hd * visible;
    println!(
        "attention: {seqs} x {ctx} tokens ({rows} query rows each), {nh} heads on {hkv} KV \
         heads of {hd}, {}: median {median:.1} us, best {:.1} us, {:.1} GB/s of cache, \
         {:.1} GMAC/s of visible pairs at the median",
        if cold { "cold" } else { "warm" },
        times[0],
        bytes as f64 / median / 1e3,
        macs as f64 / median / 1e3
    );
}
