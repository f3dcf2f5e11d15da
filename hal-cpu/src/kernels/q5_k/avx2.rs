//! Q5_K weights · Q8_K activations on AVX2 (the tile shape and contract of
//! `q4_k/avx2.rs`), in the order of llama.cpp's tiled K-quant matmul with mins (the
//! AVX-512 VNNI kernels', `flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`): per block
//! the exact integers `S = sum_j sc_j * dot_j` and `M = sum_j m_j * bsum_j`, then
//! `r = fma(-dmin, M, S * d)` and `acc = fma(r, d_a, acc)`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5K, BlockQ8K};

use crate::kernels::x86::avx2::{
    bcast16, head16, hsum8_i32, k4_header, k4_mins_dup, load32, load32i, load32u, load_bsums,
    reduce8,
};
use crate::kernels::x86::avx512::{prefetch_stream, PREFETCH_BLOCKS};

/// Q5_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        let d = _mm_cvtss_f32(ddm);
        let dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
        let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
        let mins = k4_mins_dup(u);
        let hbits = load32(&b.qh);
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let (h_lo, h_hi) = q5k_high(hbits, j);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
            let s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j)));
            let s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j + 1)));
            for r in 0..R {
                let yq = &y[r][i].qs;
                let ya = load32i(&yq[64 * j..]);
                let yb = load32i(&yq[64 * j + 32..]);
                let pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ya), s_lo);
                let pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yb), s_hi);
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pa, pb));
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            let s = hsum8_i32(sumi[r]);
            let m = hsum8_i32(_mm256_madd_epi16(load_bsums(yb), mins));
            acc[r] = tiled_step(acc[r], s, m, d, dmin, yb.d);
        }
    }
    *out = acc;
}

/// One block of the tiled order with mins: `r = fma(-dmin, M, S * d)`, then
/// `fma(r, d_a, acc)` (`flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`'s step), for
/// the block's exact integers `s` and `m`. Shared by this level's kernel and `vnni.rs`.
#[inline(always)]
pub(crate) fn tiled_step(acc: f32, s: i32, m: i32, d: f32, dmin: f32, d_a: f32) -> f32 {
    (-dmin).mul_add(m as f32, s as f32 * d).mul_add(d_a, acc)
}

/// The fifth bits of the 64 quants `64j .. 64j+64` of a Q5_K block as 0x10 bytes: bit 2j
/// of `qh[l]` belongs to element `64j + l`, bit 2j+1 to `64j + 32 + l`. (A 16-bit shift
/// by < 8 keeps bit 0 of every byte inside that byte.)
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q5k_high(hbits: __m256i, j: usize) -> (__m256i, __m256i) {
    let (h_lo, h_hi) = match j {
        0 => (hbits, _mm256_srli_epi16::<1>(hbits)),
        1 => (_mm256_srli_epi16::<2>(hbits), _mm256_srli_epi16::<3>(hbits)),
        2 => (_mm256_srli_epi16::<4>(hbits), _mm256_srli_epi16::<5>(hbits)),
        _ => (_mm256_srli_epi16::<6>(hbits), _mm256_srli_epi16::<7>(hbits)),
    };
    let one = _mm256_set1_epi8(1);
    (
        _mm256_slli_epi16::<4>(_mm256_and_si256(h_lo, one)),
        _mm256_slli_epi16::<4>(_mm256_and_si256(h_hi, one)),
    )
}

