//! AVX-512 VNNI kernels for the K-quants, with the same tile shape and contract as the
//! AVX-512 kernels.
//!
//! Q4_K and Q6_K follow llama.cpp's float orders for the rows of a prompt batch
//! (`dot_q4k_gemm`: the repacked `q4_K_8x8` gemm order; `dot_q6k_tiled`: the tiled
//! matmul's order; docs/parity.md), so that on such a CPU the device forward computes
//! what llama.cpp computes for a prompt, bit for bit. They use these orders for every
//! row, whatever the batch: a row's result never depends on what else is in the step
//! (batch invariance, which preemption and continuous batching rely on), where llama.cpp
//! switches to other kernels for single rows, the last `n % 4` rows (Q4_K) and batches
//! under 8 rows (Q6_K). Q5_K keeps Flint's own order (one 16-lane float accumulator per
//! row). Integer sums are exact whatever the
//! instruction order.
//!
//! Every kernel fuses each sub-block's scale multiply and the accumulation into one
//! `vpdpwssd` (two accumulators per row: one chained accumulator would serialise the
//! block), unpacks the two nibble halves of 32 quant bytes with one variable shift of a
//! broadcast load, and prefetches a few blocks ahead (a matvec streams the weight; the
//! prefetch keeps more lines in flight when both cores stream at once).
//! The caller must have checked AVX-512 F/BW/VNNI (and AVX2/FMA/F16C) at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};

use super::avx2::{f16c_to_f32, head16, k4_header, k4_mins_dup, load32, load_bsums, scale2};

/// Blocks ahead of the current one that a K-quant kernel prefetches (4 x 144 bytes of
/// Q4_K: far enough to cover the memory latency at the rate one core consumes blocks).
const PREFETCH_BLOCKS: usize = 4;

/// Hints the cache lines of `b` (at most 3 lines: every K-quant block is <= 210 bytes).
#[inline(always)]
fn prefetch<B>(b: &B) {
    let p = (b as *const B).cast::<i8>();
    // SAFETY: a prefetch never faults and reads nothing architecturally; the pointer
    // comes from a reference.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p);
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
    }
}

/// Loads 64 bytes (quants of either sign).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn load64<T: bytemuck::Pod>(p: &[T]) -> __m512i {
    let bytes: &[u8] = bytemuck::cast_slice(p);
    assert!(bytes.len() >= 64);
    // SAFETY: at least 64 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm512_loadu_si512(bytes.as_ptr() as *const __m512i) }
}

/// 32 quant bytes in both 256-bit halves of a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn bcast32(p: &[u8]) -> __m512i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) })
}

/// Per-i16-lane shift counts: 0 in the low half (low nibbles), 4 in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn nibble_shift() -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4))
}

/// For each pair `j` of 32-quant sub-blocks: `vpermw` indices putting scale `2j` in the
/// low half and scale `2j + 1` in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_idx() -> [__m512i; 4] {
    [
        halves_idx(0, 1),
        halves_idx(2, 3),
        halves_idx(4, 5),
        halves_idx(6, 7),
    ]
}

/// `vpermw` indices that put i16 lane `a` in the low half and lane `b` in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves_idx(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// Q5_K x Q8_K: as Q4_K with the fifth bit of every quant from `qh`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let shift = nibble_shift();
    let idx = pair_idx();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + PREFETCH_BLOCKS) {
            prefetch(ahead);
        }
        let (u, ddm) = k4_header(head16(b));
        let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(u));
        let mins = k4_mins_dup(u);
        // Bit 2j of qh byte l is the fifth bit of quant l of sub-block 2j, bit 2j + 1
        // that of sub-block 2j + 1: shifting the broadcast by 2j (low half) and 2j + 1
        // (high half) brings each to bit 0.
        let hbits = _mm512_broadcast_i64x4(load32(&b.qh));
        let hbase = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(1));
        // Two accumulators per row: a `vpdpwssd` waits for its accumulator, and four in
        // a row on one register would serialise the block.
        let mut sumi = [[_mm512_setzero_si512(); 2]; R];
        for (j, ij) in idx.iter().enumerate() {
            let q = _mm512_and_si512(_mm512_srlv_epi16(bcast32(&b.qs[32 * j..]), shift), m4);
            let hs = _mm512_add_epi16(hbase, _mm512_set1_epi16(2 * j as i16));
            let h = _mm512_and_si512(_mm512_srlv_epi16(hbits, hs), one);
            let qv = _mm512_or_si512(q, _mm512_slli_epi16::<4>(h));
            let s = _mm512_permutexvar_epi16(*ij, sc);
            for r in 0..R {
                let yv = load64(&y[r][i].qs[64 * j..]);
                let a = &mut sumi[r][j & 1];
                *a = _mm512_dpwssd_epi32(*a, _mm512_maddubs_epi16(qv, yv), s);
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            let pm = _mm256_madd_epi16(load_bsums(yb), mins);
            let (sd, sm) = scale2(ddm, yb.d);
            acc[r] = _mm512_fmadd_ps(
                _mm512_broadcastss_ps(_mm256_castps256_ps128(sd)),
                _mm512_cvtepi32_ps(_mm512_add_epi32(sumi[r][0], sumi[r][1])),
                acc[r],
            );
            accm[r] = _mm256_fmadd_ps(sm, _mm256_cvtepi32_ps(pm), accm[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]) - super::avx2::hsum_ps(accm[r]);
    }
}

/// Sum of the 16 i32 lanes of `v` (exact: integer addition).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum_i32(v: __m512i) -> i32 {
    let h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
    let q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b01_00_11_10>(q));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b10_11_00_01>(q));
    _mm_cvtsi128_si32(q)
}

/// `fma(a, b, c)` with one rounding, as `fmaf`.
#[inline]
#[target_feature(enable = "fma")]
fn fma1(a: f32, b: f32, c: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}

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
        if let Some(ahead) = x.get(i + PREFETCH_BLOCKS) {
            prefetch(ahead);
        }
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

