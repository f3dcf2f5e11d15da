// The two `expf`s of ggml's CPU backend (included by build.rs where a shader says
// `// #include lib/expf.wgsl`; needs lib/float.wgsl): `expf_ggml`, its AVX-512
// `ggml_v_expf` for one lane, and `expf_libc`, glibc's scalar `expf`.

// glibc's InvLn2N (32 / ln 2) as a 29-bit head and the rest.
const INV_LN2_N_HI = f64(46.16624128818512);
const INV_LN2_N_LO = f64(2.026170875524258e-8);

fn bits(x: u32) -> f32 {
    return bitcast<f32>(x);
}

// `x * c` rounded to the nearest integer, ties to even, from the exact product: what
// ggml gets as `fma(x, c, 0x1.8p23) - 0x1.8p23` (for |x * c| < 2^22). Written out, as a
// compiler may fold that sum (SPIR-V marks no operation exact).
fn round_product(x: f32, c: f32) -> f32 {
    let p = x * c;
    let err = fma_x(x, c, -p);
    let fl = floor(p);
    if (p - fl == 0.5) {
        if (err > 0.0) {
            return fl + 1.0;
        }
        if (err < 0.0) {
            return fl;
        }
    }
    return round(p);
}

// ggml's AVX-512 `ggml_v_expf` for one lane (`flint_core::math::expf_ggml_avx512`).
fn expf_ggml(x: f32) -> f32 {
    let n = round_product(x, bits(0x3fb8aa3bu));
    let b = fma_x(-n, bits(0x35bfbe8eu), fma_x(-n, bits(0x3f317200u), x));
    let u = b * b;
    let j = fma_x(
        fma_x(fma_x(bits(0x3c072010u), b, bits(0x3d2b9f17u)), u, fma_x(bits(0x3e2aaf33u), b, bits(0x3efffedbu))),
        u,
        fma_x(bits(0x3f7ffff6u), b, 1.0),
    );
    if (abs(n) > 192.0) {
        return select(bits(0x7f800000u), 0.0, n <= 0.0);
    }
    return ldexp(j, i32(n));
}

// 2^(i/32), i in 0..32 (glibc's `expf` table with its index bits restored).
const EXP2_32 = array<f64, 32>(
    f64(1.0),
    f64(1.0218971486541166),
    f64(1.0442737824274138),
    f64(1.0671404006768237),
    f64(1.0905077326652577),
    f64(1.1143867425958924),
    f64(1.1387886347566916),
    f64(1.1637248587775775),
    f64(1.189207115002721),
    f64(1.215247359980469),
    f64(1.241857812073484),
    f64(1.2690509571917332),
    f64(1.2968395546510096),
    f64(1.3252366431597413),
    f64(1.3542555469368927),
    f64(1.383909881963832),
    f64(1.4142135623730951),
    f64(1.4451808069770467),
    f64(1.4768261459394993),
    f64(1.5091644275934228),
    f64(1.5422108254079407),
    f64(1.5759808451078865),
    f64(1.6104903319492543),
    f64(1.645755478153965),
    f64(1.681792830507429),
    f64(1.718619298122478),
    f64(1.7562521603732995),
    f64(1.7947090750031072),
    f64(1.8340080864093424),
    f64(1.8741676341103),
    f64(1.9152065613971474),
    f64(1.9571441241754002)
);

// `round_product` in double.
fn round_product64(x: f64, c: f64) -> f64 {
    let p = x * c;
    let err = fma(x, c, -p);
    let fl = floor(p);
    if (p - fl == f64(0.5)) {
        if (err > f64(0.0)) {
            return fl + f64(1.0);
        }
        if (err < f64(0.0)) {
            return fl;
        }
    }
    return round(p);
}

// glibc's `expf` (x86-64, FMA build; `flint_core::math::expf_libc`): x * 32 / ln 2 = k + r,
// then 2^(k/32) * (c0 r^3 + c1 r^2 + c2 r + 1) in double, rounded to float once.
fn expf_libc(x: f32) -> f32 {
    let xb = bitcast<u32>(x);
    let abstop = (xb >> 20u) & 0x7ffu;
    if (abstop >= (0x42b00000u >> 20u)) {
        if (xb == 0xff800000u) {
            return 0.0;
        }
        if (abstop >= 0x7f8u) {
            return x + x;
        }
        if (x > bits(0x42b17217u)) {
            return bits(0x7f800000u);
        }
        if (x < bits(0xc2cff1b4u)) {
            return 0.0;
        }
    }
    let inv_ln2_n = f64(46.16624130844683);
    let xd = f64(x);
    // glibc rounds with `fma(inv_ln2_n, xd, 0x1.8p52) - 0x1.8p52`: the same integer.
    let kd = round_product64(inv_ln2_n, xd);
    let k = i32(kd);
    // fma(inv_ln2_n, xd, -kd) with one rounding: hi * xd is exact (29 + 24 bits) and
    // within a factor of two of kd (its rounding), so hi * xd - kd is exact too; lo * xd
    // is below the last bit of the result.
    let r = (INV_LN2_N_HI * xd - kd) + INV_LN2_N_LO * xd;
    let s = ldexp(EXP2_32[u32(k) & 31u], k >> 5u);
    let z = fma(f64(1.6938359250920212e-06), r, f64(0.00023459809789509004));
    let r2 = r * r;
    var y = fma(f64(0.021660849396613134), r, f64(1.0));
    y = fma(z, r2, y);
    return f32(y * s);
}
