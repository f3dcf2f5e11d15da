//! Q6_K weights · Q8_K activations on AVX2 (the tile shape and contract of
//! `q4_k/avx2.rs`), in the order of llama.cpp's tiled K-quant matmul (the AVX-512 VNNI
//! kernels', `flint_core::dot::ggml_x86::vec_dot_q6_k_q8_k_tiled`): per block the exact
//! integer `S = sum_s sc_s * sum (q - 32) y` over the sixteen sub-blocks, then
//! `acc = fma(S * d, d_a, acc)`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::x86::avx2::{bcast16, f16c_to_f32, load32i, load32u, load_bsums};
use crate::kernels::x86::avx512::{prefetch_stream, PREFETCH_BLOCKS};

/// Q6_K x Q8_K. Quants are used unsigned (0..63) and the offset of 32 is taken off
/// through the activation block sums.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q6k<const R: usize>(x: &[BlockQ6K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    assert!(R <= 4, "dot_q6k: at most four activation rows");
    // Lane r: activation row r's sum (lanes past R carry zeros).
    let mut acc = _mm_setzero_ps();
    for (i, b) in x.iter().enumerate() {
        let d = f16c_to_f32(b.d);
        let s = block_sums::<R>(b, std::array::from_fn(|r| &y[r][i]));
        // The rows' sums reduced together into the lanes of one vector (exact integers).
        let mut t = [_mm256_setzero_si256(); 4];
        let mut da = [0f32; 4];
        for r in 0..R {
            t[r] = s[r];
            da[r] = y[r][i].d;
        }
        let sums = reduce4(t);
        // (s as f32 * d).mul_add(d_a, acc) per row, each in its lane.
        let fs = _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_set1_ps(d));
        // SAFETY: 4 readable f32; loadu is unaligned.
        acc = _mm_fmadd_ps(fs, unsafe { _mm_loadu_ps(da.as_ptr()) }, acc);
    }
    let mut o = [0f32; 4];
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), acc) };
    out.copy_from_slice(&o[..R]);
}

/// Per activation block of `y`: eight i32 lanes that sum to `b`'s exact integer with it,
/// `S = sum_s sc_s * sum (q - 32) y` (the quants taken unsigned, 32 times the scaled
/// block sums taken off; the high bits moved into place with one shift and one mask
/// each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_sums<const R: usize>(b: &BlockQ6K, y: [&BlockQ8K; R]) -> [__m256i; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    // The 16 i8 scales as i16: all 16 (for the offset), and each half in both 128-bit
    // lanes (for the per-sub-block shuffles).
    // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
    let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
    let sc16 = _mm256_cvtepi8_epi16(sc8);
    let halves = [
        _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
        _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
    ];
    let mut sumi = [_mm256_setzero_si256(); R];
    for n in 0..2 {
        let ql0 = load32u(&b.ql[64 * n..]);
        let ql1 = load32u(&b.ql[64 * n + 32..]);
        let h = load32u(&b.qh[32 * n..]);
        // Bit pairs 0, 1, 2, 3 of `h` moved to bits 4..6 of each byte.
        let q = [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(h, m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
            ),
        ];
        for (k, qk) in q.iter().enumerate() {
            // Lanes 0..8 of maddubs come from elements 0..16 (one sub-block), lanes
            // 8..16 from the next sub-block: scales 2k and 2k+1 of this half.
            let s = _mm256_shuffle_epi8(
                halves[n],
                _mm256_set_m128i(
                    _mm_set1_epi16(bcast16(2 * k + 1)),
                    _mm_set1_epi16(bcast16(2 * k)),
                ),
            );
            for (sr, yr) in sumi.iter_mut().zip(&y) {
                let yv = load32i(&yr.qs[128 * n + 32 * k..]);
                *sr = _mm256_add_epi32(*sr, _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, yv), s));
            }
        }
    }
    // 32 * sum_k scale_k * bsum_k: the offset of the unsigned quants.
    std::array::from_fn(|r| {
        let off = _mm256_madd_epi16(sc16, load_bsums(y[r]));
        _mm256_sub_epi32(sumi[r], _mm256_slli_epi32::<5>(off))
    })
}

/// Lane `r`: the sum of `t[r]`'s eight lanes (exact integers).
#[inline]
#[target_feature(enable = "avx2")]
fn reduce4(t: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// [`dot_q6k`]`::<1>` for four weight rows at once against one activation row, each
/// row's arithmetic exactly its (the block's exact integer `S`, then
/// `acc = fma(S * d, d_a, acc)`): the decode kernel of this level. The four rows'
/// integers are reduced in one tree and their chains run in the lanes of one vector,
/// where the single-row kernel reduces each row alone. The caller passes rows far apart
/// (each stream is prefetched a few blocks ahead).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q6k_rows4(x: [&[BlockQ6K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
    let nb = y.len();
    for xs in &x {
        assert_eq!(xs.len(), nb, "dot_q6k_rows4: lengths");
    }
    let mut acc = _mm_setzero_ps();
    for (i, yb) in y.iter().enumerate() {
        let mut t = [_mm256_setzero_si256(); 4];
        let mut d = [0u16; 4];
        for r in 0..4 {
            let b = &x[r][i];
            prefetch_stream(x[r], i + PREFETCH_BLOCKS);
            d[r] = b.d;
            [t[r]] = block_sums(b, [yb]);
        }
        let sums = reduce4(t);
        // SAFETY: 4 readable u16 (8 bytes); loadl is unaligned.
        let dh = unsafe { _mm_loadl_epi64(d.as_ptr() as *const __m128i) };
        // (S as f32 * d).mul_add(d_a, acc) per row, each in its lane.
        let fs = _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_cvtph_ps(dh));
        acc = _mm_fmadd_ps(fs, _mm_set1_ps(yb.d), acc);
    }
    // SAFETY: 4 writable f32; storeu is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
}

/// [`dot_q6k_rows4`] for a single row (the last rows of a chunk).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q6k_row(x: [&[BlockQ6K]; 1], y: &[BlockQ8K], out: &mut [f32; 1]) {
    let mut o = [0f32; 4];
    dot_q6k_rows4([x[0]; 4], y, &mut o);
    out[0] = o[0];
}
