//! The prompt-batch gemm of the 256-quant block types on AVX2 (no `vpdpbusd`): eight
//! weight rows in the lanes of each register (the AVX2 counterpart of
//! [`super::kq_panel`], and the K-quant counterpart of `q0/panel_avx2.rs`), in the float
//! orders of the row kernels, bit for bit: Q4_K and Q6_K at the AVX2 and AVX-512 F
//! levels (`q4_k/avx2.rs`, `q6_k/avx2.rs`), and Q2_K, Q3_K, IQ4_XS and Q5_K at every
//! level from AVX2 up, whose row kernels keep one order everywhere (the scalar
//! reference's; Q5_K llama.cpp's tiled one) (`kernels::dispatch::level_free_panels`).
//!
//! Each weight is decoded once per matmul into panel blocks ([`KPanel8Block`]): per
//! 256-quant block of eight rows, the quants as unsigned bytes in element order with
//! dword `t` of the eight rows side by side, and the rows' scales, mins and `d`s widened
//! to lanes. Per activation row, one `vpmaddubsw` of a dword register against the row's
//! four quants broadcast gives each weight row's two pair sums as i16; a few such
//! products are added as i16 while they cannot overflow ([`sum16`]), then one
//! `vpmaddwd` with the rows' sub-block scales gives `sc·dot` per row as an i32. The
//! integers are exact in any order, so only the float steps (one or two FMAs per block
//! or pair of sub-blocks, eight outputs each) fix the result, and they are the row
//! kernels'. The row kernels spend horizontal sums per activation row and decode every
//! block once per four activation rows; here the sums stay in lanes and each block is
//! decoded once per matmul.
//!
//! On AVX-512 VNNI, IQ4_XS, Q2_K, Q3_K and Q5_K have tiles of their own
//! ([`KPanel8::tile_vnni`]): `vpdpbusd` on the panel's unsigned bytes, the same float
//! steps. A type whose tile would rearrange each activation block for every panel
//! arranges the activation rows once per gemm instead ([`KPanel8::Act`]: Q3_K's lanes
//! of eight); the others read the Q8_K blocks as they are. An expert's panels are
//! decoded one at a time between its tiles, and the tiles ask for the next panel's
//! weight rows as they go ([`gemm8`]'s `ahead`), so the decode finds them in cache.
//!
//! What the formats share is here (the panel block, the trait, the driver); each
//! format's decode and tile is in its folder's `panel_avx2.rs` (`q4_k`, `q5_k`, `q6_k`,
//! `q2_k`, `q3_k`, `iq4_xs`).

use std::arch::x86_64::*;

use flint_core::blocks::BlockQ8K;

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel::quad;
use crate::kernels::panel::{for_each_panel_of, OutCols};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x16::Ahead;
use crate::kernels::x86::avx2::transpose8;
use crate::simd::SimdLevel;
use flint_core::dequant::k4_scale_min;

/// Activation rows per tile: three share each weight register (two or four are
/// slower on the Intel Xeon host, `kernel_speed` at M = 512).
const COLS: usize = 3;

/// One 256-quant block of eight weight rows, decoded ([`KPanel8::decode_block`]); rows
/// past the end of the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct KPanel8Block {
    /// Quants `4t..4t + 4` of the eight rows (row `r` in bytes `4r..4r + 4`): Q4_K's
    /// nibbles as they are, Q5_K's five bits, Q6_K's six bits with their offset of 32,
    /// Q2_K's two bits;
    /// Q3_K's three bits plus 4, four elements of one float lane per dword
    /// (`q3_k/panel_avx2.rs`); IQ4_XS's code-book values as signed bytes.
    pub(crate) u: [[u8; 32]; 64],
    /// Per sub-block (Q4_K, Q5_K: 8 of 32 quants; Q6_K and Q2_K: 16 of 16) the rows' scales
    /// twice as i16 (for `vpmaddwd` against a row's two pair sums); Q3_K: per run of 32
    /// the rows' two group scales less 32 as an i16 pair; IQ4_XS: per sub-block of 32 the
    /// rows' `ls - 32` as plain i32.
    pub(crate) sc: [[i32; 8]; 16],
    /// Q4_K and Q5_K: per sub-block `s` the rows' mins `m_s` twice as i16 (for `vpmaddwd`
    /// against two `bsums`). Q6_K: per pair `p` of sub-blocks the rows'
    /// `(-32 sc_2p, -32 sc_2p+1)` as i16 (the offset of the unsigned quants, taken off
    /// against the pair's two `bsums`). Q2_K: per pair `p` of groups the rows' mins
    /// `(m_2p, m_2p+1)` as i16.
    pub(crate) pairs: [[i32; 8]; 8],
    /// The rows' `d`.
    pub(crate) d: [f32; 8],
    /// The rows' `dmin` (Q4_K, Q5_K, Q2_K).
    pub(crate) dmin: [f32; 8],
}

