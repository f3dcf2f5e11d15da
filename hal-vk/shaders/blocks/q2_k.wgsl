// Q2_K: 84-byte blocks of 256 values { scales: [u8; 16] @0, qs: [u8; 64] @16, d: f16 @80,
// dmin: f16 @82 }. Value e is `(d * (sc & 15)) * q - (dmin * (sc >> 4))`, sc = scales[e / 16],
// q = bits 2(r / 32).. of qs[32(e / 128) + r % 32], r = e % 128.
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + (s / 8u) * 84u;
    let p = s % 8u;
    let d = half_at(b + 80u);
    let dmin = half_at(b + 82u);
    let sh = 2u * (p % 4u);
    let qs = b + 16u + 32u * (p / 4u);
    for (var h = 0u; h < 2u; h++) {
        let sc = rd8(b + 2u * p + h);
        let dl = d * f32(sc & 0xfu);
        let ml = dmin * f32(sc >> 4u);
        for (var i = 0u; i < 4u; i++) {
            let w = rd32(qs + 16u * h + 4u * i);
            for (var t = 0u; t < 4u; t++) {
                let q = (w >> (8u * t + sh)) & 3u;
                v[16u * h + 4u * i + t] = dl * f32(q) - ml;
            }
        }
    }
    return v;
}
