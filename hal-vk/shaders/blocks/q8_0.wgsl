// Q8_0: 34-byte blocks of 32 values { d: f16 @0, qs: [i8; 32] @2 }; value j is `qs[j] * d`.
// The quants of part `s` (the exact kernel's integer operands).
fn ints32(row: u32, s: u32) -> array<i32, 32> {
    var v: array<i32, 32>;
    let b = row + s * 34u;
    for (var i = 0u; i < 8u; i++) {
        let w = rd32(b + 2u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            // Byte t of w, sign-extended.
            v[4u * i + t] = bitcast<i32>(w << (24u - 8u * t)) >> 24u;
        }
    }
    return v;
}

fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let d = half_at(row + s * 34u);
    let q = ints32(row, s);
    for (var j = 0u; j < 32u; j++) {
        v[j] = f32(q[j]) * d;
    }
    return v;
}
