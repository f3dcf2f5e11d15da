//! HAL v2 on the `tt` device: activations in tensors the device allocates stay on the
//! device (no host transfers), host views are moved in and out and counted, and
//! device-side copies honour offsets. The adapter's own counters cross-check the host's.

mod common;

use common::{h, hm, open_sim, weight, Rng};
use flint_core::GgmlType;
use flint_hal::{
    AttnSeq, Device, Gating, IndexTensor, KvLayout, PagedAttention, RopeParams, RoutingConfig,
    Tensor, View, ViewMut, WeightHandle, WeightKind,
};
use flint_hal_tt::{TtCounters, TtDevice};

const D: usize = 64;
const ROWS: usize = 3;
const N_HEADS: usize = 4;
const N_KV: usize = 2;
const HD: usize = 16;
const N_EXP: usize = 8;
const FF: usize = 32;
const TOPK: usize = 2;

struct Model {
    emb: WeightHandle,
    wq: WeightHandle,
    wk: WeightHandle,
    wv: WeightHandle,
    wo: WeightHandle,
    router: WeightHandle,
    gate: WeightHandle,
    up: WeightHandle,
    down: WeightHandle,
    norm1: Vec<f32>,
    norm2: Vec<f32>,
    bq: Vec<f32>,
    router_bias: Vec<f32>,
    /// RoPE frequency factors (`HD / 2`, Llama 3's `rope_freqs`).
    rope_freqs: Vec<f32>,
    /// Attention sink logits (`N_HEADS`).
    sinks: Vec<f32>,
}

fn model(dev: &TtDevice, rng: &mut Rng) -> Model {
    let mut st = |name: &str, ty, dims: &[usize], kind| {
        let (d, _) = weight(name, ty, dims, kind, rng);
        dev.stage(&d).expect("stage")
    };
    let q8 = GgmlType::Q8_0;
    let emb = st("token_embd.weight", q8, &[D, 10], WeightKind::Embedding);
    let wq = st("wq", q8, &[D, N_HEADS * HD], WeightKind::Matrix);
    let wk = st("wk", q8, &[D, N_KV * HD], WeightKind::Matrix);
    let wv = st("wv", q8, &[D, N_KV * HD], WeightKind::Matrix);
    let wo = st("wo", q8, &[N_HEADS * HD, D], WeightKind::Matrix);
    let router = st("router", GgmlType::F32, &[D, N_EXP], WeightKind::Matrix);
    let gate = st("gate_exps", q8, &[D, FF, N_EXP], WeightKind::ExpertTower);
    let up = st("up_exps", q8, &[D, FF, N_EXP], WeightKind::ExpertTower);
    let down = st("down_exps", q8, &[FF, D, N_EXP], WeightKind::ExpertTower);
    Model {
        emb,
        wq,
        wk,
        wv,
        wo,
        router,
        gate,
        up,
        down,
        norm1: rng.vec(D),
        norm2: rng.vec(D),
        bq: rng.vec(N_HEADS * HD),
        router_bias: rng.vec(N_EXP),
        rope_freqs: (0..HD / 2).map(|i| 1.0 + 0.5 * i as f32).collect(),
        sinks: rng.vec(N_HEADS),
    }
}

/// What one step leaves behind, in host memory.
#[derive(Debug, PartialEq)]
struct Outcome {
    residual: Vec<f32>,
    normed: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f32>,
}

