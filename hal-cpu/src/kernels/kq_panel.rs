//! The prompt-batch gemm of Q4_K and Q6_K on AVX-512 VNNI: sixteen weight rows in the
//! lanes of each register ("panels", as [`super::q0::panel::q0_gemm`] does for the legacy
//! quants), in llama.cpp's float orders, bit for bit the same as
//! `q4_k::vnni::dot_q4k_gemm` (the repacked `q4_K_8x8` order) and `q6_k::vnni::dot_q6k_tiled`
//! (the tiled matmul's order).
//!
//! Each weight is decoded once per matmul into panel blocks: per 256-quant block of 16
//! rows, the quants as unsigned bytes in element order with dword `t` of the sixteen
//! rows side by side (`u[t]`), and the rows' scales, mins and `d`s widened to lanes. One
//! `vpdpbusd` of `u[t]` against four broadcast activation quants then adds four
//! products to sixteen outputs at once, with no horizontal sums: a sub-block's dot
//! product is an integer chain in lanes, scaled by a `vpmulld` with the rows' sub-block
//! scales, and the float steps (one FMA per pair of sub-blocks for Q4_K, one per block
//! for Q6_K) run on sixteen outputs per instruction. The integers are exact in any
//! order, so only the float steps fix the result, and they are llama.cpp's.
//!
//! Tiles of 16 weight rows x [`COLS`] activation rows: each weight register feeds
//! [`COLS`] activation rows; the activation quants, their scale and their `bsums` are
//! broadcast memory operands.
//!
//! What the two formats share is here (the panel block, the trait each format's decode
//! implements, the gemm driver); each format's decode and tile is in `q4_k/panel.rs`
//! and `q6_k/panel.rs`.

use std::arch::x86_64::*;

use flint_core::blocks::BlockQ8K;

use crate::kernels::panel::{for_each_panel, put_row, OutCols, PANEL_ROWS};
use crate::kernels::x16::Ahead;
use crate::kernels::x86::avx512::transpose16;

/// Activation rows per tile.
const COLS: usize = 4;

/// One 256-quant block of sixteen weight rows, decoded ([`decode`]); rows past the end
/// of the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct KPanelBlock {
    /// Quants `4t..4t + 4` of the sixteen rows (row `r` in bytes `4r..4r + 4`),
    /// unsigned: Q4_K's nibbles as they are, Q6_K's six bits with their offset of 32.
    pub(crate) u: [[u8; 64]; 64],
    /// Per sub-block (Q4_K: 8 of 32 quants; Q6_K: 16 of 16) the rows' scales.
    pub(crate) sc: [[i32; 16]; 16],
    /// Q4_K: per sub-block `s` the rows' mins `m_s` twice as i16 (for `vpdpwssd`
    /// against two `bsums`). Q6_K: per pair `p` of sub-blocks the rows'
    /// `(-32 sc_2p, -32 sc_2p+1)` as i16 (the offset of the unsigned quants, taken off
    /// against the pair's two `bsums`).
    pub(crate) pairs: [[i32; 16]; 8],
    /// The rows' `d`.
    pub(crate) d: [f32; 16],
    /// The rows' `dmin` (Q4_K).
    pub(crate) dmin: [f32; 16],
}

const _: () = assert!(std::mem::size_of::<KPanelBlock>() == 5760);

impl KPanelBlock {
    /// A zeroed block (scratch space).
    pub(crate) const ZERO: Self = Self {
        u: [[0; 64]; 64],
        sc: [[0; 16]; 16],
        pairs: [[0; 16]; 8],
        d: [0.0; 16],
        dmin: [0.0; 16],
    };
}

/// A K-quant weight type the panel gemm takes.
pub(crate) trait KPanel: bytemuck::Pod + Sync {
    /// Block `i` of the weight rows `rows` (at most [`PANEL_ROWS`]) into the panel block
    /// `o`; lanes past `rows.len()` zero.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW.
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanelBlock);
}

/// The packed 32-bit words `w` of sixteen rows (`w(r)`: row `r`'s, up to 16 of them per
/// call) side by side: lane `r` of result `t` is word `t` of row `r`. Rows past `live`
/// are zero.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn words16(live: usize, w: impl Fn(usize) -> __m512i) -> [__m512i; 16] {
    // A loop, not `std::array::from_fn`: its closure would not inherit this function's
    // target features and could stay an out-of-line call per row.
    let mut rows = [_mm512_setzero_si512(); 16];
    for (r, v) in rows.iter_mut().enumerate().take(live) {
        *v = w(r);
    }
    transpose16(rows)
}