const _: () = assert!(std::mem::size_of::<KPanel8Block>() == 2880);

impl KPanel8Block {
    /// Stores eight rows' 32-byte vectors (`rows[r]`: row `r`'s quants `4t0..4t0 + 32`)
    /// transposed: dword `t` of every row into `u[t0 + t]`, row `r` in bytes
    /// `4r..4r + 4`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn put_dwords(&mut self, t0: usize, rows: [__m256i; PANEL8_ROWS]) {
        for (t, v) in transpose8(rows).into_iter().enumerate() {
            // SAFETY: 32 writable bytes, 32-byte aligned.
            unsafe { _mm256_store_si256(self.u[t0 + t].as_mut_ptr() as *mut __m256i, v) };
        }
    }

    /// The headers of up to eight rows' blocks of the Q4_K family (Q4_K, Q5_K: twelve
    /// bytes of 6-bit scales and mins, `d`, `dmin`; row `r` the iterator's `r`-th): per
    /// sub-block the scales into `sc` and the mins into `pairs`, each twice as i16
    /// (`k4_scale_min`), and `d`, `dmin`; lanes past the rows zero.
    pub(crate) fn put_k4_headers<'a>(
        &mut self,
        heads: impl Iterator<Item = (&'a [u8; 12], u16, u16)>,
    ) {
        let mut sc = [[0i32; PANEL8_ROWS]; 16];
        let mut pairs = [[0i32; PANEL8_ROWS]; 8];
        let mut d = [0f32; PANEL8_ROWS];
        let mut dmin = [0f32; PANEL8_ROWS];
        for (r, (scales, hd, hdmin)) in heads.take(PANEL8_ROWS).enumerate() {
            let (s, m) = k4_scale_min(scales);
            for k in 0..8 {
                sc[k][r] = i16_pair(s[k].into(), s[k].into());
                pairs[k][r] = i16_pair(m[k].into(), m[k].into());
            }
            (d[r], dmin[r]) = (f16_to_f32(hd), f16_to_f32(hdmin));
        }
        (self.sc, self.pairs, self.d, self.dmin) = (sc, pairs, d, dmin);
    }

    /// A zeroed block (scratch space).
    pub(crate) const ZERO: Self = Self {
        u: [[0; 32]; 64],
        sc: [[0; 8]; 16],
        pairs: [[0; 8]; 8],
        d: [0.0; 8],
        dmin: [0.0; 8],
    };
}

/// A K-quant weight type of the eight-row panels.
pub(crate) trait KPanel8: bytemuck::Pod + Sync {
    /// The activation blocks the tiles read: Q8_K as quantized, or an arrangement of
    /// them made once per gemm ([`Self::acts`]) where a tile would otherwise rearrange
    /// each activation block for every panel.
    type Act: Copy + Send + Sync;

    /// The Q8_K activation blocks `a` as the tiles read them: `a` itself, or arranged
    /// into `scratch`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn acts<'s>(a: &'s [BlockQ8K], scratch: &'s mut Vec<Self::Act>) -> &'s [Self::Act];

    /// Block `i` of the weight rows `rows` (at most [`PANEL8_ROWS`]) into the panel
    /// block `o`; lanes past `rows.len()` zero.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block);

    /// The eight rows of a panel (`panel`: its blocks) against `A` activation rows, in
    /// the type's float order. `out[a][r]`: panel row `r` against activation row `a`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    unsafe fn tile<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[Self::Act]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    );

    /// Whether the type has a tile of its own on AVX-512 VNNI ([`Self::tile_vnni`],
    /// with its own decode [`Self::decode_block_vnni`]); without one that level runs the
    /// AVX2 pair.
    const VNNI: bool = false;

