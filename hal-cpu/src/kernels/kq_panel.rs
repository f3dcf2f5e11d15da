//! The prompt-batch gemm of Q4_K and Q6_K on AVX-512 VNNI: sixteen weight rows in the
//! lanes of each register ("panels", as [`super::vnni::q0_gemm`] does for the legacy
//! quants), in llama.cpp's float orders, bit for bit the same as
//! `vnni::dot_q4k_gemm8` (the repacked `q4_K_8x8` order) and `vnni::dot_q6k_tiled8`
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

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};

use super::avx512::transpose16;
use super::f16_to_f32;
use super::q4k_x16::BlockQ4Kx16;
use super::q6k_x16::{self, BlockQ6Kx16};
use super::vnni::{for_each_panel, put_row};

/// Weight rows per panel: one per lane of a 512-bit register.
pub(crate) const PANEL_ROWS: usize = 16;

/// Activation rows per tile.
const COLS: usize = 4;

/// One 256-quant block of sixteen weight rows, decoded ([`decode`]); rows past the end
/// of the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct KPanelBlock {
    /// Quants `4t..4t + 4` of the sixteen rows (row `r` in bytes `4r..4r + 4`),
    /// unsigned: Q4_K's nibbles as they are, Q6_K's six bits with their offset of 32.
    u: [[u8; 64]; 64],
    /// Per sub-block (Q4_K: 8 of 32 quants; Q6_K: 16 of 16) the rows' scales.
    sc: [[i32; 16]; 16],
    /// Q4_K: per sub-block `s` the rows' mins `m_s` twice as i16 (for `vpdpwssd`
    /// against two `bsums`). Q6_K: per pair `p` of sub-blocks the rows'
    /// `(-32 sc_2p, -32 sc_2p+1)` as i16 (the offset of the unsigned quants, taken off
    /// against the pair's two `bsums`).
    pairs: [[i32; 16]; 8],
    /// The rows' `d`.
    d: [f32; 16],
    /// The rows' `dmin` (Q4_K).
    dmin: [f32; 16],
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
fn words16(live: usize, w: impl Fn(usize) -> __m512i) -> [__m512i; 16] {
    transpose16(std::array::from_fn(|r| {
        if r < live {
            w(r)
        } else {
            _mm512_setzero_si512()
        }
    }))
}

/// Sixteen rows' header word `f(row)` (a u32 per row, 0 past `live`) as lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn header16(live: usize, f: impl Fn(usize) -> u32) -> __m512i {
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
fn f16_lanes(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// Stores 16 lanes into a panel block's row of i32.
#[inline]
#[target_feature(enable = "avx512f")]
fn put(dst: &mut [i32; 16], v: __m512i) {
    // SAFETY: 64 writable bytes, 64-byte aligned.
    unsafe { _mm512_store_si512(dst.as_mut_ptr() as *mut __m512i, v) }
}

/// Stores 16 f32 lanes into a panel block's row of f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn put_ps(dst: &mut [f32; 16], v: __m512) {
    // SAFETY: 64 writable bytes, 64-byte aligned.
    unsafe { _mm512_store_ps(dst.as_mut_ptr(), v) }
}

/// Loads 64 bytes of a block.
#[inline]
#[target_feature(enable = "avx512f")]
fn load64(p: &[u8]) -> __m512i {
    assert!(p.len() >= 64);
    // SAFETY: 64 readable bytes (checked); loadu is unaligned.
    unsafe { _mm512_loadu_si512(p.as_ptr() as *const __m512i) }
}

impl KPanel for BlockQ4K {
    /// All sixteen rows at once: the packed quant words transposed (two 16 x 16
    /// transposes), then split into nibbles (word `8j + u` of `qs` holds quants
    /// `64j + 4u..` in its low nibbles and `64j + 32 + 4u..` in its high ones); the
    /// 6-bit scales and mins unpacked lane-wise as `k4_scale_min` does per row.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanelBlock) {
        let live = rows.len();
        assert!(live <= PANEL_ROWS, "decode_block: rows");
        let p0 = words16(live, |r| load64(&rows[r][i].qs[..64]));
        let p1 = words16(live, |r| load64(&rows[r][i].qs[64..]));
        q4k_nibbles(|t| if t < 16 { p0[t] } else { p1[t - 16] }, o);
        let word = |r: usize, at: usize| {
            let s = &rows[r][i].scales[at..at + 4];
            u32::from_le_bytes([s[0], s[1], s[2], s[3]])
        };
        let dd = header16(live, |r| {
            let b = &rows[r][i];
            u32::from(b.d) | (u32::from(b.dmin) << 16)
        });
        let (s0, s1, s2) = (
            header16(live, |r| word(r, 0)),
            header16(live, |r| word(r, 4)),
            header16(live, |r| word(r, 8)),
        );
        q4k_heads(dd, [s0, s1, s2], o);
    }
}

