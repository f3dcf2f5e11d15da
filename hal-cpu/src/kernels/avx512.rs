//! AVX-512 (F + BW) kernels: 64 quants per instruction. Same tile shape and contract
//! as the AVX2 kernels; the caller must have checked AVX-512F/BW (and AVX2/FMA/F16C)
//! at device open.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};

use super::avx2::{
    f16c_to_f32, head16, k4_header, k4_mins_dup, load32, load_bsums, q4_0_bytes, q5_0_bytes,
    q5k_high, q8_0_bytes, scale2,
};

/// Loads the first 32 bytes of `p`.
#[inline]
#[target_feature(enable = "avx2")]
fn load32u(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Shuffle mask that broadcasts i16 lane `s` of a 128-bit lane to all 8 of its lanes.
#[inline(always)]
fn bcast16(s: usize) -> i16 {
    (((2 * s + 1) << 8) | (2 * s)) as i16
}

/// Two 256-bit halves as one 512-bit register (`lo` in the low half).
#[inline]
#[target_feature(enable = "avx512f")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

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
                let yv = super::vnni::load64(&y[r][i].qs[64 * j..]);
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
        out[r] = _mm512_reduce_add_ps(acc[r]) - super::avx2::hsum_ps(accm[r]);
    }
}

/// Q6_K x Q8_K (unsigned quants, offset of 32 taken off through the block sums).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q6k<const R: usize>(x: &[BlockQ6K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    // Shuffle masks: 128-bit lane L of a 64-quant group takes sub-block scale L.
    let masks = [
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16(bcast16(1)),
                _mm_set1_epi16(bcast16(0)),
            )),
            _mm256_set_m128i(_mm_set1_epi16(bcast16(3)), _mm_set1_epi16(bcast16(2))),
        ),
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16(bcast16(5)),
                _mm_set1_epi16(bcast16(4)),
            )),
            _mm256_set_m128i(_mm_set1_epi16(bcast16(7)), _mm_set1_epi16(bcast16(6))),
        ),
    ];
    let mut acc = [_mm512_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let d = f16c_to_f32(b.d);
        // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
        let sc8 = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let halves = [
            _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)),
            _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16)),
        ];
        let mut sumi = [_mm512_setzero_si512(); R];
        for n in 0..2 {
            let ql0 = load32u(&b.ql[64 * n..]);
            let ql1 = load32u(&b.ql[64 * n + 32..]);
            let h = load32u(&b.qh[32 * n..]);
            let q1 = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
            );
            let q2 = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(h), m3)),
            );
            let q3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(h), m3)),
            );
            let q4 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(h), m3)),
            );
            let groups = [join(q1, q2), join(q3, q4)];
            for (k, qv) in groups.iter().enumerate() {
                let s = _mm512_shuffle_epi8(halves[n], masks[k]);
                for r in 0..R {
                    let yv = super::vnni::load64(&y[r][i].qs[128 * n + 64 * k..]);
                    let p = _mm512_madd_epi16(_mm512_maddubs_epi16(*qv, yv), s);
                    sumi[r] = _mm512_add_epi32(sumi[r], p);
                }
            }
        }
        for r in 0..R {
            let yb = &y[r][i];
            // 32 * sum_k scale_k * bsum_k: the offset of the unsigned quants.
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, load_bsums(yb)));
            acc[r] = _mm512_fmadd_ps(
                _mm512_set1_ps(d * yb.d),
                // The offset sits in the low half; the high half subtracts zero.
                _mm512_cvtepi32_ps(_mm512_sub_epi32(
                    sumi[r],
                    _mm512_inserti64x4::<0>(_mm512_setzero_si512(), off),
                )),
                acc[r],
            );
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}

/// Q5_K x Q8_K: as Q4_K with the fifth bit of every quant from `qh`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q5k<const R: usize>(x: &[BlockQ5K], y: &[&[BlockQ8K]; R], out: &mut [f32; R]) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    for (i, b) in x.iter().enumerate() {
        let (u, ddm) = k4_header(head16(b));
        let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(u));
        let mins = k4_mins_dup(u);
        let hbits = load32(&b.qh);
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..4 {
            let q = load32u(&b.qs[32 * j..]);
            let (h_lo, h_hi) = q5k_high(hbits, j);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
            let qv = join(lo, hi);
            let s = _mm512_shuffle_epi8(
                sc,
                join(
                    _mm256_set1_epi16(bcast16(2 * j)),
                    _mm256_set1_epi16(bcast16(2 * j + 1)),
                ),
            );
            for r in 0..R {
                let yv = super::vnni::load64(&y[r][i].qs[64 * j..]);
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
        out[r] = _mm512_reduce_add_ps(acc[r]) - super::avx2::hsum_ps(accm[r]);
    }
}

