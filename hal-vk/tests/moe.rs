//! The MoE ops on device tensors: `add_id` against a scalar loop and
//! `scatter_add_weighted` (weights in a device tensor) against `flint_core`'s, bit for bit;
//! `expert_matmul` and `expert_matmul_multi` with a fan-out of k and of 1 against each
//! other bit for bit and against an f64 reference; and out-of-range ids refused as
//! `InvalidInput`, not a panic. Any matmul kernel will do (`exact_order.rs` holds the
//! exact one to the cpu order). Without a Vulkan device the tests say SKIPPED and pass,
//! except in CI (`CI` set), where they fail.

use flint_core::GgmlType;
use flint_hal::{
    Device, HalErrorKind, IndexView, Op, View, ViewMut, Weight, WeightDesc, WeightKind,
    WeightSource,
};
use flint_hal_vk::VkDevice;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A value in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

fn device() -> Option<VkDevice> {
    match flint_hal_vk::probe() {
        Ok(_) => {}
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI: the vk device must be available (.ci/run installs lavapipe): {e}")
        }
        Err(e) => {
            eprintln!("!!! SKIPPED: no Vulkan device here ({e})");
            return None;
        }
    }
    Some(VkDevice::open(&Default::default()).expect("open the vk device"))
}

fn download(dev: &VkDevice, v: View<'_>) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    dev.download(v, &mut out).expect("download");
    out
}

/// The first index where `got` and `want` differ in bits.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())
        .map(|(i, (g, w))| (i, *g, *w))
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    if let Some((i, g, w)) = first_difference(got, want) {
        panic!(
            "{what}: value {i} is {g:e} ({:#010x}), the reference gives {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn add_id_is_a_scalar_loop_bit_for_bit() {
    let Some(dev) = device() else { return };
    assert!(dev.supports(Op::AddId, None), "vk supports add_id");
    let mut rng = Rng(0x00ad_d1d5);
    // 70 values a row: a row's elements straddle workgroups of 256 threads.
    let (dim, experts) = (70usize, 5usize);
    let ids: Vec<u32> = vec![4, 0, 0, 3, 1, 4, 2, 2, 0, 3, 4];
    let n = ids.len() * dim;
    let table = rng.vec(experts * dim, 3.0);
    let x0 = rng.vec(n, 1.0);
    let mut want = x0.clone();
    for (i, &id) in ids.iter().enumerate() {
        for d in 0..dim {
            want[i * dim + d] += table[id as usize * dim + d];
        }
    }
    // Both on the device, each at an offset within its tensor.
    let (xa, ta) = (9usize, 3usize);
    let mut tv = vec![7.0f32; ta];
    tv.extend_from_slice(&table);
    tv.extend([7.0; 4]);
    let t = dev.upload_new(&tv).expect("upload");
    let mut xv = vec![5.0f32; xa];
    xv.extend_from_slice(&x0);
    xv.extend([5.0; 2]);
    let mut x = dev.upload_new(&xv).expect("upload");
    dev.add_id(
        x.slice_mut(xa..xa + n),
        t.slice(ta..ta + experts * dim),
        IndexView::Host(&ids),
        dim,
    )
    .expect("add_id");
    let got = download(&dev, x.view());
    assert_bits("add_id on device tensors", &got[xa..xa + n], &want);
    assert!(
        got[..xa].iter().chain(&got[xa + n..]).all(|&v| v == 5.0),
        "add_id wrote outside x's view"
    );
    // x in host memory.
    let mut xh = x0.clone();
    dev.add_id(
        ViewMut::Host(&mut xh),
        t.slice(ta..ta + experts * dim),
        IndexView::Host(&ids),
        dim,
    )
    .expect("add_id into host memory");
    assert_bits("add_id into host memory", &xh, &want);
    // An id beyond the table's rows is an error, and x is left as it was.
    let mut bad = ids.clone();
    bad[6] = experts as u32;
    let mut xh = x0.clone();
    let err = dev
        .add_id(
            ViewMut::Host(&mut xh),
            t.slice(ta..ta + experts * dim),
            IndexView::Host(&bad),
            dim,
        )
        .expect_err("id 5 of a 5-row table");
    assert_eq!(err.kind, HalErrorKind::InvalidInput, "{err}");
    assert_bits("x after a refused add_id", &xh, &x0);
    println!("add_id: {} rows of {dim} identical", ids.len());
}

#[test]
fn scatter_reads_device_weights_bit_for_bit() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x05ca_77e5);
    // 300 values a row: two workgroups of columns.
    let dim = 300usize;
    for (rows, f) in [(4usize, 3usize), (5, 1), (2, 8)] {
        let routed = rows * f;
        let x = rng.vec(routed * dim, 4.0);
        let weights = rng.vec(routed, 1.0);
        let acc0 = rng.vec(rows * dim, 2.0);
        let mut want = acc0.clone();
        flint_core::math::scatter_add_weighted(&mut want, &x, &weights, dim);
        // Weights, x and acc in device tensors at offsets.
        let (wa, xa, aa) = (5usize, 2usize, 11usize);
        let mut wv = vec![9.0f32; wa];
        wv.extend_from_slice(&weights);
        let wt = dev.upload_new(&wv).expect("upload");
        let mut xv = vec![9.0f32; xa];
        xv.extend_from_slice(&x);
        let xt = dev.upload_new(&xv).expect("upload");
        let mut av = vec![3.0f32; aa];
        av.extend_from_slice(&acc0);
        av.extend([3.0; 6]);
        let mut acc = dev.upload_new(&av).expect("upload");
        dev.scatter_add_weighted(
            acc.slice_mut(aa..aa + rows * dim),
            xt.slice(xa..xa + routed * dim),
            wt.slice(wa..wa + routed),
            dim,
        )
        .expect("scatter_add_weighted");
        let got = download(&dev, acc.view());
        assert_bits(
            &format!("scatter {rows} rows, fan-out {f}"),
            &got[aa..aa + rows * dim],
            &want,
        );
        assert!(
            got[..aa]
                .iter()
                .chain(&got[aa + rows * dim..])
                .all(|&v| v == 3.0),
            "scatter wrote outside acc's view"
        );
        // Weights in host memory, acc on the device.
        let mut acc = dev.upload_new(&acc0).expect("upload");
        dev.scatter_add_weighted(
            acc.view_mut(),
            xt.slice(xa..xa + routed * dim),
            View::Host(&weights),
            dim,
        )
        .expect("scatter_add_weighted, host weights");
        assert_bits(
            &format!("scatter {rows} rows, fan-out {f}, host weights"),
            &download(&dev, acc.view()),
            &want,
        );
        println!("scatter: {rows} rows of {dim}, fan-out {f} identical");
    }
}

