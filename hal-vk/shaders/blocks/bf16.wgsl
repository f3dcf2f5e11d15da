// BF16: one bfloat16 (the top half of an f32) per 2 bytes, little-endian. `deq32` gives
// values 32s..32s+32 of the row at byte `row` (zeros past `k`).
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let k0 = s * 32u;
    for (var j = 0u; j < 32u; j += 2u) {
        let i = k0 + j;
        if (i + 1u < k) {
            let w = rd32(row + 2u * i);
            v[j] = bitcast<f32>(w << 16u);
            v[j + 1u] = bitcast<f32>(w & 0xffff0000u);
        } else if (i < k) {
            v[j] = bf16_at(row + 2u * i);
        }
    }
    return v;
}
