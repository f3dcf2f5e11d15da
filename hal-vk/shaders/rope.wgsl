// RoPE in place on X = [rows, heads * head_dim], one thread per (row, head, pair).
// CS holds, per row, n_rot/2 (cos, sin) pairs computed on the host by
// flint_core's RopeConfig::angles (ggml's angle recurrence and YaRN, in f32), so that
// far positions rotate by the reference's angles. kind 0 pairs (2i, 2i+1) (normal),
// kind 1 pairs (i, i + n_rot/2) (NeoX).

// #include lib/float.wgsl

struct P {
    rows: u32,
    heads: u32,
    head_dim: u32,
    n_rot: u32,
    kind: u32,
    x_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> CS: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let half = pc.n_rot / 2u;
    if (t >= pc.rows * pc.heads * half) {
        return;
    }
    let i = t % half;
    let h = (t / half) % pc.heads;
    let r = t / (half * pc.heads);
    let base = pc.x_off + (r * pc.heads + h) * pc.head_dim;
    var j0 = i;
    var j1 = i + half;
    if (pc.kind == 0u) {
        j0 = 2u * i;
        j1 = 2u * i + 1u;
    }
    let c = CS[(r * half + i) * 2u];
    let s = CS[(r * half + i) * 2u + 1u];
    let x0 = X[base + j0];
    let x1 = X[base + j1];
    X[base + j0] = fma_x(x0, c, -(x1 * s));
    X[base + j1] = fma_x(x0, s, x1 * c);
}

