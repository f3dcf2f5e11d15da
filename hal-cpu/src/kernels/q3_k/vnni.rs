//! Q3_K weights · Q8_K activations on AVX-512 VNNI: four weight rows against one
//! activation row (the decode matvec), the activation row arranged once per chunk of
//! rows ([`Q8KRunPairs`], by the kernel's own `arrange`). The caller must have checked AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C) at
//! device open, and passes rows far apart
//! ([`q0_rows`](crate::kernels::q0::vnni::q0_rows) says why), each row's stream continued
//! by the same slot of its next call: each row is prefetched a few blocks ahead, into the
//! next row past its end ([`PREFETCH_AHEAD`]).
//!
//! Order: that of the scalar reference (`flint_core::dot::vec_dot`, ggml's generic
//! `ggml_vec_dot_q3_K_q8_K`), bit for bit, as `avx2.rs`. Per row eight `f32` lane sums
//! run across the blocks, lane `l` taking the elements `e` with `e mod 8 == l`: per
//! 256-element block the exact integer `A_l = sum_{e mod 8 == l} sc_{e/16} * q_e * a_e`
//! (`q_e` in -4..=3, the 6-bit scales less 32), then `lane_l = lane_l + d * A_l` with
//! `d = f16(d_w) * d_a` (a product and an add, no `fma`); at the end
//! `((0 + lane_0) + lane_1) + ... + lane_7`.
//!
//! The integers: a 512-bit register holds run `s` of 32 elements (`32s..32s + 32`, groups
//! `2s` and `2s + 1`) in its low half and run `s + 4` in its high half, so that one shift
//! by `2s` of the 64 packed low-bit bytes decodes the low bits of both runs, and one
//! rotation of the hmask bytes (in both halves) their high bits (hmask bits `s` and
//! `s + 4`). Each half is transposed as `avx2.rs`'s `lanes_of_8` (a dword permutation,
//! then the 4 x 4 byte transposition [`T4`]: i32 lane `l` holds elements `l, l + 8` of the first group and
//! `l, l + 8` of the second); the packed bytes are transposed before decoding (decoding
//! is bytewise), the activations once per chunk. The biased quants
//! `u = q + 4 = low | hbit << 2` (0..=7, unsigned) go through `vpmaddubsw`, less the
//! activation pairs times 4 (`vpmaddubsw` of 4, arranged with them): the exact signed pair
//! sums; `vpdpwssds` weights them by their groups' scales and adds them into the row's
//! i32 lanes (the saturating form, which never saturates here: `|A_l| < 2^20`).
//!
//! Three kernels compute it, from one body (the macro `rows4_kernel`): [`dot_q3k_rows4`] with dword
//! permutes, `vpshufb` and shift / mask / rotate decoding ([`Shuffles`]), and, where the
//! CPU has AVX-512 VBMI and GFNI (`crate::simd::has_vbmi_gfni`), [`dot_q3k_rows4_vbmi`]
//! ([`BytePerms`]): each transposition one byte permute, the quants' fields moved by
//! `vgf2p8affineqb` bit transforms, and the runs interleaved lane by lane instead of by
//! halves so that each scale vector is a broadcast load rather than a `vpermd`. The
//! kernel is bound by the vector ALU ports (the shuffle port most), not by memory, on
//! the 2-core Xeons it was tuned on: the VBMI form issues about 120 vector ALU operations
//! a block of four rows where the other issues about 160 (about 15% faster on one core,
//! the weight in cache, `lowbit/Q3_K`). Where weights are repacked at staging, the VBMI
//! form reads blocks arranged for it ([`dot_q3k_rows4_perm`], `q3_k/perm.rs`): the byte
//! permutes and the high bits' shift and transform done once, about 104 operations a
//! block of four rows.

use std::arch::x86_64::*;

use flint_core::blocks::{BlockQ3K, BlockQ8K};

use super::perm::{BlockQ3KPerm, HIGH_BIT, QS_BACK};
use crate::kernels::x86::avx512::{bcast32, load64, prefetch_stream, Aligned64};

/// Blocks ahead of the current one that each row's stream is prefetched (12 x 110 bytes),
/// past the row's end too: the caller's next call continues each stream with the next
/// row, and a prefetch that stopped at the end left the first blocks of every row to the
/// hardware prefetcher (about 10% slower on the 2-core Xeon this was tuned on).
const PREFETCH_AHEAD: usize = 12;

