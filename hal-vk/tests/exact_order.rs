//! The `exact` matmul kernel (`shaders/matmul_exact.wgsl`, lavapipe's default) against
//! flint_core's statement of the cpu device's float order
//! (`flint_core::dot::matvec_f32_ggml_x86`: llama.cpp's x86 prompt-batch kernels for dense
//! rows, the repacked Q4_K gemv order for expert rows), bit for bit, for every type it
//! computes, several activation row counts, and activations with outliers, zero blocks
//! and ties. Prints the seed; `FLINT_TEST_SEED` repeats a run.
//!
//! On a device without shaderFloat64 the kernel's multiply-adds round twice, so the check
//! there is a tolerance, said in the output. Without a Vulkan device the test says
//! SKIPPED and passes, except in CI (`CI` set), where it fails.

use flint_core::dot::ggml_x86::BatchRow;
use flint_core::GgmlType;
use flint_hal::{Device, IndexView, WeightDesc, WeightKind, WeightSource};
use flint_hal_vk::{MatmulKernel, VkDevice};

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
    let dev = VkDevice::open(&Default::default()).expect("open the vk device");
    if dev.matmul_kernel() != MatmulKernel::Exact {
        eprintln!(
            "!!! SKIPPED: this device runs the {} matmul kernel (FLINT_VK_MATMUL or a \
             subgroup size other than 8)",
            dev.matmul_kernel().label()
        );
        return None;
    }
    Some(dev)
}

/// Activation rows: mostly small values, with outliers, an all-zero 256-value block,
/// a block whose largest magnitudes tie, and values on rounding ties.
fn activations(rng: &mut Rng, m: usize, k: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..m * k).map(|_| rng.unit()).collect();
    for (r, row) in x.chunks_mut(k).enumerate() {
        row[(7 * r + 3) % k] = 40.0 * rng.unit();
        if r % 3 == 1 && k >= 512 {
            row[256..512].fill(0.0);
        }
        if r % 4 == 2 {
            row[0] = 2.0;
            row[1] = -2.0;
            row[5] = 1.0;
        }
    }
    x
}

fn weight(rng: &mut Rng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    let vals: Vec<f32> = (0..rows * k)
        .map(|i| rng.unit() * if i % 97 == 0 { 8.0 } else { 1.0 })
        .collect();
    if ty == GgmlType::F32 {
        return vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    }
    let mut bytes = vec![0u8; ty.row_bytes(k).expect("whole blocks") * rows];
    flint_core::quant::quantize(ty, &vals, &mut bytes).expect("quantize");
    bytes
}

fn stage(
    dev: &VkDevice,
    ty: GgmlType,
    dims: Vec<usize>,
    kind: WeightKind,
    data: Vec<u8>,
) -> std::sync::Arc<dyn flint_hal::Weight> {
    dev.stage(&WeightDesc {
        name: format!("{ty} {dims:?}"),
        ty,
        dims,
        kind,
        data: WeightSource::from_vec(data),
    })
    .expect("stage")
}

