//! Paged attention against `flint_core::math::attention_ref` on contiguous K/V, and the
//! element-wise ops against the core math references.

mod common;

use common::Rng;
use flint_core::math::{self, AttentionParams};
use flint_hal::{
    AttnSeq, Device, DeviceOptions, Gating, HalErrorKind, KvLayout, Op, PagedAttention, RopeKind,
    RopeParams, RoutingConfig, View, Yarn, NO_BLOCK,
};
use flint_hal_cpu::{CpuDevice, SimdLevel};

fn dev() -> CpuDevice {
    CpuDevice::new(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("open cpu")
}

/// One sequence of the test: its block table, the positions queried, and its K/V rows
/// for positions `0..len` (contiguous, as the reference wants them).
struct Seq {
    table: Vec<u32>,
    len: usize,
    q_pos: Vec<u32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn check_attention(window: Option<usize>, sinks: Option<Vec<f32>>, free_first_block: bool) {
    let d = dev();
    let layout = KvLayout {
        num_blocks: 16,
        block_size: 4,
        n_kv_heads: 2,
        head_dim_k: 8,
        head_dim_v: 6,
    };
    let n_heads = 6; // GQA: 3 query heads per KV head
    let (hkv, dk, dv, bs) = (2, 8, 6, 4);
    let mut rng = Rng(11);
    let mut seqs = vec![
        Seq {
            table: vec![7, 2, 11, 5],
            len: 13,
            q_pos: vec![10, 11, 12],
            k: vec![],
            v: vec![],
        },
        Seq {
            table: vec![0, 9],
            len: 6,
            q_pos: vec![5],
            k: vec![],
            v: vec![],
        },
        Seq {
            table: vec![14, 3, 8],
            len: 9,
            q_pos: vec![0, 1, 2, 3, 4, 5, 6, 7, 8],
            k: vec![],
            v: vec![],
        },
    ];
    let mut kv = d.alloc_kv(&layout).expect("alloc kv");
    // Poison every slot: a read of any slot the kernel should not touch gives NaN.
    let all: Vec<u32> = (0..layout.num_slots() as u32).collect();
    let nan_k = vec![f32::NAN; all.len() * hkv * dk];
    let nan_v = vec![f32::NAN; all.len() * hkv * dv];
    d.write_kv(&mut *kv, (&nan_k).into(), (&nan_v).into(), (&all).into())
        .expect("poison");
    for s in seqs.iter_mut() {
        s.k = rng.vec(s.len * hkv * dk);
        s.v = rng.vec(s.len * hkv * dv);
        let slots: Vec<u32> = (0..s.len)
            .map(|j| s.table[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        d.write_kv(&mut *kv, (&s.k).into(), (&s.v).into(), (&slots).into())
            .expect("write kv");
        // The cache keeps f16 keys and values (llama.cpp's default cache types): the
        // reference attends over the same rounded values.
        for k in s.k.iter_mut() {
            *k = half::f16::from_f32(*k).to_f32();
        }
        for v in s.v.iter_mut() {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
    if free_first_block {
        // Sequence 0's first block (positions 0..4) fell out of the window and was
        // handed back: the pool reuses it for something else.
        let freed = seqs[0].table[0];
        seqs[0].table[0] = NO_BLOCK;
        let slots: Vec<u32> = (0..bs as u32).map(|t| freed * bs as u32 + t).collect();
        d.write_kv(
            &mut *kv,
            (&vec![f32::NAN; bs * hkv * dk]).into(),
            (&vec![f32::NAN; bs * hkv * dv]).into(),
            (&slots).into(),
        )
        .expect("reuse");
    }
    let n_rows: usize = seqs.iter().map(|s| s.q_pos.len()).sum();
    let q = rng.vec(n_rows * n_heads * dk);
    let mut starts = vec![];
    let mut r = 0;
    for s in &seqs {
        starts.push(r);
        r += s.q_pos.len();
    }
    let attn_seqs: Vec<AttnSeq<'_>> = seqs
        .iter()
        .zip(&starts)
        .map(|(s, &q_start)| AttnSeq {
            q_start,
            positions: (&s.q_pos).into(),
            block_table: (&s.table).into(),
        })
        .collect();
    let scale = 1.0 / (dk as f32).sqrt();
    let p = PagedAttention {
        q: (&q[..]).into(),
        seqs: &attn_seqs,
        n_heads,
        scale,
        sinks: sinks.as_deref().map(View::from),
        window,
    };
    let mut out = vec![f32::NAN; n_rows * n_heads * dv];
    d.paged_attention(&*kv, &p, (&mut out[..]).into())
        .expect("paged attention");
    let rp = AttentionParams {
        n_head: n_heads,
        n_head_kv: hkv,
        dk,
        dv,
        scale,
        sinks: sinks.as_deref(),
        window,
    };
    for (s, &q_start) in seqs.iter().zip(&starts) {
        let nq = s.q_pos.len();
        let qs = &q[q_start * n_heads * dk..(q_start + nq) * n_heads * dk];
        let mut want = vec![0f32; nq * n_heads * dv];
        math::attention_ref(&rp, qs, &s.q_pos, &s.k, &s.v, &mut want);
        let got = &out[q_start * n_heads * dv..(q_start + nq) * n_heads * dv];
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "window {window:?} sinks {sinks:?}: seq at row {q_start}, value {i}: got {g}, want {w}"
            );
        }
    }
}

#[test]
fn paged_attention_full_causal_gqa() {
    check_attention(None, None, false);
}

#[test]
fn paged_attention_with_sinks_below_and_above_the_max() {
    // Scores are about |q.k|/sqrt(8) <= ~1: -2 is below every max, 4 above.
    check_attention(None, Some(vec![-2.0, -0.5, 0.0, 4.0, -3.0, 1.0]), false);
}

#[test]
fn paged_attention_sliding_window_with_freed_block() {
    // Window 5: queries at 10..12 of sequence 0 never see positions 0..4, whose block
    // is NO_BLOCK and poisoned.
    check_attention(Some(5), Some(vec![-1.0, 0.5, -0.2, 2.0, -4.0, 0.1]), true);
    check_attention(Some(3), None, true);
}

#[test]
fn paged_attention_rejects_a_freed_block_in_view() {
    let d = dev();
    let layout = KvLayout {
        num_blocks: 4,
        block_size: 2,
        n_kv_heads: 1,
        head_dim_k: 4,
        head_dim_v: 4,
    };
    let kv = d.alloc_kv(&layout).expect("alloc");
    let table = [NO_BLOCK, 1];
    let pos = [3u32];
    let seqs = [AttnSeq {
        q_start: 0,
        positions: (&pos).into(),
        block_table: (&table).into(),
    }];
    let q = [0.1f32; 4];
    let p = PagedAttention {
        q: (&q[..]).into(),
        seqs: &seqs,
        n_heads: 1,
        scale: 0.5,
        sinks: None,
        window: None,
    };
    let mut out = [0f32; 4];
    let e = d
        .paged_attention(&*kv, &p, (&mut out[..]).into())
        .expect_err("freed block in view");
    assert_eq!(e.kind, HalErrorKind::InvalidInput);
}

#[test]
fn add_rms_norm_adds_the_residual_once() {
    let d = dev();
    let mut rng = Rng(12);
    let dim = 64;
    // 3 rows: one chunk; 37: three chunks of up to 16 rows, in parallel.
    for rows in [3usize, 37] {
        let res0 = rng.vec(rows * dim);
        let delta = rng.vec(rows * dim);
        let w = rng.vec(dim);
        let mut res = res0.clone();
        let mut out = vec![0f32; rows * dim];
        d.add_rms_norm(
            (&mut res).into(),
            (&delta).into(),
            (&w).into(),
            1e-6,
            dim,
            (&mut out).into(),
        )
        .expect("add_rms_norm");
        let sum: Vec<f32> = res0.iter().zip(&delta).map(|(a, b)| a + b).collect();
        assert_eq!(res, sum, "{rows} rows");
        let mut want = vec![0f32; rows * dim];
        for (x, o) in sum.chunks(dim).zip(want.chunks_mut(dim)) {
            math::rms_norm(x, Some(&w), 1e-6, o);
        }
        assert_eq!(out, want, "{rows} rows");
        // Per-head norm without weight.
        let mut o2 = vec![0f32; rows * dim];
        d.rms_norm((&sum).into(), None, 1e-6, 16, (&mut o2).into())
            .expect("rms_norm");
        let mut w2 = vec![0f32; rows * dim];
        for (x, o) in sum.chunks(16).zip(w2.chunks_mut(16)) {
            math::rms_norm(x, None, 1e-6, o);
        }
        assert_eq!(o2, w2, "{rows} rows");
    }
}

/// RMSNorm of any number of rows equals `math::rms_norm` row by row, bit for bit, with
/// and without a weight, at every SIMD level this CPU has: 16 rows per task; AVX-512
/// sums eight rows in one vector (sixteen side by side), AVX2 four; the rows left over
/// go eight, four, two side by side and one alone; row lengths that are not a multiple
/// of eight leave a tail per row.
#[test]
fn rms_norm_rows_match_core_bit_for_bit() {
    let mut rng = Rng(21);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|&l| l <= SimdLevel::detect())
        .collect();
    println!("levels: {levels:?}");
    for level in levels {
        let d = CpuDevice::with_level(
            &DeviceOptions {
                threads: Some(2),
                keep_quant: true,
            },
            level,
        )
        .expect("open cpu");
        for dim in [640usize, 256, 643, 5] {
            // 37 = 16 + 16 + 4 + 1; 7 = 4 + 2 + 1; 30 = 16 + 8 + 4 + 2; 13 = 8 + 4 + 1.
            for rows in [1usize, 2, 3, 4, 7, 8, 13, 30, 37] {
                // Magnitudes from 2^-20 to 2^20, so that the f64 sum of the squares
                // rounds and a different order of adds gives different bits.
                let x: Vec<f32> = rng
                    .vec(rows * dim)
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v * 2f32.powi((i * 7919 % 41) as i32 - 20))
                    .collect();
                let w = rng.vec(dim);
                for weight in [Some(&w[..]), None] {
                    let mut got = vec![0f32; rows * dim];
                    d.rms_norm(
                        (&x).into(),
                        weight.map(Into::into),
                        1e-6,
                        dim,
                        (&mut got).into(),
                    )
                    .expect("rms_norm");
                    let mut want = vec![0f32; rows * dim];
                    for (xr, o) in x.chunks(dim).zip(want.chunks_mut(dim)) {
                        math::rms_norm(xr, weight, 1e-6, o);
                    }
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{level:?}, dim {dim}, rows {rows}, weight: {}",
                        weight.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn rope_matches_core_neox() {
    let d = dev();
    let mut rng = Rng(13);
    let p = RopeParams::neox(3, 16, 12, 10000.0);
    // Rows in chunks of 8 across the threads, each row's angles shared by its heads.
    let pos: Vec<u32> = [0u32, 7, 1000]
        .into_iter()
        .chain((0..20).map(|i| 3 * i + 1))
        .collect();
    // The device keeps the angles of recent calls: the same positions with another
    // base, other positions of the same count, other rotated sizes, and a repeat.
    let pos2: Vec<u32> = pos.iter().map(|v| v + 1).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (ps, base, n_rot) in [
        (&pos, 10000.0, 12),
        (&pos, 1e6, 12),
        (&pos2, 10000.0, 12),
        (&pos, 10000.0, 16),
        (&pos, 10000.0, 12),
        (&pos2, 1e6, 12),
    ] {
        let p = RopeParams { base, n_rot, ..p };
        let x0 = rng.vec(ps.len() * 48);
        let mut x = x0.clone();
        d.rope((&mut x).into(), ps.into(), &p).expect("rope");
        let mut want = x0;
        for (row, &pv) in want.chunks_mut(48).zip(ps.iter()) {
            math::rope_neox_heads(row, 16, pv, n_rot, base);
        }
        assert_eq!(bits(&x), bits(&want), "base {base} n_rot {n_rot}");
    }
}

/// Every kind of RoPE parameters, bit for bit against `math::rope_heads`; the device's
/// angle cache must tell apart calls that differ only in scale, factors or YaRN.
#[test]
fn rope_variants_match_core() {
    let d = dev();
    let mut rng = Rng(15);
    let (n_heads, head_dim, n_rot) = (4, 20, 16);
    let pos: Vec<u32> = [0u32, 9, 4095, 4096, 32768, 131071]
        .into_iter()
        .chain((0..14).map(|i| 977 * i + 3))
        .collect();
    let f1: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 * 0.75).collect();
    let f2: Vec<f32> = f1.iter().map(|f| f * 1.5).collect();
    let yarn = |ext_factor, attn_factor| {
        Some(Yarn {
            ext_factor,
            attn_factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        })
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for kind in [RopeKind::Normal, RopeKind::Neox] {
        for (freq_scale, freq_factors, yarn) in [
            (1.0, None, None),
            (0.125, None, None),
            (1.0, Some(&f1[..]), None),
            (1.0, Some(&f2[..]), None),
            (0.25, Some(&f1[..]), yarn(1.0, 1.0)),
            (1.0 / 32.0, None, yarn(1.0, 1.0)),
            (1.0 / 32.0, None, yarn(0.5, 0.8)),
            (0.5, None, yarn(0.0, 1.25)),
        ] {
            let p = RopeParams {
                n_heads,
                head_dim,
                kind,
                n_rot,
                base: 150000.0,
                freq_scale,
                freq_factors: freq_factors.map(View::from),
                yarn,
            };
            let x0 = rng.vec(pos.len() * n_heads * head_dim);
            let mut x = x0.clone();
            d.rope((&mut x).into(), (&pos).into(), &p).expect("rope");
            let mut want = x0;
            for (row, &pv) in want.chunks_mut(n_heads * head_dim).zip(&pos) {
                math::rope_heads(row, head_dim, pv, &p.config());
            }
            let first_diff = bits(&x).iter().zip(bits(&want)).position(|(a, b)| *a != b);
            assert_eq!(first_diff, None, "{p:?}: first differing value");
        }
    }
}

#[test]
fn rope_refuses_bad_parameters() {
    let d = dev();
    let good = RopeParams::neox(2, 8, 8, 10000.0);
    let factors = [1.0f32; 3];
    let bad_factor = [1.0f32, 0.0, 1.0, 1.0];
    for (what, p) in [
        ("odd n_rot", RopeParams { n_rot: 7, ..good }),
        ("n_rot > head", RopeParams { n_rot: 10, ..good }),
        (
            "freq_scale 0",
            RopeParams {
                freq_scale: 0.0,
                ..good
            },
        ),
        (
            "base NaN",
            RopeParams {
                base: f32::NAN,
                ..good
            },
        ),
        (
            "3 factors",
            RopeParams {
                freq_factors: Some((&factors[..]).into()),
                ..good
            },
        ),
        (
            "factor 0",
            RopeParams {
                freq_factors: Some((&bad_factor[..]).into()),
                ..good
            },
        ),
    ] {
        let mut x = vec![1.0f32; 16];
        let e = d
            .rope((&mut x).into(), (&[0, 1]).into(), &p)
            .expect_err(what);
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{what}: {e}");
        assert!(e.message.contains("rope"), "{what}: {e}");
    }
}

#[test]
fn add_bias_adds_to_every_row() {
    let d = dev();
    let mut rng = Rng(16);
    let bias = rng.vec(6);
    let x0 = rng.vec(5 * 6);
    let mut x = x0.clone();
    d.add_bias((&mut x).into(), (&bias).into())
        .expect("add_bias");
    for (i, (&got, &v)) in x.iter().zip(&x0).enumerate() {
        assert_eq!(got, v + bias[i % 6], "[{i}]");
    }
    for (len, blen) in [(30, 7), (30, 0), (4, 6)] {
        let mut x = vec![0.0f32; len];
        let e = d
            .add_bias((&mut x).into(), (&vec![1.0; blen]).into())
            .expect_err("bad bias length");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains("add_bias"), "{e}");
    }
    // An empty batch takes any bias.
    d.add_bias((&mut [][..]).into(), (&bias).into())
        .expect("empty x");
}

#[test]
fn elementwise_ops_match_core() {
    let d = dev();
    let mut rng = Rng(14);
    let g = rng.vec(100);
    let u = rng.vec(100);
    let mut o = vec![0f32; 100];
    d.silu_mul((&g).into(), (&u).into(), (&mut o).into())
        .expect("silu_mul");
    for i in 0..100 {
        assert_eq!(o[i], math::silu(g[i]) * u[i]);
    }
    d.gelu_mul((&g).into(), (&u).into(), (&mut o).into())
        .expect("gelu_mul");
    for i in 0..100 {
        // GELU through ggml's f16 table, as llama.cpp's CPU backend computes it.
        assert_eq!(o[i], math::gelu_tanh_ggml_f16(g[i]) * u[i]);
    }
    let mut a = g.clone();
    d.add((&mut a).into(), (&u).into()).expect("add");
    d.scale((&mut a).into(), 0.5).expect("scale");
    for i in 0..100 {
        assert_eq!(a[i], (g[i] + u[i]) * 0.5);
    }
    // scatter_add_weighted: 2 tokens, 3 routed rows each, into rows 0 and 1 of acc.
    let dim = 4;
    let mut acc = vec![1f32; 2 * dim];
    let x = rng.vec(6 * dim);
    let w = [0.5, 2.0, -1.0, 0.25, 3.0, -0.5];
    d.scatter_add_weighted((&mut acc).into(), (&x).into(), (&w[..]).into(), dim)
        .expect("scatter");
    for j in 0..dim {
        let want =
            |t: usize| (0..3).fold(1.0f32, |a, r| a + w[3 * t + r] * x[(3 * t + r) * dim + j]);
        assert_eq!(acc[j].to_bits(), want(0).to_bits());
        assert_eq!(acc[dim + j].to_bits(), want(1).to_bits());
    }
    // add_id: rows 2, 0, 2 of a 3-row table; an id beyond it is InvalidInput.
    let table = rng.vec(3 * dim);
    let mut xs = x[..3 * dim].to_vec();
    d.add_id(
        (&mut xs).into(),
        (&table).into(),
        (&[2u32, 0, 2]).into(),
        dim,
    )
    .expect("add_id");
    for (r, e) in [2usize, 0, 2].into_iter().enumerate() {
        for j in 0..dim {
            assert_eq!(xs[r * dim + j], x[r * dim + j] + table[e * dim + j]);
        }
    }
    let err = d
        .add_id(
            (&mut xs[..dim]).into(),
            (&table).into(),
            (&[3u32]).into(),
            dim,
        )
        .expect_err("id 3 of 3 rows");
    assert_eq!(err.kind, flint_hal::HalErrorKind::InvalidInput);
}

#[test]
fn route_topk_matches_core() {
    let d = dev();
    let mut rng = Rng(15);
    let (ne, k, rows) = (8, 3, 4);
    let logits = rng.vec(rows * ne);
    let bias = rng.vec(ne);
    for (gating, cg) in [
        (Gating::Sigmoid, math::Gating::Sigmoid),
        (Gating::Softmax, math::Gating::Softmax),
    ] {
        let cfg = RoutingConfig {
            k,
            gating,
            normalize: true,
            scale: 2.5,
        };
        let mut ids = vec![0u32; rows * k];
        let mut w = vec![0f32; rows * k];
        d.route_topk(
            (&logits).into(),
            ne,
            Some((&bias).into()),
            None,
            &cfg,
            (&mut ids).into(),
            (&mut w).into(),
        )
        .expect("route");
        // With a per-expert scale: the same experts, each weight times its expert's.
        let scale = rng.vec(ne);
        let (mut ids_s, mut w_s) = (vec![0u32; rows * k], vec![0f32; rows * k]);
        d.route_topk(
            (&logits).into(),
            ne,
            Some((&bias).into()),
            Some((&scale).into()),
            &cfg,
            (&mut ids_s).into(),
            (&mut w_s).into(),
        )
        .expect("route with scale");
        assert_eq!(ids_s, ids);
        for ((&ws, &w), &e) in w_s.iter().zip(&w).zip(&ids) {
            assert_eq!(ws.to_bits(), (w * scale[e as usize]).to_bits());
        }
        for r in 0..rows {
            let mut wi = vec![0u32; k];
            let mut ww = vec![0f32; k];
            math::route_topk(
                &logits[r * ne..(r + 1) * ne],
                Some(&bias),
                k,
                cg,
                true,
                2.5,
                &mut wi,
                &mut ww,
            )
            .expect("core route");
            assert_eq!(&ids[r * k..(r + 1) * k], &wi[..]);
            assert_eq!(&w[r * k..(r + 1) * k], &ww[..]);
        }
    }
}

#[test]
fn write_kv_rejects_out_of_range_slot() {
    let d = dev();
    let layout = KvLayout {
        num_blocks: 2,
        block_size: 2,
        n_kv_heads: 1,
        head_dim_k: 2,
        head_dim_v: 2,
    };
    let mut kv = d.alloc_kv(&layout).expect("alloc");
    let e = d
        .write_kv(
            &mut *kv,
            (&[0.0; 2][..]).into(),
            (&[0.0; 2][..]).into(),
            (&[4]).into(),
        )
        .expect_err("slot 4 of 4");
    assert_eq!(e.kind, HalErrorKind::InvalidInput);
}

/// `gelu_mul` goes through a table indexed by the f16 input: every f16 value, and f32
/// values between them and beyond +-10, against `gelu_tanh_ggml_f16` bit for bit, at
/// every SIMD level this CPU has.
#[test]
fn gelu_mul_table_equals_the_core_function() {
    let mut gate: Vec<f32> = (0..=u16::MAX)
        .map(|b| half::f16::from_bits(b).to_f32())
        .filter(|x| x.is_finite())
        .collect();
    let mut rng = Rng(5);
    gate.extend(rng.vec(10_000).iter().map(|x| x * 25.0));
    gate.extend([-10.0, 10.0, -9.999, 9.999, f32::MIN_POSITIVE, -0.0]);
    let up: Vec<f32> = (0..gate.len())
        .map(|i| 1.0 + (i % 7) as f32 * 0.25)
        .collect();
    for level in flint_hal_cpu::SimdLevel::ALL {
        let opts = flint_hal::DeviceOptions {
            threads: Some(1),
            keep_quant: true,
        };
        let Ok(d) = CpuDevice::with_level(&opts, level) else {
            eprintln!("level {level:?}: not on this CPU, skipped");
            continue;
        };
        let mut out = vec![f32::NAN; gate.len()];
        d.gelu_mul((&gate).into(), (&up).into(), (&mut out).into())
            .expect("gelu_mul");
        for ((&g, &u), &o) in gate.iter().zip(&up).zip(&out) {
            let want = math::gelu_tanh_ggml_f16(g) * u;
            assert_eq!(
                o.to_bits(),
                want.to_bits(),
                "{level:?}: gelu({g}) * {u}: {o} vs {want}"
            );
        }
    }
}

/// `silu_mul` at every SIMD level this CPU has equals `math::silu(g) * u` bit for bit,
/// over a range that reaches the exponential's saturation on both sides, through a fine
/// grid of gates whose `exp(-g)` is subnormal (where the 8-lane kernel builds `2^n` in
/// two steps), with a length that leaves a scalar tail after the 16- and 8-lane bodies.
#[test]
fn silu_mul_equals_core_bit_for_bit_at_every_level() {
    let grid = 2400;
    let n = 16 * 40 + 7 + grid;
    let mut rng = Rng(31);
    let mut g: Vec<f32> = rng.vec(n).iter().map(|v| v * 120.0).collect();
    g[..6].copy_from_slice(&[0.0, -0.0, 1e-30, -1e-30, 88.5, -104.0]);
    for (i, v) in g[6..6 + grid].iter_mut().enumerate() {
        *v = 84.0 + i as f32 * 0.01;
    }
    let u = rng.vec(n);
    let want: Vec<u32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| (math::silu(g) * u).to_bits())
        .collect();
    for level in flint_hal_cpu::SimdLevel::ALL {
        let opts = flint_hal::DeviceOptions {
            threads: Some(1),
            keep_quant: true,
        };
        let Ok(d) = CpuDevice::with_level(&opts, level) else {
            eprintln!("level {level:?}: not on this CPU, skipped");
            continue;
        };
        let mut o = vec![0f32; n];
        d.silu_mul((&g).into(), (&u).into(), (&mut o).into())
            .expect("silu_mul");
        let got: Vec<u32> = o.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "level {level:?}");
    }
}

/// `swiglu_oai_mul` at every SIMD level this CPU has equals `math::swiglu_oai` bit for
/// bit (a NaN for a NaN): gates and ups past the clamp on both sides, exponents that
/// reach glibc `expf`'s special cases (overflow, underflow, infinities, NaN) inside a
/// 16-lane body, and every entry of its 32-entry table (gates on a fine grid), with a
/// length that leaves a scalar tail.
#[test]
fn swiglu_oai_mul_equals_core_bit_for_bit_at_every_level() {
    let n = 16 * 300 + 9;
    let mut rng = Rng(47);
    let mut g: Vec<f32> = rng.vec(n).iter().map(|v| v * 40.0).collect();
    // A fine grid over one period of the table (ln 2 / 32 apart at alpha = 1.702).
    for (i, x) in g[1000..2000].iter_mut().enumerate() {
        *x = -3.0 + i as f32 * 0.00613;
    }
    let specials = [
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        7.0,
        7.000001,
        -60.0,
        -51.7,
        -52.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN,
        -1e-45,
        1e-45,
    ];
    g[16..32].copy_from_slice(&specials);
    let mut u: Vec<f32> = rng.vec(n).iter().map(|v| v * 20.0).collect();
    u[32..48].copy_from_slice(&specials);
    let want: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| math::swiglu_oai(g, u))
        .collect();
    for level in flint_hal_cpu::SimdLevel::ALL {
        let opts = flint_hal::DeviceOptions {
            threads: Some(2),
            keep_quant: true,
        };
        let Ok(d) = CpuDevice::with_level(&opts, level) else {
            eprintln!("level {level:?}: not on this CPU, skipped");
            continue;
        };
        let mut o = vec![0f32; n];
        d.swiglu_oai_mul((&g).into(), (&u).into(), (&mut o).into())
            .expect("swiglu_oai_mul");
        for i in 0..n {
            assert!(
                o[i].to_bits() == want[i].to_bits() || (o[i].is_nan() && want[i].is_nan()),
                "level {level:?}, element {i}: swiglu_oai({}, {}) = {} vs {}",
                g[i],
                u[i],
                o[i],
                want[i]
            );
        }
    }
}

/// Steps inside `run_session` (where `run_step` is a plain call on the session's worker
/// and the other workers are sent back to wait for each step's work) compute what steps
/// from the caller's thread compute; a nested session and a step outside any session
/// still work; a panic in the body reaches the caller and ends the session, and the
/// device keeps working afterwards.
#[test]
fn steps_in_a_session_match_steps_outside() {
    let dev = CpuDevice::new(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("open cpu device");
    let (k, n, m) = (512usize, 96usize, 3usize);
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let w = common::random_weight(&mut Rng(5), flint_core::GgmlType::Q8_0, k, n);
    let h = dev
        .stage(&common::desc("w", flint_core::GgmlType::Q8_0, &[k, n], w))
        .expect("stage");
    let step = |dev: &CpuDevice| {
        let mut out = vec![f32::NAN; m * n];
        dev.run_step(&mut || {
            dev.matmul(&*h, (&x).into(), m, (&mut out).into())
                .expect("matmul")
        });
        out
    };
    let outside = step(&dev);
    let mut inside = Vec::new();
    dev.run_session(&mut || {
        for _ in 0..50 {
            inside.push(step(&dev));
        }
        // A long pause (the waiting workers leave), then another step.
        std::thread::sleep(std::time::Duration::from_millis(5));
        inside.push(step(&dev));
        dev.run_session(&mut || inside.push(step(&dev)));
    });
    assert_eq!(inside.len(), 52);
    for (i, got) in inside.iter().enumerate() {
        assert!(
            got.iter()
                .zip(&outside)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "step {i} in the session differs from the step outside"
        );
    }
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dev.run_session(&mut || panic!("body failed"));
    }));
    assert!(caught.is_err(), "the body's panic must reach the caller");
    assert_eq!(step(&dev), outside);
    let mut again = Vec::new();
    dev.run_session(&mut || again.push(step(&dev)));
    assert_eq!(again, vec![outside]);
}

/// The cpu device's tensors are host memory: `alloc` hands out a zeroed host vector,
/// `upload`, `download` and `download_tensor` count one call and their bytes each, and `copy`
/// copies between ranges of tensors without counting anything.
#[test]
fn host_tensors_count_transfers_and_copy_ranges() {
    let d = dev();
    assert!(d.supports(Op::Copy, None));
    let t = d.alloc(6).expect("alloc");
    assert_eq!(t.as_host(), Some(&[0.0; 6][..]));

    let before = d.transfers();
    let src = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut t = d.upload_new(&src).expect("upload_new");
    let up = d.transfers().since(&before);
    assert_eq!((up.uploads, up.upload_bytes), (1, 24));
    assert_eq!((up.downloads, up.download_bytes, up.arg_bytes), (0, 0, 0));

    // Values 1..4 of `t` over values 2..5 of `dst`.
    let mut dst = d.alloc(6).expect("alloc");
    d.copy(t.slice(1..4), dst.slice_mut(2..5)).expect("copy");
    assert_eq!(dst.as_host(), Some(&[0.0, 0.0, 2.0, 3.0, 4.0, 0.0][..]));
    assert_eq!(d.transfers().since(&before), up, "copy moves nothing over");

    let mut got = [0.0; 2];
    d.download(dst.slice(3..5), &mut got).expect("download");
    assert_eq!(got, [3.0, 4.0]);
    let down = d.transfers().since(&before).since(&up);
    assert_eq!(
        (down.downloads, down.download_bytes, down.calls()),
        (1, 8, 1)
    );

    d.upload(&[9.0, 8.0], t.slice_mut(4..6)).expect("upload");
    assert_eq!(
        d.download_tensor(t).expect("download_tensor"),
        [1.0, 2.0, 3.0, 4.0, 9.0, 8.0]
    );
    let all = d.transfers().since(&before);
    assert_eq!((all.uploads, all.upload_bytes), (2, 24 + 8));
    assert_eq!((all.downloads, all.download_bytes), (2, 8 + 24));
}

/// `norm_rope` equals `rms_norm` (per head), `rope` and `scale` one after another bit for
/// bit, at every SIMD level this CPU has: Gemma 3's queries (four heads of 256, a
/// pre-scale) and keys (one head), Qwen 3's (heads of 128), more heads in a row than
/// the norm takes at once, adjacent pairs, a partial rotation, and row counts that
/// leave a short last task.
#[test]
fn norm_rope_equals_its_three_ops() {
    use flint_hal::RopeKind;
    let mut rng = Rng(77);
    let cases: [(usize, usize, usize, RopeKind, usize, f32); 6] = [
        // (rows, heads, head_dim, kind, n_rot, scale)
        (19, 4, 256, RopeKind::Neox, 256, 0.0625),
        (19, 1, 256, RopeKind::Neox, 256, 1.0),
        (11, 8, 128, RopeKind::Neox, 128, 1.0),
        (5, 20, 64, RopeKind::Normal, 64, 0.125),
        (9, 3, 48, RopeKind::Neox, 32, 1.0),
        (1, 2, 64, RopeKind::Normal, 0, 0.5),
    ];
    for level in SimdLevel::ALL {
        let opts = DeviceOptions {
            threads: Some(2),
            keep_quant: true,
        };
        let Ok(d) = CpuDevice::with_level(&opts, level) else {
            eprintln!("level {level:?}: not on this CPU, skipped");
            continue;
        };
        for &(rows, n_heads, head_dim, kind, n_rot, scale) in &cases {
            let p = RopeParams {
                kind,
                n_rot,
                ..RopeParams::neox(n_heads, head_dim, head_dim, 1e6)
            };
            let pos: Vec<u32> = (0..rows as u32).map(|i| 5 * i + 3).collect();
            let x0: Vec<f32> = rng
                .vec(rows * n_heads * head_dim)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let w: Vec<f32> = rng.vec(head_dim).iter().map(|v| 1.0 + v).collect();
            let mut want = vec![0f32; x0.len()];
            d.rms_norm(
                (&x0).into(),
                Some((&w).into()),
                1e-6,
                head_dim,
                (&mut want).into(),
            )
            .expect("rms_norm");
            d.rope((&mut want).into(), (&pos).into(), &p).expect("rope");
            if scale != 1.0 {
                d.scale((&mut want).into(), scale).expect("scale");
            }
            let (mut got, mut scratch) = (x0.clone(), vec![0f32; x0.len()]);
            d.norm_rope(
                (&mut got).into(),
                (&w).into(),
                1e-6,
                (&pos).into(),
                &p,
                scale,
                (&mut scratch).into(),
            )
            .expect("norm_rope");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{level:?}: {rows} rows of {n_heads} x {head_dim}, {kind:?}, n_rot {n_rot}, scale {scale}"
            );
        }
    }
}

