// Matmul in the cpu device's float order (llama.cpp's x86 kernels as the cpu device runs
// them, stated in flint_core::dot::ggml_x86), one exact/<type>.wgsl per weight type:
// `wpart` decodes a 32-value part of a weight row, `act` places an activation row's block,
// `step` takes one part into a row's state `St` (exact integer dot products with the
// activation quants of quant_xi.wgsl, or f32 products for F32, then the float steps of
// the type's kernel, each multiply-add rounded once: `fma_x`, lib/float.wgsl), `done`
// gives the result.
// One thread per output, as matmul_rows.wgsl: a workgroup of 64 weight rows for one tile
// of up to MT activation rows (dense; MT from the type's file) or one routed row
// (experts); the activation words of a 32-value part are loaded once per subgroup of 8
// and broadcast. Same bindings and push constants as matmul_rows.wgsl (x_off: the first
// activation block, or value for F32).

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<u32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@group(0) @binding(3) var<storage, read> R: array<u32>;

// #include lib/float.wgsl
// #include lib/tile.wgsl

// Byte t (0..3) of word w, sign-extended.
fn sbyte(w: u32, t: u32) -> i32 {
    return bitcast<i32>(w << (24u - 8u * t)) >> 24u;
}

// The signed halves of word w.
fn shalves(w: u32) -> vec2<i32> {
    return vec2<i32>(bitcast<i32>(w << 16u) >> 16u, bitcast<i32>(w) >> 16u);
}

// Eight lanes of 4-value integer dot products of `w` (a 32-value part) with the
// activation quants whose word `l` lane l of the subgroup holds in `xw`.
fn idot_lanes(w: array<i32, 32>, xw: u32) -> array<i32, 8> {
    var v: array<u32, 8>;
    v[0] = subgroupBroadcast(xw, 0u);
    v[1] = subgroupBroadcast(xw, 1u);
    v[2] = subgroupBroadcast(xw, 2u);
    v[3] = subgroupBroadcast(xw, 3u);
    v[4] = subgroupBroadcast(xw, 4u);
    v[5] = subgroupBroadcast(xw, 5u);
    v[6] = subgroupBroadcast(xw, 6u);
    v[7] = subgroupBroadcast(xw, 7u);
    var s: array<i32, 8>;
    for (var l = 0u; l < 8u; l++) {
        var a = 0;
        for (var t = 0u; t < 4u; t++) {
            a += w[4u * l + t] * sbyte(v[l], t);
        }
        s[l] = a;
    }
    return s;
}

// The sum of the eight lanes.
fn isum8(s: array<i32, 8>) -> i32 {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
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
    var st: array<St, MT>;
    for (var s = 0u; s < pc.k / 32u; s++) {
        let w = wpart(row, s);
        for (var r = 0u; r < MT; r++) {
            if (r < rows) {
                st[r] = step(st[r], row, s, w, act(x0 + r, s), lane);
            }
        }
    }
    if (live) {
        for (var r = 0u; r < MT; r++) {
            if (r < rows) {
                O[pc.out_off + (out0 + r) * pc.out_stride + pc.o_base + o] = done(st[r]);
            }
        }
    }
}
