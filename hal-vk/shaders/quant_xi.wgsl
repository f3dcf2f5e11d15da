// Activation quantization for the exact matmul (matmul_exact.wgsl): the integers and
// scales of flint_core::quant::quantize_act, one thread per block, written as words:
// mode 0 Q8_K (256 values -> 73 words): 64 words of quants (4 per word, value 4w + t in
//        byte t), the scale d as f32 bits, then the 16 sums of 16 quants as i16 pairs
//        (word 65 + j holds sums 2j (low half) and 2j + 1). max = the value of largest
//        magnitude (first on ties), iscale = -127 / max, q = min(127, round(iscale * x)),
//        d = 1 / iscale; an all-zero block is all zero.
// mode 1 Q8_0 (32 values -> 9 words): 8 words of quants, then d (the f16 scale, as f32
//        bits): amax, d = f16(amax / 127), id = 127 / amax (0 for amax 0),
//        q = clamp(round(x * id), -128, 127).
// `round` is WGSL's round-half-to-even, as ggml's nearest_int and _mm256_round_ps.

struct P {
    n_blocks: u32,
    mode: u32,
    x_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> O: array<u32>;

fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

fn pack4(q: vec4<i32>) -> u32 {
    let b = vec4<u32>(bitcast<vec4<u32>>(q) & vec4<u32>(0xffu));
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * 64u;
    if (b >= pc.n_blocks) {
        return;
    }
    if (pc.mode == 0u) {
        let xb = pc.x_off + b * 256u;
        let ob = b * 73u;
        var amax = 0.0;
        var mx = 0.0;
        for (var i = 0u; i < 256u; i++) {
            let v = X[xb + i];
            if (abs(v) > amax) {
                amax = abs(v);
                mx = v;
            }
        }
        if (amax == 0.0) {
            for (var i = 0u; i < 73u; i++) {
                O[ob + i] = 0u;
            }
            return;
        }
        let iscale = -127.0 / mx;
        var sums: array<i32, 16>;
        for (var w = 0u; w < 64u; w++) {
            let e = xb + 4u * w;
            let v = vec4<f32>(X[e], X[e + 1u], X[e + 2u], X[e + 3u]);
            let q = vec4<i32>(min(vec4<f32>(127.0), round(iscale * v)));
            O[ob + w] = pack4(q);
            sums[w / 4u] += q.x + q.y + q.z + q.w;
        }
        O[ob + 64u] = bitcast<u32>(1.0 / iscale);
        for (var j = 0u; j < 8u; j++) {
            let lo = bitcast<u32>(sums[2u * j]) & 0xffffu;
            let hi = bitcast<u32>(sums[2u * j + 1u]) & 0xffffu;
            O[ob + 65u + j] = lo | (hi << 16u);
        }
    } else {
        let xb = pc.x_off + b * 32u;
        let ob = b * 9u;
        var amax = 0.0;
        for (var i = 0u; i < 32u; i++) {
            amax = max(amax, abs(X[xb + i]));
        }
        let d = f16_round(amax / 127.0);
        var id = 0.0;
        if (amax != 0.0) {
            id = 127.0 / amax;
        }
        for (var w = 0u; w < 8u; w++) {
            let e = xb + 4u * w;
            let v = vec4<f32>(X[e], X[e + 1u], X[e + 2u], X[e + 3u]);
            let q = vec4<i32>(clamp(round(v * id), vec4<f32>(-128.0), vec4<f32>(127.0)));
            O[ob + w] = pack4(q);
        }
        O[ob + 8u] = bitcast<u32>(d);
    }
}