/// Sixteen Q4_K rows' quant words (`word(t)`: word `t` of `qs` of each row, side by
/// side) split into the panel's unsigned quants: word `8j + u` holds quants `64j + 4u..`
/// in its low nibbles and `64j + 32 + 4u..` in its high ones.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn q4k_nibbles(word: impl Fn(usize) -> __m512i, o: &mut KPanelBlock) {
    let m4 = _mm512_set1_epi8(0x0F);
    for t in 0..32 {
        let v = word(t);
        let (j, u) = (t / 8, t % 8);
        let lo = _mm512_and_si512(v, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        // SAFETY: 64 writable bytes each, 64-byte aligned.
        unsafe {
            _mm512_store_si512(o.u[16 * j + u].as_mut_ptr() as *mut __m512i, lo);
            _mm512_store_si512(o.u[16 * j + 8 + u].as_mut_ptr() as *mut __m512i, hi);
        }
    }
}

/// The lanes of a Q4_K panel block's header from sixteen rows' header words: `dd` lane
/// `r` = row `r`'s `d | dmin << 16`, `s[c]` lane `r` = its scale bytes `4c..4c + 4`; the
/// 6-bit scales and mins unpacked lane-wise as `k4_scale_min` does per row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn q4k_heads(dd: __m512i, s: [__m512i; 3], o: &mut KPanelBlock) {
    let [s0, s1, s2] = s;
    let byte = |v: __m512i, k: u32| {
        _mm512_and_si512(
            _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * k as i32)),
            _mm512_set1_epi32(0xFF),
        )
    };
    let m6 = _mm512_set1_epi32(63);
    let mut mins = [_mm512_setzero_si512(); 8];
    for j in 0..4u32 {
        let (a0, a1, a2) = (byte(s0, j), byte(s1, j), byte(s2, j));
        put(&mut o.sc[j as usize], _mm512_and_si512(a0, m6));
        mins[j as usize] = _mm512_and_si512(a1, m6);
        // Scale / min j + 4: low nibble / high nibble of byte j + 8, top two bits
        // from bytes j / j + 4.
        let sc = _mm512_or_si512(
            _mm512_and_si512(a2, _mm512_set1_epi32(0x0F)),
            _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(a0)),
        );
        let mn = _mm512_or_si512(
            _mm512_srli_epi32::<4>(a2),
            _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(a1)),
        );
        put(&mut o.sc[j as usize + 4], sc);
        mins[j as usize + 4] = mn;
    }
    for (s, m) in mins.iter().enumerate() {
        put(
            &mut o.pairs[s],
            _mm512_or_si512(*m, _mm512_slli_epi32::<16>(*m)),
        );
    }
    put_ps(&mut o.d, f16_lanes(dd));
    put_ps(&mut o.dmin, f16_lanes(_mm512_srli_epi32::<16>(dd)));
}