/// Sixteen rows' header word `f(row)` (a u32 per row, 0 past `live`) as lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn header16(live: usize, f: impl Fn(usize) -> u32) -> __m512i {
    let mut v = [0u32; 16];
    for (r, x) in v.iter_mut().enumerate().take(live) {
        *x = f(r);
    }
    // SAFETY: 16 readable u32; loadu is unaligned.
    unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
}

/// Sixteen f16 values (the low 16 bits of each lane of `v`) widened to f32 exactly.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn f16_lanes(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// Stores 16 lanes into a panel block's row of i32.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn put(dst: &mut [i32; 16], v: __m512i) {
    // SAFETY: 64 writable bytes, 64-byte aligned.
    unsafe { _mm512_store_si512(dst.as_mut_ptr() as *mut __m512i, v) }
}

/// Stores 16 f32 lanes into a panel block's row of f32.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn put_ps(dst: &mut [f32; 16], v: __m512) {
    // SAFETY: 64 writable bytes, 64-byte aligned.
    unsafe { _mm512_store_ps(dst.as_mut_ptr(), v) }
}

/// Decodes the weight rows `rows` (at most [`PANEL_ROWS`], each `out.len()` blocks)
/// into panel blocks.
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_panel<B: KPanel>(rows: &[&[B]], out: &mut [KPanelBlock]) {
    assert!(rows.len() <= PANEL_ROWS, "decode_panel: rows");
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: this function's features are what `decode_block` needs.
        unsafe { B::decode_block(rows, i, o) };
    }
}

/// Decodes the `n` weight rows of `w` (each `nb` blocks) into panels: panel `p` (rows
/// `16p..16p + 16`) at `dec[p * nb..]`, for the panels `p0..p0 + dec.len() / nb`.
pub(crate) fn decode<B: KPanel>(w: &[B], nb: usize, n: usize, p0: usize, dec: &mut [KPanelBlock]) {
    // SAFETY: the VNNI level (AVX-512 F/BW/VL/VNNI) was checked against the CPU at
    // device open.
    for_each_panel(w, nb, n, p0, dec, |rows, d| unsafe {
        decode_panel(rows, d)
    });
}

/// [`decode`] for a weight repacked at staging (`q4_k::x16`, `q6_k::x16`): panel `p` is row
/// group `p` (`groups[p * nb..]`), for the panels `p0..p0 + dec.len() / nb`, each block
/// turned into a panel block by `block`.
pub(crate) fn decode_groups<G>(
    groups: &[G],
    nb: usize,
    p0: usize,
    dec: &mut [KPanelBlock],
    block: impl Fn(&G, &mut KPanelBlock),
) {
    if nb == 0 {
        return;
    }
    for (t, d) in dec.chunks_mut(nb).enumerate() {
        let g = &groups[(p0 + t) * nb..(p0 + t + 1) * nb];
        for (b, o) in g.iter().zip(d.iter_mut()) {
            block(b, o);
        }
    }
}

/// Four activation quants `4t..4t + 4` of `y` as one i32 (for a broadcast operand).
#[inline(always)]
pub(crate) fn quad(y: &BlockQ8K, t: usize) -> i32 {
    let q = &y.qs[4 * t..4 * t + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// Two `bsums` (`2p`, `2p + 1`) of `y` as one i32 (for a broadcast operand).
#[inline(always)]
pub(crate) fn bsum_pair(y: &BlockQ8K, p: usize) -> i32 {
    let (a, b) = (y.bsums[2 * p] as u16, y.bsums[2 * p + 1] as u16);
    (u32::from(a) | (u32::from(b) << 16)) as i32
}

/// The dot products of one sub-block (`T` dwords from dword `t0`) of the panel block's
/// sixteen rows with `A` activation rows, as exact i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) fn sub_block<const T: usize, const A: usize>(
    b: &KPanelBlock,
    t0: usize,
    ys: &[&BlockQ8K; A],
) -> [__m512i; A] {
    let mut acc = [_mm512_setzero_si512(); A];
    for t in t0..t0 + T {
        // SAFETY: 64 readable bytes, 64-byte aligned.
        let w = unsafe { _mm512_load_si512(b.u[t].as_ptr() as *const __m512i) };
        for a in 0..A {
            acc[a] = _mm512_dpbusd_epi32(acc[a], w, _mm512_set1_epi32(quad(ys[a], t)));
        }
    }
    acc
}

/// Loads 16 lanes (i32 or f32 bit patterns) of a panel block.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn lanes(v: &[i32; 16]) -> __m512i {
    // SAFETY: 64 readable bytes, 64-byte aligned.
    unsafe { _mm512_load_si512(v.as_ptr() as *const __m512i) }
}

