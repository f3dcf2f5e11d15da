//! Paged attention with AVX-512, in two arrangements of the SIMD lanes:
//!
//! - **Queries in lanes** ([`attend_group`], prompt batches): up to 16 query heads that
//!   read the same KV head of the same sequence (the heads of a GQA group, for every query
//!   row of the sequence in the step) attend together, one query per lane. Where a cache
//!   block's 16 slots are one run, the scores of its 16 keys are computed keys in lanes
//!   (each key element widened once, each query element broadcast: sixteen independent
//!   chains) and transposed; the weighted values of the keys every query sees are added
//!   for all 16 lanes at once (each value widened once), the others by groups of lanes
//!   that see the same keys.
//! - **Keys in lanes** ([`attend_keys_in_lanes`], decode steps): a decode row brings only
//!   the few heads of one GQA group (four on the bench preset and Gemma 3), which would
//!   leave twelve of sixteen lanes empty; instead sixteen consecutive keys of one cache
//!   block fill the lanes, read as one contiguous run per key element because the CPU
//!   cache stores keys transposed inside each block (`CpuKv`). A long context spreads
//!   one group over the threads the step leaves it (`LaneGroup::spread`): scores by
//!   tiles, the output by columns, the softmax bookkeeping in tile order between them.
//!
//! Both are bit-identical to `flint_core::math::attend_ggml_tiled` run on each (row, head)
//! alone (the scalar path in `kv.rs`), because every lane does exactly the scalar's
//! operations in the scalar's order: a score is one fused multiply-add chain over the head
//! dimension (in its own lane), tiles of 64 keys aligned on absolute positions, ggml's
//! AVX-512 `expf`, the 16-weight pairwise sum and the f64 denominator sum, and per query
//! and output element one fused multiply-add chain over the tile's visible keys. A query
//! for which a whole tile is invisible skips it, as the scalar loop does.
//! `tests/attention_simd.rs` checks the equality bit for bit.

use std::arch::x86_64::*;

use flint_core::math::GGML_FA_TILE;
use flint_hal::{HalError, PagedAttention};

use super::{
    finish_query, over_column_parts, over_tile_parts, KvSource, LaneGroup, TilePlan, CHUNK,
};

use crate::kernels::elementwise::avx512::expf_ggml;
use crate::kv::CpuKv;

/// Queries attended together.
pub(crate) const LANES: usize = 16;

/// `_mm512_reduce_add_ps`'s order over 16 vectors, lane by lane: halves added pairwise
/// (8, 4, 2, 1), as `flint_core`'s tiled attention sums 16 weights.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(w: &[__m512]) -> __m512 {
    let t: [__m512; 8] = std::array::from_fn(|i| _mm512_add_ps(w[i + 8], w[i]));
    let u: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(t[i + 4], t[i]));
    _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]))
}

/// Converts the 16 lanes of `v` to two f64 vectors.
#[inline]
#[target_feature(enable = "avx512f")]
fn widen(v: __m512) -> [__m512d; 2] {
    [
        _mm512_cvtps_pd(_mm512_castps512_ps256(v)),
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(v),
        ))),
    ]
}

/// Narrows two f64 vectors to 16 f32 lanes (round to nearest, as `as f32`).
#[inline]
#[target_feature(enable = "avx512f")]
fn narrow(v: [__m512d; 2]) -> __m512 {
    let lo = _mm512_cvtpd_ps(v[0]);
    let hi = _mm512_cvtpd_ps(v[1]);
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ))
}

/// Lane `l` of `v`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane(v: __m512, l: usize) -> f32 {
    let mut a = [0f32; LANES];
    // SAFETY: `a` is 16 writable f32; storeu is unaligned.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
    a[l]
}

/// Sixteen f16 (bits) at `p`, widened to f32 (exact).
///
/// # Safety
/// `p` must point to 16 readable `u16`; the CPU must have AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16_f16(p: *const u16) -> __m512 {
    // SAFETY: the caller guarantees 16 readable u16 (32 bytes); loadu is unaligned.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p as *const __m256i) })
}

impl KvSource<'_> {
    /// Asks for the cache lines of the keys of the 16 slots from `p0` (a multiple of 16,
    /// `runs16`) to be brought into L2: every key element's run. An unmapped position is
    /// skipped.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn prefetch_keys(&self, p0: usize, dk: usize) {
        let Some((kb, _)) = (self.at)(p0) else {
            return;
        };
        // `wrapping_add` only computes addresses (a prefetch never faults).
        let kp = self.k.as_ptr();
        for d in 0..dk {
            let a = kp.wrapping_add(kb + d * self.k_stride) as *const i8;
            _mm_prefetch::<_MM_HINT_T1>(a);
        }
    }

    /// Asks for the columns `col0..col0 + width` of the values of `tile`'s live chunks to
    /// be brought into L2.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn prefetch_values<const NQ: usize>(&self, tile: &KeyTile<NQ>, col0: usize, width: usize) {
        let vp = self.v.as_ptr();
        for &c in &tile.live[..tile.nl] {
            for j in 0..CHUNK {
                let row = vp.wrapping_add(tile.val_base[c] + j * self.v_stride + col0) as *const i8;
                for off in (0..width * 2).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(off));
                }
            }
        }
    }
}

