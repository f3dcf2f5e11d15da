//! Q8_0 and Q5_0 matrices in the AMX order (`kernels::amx`: the tiles from five
//! activation rows, AVX-512 VNNI below) against
//! `flint_core::dot::ggml_x86::vec_dot_q8_0_q8_0_amx` (the scalar statement of
//! llama.cpp's AMX order) and `vec_dot_q5_0_q8_0_amx`, and Q4_K / Q6_K against
//! `vec_dot_q4_k_q8_k_amx` / `vec_dot_q6_k_q8_k_amx`, bit for bit: any number of
//! activation rows (one, a few, a decode batch of 16-63, a prompt), the same bits for a
//! row whatever else is in the call, through every device path that reaches the weight
//! (`matmul`, `matmul_multi`, a row lookup), with the weights repacked in 16-row groups
//! and in the file's layout. Where the process cannot run AMX-INT8, the same orders run
//! on AVX-512 VNNI (`AmxOrder`'s panels) and are checked the same way; without AVX-512
//! VNNI the tests say so and check nothing.

mod common;

use bytemuck::Zeroable;
use common::*;
use flint_core::GgmlType;
use flint_hal::{Device, DeviceOptions};
use flint_hal_cpu::{CpuDevice, SimdLevel, WeightLayout};

/// The layouts each test stages its weights in: 16-row groups (where the process cannot
/// run the tiles, Q8_0 and Q5_0 take them) and the file's.
const LAYOUTS: [WeightLayout; 2] = [WeightLayout::Packed, WeightLayout::File];

/// The device at the VNNI level with AMX asked for, keeping its weights in `layout`;
/// `None` (said) below AVX-512 VNNI.
fn amx_device(layout: WeightLayout) -> Option<CpuDevice> {
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    if SimdLevel::detect() < SimdLevel::Avx512Vnni {
        eprintln!("no AVX-512 VNNI on this CPU: the AMX orders are not used here");
        return None;
    }
    let dev = CpuDevice::with_level(&opts, SimdLevel::Avx512Vnni)
        .expect("device")
        .with_layout(layout)
        .with_amx(true);
    assert!(dev.amx().0, "the AMX orders at the AVX-512 VNNI level");
    let tiles = flint_hal_cpu::kernels::amx::available();
    eprintln!(
        "{layout:?} layout, Q8_0/Q5_0 on {}",
        if tiles { "AMX tiles" } else { "AVX-512 VNNI" }
    );
    Some(dev)
}

/// `W x` for the `m` rows of `x` in the AMX order, row by row (`ty`: Q8_0, Q5_0, Q4_K or
/// Q6_K): the activations quantized to `ty`'s activation type, each output the scalar
/// statement of the order (`flint_core::dot::ggml_x86::vec_dot_*_amx`).
fn amx_reference(ty: GgmlType, w: &[u8], k: usize, n: usize, x: &[f32]) -> Vec<f32> {
    use flint_core::dot::ggml_x86 as x86;
    /// The blocks of a byte row (copied: the bytes need not be aligned for `B`).
    fn blocks<B: bytemuck::Pod + Zeroable>(bytes: &[u8]) -> Vec<B> {
        let mut b = vec![B::zeroed(); bytes.len() / std::mem::size_of::<B>()];
        bytemuck::cast_slice_mut(&mut b).copy_from_slice(bytes);
        b
    }
    let rb = ty.row_bytes(k).expect("row size");
    let act_ty = ty.vec_dot_type();
    let ab = act_ty.row_bytes(k).expect("activation row size");
    let m = x.len() / k;
    let mut want = vec![0f32; m * n];
    for (xr, o) in x.chunks(k).zip(want.chunks_mut(n)) {
        let mut a = vec![0u8; ab];
        flint_core::quant::quantize_act(act_ty, xr, &mut a).expect("quantize");
        for (r, v) in o.iter_mut().enumerate() {
            let row = &w[r * rb..(r + 1) * rb];
            *v = match ty {
                GgmlType::Q8_0 => x86::vec_dot_q8_0_q8_0_amx(&blocks(row), &blocks(&a)),
                GgmlType::Q5_0 => x86::vec_dot_q5_0_q8_0_amx(&blocks(row), &blocks(&a)),
                GgmlType::Q4_K => x86::vec_dot_q4_k_q8_k_amx(&blocks(row), &blocks(&a)),
                GgmlType::Q6_K => x86::vec_dot_q6_k_q8_k_amx(&blocks(row), &blocks(&a)),
                other => panic!("no AMX order for {other}"),
            };
        }
    }
    want
}

