//! Q3_K's part of the eight-row prompt-batch panels (`kq_panel_avx2.rs`; every x86 level
//! from AVX2 up): its blocks decoded into panel blocks, and its tile in the scalar
//! reference's order (bit for bit [`super::avx2::dot_q3k`], the row kernels of every
//! level).
//!
//! The order keeps eight float lanes per output, lane `l` taking the elements `e` with
//! `e mod 8 == l`, so a panel dword holds four elements of one lane: dword `8m + l`
//! holds bytes `l, l + 8, l + 16, l + 24` of run `m` (elements `32m..32m + 32`, groups
//! `2m` and `2m + 1`: [`lanes_of_8`]'s arrangement), the activation runs arranged alike
//! once per gemm ([`Q3KAct`]). The quants are stored biased (`u = q + 4`, 0..=7), the activation's pair
//! sums times 4 taken off after `vpmaddubsw`.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ3K, BlockQ8K};
use flint_core::dequant::q3k_scales;

use crate::kernels::f16_to_f32;
use crate::kernels::kq_panel_avx2::{i16_pair, lanes8, lanes8_ps, KPanel8, KPanel8Block};
use crate::kernels::q0::panel_avx2::PANEL8_ROWS;
use crate::kernels::x86::avx2::{load32i, load32u};

use super::avx2::{hbit4, lanes_of_8, low2, Lanes8};

/// One Q8_K activation block as the Q3_K tiles read it ([`KPanel8::acts`]), arranged once
/// per gemm rather than once per panel.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Q3KAct {
    /// Per run `m` the 32 quants in [`lanes_of_8`]'s arrangement, as dwords to broadcast.
    aq: [[i32; 8]; 8],
    /// The AVX2 tile: per run the pair sums of those dwords times 4 (what the bias of
    /// `u = q + 4` adds), as dwords to broadcast.
    c4: [[i32; 8]; 8],
    /// The VNNI tile: -127 times each lane's sum over the block (the accumulators' start).
    start: [i32; 8],
    /// The activation's `d`.
    d: f32,
}

impl KPanel8 for BlockQ3K {
    type Act = Q3KAct;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acts<'s>(a: &'s [BlockQ8K], scratch: &'s mut Vec<Q3KAct>) -> &'s [Q3KAct] {
        scratch.clear();
        for yb in a {
            scratch.push(arrange(yb));
        }
        scratch
    }

    /// Per row and run `m = 4j + s` the biased quants `low | hbit << 2` (low bits `2s` of
    /// `qs[32j + l]`, high bit `m` of `hmask[l]`) in [`lanes_of_8`]'s arrangement, then
    /// each dword `l` transposed across the rows; per run the rows' scale pair
    /// `(sc_2m - 32, sc_2m+1 - 32)` as i16; `d`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_block(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, false);
    }

    /// Per block and lane `l` the exact integer `A_l` of the eight rows (per run: the
    /// biased quants against the arranged activation, less its pair sums times 4, by
    /// the run's scale pair), then `lane_l = lane_l + d·A_l` with `d = d_w·d_a`; at the
    /// end `((0 + lane_0) + lane_1) + ... + lane_7`. One activation row at a time: its
    /// eight lanes of eight rows fill the registers.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[Q3KAct]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        for a in 0..A {
            tile1(panel, &y[a][..panel.len()], &mut out[a]);
        }
    }

    const VNNI: bool = true;

    /// [`Self::decode_block`] with each quant times its group's scale, plus 127.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_block_vnni(rows: &[&[Self]], i: usize, o: &mut KPanel8Block) {
        decode(rows, i, o, true);
    }

    /// [`Self::tile`]'s integers by `vpdpbusd` of the scaled quants
    /// ([`Self::decode_block_vnni`]: `A_l = sum (sc·q + 127)·a - 127·sum a` over lane
    /// `l`'s 32 elements, one instruction per four elements of the eight rows; the
    /// activation's lane sums by `vpdpbusd` with ones); the same float steps.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn tile_vnni<const A: usize>(
        panel: &[KPanel8Block],
        y: &[&[Q3KAct]; A],
        out: &mut [[f32; PANEL8_ROWS]; A],
    ) {
        for a in 0..A {
            tile1_vnni(panel, &y[a][..panel.len()], &mut out[a]);
        }
    }
}

/// [`KPanel8::tile`] of Q3_K for one activation row.
#[target_feature(enable = "avx2,fma")]
fn tile1(panel: &[KPanel8Block], y: &[Q3KAct], out: &mut [f32; PANEL8_ROWS]) {
    let mut lanes = [_mm256_setzero_ps(); 8];
    for (b, yb) in panel.iter().zip(y) {
        let d = _mm256_mul_ps(lanes8_ps(&b.d), _mm256_set1_ps(yb.d));
        for (l, lane) in lanes.iter_mut().enumerate() {
            let mut acc = _mm256_setzero_si256();
            for m in 0..8 {
                // SAFETY: 32 readable bytes, 32-byte aligned.
                let u = unsafe { _mm256_load_si256(b.u[8 * m + l].as_ptr() as *const __m256i) };
                let p = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(u, _mm256_set1_epi32(yb.aq[m][l])),
                    _mm256_set1_epi32(yb.c4[m][l]),
                );
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, lanes8(&b.sc[m])));
            }
            *lane = _mm256_add_ps(*lane, _mm256_mul_ps(d, _mm256_cvtepi32_ps(acc)));
        }
    }
    let mut s = _mm256_setzero_ps();
    for lane in lanes {
        s = _mm256_add_ps(s, lane);
    }
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
}

