//! Q5_K x Q8_K and Q6_K x Q8_K in llama.cpp's x86 order for single activation rows
//! (`flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_avx2`, `vec_dot_q6_k_q8_k_avx2`) against
//! ggml itself: the constants are the output of `tools/golden/x86_ggml.sh kquant_x86_ggml`
//! (`ggml_vec_dot_q5_K_q8_K` and `ggml_vec_dot_q6_K_q8_K` from the static libraries of an
//! AVX-512 llama.cpp 11434 build, whose x86 kernels take their AVX2 branches) on the
//! deterministic blocks of [`blocks`], eight blocks a row. llama.cpp computes a decode
//! step's Q5_K and Q6_K matmuls, and an expert that fewer than 8 rows are routed to, so.

mod lcg;

use flint_core::blocks::{BlockQ5K, BlockQ6K, BlockQ8K};
use flint_core::dot::ggml_x86::{vec_dot_q5_k_q8_k_avx2, vec_dot_q6_k_q8_k_avx2};
use lcg::Lcg;

const NB: usize = 8;
const NW: usize = 6;
const NA: usize = 4;

/// `ggml_vec_dot_q5_K_q8_K` on the random blocks, weight row major, then activation row.
const Q5_K: [u32; NW * NA] = [
    0x4692eb00, 0xcba525de, 0x49ef46ba, 0xc84ed954, 0x4b8e9499, 0xcb2c1d84, 0x483da57b, 0xcb19b215,
    0xc7bfdaa2, 0xcbb4de7f, 0x437a3b78, 0xca580e3d, 0xc6495157, 0xc8d9ca98, 0x464705a8, 0xc7aa521c,
    0xc84ef5b9, 0x4c0a6c85, 0xc482a408, 0x4ab27888, 0x4a517a51, 0xcb94715c, 0xc3d8b0bc, 0xcc8af7f3,
];
/// `ggml_vec_dot_q5_K_q8_K` on the Q5_K blocks whose mins dominate.
const Q5_K_MINS: [u32; NW * NA] = [
    0xc8b52203, 0x4a726bdf, 0xc6ec6666, 0xc7c2e77a, 0xc8a7aee7, 0xcb03d8b4, 0xc98f66c5, 0x4a651450,
    0xc9aef950, 0x48717eb5, 0xc8279ab4, 0x49e28067, 0xc9673075, 0x4a2a9809, 0xc7d5bed2, 0x4b0c0114,
    0xc86265d2, 0x4a0969fd, 0xc7d0a534, 0xc9b20e5e, 0xc8bfeb3f, 0x49e23a69, 0xc884d520, 0x4ba056fd,
];
/// `ggml_vec_dot_q6_K_q8_K` on the random blocks, weight row major, then activation row.
const Q6_K: [u32; NW * NA] = [
    0x4b57397a, 0x4cf96acc, 0xc9e959c8, 0x4ab62f10, 0xc7bebad6, 0xca119474, 0x4aac9c0b, 0x49170622,
    0x48118310, 0x4ac00cde, 0x49103f78, 0xccf9b3eb, 0x48f9cf40, 0xc9ac9ffa, 0xc77d3d50, 0x4b50530b,
    0xcb8f894a, 0x43c42008, 0x45f7963d, 0x4d002e4e, 0x474a1b0d, 0xc9b52e38, 0xc8b4870c, 0x4980f398,
];

/// A positive normal f16 between 2^-14 and 2^3 with a random mantissa
/// (`kquant_x86_ggml.c`'s `scale16`).
fn scale16(g: &mut Lcg) -> u16 {
    let k = g.next16();
    (((1 + k % 18) << 10) | (g.next16() & 0x3ff)) as u16
}

/// A Q5_K block with scales `d` and `dmin`, its scales, fifth bits and codes drawn from
/// `g` in that order.
fn q5k_block(g: &mut Lcg, d: u16, dmin: u16) -> BlockQ5K {
    let mut x = BlockQ5K {
        d,
        dmin,
        scales: [0; 12],
        qh: [0; 32],
        qs: [0; 128],
    };
    for v in x.scales.iter_mut().chain(&mut x.qh).chain(&mut x.qs) {
        *v = g.next16() as u8;
    }
    x
}

