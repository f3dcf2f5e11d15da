//! The matmul kernels against `flint_core::dot::matvec_f32_ggml_x86`, the scalar
//! statement of llama.cpp's x86 float orders (docs/parity.md), bit for bit, at every
//! SIMD level this CPU has:
//! - Q8_0, Q5_0 and Q4_0 (tinyBLAS order), for single rows, tiles of activation rows,
//!   the VNNI panel gemm's tiles of 16 weight rows x 2 activation rows and the AVX2
//!   panels of 8 weight rows (from 64 activation rows);
//! - Q4_K and Q6_K in a prompt batch (the AVX-512 VNNI kernels: Q4_K gemm / gemv rows,
//!   Q6_K tiled from 8 rows);
//! - Q4_K and Q6_K expert towers (`MUL_MAT_ID`: Q4_K in the gemv order for every row);
//! - F32 (tinyBLAS's order for batches, `ggml_vec_dot_f32`'s for other row counts and
//!   expert towers, and for single rows in llama.cpp's order) at every level, the scalar
//!   one included.

mod common;

use common::*;
use flint_core::dot::ggml_x86::BatchRow;
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions};
use flint_hal_cpu::{CpuDevice, FloatOrder, SimdLevel, WeightLayout};

#[test]
fn q8_0_and_q5_0_kernels_are_bit_exact_in_tinyblas_order() {
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| *l >= SimdLevel::Avx2 && *l <= SimdLevel::detect())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: SIMD kernels not exercised");
        return;
    }
    let mut rng = Rng(7);
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
        // Row counts that leave every edge of the panel gemm's tiles (panels of 16 weight
        // rows x 2 activation rows): panels of 1, 3, 5 or 9 live rows, exactly one
        // panel, 16 + 16 + 3 rows, 66 rows (5 panels, decoded by two tasks); odd and even
        // activation row counts. A multiple of 16 rows is repacked at staging on AVX-512
        // VNNI (`q0_x16`): 16 rows, and 48 (three row groups, over the tasks).
        for (k, n) in [
            (640, 9),
            (2048, 5),
            (96, 3),
            (64, 1),
            (160, 35),
            (32, 37),
            (640, 66),
            (64, 16),
            (640, 48),
        ] {
            let w = random_weight(&mut rng, ty, k, n);
            let rb = ty.row_bytes(k).expect("row size");
            // 16 rows and more: the weight-tiled gemm, in tasks of a multiple of 4 rows.
            // 64 and more without VNNI: the eight-row panels (`q0_gemm_avx2`).
            for m in [1usize, 2, 3, 4, 5, 9, 13, 16, 19, 30, 35, 64, 67] {
                let x = rng.vec(m * k);
                let mut want = vec![0f32; m * n];
                for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
                    flint_core::dot::matvec_f32_ggml_x86(
                        ty,
                        &w[..n * rb],
                        xr,
                        o,
                        BatchRow::IN_BATCH,
                    )
                    .expect("core");
                }
                for &level in &levels {
                    assert_device_equals(level, ty, &w, k, n, &x, m, &want);
                }
            }
        }
    }
}