/// Loads 16 f32 of a panel block.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn lanes_ps(v: &[f32; 16]) -> __m512 {
    // SAFETY: 64 readable bytes, 64-byte aligned.
    unsafe { _mm512_load_ps(v.as_ptr()) }
}

/// The float orders a K-quant tile computes in ([`KTile::tile`]'s `ORDER`): llama.cpp's
/// for a dense matmul's batch, for an expert tower's rows (`MUL_MAT_ID`: Q4_K's gemv
/// order, Q6_K's tiled one as for a dense matmul), and its AMX build's
/// (`flint_core::dot::ggml_x86::vec_dot_q4_k_q8_k_amx` / `vec_dot_q6_k_q8_k_amx`: per
/// block the whole block's integers, one FMA, Q4_K's mins a second into the same sum).
pub(crate) const DENSE: u8 = 0;
/// See [`DENSE`].
pub(crate) const EXPERT: u8 = 1;
/// See [`DENSE`].
pub(crate) const AMX: u8 = 2;

/// The tile of one type.
pub(crate) trait KTile: KPanel {
    /// `q4_k::panel::q4k_tile` / `q6_k::panel::q6k_tile` for `A` activation rows, in
    /// the float order `ORDER` ([`DENSE`], [`EXPERT`], [`AMX`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and FMA.
    /// The tile asks for the cache lines of `ahead` as it goes ([`Ahead::block`]).
    unsafe fn tile<const A: usize, const ORDER: u8>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    );
}

/// `out[t * cols.stride + cols.c0 + r] = dot(weight row r, activation row i0 + t)` for
/// the `n` weight rows decoded in `dec` (panels of `nb` blocks, [`decode`]) and the
/// `out.len() / cols.stride` activation rows from `i0` of `acts` (Q8_K, `nb` blocks per
/// row), in the float order `ORDER` ([`KTile::tile`]: llama.cpp's prompt-batch order
/// for `B`, its expert order, or its AMX build's). Per panel, tiles of [`COLS`]
/// activation rows, the rest one at a time; the tiles ask for the cache lines of `ahead`
/// (the weight rows decoded next, if any), spread over them.
#[allow(private_bounds)]
pub(crate) fn gemm<B: KTile, const ORDER: u8>(
    dec: &[KPanelBlock],
    nb: usize,
    n: usize,
    acts: &[BlockQ8K],
    i0: usize,
    out: &mut [f32],
    cols: OutCols,
    ahead: Ahead,
) {
    if n == 0 || nb == 0 {
        return;
    }
    assert!(cols.c0 + n <= cols.stride, "kq_panel::gemm: output columns");
    let m = out.len() / cols.stride;
    let panels = n.div_ceil(PANEL_ROWS);
    assert!(dec.len() >= panels * nb, "kq_panel::gemm: decoded rows");
    assert!(
        acts.len() >= (i0 + m) * nb,
        "kq_panel::gemm: activation rows"
    );
    let act = |t: usize| &acts[(i0 + t) * nb..(i0 + t + 1) * nb];
    for p in 0..panels {
        let blocks = &dec[p * nb..(p + 1) * nb];
        let r0 = p * PANEL_ROWS;
        let live = PANEL_ROWS.min(n - r0);
        let c = cols.c0 + r0;
        let mut t = 0;
        while t < m {
            let mut o = [[0f32; PANEL_ROWS]; COLS];
            let take = if m - t >= COLS { COLS } else { 1 };
            let mine = ahead.part(t / COLS, m.div_ceil(COLS));
            // SAFETY (each call): the VNNI level was checked at device open.
            unsafe {
                if take == COLS {
                    let y: [&[BlockQ8K]; COLS] = std::array::from_fn(|a| act(t + a));
                    B::tile::<COLS, ORDER>(blocks, &y, &mut o, mine);
                } else {
                    let mut o1 = [[0f32; PANEL_ROWS]; 1];
                    B::tile::<1, ORDER>(blocks, &[act(t)], &mut o1, mine);
                    o[0] = o1[0];
                }
            }
            for (a, v) in o.iter().enumerate().take(take) {
                let at = (t + a) * cols.stride + c;
                put_row(&mut out[at..at + live], v);
            }
            t += take;
        }
    }
}
