//! Q4_K weights · Q8_K activations on AVX2: `dot_q4k`, `R` dot products of one weight
//! row with `R` activation rows, decoding every weight block once for all `R` rows (the
//! batched tile of M > 1), and the decode forms `dot_q4k_rows4` / `dot_q4k_rows4_m`, four
//! weight rows against one to four activation rows. The caller must have checked AVX2,
//! FMA and F16C at device open.
//!
//! The float steps are those of llama.cpp's repacked Q4_K gemm (`q4_K_8x8`, the AVX-512
//! VNNI kernels' order, `flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_repack` with
//! `Q4kPath::Gemm`, docs/parity.md): per pair `j` of 32-quant sub-blocks the exact
//! integers `I_j = sc_2j·dot_2j + sc_2j+1·dot_2j+1` and `M_j = m_2j·bs_2j +
//! m_2j+1·bs_2j+1`, then `acc = fma(I_j, d·d_a, acc)` and `mins = fma(M_j, dmin·d_a,
//! mins)`, the result `acc - mins`. So every SIMD level computes the same bits, and a
//! CPU without AVX-512 VNNI reproduces llama.cpp's logits as one with it does.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::x86::avx2::{bcast16, head16, k4_header, load32i, load32u, load_bsums};
use crate::kernels::x86::avx512::{prefetch_stream, PREFETCH_BLOCKS};

/// Q4_K x Q8_K, for at most four activation rows (`R`): each row's float chains in
/// its own lane of one 128-bit vector.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k<const R: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    assert!(R <= 4, "dot_q4k: at most four activation rows");
    let m4 = _mm256_set1_epi8(0x0F);
    // Lane r: activation row r's sums (lanes past R carry zeros).
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        // The eight scales as i16 in both 128-bit lanes (for the per-sub-block shuffles),
        // the eight mins as i16.
        let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
        let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(u, u));
        // Per row and pair j: eight i32 lanes that sum to I_j.
        let mut v = [[_mm256_setzero_si256(); 4]; R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j)));
            let s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(bcast16(2 * j + 1)));
            for r in 0..R {
                let yq = &y[r][i].qs;
                let ya = load32i(&yq[64 * j..]);
                let yb = load32i(&yq[64 * j + 32..]);
                let pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ya), s_lo);
                let pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yb), s_hi);
                v[r][j] = _mm256_add_epi32(pa, pb);
            }
        }
        // Per row: [I_0, I_1, I_2, I_3] and [M_0, M_1, M_2, M_3] as floats (exact
        // integers), then transposed so that vector j holds I_j (M_j) of every row.
        let mut fi = [_mm_setzero_ps(); 4];
        let mut fm = [_mm_setzero_ps(); 4];
        let mut da = [0f32; 4];
        for r in 0..R {
            let yb = &y[r][i];
            // The four pairs' lanes summed (exact integers).
            let t01 = _mm256_hadd_epi32(v[r][0], v[r][1]);
            let t23 = _mm256_hadd_epi32(v[r][2], v[r][3]);
            let t = _mm256_hadd_epi32(t01, t23);
            let isum = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            // bs_s = bsums[2s] + bsums[2s+1] (at most 4096 in magnitude: an i16), then
            // the pairs of m_s·bs_s in one multiply-add.
            let b = load_bsums(yb);
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let msum = _mm_madd_epi16(mins, bs);
            (fi[r], fm[r]) = (_mm_cvtepi32_ps(isum), _mm_cvtepi32_ps(msum));
            da[r] = yb.d;
        }
        let fi = transpose4(fi);
        let fm = transpose4(fm);
        // d·d_a and dmin·d_a: one f32 product per row.
        // SAFETY: 4 readable f32; loadu is unaligned.
        let dav = unsafe { _mm_loadu_ps(da.as_ptr()) };
        let dd = _mm_mul_ps(_mm_shuffle_ps::<0x00>(ddm, ddm), dav);
        let dm = _mm_mul_ps(_mm_shuffle_ps::<0x55>(ddm, ddm), dav);
        // The chains in order j = 0..4, one fma per row and pair (each row in its lane).
        for j in 0..4 {
            acc = _mm_fmadd_ps(fi[j], dd, acc);
            accm = _mm_fmadd_ps(fm[j], dm, accm);
        }
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc, accm)) };
    out.copy_from_slice(&o[..R]);
}

/// The 4 x 4 transpose of f32 lanes: lane `r` of result `j` is lane `j` of `a[r]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose4(a: [__m128; 4]) -> [__m128; 4] {
    let t0 = _mm_unpacklo_ps(a[0], a[1]);
    let t1 = _mm_unpacklo_ps(a[2], a[3]);
    let t2 = _mm_unpackhi_ps(a[0], a[1]);
    let t3 = _mm_unpackhi_ps(a[2], a[3]);
    [
        _mm_movelh_ps(t0, t1),
        _mm_movehl_ps(t1, t0),
        _mm_movelh_ps(t2, t3),
        _mm_movehl_ps(t3, t2),
    ]
}

