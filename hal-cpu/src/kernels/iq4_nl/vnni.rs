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
//!
//! Two kernels compute it: [`dot_iq4nl_rows4`] and, where the CPU has AVX-512 VBMI
//! (`crate::simd::has_vbmi`), [`dot_iq4nl_rows4_vbmi`], which gathers each half's quant
//! bytes with one `vpermt2b` and looks the code book up with `vpermb` (about 12% faster
//! on one core with the weight in cache: 16.3-17.4 -> 18.5-18.7 GiB/s in `lowbit/IQ4_NL`).
//! Both are bound by the vector ALU ports (the shuffle port most), not by the
//! `vpdpbusd`s.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4NL, BlockQ8_0};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::x86::avx512::{load64, prefetch_stream_bytes};

/// Blocks ahead of the current group that each weight row's stream is prefetched
/// (18-byte blocks: 1,152 bytes, about the distance of the other low-bit kernels), the
/// group's 144 bytes hinted each time, past the row's end into the stream's next row. On
/// the 2-core Xeon host (`lowbit` summary, 768 MiB, 2 threads) 16 blocks streamed
/// 24.6-25.7 GB/s, 32 blocks 27.2-27.4, 56 to 112 blocks 28.0-29.4 alike.
const PREFETCH_AHEAD: usize = 64;

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
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let book =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(BIASED_BOOK.as_ptr() as *const __m128i) });
    let k = GroupConsts::new();
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        prefetch_group(&x, b);
        let yg = &y[b..b + 8];
        let ya = GroupActs::new(yg);
        // Per half h, per row r: i32 lane 4k + t holds part of S(row r, block 4h + k).
        let mut parts = [[_mm512_setzero_si512(); 4]; 2];
        for (r, xs) in x.iter().enumerate() {
            let xg = &xs[b..b + 8];
            for h in 0..2 {
                let q = qs4(&xg[4 * h..4 * h + 4]);
                let lo = _mm512_shuffle_epi8(book, _mm512_and_si512(q, m4));
                let hi = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                parts[h][r] = ya.dot(h, lo, hi);
            }
        }
        acc = group_sum(acc, &k, group_scales(&k, &x, b), yg, parts);
        b += 8;
    }
    acc = tail_blocks(acc, &x, y, b);
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc) };
    *out = o;
}

/// [`dot_iq4nl_rows4`] with AVX-512 VBMI (the same order, bit for bit): each row's eight
/// blocks come in as two 64-byte loads and one 16-byte load, `vpermt2b` gathers each
/// half's four blocks of quant bytes from them (in place of four 16-byte loads and three
/// inserts), and `vpermb` looks the nibbles up in the code book repeated four times (its
/// index is six bits wide, so neither nibble needs masking).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub(crate) fn dot_iq4nl_rows4_vbmi(x: [&[BlockIQ4NL]; 4], y: &[BlockQ8_0], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_iq4nl_rows4_vbmi: lengths");
    }
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let book =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(BIASED_BOOK.as_ptr() as *const __m128i) });
    // SAFETY: 64 readable bytes each; loadu is unaligned.
    let qs_idx = unsafe {
        [
            _mm512_loadu_si512(QS_IDX[0].as_ptr() as *const __m512i),
            _mm512_loadu_si512(QS_IDX[1].as_ptr() as *const __m512i),
        ]
    };
    // SAFETY: 64 readable bytes; loadu is unaligned.
    let d_idx = unsafe { _mm512_loadu_si512(D_BYTE_IDX.as_ptr() as *const __m512i) };
    let k = GroupConsts::new();
    let mut acc = _mm_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        prefetch_group(&x, b);
        let yg = &y[b..b + 8];
        let ya = GroupActs::new(yg);
        let mut parts = [[_mm512_setzero_si512(); 4]; 2];
        let mut dx = _mm512_setzero_si512();
        for (r, xs) in x.iter().enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(&xs[b..b + 8]);
            let v0 = load64(bytes);
            let v1 = load64(&bytes[64..]);
            // SAFETY: the group is 144 bytes: 16 readable past the first 128.
            let v2 = _mm512_castsi128_si512(unsafe {
                _mm_loadu_si128(bytes[128..144].as_ptr() as *const __m128i)
            });
            // Blocks 0..4 lie in bytes 0..72, blocks 4..8 in bytes 72..144.
            let q = [
                _mm512_permutex2var_epi8(v0, qs_idx[0], v1),
                _mm512_permutex2var_epi8(v1, qs_idx[1], v2),
            ];
            for h in 0..2 {
                let lo = _mm512_permutexvar_epi8(q[h], book);
                let hi = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(q[h]), book);
                parts[h][r] = ya.dot(h, lo, hi);
            }
            let d = _mm512_permutex2var_epi8(v0, d_idx, v1);
            dx = _mm512_mask_blend_epi16(0x1111_1111 << r, dx, d);
        }
        acc = group_sum(acc, &k, dx, yg, parts);
        b += 8;
    }
    acc = tail_blocks(acc, &x, y, b);
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc) };
    *out = o;
}

