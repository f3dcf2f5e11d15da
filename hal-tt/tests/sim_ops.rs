//! The `tt` device through the simulated adapter agrees with the core references, and
//! keep-quant staging routes to the block path.

mod common;

use common::{
    bf16_round, expert_bytes, h, hm, matmul_core, matmul_ref, open_sim, rel_rms, weight, Rng,
};
use flint_core::GgmlType;
use flint_hal::{
    AttnSeq, Device, Gating, HalErrorKind, KvLayout, PagedAttention, RopeKind, RopeParams,
    RoutingConfig, Tier, WeightKind, Yarn,
};

#[test]
fn matmul_q4k_kept_matches_reference_and_counts_block_dispatch() {
    let dev = open_sim(true);
    let mut rng = Rng::new(1);
    let (in_f, out_f, m) = (512, 24, 3);
    let (desc, deq) = weight(
        "blk.0.ffn_up.weight",
        GgmlType::Q4_K,
        &[in_f, out_f],
        WeightKind::Matrix,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage");
    assert!(w.info().kept_quant);
    assert_eq!(w.info().staged_ty, GgmlType::Q4_K);
    assert_eq!(w.info().tier, Tier::Resident);
    assert_eq!(w.info().resident_bytes, desc.data.len() as u64);
    let x = rng.vec(m * in_f);
    let mut out = vec![0.0; m * out_f];
    let before = dev.counters();
    dev.matmul(&*w, h(&x), m, hm(&mut out)).expect("matmul");
    // The core oracle (Q8_K activations, as ggml pairs them with Q4_K) ...
    let want = matmul_core(GgmlType::Q4_K, desc.data.as_slice(), in_f, &x);
    let e = rel_rms(&out, &want);
    assert!(e < 1e-6, "vs core oracle: rel-RMS {e}");
    // ... and the exact f64 product of the dequantized weights.
    let e = rel_rms(&out, &matmul_ref(&deq, in_f, &x));
    assert!(e < 2e-2, "vs f64 product: rel-RMS {e}");
    let after = dev.counters();
    // Reachability: the matmul ran on the kept blocks.
    assert_eq!(after.block_dispatches, before.block_dispatches + 1);
    assert_eq!(after.float_dispatches, before.float_dispatches);
}

#[test]
fn bf16_arm_never_dispatches_blocks() {
    let dev = open_sim(false);
    let mut rng = Rng::new(2);
    let (in_f, out_f, m) = (256, 16, 2);
    let (desc, deq) = weight(
        "w",
        GgmlType::Q4_K,
        &[in_f, out_f],
        WeightKind::Matrix,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage");
    assert!(!w.info().kept_quant);
    assert_eq!(w.info().staged_ty, GgmlType::BF16);
    assert_eq!(w.info().resident_bytes, (in_f * out_f * 2) as u64);
    let x = rng.vec(m * in_f);
    let mut out = vec![0.0; m * out_f];
    dev.matmul(&*w, h(&x), m, hm(&mut out)).expect("matmul");
    // Exactly the BF16-rounded weight, and close to the unrounded one.
    let e = rel_rms(&out, &matmul_ref(&bf16_round(&deq), in_f, &x));
    assert!(e < 1e-5, "vs bf16 weights: {e}");
    let e = rel_rms(&out, &matmul_ref(&deq, in_f, &x));
    assert!(e < 1e-2, "vs exact weights: {e}");
    let c = dev.counters();
    assert_eq!(c.block_dispatches, 0);
    assert_eq!(c.float_dispatches, 1);
}

#[test]
fn arrangement_per_encoding() {
    let dev = open_sim(true);
    let mut rng = Rng::new(3);
    // Admitted: kept. Not admitted but expandable: F32, without loss. Small floats: in
    // their own encoding.
    for (ty, kept) in [
        (GgmlType::Q4_K, true),
        (GgmlType::Q5_K, true),
        (GgmlType::Q6_K, true),
        (GgmlType::Q8_0, false),
        (GgmlType::Q4_0, false),
        (GgmlType::Q5_0, false),
        (GgmlType::F32, false),
        (GgmlType::F16, false),
    ] {
        let (desc, deq) = weight("t", ty, &[256, 4], WeightKind::Matrix, &mut rng);
        let w = dev.stage(&desc).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(w.info().kept_quant, kept, "{ty}");
        assert_eq!(dev.admits_kept(ty), kept, "{ty}");
        let want_ty = match ty {
            _ if kept => ty,
            GgmlType::F16 => GgmlType::F16,
            _ => GgmlType::F32,
        };
        assert_eq!(w.info().staged_ty, want_ty, "{ty}");
        let x = rng.vec(256);
        let mut out = vec![0.0; 4];
        dev.matmul(&*w, h(&x), 1, hm(&mut out)).expect("matmul");
        // Kept blocks and blocks expanded to F32 compute what the blocks compute
        // (activations rounded as ggml pairs them with the source encoding); float
        // tensors take f32 activations.
        let want = if ty.is_quantized() {
            matmul_core(ty, desc.data.as_slice(), 256, &x)
        } else {
            matmul_ref(&deq, 256, &x)
        };
        let e = rel_rms(&out, &want);
        assert!(e < 1e-6, "{ty}: rel-RMS {e}");
        if matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0) {
            // Expanded from the blocks llama.cpp sums in tinyBLAS's order: the same bits.
            assert_eq!(out, want, "{ty}: expanded F32 vs the blocks' order");
        }
    }
    // IQ types are admitted.
    for ty in [
        GgmlType::IQ4_XS,
        GgmlType::IQ2_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_M,
    ] {
        assert!(dev.admits_kept(ty), "{ty}");
    }
    // An encoding that can be neither kept nor expanded is refused, naming both.
    let bytes = vec![0u8; GgmlType::Q8_K.row_bytes(256).unwrap_or(0) * 2];
    let desc = flint_hal::WeightDesc {
        name: "blk.3.odd.weight".into(),
        ty: GgmlType::Q8_K,
        dims: vec![256, 2],
        kind: WeightKind::Matrix,
        data: flint_hal::WeightSource::from_vec(bytes),
    };
    let e = dev.stage(&desc).expect_err("Q8_K cannot be staged");
    assert_eq!(e.kind, HalErrorKind::Unsupported);
    assert!(
        e.message.contains("Q8_K") && e.message.contains("blk.3.odd.weight"),
        "{e}"
    );
    assert!(!dev.supports(flint_hal::Op::Matmul, Some(GgmlType::Q8_K)));
    assert!(dev.supports(flint_hal::Op::Matmul, Some(GgmlType::Q5_0)));
    // Bytes that do not match the shape are refused naming the tensor.
    let mut bad = desc.clone();
    bad.ty = GgmlType::Q4_K;
    bad.name = "short".into();
    bad.data = flint_hal::WeightSource::from_vec(vec![0u8; 100]);
    let e = dev.stage(&bad).expect_err("length mismatch");
    assert_eq!(e.kind, HalErrorKind::InvalidInput);
    assert!(e.message.contains("short"), "{e}");
}

fn expert_case(keep_quant: bool) {
    let dev = open_sim(keep_quant);
    let mut rng = Rng::new(4);
    let (in_f, out_f, n_exp) = (256, 8, 5);
    let (desc, deq) = weight(
        "blk.1.ffn_gate_exps.weight",
        GgmlType::Q4_K,
        &[in_f, out_f, n_exp],
        WeightKind::ExpertTower,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage tower");
    assert_eq!(w.info().kept_quant, keep_quant);
    assert_eq!(w.info().tier, Tier::ExpertResident);
    let x_rows = 3;
    let x = rng.vec(x_rows * in_f);
    // Two experts per input row (a fan-out of 2): routed row i reads input row i / 2.
    let ids = [4u32, 2, 0, 4, 4, 2];
    let mut out = vec![0.0; ids.len() * out_f];
    dev.expert_matmul(&*w, h(&x), (&ids).into(), hm(&mut out))
        .expect("expert matmul");
    let per = in_f * out_f;
    let mut want = Vec::new();
    for (i, &e) in ids.iter().enumerate() {
        let e = e as usize;
        let xi = &x[(i / 2) * in_f..(i / 2 + 1) * in_f];
        if keep_quant {
            let b = expert_bytes(GgmlType::Q4_K, desc.data.as_slice(), in_f, out_f, e);
            want.extend(matmul_core(GgmlType::Q4_K, b, in_f, xi));
        } else {
            want.extend(matmul_ref(
                &bf16_round(&deq[e * per..(e + 1) * per]),
                in_f,
                xi,
            ));
        }
    }
    let e = rel_rms(&out, &want);
    assert!(e < 1e-6, "keep_quant {keep_quant}: rel-RMS {e}");
    let c = dev.counters();
    assert_eq!(c.block_dispatches > 0, keep_quant);
    assert_eq!(c.float_dispatches > 0, !keep_quant);
}

#[test]
fn expert_matmul_matches_reference_kept() {
    expert_case(true);
}

#[test]
fn expert_matmul_matches_reference_bf16() {
    expert_case(false);
}

#[test]
fn get_rows_and_elementwise_ops_match_core() {
    let dev = open_sim(true);
    let mut rng = Rng::new(5);
    let (d, v) = (256, 10);
    let (desc, deq) = weight(
        "token_embd.weight",
        GgmlType::Q6_K,
        &[d, v],
        WeightKind::Embedding,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage");
    let ids = [3u32, 9, 0, 3];
    let mut out = vec![0.0; ids.len() * d];
    dev.get_rows(&*w, (&ids).into(), hm(&mut out))
        .expect("get_rows");
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            &out[i * d..(i + 1) * d],
            &deq[id as usize * d..(id as usize + 1) * d]
        );
    }
    let e = dev
        .get_rows(&*w, (&[10]).into(), hm(&mut vec![0.0; d]))
        .expect_err("id out of range");
    assert_eq!(e.kind, HalErrorKind::InvalidInput);

    let dim = 64;
    let x = rng.vec(3 * dim);
    let nw = rng.vec(dim);
    let mut got = vec![0.0; x.len()];
    dev.rms_norm(h(&x), Some(h(&nw)), 1e-6, dim, hm(&mut got))
        .expect("rms_norm");
    let mut want = vec![0.0; x.len()];
    flint_core::math::rms_norm_rows(&x, Some(&nw), dim, 1e-6, &mut want);
    assert_eq!(got, want);
    dev.rms_norm(h(&x), None, 1e-5, dim, hm(&mut got))
        .expect("rms_norm");
    flint_core::math::rms_norm_rows(&x, None, dim, 1e-5, &mut want);
    assert_eq!(got, want);

    let mut res = x.clone();
    let delta = rng.vec(x.len());
    dev.add_rms_norm(hm(&mut res), h(&delta), h(&nw), 1e-6, dim, hm(&mut got))
        .expect("add_rms_norm");
    let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
    assert_eq!(res, sum);
    flint_core::math::rms_norm_rows(&sum, Some(&nw), dim, 1e-6, &mut want);
    assert_eq!(got, want);

    // Every kind of RoPE parameters, bit for bit against the core reference.
    let pos = [0u32, 7, 1000, 70000];
    let factors: Vec<f32> = (0..6).map(|i| 1.0 + i as f32).collect();
    let yarn = Some(Yarn {
        ext_factor: 1.0,
        attn_factor: 0.9,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    });
    let plain = RopeParams::neox(3, 16, 12, 10000.0);
    for kind in [RopeKind::Normal, RopeKind::Neox] {
        for (freq_scale, freq_factors, yarn) in [
            (1.0, None, None),
            (0.25, None, None),
            (1.0, Some((&factors[..]).into()), None),
            (0.125, Some((&factors[..]).into()), yarn),
        ] {
            let p = RopeParams {
                kind,
                freq_scale,
                freq_factors,
                yarn,
                ..plain
            };
            let mut xr = rng.vec(pos.len() * 48);
            let mut want = xr.clone();
            dev.rope(hm(&mut xr), (&pos).into(), &p).expect("rope");
            for (row, &ps) in want.chunks_exact_mut(48).zip(&pos) {
                flint_core::math::rope_heads(row, 16, ps, &p.config());
            }
            assert_eq!(xr, want, "{p:?}");
        }
    }
    // Parameters the host refuses before calling the adapter.
    let short = [1.0f32; 5];
    let e = dev
        .rope(
            hm(&mut [0.0; 48]),
            (&[3]).into(),
            &RopeParams {
                freq_factors: Some((&short[..]).into()),
                ..plain
            },
        )
        .expect_err("5 factors for n_rot 12");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");

    let bias = rng.vec(8);
    let x0 = rng.vec(5 * 8);
    let mut xb = x0.clone();
    dev.add_bias(hm(&mut xb), h(&bias)).expect("add_bias");
    for i in 0..40 {
        assert_eq!(xb[i], x0[i] + bias[i % 8], "add_bias [{i}]");
    }
    let e = dev
        .add_bias(hm(&mut xb), h(&bias[..7]))
        .expect_err("a bias that does not divide x");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");

    let g = rng.vec(50);
    let u = rng.vec(50);
    let mut o = vec![0.0; 50];
    dev.silu_mul(h(&g), h(&u), hm(&mut o)).expect("silu_mul");
    for i in 0..50 {
        assert_eq!(o[i], flint_core::math::silu(g[i]) * u[i]);
    }
    dev.gelu_mul(h(&g), h(&u), hm(&mut o)).expect("gelu_mul");
    for i in 0..50 {
        // On fp16 operands, as the CPU backend and the reference forward compute it.
        assert_eq!(o[i], flint_core::math::gelu_tanh_ggml_f16(g[i]) * u[i]);
        let exact = flint_core::math::gelu_tanh(g[i]) * u[i];
        assert!((o[i] - exact).abs() <= 2e-3 * (1.0 + exact.abs()), "{i}");
    }
    let mut acc = g.clone();
    dev.add(hm(&mut acc), h(&u)).expect("add");
    for i in 0..50 {
        assert_eq!(acc[i], g[i] + u[i]);
    }
    dev.scale(hm(&mut acc), 0.5).expect("scale");
    for i in 0..50 {
        assert_eq!(acc[i], (g[i] + u[i]) * 0.5);
    }

    // Three accumulator rows, two routed rows each: x row i goes to acc row i / 2, in
    // order of i, one f32 product and one f32 add each.
    let dim = 4;
    let mut acc = rng.vec(3 * dim);
    let start = acc.clone();
    let xs = rng.vec(6 * dim);
    let ws = [0.5f32, 0.25, 1.5, -1.0, 3.0, -0.125];
    dev.scatter_add_weighted(hm(&mut acc), h(&xs), h(&ws), dim)
        .expect("scatter");
    let mut want = start;
    for (i, &w) in ws.iter().enumerate() {
        for j in 0..dim {
            want[(i / 2) * dim + j] += w * xs[i * dim + j];
        }
    }
    assert_eq!(acc, want);
}

#[test]
fn route_topk_matches_core() {
    let dev = open_sim(true);
    let mut rng = Rng::new(6);
    let (n_exp, rows) = (16, 5);
    let logits = rng.vec(rows * n_exp);
    let bias = rng.vec(n_exp);
    for (gating, cg, bias, normalize) in [
        (
            Gating::Sigmoid,
            flint_core::math::Gating::Sigmoid,
            Some(&bias[..]),
            true,
        ),
        (
            Gating::Softmax,
            flint_core::math::Gating::Softmax,
            None,
            false,
        ),
    ] {
        let cfg = RoutingConfig {
            k: 4,
            gating,
            normalize,
            scale: 2.5,
        };
        let mut ids = vec![0u32; rows * 4];
        let mut ws = vec![0.0f32; rows * 4];
        dev.route_topk(
            h(&logits),
            n_exp,
            bias.map(h),
            None,
            &cfg,
            (&mut ids).into(),
            hm(&mut ws),
        )
        .expect("route");
        // With a per-expert output scale: the same experts, each weight times its
        // expert's value.
        let es: Vec<f32> = (0..n_exp).map(|e| 0.5 + 0.125 * e as f32).collect();
        let mut ids_s = vec![0u32; rows * 4];
        let mut ws_s = vec![0.0f32; rows * 4];
        dev.route_topk(
            h(&logits),
            n_exp,
            bias.map(h),
            Some(h(&es)),
            &cfg,
            (&mut ids_s).into(),
            hm(&mut ws_s),
        )
        .expect("route with expert scale");
        assert_eq!(ids_s, ids);
        for (i, (&w, &e)) in ws.iter().zip(&ids).enumerate() {
            assert_eq!(ws_s[i], w * es[e as usize], "[{i}]");
        }
        for r in 0..rows {
            let mut wi = [0u32; 4];
            let mut ww = [0.0f32; 4];
            flint_core::math::route_topk(
                &logits[r * n_exp..(r + 1) * n_exp],
                bias,
                4,
                cg,
                normalize,
                2.5,
                &mut wi,
                &mut ww,
            )
            .expect("core route");
            assert_eq!(&ids[r * 4..(r + 1) * 4], &wi);
            assert_eq!(&ws[r * 4..(r + 1) * 4], &ww);
        }
    }
}

/// Paged attention over two sequences with scattered block tables, GQA, sinks and a
/// window, against the core contiguous reference.
fn attention_case(sinks: bool, window: Option<usize>) {
    let dev = open_sim(true);
    let mut rng = Rng::new(7);
    let layout = KvLayout {
        num_blocks: 12,
        block_size: 4,
        n_kv_heads: 2,
        head_dim_k: 16,
        head_dim_v: 8,
    };
    let n_heads = 4;
    let mut kv = dev.alloc_kv(&layout).expect("alloc kv");
    // Sequence A: 9 tokens in blocks 5, 0, 11; sequence B: 6 tokens in blocks 3, 7.
    let seqs_def: [(usize, Vec<u32>); 2] = [(9, vec![5, 0, 11]), (6, vec![3, 7])];
    let (kr, vr) = (layout.n_kv_heads * 16, layout.n_kv_heads * 8);
    let mut kvs = Vec::new();
    for (len, table) in &seqs_def {
        let k = rng.vec(len * kr);
        let v = rng.vec(len * vr);
        let slots: Vec<u32> = (0..*len)
            .map(|j| table[j / 4] * 4 + (j % 4) as u32)
            .collect();
        dev.write_kv(&mut *kv, h(&k), h(&v), (&slots).into())
            .expect("write_kv");
        // The device keeps keys and values at fp16 precision.
        let k16: Vec<f32> = k.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
        let v16: Vec<f32> = v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
        kvs.push((k16, v16));
    }
    // Queries: A's last 3 positions (a prefill chunk), B's last position (decode).
    let qa_pos = [6u32, 7, 8];
    let qb_pos = [5u32];
    let qrow = n_heads * 16;
    let q = rng.vec((qa_pos.len() + qb_pos.len()) * qrow);
    let sink_v: Vec<f32> = (0..n_heads).map(|h| 0.3 * h as f32 - 0.5).collect();
    let sk = if sinks { Some(&sink_v[..]) } else { None };
    let scale = 0.25;
    let seqs = [
        AttnSeq {
            q_start: 0,
            positions: (&qa_pos).into(),
            block_table: (&seqs_def[0].1).into(),
        },
        AttnSeq {
            q_start: 3,
            positions: (&qb_pos).into(),
            block_table: (&seqs_def[1].1).into(),
        },
    ];
    let p = PagedAttention {
        q: h(&q),
        seqs: &seqs,
        n_heads,
        scale,
        sinks: sk.map(Into::into),
        window,
    };
    let mut out = vec![0.0; 4 * n_heads * 8];
    dev.paged_attention(&*kv, &p, hm(&mut out))
        .expect("attention");

    let ap = flint_core::math::AttentionParams {
        n_head: n_heads,
        n_head_kv: 2,
        dk: 16,
        dv: 8,
        scale,
        sinks: sk,
        window,
    };
    let mut want = vec![0.0; out.len()];
    let orow = n_heads * 8;
    flint_core::math::attention_ref(
        &ap,
        &q[..3 * qrow],
        &qa_pos,
        &kvs[0].0,
        &kvs[0].1,
        &mut want[..3 * orow],
    );
    flint_core::math::attention_ref(
        &ap,
        &q[3 * qrow..],
        &qb_pos,
        &kvs[1].0,
        &kvs[1].1,
        &mut want[3 * orow..],
    );
    let e = rel_rms(&out, &want);
    assert!(e < 1e-6, "sinks {sinks} window {window:?}: rel-RMS {e}");
}

#[test]
fn paged_attention_matches_core() {
    attention_case(false, None);
}

#[test]
fn paged_attention_sinks_and_window_match_core() {
    attention_case(true, None);
    attention_case(true, Some(3));
    attention_case(false, Some(1));
    attention_case(true, Some(0));
}

#[test]
fn weights_and_kv_of_another_device_are_refused() {
    let a = open_sim(true);
    let b = open_sim(true);
    let mut rng = Rng::new(8);
    let (desc, _) = weight("w", GgmlType::Q4_K, &[256, 2], WeightKind::Matrix, &mut rng);
    let w = a.stage(&desc).expect("stage");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut out = [0.0; 2];
        let _ = b.matmul(&*w, h(&[0.0; 256]), 1, hm(&mut out));
    }));
    assert!(r.is_err(), "a weight from another device must panic");
}

