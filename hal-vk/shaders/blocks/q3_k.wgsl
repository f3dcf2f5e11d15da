// Q3_K: 110-byte blocks of 256 values { hmask: [u8; 32] @0, qs: [u8; 64] @32,
// scales: [u8; 12] @96, d: f16 @108 }. Value e is `(d * (sc - 32)) * (q - (h ? 0 : 4))`:
// sc the 6-bit scale e / 16 (`q3k_scales`), q the Q2_K-layout crumb of e, h bit e / 32
// of hmask[e % 32].

// The 6-bit scale `i` (0..16) of the block at `b`, still offset by 32.
fn q3k_scale(b: u32, i: u32) -> u32 {
    let low = (rd8(b + 96u + i % 8u) >> (4u * (i / 8u))) & 0xfu;
    let high = (rd8(b + 104u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return low | (high << 4u);
}

fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + (s / 8u) * 110u;
    let p = s % 8u;
    let d = half_at(b + 108u);
    let sh = 2u * (p % 4u);
    let qs = b + 32u + 32u * (p / 4u);
    for (var h = 0u; h < 2u; h++) {
        let dl = d * f32(i32(q3k_scale(b, 2u * p + h)) - 32);
        for (var i = 0u; i < 4u; i++) {
            let w = rd32(qs + 16u * h + 4u * i);
            let hm = rd32(b + 16u * h + 4u * i);
            for (var t = 0u; t < 4u; t++) {
                let hb = (hm >> (8u * t + p)) & 1u;
                var q = i32((w >> (8u * t + sh)) & 3u);
                if (hb == 0u) {
                    q -= 4;
                }
                v[16u * h + 4u * i + t] = dl * f32(q);
            }
        }
    }
    return v;
}
