// Q6_K weights x Q8_K activations in the order of ggml's tiled K-quant matmul
// (flint_core::dot::ggml_x86::vec_dot_q6_k_q8_k_tiled): per block the exact integer
// s = sum_g scale_g * (dot_g - 32 * bsum_g) over the sixteen 16-value groups of the
// unsigned 6-bit values, then acc = fma(s * d_w, d_a, acc).

// #include lib/exact_q8_k.wgsl

// #include blocks/q6_k.wgsl

fn wpart(row: u32, s: u32) -> array<i32, 32> {
    return ints32(row, s);
}

fn step(st: St, row: u32, s: u32, w: array<i32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let lanes = idot_lanes(w, X[ab + 8u * (s % 8u) + lane]);
    let b = row + (s / 8u) * 210u;
    let p = s % 8u;
    let bs = shalves(X[ab + 65u + p]);
    let g0 = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    let g1 = (lanes[4] + lanes[5]) + (lanes[6] + lanes[7]);
    r.i.x += rd8s(b + 192u + 2u * p) * (g0 - 32 * bs.x) + rd8s(b + 193u + 2u * p) * (g1 - 32 * bs.y);
    if (p == 7u) {
        let f = f32(r.i.x) * half_at(b + 208u);
        r.f[0] = fma_x(f, bitcast<f32>(X[ab + 64u]), r.f[0]);
        r.i = vec2<i32>(0);
    }
    return r;
}

fn done(st: St) -> f32 {
    return st.f[0];
}