#[test]
fn large_matmul_split_across_workers_matches_core() {
    // Large enough (2 * 1024 * 1024 multiply-adds) that the simulator splits the output
    // rows across threads.
    let dev = open_sim(true);
    let mut rng = Rng::new(9);
    let (in_f, out_f, m) = (1024, 1024, 2);
    let (desc, _) = weight(
        "big",
        GgmlType::Q5_K,
        &[in_f, out_f],
        WeightKind::Matrix,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage");
    let x = rng.vec(m * in_f);
    let mut out = vec![0.0; m * out_f];
    dev.matmul(&*w, h(&x), m, hm(&mut out)).expect("matmul");
    let want = matmul_core(GgmlType::Q5_K, desc.data.as_slice(), in_f, &x);
    assert!(rel_rms(&out, &want) < 1e-6);
}

#[test]
fn iq4_nl_is_kept_and_matches_core() {
    // IQ4_NL blocks built by hand (the core has no IQ quantizer): an f16 scale and 16
    // bytes of 4-bit codebook indices per 32 values.
    let dev = open_sim(true);
    let mut rng = Rng::new(10);
    let (in_f, out_f) = (64, 6);
    let n_blocks = in_f / 32 * out_f;
    let mut bytes = Vec::with_capacity(n_blocks * 18);
    for _ in 0..n_blocks {
        let d = half::f16::from_f32(0.01 + 0.02 * rng.f().abs());
        bytes.extend_from_slice(&d.to_bits().to_le_bytes());
        bytes.extend((0..16).map(|_| rng.next_u32() as u8));
    }
    let desc = flint_hal::WeightDesc {
        name: "iq".into(),
        ty: GgmlType::IQ4_NL,
        dims: vec![in_f, out_f],
        kind: WeightKind::Matrix,
        data: flint_hal::WeightSource::from_vec(bytes.clone()),
    };
    let w = dev.stage(&desc).expect("stage");
    assert!(w.info().kept_quant);
    let x = rng.vec(in_f);
    let mut out = vec![0.0; out_f];
    dev.matmul(&*w, h(&x), 1, hm(&mut out)).expect("matmul");
    assert!(rel_rms(&out, &matmul_core(GgmlType::IQ4_NL, &bytes, in_f, &x)) < 1e-6);
    assert_eq!(dev.counters().block_dispatches, 1);
}

/// MXFP4 blocks (gpt-oss's experts): 17 bytes per 32 values, an E8M0 exponent byte
/// (here scales 2^-8..2^4) and 16 bytes of E2M1 nibbles.
fn mxfp4_bytes(rng: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(blocks * 17);
    for _ in 0..blocks {
        b.push(119 + (rng.next_u32() % 13) as u8);
        b.extend((0..16).map(|_| rng.next_u32() as u8));
    }
    b
}

/// `W x` for MXFP4 rows in llama.cpp's order (the CPU backend's, bit for bit).
fn mxfp4_want(bytes: &[u8], in_f: usize, x: &[f32]) -> Vec<f32> {
    use flint_core::blocks::{BlockMXFP4, BlockQ8_0};
    let nb = in_f / 32;
    let w: Vec<BlockMXFP4> = bytes
        .chunks_exact(17)
        .map(bytemuck::pod_read_unaligned)
        .collect();
    let mut out = Vec::new();
    for xr in x.chunks_exact(in_f) {
        let mut a = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; nb];
        flint_core::quant::quantize_row_q8_0_act(xr, &mut a);
        for wr in w.chunks_exact(nb) {
            out.push(flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack(wr, &a));
        }
    }
    out
}