/// F32 weights (a MoE router, an f32 file's projections) in llama.cpp's AVX-512 orders
/// at every level, in both of the device's float orders, for lengths with and without a
/// partial last vector or step and any number of rows: tinyBLAS's
/// (`vec_dot_f32_tinyblas`: sixteen FMA lanes, `_mm512_reduce_add_ps`) for a matrix of a
/// multiple of 4 rows, `ggml_vec_dot_f32`'s (`vec_dot_f32_ggml`: four accumulators of
/// sixteen lanes) for other row counts; a single activation row takes the latter in
/// llama.cpp's order (`FloatOrder::LlamaCpp`) and the former when batch-invariant.
#[test]
fn f32_kernels_are_bit_exact_in_llama_cpp_order() {
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect();
    let mut rng = Rng(23);
    let ty = GgmlType::F32;
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    for (k, n) in [(256, 8), (40, 12), (300, 4), (16, 5), (2880, 8), (130, 6)] {
        let w = random_weight(&mut rng, ty, k, n);
        for m in [1usize, 2, 3, 4, 5, 9, 17] {
            let x = rng.vec(m * k);
            for order in [FloatOrder::BatchInvariant, FloatOrder::LlamaCpp] {
                let mut want = vec![0f32; m * n];
                for (i, (xr, o)) in x.chunks(k).zip(want.chunks_mut(n)).enumerate() {
                    let at = match (n % 4 == 0, order) {
                        (false, _) => BatchRow::SINGLE,
                        (true, FloatOrder::BatchInvariant) => BatchRow::IN_BATCH,
                        (true, FloatOrder::LlamaCpp) => BatchRow::at(m, i),
                    };
                    flint_core::dot::matvec_f32_ggml_x86(ty, &w, xr, o, at).expect("core");
                }
                for &level in &levels {
                    let dev = CpuDevice::with_level(&opts, level)
                        .expect("device")
                        .with_float_order(order);
                    let h = dev
                        .stage(&desc("w", ty, &[k, n], w.to_vec()))
                        .expect("stage");
                    let mut got = vec![f32::NAN; m * n];
                    dev.matmul(&*h, (&x).into(), m, (&mut got).into())
                        .expect("matmul");
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{level:?} {order:?} k {k} n {n} m {m}: row {}, output {}: {g} vs {e}",
                            i / n,
                            i % n
                        );
                    }
                }
            }
        }
    }
}

/// F32 expert towers (gpt-oss's f32 files) in `ggml_vec_dot_f32`'s order for every
/// routed row, as llama.cpp's `MUL_MAT_ID` computes them, at every level, through
/// `expert_matmul` and `expert_matmul_multi`, an expert with 1, 5 or 20 rows.
#[test]
fn f32_expert_towers_are_bit_exact_in_vec_dot_order() {
    let mut rng = Rng(29);
    let ty = GgmlType::F32;
    let (k, n, e) = (300, 12, 4);
    let rows = routed_rows();
    let x = rng.vec(26 * k);
    let w = random_weight(&mut rng, ty, k, n * e);
    let w2 = random_weight(&mut rng, ty, k, n * e);
    let rb = 4 * k * n;
    let want = |w: &[u8]| -> Vec<f32> {
        let mut out = vec![0f32; rows.len() * n];
        for (i, (&ex, o)) in rows.iter().zip(out.chunks_mut(n)).enumerate() {
            let ex = ex as usize;
            flint_core::dot::matvec_f32_ggml_x86(
                ty,
                &w[ex * rb..(ex + 1) * rb],
                &x[i * k..(i + 1) * k],
                o,
                BatchRow::expert(20),
            )
            .expect("core");
        }
        out
    };
    let (want1, want2) = (want(&w), want(&w2));
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    for level in SimdLevel::ALL
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
    {
        let dev = CpuDevice::with_level(&opts, level).expect("device");
        assert_towers_equal(
            &dev,
            ty,
            (k, n, e),
            (&w, &w2),
            &x,
            &rows,
            (&want1, &want2),
            &format!("{level:?}"),
        );
    }
}

/// Q4_0 has no scalar statement of tinyBLAS's order in core: the panel gemms (batches:
/// VNNI's from 16 rows, the eight-row panels of the AVX2 and AVX-512 F levels from 64)
/// must equal the AVX2 tinyBLAS-order row kernel (`tinyblas::dot_q0`, one activation row
/// at a time) bit for bit, at every level this CPU has.
#[test]
fn q4_0_panel_gemm_equals_the_tinyblas_row_kernel() {
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| *l >= SimdLevel::Avx2 && *l <= SimdLevel::detect())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: SIMD kernels not exercised");
        return;
    }
    let mut rng = Rng(9);
    let ty = GgmlType::Q4_0;
    for (k, n) in [(640, 9), (160, 35), (32, 37)] {
        let w = random_weight(&mut rng, ty, k, n);
        for m in [2usize, 3, 5, 13, 16, 21, 34, 64, 67] {
            let x = rng.vec(m * k);
            let mut want = vec![0f32; m * n];
            let opts = DeviceOptions {
                threads: Some(1),
                keep_quant: true,
            };
            let dev = CpuDevice::with_level(&opts, SimdLevel::Avx2).expect("device");
            let h = dev
                .stage(&desc("w", ty, &[k, n], w.to_vec()))
                .expect("stage");
            for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
                dev.matmul(&*h, xr.into(), 1, o.into()).expect("matmul");
            }
            for &level in &levels {
                assert_device_equals(level, ty, &w, k, n, &x, m, &want);
            }
        }
    }
}