/// Attends the queries of `g` (queries in lanes) over the keys and values of `kv`,
/// writing `dv` values per query to `out`. Errors if a visible position is not mapped.
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn attend_group(
    g: &LaneGroup<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    out: &mut [f32],
) -> Result<(), ()> {
    let n = g.q.len();
    assert!(n > 0 && n <= LANES && g.range.len() == n && g.sink.len() == n);
    assert_eq!(out.len(), n * dv, "attend_group: out length");
    let dk = g.q[0].len();
    assert!(
        g.q.iter().all(|q| q.len() == dk),
        "attend_group: query lengths"
    );
    // Queries transposed: qt[d] holds element d of every lane's query (0 in lanes
    // without one), 16 elements at a time through `transpose16`.
    let mut qt = vec![_mm512_setzero_ps(); dk];
    let mut rows = [_mm512_setzero_ps(); LANES];
    for d0 in (0..dk - dk % LANES).step_by(LANES) {
        for (r, q) in rows.iter_mut().zip(&g.q) {
            // SAFETY: d0 + 16 <= dk = q.len(); loadu is unaligned.
            *r = unsafe { _mm512_loadu_ps(q.as_ptr().add(d0)) };
        }
        qt[d0..d0 + LANES].copy_from_slice(&transpose16(&rows));
    }
    for (d, v) in qt.iter_mut().enumerate().skip(dk - dk % LANES) {
        let mut a = [0f32; LANES];
        for (x, q) in a.iter_mut().zip(&g.q) {
            *x = q[d];
        }
        // SAFETY: 16 readable f32.
        *v = unsafe { _mm512_loadu_ps(a.as_ptr()) };
    }
    let mut lo = [i32::MAX; LANES];
    let mut hi = [-1i32; LANES];
    for (l, &(a, b)) in g.range.iter().enumerate() {
        lo[l] = a as i32;
        hi[l] = b as i32;
    }
    // SAFETY: 16 readable i32 each.
    let (lo_v, hi_v) = unsafe {
        (
            _mm512_loadu_si512(lo.as_ptr() as *const __m512i),
            _mm512_loadu_si512(hi.as_ptr() as *const __m512i),
        )
    };
    let first = g.range.iter().map(|r| r.0).min().unwrap_or(0);
    let last = g.range.iter().map(|r| r.1).max().unwrap_or(0);
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut m = neg_inf;
    let mut denom = _mm512_setzero_ps();
    out.fill(0.0);
    let mut s = [neg_inf; GGML_FA_TILE];
    let mut vis = [0u16; GGML_FA_TILE];
    let mut vals: [&[u16]; GGML_FA_TILE] = [&[]; GGML_FA_TILE];
    // Without 16-key runs: the tile's visible keys widened to f32, transposed (element d
    // of tile slot t at `kt[d * GGML_FA_TILE + t]`).
    let mut kt = if kv.runs16 {
        Vec::new()
    } else {
        vec![0f32; GGML_FA_TILE * dk]
    };
    let mut t0 = first / GGML_FA_TILE * GGML_FA_TILE;
    while t0 <= last {
        // The tile's visible keys, then their scores KEYS at a time: each score is its
        // own chain over the head dimension (the reference's order), and the chains of
        // several keys run side by side instead of one after the other.
        let mut live = [0u8; GGML_FA_TILE];
        let mut nl = 0;
        for t in 0..GGML_FA_TILE {
            let p = t0 + t;
            let pv = _mm512_set1_epi32(p as i32);
            vis[t] = _mm512_cmple_epi32_mask(lo_v, pv) & _mm512_cmple_epi32_mask(pv, hi_v);
            s[t] = neg_inf;
        }
        for c in 0..GGML_FA_TILE / CHUNK {
            let chunk = c * CHUNK..(c + 1) * CHUNK;
            if vis[chunk.clone()].iter().all(|&v| v == 0) {
                continue;
            }
            if kv.runs16 {
                // Sixteen slots of one block, each key element of all of them one run:
                // their scores are computed here, keys in lanes, and turned to queries
                // in lanes.
                let (kb, vb) = kv.locate(t0 + chunk.start, dk, dv, CHUNK).ok_or(())?;
                // SAFETY: `locate` checked that the 16 keys' `dk` strided elements lie in
                // `kv.k`; `qt` holds `dk` vectors of 16 queries.
                let sc = unsafe {
                    score_chunk(
                        qt.as_ptr() as *const f32,
                        dk,
                        kv.k.as_ptr().add(kb),
                        kv.k_stride,
                    )
                };
                let mut sc = sc;
                for a in sc.iter_mut() {
                    *a = _mm512_mul_ps(*a, _mm512_set1_ps(scale));
                }
                let sc = transpose16(&sc);
                for j in 0..CHUNK {
                    let t = chunk.start + j;
                    s[t] = _mm512_mask_blend_ps(vis[t], neg_inf, sc[j]);
                }
                for (j, v) in vals[chunk.clone()].iter_mut().enumerate() {
                    *v = &kv.v[vb + j * kv.v_stride..vb + j * kv.v_stride + dv];
                }
            } else {
                for t in chunk.clone().filter(|&t| vis[t] != 0) {
                    let (kb, vb) = kv.locate(t0 + t, dk, dv, 1).ok_or(())?;
                    vals[t] = &kv.v[vb..vb + dv];
                    for d in 0..dk {
                        kt[d * GGML_FA_TILE + t] =
                            half::f16::from_bits(kv.k[kb + d * kv.k_stride]).to_f32();
                    }
                }
            }
        }
        for t in 0..GGML_FA_TILE {
            if vis[t] == 0 {
                continue;
            }
            live[nl] = t as u8;
            nl += 1;
        }
        const KEYS: usize = 4;
        // Slots not in 16-key runs: the scores from the transposed keys, KEYS at a time.
        let scattered = if kv.runs16 { 0 } else { nl };
        for c in live[..scattered].chunks(KEYS) {
            let mut acc = [_mm512_setzero_ps(); KEYS];
            let ts: [usize; KEYS] = std::array::from_fn(|j| usize::from(c[j.min(c.len() - 1)]));
            for (d, row) in kt.chunks_exact(GGML_FA_TILE).enumerate() {
                for j in 0..KEYS {
                    acc[j] = _mm512_fmadd_ps(qt[d], _mm512_set1_ps(row[ts[j]]), acc[j]);
                }
            }
            for (j, &t) in c.iter().enumerate() {
                let t = usize::from(t);
                s[t] = _mm512_mask_blend_ps(
                    vis[t],
                    neg_inf,
                    _mm512_mul_ps(acc[j], _mm512_set1_ps(scale)),
                );
            }
        }
        let tile_max = s.iter().fold(neg_inf, |a, &b| _mm512_max_ps(a, b));
        let active =
            _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(tile_max, neg_inf) & ((1u32 << n) - 1) as u16;
        if active == 0 {
            t0 += GGML_FA_TILE;
            continue;
        }
        let m_new = _mm512_max_ps(m, tile_max);
        let grow = active & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m_new, m);
        if grow != 0 {
            let mut dn = [0f32; LANES];
            // SAFETY: 16 writable f32.
            unsafe { _mm512_storeu_ps(dn.as_mut_ptr(), denom) };
            for l in (0..n).filter(|l| grow >> l & 1 == 1) {
                let ms = flint_core::math::expf_libc(lane(m, l) - lane(m_new, l));
                for o in &mut out[l * dv..(l + 1) * dv] {
                    *o *= ms;
                }
                dn[l] *= ms;
            }
            // SAFETY: 16 readable f32.
            denom = unsafe { _mm512_loadu_ps(dn.as_ptr()) };
        }
        m = _mm512_mask_blend_ps(active, m, m_new);
        let mut w = [_mm512_setzero_ps(); GGML_FA_TILE];
        let mut sum = [_mm512_setzero_pd(); 2];
        for (wc, sc) in w.chunks_exact_mut(16).zip(s.chunks_exact(16)) {
            for (wt, &st) in wc.iter_mut().zip(sc) {
                *wt = expf_ggml(_mm512_sub_ps(st, m));
            }
            let part = widen(reduce16(wc));
            sum = [
                _mm512_add_pd(sum[0], part[0]),
                _mm512_add_pd(sum[1], part[1]),
            ];
        }
        let d64 = widen(denom);
        let nd = narrow([_mm512_add_pd(d64[0], sum[0]), _mm512_add_pd(d64[1], sum[1])]);
        denom = _mm512_mask_blend_ps(active, denom, nd);
        // Output: per lane, one fused multiply-add chain over the visible keys, in order,
        // 16 output elements at a time.
        let mut wl = [[0f32; LANES]; GGML_FA_TILE];
        for (a, v) in wl.iter_mut().zip(&w) {
            // SAFETY: 16 writable f32.
            unsafe { _mm512_storeu_ps(a.as_mut_ptr(), *v) };
        }
        // Keys every query sees (the interval where all ranges meet; each lane's keys
        // are an interval around it) go with all the lanes at once, so that each value
        // is widened once for the whole group; the keys before and after them go by
        // lanes that see the same keys. Each lane still adds its keys in order.
        let live = &live[..nl];
        let nmask = ((1u32 << n) - 1) as u16;
        let (a, b) = match common_keys(g, t0) {
            Some((ca, cb)) if active == nmask && (n == LANES || n == LANES / 2) => (
                live.partition_point(|&t| t0 + usize::from(t) < ca),
                live.partition_point(|&t| t0 + usize::from(t) <= cb),
            ),
            _ => (nl, nl),
        };
        accumulate_by_visibility(n, active, &live[..a], &vis, &vals, &wl, dv, out);
        if a < b {
            accumulate_lanes(n, out, dv, 0, dv, &live[a..b], &vals, &wl, 0);
        }
        accumulate_by_visibility(n, active, &live[b..], &vis, &vals, &wl, dv, out);
        t0 += GGML_FA_TILE;
    }
    for l in 0..n {
        finish_query(
            &mut out[l * dv..(l + 1) * dv],
            lane(m, l),
            lane(denom, l),
            g.sink[l],
        );
    }
    Ok(())
}

