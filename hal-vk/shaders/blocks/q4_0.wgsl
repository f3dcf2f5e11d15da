// Q4_0: 18-byte blocks of 32 values { d: f16 @0, qs: [u8; 16] @2 }; value j is
// `d * (q - 8)` with q the low nibble of qs[j] (j < 16) or the high nibble of qs[j - 16].
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + s * 18u;
    let d = half_at(b);
    for (var i = 0u; i < 4u; i++) {
        let w = rd32(b + 2u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let q = w >> (8u * t);
            let m = 4u * i + t;
            v[m] = d * f32(i32(q & 0xfu) - 8);
            v[m + 16u] = d * f32(i32((q >> 4u) & 0xfu) - 8);
        }
    }
    return v;
}