/// One attention + MoE layer over `ROWS` tokens, every activation (the expert ids and
/// routing weights included) in a tensor that is host memory (`on_device` false: every op
/// moves its inputs and outputs) or allocated by the device (`on_device` true). With
/// `on_device`, asserts that the step itself moves nothing between host and device but
/// its index lists, on the host's count and on the adapter's.
fn step(dev: &TtDevice, m: &Model, on_device: bool) -> Outcome {
    let t = |n: usize| -> Tensor {
        if on_device {
            dev.alloc(n).expect("alloc")
        } else {
            Tensor::Host(vec![0.0; n])
        }
    };
    let put = |v: &[f32]| -> Tensor {
        if on_device {
            dev.upload_new(v).expect("upload")
        } else {
            Tensor::Host(v.to_vec())
        }
    };
    // Loaded once, before the step: norms, biases, RoPE factors and sinks.
    let (norm1, norm2, bq, rbias, freqs, sinks) = (
        put(&m.norm1),
        put(&m.norm2),
        put(&m.bq),
        put(&m.router_bias),
        put(&m.rope_freqs),
        put(&m.sinks),
    );
    let layout = KvLayout {
        num_blocks: 2,
        block_size: 4,
        n_kv_heads: N_KV,
        head_dim_k: HD,
        head_dim_v: HD,
    };
    let mut kv = dev.alloc_kv(&layout).expect("kv");
    let mut x = t(ROWS * D);
    let mut xn = t(ROWS * D);
    let (nq, nk) = (ROWS * N_HEADS * HD, ROWS * N_KV * HD);
    // q, k and v as three ranges of one tensor (k and v at offsets).
    let mut qkv = t(nq + 2 * nk);
    let mut attn = t(nq);
    let mut proj = t(ROWS * D);
    let mut h2 = t(ROWS * D);
    let mut logits = t(ROWS * N_EXP);
    let n_rows = ROWS * TOPK;
    let mut g = t(n_rows * FF);
    let mut u = t(n_rows * FF);
    let mut act = t(n_rows * FF);
    let mut down = t(n_rows * D);
    let mut ids = if on_device {
        dev.alloc_indices(n_rows).expect("alloc_indices")
    } else {
        IndexTensor::Host(vec![0; n_rows])
    };
    let mut rw = t(n_rows);

    let before = dev.transfers();
    let before_tt = dev.tt_counters().expect("counters");

    // The step's index lists, packed as the engine packs them: tokens, positions, slots,
    // the block table. On the device they are one upload; otherwise host lists, which
    // each op uploads itself.
    let packed = vec![3u32, 9, 0, 0, 1, 2, 0, 1, 2, 1];
    let idx = if on_device {
        dev.upload_indices(packed).expect("indices")
    } else {
        IndexTensor::Host(packed)
    };
    let (tokens, pos, slots, table) = (
        idx.slice(0..3),
        idx.slice(3..6),
        idx.slice(6..9),
        idx.slice(9..10),
    );
    dev.get_rows(&*m.emb, tokens, x.view_mut())
        .expect("get_rows");
    dev.rms_norm(x.view(), Some(norm1.view()), 1e-6, D, xn.view_mut())
        .expect("rms_norm");
    {
        let (q, kv_) = qkv.view_mut().split_at(nq);
        let (k, v) = kv_.split_at(nk);
        dev.matmul_multi(&[&*m.wq, &*m.wk, &*m.wv], xn.view(), ROWS, &mut [q, k, v])
            .expect("qkv");
    }
    dev.add_bias(qkv.slice_mut(0..nq), bq.view())
        .expect("add_bias");
    let rope = |n_heads| RopeParams {
        freq_factors: Some(freqs.view()),
        ..RopeParams::neox(n_heads, HD, HD, 10000.0)
    };
    dev.rope(qkv.slice_mut(0..nq), pos, &rope(N_HEADS))
        .expect("rope q");
    dev.rope(qkv.slice_mut(nq..nq + nk), pos, &rope(N_KV))
        .expect("rope k");
    dev.write_kv(
        &mut *kv,
        qkv.slice(nq..nq + nk),
        qkv.slice(nq + nk..nq + 2 * nk),
        slots,
    )
    .expect("write_kv");
    let seqs = [AttnSeq {
        q_start: 0,
        positions: pos,
        block_table: table,
    }];
    let p = PagedAttention {
        q: qkv.slice(0..nq),
        seqs: &seqs,
        n_heads: N_HEADS,
        scale: 0.25,
        sinks: Some(sinks.view()),
        window: None,
    };
    dev.paged_attention(&*kv, &p, attn.view_mut())
        .expect("attention");
    dev.matmul(&*m.wo, attn.view(), ROWS, proj.view_mut())
        .expect("wo");
    dev.add_rms_norm(
        x.view_mut(),
        proj.view(),
        norm2.view(),
        1e-6,
        D,
        h2.view_mut(),
    )
    .expect("add_rms_norm");
    dev.matmul(&*m.router, h2.view(), ROWS, logits.view_mut())
        .expect("router");
    let cfg = RoutingConfig {
        k: TOPK,
        gating: Gating::Softmax,
        normalize: true,
        scale: 1.0,
    };
    dev.route_topk(
        logits.view(),
        N_EXP,
        Some(rbias.view()),
        None,
        &cfg,
        ids.view_mut(),
        rw.view_mut(),
    )
    .expect("route");
    dev.expert_matmul_multi(
        &[&*m.gate, &*m.up],
        h2.view(),
        ids.view(),
        &mut [g.view_mut(), u.view_mut()],
    )
    .expect("gate/up");
    dev.silu_mul(g.view(), u.view(), act.view_mut())
        .expect("silu");
    dev.expert_matmul(&*m.down, act.view(), ids.view(), down.view_mut())
        .expect("down");
    dev.scatter_add_weighted(x.view_mut(), down.view(), rw.view(), D)
        .expect("scatter");
    dev.scale(x.view_mut(), 0.5).expect("scale");
    dev.add(x.view_mut(), h2.view()).expect("add");
    dev.gelu_mul(h2.view(), x.view(), g.slice_mut(0..ROWS * D))
        .expect("gelu");

    let d = dev.transfers().since(&before);
    let c = dev.tt_counters().expect("counters");
    if on_device {
        // Nothing crossed but the step's index lists (one upload of 10 indices): the
        // routing stays on the device.
        assert_eq!(d.uploads, 1, "{d:?}");
        assert_eq!(d.upload_bytes, 40, "{d:?}");
        assert_eq!(d.downloads, 0, "{d:?}");
        assert_eq!(d.download_bytes, 0, "{d:?}");
        // The adapter saw that one buffer_write and no buffer_read.
        assert_eq!(c.host_writes, before_tt.host_writes + 1);
        assert_eq!(c.host_write_bytes, before_tt.host_write_bytes + 40);
        assert_eq!(c.host_reads, before_tt.host_reads);
        // The k and v ranges (offsets) went through device-side copies.
        assert!(c.device_copies > before_tt.device_copies);
    } else {
        assert!(d.uploads > 10 && d.downloads > 10, "{d:?}");
        // Every host transfer is one buffer_write or buffer_read, the routing's too (two
        // downloads: ids and weights; the ids uploaded for each expert op, the weights
        // for the scatter).
        assert_eq!(
            (
                c.host_writes - before_tt.host_writes,
                c.host_reads - before_tt.host_reads
            ),
            (d.uploads, d.downloads),
            "adapter and host agree"
        );
        assert_eq!(
            c.host_write_bytes - before_tt.host_write_bytes,
            d.upload_bytes
        );
        assert_eq!(
            c.host_read_bytes - before_tt.host_read_bytes,
            d.download_bytes
        );
        assert_eq!(
            c.device_copies, before_tt.device_copies,
            "host views need no copies"
        );
    }
    // No per-op host arguments: index lists, routing, RoPE factors and sinks are buffers
    // in both modes (host ones uploaded per op).
    assert_eq!(d.arg_bytes, 0, "{d:?}");

    let mut g0 = vec![0.0; ROWS * D];
    dev.download(g.slice(0..ROWS * D), &mut g0)
        .expect("download");
    let mut ids_back = vec![0u32; n_rows];
    dev.download_indices(ids.view(), &mut ids_back)
        .expect("download_indices");
    Outcome {
        residual: dev.download_tensor(x).expect("x"),
        normed: g0,
        ids: ids_back,
        weights: dev.download_tensor(rw).expect("weights"),
    }
}

