//! MXFP4 weights repacked at staging for AVX-512 VNNI, as `q0::x16` does for Q8_0:
//! sixteen rows of one 32-element block side by side ([`BlockMxfp4x16`], the same 272
//! bytes as the sixteen file blocks it replaces), so that a register's lane `r` belongs
//! to row `r` from the nibbles to the accumulator.
//!
//! Why: on the file's layout each row's lanes must be folded into its block sum before
//! the per-block `fma` (`super::x86::rows8_vnni`: a transpose-and-add per block of eight
//! rows, several byte shuffles per row), about 3 multiply-adds per instruction, so a
//! gpt-oss decode step was bound by those instructions rather than by memory. Here the
//! eight `vpdpbusd` of a block all add into one register whose lane `r` is row `r`'s
//! exact block sum: no folding at all.
//!
//! The code book is biased by 12 (`w + 12` in `0..=24`, unsigned, as `vpdpbusd` wants
//! its first operand), and each block's sum starts from `-12` times the activation
//! block's quant sum, so the integer is the exact `sum(w * a)` of the scalar. The float
//! steps per output are the scalar's (`flint_core::dot::ggml_x86::vec_dot_mxfp4_q8_0_repack`,
//! llama.cpp's repacked `mxfp4` gemv): per block `d = D(e) * d_a`, `acc = fma(sum, d,
//! acc)`, in block order. So a repacked weight gives the same bits as the file's layout.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use bytemuck::{Pod, Zeroable};
use flint_core::blocks::{BlockMXFP4, BlockQ8_0};

use crate::kernels::x16::{debug_by_name, pack_rows, RowGroup, X16_ROWS};

/// One 32-element block of sixteen MXFP4 rows: `qs[j]` holds quant bytes `4j..4j + 4`
/// of every row (row `r` at bytes `4r..4r + 4`; low nibbles are elements `4j..4j + 4`,
/// high nibbles elements `16 + 4j..16 + 4j + 4`), `e` the rows' E8M0 scales.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockMxfp4x16 {
    qs: [[u8; 64]; 4],
    e: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockMxfp4x16>() == 16 * 17);

debug_by_name!(BlockMxfp4x16);

impl RowGroup for BlockMxfp4x16 {
    type Row = BlockMXFP4;
    fn unpack_row(&self, r: usize) -> BlockMXFP4 {
        let mut b = BlockMXFP4::zeroed();
        b.e = self.e[r];
        for j in 0..4 {
            b.qs[4 * j..4 * j + 4].copy_from_slice(&self.qs[j][4 * r..4 * r + 4]);
        }
        b
    }
}

/// Repacks whole MXFP4 rows (`src`, a multiple of 16 rows of `nb` blocks) into row
/// groups (`out[g * nb + i]`: group `g`'s block `i`).
pub(crate) fn pack(src: &[BlockMXFP4], nb: usize, out: &mut [BlockMxfp4x16]) {
    pack_rows(src, nb, out, "mxfp4::x16", |x, r, b| {
        x.e[r] = b.e;
        for j in 0..4 {
            x.qs[j][4 * r..4 * r + 4].copy_from_slice(&b.qs[4 * j..4 * j + 4]);
        }
    });
}

/// An activation row as [`dot_group`] takes it: its Q8_0 blocks, their scales widened
/// to f32, and per block `-12` times the sum of its quants ([`bias`]).
pub(crate) type Side<'a> = (&'a [BlockQ8_0], &'a [f32], &'a [i32]);

/// Per activation block, `-12` times the sum of its 32 quants, from the `-16 x` lane sums
/// `Acts::Q8_0` keeps (their total is `-16` times the quant sum).
pub(crate) fn bias(neg16_lanes: &[[i32; 8]]) -> Vec<i32> {
    neg16_lanes
        .iter()
        .map(|l| l.iter().sum::<i32>() / 16 * 12)
        .collect()
}