#[test]
fn mxfp4_is_kept_and_matches_the_cpu_order() {
    let dev = open_sim(true);
    assert!(dev.admits_kept(GgmlType::MXFP4));
    let mut rng = Rng::new(13);
    // gpt-oss's width (90 blocks), and an expert tower [in, out, 4].
    let (in_f, out_f, e) = (2880, 6, 4);
    // Large block sums (positive codes 5..7: 6, 8, 12) against activations whose blocks
    // alternate in sign: `sum * scale` is inexact and the blocks cancel, so that the
    // order's single `fma` per block shows against the generic `acc + sum * scale`.
    let mut bytes = mxfp4_bytes(&mut rng, in_f / 32 * out_f);
    for blk in bytes.chunks_exact_mut(17) {
        blk[0] = 127;
        for q in &mut blk[1..] {
            *q = (5 + (*q & 0x0f) % 3) | ((5 + (*q >> 4) % 3) << 4);
        }
    }
    let desc = flint_hal::WeightDesc {
        name: "blk.0.ffn_down_exps.weight".into(),
        ty: GgmlType::MXFP4,
        dims: vec![in_f, out_f],
        kind: WeightKind::Matrix,
        data: flint_hal::WeightSource::from_vec(bytes.clone()),
    };
    let w = dev.stage(&desc).expect("stage");
    assert!(w.info().kept_quant);
    assert_eq!(w.info().staged_ty, GgmlType::MXFP4);
    assert_eq!(w.info().resident_bytes, bytes.len() as u64);
    for m in [1, 3, 17] {
        let x: Vec<f32> = (0..m * in_f)
            .map(|i| (0.5 + rng.f().abs()) * if (i / 32) % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let mut out = vec![0.0; m * out_f];
        dev.matmul(&*w, h(&x), m, hm(&mut out)).expect("matmul");
        let want = mxfp4_want(&bytes, in_f, &x);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&want), "m {m}");
    }
    let tower = mxfp4_bytes(&mut rng, in_f / 32 * out_f * e);
    let desc = flint_hal::WeightDesc {
        name: "blk.0.ffn_up_exps.weight".into(),
        ty: GgmlType::MXFP4,
        dims: vec![in_f, out_f, e],
        kind: WeightKind::ExpertTower,
        data: flint_hal::WeightSource::from_vec(tower.clone()),
    };
    let t = dev.stage(&desc).expect("stage tower");
    assert!(t.info().kept_quant);
    let x = rng.vec(3 * in_f);
    let ids = [3u32, 1, 0, 3, 2, 3];
    let mut out = vec![0.0; ids.len() * out_f];
    let before = dev.counters();
    dev.expert_matmul(&*t, h(&x), (&ids).into(), hm(&mut out))
        .expect("expert_matmul");
    for (j, &e) in ids.iter().enumerate() {
        let i = j / 2;
        let want = mxfp4_want(
            expert_bytes(GgmlType::MXFP4, &tower, in_f, out_f, e as usize),
            in_f,
            &x[i * in_f..(i + 1) * in_f],
        );
        let got = &out[j * out_f..(j + 1) * out_f];
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "row {j} output {o}: {g} vs {w}");
        }
    }
    let after = dev.counters();
    assert!(after.block_dispatches > before.block_dispatches);
    assert_eq!(after.float_dispatches, before.float_dispatches);
}

