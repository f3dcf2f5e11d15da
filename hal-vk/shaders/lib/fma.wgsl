// Shared by the shaders that follow the cpu device's float order (included by build.rs
// where a shader says `// #include lib/fma.wgsl`).

// fma(a, b, c) rounded once: the f32 product is exact in f64, so only the f64 sum rounds,
// then the f32 result (a double rounding that differs from one rounding only when the f64
// sum lands exactly halfway between two floats). WGSL's `fma` is not reliably fused by
// every driver (lavapipe's is not). Devices without f64 run the shaders' `_f32`
// variants, where this is a multiply and an add.
fn fma_x(a: f32, b: f32, c: f32) -> f32 {
    return f32(f64(a) * f64(b) + f64(c));
}