/// The sums of the 16 i32 lanes of each of four vectors, side by side (exact: integer
/// adds, interleaved within 128-bit lanes, then across them).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum4(p0: __m512i, p1: __m512i, p2: __m512i, p3: __m512i) -> __m128i {
    let a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    let c = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    let e = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
    let h = _mm256_add_epi32(_mm512_castsi512_si256(e), _mm512_extracti64x4_epi64::<1>(e));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
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

/// `vpermw` indices that spread the 16 sub-block scales of a Q6_K block over the four
/// 64-quant groups: group `j`'s four 16-quant quarters get scales `4j .. 4j + 4`.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn q6k_scale_idx() -> [__m512i; 4] {
    let lane_idx = |s0: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(s0 + 1), _mm_set1_epi16(s0))),
            _mm256_set_m128i(_mm_set1_epi16(s0 + 3), _mm_set1_epi16(s0 + 2)),
        )
    };
    [lane_idx(0), lane_idx(4), lane_idx(8), lane_idx(12)]
}

/// A Q6_K block's 16 signed scales widened to i16 (256 bits, and the same in the low half
/// of a 512-bit register for `vpermw`).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn q6k_scales(b: &BlockQ6K) -> (__m256i, __m512i) {
    // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
    let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
    let sc16 = _mm256_cvtepi8_epi16(sc8);
    (sc16, _mm512_castsi256_si512(sc16))
}

/// 64 unsigned 6-bit quants of a Q6_K block as bytes: group `g` (0 or 1) of the 64 low
/// bytes `ql` (low or high nibbles) with their two high bits from the broadcast `qh`
/// bytes `h` (shifted per 256-bit half by `shift`, see [`nibble_shift`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn q6k_quants(ql: __m512i, h: __m512i, g: usize, shift: __m512i) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0F);
    let lo = if g == 0 {
        _mm512_and_si512(ql, m4)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4)
    };
    let hs = _mm512_add_epi16(
        _mm512_srli_epi16::<1>(shift),
        _mm512_set1_epi16(4 * g as i16),
    );
    let hi = _mm512_and_si512(_mm512_srlv_epi16(h, hs), _mm512_set1_epi8(3));
    _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi))
}

/// Q6_K x Q8_K in the float order of llama.cpp's tiled K-quant matmul, which it uses for
/// batches of 8 rows or more (`docs/parity.md`; the scalar statement is
/// `flint_core::dot::ggml_x86::vec_dot_q6_k_q8_k_tiled`): per block the exact integer
/// `S` (scales applied, the offset of 32 taken off), then `acc = fma(S·d, d_a, acc)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_tiled<const R: usize>(
    x: &[BlockQ6K],
    y: &[&[BlockQ8K]; R],
    out: &mut [f32; R],
) {
    let shift = nibble_shift();
    let idx = q6k_scale_idx();
    let mut acc4 = _mm_setzero_ps();
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + PREFETCH_BLOCKS) {
            prefetch(ahead);
        }
        let d = f16c_to_f32(b.d);
        let (sc16, sc) = q6k_scales(b);
        let mut sumi = [[_mm512_setzero_si512(); 2]; R];
        for n in 0..2 {
            let h = bcast32(&b.qh[32 * n..]);
            let ql = load64(&b.ql[64 * n..]);
            for g in 0..2 {
                let qv = q6k_quants(ql, h, g, shift);
                let s = _mm512_permutexvar_epi16(idx[2 * n + g], sc);
                for r in 0..R {
                    let yv = load64(&y[r][i].qs[128 * n + 64 * g..]);
                    let a = &mut sumi[r][g];
                    *a = _mm512_dpwssd_epi32(*a, _mm512_maddubs_epi16(qv, yv), s);
                }
            }
        }
        // Per row: the block's integer with the offset of the unsigned quants taken off.
        let total = |r: usize| {
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, load_bsums(&y[r][i])));
            _mm512_sub_epi32(
                _mm512_add_epi32(sumi[r][0], sumi[r][1]),
                _mm512_inserti64x4::<0>(_mm512_setzero_si512(), off),
            )
        };
        if R == 4 {
            // Four rows in the lanes of one vector, each lane its own row's chain.
            let yd: [f32; 4] = std::array::from_fn(|r| y[r.min(R - 1)][i].d);
            let t: [__m512i; 4] = std::array::from_fn(|r| total(r.min(R - 1)));
            let s4 = _mm_cvtepi32_ps(hsum4(t[0], t[1], t[2], t[3]));
            // SAFETY: 4 readable f32; loadu is unaligned.
            let yd4 = unsafe { _mm_loadu_ps(yd.as_ptr()) };
            acc4 = _mm_fmadd_ps(_mm_mul_ps(s4, _mm_set1_ps(d)), yd4, acc4);
            continue;
        }
        for r in 0..R {
            let s = hsum_i32(total(r));
            acc[r] = fma1(s as f32 * d, y[r][i].d, acc[r]);
        }
    }
    if R == 4 {
        let mut o = [0f32; 4];
        // SAFETY: 4 writable f32; storeu is unaligned.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc4) };
        out.copy_from_slice(&o[..R]);
        return;
    }
    *out = acc;
}

/// One activation row's Q8_0 blocks with their f32 scales and `-16 x` lane sums.
pub(crate) type Q8_0Side<'a> = (&'a [BlockQ8_0], &'a [f32], &'a [[i32; 8]]);

