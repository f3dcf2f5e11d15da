//! IQ4_XS's part of the eight-row prompt-batch panels (`kq_panel_avx2.rs`; every x86
//! level from AVX2 up): its blocks decoded into panel blocks (the code book looked up
//! once per matmul), and its tile in the scalar reference's order (bit for bit
//! [`super::avx2::dot_iq4xs`], the row kernels of every level).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4XS, BlockQ8K};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::kq_panel::quad;
use crate::kernels::kq_panel_avx2::{lanes8, lanes8_ps, q8k_acts, KPanel8, KPanel8Block};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::{codebook, load32i};

impl KPanel8 for BlockIQ4XS {
    q8k_acts!();

    /// Per row and 32-element sub-block `ib` the code-book values (signed bytes) in
    /// element order, each group of eight dwords transposed across the rows; per
    /// sub-block the rows' `ls - 32` (in `sc[ib]`, plain i32); `d`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, _mm256_setzero_si256());
    }

    /// Per block and sub-block `ib` the integer `S_ib` of the eight rows by `vpdpbusd`
    /// (the codes stored plus 128 as unsigned bytes, [`Self::decode_block_vnni`];
    /// each accumulator starts from `-128` times the sub-block's activation sum, from
    /// its two block sums: exact), then the float steps of [`Self::tile`].
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn tile_vnni<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        let nb = panel.len();
        let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
        let mut acc = [_mm256_setzero_ps(); A];
        for (i, b) in panel.iter().enumerate() {
            let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
            let dwa: [__m256; A] =
                std::array::from_fn(|a| _mm256_mul_ps(lanes8_ps(&b.d), _mm256_set1_ps(yb[a].d)));
            for ib in 0..8 {
                let mut s: [__m256i; A] = std::array::from_fn(|a| {
                    let sum = i32::from(yb[a].bsums[2 * ib]) + i32::from(yb[a].bsums[2 * ib + 1]);
                    _mm256_set1_epi32(-128 * sum)
                });
                for t in 8 * ib..8 * ib + 8 {
                    // SAFETY: 32 readable bytes, 32-byte aligned.
                    let w = unsafe { _mm256_load_si256(b.u[t].as_ptr() as *const __m256i) };
                    for a in 0..A {
                        s[a] = _mm256_dpbusd_epi32(s[a], w, _mm256_set1_epi32(quad(yb[a], t)));
                    }
                }
                let ls = _mm256_cvtepi32_ps(lanes8(&b.sc[ib]));
                for a in 0..A {
                    acc[a] = _mm256_add_ps(acc[a], sub_block_term(dwa[a], ls, s[a]));
                }
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }

    const VNNI: bool = true;

    /// [`Self::decode_block`] with the codes plus 128 (unsigned bytes, for `vpdpbusd`).
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_block_vnni(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, _mm256_set1_epi8(-128));
    }

    /// Per block and sub-block `ib` the exact integer `S_ib` of the eight rows (per
    /// dword: the activation's magnitudes against the codes with the activation's signs,
    /// `vpmaddubsw`, then `vpmaddwd` by ones), then `sum = sum + ((d_w·d_a)·(ls - 32))·
    /// S_ib`: products and an add, no `fma`, sub-blocks in order.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[BlockQ8K]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        let nb = panel.len();
        let ys: [&[BlockQ8K]; A] = std::array::from_fn(|a| &y[a][..nb]);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        for (i, b) in panel.iter().enumerate() {
            let yb: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a][i]);
            // The activations' magnitudes (as unsigned bytes: 128 for -128), broadcast
            // from memory below (`black_box`: not shuffled out of registers).
            let mut mag = [[0u8; 256]; A];
            for a in 0..A {
                for c in 0..8 {
                    let v = _mm256_abs_epi8(load32i(&yb[a].qs[32 * c..]));
                    // SAFETY: 32 writable bytes; storeu is unaligned.
                    unsafe {
                        _mm256_storeu_si256(mag[a][32 * c..].as_mut_ptr() as *mut __m256i, v)
                    };
                }
            }
            let mag = std::hint::black_box(&mag);
            let dwa: [__m256; A] =
                std::array::from_fn(|a| _mm256_mul_ps(lanes8_ps(&b.d), _mm256_set1_ps(yb[a].d)));
            for ib in 0..8 {
                let mut s = [_mm256_setzero_si256(); A];
                for t in 8 * ib..8 * ib + 8 {
                    // SAFETY: 32 readable bytes, 32-byte aligned.
                    let w = unsafe { _mm256_load_si256(b.u[t].as_ptr() as *const __m256i) };
                    for a in 0..A {
                        let m = &mag[a][4 * t..4 * t + 4];
                        let aa = _mm256_set1_epi32(i32::from_le_bytes([m[0], m[1], m[2], m[3]]));
                        let sw = _mm256_sign_epi8(w, _mm256_set1_epi32(quad(yb[a], t)));
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aa, sw), ones);
                        s[a] = _mm256_add_epi32(s[a], p);
                    }
                }
                let ls = _mm256_cvtepi32_ps(lanes8(&b.sc[ib]));
                for a in 0..A {
                    acc[a] = _mm256_add_ps(acc[a], sub_block_term(dwa[a], ls, s[a]));
                }
            }
        }
        for a in 0..A {
            // SAFETY: 8 writable f32; storeu is unaligned.
            unsafe { _mm256_storeu_ps(out[a].as_mut_ptr(), acc[a]) };
        }
    }
}

