//! Q4_K weights · Q8_K activations on AVX-512 VNNI, with the same tile shape and
//! contract as the AVX-512 kernels. What follows holds for the K-quants' VNNI kernels
//! alike (this file, `q5_k/vnni.rs`, `q6_k/vnni.rs`).
//!
//! Q4_K and Q6_K follow llama.cpp's float orders for the rows of a prompt batch
//! (`dot_q4k_gemm`: the repacked `q4_K_8x8` gemm order; `dot_q6k_tiled`: the tiled
//! matmul's order; docs/parity.md), so that on such a CPU the device forward computes
//! what llama.cpp computes for a prompt, bit for bit. They use these orders for every
//! row, whatever the batch: a row's result never depends on what else is in the step
//! (batch invariance, which preemption and continuous batching rely on), where llama.cpp
//! switches to other kernels for single rows, the last `n % 4` rows (Q4_K) and batches
//! under 8 rows (Q6_K). Q4_K expert towers take llama.cpp's `MUL_MAT_ID` order instead,
//! the gemv order for every row (`dot_q4k_gemv`), again whatever the batch. Q5_K keeps
//! Flint's own order (one 16-lane float accumulator per row). Integer sums are exact
//! whatever the instruction order.
//!
//! Every kernel fuses each sub-block's scale multiply and the accumulation into one
//! `vpdpwssd` (two accumulators per row: one chained accumulator would serialise the
//! block), unpacks the two nibble halves of 32 quant bytes with one variable shift of a
//! broadcast load, and prefetches a few blocks ahead (a matvec streams the weight; the
//! prefetch keeps more lines in flight when both cores stream at once).
//! The caller must have checked AVX-512 F/BW/VNNI (and AVX2/FMA/F16C) at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::x86::avx2::{head16, k4_header, k4_mins_dup, load_bsums};
use crate::kernels::x86::avx512::{
    bcast32, fma1, hsum4, hsum_i32, load64, nibble_shift, pair_idx, prefetch_stream,
    PREFETCH_BLOCKS,
};

/// Q4_K x Q8_K in the float order of llama.cpp's repacked `q4_K_8x8` kernels
/// (`docs/parity.md`; the scalar statement is
/// `flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_repack`). Per output two f32
/// accumulators, `acc` and `mins`. `GEMM` (rows of a batch taken four at a time): per
/// pair of sub-blocks `(2j, 2j + 1)` the exact integers `I = sc·dot` and `M = m·bsum` of
/// the pair, then `acc = fma(I, d·d_a, acc)`, `mins = fma(M, dmin·d_a, mins)`; gemv (the
/// last `m % 4` rows, single rows): the same once per block with the whole block's
/// integers. Result `acc - mins`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_llama<const R: usize, const GEMM: bool>(
    x: &[BlockQ4K],
    y: &[&[BlockQ8K]; R],
    out: &mut [f32; R],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = nibble_shift();
    let idx = pair_idx();
    let mut acc = [0f32; R];
    let mut accm = [0f32; R];
    // A full gemm tile keeps its four rows' accumulators as the lanes of one vector:
    // each lane still runs its own row's chain of fused multiply-adds, in order.
    let lanes = GEMM && R == 4;
    let (mut acc4, mut accm4) = (_mm_setzero_ps(), _mm_setzero_ps());
    for (i, b) in x.iter().enumerate() {
        prefetch_stream(x, i + PREFETCH_BLOCKS);
        let (u, ddm) = k4_header(head16(b));
        let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(u));
        let mins = k4_mins_dup(u);
        let (d, dmin) = (_mm_cvtss_f32(ddm), _mm_cvtss_f32(_mm_movehdup_ps(ddm)));
        // Per pair j and row: the scaled dot products of the pair's 64 quants.
        let mut pair = [[_mm512_setzero_si512(); 4]; R];
        for (j, ij) in idx.iter().enumerate() {
            let qv = _mm512_and_si512(_mm512_srlv_epi16(bcast32(&b.qs[32 * j..]), shift), m4);
            let s = _mm512_permutexvar_epi16(*ij, sc);
            for r in 0..R {
                let yv = load64(&y[r][i].qs[64 * j..]);
                pair[r][j] =
                    _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(qv, yv), s);
            }
        }
        if lanes {
            let yd: [f32; 4] = std::array::from_fn(|r| y[r.min(R - 1)][i].d);
            // SAFETY: 4 readable f32; loadu is unaligned.
            let yd4 = unsafe { _mm_loadu_ps(yd.as_ptr()) };
            let (dd4, dm4) = (
                _mm_mul_ps(_mm_set1_ps(d), yd4),
                _mm_mul_ps(_mm_set1_ps(dmin), yd4),
            );
            let row = |r: usize| &pair[r.min(R - 1)];
            let (p0, p1, p2, p3) = (row(0), row(1), row(2), row(3));
            for j in 0..4 {
                let isum = _mm_cvtepi32_ps(hsum4(p0[j], p1[j], p2[j], p3[j]));
                acc4 = _mm_fmadd_ps(isum, dd4, acc4);
            }
            // Per row [M_0 .. M_3] (M_j = pm_2j + pm_2j+1), then transposed to rows in
            // lanes.
            let m: [__m128i; 4] = std::array::from_fn(|r| {
                pair_mins(_mm256_madd_epi16(load_bsums(&y[r.min(R - 1)][i]), mins))
            });
            accm4 = fma_columns(m, dm4, accm4);
            continue;
        }
        for r in 0..R {
            let yb = &y[r][i];
            // Lane t: m_t * (bsum_2t + bsum_2t+1), the mins term of sub-block t.
            let pm = _mm256_madd_epi16(load_bsums(yb), mins);
            let (dd, dm) = (d * yb.d, dmin * yb.d);
            if GEMM {
                // The four pair integers I_j side by side (exact adds in any order):
                // interleave-and-add within 128-bit lanes, then across the lanes.
                let p = &pair[r];
                let isum = _mm_cvtepi32_ps(hsum4(p[0], p[1], p[2], p[3]));
                let imin = _mm_cvtepi32_ps(pair_mins(pm));
                (acc[r], accm[r]) = pair_chains(isum, imin, dd, dm, acc[r], accm[r]);
            } else {
                let all = _mm512_add_epi32(
                    _mm512_add_epi32(pair[r][0], pair[r][1]),
                    _mm512_add_epi32(pair[r][2], pair[r][3]),
                );
                let isum = hsum_i32(all);
                let imin = hsum_i32(_mm512_castsi256_si512(pm));
                acc[r] = fma1(isum as f32, dd, acc[r]);
                accm[r] = fma1(imin as f32, dm, accm[r]);
            }
        }
    }
    if lanes {
        let mut o = [0f32; 4];
        // SAFETY: 4 writable f32; storeu is unaligned.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc4, accm4)) };
        out.copy_from_slice(&o[..R]);
        return;
    }
    for r in 0..R {
        out[r] = acc[r] - accm[r];
    }
}