/// The first element where `got` and `want` differ in bits (or by more than `tol`
/// relative to the row's largest value when `tol > 0`).
fn first_difference(got: &[f32], want: &[f32], tol: f32) -> Option<(usize, f32, f32)> {
    let scale = want.iter().fold(0f32, |a, &b| a.max(b.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| {
            if tol > 0.0 {
                ((*g - *w) / scale).abs() > tol
            } else {
                g.to_bits() != w.to_bits()
            }
        })
        .map(|(i, (g, w))| (i, *g, *w))
}

/// The types of `shaders/exact/` and their weight rows: F32 twice, as a matrix of a
/// multiple of 4 rows takes tinyBLAS's order and one of other row counts
/// `ggml_vec_dot_f32`'s.
const CASES: [(GgmlType, usize); 7] = [
    (GgmlType::Q8_0, 80),
    (GgmlType::Q5_0, 80),
    (GgmlType::Q4_K, 80),
    (GgmlType::Q5_K, 80),
    (GgmlType::Q6_K, 80),
    (GgmlType::F32, 80),
    (GgmlType::F32, 78),
];

#[test]
fn exact_kernel_is_the_cpu_order_bit_for_bit() {
    let Some(dev) = device() else { return };
    let seed: u64 = std::env::var("FLINT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x05ee_d0ff_11e7);
    println!("seed {seed} (FLINT_TEST_SEED)");
    let f64_ok = dev.has_f64();
    let tol = if f64_ok { 0.0 } else { 1e-5 };
    if !f64_ok {
        println!("this device has no shaderFloat64: checked to 1e-5, not bit for bit");
    }
    let mut rng = Rng(seed | 1);
    let (k, experts) = (512usize, 3usize);
    for (ty, n) in CASES {
        // The cpu device's order for a dense row: llama.cpp's prompt-batch kernels, F32
        // matrices of other row counts as a single row.
        let dense_at = if ty == GgmlType::F32 && n % 4 != 0 {
            BatchRow::SINGLE
        } else {
            BatchRow::IN_BATCH
        };
        // Dense: several tile shapes (MT = 8 rows a tile).
        let wb = weight(&mut rng, ty, k, n);
        let w = stage(&dev, ty, vec![k, n], WeightKind::Matrix, wb.clone());
        for m in [1usize, 3, 8, 9, 17] {
            let xs = activations(&mut rng, m, k);
            let x = dev.upload_new(&xs).expect("upload");
            let mut out = dev.alloc(m * n).expect("alloc");
            dev.matmul(&*w, x.view(), m, out.view_mut())
                .expect("matmul");
            let mut got = vec![0f32; m * n];
            dev.download(out.view(), &mut got).expect("download");
            let mut want = vec![0f32; m * n];
            for r in 0..m {
                flint_core::dot::matvec_f32_ggml_x86(
                    ty,
                    &wb,
                    &xs[r * k..(r + 1) * k],
                    &mut want[r * n..(r + 1) * n],
                    dense_at,
                )
                .expect("reference");
            }
            if let Some((i, g, wv)) = first_difference(&got, &want, tol) {
                panic!(
                    "{ty} dense m={m}: output (row {}, col {}) is {g:e} ({:#010x}), the cpu \
                     order gives {wv:e} ({:#010x}); seed {seed}",
                    i / n,
                    i % n,
                    g.to_bits(),
                    wv.to_bits()
                );
            }
        }
        // Experts: rows routed to three experts.
        let tower = weight(&mut rng, ty, k, n * experts);
        let t = stage(
            &dev,
            ty,
            vec![k, n, experts],
            WeightKind::ExpertTower,
            tower.clone(),
        );
        // Routed rows: each of 5 tokens to 2 experts (the gate and up projections' fan-out),
        // then 7 rows to one expert each (the down projection's).
        let eb = tower.len() / experts;
        for (m, f) in [(5usize, 2usize), (7, 1)] {
            let xs = activations(&mut rng, m, k);
            let ids: Vec<u32> = (0..(m * f) as u32)
                .map(|i| (i * 2 + i / 3) % experts as u32)
                .collect();
            let x = dev.upload_new(&xs).expect("upload");
            let mut out = dev.alloc(ids.len() * n).expect("alloc");
            dev.expert_matmul(&*t, x.view(), IndexView::Host(&ids), out.view_mut())
                .expect("expert_matmul");
            let mut got = vec![0f32; ids.len() * n];
            dev.download(out.view(), &mut got).expect("download");
            let mut want = vec![0f32; ids.len() * n];
            for (i, &id) in ids.iter().enumerate() {
                let e = id as usize;
                let xr = &xs[(i / f) * k..][..k];
                flint_core::dot::matvec_f32_ggml_x86(
                    ty,
                    &tower[e * eb..(e + 1) * eb],
                    xr,
                    &mut want[i * n..(i + 1) * n],
                    BatchRow::expert(64),
                )
                .expect("reference");
            }
            if let Some((i, g, wv)) = first_difference(&got, &want, tol) {
                panic!(
                    "{ty} experts (fan-out {f}): output (routed row {}, col {}) is {g:e}, \
                     the cpu order gives {wv:e}; seed {seed}",
                    i / n,
                    i % n
                );
            }
        }
        println!(
            "{ty} ({n} rows): dense m = 1, 3, 8, 9, 17 and routed rows (fan-out 2 and 1) identical"
        );
    }
}

/// Every f16 value's neighbourhood and the GELU cut-offs, for the activations.
fn activation_inputs(rng: &mut Rng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=u16::MAX)
        .map(flint_core::dequant::f16_to_f32)
        .filter(|x| x.is_finite())
        .collect();
    v.extend((0..20_000).map(|_| rng.unit() * 30.0));
    v.extend([
        -10.0, 10.0, -9.999_999, 9.999_999, 7.0, -7.0, 0.0, -0.0, 88.0, -104.0,
    ]);
    v
}

#[test]
fn activations_are_the_cpu_order_bit_for_bit() {
    let Some(dev) = device() else { return };
    let tol = if dev.has_f64() { 0.0 } else { 1e-6 };
    let mut rng = Rng(0x00ac_7e57);
    let gate = activation_inputs(&mut rng);
    let up: Vec<f32> = (0..gate.len()).map(|_| rng.unit() * 2.0).collect();
    let g = dev.upload_new(&gate).expect("upload");
    let u = dev.upload_new(&up).expect("upload");
    type Op = fn(
        &VkDevice,
        flint_hal::View<'_>,
        flint_hal::View<'_>,
        flint_hal::ViewMut<'_>,
    ) -> Result<(), flint_hal::HalError>;
    type Want = fn(f32, f32) -> f32;
    let cases: [(&str, Op, Want); 3] = [
        (
            "silu_mul",
            |d, a, b, o| d.silu_mul(a, b, o),
            |g, u| flint_core::math::silu(g) * u,
        ),
        (
            "gelu_mul",
            |d, a, b, o| d.gelu_mul(a, b, o),
            |g, u| flint_core::math::gelu_tanh_ggml_f16(g) * u,
        ),
        (
            "swiglu_oai_mul",
            |d, a, b, o| d.swiglu_oai_mul(a, b, o),
            flint_core::math::swiglu_oai,
        ),
    ];
    for (name, op, want) in cases {
        let mut out = dev.alloc(gate.len()).expect("alloc");
        op(&dev, g.view(), u.view(), out.view_mut()).expect(name);
        let mut got = vec![0f32; gate.len()];
        dev.download(out.view(), &mut got).expect("download");
        let want: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| want(g, u)).collect();
        if let Some((i, gv, wv)) = first_difference(&got, &want, tol) {
            panic!(
                "{name}({:e}, {:e}) is {gv:e}, the cpu order gives {wv:e}",
                gate[i], up[i]
            );
        }
        println!("{name}: {} values identical", gate.len());
    }
}