fn assert_bits(what: &str, got: &[f32], want: &[f32], n: usize) {
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{what}: row {}, output {}: {g} vs {e}",
            i / n,
            i % n
        );
    }
}

/// A random `k x n` weight of `ty` staged on `dev`: `matmul` of each row count in `ms`
/// gives [`amx_reference`]'s bits.
fn matmul_matches(
    dev: &CpuDevice,
    rng: &mut Rng,
    ty: GgmlType,
    (k, n): (usize, usize),
    ms: &[usize],
) {
    let w = random_weight(rng, ty, k, n);
    let h = dev
        .stage(&desc("w", ty, &[k, n], w.clone()))
        .expect("stage");
    for &m in ms {
        let x = rng.vec(m * k);
        let want = amx_reference(ty, &w, k, n, &x);
        let mut got = vec![f32::NAN; m * n];
        dev.matmul(&*h, (&x[..]).into(), m, (&mut got).into())
            .expect("matmul");
        assert_bits(&format!("{ty} matmul k {k} n {n} m {m}"), &got, &want, n);
    }
}

#[test]
fn q8_0_and_q5_0_in_the_amx_order_are_bit_exact() {
    for layout in LAYOUTS {
        let Some(dev) = amx_device(layout) else {
            return;
        };
        let mut rng = Rng(31);
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
            // Row counts (multiples of 32, as llama.cpp's AMX buffer takes): two panels, a
            // few (split over the tasks), a vocabulary-like many; k of one block, odd block
            // counts, Gemma 3's 640 and 2048.
            for (k, n) in [
                (32, 32),
                (96, 96),
                (640, 32),
                (640, 288),
                (2048, 64),
                (224, 1024),
            ] {
                // 1-4 rows: the VNNI kernel; 5 and more: the tiles.
                matmul_matches(
                    &dev,
                    &mut rng,
                    ty,
                    (k, n),
                    &[1, 2, 3, 4, 5, 15, 16, 17, 33, 63, 64, 100],
                );
            }
        }
    }
}

#[test]
fn the_amx_order_in_a_shared_section_and_a_row_lookup() {
    for layout in LAYOUTS {
        let Some(dev) = amx_device(layout) else {
            return;
        };
        let mut rng = Rng(37);
        let (k, n) = (640, 256);
        // Gemma 3's q/k/v: a Q5_0 query matrix beside a Q8_0 value matrix, one section.
        let wq = random_weight(&mut rng, GgmlType::Q5_0, k, 1024);
        let wv = random_weight(&mut rng, GgmlType::Q8_0, k, n);
        let hq = dev
            .stage(&desc("q", GgmlType::Q5_0, &[k, 1024], wq.clone()))
            .expect("stage");
        let hv = dev
            .stage(&desc("v", GgmlType::Q8_0, &[k, n], wv.clone()))
            .expect("stage");
        for m in [1usize, 3, 5, 16, 40] {
            let x = rng.vec(m * k);
            let want_q = amx_reference(GgmlType::Q5_0, &wq, k, 1024, &x);
            let want_v = amx_reference(GgmlType::Q8_0, &wv, k, n, &x);
            let mut q = vec![f32::NAN; m * 1024];
            let mut v = vec![f32::NAN; m * n];
            dev.matmul_multi(
                &[&*hq, &*hv],
                (&x[..]).into(),
                m,
                &mut [(&mut q).into(), (&mut v).into()],
            )
            .expect("matmul_multi");
            assert_bits(&format!("matmul_multi Q5_0 m {m}"), &q, &want_q, 1024);
            assert_bits(&format!("matmul_multi Q8_0 m {m}"), &v, &want_v, n);
        }
        // Rows read back as the file holds them (a tied embedding's lookup).
        for (h, w, ty) in [(&hv, &wv, GgmlType::Q8_0), (&hq, &wq, GgmlType::Q5_0)] {
            let rb = ty.row_bytes(k).expect("row size");
            for id in [0usize, 17, n - 1] {
                let mut row = vec![0f32; k];
                dev.get_rows(&**h, (&[id as u32][..]).into(), (&mut row).into())
                    .expect("get_rows");
                let mut want = vec![0f32; k];
                flint_core::dequant::dequantize(ty, &w[id * rb..(id + 1) * rb], &mut want)
                    .expect("dequantize");
                assert_bits(&format!("{ty} get_rows {id}"), &row, &want, k);
            }
        }
    }
}

