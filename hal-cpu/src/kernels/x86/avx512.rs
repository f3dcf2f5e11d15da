//! AVX-512 helpers shared by the kernels of several formats: loads, broadcasts,
//! prefetches, horizontal sums and a 16 x 16 transpose. The caller must have checked
//! AVX-512 F/BW (and, for the `vpdpbusd` users, VNNI) at device open.

use std::arch::x86_64::*;

/// Blocks ahead of the current one that a K-quant kernel prefetches (4 x 144 bytes of
/// Q4_K: far enough to cover the memory latency at the rate one core consumes blocks).
pub(crate) const PREFETCH_BLOCKS: usize = 4;

/// A value on a 64-byte boundary: a kernel's buffer of broadcast sources, stored a whole
/// register at a time and read back a quadword at a time (a store split over two cache
/// lines does not forward to those loads, and the loads wait for it to reach the cache).
#[repr(C, align(64))]
pub(crate) struct Aligned64<T>(pub(crate) T);

/// Hints the cache lines of block `i` of the stream that `row` starts (`i` may run past
/// the row: a matvec's rows of one stream lie one after the other, and a row of a few
/// blocks would otherwise never ask for the next one; stopping at the row's end cost
/// the four-row Q4_K and Q6_K decode kernels 10-15% of a qwen3moe decode step). Never
/// reads memory: a prefetch of an address outside the weight is dropped. SSE only, so
/// the AVX2 kernels use it too.
#[inline(always)]
pub(crate) fn prefetch_stream<B>(row: &[B], i: usize) {
    prefetch_stream_bytes(row, i, std::mem::size_of::<B>());
}

/// [`prefetch_stream`] for the `bytes` bytes from the start of block `i` (a kernel that
/// consumes several small blocks at a time).
#[inline(always)]
pub(crate) fn prefetch_stream_bytes<B>(row: &[B], i: usize, bytes: usize) {
    let p = row.as_ptr().wrapping_add(i).cast::<i8>();
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch never faults and reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        off += 64;
    }
}

/// Loads 64 bytes (quants of either sign).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn load64<T: bytemuck::Pod>(p: &[T]) -> __m512i {
    let bytes: &[u8] = bytemuck::cast_slice(p);
    assert!(bytes.len() >= 64);
    // SAFETY: at least 64 bytes are readable (checked above); loadu is unaligned.
    unsafe { _mm512_loadu_si512(bytes.as_ptr() as *const __m512i) }
}

/// 32 quant bytes in both 256-bit halves of a register.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn bcast32(p: &[u8]) -> __m512i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 bytes are readable (checked above); loadu is unaligned.
    _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) })
}

/// Per-i16-lane shift counts: 0 in the low half (low nibbles), 4 in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn nibble_shift() -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4))
}

/// For each pair `j` of 32-quant sub-blocks: `vpermw` indices putting scale `2j` in the
/// low half and scale `2j + 1` in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn pair_idx() -> [__m512i; 4] {
    [
        halves_idx(0, 1),
        halves_idx(2, 3),
        halves_idx(4, 5),
        halves_idx(6, 7),
    ]
}

/// `vpermw` indices that put i16 lane `a` in the low half and lane `b` in the high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves_idx(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// Sum of the 16 i32 lanes of `v` (exact: integer addition).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn hsum_i32(v: __m512i) -> i32 {
    let h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
    let q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b01_00_11_10>(q));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b10_11_00_01>(q));
    _mm_cvtsi128_si32(q)
}

/// `fma(a, b, c)` with one rounding, as `fmaf`.
#[inline]
#[target_feature(enable = "fma")]
pub(crate) fn fma1(a: f32, b: f32, c: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}

/// The sums of the 16 i32 lanes of each of four vectors, side by side (exact: integer
/// adds, interleaved within 128-bit lanes, then across them).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn hsum4(p0: __m512i, p1: __m512i, p2: __m512i, p3: __m512i) -> __m128i {
    let a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    let c = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    let e = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
    let h = _mm256_add_epi32(_mm512_castsi512_si256(e), _mm512_extracti64x4_epi64::<1>(e));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The upper eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn hi256(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// `permutex2var` indices of one level of [`transpose16`]: with `a` and `b` the rows
/// `i` and `i + s`, lane `p` of the new row `i` (`hi` = false) or `i + s` (true) takes,
/// per chunk of `2s` lanes, the first (`hi`: second) `s` lanes of `a`, then those of `b`.
const fn transpose_idx(s: usize, hi: bool) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut p = 0;
    while p < 16 {
        let (k, w) = (p / (2 * s), p % (2 * s));
        let base = k * 2 * s + if hi { s } else { 0 };
        idx[p] = if w < s {
            (base + w) as i32
        } else {
            (16 + base + w - s) as i32
        };
        p += 1;
    }
    idx
}