/// The unscaled scores of 16 queries against the 16 keys of a run, keys in lanes:
/// `acc[l]` lane `j` is query `l`'s score of key `j`, one fused multiply-add chain over
/// the head dimension from 0, as the reference computes each score. `qt` holds element
/// `d` of query `l` at `qt[d * 16 + l]`; element `d` of key `j` is at `k[d * k_stride +
/// j]` (f16 bits). Each key element is widened once for all 16 queries and each chain
/// is independent, so the multiply-adds issue back to back.
///
/// # Safety
/// `qt` must hold `16 * dk` readable f32 and `k` the 16 elements of every `d < dk` at
/// `d * k_stride`; the CPU must have AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn score_chunk(qt: *const f32, dk: usize, k: *const u16, k_stride: usize) -> [__m512; 16] {
    let mut acc = [_mm512_setzero_ps(); LANES];
    for d in 0..dk {
        // SAFETY: the caller guarantees the 16 key elements and the 16 query elements.
        unsafe {
            let kv = load16_f16(k.add(d * k_stride));
            let q = qt.add(d * LANES);
            for (l, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(l)), kv, *a);
            }
        }
    }
    acc
}

/// The transpose of a 16 x 16 block of f32: lane `l` of vector `j` of the result is
/// lane `j` of vector `l` of `a` (moves only, every bit kept).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(a: &[__m512; 16]) -> [__m512; 16] {
    // Loops, not closures: a closure does not inherit the target features and would
    // pass the vectors through memory.
    let mut r = [_mm512_setzero_si512(); 16];
    for (d, v) in r.iter_mut().zip(a) {
        *d = _mm512_castps_si512(*v);
    }
    let r = crate::kernels::x86::avx512::transpose16(r);
    let mut t = [_mm512_setzero_ps(); 16];
    for (d, v) in t.iter_mut().zip(r) {
        *d = _mm512_castsi512_ps(v);
    }
    t
}