/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows, in the scalar's
/// float order per output (the module docs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) fn dot_group<const M: usize>(
    x: &[BlockMxfp4x16],
    y: [Side<'_>; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    let nb = x.len();
    for (q, s, b) in &y {
        assert!(
            q.len() >= nb && s.len() >= nb && b.len() >= nb,
            "mxfp4::x16::dot_group: lengths"
        );
    }
    let biased: [i8; 16] = flint_core::dequant::KVALUES_MXFP4.map(|v| v + 12);
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let lut = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(biased.as_ptr() as *const __m128i) });
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); M];
    for (i, blk) in x.iter().enumerate() {
        crate::kernels::x16::prefetch_ahead(blk);
        // The sixteen rows' biased values: `w[j]` lane `r` holds elements `4j..4j + 4`
        // of row `r`.
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            // SAFETY: 64 readable bytes; loadu is unaligned.
            let v = unsafe { _mm512_loadu_si512(blk.qs[j].as_ptr() as *const __m512i) };
            w[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low));
            w[j + 4] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16::<4>(v), low));
        }
        let dw = e8m0_half16(&blk.e);
        for a in 0..M {
            let (q, s, b) = y[a];
            let qs = &q[i].qs;
            let mut sum = _mm512_set1_epi32(b[i]);
            for (j, wj) in w.iter().enumerate() {
                // SAFETY: bytes `4j..4j + 4` of the 32 quant bytes; read_unaligned takes
                // any alignment.
                let y4 = unsafe { (qs.as_ptr().add(4 * j) as *const i32).read_unaligned() };
                sum = _mm512_dpbusd_epi32(sum, *wj, _mm512_set1_epi32(y4));
            }
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(s[i]));
            acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d, acc[a]);
        }
    }
    for a in 0..M {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
    }
}

/// Sixteen E8M0 bytes as `flint_core::dequant::e8m0_to_f32_half` gives each:
/// `(e - 1) << 23` as f32 bits, or the subnormal `0x0020_0000 << e` for `e < 2`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn e8m0_half16(e: &[u8; 16]) -> __m512 {
    // SAFETY: 16 readable bytes; loadu is unaligned.
    let e = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(e.as_ptr() as *const __m128i) });
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::x16_check::{assert_pack_round_trip, lcg};

    /// Random MXFP4 rows: every nibble, and E8M0 scales over a range that includes the
    /// subnormal bytes 0 and 1.
    fn weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockMXFP4> {
        let mut s = seed;
        (0..rows * nb)
            .map(|i| {
                let mut b = BlockMXFP4::zeroed();
                b.e = match i % 7 {
                    0 => 0,
                    1 => 1,
                    2 => 2,
                    _ => 100 + (lcg(&mut s) % 40) as u8,
                };
                b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                b
            })
            .collect()
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let (rows, nb) = (32, 3);
        assert_pack_round_trip(&weights(rows, nb, 3), nb, pack);
    }

    /// For 1 to 4 activation rows, every output of `dot_group` equals the scalar
    /// reference on the file's rows, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_dot_equals_the_scalar_reference_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")) {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let (rows, nb) = (48, 7);
        let k = 32 * nb;
        let w = weights(rows, nb, 17);
        let mut p = vec![BlockMxfp4x16::zeroed(); rows / X16_ROWS * nb];
        pack(&w, nb, &mut p);
        let acts = crate::kernels::x16_check::q8_0_acts(k);
        let biases: Vec<Vec<i32>> = (0..4).map(|a| bias(acts.q8_0_side(a, nb).2)).collect();
        let side = |a: usize| {
            let (q, s, _) = acts.q8_0_side(a, nb);
            (q, s, &biases[a][..])
        };
        for m in 1..=4usize {
            for (g, grp) in p.chunks(nb).enumerate() {
                let mut out = vec![[0f32; X16_ROWS]; m];
                let o = &mut out[..];
                // SAFETY (each call): AVX-512 VNNI and BW were checked above.
                match m {
                    1 => unsafe { dot_group(grp, [side(0)], o.try_into().expect("1")) },
                    2 => unsafe { dot_group(grp, [side(0), side(1)], o.try_into().expect("2")) },
                    3 => unsafe {
                        dot_group(grp, [side(0), side(1), side(2)], o.try_into().expect("3"))
                    },
                    _ => unsafe {
                        let y = [side(0), side(1), side(2), side(3)];
                        dot_group(grp, y, o.try_into().expect("4"))
                    },
                }
                for (a, col) in out.iter().enumerate() {
                    for (r, got) in col.iter().enumerate() {
                        let row = g * X16_ROWS + r;
                        let want = super::super::dot_scalar(
                            &w[row * nb..(row + 1) * nb],
                            acts.q8_0_side(a, nb).0,
                        );
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "M={m} row {row} act {a}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
