// Shared by every weight shader (matmul, get_rows): byte access to the weight buffer `W`
// (GGUF blocks as they are in the file, read as little-endian u32 words) and the float
// decodings blocks use. Each shader declares `W` itself.

// The byte at byte offset `b` of W.
fn rd8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The byte at `b`, as a signed value.
fn rd8s(b: u32) -> i32 {
    return (i32(rd8(b)) << 24u) >> 24u;
}

// The little-endian u16 at an even byte offset `b`.
fn rd16(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

// The little-endian u32 at an even byte offset `b`.
fn rd32(b: u32) -> u32 {
    if ((b & 3u) == 0u) {
        return W[b >> 2u];
    }
    return rd16(b) | (rd16(b + 2u) << 16u);
}

// The IEEE half at an even byte offset `b`, as f32.
fn half_at(b: u32) -> f32 {
    return unpack2x16float(rd16(b)).x;
}

// The bfloat16 at an even byte offset `b`, as f32.
fn bf16_at(b: u32) -> f32 {
    return bitcast<f32>(rd16(b) << 16u);
}

// The 6-bit (scale, min) of part `p` (0..8) of a Q4_K or Q5_K block at byte `b` (its
// 12 bytes of scales at b + 4), as `flint_core`'s `k4_scale_min`.
fn k4_scale_min(b: u32, p: u32) -> vec2<u32> {
    let s = b + 4u;
    if (p < 4u) {
        return vec2<u32>(rd8(s + p) & 63u, rd8(s + p + 4u) & 63u);
    }
    let j = p - 4u;
    let sc = (rd8(s + j + 8u) & 0xfu) | ((rd8(s + j) >> 2u) & 0x30u);
    let mn = (rd8(s + j + 8u) >> 4u) | ((rd8(s + j + 4u) >> 2u) & 0x30u);
    return vec2<u32>(sc, mn);
}

// Part `p` of a Q4_K or Q5_K block at byte `b` from its integer values `q`:
// `(d * sc) * q - (dmin * mn)`, as `flint_core` dequantizes both.
fn k4_deq32(b: u32, p: u32, q: array<i32, 32>) -> array<f32, 32> {
    var v: array<f32, 32>;
    let sm = k4_scale_min(b, p);
    let dl = half_at(b) * f32(sm.x);
    let ml = half_at(b + 2u) * f32(sm.y);
    for (var j = 0u; j < 32u; j++) {
        v[j] = dl * f32(q[j]) - ml;
    }
    return v;
}
