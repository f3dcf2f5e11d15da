//! Q2_K weights · Q8_K activations on AVX-512 VNNI: the decode matvec's four weight rows
//! against one activation row (`dot_q2k_rows4`). The caller must have checked AVX-512
//! F/BW/VL/VNNI (and AVX2/FMA/F16C) at device open.
//!
//! Order: per row that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_q2_K_q8_K`) and of `avx2.rs`, bit for bit: per 256-element block the
//! exact integers `I = sum_g sc_g * dot_g` (the sixteen 16-element groups, 4-bit scales)
//! and `M = sum_g m_g * bsum_g` (4-bit mins, the activation's group sums), then
//! `sum = sum + ((d_a * d_w) * I - (d_a * dmin_w) * M)` in block order, plain `f32`
//! products, difference and add (no `fma`), from `sum = 0`. The integers are exact
//! whatever the order of their adds; the float operations are the reference's, one row's
//! chain per vector lane (the four rows' chains side by side, never mixed).
//!
//! Element `e = 128k + 32j + l` is bits `2j` of `qs[32k + l]`: one 64-byte load of a
//! row's quants holds the four 2-bit planes `j`, each against the activation vector
//! `A_j = [qs_a[32j..32j + 32] | qs_a[128 + 32j..128 + 32j + 32]]`, built once per block
//! for the four rows. A `vpdpbusd` of plane `j` has in its 128-bit lane `c` the four
//! partial sums of group `G(c, j)` = `2j`, `2j + 1`, `8 + 2j`, `9 + 2j` (`c` = 0..4).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ2K, BlockQ8K};

use crate::kernels::x86::avx2::{load32i, load_bsums};
use crate::kernels::x86::avx512::{load64, prefetch_stream};

/// Blocks ahead of the current one that each row's stream is prefetched (12 x 84 bytes):
/// the paired read-loop ratio of the `lowbit` bench (1 GiB, 2 threads, Intel Xeon host)
/// went 0.88 -> 1.02 with it against 4 blocks.
const PREFETCH_AHEAD: usize = 12;

/// The group of 128-bit lane `c` of plane `j`'s dot products.
const fn group(c: usize, j: usize) -> usize {
    [2 * j, 2 * j + 1, 8 + 2 * j, 9 + 2 * j][c]
}

/// `vpermw` indices of plane `j`'s scale words for a `vpackssdw` of the plane's dot
/// products of two rows: word `8c + t` is scale `G(c, j)` of the first row (words 0..16
/// of the pair's register) for `t < 4`, of the second (words 16..32) above.
const fn scale_idx(j: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut p = 0;
    while p < 32 {
        let (c, t) = (p / 8, p % 8);
        idx[p] = (if t < 4 { 0 } else { 16 } + group(c, j)) as i16;
        p += 1;
    }
    idx
}

/// [`scale_idx`] of the four planes.
const SCALE_IDX: [[i16; 32]; 4] = [scale_idx(0), scale_idx(1), scale_idx(2), scale_idx(3)];

/// The scale words that are taken times 4, in both rows' halves of a pair's register:
/// those of the even planes' groups (`g % 4 < 2`; planes 0 and 2 take the quants as they
/// are, planes 1 and 3 as `4q`).
const EVEN_PLANES: __mmask32 = 0x3333_3333;

/// `vpermt2d` indices of the last sums, from `e` (indices 0..16; 128-bit lane `k`:
/// `[P_0, P_1, P_2, P_3]`, the four rows' partials of `4 I` in lane `k`) and `m` (16..32;
/// 128-bit lane `k`: partials of `16 M`, `[m01, m23, m01, m23]` with `m01` row 0 in lanes
/// 0 and 1, row 1 in lanes 2 and 3, `m23` rows 2 and 3 alike): the two vectors whose sum
/// has in lane `2r + 8h` the `h`-th half of `4 I_r` and in lane `2r + 1 + 8h` that of
/// `16 M_r`.
const fn final_idx(second: bool) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut p = 0;
    while p < 16 {
        let (h, r, is_min) = (p / 8, (p % 8) / 2, p % 2 == 1);
        // The four terms of output (r, is_min): f takes terms 2h, g terms 2h + 1.
        let term = 2 * h + if second { 1 } else { 0 };
        idx[p] = if !is_min {
            // 4 I_r: lane r of each 128-bit lane of e.
            (4 * term + r) as i32
        } else {
            // 16 M_r: rows 0 and 2 in 128-bit lanes 0, 1 of m, rows 1 and 3 in lanes 2, 3;
            // rows 0 and 1 in words 0 and 2 (m01), rows 2 and 3 in words 1 and 3 (m23).
            let lane = if r % 2 == 0 { 0 } else { 2 } + term / 2;
            let word = (r / 2) + 2 * (term % 2);
            (16 + 4 * lane + word) as i32
        };
        p += 1;
    }
    idx
}