/// `vpermd` indices of [`T4`]'s first step: in each 256-bit half, dwords 0, 2, 4, 6 to
/// the low 128-bit lane and 1, 3, 5, 7 to the high one (the packed low bits: runs 0..4
/// in `qs[..32]`, 4..8 in `qs[32..]`).
const HALVES: [i32; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// The same from one 256-bit source into both halves (the hmask bytes, shared by the two
/// runs of a register).
const BOTH: [i32; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7];

/// The same from two 256-bit sources, the first into the low half and the second (`+16`:
/// `vpermt2d`'s second table) into the high one (the activation runs `s` and `s + 4`).
const PAIR: [i32; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 16, 18, 20, 22, 17, 19, 21, 23];

/// `vpshufb` indices of the transposition's second step: a 4 x 4 byte transposition in
/// each 128-bit lane. After a dword permutation above, in each 256-bit half i32 lane `l`
/// holds the half's bytes `l, l + 8, l + 16, l + 24`.
const T4: [i8; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// `vpermw` indices picking the f16 `d` (word 7 of each row's 128-bit lane of the
/// headers, see [`heads`]) of rows 0, 1, 2, 3, eight times each.
const D_IDX: [i16; 32] = [
    7, 7, 7, 7, 7, 7, 7, 7, 15, 15, 15, 15, 15, 15, 15, 15, 23, 23, 23, 23, 23, 23, 23, 23, 31, 31,
    31, 31, 31, 31, 31, 31,
];

/// Loads 16 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn idx16(v: &[i32; 16]) -> __m512i {
    // SAFETY: 16 readable i32; loadu is unaligned.
    unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
}

/// Loads 64 byte indices.
#[inline]
#[target_feature(enable = "avx512f")]
fn idx64(v: &[u8; 64]) -> __m512i {
    // SAFETY: 64 readable bytes; loadu is unaligned.
    unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
}

/// Loads 32 bytes into the low half of a register (the high half undefined).
#[inline]
#[target_feature(enable = "avx512f")]
fn low256(p: &[u8]) -> __m512i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) })
}

/// Bytes 94..110 of a block (`BlockQ3K` or `BlockQ3KPerm`): two quant bytes, the 12
/// scale bytes, `d`.
#[inline]
fn tail16<B: Q3Block>(b: &B) -> __m128i {
    let bytes = &bytemuck::bytes_of(b)[94..110];
    // SAFETY: 16 readable bytes (the slice above); loadu is unaligned.
    unsafe { _mm_loadu_si128(bytes.as_ptr() as *const __m128i) }
}

/// A Q3_K block as the kernels here read it: the file's, or arranged at staging
/// ([`BlockQ3KPerm`]); both 110 bytes with the scales and `d` at the same place.
pub(crate) trait Q3Block: bytemuck::Pod {}

impl Q3Block for BlockQ3K {}
impl Q3Block for BlockQ3KPerm {}

const _: () = assert!(std::mem::size_of::<BlockQ3KPerm>() == std::mem::size_of::<BlockQ3K>());

/// The headers of block `i` of the four rows (128-bit lane `r`: row `r`'s [`tail16`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn heads<B: Q3Block>(x: &[&[B]; 4], i: usize) -> __m512i {
    let z = _mm512_castsi128_si512(tail16(&x[0][i]));
    let z = _mm512_inserti32x4::<1>(z, tail16(&x[1][i]));
    let z = _mm512_inserti32x4::<2>(z, tail16(&x[2][i]));
    _mm512_inserti32x4::<3>(z, tail16(&x[3][i]))
}

/// The sixteen 6-bit scales less 32 of each row of [`heads`] `z`, as bytes (128-bit lane
/// `r`: row `r`'s scales 0..16; ggml's unpacking: scale `4g + j` takes the low (g = 0, 1)
/// or high (g = 2, 3) nibble of byte `j` (g even) or `4 + j` (g odd), and bits `2g, 2g + 1`
/// of byte `8 + j` above it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn scales(z: __m512i, k: &Consts) -> __m512i {
    let (ls, hs) = (k.low_src, k.high_src);
    // Low nibbles in bytes 0..8, high nibbles in bytes 8..16 of each lane.
    let nib = _mm512_and_si512(
        _mm512_srlv_epi64(
            _mm512_shuffle_epi8(z, ls),
            _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4),
        ),
        _mm512_set1_epi8(0x0F),
    );
    // Dword g, byte j: bits 2g, 2g + 1 of scale byte 8 + j, moved to bits 4, 5.
    let top = _mm512_slli_epi32::<4>(_mm512_srlv_epi32(
        _mm512_shuffle_epi8(z, hs),
        _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6),
    ));
    // nib | (top & 0x30), less 32.
    let raw = _mm512_ternarylogic_epi32::<0xF8>(nib, top, _mm512_set1_epi8(0x30));
    _mm512_sub_epi8(raw, _mm512_set1_epi8(32))
}

/// A register with `lo` in every i32 lane of its low half and `hi` in its high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves_of(lo: i32, hi: i32) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi32(lo), _mm256_set1_epi32(hi))
}

/// The constants both kernels share ([`scales`], [`row_sum`]).
struct Consts {
    /// `vpshufb` indices of each lane's scale bytes 0..8 twice (the header's scale byte
    /// `k` is its byte `k + 2`).
    low_src: __m512i,
    /// Those of the scale bytes 8..12 in each dword.
    high_src: __m512i,
    four: __m512i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> Self {
        let low_src: [i8; 16] = [2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9];
        let high_src: [i8; 16] = [
            10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13,
        ];
        // SAFETY: 16 readable bytes each; loadu is unaligned.
        let (low_src, high_src) = unsafe {
            (
                _mm512_broadcast_i32x4(_mm_loadu_si128(low_src.as_ptr() as *const __m128i)),
                _mm512_broadcast_i32x4(_mm_loadu_si128(high_src.as_ptr() as *const __m128i)),
            )
        };
        Consts {
            low_src,
            high_src,
            four: _mm512_set1_epi8(4),
        }
    }
}

/// The i16 scale pairs of a block's four rows in the layout [`BytePerms`]'s registers
/// take, written once per block and read back as broadcasts (see [`BytePerms::row_scales`]);
/// on a cache line of its own, so that the broadcasts take their words from the stores.
type ScaleBuf = Aligned64<[i64; 16]>;

