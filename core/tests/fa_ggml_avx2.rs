//! llama.cpp's flash attention and its softmax in an AVX2 build of ggml (11434), against
//! the core's statement of that build's order ([`GgmlCpuBuild::Avx2`]), bit for bit:
//! `data/fa_ggml/avx2.bin`, written by `tools/golden/fa_ggml_avx2.sh`, whose C harness
//! documents the cases; the inputs are regenerated here with its generator.

use flint_core::math::{
    attend_ggml_one_chunk, attend_ggml_tiled, expf_ggml_avx2, f16_round, soft_max_ggml,
    window_start, GgmlCpuBuild, GGML_FA_TILE_Q,
};

const GOLDEN: &[u8] = include_bytes!("data/fa_ggml/avx2.bin");

mod ggml_harness;
use ggml_harness::{assert_bits, Golden, Rng};

fn exp_case(gold: &mut Golden<'_>) {
    let mut r = Rng(1);
    let x: Vec<f32> = (0..1024)
        .map(|i| {
            let v = r.next();
            match i / 256 {
                0 => v * 4.0,
                1 => v * 40.0 - 40.0,
                2 => v * 30.0 - 110.0,
                _ => v * 100.0,
            }
        })
        .collect();
    let want = gold.take(1024);
    let got: Vec<f32> = x.iter().map(|&v| expf_ggml_avx2(v)).collect();
    assert_bits("ggml_v_expf (AVX2)", &got, &want);
    // The bands reach both special paths: 0 (two factors, then s1 * s1) and infinity.
    assert!(want.contains(&0.0) && want.contains(&f32::INFINITY));
    assert!(x.iter().any(|&v| v < -87.5 && v > -100.0));
}

fn softmax_case(gold: &mut Golden<'_>, seed: u32, n: usize) {
    let mut r = Rng(seed);
    let mut x = r.vec(n, |v| v * 8.0);
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum = soft_max_ggml(GgmlCpuBuild::Avx2, &mut x, max);
    assert_bits(&format!("softmax {seed}"), &x, &gold.take(n));
    let want = gold.take_f64();
    assert_eq!(
        sum.to_bits(),
        want.to_bits(),
        "softmax {seed} sum: {sum} vs ggml {want}"
    );
}

/// The harness's `fa_case`: each query row and head through the core's tiled or
/// one-chunk routine, as llama.cpp picks by the number of query rows.
#[allow(clippy::too_many_arguments)]
fn fa_case(
    gold: &mut Golden<'_>,
    seed: u32,
    (h, hkv, dk, dv): (usize, usize, usize, usize),
    nkv: usize,
    nq: usize,
    scale: f32,
    window: Option<usize>,
    sinks: bool,
) {
    let mut r = Rng(seed);
    let q = r.vec(nq * h * dk, |v| v);
    let k = r.vec(nkv * hkv * dk, f16_round);
    let v = r.vec(nkv * hkv * dv, f16_round);
    let s = r.vec(h, |v| v * 2.0);
    let want = gold.take(nq * h * dv);
    let mut got = vec![0.0f32; nq * h * dv];
    for t in 0..nq {
        let p = nkv - nq + t;
        let first = window_start(p, window);
        for hq in 0..h {
            let g = hq / (h / hkv);
            let keys: Vec<&[f32]> = (first..=p)
                .map(|j| &k[(j * hkv + g) * dk..][..dk])
                .collect();
            let vals: Vec<&[f32]> = (first..=p)
                .map(|j| &v[(j * hkv + g) * dv..][..dv])
                .collect();
            let qh = &q[(t * h + hq) * dk..][..dk];
            let sink = sinks.then_some(s[hq]);
            let o = &mut got[(t * h + hq) * dv..][..dv];
            if nq >= GGML_FA_TILE_Q {
                attend_ggml_tiled(GgmlCpuBuild::Avx2, qh, &keys, &vals, first, scale, sink, o);
            } else {
                attend_ggml_one_chunk(GgmlCpuBuild::Avx2, qh, &keys, &vals, scale, sink, o);
            }
        }
    }
    assert_bits(&format!("flash attention {seed}"), &got, &want);
}

#[test]
fn avx2_build_order_matches_ggml() {
    let mut gold = Golden(GOLDEN);
    exp_case(&mut gold);
    softmax_case(&mut gold, 2, 64);
    softmax_case(&mut gold, 3, 64);
    softmax_case(&mut gold, 4, 70);
    softmax_case(&mut gold, 5, 13);
    fa_case(&mut gold, 6, (2, 1, 64, 32), 100, 100, 0.125, None, false);
    fa_case(&mut gold, 7, (2, 1, 64, 32), 100, 100, 1.0, Some(40), true);
    fa_case(&mut gold, 8, (4, 2, 48, 48), 100, 4, 1.0, None, false);
    fa_case(&mut gold, 9, (4, 2, 64, 64), 100, 4, 1.0, Some(40), true);
    assert!(gold.0.is_empty(), "{} bytes left over", gold.0.len());
}

/// The AVX-512 order is another: on the same tiled case it differs from ggml's AVX2
/// results somewhere (so the comparison above can tell the builds apart).
#[test]
fn avx512_order_differs_from_the_avx2_golden() {
    let mut gold = Golden(GOLDEN);
    let _ = gold.take(1024);
    let mut differs = 0;
    for (seed, n) in [(2, 64), (3, 64), (4, 70), (5, 13)] {
        let mut r = Rng(seed);
        let mut x = r.vec(n, |v| v * 8.0);
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum = soft_max_ggml(GgmlCpuBuild::Avx512, &mut x, max);
        let want = gold.take(n);
        differs += x
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        differs += usize::from(sum.to_bits() != gold.take_f64().to_bits());
    }
    assert!(
        differs > 0,
        "the AVX-512 softmax equals ggml's AVX2 one on every case"
    );
}