/// `post_norm_add_rms_norm` equals `rms_norm` into a buffer then `add_rms_norm` from it
/// bit for bit, residual and output, at every SIMD level this CPU has (Gemma 3 270M's
/// width, a width that is not a multiple of 16, row counts that leave a short chunk).
#[test]
fn post_norm_add_rms_norm_equals_its_two_ops() {
    let mut rng = Rng(91);
    for level in SimdLevel::ALL {
        let opts = DeviceOptions {
            threads: Some(2),
            keep_quant: true,
        };
        let Ok(d) = CpuDevice::with_level(&opts, level) else {
            eprintln!("level {level:?}: not on this CPU, skipped");
            continue;
        };
        for (rows, dim) in [(37, 640), (5, 120), (16, 64)] {
            let n = rows * dim;
            let r0: Vec<f32> = rng.vec(n).iter().map(|v| v * 4.0).collect();
            let delta = rng.vec(n);
            let dw: Vec<f32> = rng.vec(dim).iter().map(|v| 1.0 + v).collect();
            let w: Vec<f32> = rng.vec(dim).iter().map(|v| 1.0 + v * 0.5).collect();
            let (mut want_res, mut want_out, mut normed) =
                (r0.clone(), vec![0f32; n], vec![0f32; n]);
            d.rms_norm(
                (&delta).into(),
                Some((&dw).into()),
                1e-6,
                dim,
                (&mut normed).into(),
            )
            .expect("rms_norm");
            d.add_rms_norm(
                (&mut want_res).into(),
                (&normed).into(),
                (&w).into(),
                1e-6,
                dim,
                (&mut want_out).into(),
            )
            .expect("add_rms_norm");
            let (mut res, mut out, mut scratch) = (r0.clone(), vec![0f32; n], vec![0f32; n]);
            d.post_norm_add_rms_norm(
                (&mut res).into(),
                (&delta).into(),
                (&dw).into(),
                (&w).into(),
                1e-6,
                dim,
                (&mut scratch).into(),
                (&mut out).into(),
            )
            .expect("post_norm_add_rms_norm");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&res),
                bits(&want_res),
                "{level:?}: residual, {rows} x {dim}"
            );
            assert_eq!(
                bits(&out),
                bits(&want_out),
                "{level:?}: out, {rows} x {dim}"
            );
        }
    }
}
