//! AVX2 kernels. Each computes `R` dot products of one weight row with `R` activation
//! rows, decoding every weight block once for all `R` rows (the batched tile of M > 1).
//!
//! All functions are `unsafe` only because of `#[target_feature]`: the caller must have
//! checked that the CPU has AVX2, FMA and F16C (done once at device open).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};

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

/// `[a * y, b * y]` of `[a, b, _, _]` as two 8-lane broadcasts.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn scale2(ab: __m128, y: f32) -> (__m256, __m256) {
    let p = _mm_mul_ps(ab, _mm_set1_ps(y));
    (
        _mm256_broadcastss_ps(p),
        _mm256_broadcastss_ps(_mm_movehdup_ps(p)),
    )
}

/// Shuffle mask that broadcasts i16 lane `s` of a 128-bit lane to all 8 of its lanes.
#[inline(always)]
fn bcast16(s: usize) -> i16 {
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
fn load32u(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Loads 32 i8 from `p`.
#[inline]
#[target_feature(enable = "avx2")]
fn load32i(p: &[i8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Q4_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4k<const R: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(u, u));
        let mins = k4_mins_dup(u);
        let mut sumi = [_mm256_setzero_si256(); R];
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
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pa, pb));
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            let pm = _mm256_madd_epi16(load_bsums(yb), mins);
            let (sd, sm) = scale2(ddm, yb.d);
            acc[r] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(sm, _mm256_cvtepi32_ps(pm), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
}

/// Q5_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
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
            let pm = _mm256_madd_epi16(load_bsums(yb), mins);
            let (sd, sm) = scale2(ddm, yb.d);
            acc[r] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(sm, _mm256_cvtepi32_ps(pm), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
}

/// Q6_K x Q8_K. Quants are used unsigned (0..63) and the offset of 32 is taken off
/// through the activation block sums.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q6k<const R: usize>(x: &[BlockQ6K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let d = f16c_to_f32(b.d);
        // The 16 i8 scales as i16: all 16 (for the offset), and each half in both
        // 128-bit lanes (for the per-sub-block shuffles).
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
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(h), m3)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(h), m3)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(h), m3)),
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
                for r in 0..R {
                    let yv = load32i(&y[r][i].qs[128 * n + 32 * k..]);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, yv), s);
                    sumi[r] = _mm256_add_epi32(sumi[r], p);
                }
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            // 32 * sum_k scale_k * bsum_k: the offset of the unsigned quants.
            let off = _mm256_madd_epi16(sc16, load_bsums(yb));
            let s = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32::<5>(off));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * yb.d), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
}

/// Q8_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q8_0<const R: usize>(x: &[BlockQ8_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features are the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q8_0_bytes(b), |b| b.d) }
}

/// The 32 nibbles of a Q4_0/Q5_0 block as bytes: low nibbles (elements 0..16) first.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; loadu is unaligned.
    let t = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Q4_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4_0<const R: usize>(x: &[BlockQ4_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q4_0_bytes(b), |b| b.d) }
}

/// 0xFF in byte `i` where bit `i` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits(bits: u32) -> __m256i {
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    // Byte i%8 of the mask has every bit but bit i%8 set.
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
}

/// The 32 quants of a Q4_0 block as i8 (`q - 8`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q4_0_bytes(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// The 32 quants of a Q5_0 block as i8 (`q - 16`): where the fifth bit is clear the high
/// nibble becomes 0xF (nibble - 16 as i8); where it is set the nibble alone is
/// (16 + nibble) - 16.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q5_0_bytes(b: &BlockQ5_0) -> __m256i {
    let hi = _mm256_andnot_si256(
        bytes_from_bits(u32::from_le_bytes(b.qh)),
        _mm256_set1_epi8(0xF0u8 as i8),
    );
    _mm256_or_si256(nibbles(&b.qs), hi)
}

/// The 32 quants of a Q8_0 block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q8_0_bytes(b: &BlockQ8_0) -> __m256i {
    load32i(&b.qs)
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

/// Q5_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q5_0<const R: usize>(x: &[BlockQ5_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features are the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q5_0_bytes(b), |b| b.d) }
}

