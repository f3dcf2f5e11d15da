// Element-wise ops on f32 tensors, one thread per element (`mode`):
// 0 add:        A[i] += B[i]
// 1 add_bias:   A[i] += B[i % nb]
// 2 scale:      A[i] *= s
// 3 silu_mul:   O[i] = silu(A[i]) * B[i]            silu(x) = x / (1 + expf_ggml(-x))
// 5 swiglu_oai: O[i] = swiglu_oai(A[i], B[i])       gpt-oss's clamped SwiGLU (limit 7, alpha 1.702,
//                                                   glibc's expf)
// as flint_core::math::silu and swiglu_oai (gelu_mul: gelu.wgsl).
// Offsets are in elements of each binding.

// #include lib/float.wgsl
// #include lib/expf.wgsl

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
            O[pc.o_off + i] = x / (1.0 + expf_ggml(-x)) * B[pc.b_off + i];
        }
        default: {
            let x = min(A[ia], 7.0);
            let y = clamp(B[pc.b_off + i], -7.0, 7.0);
            O[pc.o_off + i] = x / (1.0 + expf_libc(1.702 * -x)) * (y + 1.0);
        }
    }
}
