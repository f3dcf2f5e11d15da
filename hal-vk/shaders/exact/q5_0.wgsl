// Q5_0 weights x Q8_0 activations in tinyBLAS's order (flint_core::dot::ggml_x86::
// vec_dot_q5_0_q8_0_tinyblas): as Q8_0, with the weight values q - 16.

// #include lib/exact_q8_0.wgsl

fn wpart(row: u32, s: u32) -> array<i32, 32> {
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

fn step(st: St, row: u32, s: u32, w: array<i32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let lanes = idot_lanes(w, X[ab + lane]);
    let d = half_at(row + s * 22u) * bitcast<f32>(X[ab + 8u]);
    for (var l = 0u; l < 8u; l++) {
        r.f[l] = fma_x(d, f32(lanes[l]), r.f[l]);
    }
    return r;
}

fn done(st: St) -> f32 {
    return hsum8(st.f);
}
