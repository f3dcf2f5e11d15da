// Activation rounding before a matmul, as ggml's CPU backend quantizes activations for
// the weight's `vec_dot_type` (flint_core::quant::quantize_act): O gets the values the
// dot product effectively multiplies by, one thread per block of `block` values:
// mode 0 Q8_K (256): max = the value of largest magnitude, iscale = -127 / max,
//        q = min(127, round(iscale * x)), value q * (1 / iscale)
// mode 1 Q8_0 / Q8_1 (32): amax, d = amax / 127 held as f16, id = 127 / amax,
//        q = clamp(round(x * id), -128, 127), value q * f16(d)
// mode 2 F16: x rounded to f16
// mode 3 BF16: x rounded to bf16 (nearest, ties to even)
// `round` is WGSL's round-half-to-even, as ggml's nearest_int and _mm256_round_ps.

struct P {
    n_blocks: u32,
    block: u32,
    mode: u32,
    x_off: u32,
}
var<immediate> pc: P;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> O: array<f32>;

fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

fn bf16_round(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    let r = u + 0x7fffu + ((u >> 16u) & 1u);
    return bitcast<f32>(r & 0xffff0000u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * 64u;
    if (b >= pc.n_blocks) {
        return;
    }
    let base = b * pc.block;
    let xb = pc.x_off + base;
    switch pc.mode {
        case 0u: {
            var amax = 0.0;
            var mx = 0.0;
            for (var i = 0u; i < pc.block; i++) {
                let v = X[xb + i];
                if (abs(v) > amax) {
                    amax = abs(v);
                    mx = v;
                }
            }
            if (amax == 0.0) {
                for (var i = 0u; i < pc.block; i++) {
                    O[base + i] = 0.0;
                }
            } else {
                let iscale = -127.0 / mx;
                let d = 1.0 / iscale;
                for (var i = 0u; i < pc.block; i++) {
                    let q = min(127.0, round(iscale * X[xb + i]));
                    O[base + i] = q * d;
                }
            }
        }
        case 1u: {
            var amax = 0.0;
            for (var i = 0u; i < pc.block; i++) {
                amax = max(amax, abs(X[xb + i]));
            }
            let d = f16_round(amax / 127.0);
            var id = 0.0;
            if (amax != 0.0) {
                id = 127.0 / amax;
            }
            for (var i = 0u; i < pc.block; i++) {
                let q = clamp(round(X[xb + i] * id), -128.0, 127.0);
                O[base + i] = q * d;
            }
        }
        case 2u: {
            for (var i = 0u; i < pc.block; i++) {
                O[base + i] = f16_round(X[xb + i]);
            }
        }
        default: {
            for (var i = 0u; i < pc.block; i++) {
                O[base + i] = bf16_round(X[xb + i]);
            }
        }
    }
}
