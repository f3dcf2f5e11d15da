//! Q4_K weights repacked at staging time for the decode matmuls on AVX-512 VNNI: sixteen
//! rows of one 256-quant block side by side ([`BlockQ4Kx16`], the same 2304 bytes as
//! the sixteen [`BlockQ4K`]s it replaces), so that one `vpdpbusd` of a row-interleaved
//! quant register against four broadcast activation quants adds four products to sixteen
//! outputs at once, with no horizontal sums and no per-call decoding.
//!
//! Why: the decode (M = 1 to a few rows) kernels on the file's layout
//! ([`super::vnni::dot_q4k_rows4`] and its gemv form) spend most of their instructions folding each row's
//! partial sums across lanes, and run below the memory's share of each core. The prompt-batch panels (`kq_panel.rs`) avoid the
//! folding by decoding sixteen rows into lanes once per matmul, which a decode step
//! cannot afford. Repacking once at load does the same transposition for free at run
//! time. (llama.cpp's CPU backend repacks Q4_K for the same reason: `q4_K_8x8`.)
//!
//! The float steps per output are those of `vnni::dot_q4k_gemm::<1>` (llama.cpp's
//! repacked gemm order, `docs/parity.md`): per pair `j` of 32-quant sub-blocks the exact
//! integers `I_j = sc_2j·dot_2j + sc_2j+1·dot_2j+1` and `M_j = m_2j·bs_2j + m_2j+1·bs_2j+1`,
//! then `acc = fma(I_j, d·d_a, acc)`, `mins = fma(M_j, dmin·d_a, mins)`, result
//! `acc - mins`. So a repacked weight gives the same bits as the file's layout.
//! [`dot_group_gemv`] does the same in the gemv order (`vnni::dot_q4k_gemv::<1>`: one
//! `fma` each per block), for the rows of expert towers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

#[cfg(target_arch = "x86_64")]
use crate::kernels::x16::bcast4;
use crate::kernels::x16::RowGroup;
pub(crate) use crate::kernels::x16::X16_ROWS;

/// One 256-quant block of sixteen Q4_K rows, interleaved.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ4Kx16 {
    /// `hdr[b][r]`: byte `b` of row `r`'s 16-byte head (`d`, `dmin`, `scales`). First:
    /// the kernels read it first, and a block streams from memory front to back.
    hdr: [[u8; X16_ROWS]; 16],
    /// `qs[t][r]`: bytes `4t..4t + 4` of row `r`'s `qs` (eight nibbles: quants
    /// `l..l + 4` of sub-blocks `2j` (low) and `2j + 1` (high), `j = t / 8`,
    /// `l = 4 (t % 8)`).
    qs: [[u32; X16_ROWS]; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ4Kx16>() == X16_ROWS * 144);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

crate::kernels::x16::debug_by_name!(BlockQ4Kx16);

impl BlockQ4Kx16 {
    /// Word `t` (bytes `4t..4t + 4` of `qs`) of the sixteen rows.
    pub(crate) fn qs_words(&self, t: usize) -> &[u32; X16_ROWS] {
        &self.qs[t]
    }

    /// Byte `at` of row `r`'s 16-byte head (`d`, `dmin`, `scales`).
    pub(crate) fn head_byte(&self, at: usize, r: usize) -> u8 {
        self.hdr[at][r]
    }
}

/// The 16-byte head of a Q4_K block (`d`, `dmin`, `scales`) as bytes.
fn head_bytes(b: &BlockQ4K) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..2].copy_from_slice(&b.d.to_le_bytes());
    h[2..4].copy_from_slice(&b.dmin.to_le_bytes());
    h[4..].copy_from_slice(&b.scales);
    h
}

/// Repacks `rows` (a multiple of 16) Q4_K rows of `nb` blocks each, as they lie in a
/// GGUF tensor, into `out` (the same length): row group `g`'s block `i` at
/// `out[g * nb + i]`.
pub(crate) fn pack(src: &[BlockQ4K], nb: usize, out: &mut [BlockQ4Kx16]) {
    crate::kernels::x16::pack_rows(src, nb, out, "q4_k::x16", |dst, r, b| {
        for (t, q) in b.qs.chunks_exact(4).enumerate() {
            dst.qs[t][r] = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
        }
        for (k, v) in head_bytes(b).into_iter().enumerate() {
            dst.hdr[k][r] = v;
        }
    })
}

