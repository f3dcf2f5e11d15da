//! Q4_K weights · Q8_K activations on AVX-512 (F + BW): 64 quants per instruction. Same
//! tile shape and contract as `q4_k/avx2.rs`; the caller must have checked AVX-512F/BW
//! (and AVX2/FMA/F16C) at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::x86::avx2::{
    bcast16, head16, hsum_ps, k4_header, k4_mins_dup, load32u, load_bsums, scale2,
};
use crate::kernels::x86::avx512::{join, load64};

/// Q4_K x Q8_K: per 32 bytes of quants, low and high nibbles side by side in one
/// register meet 64 contiguous activation quants.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q4k<const R: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        // The 8 scales as i16, in every 128-bit lane.
        let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(u));
        let mins = k4_mins_dup(u);
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let qv = join(lo, hi);
            let s = _mm512_shuffle_epi8(
                sc,
                join(
                    _mm256_set1_epi16(bcast16(2 * j)),
                    _mm256_set1_epi16(bcast16(2 * j + 1)),
                ),
            );
            for r in 0..R {
                let yv = load64(&y[r][i].qs[64 * j..]);
                let p = _mm512_madd_epi16(_mm512_maddubs_epi16(qv, yv), s);
                sumi[r] = _mm512_add_epi32(sumi[r], p);
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            let pm = _mm256_madd_epi16(load_bsums(yb), mins);
            let (sd, sm) = scale2(ddm, yb.d);
            acc[r] = _mm512_fmadd_ps(
                _mm512_broadcastss_ps(_mm256_castps256_ps128(sd)),
                _mm512_cvtepi32_ps(sumi[r]),
                acc[r],
            );
            accm[r] = _mm256_fmadd_ps(sm, _mm256_cvtepi32_ps(pm), accm[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]) - hsum_ps(accm[r]);
    }
}