/// Loads 8 weights at element `j` of a float row (kind: 0 = F32, 1 = F16, 2 = BF16).
#[inline(always)]
fn load_w8<const KIND: u8>(w: &[u8], j: usize) -> __m256 {
    let es = if KIND == 0 { 4 } else { 2 };
    assert!(w.len() >= (j + 8) * es);
    let p = w[j * es..].as_ptr();
    // SAFETY: bytes j*es .. (j+8)*es lie inside `w` (asserted above); unaligned loads;
    // the enclosing kernel enables AVX2 and F16C.
    unsafe {
        match KIND {
            0 => _mm256_loadu_ps(p as *const f32),
            1 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p as *const __m128i),
            ))),
        }
    }
}

/// Float weights (F32, F16 or BF16 bytes, unaligned) x f32 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_float<const R: usize>(
    kind: super::FloatKind,
    w: &[u8],
    y: &[&[f32]; R],
    out: &mut [f32; R],
) {
    match kind {
        super::FloatKind::F32 => dot_float_k::<0, R>(w, y, out),
        super::FloatKind::F16 => dot_float_k::<1, R>(w, y, out),
        super::FloatKind::BF16 => dot_float_k::<2, R>(w, y, out),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_float_k<const KIND: u8, const R: usize>(w: &[u8], y: &[&[f32]; R], out: &mut [f32; R]) {
    let n = y[0].len();
    for r in 0..R {
        assert!(y[r].len() >= n);
    }
    // Each product in f32, the sum in f64, as the core reference (`vec_dot_f32`) does:
    // the f64 partial sums differ from its single running sum only far below an f32 ulp,
    // so the rounded result matches it (these weights are small: routers, norms).
    let mut a0 = [_mm256_setzero_pd(); R];
    let mut a1 = [_mm256_setzero_pd(); R];
    let mut j = 0;
    while j + 8 <= n {
        let w0 = load_w8::<KIND>(w, j);
        for r in 0..R {
            // SAFETY: y[r] has at least n >= j + 8 values (asserted above).
            let y0 = unsafe { _mm256_loadu_ps(y[r].as_ptr().add(j)) };
            let p = _mm256_mul_ps(w0, y0);
            a0[r] = _mm256_add_pd(a0[r], _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
            a1[r] = _mm256_add_pd(a1[r], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(p)));
        }
        j += 8;
    }
    let kind = match KIND {
        0 => super::FloatKind::F32,
        1 => super::FloatKind::F16,
        _ => super::FloatKind::BF16,
    };
    for r in 0..R {
        let mut l = [0f64; 4];
        // SAFETY: `l` is 4 writable f64; storeu is unaligned.
        unsafe { _mm256_storeu_pd(l.as_mut_ptr(), _mm256_add_pd(a0[r], a1[r])) };
        let mut s = (l[0] + l[2]) + (l[1] + l[3]);
        for t in j..n {
            s += (kind.get(w, t) * y[r][t]) as f64;
        }
        out[r] = s as f32;
    }
}

/// `out[i] = gelu(gate[i]) * up[i]` with `gelu` read from `table` (indexed by the f16
/// bits of the input, rounded to nearest even as `half::f16::from_f32`), inputs at or
/// below -10 giving 0 and at or above 10 themselves: the rounding to f16 of eight inputs
/// at a time with F16C (the `half` crate, built without `std`, rounds in software).
/// NaN inputs give some NaN index either way, whose table entry is 0.
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn gelu_mul_table(table: &[f32], gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        table.len() > usize::from(u16::MAX),
        "gelu_mul_table: table size"
    );
    let n = out.len().min(gate.len()).min(up.len());
    let mut bits = [0u16; 8];
    for c in (0..n).step_by(8) {
        let len = 8.min(n - c);
        if len == 8 {
            // SAFETY: 8 readable f32 at `gate[c..]` and 8 writable u16 in `bits`.
            unsafe {
                let v = _mm256_loadu_ps(gate[c..].as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(bits.as_mut_ptr() as *mut __m128i, h);
            }
        } else {
            for (t, b) in bits.iter_mut().enumerate().take(len) {
                *b = half::f16::from_f32(gate[c + t]).to_bits();
            }
        }
        for t in 0..len {
            let x = gate[c + t];
            let g = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                table[usize::from(bits[t])]
            };
            out[c + t] = g * up[c + t];
        }
    }
}

/// One head's rotation by per-pair cosines and sines `cs` (the first `2 * cs.len()`
/// dims, paired as `kind` says), as `flint_core::math::rope_rotate` computes it (fused
/// multiply-adds where GCC contracts ggml's `rotate_pairs`), with the multiply-adds as
/// FMA instructions rather than calls.
#[target_feature(enable = "fma")]
pub(crate) fn rope_rotate(h: &mut [f32], kind: flint_core::math::RopeKind, cs: &[(f32, f32)]) {
    crate::ops::rope_rotate(h, kind, cs);
}

/// `dst[i]` = the f16 bits of `src[i]` (round to nearest even, as
/// `half::f16::from_f32`), eight at a time.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f16_bits_from(dst: &mut [u16], src: &[f32]) {
    let n = dst.len().min(src.len());
    let (mut d8, mut s8) = (dst[..n].chunks_exact_mut(8), src[..n].chunks_exact(8));
    for (d, s) in (&mut d8).zip(&mut s8) {
        // SAFETY: 8 readable f32 and 8 writable u16 (16 bytes); loadu/storeu are unaligned.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, h);
        }
    }
    for (d, &x) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