/// hal-cpu's Q4_K, Q5_K and Q6_K kernels compute every row in llama.cpp's prompt-batch
/// orders (those of its AVX-512 VNNI build, which the golden data came from) at every SIMD
/// level: Q4_K in the repacked gemm order, Q5_K and Q6_K in the tiled matmul's order,
/// whatever the number of rows (a row's result never depends on the batch; llama.cpp itself switches kernels
/// for single rows, tail rows and small batches).
#[test]
fn q4_k_and_q6_k_batches_are_bit_exact_in_llama_cpp_order() {
    let levels: Vec<SimdLevel> = [SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Avx512Vnni]
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: the llama.cpp-order K-quant kernels are not used here");
    }
    let mut rng = Rng(11);
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        // 27 rows: the 4-row matvec kernel and a remainder of 3; two panels of the
        // prompt-batch gemm (16 rows, then 11). 48 rows: Q4_K repacked at staging
        // (`q4k_x16`: three row groups, split over the tasks).
        for (k, n) in [(2048, 27), (512, 48), (256, 512), (256, 64)] {
            let w = random_weight(&mut rng, ty, k, n);
            let rb = ty.row_bytes(k).expect("row size");
            // 2..15 rows: the tile kernels of `dot_rows` (tiles of up to 4). From 16 rows: the
            // panel gemm (`kq_panel`), tasks of activation rows in tiles of 4, their last rows
            // one at a time.
            // From 64 rows without VNNI: the eight-row panels (`kq_panel_avx2`), tiles of
            // 3 activation rows and a last one alone (64, 67) or none (177).
            for m in [1usize, 2, 3, 4, 5, 6, 7, 8, 13, 16, 22, 31, 64, 67, 177] {
                let x = rng.vec(m * k);
                let mut want = vec![0f32; m * n];
                for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
                    let at = BatchRow::IN_BATCH;
                    flint_core::dot::matvec_f32_ggml_x86(ty, &w[..n * rb], xr, o, at)
                        .expect("core");
                }
                for &level in &levels {
                    assert_device_equals(level, ty, &w, k, n, &x, m, &want);
                }
            }
        }
    }
}

