//! The prompt-batch gemm of Q8_0, Q5_0 and Q4_0 on AVX-512 VNNI: each weight decoded
//! once per matmul into panels of sixteen rows side by side (`PanelBlock`), multiplied
//! sixteen outputs per instruction in tinyBLAS's order (`tinyblas.rs`, the default) or in
//! llama.cpp's AMX order (`kernels::amx`, where the process has no AMX tiles).

use std::arch::x86_64::*;
use std::borrow::Cow;

use crate::kernels::panel::{for_each_panel, put_row, OutCols, PANEL_ROWS};
use crate::kernels::q0::vnni::{Q0Pair, Q8_0Side};
use crate::kernels::q0::x16::Q0Group;
use crate::kernels::x16::Ahead;
use crate::kernels::x86::avx512::transpose8_halves;
use flint_core::blocks::BlockQ8_0;

/// One 32-quant block of sixteen weight rows (a panel), decoded once for every
/// activation row of a batch ([`q0_gemm`]): `u[j]` holds quants `4j..4j + 4` of the
/// sixteen rows (row `r` in bytes `4r..4r + 4`), unsigned (see [`Q0Pair`]), so one
/// `vpdpbusd` against four broadcast activation quants gives tinyBLAS's lane `j` for
/// sixteen outputs at once; `d` holds the rows' scales widened. Rows past the end of
/// the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct PanelBlock {
    u: [[u8; 64]; 8],
    d: [f32; 16],
}

const _: () = assert!(std::mem::size_of::<PanelBlock>() == 576);

impl PanelBlock {
    /// A zeroed block (scratch space).
    pub(crate) const ZERO: Self = Self {
        u: [[0; 64]; 8],
        d: [0.0; 16],
    };

    /// The block's eight quant registers and its scales.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn load(&self) -> ([__m512i; 8], __m512) {
        // SAFETY: each load reads 64 bytes of this 64-byte aligned block; the caller
        // guarantees AVX-512 F.
        unsafe {
            let w =
                std::array::from_fn(|j| _mm512_load_si512(self.u[j].as_ptr() as *const __m512i));
            (w, _mm512_load_ps(self.d.as_ptr()))
        }
    }
}

/// The activation rows `y` cut to the panel's `nb` blocks (so that the tiles' indexing
/// needs no bounds checks past the first).
#[inline(always)]
fn trimmed<'a, O: Copy, const A: usize>(y: &[Side<'a, O>; A], nb: usize) -> [Side<'a, O>; A] {
    std::array::from_fn(|a| {
        let (q, s, o) = y[a];
        (&q[..nb], &s[..nb], &o[..nb])
    })
}

/// Decodes the weight rows `rows` (at most [`PANEL_ROWS`], each `out.len()` blocks)
/// into panel blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn decode_panel<B: Q0Pair>(rows: &[&[B]], out: &mut [PanelBlock]) {
    assert!(rows.len() <= PANEL_ROWS, "decode_panel: rows");
    const HALF: usize = PANEL_ROWS / 2;
    let zero = _mm256_setzero_si256();
    for (i, o) in out.iter_mut().enumerate() {
        // Row `r`'s quants (eight dwords) in the low half of register `r`, row `r + 8`'s
        // in its high half, rows past the end zero; the transpose in each half then puts
        // dword `j` of row `r` in lane `r` of `u[j]`.
        // SAFETY (`unsigned`): this function's features include what it needs.
        let quants = |r: usize| rows.get(r).map_or(zero, |row| unsafe { row[i].unsigned() });
        let z: [__m512i; HALF] = std::array::from_fn(|r| {
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(quants(r)), quants(r + HALF))
        });
        for (u, v) in o.u.iter_mut().zip(transpose8_halves(z)) {
            // SAFETY: 64 writable bytes, 64-byte aligned.
            unsafe { _mm512_store_si512(u.as_mut_ptr() as *mut __m512i, v) };
        }
        // The rows' f16 scales, four to a 64-bit word in registers: written to memory as
        // sixteen halves and read back as one vector, they would stall on store
        // forwarding once per block.
        let mut words = [0u64; PANEL_ROWS / 4];
        for (r, row) in rows.iter().enumerate() {
            words[r / 4] |= u64::from(row[i].scale_bits()) << (16 * (r % 4));
        }
        let h = _mm256_set_epi64x(
            words[3] as i64,
            words[2] as i64,
            words[1] as i64,
            words[0] as i64,
        );
        // SAFETY: 64 writable bytes, 64-byte aligned.
        unsafe { _mm512_store_ps(o.d.as_mut_ptr(), _mm512_cvtph_ps(h)) };
    }
}

