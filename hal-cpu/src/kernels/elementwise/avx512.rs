//! Element-wise activations with AVX-512, lane for lane the operations of the scalar
//! definitions in `flint_core::math` (so that the results are the same bits).

use std::arch::x86_64::*;

/// ggml's AVX-512 `ggml_v_expf`, lane for lane the same operations as
/// `flint_core::math::expf_ggml_avx512`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn expf_ggml(x: __m512) -> __m512 {
    let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
    let r = c(0x4b40_0000);
    let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let non_pos = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let sat = _mm512_mask_blend_ps(non_pos, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
    _mm512_mask_blend_ps(big, res, sat)
}

/// `out = silu(gate) * up`, `silu(x) = x / (1 + exp(-x))` with ggml's AVX-512 `exp`
/// (`ggml_v_silu`), exactly as `flint_core::math::silu(g) * u` computes each element.
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "silu_mul: lengths"
    );
    let full = out.len() / 16 * 16;
    let one = _mm512_set1_ps(1.0);
    for i in (0..full).step_by(16) {
        // SAFETY: i + 16 <= full <= every slice's length; loadu/storeu are unaligned.
        unsafe {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let e = expf_ggml(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(s, u));
        }
    }
    for ((o, &g), &u) in out[full..].iter_mut().zip(&gate[full..]).zip(&up[full..]) {
        *o = flint_core::math::silu(g) * u;
    }
}

/// `v = silu(v)` in place, exactly as `flint_core::math::silu` computes each element
/// (the lanes of [`silu_mul`] without the product).
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn silu_in_place(v: &mut [f32]) {
    let full = v.len() / 16 * 16;
    let one = _mm512_set1_ps(1.0);
    for i in (0..full).step_by(16) {
        // SAFETY: i + 16 <= full <= v.len(); loadu/storeu are unaligned.
        unsafe {
            let g = _mm512_loadu_ps(v.as_ptr().add(i));
            let e = expf_ggml(_mm512_sub_ps(_mm512_setzero_ps(), g));
            _mm512_storeu_ps(
                v.as_mut_ptr().add(i),
                _mm512_div_ps(g, _mm512_add_ps(one, e)),
            );
        }
    }
    for x in &mut v[full..] {
        *x = flint_core::math::silu(*x);
    }
}

/// `out = gelu(gate) * up` through the f16-indexed GELU table (`table[f16 bits of x]`
/// inside (-10, 10), 0 at or below -10, `x` at or above 10), sixteen lookups per gather:
/// the same values as `avx2::gelu_mul_table`'s scalar lookups, bit for bit.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and F16C (checked at device open).
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(crate) unsafe fn gelu_mul_table(table: &[f32], gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        table.len() > usize::from(u16::MAX),
        "gelu_mul_table: table size"
    );
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "gelu_mul_table: lengths"
    );
    let full = out.len() / 16 * 16;
    let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
    for i in (0..full).step_by(16) {
        // SAFETY: i + 16 <= full <= every slice's length (loadu/storeu are unaligned);
        // the gather's indices are u16 values, inside the table (checked above).
        unsafe {
            let x = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
            let t = _mm512_i32gather_ps::<4>(bits, table.as_ptr());
            let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, lo);
            let above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi);
            let g = _mm512_mask_blend_ps(above, _mm512_maskz_mov_ps(!below, t), x);
            _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(g, u));
        }
    }
    super::avx2::gelu_mul_table(table, &gate[full..], &up[full..], &mut out[full..]);
}

