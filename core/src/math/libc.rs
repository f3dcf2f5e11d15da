//! The C library's single-precision `sinf`, `cosf` and `expf` as llama.cpp calls them on
//! an x86-64 glibc system, so that the arithmetic around them can match it to the bit.
//!
//! glibc (since 2.28) computes `sinf`/`cosf` in double precision: a reduction by
//! multiples of pi/2 (one multiply-subtract below 120, a 192-bit table of 4/pi above),
//! then short polynomials, rounded to float at the end; on x86-64 with FMA the library
//! picks a build where GCC fuses the multiply-adds, which this follows. Within 0.56 ulp
//! of the exact value, like the `libm` crate's versions, but the two differ in the last
//! bit for about 1% of RoPE angles, and Gemma 3 notices.
//!
//! `expf` is the double-precision exponential rounded to float: glibc's is correctly
//! rounded in all but rare cases.

/// Polynomial and reduction constants: sign of the sine per quadrant, 2/pi scaled by
/// 2^24, pi/2, cosine coefficients c0..c4, sine coefficients s1..s3.
struct SinCos {
    sign: [f64; 4],
    hpi_inv: f64,
    hpi: f64,
    c: [f64; 5],
    s: [f64; 3],
}

const fn f(bits: u64) -> f64 {
    f64::from_bits(bits)
}

/// The coefficients (the second set computes `-cos`, which gives quadrants 2 and 3
/// their sign for free).
const TABLE: [SinCos; 2] = {
    let sign = [1.0, -1.0, -1.0, 1.0];
    let hpi_inv = f(0x4164_5f30_6dc9_c883); // 0x1.45F306DC9C883p+23
    let hpi = f(0x3ff9_21fb_5444_2d18); // 0x1.921FB54442D18p0
    let c1 = f(0xbfdf_ffff_fd0c_621c); // -0x1.ffffffd0c621cp-2
    let c2 = f(0x3fa5_5553_e106_8f19); // 0x1.55553e1068f19p-5
    let c3 = f(0xbf56_c087_e89a_359d); // -0x1.6c087e89a359dp-10
    let c4 = f(0x3ef9_9343_027b_f8c3); // 0x1.99343027bf8c3p-16
    let s = [
        f(0xbfc5_5554_5995_a603), // -0x1.555545995a603p-3
        f(0x3f81_1076_0523_0bc4), // 0x1.1107605230bc4p-7
        f(0xbf29_94eb_3774_cf24), // -0x1.994eb3774cf24p-13
    ];
    [
        SinCos {
            sign,
            hpi_inv,
            hpi,
            c: [1.0, c1, c2, c3, c4],
            s,
        },
        SinCos {
            sign,
            hpi_inv,
            hpi,
            c: [-1.0, -c1, -c2, -c3, -c4],
            s,
        },
    ]
};

/// 4/pi to 192 bits, 8 new bits per entry.
const INV_PIO4: [u32; 24] = [
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529, 0x441529fc,
    0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0, 0x34ddc0db,
    0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
];

/// 2 pi * 2^-64.
const PI63: f64 = f(0x3c19_21fb_5444_2d18);

#[inline]
fn abstop12(x: f32) -> u32 {
    (x.to_bits() >> 20) & 0x7ff
}

/// `sin` (quadrant `n` even) or `cos` (odd) of the reduced argument `x`, `x2 = x * x`.
#[inline]
fn poly(x: f64, x2: f64, p: &SinCos, n: i32) -> f32 {
    if n & 1 == 0 {
        let x3 = x * x2;
        let s1 = libm::fma(x2, p.s[2], p.s[1]);
        let x7 = x3 * x2;
        let s = libm::fma(x3, p.s[0], x);
        libm::fma(x7, s1, s) as f32
    } else {
        let x4 = x2 * x2;
        let c2 = libm::fma(x2, p.c[4], p.c[3]);
        let c1 = libm::fma(x2, p.c[1], p.c[0]);
        let x6 = x4 * x2;
        let c = libm::fma(x4, p.c[2], c1);
        libm::fma(x6, c2, c) as f32
    }
}

/// Reduction for `|x| < 120`: `x - n * pi/2` with the quadrant `n`.
#[inline]
fn reduce_fast(x: f64, p: &SinCos) -> (f64, i32) {
    let r = x * p.hpi_inv;
    let n = ((r as i32).wrapping_add(0x80_0000)) >> 24;
    (libm::fma(-(n as f64), p.hpi, x), n)
}

/// Reduction of a float of magnitude >= 120 (its bits `xi`, sign ignored) through the
/// 4/pi table: the remainder in (-pi/4, pi/4) and the quadrant.
fn reduce_large(xi: u32) -> (f64, i32) {
    let arr = &INV_PIO4[((xi >> 26) & 15) as usize..];
    let shift = (xi >> 23) & 7;
    let xi = ((xi & 0xff_ffff) | 0x80_0000) << shift;
    let mut res0 = xi.wrapping_mul(arr[0]) as u64;
    let res1 = xi as u64 * arr[4] as u64;
    let res2 = xi as u64 * arr[8] as u64;
    res0 = (res2 >> 32) | (res0 << 32);
    res0 = res0.wrapping_add(res1);
    let n = res0.wrapping_add(1 << 61) >> 62;
    res0 = res0.wrapping_sub(n << 62);
    ((res0 as i64) as f64 * PI63, n as i32)
}