/// Row `r`'s Q6_K block `b` into the panel block `o` (its quants into `q`, 256 bytes in
/// element order, which [`KPanel::decode_block`] spreads over `o.u`).
fn q6k_decode_row(b: &BlockQ6K, r: usize, q: &mut [u8; 256], o: &mut KPanelBlock) {
    for n in 0..2 {
        let (ql, qh) = (&b.ql[64 * n..64 * n + 64], &b.qh[32 * n..32 * n + 32]);
        let e = 128 * n;
        for l in 0..32 {
            let h = qh[l];
            q[e + l] = (ql[l] & 0x0F) | ((h & 3) << 4);
            q[e + 32 + l] = (ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4);
            q[e + 64 + l] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
            q[e + 96 + l] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    for s in 0..16 {
        o.sc[s][r] = i32::from(b.scales[s]);
    }
    for p in 0..8 {
        let lo = (-32 * i32::from(b.scales[2 * p])) as u16;
        let hi = (-32 * i32::from(b.scales[2 * p + 1])) as u16;
        o.pairs[p][r] = (u32::from(lo) | (u32::from(hi) << 16)) as i32;
    }
    o.d[r] = f16_to_f32(b.d);
}

impl KPanel for BlockQ6K {
    /// Row by row into element order, then the sixteen rows' quant words transposed.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanelBlock) {
        assert!(rows.len() <= PANEL_ROWS, "decode_block: rows");
        *o = KPanelBlock::ZERO;
        let mut q = [[0u8; 256]; PANEL_ROWS];
        for (r, row) in rows.iter().enumerate() {
            q6k_decode_row(&row[i], r, &mut q[r], o);
        }
        // Words 16c..16c + 16 of the sixteen rows, transposed: `u[16c + j]` lane `r`
        // is word `16c + j` of row `r`.
        for c in 0..4 {
            let t = words16(PANEL_ROWS, |r| load64(&q[r][64 * c..]));
            for (j, v) in t.iter().enumerate() {
                // SAFETY: 64 writable bytes, 64-byte aligned.
                unsafe { _mm512_store_si512(o.u[16 * c + j].as_mut_ptr() as *mut __m512i, *v) };
            }
        }
    }
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

/// One 256-quant block of a Q4_K row group repacked at staging (`q4k_x16`) into a
/// panel block: the same lanes as [`KPanel::decode_block`] gives for its sixteen rows,
/// with no transposes (the packed block already holds word `t` of the rows side by side).
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_x16_block(b: &BlockQ4Kx16, o: &mut KPanelBlock) {
    q4k_nibbles(|t| load64(bytemuck::cast_slice(&b.qs_words(t)[..])), o);
    let word = |r: usize, at: usize| {
        u32::from_le_bytes([
            b.head_byte(at, r),
            b.head_byte(at + 1, r),
            b.head_byte(at + 2, r),
            b.head_byte(at + 3, r),
        ])
    };
    let dd = header16(PANEL_ROWS, |r| word(r, 0));
    let s = [
        header16(PANEL_ROWS, |r| word(r, 4)),
        header16(PANEL_ROWS, |r| word(r, 8)),
        header16(PANEL_ROWS, |r| word(r, 12)),
    ];
    q4k_heads(dd, s, o);
}

/// [`decode`] for a weight repacked at staging (`q4k_x16`, `q6k_x16`): panel `p` is row
/// group `p` (`groups[p * nb..]`), for the panels `p0..p0 + dec.len() / nb`, each block
/// turned into a panel block by `block`.
fn decode_groups<G>(
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

/// [`decode`] for a Q4_K weight repacked at staging.
pub(crate) fn decode_x16(groups: &[BlockQ4Kx16], nb: usize, p0: usize, dec: &mut [KPanelBlock]) {
    // SAFETY: the VNNI level (AVX-512 F/BW) was checked against the CPU at device open.
    decode_groups(groups, nb, p0, dec, |b, o| unsafe {
        decode_x16_block(b, o)
    });
}

/// One 256-quant block of a Q6_K row group repacked at staging (`q6k_x16`) into a panel
/// block: the lanes [`KPanel::decode_block`] gives for its sixteen rows, with no
/// transposes and no row-by-row decoding.
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_q6k_x16_block(b: &BlockQ6Kx16, o: &mut KPanelBlock) {
    for n in 0..2 {
        for l in 0..8 {
            let q = q6k_x16::quants(b, n, l);
            for (j, v) in q.iter().enumerate() {
                // SAFETY: 64 writable bytes, 64-byte aligned.
                unsafe {
                    _mm512_store_si512(o.u[32 * n + 8 * j + l].as_mut_ptr() as *mut __m512i, *v)
                };
            }
        }
    }
    let m16 = _mm512_set1_epi32(0xFFFF);
    for s in 0..16 {
        put(&mut o.sc[s], q6k_x16::scale_lanes(b, s));
    }
    for p in 0..8 {
        // (-32 sc_2p, -32 sc_2p+1) as i16, as `q6k_decode_row` puts them.
        let neg = |s: usize| {
            _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_slli_epi32::<5>(q6k_x16::scale_lanes(b, s)),
            )
        };
        let pair = _mm512_or_si512(
            _mm512_and_si512(neg(2 * p), m16),
            _mm512_slli_epi32::<16>(neg(2 * p + 1)),
        );
        put(&mut o.pairs[p], pair);
    }
    put_ps(&mut o.d, q6k_x16::d_lanes(b));
    put_ps(&mut o.dmin, _mm512_setzero_ps());
}

/// [`decode`] for a Q6_K weight repacked at staging.
pub(crate) fn decode_q6k_x16(
    groups: &[BlockQ6Kx16],
    nb: usize,
    p0: usize,
    dec: &mut [KPanelBlock],
) {
    // SAFETY: the VNNI level (AVX-512 F/BW) was checked against the CPU at device open.
    decode_groups(groups, nb, p0, dec, |b, o| unsafe {
        decode_q6k_x16_block(b, o)
    });
}

/// Four activation quants `4t..4t + 4` of `y` as one i32 (for a broadcast operand).
#[inline(always)]
fn quad(y: &BlockQ8K, t: usize) -> i32 {
    let q = &y.qs[4 * t..4 * t + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// Two `bsums` (`2p`, `2p + 1`) of `y` as one i32 (for a broadcast operand).
#[inline(always)]
fn bsum_pair(y: &BlockQ8K, p: usize) -> i32 {
    let (a, b) = (y.bsums[2 * p] as u16, y.bsums[2 * p + 1] as u16);
    (u32::from(a) | (u32::from(b) << 16)) as i32
}

/// The dot products of one sub-block (`T` dwords from dword `t0`) of the panel block's
/// sixteen rows with `A` activation rows, as exact i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn sub_block<const T: usize, const A: usize>(
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
fn lanes(v: &[i32; 16]) -> __m512i {
    // SAFETY: 64 readable bytes, 64-byte aligned.
    unsafe { _mm512_load_si512(v.as_ptr() as *const __m512i) }
}

/// Loads 16 f32 of a panel block.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes_ps(v: &[f32; 16]) -> __m512 {
    // SAFETY: 64 readable bytes, 64-byte aligned.
    unsafe { _mm512_load_ps(v.as_ptr()) }
}

/// Q4_K: the sixteen rows of a panel (`panel`: its blocks) against `A` activation rows
/// in the order of `vnni::dot_q4k_gemm8`: per block, per pair `j` of sub-blocks the
/// exact integers `I_j = sc_2j·dot_2j + sc_2j+1·dot_2j+1` and
/// `M_j = m_2j·bsum_2j + m_2j+1·bsum_2j+1`, then `acc = fma(I_j, d·d_a, acc)` and
/// `mins = fma(M_j, dmin·d_a, mins)`; the result `acc - mins`. `out[a][r]`: panel row
/// `r` against activation row `a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn q4k_tile<const A: usize>(
    panel: &[KPanelBlock],
    y: &[&[BlockQ8K]; A],
    out: &mut [[f32; PANEL_ROWS]; A],
) {
    let nb = panel.len();
    let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
    let mut acc = [_mm512_setzero_ps(); A];
    let mut accm = [_mm512_setzero_ps(); A];
    for (i, b) in panel.iter().enumerate() {
        let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
        let (d, dmin) = (lanes_ps(&b.d), lanes_ps(&b.dmin));
        let mut dd = [_mm512_setzero_ps(); A];
        let mut dm = [_mm512_setzero_ps(); A];
        for a in 0..A {
            dd[a] = _mm512_mul_ps(d, _mm512_set1_ps(yb[a].d));
            dm[a] = _mm512_mul_ps(dmin, _mm512_set1_ps(yb[a].d));
        }
        for j in 0..4 {
            let lo = sub_block::<8, A>(b, 16 * j, &yb);
            let hi = sub_block::<8, A>(b, 16 * j + 8, &yb);
            let (s0, s1) = (lanes(&b.sc[2 * j]), lanes(&b.sc[2 * j + 1]));
            let (m0, m1) = (lanes(&b.pairs[2 * j]), lanes(&b.pairs[2 * j + 1]));
            for a in 0..A {
                let isum =
                    _mm512_add_epi32(_mm512_mullo_epi32(lo[a], s0), _mm512_mullo_epi32(hi[a], s1));
                acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd[a], acc[a]);
                // bsums 4j, 4j + 1 belong to sub-block 2j; 4j + 2, 4j + 3 to 2j + 1.
                let msum = _mm512_dpwssd_epi32(
                    _mm512_madd_epi16(m0, _mm512_set1_epi32(bsum_pair(yb[a], 2 * j))),
                    m1,
                    _mm512_set1_epi32(bsum_pair(yb[a], 2 * j + 1)),
                );
                accm[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), dm[a], accm[a]);
            }
        }
    }
    for a in 0..A {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), _mm512_sub_ps(acc[a], accm[a])) };
    }
}

