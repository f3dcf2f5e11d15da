// Q8_0 weights x Q8_0 activations in tinyBLAS's order (flint_core::dot::ggml_x86::
// vec_dot_q8_0_q8_0_tinyblas): eight lanes, lane l = fma(d_w * d_a, s_l, lane) per block,
// s_l the integer dot of values 4l..4l+4; the lanes added by hsum8.

// #include lib/exact_q8_0.wgsl

// #include blocks/q8_0.wgsl

fn wpart(row: u32, s: u32) -> array<i32, 32> {
    return ints32(row, s);
}

fn step(st: St, row: u32, s: u32, w: array<i32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let lanes = idot_lanes(w, X[ab + lane]);
    let d = half_at(row + s * 34u) * bitcast<f32>(X[ab + 8u]);
    for (var l = 0u; l < 8u; l++) {
        r.f[l] = fma_x(d, f32(lanes[l]), r.f[l]);
    }
    return r;
}

fn done(st: St) -> f32 {
    return hsum8(st.f);
}
