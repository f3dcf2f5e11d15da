//! Test helpers shared by the repacked-weight kernels (`q4_k::x16`, `q6_k::x16`,
//! `q0::x16`, `mxfp4::x16`): random activations and the check that every row group's outputs equal the file-layout
//! kernel's, bit for bit, for 1 to 4 activation rows.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_macros, unused_imports)
)]

use bytemuck::Zeroable;
use flint_core::blocks::BlockQ8K;

use super::x16::{unpack_all, RowGroup};

/// Rows per packed group.
const ROWS: usize = 16;

/// A 64-bit LCG step; the high bits.
pub(crate) fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *s >> 33
}

/// `nb` Q8_K blocks of random quants (the extremes -128 and 127 included) with their
/// block sums and small positive scales.
pub(crate) fn acts(nb: usize, seed: u64) -> Vec<BlockQ8K> {
    let mut s = seed;
    (0..nb)
        .map(|_| {
            let mut b = BlockQ8K::zeroed();
            b.d = 0.01 + (lcg(&mut s) % 1000) as f32 * 1e-5;
            b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8 as i8);
            for g in 0..16 {
                b.bsums[g] = b.qs[16 * g..16 * (g + 1)].iter().map(|&v| v as i16).sum();
            }
            b
        })
        .collect()
}

/// Four activation rows of `k` values quantized to Q8_0 as the device quantizes them
/// (AVX-512 VNNI level): values in [-1, 1], with row 0 holding one large negative value
/// (its quant at -128) and row 1 one value far larger than the rest.
#[cfg(target_arch = "x86_64")]
pub(crate) fn q8_0_acts(k: usize) -> super::Acts {
    let mut s = 99u64;
    let mut x: Vec<f32> = (0..4 * k)
        .map(|_| (lcg(&mut s) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    x[3] = -7.5;
    x[k + 11] = 300.0;
    super::Acts::new(
        crate::SimdLevel::Avx512Vnni,
        flint_core::GgmlType::Q8_0,
        &x,
        k,
    )
    .expect("quantize")
}

/// `w` (whole rows of `nb` file blocks, a multiple of 16 rows) packed by `pack`.
pub(crate) fn packed<G: RowGroup>(
    w: &[G::Row],
    nb: usize,
    pack: fn(&[G::Row], usize, &mut [G]),
) -> Vec<G> {
    let mut p = vec![G::zeroed(); w.len() / ROWS];
    pack(w, nb, &mut p);
    p
}

/// Packing `w` and unpacking every row group gives `w`'s bytes back.
pub(crate) fn assert_pack_round_trip<G: RowGroup>(
    w: &[G::Row],
    nb: usize,
    pack: fn(&[G::Row], usize, &mut [G]),
) {
    let p = packed(w, nb, pack);
    assert!(bytemuck::cast_slice::<_, u8>(w) == &unpack_all(&p, nb)[..]);
}

/// A packed kernel: a group's `nb` blocks against `y.len()` (1 to 4) activation rows,
/// into `out[a][r]`.
pub(crate) type GroupKernel<'a, X> = &'a dyn Fn(&[X], &[&[BlockQ8K]], &mut [[f32; ROWS]]);

/// For every row group of `packed` (`nb` blocks each) and 1 to 4 of the activation rows
/// `ys`: `kernel`'s output for row `r` and activation row `a` has the bits of
/// `want(r, a)`.
pub(crate) fn assert_groups_equal<X>(
    packed: &[X],
    nb: usize,
    ys: &[Vec<BlockQ8K>],
    kernel: GroupKernel<'_, X>,
    want: &dyn Fn(usize, usize) -> f32,
) {
    for m in 1..=ys.len().min(4) {
        let y: Vec<&[BlockQ8K]> = ys[..m].iter().map(|v| &v[..]).collect();
        for (g, x) in packed.chunks(nb).enumerate() {
            let mut out = vec![[0f32; ROWS]; m];
            kernel(x, &y, &mut out);
            for (a, col) in out.iter().enumerate() {
                for (r, got) in col.iter().enumerate() {
                    let exp = want(g * ROWS + r, a);
                    assert_eq!(
                        got.to_bits(),
                        exp.to_bits(),
                        "M={m} row {} act {a}: {got} vs {exp}",
                        g * ROWS + r
                    );
                }
            }
        }
    }
}

/// A file-layout kernel: one row's blocks against one activation row.
pub(crate) type RowReference<'a, B> = &'a dyn Fn(&[B], &[BlockQ8K]) -> f32;

/// The check of both packed layouts: `w` (whole rows of `nb` file blocks) packed by
/// `pack`, every row group's `kernel` outputs against `reference` (one file-layout row
/// against one activation row) for 1 to 4 random activation rows (seeded from `seed`).
/// Skipped, saying so, on a CPU without AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
pub(crate) fn assert_packed_matches_file_layout<G: RowGroup>(
    w: &[G::Row],
    nb: usize,
    pack: fn(&[G::Row], usize, &mut [G]),
    seed: u64,
    reference: RowReference<'_, G::Row>,
    kernel: GroupKernel<'_, G>,
) {
    if !(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")) {
        eprintln!("skipped: no AVX-512 VNNI on this CPU");
        return;
    }
    let ys: Vec<Vec<BlockQ8K>> = (0..4).map(|a| acts(nb, seed + a)).collect();
    let p = packed(w, nb, pack);
    let want = |r: usize, a: usize| reference(&w[r * nb..(r + 1) * nb], &ys[a]);
    assert_groups_equal(&p, nb, &ys, kernel, &want);
}

/// Calls `$kernel::<M>` with `M = y.len()` (1 to 4) on slices (the tests' dispatch).
macro_rules! dispatch_m {
    ($kernel:ident, $x:expr, $y:expr, $out:expr) => {{
        let (x, y, out) = ($x, $y, $out);
        // SAFETY (each call): the caller checked AVX-512 VNNI.
        match y.len() {
            1 => unsafe { $kernel::<1>(x, [y[0]], out.try_into().expect("1 row")) },
            2 => unsafe { $kernel::<2>(x, [y[0], y[1]], out.try_into().expect("2 rows")) },
            3 => unsafe { $kernel::<3>(x, [y[0], y[1], y[2]], out.try_into().expect("3 rows")) },
            _ => unsafe {
                $kernel::<4>(x, [y[0], y[1], y[2], y[3]], out.try_into().expect("4 rows"))
            },
        }
    }};
}
pub(crate) use dispatch_m;