    /// [`Self::decode_block`] for [`Self::tile_vnni`].
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/VL/VNNI, AVX2, FMA and F16C.
    unsafe fn decode_block_vnni(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        // SAFETY: the caller's features include this one's.
        unsafe { Self::decode_block(rows, i, o) }
    }

    /// [`Self::tile`] on AVX-512 VNNI, in the same float order (the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/VL/VNNI, AVX2 and FMA.
    unsafe fn tile_vnni<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[Self::Act]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        // SAFETY: the caller's features include this one's.
        unsafe { Self::tile::<A>(panel, y, out) }
    }
}

/// One tile of `A` activation rows from `t` (`act(t)`: a row's blocks) against a panel,
/// into the first `A` rows of `o`.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and AVX-512 VNNI where `vnni`.
#[inline]
unsafe fn tile_n<'a, B: KPanel8, const A: usize>(
    vnni: bool,
    blocks: &[KPanel8Block],
    act: impl Fn(usize) -> &'a [B::Act],
    t: usize,
    o: &mut [[f32; PANEL8_ROWS]; COLS],
) where
    B::Act: 'a,
{
    let y: [&[B::Act]; A] = std::array::from_fn(|a| act(t + a));
    let mut r = [[0f32; PANEL8_ROWS]; A];
    // SAFETY: the caller's.
    unsafe {
        if vnni {
            B::tile_vnni::<A>(blocks, &y, &mut r);
        } else {
            B::tile::<A>(blocks, &y, &mut r);
        }
    }
    o[..A].copy_from_slice(&r);
}

/// [`KPanel8::Act`] and [`KPanel8::acts`] of a type whose tiles read the Q8_K blocks as
/// they are.
macro_rules! q8k_acts {
    () => {
        type Act = flint_core::blocks::BlockQ8K;

        unsafe fn acts<'s>(
            a: &'s [flint_core::blocks::BlockQ8K],
            _: &'s mut Vec<flint_core::blocks::BlockQ8K>,
        ) -> &'s [flint_core::blocks::BlockQ8K] {
            a
        }
    };
}
pub(crate) use q8k_acts;

/// An i16 pair `(lo, hi)` as one i32 lane (for `vpmaddwd`).
#[inline(always)]
pub(crate) fn i16_pair(lo: i32, hi: i32) -> i32 {
    (u32::from(lo as i16 as u16) | (u32::from(hi as i16 as u16) << 16)) as i32
}

/// Per activation row, `sum over t in t0..t0 + T of vpmaddubsw(u[t], quants 4t..4t + 4
/// broadcast)`: each weight row's two pair sums of those dwords, added as i16. The
/// caller keeps `T` small enough that they cannot overflow.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn sum16<const T: usize, const A: usize>(
    b: &KPanel8Block,
    t0: usize,
    ys: &[&BlockQ8K; A],
) -> [__m256i; A] {
    let mut s = [_mm256_setzero_si256(); A];
    for t in t0..t0 + T {
        // SAFETY: 32 readable bytes, 32-byte aligned.
        let w = unsafe { _mm256_load_si256(b.u[t].as_ptr() as *const __m256i) };
        for a in 0..A {
            let p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(quad(ys[a], t)));
            s[a] = _mm256_add_epi16(s[a], p);
        }
    }
    s
}

/// Loads eight i32 lanes of a panel block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lanes8(v: &[i32; 8]) -> __m256i {
    // SAFETY: 32 readable bytes, 32-byte aligned.
    unsafe { _mm256_load_si256(v.as_ptr() as *const __m256i) }
}