impl RowGroup for BlockQ4Kx16 {
    type Row = BlockQ4K;

    fn unpack_row(&self, r: usize) -> BlockQ4K {
        let b = self;
        let h: [u8; 16] = std::array::from_fn(|k| b.hdr[k][r]);
        let mut out = BlockQ4K {
            d: u16::from_le_bytes([h[0], h[1]]),
            dmin: u16::from_le_bytes([h[2], h[3]]),
            scales: [0; 12],
            qs: [0; 128],
        };
        out.scales.copy_from_slice(&h[4..]);
        for t in 0..32 {
            out.qs[4 * t..4 * t + 4].copy_from_slice(&b.qs[t][r].to_le_bytes());
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
/// The rows' scales and mins of one packed block, widened to lanes.
struct Scales {
    /// Per sub-block `s`: the sixteen rows' `sc_s` as i32.
    sc: [__m512i; 8],
    /// Per pair `j`: the rows' `m_2j | m_2j+1 << 16` (for `vpmaddwd` against the pair's
    /// two activation sums).
    mins: [__m512i; 4],
    /// The rows' `d` and `dmin` as f32.
    d: __m512,
    dmin: __m512,
}

#[cfg(target_arch = "x86_64")]
/// Unpacks the six-bit scales and mins of sixteen rows (`get_scale_min_k4` in lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
fn scales(b: &BlockQ4Kx16) -> Scales {
    // SAFETY: `hdr` is 256 readable bytes; loadu is unaligned.
    let h: [__m512i; 4] = std::array::from_fn(|k| unsafe {
        _mm512_loadu_si512(b.hdr[4 * k..].as_ptr() as *const __m512i)
    });
    // h[1] = scales bytes 0..4 (rows in each 16-byte lane), h[2] = 4..8, h[3] = 8..12.
    let m63 = _mm512_set1_epi8(63);
    let m15 = _mm512_set1_epi8(15);
    let m48 = _mm512_set1_epi8(48);
    // The top two bits of a byte moved to bits 4..6 (the neighbour byte's bits masked).
    let top2 = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<2>(v), m48);
    let sc_lo = _mm512_and_si512(h[1], m63);
    let m_lo = _mm512_and_si512(h[2], m63);
    let sc_hi = _mm512_or_si512(_mm512_and_si512(h[3], m15), top2(h[1]));
    let m_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16::<4>(h[3]), m15),
        top2(h[2]),
    );
    let lane = |v: __m512i, k: usize| -> __m128i {
        match k {
            0 => _mm512_castsi512_si128(v),
            1 => _mm512_extracti32x4_epi32::<1>(v),
            2 => _mm512_extracti32x4_epi32::<2>(v),
            _ => _mm512_extracti32x4_epi32::<3>(v),
        }
    };
    let sc: [__m512i; 8] = std::array::from_fn(|s| {
        let v = if s < 4 { sc_lo } else { sc_hi };
        _mm512_cvtepu8_epi32(lane(v, s % 4))
    });
    let mins: [__m512i; 4] = std::array::from_fn(|j| {
        let v = if j < 2 { m_lo } else { m_hi };
        let (a, c) = (lane(v, 2 * (j % 2)), lane(v, 2 * (j % 2) + 1));
        _mm512_or_si512(
            _mm512_cvtepu8_epi32(a),
            _mm512_slli_epi32::<16>(_mm512_cvtepu8_epi32(c)),
        )
    });
    let h0 = _mm512_castsi512_si128(h[0]);
    let (d_lo, d_hi) = (h0, _mm512_extracti32x4_epi32::<1>(h[0]));
    let (m_lo8, m_hi8) = (
        _mm512_extracti32x4_epi32::<2>(h[0]),
        _mm512_extracti32x4_epi32::<3>(h[0]),
    );
    let halfs = |lo: __m128i, hi: __m128i| {
        _mm512_cvtph_ps(_mm256_set_m128i(
            _mm_unpackhi_epi8(lo, hi),
            _mm_unpacklo_epi8(lo, hi),
        ))
    };
    Scales {
        sc,
        mins,
        d: halfs(d_lo, d_hi),
        dmin: halfs(m_lo8, m_hi8),
    }
}