/// The transpositions and the decode of [`dot_q3k_rows4`]: dword permutes and
/// `vpshufb` (AVX-512 F/BW), the quants' fields by shifts, masks and rotations.
pub(crate) struct Shuffles {
    halves: __m512i,
    both: __m512i,
    pair: __m512i,
    t4: __m512i,
    m3: __m512i,
    four: __m512i,
    /// Per run pair `s`: `vprorvd` counts that bring hmask bit `s` (low half) and `s + 4`
    /// (high half) of each byte to its bit 2.
    rot: [__m512i; 4],
    /// Per run pair `s`, even / odd row: `vpermd` indices of the row's scale pair
    /// `(2s, 2s + 1)` in the low half and `(2s + 8, 2s + 9)` in the high half, from a
    /// register holding the even row's 16 i16 scales in its low half and the odd row's in
    /// its high half.
    sc_idx: [[__m512i; 2]; 4],
}

impl Shuffles {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> (Consts, Self) {
        // Opaque to the optimiser: with the indices known, LLVM lowers each scale and
        // transposition `vpermd` (and a `vpshufb` of `scales`) to two shuffles.
        std::hint::black_box((
            Consts::new(),
            Shuffles {
                halves: idx16(&HALVES),
                both: idx16(&BOTH),
                pair: idx16(&PAIR),
                // SAFETY: 16 readable bytes; loadu is unaligned.
                t4: _mm512_broadcast_i32x4(unsafe {
                    _mm_loadu_si128(T4.as_ptr() as *const __m128i)
                }),
                m3: _mm512_set1_epi8(3),
                four: _mm512_set1_epi8(4),
                // Rotated right by c, bit 8j + 2 of a dword (bit 2 of byte j) takes its bit
                // 8j + 2 + c (mod 32): c = s - 2 (mod 32) in the low half, s + 2 in the high
                // half.
                rot: [
                    halves_of(30, 2),
                    halves_of(31, 3),
                    halves_of(0, 4),
                    halves_of(1, 5),
                ],
                sc_idx: [
                    [halves_of(0, 4), halves_of(8, 12)],
                    [halves_of(1, 5), halves_of(9, 13)],
                    [halves_of(2, 6), halves_of(10, 14)],
                    [halves_of(3, 7), halves_of(11, 15)],
                ],
            },
        ))
    }

    /// Rows (0, 1) and (2, 3) of [`scales`] `sc` as i16, the even row's in the low half.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn scale_set(&self, sc: __m512i, _: &mut ScaleBuf) -> [__m512i; 2] {
        [
            _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc)),
            _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64::<1>(sc)),
        ]
    }

    /// Row `r`'s scale pair of each run pair `s` in every i32 lane of its half.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn row_scales(&self, w: &[__m512i; 2], _: &ScaleBuf, r: usize) -> [__m512i; 4] {
        let (w, odd) = (w[r / 2], r % 2);
        [
            _mm512_permutexvar_epi32(self.sc_idx[0][odd], w),
            _mm512_permutexvar_epi32(self.sc_idx[1][odd], w),
            _mm512_permutexvar_epi32(self.sc_idx[2][odd], w),
            _mm512_permutexvar_epi32(self.sc_idx[3][odd], w),
        ]
    }

    /// Rows `(a, b)`'s i32 lanes (rows of [`row_sum`]) as lanes 0..8 and 8..16: a row's
    /// lane `l` is its two halves' dwords `l` added.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair_lanes(&self, a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x44>(a, b),
            _mm512_shuffle_i64x2::<0xEE>(a, b),
        )
    }

    /// Run pair `s` of an activation block (run `s` in the low half, run `s + 4` in the
    /// high half), transposed.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn act(&self, yb: &BlockQ8K, s: usize) -> __m512i {
        let (lo, hi) = act_runs(yb, s);
        _mm512_shuffle_epi8(
            _mm512_permutex2var_epi32(low256(lo), self.pair, low256(hi)),
            self.t4,
        )
    }

    /// The biased quants `u = q + 4` of run pairs 0..4 of a weight block, transposed as
    /// the activations.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn quants(&self, b: &BlockQ3K) -> [__m512i; 4] {
        // Runs s (low half) and s + 4 (high half): low bits 2s of qs[l] and qs[32 + l],
        // high bits s and s + 4 of hmask[l].
        let q = _mm512_shuffle_epi8(
            _mm512_permutexvar_epi32(self.halves, load64(&b.qs)),
            self.t4,
        );
        let h = _mm512_shuffle_epi8(
            _mm512_permutexvar_epi32(self.both, low256(&b.hmask)),
            self.t4,
        );
        let low = [
            q,
            _mm512_srli_epi16::<2>(q),
            _mm512_srli_epi16::<4>(q),
            _mm512_srli_epi16::<6>(q),
        ];
        [
            self.biased(low[0], h, 0),
            self.biased(low[1], h, 1),
            self.biased(low[2], h, 2),
            self.biased(low[3], h, 3),
        ]
    }

    /// `u = low | (hbit << 2)` of run pair `s`: `(low & 3) | (rotated hmask & 4)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn biased(&self, low: __m512i, h: __m512i, s: usize) -> __m512i {
        _mm512_ternarylogic_epi32::<0xF8>(
            _mm512_and_si512(low, self.m3),
            _mm512_rorv_epi32(h, self.rot[s]),
            self.four,
        )
    }
}

