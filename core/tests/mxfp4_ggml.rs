//! MXFP4 x Q8_0 in llama.cpp's x86 orders (`flint_core::dot::ggml_x86`) against ggml
//! itself: the constants are the output of `tools/golden/x86_ggml.sh mxfp4_ggml` (ggml's
//! `ggml_vec_dot_mxfp4_q8_0` and the repacked `mxfp4_8x8` gemv and gemm from the static
//! libraries of an AVX-512 llama.cpp 11434 build) on the deterministic blocks of
//! [`blocks`], five blocks a row (an odd count: the vec_dot's unpaired last block).

mod lcg;

use flint_core::blocks::{BlockMXFP4, BlockQ8_0};
use flint_core::dot::ggml_x86::BatchRow;
use flint_core::dot::ggml_x86::{vec_dot_mxfp4_q8_0_avx2, vec_dot_mxfp4_q8_0_repack};
use flint_core::dot::{matvec_f32_ggml_x86, vec_dot_mxfp4_q8_0};
use flint_core::GgmlType;
use lcg::Lcg;

const NB: usize = 5;
const NW: usize = 8;
const NA: usize = 4;

/// `ggml_vec_dot_mxfp4_q8_0` on the random blocks, weight row major, then activation row.
const VEC_DOT: [u32; NW * NA] = [
    0xc7e21bab, 0xc71a78df, 0x4b3fa068, 0x477a4efa, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xffc00000, 0xffc00000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xffc00000, 0x4298174c, 0x4325be6d, 0x4a3bb9c4, 0xc440f02c,
    0xc7cc4400, 0xc5a41130, 0x4910f579, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc3,
];
/// `ggml_gemv_mxfp4_8x8_q8_0` on the random blocks, one activation row at a time.
const GEMV: [u32; NW * NA] = [
    0xc7e21bac, 0xc71a78df, 0x4b3fa068, 0x477a4efc, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xff800000, 0x7f800000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xff800000, 0x4298174d, 0x4325be6d, 0x4a3bb9c4, 0xc440f02e,
    0xc7cc4400, 0xc5a41130, 0x4910f57a, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc4,
];
/// `ggml_gemm_mxfp4_8x8_q8_0` on the random blocks, the four activation rows together.
const GEMM: [u32; NW * NA] = [
    0xc7e21bac, 0xc71a78df, 0x4b3fa068, 0x477a4efc, 0xcb239aff, 0xc9b576c0, 0x4df6e1ec, 0xcb83fdea,
    0x463c3af2, 0xc461780c, 0x4978d02d, 0xc78fb1b1, 0x7f0aa380, 0x7ed621c0, 0xff800000, 0x7f800000,
    0x7f800000, 0x7ef88980, 0x7e97d368, 0xff800000, 0x4298174d, 0x4325be6d, 0x4a3bb9c4, 0xc440f02e,
    0xc7cc4400, 0xc5a41130, 0x4910f57a, 0xca36d33d, 0x4912ebd6, 0xc7bb5952, 0xcbd8af15, 0xcadbdbc4,
];
/// `ggml_vec_dot_mxfp4_q8_0` on the large block sums, weight row major, then activation row.
const VEC_DOT_LARGE: [u32; NW * NA] = [
    0x4577b818, 0x45f09380, 0x4645bba6, 0x4628e84d, 0x45eb8778, 0x462737e3, 0x468c3ad0, 0x466c4a2a,
    0xc482ab80, 0x4533564a, 0x46074509, 0x4638a06c, 0x46e04fca, 0x46e4ac38, 0x470289bb, 0x470016d4,
    0x4698700c, 0x46af6ada, 0x46a3164c, 0x46c4dff2, 0x460db820, 0x46127546, 0x4692bf19, 0x466acd80,
    0xc5cdfba0, 0xc523f3a0, 0x45885458, 0x45d042e7, 0x4604f250, 0x4630c12c, 0x46a0f7b8, 0x467ce554,
];
/// `ggml_gemv_mxfp4_8x8_q8_0` on the large block sums, one activation row at a time.
const GEMV_LARGE: [u32; NW * NA] = [
    0x4577b818, 0x45f0937e, 0x4645bba6, 0x4628e84d, 0x45eb8778, 0x462737e3, 0x468c3ad0, 0x466c4a2a,
    0xc482ab80, 0x4533564e, 0x46074509, 0x4638a06c, 0x46e04fc9, 0x46e4ac3a, 0x470289bc, 0x470016d4,
    0x4698700c, 0x46af6adb, 0x46a3164c, 0x46c4dff2, 0x460db821, 0x46127548, 0x4692bf19, 0x466acd80,
    0xc5cdfba0, 0xc523f3a0, 0x45885458, 0x45d042e7, 0x4604f250, 0x4630c12b, 0x46a0f7b8, 0x467ce554,
];
/// `ggml_gemm_mxfp4_8x8_q8_0` on the large block sums, the four activation rows together.
const GEMM_LARGE: [u32; NW * NA] = [
    0x4577b818, 0x45f0937e, 0x4645bba6, 0x4628e84d, 0x45eb8778, 0x462737e3, 0x468c3ad0, 0x466c4a2a,
    0xc482ab80, 0x4533564e, 0x46074509, 0x4638a06c, 0x46e04fc9, 0x46e4ac3a, 0x470289bc, 0x470016d4,
    0x4698700c, 0x46af6adb, 0x46a3164c, 0x46c4dff2, 0x460db821, 0x46127548, 0x4692bf19, 0x466acd80,
    0xc5cdfba0, 0xc523f3a0, 0x45885458, 0x45d042e7, 0x4604f250, 0x4630c12b, 0x46a0f7b8, 0x467ce554,
];

