// Matmul with one thread per output (a weight row for a tile of up to MT activation
// rows): no shared memory and no barriers, for Vulkan implementations that run
// invocations as SIMD lanes of CPU threads (lavapipe), where a workgroup-wide reduction
// costs more than it saves. Needs subgroups of 8 invocations (the activations are shared
// by broadcast; the host checks the size). Same bindings, push constants and modes as
// matmul.wgsl.

const MT: u32 = 8u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
// The activations as vec4s (one load gives a lane its 4 values; buffers are whole vec4s).
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@group(0) @binding(3) var<storage, read> R: array<u32>;

// #include lib/tile.wgsl

// The activations of one row's 32-value part, spread over the 8 lanes of a subgroup
// (lane l holds values 4l..4l+4), dotted with `w`: each lane loads 4 values, not 32, and
// takes the others from its neighbours. lavapipe loads from a storage buffer lane by
// lane, and a broadcast from a constant lane is a register move, so this is the cheap
// way to give every lane the same 32 values.
// Activation value `i`.
fn xat(i: u32) -> f32 {
    return X[i >> 2u][i & 3u];
}

fn dot_lanes(w: array<f32, 32>, xv: vec4<f32>) -> f32 {
    var v: array<vec4<f32>, 8>;
    v[0] = subgroupBroadcast(xv, 0u);
    v[1] = subgroupBroadcast(xv, 1u);
    v[2] = subgroupBroadcast(xv, 2u);
    v[3] = subgroupBroadcast(xv, 3u);
    v[4] = subgroupBroadcast(xv, 4u);
    v[5] = subgroupBroadcast(xv, 5u);
    v[6] = subgroupBroadcast(xv, 6u);
    v[7] = subgroupBroadcast(xv, 7u);
    var sum = 0.0;
    for (var l = 0u; l < 8u; l++) {
        for (var c = 0u; c < 4u; c++) {
            sum = fma(w[4u * l + c], v[l][c], sum);
        }
    }
    return sum;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    // Workgroup (x, tile): weight rows 64x.. for one activation tile (dense) or routed row
    // (experts). Every lane runs to the end, also past the last weight row (it reads row
    // n - 1 and stores nothing), so that each subgroup is whole at every broadcast.
    let o_raw = wg.x * 64u + lid;
    let live = o_raw < pc.n;
    let o = min(o_raw, pc.n - 1u);
    let tl = tile(o, wg.y + wg.z * nwg.y, MT);
    let row = tl.row;
    let rows = tl.rows;
    let x0 = tl.x0;
    let out0 = tl.out0;
    if (rows == 0u) {
        return;
    }
    // Every loop over `acc` and the decoded values has a constant trip count so that the
    // compiler unrolls it and keeps both arrays in registers: a dynamic index into a
    // private array puts it in memory, which costs lavapipe more than the arithmetic.
    var acc: array<f32, 8>;
    let full = pc.k / 32u;
    let aligned = ((pc.x_off | pc.k) & 3u) == 0u;
    for (var s = 0u; s < full; s++) {
        let w = deq32(row, s, pc.k);
        for (var r = 0u; r < MT; r++) {
            if (r < rows) {
                let xb = pc.x_off + (x0 + r) * pc.k + s * 32u + 4u * lane;
                var xv: vec4<f32>;
                if (aligned) {
                    xv = X[xb >> 2u];
                } else {
                    xv = vec4<f32>(xat(xb), xat(xb + 1u), xat(xb + 2u), xat(xb + 3u));
                }
                acc[r] += dot_lanes(w, xv);
            }
        }
    }
    // A last part of fewer than 32 values (float weights only): each lane reads all.
    let kk = full * 32u;
    if (kk < pc.k) {
        let w = deq32(row, full, pc.k);
        for (var r = 0u; r < MT; r++) {
            if (r < rows) {
                let xb = pc.x_off + (x0 + r) * pc.k + kk;
                var sum = 0.0;
                for (var j = 0u; j < 32u; j++) {
                    if (kk + j < pc.k) {
                        sum = fma(w[j], xat(xb + j), sum);
                    }
                }
                acc[r] += sum;
            }
        }
    }
    if (live) {
        for (var r = 0u; r < MT; r++) {
            if (r < rows) {
                O[pc.out_off + (out0 + r) * pc.out_stride + pc.o_base + o] = acc[r];
            }
        }
    }
}
