//! What the weights repacked at staging (`q4_k::x16`, `q6_k::x16`, `q0::x16`, `mxfp4::x16`) have in common: sixteen
//! rows of one block side by side, and the way back to the file's layout for the rare
//! paths without a kernel for the packed one.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use bytemuck::{Pod, Zeroable};

/// Weight rows per packed block: one per lane of a 512-bit register.
pub(crate) const X16_ROWS: usize = 16;

/// `Debug` for packed blocks: the type's name (their bytes say nothing when printed).
macro_rules! debug_by_name {
    ($($t:ty),+) => {
        $(impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($t))
            }
        })+
    };
}
pub(crate) use debug_by_name;

/// One block of sixteen rows repacked from the file's blocks `Row`.
pub(crate) trait RowGroup: Pod {
    /// The file's block type.
    type Row: Pod;
    /// Row `r` (0..16) back in the file's layout.
    fn unpack_row(&self, r: usize) -> Self::Row;
}

/// A broadcast of four activation quants (bytes `o..o + 4` of `q`), the operand the
/// packed kernels multiply sixteen rows' quant words with.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn bcast4<const N: usize>(q: &[i8; N], o: usize) -> __m512i {
    // One 4-byte load, which the compiler folds into the `vpdpbusd` as a `{1to16}`
    // operand; built from four byte reads, it can stay four byte loads, shifts and ors
    // per broadcast.
    assert!(o + 4 <= N, "bcast4: offset {o} past the block");
    // SAFETY: bytes `o..o + 4` lie within `q` (checked above); read_unaligned takes
    // any alignment.
    _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(q.as_ptr().add(o) as *const i32) })
}

/// Bytes ahead of the packed block being multiplied that the x16 kernels prefetch. A
/// row group's blocks are one sequential stream, but with a few activation rows the
/// kernels take it slower than the hardware prefetcher runs ahead of. On Zen 4 (2
/// threads, from memory) Q8_0 at four rows went from 63 to 94-125 GMAC/s with this, one
/// row from 33 to 41-46 GB/s (1024 bytes ahead gave less, 8192 the same), and a decode
/// step of Gemma 3 270M or of the gpt-oss bench preset took 0.88-0.90 of its time
/// (`ab_test`, docs/benchmarks.md).
#[cfg(target_arch = "x86_64")]
pub(crate) const X16_PREFETCH: usize = 4096;

/// Asks for every cache line of the packed block [`X16_PREFETCH`] bytes after `b` (its
/// group's stream).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<G>(b: &G) {
    prefetch_lines(
        (b as *const G as *const i8).wrapping_add(X16_PREFETCH),
        std::mem::size_of::<G>(),
    );
}

/// The weight bytes a gemm decodes next (the following panels' rows, either layout). A
/// prompt-batch strip asks for them all at once while it decodes the panels before
/// ([`Ahead::all`]); a weight-stationary gemm's tiles ask for the next panel while they
/// multiply the current one: a cache line as each tile starts each weight block, the
/// lines split over the panel's tiles ([`Ahead::part`]). Asked for all at once between two panels, the sixteen rows' lines
/// (a Q8_0 panel of 640-wide rows: 170) exceed the core's outstanding misses and the
/// prefetches themselves stall it; spread over the tiles they arrive while the core
/// multiplies. Gemma 3's tied 262144 x 640 Q8_0 matrix at 16 rows (2 threads, from
/// memory, `kernel_speed`): 111 GMAC/s asked for all at once, 145 spread over the blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ahead {
    at: *const i8,
    lines: usize,
}

impl Ahead {
    /// Nothing to ask for.
    pub(crate) const NONE: Self = Self {
        at: std::ptr::null(),
        lines: 0,
    };

    /// The cache lines `blocks` (contiguous, of any block type) lie on.
    pub(crate) fn of<B>(blocks: &[B]) -> Self {
        let bytes = std::mem::size_of_val(blocks);
        if bytes == 0 {
            return Self::NONE;
        }
        let skew = blocks.as_ptr() as usize % 64;
        Self {
            at: (blocks.as_ptr() as *const i8).wrapping_sub(skew),
            lines: (skew + bytes).div_ceil(64),
        }
    }

    /// Tile `k` of `tiles`' share of the lines.
    pub(crate) fn part(self, k: usize, tiles: usize) -> Self {
        let tiles = tiles.max(1);
        let (l0, l1) = (
            k * self.lines / tiles,
            ((k + 1) * self.lines / tiles).min(self.lines),
        );
        Self {
            at: self.at.wrapping_add(64 * l0),
            lines: l1.saturating_sub(l0),
        }
    }