/// The same as [`Shuffles`] with AVX-512 VBMI and GFNI, in another register layout: run
/// `s` in the even i32 lanes and run `s + 4` in the odd ones (lane `2l` and `2l + 1`: the
/// row's lane `l`), so that a row's scale pairs of a run pair are one 64-bit broadcast
/// from memory (a load, where the halves' layout takes a `vpermd` on the shuffle port,
/// the port this kernel is bound by). Each transposition is one `vpermb` (`vpermt2b` for
/// the activations); the fields move by affine bit transforms (`vgf2p8affineqb`, any bit
/// permutation within each byte): the hmask bits of the four runs into place in one (the
/// odd lanes' bits shifted down by 4 first), two selects (`vpternlogd`) pack each pair of
/// runs' six bits into one byte, and one transform per run picks its `u` out of it.
pub(crate) struct BytePerms {
    q_idx: __m512i,
    h_idx: __m512i,
    a_idx: __m512i,
    /// 0 in the even i32 lanes, 4 in the odd ones (hmask bits `s + 4` down to `s`).
    h_shift: __m512i,
    /// Hmask bits 0, 1 (runs 0, 1) to bits 4, 5 and 2, 3 (runs 2, 3) to bits 0, 1.
    gh: __m512i,
    low_nibbles: __m512i,
    high_nibbles: __m512i,
    /// Per run pair `s`: its `u` out of the packed byte of runs 0, 1 (`s` < 2) or 2, 3.
    gu: [__m512i; 4],
    /// `vpshufb` indices putting each row's scales in the order of [`ScaleBuf`]'s
    /// 64-bit words: `(2s, 2s + 1, 2s + 8, 2s + 9)` for `s` in 0..4.
    sc_order: __m512i,
    even: __m512i,
    odd: __m512i,
}

/// A `vgf2p8affineqb` matrix (one qword) setting output bit `to` of each byte to its input
/// bit `from` (output bit `i` is the parity of the input and the matrix's byte `7 - i`).
const fn bit_move(from: u32, to: u32) -> i64 {
    ((1i64 << from) & 0xFF) << (8 * (7 - to))
}

/// The `vgf2p8affineqb` matrix that picks run pair `s`'s biased quant `u` out of a byte
/// holding its two low bits at bits `2s, 2s + 1` (mod 8) and its high bit at `high`.
const fn pick_u(s: usize, high: u32) -> i64 {
    let lo = (2 * s % 8) as u32;
    bit_move(lo, 0) | bit_move(lo + 1, 1) | bit_move(high, 2)
}

/// [`BytePerms`]'s byte indices: i32 lane `2l + o`, byte `k` takes source byte
/// `l + 8k`, plus `second` where `o` is 1.
const fn interleaved(second: u8) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        let (lane, k) = (b / 4, b % 4);
        out[b] = (lane / 2 + 8 * k) as u8 + if lane % 2 == 1 { second } else { 0 };
        b += 1;
    }
    out
}