/// Decodes the `n` weight rows of `w` (each `nb` blocks) into panels: panel `p` (rows
/// `16p..16p + 16`) at `dec[p * nb..]`, for the panels `p0..p0 + dec.len() / nb`.
pub(crate) fn q0_decode<B: Q0Pair>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [PanelBlock],
) {
    // SAFETY: the VNNI level (AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C) was checked against
    // the CPU at device open.
    for_each_panel(w, nb, n, p0, dec, |rows, d| unsafe {
        decode_panel(rows, d)
    });
}

/// The panels `p0..p0 + dec.len() / nb` of Q8_0 or Q5_0 rows repacked at staging
/// (`q0::x16`: whole 16-row groups of `nb` blocks): the same panels [`q0_decode`] makes
/// of the file's rows, with no transposes.
pub(crate) fn q0_decode_x16<G: Q0Group>(
    groups: &[G],
    nb: usize,
    p0: usize,
    dec: &mut [PanelBlock],
) {
    // SAFETY: the VNNI level (AVX-512 F/BW, F16C) was checked against the CPU at device
    // open.
    unsafe { decode_x16_blocks(&groups[p0 * nb..p0 * nb + dec.len()], dec) }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
fn decode_x16_blocks<G: Q0Group>(src: &[G], dec: &mut [PanelBlock]) {
    for (o, b) in dec.iter_mut().zip(src) {
        // SAFETY: this function's features include what `lanes` needs.
        let u = unsafe { b.lanes() };
        for (dst, v) in o.u.iter_mut().zip(u) {
            // SAFETY: 64 writable bytes, 64-byte aligned.
            unsafe { _mm512_store_si512(dst.as_mut_ptr() as *mut __m512i, v) };
        }
        // SAFETY: 32 readable bytes in, 64 writable bytes out, 64-byte aligned.
        unsafe {
            let h = _mm256_loadu_si256(b.scale_bits().as_ptr() as *const __m256i);
            _mm512_store_ps(o.d.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
}

/// The sixteen rows of a panel (`panel`: its blocks) against `A` activation rows, in
/// tinyBLAS's order: per output eight f32 lanes, per block
/// `lane j = fma(d_w * d_a, sum of quants 4j..4j + 4, lane j)`, the lanes added as
/// `hsum_ps` adds them, as `vnni::dot_q5_0` and `tinyblas::dot_q0` (bit for bit). A
/// register holds lane `j` of the sixteen rows' outputs, so per block and activation
/// row one scale product serves all eight `vpdpbusd` / conversion / FMA steps, and the
/// side data and the four activation quants of each step are broadcast loads (no
/// register copy): three 512-bit ALU ops per 64 MACs where a register of two outputs'
/// lanes needs five. The side data `l` of an activation row must be its lane sums times
/// minus the weight type's offset. `out[a][r]`: panel row `r` against activation row `a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q0_panel_tile<const A: usize>(
    panel: &[PanelBlock],
    y: &[Q8_0Side<'_>; A],
    out: &mut [[f32; PANEL_ROWS]; A],
    ahead: Ahead,
) {
    let nb = panel.len();
    let ys = trimmed(y, nb);
    let mut acc = [[_mm512_setzero_ps(); 8]; A];
    for (i, b) in panel.iter().enumerate() {
        ahead.block(i, nb);
        // SAFETY: this function's features include AVX-512 F.
        let (w, dw) = unsafe { b.load() };
        for a in 0..A {
            let (q, s, l) = ys[a];
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            let qs = q[i].qs.as_ptr() as *const i32;
            let lanes = &l[i];
            for j in 0..8 {
                // SAFETY: `qs` points at 32 readable quant bytes, `j < 8`;
                // read_unaligned needs no alignment.
                let y4 = unsafe { qs.add(j).read_unaligned() };
                let t =
                    _mm512_dpbusd_epi32(_mm512_set1_epi32(lanes[j]), w[j], _mm512_set1_epi32(y4));
                acc[a][j] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(t), acc[a][j]);
            }
        }
    }
    for a in 0..A {
        let v = &acc[a];
        // hsum_ps: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
        let r = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
            _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])),
        );
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), r) };
    }
}

