//! Q6_K weights repacked at staging, as `q4_k::x16` does for Q4_K: sixteen rows of one
//! 256-quant block side by side ([`BlockQ6Kx16`], the same 3360 bytes as the sixteen
//! [`BlockQ6K`]s it replaces), for decode kernels that add four products to sixteen
//! outputs per `vpdpbusd` with no horizontal sums and no per-call decoding, and for a
//! prompt-batch panel decode without transposes.
//!
//! The float steps per output are those of `vnni::dot_q6k_tiled::<1>` (llama.cpp's tiled
//! matmul order, `docs/parity.md`): per block the exact integer
//! `S = sum_s sc_s * sum (q - 32) y` over the 16 sub-blocks of 16 quants (taken as
//! `sc_s * dot(q, y) - 32 * sc_s * bsum_s` with the quants unsigned), then
//! `acc = fma(S * d, d_a, acc)`. So a repacked weight gives the same bits as the file's
//! layout.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use bytemuck::Zeroable;
use flint_core::blocks::{BlockQ6K, BlockQ8K};

#[cfg(target_arch = "x86_64")]
use crate::kernels::x16::bcast4;
use crate::kernels::x16::RowGroup;
pub(crate) use crate::kernels::x16::X16_ROWS;

/// One 256-quant block of sixteen Q6_K rows, interleaved.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ6Kx16 {
    /// `q[8n + l]`: the three words of the sixteen rows that give quants
    /// `128n + 32j + 4l .. + 4` (`j` = 0..4): `[ql word 16n + l, ql word 16n + 8 + l,
    /// qh word 8n + l]`, word `t` being bytes `4t..4t + 4` of the row's `ql` / `qh`. In
    /// the order the kernels read them, so that a block streams from memory front to
    /// back (with `ql` and `qh` apart, three interleaved streams ran at half the speed
    /// from memory).
    q: [[[u32; X16_ROWS]; 3]; 16],
    /// `sc[s][r]`: row `r`'s scale of sub-block `s`.
    sc: [[i8; X16_ROWS]; 16],
    /// The rows' `d` (f16 bits).
    d: [u16; X16_ROWS],
}

const _: () = assert!(std::mem::size_of::<BlockQ6Kx16>() == X16_ROWS * 210);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

crate::kernels::x16::debug_by_name!(BlockQ6Kx16);

fn word(b: &[u8], t: usize) -> u32 {
    u32::from_le_bytes([b[4 * t], b[4 * t + 1], b[4 * t + 2], b[4 * t + 3]])
}

/// Repacks `rows` (a multiple of 16) Q6_K rows of `nb` blocks each, as they lie in a
/// GGUF tensor, into `out` (the same length): row group `g`'s block `i` at
/// `out[g * nb + i]`.
pub(crate) fn pack(src: &[BlockQ6K], nb: usize, out: &mut [BlockQ6Kx16]) {
    crate::kernels::x16::pack_rows(src, nb, out, "q6_k::x16", |dst, r, b| {
        for n in 0..2 {
            for l in 0..8 {
                let e = &mut dst.q[8 * n + l];
                e[0][r] = word(&b.ql, 16 * n + l);
                e[1][r] = word(&b.ql, 16 * n + 8 + l);
                e[2][r] = word(&b.qh, 8 * n + l);
            }
        }
        for s in 0..16 {
            dst.sc[s][r] = b.scales[s];
        }
        dst.d[r] = b.d;
    })
}

impl RowGroup for BlockQ6Kx16 {
    type Row = BlockQ6K;

    fn unpack_row(&self, r: usize) -> BlockQ6K {
        let b = self;
        let mut out = BlockQ6K::zeroed();
        let put = |dst: &mut [u8], t: usize, v: u32| {
            dst[4 * t..4 * t + 4].copy_from_slice(&v.to_le_bytes())
        };
        for n in 0..2 {
            for l in 0..8 {
                let e = &b.q[8 * n + l];
                put(&mut out.ql, 16 * n + l, e[0][r]);
                put(&mut out.ql, 16 * n + 8 + l, e[1][r]);
                put(&mut out.qh, 8 * n + l, e[2][r]);
            }
        }
        for s in 0..16 {
            out.scales[s] = b.sc[s][r];
        }
        out.d = b.d[r];
        out
    }
}