/// The positions every query of `g` sees (the meet of their ranges), if any lies in
/// the 64-key tile from `t0`.
fn common_keys(g: &LaneGroup<'_>, t0: usize) -> Option<(usize, usize)> {
    let ca = g.range.iter().map(|r| r.0).max()?.max(t0);
    let cb = g
        .range
        .iter()
        .map(|r| r.1)
        .min()?
        .min(t0 + GGML_FA_TILE - 1);
    (ca <= cb).then_some((ca, cb))
}

/// `out` (`n` queries of `dv` values) += the weighted values of the tile slots `keys`
/// (in order), for the `active` lanes, each seeing the keys its `vis` bits give: up to
/// four consecutive lanes that see the same keys (the heads of one query row) go
/// together, so that each value loaded feeds all of them.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate_by_visibility(
    n: usize,
    active: u16,
    keys: &[u8],
    vis: &[u16; GGML_FA_TILE],
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; LANES]; GGML_FA_TILE],
    dv: usize,
    out: &mut [f32],
) {
    if keys.is_empty() {
        return;
    }
    let mut l = 0;
    while l < n {
        if active >> l & 1 == 0 {
            l += 1;
            continue;
        }
        // The keys this lane sees, in order, and the lanes after it that see the same.
        let mut mine = [0u8; GGML_FA_TILE];
        let mut nm = 0;
        // Bit k: lane l + k differs from lane l somewhere (or is not active).
        let mut differ = 0u32;
        for k in 1..4 {
            if l + k >= n || active >> (l + k) & 1 == 0 {
                differ |= 1 << k;
            }
        }
        for &t in keys {
            let vt = u32::from(vis[usize::from(t)]);
            let own = vt >> l & 1;
            for k in 1..4 {
                if (vt >> (l + k).min(15) & 1) != own {
                    differ |= 1 << k;
                }
            }
            if own == 1 {
                mine[nm] = t;
                nm += 1;
            }
        }
        // Lanes l .. l + lanes all see the same keys.
        let lanes = ((differ | 1 << 4) >> 1).trailing_zeros() as usize + 1;
        let o = &mut out[l * dv..(l + lanes) * dv];
        accumulate_lanes(lanes, o, dv, 0, dv, &mine[..nm], vals, wl, l);
        l += lanes;
    }
}

/// Queries that [`attend_keys_in_lanes`] takes at once: a decode row's GQA group.
pub(crate) const KEY_LANE_QUERIES: usize = 8;

/// Bit `j` set where position `p0 + j` lies in `lo..=hi`, for `j` in `0..16`.
#[inline]
fn visible16(p0: usize, (lo, hi): (usize, usize)) -> u16 {
    if hi < p0 || lo > p0 + (CHUNK - 1) {
        return 0;
    }
    let start = lo.saturating_sub(p0);
    let end = (hi - p0).min(CHUNK - 1);
    let upto = (1u32 << (end + 1)) - 1;
    (upto & !((1u32 << start) - 1)) as u16
}

/// The pairwise sum of 16 weights, as `flint_core`'s tiled attention adds them: lanes
/// `i` and `i + 8`, then `i` and `i + 4`, then (0 + 2) + (1 + 3).
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce_add_16(w: __m512) -> f32 {
    let mut a = [0f32; CHUNK];
    // SAFETY: 16 writable f32; storeu is unaligned.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), w) };
    let t: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let u: [f32; 4] = std::array::from_fn(|i| t[i + 4] + t[i]);
    (u[0] + u[2]) + (u[1] + u[3])
}

