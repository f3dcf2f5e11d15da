//! Q8_0 and Q5_0 weights repacked at staging for the decode matmuls on AVX-512 VNNI, as
//! `q4_k::x16` does for Q4_K: sixteen rows of one 32-quant block side by side
//! ([`BlockQ8_0x16`], [`BlockQ5_0x16`]: the same 544 / 352 bytes as the sixteen file
//! blocks they replace), so that one `vpdpbusd` of a row-interleaved quant register
//! against four broadcast activation quants gives one tinyBLAS lane of sixteen outputs at
//! once.
//!
//! Why: on the file's layout a few decode rows (`vnni::q0_rows`, `q0_rows_pairs`) fold
//! each row's lanes apart and widen each row's scale on its own, so that Gemma 3's tied
//! output matrix (Q8_0, 262144 x 640) and its Q5_0 matrices (q, k, gate, up) are bound
//! by those instructions rather than by memory at a few sequences. The prompt-batch panels (`q0::panel::PanelBlock`) are this layout already,
//! decoded per call; here the transposition is done once at load.
//!
//! The float steps per output are those of `vnni::q0_rows` (tinyBLAS's order,
//! `docs/parity.md`): per block eight i32 lanes of four quants each,
//! `lane j = fma(d_w * d_a, lane sum, lane j)`, the lanes added as `hsum_ps` adds them.
//! So a repacked weight gives the same bits as the file's layout.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ5_0, BlockQ8_0};

#[cfg(target_arch = "x86_64")]
use super::vnni::Q8_0Side;
use crate::kernels::x16::RowGroup;
pub(crate) use crate::kernels::x16::X16_ROWS;

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

crate::kernels::x16::debug_by_name!(BlockQ8_0x16);

/// The sign bit of each of four quant bytes.
const SIGNS: u32 = 0x8080_8080;