/// Q8_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`; 256-bit lanes are
/// what fix that order, so there is no wider variant).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q8_0<const R: usize>(x: &[BlockQ8_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q8_0_bytes(b), |b| b.d) }
}

/// Q4_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q4_0<const R: usize>(x: &[BlockQ4_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q4_0_bytes(b), |b| b.d) }
}

/// Q5_0 x Q8_0, in llama.cpp's tinyBLAS order (`super::tinyblas`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn dot_q5_0<const R: usize>(x: &[BlockQ5_0], y: &[&[BlockQ8_0]; R], out: &mut [f32; R]) {
    // SAFETY: this function's target features include the ones `dot_q0` needs.
    unsafe { super::tinyblas::dot_q0(x, y, out, |b| q5_0_bytes(b), |b| b.d) }
}

/// Quantizes one activation row to Q8_0 exactly as `flint_core::quant::quantize_row_q8_0_act`
/// (per block: `amax` the largest magnitude, `d = amax / 127` stored as f16,
/// `q = nearest_int(x * (127 / amax))` saturated to i8, round half to even), and writes
/// each block's scale widened back to f32 and its `-16 x` sums of four quants (the side
/// data of `kernels::Acts::Q8_0`). A block with a NaN or infinite value goes through the
/// core function (whose NaN handling the vector code does not copy).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn quantize_q8_0_act_row(
    x: &[f32],
    out: &mut [BlockQ8_0],
    scales: &mut [f32],
    neg16: &mut [[i32; 8]],
) {
    assert!(
        x.len() == out.len() * 32 && scales.len() == out.len() && neg16.len() == out.len(),
        "quantize_q8_0_act_row: lengths"
    );
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let inf = _mm512_set1_epi32(0x7f80_0000);
    for (((xb, y), s), l) in x
        .chunks_exact(32)
        .zip(out.iter_mut())
        .zip(scales.iter_mut())
        .zip(neg16.iter_mut())
    {
        // SAFETY: `xb` is 32 readable f32; loadu is unaligned.
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(xb.as_ptr()),
                _mm512_loadu_ps(xb.as_ptr().add(16)),
            )
        };
        let (aa, ab) = (
            _mm512_and_si512(_mm512_castps_si512(a), abs_mask),
            _mm512_and_si512(_mm512_castps_si512(b), abs_mask),
        );
        // NaN or infinity: an exponent of all ones.
        let bad = _mm512_cmpge_epi32_mask(aa, inf) | _mm512_cmpge_epi32_mask(ab, inf);
        if bad != 0 {
            flint_core::quant::quantize_row_q8_0_act(xb, std::slice::from_mut(y));
        } else {
            // The maximum of finite magnitudes is exact in any order.
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_castsi512_ps(aa),
                _mm512_castsi512_ps(ab),
            ));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            // Round half to even (the default rounding mode), then saturate to i8.
            let qa = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, idv)));
            let qb = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, idv)));
            // SAFETY: `qs` is 32 writable bytes; storeu is unaligned.
            unsafe {
                _mm_storeu_si128(y.qs.as_mut_ptr() as *mut __m128i, qa);
                _mm_storeu_si128(y.qs.as_mut_ptr().add(16) as *mut __m128i, qb);
            }
            y.d = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d)))
                as u16;
        }
        *s = f16c_to_f32(y.d);
        // SAFETY: 32 readable quant bytes, 8 writable i32; loadu/storeu are unaligned.
        unsafe {
            let q = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            let sums = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                _mm256_set1_epi16(1),
            );
            let v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<4>(sums));
            _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, v);
        }
    }
}