/// The unsigned 6-bit quants of sixteen rows, four per lane, for one `(n, l)` step of a
/// block (`n`: 128-quant half, `l`: quad of `l`s, 0..8): `[q0, q1, q2, q3]` hold
/// quants `128n + 32j + 4l .. + 4` (`j` = 0..4) of every row, i.e. dword
/// `32n + 8j + l` of the row's quants in element order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn quants(b: &BlockQ6Kx16, n: usize, l: usize) -> [__m512i; 4] {
    // SAFETY (each load): 64 readable bytes; loadu is unaligned.
    let e = &b.q[8 * n + l];
    let (a, c, h) = unsafe {
        (
            _mm512_loadu_si512(e[0].as_ptr() as *const __m512i),
            _mm512_loadu_si512(e[1].as_ptr() as *const __m512i),
            _mm512_loadu_si512(e[2].as_ptr() as *const __m512i),
        )
    };
    quants_of(a, c, h)
}

/// [`quants`] from the three words of sixteen rows side by side: `a` (ql word
/// `16n + l`), `c` (ql word `16n + 8 + l`), `h` (qh word `8n + l`), one row per lane
/// (a file-layout panel decode transposes the rows' words into these).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn quants_of(a: __m512i, c: __m512i, h: __m512i) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // (x & 0x0F) | hi, with hi already in bits 4..6: vpternlogd 0xEA = (A & B) | C.
    let merge = |x: __m512i, hi: __m512i| _mm512_ternarylogic_epi32::<0xEA>(x, m4, hi);
    [
        merge(a, _mm512_and_si512(_mm512_slli_epi16::<4>(h), m30)),
        merge(c, _mm512_and_si512(_mm512_slli_epi16::<2>(h), m30)),
        merge(_mm512_srli_epi16::<4>(a), _mm512_and_si512(h, m30)),
        merge(
            _mm512_srli_epi16::<4>(c),
            _mm512_and_si512(_mm512_srli_epi16::<2>(h), m30),
        ),
    ]
}

/// Sub-block `s`'s scales of the sixteen rows, sign-extended to i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn scale_lanes(b: &BlockQ6Kx16, s: usize) -> __m512i {
    // SAFETY: 16 readable bytes; loadu is unaligned.
    _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(b.sc[s].as_ptr() as *const __m128i) })
}

/// The sixteen rows' `d` as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn d_lanes(b: &BlockQ6Kx16) -> __m512 {
    // SAFETY: 32 readable bytes; loadu is unaligned.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(b.d.as_ptr() as *const __m256i) })
}

/// The integer sums `sum_s sc_s * dot_s` of one packed block's sixteen rows against `P`
/// (one or two) activation rows' quants (`yq[a]`: a Q8_K block's `qs`), the quants as
/// stored (unsigned, before the offset of 32).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
fn block_sums<const P: usize>(b: &BlockQ6Kx16, yq: [&[i8; 256]; P]) -> [__m512i; P] {
    let mut total = [_mm512_setzero_si512(); P];
    // Phase (n, h): quads l = 4h..4h + 4, which feed sub-blocks 8n + h + 2j.
    for n in 0..2 {
        for h in 0..2 {
            let z = _mm512_setzero_si512();
            let mut sub = [[z; 4]; P];
            for l in 4 * h..4 * h + 4 {
                let q = quants(b, n, l);
                for a in 0..P {
                    for (j, qj) in q.iter().enumerate() {
                        let o = 128 * n + 32 * j + 4 * l;
                        sub[a][j] = _mm512_dpbusd_epi32(sub[a][j], *qj, bcast4(yq[a], o));
                    }
                }
            }
            for a in 0..P {
                for (j, sj) in sub[a].iter().enumerate() {
                    let s = 8 * n + h + 2 * j;
                    let p = _mm512_mullo_epi32(*sj, scale_lanes(b, s));
                    total[a] = _mm512_add_epi32(total[a], p);
                }
            }
        }
    }
    total
}

