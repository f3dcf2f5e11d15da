// The tiling, the state and the activation blocks of matmul_exact.wgsl's K-quant weight
// types (exact/q4_k.wgsl, q5_k.wgsl, q6_k.wgsl), whose activations are Q8_K.

// Activation rows a thread computes (the host tiles dense rows so).
const MT: u32 = 8u;

// A row's float sums (two: the scaled sums and the mins where the type has them) and
// its exact integer sums.
struct St {
    f: array<f32, 2>,
    i: vec2<i32>,
}

// The activation block holding part `s` of activation row `x` (quant_xi.wgsl's Q8_K
// blocks, 73 words each, eight 32-value parts a block).
fn act(x: u32, s: u32) -> u32 {
    return (pc.x_off + x * (pc.k / 256u) + s / 8u) * 73u;
}