/// `vpermt2b` indices gathering, from the 144 bytes of eight IQ4_NL blocks, the quant bytes
/// of blocks `4h..4h + 4` (`h` the half), block `4h + k`'s 16 in 128-bit lane `k`: half 0
/// from bytes 0..128 (block `k`'s quants at `18k + 2`), half 1 from bytes 64..192 (block
/// `4 + k`'s at `72 + 18k + 2`, less 64).
const QS_IDX: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let mut h = 0;
    while h < 2 {
        let mut j = 0;
        while j < 64 {
            t[h][j] = (72 * h + 18 * (j / 16) + 2 + j % 16 - 64 * h) as u8;
            j += 1;
        }
        h += 1;
    }
    t
};

/// `vpermt2b` indices taking, from the first 128 bytes of eight IQ4_NL blocks, block
/// `w / 4`'s `d` (bytes `18 (w / 4)` and one more) into word `w`: [`X_D_IDX`] by bytes.
const D_BYTE_IDX: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        t[j] = (18 * (j / 8) + j % 2) as u8;
        j += 1;
    }
    t
};

/// Each row's stream prefetched [`PREFETCH_AHEAD`] blocks past group `b`.
#[inline]
fn prefetch_group(x: &[&[BlockIQ4NL]; 4], b: usize) {
    for xs in x {
        prefetch_stream_bytes(
            xs,
            b + PREFETCH_AHEAD,
            8 * std::mem::size_of::<BlockIQ4NL>(),
        );
    }
}

/// The scale-gathering indices of [`group_sum`].
struct GroupConsts {
    x_idx: __m512i,
    y_idx: __m512i,
}

impl GroupConsts {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        // SAFETY: 32 readable i16 each; loadu is unaligned.
        unsafe {
            Self {
                x_idx: _mm512_loadu_si512(X_D_IDX.as_ptr() as *const __m512i),
                y_idx: _mm512_loadu_si512(Y_D_IDX.as_ptr() as *const __m512i),
            }
        }
    }
}

/// A group's eight activation blocks, per half `h` (blocks `4h..4h + 4`): the quants,
/// 128-bit lane `k` holding block `4h + k`'s elements 0..16 (`lo`) and 16..32 (`hi`), and
/// the accumulators' start, -128 times the lane sums of both.
struct GroupActs {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
    start: [__m512i; 2],
}

impl GroupActs {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn new(yg: &[BlockQ8_0]) -> Self {
        let bias = _mm512_set1_epi8(-128);
        let mut g = Self {
            lo: [_mm512_setzero_si512(); 2],
            hi: [_mm512_setzero_si512(); 2],
            start: [_mm512_setzero_si512(); 2],
        };
        for h in 0..2 {
            (g.lo[h], g.hi[h]) = acts4(&yg[4 * h..4 * h + 4]);
            let z = _mm512_setzero_si512();
            let sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, bias, g.lo[h]), bias, g.hi[h]);
            g.start[h] = _mm512_sub_epi32(z, sums);
        }
        g
    }

    /// Half `h`'s partial sums of one row from its biased code-book bytes (`lo`: the low
    /// nibbles' values, `hi`: the high nibbles'): i32 lane `4k + t` holds part of that
    /// row's `S` of block `4h + k`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn dot(&self, h: usize, lo: __m512i, hi: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(self.start[h], lo, self.lo[h]),
            hi,
            self.hi[h],
        )
    }
}

