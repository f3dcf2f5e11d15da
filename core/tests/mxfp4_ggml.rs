//! MXFP4 x Q8_0 in llama.cpp's x86 orders (`flint_core::dot::ggml_x86`) against ggml
//! itself: the constants are the output of `tools/golden/mxfp4_ggml.sh` (ggml's
//! `ggml_vec_dot_mxfp4_q8_0` and the repacked `mxfp4_8x8` gemv and gemm from the static
//! libraries of an AVX-512 llama.cpp 11434 build) on the deterministic blocks below.

use flint_core::blocks::{BlockMXFP4, BlockQ8_0};
use flint_core::dot::ggml_x86::{vec_dot_mxfp4_q8_0_avx2, vec_dot_mxfp4_q8_0_repack};
use flint_core::dot::matvec_f32_ggml_x86;

const NB: usize = 5;
const NW: usize = 8;
const NA: usize = 4;

/// `ggml_vec_dot_mxfp4_q8_0`, weight row major, then activation row.
const VEC_DOT: [u32; NW * NA] = [
    0xc7e21bab, 0xc71a78df, 0x4b3fa068, 0x477a4efa, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xffc00000, 0xffc00000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xffc00000, 0x4298174c, 0x4325be6d, 0x4a3bb9c4, 0xc440f02c,
    0xc7cc4400, 0xc5a41130, 0x4910f579, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc3,
];
/// `ggml_gemv_mxfp4_8x8_q8_0`, one activation row at a time.
const GEMV: [u32; NW * NA] = [
    0xc7e21bac, 0xc71a78df, 0x4b3fa068, 0x477a4efc, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xff800000, 0x7f800000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xff800000, 0x4298174d, 0x4325be6d, 0x4a3bb9c4, 0xc440f02e,
    0xc7cc4400, 0xc5a41130, 0x4910f57a, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc4,
];
/// `ggml_gemm_mxfp4_8x8_q8_0`, the four activation rows together.
const GEMM: [u32; NW * NA] = [
    0xc7e21bac, 0xc71a78df, 0x4b3fa068, 0x477a4efc, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xff800000, 0x7f800000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xff800000, 0x4298174d, 0x4325be6d, 0x4a3bb9c4, 0xc440f02e,
    0xc7cc4400, 0xc5a41130, 0x4910f57a, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc4,
];

/// The generator of `mxfp4_ggml.c`: a 32-bit LCG, its top 16 bits.
struct Lcg(u32);
impl Lcg {
    fn next16(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1103515245).wrapping_add(12345);
        self.0 >> 16
    }
}

fn blocks() -> (Vec<Vec<BlockMXFP4>>, Vec<Vec<BlockQ8_0>>) {
    let mut g = Lcg(12345);
    let w = (0..NW)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let k = g.next16();
                    let e = match k % 16 {
                        0 => (k / 16 % 2) as u8,
                        1 => 254,
                        _ => (112 + k / 16 % 32) as u8,
                    };
                    let qs = core::array::from_fn(|_| g.next16() as u8);
                    BlockMXFP4 { e, qs }
                })
                .collect()
        })
        .collect();
    let a = (0..NA)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let k = g.next16();
                    let d = (((1 + k % 18) << 10) | (g.next16() & 0x3ff)) as u16;
                    let qs = core::array::from_fn(|_| ((g.next16() % 255) as i32 - 127) as i8);
                    BlockQ8_0 { d, qs }
                })
                .collect()
        })
        .collect();
    (w, a)
}

fn check(name: &str, want: &[u32], f: impl Fn(&[BlockMXFP4], &[BlockQ8_0]) -> f32) {
    let (w, a) = blocks();
    for r in 0..NW {
        for c in 0..NA {
            let got = f(&w[r], &a[c]);
            assert_eq!(
                got.to_bits(),
                want[r * NA + c],
                "{name}: weight row {r}, activation row {c}: {got} vs {}",
                f32::from_bits(want[r * NA + c])
            );
        }
    }
}

#[test]
fn repack_order_equals_ggml_gemv_and_gemm() {
    check("gemv", &GEMV, vec_dot_mxfp4_q8_0_repack);
    check("gemm", &GEMM, vec_dot_mxfp4_q8_0_repack);
}

#[test]
fn avx2_order_equals_ggml_vec_dot() {
    check("vec_dot", &VEC_DOT, vec_dot_mxfp4_q8_0_avx2);
}

#[test]
fn the_vec_dot_order_differs_from_the_repacked_one() {
    // The blocks tell the two ggml orders apart (else the tests above would prove
    // nothing about the lanes). The repacked order rounds once per block as the generic
    // kernel (`vec_dot_mxfp4_q8_0`) does; its `fma` differs from the generic
    // `acc + d * sum` only where `d * sum` is inexact (more than 24 significant bits, or
    // subnormal), which these few blocks do not hit.
    let (w, a) = blocks();
    let mut differ = 0;
    for r in 0..NW {
        for c in 0..NA {
            let rep = vec_dot_mxfp4_q8_0_repack(&w[r], &a[c]).to_bits();
            let avx = vec_dot_mxfp4_q8_0_avx2(&w[r], &a[c]).to_bits();
            differ += usize::from(rep != avx);
        }
    }
    assert!(differ > 0, "the orders agree on every output");
}

#[test]
fn matvec_picks_the_repacked_order_for_multiples_of_8_rows() {
    let (w, _) = blocks();
    let bytes: Vec<u8> = w.iter().flatten().flat_map(bytemuck::bytes_of).copied().collect();
    let x: Vec<f32> = (0..NB * 32).map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0).collect();
    let mut act = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; NB];
    flint_core::quant::quantize_row_q8_0_act(&x, &mut act);
    let at = flint_core::dot::ggml_x86::BatchRow::SINGLE;
    let mut out8 = vec![0f32; NW];
    matvec_f32_ggml_x86(flint_core::GgmlType::MXFP4, &bytes, &x, &mut out8, at).unwrap();
    let row = bytes.len() / NW;
    let mut out7 = vec![0f32; NW - 1];
    matvec_f32_ggml_x86(flint_core::GgmlType::MXFP4, &bytes[..7 * row], &x, &mut out7, at)
        .unwrap();
    for r in 0..NW {
        assert_eq!(out8[r].to_bits(), vec_dot_mxfp4_q8_0_repack(&w[r], &act).to_bits());
        if r < NW - 1 {
            assert_eq!(out7[r].to_bits(), vec_dot_mxfp4_q8_0_avx2(&w[r], &act).to_bits());
        }
    }
}
