// KV writes through a slot mapping: token i's key row goes to KC row S[i], its value
// row to VC row S[i], each value rounded to f16 (the cache holds what llama.cpp's default
// f16 cache holds; the buffers stay f32). One thread per (token, element).

struct P {
    n_tok: u32,
    row_k: u32,
    row_v: u32,
    k_off: u32,
    v_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> K: array<f32>;
@group(0) @binding(1) var<storage, read> V: array<f32>;
@group(0) @binding(2) var<storage, read_write> KC: array<f32>;
@group(0) @binding(3) var<storage, read_write> VC: array<f32>;
@group(0) @binding(4) var<storage, read> S: array<u32>;

fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let w = max(pc.row_k, pc.row_v);
    if (t >= pc.n_tok * w) {
        return;
    }
    let i = t / w;
    let e = t % w;
    let slot = S[i];
    if (e < pc.row_k) {
        KC[slot * pc.row_k + e] = f16_round(K[pc.k_off + i * pc.row_k + e]);
    }
    if (e < pc.row_v) {
        VC[slot * pc.row_v + e] = f16_round(V[pc.v_off + i * pc.row_v + e]);
    }
}
