//! Q6_K weights · Q8_K activations on AVX-512 VNNI, in llama.cpp's tiled matmul's order
//! for every row (`dot_q6k_tiled`; `q4_k/vnni.rs` says why), with its decode forms
//! (`dot_q6k_rows`, `dot_q6k_rows4`, `dot_q6k_rows4_m`). The caller must have checked AVX-512 F/BW/VNNI
//! (and AVX2/FMA/F16C) at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::x86::avx2::{f16c_to_f32, load_bsums};
use crate::kernels::x86::avx512::{
    bcast32, fma1, hsum4, hsum_i32, load64, nibble_shift, prefetch_stream, PREFETCH_BLOCKS,
};

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
        prefetch_stream(x, i + PREFETCH_BLOCKS);
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

/// [`dot_q6k_rows`] for four weight rows at once: each row's block integer summed
/// exactly, the four summed side by side ([`hsum4`]), and the rows' chains
/// `acc = fma(S·d, d_a, acc)` in the lanes of one vector (the per-row arithmetic of
/// `dot_q6k_tiled::<1>`, bit for bit); [`dot_q6k_rows4_m`] with one activation row,
/// whose integer route is the faster one here too. The caller passes rows far apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_rows4(x: [&[BlockQ6K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let mut o = [[0f32; 4]; 1];
    dot_q6k_rows4_m::<1, false>(x, [y], &mut o);
    *out = o[0];
}

/// `vpermw` indices for the scales of [`dot_q6k_rows4_m`]'s packed products: pair `n`
/// packs the 4-quant sums of groups `2n` and `2n + 1` (`vpackssdw`), so 128-bit lane `k`
/// holds four words of sub-block `8n + k`, then four of sub-block `8n + 4 + k`.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn q6k_pack_scale_idx() -> [__m512i; 2] {
    let lane = |s: i16| _mm_set_epi16(s + 4, s + 4, s + 4, s + 4, s, s, s, s);
    let pair = |n: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(lane(8 * n + 1), lane(8 * n))),
            _mm256_set_m128i(lane(8 * n + 3), lane(8 * n + 2)),
        )
    };
    [pair(0), pair(1)]
}