type Blocks = (Vec<Vec<BlockMXFP4>>, Vec<Vec<BlockQ8_0>>);

/// The two sets of `mxfp4_ggml.c`, in its order: random blocks (exponents 112..143 with
/// the codes 0, 1 and 254 mixed in, which give infinities and NaNs in some outputs), then
/// large block sums (positive codes 5..7 against quants of magnitude 64..127, positive in
/// even blocks and negative in odd ones, scales of one magnitude, so that
/// `sum * D(e) * d_a` is inexact and the blocks cancel in the accumulator: a fused
/// multiply-add shows).
fn blocks() -> [Blocks; 2] {
    let mut g = Lcg(12345);
    let mut set = |large: bool| -> Blocks {
        let w = (0..NW)
            .map(|_| {
                (0..NB)
                    .map(|_| {
                        let k = g.next16();
                        let e = match (large, k % 16) {
                            (true, _) => (126 + k % 2) as u8,
                            (false, 0) => (k / 16 % 2) as u8,
                            (false, 1) => 254,
                            (false, _) => (112 + k / 16 % 32) as u8,
                        };
                        let qs = core::array::from_fn(|_| {
                            let q = g.next16();
                            if large {
                                ((5 + q % 3) | ((5 + q / 3 % 3) << 4)) as u8
                            } else {
                                q as u8
                            }
                        });
                        BlockMXFP4 { e, qs }
                    })
                    .collect()
            })
            .collect();
        let a = (0..NA)
            .map(|_| {
                (0..NB)
                    .map(|b| {
                        let k = g.next16();
                        let exp = if large { 15 } else { 1 + k % 18 };
                        let d = ((exp << 10) | (g.next16() & 0x3ff)) as u16;
                        let sign = if b % 2 == 1 { -1 } else { 1 };
                        let qs = core::array::from_fn(|_| {
                            let q = g.next16();
                            if large {
                                (sign * (64 + q % 64) as i32) as i8
                            } else {
                                ((q % 255) as i32 - 127) as i8
                            }
                        });
                        BlockQ8_0 { d, qs }
                    })
                    .collect()
            })
            .collect();
        (w, a)
    };
    let random = set(false);
    [random, set(true)]
}

fn check(name: &str, set: usize, want: &[u32], f: impl Fn(&[BlockMXFP4], &[BlockQ8_0]) -> f32) {
    let (w, a) = &blocks()[set];
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
    check("gemv", 0, &GEMV, vec_dot_mxfp4_q8_0_repack);
    check("gemm", 0, &GEMM, vec_dot_mxfp4_q8_0_repack);
    check("gemv large", 1, &GEMV_LARGE, vec_dot_mxfp4_q8_0_repack);
    check("gemm large", 1, &GEMM_LARGE, vec_dot_mxfp4_q8_0_repack);
}

#[test]
fn avx2_order_equals_ggml_vec_dot() {
    check("vec_dot", 0, &VEC_DOT, vec_dot_mxfp4_q8_0_avx2);
    check("vec_dot large", 1, &VEC_DOT_LARGE, vec_dot_mxfp4_q8_0_avx2);
}

#[test]
fn the_blocks_tell_the_orders_apart() {
    // Were two orders equal on every output of a set, the tests above would not show
    // which of them ggml follows. The random blocks separate the lanes of the vec_dot
    // from the repacked order's single accumulator; the large block sums separate the
    // repacked order's `fma(sum, d, acc)` from the generic kernel's `acc + d * sum`
    // (`vec_dot_mxfp4_q8_0`, which they agree with wherever `d * sum` is exact).
    let count = |set: usize, f: fn(&[BlockMXFP4], &[BlockQ8_0]) -> f32| {
        let (w, a) = &blocks()[set];
        let mut differ = 0;
        for r in 0..NW {
            for c in 0..NA {
                let rep = vec_dot_mxfp4_q8_0_repack(&w[r], &a[c]).to_bits();
                differ += usize::from(rep != f(&w[r], &a[c]).to_bits());
            }
        }
        differ
    };
    assert!(
        count(0, vec_dot_mxfp4_q8_0_avx2) > 0,
        "lanes not told apart"
    );
    assert!(count(1, vec_dot_mxfp4_q8_0) > 0, "fma not told apart");
}

#[test]
fn matvec_takes_the_repacked_order_for_any_rows() {
    let (w, _) = &blocks()[0];
    let bytes: Vec<u8> = w
        .iter()
        .flatten()
        .flat_map(bytemuck::bytes_of)
        .copied()
        .collect();
    let x: Vec<f32> = (0..NB * 32)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0)
        .collect();
    let mut act = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; NB];
    flint_core::quant::quantize_row_q8_0_act(&x, &mut act);
    let row = bytes.len() / NW;
    for (rows, at) in [(NW, BatchRow::SINGLE), (NW - 1, BatchRow::IN_BATCH)] {
        let mut out = vec![0f32; rows];
        matvec_f32_ggml_x86(GgmlType::MXFP4, &bytes[..rows * row], &x, &mut out, at).unwrap();
        for r in 0..rows {
            assert_eq!(
                out[r].to_bits(),
                vec_dot_mxfp4_q8_0_repack(&w[r], &act).to_bits()
            );
        }
    }
}
