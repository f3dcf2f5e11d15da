// Matmul on a weight kept in its own encoding (the block decoding `deq32` comes from
// blocks/<type>.wgsl, the byte readers from prelude.wgsl, the push constants from
// matmul_params.wgsl; build.rs joins them).
//
// Dense (mode 0): `O[out_off + r * out_stride + o_base + o] = sum_k W[o][k] * X[x_off + r * k + k']`
// for the chunk's `n` weight rows and the `m` activation rows; one workgroup computes one
// weight row for a tile of up to MT activation rows, so each sub-block is decoded once
// per tile.
// Expert (mode 1): `R` holds (input row, expert) pairs; one workgroup per (weight row,
// routed row); rows whose expert lies outside this chunk's `e_base..e_base + e_count`
// are left to the chunk that holds it.
//
// Threads split the row into groups of 32 values; the partial sums meet in a tree.

const MT: u32 = 8u;
const WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@group(0) @binding(3) var<storage, read> R: array<u32>;

var<workgroup> red: array<f32, 512>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let o = g % pc.n;
    let t = g / pc.n;
    var valid = true;
    var row = 0u;
    var rows = 0u;
    var x_rows: array<u32, 8>;
    var out_rows: array<u32, 8>;
    if (pc.mode == 0u) {
        let m0 = t * MT;
        if (m0 >= pc.m) {
            valid = false;
        } else {
            rows = min(MT, pc.m - m0);
            row = o * pc.row_bytes;
            for (var r = 0u; r < rows; r++) {
                x_rows[r] = m0 + r;
                out_rows[r] = m0 + r;
            }
        }
    } else {
        if (t >= pc.n_rows) {
            valid = false;
        } else {
            let e = R[2u * t + 1u];
            if (e < pc.e_base || e >= pc.e_base + pc.e_count) {
                valid = false;
            } else {
                rows = 1u;
                row = (e - pc.e_base) * pc.expert_bytes + o * pc.row_bytes;
                x_rows[0] = R[2u * t];
                out_rows[0] = t;
            }
        }
    }

    var acc: array<f32, 8>;
    let nsub = (pc.k + 31u) / 32u;
    if (valid) {
        for (var s = lid; s < nsub; s += WG) {
            let w = deq32(row, s, pc.k);
            let kk = s * 32u;
            let n_here = min(32u, pc.k - kk);
            for (var r = 0u; r < rows; r++) {
                let xb = pc.x_off + x_rows[r] * pc.k + kk;
                var sum = 0.0;
                for (var j = 0u; j < n_here; j++) {
                    sum = fma(w[j], X[xb + j], sum);
                }
                acc[r] += sum;
            }
        }
    }
    for (var r = 0u; r < MT; r++) {
        red[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            for (var r = 0u; r < MT; r++) {
                red[r * WG + lid] += red[r * WG + lid + h];
            }
        }
        workgroupBarrier();
    }
    if (valid && lid == 0u) {
        for (var r = 0u; r < rows; r++) {
            O[pc.out_off + out_rows[r] * pc.out_stride + pc.o_base + o] = red[r * WG];
        }
    }
}
