//! Q8_0 weights repacked at staging for the decode matmuls on AVX-512 VNNI, as
//! `q4k_x16` does for Q4_K: sixteen rows of one 32-quant block side by side
//! ([`BlockQ8_0x16`], the same 544 bytes as the sixteen [`BlockQ8_0`]s it replaces), so
//! that one `vpdpbusd` of a row-interleaved quant register against four broadcast
//! activation quants gives one tinyBLAS lane of sixteen outputs at once.
//!
//! Why: on the file's layout a few decode rows (`vnni::q0_rows_pairs`) fold each row's
//! lanes apart and convert each row's scale on its own; Gemma 3's tied output matrix
//! (Q8_0, 262144 x 640, 178 MB) took 7.4 ms of a 14.9 ms step at four sequences against
//! 4.1 ms at one, bound by those instructions rather than by memory. The prompt-batch
//! panels (`vnni::PanelBlock`) are this layout already, decoded per call; here the
//! transposition is done once at load.
//!
//! The float steps per output are those of `vnni::q0_rows` (tinyBLAS's order,
//! `docs/parity.md`): per block eight i32 lanes of four quants each,
//! `lane j = fma(d_w * d_a, lane sum, lane j)`, the lanes added as `hsum_ps` adds them.
//! So a repacked weight gives the same bits as the file's layout.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use flint_core::blocks::BlockQ8_0;

#[cfg(target_arch = "x86_64")]
use super::vnni::Q8_0Side;
use super::x16::RowGroup;
pub(crate) use super::x16::X16_ROWS;

/// One 32-quant block of sixteen Q8_0 rows, interleaved.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ8_0x16 {
    /// The rows' `d` (f16 bits). First: the kernels read it first, and a block streams
    /// from memory front to back.
    d: [u16; X16_ROWS],
    /// `qs[t][r]`: quants `4t..4t + 4` of row `r`, each with its sign bit flipped (the
    /// quant plus 128 as an unsigned byte, the operand `vpdpbusd` takes; the kernel's
    /// lane sums start from the activation's lane sums times -128, which takes the
    /// offset back out exactly).
    qs: [[u32; X16_ROWS]; 8],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0x16>() == X16_ROWS * 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl std::fmt::Debug for BlockQ8_0x16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlockQ8_0x16")
    }
}

impl BlockQ8_0x16 {
    /// The quant words `qs[t][r]` (quants `4t..4t + 4` of row `r`, unsigned).
    pub(crate) fn qs_words(&self) -> &[[u32; X16_ROWS]; 8] {
        &self.qs
    }

    /// The rows' scales (f16 bits).
    pub(crate) fn scale_bits(&self) -> &[u16; X16_ROWS] {
        &self.d
    }
}

/// The sign bit of each of four quant bytes.
const SIGNS: u32 = 0x8080_8080;

/// Repacks `rows` (a multiple of 16) Q8_0 rows of `nb` blocks each, as they lie in a
/// GGUF tensor, into `out` (the same length): row group `g`'s block `i` at
/// `out[g * nb + i]`.
pub(crate) fn pack(src: &[BlockQ8_0], nb: usize, out: &mut [BlockQ8_0x16]) {
    assert_eq!(src.len(), out.len() * X16_ROWS, "q8_0_x16::pack: lengths");
    assert!(
        nb > 0 && out.len().is_multiple_of(nb),
        "q8_0_x16::pack: blocks per row"
    );
    for (gi, dst) in out.iter_mut().enumerate() {
        let (g, i) = (gi / nb, gi % nb);
        for r in 0..X16_ROWS {
            let b = &src[(g * X16_ROWS + r) * nb + i];
            dst.d[r] = b.d;
            for (t, q) in b.qs.chunks_exact(4).enumerate() {
                let w = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                dst.qs[t][r] = w ^ SIGNS;
            }
        }
    }
}

impl RowGroup for BlockQ8_0x16 {
    type Row = BlockQ8_0;

