//! Q8_0 weights (and Q5_0 widened to Q8_0 blocks) · Q8_0 activations on AMX tiles, five
//! activation rows or more, in the order of llama.cpp's AMX kernels
//! (`flint_core::dot::ggml_x86::vec_dot_q8_0_q8_0_amx`): for each 32-quant block the
//! exact integer dot product, then `acc = fma(sum, d_w * d_a, acc)`.
//!
//! Q8_0 rows stay in the file's layout: sixteen rows of one block are an A tile of 16
//! rows x 32 bytes read straight from the rows (`tileloadd` with the row length as its
//! stride), so nothing is decoded or repacked; a Q5_0 panel is widened first
//! ([`widen`]). The activation rows, sixteen at a time, are the B tile, in the layout
//! `tdpbssd` takes (row `j` of the tile: quants `4j..4j + 4` of each activation row side
//! by side), built once per matmul ([`AmxActs`]). One `tdpbssd` gives the 16 x 16 block
//! sums; stored to memory, each weight row's sums (a vector over the activation rows) are
//! converted and added to that row's accumulator with one FMA, the AMX step of the next
//! block in flight meanwhile (two sets of tile registers, used by even and odd blocks).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;

use flint_core::blocks::{BlockQ5_0, BlockQ8_0};

use crate::kernels::q0::vnni::Q0Pair;
use crate::kernels::x16::Ahead;

/// A weight type the tiles take: Q8_0 as it lies in the file, Q5_0 widened to Q8_0
/// blocks (its quants `-16..=15` as i8, the same scale) sixteen rows at a time
/// ([`widen`]), which gives the same integer sums.
pub(crate) trait AmxWeight: Q0Pair {
    /// The rows as Q8_0 blocks, where they are ones.
    fn as_q8_0(w: &[Self]) -> Option<&[BlockQ8_0]>;
}

impl AmxWeight for BlockQ8_0 {
    fn as_q8_0(w: &[Self]) -> Option<&[BlockQ8_0]> {
        Some(w)
    }
}

impl AmxWeight for BlockQ5_0 {
    fn as_q8_0(_: &[Self]) -> Option<&[BlockQ8_0]> {
        None
    }
}

/// `dst[j]` = `src[j]` as a Q8_0 block: its quants as i8, its scale.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn widen<B: Q0Pair>(src: &[B], dst: &mut [BlockQ8_0]) {
    let offset = _mm256_set1_epi8((16u32 << B::SHIFT) as u8 as i8);
    for (d, b) in dst.iter_mut().zip(src) {
        // SAFETY: this function's features include what `unsigned` needs; 32 writable
        // bytes, storeu is unaligned.
        unsafe {
            let q = _mm256_sub_epi8(b.unsigned(), offset);
            _mm256_storeu_si256(d.qs.as_mut_ptr() as *mut __m256i, q);
        }
        d.d = b.scale_bits();
    }
}

/// Weight rows per call of [`rows16`] (the rows of an A tile and of a C tile).
pub(crate) const ROWS: usize = 16;

/// The tile configuration (`ldtilecfg`'s 64-byte operand): palette 1, then each tile
/// register's bytes per row and rows.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// The kernel's tiles: `tmm0` / `tmm3` the weights (16 rows x 32 bytes), `tmm1` / `tmm4`
/// the activations (8 rows x 64 bytes), `tmm2` / `tmm5` the sums (16 rows x 16 i32);
/// the first of each pair for even blocks, the second for odd ones.
const CONFIG: TileConfig = {
    let mut c = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut set = 0;
    while set < 2 {
        let t = 3 * set;
        c.colsb[t] = 32;
        c.rows[t] = 16;
        c.colsb[t + 1] = 64;
        c.rows[t + 1] = 8;
        c.colsb[t + 2] = 64;
        c.rows[t + 2] = 16;
        set += 1;
    }
    c
};