/// The K-quant panels and the AVX2 Q4_K decode kernels add a few `vpmaddubsw` products
/// as i16 before widening them (`kq_panel_avx2::sum16`, `q4_k::avx2::dot_q4k_rows4_m`):
/// with every quant at its largest magnitude (Q4_K nibbles 15, Q5_K quants 31,
/// Q6_K quants 63, the scales and mins at their extremes) against activations that
/// quantize to -127 or 127 throughout, the sums must still equal the scalar statement
/// bit for bit at every level (an overflow would wrap).
#[test]
fn k_quant_panels_hold_the_largest_quants() {
    let levels: Vec<SimdLevel> = [SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Avx512Vnni]
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: the K-quant panels are not used here");
        return;
    }
    let (k, n) = (512, 11);
    let one = 0x3C00u16.to_le_bytes();
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let mut block = Vec::new();
        if ty == GgmlType::Q4_K {
            // d, dmin, twelve scale bytes (every 6-bit scale and min 63), the nibbles.
            block.extend(one);
            block.extend(one);
            block.extend([0xFF; 12]);
            block.extend([0xFF; 128]);
        } else if ty == GgmlType::Q5_K {
            // d, dmin, the scales and mins (63), qh and the nibbles (every quant 31).
            block.extend(one);
            block.extend(one);
            block.extend([0xFF; 12]);
            block.extend([0xFF; 32]);
            block.extend([0xFF; 128]);
        } else {
            // ql, qh (every quant 63), scales (the two extremes), d.
            block.extend([0xFF; 128]);
            block.extend([0xFF; 64]);
            block.extend((0..16).map(|s| if s % 2 == 0 { 0x80u8 } else { 0x7F }));
            block.extend(one);
        }
        let w: Vec<u8> = block
            .iter()
            .copied()
            .cycle()
            .take(block.len() * (k / 256) * n)
            .collect();
        let rb = ty.row_bytes(k).expect("row size");
        assert_eq!(w.len(), rb * n, "{ty}: block layout");
        // The decode kernels (one row, a small batch) and the panels.
        for m in [1, 3, 67] {
            // Rows of one value: every quant -127 (negative rows) or 127.
            let x: Vec<f32> = (0..m * k)
                .map(|i| if (i / k) % 2 == 0 { -3.5 } else { 2.25 })
                .collect();
            let mut want = vec![0f32; m * n];
            for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
                flint_core::dot::matvec_f32_ggml_x86(ty, &w, xr, o, BatchRow::IN_BATCH)
                    .expect("core");
            }
            for &level in &levels {
                assert_device_equals(level, ty, &w, k, n, &x, m, &want);
            }
        }
    }
}

/// Expert towers on AVX-512 VNNI follow llama.cpp's `MUL_MAT_ID` orders
/// (`BatchRow::expert`, docs/parity.md): Q4_K in the repacked gemv order for every
/// routed row (not the gemm order of a dense matmul), Q6_K tiled, whatever the number of
/// rows an expert gets (1, a few, a prompt's worth for the weight-tiled gemm), in either
/// layout, through `expert_matmul` and `expert_matmul_multi`.
#[test]
fn expert_towers_are_bit_exact_in_mul_mat_id_order() {
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!(
            "no AVX-512 VNNI on this CPU: the llama.cpp-order expert kernels are not used here"
        );
        return;
    }
    // Expert 0: 20 rows, expert 1: 1 row, expert 2: none, expert 3: 5 rows; 26 input rows,
    // one routed row each. 32 rows per expert: repacked at staging in the packed layout;
    // 40: never.
    check_expert_towers(Rng(17), 4, &routed_rows(), [32, 40], BatchRow::expert(64));
}

/// A prefill's expert towers: one expert with 70 routed rows (the strips of the
/// weight-tiled gemm, 64 rows or more), one with 30 (the one-section panel tasks of a
/// prompt's experts, `expert_panel_section`), one with 3 (the small-batch tasks), in
/// llama.cpp's `MUL_MAT_ID` orders bit for bit, in either layout, with a partial last
/// panel (40 rows an expert) and without (48).
#[test]
fn expert_towers_with_a_prompts_rows_are_bit_exact() {
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!(
            "no AVX-512 VNNI on this CPU: the llama.cpp-order expert kernels are not used here"
        );
        return;
    }
    let mut rows: Vec<u32> = [vec![0u32; 70], vec![2u32; 30], vec![1u32; 3]].concat();
    rows.rotate_left(31);
    check_expert_towers(Rng(19), 3, &rows, [48, 40], BatchRow::expert(rows.len()));
}

