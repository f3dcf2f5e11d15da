// Q8_0: 34-byte blocks of 32 values { d: f16 @0, qs: [i8; 32] @2 }; value j is `qs[j] * d`.
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let b = row + s * 34u;
    let d = half_at(b);
    for (var i = 0u; i < 8u; i++) {
        let w = rd32(b + 2u + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            // Byte t of w, sign-extended.
            let q = bitcast<i32>(w << (24u - 8u * t)) >> 24u;
            v[4u * i + t] = f32(q) * d;
        }
    }
    return v;
}