/// One Q8_K activation block arranged for [`dot_q4k_rows4`] (once per matvec, for every
/// weight row): per pair `j` of sub-blocks, `qs[2j]` = quants 0..16 of sub-block `2j` then
/// of `2j + 1`, `qs[2j + 1]` = quants 16..32 of both, matching a weight chunk's 16 bytes
/// broadcast to both 128-bit lanes, low nibbles in the low lane, high in the high; the
/// sub-blocks' activation sums `bs_s = bsums[2s] + bsums[2s + 1]`; the block's `d`.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Q8KPairs {
    qs: [[i8; 32]; 8],
    bs: [i16; 8],
    d: f32,
}

impl Q8KPairs {
    /// `y`'s blocks arranged, into `out` (cleared first).
    pub(crate) fn arrange(y: &[BlockQ8K], out: &mut Vec<Q8KPairs>) {
        out.clear();
        out.extend(y.iter().map(|b| {
            let mut qs = [[0i8; 32]; 8];
            for j in 0..4 {
                let q = &b.qs[64 * j..64 * j + 64];
                qs[2 * j][..16].copy_from_slice(&q[..16]);
                qs[2 * j][16..].copy_from_slice(&q[32..48]);
                qs[2 * j + 1][..16].copy_from_slice(&q[16..32]);
                qs[2 * j + 1][16..].copy_from_slice(&q[48..]);
            }
            let bs = std::array::from_fn(|s| b.bsums[2 * s] + b.bsums[2 * s + 1]);
            Q8KPairs { qs, bs, d: b.d }
        }));
    }
}

/// `pshufb` controls that spread scale byte `2j` over the low 128-bit lane's i16 lanes
/// and byte `2j + 1` over the high lane's (`u` holds the eight scales in bytes 0..8).
const Q4K_PAIR_SCALES: [[i8; 32]; 4] = {
    let mut m = [[0i8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 16 {
            let (lo, hi) = if b % 2 == 0 {
                ((2 * j) as i8, (2 * j + 1) as i8)
            } else {
                (-128, -128)
            };
            m[j][b] = lo;
            m[j][16 + b] = hi;
            b += 1;
        }
        j += 1;
    }
    m
};

/// [`dot_q4k`]`::<1>` for four weight rows at once, each row's float steps exactly its
/// (per pair `j` in turn `acc = fma(I_j, d·d_a, acc)`, `mins = fma(M_j, dmin·d_a,
/// mins)`, then `acc - mins`; the integers are exact in any order): the decode kernel of
/// this level. Against the single-row kernel (two scale broadcasts per sub-block, a
/// transpose and a chain per row): a weight chunk's halves are broadcast-loaded so that
/// one scale vector serves a pair of sub-blocks, and the four rows' integers (`I_j`
/// beside `M_j`) are transposed together so that both float chains of all four rows run
/// in the lanes of one vector (`flint_hal::ab_test` on the qwen3moe bench preset's
/// decode at this level: steps 0.86x the single-row kernel's). The caller passes rows
/// far apart (each stream is prefetched a few blocks ahead, past the row's end) and the
/// activation row arranged once ([`Q8KPairs`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4(x: [&[BlockQ4K]; 4], y: &[Q8KPairs], out: &mut [f32; 4]) {
    let mut o = [[0f32; 4]; 1];
    dot_q4k_rows4_m::<1>(x, [y], &mut o);
    *out = o[0];
}

