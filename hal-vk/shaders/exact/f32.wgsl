// F32 weights x f32 activations in the cpu device's orders (flint_core::dot::ggml_x86):
// a dense matrix of a multiple of 4 rows in tinyBLAS's (`vec_dot_f32_tinyblas`, AVX-512:
// sixteen lanes, lane l the FMA chain over the values l mod 16, the lanes added by
// reduce_add_16); expert rows and other dense matrices in `ggml_vec_dot_f32`'s
// (`vec_dot_f32_ggml`, AVX-512: four accumulators of sixteen lanes over steps of 64,
// added (0 + 2) + (1 + 3) per lane, then reduce_add_16). Rows of a multiple of 64 values
// (the host sends others to matmul_rows).

// Activation rows a thread computes (the host tiles dense rows so).
const MT: u32 = 1u;

struct St {
    f: array<f32, 64>,
}

// The first value of part `s` of activation row `x` (the activations as they are).
fn act(x: u32, s: u32) -> u32 {
    return pc.x_off + x * pc.k + 32u * s;
}

fn wpart(row: u32, s: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) {
        v[i] = bitcast<f32>(W[(row >> 2u) + 32u * s + i]);
    }
    return v;
}

// The 32 activation values of a part, lane l of the subgroup holding values 4l..4l+4.
fn xpart(xv: vec4<u32>) -> array<f32, 32> {
    var b: array<vec4<u32>, 8>;
    b[0] = subgroupBroadcast(xv, 0u);
    b[1] = subgroupBroadcast(xv, 1u);
    b[2] = subgroupBroadcast(xv, 2u);
    b[3] = subgroupBroadcast(xv, 3u);
    b[4] = subgroupBroadcast(xv, 4u);
    b[5] = subgroupBroadcast(xv, 5u);
    b[6] = subgroupBroadcast(xv, 6u);
    b[7] = subgroupBroadcast(xv, 7u);
    var v: array<f32, 32>;
    for (var l = 0u; l < 8u; l++) {
        for (var c = 0u; c < 4u; c++) {
            v[4u * l + c] = bitcast<f32>(b[l][c]);
        }
    }
    return v;
}

// tinyBLAS's order: the dense product of a matrix of a multiple of 4 rows.
fn tinyblas() -> bool {
    return pc.mode == 0u && pc.out_stride % 4u == 0u;
}

fn step(st: St, row: u32, s: u32, w: array<f32, 32>, ab: u32, lane: u32) -> St {
    var r = st;
    let a = ab + 4u * lane;
    let x = xpart(vec4<u32>(X[a], X[a + 1u], X[a + 2u], X[a + 3u]));
    // Constant indices only (every loop unrolls), so the state stays in registers.
    if (tinyblas()) {
        for (var i = 0u; i < 16u; i++) {
            r.f[i] = fma_x(w[i], x[i], r.f[i]);
        }
        for (var i = 0u; i < 16u; i++) {
            r.f[i] = fma_x(w[16u + i], x[16u + i], r.f[i]);
        }
    } else if (s % 2u == 0u) {
        // The first half of a 64-value step: accumulators 0 and 1.
        for (var i = 0u; i < 32u; i++) {
            r.f[i] = fma_x(w[i], x[i], r.f[i]);
        }
    } else {
        // The second half: accumulators 2 and 3.
        for (var i = 0u; i < 32u; i++) {
            r.f[32u + i] = fma_x(w[i], x[i], r.f[32u + i]);
        }
    }
    return r;
}

fn done(st: St) -> f32 {
    var v: array<f32, 16>;
    for (var l = 0u; l < 16u; l++) {
        if (tinyblas()) {
            v[l] = st.f[l];
        } else {
            v[l] = (st.f[l] + st.f[32u + l]) + (st.f[16u + l] + st.f[48u + l]);
        }
    }
    return reduce_add_16(v);
}
