//! IQ4_XS weights · Q8_K activations on AVX-512 VNNI: a decode's matvec, four weight
//! rows against one activation row ([`dot_iq4xs_rows4`]). The caller must have checked
//! AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C) at device open, and passes rows far apart
//! (`q0::vnni::q0_rows` says why).
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_iq4_xs_q8_K`) for each row, bit for bit, as `avx2.rs`: per 32-element
//! sub-block `ib` the exact integer `S_ib`, then `sum = sum + ((d_w * d_a) * (ls_ib - 32))
//! * S_ib` in block and sub-block order, `f32` products and adds (no `fma`).
//!
//! How: `vpdpbusd` multiplies unsigned by signed bytes, so the code book is looked up
//! biased by +128 (1..=241) and `128 · sum(a)` of the sub-block (from the activation's
//! block sums) is subtracted from the integer sum: exact. A register holds four
//! sub-blocks, one per 128-bit lane: the low nibbles (elements 0..16) against one
//! arrangement of the activation and the high nibbles (16..32) against another, both
//! built once per block for the four rows. The four rows' float sums are four
//! independent chains, so their adds overlap where one row's would wait on the last.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4XS, BlockQ8K};
use flint_core::dequant::KVALUES_IQ4NL;

use super::avx2::sub_scales;
use crate::kernels::x86::avx2::{f16c_to_f32, load_bsums};
use crate::kernels::x86::avx512::{load64, prefetch_stream};

/// Blocks ahead of the current one that each row's stream is prefetched (8 x 136 bytes):
/// the paired read-loop ratio of the `lowbit` bench (1 GiB, 2 threads, Intel Xeon host)
/// went 0.93 -> 0.96 with it against 4 blocks.
const PREFETCH_AHEAD: usize = 8;

/// The code book biased by +128, as unsigned bytes.
const BOOK_U8: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// Lane `4k + j` of a row pair's sums holds sub-block `k + 4 (j & 1)`: the activation
/// correction's lanes in that order.
const CORR_IDX: [i32; 16] = [0, 4, 0, 4, 1, 5, 1, 5, 2, 6, 2, 6, 3, 7, 3, 7];

/// The scales of a row pair (`a` lanes 0..8, `b` lanes 16..24 of `permutex2var`) in the
/// order of its sums: lane `4k + j` takes sub-block `k + 4 (j & 1)` of row `j / 2`.
const PAIR_IDX: [i32; 16] = [0, 4, 16, 20, 1, 5, 17, 21, 2, 6, 18, 22, 3, 7, 19, 23];

/// Per 128-bit lane `k`, the sums of sub-blocks `k` and `k + 4` of a row, unreduced:
/// `[d0[0] + d0[2], d1[0] + d1[2], d0[1] + d0[3], d1[1] + d1[3]]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(d0: __m512i, d1: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1))
}

/// Two rows' folded sums to lane `4k + j`: sub-block `k + 4 (j & 1)` of row `j / 2`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair(t0: __m512i, t1: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1))
}

