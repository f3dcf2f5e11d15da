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