thread_local! {
    /// Whether this thread has loaded [`CONFIG`]. Nothing else in the process uses the
    /// tiles, so a thread loads it once and keeps it (as llama.cpp's AMX backend does).
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Loads [`CONFIG`] on this thread if it is not loaded yet.
///
/// # Safety
/// AMX must be usable by this process ([`super::available`]).
unsafe fn configure() {
    if !CONFIGURED.get() {
        // SAFETY: the caller guarantees AMX; the operand is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) &CONFIG as *const TileConfig, options(nostack)) };
        CONFIGURED.set(true);
    }
}

/// One block's tile step: C tile `tmm{c}` zeroed, A tile `tmm{a}` loaded from `$w`
/// (sixteen rows of 32 bytes, `$s` bytes apart), B tile `tmm{b}` from the `BTile` at
/// `$x`, `tdpbssd`, and C stored into the `CTile` at `$p`. Unsafe: AMX configured on this
/// thread ([`CONFIG`]) and the addresses valid for those reads and that write.
macro_rules! tile_block {
    ($a:literal, $b:literal, $c:literal, $w:expr, $s:expr, $x:expr, $p:expr) => {
        asm!(
            concat!("tilezero tmm", $c),
            concat!("tileloadd tmm", $a, ", [{w} + {s}*1]"),
            concat!("tileloadd tmm", $b, ", [{x} + {xs}*1]"),
            concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
            concat!("tilestored [{p} + {xs}*1], tmm", $c),
            w = in(reg) $w,
            s = in(reg) $s,
            x = in(reg) $x,
            xs = in(reg) 64usize,
            p = in(reg) $p,
            options(nostack),
        )
    };
}

/// One block of sixteen activation rows as the B tile takes it: byte `64j + 4c + t` is
/// quant `4j + t` of activation row `c`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct BTile([i8; 512]);

/// The sixteen activation rows' scales of one block, as f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Scales([f32; ROWS]);

/// Activation rows prepared for the tiles once per matmul: per group of sixteen rows
/// (the last one padded with zero rows) and block, the B tile and the scales.
pub(crate) struct AmxActs {
    m: usize,
    nb: usize,
    tiles: Vec<BTile>,
    scales: Vec<Scales>,
}

impl AmxActs {
    /// The activation rows `rows` of `blocks` / `scales` (`nb` blocks a row; `scales`
    /// the blocks' scales as f32).
    pub(crate) fn new(blocks: &[BlockQ8_0], scales: &[f32], rows: &[usize], nb: usize) -> Self {
        let groups = rows.len().div_ceil(ROWS);
        let mut tiles = vec![BTile([0; 512]); groups * nb];
        let mut sc = vec![Scales([0.0; ROWS]); groups * nb];
        for (c, &r) in rows.iter().enumerate() {
            let (g, c) = (c / ROWS, c % ROWS);
            for i in 0..nb {
                let b = &blocks[r * nb + i];
                let t = &mut tiles[g * nb + i].0;
                for j in 0..8 {
                    t[64 * j + 4 * c..64 * j + 4 * c + 4].copy_from_slice(&b.qs[4 * j..4 * j + 4]);
                }
                sc[g * nb + i].0[c] = scales[r * nb + i];
            }
        }
        Self {
            m: rows.len(),
            nb,
            tiles,
            scales: sc,
        }
    }
}

/// Where [`rows16`] writes: activation row `t`'s output for weight row `r` at
/// `t * t_stride + r * r_stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strides {
    pub(crate) t: usize,
    pub(crate) r: usize,
}

/// The sixteen sums of a C tile, stored for the vector steps.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CTile([[i32; ROWS]; ROWS]);