    fn unpack_row(&self, r: usize) -> BlockQ8_0 {
        let mut out = BlockQ8_0 {
            d: self.d[r],
            qs: [0; 32],
        };
        for t in 0..8 {
            let w = (self.qs[t][r] ^ SIGNS).to_le_bytes();
            for (o, v) in out.qs[4 * t..4 * t + 4].iter_mut().zip(w) {
                *o = v as i8;
            }
        }
        out
    }
}

/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows (`y[a]`: `nb`
/// Q8_0 blocks each with their f32 scales and lane sums times -128, the weights'
/// offset: [`scaled_lanes`]), in the float order of `vnni::q0_rows` per output.
///
/// A register holds lane `j` of the sixteen rows' outputs, so per block and activation
/// row one scale product serves all eight `vpdpbusd` / conversion / FMA steps, and the
/// four activation quants of each step are a broadcast load.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group<const M: usize>(
    x: &[BlockQ8_0x16],
    y: [Q8_0Side<'_>; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    let nb = x.len();
    for (q, s, l) in &y {
        assert!(
            q.len() >= nb && s.len() >= nb && l.len() >= nb,
            "q8_0_x16::dot_group: lengths"
        );
    }
    let mut acc = [[_mm512_setzero_ps(); 8]; M];
    if M <= 2 {
        rows_over_blocks::<M, 0, M>(x, 0, &y, &mut acc);
    } else {
        // Eight accumulators per activation row: four rows' 32 do not fit in the
        // registers with anything else. So rows 0-1, then the rest, over a few blocks
        // at a time (in L1 by the second pass): two passes over the whole group instead
        // left the memory idle during the second (Gemma 3's output matrix at four
        // rows, one thread: 81 GMAC/s in cache, yet from memory slower than the file's
        // layout).
        for (c, chunk) in x.chunks(CHUNK_BLOCKS).enumerate() {
            let i0 = c * CHUNK_BLOCKS;
            rows_over_blocks::<M, 0, 2>(chunk, i0, &y, &mut acc);
            if M == 3 {
                rows_over_blocks::<M, 2, 1>(chunk, i0, &y, &mut acc);
            } else {
                rows_over_blocks::<M, 2, 2>(chunk, i0, &y, &mut acc);
            }
        }
    }
    for a in 0..M {
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

/// Blocks per pass of [`dot_group`] with three or four activation rows.
const CHUNK_BLOCKS: usize = 4;

/// Activation rows `A0..A0 + N` of `y` against the blocks `x` (blocks `i0..` of the
/// group), added to their accumulators in `acc` (lane `j` of the sixteen outputs per
/// row), in the float order of `vnni::q0_rows`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn rows_over_blocks<const M: usize, const A0: usize, const N: usize>(
    x: &[BlockQ8_0x16],
    i0: usize,
    y: &[Q8_0Side<'_>; M],
    acc: &mut [[__m512; 8]; M],
) {
    // The rows' accumulators in locals for the loop (registers), back at the end.
    let mut loc = [[_mm512_setzero_ps(); 8]; N];
    for (a, l) in loc.iter_mut().enumerate() {
        *l = acc[A0 + a];
    }
    for (di, b) in x.iter().enumerate() {
        let i = i0 + di;
        // SAFETY: `d` is 32 readable bytes; loadu is unaligned.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(b.d.as_ptr() as *const __m256i) });
        for (a, la) in loc.iter_mut().enumerate() {
            let (q, s, l) = y[A0 + a];
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            let qs = &q[i].qs;
            for (j, lj) in la.iter_mut().enumerate() {
                // SAFETY: `qs[j]` is 64 readable bytes; loadu is unaligned.
                let w = unsafe { _mm512_loadu_si512(b.qs[j].as_ptr() as *const __m512i) };
                let init = _mm512_set1_epi32(l[i][j]);
                let t = _mm512_dpbusd_epi32(init, w, super::x16::bcast4(qs, 4 * j));
                *lj = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(t), *lj);
            }
        }
    }
    for (a, l) in loc.iter().enumerate() {
        acc[A0 + a] = *l;
    }
}

/// An activation row's `-16 x` lane sums (`Acts::Q8_0`) times 8: its lane sums times
/// -128, which the kernel starts each lane from (scaled once per call here rather than
/// per block and lane in the kernel, where the shift costs a scalar load, shift and
/// broadcast per `vpdpbusd`).
pub(crate) fn scaled_lanes(neg16: &[[i32; 8]]) -> Vec<[i32; 8]> {
    neg16.iter().map(|l| l.map(|v| v << 3)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::x16_check::{assert_pack_round_trip, lcg};

    fn weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockQ8_0> {
        let mut s = seed;
        (0..rows * nb)
            .map(|_| {
                let mut b = BlockQ8_0 {
                    // Small positive normal f16 scales.
                    d: 0x2000 | (lcg(&mut s) as u16 & 0x3FF),
                    qs: [0; 32],
                };
                // Every byte, the extremes -128 and 127 included.
                b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8 as i8);
                b
            })
            .collect()
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let (rows, nb) = (32, 3);
        assert_pack_round_trip(&weights(rows, nb, 3), nb, pack);
    }

    /// Every output equals `vnni::q0_rows` on the file's layout, bit for bit, for 1 to 4
    /// activation rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_dot_equals_the_file_layout_kernel_bit_for_bit() {
        use crate::kernels::{vnni, Acts};
        use crate::SimdLevel;
        if !(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")) {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let (rows, nb) = (48, 5);
        let k = 32 * nb;
        let w = weights(rows, nb, 17);
        let mut p = vec![<BlockQ8_0x16 as bytemuck::Zeroable>::zeroed(); rows / X16_ROWS * nb];
        pack(&w, nb, &mut p);
        // Four activation rows, one of them with a quant at -128 (its largest value
        // negative) and one far larger than the rest.
        let mut s = 99u64;
        let mut x: Vec<f32> = (0..4 * k)
            .map(|_| (lcg(&mut s) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        x[3] = -7.5;
        x[k + 11] = 300.0;
        let acts =
            Acts::new(SimdLevel::Avx512Vnni, flint_core::GgmlType::Q8_0, &x, k).expect("quantize");
        for m in 1..=4usize {
            let scaled: Vec<Vec<[i32; 8]>> = (0..m)
                .map(|a| scaled_lanes(acts.q8_0_side(a, nb).2))
                .collect();
            let sides: Vec<_> = (0..m)
                .map(|a| {
                    let (q, s, _) = acts.q8_0_side(a, nb);
                    (q, s, &scaled[a][..])
                })
                .collect();
            for (g, grp) in p.chunks(nb).enumerate() {
                let mut out = vec![[0f32; X16_ROWS]; m];
                // SAFETY (each call): AVX-512 VNNI checked above.
                match m {
                    1 => unsafe {
                        dot_group::<1>(grp, [sides[0]], (&mut out[..]).try_into().expect("1"))
                    },
                    2 => unsafe {
                        dot_group::<2>(
                            grp,
                            [sides[0], sides[1]],
                            (&mut out[..]).try_into().expect("2"),
                        )
                    },
                    3 => unsafe {
                        dot_group::<3>(
                            grp,
                            [sides[0], sides[1], sides[2]],
                            (&mut out[..]).try_into().expect("3"),
                        )
                    },
                    _ => unsafe {
                        dot_group::<4>(
                            grp,
                            [sides[0], sides[1], sides[2], sides[3]],
                            (&mut out[..]).try_into().expect("4"),
                        )
                    },
                }
                for (a, col) in out.iter().enumerate() {
                    for (r, got) in col.iter().enumerate() {
                        let row = g * X16_ROWS + r;
                        let mut want = [0f32; 1];
                        // SAFETY: AVX-512 VNNI checked above.
                        unsafe {
                            vnni::q0_rows::<BlockQ8_0, 1, 1, 0>(
                                &w[row * nb..(row + 1) * nb],
                                nb,
                                &[acts.q8_0_side(a, nb)],
                                &mut want,
                                1,
                            )
                        };
                        assert_eq!(
                            got.to_bits(),
                            want[0].to_bits(),
                            "M={m} row {row} act {a}: {got} vs {}",
                            want[0]
                        );
                    }
                }
            }
        }
    }
}
