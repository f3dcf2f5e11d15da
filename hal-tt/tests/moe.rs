//! MoE layers keep their routing on the `tt` device (ABI 6): `route_topk` writes the
//! expert ids into an index tensor and the weights into a tensor, and the expert matmuls
//! and the scatter read them there. The results are the cpu device's bits, nothing
//! crosses the bus, a bad id in a device index tensor is `InvalidInput`, and index
//! tensors read back.

mod common;

use common::{h, hm, open_sim, rel_rms, weight, Rng};
use flint_core::GgmlType;
use flint_hal::{
    Device, DeviceOptions, Gating, HalErrorKind, IndexTensor, Op, RoutingConfig, Tensor, Transfers,
    WeightDesc, WeightHandle, WeightKind,
};
use flint_hal_cpu::{CpuDevice, SimdLevel};

const D: usize = 256;
const FF: usize = 256;
const E: usize = 8;
const K: usize = 2;
const ROWS: usize = 5;
/// Routed rows: `K` per token.
const N: usize = ROWS * K;

const CFG: RoutingConfig = RoutingConfig {
    k: K,
    gating: Gating::Softmax,
    normalize: true,
    scale: 1.5,
};

/// A layer's towers and the values it runs on.
struct Case {
    towers: Vec<WeightDesc>,
    logits: Vec<f32>,
    bias: Vec<f32>,
    /// Gemma 4's per-expert output scale: no value is 1, so that leaving it out shows.
    expert_scale: Vec<f32>,
    x: Vec<f32>,
    acc: Vec<f32>,
}

