//! MXFP4 weights · Q8_0 activations (gpt-oss's experts), every SIMD level and the scalar
//! fallback in one place.
//!
//! The order is llama.cpp's for MXFP4 on x86 (its repacked `mxfp4_8x8` gemv and gemm,
//! which it runs for single rows and batches alike): per output one `f32` accumulator,
//! per 32-element block `acc = fma(sum, D(e) * d_a, acc)`, with `sum` the exact integer
//! dot product of the block's code-book values with the activation's quants and `D(e)`
//! the halved E8M0 scale. The scalar statement is
//! `flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack`; every level here equals it bit
//! for bit, for any number of activation rows, since only `sum` is computed in SIMD
//! (exactly) and the float steps are the same: one product and one `fma` per block, in
//! block order.
//!
//! The SIMD kernels turn the E2M1 nibbles into int8 with one byte lookup (`vpshufb` on
//! the doubled code book `KVALUES_MXFP4`) and multiply them with the activation's int8
//! quants (`|w|` times `a` with `w`'s sign, summed in pairs by `vpmaddubsw` then
//! `vpmaddwd`, or in fours by `vpdpbusd` on AVX-512 VNNI; exact, as the activation
//! quantizer never writes -128, whose negation would wrap). AVX2 takes one block per
//! 256-bit register, AVX-512 and AVX-512 VNNI two per 512-bit register. Two shapes:
//!
//! - eight weight rows in the lanes of a vector (`rows8_*`): per block, the eight rows'
//!   lanes reduced at once into their eight block sums, then one vector `fma` into the
//!   eight accumulators; for every group of eight rows of a matvec or a batch;
//! - one weight row (`tile_*`): eight blocks' lanes reduced at once into eight block sums,
//!   then eight scalar `fma`s in block order; for the rows left over.
//!
//! Both decode each weight block once for up to four activation rows. Entry points (from
//! `kernels/dispatch.rs`): [`dot_rows`] (one weight row, a tile of up to four activation
//! rows), [`matvec`] (many weight rows, one activation row: a decode) and [`small_batch`]
//! (many weight rows, every activation row: a few decode rows or a prompt batch,
//! cache-blocked).

use flint_core::blocks::{BlockMXFP4, BlockQ8_0};

use crate::simd::SimdLevel;

pub(crate) mod x16;

/// Most activation rows one tile kernel call takes (each weight block decoded once for
/// all of them).
pub(crate) const TILE: usize = 4;

/// Weight rows per block of [`small_batch`]: they stay in cache while every tile of
/// activation rows passes over them.
const ROW_BLOCK: usize = 64;

/// Bytes ahead of each weight row that the eight-row AVX2 kernel prefetches (as the
/// Q8_0-family decode kernels do, `kernels::dispatch`'s `STREAM_PREFETCH`: the hardware
/// prefetcher alone does not keep sixteen concurrent row streams fed).
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 1024;

/// The scalar fallback: the core reference in llama.cpp's order.
pub(crate) fn dot_scalar(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack(x, y)
}

/// Activations as the kernels read them: every row's Q8_0 blocks and their scales
/// widened to f32, `nb` blocks per row.
#[derive(Clone, Copy)]
pub(crate) struct Act<'a> {
    pub(crate) blocks: &'a [BlockQ8_0],
    pub(crate) scales: &'a [f32],
    pub(crate) nb: usize,
}

impl<'a> Act<'a> {
    fn row(self, i: usize) -> (&'a [BlockQ8_0], &'a [f32]) {
        let r = i * self.nb..(i + 1) * self.nb;
        (&self.blocks[r.clone()], &self.scales[r])
    }
}

/// `out[t] = dot(w, activation row rows[t])` for `rows.len() <= TILE`.
pub(crate) fn dot_rows(
    level: SimdLevel,
    w: &[BlockMXFP4],
    act: Act<'_>,
    rows: &[usize],
    out: &mut [f32],
) {
    debug_assert!(rows.len() <= TILE && rows.len() == out.len());
    macro_rules! tile {
        ($R:literal) => {{
            let mut ys = [&[][..]; $R];
            let mut ss = [&[][..]; $R];
            for (t, &i) in rows.iter().enumerate() {
                (ys[t], ss[t]) = act.row(i);
            }
            let mut o = [0f32; $R];
            run_tile::<$R>(level, w, &ys, &ss, &mut o);
            out.copy_from_slice(&o);
        }};
    }
    match rows.len() {
        4 => tile!(4),
        3 => tile!(3),
        2 => tile!(2),
        1 => tile!(1),
        _ => {}
    }
}

