// MoE combine: ACC[(i / f) * dim + d] += Wt[i] * X[i * dim + d] for the n routed rows i in
// order, f routed rows (the fan-out) per output row. One thread per column d walks every
// routed row, so rows that land on the same output row add up without races, in the
// reference's order. Offsets are in elements of each binding.

struct P {
    n: u32,
    dim: u32,
    acc_off: u32,
    x_off: u32,
    w_off: u32,
    f: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> ACC: array<f32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> Wt: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let d = gid.x + gid.y * nwg.x * 256u;
    if (d >= pc.dim) {
        return;
    }
    for (var i = 0u; i < pc.n; i++) {
        let a = pc.acc_off + (i / pc.f) * pc.dim + d;
        ACC[a] = ACC[a] + Wt[pc.w_off + i] * X[pc.x_off + i * pc.dim + d];
    }
}
