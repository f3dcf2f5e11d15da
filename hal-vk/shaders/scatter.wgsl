// MoE combine: ACC[R[i] * dim + d] += Wt[i] * X[i * dim + d] for i in order. One thread
// per column d walks every routed row, so rows that land on the same output row add up
// without races, in the reference's order.

struct P {
    n: u32,
    dim: u32,
    acc_off: u32,
    x_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> ACC: array<f32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> R: array<u32>;
@group(0) @binding(3) var<storage, read> Wt: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let d = gid.x + gid.y * nwg.x * 256u;
    if (d >= pc.dim) {
        return;
    }
    for (var i = 0u; i < pc.n; i++) {
        let a = pc.acc_off + R[i] * pc.dim + d;
        ACC[a] = ACC[a] + Wt[i] * X[pc.x_off + i * pc.dim + d];
    }
}
