// Element-wise ops on f32 tensors, one thread per element (`mode`):
// 0 add:        A[i] += B[i]
// 1 add_bias:   A[i] += B[i % nb]
// 2 scale:      A[i] *= s
// 3 silu_mul:   O[i] = silu(A[i]) * B[i]            silu(x) = x / (1 + exp(-x))
// 4 gelu_mul:   O[i] = gelu(A[i]) * B[i]            ggml's f16 GELU (see gelu_tanh below)
// 5 swiglu_oai: O[i] = swiglu_oai(A[i], B[i])       gpt-oss's clamped SwiGLU (limit 7, alpha 1.702)
// Offsets are in elements of each binding.

struct P {
    n: u32,
    mode: u32,
    a_off: u32,
    b_off: u32,
    o_off: u32,
    nb: u32,
    s: f32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;

fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// GELU as ggml's CPU backend computes it (its GGML_GELU_FP16 table, flint_core's
// gelu_tanh_ggml_f16): 0 at or below -10, x at or above 10, else the tanh form of x
// rounded to f16, itself rounded to f16.
fn gelu_tanh(x0: f32) -> f32 {
    if (x0 <= -10.0) {
        return 0.0;
    }
    if (x0 >= 10.0) {
        return x0;
    }
    let x = f16_round(x0);
    let inner = 0.7978846 * x * fma(0.044715 * x, x, 1.0);
    // tanh through exp, stable for large |inner|.
    let e = exp(-2.0 * abs(inner));
    let t = sign(inner) * (1.0 - e) / (1.0 + e);
    return f16_round(0.5 * x * (1.0 + t));
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= pc.n) {
        return;
    }
    let ia = pc.a_off + i;
    switch pc.mode {
        case 0u: {
            A[ia] = A[ia] + B[pc.b_off + i];
        }
        case 1u: {
            A[ia] = A[ia] + B[pc.b_off + i % pc.nb];
        }
        case 2u: {
            A[ia] = A[ia] * pc.s;
        }
        case 3u: {
            let x = A[ia];
            O[pc.o_off + i] = x / (1.0 + exp(-x)) * B[pc.b_off + i];
        }
        case 4u: {
            O[pc.o_off + i] = gelu_tanh(A[ia]) * B[pc.b_off + i];
        }
        default: {
            let x = min(A[ia], 7.0);
            let y = clamp(B[pc.b_off + i], -7.0, 7.0);
            O[pc.o_off + i] = x / (1.0 + exp(1.702 * -x)) * (y + 1.0);
        }
    }
}
