// F32: one value per 4 bytes. `deq32` gives values 32s..32s+32 of the row at byte
// `row` (zeros past `k`).
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let k0 = s * 32u;
    for (var j = 0u; j < 32u; j++) {
        if (k0 + j < k) {
            v[j] = bitcast<f32>(rd32(row + 4u * (k0 + j)));
        }
    }
    return v;
}