/// Decodes block `i` of up to eight IQ4_XS rows into `o` ([`KPanel8::decode_block`]), the
/// codes XORed with `bias` (zero: signed bytes; 0x80 in every byte: plus 128, unsigned).
///
/// Per sub-block the rows' 16 packed bytes are transposed by dwords before the look-up
/// (row `r` and `r + 4` in the halves of one register, a 4 x 4 dword transposition per
/// 128-bit lane): raw dword `j` of the eight rows then decodes to element dwords `j`
/// (low nibbles) and `j + 4` (high nibbles), already in the panel's layout. The scales
/// and `d`s are decoded eight rows at a time, one row a lane. Lanes past `rows.len()` are
/// zero.
#[target_feature(enable = "avx2,fma,f16c")]
fn decode(rows: &[&[BlockIQ4XS]], i: usize, o: &mut KPanel8Block, bias: __m256i) {
    let lut = codebook(&KVALUES_IQ4NL);
    let m4 = _mm256_set1_epi8(0x0F);
    let n = rows.len().min(PANEL8_ROWS);
    // All ones in the dword lanes of the rows present.
    let live = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    // Each row's packed quants (zeros past the rows).
    const NONE: [u8; 128] = [0; 128];
    let mut qs = [&NONE; PANEL8_ROWS];
    for (q, row) in qs.iter_mut().zip(rows) {
        *q = &row[i].qs;
    }
    for ib in 0..8 {
        let at = 16 * ib;
        // y[p]: rows p (low half) and p + 4 (high half).
        // (Written out: a closure here is not always inlined, and then passes each
        // register through memory.)
        let y = [
            halves(&qs[4][at..], &qs[0][at..]),
            halves(&qs[5][at..], &qs[1][at..]),
            halves(&qs[6][at..], &qs[2][at..]),
            halves(&qs[7][at..], &qs[3][at..]),
        ];
        let a01 = _mm256_unpacklo_epi32(y[0], y[1]);
        let b01 = _mm256_unpackhi_epi32(y[0], y[1]);
        let a23 = _mm256_unpacklo_epi32(y[2], y[3]);
        let b23 = _mm256_unpackhi_epi32(y[2], y[3]);
        // t[j]: raw dword j of rows 0..4 (low half) and 4..8 (high half).
        let t = [
            _mm256_unpacklo_epi64(a01, a23),
            _mm256_unpackhi_epi64(a01, a23),
            _mm256_unpacklo_epi64(b01, b23),
            _mm256_unpackhi_epi64(b01, b23),
        ];
        for (j, &tj) in t.iter().enumerate() {
            let lo = look_up(lut, tj, m4, bias, live);
            let hi = look_up(lut, _mm256_srli_epi16::<4>(tj), m4, bias, live);
            // SAFETY: 32 writable bytes each, 32-byte aligned.
            unsafe {
                _mm256_store_si256(o.u[8 * ib + j].as_mut_ptr() as *mut __m256i, lo);
                _mm256_store_si256(o.u[8 * ib + 4 + j].as_mut_ptr() as *mut __m256i, hi);
            }
        }
    }
    // One row a lane: the packed low scale bits, the high bits, `d`.
    let mut sl = [0i32; PANEL8_ROWS];
    let mut sh = [0i32; PANEL8_ROWS];
    let mut dh = [0u16; PANEL8_ROWS];
    for (r, row) in rows.iter().take(PANEL8_ROWS).enumerate() {
        let b = &row[i];
        (sl[r], sh[r], dh[r]) = (i32::from_le_bytes(b.scales_l), i32::from(b.scales_h), b.d);
    }
    let (sl, sh) = (lanes8(&sl), lanes8(&sh));
    for ib in 0..8 {
        // ls = (scales_l nibble ib) | (scales_h bits 2ib, 2ib + 1) << 4.
        let low = _mm256_and_si256(
            _mm256_srl_epi32(sl, _mm_cvtsi32_si128(4 * ib as i32)),
            _mm256_set1_epi32(0x0F),
        );
        let high = _mm256_and_si256(
            _mm256_srl_epi32(sh, _mm_cvtsi32_si128(2 * ib as i32)),
            _mm256_set1_epi32(3),
        );
        let ls = _mm256_or_si256(low, _mm256_slli_epi32::<4>(high));
        let sc = _mm256_and_si256(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)), live);
        // SAFETY: 32 writable bytes, 32-byte aligned.
        unsafe { _mm256_store_si256(o.sc[ib].as_mut_ptr() as *mut __m256i, sc) };
    }
    o.sc[8..].fill([0; PANEL8_ROWS]);
    // SAFETY: 16 readable bytes; loadu is unaligned. 32 writable bytes; storeu likewise.
    unsafe {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
        _mm256_storeu_ps(o.d.as_mut_ptr(), d);
    }
}

