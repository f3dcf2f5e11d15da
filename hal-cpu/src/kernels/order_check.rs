//! Test helpers for the kernels held to the scalar reference bit for bit (`iq4_nl`,
//! `iq4_xs`, `q3_k`, `q2_k`): a printed seed, random scales and activations, and the
//! check of every tile size against `flint_core::dot::vec_dot`.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_macros, unused_imports)
)]

use bytemuck::Zeroable;
use flint_core::blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ6K, BlockQ8K, BlockQ8_0,
};

use super::x16_check::lcg;

/// The seed of a randomized test: `FLINT_TEST_SEED` if set, else the clock; printed, so
/// that a failure can be replayed.
pub(crate) fn seed(test: &str) -> u64 {
    let s = std::env::var("FLINT_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("{test}: seed {s} (replay with FLINT_TEST_SEED={s})");
    s
}

/// A random normal f16 of either sign, magnitude in about [2^-10, 2^1).
pub(crate) fn f16_scale(s: &mut u64) -> u16 {
    let r = lcg(s) as u16;
    let exp = 5 + (r >> 10) % 11;
    ((r & 0x8000) | (exp << 10)) | (lcg(s) as u16 & 0x3FF)
}

/// A random activation quant in -127..=127 (the range of every Flint quantizer).
fn quant(s: &mut u64) -> i8 {
    ((lcg(s) % 255) as i32 - 127) as i8
}

/// `nb` random Q8_K blocks, with their block sums.
pub(crate) fn q8k_acts(nb: usize, s: &mut u64) -> Vec<BlockQ8K> {
    (0..nb)
        .map(|_| {
            let mut b = BlockQ8K::zeroed();
            b.d = (1 + lcg(s) % 1000) as f32 * 1e-4 * if lcg(s) & 1 == 0 { 1.0 } else { -1.0 };
            b.qs.iter_mut().for_each(|v| *v = quant(s));
            for g in 0..16 {
                b.bsums[g] = b.qs[16 * g..16 * (g + 1)].iter().map(|&v| v as i16).sum();
            }
            b
        })
        .collect()
}

/// `nb` random Q8_0 blocks.
pub(crate) fn q8_0_acts(nb: usize, s: &mut u64) -> Vec<BlockQ8_0> {
    (0..nb)
        .map(|_| BlockQ8_0 {
            d: f16_scale(s),
            qs: std::array::from_fn(|_| quant(s)),
        })
        .collect()
}

/// Whether the CPU has what the AVX-512 VNNI kernels need (AVX-512 F/BW/VL/VNNI and
/// AVX2/FMA/F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vnni_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `nb` random IQ4_NL blocks (random bytes, normal f16 scales of either sign).
pub(crate) fn iq4_nl_weights(nb: usize, s: &mut u64) -> Vec<BlockIQ4NL> {
    (0..nb)
        .map(|_| BlockIQ4NL {
            d: f16_scale(s),
            qs: std::array::from_fn(|_| lcg(s) as u8),
        })
        .collect()
}

/// `nb` random IQ4_XS blocks (random bytes, normal f16 scales of either sign).
pub(crate) fn iq4_xs_weights(nb: usize, s: &mut u64) -> Vec<BlockIQ4XS> {
    (0..nb)
        .map(|_| BlockIQ4XS {
            d: f16_scale(s),
            scales_h: lcg(s) as u16,
            scales_l: std::array::from_fn(|_| lcg(s) as u8),
            qs: std::array::from_fn(|_| lcg(s) as u8),
        })
        .collect()
}

/// `nb` random Q4_K blocks (random bytes, normal f16 scales of either sign).
pub(crate) fn q4_k_weights(nb: usize, s: &mut u64) -> Vec<BlockQ4K> {
    (0..nb)
        .map(|_| BlockQ4K {
            d: f16_scale(s),
            dmin: f16_scale(s),
            scales: std::array::from_fn(|_| lcg(s) as u8),
            qs: std::array::from_fn(|_| lcg(s) as u8),
        })
        .collect()
}

/// `nb` random Q6_K blocks (the extremes of the i8 scales included).
pub(crate) fn q6_k_weights(nb: usize, s: &mut u64) -> Vec<BlockQ6K> {
    (0..nb)
        .map(|_| {
            let mut b = BlockQ6K::zeroed();
            b.ql.iter_mut().for_each(|v| *v = lcg(s) as u8);
            b.qh.iter_mut().for_each(|v| *v = lcg(s) as u8);
            b.scales.iter_mut().for_each(|v| *v = lcg(s) as u8 as i8);
            b.d = f16_scale(s);
            b
        })
        .collect()
}

/// `nb` random Q3_K blocks (random bytes, normal f16 scales of either sign).
pub(crate) fn q3_k_weights(nb: usize, s: &mut u64) -> Vec<BlockQ3K> {
    (0..nb)
        .map(|_| BlockQ3K {
            hmask: std::array::from_fn(|_| lcg(s) as u8),
            qs: std::array::from_fn(|_| lcg(s) as u8),
            scales: std::array::from_fn(|_| lcg(s) as u8),
            d: f16_scale(s),
        })
        .collect()
}

/// `nb` random Q2_K blocks (random bytes, normal f16 scales of either sign).
pub(crate) fn q2_k_weights(nb: usize, s: &mut u64) -> Vec<BlockQ2K> {
    (0..nb)
        .map(|_| BlockQ2K {
            scales: std::array::from_fn(|_| lcg(s) as u8),
            qs: std::array::from_fn(|_| lcg(s) as u8),
            d: f16_scale(s),
            dmin: f16_scale(s),
        })
        .collect()
}

/// The tile kernel `$f::<R>` (one weight row `$w`, `R` activation rows of `$ys`) equals
/// `flint_core::dot::vec_dot` of type `$ty` over `$n` elements bit for bit, for every
/// `R` in 1..=4 and every activation row.
macro_rules! assert_tiles_match_reference {
    ($ty:expr, $f:ident, $w:expr, $ys:expr, $n:expr) => {{
        let (w, ys, n) = ($w, $ys, $n);
        let wb: &[u8] = bytemuck::cast_slice(w);
        let want: Vec<f32> = ys
            .iter()
            .map(|y| {
                flint_core::dot::vec_dot($ty, wb, bytemuck::cast_slice(&y[..]), n)
                    .expect("reference")
            })
            .collect();
        let check = |got: &[f32], first: usize| {
            for (t, g) in got.iter().enumerate() {
                let r = want[first + t];
                assert!(
                    g.to_bits() == r.to_bits(),
                    "{} n={n} tile of {} row {}: {g:e} vs reference {r:e}",
                    $ty,
                    got.len(),
                    first + t
                );
            }
        };
        let mut o1 = [0f32; 1];
        for (t, y) in ys.iter().enumerate() {
            // SAFETY (each call): the caller checked the kernel's CPU features.
            unsafe { $f::<1>(w, &[&y[..]], &mut o1) };
            check(&o1, t);
        }
        let mut o2 = [0f32; 2];
        // SAFETY: as above.
        unsafe { $f::<2>(w, &[&ys[1][..], &ys[2][..]], &mut o2) };
        check(&o2, 1);
        let mut o3 = [0f32; 3];
        // SAFETY: as above.
        unsafe { $f::<3>(w, &[&ys[0][..], &ys[1][..], &ys[2][..]], &mut o3) };
        check(&o3, 0);
        let mut o4 = [0f32; 4];
        // SAFETY: as above.
        unsafe {
            $f::<4>(
                w,
                &[&ys[0][..], &ys[1][..], &ys[2][..], &ys[3][..]],
                &mut o4,
            )
        };
        check(&o4, 0);
    }};
}
pub(crate) use assert_tiles_match_reference;

/// The four-row decode kernel `f` (four weight rows `w`, one activation row `y` of `n`
/// elements) gives each row's `flint_core::dot::vec_dot` of type `ty` bit for bit.
pub(crate) fn assert_rows4_match_reference<B: bytemuck::Pod, A: bytemuck::Pod>(
    ty: flint_core::GgmlType,
    f: unsafe fn([&[B]; 4], &[A], &mut [f32; 4]),
    w: &[Vec<B>; 4],
    y: &[A],
    n: usize,
) {
    let mut got = [0f32; 4];
    // SAFETY: the caller checked the kernel's CPU features.
    unsafe { f(std::array::from_fn(|r| &w[r][..]), y, &mut got) };
    for (r, g) in got.iter().enumerate() {
        let want =
            flint_core::dot::vec_dot(ty, bytemuck::cast_slice(&w[r]), bytemuck::cast_slice(y), n)
                .expect("reference");
        assert!(
            g.to_bits() == want.to_bits(),
            "{ty} n={n} row {r}: {g:e} ({:#010x}) vs reference {want:e} ({:#010x})",
            g.to_bits(),
            want.to_bits()
        );
    }
}

/// Whether the CPU has what the AVX2 kernels need (AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `nb` Q8_K blocks whose quants are all `a` (block sums `16 a`), `d` of either sign.
pub(crate) fn q8k_uniform(nb: usize, a: i8) -> Vec<BlockQ8K> {
    let mut y = vec![BlockQ8K::zeroed(); nb];
    for yb in &mut y {
        yb.d = if a > 0 { 0.0123 } else { -0.0456 };
        yb.qs = [a; 256];
        yb.bsums = [16 * i16::from(a); 16];
    }
    y
}

/// A four-row IQ4_NL kernel at the code book's extremes (-127 and 113 in either nibble)
/// against activations all 127, all -127 and all -128: the largest integer sums of
/// either sign.
pub(crate) fn check_iq4nl_rows4_extremes(
    test: &str,
    f: unsafe fn([&[BlockIQ4NL]; 4], &[BlockQ8_0], &mut [f32; 4]),
) {
    let mut s = seed(test);
    for nb in [1, 8, 9, 17, 33] {
        // Rows: all -127, all 113, and two mixes of the extremes.
        let x: [Vec<BlockIQ4NL>; 4] = std::array::from_fn(|r| {
            (0..nb)
                .map(|i| BlockIQ4NL {
                    d: f16_scale(&mut s),
                    qs: std::array::from_fn(|j| match r {
                        0 => 0x00,
                        1 => 0xFF,
                        2 => [0x0F, 0xF0][(i + j) % 2],
                        _ => [0x00, 0xFF, 0x0F, 0xF0][lcg(&mut s) as usize % 4],
                    }),
                })
                .collect()
        });
        for a in [127i8, -127, -128] {
            let y: Vec<BlockQ8_0> = (0..nb)
                .map(|_| BlockQ8_0 {
                    d: f16_scale(&mut s),
                    qs: [a; 32],
                })
                .collect();
            assert_rows4_match_reference(flint_core::GgmlType::IQ4_NL, f, &x, &y, nb * 32);
        }
    }
}

/// A four-row Q2_K kernel at the extremes of every integer: all quants 3 or 0, scales
/// and mins 15 or 0, the activations all 127, -127 or -128, against random and uniform
/// rows alike.
pub(crate) fn check_q2k_rows4_extremes(
    test: &str,
    f: unsafe fn([&[BlockQ2K]; 4], &[BlockQ8K], &mut [f32; 4]),
) {
    let mut s = seed(test);
    let block = |qs: u8, scales: u8, s: &mut u64| BlockQ2K {
        scales: [scales; 16],
        qs: [qs; 64],
        d: f16_scale(s),
        dmin: f16_scale(s),
    };
    for nb in [1, 3, 16] {
        for a in [127i8, -127, -128] {
            let y = q8k_uniform(nb, a);
            for (qs, scales) in [(0xFF, 0xFF), (0xFF, 0x0F), (0xFF, 0xF0), (0x00, 0xFF)] {
                let x: [Vec<BlockQ2K>; 4] = std::array::from_fn(|r| {
                    if r == 2 {
                        q2_k_weights(nb, &mut s)
                    } else {
                        (0..nb).map(|_| block(qs, scales, &mut s)).collect()
                    }
                });
                assert_rows4_match_reference(flint_core::GgmlType::Q2_K, f, &x, &y, nb * 256);
            }
        }
    }
}

/// A four-row kernel `f` of type `ty` (blocks of `block_elems`) against random rows
/// (`weights`) and activations (`acts`) at each length of `nbs` (`reps` draws each):
/// each row's scalar reference bit for bit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_rows4_random<B: bytemuck::Pod, A: bytemuck::Pod>(
    test: &str,
    ty: flint_core::GgmlType,
    f: unsafe fn([&[B]; 4], &[A], &mut [f32; 4]),
    weights: fn(usize, &mut u64) -> Vec<B>,
    acts: fn(usize, &mut u64) -> Vec<A>,
    block_elems: usize,
    nbs: &[usize],
    reps: usize,
) {
    let mut s = seed(test);
    for &nb in nbs {
        for _ in 0..reps {
            let x: [Vec<B>; 4] = std::array::from_fn(|_| weights(nb, &mut s));
            let y = acts(nb, &mut s);
            assert_rows4_match_reference(ty, f, &x, &y, nb * block_elems);
        }
    }
}
