// Q5_K weights x Q8_K activations in the order of ggml's tiled K-quant matmul with mins
// (flint_core::dot::ggml_x86::vec_dot_q5_k_q8_k_tiled): per block the exact integers
// s = sum sc_j * dot_j and m = sum mn_j * bsum_j, r = fma(-dmin_w, m, s * d_w), then
// acc = fma(r, d_a, acc).

// #include lib/exact_q8_k.wgsl

// #include blocks/q5_k.wgsl

fn wpart(row: u32, s: u32) -> array<i32, 32> {
    return ints32(row, s);
}

fn step(st: St, row: u32, s: u32, w: array<i32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let lanes = idot_lanes(w, X[ab + 8u * (s % 8u) + lane]);
    let b = row + (s / 8u) * 176u;
    let p = s % 8u;
    let sm = k4_scale_min(b, p);
    let bs = shalves(X[ab + 65u + p]);
    r.i += vec2<i32>(i32(sm.x) * isum8(lanes), i32(sm.y) * (bs.x + bs.y));
    if (p == 7u) {
        let sd = f32(r.i.x) * half_at(b);
        let m = fma_x(-half_at(b + 2u), f32(r.i.y), sd);
        r.f[0] = fma_x(m, bitcast<f32>(X[ab + 64u]), r.f[0]);
        r.i = vec2<i32>(0);
    }
    return r;
}

fn done(st: St) -> f32 {
    return st.f[0];
}