/// 16 bytes of `lo` in the low half of a register and 16 of `hi` in the high half.
#[inline]
#[target_feature(enable = "avx2")]
fn halves(hi: &[u8], lo: &[u8]) -> __m256i {
    assert!(hi.len() >= 16 && lo.len() >= 16);
    // SAFETY: 16 readable bytes each (checked above); loadu is unaligned.
    unsafe { _mm256_loadu2_m128i(hi.as_ptr() as *const __m128i, lo.as_ptr() as *const __m128i) }
}

/// The code-book values of the low nibbles of `q`'s bytes, XORed with `bias`, in the
/// dword lanes of `live` (zero elsewhere).
#[inline]
#[target_feature(enable = "avx2")]
fn look_up(lut: __m256i, q: __m256i, m4: __m256i, bias: __m256i, live: __m256i) -> __m256i {
    let v = _mm256_xor_si256(_mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4)), bias);
    _mm256_and_si256(v, live)
}

/// One sub-block's term of the eight rows' sums: `((d_w·d_a)·(ls - 32))·S`, the
/// reference's two products (`dwa`: `d_w·d_a`; `ls`: `ls - 32`; `s`: the exact `S`).
#[inline]
#[target_feature(enable = "avx2")]
fn sub_block_term(dwa: __m256, ls: __m256, s: __m256i) -> __m256 {
    _mm256_mul_ps(_mm256_mul_ps(dwa, ls), _mm256_cvtepi32_ps(s))
}