/// Q5_0 x Q8_0 in tinyBLAS's order (as `tinyblas::dot_q0`: per block, eight i32 lanes of
/// four quants each, `lane = fma(d_w * d_a, lane sum, lane)`, `hsum_ps` at the end), on
/// the quants taken unsigned (`q + 16`, the fifth bit from a mask register): `vpdpbusd`
/// starting from the activation block's `-16 x` lane sums gives exactly the signed lane
/// sums, with no sign juggling and no f16 conversion of activation scales per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q5_0<const R: usize>(x: &[BlockQ5_0], y: &[Q8_0Side<'_>; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let bit5 = _mm256_set1_epi8(0x10);
    for r in 0..R {
        assert!(y[r].0.len() >= x.len() && y[r].1.len() >= x.len() && y[r].2.len() >= x.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + 8) {
            _mm_prefetch::<_MM_HINT_T0>((ahead as *const BlockQ5_0).cast::<i8>());
        }
        // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
        let t = unsafe { _mm_loadu_si128(b.qs.as_ptr() as *const __m128i) };
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), m4);
        let u = _mm256_or_si256(nib, _mm256_maskz_mov_epi8(u32::from_le_bytes(b.qh), bit5));
        let d = _mm256_set1_ps(f16c_to_f32(b.d));
        for r in 0..R {
            let (yb, ys, yl) = (&y[r].0[i], y[r].1[i], &y[r].2[i]);
            // SAFETY: 32 quant bytes and 8 i32 are readable; loadu is unaligned.
            let (yv, init) = unsafe {
                (
                    _mm256_loadu_si256(yb.qs.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(yl.as_ptr() as *const __m256i),
                )
            };
            let s = _mm256_dpbusd_epi32(init, u, yv);
            let dd = _mm256_mul_ps(d, _mm256_set1_ps(ys));
            acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = super::avx2::hsum_ps(acc[r]);
    }
}

/// `out[t] = dot(Q5_0 weight row x, activation row rows[t])` for up to 4 rows, each
/// row's side data from `side`.
pub(crate) fn q5_0_rows<'a>(
    x: &[BlockQ5_0],
    rows: &[usize],
    side: &dyn Fn(usize) -> Q8_0Side<'a>,
    out: &mut [f32],
) {
    // SAFETY (each call): the VNNI level (AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C) was
    // checked against the CPU at device open.
    match rows.len() {
        4 => {
            let ys = [side(rows[0]), side(rows[1]), side(rows[2]), side(rows[3])];
            let mut o = [0f32; 4];
            unsafe { dot_q5_0::<4>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        3 => {
            let ys = [side(rows[0]), side(rows[1]), side(rows[2])];
            let mut o = [0f32; 3];
            unsafe { dot_q5_0::<3>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        2 => {
            let ys = [side(rows[0]), side(rows[1])];
            let mut o = [0f32; 2];
            unsafe { dot_q5_0::<2>(x, &ys, &mut o) };
            out.copy_from_slice(&o);
        }
        _ => {
            for (t, &r) in rows.iter().enumerate() {
                let mut o = [0f32; 1];
                unsafe { dot_q5_0::<1>(x, &[side(r)], &mut o) };
                out[t] = o[0];
            }
        }
    }
}

/// A legacy 32-quant weight type as the VNNI kernels take it: its quants made unsigned by
/// an offset `o` (16 for Q5_0: the fifth bit as is; 128 for the others: the sign bit
/// flipped), which the activation block's `-16 x` lane sums, shifted left by `SHIFT`
/// (`log2(o / 16)`), take back out exactly.
pub(crate) trait Q0Pair: bytemuck::Pod + Sync {
    /// `log2(o / 16)`.
    const SHIFT: u32;
    /// The f16 scale bits.
    fn scale_bits(&self) -> u16;
    /// The 32 quants plus the offset, as u8.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL and AVX2.
    unsafe fn unsigned(&self) -> __m256i;
}

impl Q0Pair for BlockQ5_0 {
    const SHIFT: u32 = 0;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            _mm256_or_si256(
                nibbles(&self.qs),
                _mm256_maskz_mov_epi8(u32::from_le_bytes(self.qh), _mm256_set1_epi8(0x10)),
            )
        }
    }
}

impl Q0Pair for BlockQ8_0 {
    const SHIFT: u32 = 3;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees AVX2; `qs` is 32 readable bytes.
        unsafe {
            let q = _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i);
            _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
        }
    }
}

impl Q0Pair for flint_core::blocks::BlockQ4_0 {
    const SHIFT: u32 = 3;
    fn scale_bits(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    unsafe fn unsigned(&self) -> __m256i {
        // SAFETY: the caller guarantees AVX2. q - 8 + 128 = nibble + 120.
        unsafe { _mm256_add_epi8(nibbles(&self.qs), _mm256_set1_epi8(120)) }
    }
}

/// The 32 nibbles of 16 quant bytes as bytes, in element order (low nibbles, then high).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: the caller guarantees AVX2; `qs` is 16 readable bytes, loadu is unaligned.
    unsafe {
        let t = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16::<4>(t), t),
            _mm256_set1_epi8(0x0F),
        )
    }
}

/// Weight rows per panel of the prompt-batch gemm ([`q0_gemm`]): one per lane of a
/// 512-bit register.
pub(crate) const PANEL_ROWS: usize = 16;

/// One 32-quant block of sixteen weight rows (a panel), decoded once for every
/// activation row of a batch ([`q0_gemm`]): `u[j]` holds quants `4j..4j + 4` of the
/// sixteen rows (row `r` in bytes `4r..4r + 4`), unsigned (see [`Q0Pair`]), so one
/// `vpdpbusd` against four broadcast activation quants gives tinyBLAS's lane `j` for
/// sixteen outputs at once; `d` holds the rows' scales widened. Rows past the end of
/// the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct PanelBlock {
    u: [[u8; 64]; 8],
    d: [f32; 16],
}

const _: () = assert!(std::mem::size_of::<PanelBlock>() == 576);

impl PanelBlock {
    /// A zeroed block (scratch space).
    pub(crate) const ZERO: Self = Self {
        u: [[0; 64]; 8],
        d: [0.0; 16],
    };
}

/// Decodes the weight rows `rows` (at most [`PANEL_ROWS`], each `out.len()` blocks)
/// into panel blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn decode_panel<B: Q0Pair>(rows: &[&[B]], out: &mut [PanelBlock]) {
    assert!(rows.len() <= PANEL_ROWS, "decode_panel: rows");
    // The sixteen rows' quants (rows past the end stay zero), then transposed: `u[j]`
    // lane `r` is dword `j` of row `r` (a 16 x 16 transpose of which the first eight
    // columns are the quants).
    let mut q = [[0u8; 64]; PANEL_ROWS];
    for (i, o) in out.iter_mut().enumerate() {
        o.d = [0.0; 16];
        for (r, row) in rows.iter().enumerate() {
            let b = &row[i];
            // SAFETY: this function's features include what `unsigned` needs; `q[r]` is
            // 64 writable bytes and storeu is unaligned.
            unsafe { _mm256_storeu_si256(q[r].as_mut_ptr() as *mut __m256i, b.unsigned()) };
            o.d[r] = f16c_to_f32(b.scale_bits());
        }
        let t = super::avx512::transpose16(std::array::from_fn(|r| {
            // SAFETY: 64 readable bytes; loadu is unaligned.
            unsafe { _mm512_loadu_si512(q[r].as_ptr() as *const __m512i) }
        }));
        for (u, v) in o.u.iter_mut().zip(&t) {
            // SAFETY: 64 writable bytes, 64-byte aligned.
            unsafe { _mm512_store_si512(u.as_mut_ptr() as *mut __m512i, *v) };
        }
    }
}