/// [`dot_q6k_rows4`] for `M` activation rows (1 to 4): `out[a][r]` is
/// `dot_q6k_tiled::<1>` of weight row `r` with activation row `a`, bit for bit. Each
/// weight block's quants, scales and scale permutes are decoded once for all `M` rows.
/// Per activation row the block integer is summed exactly another way: `vpdpbusd` of
/// the unsigned quants gives 4-quant sums (|sum| <= 4·63·128, an i16), two groups of
/// them are packed to words and `vpdpwssd` applies the sub-block scales; the offset of
/// the unsigned quants, `-32·Σ sc·bsum`, seeds the sum. The rows' integers are then
/// reduced together ([`hsum4`]) and the chains `acc = fma(S·d, d_a, acc)` run in the
/// lanes of one vector per activation row, as in [`dot_q6k_rows4`]. Where `AMX`, the
/// chains are llama.cpp's AMX order instead (`acc = fma(S, d·d_a, acc)`,
/// `flint_core::dot::ggml_x86::vec_dot_q6_k_q8_k_amx`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q6k_rows4_m<const M: usize, const AMX: bool>(
    x: [&[BlockQ6K]; 4],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; 4]; M],
) {
    let nb = x[0].len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q6k_rows4_m: lengths");
    }
    for ys in &y {
        assert_eq!(ys.len(), nb, "dot_q6k_rows4_m: lengths");
    }
    let shift = nibble_shift();
    let idx = q6k_pack_scale_idx();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm_setzero_ps(); M];
    for i in 0..nb {
        // Per weight row, shared by every activation row: the quants of the four
        // 64-quant groups, the scales of the two packed pairs, and -32·scales (for the
        // offset; |32·sc| <= 4096 fits an i16).
        let mut qv = [[zero; 4]; 4];
        let mut sp = [[zero; 2]; 4];
        let mut nsc = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            let b = &x[r][i];
            prefetch_stream(x[r], i + PREFETCH_BLOCKS);
            let (sc16, sc) = q6k_scales(b);
            nsc[r] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16));
            for n in 0..2 {
                let h = bcast32(&b.qh[32 * n..]);
                let ql = load64(&b.ql[64 * n..]);
                for g in 0..2 {
                    qv[r][2 * n + g] = q6k_quants(ql, h, g, shift);
                }
                sp[r][n] = _mm512_permutexvar_epi16(idx[n], sc);
            }
        }
        let dh = |r: usize| x[r][i].d as i16;
        let d4 = _mm_cvtph_ps(_mm_setr_epi16(dh(0), dh(1), dh(2), dh(3), 0, 0, 0, 0));
        for (a, ya) in y.iter().enumerate() {
            let yb = &ya[i];
            let bs = load_bsums(yb);
            let yv: [__m512i; 4] = std::array::from_fn(|k| load64(&yb.qs[64 * k..]));
            let t: [__m512i; 4] = std::array::from_fn(|r| {
                let mut s = _mm512_zextsi256_si512(_mm256_madd_epi16(nsc[r], bs));
                for n in 0..2 {
                    let p0 = _mm512_dpbusd_epi32(zero, qv[r][2 * n], yv[2 * n]);
                    let p1 = _mm512_dpbusd_epi32(zero, qv[r][2 * n + 1], yv[2 * n + 1]);
                    s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(p0, p1), sp[r][n]);
                }
                s
            });
            let s4 = _mm_cvtepi32_ps(hsum4(t[0], t[1], t[2], t[3]));
            acc[a] = if AMX {
                _mm_fmadd_ps(s4, _mm_mul_ps(d4, _mm_set1_ps(yb.d)), acc[a])
            } else {
                _mm_fmadd_ps(_mm_mul_ps(s4, d4), _mm_set1_ps(yb.d), acc[a])
            };
        }
    }
    for (o, v) in out.iter_mut().zip(acc) {
        // SAFETY: 4 writable f32; storeu is unaligned.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{q6_k_weights as weights, seed, vnni_available};
    use crate::kernels::x16_check::{acts, lcg};

    /// `dot_q6k_rows4_m::<M>`: every output equals `dot_q6k_rows4` of its activation row
    /// and `dot_q6k_tiled::<1>` of its weight and activation rows, bit for bit.
    fn assert_rows4_m<const M: usize>(nb: usize, s: &mut u64) {
        let w: [Vec<BlockQ6K>; 4] = std::array::from_fn(|_| weights(nb, s));
        let ys: [Vec<BlockQ8K>; M] = std::array::from_fn(|_| acts(nb, lcg(s)));
        let x: [&[BlockQ6K]; 4] = std::array::from_fn(|r| &w[r][..]);
        let mut got = [[0f32; 4]; M];
        // SAFETY: the caller checked the kernels' CPU features.
        unsafe { dot_q6k_rows4_m::<M, false>(x, std::array::from_fn(|a| &ys[a][..]), &mut got) };
        for (a, ya) in ys.iter().enumerate() {
            let mut four = [0f32; 4];
            // SAFETY: as above.
            unsafe { dot_q6k_rows4(x, ya, &mut four) };
            for r in 0..4 {
                let mut one = [0f32; 1];
                // SAFETY: as above.
                unsafe { dot_q6k_tiled::<1>(x[r], &[ya], &mut one) };
                let g = got[a][r];
                for (what, want) in [("dot_q6k_rows4", four[r]), ("dot_q6k_tiled", one[0])] {
                    assert!(
                        g.to_bits() == want.to_bits(),
                        "M={M} nb={nb} act {a} row {r}: {g:e} ({:#010x}) vs {what} {want:e} ({:#010x})",
                        g.to_bits(),
                        want.to_bits()
                    );
                }
            }
        }
    }

    /// Random rows and activations (activation quants -128 and 127 included), 1 to 4
    /// activation rows.
    #[test]
    fn rows4_m_equals_rows4_and_tiled_bit_for_bit() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: Q6_K rows4_m kernel not exercised");
            return;
        }
        let mut s = seed("q6_k rows4_m");
        for nb in [1, 2, 3, 8] {
            for _ in 0..8 {
                assert_rows4_m::<1>(nb, &mut s);
                assert_rows4_m::<2>(nb, &mut s);
                assert_rows4_m::<3>(nb, &mut s);
                assert_rows4_m::<4>(nb, &mut s);
            }
        }
    }
}