/// A matrix whose row count is a multiple of 16 but not of 32 stays off AMX, as in
/// llama.cpp's AMX build (its AMX buffer refuses it): the device gives the non-AMX
/// device's bits for it.
#[test]
fn matrices_llamacpp_keeps_off_amx_keep_the_non_amx_order() {
    for layout in LAYOUTS {
        let Some(dev) = amx_device(layout) else {
            return;
        };
        let opts = DeviceOptions {
            threads: Some(2),
            keep_quant: true,
        };
        let plain = CpuDevice::with_level(&opts, SimdLevel::Avx512Vnni)
            .expect("device")
            .with_layout(layout)
            .with_amx(false);
        let mut rng = Rng(41);
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
            let (k, n) = (640, 48);
            let w = random_weight(&mut rng, ty, k, n);
            let h = dev
                .stage(&desc("w", ty, &[k, n], w.clone()))
                .expect("stage");
            let hp = plain
                .stage(&desc("w", ty, &[k, n], w.clone()))
                .expect("stage");
            for m in [1usize, 5, 16] {
                let x = rng.vec(m * k);
                let mut got = vec![f32::NAN; m * n];
                let mut want = vec![f32::NAN; m * n];
                dev.matmul(&*h, (&x[..]).into(), m, (&mut got).into())
                    .expect("matmul");
                plain
                    .matmul(&*hp, (&x[..]).into(), m, (&mut want).into())
                    .expect("matmul");
                assert_bits(&format!("{ty} n {n} m {m} off AMX"), &got, &want, n);
                let amx = amx_reference(ty, &w, k, n, &x);
                assert!(
                    got.iter()
                        .zip(&amx)
                        .any(|(g, a)| g.to_bits() != a.to_bits()),
                    "{ty} n {n} m {m}: the AMX order's bits, so the check above shows nothing"
                );
            }
        }
    }
}

/// Q4_K and Q6_K matrices on the AMX path against the scalar statements of llama.cpp's AMX
/// order for them, bit for bit: one to four activation rows (AVX-512) and more (the
/// tiles), several block counts, through `matmul`, `matmul_multi` beside a Q8_0 matrix,
/// and a row lookup.
#[test]
fn q4_k_and_q6_k_in_the_amx_order_are_bit_exact() {
    for layout in LAYOUTS {
        let Some(dev) = amx_device(layout) else {
            return;
        };
        let mut rng = Rng(43);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for (k, n) in [(256, 32), (768, 96), (1024, 640), (2048, 64)] {
                matmul_matches(&dev, &mut rng, ty, (k, n), &[1, 2, 3, 4, 5, 16, 17, 40]);
            }
            // A section of two matrices of the same activation type (Gemma 3's ffn_down
            // beside another), and the rows read back.
            let (k, n) = (512, 160);
            let wa = random_weight(&mut rng, ty, k, n);
            let wb = random_weight(&mut rng, ty, k, 2 * n);
            let ha = dev
                .stage(&desc("a", ty, &[k, n], wa.clone()))
                .expect("stage");
            let hb = dev
                .stage(&desc("b", ty, &[k, 2 * n], wb.clone()))
                .expect("stage");
            for m in [1usize, 3, 5, 16] {
                let x = rng.vec(m * k);
                let (want_a, want_b) = (
                    amx_reference(ty, &wa, k, n, &x),
                    amx_reference(ty, &wb, k, 2 * n, &x),
                );
                let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * 2 * n]);
                dev.matmul_multi(
                    &[&*ha, &*hb],
                    (&x[..]).into(),
                    m,
                    &mut [(&mut a).into(), (&mut b).into()],
                )
                .expect("matmul_multi");
                assert_bits(&format!("{ty} matmul_multi a m {m}"), &a, &want_a, n);
                assert_bits(&format!("{ty} matmul_multi b m {m}"), &b, &want_b, 2 * n);
            }
            let rb = ty.row_bytes(k).expect("row size");
            for id in [0usize, 33, n - 1] {
                let mut row = vec![0f32; k];
                dev.get_rows(&*ha, (&[id as u32][..]).into(), (&mut row).into())
                    .expect("get_rows");
                let mut want = vec![0f32; k];
                flint_core::dequant::dequantize(ty, &wa[id * rb..(id + 1) * rb], &mut want)
                    .expect("dequantize");
                assert_bits(&format!("{ty} get_rows {id}"), &row, &want, k);
            }
        }
    }
}
