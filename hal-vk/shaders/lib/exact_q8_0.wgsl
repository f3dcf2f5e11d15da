// The tiling, the state and the activation blocks of matmul_exact.wgsl's weight types
// whose activations are Q8_0 (exact/q5_0.wgsl, q8_0.wgsl: tinyBLAS's eight lanes).

// Activation rows a thread computes (the host tiles dense rows so).
const MT: u32 = 8u;

// A row's eight float lanes and its exact integer sums.
struct St {
    f: array<f32, 8>,
    i: vec2<i32>,
}

// The activation block holding part `s` of activation row `x` (quant_xi.wgsl's Q8_0
// blocks, 9 words each, one 32-value part a block).
fn act(x: u32, s: u32) -> u32 {
    return (pc.x_off + x * (pc.k / 32u) + s) * 9u;
}