#[test]
fn device_tensors_match_host_views_without_transfers() {
    let dev = open_sim(true);
    let mut rng = Rng::new(21);
    let m = model(&dev, &mut rng);
    let host = step(&dev, &m, false);
    let used = dev.tt_counters().expect("counters").dram_used_bytes;
    let on_dev = step(&dev, &m, true);
    // Bit for bit: the same kernels on the same values.
    assert_eq!(host, on_dev);
    assert!(host.residual.iter().all(|v| v.is_finite()));
    // Every tensor of the step was freed when it was dropped.
    assert_eq!(dev.tt_counters().expect("counters").dram_used_bytes, used);
}

fn tt_delta(a: &TtCounters, b: &TtCounters) -> (u64, u64, u64, u64) {
    (
        b.host_writes - a.host_writes,
        b.host_write_bytes - a.host_write_bytes,
        b.host_reads - a.host_reads,
        b.host_read_bytes - a.host_read_bytes,
    )
}

#[test]
fn host_views_are_counted_once_per_input_and_output() {
    let dev = open_sim(true);
    let mut rng = Rng::new(22);
    let dim = 32;
    let (x, delta, w) = (rng.vec(2 * dim), rng.vec(2 * dim), rng.vec(dim));
    let mut res = x.clone();
    let mut out = vec![0.0; 2 * dim];

    // add_rms_norm: residual (in and out), delta, weight in; residual and out back.
    let (b, bt) = (dev.transfers(), dev.tt_counters().expect("c"));
    dev.add_rms_norm(hm(&mut res), h(&delta), h(&w), 1e-6, dim, hm(&mut out))
        .expect("add_rms_norm");
    let d = dev.transfers().since(&b);
    assert_eq!((d.uploads, d.downloads), (3, 2), "{d:?}");
    assert_eq!(d.upload_bytes, 4 * (2 * 64 + 32));
    assert_eq!(d.download_bytes, 4 * 2 * 64);
    assert_eq!(d.arg_bytes, 0);
    let t = tt_delta(&bt, &dev.tt_counters().expect("c"));
    assert_eq!(
        t,
        (3, d.upload_bytes, 2, d.download_bytes),
        "adapter's count"
    );

    // Mixed: a device weight is not moved, the host input and output are.
    let wt = dev.upload_new(&w).expect("upload");
    let b = dev.transfers();
    dev.rms_norm(h(&x), Some(wt.view()), 1e-6, dim, hm(&mut out))
        .expect("rms_norm");
    let d = dev.transfers().since(&b);
    assert_eq!(
        (d.uploads, d.downloads, d.bytes()),
        (1, 1, 2 * 4 * 64),
        "{d:?}"
    );

    // Explicit moves: one each, whatever the offset.
    let mut t = dev.alloc(100).expect("alloc");
    let b = dev.transfers();
    dev.upload(&x, t.slice_mut(10..10 + 2 * dim))
        .expect("upload");
    let mut back = vec![0.0; 2 * dim];
    dev.download(t.slice(10..10 + 2 * dim), &mut back)
        .expect("download");
    assert_eq!(back, x);
    let d = dev.transfers().since(&b);
    assert_eq!(
        (d.uploads, d.downloads, d.bytes()),
        (1, 1, 2 * 4 * 64),
        "{d:?}"
    );
    let v = dev.download_tensor(t).expect("download_tensor");
    assert_eq!(&v[10..10 + 2 * dim], &x[..]);
    assert!(v[..10].iter().chain(&v[74..]).all(|&z| z == 0.0));
    assert_eq!(dev.transfers().since(&b).downloads, 2);
}

