// Q5_1: 24-byte blocks of 32 values { d: f16 @0, m: f16 @2, qh: u32 (LE bytes) @4,
// qs: [u8; 16] @8 }; value j is `d * q + m`, q = the Q4_1 nibble of j | bit j of qh << 4.
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + s * 24u;
    let d = half_at(b);
    let mn = half_at(b + 2u);
    let qh = rd32(b + 4u);
    for (var i = 0u; i < 4u; i++) {
        let w = rd32(b + 8u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let q = w >> (8u * t);
            let m = 4u * i + t;
            let lo = (q & 0xfu) | (((qh >> m) & 1u) << 4u);
            let hi = ((q >> 4u) & 0xfu) | (((qh >> (m + 16u)) & 1u) << 4u);
            v[m] = d * f32(lo) + mn;
            v[m + 16u] = d * f32(hi) + mn;
        }
    }
    return v;
}