/// One tile of `R` activation rows against one weight row at `level`.
#[inline]
fn run_tile<const R: usize>(
    level: SimdLevel,
    w: &[BlockMXFP4],
    ys: &[&[BlockQ8_0]; R],
    ss: &[&[f32]; R],
    out: &mut [f32; R],
) {
    match level {
        // SAFETY (each call): the level was checked against the CPU's features at device
        // open (`SimdLevel::check`), so the kernel's target features are present.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => unsafe { x86::tile_vnni::<R>(w, ys, ss, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => unsafe { x86::tile_avx512::<R>(w, ys, ss, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { x86::tile_avx2::<R>(w, ys, ss, out) },
        _ => {
            for (o, y) in out.iter_mut().zip(ys) {
                *o = dot_scalar(w, y);
            }
        }
    }
}

/// Weight rows `8g..8g + 8` of `w` against the activation rows `rows` (at most
/// [`TILE`]), into `out[t][r]`; `false` (nothing written) at a level without the
/// eight-row kernels.
fn rows8(
    level: SimdLevel,
    w: &[BlockMXFP4],
    act: Act<'_>,
    g: usize,
    rows: &[usize],
    out: &mut [[f32; 8]; TILE],
) -> bool {
    let nb = act.nb;
    let wr: [&[BlockMXFP4]; 8] =
        std::array::from_fn(|r| &w[(8 * g + r) * nb..(8 * g + r + 1) * nb]);
    macro_rules! go {
        ($R:literal) => {{
            let mut ys = [&[][..]; $R];
            let mut ss = [&[][..]; $R];
            for (t, &i) in rows.iter().enumerate() {
                (ys[t], ss[t]) = act.row(i);
            }
            let mut o = [[0f32; 8]; $R];
            match level {
                // SAFETY (each call): the level was checked against the CPU's features at
                // device open (`SimdLevel::check`), so the kernel's target features are
                // present.
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx512Vnni => unsafe { x86::rows8_vnni::<$R>(&wr, &ys, &ss, &mut o) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx512 => unsafe { x86::rows8_avx512::<$R>(&wr, &ys, &ss, &mut o) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx2 => unsafe { x86::rows8_avx2::<$R>(&wr, &ys, &ss, &mut o) },
                _ => return false,
            }
            out[..$R].copy_from_slice(&o);
        }};
    }
    match rows.len() {
        4 => go!(4),
        3 => go!(3),
        2 => go!(2),
        1 => go!(1),
        _ => {}
    }
    true
}

/// `out[o] = dot(weight row o, activation row act_row)` for every weight row of `w`
/// (`out.len()` rows of `act.nb` blocks): a decode's matvec, eight weight rows at a time
/// in the lanes of a vector.
pub(crate) fn matvec(
    level: SimdLevel,
    w: &[BlockMXFP4],
    act: Act<'_>,
    act_row: usize,
    out: &mut [f32],
) {
    let nb = act.nb.max(1);
    let groups = out.len() / 8;
    let mut o8 = [[0f32; 8]; TILE];
    let mut done = 0;
    for g in 0..groups {
        if !rows8(level, w, act, g, &[act_row], &mut o8) {
            break;
        }
        out[8 * g..8 * g + 8].copy_from_slice(&o8[0]);
        done = 8 * g + 8;
    }
    for (x, o) in w[done * nb..].chunks_exact(nb).zip(&mut out[done..]) {
        dot_rows(level, x, act, &[act_row], std::slice::from_mut(o));
    }
}

/// Every weight row of `w` against every activation row `0..m`, into `out_t` as
/// `[weight row][m]`: weight rows in blocks of [`ROW_BLOCK`], each block against tiles of
/// up to [`TILE`] activation rows, eight weight rows at a time in the lanes of a vector
/// (the rest of a block one by one).
pub(crate) fn small_batch(
    level: SimdLevel,
    w: &[BlockMXFP4],
    act: Act<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = act.nb.max(1);
    for (wb, ob) in w
        .chunks(ROW_BLOCK * nb)
        .zip(out_t.chunks_mut(ROW_BLOCK * m))
    {
        let mut a0 = 0;
        while a0 < m {
            let len = (m - a0).min(TILE);
            let idx: [usize; TILE] = std::array::from_fn(|t| a0 + t);
            let rows_here = ob.len() / m;
            let mut o8 = [[0f32; 8]; TILE];
            let mut done = 0;
            for g in 0..rows_here / 8 {
                if !rows8(level, wb, act, g, &idx[..len], &mut o8) {
                    break;
                }
                for (r, o) in ob[8 * g * m..(8 * g + 8) * m]
                    .chunks_exact_mut(m)
                    .enumerate()
                {
                    for t in 0..len {
                        o[a0 + t] = o8[t][r];
                    }
                }
                done = 8 * g + 8;
            }
            let rest = wb[done * nb..].chunks_exact(nb);
            for (x, o) in rest.zip(ob[done * m..].chunks_exact_mut(m)) {
                dot_rows(level, x, act, &idx[..len], &mut o[a0..a0 + len]);
            }
            a0 += len;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The SIMD kernels. All are `unsafe` to call only because of
    //! `#[target_feature]`: the caller must have checked the CPU's features (done once
    //! at device open).

    use std::arch::x86_64::*;

    use flint_core::blocks::{BlockMXFP4, BlockQ8_0};
    use flint_core::dequant::{e8m0_to_f32_half, KVALUES_MXFP4};

    use crate::kernels::x86::avx2::{codebook, hsum8_i32, nibbles, reduce8, signed_lanes};

    /// The code book in both 128-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lut256() -> __m256i {
        codebook(&KVALUES_MXFP4)
    }

    /// The 32 code-book values of a block as i8, in element order (low nibbles, then
    /// high nibbles).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn values256(b: &BlockMXFP4, lut: __m256i) -> __m256i {
        _mm256_shuffle_epi8(lut, nibbles(&b.qs))
    }

    /// The 32 quants of an activation block.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quants256(b: &BlockQ8_0) -> __m256i {
        // SAFETY: `qs` is 32 readable bytes; loadu is unaligned.
        unsafe { _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i) }
    }

    /// Eight block sums and their scales into the accumulator, in block order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn accumulate8(sums: __m256i, d: &[f32; 8], acc: &mut f32) {
        let mut f = [0f32; 8];
        // SAFETY: `f` is 8 writable f32; storeu is unaligned.
        unsafe { _mm256_storeu_ps(f.as_mut_ptr(), _mm256_cvtepi32_ps(sums)) };
        for (fj, dj) in f.iter().zip(d) {
            *acc = fj.mul_add(*dj, *acc);
        }
    }

    /// The tile kernel of one level: `$dot8` gives the eight per-block i32 lane vectors
    /// of a chunk of eight blocks against one activation row, `$dot1` one block's.
    macro_rules! tile_kernel {
        ($(#[$m:meta])* $name:ident, $features:literal, $prep:ident, $dot8:ident, $dot1:ident) => {
            $(#[$m])*
            #[target_feature(enable = $features)]
            pub(crate) fn $name<const R: usize>(
                x: &[BlockMXFP4],
                y: &[&[BlockQ8_0]; R],
                s: &[&[f32]; R],
                out: &mut [f32; R],
            ) {
                let nb = x.len();
                for r in 0..R {
                    assert!(y[r].len() >= nb && s[r].len() >= nb, "mxfp4: short activation row");
                }
                let lut = lut256();
                let mut acc = [0f32; R];
                let mut b = 0;
                while b + 8 <= nb {
                    let xw = &x[b..b + 8];
                    let dec = $prep(xw, lut);
                    let dw: [f32; 8] = std::array::from_fn(|j| e8m0_to_f32_half(xw[j].e));
                    for r in 0..R {
                        let sums = reduce8($dot8(&dec, &y[r][b..b + 8]));
                        let d: [f32; 8] = std::array::from_fn(|j| dw[j] * s[r][b + j]);
                        accumulate8(sums, &d, &mut acc[r]);
                    }
                    b += 8;
                }
                for (i, xb) in x.iter().enumerate().skip(b) {
                    let v = values256(xb, lut);
                    for r in 0..R {
                        let sum = hsum8_i32($dot1(v, &y[r][i]));
                        let d = e8m0_to_f32_half(xb.e) * s[r][i];
                        acc[r] = (sum as f32).mul_add(d, acc[r]);
                    }
                }
                *out = acc;
            }
        };
    }

    // ---- AVX2: one block per 256-bit register, vpmaddubsw + vpmaddwd.

    /// Eight blocks' values and their magnitudes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn prep_avx2(x: &[BlockMXFP4], lut: __m256i) -> [[__m256i; 8]; 2] {
        let v: [__m256i; 8] = std::array::from_fn(|j| values256(&x[j], lut));
        [v, v.map(|q| _mm256_sign_epi8(q, q))]
    }

    /// One block's eight lanes: `sum_{e in 4l..4l+4} w[e] * a[e]` in lane `l`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes_avx2(w: __m256i, aw: __m256i, y: &BlockQ8_0) -> __m256i {
        signed_lanes(w, aw, quants256(y))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot8_avx2(dec: &[[__m256i; 8]; 2], y: &[BlockQ8_0]) -> [__m256i; 8] {
        std::array::from_fn(|j| lanes_avx2(dec[0][j], dec[1][j], &y[j]))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot1_avx2(w: __m256i, y: &BlockQ8_0) -> __m256i {
        lanes_avx2(w, _mm256_sign_epi8(w, w), y)
    }

    tile_kernel!(
        /// MXFP4 x Q8_0, AVX2.
        tile_avx2, "avx2,fma", prep_avx2, dot8_avx2, dot1_avx2
    );

    // ---- AVX-512 (F+BW) and AVX-512 VNNI: two blocks per 512-bit register.

    /// Two blocks side by side: block `2p` in the low 256 bits, `2p + 1` in the high.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn join(lo: __m256i, hi: __m256i) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }

    /// Eight blocks' values (four pairs) and their magnitudes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn prep_avx512(x: &[BlockMXFP4], lut: __m256i) -> [[__m512i; 4]; 2] {
        let v: [__m512i; 4] =
            std::array::from_fn(|p| join(values256(&x[2 * p], lut), values256(&x[2 * p + 1], lut)));
        [v, v.map(|q| _mm512_abs_epi8(q))]
    }

    /// The activation quants of two blocks, each negated where the weight is negative.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn signed_acts(w: __m512i, y0: &BlockQ8_0, y1: &BlockQ8_0) -> __m512i {
        let a = join(quants256(y0), quants256(y1));
        _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a)
    }

    /// The two 256-bit halves of each of four registers, in block order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn halves(v: [__m512i; 4]) -> [__m256i; 8] {
        std::array::from_fn(|j| {
            let p = v[j / 2];
            if j % 2 == 0 {
                _mm512_castsi512_si256(p)
            } else {
                _mm512_extracti64x4_epi64::<1>(p)
            }
        })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn dot8_avx512(dec: &[[__m512i; 4]; 2], y: &[BlockQ8_0]) -> [__m256i; 8] {
        let one = _mm512_set1_epi16(1);
        halves(std::array::from_fn(|p| {
            let sa = signed_acts(dec[0][p], &y[2 * p], &y[2 * p + 1]);
            _mm512_madd_epi16(_mm512_maddubs_epi16(dec[1][p], sa), one)
        }))
    }

    tile_kernel!(
        /// MXFP4 x Q8_0, AVX-512 F+BW.
        tile_avx512, "avx512f,avx512bw,avx2,fma", prep_avx512, dot8_avx512, dot1_avx2
    );

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
    fn dot8_vnni(dec: &[[__m512i; 4]; 2], y: &[BlockQ8_0]) -> [__m256i; 8] {
        halves(std::array::from_fn(|p| {
            let sa = signed_acts(dec[0][p], &y[2 * p], &y[2 * p + 1]);
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), dec[1][p], sa)
        }))
    }

    tile_kernel!(
        /// MXFP4 x Q8_0, AVX-512 VNNI.
        tile_vnni, "avx512f,avx512bw,avx512vnni,avx2,fma", prep_avx512, dot8_vnni, dot1_avx2
    );

    // ---- Eight weight rows in the lanes of one vector (decode and batches).

    /// The eight-row kernel of one level: per block, `$prep` decodes the block of each of
    /// the eight rows, `$dot` gives each row's i32 lanes against one activation block,
    /// [`reduce8`] turns them into the eight rows' block sums, and one vector `fma` per
    /// block adds them to the eight accumulators, in block order.
    macro_rules! rows8_kernel {
        ($(#[$m:meta])* $name:ident, $features:literal, $prep:ident, $dot:ident) => {
            $(#[$m])*
            #[target_feature(enable = $features)]
            pub(crate) fn $name<const T: usize>(
                w: &[&[BlockMXFP4]; 8],
                y: &[&[BlockQ8_0]; T],
                s: &[&[f32]; T],
                out: &mut [[f32; 8]; T],
            ) {
                let nb = w[0].len();
                assert!(w.iter().all(|r| r.len() == nb), "mxfp4: rows of different lengths");
                for t in 0..T {
                    assert!(y[t].len() >= nb && s[t].len() >= nb, "mxfp4: short activation row");
                }
                let lut = lut256();
                let mut acc = [_mm256_setzero_ps(); T];
                for j in 0..nb {
                    let blk: [&BlockMXFP4; 8] = std::array::from_fn(|r| &w[r][j]);
                    let dec = $prep(&blk, lut);
                    let dw: [f32; 8] = std::array::from_fn(|r| e8m0_to_f32_half(blk[r].e));
                    // SAFETY: `dw` is 8 readable f32; loadu is unaligned.
                    let dw = unsafe { _mm256_loadu_ps(dw.as_ptr()) };
                    for t in 0..T {
                        let sums = reduce8($dot(&dec, &y[t][j]));
                        let d = _mm256_mul_ps(dw, _mm256_set1_ps(s[t][j]));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[t]);
                    }
                }
                for t in 0..T {
                    // SAFETY: `out[t]` is 8 writable f32; storeu is unaligned.
                    unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
                }
            }
        };
    }

    /// One block of two weight rows `b0` and `b1`, as values: elements 0..16 of `b0` in
    /// the low half and of `b1` in the high half of the first vector, elements 16..32 in
    /// the second.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn pair_values(b0: &BlockMXFP4, b1: &BlockMXFP4, lut: __m256i) -> [__m256i; 2] {
        // SAFETY: each `qs` is 16 readable bytes; loadu2 is unaligned.
        let x = unsafe {
            _mm256_loadu2_m128i(
                b1.qs.as_ptr() as *const __m128i,
                b0.qs.as_ptr() as *const __m128i,
            )
        };
        let m = _mm256_set1_epi8(0x0F);
        let lo = _mm256_and_si256(x, m);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m);
        [_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi)]
    }

    /// An activation block's quants 0..16 in both halves of the first vector, 16..32 in
    /// both halves of the second.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn halves_broadcast(y: &BlockQ8_0) -> [__m256i; 2] {
        // SAFETY: `qs` is 32 readable bytes; each load reads 16 of them, unaligned.
        let (lo, hi) = unsafe {
            (
                _mm_loadu_si128(y.qs.as_ptr() as *const __m128i),
                _mm_loadu_si128(y.qs.as_ptr().add(16) as *const __m128i),
            )
        };
        [
            _mm256_broadcastsi128_si256(lo),
            _mm256_broadcastsi128_si256(hi),
        ]
    }

    /// The two rows of [`pair_values`] against one activation block
    /// ([`halves_broadcast`]): per 128-bit half, one row's eight 16-bit partial sums of
    /// four products each (`vpmaddubsw` pairs of the two element halves added; at most
    /// `4 * 12 * 127`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn pair_sums(v: &[__m256i; 2], aw: &[__m256i; 2], a: &[__m256i; 2]) -> __m256i {
        let p0 = _mm256_maddubs_epi16(aw[0], _mm256_sign_epi8(a[0], v[0]));
        let p1 = _mm256_maddubs_epi16(aw[1], _mm256_sign_epi8(a[1], v[1]));
        _mm256_add_epi16(p0, p1)
    }

    /// Eight MXFP4 rows x Q8_0, AVX2. Per block: rows `i` and `i + 4` decoded side by
    /// side ([`pair_values`], [`pair_sums`]), two `vphaddw` levels leave in each half four
    /// rows' pairs of partial sums (at most `16 * 12 * 127`: within i16) and one
    /// `vpmaddwd` the eight rows' exact block sums in lane order; then one vector `fma`
    /// into the eight accumulators, in block order. Each row is prefetched
    /// [`super::PREFETCH`] bytes ahead.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn rows8_avx2<const T: usize>(
        w: &[&[BlockMXFP4]; 8],
        y: &[&[BlockQ8_0]; T],
        s: &[&[f32]; T],
        out: &mut [[f32; 8]; T],
    ) {
        let nb = w[0].len();
        assert!(
            w.iter().all(|r| r.len() == nb),
            "mxfp4: rows of different lengths"
        );
        for t in 0..T {
            assert!(
                y[t].len() >= nb && s[t].len() >= nb,
                "mxfp4: short activation row"
            );
        }
        let (wp, yp, sp) = (
            w.map(<[_]>::as_ptr),
            y.map(<[_]>::as_ptr),
            s.map(<[_]>::as_ptr),
        );
        let lut = lut256();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        for j in 0..nb {
            if j % 2 == 0 {
                for row in w {
                    let p =
                        (row.as_ptr().wrapping_add(j) as *const i8).wrapping_add(super::PREFETCH);
                    // A prefetch is a hint: it reads nothing and faults on no address.
                    _mm_prefetch::<_MM_HINT_T0>(p);
                }
            }
            // SAFETY (the three reads, unchecked: the checks cost this loop 3-5% of its
            // time): `j < nb`, and every row and activation slice holds at least `nb`
            // elements (asserted above).
            let blk: [&BlockMXFP4; 8] = std::array::from_fn(|r| unsafe { &*wp[r].add(j) });
            // SAFETY: as above.
            let a: [[__m256i; 2]; T] =
                std::array::from_fn(|t| halves_broadcast(unsafe { &*yp[t].add(j) }));
            // SAFETY: as above.
            let sa: [f32; T] = std::array::from_fn(|t| unsafe { *sp[t].add(j) });
            // `p[t][i]`: rows `i` and `i + 4` against activation row `t`.
            let mut p = [[_mm256_setzero_si256(); 4]; T];
            for i in 0..4 {
                let v = pair_values(blk[i], blk[i + 4], lut);
                let aw = v.map(|x| _mm256_sign_epi8(x, x));
                for t in 0..T {
                    p[t][i] = pair_sums(&v, &aw, &a[t]);
                }
            }
            let dw: [f32; 8] = std::array::from_fn(|r| e8m0_to_f32_half(blk[r].e));
            // SAFETY: `dw` is 8 readable f32; loadu is unaligned.
            let dw = unsafe { _mm256_loadu_ps(dw.as_ptr()) };
            for t in 0..T {
                let h01 = _mm256_hadd_epi16(p[t][0], p[t][1]);
                let h23 = _mm256_hadd_epi16(p[t][2], p[t][3]);
                let sums = _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones);
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(sa[t]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[t]);
            }
        }
        for t in 0..T {
            // SAFETY: `out[t]` is 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
        }
    }

    /// One block of each of eight rows, two rows per register (row `2p` in the low half),
    /// and their magnitudes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn prep8_avx512(blk: &[&BlockMXFP4; 8], lut: __m256i) -> [[__m512i; 4]; 2] {
        let v: [__m512i; 4] = std::array::from_fn(|p| {
            join(values256(blk[2 * p], lut), values256(blk[2 * p + 1], lut))
        });
        [v, v.map(|q| _mm512_abs_epi8(q))]
    }

    /// One activation block in both halves, negated where the weight is negative.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn signed_act2(w: __m512i, a: __m512i) -> __m512i {
        _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn rowdot_avx512(dec: &[[__m512i; 4]; 2], y: &BlockQ8_0) -> [__m256i; 8] {
        let a = _mm512_broadcast_i64x4(quants256(y));
        let one = _mm512_set1_epi16(1);
        halves(std::array::from_fn(|p| {
            let sa = signed_act2(dec[0][p], a);
            _mm512_madd_epi16(_mm512_maddubs_epi16(dec[1][p], sa), one)
        }))
    }

    rows8_kernel!(
        /// Eight MXFP4 rows x Q8_0, AVX-512 F+BW.
        rows8_avx512, "avx512f,avx512bw,avx2,fma", prep8_avx512, rowdot_avx512
    );

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
    fn rowdot_vnni(dec: &[[__m512i; 4]; 2], y: &BlockQ8_0) -> [__m256i; 8] {
        let a = _mm512_broadcast_i64x4(quants256(y));
        halves(std::array::from_fn(|p| {
            let sa = signed_act2(dec[0][p], a);
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), dec[1][p], sa)
        }))
    }

    rows8_kernel!(
        /// Eight MXFP4 rows x Q8_0, AVX-512 VNNI.
        rows8_vnni, "avx512f,avx512bw,avx512vnni,avx2,fma", prep8_avx512, rowdot_vnni
    );
}
