//! The SIMD paged attention against the scalar path (`kv::paged_attention`), bit for
//! bit, in both attention orders of the device. Batch-invariant: llama.cpp's tiled order
//! for every call (`flint_core::math::attend_ggml_tiled` per row and head; AVX2: queries
//! of a GQA group in lanes; AVX-512: queries in lanes for prompt rows, keys in lanes for
//! decode rows). llama.cpp's: the same from 64 query rows, its one-key-at-a-time order
//! below (`attend_ggml_one_chunk`; keys in lanes for the scores, the output in f16).
//! Cases: prompt batches longer than a 64-key tile and than 16 lanes, decode rows alone
//! and beside a prompt, short prompt chunks, sliding windows with the blocks below them
//! freed, sinks above and below the score maximum, head sizes that are not a multiple of
//! 16 or 8, cache blocks of 8 (no 16-key runs), 16 and 32 slots, decode contexts long
//! enough that one group's work is split over the threads, or walked in windows of tiles.

mod common;

use common::Rng;
use flint_hal::{AttnSeq, Device, DeviceOptions, KvLayout, PagedAttention, View, NO_BLOCK};
use flint_hal_cpu::{CpuDevice, FloatOrder, SimdLevel};

fn device(level: SimdLevel, order: FloatOrder) -> CpuDevice {
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    CpuDevice::with_level(&opts, level)
        .expect("open cpu")
        .with_float_order(order)
}

struct Case {
    n_heads: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    window: Option<usize>,
    sinks: bool,
    /// Per sequence: tokens in the cache, and the positions queried.
    seqs: Vec<(usize, Vec<u32>)>,
}

