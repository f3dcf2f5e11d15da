// Q4_K weights x Q8_K activations in the order of ggml's repacked q4_K_8x8 kernels
// (flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_repack): exact integers
// I = sum sc_j * dot_j and M = sum mn_j * bsum_j over a pair of 32-value parts (gemm,
// dense rows) or a whole block (gemv, expert rows), then
// acc = fma(I, d_w * d_a, acc), mins = fma(M, dmin_w * d_a, mins); the result acc - mins.

// #include lib/exact_q8_k.wgsl

// #include blocks/q4_k.wgsl

fn wpart(row: u32, s: u32) -> array<i32, 32> {
    return ints32(row, s);
}

fn step(st: St, row: u32, s: u32, w: array<i32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let lanes = idot_lanes(w, X[ab + 8u * (s % 8u) + lane]);
    let b = row + (s / 8u) * 144u;
    let p = s % 8u;
    let sm = k4_scale_min(b, p);
    let bs = shalves(X[ab + 65u + p]);
    r.i += vec2<i32>(i32(sm.x) * isum8(lanes), i32(sm.y) * (bs.x + bs.y));
    if ((pc.mode == 0u && p % 2u == 1u) || p == 7u) {
        let ad = bitcast<f32>(X[ab + 64u]);
        let dd = half_at(b) * ad;
        let dm = half_at(b + 2u) * ad;
        r.f[0] = fma_x(f32(r.i.x), dd, r.f[0]);
        r.f[1] = fma_x(f32(r.i.y), dm, r.f[1]);
        r.i = vec2<i32>(0);
    }
    return r;
}

fn done(st: St) -> f32 {
    return st.f[0] - st.f[1];
}
