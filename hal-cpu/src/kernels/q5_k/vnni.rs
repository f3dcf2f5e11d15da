//! Q5_K weights · Q8_K activations on AVX-512 VNNI, with the tile shape and contract of
//! `q4_k/vnni.rs`, in the order of llama.cpp's tiled K-quant matmul with mins (as
//! `q5_k/avx2.rs`, `flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled`): per block the
//! exact integers `S = sum_j sc_j * dot_j` and `M = sum_j m_j * bsum_j`, then
//! `r = fma(-dmin, M, S * d)` and `acc = fma(r, d_a, acc)`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5K, BlockQ8K};

use crate::kernels::q5_k::avx2::tiled_step;
use crate::kernels::x86::avx2::{head16, hsum8_i32, k4_header, k4_mins_dup, load32, load_bsums};
use crate::kernels::x86::avx512::{
    bcast32, load64, nibble_shift, pair_idx, prefetch_stream, PREFETCH_BLOCKS,
};

/// Q5_K x Q8_K: as Q4_K with the fifth bit of every quant from `qh`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let shift = nibble_shift();
    let idx = pair_idx();
    let mut acc = [0f32; R];
    for (i, b) in x.iter().enumerate() {
        prefetch_stream(x, i + PREFETCH_BLOCKS);
        let (u, ddm) = k4_header(head16(b));
        let d = _mm_cvtss_f32(ddm);
        let dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
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
            let s = _mm512_reduce_add_epi32(_mm512_add_epi32(sumi[r][0], sumi[r][1]));
            let m = hsum8_i32(_mm256_madd_epi16(load_bsums(yb), mins));
            acc[r] = tiled_step(acc[r], s, m, d, dmin, yb.d);
        }
    }
    *out = acc;
}