/// Attends the queries of `g` (at most [`KEY_LANE_QUERIES`]) with keys in lanes: the
/// scores of sixteen consecutive keys are one vector per query, each lane one fused
/// multiply-add chain over the head dimension. `kv.at` of a position that is a multiple
/// of 16 must give a run of 16 slots (`kv.runs16`). Errors if a visible position is not
/// mapped.
///
/// The work runs in three passes, so that a long context can use every thread the step
/// leaves to this group (`g.spread`) without changing a single operation:
///
/// 1. scores, tile by tile ([`score_tiles`]): each score is its own chain, so the tiles
///    can be split over threads;
/// 2. the running maximum, the weights and the denominator ([`weigh_tiles`]), in tile
///    order on one thread (a few vector operations per 16 keys);
/// 3. the output ([`accumulate_tiles`]): per output element one chain over every tile's
///    keys with the rescales between tiles, so the output elements can be split over
///    threads (each thread reads its columns of every value).
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn attend_keys_in_lanes(
    g: &LaneGroup<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    out: &mut [f32],
) -> Result<(), ()> {
    match g.q.len() {
        1 => keys_in_lanes::<1>(g, kv, scale, dv, out),
        2 => keys_in_lanes::<2>(g, kv, scale, dv, out),
        3 | 4 => keys_in_lanes::<4>(g, kv, scale, dv, out),
        5..=KEY_LANE_QUERIES => keys_in_lanes::<KEY_LANE_QUERIES>(g, kv, scale, dv, out),
        n => panic!("attend_keys_in_lanes: {n} queries"),
    }
}

/// Chunks of 16 keys in a 64-key tile.
const TILE_CHUNKS: usize = GGML_FA_TILE / CHUNK;

/// One 64-key tile as [`keys_in_lanes`] walks it.
#[derive(Clone, Copy)]
struct KeyTile<const NQ: usize> {
    /// Per query and chunk: bit `j` set where the query sees key `j` of the chunk.
    vis: [[u16; TILE_CHUNKS]; NQ],
    /// The chunks some query sees a key of (the first `nl`), in order.
    live: [usize; TILE_CHUNKS],
    nl: usize,
    /// Per live chunk: where its keys' element 0 and its first value lie.
    key_base: [usize; TILE_CHUNKS],
    val_base: [usize; TILE_CHUNKS],
    /// Per query: whether it sees a key of the tile, and the factor its output is
    /// scaled by before the tile's keys are added (`None`: the maximum did not grow).
    active: [bool; NQ],
    rescale: [Option<f32>; NQ],
}

impl<const NQ: usize> KeyTile<NQ> {
    const EMPTY: Self = KeyTile {
        vis: [[0; TILE_CHUNKS]; NQ],
        live: [0; TILE_CHUNKS],
        nl: 0,
        key_base: [0; TILE_CHUNKS],
        val_base: [0; TILE_CHUNKS],
        active: [false; NQ],
        rescale: [None; NQ],
    };
}

/// Tiles ahead whose values the output pass asks for (it spends less time per tile than
/// the score pass, so it asks further ahead).
const VALUES_AHEAD: usize = 4;

/// Per tile: each query's 64 scores (`-inf` where it does not see the key; the rows of
/// `NQ` beyond the group's queries are never read).
type TileScores<const NQ: usize> = [[f32; GGML_FA_TILE]; NQ];
/// Per tile: each key's weight for each query.
type TileWeights<const NQ: usize> = [[f32; NQ]; GGML_FA_TILE];

/// [`attend_keys_in_lanes`] for up to `NQ` queries (the rest of the `NQ` chains repeat
/// the first query and are dropped).
#[target_feature(enable = "avx512f,avx2,fma")]
fn keys_in_lanes<const NQ: usize>(
    g: &LaneGroup<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    out: &mut [f32],
) -> Result<(), ()> {
    let n = g.q.len();
    assert!(n > 0 && n <= NQ && g.range.len() == n && g.sink.len() == n);
    assert!(kv.runs16, "attend_keys_in_lanes: keys not in runs of 16");
    assert_eq!(out.len(), n * dv, "attend_keys_in_lanes: out length");
    let plan = TilePlan::of(g);
    let (spread, win) = (plan.spread, plan.win);
    let mut tiles = vec![KeyTile::<NQ>::EMPTY; win];
    let mut scores = vec![[[0f32; GGML_FA_TILE]; NQ]; win];
    let mut weights = vec![[[0f32; NQ]; GGML_FA_TILE]; win];
    let mut m = [f32::NEG_INFINITY; NQ];
    let mut denom = [0f32; NQ];
    out.fill(0.0);
    for (k, t_win) in plan.windows() {
        let tiles = &mut tiles[..k];
        tiles.fill(KeyTile::EMPTY);
        // The closures inherit this function's target features; its caller's guarantee
        // (AVX-512F on this CPU) holds on every thread of the pool.
        over_tile_parts(spread, tiles, &mut scores[..k], |first, t, s| {
            score_tiles(g, kv, scale, dv, t_win + first * GGML_FA_TILE, t, s)
        })?;
        weigh_tiles(
            n,
            tiles,
            &scores[..k],
            &mut weights[..k],
            &mut m,
            &mut denom,
        );
        let (tiles, weights) = (&*tiles, &weights[..k]);
        over_column_parts(spread, n, dv, out, |col0, width, o| {
            accumulate_tiles(n, tiles, weights, kv, dv, col0, width, o)
        });
    }
    for i in 0..n {
        finish_query(&mut out[i * dv..(i + 1) * dv], m[i], denom[i], g.sink[i]);
    }
    Ok(())
}