/// Repacks `rows` (a multiple of 16) Q8_0 rows of `nb` blocks each, as they lie in a
/// GGUF tensor, into `out` (the same length): row group `g`'s block `i` at
/// `out[g * nb + i]`.
pub(crate) fn pack_q8_0(src: &[BlockQ8_0], nb: usize, out: &mut [BlockQ8_0x16]) {
    crate::kernels::x16::pack_rows(src, nb, out, "q0::x16", |dst, r, b| {
        dst.d[r] = b.d;
        for (t, q) in b.qs.chunks_exact(4).enumerate() {
            let w = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
            dst.qs[t][r] = w ^ SIGNS;
        }
    })
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

/// One 32-quant block of sixteen Q5_0 rows, interleaved.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ5_0x16 {
    /// The rows' `d` (f16 bits).
    d: [u16; X16_ROWS],
    /// The rows' `qh` (the fifth bit of quant `q` is bit `q`).
    qh: [u32; X16_ROWS],
    /// `qs[t][r]`: bytes `4t..4t + 4` of row `r`'s `qs` (the low nibbles of quants
    /// `4t..4t + 4` and, above them, of quants `16 + 4t..16 + 4t + 4`).
    qs: [[u32; X16_ROWS]; 4],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0x16>() == X16_ROWS * 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

crate::kernels::x16::debug_by_name!(BlockQ5_0x16);

/// Repacks `rows` (a multiple of 16) Q5_0 rows of `nb` blocks each, as they lie in a
/// GGUF tensor, into `out` (the same length): row group `g`'s block `i` at
/// `out[g * nb + i]`.
pub(crate) fn pack_q5_0(src: &[BlockQ5_0], nb: usize, out: &mut [BlockQ5_0x16]) {
    crate::kernels::x16::pack_rows(src, nb, out, "q0::x16", |dst, r, b| {
        dst.d[r] = b.d;
        dst.qh[r] = u32::from_le_bytes(b.qh);
        for (t, q) in b.qs.chunks_exact(4).enumerate() {
            dst.qs[t][r] = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
        }
    })
}

impl RowGroup for BlockQ5_0x16 {
    type Row = BlockQ5_0;

    fn unpack_row(&self, r: usize) -> BlockQ5_0 {
        let mut out = BlockQ5_0 {
            d: self.d[r],
            qh: self.qh[r].to_le_bytes(),
            qs: [0; 16],
        };
        for t in 0..4 {
            out.qs[4 * t..4 * t + 4].copy_from_slice(&self.qs[t][r].to_le_bytes());
        }
        out
    }
}

/// A repacked legacy 32-quant block of sixteen rows, as the kernels here take it.
pub(crate) trait Q0Group: RowGroup + Sync {
    /// The rows' scales (f16 bits).
    fn scale_bits(&self) -> &[u16; X16_ROWS];

    /// `[j]`: quants `4j..4j + 4` of the sixteen rows (row `r` in bytes `4r..4r + 4`)
    /// plus the type's offset (128 for Q8_0, 16 for Q5_0), as unsigned bytes: tinyBLAS's
    /// lane `j`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW.
    #[cfg(target_arch = "x86_64")]
    unsafe fn lanes(&self) -> [__m512i; 8];
}

impl Q0Group for BlockQ8_0x16 {
    fn scale_bits(&self) -> &[u16; X16_ROWS] {
        &self.d
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes(&self) -> [__m512i; 8] {
        // SAFETY (the whole body): each `q` is 64 readable bytes (loadu is unaligned);
        // the caller guarantees AVX-512 F.
        unsafe {
            let mut out = [_mm512_setzero_si512(); 8];
            for (o, q) in out.iter_mut().zip(&self.qs) {
                *o = _mm512_loadu_si512(q.as_ptr() as *const __m512i);
            }
            out
        }
    }
}

impl Q0Group for BlockQ5_0x16 {
    fn scale_bits(&self) -> &[u16; X16_ROWS] {
        &self.d
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes(&self) -> [__m512i; 8] {
        // SAFETY (the whole body): every load reads 64 bytes of `self` (loadu is
        // unaligned); the caller guarantees AVX-512 F/BW.
        unsafe {
            let m4 = _mm512_set1_epi8(0x0F);
            let b16 = _mm512_set1_epi8(0x10);
            let qh = _mm512_loadu_si512(self.qh.as_ptr() as *const __m512i);
            let mut out = [_mm512_setzero_si512(); 8];
            for t in 0..4 {
                let w = _mm512_loadu_si512(self.qs[t].as_ptr() as *const __m512i);
                out[t] = _mm512_and_si512(w, m4);
                out[t + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
            }
            for (j, o) in out.iter_mut().enumerate() {
                // The fifth bits of quants 4j..4j + 4 are bits 4j..4j + 4 of `qh`: its
                // byte j / 2 copied to all four bytes of the row's lane (`vpshufb`
                // picks within 128-bit lanes: row 4d + e of a lane has its bytes at
                // 4e..4e + 4), then byte b tested against bit b of that nibble and 16
                // added where set.
                let p = (j / 2) as u8;
                let idx: [u8; 64] = std::array::from_fn(|i| (i % 16) as u8 / 4 * 4 + p);
                let spread =
                    _mm512_shuffle_epi8(qh, _mm512_loadu_si512(idx.as_ptr() as *const __m512i));
                let s = 4 * (j % 2) as u32;
                let bits =
                    _mm512_set1_epi32(i32::from_le_bytes([1u8 << s, 2u8 << s, 4u8 << s, 8u8 << s]));
                let k = _mm512_test_epi8_mask(spread, bits);
                *o = _mm512_mask_add_epi8(*o, k, *o, b16);
            }
            out
        }
    }
}

/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows (`y[a]`: `nb`
/// Q8_0 blocks each with their f32 scales and lane sums times minus the weight type's
/// offset: `q0::panel::TinyBlas`'s `offsets`), in the
/// float order of `vnni::q0_rows` per output.
///
/// A register holds lane `j` of the sixteen rows' outputs, so per block and activation
/// row one scale product serves all eight `vpdpbusd` / conversion / FMA steps, and the
/// four activation quants of each step are a broadcast load.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group<G: Q0Group, const M: usize>(
    x: &[G],
    y: [Q8_0Side<'_>; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    let nb = x.len();
    for (q, s, l) in &y {
        assert!(
            q.len() >= nb && s.len() >= nb && l.len() >= nb,
            "q0::x16::dot_group: lengths"
        );
    }
    let mut acc = [[_mm512_setzero_ps(); 8]; M];
    if M <= 2 {
        rows_over_blocks::<G, M, 0, M>(x, 0, &y, &mut acc);
    } else {
        // Eight accumulators per activation row: four rows' 32 do not fit in the
        // registers with anything else. So rows 0-1, then the rest, over a few blocks
        // at a time (in L1 by the second pass): two passes over the whole group would
        // leave the memory idle during the second.
        for (c, chunk) in x.chunks(CHUNK_BLOCKS).enumerate() {
            let i0 = c * CHUNK_BLOCKS;
            rows_over_blocks::<G, M, 0, 2>(chunk, i0, &y, &mut acc);
            if M == 3 {
                rows_over_blocks::<G, M, 2, 1>(chunk, i0, &y, &mut acc);
            } else {
                rows_over_blocks::<G, M, 2, 2>(chunk, i0, &y, &mut acc);
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

/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows (`y[a]`: `nb`
/// Q8_0 blocks each with their f32 scales and per block its quants' sum times minus the
/// weight type's offset), in llama.cpp's AMX order (the decode kernel of
/// `q0::panel::AmxOrder`, the same bits as its panels): per block eight `vpdpbusd` into
/// the sixteen rows' exact block sums, one conversion, one FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group_amx<G: Q0Group, const M: usize>(
    x: &[G],
    y: [crate::kernels::q0::panel::Side<'_, i32>; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    let nb = x.len();
    for (q, s, o) in &y {
        assert!(
            q.len() >= nb && s.len() >= nb && o.len() >= nb,
            "q0::x16::dot_group_amx: lengths"
        );
    }
    let mut acc = [_mm512_setzero_ps(); M];
    for (i, b) in x.iter().enumerate() {
        crate::kernels::x16::prefetch_ahead(b);
        // SAFETY: 32 readable bytes; loadu is unaligned.
        let dw = _mm512_cvtph_ps(unsafe {
            _mm256_loadu_si256(b.scale_bits().as_ptr() as *const __m256i)
        });
        // SAFETY: this function's features include AVX-512 F/BW.
        let u = unsafe { b.lanes() };
        for (a, acc_a) in acc.iter_mut().enumerate() {
            let (q, s, o) = y[a];
            let qs = &q[i].qs;
            // Two chains of four (`q0::panel::q0_panel_tile_amx` says why).
            let mut t = [_mm512_set1_epi32(o[i]), _mm512_setzero_si512()];
            for (j, uj) in u.iter().enumerate() {
                let y4 = crate::kernels::x16::bcast4(qs, 4 * j);
                t[j / 4] = _mm512_dpbusd_epi32(t[j / 4], *uj, y4);
            }
            let t = _mm512_add_epi32(t[0], t[1]);
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            *acc_a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sc, *acc_a);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
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
fn rows_over_blocks<G: Q0Group, const M: usize, const A0: usize, const N: usize>(
    x: &[G],
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
        if A0 == 0 {
            // The first pass over a block asks for the stream ahead.
            crate::kernels::x16::prefetch_ahead(b);
        }
        // SAFETY: 32 readable bytes; loadu is unaligned.
        let dw = _mm512_cvtph_ps(unsafe {
            _mm256_loadu_si256(b.scale_bits().as_ptr() as *const __m256i)
        });
        // SAFETY: this function's features include AVX-512 F/BW.
        let u = unsafe { b.lanes() };
        for (a, la) in loc.iter_mut().enumerate() {
            let (q, s, l) = y[A0 + a];
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            let qs = &q[i].qs;
            for (j, lj) in la.iter_mut().enumerate() {
                let init = _mm512_set1_epi32(l[i][j]);
                let t = _mm512_dpbusd_epi32(init, u[j], crate::kernels::x16::bcast4(qs, 4 * j));
                *lj = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(t), *lj);
            }
        }
    }
    for (a, l) in loc.iter().enumerate() {
        acc[A0 + a] = *l;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::x16_check::{assert_pack_round_trip, lcg};

    /// Small positive normal f16 scales.
    fn scale(s: &mut u64) -> u16 {
        0x2000 | (lcg(s) as u16 & 0x3FF)
    }

    fn q8_0_weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockQ8_0> {
        let mut s = seed;
        (0..rows * nb)
            .map(|_| {
                let mut b = BlockQ8_0 {
                    d: scale(&mut s),
                    qs: [0; 32],
                };
                // Every byte, the extremes -128 and 127 included.
                b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8 as i8);
                b
            })
            .collect()
    }

    fn q5_0_weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockQ5_0> {
        let mut s = seed;
        (0..rows * nb)
            .map(|_| {
                let mut b = BlockQ5_0 {
                    d: scale(&mut s),
                    qh: (lcg(&mut s) as u32).to_le_bytes(),
                    qs: [0; 16],
                };
                b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                b
            })
            .collect()
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let (rows, nb) = (32, 3);
        assert_pack_round_trip(&q8_0_weights(rows, nb, 3), nb, pack_q8_0);
        assert_pack_round_trip(&q5_0_weights(rows, nb, 4), nb, pack_q5_0);
    }

    /// For 1 to 4 activation rows, every output of `dot_group` on `w` packed by `pack`
    /// has the bits of `vnni::q0_rows` on the file's layout.
    #[cfg(target_arch = "x86_64")]
    fn assert_packed_matches_q0_rows<B: crate::kernels::q0::vnni::Q0Pair, G: Q0Group<Row = B>>(
        w: &[B],
        rows: usize,
        nb: usize,
        pack: fn(&[B], usize, &mut [G]),
    ) {
        use crate::kernels::q0::vnni;
        let k = 32 * nb;
        let mut p = vec![G::zeroed(); rows / X16_ROWS * nb];
        pack(w, nb, &mut p);
        let acts = crate::kernels::x16_check::q8_0_acts(k);
        // The side data as the kernels take it: the `-16 x` lane sums shifted by the
        // type's `SHIFT` (`q0::panel::TinyBlas`'s `offsets`).
        let lanes: Vec<Vec<[i32; 8]>> = (0..4)
            .map(|a| {
                let l = acts.q8_0_side(a, nb).2;
                l.iter().map(|v| v.map(|x| x << B::SHIFT)).collect()
            })
            .collect();
        for m in 1..=4usize {
            let sides: Vec<_> = (0..m)
                .map(|a| {
                    let (q, s, _) = acts.q8_0_side(a, nb);
                    (q, s, &lanes[a][..])
                })
                .collect();
            for (g, grp) in p.chunks(nb).enumerate() {
                let mut out = vec![[0f32; X16_ROWS]; m];
                let o = &mut out[..];
                // SAFETY (each call): the caller checked AVX-512 VNNI.
                match m {
                    1 => unsafe { dot_group(grp, [sides[0]], o.try_into().expect("1")) },
                    2 => unsafe { dot_group(grp, [sides[0], sides[1]], o.try_into().expect("2")) },
                    3 => unsafe {
                        let y = [sides[0], sides[1], sides[2]];
                        dot_group(grp, y, o.try_into().expect("3"))
                    },
                    _ => unsafe {
                        let y = [sides[0], sides[1], sides[2], sides[3]];
                        dot_group(grp, y, o.try_into().expect("4"))
                    },
                }
                for (a, col) in out.iter().enumerate() {
                    for (r, got) in col.iter().enumerate() {
                        let row = g * X16_ROWS + r;
                        let mut want = [0f32; 1];
                        // SAFETY: the caller checked AVX-512 VNNI.
                        unsafe {
                            vnni::q0_rows::<B, 1, 1, 0>(
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

    /// Every output equals `vnni::q0_rows` on the file's layout, bit for bit, for 1 to 4
    /// activation rows, for both types.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_dot_equals_the_file_layout_kernel_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")) {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let (rows, nb) = (48, 5);
        assert_packed_matches_q0_rows(&q8_0_weights(rows, nb, 17), rows, nb, pack_q8_0);
        assert_packed_matches_q0_rows(&q5_0_weights(rows, nb, 18), rows, nb, pack_q5_0);
    }
}
