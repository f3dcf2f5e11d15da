//! Q4_K's part of the K-quant prompt-batch panels (`kq_panel.rs`): its blocks (file
//! layout and `q4_k/x16.rs`'s) decoded into panel blocks, and its tile in llama.cpp's
//! repacked `q4_K_8x8` order (bit for bit `q4_k::vnni::dot_q4k_gemm`).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ4K, BlockQ8K};

use crate::kernels::kq_panel::{
    self, bsum_pair, decode_groups, f16_lanes, header16, lanes, lanes_ps, put, put_ps, sub_block,
    words16, KPanel, KPanelBlock, KTile,
};
use crate::kernels::panel::PANEL_ROWS;
use crate::kernels::q4_k::x16::BlockQ4Kx16;
use crate::kernels::x16::Ahead;
use crate::kernels::x86::avx512::load64;

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

/// One 256-quant block of a Q4_K row group repacked at staging (`q4_k::x16`) into a
/// panel block: the same lanes as [`KPanel::decode_block`] gives for its sixteen rows,
/// with no transposes (the packed block already holds word `t` of the rows side by side).
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_x16_block(b: &BlockQ4Kx16, o: &mut KPanelBlock) {
    q4k_nibbles(
        |t| load64::<u8>(bytemuck::cast_slice(&b.qs_words(t)[..])),
        o,
    );
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

/// [`decode`](crate::kernels::kq_panel::decode) for a Q4_K weight repacked at staging.
pub(crate) fn decode_x16(groups: &[BlockQ4Kx16], nb: usize, p0: usize, dec: &mut [KPanelBlock]) {
    // SAFETY: the VNNI level (AVX-512 F/BW) was checked against the CPU at device open.
    decode_groups(groups, nb, p0, dec, |b, o| unsafe {
        decode_x16_block(b, o)
    });
}

/// Q4_K: the sixteen rows of a panel (`panel`: its blocks) against `A` activation rows
/// in the order of `vnni::dot_q4k_gemm`: per block, per pair `j` of sub-blocks the
/// exact integers `I_j = sc_2j·dot_2j + sc_2j+1·dot_2j+1` and
/// `M_j = m_2j·bsum_2j + m_2j+1·bsum_2j+1`, then `acc = fma(I_j, d·d_a, acc)` and
/// `mins = fma(M_j, dmin·d_a, mins)`; the result `acc - mins`. `out[a][r]`: panel row
/// `r` against activation row `a`. Without `GEMM`, the gemv order
/// (`vnni::dot_q4k_gemv`): one `fma` each per block, with the whole block's integers.
/// Where `AMX` (without `GEMM`), llama.cpp's AMX order: the same whole-block integers,
/// `acc = fma(I, d·d_a, acc)` then `acc = fma(-M, dmin·d_a, acc)` into the one sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn q4k_tile<const A: usize, const GEMM: bool, const AMX: bool>(
    panel: &[KPanelBlock],
    y: &[&[BlockQ8K]; A],
    out: &mut [[f32; PANEL_ROWS]; A],
    ahead: Ahead,
) {
    let nb = panel.len();
    let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
    let mut acc = [_mm512_setzero_ps(); A];
    let mut accm = [_mm512_setzero_ps(); A];
    for (i, b) in panel.iter().enumerate() {
        ahead.block(i, nb);
        let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
        let (d, dmin) = (lanes_ps(&b.d), lanes_ps(&b.dmin));
        let mut dd = [_mm512_setzero_ps(); A];
        let mut dm = [_mm512_setzero_ps(); A];
        for a in 0..A {
            dd[a] = _mm512_mul_ps(d, _mm512_set1_ps(yb[a].d));
            dm[a] = _mm512_mul_ps(dmin, _mm512_set1_ps(yb[a].d));
        }
        // The gemv order's whole-block integers (exact sums of the pairs').
        let mut iblock = [_mm512_setzero_si512(); A];
        let mut mblock = [_mm512_setzero_si512(); A];
        for j in 0..4 {
            let lo = sub_block::<8, A>(b, 16 * j, &yb);
            let hi = sub_block::<8, A>(b, 16 * j + 8, &yb);
            let (s0, s1) = (lanes(&b.sc[2 * j]), lanes(&b.sc[2 * j + 1]));
            let (m0, m1) = (lanes(&b.pairs[2 * j]), lanes(&b.pairs[2 * j + 1]));
            // The gemm's `I_j` in floats, exactly: `|dot| <= 32 * 15 * 128`, scales
            // below 64, so each product and their sum stay below 2^24 (integer
            // multiplies are two uops on the port `vpdpbusd` needs).
            let (f0, f1) = (_mm512_cvtepi32_ps(s0), _mm512_cvtepi32_ps(s1));
            for a in 0..A {
                // bsums 4j, 4j + 1 belong to sub-block 2j; 4j + 2, 4j + 3 to 2j + 1.
                let msum = _mm512_dpwssd_epi32(
                    _mm512_madd_epi16(m0, _mm512_set1_epi32(bsum_pair(yb[a], 2 * j))),
                    m1,
                    _mm512_set1_epi32(bsum_pair(yb[a], 2 * j + 1)),
                );
                if GEMM {
                    let isum = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(lo[a]),
                        f0,
                        _mm512_mul_ps(_mm512_cvtepi32_ps(hi[a]), f1),
                    );
                    acc[a] = _mm512_fmadd_ps(isum, dd[a], acc[a]);
                    accm[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), dm[a], accm[a]);
                } else {
                    let isum = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo[a], s0),
                        _mm512_mullo_epi32(hi[a], s1),
                    );
                    iblock[a] = _mm512_add_epi32(iblock[a], isum);
                    mblock[a] = _mm512_add_epi32(mblock[a], msum);
                }
            }
        }
        if AMX {
            for a in 0..A {
                acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblock[a]), dd[a], acc[a]);
                acc[a] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mblock[a]), dm[a], acc[a]);
            }
        } else if !GEMM {
            for a in 0..A {
                acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblock[a]), dd[a], acc[a]);
                accm[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mblock[a]), dm[a], accm[a]);
            }
        }
    }
    for a in 0..A {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), _mm512_sub_ps(acc[a], accm[a])) };
    }
}

impl KTile for BlockQ4K {
    unsafe fn tile<const A: usize, const ORDER: u8>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    ) {
        // SAFETY (each): the caller guarantees the features.
        match ORDER {
            kq_panel::EXPERT => unsafe { q4k_tile::<A, false, false>(panel, y, out, ahead) },
            kq_panel::AMX => unsafe { q4k_tile::<A, false, true>(panel, y, out, ahead) },
            _ => unsafe { q4k_tile::<A, true, false>(panel, y, out, ahead) },
        }
    }
}
