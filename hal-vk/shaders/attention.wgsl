// Paged attention, one workgroup per (query entry, head). Entry e of A is
// (query row, position p, offset of the sequence's block table in A); the query at p
// attends to keys j in [max(0, p + 1 - window), p] (window 0: no window), key j living
// in slot A[bt + j / bs] * bs + j % bs. Keys are taken in tiles of 64 (one score per
// thread), with a running max and sum (online softmax); each thread owns output dims
// lid, lid + 64, ... (head_dim_v <= 512). Per-head sinks (F) add exp(sink - m) to the
// denominator only.

const WG: u32 = 64u;

struct P {
    n_heads: u32,
    n_kv_heads: u32,
    dk: u32,
    dv: u32,
    bs: u32,
    scale: f32,
    window: u32,
    has_sinks: u32,
    q_off: u32,
    out_off: u32,
    n_entries: u32,
    q_stride: u32,
    o_stride: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> KC: array<f32>;
@group(0) @binding(2) var<storage, read> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<storage, read> A: array<u32>;
@group(0) @binding(5) var<storage, read> F: array<f32>;

var<workgroup> q_sh: array<f32, 512>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> slots: array<u32, 64>;
var<workgroup> bounds: vec2<u32>;

const NEG: f32 = -3.0e38;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let e = g / pc.n_heads;
    let h = g % pc.n_heads;
    let valid = e < pc.n_entries;
    let kvh = h / (pc.n_heads / pc.n_kv_heads);
    var qrow = 0u;
    var bt = 0u;
    if (valid) {
        qrow = A[3u * e];
        bt = A[3u * e + 2u];
        let qb = pc.q_off + qrow * pc.q_stride + h * pc.dk;
        for (var d = lid; d < pc.dk; d += WG) {
            q_sh[d] = Q[qb + d];
        }
        if (lid == 0u) {
            let p = A[3u * e + 1u];
            var j0 = 0u;
            if (pc.window > 0u && p + 1u > pc.window) {
                j0 = p + 1u - pc.window;
            }
            bounds = vec2<u32>(j0, p + 1u);
        }
    } else if (lid == 0u) {
        bounds = vec2<u32>(0u, 0u);
    }
    let b = workgroupUniformLoad(&bounds);
    let j0 = b.x;
    let j1 = b.y;

    var m = NEG;
    var l = 0.0;
    var acc: array<f32, 8>;
    let n_tiles = (j1 - j0 + WG - 1u) / WG;
    for (var t = 0u; t < n_tiles; t++) {
        let j = j0 + t * WG + lid;
        var s = NEG;
        var slot = 0u;
        if (j < j1) {
            slot = A[bt + j / pc.bs] * pc.bs + j % pc.bs;
            let kb = (slot * pc.n_kv_heads + kvh) * pc.dk;
            var dot = 0.0;
            for (var d = 0u; d < pc.dk; d++) {
                dot = fma(q_sh[d], KC[kb + d], dot);
            }
            s = dot * pc.scale;
        }
        sc[lid] = s;
        slots[lid] = slot;
        workgroupBarrier();
        let n_here = min(WG, j1 - (j0 + t * WG));
        var mt = m;
        for (var i = 0u; i < n_here; i++) {
            mt = max(mt, sc[i]);
        }
        let corr = exp(m - mt);
        l = l * corr;
        for (var c = 0u; c < 8u; c++) {
            acc[c] = acc[c] * corr;
        }
        for (var i = 0u; i < n_here; i++) {
            let p = exp(sc[i] - mt);
            l += p;
            let vb = (slots[i] * pc.n_kv_heads + kvh) * pc.dv;
            var c = 0u;
            for (var d = lid; d < pc.dv; d += WG) {
                acc[c] = fma(p, VC[vb + d], acc[c]);
                c++;
            }
        }
        m = mt;
        workgroupBarrier();
    }
    if (valid) {
        var denom = l;
        var f = 1.0;
        if (pc.has_sinks != 0u) {
            let sink = F[h];
            let m2 = max(m, sink);
            f = exp(m - m2);
            denom = l * f + exp(sink - m2);
        }
        let ob = pc.out_off + qrow * pc.o_stride + h * pc.dv;
        var c = 0u;
        for (var d = lid; d < pc.dv; d += WG) {
            O[ob + d] = acc[c] * f / denom;
            c++;
        }
    }
}
