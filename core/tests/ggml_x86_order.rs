//! The llama.cpp x86 orders of `flint_core::dot::ggml_x86` and the glibc functions of
//! `flint_core::math`: the same maths as the generic paths (only roundings differ),
//! and the summation orders they document. Their bit-exactness against llama.cpp's own
//! output is checked on the real model in `engine/tests/gemma_op_parity.rs`.

use flint_core::dot::ggml_x86::{hsum8, BatchRow};
use flint_core::dot::{matvec_f32, matvec_f32_ggml_x86};
use flint_core::math::{cosf_glibc, expf_libc, sinf_glibc};
use flint_core::{quantize, GgmlType};

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn sym(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Distance in ulps between two finite f32 of the same sign.
fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        0
    } else if a.is_sign_negative() != b.is_sign_negative() {
        u32::MAX
    } else {
        a.to_bits().abs_diff(b.to_bits())
    }
}

#[test]
fn hsum8_adds_high_half_onto_low_then_pairs() {
    // Values where the order decides the result: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
    let v = [1e8f32, 1.0, 3.0, 0.5, -1e8, 1.0, 0.25, 0.5];
    let want = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    assert_eq!(hsum8(v), want);
    assert_eq!(want, 6.25);
    // A left-to-right sum loses the small terms next to 1e8.
    assert_ne!(v.iter().fold(0.0f32, |s, &x| s + x), want);
}

#[test]
fn x86_orders_agree_with_the_generic_kernels_to_rounding() {
    let mut rng = Rng(3);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
        GgmlType::Q4_K,
    ] {
        let (k, n) = (2048, 16);
        let w: Vec<f32> = (0..k * n).map(|_| rng.sym()).collect();
        let mut wq = vec![0u8; ty.row_bytes(k).expect("row") * n];
        quantize(ty, &w, &mut wq).expect("quantize");
        let x: Vec<f32> = (0..k).map(|_| rng.sym()).collect();
        let mut generic = vec![0f32; n];
        matvec_f32(ty, &wq, &x, &mut generic).expect("generic");
        let scale: f32 = x.iter().map(|v| v.abs()).sum();
        let mut differs = 0;
        for at in [BatchRow::IN_BATCH, BatchRow::SINGLE] {
            let mut ours = vec![0f32; n];
            matvec_f32_ggml_x86(ty, &wq, &x, &mut ours, at).expect("x86 order");
            for (a, b) in ours.iter().zip(&generic) {
                // Same integer sums, other float roundings: a few ulp of the terms.
                assert!((a - b).abs() <= 1e-5 * scale, "{ty}: {a} vs generic {b}");
                differs += (a != b) as usize;
            }
        }
        eprintln!(
            "{ty}: {differs} of {} outputs differ from the generic order in the last bits",
            2 * n
        );
    }
}

#[test]
fn q4_k_gemm_and_gemv_orders_differ_only_in_rounding() {
    let mut rng = Rng(5);
    let (k, n) = (4096, 32);
    let w: Vec<f32> = (0..k * n).map(|_| rng.sym()).collect();
    let mut wq = vec![0u8; GgmlType::Q4_K.row_bytes(k).expect("row") * n];
    quantize(GgmlType::Q4_K, &w, &mut wq).expect("quantize");
    let x: Vec<f32> = (0..k).map(|_| rng.sym()).collect();
    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
    matvec_f32_ggml_x86(GgmlType::Q4_K, &wq, &x, &mut a, BatchRow::IN_BATCH).expect("gemm");
    matvec_f32_ggml_x86(GgmlType::Q4_K, &wq, &x, &mut b, BatchRow::SINGLE).expect("gemv");
    let scale: f32 = x.iter().map(|v| v.abs()).sum();
    let mut differ = 0;
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= 1e-5 * scale);
        differ += (p != q) as usize;
    }
    // One rounding per 64 values against one per 256: they must not always agree, or
    // the two paths would be the same function.
    assert!(
        differ > 0,
        "gemm and gemv orders gave identical results on 32 rows"
    );
}