/// One Q4_K block's terms added to a row's two chains in llama.cpp's order:
/// `acc = fma(I_j, dd, acc)` and `accm = fma(M_j, dm, accm)` for the four pairs `j` in
/// turn (`isum`, `imin`: the pairs' integers as f32).
#[inline]
#[target_feature(enable = "avx,fma")]
fn pair_chains(isum: __m128, imin: __m128, dd: f32, dm: f32, acc: f32, accm: f32) -> (f32, f32) {
    let (ddv, dmv) = (_mm_set_ss(dd), _mm_set_ss(dm));
    let (mut a_acc, mut a_min) = (_mm_set_ss(acc), _mm_set_ss(accm));
    a_acc = _mm_fmadd_ss(isum, ddv, a_acc);
    a_min = _mm_fmadd_ss(imin, dmv, a_min);
    a_acc = _mm_fmadd_ss(_mm_shuffle_ps::<1>(isum, isum), ddv, a_acc);
    a_min = _mm_fmadd_ss(_mm_shuffle_ps::<1>(imin, imin), dmv, a_min);
    a_acc = _mm_fmadd_ss(_mm_shuffle_ps::<2>(isum, isum), ddv, a_acc);
    a_min = _mm_fmadd_ss(_mm_shuffle_ps::<2>(imin, imin), dmv, a_min);
    a_acc = _mm_fmadd_ss(_mm_shuffle_ps::<3>(isum, isum), ddv, a_acc);
    a_min = _mm_fmadd_ss(_mm_shuffle_ps::<3>(imin, imin), dmv, a_min);
    (_mm_cvtss_f32(a_acc), _mm_cvtss_f32(a_min))
}

/// `[M_0, M_1, M_2, M_3]` with `M_j = pm_2j + pm_2j+1`: the mins terms of the four pairs
/// of sub-blocks, from the eight per-sub-block terms `pm`.
#[inline]
#[target_feature(enable = "avx2")]
fn pair_mins(pm: __m256i) -> __m128i {
    let hm = _mm256_hadd_epi32(pm, pm);
    _mm_unpacklo_epi64(
        _mm256_castsi256_si128(hm),
        _mm256_extracti128_si256::<1>(hm),
    )
}

/// Four rows' `[M_0 .. M_3]` (`m[row]`) transposed so that lane `row` of column `j` is
/// row's `M_j`, then `acc = fma(M_j, dm, acc)` for `j = 0..4` in order: each lane runs
/// its own row's chain.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fma_columns(m: [__m128i; 4], dm: __m128, mut acc: __m128) -> __m128 {
    let (t0, t1) = (
        _mm_unpacklo_epi32(m[0], m[1]),
        _mm_unpacklo_epi32(m[2], m[3]),
    );
    let (t2, t3) = (
        _mm_unpackhi_epi32(m[0], m[1]),
        _mm_unpackhi_epi32(m[2], m[3]),
    );
    for col in [
        _mm_unpacklo_epi64(t0, t1),
        _mm_unpackhi_epi64(t0, t1),
        _mm_unpacklo_epi64(t2, t3),
        _mm_unpackhi_epi64(t2, t3),
    ] {
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(col), dm, acc);
    }
    acc
}

