//! Every matmul kernel at every SIMD level this CPU has, against an f64 reference over
//! the dequantized weight and the activations as quantized for the dot product, with
//! awkward shapes; scalar path against SIMD paths; staging and expert matmul.

mod common;

use std::sync::Arc;

use common::*;
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions, HalErrorKind, Op, WeightKind, WeightSource};
use flint_hal_cpu::kernels::native_kernel;
use flint_hal_cpu::{CpuDevice, SimdLevel, WeightLayout};

const SIMD_TYPES: [GgmlType; 13] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

/// The SIMD levels this CPU has (AVX2 and up).
fn simd_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| *l >= SimdLevel::Avx2 && *l <= SimdLevel::detect())
        .collect()
}

/// The device at `level`, weights repacked where the level repacks them (the file
/// layout's kernels are checked in `tinyblas_order.rs`, both layouts).
fn device(level: SimdLevel, threads: usize) -> CpuDevice {
    let opts = DeviceOptions {
        threads: Some(threads),
        keep_quant: true,
    };
    CpuDevice::with_level(&opts, level)
        .expect("open cpu device")
        .with_layout(WeightLayout::Packed)
}

fn run(
    dev: &CpuDevice,
    ty: GgmlType,
    w: &[u8],
    k: usize,
    n: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let h = dev
        .stage(&desc("w", ty, &[k, n], w.to_vec()))
        .expect("stage");
    let mut out = vec![f32::NAN; m * n];
    dev.matmul(&*h, x.into(), m, (&mut out).into())
        .expect("matmul");
    out
}

#[test]
fn simd_kernels_match_reference_on_awkward_shapes() {
    let levels = simd_levels();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: SIMD kernels not exercised");
        return;
    }
    let mut rng = Rng(1);
    for ty in SIMD_TYPES {
        // Shapes: rows not a multiple of the tiles, M around the activation tile of 4;
        // for 32-element blocks also an odd number of blocks per row (the AVX-512
        // kernels take blocks in pairs).
        let mut shapes: Vec<(usize, usize, &[usize])> =
            vec![(256, 7, &[1, 3, 5, 17]), (4096, 5, &[1, 4, 5])];
        if ty.block_size() <= 32 {
            shapes.push((160, 6, &[1, 5]));
        }
        if ty.block_size() == 1 {
            // Float rows that end in a partial vector (of 8 and of 16 lanes).
            shapes.push((37, 5, &[1, 4, 5]));
            shapes.push((72, 3, &[1, 4]));
        }
        for (k, n, ms) in shapes {
            let w = random_weight(&mut rng, ty, k, n);
            for &m in ms {
                let x = rng.vec(m * k);
                let (want, mag) = reference_matmul(ty, &w, k, n, &x, m);
                for &level in &levels {
                    let got = run(&device(level, 2), ty, &w, k, n, &x, m);
                    assert_close(
                        &format!("{ty} {level} k={k} n={n} m={m}"),
                        &got,
                        &want,
                        &mag,
                        2e-5,
                    );
                }
            }
        }
    }
}

#[test]
fn every_main_type_has_a_native_kernel() {
    for ty in SIMD_TYPES {
        if SimdLevel::detect() >= SimdLevel::Avx2 {
            assert!(native_kernel(SimdLevel::Avx2, ty).is_some(), "{ty}");
        }
        assert!(native_kernel(SimdLevel::Scalar, ty).is_none());
    }
    assert_eq!(
        native_kernel(SimdLevel::Avx512, GgmlType::Q8_0),
        Some(SimdLevel::Avx512)
    );
    // The K-quants run the AVX2 kernels at the AVX-512 F/BW level (llama.cpp's orders).
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        assert_eq!(native_kernel(SimdLevel::Avx512, ty), Some(SimdLevel::Avx2));
    }
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        assert_eq!(
            native_kernel(SimdLevel::Avx512Vnni, ty),
            Some(SimdLevel::Avx512Vnni)
        );
    }
}