/// One activation block arranged for the tiles ([`Q3KAct`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn arrange(yb: &BlockQ8K) -> Q3KAct {
    let t = Lanes8::new();
    let four = _mm256_set1_epi8(4);
    let mut a = Q3KAct {
        aq: [[0; 8]; 8],
        c4: [[0; 8]; 8],
        start: [0; 8],
        d: yb.d,
    };
    let mut sums = _mm256_setzero_si256();
    for m in 0..8 {
        let v = lanes_of_8(load32i(&yb.qs[32 * m..]), t);
        // Each lane's four quants summed: |sum| <= 512, exact in i16 pairs and dwords.
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        // SAFETY: 32 writable bytes each, 32-byte aligned.
        unsafe {
            _mm256_store_si256(a.aq[m].as_mut_ptr() as *mut __m256i, v);
            _mm256_store_si256(
                a.c4[m].as_mut_ptr() as *mut __m256i,
                _mm256_maddubs_epi16(four, v),
            );
        }
    }
    // SAFETY: 32 writable bytes, 32-byte aligned.
    unsafe {
        _mm256_store_si256(
            a.start.as_mut_ptr() as *mut __m256i,
            _mm256_mullo_epi32(sums, _mm256_set1_epi32(-127)),
        )
    };
    a
}

/// Decodes block `i` of up to eight Q3_K rows into `o` ([`KPanel8::decode_block`]); with
/// `scaled` each quant `q` as `q·sc + 127` (its group's scale; 3..=255:
/// [`KPanel8::decode_block_vnni`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn decode(rows: &[&[BlockQ3K]], i: usize, o: &mut KPanel8Block, scaled: bool) {
    let t = Lanes8::new();
    let zero = _mm256_setzero_si256();
    // (Loops, not closures: a closure here is not always inlined, and then passes each
    // register through memory.)
    let mut h = [zero; PANEL8_ROWS];
    let mut qs = [[zero; 2]; PANEL8_ROWS];
    for (r, row) in rows.iter().enumerate() {
        h[r] = load32u(&row[i].hmask);
        qs[r] = [load32u(&row[i].qs[..32]), load32u(&row[i].qs[32..])];
    }
    // With `scaled`: per row and run, `(u - 4)·sc_g + 127` for u = 0..8 of groups 2m (low
    // 128 bits) and 2m + 1 (high): 3..=255, an unsigned byte.
    let mut tables = [[zero; 8]; PANEL8_ROWS];
    if scaled {
        let ramp = _mm_setr_epi16(-4, -3, -2, -1, 0, 1, 2, 3);
        for (r, row) in rows.iter().enumerate() {
            let s = q3k_scales(&row[i].scales);
            for m in 0..8 {
                let sc = |g: usize| i16::from(s[g]) - 32;
                let lo = _mm_add_epi16(
                    _mm_mullo_epi16(_mm_set1_epi16(sc(2 * m)), ramp),
                    _mm_set1_epi16(127),
                );
                let hi = _mm_add_epi16(
                    _mm_mullo_epi16(_mm_set1_epi16(sc(2 * m + 1)), ramp),
                    _mm_set1_epi16(127),
                );
                let x = _mm_packus_epi16(lo, hi);
                tables[r][m] = _mm256_set_m128i(_mm_srli_si128::<8>(x), x);
            }
        }
    }
    for m in 0..8 {
        let mut runs = [zero; PANEL8_ROWS];
        for (r, run) in runs.iter_mut().enumerate() {
            let u = _mm256_or_si256(low2(qs[r][m / 4], m % 4), hbit4(h[r], m));
            // Scaled: each quant looked up in its group's table (groups 2m and 2m + 1,
            // the run's low and high 16 elements).
            let u = if scaled {
                _mm256_shuffle_epi8(tables[r][m], u)
            } else {
                u
            };
            *run = lanes_of_8(u, t);
        }
        o.put_dwords(8 * m, runs);
    }
    let mut sc = [[0i32; PANEL8_ROWS]; 16];
    let mut d = [0f32; PANEL8_ROWS];
    for (r, row) in rows.iter().enumerate() {
        let b = &row[i];
        let s = q3k_scales(&b.scales);
        for m in 0..8 {
            sc[m][r] = i16_pair(i32::from(s[2 * m]) - 32, i32::from(s[2 * m + 1]) - 32);
        }
        d[r] = f16_to_f32(b.d);
    }
    (o.sc, o.d) = (sc, d);
}

/// [`KPanel8::tile_vnni`] of Q3_K for one activation row.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma")]
fn tile1_vnni(panel: &[KPanel8Block], y: &[Q3KAct], out: &mut [f32; PANEL8_ROWS]) {
    let mut lanes = [_mm256_setzero_ps(); 8];
    for (b, yb) in panel.iter().zip(y) {
        let d = _mm256_mul_ps(lanes8_ps(&b.d), _mm256_set1_ps(yb.d));
        for (l, lane) in lanes.iter_mut().enumerate() {
            let mut acc = _mm256_set1_epi32(yb.start[l]);
            for m in 0..8 {
                // SAFETY: 32 readable bytes, 32-byte aligned.
                let u = unsafe { _mm256_load_si256(b.u[8 * m + l].as_ptr() as *const __m256i) };
                acc = _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(yb.aq[m][l]));
            }
            *lane = _mm256_add_ps(*lane, _mm256_mul_ps(d, _mm256_cvtepi32_ps(acc)));
        }
    }
    let mut s = _mm256_setzero_ps();
    for lane in lanes {
        s = _mm256_add_ps(s, lane);
    }
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
}