/// [`dot_q4k_llama`] for the rows of a 4-row gemm group.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_gemm<const R: usize>(
    x: &[BlockQ4K],
    y: &[&[BlockQ8K]; R],
    out: &mut [f32; R],
) {
    dot_q4k_llama::<R, true>(x, y, out)
}

/// [`dot_q4k_llama`] in the gemv order: llama.cpp's order for every row of a Q4_K expert
/// tower (`MUL_MAT_ID`, docs/parity.md), whatever the number of rows routed to it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_gemv<const R: usize>(
    x: &[BlockQ4K],
    y: &[&[BlockQ8K]; R],
    out: &mut [f32; R],
) {
    dot_q4k_llama::<R, false>(x, y, out)
}

/// [`dot_q4k_gemm`] for one activation row against `S` weight rows side by side (the
/// M = 1 path): each row's arithmetic exactly that of `dot_q4k_gemm::<1>`, the rows'
/// chains interleaved for the out-of-order core. The caller passes rows far apart
/// ([`q0_rows`](crate::kernels::q0::vnni::q0_rows) says why).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows<const S: usize>(
    x: [&[BlockQ4K]; S],
    y: &[BlockQ8K],
    out: &mut [f32; S],
) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q4k_rows: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = nibble_shift();
    let idx = pair_idx();
    let mut acc = [0f32; S];
    let mut accm = [0f32; S];
    for (i, yb) in y.iter().enumerate() {
        let pmy = load_bsums(yb);
        for s in 0..S {
            let b = &x[s][i];
            let (u, ddm) = k4_header(head16(b));
            let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(u));
            let mins = k4_mins_dup(u);
            let (d, dmin) = (_mm_cvtss_f32(ddm), _mm_cvtss_f32(_mm_movehdup_ps(ddm)));
            let pair: [__m512i; 4] = std::array::from_fn(|j| {
                let qv = _mm512_and_si512(_mm512_srlv_epi16(bcast32(&b.qs[32 * j..]), shift), m4);
                let sj = _mm512_permutexvar_epi16(idx[j], sc);
                let yv = load64(&yb.qs[64 * j..]);
                _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(qv, yv), sj)
            });
            let pm = _mm256_madd_epi16(pmy, mins);
            let (dd, dm) = (d * yb.d, dmin * yb.d);
            let isum = _mm_cvtepi32_ps(hsum4(pair[0], pair[1], pair[2], pair[3]));
            let imin = _mm_cvtepi32_ps(pair_mins(pm));
            (acc[s], accm[s]) = pair_chains(isum, imin, dd, dm, acc[s], accm[s]);
        }
    }
    for s in 0..S {
        out[s] = acc[s] - accm[s];
    }
}

/// `vpermd` indices that turn the pair sums of [`dot_q4k_rows4_llama`] (128-bit lane `k`:
/// rows `k / 2` and `k / 2 + 2`, pairs `[j, j + 2]` with `j = k % 2`) into `[j][row]`:
/// lane `4j + r` holds row `r`'s pair `j`.
const Q4K_ROWS4_OUT: [i32; 16] = [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15];

/// The same for the mins terms (128-bit lane `k`: rows `k / 2` and `k / 2 + 2`, pairs
/// `[2(k % 2), 2(k % 2) + 1]`).
const Q4K_ROWS4_MINS: [i32; 16] = [0, 8, 2, 10, 1, 9, 3, 11, 4, 12, 6, 14, 5, 13, 7, 15];

/// [`dot_q4k_rows`] for four weight rows at once: [`dot_q4k_rows4_m`] with one
/// activation row, each row's arithmetic exactly that of `dot_q4k_gemm::<1>` (the
/// integers of a pair of sub-blocks are exact in any order; per pair `j` in turn
/// `acc = fma(I_j, d·d_a, acc)`, `mins = fma(M_j, dmin·d_a, mins)`). Its route (the
/// scales applied to packed pair sums inside a `vpmaddwd`) decodes a cache-resident
/// matrix 1.1-1.4x faster on one core than [`dot_q4k_rows4_llama`]'s, which leaves the
/// memory more of each core's time on a decode. The caller passes rows far apart
/// ([`q0_rows`](crate::kernels::q0::vnni::q0_rows) says why).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4(x: [&[BlockQ4K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let mut o = [[0f32; 4]; 1];
    dot_q4k_rows4_m::<1, false>(x, [y], &mut o);
    *out = o[0];
}

/// [`dot_q4k_rows4`] in the gemv order (each row's arithmetic that of
/// `dot_q4k_gemv::<1>`: the four pairs' integers summed, then one `fma` each per
/// block): the decode rows of expert towers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4_gemv(x: [&[BlockQ4K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    dot_q4k_rows4_llama::<false>(x, y, out)
}