fn run(dev: &CpuDevice, c: &Case, bs: usize, seed: u64) -> Vec<f32> {
    let blocks_per_seq: Vec<usize> = c.seqs.iter().map(|(len, _)| len.div_ceil(bs)).collect();
    let layout = KvLayout {
        num_blocks: blocks_per_seq.iter().sum::<usize>() + 3,
        block_size: bs,
        n_kv_heads: c.hkv,
        head_dim_k: c.dk,
        head_dim_v: c.dv,
    };
    let mut rng = Rng(seed);
    let mut kv = dev.alloc_kv(&layout).expect("alloc kv");
    // Block tables in a scrambled order, so that slots are not contiguous per sequence.
    let mut next = layout.num_blocks as u32;
    let mut tables = Vec::new();
    for (si, (len, _)) in c.seqs.iter().enumerate() {
        let mut t = Vec::new();
        for _ in 0..blocks_per_seq[si] {
            next -= 1;
            t.push(next);
        }
        let slots: Vec<u32> = (0..*len)
            .map(|j| t[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        // Sharp scores (large keys) so that the running maximum moves between tiles.
        let k: Vec<f32> = rng
            .vec(len * c.hkv * c.dk)
            .iter()
            .map(|x| x * 4.0)
            .collect();
        let v = rng.vec(len * c.hkv * c.dv);
        dev.write_kv(&mut *kv, (&k).into(), (&v).into(), (&slots).into())
            .expect("write kv");
        // As the sliding group does: blocks wholly below every queried row's window are
        // handed back (their slots keep stale keys, which must not be read).
        if let Some(w) = c.window {
            let lowest = c.seqs[si].1.iter().min().map_or(0, |&p| p as usize);
            let lo = flint_core::math::window_start(lowest, Some(w));
            for (b, e) in t.iter_mut().enumerate() {
                if (b + 1) * bs <= lo {
                    *e = NO_BLOCK;
                }
            }
        }
        tables.push(t);
    }
    let n_rows: usize = c.seqs.iter().map(|(_, q)| q.len()).sum();
    let q = rng.vec(n_rows * c.n_heads * c.dk);
    let sinks: Option<Vec<f32>> = c.sinks.then(|| {
        (0..c.n_heads)
            .map(|h| if h % 2 == 0 { 9.0 } else { -1.5 })
            .collect()
    });
    let mut attn = Vec::new();
    let mut r = 0;
    for ((_, qp), t) in c.seqs.iter().zip(&tables) {
        attn.push(AttnSeq {
            q_start: r,
            positions: qp.as_slice().into(),
            block_table: t.into(),
        });
        r += qp.len();
    }
    let p = PagedAttention {
        q: (&q).into(),
        seqs: &attn,
        n_heads: c.n_heads,
        scale: 1.0 / (c.dk as f32).sqrt(),
        sinks: sinks.as_deref().map(View::from),
        window: c.window,
    };
    let mut out = vec![f32::NAN; n_rows * c.n_heads * c.dv];
    dev.paged_attention(&*kv, &p, (&mut out).into())
        .expect("attention");
    out
}

#[test]
fn simd_attention_equals_scalar_bit_for_bit() {
    let best = SimdLevel::detect();
    if best < SimdLevel::Avx2 {
        eprintln!("no AVX2 on this CPU ({best}): the SIMD attention is not used here");
        return;
    }
    // Each SIMD arrangement this CPU runs (AVX-512 picks its own for AVX-512 VNNI too).
    let levels: Vec<SimdLevel> = [SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|&l| l <= best)
        .collect();
    eprintln!("SIMD attention levels checked against the scalar path: {levels:?}");
    let prompt: Vec<u32> = (0..150).collect();
    let cases = [
        // A prompt of 150 rows (3 tiles, 10 x 16 lanes per KV head), GQA 4:1, no window.
        Case {
            n_heads: 8,
            hkv: 2,
            dk: 64,
            dv: 64,
            window: None,
            sinks: false,
            seqs: vec![(150, prompt.clone())],
        },
        // The same with a window shorter than a tile and sinks; plus decode rows.
        Case {
            n_heads: 8,
            hkv: 2,
            dk: 64,
            dv: 64,
            window: Some(40),
            sinks: true,
            seqs: vec![(150, prompt.clone()), (90, vec![89]), (7, vec![6])],
        },
        // Head sizes with a tail (not a multiple of 16), 3 heads per KV head, a chunk
        // of a prompt (positions 70..100 of a 100-token cache).
        Case {
            n_heads: 3,
            hkv: 1,
            dk: 40,
            dv: 20,
            window: Some(64),
            sinks: true,
            seqs: vec![(100, (70..100).collect()), (129, vec![128])],
        },
        // Gemma 3's grouping (4 heads on one KV head), a value size past the 64-element
        // groups the output chains take side by side, a key count that leaves 1..3 keys
        // over the 4 scored together.
        Case {
            n_heads: 4,
            hkv: 1,
            dk: 96,
            dv: 80,
            window: None,
            sinks: false,
            seqs: vec![(150, prompt.clone()), (67, vec![66]), (3, vec![0, 1, 2])],
        },
        // One decoding sequence on one KV head (a Gemma 3 decode: one lane group, four
        // lanes used, head size 256).
        Case {
            n_heads: 4,
            hkv: 1,
            dk: 256,
            dv: 256,
            window: None,
            sinks: false,
            seqs: vec![(150, vec![149])],
        },
        // Four decoding sequences (the bench preset at c = 4: 16 heads on 4 KV heads),
        // one of them past a sliding window, one with two rows (a short chunk) and one
        // with a single key.
        Case {
            n_heads: 16,
            hkv: 4,
            dk: 64,
            dv: 64,
            window: Some(100),
            sinks: true,
            seqs: vec![
                (131, vec![130]),
                (144, vec![143]),
                (20, vec![18, 19]),
                (1, vec![0]),
            ],
        },
        // Eight heads on one KV head (eight queries with keys in lanes), a key size
        // with a tail.
        Case {
            n_heads: 8,
            hkv: 1,
            dk: 72,
            dv: 64,
            window: None,
            sinks: true,
            seqs: vec![(77, vec![76])],
        },
        // The same with a window that cuts a tile and sinks, and an odd key count.
        Case {
            n_heads: 4,
            hkv: 1,
            dk: 64,
            dv: 48,
            window: Some(45),
            sinks: true,
            seqs: vec![(101, vec![100])],
        },
        // Long decode contexts (16+ tiles), where a group alone in its step spreads its
        // scores over tiles and its output over columns on the pool's two threads: a
        // Gemma 3 global layer, and two rows of one sequence (six queries) with a window
        // that cuts a tile, sinks, and a value size that leaves a 16-column part.
        Case {
            n_heads: 4,
            hkv: 1,
            dk: 256,
            dv: 256,
            window: None,
            sinks: false,
            seqs: vec![(1500, vec![1499])],
        },
        Case {
            n_heads: 3,
            hkv: 1,
            dk: 40,
            dv: 80,
            window: Some(1100),
            sinks: true,
            seqs: vec![(1250, vec![1248, 1249])],
        },
        // Two long decoding sequences: each group keeps to one thread and walks its
        // tiles in windows, carrying the maxima, sums and outputs across them.
        Case {
            n_heads: 4,
            hkv: 1,
            dk: 64,
            dv: 64,
            window: None,
            sinks: true,
            seqs: vec![(4200, vec![4199]), (4130, vec![4129])],
        },
    ];
    for order in [FloatOrder::BatchInvariant, FloatOrder::LlamaCpp] {
        for bs in [8, 16, 32] {
            for (i, c) in cases.iter().enumerate() {
                let seed = 100 + i as u64;
                let want = run(&device(SimdLevel::Scalar, order), c, bs, seed);
                for &level in &levels {
                    let got = run(&device(level, order), c, bs, seed);
                    assert_eq!(got.len(), want.len());
                    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{level} {order:?}: case {i}, block size {bs}, value {j}: SIMD {g} vs scalar {w} (seed {seed})"
                        );
                    }
                }
            }
        }
    }
}
