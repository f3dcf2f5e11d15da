//! Q6_K's part of the K-quant prompt-batch panels (`kq_panel.rs`): its blocks (file
//! layout and `q6_k/x16.rs`'s) decoded into panel blocks, and its tile in llama.cpp's
//! tiled matmul's order (bit for bit `q6_k::vnni::dot_q6k_tiled`).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ6K, BlockQ8K};

use crate::kernels::kq_panel::{
    self, bsum_pair, decode_groups, f16_lanes, header16, lanes, lanes_ps, put, put_ps, sub_block,
    words16, KPanel, KPanelBlock, KTile,
};
use crate::kernels::panel::PANEL_ROWS;
use crate::kernels::q6_k::x16::{self, BlockQ6Kx16};
use crate::kernels::x16::Ahead;
use crate::kernels::x86::avx512::load64;

impl KPanel for BlockQ6K {
    /// All sixteen rows at once: the `ql` and `qh` words transposed (three 16 x 16
    /// transposes) into the lanes a repacked block holds (`q6_k::x16`), then the same
    /// lane-wise steps as [`decode_q6k_x16_block`].
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanelBlock) {
        let live = rows.len();
        assert!(live <= PANEL_ROWS, "decode_block: rows");
        let ql0 = words16(live, |r| load64(&rows[r][i].ql[..64]));
        let ql1 = words16(live, |r| load64(&rows[r][i].ql[64..]));
        let qh = words16(live, |r| load64(&rows[r][i].qh[..]));
        let ql = |t: usize| if t < 16 { ql0[t] } else { ql1[t - 16] };
        // The sixteen scales of each row as four words, transposed: lane `r` of
        // `sw[w]` holds row `r`'s scales `4w..4w + 4`.
        let sw = words16(live, |r| {
            // SAFETY: `scales` is 16 readable bytes; loadu is unaligned.
            _mm512_castsi128_si512(unsafe {
                _mm_loadu_si128(rows[r][i].scales.as_ptr() as *const __m128i)
            })
        });
        let d = header16(live, |r| u32::from(rows[r][i].d));
        emit(
            |n, l| x16::quants_of(ql(16 * n + l), ql(16 * n + 8 + l), qh[8 * n + l]),
            // Byte `s % 4` of word `s / 4`, sign-extended.
            |s| match s % 4 {
                0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(sw[s / 4])),
                1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(sw[s / 4])),
                2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(sw[s / 4])),
                _ => _mm512_srai_epi32::<24>(sw[s / 4]),
            },
            f16_lanes(d),
            o,
        );
    }
}

/// A panel block from sixteen rows' unsigned quants (`quants(n, l)`, as
/// `q6_k::x16::quants` gives them), sub-block scales as i32 lanes (`scale(s)`) and `d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn emit(
    quants: impl Fn(usize, usize) -> [__m512i; 4],
    scale: impl Fn(usize) -> __m512i,
    d: __m512,
    o: &mut KPanelBlock,
) {
    for n in 0..2 {
        for l in 0..8 {
            let q = quants(n, l);
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
        put(&mut o.sc[s], scale(s));
    }
    for p in 0..8 {
        // (-32 sc_2p, -32 sc_2p+1) as i16 (the offset of the unsigned quants).
        let neg =
            |s: usize| _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<5>(scale(s)));
        let pair = _mm512_or_si512(
            _mm512_and_si512(neg(2 * p), m16),
            _mm512_slli_epi32::<16>(neg(2 * p + 1)),
        );
        put(&mut o.pairs[p], pair);
    }
    put_ps(&mut o.d, d);
    put_ps(&mut o.dmin, _mm512_setzero_ps());
}

/// One 256-quant block of a Q6_K row group repacked at staging (`q6_k::x16`) into a panel
/// block: the lanes [`KPanel::decode_block`] gives for its sixteen rows, with no
/// transposes and no row-by-row decoding.
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_q6k_x16_block(b: &BlockQ6Kx16, o: &mut KPanelBlock) {
    emit(
        |n, l| x16::quants(b, n, l),
        |s| x16::scale_lanes(b, s),
        x16::d_lanes(b),
        o,
    );
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
/// `acc = fma(S·d, d_a, acc)`; where `AMX`, llama.cpp's AMX order:
/// `acc = fma(S, d·d_a, acc)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn q6k_tile<const A: usize, const AMX: bool>(
    panel: &[KPanelBlock],
    y: &[&[BlockQ8K]; A],
    out: &mut [[f32; PANEL_ROWS]; A],
    ahead: Ahead,
) {
    let nb = panel.len();
    let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
    let mut acc = [_mm512_setzero_ps(); A];
    for (i, b) in panel.iter().enumerate() {
        ahead.block(i, nb);
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
            if AMX {
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(yb[a].d));
                acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[a]), dd, acc[a]);
            } else {
                let sd = _mm512_mul_ps(_mm512_cvtepi32_ps(s[a]), d);
                acc[a] = _mm512_fmadd_ps(sd, _mm512_set1_ps(yb[a].d), acc[a]);
            }
        }
    }
    for a in 0..A {
        // SAFETY: 16 writable f32; storeu is unaligned.
        unsafe { _mm512_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
    }
}

impl KTile for BlockQ6K {
    /// The tiled order for dense and expert rows alike; the AMX order apart.
    unsafe fn tile<const A: usize, const ORDER: u8>(
        panel: &[KPanelBlock],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL_ROWS]; A],
        ahead: Ahead,
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe {
            if ORDER == kq_panel::AMX {
                q6k_tile::<A, true>(panel, y, out, ahead)
            } else {
                q6k_tile::<A, false>(panel, y, out, ahead)
            }
        }
    }
}