/// `dot_q4k_gemv::<1>` in the form of `dot_q4k_rows::<1>` (the last rows of a
/// chunk beside [`dot_q4k_rows4_gemv`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_row_gemv(x: [&[BlockQ4K]; 1], y: &[BlockQ8K], out: &mut [f32; 1]) {
    dot_q4k_llama::<1, false>(x[0], &[y], out)
}

/// Four rows' chains in the lanes of one vector, in the gemv order
/// ([`dot_q4k_rows4_gemv`]) or, with `GEMM`, the repacked gemm order (the tests' second
/// route to [`dot_q4k_rows4`]'s results). Against [`dot_q4k_rows`], which spends most of
/// its time on the per-row horizontal sums and scalar chains: each sub-block's 32
/// products are taken with one `vpdpbusd` (nibbles times quants, no scale yet; two
/// sub-blocks per register, the activation halves rearranged once per block for all four
/// rows), the sixteen registers of the four rows are summed in one tree down to the 32
/// sub-block sums, and the scales are applied to the sums (`vpmulld`), not to every
/// product.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q4k_rows4_llama<const GEMM: bool>(x: [&[BlockQ4K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q4k_rows4: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY: 16 readable i32 each; loadu is unaligned.
    let (out_idx, mins_idx) = unsafe {
        (
            _mm512_loadu_si512(Q4K_ROWS4_OUT.as_ptr() as *const __m512i),
            _mm512_loadu_si512(Q4K_ROWS4_MINS.as_ptr() as *const __m512i),
        )
    };
    // Scale bytes of two rows (`[sc0..sc7]` of each) reordered to the sub-block order of
    // the tree's last level: per row `[sc0, sc1, sc4, sc5, sc2, sc3, sc6, sc7]`.
    let sc_order = _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        // The activation quants as the nibble registers pair the sub-blocks:
        // [sb0 | sb2], [sb1 | sb3], [sb4 | sb6], [sb5 | sb7].
        let (y0, y1) = (load64(&yb.qs[..]), load64(&yb.qs[64..]));
        let (y2, y3) = (load64(&yb.qs[128..]), load64(&yb.qs[192..]));
        let ya = [
            _mm512_shuffle_i64x2::<0x44>(y0, y1),
            _mm512_shuffle_i64x2::<0xEE>(y0, y1),
            _mm512_shuffle_i64x2::<0x44>(y2, y3),
            _mm512_shuffle_i64x2::<0xEE>(y2, y3),
        ];
        // Lane t: bsum_2t + bsum_2t+1, the activation sum of sub-block t, in both halves.
        let bs = _mm256_madd_epi16(load_bsums(yb), _mm256_set1_epi16(1));
        let bs2 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bs), bs);
        let mut heads = [(_mm_setzero_si128(), _mm_setzero_ps()); 4];
        // Per row, per 128-bit lane k: [sum of lane k of da, db, dc, dd].
        let mut v = [_mm512_setzero_si512(); 4];
        for r in 0..4 {
            let b = &x[r][i];
            heads[r] = k4_header(head16(b));
            let (q0, q1) = (load64(&b.qs[..]), load64(&b.qs[64..]));
            let z = _mm512_setzero_si512();
            let da = _mm512_dpbusd_epi32(z, _mm512_and_si512(q0, m4), ya[0]);
            let db =
                _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4), ya[1]);
            let dc = _mm512_dpbusd_epi32(z, _mm512_and_si512(q1, m4), ya[2]);
            let dd =
                _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4), ya[3]);
            let t = _mm512_add_epi32(_mm512_unpacklo_epi32(da, db), _mm512_unpackhi_epi32(da, db));
            let u = _mm512_add_epi32(_mm512_unpacklo_epi32(dc, dd), _mm512_unpackhi_epi32(dc, dd));
            v[r] = _mm512_add_epi32(_mm512_unpacklo_epi64(t, u), _mm512_unpackhi_epi64(t, u));
        }
        // Rows (0, 1) and (2, 3): 128-bit lanes [r: sb0 sb1 sb4 sb5], [r: sb2 sb3 sb6 sb7],
        // [r+1: ...], [r+1: ...].
        let w = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0x88>(a, b),
                _mm512_shuffle_i32x4::<0xDD>(a, b),
            )
        };
        let (w01, w23) = (w(v[0], v[1]), w(v[2], v[3]));
        let scales = |a: __m128i, b: __m128i| {
            _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_unpacklo_epi64(a, b), sc_order))
        };
        let p01 = _mm512_mullo_epi32(w01, scales(heads[0].0, heads[1].0));
        let p23 = _mm512_mullo_epi32(w23, scales(heads[2].0, heads[3].0));
        // Adjacent lanes summed: I_j = sc_2j·s_2j + sc_2j+1·s_2j+1.
        let (pf01, pf23) = (_mm512_castsi512_ps(p01), _mm512_castsi512_ps(p23));
        let isum = _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(pf01, pf23)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(pf01, pf23)),
        );
        let iperm = _mm512_permutexvar_epi32(out_idx, isum);
        // Mins: lane t of each row m_t·bsum(t), then pairs summed the same way.
        let mins = |a: __m128i, b: __m128i| {
            _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_unpackhi_epi64(a, b)), bs2)
        };
        let (m01, m23) = (
            _mm512_castsi512_ps(mins(heads[0].0, heads[1].0)),
            _mm512_castsi512_ps(mins(heads[2].0, heads[3].0)),
        );
        let msum = _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(m01, m23)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(m01, m23)),
        );
        let mperm = _mm512_permutexvar_epi32(mins_idx, msum);
        // [d_r] and [dmin_r], times the activation scale: the f32 products d·d_a.
        let t01 = _mm_unpacklo_ps(heads[0].1, heads[1].1);
        let t23 = _mm_unpacklo_ps(heads[2].1, heads[3].1);
        let dy = _mm_set1_ps(yb.d);
        let dd = _mm_mul_ps(_mm_movelh_ps(t01, t23), dy);
        let dm = _mm_mul_ps(_mm_movehl_ps(t23, t01), dy);
        if !GEMM {
            // Per row the whole block's integers (lanes 4j + r summed over j, exact).
            let fold = |v: __m512i| {
                let h =
                    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
                _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
            };
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(fold(iperm)), dd, acc);
            accm = _mm_fmadd_ps(_mm_cvtepi32_ps(fold(mperm)), dm, accm);
            continue;
        }
        let (ifl, mfl) = (_mm512_cvtepi32_ps(iperm), _mm512_cvtepi32_ps(mperm));
        acc = _mm_fmadd_ps(_mm512_castps512_ps128(ifl), dd, acc);
        accm = _mm_fmadd_ps(_mm512_castps512_ps128(mfl), dm, accm);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps::<1>(ifl), dd, acc);
        accm = _mm_fmadd_ps(_mm512_extractf32x4_ps::<1>(mfl), dm, accm);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps::<2>(ifl), dd, acc);
        accm = _mm_fmadd_ps(_mm512_extractf32x4_ps::<2>(mfl), dm, accm);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps::<3>(ifl), dd, acc);
        accm = _mm_fmadd_ps(_mm512_extractf32x4_ps::<3>(mfl), dm, accm);
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc, accm)) };
    *out = o;
}