/// glibc's `expf` on sixteen lanes, bit for bit `flint_core::math::expf_libc`: each
/// half widened to eight doubles, the same fused multiply-adds (`x * 32 / ln 2 = k + r`,
/// the table entry `2^(k/32)` by two two-source permutes, the cubic in `r`), rounded to
/// float once. Lanes that need `expf_libc`'s special cases (overflow, underflow,
/// infinities, NaN) are recomputed by the scalar.
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(crate) fn expf_libc(x: __m512) -> __m512 {
    use flint_core::math::{EXP2F_TAB, EXPF_INV_LN2_N, EXPF_POLY, EXPF_SHIFT};
    // SAFETY (the four loads): `EXP2F_TAB` holds 32 u64, read 8 at a time, unaligned.
    let tab: [__m512i; 4] = std::array::from_fn(|i| unsafe {
        _mm512_loadu_si512(EXP2F_TAB.as_ptr().add(8 * i) as *const __m512i)
    });
    let (inv, shift) = (_mm512_set1_pd(EXPF_INV_LN2_N), _mm512_set1_pd(EXPF_SHIFT));
    let c = EXPF_POLY.map(|v| _mm512_set1_pd(v));
    let half = |xs: __m256| -> __m256 {
        let xd = _mm512_cvtps_pd(xs);
        let kd = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        let r = _mm512_fmsub_pd(inv, xd, kd);
        // Entry `ki % 32`: the permutes index by the low three bits and the source bit
        // (bit 3), bit 4 picks the permute.
        let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
        let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(c[0], r, c[1]);
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(c[2], r, _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    };
    let lo = half(_mm512_castps512_ps256(x));
    let hi = half(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(x),
    )));
    let mut e = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ));
    let abstop = _mm512_and_si512(
        _mm512_srli_epi32::<20>(_mm512_castps_si512(x)),
        _mm512_set1_epi32(0x7ff),
    );
    let special = _mm512_cmpge_epu32_mask(
        abstop,
        _mm512_set1_epi32(flint_core::math::EXPF_SPECIAL_ABSTOP as i32),
    );
    if special != 0 {
        let mut xs = [0f32; 16];
        let mut es = [0f32; 16];
        // SAFETY: 16 writable f32 each; storeu is unaligned.
        unsafe {
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(es.as_mut_ptr(), e);
        }
        for l in 0..16 {
            if special & (1 << l) != 0 {
                es[l] = flint_core::math::expf_libc(xs[l]);
            }
        }
        // SAFETY: 16 readable f32; loadu is unaligned.
        e = unsafe { _mm512_loadu_ps(es.as_ptr()) };
    }
    e
}

/// `out = swiglu_oai(gate, up)` element by element, bit for bit
/// `flint_core::math::swiglu_oai`: `x = min(gate, limit)` (a NaN gate kept),
/// `y = clamp(up, -limit, limit)` (a NaN kept), `x / (1 + expf(alpha * -x)) * (y + 1)`
/// with glibc's `expf` ([`expf_libc`]); the tail by the scalar.
///
/// # Safety
/// The CPU must have AVX-512 F (checked at device open).
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn swiglu_oai_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    use flint_core::math::{swiglu_oai, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};
    assert!(
        gate.len() == out.len() && up.len() == out.len(),
        "swiglu_oai_mul: lengths"
    );
    let limit = _mm512_set1_ps(SWIGLU_OAI_LIMIT);
    let neg_limit = _mm512_set1_ps(-SWIGLU_OAI_LIMIT);
    let alpha = _mm512_set1_ps(SWIGLU_OAI_ALPHA);
    let one = _mm512_set1_ps(1.0);
    let mut o = out.chunks_exact_mut(16);
    let mut g = gate.chunks_exact(16);
    let mut u = up.chunks_exact(16);
    for ((o, g), u) in (&mut o).zip(&mut g).zip(&mut u) {
        // SAFETY: 16 readable / writable f32 each; loadu and storeu are unaligned.
        unsafe {
            let gv = _mm512_loadu_ps(g.as_ptr());
            let uv = _mm512_loadu_ps(u.as_ptr());
            // `min` returns its second operand when either is NaN: `limit < gate ? limit
            // : gate`, as the scalar.
            let x = _mm512_min_ps(limit, gv);
            let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(uv, neg_limit);
            let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(uv, limit);
            let y = _mm512_mask_blend_ps(above, _mm512_mask_blend_ps(below, uv, neg_limit), limit);
            let neg_x = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(x),
                _mm512_set1_epi32(i32::MIN),
            ));
            let e = expf_libc(_mm512_mul_ps(alpha, neg_x));
            let glu = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(glu, _mm512_add_ps(y, one)));
        }
    }
    for ((o, &g), &u) in o
        .into_remainder()
        .iter_mut()
        .zip(g.remainder())
        .zip(u.remainder())
    {
        *o = swiglu_oai(g, u);
    }
}

