//! Element-wise activations.

/// `sigmoid(x) = 1 / (1 + exp(-x))`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-x))
}

/// [`sigmoid`] as ggml's `ggml_vec_sigmoid_f32` computes it (the `GGML_OP_SIGMOID` of
/// Qwen 3.5's attention gate, shared-expert gate and `beta`): glibc's `expf`
/// ([`super::expf_libc`]).
pub fn sigmoid_ggml(x: f32) -> f32 {
    1.0 / (1.0 + super::expf_libc(-x))
}

/// `silu(x) = x / (1 + exp(-x))`, as ggml's `ggml_v_silu` computes it in llama.cpp's
/// AVX-512 build (`ggml_vec_swiglu_f32`): one division (not `x * sigmoid(x)`, which rounds
/// twice), with ggml's AVX-512 `exp` ([`super::expf_ggml_avx512`]), so that the CPU
/// backend's 16-lane kernel computes the same bits.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + super::attn_ggml::expf_ggml_avx512(-x))
}

/// sqrt(2/pi), as ggml spells it.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation of GELU.
const GELU_COEF_A: f32 = 0.044715;

/// GELU in its tanh form, exactly ggml's `ggml_gelu_f32`:
/// `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))`, evaluated in f32 in that order.
///
/// This is the reference form. ggml's CPU backend is built with `GGML_GELU_FP16` by
/// default, which instead rounds `x` to f16, looks the result up in a table of
/// f16-rounded values of this same formula, and passes `x` through above 10 and gives 0
/// below -10; [`gelu_tanh_ggml_f16`] reproduces that when bit-agreement with a llama.cpp
/// CPU run is wanted. The reference keeps the exact form because the f16 table loses up
/// to 2^-11 relative precision per activation, which is an artefact of one backend and
/// not part of the model.
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))
}

/// [`gelu_tanh`] as GCC compiles ggml's `ggml_gelu_f32` for x86 (floating-point
/// contraction on, the GNU C default): `1 + 0.044715 x * x` becomes one fused
/// multiply-add, `fma(0.044715 x, x, 1)`. This is the function ggml's f16 GELU table is
/// filled from in a release build.
fn gelu_tanh_fma(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * libm::fmaf(GELU_COEF_A * x, x, 1.0)))
}

/// GELU as ggml's CPU backend computes it for f32 tensors under `GGML_GELU_FP16` (its
/// default build): `0` for `x <= -10`, `x` for `x >= 10`, otherwise
/// `f16(gelu_tanh(f16(x)))` widened back to f32. Computed directly instead of from a
/// 64Ki-entry table, with the same result for every input (bit-exact against ggml's
/// `ggml_gelu` in tests/math_ggml.rs).
pub fn gelu_tanh_ggml_f16(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let xh = super::f16_round(x);
        super::f16_round(gelu_tanh_fma(xh))
    }
}

/// Entry `bits` of a 64Ki-entry GELU table indexed by the f16 bits of the input, as
/// ggml's `GGML_GELU_FP16` table is used: [`gelu_tanh_ggml_f16`] of that f16 value for
/// inputs inside (-10, 10) (the two entries of +-10 itself hold the value just inside,
/// which rounds to the same f16; callers apply the cut-offs before the lookup), 0 for
/// infinities and NaNs.
pub fn gelu_f16_table_entry(bits: u16) -> f32 {
    let x = crate::dequant::f16_to_f32(bits);
    if !x.is_finite() {
        return 0.0;
    }
    let inside = if x.abs() >= 10.0 {
        f32::from_bits(x.to_bits() - 1)
    } else {
        x
    };
    gelu_tanh_ggml_f16(inside)
}

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]`, the dense and expert FFN inner product.
///
/// # Panics
/// If the three slices differ in length.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    assert_eq!(out.len(), gate.len(), "swiglu: out and gate lengths differ");
    for i in 0..gate.len() {
        out[i] = silu(gate[i]) * up[i];
    }
}

/// The `alpha` of gpt-oss's clamped SwiGLU ([`swiglu_oai`]; llama.cpp's constant).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
/// The clamp `limit` of gpt-oss's SwiGLU ([`swiglu_oai`]; llama.cpp's constant).
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// gpt-oss's clamped SwiGLU of one gate/up pair, as ggml's `swiglu_oai` computes it:
/// `x = min(gate, limit)`, `y = clamp(up, -limit, limit)`,
/// `x / (1 + exp(alpha * -x)) * (y + 1)` with [`SWIGLU_OAI_ALPHA`] and
/// [`SWIGLU_OAI_LIMIT`] (glibc's `expf`, [`super::expf_libc`]; a NaN gate stays NaN, as
/// `std::min` keeps it).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    let x = if SWIGLU_OAI_LIMIT < gate {
        SWIGLU_OAI_LIMIT
    } else {
        gate
    };
    let y = up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
    let glu = x / (1.0 + super::expf_libc(SWIGLU_OAI_ALPHA * -x));
    glu * (y + 1.0)
}

/// `x = sigmoid(x)` ([`sigmoid_ggml`]) element by element: ggml's `sigmoid` op.
pub fn sigmoid_ggml_in_place(x: &mut [f32]) {
    for v in x {
        *v = sigmoid_ggml(*v);
    }
}

/// `acc[i] *= x[i / (acc.len() / x.len())]`: ggml's `mul` of `acc` by `x`, `x` either as
/// long as `acc` or one value per row of `acc` (broadcast along the row).
///
/// # Panics
/// When `x` is empty while `acc` is not, or its length does not divide `acc`'s.
pub fn mul_rows(acc: &mut [f32], x: &[f32]) {
    if acc.is_empty() {
        return;
    }
    assert!(
        !x.is_empty() && acc.len().is_multiple_of(x.len()),
        "mul: {} values by {} values",
        acc.len(),
        x.len()
    );
    let per = acc.len() / x.len();
    for (row, &m) in acc.chunks_exact_mut(per).zip(x) {
        for v in row {
            *v *= m;
        }
    }
}

/// Splits `src`, a run of groups of `outs.len()` chunks of `chunk` values each, by
/// chunk: chunk `j` of group `g` goes to `outs[j][g * chunk..]` (Qwen 3.5's query
/// projection gives each head its queries then its gate).
///
/// # Panics
/// When `src` is not whole groups or an output is not one chunk per group long.
pub fn deinterleave(src: &[f32], chunk: usize, outs: &mut [&mut [f32]]) {
    let parts = outs.len();
    assert!(
        chunk > 0 && parts > 0 && src.len().is_multiple_of(chunk * parts),
        "deinterleave: {} values are not groups of {parts} chunks of {chunk}",
        src.len()
    );
    let groups = src.len() / (chunk * parts);
    for o in outs.iter() {
        assert_eq!(o.len(), groups * chunk, "deinterleave: output length");
    }
    for (g, group) in src.chunks_exact(chunk * parts).enumerate() {
        for (j, c) in group.chunks_exact(chunk).enumerate() {
            outs[j][g * chunk..(g + 1) * chunk].copy_from_slice(c);
        }
    }
}