fn case(seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let mut tower = |name: &str, ty, dims: &[usize]| {
        weight(name, ty, dims, WeightKind::ExpertTower, &mut rng).0
    };
    let towers = vec![
        tower("blk.0.ffn_gate_exps.weight", GgmlType::Q4_K, &[D, FF, E]),
        tower("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, &[D, FF, E]),
        tower("blk.0.ffn_down_exps.weight", GgmlType::Q6_K, &[FF, D, E]),
    ];
    Case {
        towers,
        logits: rng.vec(ROWS * E).iter().map(|v| 3.0 * v).collect(),
        bias: rng.vec(E).iter().map(|v| 0.1 * v).collect(),
        expert_scale: (0..E).map(|e| 0.25 + 0.3 * e as f32).collect(),
        x: rng.vec(ROWS * D),
        acc: rng.vec(ROWS * D),
    }
}

fn stage(dev: &dyn Device, c: &Case) -> Vec<WeightHandle> {
    c.towers
        .iter()
        .map(|d| dev.stage(d).expect("stage"))
        .collect()
}

/// One MoE layer's tensors, all allocated by the device; the ids and weights at `off`
/// in tensors `off` values longer.
struct Tensors {
    logits: Tensor,
    bias: Tensor,
    expert_scale: Tensor,
    x: Tensor,
    acc: Tensor,
    ids: IndexTensor,
    weights: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
    down: Tensor,
    off: usize,
}

fn tensors(dev: &dyn Device, c: &Case, off: usize) -> Tensors {
    let put = |v: &[f32]| dev.upload_new(v).expect("upload");
    let alloc = |n: usize| dev.alloc(n).expect("alloc");
    Tensors {
        logits: put(&c.logits),
        bias: put(&c.bias),
        expert_scale: put(&c.expert_scale),
        x: put(&c.x),
        acc: put(&c.acc),
        ids: dev.alloc_indices(off + N).expect("alloc_indices"),
        weights: alloc(off + N),
        gate: alloc(N * FF),
        up: alloc(N * FF),
        act: alloc(N * FF),
        down: alloc(N * D),
        off,
    }
}

/// The layer: routing into the index tensor, the gate and up towers on `k` routed rows
/// per token, SiLU, the down tower on one row per routed row, the weighted scatter back
/// into one row per token.
fn run(dev: &dyn Device, w: &[WeightHandle], t: &mut Tensors) {
    let r = t.off..t.off + N;
    dev.route_topk(
        t.logits.view(),
        E,
        Some(t.bias.view()),
        Some(t.expert_scale.view()),
        &CFG,
        t.ids.slice_mut(r.clone()),
        t.weights.slice_mut(r.clone()),
    )
    .expect("route_topk");
    dev.expert_matmul_multi(
        &[&*w[0], &*w[1]],
        t.x.view(),
        t.ids.slice(r.clone()),
        &mut [t.gate.view_mut(), t.up.view_mut()],
    )
    .expect("gate and up");
    dev.silu_mul(t.gate.view(), t.up.view(), t.act.view_mut())
        .expect("silu_mul");
    dev.expert_matmul(
        &*w[2],
        t.act.view(),
        t.ids.slice(r.clone()),
        t.down.view_mut(),
    )
    .expect("down");
    dev.scatter_add_weighted(t.acc.view_mut(), t.down.view(), t.weights.slice(r), D)
        .expect("scatter_add_weighted");
}

/// What a layer leaves, in host memory.
#[derive(Debug)]
struct Out {
    ids: Vec<u32>,
    weights: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    acc: Vec<f32>,
}

fn collect(dev: &dyn Device, t: Tensors) -> Out {
    let r = t.off..t.off + N;
    let mut ids = vec![0u32; N];
    dev.download_indices(t.ids.slice(r.clone()), &mut ids)
        .expect("download_indices");
    let mut weights = vec![0.0; N];
    dev.download(t.weights.slice(r), &mut weights)
        .expect("download weights");
    Out {
        ids,
        weights,
        gate: dev.download_tensor(t.gate).expect("gate"),
        up: dev.download_tensor(t.up).expect("up"),
        down: dev.download_tensor(t.down).expect("down"),
        acc: dev.download_tensor(t.acc).expect("acc"),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn layer(dev: &dyn Device, w: &[WeightHandle], c: &Case, off: usize) -> (Out, Transfers) {
    let mut t = tensors(dev, c, off);
    let before = dev.transfers();
    run(dev, w, &mut t);
    let d = dev.transfers().since(&before);
    (collect(dev, t), d)
}

#[test]
fn routing_on_the_device_gives_the_cpu_devices_bits() {
    let c = case(41);
    let tt = open_sim(true);
    let cpu = CpuDevice::new(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("the cpu device opens");
    eprintln!("cpu device at {:?}", cpu.level());
    let (a, _) = layer(&tt, &stage(&tt, &c), &c, 0);
    let (b, _) = layer(&cpu, &stage(&cpu, &c), &c, 0);

    // The routing is the core's on every device: the same experts and weight bits, and
    // those of `flint_core::math::route_topk` with each weight then times its expert's
    // scale.
    assert_eq!(a.ids, b.ids, "expert ids");
    assert_eq!(bits(&a.weights), bits(&b.weights), "routing weights");
    for r in 0..ROWS {
        let (mut ids, mut ws) = ([0u32; K], [0.0f32; K]);
        flint_core::math::route_topk(
            &c.logits[r * E..(r + 1) * E],
            Some(&c.bias),
            K,
            flint_core::math::Gating::Softmax,
            true,
            CFG.scale,
            &mut ids,
            &mut ws,
        )
        .expect("core routing");
        assert_eq!(&a.ids[r * K..(r + 1) * K], &ids, "row {r}");
        for j in 0..K {
            let want = ws[j] * c.expert_scale[ids[j] as usize];
            assert_eq!(
                a.weights[r * K + j].to_bits(),
                want.to_bits(),
                "row {r}.{j}"
            );
            assert_ne!(a.weights[r * K + j], ws[j], "the expert scale was applied");
        }
    }
    // The rows really spread over experts (more than one expert, rows not in id order).
    let mut used = a.ids.clone();
    used.sort_unstable();
    used.dedup();
    assert!(used.len() > 2, "experts used: {used:?}");

    // The expert matmuls and the scatter read the ids and weights where route_topk put
    // them. The cpu device computes llama.cpp's orders as the simulator does on AVX-512
    // VNNI (docs/parity.md): the same bits there, close elsewhere.
    let parts = [
        ("gate", &a.gate, &b.gate),
        ("up", &a.up, &b.up),
        ("down", &a.down, &b.down),
        ("acc", &a.acc, &b.acc),
    ];
    for (name, x, y) in parts {
        if cpu.level() == SimdLevel::Avx512Vnni {
            assert_eq!(bits(x), bits(y), "{name}: tt and cpu bits");
        } else {
            let e = rel_rms(x, y);
            assert!(e < 1e-5, "{name}: rel-RMS {e} on {:?}", cpu.level());
        }
    }
    // And the accumulator moved: the scatter added something.
    assert!(rel_rms(&a.acc, &c.acc) > 1e-3);
}

#[test]
fn a_moe_layer_on_device_tensors_moves_nothing_over_the_bus() {
    let c = case(42);
    let dev = open_sim(true);
    let w = stage(&dev, &c);
    let mut outs = Vec::new();
    // The ids and weights at the start of their tensors, and inside them (offsets 3 and
    // 5: the adapter reads and writes them at the offset, with no copy).
    for off in [0, 3, 5] {
        let mut t = tensors(&dev, &c, off);
        let before = dev.transfers();
        let before_tt = dev.tt_counters().expect("counters");
        run(&dev, &w, &mut t);
        let d = dev.transfers().since(&before);
        let after_tt = dev.tt_counters().expect("counters");
        assert_eq!(d, Transfers::default(), "offset {off}: {d:?}");
        assert_eq!(d.arg_bytes, 0);
        // The adapter's count: no buffer write or read, no device copy either (every
        // view starts at its tensor's first value or is passed with its offset).
        assert_eq!(
            (after_tt.host_writes, after_tt.host_reads),
            (before_tt.host_writes, before_tt.host_reads),
            "offset {off}"
        );
        assert_eq!(
            after_tt.device_copies, before_tt.device_copies,
            "offset {off}"
        );
        // Nothing was written before the offset.
        let mut head = vec![7u32; off];
        dev.download_indices(t.ids.slice(0..off), &mut head)
            .expect("download_indices");
        assert!(head.iter().all(|&i| i == 0), "offset {off}: {head:?}");
        let mut whead = vec![7.0f32; off];
        dev.download(t.weights.slice(0..off), &mut whead)
            .expect("download");
        assert!(whead.iter().all(|&v| v == 0.0), "offset {off}: {whead:?}");
        outs.push(collect(&dev, t));
    }
    for o in &outs[1..] {
        assert_eq!(o.ids, outs[0].ids);
        assert_eq!(bits(&o.weights), bits(&outs[0].weights));
        assert_eq!(bits(&o.acc), bits(&outs[0].acc));
    }
    // The same layer on host views agrees, and there every routed list crosses: the
    // ids and weights come back (2 downloads), the ids go in for each expert op and the
    // weights for the scatter (3 uploads), besides the activations.
    let mut ids = vec![0u32; N];
    let mut ws = vec![0.0f32; N];
    let before = dev.transfers();
    dev.route_topk(
        h(&c.logits),
        E,
        Some(h(&c.bias)),
        Some(h(&c.expert_scale)),
        &CFG,
        (&mut ids).into(),
        hm(&mut ws),
    )
    .expect("route_topk on host views");
    let d = dev.transfers().since(&before);
    assert_eq!((d.uploads, d.downloads), (3, 2), "{d:?}");
    assert_eq!(d.download_bytes, 8 * N as u64, "{d:?}");
    assert_eq!(ids, outs[0].ids);
    assert_eq!(bits(&ws), bits(&outs[0].weights));
}

#[test]
fn an_expert_id_out_of_range_in_a_device_tensor_is_invalid_input() {
    let c = case(43);
    let dev = open_sim(true);
    let w = stage(&dev, &c);
    let mut rng = Rng::new(44);
    let x = dev.upload_new(&rng.vec(2 * D)).expect("x");
    let mut out = dev.upload_new(&vec![5.0; 4 * FF]).expect("out");
    // Two tokens, two experts each; routed row 2 names expert 8 of 8.
    for bad in [vec![1u32, 7, 8, 0], vec![0, 0, 0, u32::MAX]] {
        let ids = dev.upload_indices(bad.clone()).expect("indices");
        let r = dev.expert_matmul(&*w[0], x.view(), ids.view(), out.view_mut());
        let e = r.expect_err("an id beyond the tower");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
        let id = bad.iter().find(|&&i| i as usize >= E).copied().unwrap_or(0);
        assert!(
            e.message.contains("expert_matmul") && e.message.contains(&format!("expert id {id}")),
            "{e}"
        );
        let mut o = Tensor::Host(vec![0.0; 4 * FF]);
        let mut up = Tensor::Host(vec![0.0; 4 * FF]);
        let e = dev
            .expert_matmul_multi(
                &[&*w[0], &*w[1]],
                x.view(),
                ids.view(),
                &mut [o.view_mut(), up.view_mut()],
            )
            .expect_err("expert_matmul_multi");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
        // The same ids from host memory: the same answer.
        let e = dev
            .expert_matmul(&*w[0], x.view(), (&bad).into(), out.view_mut())
            .expect_err("host ids");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    }
    // Nothing was written.
    let left = dev.download_tensor(out).expect("out");
    assert!(left.iter().all(|&v| v == 5.0));
    // The bad id outside the view is not read: ids [9, 1, 7, 0, 2] viewed from 1.
    let ids = dev.upload_indices(vec![9, 1, 7, 0, 2]).expect("indices");
    let mut o = Tensor::Host(vec![0.0; 4 * FF]);
    dev.expert_matmul(&*w[0], x.view(), ids.slice(1..5), o.view_mut())
        .expect("ids at an offset");
    let mut want = vec![0.0; 4 * FF];
    dev.expert_matmul(&*w[0], x.view(), (&[1, 7, 0, 2]).into(), hm(&mut want))
        .expect("host ids");
    assert_eq!(o.as_host().expect("host"), &want[..]);
}

#[test]
fn index_tensors_read_back() {
    let dev = open_sim(true);
    let v: Vec<u32> = vec![0, 1, 7, u32::MAX, 123_456_789, 42];
    let t = dev.upload_indices(v.clone()).expect("upload_indices");
    let before = dev.transfers();
    let before_tt = dev.tt_counters().expect("counters");
    let mut all = vec![0u32; v.len()];
    dev.download_indices(t.view(), &mut all)
        .expect("download_indices");
    assert_eq!(all, v);
    let mut part = vec![0u32; 3];
    dev.download_indices(t.slice(2..5), &mut part)
        .expect("download_indices at an offset");
    assert_eq!(part, &v[2..5]);
    // One download each, on the host's count and the adapter's (buffer reads).
    let d = dev.transfers().since(&before);
    assert_eq!((d.uploads, d.downloads), (0, 2), "{d:?}");
    assert_eq!(d.download_bytes, 4 * (6 + 3), "{d:?}");
    let c = dev.tt_counters().expect("counters");
    assert_eq!(c.host_reads - before_tt.host_reads, 2);
    assert_eq!(c.host_read_bytes - before_tt.host_read_bytes, 4 * (6 + 3));

    // A new index tensor is device memory of zeros, freed on drop.
    let used = dev.tt_counters().expect("counters").dram_used_bytes;
    let z = dev.alloc_indices(10).expect("alloc_indices");
    assert!(matches!(z, IndexTensor::Device(_)));
    assert_eq!(z.len(), 10);
    assert_eq!(dev.tt_counters().expect("c").dram_used_bytes, used + 40);
    let mut zs = vec![9u32; 10];
    dev.download_indices(z.view(), &mut zs)
        .expect("download_indices");
    assert_eq!(zs, vec![0; 10]);
    drop(z);
    assert_eq!(dev.tt_counters().expect("c").dram_used_bytes, used);

    // Host indices are copied, and counted as a download all the same.
    let before = dev.transfers();
    let mut hs = vec![0u32; 3];
    dev.download_indices((&[4u32, 5, 6]).into(), &mut hs)
        .expect("host indices");
    assert_eq!(hs, [4, 5, 6]);
    assert_eq!(dev.transfers().since(&before).downloads, 1);
}

#[test]
fn add_id_is_not_in_the_abi() {
    let dev = open_sim(true);
    assert!(!dev.supports(Op::AddId, None));
    let mut x = vec![0.0f32; 8];
    let e = dev
        .add_id(hm(&mut x), h(&[1.0; 8]), (&[0u32, 1]).into(), 4)
        .expect_err("add_id");
    assert_eq!(e.kind, HalErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("add_id"), "{e}");
    // The ops it leans on are there.
    for op in [Op::RouteTopK, Op::ExpertMatmul, Op::ScatterAddWeighted] {
        assert!(dev.supports(op, None), "{op}");
    }
}
