// MoE routing, one thread per token row, as flint_core::math::route_topk computes it
// (llama.cpp's AVX-512 build): scores by `gating` (0 sigmoid: 1 / (1 + glibc expf(-x));
// 1 softmax over all n experts: ggml's soft_max, expf_ggml over whole vectors of 16 and
// glibc's expf after them, the lanes summed by reduce_add_16 and the vectors in f64,
// every value times the f32 reciprocal of the sum; 2 softmax over the chosen logits),
// the k largest score + bias (ties to the lower index, NaN never preferred), the chosen
// unbiased scores as weights (gating 2: their softmax), renormalised by their f64 sum
// (clamped below at 2^-14) when `normalize`, times `scale`; with `has_es`, each then
// times its expert's ES value (Gemma 4's per-expert scale, one f32 multiply as
// flint_core::math::scale_by_expert). Row r writes its ids to IDS[kr..k(r + 1)] and its
// weights to W[w_off + kr..w_off + k(r + 1)].

// #include lib/float.wgsl
// #include lib/expf.wgsl

const MAX_K: u32 = 64u;

struct P {
    rows: u32,
    n: u32,
    k: u32,
    gating: u32,
    normalize: u32,
    scale: f32,
    has_bias: u32,
    l_off: u32,
    b_off: u32,
    has_es: u32,
    es_off: u32,
    w_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read> BIAS: array<f32>;
@group(0) @binding(2) var<storage, read> ES: array<f32>;
@group(0) @binding(3) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(4) var<storage, read_write> W: array<f32>;

// ggml's soft_max exponential of value i of a row of `len`: expf_ggml inside the whole
// vectors of 16, glibc's expf after them (flint_core::math::soft_max_exp).
fn soft_max_exp(len: u32, i: u32, x: f32) -> f32 {
    if (i < len - len % 16u) {
        return expf_ggml(x);
    }
    return expf_libc(x);
}

fn beats(a: f32, b: f32) -> bool {
    let a_nan = a != a;
    let b_nan = b != b;
    return a > b || (b_nan && !a_nan);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= pc.rows) {
        return;
    }
    let n = pc.n;
    let k = pc.k;
    let base = pc.l_off + r * n;
    // Softmax over all experts: the maximum and the f32 reciprocal of the sum.
    var smax = 0.0;
    var inv = 1.0;
    if (pc.gating == 1u) {
        smax = L[base];
        for (var e = 1u; e < n; e++) {
            smax = max(smax, L[base + e]);
        }
        let full = n - n % 16u;
        var sum = f64(0.0);
        for (var c = 0u; c < full; c += 16u) {
            var v: array<f32, 16>;
            for (var j = 0u; j < 16u; j++) {
                v[j] = expf_ggml(L[base + c + j] - smax);
            }
            sum += f64(reduce_add_16(v));
        }
        for (var e = full; e < n; e++) {
            sum += f64(expf_libc(L[base + e] - smax));
        }
        inv = f32(f64(1.0) / sum);
    }
    // The k best keys, best first.
    var keys: array<f32, MAX_K>;
    var ids: array<u32, MAX_K>;
    var len = 0u;
    for (var e = 0u; e < n; e++) {
        let x = L[base + e];
        var s = x;
        if (pc.gating == 0u) {
            s = 1.0 / (1.0 + expf_libc(-x));
        } else if (pc.gating == 1u) {
            s = soft_max_exp(n, e, x - smax) * inv;
        }
        var key = s;
        if (pc.has_bias != 0u) {
            key = s + BIAS[pc.b_off + e];
        }
        if (len == k && !beats(key, keys[k - 1u])) {
            continue;
        }
        var at = min(len, k - 1u);
        for (var i = 0u; i < len; i++) {
            if (beats(key, keys[i])) {
                at = i;
                break;
            }
        }
        var j = min(len, k - 1u);
        while (j > at) {
            keys[j] = keys[j - 1u];
            ids[j] = ids[j - 1u];
            j--;
        }
        keys[at] = key;
        ids[at] = e;
        len = min(len + 1u, k);
    }
    var w: array<f32, MAX_K>;
    for (var i = 0u; i < k; i++) {
        let x = L[base + ids[i]];
        if (pc.gating == 0u) {
            w[i] = 1.0 / (1.0 + expf_libc(-x));
        } else if (pc.gating == 1u) {
            w[i] = soft_max_exp(n, ids[i], x - smax) * inv;
        } else {
            w[i] = x;
        }
    }
    if (pc.gating == 2u) {
        var m = w[0];
        for (var i = 1u; i < k; i++) {
            m = max(m, w[i]);
        }
        let full = k - k % 16u;
        var sum = f64(0.0);
        for (var c = 0u; c < full; c += 16u) {
            var v: array<f32, 16>;
            for (var j = 0u; j < 16u; j++) {
                w[c + j] = expf_ggml(w[c + j] - m);
                v[j] = w[c + j];
            }
            sum += f64(reduce_add_16(v));
        }
        for (var i = full; i < k; i++) {
            w[i] = expf_libc(w[i] - m);
            sum += f64(w[i]);
        }
        let winv = f32(f64(1.0) / sum);
        for (var i = 0u; i < k; i++) {
            w[i] = w[i] * winv;
        }
    }
    if (pc.normalize != 0u) {
        var sum = f64(0.0);
        for (var i = 0u; i < k; i++) {
            sum += f64(w[i]);
        }
        let d = max(f32(sum), 6.1035156e-5);
        for (var i = 0u; i < k; i++) {
            w[i] = w[i] / d;
        }
    }
    let o = k * r;
    for (var i = 0u; i < k; i++) {
        IDS[o + i] = ids[i];
        var wv = w[i] * pc.scale;
        if (pc.has_es != 0u) {
            wv = wv * ES[pc.es_off + ids[i]];
        }
        W[pc.w_off + o + i] = wv;
    }
}
