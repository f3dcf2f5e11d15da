// Q6_K: 210-byte blocks of 256 values { ql: [u8; 128] @0, qh: [u8; 64] @128,
// scales: [i8; 16] @192, d: f16 @208 }. Value e = 128h + r is `(d * scales[e / 16]) * (q - 32)`,
// q = (nibble r / 64 of ql[64h + r % 64]) | (bits 2(r / 32).. of qh[32h + r % 32]) << 4.
// The 6-bit values q (0..63, before the offset of 32) of part `s` (the exact kernel's
// integer operands).
fn ints32(row: u32, s: u32) -> array<i32, 32> {
    var v: array<i32, 32>;
    let b = row + (s / 8u) * 210u;
    let p = s % 8u;
    let hf = p / 4u;
    let ql = b + 64u * hf + 32u * (p % 2u);
    let lsh = 4u * ((p % 4u) / 2u);
    let qh = b + 128u + 32u * hf;
    let hsh = 2u * (p % 4u);
    for (var i = 0u; i < 8u; i++) {
        let lw = rd32(ql + 4u * i);
        let hw = rd32(qh + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let lo = (lw >> (8u * t + lsh)) & 0xfu;
            let hi = (hw >> (8u * t + hsh)) & 3u;
            v[4u * i + t] = i32(lo | (hi << 4u));
        }
    }
    return v;
}

fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + (s / 8u) * 210u;
    let p = s % 8u;
    let d = half_at(b + 208u);
    let q = ints32(row, s);
    for (var h = 0u; h < 2u; h++) {
        let dl = d * f32(rd8s(b + 192u + 2u * p + h));
        for (var j = 0u; j < 16u; j++) {
            v[16u * h + j] = dl * f32(q[16u * h + j] - 32);
        }
    }
    return v;
}