/// Loads eight f32 of a panel block.
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn lanes8_ps(v: &[f32; 8]) -> __m256 {
    // SAFETY: 32 readable bytes, 32-byte aligned.
    unsafe { _mm256_load_ps(v.as_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn decode_panel<B: KPanel8>(rows: &[&[B]], out: &mut [KPanel8Block]) {
    assert!(rows.len() <= PANEL8_ROWS, "decode_panel: rows");
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: this function's features are what `decode_block` needs.
        unsafe { B::decode_block(rows, i, o) };
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
fn decode_panel_vnni<B: KPanel8>(rows: &[&[B]], out: &mut [KPanel8Block]) {
    assert!(rows.len() <= PANEL8_ROWS, "decode_panel: rows");
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: this function's features are what `decode_block_vnni` needs.
        unsafe { B::decode_block_vnni(rows, i, o) };
    }
}

/// Whether [`decode8`] and [`gemm8`] take `B`'s AVX-512 VNNI pair at `level`.
pub(crate) fn vnni_tiles<B: KPanel8>(level: SimdLevel) -> bool {
    B::VNNI && level == SimdLevel::Avx512Vnni
}

/// Decodes the `n` weight rows of `w` (each `nb` blocks) into panels: panel `p` (rows
/// `8p..8p + 8`) at `dec[(p - p0) * nb..]`, for the panels `p0..p0 + dec.len() / nb`,
/// for the tile [`gemm8`] takes at `level`.
pub(crate) fn decode8<B: KPanel8>(
    level: SimdLevel,
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [KPanel8Block],
) {
    if vnni_tiles::<B>(level) {
        // SAFETY: the AVX-512 VNNI level was checked against the CPU at device open.
        for_each_panel_of::<PANEL8_ROWS, _, _>(w, nb, n, p0, dec, |rows, d| unsafe {
            decode_panel_vnni(rows, d)
        });
        return;
    }
    // SAFETY: every level that reaches here has AVX2, FMA and F16C (checked against the
    // CPU at device open).
    for_each_panel_of::<PANEL8_ROWS, _, _>(w, nb, n, p0, dec, |rows, d| unsafe {
        decode_panel(rows, d)
    });
}

/// `out[t * cols.stride + cols.c0 + r] = dot(weight row r, activation row t)` for the
/// `n` weight rows decoded in `dec` (panels of `nb` blocks, [`decode8`]) and the
/// `out.len() / cols.stride` activation rows `acts` (`nb` blocks each, as
/// [`KPanel8::acts`] gives them), in `B`'s float order (the row kernels' results, bit for
/// bit): per panel (which stays in L1) tiles of [`COLS`] activation rows, the last one or
/// two rows in one tile. Each tile first asks for its share of the cache lines of `ahead`
/// (the weight rows decoded next, if any).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm8<B: KPanel8>(
    level: SimdLevel,
    dec: &[KPanel8Block],
    nb: usize,
    n: usize,
    acts: &[B::Act],
    out: &mut [f32],
    cols: OutCols,
    ahead: Ahead,
) {
    if n == 0 || nb == 0 {
        return;
    }
    assert!(
        cols.c0 + n <= cols.stride,
        "kq_panel_avx2::gemm8: output columns"
    );
    let m = out.len() / cols.stride;
    assert!(
        acts.len() >= m * nb,
        "kq_panel_avx2::gemm8: activation rows"
    );
    let panels = n.div_ceil(PANEL8_ROWS);
    assert!(
        dec.len() >= panels * nb,
        "kq_panel_avx2::gemm8: decoded rows"
    );
    let act = |t: usize| &acts[t * nb..(t + 1) * nb];
    let vnni = vnni_tiles::<B>(level);
    let tiles = m.div_ceil(COLS);
    for p in 0..panels {
        let blocks = &dec[p * nb..(p + 1) * nb];
        let r0 = p * PANEL8_ROWS;
        let live = PANEL8_ROWS.min(n - r0);
        let mut t = 0;
        let mut tile = p * tiles;
        while t < m {
            let take = COLS.min(m - t);
            ahead.part(tile, panels * tiles).all();
            tile += 1;
            let mut o = [[0f32; PANEL8_ROWS]; COLS];
            // SAFETY (each call): the AVX2 level was checked against the CPU at device
            // open.
            unsafe {
                match take {
                    COLS => tile_n::<B, COLS>(vnni, blocks, act, t, &mut o),
                    2 => tile_n::<B, 2>(vnni, blocks, act, t, &mut o),
                    _ => tile_n::<B, 1>(vnni, blocks, act, t, &mut o),
                }
            }
            for (a, v) in o.iter().enumerate().take(take) {
                let at = (t + a) * cols.stride + cols.c0 + r0;
                out[at..at + live].copy_from_slice(&v[..live]);
            }
            t += take;
        }
    }
}