    /// The lines [`Ahead::block`] asks for at block `i` of `blocks`: `i, i + blocks, ...`.
    /// (A plain counter: `step_by` in the tiles' block loop cost Q8_0 at 16 rows about
    /// a tenth of its speed.)
    #[inline(always)]
    fn lines_at(self, i: usize, blocks: usize) -> impl Iterator<Item = usize> {
        let (end, step) = (self.lines, blocks.max(1));
        let mut next = i;
        std::iter::from_fn(move || {
            (next < end).then(|| {
                next += step;
                next - step
            })
        })
    }

    /// Asks for every line at once.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn all(self) {
        prefetch_lines(self.at, 64 * self.lines);
    }

    /// [`Ahead::block`] into the L2 cache only.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn block_l2(self, i: usize, blocks: usize) {
        for l in self.lines_at(i, blocks) {
            // SAFETY: as in `block`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.at.wrapping_add(64 * l)) };
        }
    }

    /// Asks for this share's lines `i, i + blocks, i + 2 blocks, ...`: called at each of a
    /// tile's `blocks` weight blocks, it asks for every line once.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn block(self, i: usize, blocks: usize) {
        for l in self.lines_at(i, blocks) {
            // SAFETY: SSE is part of x86-64; a prefetch is a hint that reads nothing and
            // faults on no address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.at.wrapping_add(64 * l)) };
        }
    }
}

/// Asks for the cache lines of `len` bytes from `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines(p: *const i8, len: usize) {
    for line in (0..len).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch is a hint that reads nothing and
        // faults on no address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line)) };
    }
}

/// Repacks `rows` (a multiple of 16) file rows of `nb` blocks each, as they lie in a GGUF
/// tensor, into `out` (the same length): row group `g`'s block `i` at `out[g * nb + i]`,
/// built by `put(group block, r, row r's block)` for its sixteen rows. `what` names the
/// layout in the length checks' messages.
pub(crate) fn pack_rows<B, X>(
    src: &[B],
    nb: usize,
    out: &mut [X],
    what: &str,
    put: impl Fn(&mut X, usize, &B),
) {
    assert_eq!(src.len(), out.len() * X16_ROWS, "{what}::pack: lengths");
    assert!(
        nb > 0 && out.len().is_multiple_of(nb),
        "{what}::pack: blocks per row"
    );
    for (gi, dst) in out.iter_mut().enumerate() {
        let (g, i) = (gi / nb, gi % nb);
        for r in 0..X16_ROWS {
            put(dst, r, &src[(g * X16_ROWS + r) * nb + i]);
        }
    }
}

/// Row `r` (0..16) of one row group (`g`: its blocks) in the file's layout, as bytes.
pub(crate) fn unpack_row_bytes<G: RowGroup>(g: &[G], r: usize) -> Vec<u8> {
    let row: Vec<G::Row> = g.iter().map(|b| b.unpack_row(r)).collect();
    bytemuck::cast_slice(&row).to_vec()
}

/// Every row group of `groups` (`nb` blocks per row) back in the file's layout, as bytes.
pub(crate) fn unpack_all<G: RowGroup>(groups: &[G], nb: usize) -> Vec<u8> {
    let mut rows = vec![G::Row::zeroed(); groups.len() * X16_ROWS];
    if nb > 0 {
        for (g, out) in groups.chunks(nb).zip(rows.chunks_mut(nb * X16_ROWS)) {
            for (i, b) in g.iter().enumerate() {
                for r in 0..X16_ROWS {
                    out[r * nb + i] = b.unpack_row(r);
                }
            }
        }
    }
    bytemuck::cast_slice(&rows).to_vec()
}

#[cfg(test)]
mod tests {
    use super::Ahead;

    /// Every cache line of the next panel is asked for exactly once, whatever the number
    /// of tiles and weight blocks (more lines than blocks, fewer lines than tiles, none),
    /// counting the lines a slice starts and ends inside.
    #[test]
    fn ahead_asks_for_every_line_once() {
        let bytes = vec![0u8; 64 * 300];
        for (start, len) in [
            (0usize, 64 * 170),
            (10, 64 * 170 - 5),
            (3, 1),
            (0, 0),
            (63, 130),
        ] {
            let slice = &bytes[start..start + len];
            let a = Ahead::of(slice);
            let skew = slice.as_ptr() as usize % 64;
            let want = if len == 0 {
                0
            } else {
                (skew + len).div_ceil(64)
            };
            assert_eq!(a.lines, want, "start {start} len {len}");
            for (tiles, blocks) in [(8, 20), (4, 2), (1, 1), (300, 4), (3, 400)] {
                let mut seen = vec![0u32; a.lines];
                for k in 0..tiles {
                    let part = a.part(k, tiles);
                    let first = (part.at as usize - a.at as usize) / 64;
                    for i in 0..blocks {
                        for l in part.lines_at(i, blocks) {
                            seen[first + l] += 1;
                        }
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "start {start} len {len} tiles {tiles} blocks {blocks}: {seen:?}"
                );
            }
        }
    }
}
