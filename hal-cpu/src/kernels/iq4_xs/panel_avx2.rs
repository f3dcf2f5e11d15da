//! IQ4_XS's part of the eight-row prompt-batch panels (`kq_panel_avx2.rs`; every x86
//! level from AVX2 up): its blocks decoded into panel blocks (the code book looked up
//! once per matmul), and its tile in the scalar reference's order (bit for bit
//! [`super::avx2::dot_iq4xs`], the row kernels of every level).

use std::arch::x86_64::*;

use flint_core::blocks::{BlockIQ4XS, BlockQ8K};
use flint_core::dequant::KVALUES_IQ4NL;

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel::quad;
use crate::kernels::kq_panel_avx2::{lanes8, lanes8_ps, KPanel8, KPanel8Block};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::{codebook, load32i, nibbles};

impl KPanel8 for BlockIQ4XS {
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
#[target_feature(enable = "avx2,fma,f16c")]
fn decode(rows: &[&[BlockIQ4XS]], i: usize, o: &mut KPanel8Block, bias: __m256i) {
    let lut = codebook(&KVALUES_IQ4NL);
    let zero = _mm256_setzero_si256();

    for ib in 0..8 {
        let v: [__m256i; PANEL8_ROWS] = std::array::from_fn(|r| {
            rows.get(r).map_or(zero, |row| {
                let (qs, _) = row[i].qs.as_chunks::<16>();
                _mm256_xor_si256(_mm256_shuffle_epi8(lut, nibbles(&qs[ib])), bias)
            })
        });
        o.put_dwords(8 * ib, v);
    }
    let mut sc = [[0i32; PANEL8_ROWS]; 16];
    let mut d = [0f32; PANEL8_ROWS];
    for (r, row) in rows.iter().enumerate() {
        let b = &row[i];
        for ib in 0..8 {
            let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
            let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
            sc[ib][r] = i32::from(low | (high << 4)) - 32;
        }
        d[r] = f16_to_f32(b.d);
    }
    (o.sc, o.d) = (sc, d);
}

/// One sub-block's term of the eight rows' sums: `((d_w·d_a)·(ls - 32))·S`, the
/// reference's two products (`dwa`: `d_w·d_a`; `ls`: `ls - 32`; `s`: the exact `S`).
#[inline]
#[target_feature(enable = "avx2")]
fn sub_block_term(dwa: __m256, ls: __m256, s: __m256i) -> __m256 {
    _mm256_mul_ps(_mm256_mul_ps(dwa, ls), _mm256_cvtepi32_ps(s))
}