/// `vpermw` indices per pair `j` of sub-blocks for [`dot_q4k_rows4_m`]: from the four
/// rows' scales as i16 (lane `8r + t`: row `r`'s scale `t`) to the layout of the
/// second level of its tree (lane `8k + 2r + e`: row `r`'s scale of sub-block
/// `2j + k / 2`, the sub-block of 128-bit lane `k` of the pair's register).
const Q4K_ROWS4M_SCALES: [[i16; 32]; 4] = {
    let mut idx = [[0i16; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut l = 0;
        while l < 32 {
            let (k, r) = (l / 8, (l % 8) / 2);
            idx[j][l] = (8 * r + 2 * j + k / 2) as i16;
            l += 1;
        }
        j += 1;
    }
    idx
};

/// `vpermd` indices per pair `j` for [`dot_q4k_rows4_m`] with two or more activation
/// rows: from the four rows' mins as i16 (dword `4r + j`: row `r`'s `(m_2j, m_2j+1)`)
/// to lane `4a + r`.
const Q4K_ROWS4M_MINS: [[i32; 16]; 4] = {
    let mut idx = [[0i32; 16]; 4];
    let mut j = 0;
    while j < 4 {
        let mut l = 0;
        while l < 16 {
            idx[j][l] = (4 * (l % 4) + j) as i32;
            l += 1;
        }
        j += 1;
    }
    idx
};

/// `vpermd` indices per pair `j` for [`dot_q4k_rows4_m`] with two or more activation
/// rows: from the activations' sub-block sums as i16 (the `vpackssdw` of two registers
/// of rows `(0, 1)` and `(2, 3)`, each row's eight sums over two 128-bit lanes) to
/// lane `4a + r`: activation row `a`'s `(bs_2j, bs_2j+1)`.
const Q4K_ROWS4M_BSUMS: [[i32; 16]; 4] = {
    let mut idx = [[0i32; 16]; 4];
    let mut j = 0;
    while j < 4 {
        let mut l = 0;
        while l < 16 {
            let a = l / 4;
            let k = 2 * (a % 2) + j / 2;
            idx[j][l] = (4 * k + 2 * (a / 2) + j % 2) as i32;
            l += 1;
        }
        j += 1;
    }
    idx
};

/// The same for one activation row, to lane `4j + r` (mins: row `r`'s `(m_2j, m_2j+1)`;
/// sums: `(bs_2j, bs_2j+1)` from the 256-bit `vpackssdw` of the row's eight sums with
/// themselves).
const Q4K_ROWS4M_MINS1: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
const Q4K_ROWS4M_BSUMS1: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5, 5];

/// Loads 64 bytes of `vpermd` / `vpermw` indices.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_idx<T: bytemuck::Pod>(t: &T) -> __m512i {
    load64(std::slice::from_ref(t))
}