/// For the panels `p0..p0 + dec.len() / nb` of the `n` weight rows of `w` (each `nb`
/// blocks; panel `p` is rows `16p..16p + 16`, fewer at the end): `decode(rows, chunk)`
/// with the panel's rows and its `nb` blocks of `dec`.
pub(crate) fn for_each_panel<B, D>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [D],
    mut decode: impl FnMut(&[&[B]], &mut [D]),
) {
    if nb == 0 {
        return;
    }
    assert!(w.len() >= n * nb, "for_each_panel: weight rows");
    for (t, d) in dec.chunks_mut(nb).enumerate() {
        let r0 = PANEL_ROWS * (p0 + t);
        let rows: Vec<&[B]> = (r0..(r0 + PANEL_ROWS).min(n))
            .map(|r| &w[r * nb..(r + 1) * nb])
            .collect();
        decode(&rows, d);
    }
}

/// Decodes the `n` weight rows of `w` (each `nb` blocks) into panels: panel `p` (rows
/// `16p..16p + 16`) at `dec[p * nb..]`, for the panels `p0..p0 + dec.len() / nb`.
pub(crate) fn q0_decode<B: Q0Pair>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [PanelBlock],
) {
    // SAFETY: the VNNI level (AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C) was checked against
    // the CPU at device open.
    for_each_panel(w, nb, n, p0, dec, |rows, d| unsafe {
        decode_panel(rows, d)
    });
}

/// The panels `p0..p0 + dec.len() / nb` of Q8_0 or Q5_0 rows repacked at staging
/// (`q0_x16`: whole 16-row groups of `nb` blocks): the same panels [`q0_decode`] makes
/// of the file's rows, with no transposes.
pub(crate) fn q0_decode_x16<G: super::q0_x16::Q0Group>(
    groups: &[G],
    nb: usize,
    p0: usize,
    dec: &mut [PanelBlock],
) {
    // SAFETY: the VNNI level (AVX-512 F/BW, F16C) was checked against the CPU at device
    // open.
    unsafe { decode_x16_blocks(&groups[p0 * nb..p0 * nb + dec.len()], dec) }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
fn decode_x16_blocks<G: super::q0_x16::Q0Group>(src: &[G], dec: &mut [PanelBlock]) {
    for (o, b) in dec.iter_mut().zip(src) {
        // SAFETY: this function's features include what `lanes` needs.
        let u = unsafe { b.lanes() };
        for (dst, v) in o.u.iter_mut().zip(u) {
            // SAFETY: 64 writable bytes, 64-byte aligned.
            unsafe { _mm512_store_si512(dst.as_mut_ptr() as *mut __m512i, v) };
        }
        // SAFETY: 32 readable bytes in, 64 writable bytes out, 64-byte aligned.
        unsafe {
            let h = _mm256_loadu_si256(b.scale_bits().as_ptr() as *const __m256i);
            _mm512_store_ps(o.d.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
}

/// The sixteen rows of a panel (`panel`: its blocks) against `A` activation rows, in
/// tinyBLAS's order: per output eight f32 lanes, per block
/// `lane j = fma(d_w * d_a, sum of quants 4j..4j + 4, lane j)`, the lanes added as
/// `hsum_ps` adds them, as [`dot_q5_0`] and `tinyblas::dot_q0` (bit for bit). A
/// register holds lane `j` of the sixteen rows' outputs, so per block and activation
/// row one scale product serves all eight `vpdpbusd` / conversion / FMA steps, and the
/// side data and the four activation quants of each step are broadcast loads (no
/// register copy): three 512-bit ALU ops per 64 MACs where a register of two outputs'
/// lanes needs five. The side data `l` of an activation row must be its lane sums times
/// minus the weight type's offset. `out[a][r]`: panel row `r` against activation row `a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q0_panel_tile<const A: usize>(
    panel: &[PanelBlock],
    y: &[Q8_0Side<'_>; A],
    out: &mut [[f32; PANEL_ROWS]; A],
) {
    let nb = panel.len();
    let ys: [Q8_0Side<'_>; A] = std::array::from_fn(|a| {
        let (q, s, l) = y[a];
        (&q[..nb], &s[..nb], &l[..nb])
    });
    let mut acc = [[_mm512_setzero_ps(); 8]; A];
    for (i, b) in panel.iter().enumerate() {
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..8 {
            // SAFETY: 64 readable bytes; the block is 64-byte aligned.
            w[j] = unsafe { _mm512_load_si512(b.u[j].as_ptr() as *const __m512i) };
        }
        // SAFETY: 16 readable f32, 64-byte aligned.
        let dw = unsafe { _mm512_load_ps(b.d.as_ptr()) };
        for a in 0..A {
            let (q, s, l) = ys[a];
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            let qs = q[i].qs.as_ptr() as *const i32;
            let lanes = &l[i];
            for j in 0..8 {
                // SAFETY: `qs` points at 32 readable quant bytes, `j < 8`;
                // read_unaligned needs no alignment.
                let y4 = unsafe { qs.add(j).read_unaligned() };
                let t =
                    _mm512_dpbusd_epi32(_mm512_set1_epi32(lanes[j]), w[j], _mm512_set1_epi32(y4));
                acc[a][j] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(t), acc[a][j]);
            }
        }
    }
    for a in 0..A {
        let v = &acc[a];
        // hsum_ps: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
        let r = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
            _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])),
        );
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), r) };
    }
}

