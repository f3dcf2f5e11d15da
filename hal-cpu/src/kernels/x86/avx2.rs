//! AVX2 helpers shared by the kernels of several formats: loads, broadcasts, horizontal
//! sums, f16 widening, and the 12-byte scale header Q4_K and Q5_K share.
//!
//! All functions are `unsafe` only because of `#[target_feature]`: the caller must have
//! checked that the CPU has AVX2, FMA and F16C (done once at device open).

use std::arch::x86_64::*;

use flint_core::blocks::BlockQ8K;

/// A value on a 32-byte boundary: a kernel's buffer of broadcast sources, stored whole
/// and read back a dword or quadword at a time (a store split over two cache lines
/// does not forward to those loads).
#[repr(C, align(32))]
pub(crate) struct Aligned32<T>(pub(crate) T);

/// IEEE half bits to f32 with the F16C instruction: the hardware form of
/// `flint_core::dequant::f16_to_f32` (the `half` crate, built without `std`, converts in
/// software, which dominated the legacy-type kernels).
#[inline]
#[target_feature(enable = "f16c")]
pub(crate) fn f16c_to_f32(b: u16) -> f32 {
    // A broadcast rather than an insert: an insert into whatever register the compiler
    // picks made the conversion wait on the accumulator chain.
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(b as i16)))
}

/// IEEE half bits to f32, in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn f16_bcast(b: u16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(b as i16))
}

/// The first 16 bytes of a Q4_K/Q5_K block (`d`, `dmin`, 12 bytes of scales) unpacked:
/// the 6-bit scales and mins as 16 bytes (scales 0..8, mins 8..16; the bit layout of
/// ggml's `get_scale_min_k4`, four at a time in 32-bit lanes) and `[d, dmin, _, _]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn k4_header(h: &[u8; 16]) -> (__m128i, __m128) {
    // SAFETY: `h` is 16 readable bytes; loadu is unaligned.
    let v = unsafe { _mm_loadu_si128(h.as_ptr() as *const __m128i) };
    // Lanes: [d|dmin, a, b, c] with a, b, c the three u32 of scale bytes.
    let p = _mm_shuffle_epi32::<0b11_10_11_01>(v); // [a, c, b, c]
    let q = _mm_shuffle_epi32::<0b10_10_01_01>(v); // [a, a, b, b]
                                                   // Scales/mins 0..4: low 6 bits of a / b.
    let lo = _mm_and_si128(p, _mm_set1_epi32(0x3f3f_3f3f));
    // Scales/mins 4..8: low / high nibbles of c, the top 2 bits of a / b above them.
    let nib = _mm_and_si128(
        _mm_srlv_epi32(p, _mm_setr_epi32(0, 0, 0, 4)),
        _mm_set1_epi32(0x0f0f_0f0f),
    );
    let top = _mm_slli_epi32::<4>(_mm_and_si128(
        _mm_srli_epi32::<6>(q),
        _mm_set1_epi32(0x0303_0303),
    ));
    let hi = _mm_or_si128(nib, top);
    let sm = _mm_blend_epi32::<0b1010>(lo, hi);
    (sm, _mm_cvtph_ps(v))
}

/// The first 16 bytes of a block.
#[inline(always)]
pub(crate) fn head16<B: bytemuck::Pod>(b: &B) -> &[u8; 16] {
    let bytes = bytemuck::bytes_of(b);
    bytes[..16]
        .try_into()
        .expect("blocks are longer than 16 bytes")
}

/// Shuffle mask that broadcasts i16 lane `s` of a 128-bit lane to all 8 of its lanes.
#[inline(always)]
pub(crate) fn bcast16(s: usize) -> i16 {
    (((2 * s + 1) << 8) | (2 * s)) as i16
}

/// The i16 vector `[m0, m0, m1, m1, ..., m7, m7]` from the unpacked mins, to meet the 16
/// activation block sums (two per sub-block of 32).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn k4_mins_dup(u: __m128i) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(u, u))
}

/// Loads the 16 block sums of a Q8_K block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load_bsums(y: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16 = 32 readable bytes; loadu is unaligned.
    unsafe { _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i) }
}