/// [`transpose16`]'s indices, per level (blocks of 8, 4, 2, 1).
const TRANSPOSE_IDX: [[[i32; 16]; 2]; 4] = [
    [transpose_idx(8, false), transpose_idx(8, true)],
    [transpose_idx(4, false), transpose_idx(4, true)],
    [transpose_idx(2, false), transpose_idx(2, true)],
    [transpose_idx(1, false), transpose_idx(1, true)],
];

/// The 16 x 16 transpose of 32-bit lanes (row `i` lane `j` -> row `j` lane `i`): blocks
/// of 8, 4, 2 and 1 lanes swapped across the diagonal, 64 two-source permutes (the
/// panel decoders: sixteen weight rows' dwords into one register per dword).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(mut r: [__m512i; 16]) -> [__m512i; 16] {
    for (level, idx) in TRANSPOSE_IDX.iter().enumerate() {
        let s = 8 >> level;
        // SAFETY: 16 readable i32 each; loadu is unaligned.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(idx[0].as_ptr() as *const __m512i),
                _mm512_loadu_si512(idx[1].as_ptr() as *const __m512i),
            )
        };
        for i in 0..16 {
            if i & s == 0 {
                let (a, b) = (r[i], r[i + s]);
                r[i] = _mm512_permutex2var_epi32(a, lo, b);
                r[i + s] = _mm512_permutex2var_epi32(a, hi, b);
            }
        }
    }
    r
}

/// An 8 x 8 transpose of 32-bit lanes in each 256-bit half at once (half `h` of `r[i]`,
/// lane `j` -> half `h` of row `j`, lane `i`): 24 shuffles, a third of [`transpose16`]'s
/// permutes for the panels of the legacy 32-quant blocks, whose rows are eight dwords
/// (sixteen rows as eight registers of two rows each, row `r + 8` in the high half).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose8_halves(r: [__m512i; 8]) -> [__m512i; 8] {
    // Pairs of rows interleaved, then pairs of pairs: `s[j]` holds dword `j` (low
    // 128-bit lane of each half) and dword `j + 4` (high lane) of four rows, the first
    // four rows' in `s[0..4]`, the last four's in `s[4..8]`.
    let t: [__m512i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let s: [__m512i; 8] = std::array::from_fn(|j| {
        // Rows 0-3 from t[0..4], rows 4-7 from t[4..8]; dwords 0/1 from the lo unpacks,
        // 2/3 from the hi ones.
        let base = if j < 4 { 0 } else { 4 };
        let (a, b) = (t[base + (j % 4) / 2], t[base + 2 + (j % 4) / 2]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // The low 128-bit lanes of s[j] and s[j + 4] make row j of each half; the high
    // lanes make row j + 4.
    let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    std::array::from_fn(|j| {
        if j < 4 {
            _mm512_permutex2var_epi64(s[j], lo, s[j + 4])
        } else {
            _mm512_permutex2var_epi64(s[j - 4], hi, s[j])
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f` applied to the rows `m` (`R` registers of 16 lanes), or `None` without
    /// AVX-512F (said on stderr, naming `what`).
    fn through<const R: usize>(
        what: &str,
        m: &[[i32; 16]; R],
        f: impl Fn([__m512i; R]) -> [__m512i; R],
    ) -> Option<[[i32; 16]; R]> {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512F: {what} not exercised");
            return None;
        }
        // SAFETY: AVX-512F was detected above; each row is 16 readable i32.
        let r =
            std::array::from_fn(|i| unsafe { _mm512_loadu_si512(m[i].as_ptr() as *const __m512i) });
        let t = f(r);
        Some(std::array::from_fn(|j| {
            let mut out = [0i32; 16];
            // SAFETY: 16 writable i32.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, t[j]) };
            out
        }))
    }

    #[test]
    fn transpose8_halves_transposes_each_half() {
        // Row i, half h, lane j holds 1000 h + 100 i + j.
        let m: [[i32; 16]; 8] = std::array::from_fn(|i| {
            std::array::from_fn(|l| (1000 * (l / 8) + 100 * i + l % 8) as i32)
        });
        // SAFETY (the call): `through` checked AVX-512F.
        let Some(t) = through("transpose8_halves", &m, |r| unsafe { transpose8_halves(r) }) else {
            return;
        };
        for (j, out) in t.iter().enumerate() {
            for (l, &x) in out.iter().enumerate() {
                let (h, i) = (l / 8, l % 8);
                assert_eq!(
                    x,
                    (1000 * h + 100 * i + j) as i32,
                    "row {j} half {h} lane {i}"
                );
            }
        }
    }

    #[test]
    fn transpose16_transposes() {
        let m: [[i32; 16]; 16] =
            std::array::from_fn(|i| std::array::from_fn(|j| (100 * i + j) as i32));
        // SAFETY (the call): `through` checked AVX-512F.
        let Some(t) = through("transpose16", &m, |r| unsafe { transpose16(r) }) else {
            return;
        };
        for (j, out) in t.iter().enumerate() {
            for (i, &x) in out.iter().enumerate() {
                assert_eq!(x, (100 * i + j) as i32, "row {j} lane {i}");
            }
        }
    }
}