/// The first pass of [`keys_in_lanes`] over the consecutive tiles from `t_first`: which
/// keys each query sees, where they lie, and their scores. Errors if a visible position
/// is not mapped.
#[target_feature(enable = "avx512f,avx2,fma")]
fn score_tiles<const NQ: usize>(
    g: &LaneGroup<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    t_first: usize,
    tiles: &mut [KeyTile<NQ>],
    scores: &mut [TileScores<NQ>],
) -> Result<(), ()> {
    let n = g.q.len();
    let dk = g.q[0].len();
    let qs: [&[f32]; NQ] = std::array::from_fn(|i| &g.q[i.min(n - 1)][..dk]);
    let last = g.range.iter().map(|r| r.1).max().unwrap_or(0);
    // Prefetches run past this call's tiles into the next window's or part's.
    let end = last + 1;
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let vscale = _mm512_set1_ps(scale);
    let (kp, k_stride) = (kv.k.as_ptr(), kv.k_stride);
    // The cache is cold in a decode step (the step's weights have passed through the
    // caches since the last one) and its blocks are scattered, so the hardware
    // prefetchers see only short runs and the reads wait on latency. So the keys of the
    // first two tiles are asked for now and those two tiles ahead at each tile, into L2
    // (into L1, or one tile ahead, is too late to hide the latency; `attention_speed`
    // measures it).
    for p0 in (t_first..end.min(t_first + 2 * GGML_FA_TILE)).step_by(CHUNK) {
        kv.prefetch_keys(p0, dk);
    }
    for (idx, (tile, s)) in tiles.iter_mut().zip(scores.iter_mut()).enumerate() {
        let t0 = t_first + idx * GGML_FA_TILE;
        for c in 0..TILE_CHUNKS {
            let p0 = t0 + c * CHUNK;
            let mut any = 0u16;
            for i in 0..n {
                tile.vis[i][c] = visible16(p0, g.range[i]);
                any |= tile.vis[i][c];
            }
            if any == 0 {
                for row in s.iter_mut().take(n) {
                    row[c * CHUNK..(c + 1) * CHUNK].fill(f32::NEG_INFINITY);
                }
                continue;
            }
            let (kb, vb) = kv.locate(p0, dk, dv, CHUNK).ok_or(())?;
            tile.key_base[c] = kb;
            tile.val_base[c] = vb;
            tile.live[tile.nl] = c;
            tile.nl += 1;
        }
        let ahead = t0 + 2 * GGML_FA_TILE;
        for p0 in (ahead..end.min(ahead + GGML_FA_TILE)).step_by(CHUNK) {
            kv.prefetch_keys(p0, dk);
        }
        // Two chunks at a time: 2 * NQ independent chains.
        for pair in tile.live[..tile.nl].chunks(2) {
            let (c0, c1) = (pair[0], pair[pair.len() - 1]);
            let (b0, b1) = (tile.key_base[c0], tile.key_base[c1]);
            let mut a0 = [_mm512_setzero_ps(); NQ];
            let mut a1 = [_mm512_setzero_ps(); NQ];
            for d in 0..dk {
                // SAFETY: `locate` checked that 16 keys' element d lie in `kv.k`.
                let (x0, x1) = unsafe {
                    (
                        load16_f16(kp.add(b0 + d * k_stride)),
                        load16_f16(kp.add(b1 + d * k_stride)),
                    )
                };
                for i in 0..NQ {
                    let qd = _mm512_set1_ps(qs[i][d]);
                    a0[i] = _mm512_fmadd_ps(qd, x0, a0[i]);
                    a1[i] = _mm512_fmadd_ps(qd, x1, a1[i]);
                }
            }
            for i in 0..n {
                for (c, a) in [(c0, a0[i]), (c1, a1[i])] {
                    let v = _mm512_mask_blend_ps(tile.vis[i][c], neg_inf, _mm512_mul_ps(a, vscale));
                    // SAFETY: 16 writable f32 at `c * CHUNK` of a 64-f32 row.
                    unsafe { _mm512_storeu_ps(s[i].as_mut_ptr().add(c * CHUNK), v) };
                }
            }
        }
    }
    Ok(())
}