/// `out[t * at.t + r * at.r]` = weight row `r` of `w` (sixteen rows of `acts`' block
/// count, one after another as in the file) · activation row `t` of `acts`, in
/// llama.cpp's AMX order, for every activation row. Asks for the lines of `ahead` (the
/// weight rows multiplied next) into L1 and those of `far` (the ones after) into L2, a
/// share per block.
///
/// # Safety
/// AMX must be usable by this process ([`super::available`]) and the CPU must support
/// AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn rows16(
    w: &[BlockQ8_0],
    acts: &AmxActs,
    out: &mut [f32],
    at: Strides,
    ahead: Ahead,
    far: Ahead,
) {
    let nb = acts.nb;
    assert!(w.len() >= ROWS * nb, "amx rows16: sixteen weight rows");
    if acts.m == 0 {
        return;
    }
    assert!(
        (acts.m - 1) * at.t + (ROWS - 1) * at.r < out.len(),
        "amx rows16: output length"
    );
    // SAFETY: the caller guarantees AMX.
    unsafe { configure() };
    let stride = std::mem::size_of::<BlockQ8_0>() * nb;
    let mut c = [CTile([[0; ROWS]; ROWS]); 2];
    let cp = c.as_mut_ptr();
    let groups = acts.m.div_ceil(ROWS);
    for g in 0..groups {
        let mut acc = [_mm512_setzero_ps(); ROWS];
        for i in 0..nb {
            if g == 0 {
                ahead.block(i, nb);
                far.block_l2(i, nb);
            }
            let a = w[i].qs.as_ptr();
            let b = acts.tiles[g * nb + i].0.as_ptr();
            // SAFETY: AMX is configured on this thread (`configure`); the A tile reads
            // 32 bytes at `a + r * stride` for r < 16 (block `i`'s quants of weight row
            // r, inside `w`), the B tile 512 bytes of a `BTile`, the store writes the
            // 1 KiB `CTile` `c[i % 2]`.
            unsafe {
                if i % 2 == 0 {
                    tile_block!(0, 1, 2, a, stride, b, cp);
                } else {
                    tile_block!(3, 4, 5, a, stride, b, cp.add(1));
                }
            }
            if i > 0 {
                // SAFETY: the tile store of block `i - 1` has completed (the asm block
                // before); features as this function's.
                unsafe {
                    scale_add(
                        w,
                        nb,
                        i - 1,
                        &acts.scales[g * nb + i - 1],
                        &*cp.add((i - 1) % 2),
                        &mut acc,
                    )
                };
            }
        }
        // SAFETY: as above.
        unsafe {
            scale_add(
                w,
                nb,
                nb - 1,
                &acts.scales[g * nb + nb - 1],
                &*cp.add((nb - 1) % 2),
                &mut acc,
            )
        };
        // acc[r] lane t: weight row r against activation row 16 g + t.
        let mut t = [[0f32; ROWS]; ROWS];
        for (dst, a) in t.iter_mut().zip(&acc) {
            // SAFETY: 64 writable bytes; storeu is unaligned.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *a) };
        }
        for c in 0..ROWS.min(acts.m - g * ROWS) {
            let o = (g * ROWS + c) * at.t;
            for (r, row) in t.iter().enumerate() {
                out[o + r * at.r] = row[c];
            }
        }
    }
}

/// Adds block `i`'s sums `c` (weight row `r`'s sums against the sixteen activation rows
/// in `c.0[r]`) to the accumulators: `acc[r] = fma(sum, d_w * d_a, acc[r])`, `d_a` the
/// activation rows' scales `sa`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn scale_add(
    w: &[BlockQ8_0],
    nb: usize,
    i: usize,
    sa: &Scales,
    c: &CTile,
    acc: &mut [__m512; ROWS],
) {
    // SAFETY: `Scales` is 64 bytes, 64-byte aligned.
    let sa = unsafe { _mm512_load_ps(sa.0.as_ptr()) };
    for (r, a) in acc.iter_mut().enumerate() {
        let dw = _mm512_cvtph_ps(_mm256_set1_epi16(w[r * nb + i].d as i16));
        // SAFETY: 64 readable bytes, 64-byte aligned.
        let s = unsafe { _mm512_load_si512(c.0[r].as_ptr() as *const __m512i) };
        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, sa), *a);
    }
}

/// One tile multiply on known data (the availability probe runs it in a child
/// process): whether the sums come out right.
///
/// # Safety
/// The CPU must report AMX-INT8 and this process must hold the tile data permission.
pub(crate) unsafe fn self_test() -> bool {
    let a = BTile([1; 512]);
    let b = BTile([2; 512]);
    let mut c = CTile([[0; ROWS]; ROWS]);
    // SAFETY: the caller guarantees AMX; A reads 16 rows of 32 bytes of `a` (stride 32),
    // B 8 rows of 64 bytes of `b`, the store 1 KiB into `c`.
    unsafe {
        configure();
        tile_block!(
            0,
            1,
            2,
            a.0.as_ptr(),
            32usize,
            b.0.as_ptr(),
            c.0.as_mut_ptr()
        );
    }
    c.0.iter().flatten().all(|&v| v == 64)
}
