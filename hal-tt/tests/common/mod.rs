//! Shared test helpers: finding the simulated adapter and building weights.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use flint_core::GgmlType;
use flint_hal::{DeviceOptions, View, ViewMut, WeightDesc, WeightKind, WeightSource};
use flint_hal_tt::TtDevice;

/// The simulated adapter `libflint_tt_sim.so`. `flint-tt-sim` is a dev-dependency, so
/// cargo builds its cdylib into the same target directory as this test binary
/// (`target/<profile>/deps/`, and `target/<profile>/` when built directly): the lookup
/// walks up from the test executable. `FLINT_TT_SIM_LIB` overrides it.
pub fn sim_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_TT_SIM_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    for dir in exe.ancestors().skip(1).take(3) {
        let p = dir.join("libflint_tt_sim.so");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "libflint_tt_sim.so not found next to {} (is flint-tt-sim built?)",
        exe.display()
    );
}

/// Host values as a read view.
pub fn h(s: &[f32]) -> View<'_> {
    View::Host(s)
}

/// Host values as a write view.
pub fn hm(s: &mut [f32]) -> ViewMut<'_> {
    ViewMut::Host(s)
}

/// Opens the simulated device with `keep_quant`.
pub fn open_sim(keep_quant: bool) -> TtDevice {
    let opts = DeviceOptions {
        threads: None,
        keep_quant,
    };
    TtDevice::open_path(&sim_path(), &opts).expect("open the simulated device")
}

/// A small deterministic generator (xorshift) for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next_u32() as f32 / u32::MAX as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// `values` (`[in, out, ...]` row-major) encoded as `ty` by the core quantizer.
pub fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    let bytes = ty.row_bytes(values.len()).expect("whole blocks");
    let mut out = vec![0u8; bytes];
    flint_core::quant::quantize(ty, values, &mut out).expect("quantize");
    out
}

/// A weight description of `ty` with `dims` from random values; returns it and the
/// dequantized values the device should compute with.
pub fn weight(
    name: &str,
    ty: GgmlType,
    dims: &[usize],
    kind: WeightKind,
    rng: &mut Rng,
) -> (WeightDesc, Vec<f32>) {
    let n: usize = dims.iter().product();
    let vals = rng.vec(n);
    let bytes = encode(ty, &vals);
    let deq = flint_core::dequant::dequantize_to_vec(ty, &bytes).expect("dequantize");
    let desc = WeightDesc {
        name: name.to_string(),
        ty,
        dims: dims.to_vec(),
        kind,
        data: WeightSource::new(Arc::new(bytes.clone()), 0..bytes.len()).expect("range"),
    };
    (desc, deq)
}

/// `out[i][o] = sum_k w[o][k] x[i][k]` in f64.
pub fn matmul_ref(w: &[f32], in_f: usize, x: &[f32]) -> Vec<f32> {
    let out_f = w.len() / in_f;
    let m = x.len() / in_f;
    let mut out = vec![0.0; m * out_f];
    for i in 0..m {
        for o in 0..out_f {
            out[i * out_f + o] = (0..in_f)
                .map(|k| w[o * in_f + k] as f64 * x[i * in_f + k] as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}

/// Relative RMS error of `got` against `want`.
pub fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Rounds to BF16 (nearest even) and back.
pub fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// The core oracle for a matmul on block weights: each row through
/// `flint_core::dot::matvec_f32_ggml_x86` (activations quantized as ggml pairs them).
pub fn matmul_core(ty: GgmlType, bytes: &[u8], in_f: usize, x: &[f32]) -> Vec<f32> {
    let rb = ty.row_bytes(in_f).expect("whole blocks");
    let out_f = bytes.len() / rb;
    let m = x.len() / in_f;
    let mut out = vec![0.0; m * out_f];
    for i in 0..m {
        // Q4_K, Q6_K, Q8_0 and Q5_0 in llama.cpp's prompt-batch orders, as the simulator
        // (and the CPU backend) sum them; every other type through the core reference.
        flint_core::dot::matvec_f32_ggml_x86(
            ty,
            bytes,
            &x[i * in_f..(i + 1) * in_f],
            &mut out[i * out_f..(i + 1) * out_f],
            flint_core::dot::ggml_x86::BatchRow::IN_BATCH,
        )
        .expect("core dot");
    }
    out
}

/// Expert `e`'s bytes of a tower `[in_f, out_f, E]` of `ty`.
pub fn expert_bytes(ty: GgmlType, bytes: &[u8], in_f: usize, out_f: usize, e: usize) -> &[u8] {
    let per = ty.row_bytes(in_f).expect("whole blocks") * out_f;
    &bytes[e * per..(e + 1) * per]
}