/// [`dot_q4k_rows4`] against `M` activation rows (1 to 4, each arranged): each weight
/// block's scales and nibbles decoded once for them all, each (weight row, activation
/// row) pair's arithmetic exactly that of [`dot_q4k`] (the small batches of a c = 4
/// decode step).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k_rows4_m<const M: usize>(
    x: [&[BlockQ4K]; 4],
    y: [&[Q8KPairs]; M],
    out: &mut [[f32; 4]; M],
) {
    let nb = y.first().map_or(0, |y| y.len());
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q4k_rows4: lengths");
    }
    for ys in &y {
        assert_eq!(ys.len(), nb, "dot_q4k_rows4: activation lengths");
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    // SAFETY: 32 readable bytes each; loadu is unaligned.
    let pair_sc: [__m256i; 4] = std::array::from_fn(|j| unsafe {
        _mm256_loadu_si256(Q4K_PAIR_SCALES[j].as_ptr() as *const __m256i)
    });
    let mins_idx = _mm_setr_epi8(
        8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128,
    );
    // [d_0..d_3 | dmin_0..dmin_3] from [d_0, dmin_0, d_1, dmin_1, ...].
    let dd_idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let mut acc = [_mm256_setzero_ps(); M];
    for i in 0..nb {
        // SAFETY: 8 readable i16 each; loadu is unaligned.
        let bs: [__m128i; M] = std::array::from_fn(|a| unsafe {
            _mm_loadu_si128(y[a][i].bs.as_ptr() as *const __m128i)
        });
        let mut z = [[_mm256_setzero_si256(); 4]; M];
        let mut hdr = [0i32; 4];
        for r in 0..4 {
            let b = &x[r][i];
            prefetch_stream(x[r], i + PREFETCH_BLOCKS);
            let h = head16(b);
            hdr[r] = i32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let (u, _) = k4_header(h);
            let u2 = _mm256_broadcastsi128_si256(u);
            let mins = _mm_shuffle_epi8(u, mins_idx);
            // Per pair j: the chunk's two halves (low nibbles in the low 128-bit lane,
            // high in the high) and the pair's scale vector.
            let mut qs = [[_mm256_setzero_si256(); 2]; 4];
            for (j, qj) in qs.iter_mut().enumerate() {
                // SAFETY: 16 readable bytes each at `qs[32j..]` and `qs[32j + 16..]`.
                let (qa, qb) = unsafe {
                    (
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            b.qs[32 * j..].as_ptr() as *const __m128i
                        )),
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            b.qs[32 * j + 16..].as_ptr() as *const __m128i
                        )),
                    )
                };
                *qj = [
                    _mm256_and_si256(_mm256_srlv_epi32(qa, shift), m4),
                    _mm256_and_si256(_mm256_srlv_epi32(qb, shift), m4),
                ];
            }
            let sc: [__m256i; 4] = std::array::from_fn(|j| _mm256_shuffle_epi8(u2, pair_sc[j]));
            for a in 0..M {
                let ya = &y[a][i];
                // Per pair j: eight i32 lanes that sum to I_j.
                let v: [__m256i; 4] = std::array::from_fn(|j| {
                    // SAFETY: 32 readable bytes each, 32-byte aligned.
                    let (y0, y1) = unsafe {
                        (
                            _mm256_load_si256(ya.qs[2 * j].as_ptr() as *const __m256i),
                            _mm256_load_si256(ya.qs[2 * j + 1].as_ptr() as *const __m256i),
                        )
                    };
                    // Four products a lane (at most 4 * 15 * 128): no overflow in i16.
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(qs[j][0], y0),
                        _mm256_maddubs_epi16(qs[j][1], y1),
                    );
                    _mm256_madd_epi16(p, sc[j])
                });
                // Per 128-bit lane: the sums of v0..v3's four lanes there.
                let q =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
                // [I_0..I_3 | M_0..M_3].
                let msum = _mm_madd_epi16(mins, bs[a]);
                z[a][r] = _mm256_add_epi32(
                    _mm256_blend_epi32::<0xF0>(q, _mm256_setzero_si256()),
                    _mm256_permute2x128_si256::<0x21>(q, _mm256_castsi128_si256(msum)),
                );
            }
        }
        // [d_r | dmin_r] of the four rows.
        let h = _mm_setr_epi32(hdr[0], hdr[1], hdr[2], hdr[3]);
        let dw = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), dd_idx);
        for a in 0..M {
            let z = &z[a];
            // f[j] = [I_j of rows 0..4 | M_j of rows 0..4].
            let (lo01, lo23) = (
                _mm256_unpacklo_epi32(z[0], z[1]),
                _mm256_unpacklo_epi32(z[2], z[3]),
            );
            let (hi01, hi23) = (
                _mm256_unpackhi_epi32(z[0], z[1]),
                _mm256_unpackhi_epi32(z[2], z[3]),
            );
            let f = [
                _mm256_unpacklo_epi64(lo01, lo23),
                _mm256_unpackhi_epi64(lo01, lo23),
                _mm256_unpacklo_epi64(hi01, hi23),
                _mm256_unpackhi_epi64(hi01, hi23),
            ];
            // [d_r·d_a | dmin_r·d_a]: one f32 product per row.
            let dd = _mm256_mul_ps(dw, _mm256_set1_ps(y[a][i].d));
            for fj in f {
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fj), dd, acc[a]);
            }
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        let r = _mm_sub_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        // SAFETY: 4 writable f32; storeu is unaligned.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), r) };
    }
}

/// [`dot_q4k_rows4`] for a single row (the last rows of a chunk).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k_row(x: [&[BlockQ4K]; 1], y: &[Q8KPairs], out: &mut [f32; 1]) {
    let mut o = [0f32; 4];
    dot_q4k_rows4([x[0]; 4], y, &mut o);
    out[0] = o[0];
}