impl BytePerms {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> (Consts, Self) {
        // Not through `black_box` (which puts every constant through the stack at each
        // call): LLVM keeps these permutes as written, and a call's prologue counts where
        // rows are a few blocks long (a Qwen3 MoE expert's down rows: 3 blocks).
        // Low bits of runs s + 4 in qs[32..]; hmask bits of both runs in one byte;
        // activation run s + 4 in `vpermt2b`'s second table.
        const Q: [u8; 64] = interleaved(32);
        const H: [u8; 64] = interleaved(0);
        const A: [u8; 64] = interleaved(64);
        const SC: [i8; 16] = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15];
        let p = BytePerms {
            q_idx: idx64(&Q),
            h_idx: idx64(&H),
            a_idx: idx64(&A),
            h_shift: _mm512_set1_epi64(4 << 32),
            gh: _mm512_set1_epi64(
                bit_move(0, 4) | bit_move(1, 5) | bit_move(2, 0) | bit_move(3, 1),
            ),
            low_nibbles: _mm512_set1_epi8(0x0F),
            high_nibbles: _mm512_set1_epi8(0xF0u8 as i8),
            // Packed byte of runs 0, 1: low bits in bits 0..4, high bits in 4, 5; of runs
            // 2, 3: low bits in bits 4..8, high bits in 0, 1.
            gu: std::array::from_fn(|s| _mm512_set1_epi64(pick_u(s, HIGH_BIT[s]))),
            // SAFETY: 16 readable bytes; loadu is unaligned.
            sc_order: _mm512_broadcast_i32x4(unsafe {
                _mm_loadu_si128(SC.as_ptr() as *const __m128i)
            }),
            even: idx16(&[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]),
            odd: idx16(&[1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31]),
        };
        (Consts::new(), p)
    }

    /// As [`Shuffles::act`], in this layout.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn act(&self, yb: &BlockQ8K, s: usize) -> __m512i {
        let (lo, hi) = act_runs(yb, s);
        _mm512_permutex2var_epi8(low256(lo), self.a_idx, low256(hi))
    }

    /// As [`Shuffles::quants`], in this layout.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn quants(&self, b: &BlockQ3K) -> [__m512i; 4] {
        let q = _mm512_permutexvar_epi8(self.q_idx, load64(&b.qs));
        let h = _mm512_srlv_epi32(
            _mm512_permutexvar_epi8(self.h_idx, low256(&b.hmask)),
            self.h_shift,
        );
        let h = _mm512_gf2p8affine_epi64_epi8::<0>(h, self.gh);
        self.biased(q, h, &self.gu)
    }

    /// Each run pair's `u` from the placed low bits `q` and high bits `h`: two selects
    /// pack two run pairs' bits into one byte, one transform `gu[s]` a run pair picks its
    /// `u` out of it.
    #[inline]
    #[target_feature(enable = "avx512f,gfni")]
    fn biased(&self, q: __m512i, h: __m512i, gu: &[__m512i; 4]) -> [__m512i; 4] {
        // `c ? a : b` bit by bit: the packed low bits where the mask is set.
        let x = _mm512_ternarylogic_epi32::<0xE4>(q, h, self.low_nibbles);
        let y = _mm512_ternarylogic_epi32::<0xE4>(q, h, self.high_nibbles);
        [
            _mm512_gf2p8affine_epi64_epi8::<0>(x, gu[0]),
            _mm512_gf2p8affine_epi64_epi8::<0>(x, gu[1]),
            _mm512_gf2p8affine_epi64_epi8::<0>(y, gu[2]),
            _mm512_gf2p8affine_epi64_epi8::<0>(y, gu[3]),
        ]
    }

    /// [`scales`] `sc` as i16 into `buf` (row `r`, run pair `s`: the 64-bit word
    /// `4r + s`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn scale_set(&self, sc: __m512i, buf: &mut ScaleBuf) -> [__m512i; 2] {
        let sc = _mm512_shuffle_epi8(sc, self.sc_order);
        // SAFETY: `buf` is 128 writable bytes; storeu is unaligned.
        unsafe {
            let p = buf.0.as_mut_ptr() as *mut __m512i;
            _mm512_storeu_si512(p, _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc)));
            _mm512_storeu_si512(
                p.add(1),
                _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64::<1>(sc)),
            );
        }
        [_mm512_setzero_si512(); 2]
    }

    /// Row `r`'s scale pairs of each run pair `s`: run `s`'s in the even i32 lanes, run
    /// `s + 4`'s in the odd ones (a broadcast load each).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn row_scales(&self, _: &[__m512i; 2], buf: &ScaleBuf, r: usize) -> [__m512i; 4] {
        // Read from memory (LLVM would otherwise shuffle each word out of the registers
        // it stored).
        let buf = &std::hint::black_box(buf).0;
        [
            _mm512_set1_epi64(buf[4 * r]),
            _mm512_set1_epi64(buf[4 * r + 1]),
            _mm512_set1_epi64(buf[4 * r + 2]),
            _mm512_set1_epi64(buf[4 * r + 3]),
        ]
    }

    /// As [`Shuffles::pair_lanes`]: a row's lane `l` is its dwords `2l` and `2l + 1` added.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair_lanes(&self, a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(
            _mm512_permutex2var_epi32(a, self.even, b),
            _mm512_permutex2var_epi32(a, self.odd, b),
        )
    }
}

/// [`BytePerms`] for blocks arranged at staging ([`BlockQ3KPerm`]): the quant bytes are
/// already where the byte permute would put them, and the high bits of both halves' lanes
/// share one 32-byte load (broadcast), each half's bits picked by that half's transforms.
pub(crate) struct PermBytes {
    base: BytePerms,
    /// [`BytePerms::gu`] in the low half; in the high half the same from the bits the
    /// arrangement gives lanes 32..64 (each high bit two places up).
    gu: [__m512i; 4],
}

impl PermBytes {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> (Consts, Self) {
        let (k, base) = BytePerms::new();
        let gu = std::array::from_fn(|s| {
            _mm512_inserti64x4::<1>(
                _mm512_set1_epi64(pick_u(s, HIGH_BIT[s])),
                _mm256_set1_epi64x(pick_u(s, HIGH_BIT[s] + 2)),
            )
        });
        (k, PermBytes { base, gu })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn act(&self, yb: &BlockQ8K, s: usize) -> __m512i {
        self.base.act(yb, s)
    }