/// The activation's sums of sub-blocks `2j` and `2j + 1` (`j` = 0..4) as the low and high
/// i16 of one i32 each: the operand of the mins' `vpmaddwd`. Each sum is at most
/// 2 x 32 x 128 in magnitude, so i16 holds it and `phaddw` of the sixteen block sums
/// gives all four at once. Written out and inlined: as a `std::array::from_fn` closure
/// it stays a call per activation row and block, and every call spills the
/// accumulators around a `vzeroupper`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn sub_block_pair_sums(y: &BlockQ8K) -> [i32; 4] {
    // SAFETY: `bsums` is 16 readable i16 (32 bytes); loadu is unaligned.
    let (lo, hi) = unsafe {
        let p = y.bsums.as_ptr() as *const __m128i;
        (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)))
    };
    let mut out = [0i32; 4];
    // SAFETY: 16 writable bytes; storeu is unaligned.
    unsafe { _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, _mm_hadd_epi16(lo, hi)) };
    out
}

#[cfg(target_arch = "x86_64")]
/// `out[a][r] = dot(row r of the group, activation row a)` for the sixteen rows of one
/// row group (`x`: its `nb` packed blocks) against `M` activation rows (`y[a]`: `nb`
/// Q8_K blocks each), in the float order of `vnni::dot_q4k_gemm::<1>` per output.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group<const M: usize>(
    x: &[BlockQ4Kx16],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    dot_group_llama::<M, true>(x, y, out)
}

#[cfg(target_arch = "x86_64")]
/// [`dot_group`] in the float order of llama.cpp's repacked gemv
/// (`vnni::dot_q4k_gemv::<1>` per output: one `fma` each for `acc` and `mins` per block,
/// with the whole block's integers), the order of its expert matmuls.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_group_gemv<const M: usize>(
    x: &[BlockQ4Kx16],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    dot_group_llama::<M, false>(x, y, out)
}