#[test]
fn scalar_path_matches_simd_path() {
    let scalar = device(SimdLevel::Scalar, 2);
    let mut rng = Rng(2);
    for ty in SIMD_TYPES {
        if !scalar.supports(Op::Matmul, Some(ty)) {
            // Block types need flint_core::dot (the scalar reference).
            eprintln!("scalar reference does not compute {ty} yet: skipped");
            continue;
        }
        for &(k, n, m) in &[
            (512usize, 9usize, 5usize),
            (256, 5, 17),
            (4096, 3, 3),
            (256, 4, 1),
        ] {
            let w = random_weight(&mut rng, ty, k, n);
            let x = rng.vec(m * k);
            let (want, mag) = reference_matmul(ty, &w, k, n, &x, m);
            let s = run(&scalar, ty, &w, k, n, &x, m);
            assert_close(&format!("{ty} scalar"), &s, &want, &mag, 2e-5);
            for level in simd_levels() {
                let v = run(&device(level, 2), ty, &w, k, n, &x, m);
                assert_close(
                    &format!("{ty} scalar vs {level} k={k} m={m}"),
                    &v,
                    &s,
                    &mag,
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn fallback_types_use_the_scalar_reference() {
    // Types without a SIMD kernel go through flint_core::dot::vec_dot at every level.
    let mut rng = Rng(8);
    let (k, n, m) = (256, 3, 5);
    for ty in [GgmlType::Q4_1, GgmlType::Q5_1] {
        let w = random_weight(&mut rng, ty, k, n);
        let x = rng.vec(m * k);
        let (want, mag) = reference_matmul(ty, &w, k, n, &x, m);
        for level in [SimdLevel::Scalar, SimdLevel::detect()] {
            let dev = device(level, 2);
            assert!(dev.supports(Op::Matmul, Some(ty)), "{ty}");
            let got = run(&dev, ty, &w, k, n, &x, m);
            assert_close(&format!("{ty} {level}"), &got, &want, &mag, 2e-5);
        }
    }
}

/// The types whose SIMD kernels keep the scalar reference's order (`kernels/iq4_nl`,
/// `iq4_xs`, `q3_k`, `q2_k`) give the scalar device's results bit for bit at every level,
/// for odd row counts and lengths, one decode row, small batches and prompt batches
/// (the eight-row panels from 64 rows).
#[test]
fn reference_order_types_equal_the_scalar_path_bit_for_bit() {
    let scalar = device(SimdLevel::Scalar, 2);
    let mut rng = Rng(9);
    for ty in [
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::Q3_K,
        GgmlType::Q2_K,
    ] {
        let bs = ty.block_size();
        // n = 21: a partial last panel of the prompt-batch gemm (m = 64 and 70).
        for (k, n) in [
            (bs, 7),
            (3 * bs, 5),
            (9 * bs, 3),
            (17 * bs, 9),
            (2 * bs, 21),
        ] {
            let w = random_weight(&mut rng, ty, k, n);
            for m in [1, 3, 5, 17, 64, 70] {
                let x = rng.vec(m * k);
                let want = run(&scalar, ty, &w, k, n, &x, m);
                for level in simd_levels() {
                    let got = run(&device(level, 2), ty, &w, k, n, &x, m);
                    for (i, (g, s)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            s.to_bits(),
                            "{ty} {level} k={k} n={n} m={m} out {i}: {g:e} vs scalar {s:e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn one_thread_and_many_rows_agree_with_reference() {
    // Enough output rows that the row chunks split across tasks.
    let mut rng = Rng(3);
    let (k, n, m) = (256, 301, 6);
    let ty = GgmlType::Q4_K;
    let w = random_weight(&mut rng, ty, k, n);
    let x = rng.vec(m * k);
    let (want, mag) = reference_matmul(ty, &w, k, n, &x, m);
    for threads in [1, 3] {
        let got = run(&device(SimdLevel::detect(), threads), ty, &w, k, n, &x, m);
        assert_close(&format!("{threads} threads"), &got, &want, &mag, 2e-5);
    }
}

#[test]
fn unaligned_source_bytes_take_the_copy_path() {
    let mut rng = Rng(4);
    let (k, n, m) = (256, 4, 2);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F32] {
        let w = random_weight(&mut rng, ty, k, n);
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&w);
        let len = shifted.len();
        let src = WeightSource::new(Arc::new(shifted), 1..len).expect("range");
        let d = flint_hal::WeightDesc {
            name: "odd".into(),
            ty,
            dims: vec![k, n],
            kind: WeightKind::Matrix,
            data: src,
        };
        let x = rng.vec(m * k);
        let (want, mag) = reference_matmul(ty, &w, k, n, &x, m);
        let dev = device(SimdLevel::detect(), 2);
        let h = dev.stage(&d).expect("stage");
        let mut out = vec![0f32; m * n];
        dev.matmul(&*h, (&x).into(), m, (&mut out).into())
            .expect("matmul");
        assert_close(&format!("{ty} unaligned"), &out, &want, &mag, 2e-5);
    }
}

#[test]
fn staging_keeps_the_bytes_and_reports_them() {
    let dev = device(SimdLevel::detect(), 1);
    let mut rng = Rng(5);
    let w = random_weight(&mut rng, GgmlType::Q6_K, 512, 3);
    let len = w.len() as u64;
    let h = dev
        .stage(&desc("blk.0.ffn_down.weight", GgmlType::Q6_K, &[512, 3], w))
        .expect("stage");
    let info = h.info();
    assert!(info.kept_quant);
    assert_eq!(info.resident_bytes, len);
    assert_eq!(info.streamed_bytes, 0);
    assert_eq!(info.staged_ty, GgmlType::Q6_K);
    // Wrong length: InvalidInput naming the tensor.
    let e = dev
        .stage(&desc("short", GgmlType::Q4_K, &[256, 2], vec![0; 100]))
        .expect_err("bad length");
    assert_eq!(e.kind, HalErrorKind::InvalidInput);
    assert!(e.message.contains("short"), "{e}");
    // A type the backend cannot compute: Unsupported naming tensor and type.
    let e = dev
        .stage(&desc("ints", GgmlType::I32, &[4, 2], vec![0; 32]))
        .expect_err("I32 matrix");
    assert_eq!(e.kind, HalErrorKind::Unsupported);
    assert!(
        e.message.contains("ints") && e.message.contains("I32"),
        "{e}"
    );
    assert!(!dev.supports(Op::Matmul, Some(GgmlType::I32)));
    let e = dev
        .plan(&[desc("ints", GgmlType::I32, &[4, 2], vec![0; 32])], 0)
        .expect_err("plan of an I32 matrix");
    assert_eq!(e.kind, HalErrorKind::Unsupported);
    let plan = dev
        .plan(&[desc("f", GgmlType::F32, &[4, 2], vec![0; 32])], 0)
        .expect("plan");
    assert!(plan.weights[0].kept_quant);
    assert_eq!(plan.resident_bytes(), 32);
    assert!(dev.supports(Op::Matmul, Some(GgmlType::Q4_K)));
    assert!(dev.supports(Op::Matmul, Some(GgmlType::F32)));
    assert!(dev.supports(Op::PagedAttention, None));
}

#[test]
fn expert_matmul_matches_per_expert_matmul() {
    let mut rng = Rng(6);
    let (k, e) = (256, 4);
    // n = 6 (fewer rows than one task), n = 40 (several tasks per expert).
    for (ty, n) in [
        (GgmlType::Q4_K, 6),
        (GgmlType::Q8_0, 6),
        (GgmlType::F16, 6),
        (GgmlType::Q4_K, 40),
        // 32 rows per expert: Q4_K, Q6_K, Q8_0 and Q5_0 repacked at staging on AVX-512
        // VNNI (`q4k_x16`, `q6k_x16`, `q0_x16`).
        (GgmlType::Q4_K, 32),
        (GgmlType::Q6_K, 32),
        (GgmlType::Q8_0, 32),
        (GgmlType::Q5_0, 32),
        (GgmlType::Q6_K, 40),
        (GgmlType::Q5_0, 40),
        // The eight-row panels of every level (experts 0 and 3 below).
        (GgmlType::Q2_K, 40),
        (GgmlType::Q3_K, 40),
        (GgmlType::IQ4_XS, 40),
        (GgmlType::Q5_K, 40),
    ] {
        let w = random_weight(&mut rng, ty, k, n * e);
        let dev = device(SimdLevel::detect(), 2);
        let tower = dev
            .stage(&desc("exps", ty, &[k, n, e], w.clone()))
            .expect("stage tower");
        // Unordered, repeated experts (expert 3 has 5 rows: more than one tile), expert
        // 2 unused, expert 1 with a single row (the matvec path), two per input row (the
        // gate and up projections' fan-out); then a prompt's worth, one per input row (the
        // down projection's): experts 0 and 3 with 20 and 17 rows (the weight-tiled
        // gemm), expert 1 with 3, in a scattered order.
        let few: Vec<u32> = vec![3, 0, 3, 1, 0, 3, 3, 3];
        let many: Vec<u32> = (0..40u32)
            .map(|i| match (i * 7) % 40 {
                0..20 => 0,
                20..37 => 3,
                _ => 1,
            })
            .collect();
        for (n_in, rows) in [(4usize, few), (40, many)] {
            let x = rng.vec(n_in * k);
            let f = rows.len() / n_in;
            let mut out = vec![f32::NAN; rows.len() * n];
            dev.expert_matmul(&*tower, (&x).into(), (&rows).into(), (&mut out).into())
                .expect("expert_matmul");
            let rb = ty.row_bytes(k).expect("row bytes") * n;
            for (t, &ex) in rows.iter().enumerate() {
                let ex = ex as usize;
                let wi = &w[ex * rb..(ex + 1) * rb];
                let xi = &x[t / f * k..(t / f + 1) * k];
                let (want, mag) = reference_matmul(ty, wi, k, n, xi, 1);
                assert_close(
                    &format!("{ty} row {t}"),
                    &out[t * n..(t + 1) * n],
                    &want,
                    &mag,
                    2e-5,
                );
                // Batch invariance: bit for bit what the tower gives for this token
                // alone, however many tokens the expert had.
                let alone = [ex as u32];
                let mut one = vec![f32::NAN; n];
                dev.expert_matmul(&*tower, xi.into(), (&alone).into(), (&mut one).into())
                    .expect("expert_matmul");
                for (o, (g, e)) in out[t * n..(t + 1) * n].iter().zip(&one).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{ty} row {t} output {o}: {g} vs {e}"
                    );
                }
            }
            // Two towers on the same rows in one call (a layer's gate and up, whose
            // rows are quantized once): each output bit for bit its tower's own call.
            let w2 = random_weight(&mut rng, ty, k, n * e);
            let tower2 = dev
                .stage(&desc("exps2", ty, &[k, n, e], w2))
                .expect("stage second tower");
            let mut out2 = vec![f32::NAN; rows.len() * n];
            dev.expert_matmul(&*tower2, (&x).into(), (&rows).into(), (&mut out2).into())
                .expect("expert_matmul");
            let mut m1 = vec![f32::NAN; rows.len() * n];
            let mut m2 = vec![f32::NAN; rows.len() * n];
            dev.expert_matmul_multi(
                &[&*tower, &*tower2],
                (&x).into(),
                (&rows).into(),
                &mut [(&mut m1).into(), (&mut m2).into()],
            )
            .expect("expert_matmul_multi");
            for (name, got, want) in [("first", &m1, &out), ("second", &m2, &out2)] {
                let same = got
                    .iter()
                    .zip(want.iter())
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{ty}, {n_in} rows: the {name} tower's multi output differs"
                );
            }
        }
        let bad = [4u32];
        let mut o = vec![0f32; n];
        let err = dev
            .expert_matmul(
                &*tower,
                (&rng.vec(k)).into(),
                (&bad).into(),
                (&mut o).into(),
            )
            .expect_err("expert 4 of 4");
        assert_eq!(err.kind, HalErrorKind::InvalidInput);
    }
}

#[test]
fn get_rows_dequantizes_embedding_rows() {
    let mut rng = Rng(7);
    let d = 256;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        // 10 rows, arranged block by block where the CPU has VBMI and GFNI (`q3_k::perm`).
        GgmlType::Q3_K,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        // 48 Q4_K / Q6_K / Q8_0 / Q5_0 rows: repacked at staging on AVX-512 VNNI
        // (`q4k_x16`, `q6k_x16`, `q0_x16`), rows of the second and third groups asked for.
        let v = if matches!(
            ty,
            GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0 | GgmlType::Q5_0
        ) {
            48
        } else {
            10
        };
        let w = random_weight(&mut rng, ty, d, v);
        let full = flint_core::dequant::dequantize_to_vec(ty, &w).expect("dequantize");
        let dev = device(SimdLevel::detect(), 1);
        let mut de = desc("token_embd.weight", ty, &[d, v], w);
        de.kind = WeightKind::Embedding;
        let h = dev.stage(&de).expect("stage");
        let ids = [9u32, 0, 3, 3, v as u32 - 1, v as u32 / 2];
        let mut out = vec![0f32; ids.len() * d];
        dev.get_rows(&*h, (&ids).into(), (&mut out).into())
            .expect("get_rows");
        for (t, &id) in ids.iter().enumerate() {
            assert_eq!(
                &out[t * d..(t + 1) * d],
                &full[id as usize * d..(id as usize + 1) * d],
                "{ty}"
            );
        }
        let e = dev
            .get_rows(&*h, (&[v as u32]).into(), (&mut out[..d]).into())
            .expect_err("id v of v");
        assert_eq!(e.kind, HalErrorKind::InvalidInput);
    }
}

#[test]
fn simd_level_env_names_parse() {
    assert_eq!(SimdLevel::from_name("AVX2"), Some(SimdLevel::Avx2));
    assert_eq!(SimdLevel::from_name("scalar"), Some(SimdLevel::Scalar));
    assert_eq!(SimdLevel::from_name("neon"), None);
    assert!(SimdLevel::Scalar.check().is_ok());
}

#[test]
fn registry_entry_opens_cpu() {
    let entries = flint_hal_cpu::backends();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "cpu");
    assert!((entries[0].probe)().is_ok());
    let dev = (entries[0].open)(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("open");
    assert_eq!(dev.name(), "cpu");
    assert!(dev.description().contains("2 threads"));
}

/// On AVX-512 VNNI every weight hands its file bytes back through the source's release
/// hook, once, with its own range: a Q4_K, Q6_K, Q8_0 or Q5_0 weight with rows a multiple of 16
/// repacked at staging, any other copied into the device's huge-page arena (the holes
/// the repacked ones leave in the loader's copy would put it on small pages). Either way
/// the staged weight computes what a plain copy of the bytes does.
#[test]
fn every_weight_releases_its_file_bytes_repacked_or_copied() {
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!("SKIPPED: no AVX-512 VNNI on this CPU, nothing is repacked");
        return;
    }
    let mut rng = Rng(12);
    let k = 512;
    let dev = device(SimdLevel::Avx512Vnni, 2);
    // Repacked, kept in the file's layout (27 rows), repacked three times, another
    // type; then a repacked and a copied weight larger than one piece of the packing
    // (4 MiB), whose bytes go back piece by piece as they are packed or copied, and
    // then whole.
    for (ty, n) in [
        (GgmlType::Q4_K, 32),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q6_K, 32),
        (GgmlType::Q8_0, 32),
        (GgmlType::Q5_0, 32),
        (GgmlType::Q4_0, 32),
        (GgmlType::Q8_0, 18432),
        (GgmlType::Q4_0, 32768),
    ] {
        let w = random_weight(&mut rng, ty, k, n);
        // The tensor in the middle of a larger buffer, as in a file.
        let mut buf = vec![0u8; 100];
        buf.extend_from_slice(&w);
        buf.extend_from_slice(&[0u8; 50]);
        let range = 100..100 + w.len();
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let mut d = desc("w", ty, &[k, n], Vec::new());
        d.data = WeightSource::new(Arc::new(buf), range.clone())
            .expect("range")
            .with_release(Arc::new(move |r| seen.lock().expect("lock").push(r)));
        let h = dev.stage(&d).expect("stage");
        let calls = calls.lock().expect("lock").clone();
        if w.len() <= 4 << 20 {
            assert_eq!(calls, vec![range], "{ty} n = {n}");
        } else {
            // Consecutive pieces from the start, short of the end, then the whole.
            assert!(calls.len() >= 3, "{ty} n = {n}: {calls:?}");
            assert_eq!(calls.last(), Some(&range), "{ty} n = {n}");
            let mut at = range.start;
            for r in &calls[..calls.len() - 1] {
                assert_eq!(r.start, at, "{ty} n = {n}: {calls:?}");
                assert!(
                    r.end > r.start && r.end < range.end,
                    "{ty} n = {n}: {calls:?}"
                );
                at = r.end;
            }
        }
        // And the staged weight computes what a plain copy of the bytes does.
        let x = rng.vec(k);
        let mut got = vec![0f32; n];
        dev.matmul(&*h, (&x).into(), 1, (&mut got).into())
            .expect("matmul");
        assert_eq!(got, run(&dev, ty, &w, k, n, &x, 1), "{ty} n = {n}");
    }
}
