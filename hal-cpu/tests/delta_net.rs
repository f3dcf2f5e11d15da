//! The Gated DeltaNet ops of the cpu device: the AVX2 delta rule against the scalar
//! path (`flint_core::math::gated_delta_net`) bit for bit, on head sizes with and without
//! a scalar tail, one token and a prompt, GQA; a shape the device refuses.

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
    dev.gated_delta_net(shape, &q, &k, &v, &g, &beta, &mut state, &mut out)
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
    let mut state = vec![0.0; s.state_len()];
    let mut out = vec![0.0; s.v_len()];
    let e = dev
        .gated_delta_net(
            &s, &[0.0; 8], &[0.0; 8], &[0.0; 12], &[0.0; 3], &[0.0; 3], &mut state, &mut out,
        )
        .expect_err("an invalid shape");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
}