/// The blocks of `kquant_x86_ggml.c`, in its order: Q5_K weights (random codes, scales,
/// mins and fifth bits), Q6_K weights (random codes and signed scales), Q5_K weights whose
/// mins dominate (`d` the smallest normal f16, `dmin` 2^1 to 2^4: the result is mostly the
/// mins' f32 sum, whose fused multiply-add shows), then Q8_K activations (quants in
/// -127..=127 with their group sums, scales 2^-20 to 2^4).
/// The weight and activation rows of `kquant_x86_ggml.c`.
struct Blocks {
    w5: Vec<Vec<BlockQ5K>>,
    w6: Vec<Vec<BlockQ6K>>,
    w5m: Vec<Vec<BlockQ5K>>,
    a: Vec<Vec<BlockQ8K>>,
}

fn blocks() -> Blocks {
    let mut g = Lcg(2718);
    let w5 = (0..NW)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let d = scale16(&mut g);
                    let dmin = scale16(&mut g);
                    q5k_block(&mut g, d, dmin)
                })
                .collect()
        })
        .collect();
    let w6 = (0..NW)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let mut x = BlockQ6K {
                        ql: [0; 128],
                        qh: [0; 64],
                        scales: [0; 16],
                        d: 0,
                    };
                    for v in x.ql.iter_mut().chain(&mut x.qh) {
                        *v = g.next16() as u8;
                    }
                    for v in &mut x.scales {
                        *v = (g.next16() & 0xff) as u8 as i8;
                    }
                    x.d = scale16(&mut g);
                    x
                })
                .collect()
        })
        .collect();
    let w5m = (0..NW)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let e = 16 + g.next16() % 4;
                    let dmin = ((e << 10) | (g.next16() & 0x3ff)) as u16;
                    q5k_block(&mut g, 0x0400, dmin)
                })
                .collect()
        })
        .collect();
    let a = (0..NA)
        .map(|_| {
            (0..NB)
                .map(|_| {
                    let k = g.next16();
                    let m = 1.0f32 + (g.next16() & 0xffff) as f32 / 65536.0;
                    let e = (k % 25) as i32 - 20;
                    let d = m * f32::from_bits(((127 + e) as u32) << 23);
                    let mut y = BlockQ8K {
                        d,
                        qs: [0; 256],
                        bsums: [0; 16],
                    };
                    for gi in 0..16 {
                        let mut sum = 0i32;
                        for j in 0..16 {
                            let q = (g.next16() % 255) as i32 - 127;
                            y.qs[16 * gi + j] = q as i8;
                            sum += q;
                        }
                        y.bsums[gi] = sum as i16;
                    }
                    y
                })
                .collect()
        })
        .collect();
    Blocks { w5, w6, w5m, a }
}

fn check(name: &str, want: &[u32], got: impl Fn(usize, usize) -> f32) {
    let mut bad = Vec::new();
    for r in 0..NW {
        for c in 0..NA {
            let g = got(r, c);
            let w = f32::from_bits(want[r * NA + c]);
            if g.to_bits() != w.to_bits() {
                bad.push(format!("row {r} act {c}: {g:e} vs ggml {w:e}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} differ: {bad:?}",
        bad.len(),
        NW * NA
    );
}

#[test]
fn q5_k_single_rows_are_ggmls_x86_vec_dot() {
    let b = blocks();
    check("Q5_K", &Q5_K, |r, c| {
        vec_dot_q5_k_q8_k_avx2(&b.w5[r], &b.a[c])
    });
    check("Q5_K, mins dominating", &Q5_K_MINS, |r, c| {
        vec_dot_q5_k_q8_k_avx2(&b.w5m[r], &b.a[c])
    });
}

#[test]
fn q6_k_single_rows_are_ggmls_x86_vec_dot() {
    let b = blocks();
    check("Q6_K", &Q6_K, |r, c| {
        vec_dot_q6_k_q8_k_avx2(&b.w6[r], &b.a[c])
    });
}
