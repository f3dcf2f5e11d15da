// ggml's add_id: X[i * dim + d] += T[ID[i] * dim + d] for the rows i of dim values (gpt-oss's
// per-expert biases on routed rows: T holds one row per expert, ID the routed rows'
// experts, checked against T's rows by the host). One thread per element, one f32 add
// each. Offsets are in elements of each binding.

struct P {
    n: u32,
    dim: u32,
    x_off: u32,
    t_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> T: array<f32>;
@group(0) @binding(2) var<storage, read> ID: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= pc.n) {
        return;
    }
    let row = i / pc.dim;
    let d = i % pc.dim;
    let a = pc.x_off + i;
    X[a] = X[a] + T[pc.t_off + ID[row] * pc.dim + d];
}
