// Q5_0: 22-byte blocks of 32 values { d: f16 @0, qh: u32 (LE bytes) @2, qs: [u8; 16] @6 };
// value j is `d * (q - 16)`, q = the Q4_0 nibble of j | bit j of qh << 4.
// The values q - 16 of part `s` (the exact kernel's integer operands).
fn ints32(row: u32, s: u32) -> array<i32, 32> {
    var v: array<i32, 32>;
    let b = row + s * 22u;
    let qh = rd32(b + 2u);
    for (var i = 0u; i < 4u; i++) {
        let w = rd32(b + 6u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let q = w >> (8u * t);
            let m = 4u * i + t;
            let lo = (q & 0xfu) | (((qh >> m) & 1u) << 4u);
            let hi = ((q >> 4u) & 0xfu) | (((qh >> (m + 16u)) & 1u) << 4u);
            v[m] = i32(lo) - 16;
            v[m + 16u] = i32(hi) - 16;
        }
    }
    return v;
}

fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let d = half_at(row + s * 22u);
    let q = ints32(row, s);
    for (var j = 0u; j < 32u; j++) {
        v[j] = d * f32(q[j]);
    }
    return v;
}