/// Per 128-bit lane `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]` (i32), with the i16 pack
/// and multiply-add: exact while every lane of `a` and `b` fits in i16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fold_pack(a: __m512i, b: __m512i) -> __m512i {
    _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1))
}

/// [`fold_pack`] with two shuffles and an add (the same lanes; no range limit): the
/// first level of [`dot_q4k_rows4_m`]'s tree takes both forms, to spread its
/// instructions over the shuffle and multiply ports.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_shuf(a: __m512i, b: __m512i) -> __m512i {
    let (a, b) = (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b));
    _mm512_add_epi32(
        _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(a, b)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(a, b)),
    )
}

/// 128-bit lanes `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]` (i32 adds, lane by lane).
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_lanes(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x88>(a, b),
        _mm512_shuffle_i32x4::<0xDD>(a, b),
    )
}

/// Four weight rows against `M` (1 to 4) activation rows at once: `out[a][r]` is bit for
/// bit `dot_q4k_gemm::<1>(x[r], y[a])` (llama.cpp's repacked gemm order; per pair `j` in
/// turn `acc = fma(I_j, d·d_a, acc)`, `mins = fma(M_j, dmin·d_a, mins)`).
///
/// What depends on the weights alone is formed once per block for all activation rows:
/// the nibbles (pair `j` of a row: sub-block `2j` in the low half of a register, `2j + 1`
/// in the high half, as the activation's own 64 bytes hold them, so that the activation
/// is used as loaded), the headers, and the scales and mins in the layouts the tree
/// and the chains meet them in. Per activation row and pair: one `vpdpbusd` per weight
/// row (nibbles times quants, no scale), then a tree. Its first level sums adjacent
/// lanes, half the registers with `vpackssdw` + `vpmaddwd` and half with two shuffles
/// and an add (the multiply and shuffle ports share the work); its second level packs
/// the sums to i16 (they fit: at most 8 products of 15·128) and sums adjacent lanes with
/// `vpmaddwd` whose multipliers are the scales, so that the scales cost no instruction
/// of their own. The last two levels sum the 128-bit lanes, and with two or more
/// activation rows they do it across the rows, which leaves pair `j`'s integers of all
/// rows in one register, lane `4a + r`: the chains then run 16 lanes wide, one `fma`
/// per pair and block for all outputs. The mins terms take one `vpmaddwd` per pair
/// (the activations' sub-block sums against the mins). The caller passes rows far
/// apart, four streams, each prefetched a few blocks ahead, past the row's end into the
/// stream's next row (`prefetch_stream`: the qwen3moe bench preset's decode steps 0.86x,
/// c = 4 0.90x, Gemma 3's 0.97x against no prefetch, `flint_hal::ab_test`). Where `AMX`, the chains are llama.cpp's
/// AMX order instead (`flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_amx`): the whole
/// block's integers `I` and `M` (the pairs' summed), `acc = fma(I, d·d_a, acc)`, then
/// `acc = fma(-M, dmin·d_a, acc)` into the same chain.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4_m<const M: usize, const AMX: bool>(
    x: [&[BlockQ4K]; 4],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; 4]; M],
) {
    assert!(
        (1..=4).contains(&M),
        "dot_q4k_rows4_m: 1 to 4 activation rows"
    );
    let nb = x[0].len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q4k_rows4_m: lengths");
    }
    for ys in &y {
        assert_eq!(ys.len(), nb, "dot_q4k_rows4_m: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = nibble_shift();
    let ones = _mm512_set1_epi16(1);
    let sidx: [__m512i; 4] = std::array::from_fn(|j| load_idx(&Q4K_ROWS4M_SCALES[j]));
    let midx: [__m512i; 4] = std::array::from_fn(|j| load_idx(&Q4K_ROWS4M_MINS[j]));
    let bidx: [__m512i; 4] = std::array::from_fn(|j| load_idx(&Q4K_ROWS4M_BSUMS[j]));
    let (midx1, bidx1) = (load_idx(&Q4K_ROWS4M_MINS1), load_idx(&Q4K_ROWS4M_BSUMS1));
    // Lane 4a + r of the wide chains (M >= 2); lane r of the narrow ones (M = 1).
    let (mut acc, mut accm) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut acc1, mut accm1) = (_mm_setzero_ps(), _mm_setzero_ps());
    for i in 0..nb {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_BLOCKS);
        }
        let b: [&BlockQ4K; 4] = std::array::from_fn(|r| &x[r][i]);
        let yb: [&BlockQ8K; M] = std::array::from_fn(|a| &y[a][i]);
        let h: [(__m128i, __m128); 4] = std::array::from_fn(|r| k4_header(head16(b[r])));
        // The four rows' scales (`lo`) or mins as i16, lane 8r + t.
        let six = |lo: bool| {
            let (p, q) = if lo {
                (
                    _mm_unpacklo_epi64(h[0].0, h[1].0),
                    _mm_unpacklo_epi64(h[2].0, h[3].0),
                )
            } else {
                (
                    _mm_unpackhi_epi64(h[0].0, h[1].0),
                    _mm_unpackhi_epi64(h[2].0, h[3].0),
                )
            };
            _mm512_cvtepu8_epi16(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(p), q))
        };
        let (sc16, mn16) = (six(true), six(false));
        // [d_r] and [dmin_r].
        let t01 = _mm_unpacklo_ps(h[0].1, h[1].1);
        let t23 = _mm_unpacklo_ps(h[2].1, h[3].1);
        let (d4, dm4) = (_mm_movelh_ps(t01, t23), _mm_movehl_ps(t23, t01));
        let wide = M >= 2;
        // Per activation row the sub-block sums bs_t = bsum_2t + bsum_2t+1 as i16.
        let bs = if wide {
            let z = |a0: usize, a1: usize| {
                let v = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(load_bsums(yb[a0.min(M - 1)])),
                    load_bsums(yb[a1.min(M - 1)]),
                );
                _mm512_madd_epi16(v, ones)
            };
            _mm512_packs_epi32(z(0, 1), z(2, 3))
        } else {
            let m = _mm256_madd_epi16(load_bsums(yb[0]), _mm256_set1_epi16(1));
            _mm512_castsi256_si512(_mm256_packs_epi32(m, m))
        };
        let mut wj = [_mm512_setzero_si512(); 4];
        // AMX: the block's integers, the pairs' summed (wide chains).
        let (mut iblk, mut mblk) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let (dd, dm) = if wide {
            let s = |a: usize| _mm512_set1_ps(yb[a.min(M - 1)].d);
            let da = _mm512_mask_blend_ps(
                0xFF00,
                _mm512_mask_blend_ps(0x00F0, s(0), s(1)),
                _mm512_mask_blend_ps(0xF000, s(2), s(3)),
            );
            (
                _mm512_mul_ps(_mm512_broadcast_f32x4(d4), da),
                _mm512_mul_ps(_mm512_broadcast_f32x4(dm4), da),
            )
        } else {
            (_mm512_setzero_ps(), _mm512_setzero_ps())
        };
        for j in 0..4 {
            let q: [__m512i; 4] = std::array::from_fn(|r| {
                _mm512_and_si512(_mm512_srlv_epi16(bcast32(&b[r].qs[32 * j..]), shift), m4)
            });
            let s = _mm512_permutexvar_epi16(sidx[j], sc16);
            // Per activation row, 128-bit lane k: [row r's sum of lane k of its
            // products, times the scale of sub-block 2j + k / 2].
            let w: [__m512i; M] = std::array::from_fn(|a| {
                let ya = load64(&yb[a].qs[64 * j..]);
                let z = _mm512_setzero_si512();
                let d: [__m512i; 4] = std::array::from_fn(|r| _mm512_dpbusd_epi32(z, q[r], ya));
                let (l01, l23) = (fold_pack(d[0], d[1]), fold_shuf(d[2], d[3]));
                _mm512_madd_epi16(_mm512_packs_epi32(l01, l23), s)
            });
            if !wide {
                wj[j] = w[0];
                continue;
            }
            // 128-bit lane a: activation row a's I_j of the four weight rows.
            let x01 = fold_lanes(w[0], w[1.min(M - 1)]);
            let ij = if M == 2 {
                fold_lanes(x01, x01)
            } else {
                fold_lanes(x01, fold_lanes(w[2.min(M - 1)], w[M - 1]))
            };
            let mj = _mm512_madd_epi16(
                _mm512_permutexvar_epi32(bidx[j], bs),
                _mm512_permutexvar_epi32(midx[j], mn16),
            );
            if AMX {
                iblk = _mm512_add_epi32(iblk, ij);
                mblk = _mm512_add_epi32(mblk, mj);
            } else {
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ij), dd, acc);
                accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mj), dm, accm);
            }
        }
        if wide {
            if AMX {
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblk), dd, acc);
                acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mblk), dm, acc);
            }
            continue;
        }
        // One activation row: lane 4j + r holds row r's I_j (M_j).
        let isum = fold_lanes(fold_lanes(wj[0], wj[1]), fold_lanes(wj[2], wj[3]));
        let msum = _mm512_madd_epi16(
            _mm512_permutexvar_epi32(bidx1, bs),
            _mm512_permutexvar_epi32(midx1, mn16),
        );
        let dy = _mm_set1_ps(yb[0].d);
        let (dd, dm) = (_mm_mul_ps(d4, dy), _mm_mul_ps(dm4, dy));
        if AMX {
            // Lane 4j + r: row r's pair j; the block's integers are the four pairs'.
            let whole = |v: __m512i| {
                let h =
                    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
                _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
            };
            acc1 = _mm_fmadd_ps(_mm_cvtepi32_ps(whole(isum)), dd, acc1);
            acc1 = _mm_fnmadd_ps(_mm_cvtepi32_ps(whole(msum)), dm, acc1);
            continue;
        }
        let (ifl, mfl) = (_mm512_cvtepi32_ps(isum), _mm512_cvtepi32_ps(msum));
        acc1 = _mm_fmadd_ps(_mm512_castps512_ps128(ifl), dd, acc1);
        accm1 = _mm_fmadd_ps(_mm512_castps512_ps128(mfl), dm, accm1);
        acc1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<1>(ifl), dd, acc1);
        accm1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<1>(mfl), dm, accm1);
        acc1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<2>(ifl), dd, acc1);
        accm1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<2>(mfl), dm, accm1);
        acc1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<3>(ifl), dd, acc1);
        accm1 = _mm_fmadd_ps(_mm512_extractf32x4_ps::<3>(mfl), dm, accm1);
    }
    let mut o = [0f32; 16];
    // AMX: the mins are in the one chain already (`accm` stays zero; `x - 0` is `x`).
    if M >= 2 {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(acc, accm)) };
    } else {
        // SAFETY: 4 writable f32; storeu is unaligned.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc1, accm1)) };
    }
    for (a, row) in out.iter_mut().enumerate() {
        row.copy_from_slice(&o[4 * a..4 * a + 4]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{q4_k_weights as weights, q8k_acts, seed, vnni_available};
    use flint_core::dot::ggml_x86::{vec_dot_q4_k_q8_k_repack, Q4kPath};

    /// `dot_q4k_rows4_m::<M>` against `dot_q4k_rows4_llama::<true>` (the other four-row
    /// route), `dot_q4k_gemm::<1>` and the scalar statement, every output bit for bit.
    fn check<const M: usize>(rows: &[Vec<BlockQ4K>; 4], ys: &[Vec<BlockQ8K>]) {
        let x: [&[BlockQ4K]; 4] = std::array::from_fn(|r| &rows[r][..]);
        let y: [&[BlockQ8K]; M] = std::array::from_fn(|a| &ys[a][..]);
        let mut got = [[0f32; 4]; M];
        // SAFETY: the caller checked the VNNI level's features.
        unsafe { dot_q4k_rows4_m::<M, false>(x, y, &mut got) };
        for (a, ya) in y.iter().enumerate() {
            let mut four = [0f32; 4];
            // SAFETY: as above.
            unsafe { dot_q4k_rows4_llama::<true>(x, ya, &mut four) };
            for r in 0..4 {
                let mut one = [0f32; 1];
                // SAFETY: as above.
                unsafe { dot_q4k_gemm::<1>(x[r], &[*ya], &mut one) };
                let want = vec_dot_q4_k_q8_k_repack(x[r], ya, Q4kPath::Gemm);
                let g = got[a][r];
                let ctx = format!("M {M}, activation {a}, row {r}, {} blocks", ya.len());
                assert_eq!(
                    g.to_bits(),
                    four[r].to_bits(),
                    "{ctx}: {g:e} vs rows4 {:e}",
                    four[r]
                );
                assert_eq!(
                    g.to_bits(),
                    one[0].to_bits(),
                    "{ctx}: {g:e} vs gemm {:e}",
                    one[0]
                );
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{ctx}: {g:e} vs scalar {want:e}"
                );
            }
        }
    }

    /// Four weight rows times 1 to 4 activation rows equal the one-row kernels and the
    /// scalar statement of the repacked gemm order, bit for bit.
    #[test]
    fn rows4_m_equals_rows4_and_the_scalar_order_bit_for_bit() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: Q4_K rows4_m kernel not exercised");
            return;
        }
        let mut s = seed("q4_k rows4_m");
        for nb in [1, 2, 3, 8] {
            for _ in 0..8 {
                let rows = std::array::from_fn(|_| weights(nb, &mut s));
                let ys: Vec<_> = (0..4).map(|_| q8k_acts(nb, &mut s)).collect();
                check::<1>(&rows, &ys);
                check::<2>(&rows, &ys);
                check::<3>(&rows, &ys);
                check::<4>(&rows, &ys);
            }
        }
    }

    /// The extremes of the partial sums the tree packs to i16: nibbles 15 against
    /// activations -128 and 127, scales and mins 63.
    #[test]
    fn rows4_m_extremes_equal_rows4() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: Q4_K rows4_m kernel not exercised");
            return;
        }
        let mut s = seed("q4_k rows4_m extremes");
        for act in [127i8, -128, -127] {
            let ys: Vec<_> = (0..4)
                .map(|a| {
                    let mut y = q8k_acts(3, &mut s);
                    for b in &mut y {
                        b.qs = [if a % 2 == 0 { act } else { -act.max(-127) }; 256];
                        b.bsums = [16 * b.qs[0] as i16; 16];
                    }
                    y
                })
                .collect();
            let rows = std::array::from_fn(|r| {
                let mut w = weights(3, &mut s);
                for b in &mut w {
                    b.qs = [if r == 3 { 0 } else { 0xFF }; 128];
                    b.scales = [if r == 2 { 0 } else { 0xFF }; 12];
                }
                w
            });
            check::<4>(&rows, &ys);
            check::<3>(&rows, &ys);
        }
    }
}
