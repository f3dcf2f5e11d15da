// Embedding gather on a weight kept in its own encoding (`deq32` from
// blocks/<type>.wgsl): for each pair i of `R` = (output row, weight row within this
// chunk), `O[out_off + R[2i] * k ..][..k] = dequant(W row R[2i + 1])`. One workgroup per
// pair; threads split the row into groups of 32 values.

const WG: u32 = 64u;

struct P {
    k: u32,
    row_bytes: u32,
    n_pairs: u32,
    out_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read_write> O: array<f32>;
@group(0) @binding(2) var<storage, read> R: array<u32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = wid.x + wid.y * nwg.x;
    if (i >= pc.n_pairs) {
        return;
    }
    let dst = pc.out_off + R[2u * i] * pc.k;
    let row = R[2u * i + 1u] * pc.row_bytes;
    let nsub = (pc.k + 31u) / 32u;
    for (var s = lid; s < nsub; s += WG) {
        let w = deq32(row, s, pc.k);
        let kk = s * 32u;
        let n_here = min(32u, pc.k - kk);
        for (var j = 0u; j < n_here; j++) {
            O[dst + kk + j] = w[j];
        }
    }
}