/// At the AVX2 and AVX-512 F levels the expert towers take the dense order (the row
/// kernels': Q4_K's repacked gemm order, Q6_K tiled) for any number of routed rows: an
/// expert with 70 rows and one with 30 (the one-section tasks of eight-row panels,
/// `expert_panel_section`), one with 3 and one with 1 (the small-batch tasks), with a
/// partial last panel (44 rows an expert) and without (48).
#[test]
fn expert_towers_at_the_avx2_levels_are_bit_exact() {
    let mut rows: Vec<u32> =
        [vec![0u32; 70], vec![2u32; 30], vec![1u32; 3], vec![3u32; 1]].concat();
    rows.rotate_left(29);
    let k = 512;
    let mut rng = Rng(23);
    let x = rng.vec(rows.len() * k);
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for n in [48, 44] {
            let e = 4;
            let w = random_weight(&mut rng, ty, k, n * e);
            let w2 = random_weight(&mut rng, ty, k, n * e);
            let want1 = towers_want(ty, &w, &x, &rows, (k, n), BatchRow::IN_BATCH);
            let want2 = towers_want(ty, &w2, &x, &rows, (k, n), BatchRow::IN_BATCH);
            for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
                let Ok(dev) = CpuDevice::with_level(&opts, level) else {
                    eprintln!("{level:?}: not on this CPU, skipped");
                    continue;
                };
                assert_towers_equal(
                    &dev,
                    ty,
                    (k, n, e),
                    (&w, &w2),
                    &x,
                    &rows,
                    (&want1, &want2),
                    &format!("{ty} {level:?} n {n}"),
                );
            }
        }
    }
}

/// The scalar statement of a tower `w` (`k` x `n` per expert) on the routed rows `rows`
/// (routed row `i` reads input row `i` of `x`), each row in the order `at` names.
fn towers_want(
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    rows: &[u32],
    (k, n): (usize, usize),
    at: BatchRow,
) -> Vec<f32> {
    let rb = ty.row_bytes(k).expect("row size") * n;
    let mut out = vec![0f32; rows.len() * n];
    for (i, (&ex, o)) in rows.iter().zip(out.chunks_mut(n)).enumerate() {
        let ex = ex as usize;
        flint_core::dot::matvec_f32_ggml_x86(
            ty,
            &w[ex * rb..(ex + 1) * rb],
            &x[i * k..(i + 1) * k],
            o,
            at,
        )
        .expect("core");
    }
    out
}

/// `assert_towers_equal` for Q4_K and Q6_K towers of `e` experts of 512 x `n` (each `n`
/// of `ns`), the routed rows `rows` (one per input row), against the scalar statement
/// with `at`, at AVX-512 VNNI in either layout.
fn check_expert_towers(mut rng: Rng, e: usize, rows: &[u32], ns: [usize; 2], at: BatchRow) {
    let k = 512;
    let x = rng.vec(rows.len() * k);
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for n in ns {
            let w = random_weight(&mut rng, ty, k, n * e);
            let w2 = random_weight(&mut rng, ty, k, n * e);
            let want1 = towers_want(ty, &w, &x, rows, (k, n), at);
            let want2 = towers_want(ty, &w2, &x, rows, (k, n), at);
            for layout in [WeightLayout::Packed, WeightLayout::File] {
                let dev = CpuDevice::with_level(&opts, SimdLevel::Avx512Vnni)
                    .expect("device")
                    .with_layout(layout);
                assert_towers_equal(
                    &dev,
                    ty,
                    (k, n, e),
                    (&w, &w2),
                    &x,
                    rows,
                    (&want1, &want2),
                    &format!("{ty} {layout:?} n {n}"),
                );
            }
        }
    }
}

/// The expert ids of the expert tests' routed rows, one per input row (a fan-out of 1:
/// routed row `i` reads input row `i`): expert 0 gets 20 rows, expert 1 one row, expert
/// 2 none, expert 3 five rows, in a rotated order; 26 rows.
fn routed_rows() -> Vec<u32> {
    let mut ids: Vec<u32> = vec![0; 20];
    ids.push(1);
    ids.extend([3; 5]);
    ids.rotate_left(9);
    ids
}