fn dev_view<'a>(t: &'a Tensor, offset: usize, len: usize) -> View<'a> {
    match t {
        Tensor::Device(b) => View::Device {
            buf: &**b,
            offset,
            len,
        },
        Tensor::Host(_) => panic!("a device tensor"),
    }
}

fn dev_view_mut<'a>(t: &'a Tensor, offset: usize, len: usize) -> ViewMut<'a> {
    match t {
        Tensor::Device(b) => ViewMut::Device {
            buf: &**b,
            offset,
            len,
        },
        Tensor::Host(_) => panic!("a device tensor"),
    }
}

#[test]
fn copy_honours_offsets() {
    let dev = open_sim(true);
    let vals: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let a = dev.upload_new(&vals).expect("upload");
    let mut b = dev.alloc(16).expect("alloc");
    let before = dev.transfers();
    let c0 = dev.tt_counters().expect("c");
    // a[2..6] -> b[5..9], a[0..4] -> b[0..4] (offset 0 both), b[5..9] -> b[12..16].
    dev.copy(a.slice(2..6), b.slice_mut(5..9)).expect("copy");
    dev.copy(a.slice(0..4), b.slice_mut(0..4)).expect("copy");
    dev.copy(dev_view(&b, 5, 4), dev_view_mut(&b, 12, 4))
        .expect("copy within");
    // Overlapping ranges of one buffer: a[0..8] -> a[4..12] (through a scratch buffer).
    dev.copy(dev_view(&a, 0, 8), dev_view_mut(&a, 4, 8))
        .expect("overlapping copy");
    let d = dev.transfers().since(&before);
    assert_eq!(d.calls(), 0, "device-side copies move nothing over the bus");
    let c1 = dev.tt_counters().expect("c");
    assert_eq!(c1.device_copies - c0.device_copies, 5);
    assert_eq!(tt_delta(&c0, &c1), (0, 0, 0, 0));

    let bv = dev
        .download_tensor(std::mem::replace(&mut b, Tensor::Host(Vec::new())))
        .expect("b");
    let mut want_b = vec![0.0; 16];
    want_b[..4].copy_from_slice(&vals[..4]);
    want_b[5..9].copy_from_slice(&vals[2..6]);
    want_b[12..16].copy_from_slice(&vals[2..6]);
    assert_eq!(bv, want_b);
    let av = dev.download_tensor(a).expect("a");
    let mut want_a = vals.clone();
    want_a[4..12].copy_from_slice(&vals[0..8]);
    assert_eq!(av, want_a);

    // Host on either side is an upload or a download.
    let t = dev.alloc(4).expect("alloc");
    let before = dev.transfers();
    dev.copy(h(&vals[..4]), dev_view_mut(&t, 0, 4)).expect("up");
    let mut back = [0.0f32; 4];
    dev.copy(t.view(), hm(&mut back)).expect("down");
    assert_eq!(&back, &vals[..4]);
    let d = dev.transfers().since(&before);
    assert_eq!((d.uploads, d.downloads), (1, 1));
}