#[test]
fn glibc_sin_cos_exp_are_within_half_an_ulp_or_so() {
    // Angles of RoPE (up to a few thousand radians, through both reductions) and the
    // small arguments of the softmax rescale.
    let mut x = 1e-6f32;
    while x < 5000.0 {
        for v in [x, -x] {
            let (s, c) = (sinf_glibc(v), cosf_glibc(v));
            let (ws, wc) = ((v as f64).sin() as f32, (v as f64).cos() as f32);
            assert!(
                ulps(s, ws) <= 1 || (s - ws).abs() < 1e-7,
                "sinf({v}) = {s}, want {ws}"
            );
            assert!(
                ulps(c, wc) <= 1 || (c - wc).abs() < 1e-7,
                "cosf({v}) = {c}, want {wc}"
            );
        }
        x *= 1.01;
    }
    let mut x = -100.0f32;
    while x < 88.0 {
        let (e, w) = (expf_libc(x), (x as f64).exp() as f32);
        assert!(ulps(e, w) <= 1, "expf({x}) = {e}, want {w}");
        x += 0.0137;
    }
    assert_eq!(expf_libc(0.0), 1.0);
    assert_eq!(expf_libc(f32::NEG_INFINITY), 0.0);
    assert_eq!(expf_libc(100.0), f32::INFINITY);
    assert_eq!(sinf_glibc(0.0), 0.0);
    assert_eq!(cosf_glibc(0.0), 1.0);
    assert!(sinf_glibc(f32::NAN).is_nan());
}

/// tinyBLAS's F32 order (llama.cpp's F32 matmul on an AVX-512 build, e.g. a MoE router):
/// sixteen lanes, lane `l` the FMA chain over elements `l (mod 16)`, then
/// `_mm512_reduce_add_ps` (lanes `i + 8` onto `i`, `i + 4` onto `i`, then
/// `(u0 + u2) + (u1 + u3)`). Values where that order decides the result: 2^24 in lane 0
/// absorbs the 1 of element 16 (same lane, fused: 2^24 + 1 rounds to even) and, after
/// the reduction adds lane 2's 1 to it (`u0 + u2`), lane 1's 1 (`u1`); an f64 sum keeps
/// all three (2^24 + 3 rounds to 2^24 + 4).
#[test]
fn f32_tinyblas_order_is_sixteen_fma_lanes_reduced_pairwise() {
    use flint_core::dot::ggml_x86::{vec_dot_f32_ggml, vec_dot_f32_tinyblas};
    use flint_core::math::GgmlCpuBuild;
    let mut w = vec![0.0f32; 40];
    w[0] = 16_777_216.0;
    w[1] = 1.0;
    w[2] = 1.0;
    w[16] = 1.0;
    let x = vec![1.0f32; 40];
    assert_eq!(
        vec_dot_f32_tinyblas(GgmlCpuBuild::Avx512, &w, &x),
        16_777_216.0
    );
    assert_eq!(flint_core::dot::vec_dot_f32(&w, &x), 16_777_220.0);
    // The partial last vector (elements 32..40) goes into lanes 0..8: element 33 joins
    // lane 1's chain, which then holds 2; `u0 + u2` still drops lane 2's 1, and
    // `2^24 + u1` = 2^24 + 2 is exact.
    w[33] = 1.0;
    assert_eq!(
        vec_dot_f32_tinyblas(GgmlCpuBuild::Avx512, &w, &x),
        16_777_218.0
    );
    // Random rows: within rounding of the f64 sum, and the batch matvec takes this
    // order for F32 weights, single rows and expert rows `ggml_vec_dot_f32`'s.
    let mut rng = Rng(5);
    for k in [16usize, 17, 256, 300] {
        let w: Vec<f32> = (0..4 * k).map(|_| rng.sym()).collect();
        let x: Vec<f32> = (0..k).map(|_| rng.sym()).collect();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (mut batch, mut single, mut expert, mut generic) =
            (vec![0f32; 4], vec![0f32; 4], vec![0f32; 4], vec![0f32; 4]);
        matvec_f32_ggml_x86(GgmlType::F32, &bytes, &x, &mut batch, BatchRow::IN_BATCH)
            .expect("batch");
        matvec_f32_ggml_x86(GgmlType::F32, &bytes, &x, &mut single, BatchRow::SINGLE)
            .expect("single");
        matvec_f32_ggml_x86(GgmlType::F32, &bytes, &x, &mut expert, BatchRow::expert(64))
            .expect("expert");
        matvec_f32(GgmlType::F32, &bytes, &x, &mut generic).expect("generic");
        for (o, wr) in w.chunks(k).enumerate() {
            assert_eq!(
                batch[o].to_bits(),
                vec_dot_f32_tinyblas(GgmlCpuBuild::Avx512, wr, &x).to_bits()
            );
            assert!(
                (batch[o] - generic[o]).abs() <= 1e-5,
                "k {k}: {batch:?} vs {generic:?}"
            );
        }
        for (o, wr) in w.chunks(k).enumerate() {
            let v = vec_dot_f32_ggml(GgmlCpuBuild::Avx512, wr, &x);
            assert_eq!(single[o].to_bits(), v.to_bits(), "k {k} row {o}");
            assert_eq!(expert[o].to_bits(), v.to_bits(), "k {k} row {o}");
        }
    }
}