/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows (`y[a]`: `nb`
/// Q8_K blocks each), in the float order of `vnni::dot_q6k_tiled::<1>` per output.
///
/// The activation rows go in pairs inside each block: with three or four at once, the
/// sixteen sub-block sums per row outgrow the 32 vector registers. Both pairs are done
/// in one pass over the group rather than one pass per pair: in a second pass, with the
/// group already in L1, nothing would ask the memory for the next group.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group<const M: usize>(
    x: &[BlockQ6Kx16],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    const {
        assert!(
            M >= 1 && M <= 4,
            "q6_k::x16::dot_group: 1 to 4 activation rows"
        )
    };
    let nb = x.len();
    for ya in &y {
        assert_eq!(ya.len(), nb, "q6_k::x16::dot_group: lengths");
    }
    let mut acc = [_mm512_setzero_ps(); M];
    let m16 = _mm512_set1_epi32(0xFFFF);
    for (i, b) in x.iter().enumerate() {
        crate::kernels::x16::prefetch_ahead(b);
        let d = d_lanes(b);
        // The offset of the unsigned quants: 32 * sum_s sc_s * bsum_s, by pairs of
        // sub-blocks (i16 scales against i16 block sums).
        let pairs: [__m512i; 8] = std::array::from_fn(|p| {
            _mm512_or_si512(
                _mm512_and_si512(scale_lanes(b, 2 * p), m16),
                _mm512_slli_epi32::<16>(scale_lanes(b, 2 * p + 1)),
            )
        });
        // The row sums, pairs of rows at constant indices (a loop-carried index would
        // keep the accumulators in memory).
        let mut total = [_mm512_setzero_si512(); M];
        let mut take = |a0: usize, t: &[__m512i]| {
            for (k, v) in t.iter().enumerate() {
                total[a0 + k] = *v;
            }
        };
        match M {
            1 => take(0, &block_sums::<1>(b, [&y[0][i].qs])),
            2 => take(0, &block_sums::<2>(b, [&y[0][i].qs, &y[1][i].qs])),
            3 => {
                take(0, &block_sums::<2>(b, [&y[0][i].qs, &y[1][i].qs]));
                take(2, &block_sums::<1>(b, [&y[2][i].qs]));
            }
            _ => {
                take(0, &block_sums::<2>(b, [&y[0][i].qs, &y[1][i].qs]));
                take(2, &block_sums::<2>(b, [&y[2][i].qs, &y[3][i].qs]));
            }
        }
        for a in 0..M {
            let ya = &y[a][i];
            let bs = &ya.bsums;
            let mut off = _mm512_setzero_si512();
            for (p, pair) in pairs.iter().enumerate() {
                let bp = (bs[2 * p] as u16 as u32 | ((bs[2 * p + 1] as u16 as u32) << 16)) as i32;
                off = _mm512_add_epi32(off, _mm512_madd_epi16(*pair, _mm512_set1_epi32(bp)));
            }
            let s = _mm512_sub_epi32(total[a], _mm512_slli_epi32::<5>(off));
            let sd = _mm512_mul_ps(_mm512_cvtepi32_ps(s), d);
            acc[a] = _mm512_fmadd_ps(sd, _mm512_set1_ps(ya.d), acc[a]);
        }
    }
    for a in 0..M {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::x16_check::{assert_pack_round_trip, lcg};

    fn weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockQ6K> {
        let mut s = seed;
        (0..rows * nb)
            .map(|_| {
                let mut b = BlockQ6K::zeroed();
                b.ql.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                b.qh.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                // The extremes of the i8 scales included.
                b.scales
                    .iter_mut()
                    .for_each(|v| *v = lcg(&mut s) as u8 as i8);
                b.d = 0x2000 | (lcg(&mut s) as u16 & 0x3FF);
                b
            })
            .collect()
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let (rows, nb) = (32, 3);
        assert_pack_round_trip(&weights(rows, nb, 5), nb, pack);
    }

    /// Every output equals `vnni::dot_q6k_tiled::<1>` on the file's layout, bit for bit,
    /// for 1 to 4 activation rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_dot_equals_the_file_layout_kernel_bit_for_bit() {
        use crate::kernels::q6_k::vnni;
        use crate::kernels::x16_check::{assert_packed_matches_file_layout, dispatch_m};
        let nb = 3;
        let reference = |w: &[_], y: &[BlockQ8K]| {
            let mut o = [0f32; 1];
            // SAFETY: the helper runs this only where AVX-512 VNNI is present.
            unsafe { vnni::dot_q6k_tiled::<1>(w, &[y], &mut o) };
            o[0]
        };
        let kernel = |x: &[BlockQ6Kx16], y: &[&[BlockQ8K]], out: &mut [[f32; X16_ROWS]]| {
            dispatch_m!(dot_group, x, y, out)
        };
        let w = weights(32, nb, 9);
        assert_packed_matches_file_layout(&w, nb, pack, 77, &reference, &kernel);
    }
}