/// The sums of squares of `rows.len()` rows (`8 * G`, each at least `n` long) as
/// `flint_core::math::rms_norm` forms each one: every value squared in f32, widened to
/// f64 and added in order from 0. Eight rows share the lanes of one f64 vector: eight
/// values of each row are squared and widened together and the block is transposed, so
/// that each add serves eight rows; `G` such chains run side by side.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn sum_squares<const G: usize>(rows: &[&[f32]], n: usize, out: &mut [f64]) {
    assert!(
        rows.len() == 8 * G && out.len() == 8 * G,
        "sum_squares: rows"
    );
    assert!(rows.iter().all(|r| r.len() >= n), "sum_squares: short row");
    let full = n - n % 8;
    let mut acc = [_mm512_setzero_pd(); G];
    for i in (0..full).step_by(8) {
        for (g, a) in acc.iter_mut().enumerate() {
            let mut v = [_mm512_setzero_pd(); 8];
            for (r, x) in v.iter_mut().enumerate() {
                // SAFETY: i + 8 <= n <= the row's length (asserted); loadu is unaligned.
                let y = unsafe { _mm256_loadu_ps(rows[8 * g + r].as_ptr().add(i)) };
                *x = _mm512_cvtps_pd(_mm256_mul_ps(y, y));
            }
            for c in transpose8_pd(&v) {
                *a = _mm512_add_pd(*a, c);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        // SAFETY: 8 writable f64 (asserted length); storeu is unaligned.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr().add(8 * g), *a) };
    }
    for (s, row) in out.iter_mut().zip(rows) {
        for &v in &row[full..n] {
            *s += (v * v) as f64;
        }
    }
}

/// The transpose of an 8 x 8 block of f64: lane `l` of vector `j` of the result is lane
/// `j` of vector `l` of `r` (moves only).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose8_pd(r: &[__m512d; 8]) -> [__m512d; 8] {
    let z = _mm512_setzero_pd();
    // a[2p] holds elements 0, 2, 4, 6 of rows 2p and 2p + 1 (one 128-bit lane each), a[2p
    // + 1] elements 1, 3, 5, 7.
    let mut a = [z; 8];
    for p in (0..8).step_by(2) {
        a[p] = _mm512_unpacklo_pd(r[p], r[p + 1]);
        a[p + 1] = _mm512_unpackhi_pd(r[p], r[p + 1]);
    }
    // b[h + 2o + e] (h = 0, 4; o, e = 0, 1): rows h..h + 4, elements o + 2e and o + 2e + 4.
    let mut b = [z; 8];
    for h in [0, 4] {
        for o in 0..2 {
            b[h + 2 * o] = _mm512_shuffle_f64x2::<0x88>(a[h + o], a[h + o + 2]);
            b[h + 2 * o + 1] = _mm512_shuffle_f64x2::<0xDD>(a[h + o], a[h + o + 2]);
        }
    }
    // Element c = o + 2e (+ 4): rows 0..4 from b[2o + e], rows 4..8 from b[4 + 2o + e].
    let mut t = [z; 8];
    for o in 0..2 {
        for e in 0..2 {
            let (x, y) = (b[2 * o + e], b[4 + 2 * o + e]);
            t[o + 2 * e] = _mm512_shuffle_f64x2::<0x88>(x, y);
            t[o + 2 * e + 4] = _mm512_shuffle_f64x2::<0xDD>(x, y);
        }
    }
    t
}