/// The weight scales of group `b` in [`group_sum`]'s layout: word `4k + r` holds row `r`'s
/// `d` of block `k`, gathered with `vpermt2w` from each row's 128 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn group_scales(k: &GroupConsts, x: &[&[BlockIQ4NL]; 4], b: usize) -> __m512i {
    let mut dx = _mm512_setzero_si512();
    for (r, xs) in x.iter().enumerate() {
        let bytes: &[u8] = bytemuck::cast_slice(&xs[b..b + 8]);
        let d = _mm512_permutex2var_epi16(load64(bytes), k.x_idx, load64(&bytes[64..]));
        dx = _mm512_mask_blend_epi16(0x1111_1111 << r, dx, d);
    }
    dx
}

/// Adds a group's products to the four chains `acc` (lane `r`: row `r`) block by block:
/// `parts` are the rows' partial sums per half ([`GroupActs::dot`]), `dx` the rows'
/// scales ([`group_scales`]), `yg` the group's activation blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn group_sum(
    mut acc: __m128,
    k: &GroupConsts,
    dx: __m512i,
    yg: &[BlockQ8_0],
    parts: [[__m512i; 4]; 2],
) -> __m128 {
    // Per half: lane 4k + r = S(row r, block 4h + k).
    let s = parts.map(|p| sums4(p[0], p[1], p[2], p[3]));
    // Word 4k + r of the weight scales: k < 4 the first half, k >= 4 the second.
    let dx = [
        _mm512_castsi512_si256(dx),
        _mm512_extracti64x4_epi64::<1>(dx),
    ];
    let ybytes: &[u8] = bytemuck::cast_slice(yg);
    for h in 0..2 {
        // Word 4k + r: block 4h + k's activation d (136 bytes: four Q8_0 blocks).
        let yb = &ybytes[136 * h..];
        let dy = _mm512_permutex2var_epi16(load64(yb), k.y_idx, load64(&yb[64..]));
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
    acc
}

/// The blocks from `b` on (fewer than eight) added to `acc` one at a time, in the same
/// order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn tail_blocks(mut acc: __m128, x: &[&[BlockIQ4NL]; 4], y: &[BlockQ8_0], b: usize) -> __m128 {
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let book = unsafe { _mm_loadu_si128(BIASED_BOOK.as_ptr() as *const __m128i) };
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
    acc
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
/// `p_r` (exact: integer adds). Shifts, adds and blends where they serve (the vector ALU
/// port they share with the shuffles is these kernels' bottleneck), two unpacks.
#[inline]
#[target_feature(enable = "avx512f")]
fn sums4(p0: __m512i, p1: __m512i, p2: __m512i, p3: __m512i) -> __m512i {
    // Per 128-bit lane: [pa_0 + pa_1, pb_0 + pb_1, pa_2 + pa_3, pb_2 + pb_3].
    let pairs = |a: __m512i, b: __m512i| {
        _mm512_mask_blend_epi32(
            0xAAAA,
            _mm512_add_epi32(a, _mm512_srli_epi64::<32>(a)),
            _mm512_add_epi32(b, _mm512_slli_epi64::<32>(b)),
        )
    };
    let (c, d) = (pairs(p0, p1), pairs(p2, p3));
    _mm512_add_epi32(_mm512_unpacklo_epi64(c, d), _mm512_unpackhi_epi64(c, d))
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

    fn vbmi_available() -> bool {
        vnni_available() && is_x86_feature_detected!("avx512vbmi")
    }

    /// The VBMI kernel, as the two tests above.
    #[test]
    fn rows4_vbmi_equals_the_scalar_reference_bit_for_bit() {
        if !vbmi_available() {
            eprintln!("no AVX-512 VBMI: IQ4_NL rows4 VBMI kernel not exercised");
            return;
        }
        check_rows4_random(
            "iq4_nl rows4 vbmi",
            GgmlType::IQ4_NL,
            dot_iq4nl_rows4_vbmi,
            iq4_nl_weights,
            q8_0_acts,
            32,
            &[1, 2, 3, 7, 8, 9, 16, 17, 128],
            8,
        );
        check_iq4nl_rows4_extremes("iq4_nl rows4 vbmi extremes", dot_iq4nl_rows4_vbmi);
    }
}