/// The second pass of [`keys_in_lanes`], tile by tile in order: per query the running
/// maximum `m` (and the rescale it asks of the output so far), the weights of the
/// tile's keys (ggml's AVX-512 `expf`) and the denominator `denom` (each chunk's 16
/// weights summed pairwise, the tile's sum in f64), as the scalar.
#[target_feature(enable = "avx512f,avx2,fma")]
fn weigh_tiles<const NQ: usize>(
    n: usize,
    tiles: &mut [KeyTile<NQ>],
    scores: &[TileScores<NQ>],
    weights: &mut [TileWeights<NQ>],
    m: &mut [f32; NQ],
    denom: &mut [f32; NQ],
) {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    for ((tile, s), wl) in tiles.iter_mut().zip(scores).zip(weights.iter_mut()) {
        for i in 0..n {
            // SAFETY: each of the four loads reads 16 f32 of a 64-f32 row.
            let sv: [__m512; TILE_CHUNKS] =
                std::array::from_fn(|c| unsafe { _mm512_loadu_ps(s[i].as_ptr().add(c * CHUNK)) });
            let tile_max =
                _mm512_reduce_max_ps(sv.iter().fold(neg_inf, |a, &b| _mm512_max_ps(a, b)));
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
            tile.active[i] = true;
            let m_new = m[i].max(tile_max);
            if m_new > m[i] {
                let ms = flint_core::math::expf_libc(m[i] - m_new);
                tile.rescale[i] = Some(ms);
                denom[i] *= ms;
            }
            m[i] = m_new;
            let mv = _mm512_set1_ps(m_new);
            let mut sum = 0f64;
            for &c in &tile.live[..tile.nl] {
                let w = expf_ggml(_mm512_sub_ps(sv[c], mv));
                sum += f64::from(reduce_add_16(w));
                let mut a = [0f32; CHUNK];
                // SAFETY: 16 writable f32; storeu is unaligned.
                unsafe { _mm512_storeu_ps(a.as_mut_ptr(), w) };
                for (j, &x) in a.iter().enumerate() {
                    wl[c * CHUNK + j][i] = x;
                }
            }
            denom[i] = (f64::from(denom[i]) + sum) as f32;
        }
    }
}

/// The third pass of [`keys_in_lanes`] for the output columns `col0..col0 + width` (of
/// `dv`): `o` (`n` rows of `width`) accumulates every tile's weighted values, each
/// tile's rescales first, as the scalar does for those columns.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate_tiles<const NQ: usize>(
    n: usize,
    tiles: &[KeyTile<NQ>],
    weights: &[TileWeights<NQ>],
    kv: &KvSource<'_>,
    dv: usize,
    col0: usize,
    width: usize,
    o: &mut [f32],
) {
    assert_eq!(o.len(), n * width, "accumulate_tiles: out length");
    assert!(col0 + width <= dv, "accumulate_tiles: columns beyond dv");
    let mut vals: [&[u16]; GGML_FA_TILE] = [&[]; GGML_FA_TILE];
    // The values of the first tiles now, then `VALUES_AHEAD` tiles ahead (see
    // `score_tiles`).
    for tile in tiles.iter().take(VALUES_AHEAD) {
        kv.prefetch_values(tile, col0, width);
    }
    for (idx, (tile, wl)) in tiles.iter().zip(weights).enumerate() {
        if let Some(ahead) = tiles.get(idx + VALUES_AHEAD) {
            kv.prefetch_values(ahead, col0, width);
        }
        for &c in &tile.live[..tile.nl] {
            let vb = tile.val_base[c];
            for (j, v) in vals[c * CHUNK..(c + 1) * CHUNK].iter_mut().enumerate() {
                *v = &kv.v[vb + j * kv.v_stride..vb + j * kv.v_stride + dv];
            }
        }
        for i in 0..n {
            if let Some(ms) = tile.rescale[i] {
                for x in &mut o[i * width..(i + 1) * width] {
                    *x *= ms;
                }
            }
        }
        // Queries that see the same keys (the heads of one decode row) go together, up
        // to four, so that each value block loaded feeds all of them.
        let mut i = 0;
        while i < n {
            if !tile.active[i] {
                i += 1;
                continue;
            }
            let mut lanes = 1;
            while lanes < 4
                && i + lanes < n
                && tile.active[i + lanes]
                && tile.vis[i + lanes] == tile.vis[i]
            {
                lanes += 1;
            }
            let mut mine = [0u8; GGML_FA_TILE];
            let mut nm = 0;
            for &c in &tile.live[..tile.nl] {
                let mut bits = tile.vis[i][c];
                while bits != 0 {
                    mine[nm] = (c * CHUNK) as u8 + bits.trailing_zeros() as u8;
                    nm += 1;
                    bits &= bits - 1;
                }
            }
            let out = &mut o[i * width..(i + lanes) * width];
            accumulate_lanes(lanes, out, width, col0, width, &mine[..nm], &vals, wl, i);
            i += lanes;
        }
    }
}

/// [`accumulate`] for `lanes` (1 to 4, 8 or 16) lanes from `l0`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate_lanes<const W: usize>(
    lanes: usize,
    o: &mut [f32],
    stride: usize,
    col0: usize,
    width: usize,
    mine: &[u8],
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; W]; GGML_FA_TILE],
    l0: usize,
) {
    let cols = Cols {
        stride,
        col0,
        width,
    };
    match lanes {
        16 => accumulate::<16, W>(o, cols, mine, vals, wl, l0),
        8 => accumulate::<8, W>(o, cols, mine, vals, wl, l0),
        4 => accumulate::<4, W>(o, cols, mine, vals, wl, l0),
        3 => accumulate::<3, W>(o, cols, mine, vals, wl, l0),
        2 => accumulate::<2, W>(o, cols, mine, vals, wl, l0),
        _ => accumulate::<1, W>(o, cols, mine, vals, wl, l0),
    }
}