/// Four IQ4_XS rows (`x`, equal lengths) · one Q8_K row `y` (quants in -127..=127, block
/// sums exact, as every Flint quantizer writes them).
///
/// # Panics
/// If a weight row's length differs from the activation row's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_iq4xs_rows4(x: [&[BlockIQ4XS]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_iq4xs_rows4: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY (each load): 16 readable bytes / i32s; loadu is unaligned.
    let book = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(BOOK_U8.as_ptr().cast()) });
    let (corr_idx, pair_idx) = unsafe {
        (
            _mm512_loadu_si512(CORR_IDX.as_ptr().cast()),
            _mm512_loadu_si512(PAIR_IDX.as_ptr().cast()),
        )
    };
    let mut acc = [0f32; 4];
    for (i, yb) in y.iter().enumerate() {
        for xs in &x {
            prefetch_stream(xs, i + PREFETCH_AHEAD);
        }
        // Sub-blocks 0..4 (`lo0`, `hi0`) and 4..8: 128-bit lane k takes elements 0..16
        // (resp. 16..32) of sub-block k (resp. k + 4).
        let (y0, y1) = (load64(&yb.qs[..]), load64(&yb.qs[64..]));
        let (y2, y3) = (load64(&yb.qs[128..]), load64(&yb.qs[192..]));
        let lo0 = _mm512_shuffle_i64x2::<0b10_00_10_00>(y0, y1);
        let hi0 = _mm512_shuffle_i64x2::<0b11_01_11_01>(y0, y1);
        let lo1 = _mm512_shuffle_i64x2::<0b10_00_10_00>(y2, y3);
        let hi1 = _mm512_shuffle_i64x2::<0b11_01_11_01>(y2, y3);
        // 128 times each sub-block's activation sum, in the sums' lane order.
        let bs = _mm256_madd_epi16(load_bsums(yb), _mm256_set1_epi16(128));
        let corr = _mm512_permutexvar_epi32(corr_idx, _mm512_castsi256_si512(bs));
        let mut t = [_mm512_setzero_si512(); 4];
        let mut dls = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let b = &x[r][i];
            let (q0, q1) = (load64(&b.qs[..64]), load64(&b.qs[64..]));
            let z = _mm512_setzero_si512();
            let look = |q: __m512i| _mm512_shuffle_epi8(book, _mm512_and_si512(q, m4));
            let d0 = _mm512_dpbusd_epi32(z, look(q0), lo0);
            let d0 = _mm512_dpbusd_epi32(d0, look(_mm512_srli_epi16::<4>(q0)), hi0);
            let d1 = _mm512_dpbusd_epi32(z, look(q1), lo1);
            let d1 = _mm512_dpbusd_epi32(d1, look(_mm512_srli_epi16::<4>(q1)), hi1);
            t[r] = fold(d0, d1);
            // `(d_w * d_a) * (ls - 32)` per sub-block, as the reference rounds it.
            dls[r] = _mm256_mul_ps(_mm256_set1_ps(f16c_to_f32(b.d) * yb.d), sub_scales(b));
        }
        let s01 = _mm512_sub_epi32(pair(t[0], t[1]), corr);
        let s23 = _mm512_sub_epi32(pair(t[2], t[3]), corr);
        let d = |a: __m256, b: __m256| {
            _mm512_permutex2var_ps(
                _mm512_castps256_ps512(a),
                pair_idx,
                _mm512_castps256_ps512(b),
            )
        };
        let p01 = _mm512_mul_ps(d(dls[0], dls[1]), _mm512_cvtepi32_ps(s01));
        let p23 = _mm512_mul_ps(d(dls[2], dls[3]), _mm512_cvtepi32_ps(s23));
        let (mut f01, mut f23) = ([0f32; 16], [0f32; 16]);
        // SAFETY: 16 writable f32 each; storeu is unaligned.
        unsafe {
            _mm512_storeu_ps(f01.as_mut_ptr(), p01);
            _mm512_storeu_ps(f23.as_mut_ptr(), p23);
        }
        for ib in 0..8 {
            let l = 4 * (ib % 4) + ib / 4;
            acc[0] += f01[l];
            acc[1] += f01[l + 2];
            acc[2] += f23[l];
            acc[3] += f23[l + 2];
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{iq4_xs_weights, q8k_acts, seed, vnni_available};

    use flint_core::GgmlType;

    fn check(rows: &[Vec<BlockIQ4XS>; 4], y: &[BlockQ8K]) {
        let mut got = [0f32; 4];
        // SAFETY: the caller checked the VNNI level's features.
        unsafe { dot_iq4xs_rows4(std::array::from_fn(|r| &rows[r][..]), y, &mut got) };
        for (r, g) in got.iter().enumerate() {
            let want = flint_core::dot::vec_dot(
                GgmlType::IQ4_XS,
                bytemuck::cast_slice(&rows[r]),
                bytemuck::cast_slice(y),
                256 * y.len(),
            )
            .expect("reference");
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "row {r} of {} blocks: {g:e} vs reference {want:e}",
                y.len()
            );
        }
    }

    /// Four rows at once equal the scalar reference row by row, bit for bit.
    #[test]
    fn rows4_equals_the_scalar_reference_bit_for_bit() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: IQ4_XS rows4 kernel not exercised");
            return;
        }
        let mut s = seed("iq4_xs rows4");
        for nb in [1, 2, 3, 5, 11, 16] {
            for _ in 0..8 {
                let rows = std::array::from_fn(|_| iq4_xs_weights(nb, &mut s));
                check(&rows, &q8k_acts(nb, &mut s));
            }
        }
    }

    /// The code book's extremes with activations at +-127 (the bias and its
    /// correction at their largest).
    #[test]
    fn rows4_extremes_equal_the_scalar_reference() {
        if !vnni_available() {
            eprintln!("no AVX-512 VNNI: IQ4_XS rows4 kernel not exercised");
            return;
        }
        let mut s = seed("iq4_xs rows4 extremes");
        for (code, act) in [(0x00u8, 127i8), (0x00, -127), (0xFF, 127), (0xFF, -127)] {
            let mut y = q8k_acts(3, &mut s);
            for b in &mut y {
                b.qs = [act; 256];
                b.bsums = [16 * act as i16; 16];
            }
            let rows = std::array::from_fn(|r| {
                let mut w = iq4_xs_weights(3, &mut s);
                for b in &mut w {
                    b.qs = [code; 128];
                    b.scales_l = [if r % 2 == 0 { 0xFF } else { 0 }; 4];
                    b.scales_h = if r < 2 { 0xFFFF } else { 0 };
                }
                w
            });
            check(&rows, &y);
        }
    }
}
