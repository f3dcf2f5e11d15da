// O[i] = gelu(A[i]) * B[i] with GELU as ggml's CPU backend computes it: 0 at or below
// -10, x at or above 10, else its f16 table (GGML_GELU_FP16) at the f16 bits of x. T is
// that table (flint_core::math::gelu_f16_table_entry, 65536 f32 values, uploaded once).

struct P {
    n: u32,
    a_off: u32,
    b_off: u32,
    o_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@group(0) @binding(3) var<storage, read> T: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= pc.n) {
        return;
    }
    let x = A[pc.a_off + i];
    var g = x;
    if (x <= -10.0) {
        g = 0.0;
    } else if (x < 10.0) {
        g = T[pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu];
    }
    O[pc.o_off + i] = g * B[pc.b_off + i];
}