/// Q6_K: the sixteen rows of a panel against `A` activation rows in the order of
/// `vnni::dot_q6k_tiled8`: per block the exact integer
/// `S = sum_s sc_s·dot_s - 32·sum_s sc_s·bsum_s` (the quants unsigned), then
/// `acc = fma(S·d, d_a, acc)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn q6k_tile<const A: usize>(
    panel: &[KPanelBlock],
    y: &[&[BlockQ8K]; A],
    out: &mut [[f32; PANEL_ROWS]; A],
) {
    let nb = panel.len();
    let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
    let mut acc = [_mm512_setzero_ps(); A];
    for (i, b) in panel.iter().enumerate() {
        let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
        // The offset first: S starts at -32·sum_s sc_s·bsum_s.
        let mut s = [_mm512_setzero_si512(); A];
        for p in 0..8 {
            let c = lanes(&b.pairs[p]);
            for a in 0..A {
                s[a] = _mm512_dpwssd_epi32(s[a], c, _mm512_set1_epi32(bsum_pair(yb[a], p)));
            }
        }
        for sb in 0..16 {
            let dot = sub_block::<4, A>(b, 4 * sb, &yb);
            let sc = lanes(&b.sc[sb]);
            for a in 0..A {
                s[a] = _mm512_add_epi32(s[a], _mm512_mullo_epi32(dot[a], sc));
            }
        }
        let d = lanes_ps(&b.d);
        for a in 0..A {
            let sd = _mm512_mul_ps(_mm512_cvtepi32_ps(s[a]), d);
            acc[a] = _mm512_fmadd_ps(sd, _mm512_set1_ps(yb[a].d), acc[a]);
        }
    }
    for a in 0..A {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
    }
}

