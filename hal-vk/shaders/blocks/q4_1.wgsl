// Q4_1: 20-byte blocks of 32 values { d: f16 @0, m: f16 @2, qs: [u8; 16] @4 }; value j is
// `d * q + m` with q the low nibble of qs[j] (j < 16) or the high nibble of qs[j - 16].
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + s * 20u;
    let d = half_at(b);
    let mn = half_at(b + 2u);
    for (var i = 0u; i < 4u; i++) {
        let w = rd32(b + 4u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let q = w >> (8u * t);
            let m = 4u * i + t;
            v[m] = d * f32(q & 0xfu) + mn;
            v[m + 16u] = d * f32((q >> 4u) & 0xfu) + mn;
        }
    }
    return v;
}