/// Shared by [`sinf_glibc`] (`odd = 0`) and [`cosf_glibc`] (`odd = 1`).
fn sincos(y: f32, odd: i32) -> f32 {
    let x = y as f64;
    let t = &TABLE;
    if abstop12(y) < abstop12(core::f32::consts::FRAC_PI_4) {
        if abstop12(y) < abstop12(f32::from_bits(0x3980_0000)) {
            // |y| < 2^-12: sin y = y, cos y = 1 to float precision.
            return if odd == 0 { y } else { 1.0 };
        }
        return poly(x, x * x, &t[0], odd);
    }
    let (r, n, sign) = if abstop12(y) < abstop12(120.0) {
        let (r, n) = reduce_fast(x, &t[0]);
        (r, n, 0)
    } else if y.is_finite() {
        let (r, n) = reduce_large(y.to_bits());
        (r, n, (y.to_bits() >> 31) as i32)
    } else {
        return f32::NAN;
    };
    let q = n.wrapping_add(sign);
    let s = t[0].sign[(q & 3) as usize];
    let p = if q & 2 != 0 { &t[1] } else { &t[0] };
    poly(r * s, r * r, p, n ^ odd)
}

/// glibc's `sinf` (x86-64, FMA build), bit for bit.
pub fn sinf_glibc(x: f32) -> f32 {
    sincos(x, 0)
}

/// glibc's `cosf` (x86-64, FMA build), bit for bit.
pub fn cosf_glibc(x: f32) -> f32 {
    sincos(x, 1)
}

/// `2^(i/32)` as doubles, less `i << 47`, for `expf` (public for SIMD forms of
/// [`expf_libc`], with [`EXPF_INV_LN2_N`], [`EXPF_SHIFT`] and [`EXPF_POLY`]).
pub const EXP2F_TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2`: `x * EXPF_INV_LN2_N = k + r` in [`expf_libc`].
pub const EXPF_INV_LN2_N: f64 = f(0x3ff7_1547_652b_82fe) * 32.0;
/// `0x1.8p52`: added to round `x * 32 / ln 2` to an integer in the low mantissa bits.
pub const EXPF_SHIFT: f64 = f(0x4338_0000_0000_0000);
/// The polynomial `c0 r^3 + c1 r^2 + c2 r + 1` of [`expf_libc`]: `[c0, c1, c2]`.
pub const EXPF_POLY: [f64; 3] = [
    f(0x3fac_6af8_4b91_2394) / 32.0 / 32.0 / 32.0,
    f(0x3fce_bfce_50fa_c4f3) / 32.0 / 32.0,
    f(0x3fe6_2e42_ff0c_52d6) / 32.0,
];
/// `expf_libc` takes its special-case path (overflow, underflow, infinities, NaN) for
/// `x` whose bits shifted right by 20, sign cleared, are at least this.
pub const EXPF_SPECIAL_ABSTOP: u32 = 88.0f32.to_bits() >> 20;

/// glibc's `expf` (x86-64, FMA build): `x * 32 / ln 2 = k + r`, then
/// `2^(k/32) * (c0 r^3 + c1 r^2 + c2 r + 1)` in double, rounded to float once.
pub fn expf_libc(x: f32) -> f32 {
    let abstop = (x.to_bits() >> 20) & 0x7ff;
    if abstop >= EXPF_SPECIAL_ABSTOP {
        if x == f32::NEG_INFINITY {
            return 0.0;
        }
        if abstop >= (f32::INFINITY.to_bits() >> 20) {
            return x + x;
        }
        if x > f32::from_bits(0x42b1_7217) {
            return f32::INFINITY;
        }
        if x < f32::from_bits(0xc2cf_f1b4) {
            return 0.0;
        }
    }
    let (inv_ln2_n, shift, c) = (EXPF_INV_LN2_N, EXPF_SHIFT, EXPF_POLY);
    let xd = x as f64;
    // GCC fuses the product x * N / ln 2 into both of its uses.
    let kd = libm::fma(inv_ln2_n, xd, shift);
    let ki = kd.to_bits();
    let kd = kd - shift;
    let r = libm::fma(inv_ln2_n, xd, -kd);
    let t = EXP2F_TAB[(ki % 32) as usize].wrapping_add(ki << 47);
    let s = f64::from_bits(t);
    let z = libm::fma(c[0], r, c[1]);
    let r2 = r * r;
    let y = libm::fma(c[2], r, 1.0);
    let y = libm::fma(z, r2, y);
    (y * s) as f32
}