/// Writes a panel's outputs for one activation row (`dst`: its live rows): a whole
/// panel as one fixed-size copy (a copy of run-time length is a `memcpy` call, 5% of a
/// prompt-batch matmul), a partial one element by element.
#[inline]
pub(crate) fn put_row(dst: &mut [f32], v: &[f32; PANEL_ROWS]) {
    match <&mut [f32; PANEL_ROWS]>::try_from(&mut *dst) {
        Ok(d) => *d = *v,
        Err(_) => {
            for (d, &x) in dst.iter_mut().zip(v) {
                *d = x;
            }
        }
    }
}

/// `out[t * n + r] = dot(weight row r, activation row i0 + t)` for the `n` weight rows
/// decoded in `dec` (panels of `nb` blocks, [`q0_decode`]) and the `out.len() / n`
/// activation rows from `i0` that `side` gives (their lane sums times minus the weight
/// type's offset), in tinyBLAS's order (the same results as [`q5_0_rows`] /
/// `tinyblas::dot_q0` row by row). Per panel (which stays in L1), tiles of two
/// activation rows ([`q0_panel_tile`], which keeps both multiply pipes busy), the last
/// odd row alone.
pub(crate) fn q0_gemm<'a>(
    dec: &[PanelBlock],
    nb: usize,
    n: usize,
    side: &dyn Fn(usize) -> Q8_0Side<'a>,
    i0: usize,
    out: &mut [f32],
) {
    if n == 0 || nb == 0 {
        return;
    }
    let m = out.len() / n;
    let panels = n.div_ceil(PANEL_ROWS);
    assert!(dec.len() >= panels * nb, "q0_gemm: decoded rows");
    // The activation rows' side data once, not once per tile.
    let sides: Vec<Q8_0Side<'a>> = (0..m).map(|t| side(i0 + t)).collect();
    for p in 0..panels {
        let blocks = &dec[p * nb..(p + 1) * nb];
        let r0 = p * PANEL_ROWS;
        let live = PANEL_ROWS.min(n - r0);
        let mut t = 0;
        while t < m {
            let mut o = [[0f32; PANEL_ROWS]; 2];
            let take = (m - t).min(2);
            // SAFETY (each call): features checked at device open (see `q0_decode`).
            unsafe {
                if take == 2 {
                    q0_panel_tile::<2>(blocks, &[sides[t], sides[t + 1]], &mut o);
                } else {
                    let mut o1 = [[0f32; PANEL_ROWS]; 1];
                    q0_panel_tile::<1>(blocks, &[sides[t]], &mut o1);
                    o[0] = o1[0];
                }
            }
            for (a, v) in o.iter().enumerate().take(take) {
                put_row(&mut out[(t + a) * n + r0..(t + a) * n + r0 + live], v);
            }
            t += take;
        }
    }
}

/// `vpermt2d` indices of [`dot_q4k_gemm8`]'s mins (see there).
const MINS_EVEN: [i32; 16] = [0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30];
const MINS_ODD: [i32; 16] = [1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31];
const MINS_J01: [i32; 16] = [0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23];
const MINS_J23: [i32; 16] = [8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31];

/// The upper eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f")]
fn hi256(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// Loads 8 f32 (`v` must hold 8).
#[inline]
#[target_feature(enable = "avx")]
fn load8(v: &[f32; 8]) -> __m256 {
    // SAFETY: 8 readable f32; loadu is unaligned.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// One Q4_K weight row against eight activation rows in the gemm order of
/// [`dot_q4k_llama`] (bit for bit the same per row): each weight block decoded once for
/// the eight rows, whose accumulators are the lanes of one vector (each lane its own
/// row's chain, in order).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_gemm8(x: &[BlockQ4K], y: &[&[BlockQ8K]; 8], out: &mut [f32; 8]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = nibble_shift();
    let idx = pair_idx();
    let nb = x.len();
    let ys: [&[BlockQ8K]; 8] = std::array::from_fn(|r| &y[r][..nb]);
    let mut acc8 = _mm256_setzero_ps();
    let mut accm8 = _mm256_setzero_ps();
    // Permutation indices for the mins below: lane 4j + r of `ev` / `od` takes sub-block
    // 2j / 2j + 1 of row r of four rows held in two registers (row r at lanes 8r..);
    // lane 8jj + r of `j01` / `j23` takes pair j = jj / 2 + jj of row r of eight rows
    // held as two such sets (lane 4j + r, rows 4..8 in the second).
    let ld = |v: &[i32; 16]| {
        // SAFETY: 16 readable i32; loadu is unaligned.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
    };
    let ev = ld(&MINS_EVEN);
    let od = ld(&MINS_ODD);
    let j01 = ld(&MINS_J01);
    let j23 = ld(&MINS_J23);
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + PREFETCH_BLOCKS) {
            prefetch(ahead);
        }
        let (u, ddm) = k4_header(head16(b));
        let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(u));
        let mins = k4_mins_dup(u);
        let (d, dmin) = (_mm_cvtss_f32(ddm), _mm_cvtss_f32(_mm_movehdup_ps(ddm)));
        let yd8 = load8(&std::array::from_fn(|r| ys[r][i].d));
        let (dd8, dm8) = (
            _mm256_mul_ps(_mm256_set1_ps(d), yd8),
            _mm256_mul_ps(_mm256_set1_ps(dmin), yd8),
        );
        for (j, ij) in idx.iter().enumerate() {
            let qv = _mm512_and_si512(_mm512_srlv_epi16(bcast32(&b.qs[32 * j..]), shift), m4);
            let s = _mm512_permutexvar_epi16(*ij, sc);
            // Plain loops rather than `array::from_fn` closures: a closure the compiler
            // does not inline passes every vector through memory (2.3x slower).
            let mut p = [_mm512_setzero_si512(); 8];
            for (r, pr) in p.iter_mut().enumerate() {
                let yv = load64(&ys[r][i].qs[64 * j..]);
                *pr = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(qv, yv), s);
            }
            let lo = hsum4(p[0], p[1], p[2], p[3]);
            let hi = hsum4(p[4], p[5], p[6], p[7]);
            let isum = _mm256_cvtepi32_ps(_mm256_set_m128i(hi, lo));
            acc8 = _mm256_fmadd_ps(isum, dd8, acc8);
        }
        // The mins terms, two rows per register: lanes 0..8 `m_s * bsum_s` of row 2k,
        // lanes 8..16 those of row 2k + 1 (s the sub-block), then the pairs of
        // sub-blocks added and the rows gathered per pair `j`, eight rows side by side.
        // Exact integers, in the lanes the chains need.
        let mins2 = _mm512_broadcast_i64x4(mins);
        let mut z = [_mm512_setzero_si512(); 4];
        for (k, zk) in z.iter_mut().enumerate() {
            let b = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(load_bsums(&ys[2 * k][i])),
                load_bsums(&ys[2 * k + 1][i]),
            );
            *zk = _mm512_madd_epi16(b, mins2);
        }
        let w03 = _mm512_add_epi32(
            _mm512_permutex2var_epi32(z[0], ev, z[1]),
            _mm512_permutex2var_epi32(z[0], od, z[1]),
        );
        let w47 = _mm512_add_epi32(
            _mm512_permutex2var_epi32(z[2], ev, z[3]),
            _mm512_permutex2var_epi32(z[2], od, z[3]),
        );
        let m01 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(w03, j01, w47));
        let m23 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(w03, j23, w47));
        accm8 = _mm256_fmadd_ps(_mm512_castps512_ps256(m01), dm8, accm8);
        accm8 = _mm256_fmadd_ps(hi256(m01), dm8, accm8);
        accm8 = _mm256_fmadd_ps(_mm512_castps512_ps256(m23), dm8, accm8);
        accm8 = _mm256_fmadd_ps(hi256(m23), dm8, accm8);
    }
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc8, accm8)) };
}

