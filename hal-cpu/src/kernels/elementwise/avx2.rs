//! Element-wise ops with AVX2: GELU through its f16 table, SiLU, RoPE rotation, and the f16
//! conversions of the KV cache. The caller must have checked AVX2, FMA and F16C at
//! device open.

use std::arch::x86_64::*;

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

/// `2^k` for integer-valued `k` in `-126..=127`, built from its exponent bits.
#[inline]
#[target_feature(enable = "avx2")]
fn pow2(k: __m256) -> __m256 {
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
}

/// ggml's AVX-512 `ggml_v_expf` on eight lanes with AVX2 + FMA, bit for bit
/// `flint_core::math::expf_ggml_avx512` (and so the AVX-512 kernel): the same fused
/// multiply-adds, and `_mm512_scalef_ps(j, n)` as `j * 2^(n - k) * 2^k` with `k` clamped
/// to the normal exponents, the first product exact (it stays normal), the second
/// rounded once, as `scalef` (and the scalar's `scalbnf`) round `j * 2^n`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn expf_ggml(x: __m256) -> __m256 {
    let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
    );
    // |n| <= 192 where the result is used: n - k lies in -66..=65.
    let k = _mm256_min_ps(
        _mm256_max_ps(n, _mm256_set1_ps(-126.0)),
        _mm256_set1_ps(127.0),
    );
    let nk = _mm256_min_ps(
        _mm256_max_ps(_mm256_sub_ps(n, k), _mm256_set1_ps(-126.0)),
        _mm256_set1_ps(127.0),
    );
    let res = _mm256_mul_ps(_mm256_mul_ps(j, pow2(nk)), pow2(k));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let non_pos = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let sat = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), non_pos);
    _mm256_blendv_ps(res, sat, big)
}

/// `out = silu(gate) * up` on eight lanes at a time, bit for bit
/// `flint_core::math::silu(g) * u` (one division by `1 + exp(-g)` with [`expf_ggml`]), as
/// the AVX-512 kernel computes it.
///
/// # Safety
/// The CPU must have AVX2 and FMA (checked at device open).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "silu_mul: lengths"
    );
    let full = out.len() / 8 * 8;
    let (one, sign) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= every slice's length; loadu/storeu are unaligned.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = expf_ggml(_mm256_xor_ps(g, sign));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
        }
    }
    for ((o, &g), &u) in out[full..].iter_mut().zip(&gate[full..]).zip(&up[full..]) {
        *o = flint_core::math::silu(g) * u;
    }
}

/// `v = silu(v)` in place, bit for bit `flint_core::math::silu` (the lanes of
/// [`silu_mul`] without the product).
///
/// # Safety
/// The CPU must have AVX2 and FMA (checked at device open).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_in_place(v: &mut [f32]) {
    let full = v.len() / 8 * 8;
    let (one, sign) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= v.len(); loadu/storeu are unaligned.
        unsafe {
            let g = _mm256_loadu_ps(v.as_ptr().add(i));
            let e = expf_ggml(_mm256_xor_ps(g, sign));
            _mm256_storeu_ps(
                v.as_mut_ptr().add(i),
                _mm256_div_ps(g, _mm256_add_ps(one, e)),
            );
        }
    }
    for x in &mut v[full..] {
        *x = flint_core::math::silu(*x);
    }
}

/// The sums of squares of `rows.len()` rows (`4 * G`, each at least `n` long) as
/// `flint_core::math::rms_norm` forms each one (every value squared in f32, widened to
/// f64, added in order from 0): four rows in the lanes of one f64 vector, four values of
/// each squared and widened together and the block transposed; `G` chains side by side.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn sum_squares<const G: usize>(rows: &[&[f32]], n: usize, out: &mut [f64]) {
    assert!(
        rows.len() == 4 * G && out.len() == 4 * G,
        "sum_squares: rows"
    );
    assert!(rows.iter().all(|r| r.len() >= n), "sum_squares: short row");
    let full = n - n % 4;
    let mut acc = [_mm256_setzero_pd(); G];
    for i in (0..full).step_by(4) {
        for (g, a) in acc.iter_mut().enumerate() {
            let mut v = [_mm256_setzero_pd(); 4];
            for (r, x) in v.iter_mut().enumerate() {
                // SAFETY: i + 4 <= n <= the row's length (asserted); loadu is unaligned.
                let y = unsafe { _mm_loadu_ps(rows[4 * g + r].as_ptr().add(i)) };
                *x = _mm256_cvtps_pd(_mm_mul_ps(y, y));
            }
            // Rows 0, 1 interleaved (elements 0 and 2, then 1 and 3), rows 2, 3 the same;
            // then the halves gathered: element c of the four rows in t[c].
            let lo01 = _mm256_unpacklo_pd(v[0], v[1]);
            let hi01 = _mm256_unpackhi_pd(v[0], v[1]);
            let lo23 = _mm256_unpacklo_pd(v[2], v[3]);
            let hi23 = _mm256_unpackhi_pd(v[2], v[3]);
            let t = [
                _mm256_permute2f128_pd::<0x20>(lo01, lo23),
                _mm256_permute2f128_pd::<0x20>(hi01, hi23),
                _mm256_permute2f128_pd::<0x31>(lo01, lo23),
                _mm256_permute2f128_pd::<0x31>(hi01, hi23),
            ];
            for c in t {
                *a = _mm256_add_pd(*a, c);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        // SAFETY: 4 writable f64 (asserted length); storeu is unaligned.
        unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(4 * g), *a) };
    }
    for (s, row) in out.iter_mut().zip(rows) {
        for &v in &row[full..n] {
            *s += (v * v) as f64;
        }
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

    /// The eight-lane `expf` against the scalar statement of ggml's AVX-512 one, bit for
    /// bit: every 257th f32 from -200 to 100 (normal, subnormal and zero results, the
    /// two-step scaling below 2^-126, overflow), and -inf, +inf, NaN.
    #[test]
    fn expf_matches_the_scalar_ggml_expf() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            eprintln!("no AVX2 + FMA here: nothing to compare");
            return;
        }
        use std::arch::x86_64::*;
        let mut xs: Vec<f32> = (0..u32::MAX / 257)
            .map(|i| f32::from_bits(i * 257))
            .filter(|x| x.is_finite() && (-200.0..=100.0).contains(x))
            .collect();
        xs.extend(
            (0..u32::MAX / 257)
                .map(|i| -f32::from_bits(i * 257))
                .filter(|x| x.is_finite() && (-200.0..=100.0).contains(x)),
        );
        xs.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -87.5,
            -103.9,
            -150.0,
        ]);
        let mut checked = 0usize;
        for c in xs.chunks(8) {
            let mut a = [0f32; 8];
            a[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; 8 readable and writable f32.
            unsafe {
                _mm256_storeu_ps(
                    got.as_mut_ptr(),
                    super::expf_ggml(_mm256_loadu_ps(a.as_ptr())),
                )
            };
            for (&x, &g) in c.iter().zip(&got) {
                let want = flint_core::math::expf_ggml_avx512(x);
                if want.is_nan() {
                    assert!(g.is_nan(), "expf({x:e}): {g:e} where the scalar gives NaN");
                } else {
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "expf({x:e}): {g:e} vs {want:e}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 1_000_000, "only {checked} inputs");
    }
}
