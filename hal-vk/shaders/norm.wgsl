// RMSNorm of rows of `dim` values, one workgroup per row:
// mode 0: O = X / sqrt(mean(X^2) + eps) (* Wt when has_w)
// mode 1: X += D (the residual, once), then O = rmsnorm(X) * Wt
// Offsets are in elements.

const WG: u32 = 256u;

struct P {
    dim: u32,
    rows: u32,
    eps: f32,
    mode: u32,
    has_w: u32,
    x_off: u32,
    d_off: u32,
    w_off: u32,
    o_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> D: array<f32>;
@group(0) @binding(2) var<storage, read> Wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    let valid = r < pc.rows;
    let xb = pc.x_off + r * pc.dim;
    var sum = 0.0;
    if (valid) {
        for (var i = lid; i < pc.dim; i += WG) {
            var v = X[xb + i];
            if (pc.mode == 1u) {
                v = v + D[pc.d_off + r * pc.dim + i];
                X[xb + i] = v;
            }
            sum += v * v;
        }
    }
    red[lid] = sum;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            red[lid] += red[lid + h];
        }
        workgroupBarrier();
    }
    if (valid) {
        let scale = 1.0 / sqrt(red[0] / f32(pc.dim) + pc.eps);
        let ob = pc.o_off + r * pc.dim;
        for (var i = lid; i < pc.dim; i += WG) {
            var y = X[xb + i] * scale;
            if (pc.has_w != 0u) {
                y = y * Wt[pc.w_off + i];
            }
            O[ob + i] = y;
        }
    }
}