/// The tile of one type.
trait KTile: KPanel {
    /// [`q4k_tile`] / [`q6k_tile`] for `A` activation rows.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and FMA.
    unsafe fn tile<const A: usize>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
    );
}

impl KTile for BlockQ4K {
    unsafe fn tile<const A: usize>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { q4k_tile::<A>(panel, y, out) }
    }
}

impl KTile for BlockQ6K {
    unsafe fn tile<const A: usize>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { q6k_tile::<A>(panel, y, out) }
    }
}

/// `out[t * n + r] = dot(weight row r, activation row i0 + t)` for the `n` weight rows
/// decoded in `dec` (panels of `nb` blocks, [`decode`]) and the `out.len() / n`
/// activation rows from `i0` of `acts` (Q8_K, `nb` blocks per row), in llama.cpp's
/// prompt-batch order for `B`. Per panel, tiles of [`COLS`] activation rows, the rest
/// one at a time.
#[allow(private_bounds)]
pub(crate) fn gemm<B: KTile>(
    dec: &[KPanelBlock],
    nb: usize,
    n: usize,
    acts: &[BlockQ8K],
    i0: usize,
    out: &mut [f32],
) {
    if n == 0 || nb == 0 {
        return;
    }
    let m = out.len() / n;
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
        let mut t = 0;
        while t < m {
            let mut o = [[0f32; PANEL_ROWS]; COLS];
            let take = if m - t >= COLS { COLS } else { 1 };
            // SAFETY (each call): the VNNI level was checked at device open.
            unsafe {
                if take == COLS {
                    let y: [&[BlockQ8K]; COLS] = std::array::from_fn(|a| act(t + a));
                    B::tile::<COLS>(blocks, &y, &mut o);
                } else {
                    let mut o1 = [[0f32; PANEL_ROWS]; 1];
                    B::tile::<1>(blocks, &[act(t)], &mut o1);
                    o[0] = o1[0];
                }
            }
            for (a, v) in o.iter().enumerate().take(take) {
                put_row(&mut out[(t + a) * n + r0..(t + a) * n + r0 + live], v);
            }
            t += take;
        }
    }
}
