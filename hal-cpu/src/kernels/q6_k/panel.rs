//! Q6_K's part of the K-quant prompt-batch panels (`kq_panel.rs`): its blocks (file
//! layout and `q6_k/x16.rs`'s) decoded into panel blocks, and its tile in llama.cpp's
//! tiled matmul's order (bit for bit `q6_k::vnni::dot_q6k_tiled`).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel::{
    bsum_pair, decode_groups, lanes, lanes_ps, put, put_ps, sub_block, words16, KPanel,
    KPanelBlock, KTile,
};
use crate::kernels::panel::PANEL_ROWS;
use crate::kernels::q6_k::x16::BlockQ6Kx16;
use crate::kernels::x86::avx512::load64;

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

/// One 256-quant block of a Q6_K row group repacked at staging (`q6_k::x16`) into a panel
/// block: the lanes [`KPanel::decode_block`] gives for its sixteen rows, with no
/// transposes and no row-by-row decoding.
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_q6k_x16_block(b: &BlockQ6Kx16, o: &mut KPanelBlock) {
    for n in 0..2 {
        for l in 0..8 {
            let q = crate::kernels::q6_k::x16::quants(b, n, l);
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
        put(&mut o.sc[s], crate::kernels::q6_k::x16::scale_lanes(b, s));
    }
    for p in 0..8 {
        // (-32 sc_2p, -32 sc_2p+1) as i16, as `q6k_decode_row` puts them.
        let neg = |s: usize| {
            _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_slli_epi32::<5>(crate::kernels::q6_k::x16::scale_lanes(b, s)),
            )
        };
        let pair = _mm512_or_si512(
            _mm512_and_si512(neg(2 * p), m16),
            _mm512_slli_epi32::<16>(neg(2 * p + 1)),
        );
        put(&mut o.pairs[p], pair);
    }
    put_ps(&mut o.d, crate::kernels::q6_k::x16::d_lanes(b));
    put_ps(&mut o.dmin, _mm512_setzero_ps());
}

/// [`decode`](crate::kernels::kq_panel::decode) for a Q6_K weight repacked at staging.
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

/// Q6_K: the sixteen rows of a panel against `A` activation rows in the order of
/// `vnni::dot_q6k_tiled`: per block the exact integer
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

impl KTile for BlockQ6K {
    /// The tiled order for dense and expert rows alike.
    unsafe fn tile<const A: usize, const EXPERT: bool>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { q6k_tile::<A>(panel, y, out) }
    }
}
