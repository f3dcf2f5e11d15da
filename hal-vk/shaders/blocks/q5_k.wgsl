// Q5_K: 176-byte blocks of 256 values { d: f16 @0, dmin: f16 @2, scales: [u8; 12] @4,
// qh: [u8; 32] @16, qs: [u8; 128] @48 }: Q4_K plus a fifth bit. Value 32p + j is
// `(d * sc) * q - (dmin * mn)`, q = the Q4_K nibble | (bit p of qh[j]) << 4.

// The 5-bit values q of part `s` (the exact kernel's integer operands).
fn ints32(row: u32, s: u32) -> array<i32, 32> {
    var v: array<i32, 32>;
    let b = row + (s / 8u) * 176u;
    let p = s % 8u;
    let sh = 4u * (p % 2u);
    let qs = b + 48u + 32u * (p / 2u);
    for (var i = 0u; i < 8u; i++) {
        let w = rd32(qs + 4u * i);
        let hw = rd32(b + 16u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            v[4u * i + t] = i32(((w >> (8u * t + sh)) & 0xfu) | (((hw >> (8u * t + p)) & 1u) << 4u));
        }
    }
    return v;
}

fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    return k4_deq32(row + (s / 8u) * 176u, s % 8u, ints32(row, s));
}