/// `ggml_vec_dot_f32`'s order (llama.cpp's F32 matmul for one activation row and for
/// `MUL_MAT_ID`, e.g. a MoE router in a decode step): four accumulators of sixteen lanes
/// over steps of 64 (element `e` in accumulator `(e mod 64) / 16`, lane `e mod 16`), the
/// accumulators added per lane as `(0 + 2) + (1 + 3)`, the lanes as
/// `_mm512_reduce_add_ps`, then the elements after the last step one by one. Values where
/// that order decides: 2^24 in accumulator 0 lane 0 absorbs accumulator 2's 1 (2^24 + 1
/// rounds to even), then takes accumulators 1 and 3 as one exact 2 (2^24 + 2); tinyBLAS
/// chains all four in one lane (2^24); an f64 sum gives 2^24 + 3, rounded to 2^24 + 4.
#[test]
fn f32_vec_dot_order_is_four_accumulators_of_sixteen_lanes() {
    use flint_core::dot::ggml_x86::{vec_dot_f32_ggml, vec_dot_f32_tinyblas};
    use flint_core::math::GgmlCpuBuild;
    let mut w = vec![0.0f32; 64];
    w[0] = 16_777_216.0;
    w[16] = 1.0;
    w[32] = 1.0;
    w[48] = 1.0;
    let x = vec![1.0f32; 64];
    assert_eq!(vec_dot_f32_ggml(GgmlCpuBuild::Avx512, &w, &x), 16_777_218.0);
    assert_eq!(
        vec_dot_f32_tinyblas(GgmlCpuBuild::Avx512, &w, &x),
        16_777_216.0
    );
    assert_eq!(flint_core::dot::vec_dot_f32(&w, &x), 16_777_220.0);
    // The AVX2 build (steps of 32, eight lanes) puts element 32 into 2^24's chain (lost
    // to rounding) and elements 16 and 48 into accumulator 2 (an exact 2):
    // `(0 + 2)` = 2^24 + 2.
    assert_eq!(vec_dot_f32_ggml(GgmlCpuBuild::Avx2, &w, &x), 16_777_218.0);
    // Past the last whole step each product is added to the running f32 sum: 2^24 + 2
    // then + 1 is a tie, rounded to even (2^24 + 4); + 0.5 more is lost.
    let mut w70 = w.clone();
    w70.extend([1.0, 0.5, 0.0, 0.0, 0.0, 0.0]);
    let x70 = vec![1.0f32; 70];
    assert_eq!(
        vec_dot_f32_ggml(GgmlCpuBuild::Avx512, &w70, &x70),
        16_777_220.0
    );
}