/// Two towers `w`, `w2` (`k` x `n` x `e`) staged on `dev`: `expert_matmul` of the first
/// and `expert_matmul_multi` of both on `rows` equal `want` bit for bit.
#[allow(clippy::too_many_arguments)]
fn assert_towers_equal(
    dev: &CpuDevice,
    ty: GgmlType,
    (k, n, e): (usize, usize, usize),
    (w, w2): (&[u8], &[u8]),
    x: &[f32],
    rows: &[u32],
    (want1, want2): (&[f32], &[f32]),
    label: &str,
) {
    let t1 = dev
        .stage(&desc("exps", ty, &[k, n, e], w.to_vec()))
        .expect("stage");
    let t2 = dev
        .stage(&desc("exps2", ty, &[k, n, e], w2.to_vec()))
        .expect("stage");
    let mut one = vec![f32::NAN; rows.len() * n];
    dev.expert_matmul(&*t1, x.into(), rows.into(), (&mut one).into())
        .expect("expert_matmul");
    let mut m1 = vec![f32::NAN; rows.len() * n];
    let mut m2 = vec![f32::NAN; rows.len() * n];
    dev.expert_matmul_multi(
        &[&*t1, &*t2],
        x.into(),
        rows.into(),
        &mut [(&mut m1).into(), (&mut m2).into()],
    )
    .expect("expert_matmul_multi");
    for (what, got, want) in [
        ("expert_matmul", &one[..], want1),
        ("multi, first", &m1[..], want1),
        ("multi, second", &m2[..], want2),
    ] {
        for (i, (g, e)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{label} {what}: row {} (expert {}), output {}: {g} vs {e}",
                i / n,
                rows[i / n],
                i % n
            );
        }
    }
}

/// The cpu device at `level`, `W x` for the `m` rows of `x`, equals `want` bit for bit,
/// with the weight in either layout.
#[allow(clippy::too_many_arguments)]
fn assert_device_equals(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    k: usize,
    n: usize,
    x: &[f32],
    m: usize,
    want: &[f32],
) {
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    for layout in [WeightLayout::Packed, WeightLayout::File] {
        let dev = CpuDevice::with_level(&opts, level)
            .expect("device")
            .with_layout(layout);
        let h = dev
            .stage(&desc("w", ty, &[k, n], w.to_vec()))
            .expect("stage");
        let mut got = vec![f32::NAN; m * n];
        dev.matmul(&*h, x.into(), m, (&mut got).into())
            .expect("matmul");
        for (i, (g, e)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{ty} {level:?} {layout:?} k {k} n {n} m {m}: row {}, output {}: {g} vs {e}",
                i / n,
                i % n
            );
        }
    }
}

/// The eight-row panel gemms without VNNI (the AVX2 and AVX-512 F levels) strip by strip
/// too: a weight of `strip + 13` rows (the last strip partial, a partial last panel) and
/// 64 activation rows, Q4_K and Q8_0, equal the scalar statement bit for bit.
#[test]
fn avx2_panel_gemms_over_several_strips_are_bit_exact() {
    if SimdLevel::detect() < SimdLevel::Avx2 {
        eprintln!("no AVX2 on this CPU: the eight-row panel gemms are not used here");
        return;
    }
    let mut rng = Rng(17);
    let (k, m) = (512, 64);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let strip =
            flint_hal_cpu::kernels::gemm_strip_rows(SimdLevel::Avx2, ty, k).expect("a strip size");
        assert_random_batch_exact(&mut rng, SimdLevel::Avx2, ty, k, strip + 13, m);
    }
}

/// A random `k x n` weight of `ty` times `m` random activation rows on the cpu device at
/// `level` equals the scalar statement of llama.cpp's prompt-batch order bit for bit.
fn assert_random_batch_exact(
    rng: &mut Rng,
    level: SimdLevel,
    ty: GgmlType,
    k: usize,
    n: usize,
    m: usize,
) {
    let w = random_weight(rng, ty, k, n);
    let rb = ty.row_bytes(k).expect("row size");
    let x = rng.vec(m * k);
    let mut want = vec![0f32; m * n];
    for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
        flint_core::dot::matvec_f32_ggml_x86(ty, &w[..n * rb], xr, o, BatchRow::IN_BATCH)
            .expect("core");
    }
    assert_device_equals(level, ty, &w, k, n, &x, m, &want);
}

