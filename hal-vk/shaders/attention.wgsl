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
// - a sink (F) joins the denominator after the last tile; the output is multiplied by
//   1 / denominator.
// Invocation 0 finds each tile's maximum and sum; every invocation keeps its own copy of
// the running maximum and denominator (the same values).

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
var<workgroup> wt: array<f32, 64>;
var<workgroup> vis: array<u32, 64>;
var<workgroup> slots: array<u32, 64>;
var<workgroup> bounds: vec2<u32>;
// The tile's maximum score and whether it has a visible key (invocation 0's findings).
var<workgroup> tile_max: f32;
var<workgroup> tile_any: u32;
var<workgroup> tile_sum: f64;


fn bits(x: u32) -> f32 {
    return bitcast<f32>(x);
}

// `x * c` rounded to the nearest integer, ties to even, from the exact product: what
// ggml gets as `fma(x, c, 0x1.8p23) - 0x1.8p23` (for |x * c| < 2^22). Written out, as a
// compiler may fold that sum (SPIR-V marks no operation exact).
fn round_product(x: f32, c: f32) -> f32 {
    let p = x * c;
    let err = fma(x, c, -p);
    let fl = floor(p);
    if (p - fl == 0.5) {
        if (err > 0.0) {
            return fl + 1.0;
        }
        if (err < 0.0) {
            return fl;
        }
    }
    return round(p);
}

// ggml's AVX-512 `ggml_v_expf` for one lane (`flint_core::math::expf_ggml_avx512`).
fn expf_ggml(x: f32) -> f32 {
    let n = round_product(x, bits(0x3fb8aa3bu));
    let b = fma(-n, bits(0x35bfbe8eu), fma(-n, bits(0x3f317200u), x));
    let u = b * b;
    let j = fma(
        fma(fma(bits(0x3c072010u), b, bits(0x3d2b9f17u)), u, fma(bits(0x3e2aaf33u), b, bits(0x3efffedbu))),
        u,
        fma(bits(0x3f7ffff6u), b, 1.0),
    );
    if (abs(n) > 192.0) {
        return select(bits(0x7f800000u), 0.0, n <= 0.0);
    }
    return ldexp(j, i32(n));
}

// 2^(i/32), i in 0..32 (glibc's `expf` table with its index bits restored).
const EXP2_32 = array<f64, 32>(
    f64(1.0),
    f64(1.0218971486541166),
    f64(1.0442737824274138),
    f64(1.0671404006768237),
    f64(1.0905077326652577),
    f64(1.1143867425958924),
    f64(1.1387886347566916),
    f64(1.1637248587775775),
    f64(1.189207115002721),
    f64(1.215247359980469),
    f64(1.241857812073484),
    f64(1.2690509571917332),
    f64(1.2968395546510096),
    f64(1.3252366431597413),
    f64(1.3542555469368927),
    f64(1.383909881963832),
    f64(1.4142135623730951),
    f64(1.4451808069770467),
    f64(1.4768261459394993),
    f64(1.5091644275934228),
    f64(1.5422108254079407),
    f64(1.5759808451078865),
    f64(1.6104903319492543),
    f64(1.645755478153965),
    f64(1.681792830507429),
    f64(1.718619298122478),
    f64(1.7562521603732995),
    f64(1.7947090750031072),
    f64(1.8340080864093424),
    f64(1.8741676341103),
    f64(1.9152065613971474),
    f64(1.9571441241754002)
);

// `round_product` in double.
fn round_product64(x: f64, c: f64) -> f64 {
    let p = x * c;
    let err = fma(x, c, -p);
    let fl = floor(p);
    if (p - fl == f64(0.5)) {
        if (err > f64(0.0)) {
            return fl + f64(1.0);
        }
        if (err < f64(0.0)) {
            return fl;
        }
    }
    return round(p);
}

// glibc's `expf` (x86-64, FMA build; `flint_core::math::expf_libc`): x * 32 / ln 2 = k + r,
// then 2^(k/32) * (c0 r^3 + c1 r^2 + c2 r + 1) in double, rounded to float once.
fn expf_libc(x: f32) -> f32 {
    let xb = bitcast<u32>(x);
    let abstop = (xb >> 20u) & 0x7ffu;
    if (abstop >= (0x42b00000u >> 20u)) {
        if (xb == 0xff800000u) {
            return 0.0;
        }
        if (abstop >= 0x7f8u) {
            return x + x;
        }
        if (x > bits(0x42b17217u)) {
            return bits(0x7f800000u);
        }
        if (x < bits(0xc2cff1b4u)) {
            return 0.0;
        }
    }
    let inv_ln2_n = f64(46.16624130844683);
    let xd = f64(x);
    // glibc rounds with `fma(inv_ln2_n, xd, 0x1.8p52) - 0x1.8p52`: the same integer.
    let kd = round_product64(inv_ln2_n, xd);
    let k = i32(kd);
    let r = fma(inv_ln2_n, xd, -kd);
    let s = ldexp(EXP2_32[u32(k) & 31u], k >> 5u);
    let z = fma(f64(1.6938359250920212e-06), r, f64(0.00023459809789509004));
    let r2 = r * r;
    var y = fma(f64(0.021660849396613134), r, f64(1.0));
    y = fma(z, r2, y);
    return f32(y * s);
}

// `_mm512_reduce_add_ps` of wt[16g..16g + 16] as GCC expands it
// (`flint_core::math::reduce_add_16`).
fn reduce16(g: u32) -> f32 {
    let o = 16u * g;
    var t: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        t[i] = wt[o + i + 8u] + wt[o + i];
    }
    let u0 = t[4] + t[0];
    let u1 = t[5] + t[1];
    let u2 = t[6] + t[2];
    let u3 = t[7] + t[3];
    return (u0 + u2) + (u1 + u3);
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
                dot = fma(q_sh[d], KC[kb + d], dot);
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
                        acc[c] = fma(wi, VC[vb + d], acc[c]);
                        c++;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (valid) {
        if (pc.has_sinks != 0u) {
            let sink = F[h];
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
            denom = fma(denom, ms, vs);
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
