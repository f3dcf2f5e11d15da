// Paged attention, one workgroup per (query entry, head), computing for each what
// `flint_core::math::attend_ggml_tiled` computes in its AVX-512 build (llama.cpp's tiled
// CPU flash attention, operation for operation; the cpu and ref devices compute it too):
// Entry e of A is (query row, position p, offset of the sequence's block table in A);
// the query at p attends to keys j in [j0, p], j0 = max(0, p + 1 - window) (window 0: no
// window), key j living in slot A[bt + j / bs] * bs + j % bs.
// - tiles of 64 keys aligned on absolute positions, one score per invocation: a fused
//   multiply-add chain over the head dimension from 0, times `scale`;
// - per tile with a visible key: the running maximum grows to the tile's (rescaling the
//   output and the denominator by glibc's `expf` of the difference), the weights are
//   ggml's AVX-512 `expf` of `score - max`, their sum is taken as 4 vectors of 16 lanes
//   (`reduce_add_16`) added in f64 and added to the f32 denominator in f64;
// - each invocation owns output dims lid, lid + 64, ... (head_dim_v <= 512), one fused
//   multiply-add chain over the tile's visible keys in order;
// - a sink (F from sinks_off) joins the denominator after the last tile; the output is multiplied by
//   1 / denominator.
// Invocation 0 finds each tile's maximum and sum; every invocation keeps its own copy of
// the running maximum and denominator (the same values).

const WG: u32 = 64u;

// #include lib/float.wgsl
// #include lib/expf.wgsl

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
    // First sink of F (F may be a model tensor at an offset).
    sinks_off: u32,
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
var<workgroup> wt: array<f32, 64>;
var<workgroup> vis: array<u32, 64>;
var<workgroup> slots: array<u32, 64>;
var<workgroup> bounds: vec2<u32>;
// The tile's maximum score and whether it has a visible key (invocation 0's findings).
var<workgroup> tile_max: f32;
var<workgroup> tile_any: u32;
var<workgroup> tile_sum: f64;

// `reduce_add_16` (lib/expf.wgsl) of wt[16g..16g + 16].
fn reduce16(g: u32) -> f32 {
    var v: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        v[i] = wt[16u * g + i];
    }
    return reduce_add_16(v);
}

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

    // The running maximum (`have_m`: some key seen), the denominator, the output.
    var m = 0.0;
    var have_m = false;
    var denom = 0.0;
    var acc: array<f32, 8>;
    var t0 = (j0 / WG) * WG;
    if (j1 == 0u) {
        t0 = 0u;
    }
    for (; t0 < j1; t0 += WG) {
        let j = t0 + lid;
        let visible = j >= j0 && j < j1;
        var s = 0.0;
        var slot = 0u;
        if (visible) {
            slot = A[bt + j / pc.bs] * pc.bs + j % pc.bs;
            let kb = (slot * pc.n_kv_heads + kvh) * pc.dk;
            var dot = 0.0;
            for (var d = 0u; d < pc.dk; d++) {
                dot = fma_x(q_sh[d], KC[kb + d], dot);
            }
            s = dot * pc.scale;
        }
        sc[lid] = s;
        vis[lid] = u32(visible);
        slots[lid] = slot;
        workgroupBarrier();
        if (lid == 0u) {
            var any = false;
            var tmax = 0.0;
            for (var i = 0u; i < WG; i++) {
                if (vis[i] != 0u) {
                    tmax = select(sc[i], max(tmax, sc[i]), any);
                    any = true;
                }
            }
            tile_max = tmax;
            tile_any = u32(any);
        }
        let any = workgroupUniformLoad(&tile_any) != 0u;
        let tmax = workgroupUniformLoad(&tile_max);
        if (any) {
            var m_new = tmax;
            if (have_m) {
                m_new = max(m, tmax);
                if (m_new > m) {
                    let ms = expf_libc(m - m_new);
                    for (var c = 0u; c < 8u; c++) {
                        acc[c] = acc[c] * ms;
                    }
                    denom = denom * ms;
                }
            }
            m = m_new;
            have_m = true;
            var w = 0.0;
            if (visible) {
                w = expf_ggml(s - m);
            }
            wt[lid] = w;
            workgroupBarrier();
            if (lid == 0u) {
                var sum = f64(0.0);
                for (var q = 0u; q < 4u; q++) {
                    sum += f64(reduce16(q));
                }
                tile_sum = sum;
            }
            denom = f32(f64(denom) + workgroupUniformLoad(&tile_sum));
            for (var i = 0u; i < WG; i++) {
                if (vis[i] != 0u) {
                    let wi = wt[i];
                    let vb = (slots[i] * pc.n_kv_heads + kvh) * pc.dv;
                    var c = 0u;
                    for (var d = lid; d < pc.dv; d += WG) {
                        acc[c] = fma_x(wi, VC[vb + d], acc[c]);
                        c++;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (valid) {
        if (pc.has_sinks != 0u) {
            let sink = F[pc.sinks_off + h];
            var ms = 1.0;
            var vs = 1.0;
            if (!have_m || sink > m) {
                ms = select(0.0, expf_libc(m - sink), have_m);
                for (var c = 0u; c < 8u; c++) {
                    acc[c] = acc[c] * ms;
                }
            } else {
                vs = expf_libc(sink - m);
            }
            denom = fma_x(denom, ms, vs);
        }
        var inv = 0.0;
        if (denom != 0.0) {
            inv = 1.0 / denom;
        }
        let ob = pc.out_off + qrow * pc.o_stride + h * pc.dv;
        var c = 0u;
        for (var d = lid; d < pc.dv; d += WG) {
            O[ob + d] = acc[c] * inv;
            c++;
        }
    }
}