/// Horizontal sum of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Loads 32 bytes from `p` (no alignment needed).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load32(p: &[u8; 32]) -> __m256i {
    // SAFETY: `p` is a valid reference to 32 bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Loads the first 32 bytes of `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load32u(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Loads 32 i8 from `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load32i(p: &[i8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Eight vectors of eight i32 lanes to the eight vectors' sums, vector `j`'s in lane `j`
/// (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn reduce8(v: [__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: the half-sums of v0..v3 (resp. v4..v7).
    let q0 = _mm256_hadd_epi32(h01, h23);
    let q1 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256::<0x20>(q0, q1);
    let hi = _mm256_permute2x128_si256::<0x31>(q0, q1);
    _mm256_add_epi32(lo, hi)
}

/// The sum of eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// The 32 four-bit codes of a 16-byte block as bytes, in element order: low nibbles
/// (elements 0..16), then high nibbles (16..32).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
    let t = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// A 16-entry i8 code book in both 128-bit lanes, for [`nibbles`] looked up with
/// `vpshufb`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn codebook(book: &[i8; 16]) -> __m256i {
    // SAFETY: the table is 16 readable bytes; loadu is unaligned.
    let t = unsafe { _mm_loadu_si128(book.as_ptr() as *const __m128i) };
    _mm256_broadcastsi128_si256(t)
}

/// `sum_{e in 4l..4l+4} w[e] * a[e]` in i32 lane `l`, for i8 weights `w` (with `aw` their
/// magnitudes) and i8 activations `a`: `|w|` times `a` with `w`'s sign, summed in pairs by
/// `vpmaddubsw`, then in fours. Exact where no activation is -128 (whose negation would
/// wrap) and no pair of products leaves i16, which holds for every Flint activation
/// quantizer (quants in -127..=127) and weights of magnitude at most 128.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn signed_lanes(w: __m256i, aw: __m256i, a: __m256i) -> __m256i {
    let sa = _mm256_sign_epi8(a, w);
    _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), _mm256_set1_epi16(1))
}

/// Eight IEEE half values widened to f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn f16x8(h: [u16; 8]) -> __m256 {
    // SAFETY: `h` is 16 readable bytes; loadu is unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr() as *const __m128i) })
}

/// Adds the eight lanes of `p` to `acc` one after the other, lane 0 first.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn add_in_order(p: __m256, acc: &mut f32) {
    let mut f = [0f32; 8];
    // SAFETY: `f` is 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(f.as_mut_ptr(), p) };
    for v in f {
        *acc += v;
    }
}
/// The 8 x 8 transpose of 32-bit lanes: lane `r` of result `j` is lane `j` of `a[r]`
/// (24 shuffles; the AVX2 panel decoders and the attention's scores).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8(a: [__m256i; 8]) -> [__m256i; 8] {
    // Pairs of rows interleaved by dwords, then pairs of pairs by quadwords, then the
    // 128-bit halves put in place.
    let mut b = [_mm256_setzero_si256(); 8];
    for p in (0..8).step_by(2) {
        b[p] = _mm256_unpacklo_epi32(a[p], a[p + 1]);
        b[p + 1] = _mm256_unpackhi_epi32(a[p], a[p + 1]);
    }
    // c[g + e] (g = 0, 4): rows g..g + 4, dword e in the low half and e + 4 in the high.
    let mut c = [_mm256_setzero_si256(); 8];
    for g in [0, 4] {
        c[g] = _mm256_unpacklo_epi64(b[g], b[g + 2]);
        c[g + 1] = _mm256_unpackhi_epi64(b[g], b[g + 2]);
        c[g + 2] = _mm256_unpacklo_epi64(b[g + 1], b[g + 3]);
        c[g + 3] = _mm256_unpackhi_epi64(b[g + 1], b[g + 3]);
    }
    let mut t = [_mm256_setzero_si256(); 8];
    for e in 0..4 {
        t[e] = _mm256_permute2x128_si256::<0x20>(c[e], c[4 + e]);
        t[4 + e] = _mm256_permute2x128_si256::<0x31>(c[e], c[4 + e]);
    }
    t
}
