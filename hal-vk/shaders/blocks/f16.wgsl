// F16: one IEEE half per 2 bytes, little-endian. `deq32` gives values 32s..32s+32 of the
// row at byte `row` (zeros past `k`); pairs inside the row are read as one u32.
fn deq32(row: u32, s: u32, k: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let k0 = s * 32u;
    for (var j = 0u; j < 32u; j += 2u) {
        let i = k0 + j;
        if (i + 1u < k) {
            let f = unpack2x16float(rd32(row + 2u * i));
            v[j] = f.x;
            v[j + 1u] = f.y;
        } else if (i < k) {
            v[j] = half_at(row + 2u * i);
        }
    }
    return v;
}
