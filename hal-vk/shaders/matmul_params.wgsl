// The push constants of the matmul shaders (matmul, matmul_rows, matmul_exact): k values
// per row; n weight rows in this dispatch (dense) or per expert; m activation rows;
// row_bytes per weight row; x_off, the first activation element (block for
// matmul_exact); out_off, out_stride and o_base place output (row, o) at
// out_off + row * out_stride + o_base + o; mode 0 dense, 1 experts (n_rows routed rows,
// pairs (input row, expert) in R; expert_bytes per expert; this buffer holds experts
// e_base .. e_base + e_count).
struct P {
    k: u32,
    n: u32,
    m: u32,
    row_bytes: u32,
    x_off: u32,
    out_off: u32,
    out_stride: u32,
    o_base: u32,
    mode: u32,
    n_rows: u32,
    expert_bytes: u32,
    e_base: u32,
    e_count: u32,
}
var<immediate> pc: P;