#[test]
fn routing_is_the_cpu_order_bit_for_bit() {
    use flint_core::math::{route_topk, scale_by_expert, Gating};
    use flint_hal::{HalErrorKind, IndexViewMut, RoutingConfig, ViewMut};
    let Some(dev) = device() else { return };
    let tol = if dev.has_f64() { 0.0 } else { 1e-6 };
    let mut rng = Rng(0x000a_07e5);
    // (experts, chosen, gating, bias, normalize, scale, per-expert scale): Qwen3-MoE,
    // gpt-oss, GLM-4.5, DeepSeek- and Gemma 4-like shapes, and expert counts that leave a
    // tail after the 16-lane vectors.
    let cases = [
        (
            128usize,
            8usize,
            Gating::Softmax,
            false,
            true,
            1.0f32,
            false,
        ),
        (60, 6, Gating::Softmax, false, false, 1.0, false),
        (32, 4, Gating::SoftmaxWeight, false, false, 1.0, false),
        (128, 8, Gating::Sigmoid, true, true, 2.5, false),
        (72, 16, Gating::Sigmoid, true, false, 1.0, false),
        (16, 16, Gating::Softmax, true, true, 1.0, false),
        (128, 8, Gating::Softmax, false, true, 1.0, true),
        (72, 6, Gating::Sigmoid, true, true, 2.5, true),
    ];
    for (n, k, gating, with_bias, normalize, scale, with_es) in cases {
        let rows = 37usize;
        let mut logits: Vec<f32> = (0..rows * n).map(|_| rng.unit() * 6.0).collect();
        // Ties: row 1 repeats one value everywhere, row 2 has two equal maxima.
        logits[n..2 * n].fill(0.25);
        logits[2 * n + 3] = 9.0;
        logits[2 * n + 7] = 9.0;
        let bias: Vec<f32> = (0..n).map(|_| rng.unit() * 0.1).collect();
        let es: Vec<f32> = (0..n).map(|_| 1.0 + rng.unit() * 0.75).collect();
        let cfg = RoutingConfig {
            k,
            gating,
            normalize,
            scale,
        };
        let l = dev.upload_new(&logits).expect("upload");
        let b = dev.upload_new(&bias).expect("upload");
        let s = dev.upload_new(&es).expect("upload");
        // The weights into a device tensor, at an offset within it, and into host memory.
        let at = 5usize;
        let mut wt = dev.alloc(at + rows * k + 3).expect("alloc");
        let (mut ids, mut ids_h) = (vec![0u32; rows * k], vec![0u32; rows * k]);
        dev.route_topk(
            l.view(),
            n,
            with_bias.then(|| b.view()),
            with_es.then(|| s.view()),
            &cfg,
            IndexViewMut::Host(&mut ids),
            wt.slice_mut(at..at + rows * k),
        )
        .expect("route_topk");
        let mut w = vec![0f32; rows * k];
        dev.download(wt.slice(at..at + rows * k), &mut w)
            .expect("download");
        let mut w_h = vec![0f32; rows * k];
        dev.route_topk(
            l.view(),
            n,
            with_bias.then(|| b.view()),
            with_es.then(|| s.view()),
            &cfg,
            IndexViewMut::Host(&mut ids_h),
            ViewMut::Host(&mut w_h),
        )
        .expect("route_topk into host memory");
        assert_eq!(ids, ids_h, "{gating:?} n={n} k={k}: ids into host weights");
        assert!(
            w.iter().zip(&w_h).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{gating:?} n={n} k={k}: weights into host memory differ"
        );
        let mut edges = [1f32; 8];
        dev.download(wt.slice(0..at), &mut edges[..at])
            .expect("download");
        dev.download(wt.slice(at + rows * k..at + rows * k + 3), &mut edges[at..])
            .expect("download");
        assert_eq!(edges, [0.0; 8], "route_topk wrote outside its weights view");
        for r in 0..rows {
            let (mut wi, mut ww) = (vec![0u32; k], vec![0f32; k]);
            route_topk(
                &logits[r * n..(r + 1) * n],
                with_bias.then_some(bias.as_slice()),
                k,
                gating,
                normalize,
                scale,
                &mut wi,
                &mut ww,
            )
            .expect("reference routing");
            if with_es {
                scale_by_expert(&mut ww, &wi, &es).expect("reference expert scale");
            }
            assert_eq!(
                &ids[r * k..(r + 1) * k],
                wi.as_slice(),
                "{gating:?} n={n} k={k}: row {r} ids"
            );
            if let Some((i, g, v)) = first_difference(&w[r * k..(r + 1) * k], &ww, tol) {
                panic!(
                    "{gating:?} n={n} k={k} expert scale {with_es}: row {r} weight {i} is \
                     {g:e}, the cpu order gives {v:e}"
                );
            }
        }
        println!(
            "route {gating:?} n={n} k={k}{}: {rows} rows identical",
            if with_es { " with expert scale" } else { "" }
        );
    }
    // Bad arguments are refused by name, as on the cpu device.
    let l = dev.upload_new(&[0.0f32; 8]).expect("upload");
    let cfg = RoutingConfig {
        k: 3,
        gating: Gating::Softmax,
        normalize: false,
        scale: 1.0,
    };
    let err = dev
        .route_topk(
            l.view(),
            2,
            None,
            None,
            &cfg,
            IndexViewMut::Host(&mut [0; 12]),
            ViewMut::Host(&mut [0.0; 12]),
        )
        .expect_err("3 of 2 experts");
    assert!(err.to_string().contains("cannot choose 3 of 2"), "{err}");
    // An expert scale of the wrong length.
    let cfg = RoutingConfig { k: 2, ..cfg };
    let err = dev
        .route_topk(
            l.view(),
            4,
            None,
            Some(l.slice(0..3)),
            &cfg,
            IndexViewMut::Host(&mut [0; 4]),
            ViewMut::Host(&mut [0.0; 4]),
        )
        .expect_err("3 scales for 4 experts");
    assert_eq!(err.kind, HalErrorKind::InvalidInput, "{err}");
}
