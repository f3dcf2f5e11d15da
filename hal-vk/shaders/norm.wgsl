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

var<workgroup> scale_sh: f32;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    let valid = r < pc.rows;
    let xb = pc.x_off + r * pc.dim;
    if (valid && pc.mode == 1u) {
        for (var i = lid; i < pc.dim; i += WG) {
            X[xb + i] = X[xb + i] + D[pc.d_off + r * pc.dim + i];
        }
    }
    storageBarrier();
    // The scale as ggml's CPU rms_norm (and flint_core's `rms_scale`) computes it: the f32
    // squares summed in f64 in order, the mean rounded to f32 before eps is added. One
    // invocation sums the row: the order is the point, and a row is short.
    if (valid && lid == 0u) {
        var sum = f64(0.0);
        for (var i = 0u; i < pc.dim; i++) {
            let v = X[xb + i];
            sum += f64(v * v);
        }
        let mean = f32(sum / f64(pc.dim));
        scale_sh = 1.0 / sqrt(mean + pc.eps);
    }
    let scale = workgroupUniformLoad(&scale_sh);
    if (valid) {
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