/// [`final_idx`] of the two vectors.
const FINAL_IDX: [[i32; 16]; 2] = [final_idx(false), final_idx(true)];

/// The shifts that turn `4 I_r` (even lanes) and `16 M_r` (odd lanes) into `I_r` and
/// `M_r` (exact: both are multiples).
const DOWN: [i32; 8] = [2, 4, 2, 4, 2, 4, 2, 4];

/// Loads 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn load16(p: &[u8; 16]) -> __m128i {
    // SAFETY: `p` is 16 readable bytes; loadu is unaligned.
    unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) }
}

/// A row's `d` and `dmin` half bits as one u32 (`d` low).
#[inline(always)]
fn d_dmin(b: &BlockQ2K) -> i32 {
    (u32::from(b.d) | (u32::from(b.dmin) << 16)) as i32
}

/// Four Q2_K weight rows (each `y.len()` blocks) · one Q8_K activation row: `out[r]` is
/// row `r`'s dot product, bit for bit `flint_core::dot::vec_dot` of that row (the order
/// is in the file's header).
///
/// Per block and pair of rows `(0, 1)`, `(2, 3)`: each row's four planes against the
/// shared `A_j` (`vpdpbusd`; planes 1 and 3 taken as `4q`, unshifted), plane `j` of the
/// two rows packed to words (`vpackssdw`: the partial sums are below 2^15 in magnitude,
/// 4 x 16 x 3 x 127) and times the plane's scale words of both rows (`vpmaddwd`; the
/// even planes' scales times 4, so that every product is `4 sc dot`), the mins times 16
/// (the scale bytes' high nibbles in place) against the block sums (`vpmaddwd`); then
/// the four rows' `4I` and `16M` summed side by side and shifted down (exact). The
/// caller passes rows far apart (a matvec streams four weight rows; each is prefetched a
/// few blocks ahead).
///
/// # Panics
/// If a weight row's length is not `y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q2k_rows4(x: [&[BlockQ2K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q2k_rows4: lengths");
    }
    let m3 = _mm512_set1_epi8(0x03);
    let m12 = _mm512_set1_epi8(0x0C);
    let m15 = _mm512_set1_epi16(0x0F);
    let m240 = _mm512_set1_epi16(0xF0);
    // SAFETY: 32 readable i16 or 16 readable i32 each, 8 readable i32; loadu is
    // unaligned.
    let (sidx, fidx, down) = unsafe {
        (
            SCALE_IDX.map(|v| _mm512_loadu_si512(v.as_ptr() as *const __m512i)),
            FINAL_IDX.map(|v| _mm512_loadu_si512(v.as_ptr() as *const __m512i)),
            _mm256_loadu_si256(DOWN.as_ptr() as *const __m256i),
        )
    };
    // Lane 2r: row r's chain; odd lanes unused.
    let mut acc = _mm256_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        let b: [&BlockQ2K; 4] = std::array::from_fn(|r| &x[r][i]);
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        let a: [__m512i; 4] = std::array::from_fn(|j| {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(load32i(&yb.qs[32 * j..])),
                load32i(&yb.qs[128 + 32 * j..]),
            )
        });
        let bs = load_bsums(yb);
        let bs2 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bs), bs);
        let z = _mm512_setzero_si512();
        // A row's four planes' dot products (128-bit lane c of plane j: group G(c, j)).
        let planes = |b: &BlockQ2K| -> [__m512i; 4] {
            let q = load64(&b.qs[..]);
            let q4 = _mm512_srli_epi16::<4>(q);
            [
                _mm512_dpbusd_epi32(z, _mm512_and_si512(q, m3), a[0]),
                _mm512_dpbusd_epi32(z, _mm512_and_si512(q, m12), a[1]),
                _mm512_dpbusd_epi32(z, _mm512_and_si512(q4, m3), a[2]),
                _mm512_dpbusd_epi32(z, _mm512_and_si512(q4, m12), a[3]),
            ]
        };
        // Per pair of rows: the scaled dot products (128-bit lane c: two lanes of the
        // first row, then two of the second) and the mins terms times 16 (i32 lane t:
        // groups 2t, 2t + 1 of the first row below lane 8, of the second above).
        let mut prod = [z; 2];
        let mut mins = [z; 2];
        for p in 0..2 {
            let (b0, b1) = (b[2 * p], b[2 * p + 1]);
            let raw = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(load16(&b0.scales)),
                load16(&b1.scales),
            );
            let w = _mm512_cvtepu8_epi16(raw);
            mins[p] = _mm512_madd_epi16(_mm512_and_si512(w, m240), bs2);
            let s = _mm512_and_si512(w, m15);
            let s = _mm512_mask_slli_epi16::<2>(s, EVEN_PLANES, s);
            let (d0, d1) = (planes(b0), planes(b1));
            let sc = |j: usize| _mm512_permutexvar_epi16(sidx[j], s);
            let pk = |j: usize| _mm512_packs_epi32(d0[j], d1[j]);
            let mut t = _mm512_madd_epi16(pk(0), sc(0));
            for j in 1..4 {
                t = _mm512_dpwssd_epi32(t, pk(j), sc(j));
            }
            prod[p] = t;
        }
        // 128-bit lane k of e: [P_0, P_1, P_2, P_3], the rows' sums of lane k; of m:
        // [m01, m23, m01, m23], each the sum of two lanes of mins[0] or mins[1].
        let (f0, f1) = (_mm512_castsi512_ps(prod[0]), _mm512_castsi512_ps(prod[1]));
        let e = _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(f0, f1)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(f0, f1)),
        );
        let m = _mm512_add_epi32(
            _mm512_unpacklo_epi32(mins[0], mins[1]),
            _mm512_unpackhi_epi32(mins[0], mins[1]),
        );
        let h = _mm512_add_epi32(
            _mm512_permutex2var_epi32(e, fidx[0], m),
            _mm512_permutex2var_epi32(e, fidx[1], m),
        );
        // [4 I_0, 16 M_0, 4 I_1, 16 M_1, ...], then [I_0, M_0, I_1, M_1, ...].
        let im = _mm256_add_epi32(_mm512_castsi512_si256(h), _mm512_extracti64x4_epi64::<1>(h));
        let im = _mm256_cvtepi32_ps(_mm256_srav_epi32(im, down));
        // [d_0, dmin_0, d_1, dmin_1, ...] times d_a: [dall_0, dmin_0, ...].
        let dw = _mm256_cvtph_ps(_mm_setr_epi32(
            d_dmin(b[0]),
            d_dmin(b[1]),
            d_dmin(b[2]),
            d_dmin(b[3]),
        ));
        let p = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(yb.d), dw), im);
        // Even lanes: dall * I - dmin * M.
        acc = _mm256_add_ps(acc, _mm256_sub_ps(p, _mm256_movehdup_ps(p)));
    }
    let mut o = [0f32; 8];
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc) };
    *out = [o[0], o[2], o[4], o[6]];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{
        check_q2k_rows4_extremes, check_rows4_random, q2_k_weights, q8k_acts, vnni_available,
    };

    use flint_core::GgmlType;

    /// Random rows and activations: each output equals its row's scalar reference.
    #[test]
    fn rows4_equals_the_scalar_reference_bit_for_bit() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: Q2_K rows4 kernel not exercised");
            return;
        }
        check_rows4_random(
            "q2_k rows4",
            GgmlType::Q2_K,
            dot_q2k_rows4,
            q2_k_weights,
            q8k_acts,
            256,
            &[1, 2, 3, 5, 11, 16],
            16,
        );
    }

    /// The extremes of every integer.
    #[test]
    fn rows4_equals_the_scalar_reference_at_the_extremes() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: Q2_K rows4 kernel not exercised");
            return;
        }
        check_q2k_rows4_extremes("q2_k rows4 extremes", dot_q2k_rows4);
    }
}
