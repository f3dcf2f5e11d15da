// Which weight row and activation rows an invocation of the one-thread-per-output matmuls
// (matmul_rows.wgsl, matmul_exact.wgsl) computes: output `o` of tile `t`, in the modes of
// matmul_params.wgsl.
struct Tile {
    // Byte offset of the weight row in W.
    row: u32,
    // Activation rows to compute (0: nothing, an expert of another part of the weight).
    rows: u32,
    // The first activation row, and the first output row.
    x0: u32,
    out0: u32,
}

// Dense (mode 0): tile `t` is activation rows mt*t.. (at most `mt`) against weight row `o`.
// Experts: `t` is routed pair t of R (activation row, expert), computed when the expert
// lies in this part of the weight (e_base, e_count).
fn tile(o: u32, t: u32, mt: u32) -> Tile {
    if (pc.mode == 0u) {
        let m0 = t * mt;
        return Tile(o * pc.row_bytes, min(mt, pc.m - m0), m0, m0);
    }
    let e = R[2u * t + 1u];
    let here = e >= pc.e_base && e < pc.e_base + pc.e_count;
    return Tile(
        (e - pc.e_base) * pc.expert_bytes + o * pc.row_bytes,
        select(0u, 1u, here),
        R[2u * t],
        t,
    );
}