/// Quantizes one activation row to Q8_K exactly as `flint_core::quant::quantize_row_q8_k`
/// (per block of 256: `max` the first element of largest magnitude, `iscale = -127 / max`,
/// `q = min(127, nearest_int(iscale * x))` rounding half to even, `d = 1 / iscale`, the
/// sums of each 16 quants; an all-zero block all zeros). A block with a NaN or infinite
/// value goes through the core function.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn quantize_q8_k_row(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * 256, "quantize_q8_k_row: lengths");
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let inf = _mm512_set1_epi32(0x7f80_0000);
    for (xb, y) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut v = [_mm512_setzero_ps(); 16];
        let mut m = _mm512_setzero_ps();
        let mut bad = 0u16;
        for (j, vj) in v.iter_mut().enumerate() {
            // SAFETY: 16 readable f32 at `16j` of a 256-value block; loadu is unaligned.
            *vj = unsafe { _mm512_loadu_ps(xb.as_ptr().add(16 * j)) };
            let a = _mm512_and_si512(_mm512_castps_si512(*vj), abs_mask);
            bad |= _mm512_cmpge_epi32_mask(a, inf);
            m = _mm512_max_ps(m, _mm512_castsi512_ps(a));
        }
        if bad != 0 {
            flint_core::quant::quantize_row_q8_k(xb, std::slice::from_mut(y));
            continue;
        }
        // Finite magnitudes: their maximum is exact in any order.
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; 256];
            y.bsums = [0; 16];
            continue;
        }
        // The first element of that magnitude, with its sign.
        let am = _mm512_set1_ps(amax);
        let mut max = amax;
        for (j, vj) in v.iter().enumerate() {
            let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(*vj), abs_mask));
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, am);
            if hit != 0 {
                max = xb[16 * j + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let sv = _mm512_set1_ps(iscale);
        let top = _mm512_set1_epi32(127);
        for (j, vj) in v.iter().enumerate() {
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(sv, *vj)), top);
            y.bsums[j] = _mm512_reduce_add_epi32(q) as i16;
            // SAFETY: 16 writable quant bytes at `16j`; storeu is unaligned.
            unsafe {
                _mm_storeu_si128(
                    y.qs.as_mut_ptr().add(16 * j) as *mut __m128i,
                    _mm512_cvtsepi32_epi8(q),
                )
            };
        }
        y.d = 1.0 / iscale;
    }
}

/// `permutex2var` indices of one level of [`transpose16`]: with `a` and `b` the rows
/// `i` and `i + s`, lane `p` of the new row `i` (`hi` = false) or `i + s` (true) takes,
/// per chunk of `2s` lanes, the first (`hi`: second) `s` lanes of `a`, then those of `b`.
const fn transpose_idx(s: usize, hi: bool) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut p = 0;
    while p < 16 {
        let (k, w) = (p / (2 * s), p % (2 * s));
        let base = k * 2 * s + if hi { s } else { 0 };
        idx[p] = if w < s {
            (base + w) as i32
        } else {
            (16 + base + w - s) as i32
        };
        p += 1;
    }
    idx
}

/// [`transpose16`]'s indices, per level (blocks of 8, 4, 2, 1).
const TRANSPOSE_IDX: [[[i32; 16]; 2]; 4] = [
    [transpose_idx(8, false), transpose_idx(8, true)],
    [transpose_idx(4, false), transpose_idx(4, true)],
    [transpose_idx(2, false), transpose_idx(2, true)],
    [transpose_idx(1, false), transpose_idx(1, true)],
];

/// The 16 x 16 transpose of 32-bit lanes (row `i` lane `j` -> row `j` lane `i`): blocks
/// of 8, 4, 2 and 1 lanes swapped across the diagonal, 64 two-source permutes (the
/// panel decoders: sixteen weight rows' dwords into one register per dword).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(mut r: [__m512i; 16]) -> [__m512i; 16] {
    for (level, idx) in TRANSPOSE_IDX.iter().enumerate() {
        let s = 8 >> level;
        // SAFETY: 16 readable i32 each; loadu is unaligned.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(idx[0].as_ptr() as *const __m512i),
                _mm512_loadu_si512(idx[1].as_ptr() as *const __m512i),
            )
        };
        for i in 0..16 {
            if i & s == 0 {
                let (a, b) = (r[i], r[i + s]);
                r[i] = _mm512_permutex2var_epi32(a, lo, b);
                r[i + s] = _mm512_permutex2var_epi32(a, hi, b);
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512F: transpose16 not exercised");
            return;
        }
        let m: Vec<[i32; 16]> = (0..16)
            .map(|i| std::array::from_fn(|j| (100 * i + j) as i32))
            .collect();
        // SAFETY: AVX-512F was detected above; each row is 16 readable i32.
        let t = unsafe {
            let r: [__m512i; 16] =
                std::array::from_fn(|i| _mm512_loadu_si512(m[i].as_ptr() as *const __m512i));
            transpose16(r)
        };
        for (j, v) in t.iter().enumerate() {
            let mut out = [0i32; 16];
            // SAFETY: 16 writable i32.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, *v) };
            for (i, &x) in out.iter().enumerate() {
                assert_eq!(x, (100 * i + j) as i32, "row {j} lane {i}");
            }
        }
    }
}