/// Which output columns an [`accumulate`] call adds to: lane `k`'s column `col0 + d` (of
/// the values) is `o[k * stride + d]`, for `d` in `0..width`.
#[derive(Clone, Copy)]
struct Cols {
    stride: usize,
    col0: usize,
    width: usize,
}

/// `o` (the outputs of lanes `l0..l0 + L`, the columns `cols`) += the weighted values of
/// the keys `mine` (tile slots, in order; `wl[t][l]` the weight of slot `t` for lane
/// `l`): per lane and output element one fused multiply-add chain over the keys, as the
/// reference. Groups of 16 elements side by side (independent chains), each value block
/// loaded once for the `L` lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate<const L: usize, const W: usize>(
    o: &mut [f32],
    cols: Cols,
    mine: &[u8],
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; W]; GGML_FA_TILE],
    l0: usize,
) {
    let Cols {
        stride,
        col0,
        width,
    } = cols;
    assert!(
        o.len() >= (L - 1) * stride + width,
        "accumulate: output length"
    );
    let mut d0 = 0;
    // Sixteen accumulators at most: runs of 64 columns for up to four lanes, of 32 for
    // eight, of 16 for sixteen.
    if L <= 4 {
        while d0 + 4 * 16 <= width {
            accumulate_run::<L, 4, W>(o, stride, d0, col0 + d0, mine, vals, wl, l0);
            d0 += 4 * 16;
        }
    } else if L <= 8 {
        while d0 + 2 * 16 <= width {
            accumulate_run::<L, 2, W>(o, stride, d0, col0 + d0, mine, vals, wl, l0);
            d0 += 2 * 16;
        }
    }
    while d0 + 16 <= width {
        accumulate_run::<L, 1, W>(o, stride, d0, col0 + d0, mine, vals, wl, l0);
        d0 += 16;
    }
    for k in 0..L {
        for d in d0..width {
            let mut acc = o[k * stride + d];
            for &t in mine {
                let v = half::f16::from_bits(vals[usize::from(t)][col0 + d]).to_f32();
                acc = wl[usize::from(t)][l0 + k].mul_add(v, acc);
            }
            o[k * stride + d] = acc;
        }
    }
}

/// [`accumulate`] for the `16 * C` output elements from `d0` (value columns from `c0`).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate_run<const L: usize, const C: usize, const W: usize>(
    o: &mut [f32],
    stride: usize,
    d0: usize,
    c0: usize,
    mine: &[u8],
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; W]; GGML_FA_TILE],
    l0: usize,
) {
    assert!((L - 1) * stride + d0 + 16 * C <= o.len());
    let mut acc = [[_mm512_setzero_ps(); C]; L];
    for (k, ak) in acc.iter_mut().enumerate() {
        for (c, a) in ak.iter_mut().enumerate() {
            // SAFETY: k * stride + d0 + 16 * C <= o.len() (asserted); loadu is unaligned.
            *a = unsafe { _mm512_loadu_ps(o.as_ptr().add(k * stride + d0 + 16 * c)) };
        }
    }
    for &t in mine {
        let t = usize::from(t);
        let v = &vals[t][c0..c0 + 16 * C];
        let mut wt = [_mm512_setzero_ps(); L];
        for (k, w) in wt.iter_mut().enumerate() {
            *w = _mm512_set1_ps(wl[t][l0 + k]);
        }
        for c in 0..C {
            // SAFETY: `v` holds 16 * C readable u16.
            let vv = unsafe { load16_f16(v.as_ptr().add(16 * c)) };
            for k in 0..L {
                acc[k][c] = _mm512_fmadd_ps(wt[k], vv, acc[k][c]);
            }
        }
    }
    for (k, ak) in acc.iter().enumerate() {
        for (c, a) in ak.iter().enumerate() {
            // SAFETY: as the loads above; storeu is unaligned.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(k * stride + d0 + 16 * c), *a) };
        }
    }
}

/// Paged attention over every sequence of `p`, in groups of up to [`LANES`] queries
/// that share a sequence and a KV head ([`super::paged_attention_in_groups`]): keys in
/// lanes for a decode row's few heads where a block's 16 slots are one run, queries in
/// lanes otherwise. The same contract and checks as the scalar `kv::paged_attention`.
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
pub(crate) unsafe fn paged_attention(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<(), HalError> {
    let run = |g: &LaneGroup<'_>, src: &KvSource<'_>, o: &mut [f32]| {
        if src.runs16 && g.q.len() <= KEY_LANE_QUERIES {
            // SAFETY: the caller guarantees AVX-512F.
            unsafe { attend_keys_in_lanes(g, src, p.scale, o.len() / g.q.len(), o) }
        } else {
            // SAFETY: as above.
            unsafe { attend_group(g, src, p.scale, o.len() / g.q.len(), o) }
        }
    };
    super::paged_attention_in_groups(kv, p, out, LANES, &run)
}