#[test]
fn concurrent_calls_on_one_device_agree() {
    let dev = std::sync::Arc::new(open_sim(true));
    let mut rng = Rng::new(12);
    let (desc, _) = weight(
        "w",
        GgmlType::Q4_K,
        &[256, 32],
        WeightKind::Matrix,
        &mut rng,
    );
    let w = dev.stage(&desc).expect("stage");
    let xs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(256)).collect();
    std::thread::scope(|s| {
        for x in &xs {
            let (dev, w, bytes) = (dev.clone(), w.clone(), desc.data.as_slice());
            s.spawn(move || {
                for _ in 0..20 {
                    let mut out = vec![0.0; 32];
                    dev.matmul(&*w, h(x), 1, hm(&mut out)).expect("matmul");
                    assert_eq!(out, matmul_core(GgmlType::Q4_K, bytes, 256, x));
                }
            });
        }
    });
    assert_eq!(dev.counters().block_dispatches, 80);
}

#[test]
fn expansion_to_f16_and_f32() {
    let mut rng = Rng::new(13);
    let (desc, deq) = weight(
        "q8",
        GgmlType::Q8_0,
        &[256, 8],
        WeightKind::Matrix,
        &mut rng,
    );
    let x = rng.vec(2 * 256);
    for (to, want) in [
        (
            GgmlType::F16,
            deq.iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect::<Vec<_>>(),
        ),
        (GgmlType::F32, Vec::new()),
    ] {
        let mut dev = open_sim(true);
        dev.set_expansion(to).expect("expansion target");
        let w = dev.stage(&desc).expect("stage");
        assert_eq!(w.info().staged_ty, to);
        assert!(!w.info().kept_quant);
        assert_eq!(w.info().resident_bytes, (256 * 8 * to.type_size()) as u64);
        let mut out = vec![0.0; 16];
        dev.matmul(&*w, h(&x), 2, hm(&mut out)).expect("matmul");
        if to == GgmlType::F32 {
            // Lossless: the blocks' own arithmetic, bit for bit (`source_type`).
            assert_eq!(
                out,
                matmul_core(GgmlType::Q8_0, desc.data.as_slice(), 256, &x)
            );
        } else {
            // F16 rounds the weights; activations stay f32.
            let e = rel_rms(&out, &matmul_ref(&want, 256, &x));
            assert!(e < 1e-6, "{to}: {e}");
        }
        assert_eq!(dev.counters().float_dispatches, 1);
        assert_eq!(dev.counters().block_dispatches, 0);
    }
    let mut dev = open_sim(true);
    assert!(dev.set_expansion(GgmlType::Q8_0).is_err());
}