#[test]
fn offsets_and_aliasing_in_ops() {
    let dev = open_sim(true);
    let mut rng = Rng::new(23);
    let x = rng.vec(40);
    let y = rng.vec(40);
    let mut both = x.clone();
    both.extend_from_slice(&y);
    let t = dev.upload_new(&both).expect("upload");
    // acc = t[0..40] (offset 0), x = t[40..80] (offset): acc += x.
    dev.add(dev_view_mut(&t, 0, 40), dev_view(&t, 40, 40))
        .expect("add");
    // t[40..80] += t[40..80] through the same buffer (an output that is an input).
    dev.add(dev_view_mut(&t, 40, 40), dev_view(&t, 40, 40))
        .expect("add to itself at an offset");
    // And at offset 0: t[0..40] += t[0..40].
    dev.add(dev_view_mut(&t, 0, 40), dev_view(&t, 0, 40))
        .expect("add to itself");
    let before = dev.transfers();
    let v = dev.download_tensor(t).expect("down");
    assert_eq!(dev.transfers().since(&before).downloads, 1);
    for i in 0..40 {
        assert_eq!(v[i], (x[i] + y[i]) * 2.0, "[{i}]");
        assert_eq!(v[40 + i], y[i] * 2.0, "[{}]", 40 + i);
    }
    // A tensor's drop frees its buffer.
    let used = dev.tt_counters().expect("c").dram_used_bytes;
    let big = dev.alloc(1000).expect("alloc");
    assert_eq!(dev.tt_counters().expect("c").dram_used_bytes, used + 4000);
    drop(big);
    assert_eq!(dev.tt_counters().expect("c").dram_used_bytes, used);
}

#[test]
fn a_buffer_of_another_device_is_refused() {
    let a = open_sim(true);
    let b = open_sim(true);
    let t = a.alloc(8).expect("alloc");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = b.scale(dev_view_mut(&t, 0, 8), 2.0);
    }));
    assert!(r.is_err(), "a buffer from another device must panic");
}

#[test]
fn attention_with_a_window_of_zero_writes_zeros_on_the_device() {
    let dev = open_sim(true);
    let layout = KvLayout {
        num_blocks: 1,
        block_size: 4,
        n_kv_heads: 1,
        head_dim_k: 8,
        head_dim_v: 8,
    };
    let kv = dev.alloc_kv(&layout).expect("kv");
    let q = dev.upload_new(&[1.0; 8]).expect("q");
    let out = dev.upload_new(&[7.0; 12]).expect("out");
    let seqs = [AttnSeq {
        q_start: 0,
        positions: (&[0]).into(),
        block_table: (&[0]).into(),
    }];
    let p = PagedAttention {
        q: q.view(),
        seqs: &seqs,
        n_heads: 1,
        scale: 1.0,
        sinks: None,
        window: Some(0),
    };
    let before = dev.transfers();
    dev.paged_attention(&*kv, &p, dev_view_mut(&out, 2, 8))
        .expect("attention");
    assert_eq!(dev.transfers().since(&before).calls(), 0);
    let v = dev.download_tensor(out).expect("out");
    assert_eq!(
        v,
        [7.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 7.0]
    );
}