/// One Q6_K weight row against eight activation rows in the tiled order of
/// [`dot_q6k_tiled`] (bit for bit the same per row), the eight rows' accumulators the
/// lanes of one vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_tiled8(x: &[BlockQ6K], y: &[&[BlockQ8K]; 8], out: &mut [f32; 8]) {
    let shift = nibble_shift();
    let idx = q6k_scale_idx();
    let nb = x.len();
    let ys: [&[BlockQ8K]; 8] = std::array::from_fn(|r| &y[r][..nb]);
    let mut acc8 = _mm256_setzero_ps();
    for (i, b) in x.iter().enumerate() {
        if let Some(ahead) = x.get(i + PREFETCH_BLOCKS) {
            prefetch(ahead);
        }
        let d = f16c_to_f32(b.d);
        let (sc16, sc) = q6k_scales(b);
        // Per row: the block's integer with the offset of the unsigned quants taken off,
        // started from the offset (exact integer adds in any order).
        let mut tot: [__m512i; 8] = std::array::from_fn(|r| {
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, load_bsums(&ys[r][i])));
            _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_inserti64x4::<0>(_mm512_setzero_si512(), off),
            )
        });
        for n in 0..2 {
            let h = bcast32(&b.qh[32 * n..]);
            let ql = load64(&b.ql[64 * n..]);
            for g in 0..2 {
                let qv = q6k_quants(ql, h, g, shift);
                let s = _mm512_permutexvar_epi16(idx[2 * n + g], sc);
                for (r, t) in tot.iter_mut().enumerate() {
                    let yv = load64(&ys[r][i].qs[128 * n + 64 * g..]);
                    *t = _mm512_dpwssd_epi32(*t, _mm512_maddubs_epi16(qv, yv), s);
                }
            }
        }
        let lo = hsum4(tot[0], tot[1], tot[2], tot[3]);
        let hi = hsum4(tot[4], tot[5], tot[6], tot[7]);
        let s8 = _mm256_cvtepi32_ps(_mm256_set_m128i(hi, lo));
        let yd8 = load8(&std::array::from_fn(|r| ys[r][i].d));
        acc8 = _mm256_fmadd_ps(_mm256_mul_ps(s8, _mm256_set1_ps(d)), yd8, acc8);
    }
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc8) };
}

/// The number of weight rows of `w_len` blocks in rows of `nb`, after checking the
/// lengths a [`q0_rows`]-style kernel indexes without bounds checks: whole rows, every
/// activation row at least `nb` blocks, room in `out` for `[row][stride]` results.
fn rows_checked<const A: usize>(
    w_len: usize,
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out_len: usize,
    stride: usize,
    what: &str,
) -> usize {
    let n = w_len / nb.max(1);
    assert!(
        nb > 0 && A > 0 && w_len == nb * n && stride >= A && out_len >= (n.max(1) - 1) * stride + A,
        "{what}: lengths"
    );
    for (yb, ys, yl) in y {
        assert!(
            yb.len() >= nb && ys.len() >= nb && yl.len() >= nb,
            "{what}: activation lengths"
        );
    }
    n
}