fn stage(
    dev: &VkDevice,
    ty: GgmlType,
    dims: Vec<usize>,
    data: Vec<u8>,
) -> std::sync::Arc<dyn Weight> {
    dev.stage(&WeightDesc {
        name: format!("{ty} {dims:?}"),
        ty,
        dims,
        kind: WeightKind::ExpertTower,
        data: WeightSource::from_vec(data),
    })
    .expect("stage")
}

/// A tower `[k, n, experts]` of `ty` and its values as the file decodes them.
fn tower(rng: &mut Rng, ty: GgmlType, k: usize, n: usize, experts: usize) -> (Vec<u8>, Vec<f32>) {
    let vals = rng.vec(k * n * experts, 1.0);
    if ty == GgmlType::F32 {
        return (vals.iter().flat_map(|v| v.to_le_bytes()).collect(), vals);
    }
    let mut bytes = vec![0u8; ty.row_bytes(k).expect("whole blocks") * n * experts];
    flint_core::quant::quantize(ty, &vals, &mut bytes).expect("quantize");
    let deq = flint_core::dequant::dequantize_to_vec(ty, &bytes).expect("dequantize");
    (bytes, deq)
}

#[test]
fn expert_matmul_fans_out() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x0e7e_4a11);
    let (k, n, experts) = (256usize, 24usize, 4usize);
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        let (gate_b, gate_v) = tower(&mut rng, ty, k, n, experts);
        let (up_b, _) = tower(&mut rng, ty, k, n, experts);
        let gate = stage(&dev, ty, vec![k, n, experts], gate_b);
        let up = stage(&dev, ty, vec![k, n, experts], up_b);
        // 3 tokens, 2 experts each (the fan-out of the gate and up projections).
        let (m, f) = (3usize, 2usize);
        let xs = rng.vec(m * k, 1.0);
        let ids: Vec<u32> = vec![3, 0, 1, 3, 2, 2];
        let x = dev.upload_new(&xs).expect("upload");
        let mut out = dev.alloc(ids.len() * n).expect("alloc");
        dev.expert_matmul(&*gate, x.view(), IndexView::Host(&ids), out.view_mut())
            .expect("expert_matmul, fan-out 2");
        let fanned = download(&dev, out.view());
        // Against an f64 dot product of the decoded weights (the activations are rounded
        // as ggml rounds them for the type, so within its error).
        for (i, &e) in ids.iter().enumerate() {
            let xr = &xs[(i / f) * k..][..k];
            for o in 0..n {
                let wr = &gate_v[(e as usize * n + o) * k..][..k];
                let want: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let mag: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| f64::from((a * b).abs()))
                    .sum();
                let got = f64::from(fanned[i * n + o]);
                assert!(
                    (got - want).abs() <= 1e-2 * mag.max(1e-6),
                    "{ty} routed row {i} (expert {e}) col {o}: {got} against {want}"
                );
            }
        }
        // The same rows with fan-out 1: x's rows repeated, one id each (the down
        // projection's shape), bit for bit.
        let rep: Vec<f32> = (0..ids.len())
            .flat_map(|i| xs[(i / f) * k..][..k].to_vec())
            .collect();
        let xr = dev.upload_new(&rep).expect("upload");
        let mut out1 = dev.alloc(ids.len() * n).expect("alloc");
        dev.expert_matmul(&*gate, xr.view(), IndexView::Host(&ids), out1.view_mut())
            .expect("expert_matmul, fan-out 1");
        assert_bits(
            &format!("{ty}: fan-out 1 against fan-out 2"),
            &download(&dev, out1.view()),
            &fanned,
        );
        // Into host memory, from host activations.
        let mut host = vec![0f32; ids.len() * n];
        dev.expert_matmul(
            &*gate,
            View::Host(&xs),
            IndexView::Host(&ids),
            ViewMut::Host(&mut host),
        )
        .expect("expert_matmul, host views");
        assert_bits(&format!("{ty}: host views"), &host, &fanned);
        // Gate and up in one call equal two calls.
        let mut up_out = dev.alloc(ids.len() * n).expect("alloc");
        dev.expert_matmul(&*up, x.view(), IndexView::Host(&ids), up_out.view_mut())
            .expect("expert_matmul, up");
        let (mut g2, mut u2) = (
            dev.alloc(ids.len() * n).expect("alloc"),
            dev.alloc(ids.len() * n).expect("alloc"),
        );
        dev.expert_matmul_multi(
            &[&*gate, &*up],
            x.view(),
            IndexView::Host(&ids),
            &mut [g2.view_mut(), u2.view_mut()],
        )
        .expect("expert_matmul_multi");
        assert_bits(
            &format!("{ty}: multi gate"),
            &download(&dev, g2.view()),
            &fanned,
        );
        assert_bits(
            &format!("{ty}: multi up"),
            &download(&dev, u2.view()),
            &download(&dev, up_out.view()),
        );
        // An expert id beyond the tower is an error, not a panic.
        let bad: Vec<u32> = vec![3, 0, 1, experts as u32, 2, 2];
        let err = dev
            .expert_matmul(&*gate, x.view(), IndexView::Host(&bad), out.view_mut())
            .expect_err("expert 4 of 4");
        assert_eq!(err.kind, HalErrorKind::InvalidInput, "{err}");
        let err = dev
            .expert_matmul_multi(
                &[&*gate, &*up],
                x.view(),
                IndexView::Host(&bad),
                &mut [g2.view_mut(), u2.view_mut()],
            )
            .expect_err("expert 4 of 4, multi");
        assert_eq!(err.kind, HalErrorKind::InvalidInput, "{err}");
        println!(
            "{ty}: expert_matmul fan-out 2 and 1, multi, host views identical; bad id refused"
        );
    }
}
