//! Q5_K weights · Q8_K activations on AVX-512 VNNI, in Flint's own order (one 16-lane
//! float accumulator per row), with the tile shape and contract of `q4_k/vnni.rs`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5K, BlockQ8K};

use crate::kernels::x86::avx2::{
    head16, hsum_ps, k4_header, k4_mins_dup, load32, load_bsums, scale2,
};
use crate::kernels::x86::avx512::{
    bcast32, load64, nibble_shift, pair_idx, prefetch, PREFETCH_BLOCKS,
};

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
        out[r] = _mm512_reduce_add_ps(acc[r]) - hsum_ps(accm[r]);
    }
}