    /// As [`BytePerms::quants`], from an arranged block: the bytes as they lie.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn quants(&self, b: &BlockQ3KPerm) -> [__m512i; 4] {
        self.base.biased(load64(&b.qs), bcast32(&b.hmask), &self.gu)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn scale_set(&self, sc: __m512i, buf: &mut ScaleBuf) -> [__m512i; 2] {
        self.base.scale_set(sc, buf)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn row_scales(&self, w: &[__m512i; 2], buf: &ScaleBuf, r: usize) -> [__m512i; 4] {
        self.base.row_scales(w, buf, r)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair_lanes(&self, a: __m512i, b: __m512i) -> __m512i {
        self.base.pair_lanes(a, b)
    }
}

/// Blocks arranged for [`PermBytes`] back in the file's layout (`q3_k::perm::unpack`'s
/// result, about ten vector operations a block): what the prompt-batch panels decode
/// from. The CPU must have AVX-512 F/BW, VBMI and GFNI (every CPU that arranges them).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni,avx2")]
pub(crate) fn unpack_perm(src: &[BlockQ3KPerm], out: &mut [BlockQ3K]) {
    assert_eq!(src.len(), out.len(), "q3_k::vnni::unpack_perm: lengths");
    // `qs`: the arrangement's byte permutation undone.
    let qs_back = idx64(&QS_BACK);
    // The high bits: each byte lane's four (run pairs 0..4, bits 4, 5, 0, 1 of the
    // kernel's decode) as a nibble in run order, from the half a byte of `hmask` the
    // lane's half keeps (bits 0, 1, 4, 5 for lanes 0..32, 2, 3, 6, 7 for 32..64) ...
    let to_nibble = _mm512_inserti64x4::<1>(
        _mm512_set1_epi64(bit_move(4, 0) | bit_move(5, 1) | bit_move(0, 2) | bit_move(1, 3)),
        _mm256_set1_epi64x(bit_move(6, 0) | bit_move(7, 1) | bit_move(2, 2) | bit_move(3, 3)),
    );
    // ... the odd i32 lanes' (runs 4..8) moved up to bits 4..8 ...
    let odd_up = _mm512_set1_epi64(4 << 32);
    // ... and the two lanes of each file byte `l + 8k` (bytes `8l + k` and `8l + 4 + k`)
    // gathered into the two halves, to be or-ed.
    const GATHER: [u8; 64] = {
        let mut g = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            let (j, odd) = (i % 32, i / 32);
            g[i] = ((j % 8) * 8 + 4 * odd + j / 8) as u8;
            i += 1;
        }
        g
    };
    let gather = idx64(&GATHER);
    for (o, b) in out.iter_mut().zip(src) {
        let qs = _mm512_permutexvar_epi8(qs_back, load64(&b.qs));
        let h = _mm512_gf2p8affine_epi64_epi8::<0>(bcast32(&b.hmask), to_nibble);
        let h = _mm512_permutexvar_epi8(gather, _mm512_sllv_epi32(h, odd_up));
        let hm = _mm256_or_si256(_mm512_castsi512_si256(h), _mm512_extracti64x4_epi64::<1>(h));
        // SAFETY: 32 and 64 writable bytes; storeu is unaligned.
        unsafe {
            _mm256_storeu_si256(o.hmask.as_mut_ptr() as *mut __m256i, hm);
            _mm512_storeu_si512(o.qs.as_mut_ptr() as *mut __m512i, qs);
        }
        o.scales = b.scales;
        o.d = b.d;
    }
}

/// Runs `s` and `s + 4` of an activation block's quants.
#[inline]
fn act_runs(yb: &BlockQ8K, s: usize) -> (&[u8], &[u8]) {
    (
        bytemuck::cast_slice(&yb.qs[32 * s..32 * s + 32]),
        bytemuck::cast_slice(&yb.qs[128 + 32 * s..128 + 32 * s + 32]),
    )
}

/// One weight block's i32 lanes against the activation block (`u`: the block's biased
/// quants per run pair; `ya`: the activation run pairs, `bias`: their `vpmaddubsw` of 4;
/// `w`: the i16 scales of this row and its pair, `odd`: which half is this row's): in each
/// half, lane `l` holds that half's part of `A_l`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn row_sum(u: [__m512i; 4], ya: &[__m512i; 4], bias: &[__m512i; 4], scs: [__m512i; 4]) -> __m512i {
    let mut acc = _mm512_setzero_si512();
    for s in 0..4 {
        let p = _mm512_sub_epi16(_mm512_maddubs_epi16(u[s], ya[s]), bias[s]);
        // Saturating form: LLVM splits a chain of plain `vpdpwssd` into `vpmaddwd` and
        // `vpaddd` (two instructions), and no sum here comes near saturation.
        acc = _mm512_dpwssds_epi32(acc, p, scs[s]);
    }
    acc
}

/// An activation block arranged for the four-row kernel of one set of transpositions
/// `P` ([`Shuffles`] or [`BytePerms`]), once per matvec chunk instead of once per block
/// of four rows: its run pairs transposed (`P::act`) and their `vpmaddubsw` of 4 (the
/// bias of the biased quants), and the block's `d`.
#[repr(C, align(64))]
pub(crate) struct Q8KRunPairs<P> {
    ya: [[u8; 64]; 4],
    bias: [[i16; 32]; 4],
    d: f32,
    _layout: std::marker::PhantomData<P>,
}

/// The kernel's body, for one set of transpositions (`$perms`: [`Shuffles`] or
/// [`BytePerms`]) and the target features they need.
macro_rules! rows4_kernel {
    ($(#[$doc:meta])* $name:ident, $arrange:ident, $row:ident, $features:literal, $perms:ident, $B:ty) => {
        /// `y`'s blocks arranged for [`
        #[doc = stringify!($name)]
        /// `], into `out` (cleared first).
        #[target_feature(enable = $features)]
        pub(crate) fn $arrange(y: &[BlockQ8K], out: &mut Vec<Q8KRunPairs<$perms>>) {
            let (k, p) = $perms::new();
            out.clear();
            out.reserve(y.len());
            for yb in y {
                let mut a = Q8KRunPairs {
                    ya: [[0; 64]; 4],
                    bias: [[0; 32]; 4],
                    d: yb.d,
                    _layout: std::marker::PhantomData,
                };
                for s in 0..4 {
                    let v = p.act(yb, s);
                    // SAFETY: 64 writable bytes each; storeu is unaligned.
                    unsafe {
                        _mm512_storeu_si512(a.ya[s].as_mut_ptr() as *mut __m512i, v);
                        _mm512_storeu_si512(
                            a.bias[s].as_mut_ptr() as *mut __m512i,
                            _mm512_maddubs_epi16(k.four, v),
                        );
                    }
                }
                out.push(a);
            }
        }

        /// One Q3_K row against an arranged activation row in the same order: the rows
        /// of a chunk left over beside [`
        #[doc = stringify!($name)]
        /// `].
        #[target_feature(enable = $features)]
        pub(crate) fn $row(x: [&[$B]; 1], y: &[Q8KRunPairs<$perms>], out: &mut [f32; 1]) {
            let mut o = [0f32; 4];
            $name([x[0]; 4], y, &mut o);
            out[0] = o[0];
        }

        $(#[$doc])*
        ///
        /// # Panics
        /// If a weight row's length differs from the activation row's.
        #[target_feature(enable = $features)]
        pub(crate) fn $name(x: [&[$B]; 4], y: &[Q8KRunPairs<$perms>], out: &mut [f32; 4]) {
            let nb = y.len();
            for xs in &x {
                assert_eq!(xs.len(), nb, concat!(stringify!($name), ": lengths"));
            }
            // SAFETY: 32 readable i16; loadu is unaligned.
            let d_idx = unsafe { _mm512_loadu_si512(D_IDX.as_ptr() as *const __m512i) };
            let (k, p) = $perms::new();
            let mut lanes = [_mm512_setzero_ps(); 2];
            let mut buf: ScaleBuf = Aligned64([0; 16]);
            for (i, yb) in y.iter().enumerate() {
                for xs in &x {
                    prefetch_stream(xs, i + PREFETCH_AHEAD);
                }
                // The run pairs and 4 (a_e + a_e') per i16 pair: what the bias of u = q + 4
                // adds (arranged once, `$arrange`).
                let ya = [0, 1, 2, 3].map(|s| load64(&yb.ya[s]));
                let bias = [0, 1, 2, 3].map(|s| load64(&yb.bias[s]));
                let z = heads(&x, i);
                let sc = scales(z, &k);
                let w = p.scale_set(sc, &mut buf);
                let a0 = row_sum(p.quants(&x[0][i]), &ya, &bias, p.row_scales(&w, &buf, 0));
                let a1 = row_sum(p.quants(&x[1][i]), &ya, &bias, p.row_scales(&w, &buf, 1));
                let a2 = row_sum(p.quants(&x[2][i]), &ya, &bias, p.row_scales(&w, &buf, 2));
                let a3 = row_sum(p.quants(&x[3][i]), &ya, &bias, p.row_scales(&w, &buf, 3));
                // Rows (0, 1) and (2, 3), each row's eight lanes.
                let ints = [p.pair_lanes(a0, a1), p.pair_lanes(a2, a3)];
                // f16(d_w) * d_a of each row, eight times.
                let dh = _mm512_permutexvar_epi16(d_idx, z);
                let dy = _mm512_set1_ps(yb.d);
                let d = [
                    _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(dh)), dy),
                    _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dh)), dy),
                ];
                for k in 0..2 {
                    lanes[k] =
                        _mm512_add_ps(lanes[k], _mm512_mul_ps(d[k], _mm512_cvtepi32_ps(ints[k])));
                }
            }
            let mut f = [0f32; 32];
            // SAFETY: `f` is 32 writable f32; storeu is unaligned.
            unsafe {
                _mm512_storeu_ps(f.as_mut_ptr(), lanes[0]);
                _mm512_storeu_ps(f.as_mut_ptr().add(16), lanes[1]);
            }
            for (r, o) in out.iter_mut().enumerate() {
                *o = f[8 * r..8 * r + 8].iter().fold(0.0f32, |s, &v| s + v);
            }
        }
    };
}

