//! The Gated DeltaNet ops of the cpu device: the AVX2 delta rule against the scalar
//! path (`flint_core::math::gated_delta_net`) bit for bit, on head sizes with and without
//! a scalar tail, one token and a prompt, GQA; a shape the device refuses; the
//! convolution with SiLU against `math::ssm_conv` then `math::silu` bit for bit, at every
//! level, carried over calls.

mod common;

use common::Rng;
use flint_hal::{DeltaNetShape, Device, DeviceOptions, HalErrorKind};
use flint_hal_cpu::{CpuDevice, SimdLevel};

fn device(level: SimdLevel) -> CpuDevice {
    let opts = DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    };
    CpuDevice::with_level(&opts, level).expect("open cpu")
}

fn run(dev: &CpuDevice, shape: &DeltaNetShape, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut r = Rng(seed);
    // Uniform in [lo, hi).
    let mut vec = |len: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..len)
            .map(|_| lo + (hi - lo) * (r.f() + 1.0) * 0.5)
            .collect()
    };
    let q = vec(n * shape.qk_len(), -0.3, 0.3);
    let k = vec(n * shape.qk_len(), -0.3, 0.3);
    let v = vec(n * shape.v_len(), -1.0, 1.0);
    let g = vec(n * shape.heads_v, -1.0, 0.0);
    let beta = vec(n * shape.heads_v, 0.0, 1.0);
    let mut state = vec(shape.state_len(), -0.5, 0.5);
    let mut out = vec![0.0; n * shape.v_len()];
    dev.gated_delta_net(
        shape,
        (&q).into(),
        (&k).into(),
        (&v).into(),
        (&g).into(),
        (&beta).into(),
        (&mut state).into(),
        (&mut out).into(),
    )
    .expect("gated_delta_net");
    (out, state)
}

#[test]
fn avx2_delta_rule_equals_scalar_bit_for_bit() {
    if SimdLevel::detect() < SimdLevel::Avx2 {
        eprintln!("no AVX2 on this CPU: the AVX2 delta rule is not used here");
        return;
    }
    let (scalar, avx2) = (device(SimdLevel::Scalar), device(SimdLevel::Avx2));
    let shape = |heads_k, heads_v, head_dim| DeltaNetShape {
        heads_k,
        heads_v,
        head_dim,
    };
    for (i, (s, n)) in [
        (shape(2, 4, 128), 1),
        (shape(2, 4, 128), 5),
        (shape(1, 2, 36), 3),
        (shape(1, 1, 5), 4),
        (shape(3, 3, 40), 1),
    ]
    .into_iter()
    .enumerate()
    {
        let want = run(&scalar, &s, n, i as u64 + 1);
        let got = run(&avx2, &s, n, i as u64 + 1);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&got.0), bits(&want.0), "{s:?}, {n} tokens: outputs");
        assert_eq!(bits(&got.1), bits(&want.1), "{s:?}, {n} tokens: state");
    }
}

#[test]
fn value_heads_not_a_multiple_of_key_heads_are_refused() {
    let dev = device(SimdLevel::Scalar);
    let s = DeltaNetShape {
        heads_k: 2,
        heads_v: 3,
        head_dim: 4,
    };
    let (qk, v, gb) = (vec![0.0; 8], vec![0.0; 12], vec![0.0; 3]);
    let mut state = vec![0.0; s.state_len()];
    let mut out = vec![0.0; s.v_len()];
    let e = dev
        .gated_delta_net(
            &s,
            (&qk).into(),
            (&qk).into(),
            (&v).into(),
            (&gb).into(),
            (&gb).into(),
            (&mut state).into(),
            (&mut out).into(),
        )
        .expect_err("an invalid shape");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
}

#[test]
fn ssm_conv_silu_equals_the_core_reference_bit_for_bit() {
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| *l <= SimdLevel::detect())
        .collect();
    let mut r = Rng(29);
    // Channels with and without a 16-lane tail; one token (twice), a few, and more than a
    // task.
    for (channels, d_conv) in [(37usize, 4usize), (64, 4), (48, 2), (5, 1)] {
        let w = d_conv - 1;
        let weight: Vec<f32> = (0..channels * d_conv).map(|_| r.f()).collect();
        let state0: Vec<f32> = (0..channels * w).map(|_| 2.0 * r.f()).collect();
        let calls: Vec<Vec<f32>> = [1usize, 1, 3, 21]
            .iter()
            .map(|&n| (0..n * channels).map(|_| 4.0 * r.f()).collect())
            .collect();
        // The reference, the window carried from call to call.
        let mut st = state0.clone();
        let want: Vec<Vec<f32>> = calls
            .iter()
            .map(|x| {
                let mut o = vec![0.0f32; x.len()];
                flint_core::math::ssm_conv(x, &weight, d_conv, &mut st, &mut o);
                o.iter().map(|&v| flint_core::math::silu(v)).collect()
            })
            .collect();
        for &level in &levels {
            let dev = device(level);
            let mut st_dev = state0.clone();
            for (c, (x, want)) in calls.iter().zip(&want).enumerate() {
                let mut got = vec![f32::NAN; x.len()];
                dev.ssm_conv_silu(
                    x.into(),
                    (&weight).into(),
                    d_conv,
                    (&mut st_dev).into(),
                    (&mut got).into(),
                )
                .expect("ssm_conv_silu");
                for (i, (g, e)) in got.iter().zip(want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{level:?} channels {channels} d_conv {d_conv} call {c} output {i}: {g} vs {e}"
                    );
                }
            }
            assert_eq!(
                st_dev.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                st.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{level:?} channels {channels}: the carried window"
            );
        }
    }
}