/// Rows of a legacy 32-quant weight `w` (`nb` blocks each) against `A` Q8_0
/// activation rows `y` (decode: one, or a few sequences), in tinyBLAS's order as
/// [`dot_q5_0`] and `tinyblas::dot_q0` (bit for bit): `out[r * stride + a]` is weight row
/// `r` against `y[a]`. `vpdpbusd` on the quants taken unsigned, starting from the
/// activation block's `-16 x` lane sums shifted by `B::SHIFT`, gives the signed lane sums
/// in one instruction; each weight block is decoded once for the `A` rows.
///
/// `PF`: bytes ahead of each weight stream to prefetch (0: none).
///
/// `S` weight rows go side by side (`S x A` independent chains for the out-of-order
/// core), and they are rows far apart: row `t` of each of `S` equal runs of the rows.
/// Two *adjacent* rows read side by side stream from memory far slower than one (the
/// hardware prefetcher does not follow two streams a row apart), while rows half a
/// matrix apart are two clean streams.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q0_rows<B: Q0Pair, const S: usize, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
) {
    let n = rows_checked(w.len(), nb, y, out.len(), stride, "q0_rows");
    let run = n / S;
    for t in 0..run {
        let xr: [&[B]; S] = std::array::from_fn(|s| &w[(s * run + t) * nb..(s * run + t + 1) * nb]);
        let mut acc = [[_mm256_setzero_ps(); A]; S];
        for i in 0..nb {
            // SAFETY: `i < nb`; every activation slice has at least `nb` entries (checked
            // above) and every `xr[s]` exactly `nb`; 32 quant bytes and 8 i32 are
            // readable, loadu is unaligned; this function's features include what
            // `unsigned` needs.
            unsafe {
                let mut u = [_mm256_setzero_si256(); S];
                let mut d = [_mm256_setzero_ps(); S];
                for s in 0..S {
                    let b = xr[s].get_unchecked(i);
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    u[s] = b.unsigned();
                    d[s] = _mm256_cvtph_ps(_mm_set1_epi16(b.scale_bits() as i16));
                }
                for a in 0..A {
                    let (yb, ys, yl) = y[a];
                    let yv = _mm256_loadu_si256(yb.get_unchecked(i).qs.as_ptr() as *const __m256i);
                    let init = _mm256_loadu_si256(yl.get_unchecked(i).as_ptr() as *const __m256i);
                    let init = if B::SHIFT == 0 {
                        init
                    } else {
                        _mm256_sll_epi32(init, _mm_cvtsi32_si128(B::SHIFT as i32))
                    };
                    let dy = _mm256_set1_ps(*ys.get_unchecked(i));
                    for s in 0..S {
                        let sum = _mm256_dpbusd_epi32(init, u[s], yv);
                        acc[s][a] = _mm256_fmadd_ps(
                            _mm256_mul_ps(d[s], dy),
                            _mm256_cvtepi32_ps(sum),
                            acc[s][a],
                        );
                    }
                }
            }
        }
        for s in 0..S {
            for a in 0..A {
                out[(s * run + t) * stride + a] = super::avx2::hsum_ps(acc[s][a]);
            }
        }
    }
    // The rows past `S` equal runs, one at a time.
    if S > 1 {
        for r in S * run..n {
            q0_rows::<B, 1, A, PF>(
                &w[r * nb..(r + 1) * nb],
                nb,
                y,
                &mut out[r * stride..],
                stride,
            );
        }
    }
}

/// [`dot_q4k_gemm`] for one activation row against `S` weight rows side by side (the
/// M = 1 path): each row's arithmetic exactly that of `dot_q4k_gemm::<1>`, the rows'
/// chains interleaved for the out-of-order core. The caller passes rows far apart
/// ([`q0_rows`] says why).
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

/// One Q6_K block against one Q8_K block (`bs`: its 16 block sums): the exact block
/// integer `S` of [`dot_q6k_tiled`] spread over 16 lanes (scales applied, the offset of
/// the unsigned quants taken off), for the decode kernels to sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
fn q6k_block_lanes(
    b: &BlockQ6K,
    yb: &BlockQ8K,
    bs: __m256i,
    shift: __m512i,
    idx: &[__m512i; 4],
) -> __m512i {
    let (sc16, sc) = q6k_scales(b);
    let mut sumi = [_mm512_setzero_si512(); 2];
    for n in 0..2 {
        let h = bcast32(&b.qh[32 * n..]);
        let ql = load64(&b.ql[64 * n..]);
        for (g, a) in sumi.iter_mut().enumerate() {
            let qv = q6k_quants(ql, h, g, shift);
            let sg = _mm512_permutexvar_epi16(idx[2 * n + g], sc);
            let yv = load64(&yb.qs[128 * n + 64 * g..]);
            *a = _mm512_dpwssd_epi32(*a, _mm512_maddubs_epi16(qv, yv), sg);
        }
    }
    let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
    _mm512_sub_epi32(
        _mm512_add_epi32(sumi[0], sumi[1]),
        _mm512_inserti64x4::<0>(_mm512_setzero_si512(), off),
    )
}

/// [`dot_q6k_tiled`] for one activation row against `S` weight rows side by side (the
/// M = 1 path), each row's arithmetic exactly that of `dot_q6k_tiled::<1>`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_rows<const S: usize>(
    x: [&[BlockQ6K]; S],
    y: &[BlockQ8K],
    out: &mut [f32; S],
) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q6k_rows: lengths");
    }
    let shift = nibble_shift();
    let idx = q6k_scale_idx();
    let mut acc = [0f32; S];
    for (i, yb) in y.iter().enumerate() {
        let bs = load_bsums(yb);
        for s in 0..S {
            let b = &x[s][i];
            let d = f16c_to_f32(b.d);
            let total = q6k_block_lanes(b, yb, bs, shift, &idx);
            acc[s] = fma1(hsum_i32(total) as f32 * d, yb.d, acc[s]);
        }
    }
    *out = acc;
}

/// `vpermd` indices that turn the pair sums of [`dot_q4k_rows4`] (128-bit lane `k`:
/// rows `k / 2` and `k / 2 + 2`, pairs `[j, j + 2]` with `j = k % 2`) into `[j][row]`:
/// lane `4j + r` holds row `r`'s pair `j`.
const Q4K_ROWS4_OUT: [i32; 16] = [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15];
/// The same for the mins terms (128-bit lane `k`: rows `k / 2` and `k / 2 + 2`, pairs
/// `[2(k % 2), 2(k % 2) + 1]`).
const Q4K_ROWS4_MINS: [i32; 16] = [0, 8, 2, 10, 1, 9, 3, 11, 4, 12, 6, 14, 5, 13, 7, 15];

