// Float steps shared by the shaders that follow the cpu device's float order (included by
// build.rs where a shader says `// #include lib/float.wgsl`): a once-rounded multiply-add
// and the lane sums of ggml's x86 code.

// fma(a, b, c) rounded once: the f32 product is exact in f64, so only the f64 sum rounds,
// then the f32 result (a double rounding that differs from one rounding only when the f64
// sum lands exactly halfway between two floats). WGSL's `fma` is not reliably fused by
// every driver (lavapipe's is not). Devices without f64 run the shaders' `_f32`
// variants, where this is a multiply and an add.
fn fma_x(a: f32, b: f32, c: f32) -> f32 {
    return f32(f64(a) * f64(b) + f64(c));
}

// `_mm512_reduce_add_ps` of 16 lanes as GCC expands it (`flint_core::math::reduce_add_16`):
// halves added pairwise, 8, 4, 2, 1.
fn reduce_add_16(v: array<f32, 16>) -> f32 {
    var t: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        t[i] = v[i + 8u] + v[i];
    }
    let u0 = t[4] + t[0];
    let u1 = t[5] + t[1];
    let u2 = t[6] + t[2];
    let u3 = t[7] + t[3];
    return (u0 + u2) + (u1 + u3);
}

// Eight f32 lanes added as ggml's x86 hsum_float_8 and tinyBLAS's hsum: the high half
// onto the low half, then movehl, then movehdup (flint_core::dot::ggml_x86::hsum8).
fn hsum8(v: array<f32, 8>) -> f32 {
    let a0 = v[0] + v[4];
    let a1 = v[1] + v[5];
    let a2 = v[2] + v[6];
    let a3 = v[3] + v[7];
    return (a0 + a2) + (a1 + a3);
}