/// [`dot_q5k`]`::<1>` for four weight rows at once (each `y.len()` blocks), each row's
/// float steps exactly its own ([`tiled_step`] per block, the four rows in the lanes of
/// one vector): the decode kernel of this level. Per row and block the exact `S` and `M`
/// as [`dot_q5k`] forms them; the four rows' eight integers reduced together
/// ([`reduce8`]). The caller passes rows far apart (each stream is prefetched a few
/// blocks ahead, past the row's end).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5k_rows4(x: [&[BlockQ5K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q5k_rows4: lengths");
    }
    let m4 = _mm256_set1_epi8(0x0F);
    // Lane r: row r's sum.
    let mut acc = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_BLOCKS);
        }
        let bs = load_bsums(yb);
        let mut v = [_mm256_setzero_si256(); 8];
        let mut h = [0i16; 8];
        for r in 0..4 {
            let b = &x[r][i];
            let (u, _) = k4_header(head16(b));
            (h[r], h[4 + r]) = (b.d as i16, b.dmin as i16);
            let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
            let hbits = load32(&b.qh);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q = load32u(&b.qs[32 * j..]);
                let (h_lo, h_hi) = q5k_high(hbits, j);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
                let s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j)));
                let s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j + 1)));
                let pa =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32i(&yb.qs[64 * j..])), s_lo);
                let pb = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, load32i(&yb.qs[64 * j + 32..])),
                    s_hi,
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pa, pb));
            }
            v[r] = sumi;
            v[4 + r] = _mm256_madd_epi16(bs, k4_mins_dup(u));
        }
        // [S_0..S_3 | M_0..M_3] and [d_0..d_3 | dmin_0..dmin_3].
        let sm = _mm256_cvtepi32_ps(reduce8(v));
        // SAFETY: 16 readable bytes; loadu is unaligned.
        let dd = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr() as *const __m128i) });
        let d = _mm256_castps256_ps128(dd);
        // -dmin: the sign flipped (exact, as the scalar `-dmin`).
        let ndmin = _mm_xor_ps(_mm256_extractf128_ps::<1>(dd), _mm_set1_ps(-0.0));
        let s = _mm256_castps256_ps128(sm);
        let m = _mm256_extractf128_ps::<1>(sm);
        let r = _mm_fmadd_ps(ndmin, m, _mm_mul_ps(s, d));
        acc = _mm_fmadd_ps(r, _mm_set1_ps(yb.d), acc);
    }
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
}

/// One Q5_K row · one Q8_K row in the same order: the rows of a chunk left over beside
/// [`dot_q5k_rows4`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5k_row(x: [&[BlockQ5K]; 1], y: &[BlockQ8K], out: &mut [f32; 1]) {
    dot_q5k::<1>(x[0], &[y], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{avx2_available, q8k_acts, seed};
    use crate::kernels::x16_check::lcg;

    /// The four-row kernel gives each row what the single-row kernel gives it (the order
    /// the tiled reference fixes, checked against it in `tests/tinyblas_order.rs`), bit for
    /// bit, for random rows (the extremes of the scales, mins and quants included).
    #[test]
    fn rows4_equal_the_row_kernel_bit_for_bit() {
        if !avx2_available() {
            eprintln!("no AVX2: Q5_K rows4 kernel not exercised");
            return;
        }
        let mut s = seed("q5_k avx2 rows4");
        let block = |s: &mut u64| {
            let mut b: BlockQ5K = bytemuck::Zeroable::zeroed();
            let bytes: &mut [u8] = bytemuck::bytes_of_mut(&mut b);
            bytes.iter_mut().for_each(|v| *v = lcg(s) as u8);
            b.d = crate::kernels::order_check::f16_scale(s);
            b.dmin = crate::kernels::order_check::f16_scale(s);
            b
        };
        for nb in [1, 2, 3, 5, 11, 16] {
            for _ in 0..16 {
                let x: [Vec<BlockQ5K>; 4] =
                    std::array::from_fn(|_| (0..nb).map(|_| block(&mut s)).collect());
                let y = q8k_acts(nb, &mut s);
                let mut got = [0f32; 4];
                // SAFETY: AVX2, FMA and F16C checked above.
                unsafe { dot_q5k_rows4(std::array::from_fn(|r| &x[r][..]), &y, &mut got) };
                for r in 0..4 {
                    let mut want = [0f32; 1];
                    // SAFETY: as above.
                    unsafe { dot_q5k::<1>(&x[r], &[&y], &mut want) };
                    assert!(
                        got[r].to_bits() == want[0].to_bits(),
                        "nb={nb} row {r}: {:e} vs {:e}",
                        got[r],
                        want[0]
                    );
                }
            }
        }
    }
}