/// [`dot_q4k_rows`] for four weight rows at once, the rows' chains in the lanes of one
/// vector: each row's arithmetic exactly that of `dot_q4k_gemm::<1>` (the integers of a
/// pair of sub-blocks are exact in any order; per pair `j` in turn
/// `acc = fma(I_j, d·d_a, acc)`, `mins = fma(M_j, dmin·d_a, mins)`, one lane per row).
///
/// Against [`dot_q4k_rows`], which spends most of its time on the per-row horizontal
/// sums and scalar chains: each sub-block's 32 products are taken with one `vpdpbusd`
/// (nibbles times quants, no scale yet; two sub-blocks per register, the activation
/// halves rearranged once per block for all four rows), the sixteen registers of the four
/// rows are summed in one tree down to the 32 sub-block sums, and the scales are applied
/// to the sums (`vpmulld`), not to every product. The caller passes rows far apart
/// ([`q0_rows`] says why).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4(x: [&[BlockQ4K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
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
        let ifl = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(out_idx, isum));
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
        let mfl = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(mins_idx, msum));
        // [d_r] and [dmin_r], times the activation scale: the f32 products d·d_a.
        let t01 = _mm_unpacklo_ps(heads[0].1, heads[1].1);
        let t23 = _mm_unpacklo_ps(heads[2].1, heads[3].1);
        let dy = _mm_set1_ps(yb.d);
        let dd = _mm_mul_ps(_mm_movelh_ps(t01, t23), dy);
        let dm = _mm_mul_ps(_mm_movehl_ps(t23, t01), dy);
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

/// [`dot_q6k_rows`] for four weight rows at once: each row's block integer as there, the
/// four summed side by side ([`hsum4`]), and the rows' chains
/// `acc = fma(S·d, d_a, acc)` in the lanes of one vector (the per-row arithmetic of
/// `dot_q6k_tiled::<1>`, bit for bit). The caller passes rows far apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_rows4(x: [&[BlockQ6K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q6k_rows4: lengths");
    }
    let shift = nibble_shift();
    let idx = q6k_scale_idx();
    let mut acc = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        let bs = load_bsums(yb);
        let mut t = [_mm512_setzero_si512(); 4];
        for (s, ts) in t.iter_mut().enumerate() {
            *ts = q6k_block_lanes(&x[s][i], yb, bs, shift, &idx);
        }
        let s4 = _mm_cvtepi32_ps(hsum4(t[0], t[1], t[2], t[3]));
        let dh = |s: usize| x[s][i].d as i16;
        let d4 = _mm_cvtph_ps(_mm_setr_epi16(dh(0), dh(1), dh(2), dh(3), 0, 0, 0, 0));
        acc = _mm_fmadd_ps(_mm_mul_ps(s4, d4), _mm_set1_ps(yb.d), acc);
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc) };
    *out = o;
}

/// [`q0_rows`] for several activation rows in 512-bit registers, `P` pairs of weight rows
/// at a time: the two rows of a pair in the two halves of each register, so that one
/// `vpdpbusd`, one scale product, one conversion and one fused multiply-add serve both,
/// and each activation block loaded, shifted and broadcast once for all `2P` rows. All
/// `2P` rows far apart (row
/// `t + s * run` for `s < 2P`; [`q0_rows`] says why). The same arithmetic per lane as
/// [`q0_rows`]; `PF` as there. The last `n % 2P` rows: pairs again one at a time, then an
/// odd row alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q0_rows_pairs<B: Q0Pair, const P: usize, const A: usize, const PF: usize>(
    w: &[B],
    nb: usize,
    y: &[Q8_0Side<'_>; A],
    out: &mut [f32],
    stride: usize,
) {
    let n = rows_checked(w.len(), nb, y, out.len(), stride, "q0_rows_pairs");
    let run = n / (2 * P);
    for t in 0..run {
        let xs: [&[B]; 6] = std::array::from_fn(|s| {
            let r = (s.min(2 * P - 1)) * run + t;
            &w[r * nb..(r + 1) * nb]
        });
        let mut acc = [[_mm512_setzero_ps(); A]; P];
        for i in 0..nb {
            // SAFETY: `i < nb`; every activation slice has at least `nb` entries and every
            // `xs[s]` exactly `nb` (checked above); 32 quant bytes and 8 i32 are readable,
            // loadu is unaligned; this function's features include what `unsigned` needs.
            unsafe {
                let mut u = [_mm512_setzero_si512(); P];
                let mut d = [_mm512_setzero_ps(); P];
                for p in 0..P {
                    let (b0, b1) = (xs[2 * p].get_unchecked(i), xs[2 * p + 1].get_unchecked(i));
                    if PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>((b0 as *const B).cast::<i8>().wrapping_add(PF));
                        _mm_prefetch::<_MM_HINT_T0>((b1 as *const B).cast::<i8>().wrapping_add(PF));
                    }
                    u[p] = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(b0.unsigned()),
                        b1.unsigned(),
                    );
                    d[p] = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_cvtph_ps(_mm_set1_epi16(
                            b0.scale_bits() as i16,
                        )))),
                        _mm256_castps_pd(_mm256_cvtph_ps(_mm_set1_epi16(b1.scale_bits() as i16))),
                    ));
                }
                for a in 0..A {
                    let (yb, ys, yl) = y[a];
                    let yv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yb.get_unchecked(i).qs.as_ptr() as *const __m256i,
                    ));
                    let init = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        yl.get_unchecked(i).as_ptr() as *const __m256i,
                    ));
                    let init = if B::SHIFT == 0 {
                        init
                    } else {
                        _mm512_sll_epi32(init, _mm_cvtsi32_si128(B::SHIFT as i32))
                    };
                    let dy = _mm512_set1_ps(*ys.get_unchecked(i));
                    for p in 0..P {
                        let sum = _mm512_dpbusd_epi32(init, u[p], yv);
                        acc[p][a] = _mm512_fmadd_ps(
                            _mm512_mul_ps(d[p], dy),
                            _mm512_cvtepi32_ps(sum),
                            acc[p][a],
                        );
                    }
                }
            }
        }
        for p in 0..P {
            for a in 0..A {
                out[(2 * p * run + t) * stride + a] =
                    super::avx2::hsum_ps(_mm512_castps512_ps256(acc[p][a]));
                out[((2 * p + 1) * run + t) * stride + a] = super::avx2::hsum_ps(hi256(acc[p][a]));
            }
        }
    }
    let done = 2 * P * run;
    if done == n {
        return;
    }
    let (rest, o) = (&w[done * nb..], &mut out[done * stride..]);
    if P > 1 {
        q0_rows_pairs::<B, 1, A, PF>(rest, nb, y, o, stride);
    } else {
        q0_rows::<B, 1, A, 0>(rest, nb, y, o, stride);
    }
}