/// `dst[i]` = the f16 `src[i]` widened to f32 (exact), eight at a time.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f32_from_f16_bits(dst: &mut [f32], src: &[u16]) {
    let n = dst.len().min(src.len());
    let (mut d8, mut s8) = (dst[..n].chunks_exact_mut(8), src[..n].chunks_exact(8));
    for (d, s) in (&mut d8).zip(&mut s8) {
        // SAFETY: 8 readable u16 (16 bytes) and 8 writable f32; loadu/storeu are unaligned.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (d, &x) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = half::f16::from_bits(x).to_f32();
    }
}

#[cfg(test)]
mod tests {
    /// F16C's widening against `half`'s on every f16.
    #[test]
    fn f16_widening_matches_half() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            eprintln!("no F16C here: nothing to compare");
            return;
        }
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let mut got = vec![0f32; bits.len()];
        // SAFETY: F16C was detected above (AVX with it).
        unsafe { super::f32_from_f16_bits(&mut got, &bits) };
        for (&b, &g) in bits.iter().zip(&got) {
            let want = half::f16::from_bits(b).to_f32();
            if want.is_nan() {
                assert!(g.is_nan(), "{b:#06x}: {g:e} where half gives NaN");
            } else {
                assert_eq!(g.to_bits(), want.to_bits(), "{b:#06x}");
            }
        }
    }

    /// F16C's rounding against `half`'s on every 4099th f32 bit pattern (normals,
    /// subnormals, values that overflow to infinity, ties; NaN only as NaN).
    #[test]
    fn f16_conversions_match_half() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            eprintln!("no F16C here: nothing to compare");
            return;
        }
        let src: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i.wrapping_mul(4099)))
            .chain([
                65504.0,
                65519.0,
                65520.0,
                -65520.0,
                1.0 + f32::EPSILON,
                6.0e-8,
                2.9e-8,
            ])
            .collect();
        let mut bits = vec![0u16; src.len()];
        let mut got = vec![0f32; src.len()];
        // SAFETY: F16C was detected above (AVX with it).
        unsafe {
            super::f16_bits_from(&mut bits, &src);
            super::f32_from_f16_bits(&mut got, &bits);
        }
        for ((&x, &b), &g) in src.iter().zip(&bits).zip(&got) {
            let want = half::f16::from_f32(x).to_f32();
            if !want.is_nan() {
                assert_eq!(b, half::f16::from_f32(x).to_bits(), "{x:e}: f16 bits");
            }
            if want.is_nan() {
                assert!(g.is_nan(), "{x:e}: {g:e} where half gives NaN");
            } else {
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{x:e}: {g:e} vs half's {want:e}"
                );
            }
        }
    }
}