/// A weight whose decoded panels exceed the gemm's scratch bound is decoded and applied
/// strip by strip (`kernels::gemm_strip_rows`) for a prompt's rows, panel by panel
/// (weight-stationary) for a few dozen: every output column of every strip, the last
/// strip partial, in the file layout (`strip + 37` rows) and repacked at staging
/// (`strip + 48`, a multiple of 16), equals the scalar statement bit for bit.
#[test]
fn weights_larger_than_one_strip_are_bit_exact() {
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!("no AVX-512 VNNI on this CPU: the strip-mined panel gemm is not used here");
        return;
    }
    let mut rng = Rng(13);
    let k = 2048;
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
        let strip = flint_hal_cpu::kernels::gemm_strip_rows(SimdLevel::Avx512Vnni, ty, k)
            .expect("a strip size");
        // 65 activation rows: the strips; 17: the weight-stationary gemm of a few rows.
        for (n, m) in [(strip + 37, 65), (strip + 48, 65), (strip + 37, 17)] {
            assert_random_batch_exact(&mut rng, SimdLevel::Avx512Vnni, ty, k, n, m);
        }
    }
}

/// `matmul_glu` of two legacy-type weights on a prompt batch (the fused gemm that
/// applies the activation to each task's tiles) equals `matmul_multi` and the
/// activation op bit for bit: Q5_0, Q8_0 and Q4_0, GELU and SiLU, both layouts, a
/// weight wider than the fused gemm's strip of two weights (the last strip and the last
/// panel partial), row counts at and above its threshold, and a few rows (the two
/// matmuls).
#[test]
fn fused_glu_equals_its_matmuls_and_activation() {
    use flint_hal::Glu;
    let mut rng = Rng(23);
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    let k = 640;
    let strip = flint_hal_cpu::kernels::gemm_strip_rows(SimdLevel::Avx512Vnni, GgmlType::Q8_0, k)
        .expect("a strip size");
    let n = strip / 2 + 37;
    for level in [SimdLevel::Avx512Vnni, SimdLevel::Avx2] {
        if SimdLevel::detect() < level {
            eprintln!("{level:?}: not on this CPU, skipped");
            continue;
        }
        for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_0] {
            let (wg, wu) = (
                random_weight(&mut rng, ty, k, n),
                random_weight(&mut rng, ty, k, n),
            );
            for layout in [WeightLayout::Packed, WeightLayout::File] {
                let dev = CpuDevice::with_level(&opts, level)
                    .expect("device")
                    .with_layout(layout);
                let g = dev
                    .stage(&desc("g", ty, &[k, n], wg.clone()))
                    .expect("stage");
                let u = dev
                    .stage(&desc("u", ty, &[k, n], wu.clone()))
                    .expect("stage");
                for (m, glu) in [(64, Glu::GeluTanh), (131, Glu::Silu), (20, Glu::GeluTanh)] {
                    let x = rng.vec(m * k);
                    let (mut gp, mut up) = (vec![0f32; m * n], vec![0f32; m * n]);
                    dev.matmul_multi(
                        &[&*g, &*u],
                        (&x).into(),
                        m,
                        &mut [(&mut gp).into(), (&mut up).into()],
                    )
                    .expect("matmul_multi");
                    let mut want = vec![0f32; m * n];
                    match glu {
                        Glu::GeluTanh => {
                            dev.gelu_mul((&gp).into(), (&up).into(), (&mut want).into())
                        }
                        _ => dev.silu_mul((&gp).into(), (&up).into(), (&mut want).into()),
                    }
                    .expect("activation");
                    let (mut s0, mut s1) = (vec![0f32; m * n], vec![0f32; m * n]);
                    let mut got = vec![f32::NAN; m * n];
                    dev.matmul_glu(
                        &*g,
                        &*u,
                        (&x).into(),
                        m,
                        glu,
                        [(&mut s0).into(), (&mut s1).into()],
                        (&mut got).into(),
                    )
                    .expect("matmul_glu");
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} {level:?} {layout:?} {glu:?} m {m}: row {}, column {}: {a} vs {b}",
                            i / n,
                            i % n
                        );
                    }
                }
            }
        }
    }
}