#[cfg(target_arch = "x86_64")]
/// [`dot_group`] (`GEMM`: one `fma` per pair of sub-blocks) or [`dot_group_gemv`] (one
/// per block).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn dot_group_llama<const M: usize, const GEMM: bool>(
    x: &[BlockQ4Kx16],
    y: [&[BlockQ8K]; M],
    out: &mut [[f32; X16_ROWS]; M],
) {
    let nb = x.len();
    for ya in &y {
        assert_eq!(ya.len(), nb, "q4_k::x16::dot_group: lengths");
    }
    let m4 = _mm512_set1_epi8(0x0F);
    let mf0 = _mm512_set1_epi8(0xF0_u8 as i8);
    let mut acc = [_mm512_setzero_ps(); M];
    let mut accm = [_mm512_setzero_ps(); M];
    for (i, b) in x.iter().enumerate() {
        crate::kernels::x16::prefetch_ahead(b);
        let s = scales(b);
        // Per activation row: the sums of sub-blocks (2j, 2j + 1) as i16 pairs.
        let mut bpair = [[0i32; 4]; M];
        for (a, p) in bpair.iter_mut().enumerate() {
            *p = sub_block_pair_sums(&y[a][i]);
        }
        let dy: [__m512; M] = std::array::from_fn(|a| _mm512_set1_ps(y[a][i].d));
        // The gemv order's whole-block integers (exact sums of the pairs').
        let mut iblock = [_mm512_setzero_si512(); M];
        let mut mblock = [_mm512_setzero_si512(); M];
        for j in 0..4 {
            // Two accumulators per sub-block and activation row (even and odd `l`), so
            // that the dependent `vpdpbusd` chains are half as long.
            let z = _mm512_setzero_si512();
            let mut lo = [[z; 2]; M];
            let mut hi = [[z; 2]; M];
            // `l` in pairs with the accumulator index a constant: a loop-carried index
            // keeps the accumulators in memory.
            for lp in 0..4 {
                let mut step = |l: usize, c: usize| {
                    // SAFETY: `qs[8j + l]` is 64 readable bytes; loadu is unaligned.
                    let w =
                        unsafe { _mm512_loadu_si512(b.qs[8 * j + l].as_ptr() as *const __m512i) };
                    let wl = _mm512_and_si512(w, m4);
                    // The high quants in place, sixteen times their value (at most 240,
                    // still an unsigned byte): the sums are divided by 16 exactly below,
                    // and a shift per load is saved.
                    let wh = _mm512_and_si512(w, mf0);
                    for a in 0..M {
                        let q = &y[a][i].qs;
                        let o = 64 * j + 4 * l;
                        lo[a][c] = _mm512_dpbusd_epi32(lo[a][c], wl, bcast4(q, o));
                        hi[a][c] = _mm512_dpbusd_epi32(hi[a][c], wh, bcast4(q, o + 32));
                    }
                };
                // Past two activation rows the rows' chains are independent enough.
                step(2 * lp, 0);
                step(2 * lp + 1, if M <= 2 { 1 } else { 0 });
            }
            for a in 0..M {
                let dot_lo = _mm512_add_epi32(lo[a][0], lo[a][1]);
                // Sixteen times the high sub-block's sum, divided exactly.
                let dot_hi = _mm512_srai_epi32::<4>(_mm512_add_epi32(hi[a][0], hi[a][1]));
                let isum = _mm512_add_epi32(
                    _mm512_mullo_epi32(dot_lo, s.sc[2 * j]),
                    _mm512_mullo_epi32(dot_hi, s.sc[2 * j + 1]),
                );
                let msum = _mm512_madd_epi16(s.mins[j], _mm512_set1_epi32(bpair[a][j]));
                if !GEMM {
                    iblock[a] = _mm512_add_epi32(iblock[a], isum);
                    mblock[a] = _mm512_add_epi32(mblock[a], msum);
                    continue;
                }
                acc[a] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s.d, dy[a]), acc[a]);
                accm[a] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(msum),
                    _mm512_mul_ps(s.dmin, dy[a]),
                    accm[a],
                );
            }
        }
        if !GEMM {
            for a in 0..M {
                acc[a] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(iblock[a]),
                    _mm512_mul_ps(s.d, dy[a]),
                    acc[a],
                );
                accm[a] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(mblock[a]),
                    _mm512_mul_ps(s.dmin, dy[a]),
                    accm[a],
                );
            }
        }
    }
    for a in 0..M {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), _mm512_sub_ps(acc[a], accm[a])) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::x16_check::{assert_pack_round_trip, lcg};

    fn weights(rows: usize, nb: usize, seed: u64) -> Vec<BlockQ4K> {
        let mut s = seed;
        (0..rows * nb)
            .map(|_| {
                let mut b = BlockQ4K {
                    // Small positive normal f16 scales.
                    d: 0x2000 | (lcg(&mut s) as u16 & 0x3FF),
                    dmin: 0x1C00 | (lcg(&mut s) as u16 & 0x3FF),
                    scales: [0; 12],
                    qs: [0; 128],
                };
                b.scales.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                b.qs.iter_mut().for_each(|v| *v = lcg(&mut s) as u8);
                b
            })
            .collect()
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let (rows, nb) = (32, 3);
        assert_pack_round_trip(&weights(rows, nb, 7), nb, pack);
    }

    /// Every output equals `vnni::dot_q4k_gemm::<1>` on the file's layout, bit for bit,
    /// for 1 to 4 activation rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_dot_equals_the_file_layout_kernel_bit_for_bit() {
        use crate::kernels::q4_k::vnni;
        use crate::kernels::x16_check::{assert_packed_matches_file_layout, dispatch_m};
        let nb = 4;
        let reference = |w: &[_], y: &[BlockQ8K]| {
            let mut o = [0f32; 1];
            // SAFETY: the helper runs this only where AVX-512 VNNI is present.
            unsafe { vnni::dot_q4k_gemm::<1>(w, &[y], &mut o) };
            o[0]
        };
        let kernel = |x: &[BlockQ4Kx16], y: &[&[BlockQ8K]], out: &mut [[f32; X16_ROWS]]| {
            dispatch_m!(dot_group, x, y, out)
        };
        let w = weights(48, nb, 11);
        assert_packed_matches_file_layout(&w, nb, pack, 100, &reference, &kernel);
    }
}