/// A float order of the panel tiles: what an activation row's side data holds per block
/// ([`Side`]) and the tile that multiplies a panel in that order.
pub(crate) trait Q0Order {
    /// Per block of an activation row, what its integer sums start from.
    type Off: Copy + Send + Sync;
    /// Activation rows per tile (1, 2, 4 or 8): as many as the registers hold.
    const TILE: usize;
    /// Each block's side data for the weight type `B` (offset `16 << B::SHIFT`), from
    /// the activation blocks' `-16 x` lane sums: made once per matmul, not per tile.
    fn offsets<B: Q0Pair>(neg16_lanes: &[[i32; 8]]) -> Cow<'_, [Self::Off]>;
    /// The tile: the sixteen rows of a panel against `A` activation rows
    /// (`out[a][r]`: panel row `r` against activation row `a`), asking for the lines of
    /// `ahead` a block at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    unsafe fn tile<const A: usize>(
        panel: &[PanelBlock],
        y: &[Side<'_, Self::Off>; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    );
}

/// An activation row as the panel tiles read it: its Q8_0 blocks, their scales widened
/// to f32, and per block what the order's integer sums start from ([`Q0Order::Off`]).
pub(crate) type Side<'a, O> = (&'a [BlockQ8_0], &'a [f32], &'a [O]);

/// tinyBLAS's order ([`q0_panel_tile`]): per block eight lane sums, each converted and
/// added on its own; a block's side data is its eight lane sums times minus the weight
/// type's offset.
pub(crate) struct TinyBlas;

impl Q0Order for TinyBlas {
    type Off = [i32; 8];
    /// Sixteen accumulators a row and the eight quant registers: two rows.
    const TILE: usize = 2;
    /// The lane sums times the weight's offset over 16 (`1 << SHIFT`), which the tile
    /// starts each lane from (a shift in the kernel would cost a scalar load, shift and
    /// broadcast per `vpdpbusd`).
    fn offsets<B: Q0Pair>(neg16_lanes: &[[i32; 8]]) -> Cow<'_, [[i32; 8]]> {
        if B::SHIFT == 0 {
            return Cow::Borrowed(neg16_lanes);
        }
        Cow::Owned(
            neg16_lanes
                .iter()
                .map(|l| l.map(|v| v << B::SHIFT))
                .collect(),
        )
    }
    unsafe fn tile<const A: usize>(
        panel: &[PanelBlock],
        y: &[Q8_0Side<'_>; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { q0_panel_tile(panel, y, out, ahead) }
    }
}

/// llama.cpp's AMX order ([`q0_panel_tile_amx`]): per block the exact integer sum of
/// its 32 products, one conversion and one FMA; a block's side data is the sum of its
/// quants times minus the weight type's offset.
pub(crate) struct AmxOrder;

impl Q0Order for AmxOrder {
    type Off = i32;
    /// One accumulator and one sum a row beside the eight quant registers: eight rows,
    /// eight independent chains of `vpdpbusd` per block.
    const TILE: usize = 8;
    /// The block's eight lane sums added, times the weight's offset over 16 (exact: at
    /// most 32 x 128 x 128 in size).
    fn offsets<B: Q0Pair>(neg16_lanes: &[[i32; 8]]) -> Cow<'_, [i32]> {
        Cow::Owned(
            neg16_lanes
                .iter()
                .map(|l| l.iter().sum::<i32>() << B::SHIFT)
                .collect(),
        )
    }
    unsafe fn tile<const A: usize>(
        panel: &[PanelBlock],
        y: &[Side<'_, i32>; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { q0_panel_tile_amx(panel, y, out, ahead) }
    }
}