rows4_kernel!(
    /// Q3_K x Q8_K for four weight rows `x` against one activation row `y` (any i8
    /// activation quants), each `out[r]` that of `flint_core::dot::vec_dot` for row `r`
    /// bit for bit.
    dot_q3k_rows4,
    arrange,
    dot_q3k_row,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    Shuffles,
    BlockQ3K
);

rows4_kernel!(
    /// [`dot_q3k_rows4`] with VBMI byte permutes and GFNI bit transforms
    /// ([`BytePerms`]), for CPUs with both (`crate::simd::has_vbmi_gfni`).
    dot_q3k_rows4_vbmi,
    arrange_vbmi,
    dot_q3k_row_vbmi,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c",
    BytePerms,
    BlockQ3K
);

rows4_kernel!(
    /// [`dot_q3k_rows4_vbmi`] on blocks arranged at staging ([`BlockQ3KPerm`],
    /// [`PermBytes`]): the same bits, four fewer vector operations a weight block.
    dot_q3k_rows4_perm,
    arrange_perm,
    dot_q3k_row_perm,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c",
    PermBytes,
    BlockQ3KPerm
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{q3_k_weights, q8k_acts, seed, vnni_available};

    use bytemuck::Zeroable;
    use flint_core::GgmlType;

    type Kernel = unsafe fn([&[BlockQ3K]; 4], &[BlockQ8K], &mut [f32; 4]);

    /// [`dot_q3k_rows4`] against a plain activation row, arranged here.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn rows4_plain(x: [&[BlockQ3K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
        let mut a = Vec::new();
        // SAFETY: the caller checked the features.
        unsafe {
            arrange(y, &mut a);
            dot_q3k_rows4(x, &a, out)
        }
    }

    /// [`dot_q3k_rows4_vbmi`] against a plain activation row, arranged here.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn rows4_vbmi_plain(x: [&[BlockQ3K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
        let mut a = Vec::new();
        // SAFETY: the caller checked the features.
        unsafe {
            arrange_vbmi(y, &mut a);
            dot_q3k_rows4_vbmi(x, &a, out)
        }
    }

    /// [`dot_q3k_rows4_perm`] on the rows arranged here, against a plain activation row.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn rows4_perm_plain(x: [&[BlockQ3K]; 4], y: &[BlockQ8K], out: &mut [f32; 4]) {
        let p: Vec<Vec<BlockQ3KPerm>> = x
            .iter()
            .map(|r| {
                let mut p = vec![BlockQ3KPerm::zeroed(); r.len()];
                super::super::perm::pack(r, &mut p);
                p
            })
            .collect();
        let mut a = Vec::new();
        // SAFETY: the caller checked the features.
        unsafe {
            arrange_perm(y, &mut a);
            dot_q3k_rows4_perm([&p[0], &p[1], &p[2], &p[3]], &a, out)
        }
    }

    /// The kernels this CPU runs, with their names.
    fn kernels() -> Vec<(Kernel, &'static str)> {
        let mut k: Vec<(Kernel, &'static str)> = Vec::new();
        if vnni_available() {
            k.push((rows4_plain, "rows4"));
            if crate::simd::has_vbmi_gfni() {
                k.push((rows4_vbmi_plain, "rows4 vbmi"));
                k.push((rows4_perm_plain, "rows4 arranged"));
            } else {
                eprintln!("no AVX-512 VBMI + GFNI: Q3_K rows4 VBMI kernel not exercised");
            }
        } else {
            eprintln!("no AVX-512 VNNI: Q3_K rows4 kernels not exercised");
        }
        k
    }

    /// `kernel` of the rows `w` against `y`, each output's bits equal to the reference's.
    fn check(kernel: (Kernel, &str), w: &[Vec<BlockQ3K>; 4], y: &[BlockQ8K], what: &str) {
        let nb = y.len();
        let mut out = [0f32; 4];
        // SAFETY: `kernels` checked the CPU features the kernel needs.
        unsafe { kernel.0([&w[0], &w[1], &w[2], &w[3]], y, &mut out) };
        for (r, g) in out.iter().enumerate() {
            let want = flint_core::dot::vec_dot(
                GgmlType::Q3_K,
                bytemuck::cast_slice(&w[r]),
                bytemuck::cast_slice(y),
                nb * 256,
            )
            .expect("reference");
            assert!(
                g.to_bits() == want.to_bits(),
                "{} {what} nb={nb} row {r}: {g:e} vs reference {want:e}",
                kernel.1
            );
        }
    }

    /// Random rows and activations: every output equals the scalar reference bit for bit.
    #[test]
    fn rows4_equal_the_scalar_reference_bit_for_bit() {
        for kernel in kernels() {
            let mut s = seed("q3_k rows4");
            for nb in [1, 2, 3, 5, 11, 16] {
                for _ in 0..8 {
                    let w: [Vec<BlockQ3K>; 4] = std::array::from_fn(|_| q3_k_weights(nb, &mut s));
                    let y = q8k_acts(nb, &mut s);
                    check(kernel, &w, &y, "random");
                }
            }
        }
    }

    /// Quants all -4 or all +3, scales all -32 or all +31, activations all 127, all -127
    /// or all -128 (the largest integer sums of either sign), mixed across the rows and
    /// blocks.
    #[test]
    fn rows4_extremes_equal_the_scalar_reference() {
        // (qs, hmask): q = -4 (low bits 0, high bit clear) or +3 (3, set).
        let quants = [(0x00u8, 0x00u8), (0xFF, 0xFF)];
        // Scale bytes: all 6-bit scales 0 (-32) or 63 (+31).
        let scale_bytes = [0x00u8, 0xFF];
        // f16: 1.0, -65504 (the largest), 2^-14 (the smallest normal), -0.5.
        let ds = [0x3C00u16, 0xFBFF, 0x0400, 0xB800];
        let block = |c: usize, d: u16| {
            let (qs, hm) = quants[c % 2];
            BlockQ3K {
                hmask: [hm; 32],
                qs: [qs; 64],
                scales: [scale_bytes[(c / 2) % 2]; 12],
                d,
            }
        };
        for kernel in kernels() {
            for nb in [1, 2, 3, 5] {
                for combo in 0..24 {
                    let w: [Vec<BlockQ3K>; 4] = std::array::from_fn(|r| {
                        (0..nb)
                            .map(|i| block(combo + r + i, ds[(combo + 3 * r + i) % 4]))
                            .collect()
                    });
                    let y: Vec<BlockQ8K> = (0..nb)
                        .map(|i| {
                            let mut b = BlockQ8K::zeroed();
                            let a: i8 = [127, -127, -128][(combo / 4 + i) % 3];
                            b.qs = [a; 256];
                            b.bsums = [16 * a as i16; 16];
                            b.d = if combo % 3 == 0 { 0.0123 } else { -3.5e-3 };
                            b
                        })
                        .collect();
                    check(kernel, &w, &y, "extremes");
                }
            }
        }
    }
}
