//! IQ4_NL weights · Q8_0 activations on AVX-512 VNNI: four weight rows against one
//! activation row (the decode matvec). The caller must have checked AVX-512
//! F/BW/VL/VNNI (and AVX2/FMA/F16C) at device open, and passes rows far apart
//! ([`q0_rows`](crate::kernels::q0::vnni::q0_rows) says why).
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_iq4_nl_q8_0`), bit for bit, per row: per 32-element block the exact
//! integer sum `S` of the code-book values times the activation quants, then
//! `sum = sum + (d_a * d_w) * S` in block order, two `f32` products and one `f32` add (no
//! `fma`), from `sum = 0`. The four rows' sums are the four lanes of one vector, each
//! lane its own row's chain (four independent chains, which hide the add latency one
//! row's chain would expose).
//!
//! `S` is exact whatever the instruction order: the code book is looked up biased by
//! +128 (unsigned bytes 1..=241) for `vpdpbusd`, whose accumulators start from `-128`
//! times the activation lane sums (formed once per group, shared by the rows), so any
//! `i8` activation quant is exact. Eight blocks at a time: per row two registers of four
//! blocks (one block's 16 quant bytes per 128-bit lane), the four rows' lane sums reduced
//! to one `S` per (block, row) in lane `4 * block + row`, the f16 scales gathered into
//! the same layout with word permutes, the products formed lane by lane (the same
//! roundings as the scalar statements) and added to the chains one block at a time; the
//! last `nb % 8` blocks one at a time, in the same order. Each row is prefetched
//! `PREFETCH_AHEAD` blocks ahead.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4NL, BlockQ8_0};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::x86::avx512::{load64, prefetch_stream_bytes};

/// Blocks ahead of the current group that each weight row's stream is prefetched
/// (18-byte blocks: 288 bytes), the group's 144 bytes hinted each time, past the row's
/// end into the stream's next row (the `lowbit` summary's paired ratio 1.00-1.06 ->
/// 1.08-1.12 against stopping at the row's end).
const PREFETCH_AHEAD: usize = 16;

/// The code book plus 128 as unsigned bytes (`vpdpbusd`'s unsigned operand).
const BIASED_BOOK: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as u8) ^ 0x80;
        i += 1;
    }
    t
};

/// `vpermt2w` indices taking, from 128 bytes of eight IQ4_NL blocks, block `w / 4`'s `d`
/// (word `9 * (w / 4)`: the blocks are 18 bytes apart) into word `w`.
const X_D_IDX: [i16; 32] = {
    let mut t = [0i16; 32];
    let mut w = 0;
    while w < 32 {
        t[w] = (9 * (w / 4)) as i16;
        w += 1;
    }
    t
};

/// `vpermt2w` indices taking, from 128 bytes of four Q8_0 blocks, block `w / 4`'s `d`
/// (word `17 * (w / 4)`: the blocks are 34 bytes apart) into word `w < 16` (the upper
/// words are unused).
const Y_D_IDX: [i16; 32] = {
    let mut t = [0i16; 32];
    let mut w = 0;
    while w < 16 {
        t[w] = (17 * (w / 4)) as i16;
        w += 1;
    }
    t
};

/// Four IQ4_NL weight rows (`x`, each `y.len()` blocks) dotted with one Q8_0 activation
/// row `y`: `out[r]` is row `r`'s dot product, bit for bit the scalar reference's.
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_iq4nl_rows4(x: [&[BlockIQ4NL]; 4], y: &[BlockQ8_0], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_iq4nl_rows4: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    let bias = _mm512_set1_epi8(-128);
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let book =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(BIASED_BOOK.as_ptr() as *const __m128i) });
    // SAFETY: 32 readable i16 each; loadu is unaligned.
    let (x_idx, y_idx) = unsafe {
        (
            _mm512_loadu_si512(X_D_IDX.as_ptr() as *const __m512i),
            _mm512_loadu_si512(Y_D_IDX.as_ptr() as *const __m512i),
        )
    };
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        for xs in &x {
            prefetch_stream_bytes(
                xs,
                b + PREFETCH_AHEAD,
                8 * std::mem::size_of::<BlockIQ4NL>(),
            );
        }
        let yg = &y[b..b + 8];
        // Per half h (blocks 4h..4h+4 of the group): the activation quants, 128-bit lane
        // k holding block 4h + k's elements 0..16 (`lo`) and 16..32 (`hi`), and the
        // accumulators' start, -128 times the lane sums of both.
        let mut ylo = [_mm512_setzero_si512(); 2];
        let mut yhi = [_mm512_setzero_si512(); 2];
        let mut start = [_mm512_setzero_si512(); 2];
        for h in 0..2 {
            (ylo[h], yhi[h]) = acts4(&yg[4 * h..4 * h + 4]);
            let z = _mm512_setzero_si512();
            let sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, bias, ylo[h]), bias, yhi[h]);
            start[h] = _mm512_sub_epi32(z, sums);
        }
        // Per half h, per row r: i32 lane 4k + t holds part of S(row r, block 4h + k).
        let mut parts = [[_mm512_setzero_si512(); 4]; 2];
        for (r, xs) in x.iter().enumerate() {
            let xg = &xs[b..b + 8];
            for h in 0..2 {
                let q = qs4(&xg[4 * h..4 * h + 4]);
                let lo = _mm512_shuffle_epi8(book, _mm512_and_si512(q, m4));
                let hi = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                parts[h][r] =
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start[h], lo, ylo[h]), hi, yhi[h]);
            }
        }
        // Per half: lane 4k + r = S(row r, block 4h + k).
        let s = parts.map(|p| sums4(p[0], p[1], p[2], p[3]));
        // The weight scales in the same layout: word 4k + r = row r's d of block k
        // (k < 4: the first half, k >= 4: the second).
        let mut dx = _mm512_setzero_si512();
        for (r, xs) in x.iter().enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(&xs[b..b + 8]);
            let d = _mm512_permutex2var_epi16(load64(bytes), x_idx, load64(&bytes[64..]));
            dx = _mm512_mask_blend_epi16(0x1111_1111 << r, dx, d);
        }
        let dx = [
            _mm512_castsi512_si256(dx),
            _mm512_extracti64x4_epi64::<1>(dx),
        ];
        let ybytes: &[u8] = bytemuck::cast_slice(yg);
        for h in 0..2 {
            // Word 4k + r: block 4h + k's activation d (136 bytes: four Q8_0 blocks).
            let yb = &ybytes[136 * h..];
            let dy = _mm512_permutex2var_epi16(load64(yb), y_idx, load64(&yb[64..]));
            let d = _mm512_mul_ps(
                _mm512_cvtph_ps(_mm512_castsi512_si256(dy)),
                _mm512_cvtph_ps(dx[h]),
            );
            let p = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s[h]));
            acc = _mm_add_ps(acc, _mm512_castps512_ps128(p));
            acc = _mm_add_ps(acc, _mm512_extractf32x4_ps::<1>(p));
            acc = _mm_add_ps(acc, _mm512_extractf32x4_ps::<2>(p));
            acc = _mm_add_ps(acc, _mm512_extractf32x4_ps::<3>(p));
        }
        b += 8;
    }
    // The last `nb % 8` blocks one at a time, in the same order.
    let book = _mm512_castsi512_si128(book);
    let m4 = _mm_set1_epi8(0x0F);
    let bias = _mm_set1_epi8(-128);
    for (i, yb) in y.iter().enumerate().skip(b) {
        // SAFETY: `qs` is 32 readable bytes; loadu is unaligned.
        let (ylo, yhi) = unsafe {
            (
                _mm_loadu_si128(yb.qs.as_ptr() as *const __m128i),
                _mm_loadu_si128(yb.qs[16..].as_ptr() as *const __m128i),
            )
        };
        let z = _mm_setzero_si128();
        let start = _mm_sub_epi32(
            z,
            _mm_dpbusd_epi32(_mm_dpbusd_epi32(z, bias, ylo), bias, yhi),
        );
        let part: [__m128i; 4] = std::array::from_fn(|r| {
            // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
            let q = unsafe { _mm_loadu_si128(x[r][i].qs.as_ptr() as *const __m128i) };
            let lo = _mm_shuffle_epi8(book, _mm_and_si128(q, m4));
            let hi = _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16::<4>(q), m4));
            _mm_dpbusd_epi32(_mm_dpbusd_epi32(start, lo, ylo), hi, yhi)
        });
        let s = _mm512_castsi512_si128(sums4(
            _mm512_castsi128_si512(part[0]),
            _mm512_castsi128_si512(part[1]),
            _mm512_castsi128_si512(part[2]),
            _mm512_castsi128_si512(part[3]),
        ));
        let dx = _mm_cvtph_ps(_mm_setr_epi16(
            x[0][i].d as i16,
            x[1][i].d as i16,
            x[2][i].d as i16,
            x[3][i].d as i16,
            0,
            0,
            0,
            0,
        ));
        let dy = _mm_cvtph_ps(_mm_set1_epi16(yb.d as i16));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(dy, dx), _mm_cvtepi32_ps(s)));
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc) };
    *out = o;
}

/// The quant bytes of four IQ4_NL blocks, block `k`'s 16 in 128-bit lane `k`.
#[inline]
#[target_feature(enable = "avx512f")]
fn qs4(x: &[BlockIQ4NL]) -> __m512i {
    let x: &[BlockIQ4NL; 4] = x.try_into().expect("four blocks");
    // SAFETY: each `qs` is 16 readable bytes; loadu is unaligned.
    unsafe {
        let l = |k: usize| _mm_loadu_si128(x[k].qs.as_ptr() as *const __m128i);
        let v = _mm512_castsi128_si512(l(0));
        let v = _mm512_inserti32x4::<1>(v, l(1));
        let v = _mm512_inserti32x4::<2>(v, l(2));
        _mm512_inserti32x4::<3>(v, l(3))
    }
}

/// The quants of four Q8_0 blocks: block `k`'s elements 0..16 in 128-bit lane `k` of the
/// first register, its elements 16..32 in lane `k` of the second.
#[inline]
#[target_feature(enable = "avx512f")]
fn acts4(y: &[BlockQ8_0]) -> (__m512i, __m512i) {
    let y: &[BlockQ8_0; 4] = y.try_into().expect("four blocks");
    // SAFETY: each `qs` is 32 readable bytes; loadu is unaligned.
    let l = |k: usize| unsafe { _mm256_loadu_si256(y[k].qs.as_ptr() as *const __m256i) };
    // 128-bit lanes [y0 lo, y0 hi, y1 lo, y1 hi] and the same for y2, y3.
    let a01 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l(0)), l(1));
    let a23 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l(2)), l(3));
    (
        _mm512_shuffle_i64x2::<0b10_00_10_00>(a01, a23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(a01, a23),
    )
}

/// Per 128-bit lane `k`: lane `r` of the result is the sum of the four i32 of lane `k` of
/// `p_r` (exact: integer adds).
#[inline]
#[target_feature(enable = "avx512f")]
fn sums4(p0: __m512i, p1: __m512i, p2: __m512i, p3: __m512i) -> __m512i {
    // Per 128-bit lane: [p0_0 + p0_2, p1_0 + p1_2, p0_1 + p0_3, p1_1 + p1_3].
    let a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    let c = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        check_iq4nl_rows4_extremes, check_rows4_random, iq4_nl_weights, q8_0_acts, vnni_available,
    };
    use flint_core::GgmlType;

    /// Four random rows against one activation row, at lengths around the groups of eight
    /// blocks.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: IQ4_NL rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "iq4_nl rows4",
            GgmlType::IQ4_NL,
            dot_iq4nl_rows4,
            iq4_nl_weights,
            q8_0_acts,
            32,
            &[1, 2, 3, 7, 8, 9, 16, 17, 128],
            8,
        );
    }

    /// The code book's extremes.
    #[test]
    fn rows4_extremes_equal_the_scalar_reference() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: IQ4_NL rows4 kernel not exercised");
            return;
        }
        check_iq4nl_rows4_extremes("iq4_nl rows4 extremes", dot_iq4nl_rows4);
    }
}