/// The sixteen rows of a panel against `A` activation rows in the order of llama.cpp's
/// AMX kernels (`flint_core::dot::ggml_x86::vec_dot_q8_0_q8_0_amx` and
/// `vec_dot_q5_0_q8_0_amx`, bit for bit): per block, eight `vpdpbusd` of the panel's
/// quant registers against four broadcast activation quants each, into one register
/// that starts from the block's side data `o` (its quants' sum times minus the weight
/// type's offset), give the sixteen rows' exact block sums; then
/// `acc = fma(sum, d_w * d_a, acc)`, one conversion and one FMA per 512 multiply-adds
/// where tinyBLAS's order needs eight of each. The AMX path's tile on a CPU without AMX
/// tiles (`kernels::amx`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q0_panel_tile_amx<const A: usize>(
    panel: &[PanelBlock],
    y: &[Side<'_, i32>; A],
    out: &mut [[f32; PANEL_ROWS]; A],
    ahead: Ahead,
) {
    let nb = panel.len();
    let ys = trimmed(y, nb);
    let mut acc = [_mm512_setzero_ps(); A];
    for (i, b) in panel.iter().enumerate() {
        ahead.block(i, nb);
        // SAFETY: this function's features include AVX-512 F.
        let (w, dw) = unsafe { b.load() };
        // The rows' block sums side by side, a step of each in turn: `A` independent
        // chains of eight `vpdpbusd` (a chain alone is 40 cycles long).
        let mut t: [__m512i; A] = std::array::from_fn(|a| _mm512_set1_epi32(ys[a].2[i]));
        for (j, wj) in w.iter().enumerate() {
            for (a, ta) in t.iter_mut().enumerate() {
                let qs = ys[a].0[i].qs.as_ptr() as *const i32;
                // SAFETY: `qs` points at 32 readable quant bytes, `j < 8`;
                // read_unaligned needs no alignment.
                let y4 = unsafe { qs.add(j).read_unaligned() };
                *ta = _mm512_dpbusd_epi32(*ta, *wj, _mm512_set1_epi32(y4));
            }
        }
        for a in 0..A {
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(ys[a].1[i]));
            acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[a]), sc, acc[a]);
        }
    }
    for a in 0..A {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
    }
}

/// `out[t * cols.stride + cols.c0 + r] = dot(weight row r, activation row t)` for the
/// `n` weight rows decoded in `dec` (panels of `nb` blocks, [`q0_decode`]) and the
/// activation rows `sides` (`out.len() / cols.stride` of them, their side data in the
/// order `O`'s form), in the order `O` (with [`TinyBlas`], the same results as
/// [`q5_0_rows`](super::vnni::q5_0_rows) / `tinyblas::dot_q0` row by row). Per panel
/// (which stays in L1), tiles of [`Q0Order::TILE`] activation rows (which keeps both
/// multiply pipes busy), the last ones fewer. The tiles ask for the cache lines of `ahead` (the
/// weight rows decoded next, if any), a line per block, spread over the tiles (see
/// [`Ahead`]).
pub(crate) fn q0_gemm<O: Q0Order>(
    dec: &[PanelBlock],
    nb: usize,
    n: usize,
    sides: &[Side<'_, O::Off>],
    out: &mut [f32],
    cols: OutCols,
    ahead: Ahead,
) {
    if n == 0 || nb == 0 {
        return;
    }
    assert!(cols.c0 + n <= cols.stride, "q0_gemm: output columns");
    let m = out.len() / cols.stride;
    assert!(sides.len() >= m, "q0_gemm: activation rows");
    let panels = n.div_ceil(PANEL_ROWS);
    assert!(dec.len() >= panels * nb, "q0_gemm: decoded rows");
    for p in 0..panels {
        let blocks = &dec[p * nb..(p + 1) * nb];
        let r0 = p * PANEL_ROWS;
        let live = PANEL_ROWS.min(n - r0);
        let tile = O::TILE;
        let mut t = 0;
        while t < m {
            let mut o = [[0f32; PANEL_ROWS]; 8];
            // The largest power of two of rows that the tile takes and that are left.
            let take = 1 << (m - t).min(tile).ilog2();
            let mine = ahead.part(t / tile, m.div_ceil(tile));
            let y = &sides[t..t + take];
            // SAFETY (each call): features checked at device open (see `q0_decode`).
            unsafe {
                match take {
                    8 => O::tile::<8>(blocks, y.try_into().expect("8 rows"), &mut o, mine),
                    4 => {
                        let mut o4 = [[0f32; PANEL_ROWS]; 4];
                        O::tile::<4>(blocks, y.try_into().expect("4 rows"), &mut o4, mine);
                        o[..4].copy_from_slice(&o4);
                    }
                    2 => {
                        let mut o2 = [[0f32; PANEL_ROWS]; 2];
                        O::tile::<2>(blocks, &[y[0], y[1]], &mut o2, mine);
                        o[..2].copy_from_slice(&o2);
                    }
                    _ => {
                        let mut o1 = [[0f32; PANEL_ROWS]; 1];
                        O::tile::<1>(blocks, &[y[0]], &mut o1, mine);
                        o[0] = o1[0];
                    }
                }
            }
            for (a, v) in o.iter().enumerate().take(take) {
                let at = (t + a) * cols.stride + cols.c0 + r0;
                put_row(&mut out[at..at + live], v);
            }
            t += take;
        }
    }
}
