//! Paged attention with AVX2 + FMA + F16C: up to eight query heads that read the same KV
//! head of the same sequence (the heads of a GQA group, for every query row of the
//! sequence in the step) attend together, one query per lane of a 256-bit vector; each
//! key element is widened once and broadcast to all of them.
//!
//! Bit-identical to `flint_core::math::attend_ggml_tiled` run on each (row, head) alone
//! (see the parent module): a lane does exactly the scalar's operations in the scalar's
//! order. Scores run eight keys side by side (eight independent chains, each over the
//! head dimension in order): keys in lanes where a cache block's 16 slots are one run
//! (each key element widened once, then the block of scores transposed), else from a
//! transposed copy of the tile's keys. The output of each query is one fused multiply-add
//! chain per element over the tile's visible keys, eight elements per vector; the keys
//! that all eight lanes see go for the eight at once (each value widened once). A long context spreads
//! one group over the threads the step leaves it (`LaneGroup::spread`): scores by tiles,
//! the output by columns, the softmax bookkeeping in tile order between them.

use std::arch::x86_64::*;

use flint_core::math::GGML_FA_TILE;
use flint_hal::{HalError, PagedAttention};

use super::{
    finish_query, over_column_parts, over_tile_parts, KvSource, LaneGroup, TilePlan, CHUNK,
};
use crate::kernels::elementwise::avx2::expf_ggml;
use crate::kernels::x86::avx2::transpose8;
use crate::kv::CpuKv;

/// Queries attended together.
pub(crate) const LANES: usize = 8;

/// Keys scored side by side (independent fused multiply-add chains).
const KEYS: usize = 8;

/// `_mm512_reduce_add_ps`'s order over 16 vectors, lane by lane: halves added pairwise
/// (8, 4, 2, 1), as `flint_core`'s tiled attention sums 16 weights.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce16(w: &[__m256]) -> __m256 {
    let t: [__m256; 8] = std::array::from_fn(|i| _mm256_add_ps(w[i + 8], w[i]));
    let u: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(t[i + 4], t[i]));
    _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]))
}

/// The eight lanes of `v` as two f64 vectors.
#[inline]
#[target_feature(enable = "avx2")]
fn widen(v: __m256) -> [__m256d; 2] {
    [
        _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
    ]
}

/// Two f64 vectors narrowed to eight f32 lanes (round to nearest, as `as f32`).
#[inline]
#[target_feature(enable = "avx2")]
fn narrow(v: [__m256d; 2]) -> __m256 {
    _mm256_set_m128(_mm256_cvtpd_ps(v[1]), _mm256_cvtpd_ps(v[0]))
}

/// The lanes of `v` as an array.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(v: __m256) -> [f32; LANES] {
    let mut a = [0f32; LANES];
    // SAFETY: `a` is 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// An all-ones lane where bit `l` of `bits` is set.
#[inline]
#[target_feature(enable = "avx2")]
fn mask_of(bits: u8) -> __m256 {
    let sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let hit = _mm256_and_si256(_mm256_set1_epi32(i32::from(bits)), sel);
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(hit, sel))
}

/// Bit `l` set where lane `l` of `v` is all ones (a comparison's result).
#[inline]
#[target_feature(enable = "avx2")]
fn bits_of(v: __m256) -> u8 {
    _mm256_movemask_ps(v) as u8
}

/// Attends the queries of `g` (queries in lanes) over the keys and values of `kv`,
/// writing `dv` values per query to `out`. Errors if a visible position is not mapped.
///
/// Three passes, so that a long context can use every thread the step leaves to this
/// group (`g.spread`) without changing an operation: the scores tile by tile
/// ([`score_tiles`], split by tiles), the running maximum, weights and denominators in
/// tile order ([`weigh_tiles`]), then the output ([`accumulate_tiles`], split by
/// columns: per element one chain over every tile's keys, the rescales between tiles).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (checked at device open).
#[target_feature(enable = "avx2,fma,f16c")]
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
    // Queries transposed: qt[d] holds element d of every lane's query.
    let qt: Vec<[f32; LANES]> = (0..dk)
        .map(|d| {
            let mut a = [0f32; LANES];
            for (l, q) in g.q.iter().enumerate() {
                a[l] = q[d];
            }
            a
        })
        .collect();
    let plan = TilePlan::of(g);
    let (spread, win) = (plan.spread, plan.win);
    let mut tiles = vec![Tile::EMPTY; win];
    let mut weights = vec![[[0f32; LANES]; GGML_FA_TILE]; win];
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut denom = _mm256_setzero_ps();
    out.fill(0.0);
    for (k, t_win) in plan.windows() {
        let tiles = &mut tiles[..k];
        tiles.fill(Tile::EMPTY);
        // The closures inherit this function's target features; its caller's guarantee
        // (AVX2, FMA and F16C on this CPU) holds on every thread of the pool.
        over_tile_parts(spread, tiles, &mut weights[..k], |first, t, s| {
            score_tiles(g, &qt, kv, scale, dv, t_win + first * GGML_FA_TILE, t, s)
        })?;
        weigh_tiles(n, tiles, &mut weights[..k], &mut m, &mut denom);
        let (tiles, weights) = (&*tiles, &weights[..k]);
        over_column_parts(spread, n, dv, out, |col0, width, o| {
            accumulate_tiles(n, tiles, weights, kv, col0, width, o)
        });
    }
    let (m, denom) = (lanes(m), lanes(denom));
    for l in 0..n {
        finish_query(&mut out[l * dv..(l + 1) * dv], m[l], denom[l], g.sink[l]);
    }
    Ok(())
}

/// One 64-key tile as [`attend_group`] walks it.
#[derive(Clone, Copy)]
struct Tile {
    /// Per tile slot: bit `l` set where lane `l` sees the key.
    vis: [u8; GGML_FA_TILE],
    /// The slots some lane sees (the first `nl`), in order.
    live: [u8; GGML_FA_TILE],
    nl: usize,
    /// Per live slot: where its value starts in the cache.
    val: [usize; GGML_FA_TILE],
    /// Bit `l`: lane `l` sees a key of the tile; `grow`: its maximum grew, its output
    /// scaled by `ms[l]` before the tile's keys are added.
    active: u8,
    grow: u8,
    ms: [f32; LANES],
}

impl Tile {
    const EMPTY: Tile = Tile {
        vis: [0; GGML_FA_TILE],
        live: [0; GGML_FA_TILE],
        nl: 0,
        val: [0; GGML_FA_TILE],
        active: 0,
        grow: 0,
        ms: [1.0; LANES],
    };
}

/// Per tile slot: the lanes' scores, turned into their weights by [`weigh_tiles`].
type TileLanes = [[f32; LANES]; GGML_FA_TILE];

/// The first pass of [`attend_group`] over the consecutive tiles from `t_first`: which
/// keys each lane sees, where the values lie, and the scores (`-inf` where a lane does
/// not see the key). Errors if a visible position is not mapped.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_tiles(
    g: &LaneGroup<'_>,
    qt: &[[f32; LANES]],
    kv: &KvSource<'_>,
    scale: f32,
    dv: usize,
    t_first: usize,
    tiles: &mut [Tile],
    scores: &mut [TileLanes],
) -> Result<(), ()> {
    let dk = qt.len();
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let vscale = _mm256_set1_ps(scale);
    // Without 16-key runs: the tile's visible keys widened to f32, transposed (element d
    // of tile slot t at `kt[d * GGML_FA_TILE + t]`).
    let mut kt = if kv.runs16 {
        Vec::new()
    } else {
        vec![0f32; GGML_FA_TILE * dk]
    };
    for (idx, (tile, s)) in tiles.iter_mut().zip(scores.iter_mut()).enumerate() {
        let t0 = t_first + idx * GGML_FA_TILE;
        for t in 0..GGML_FA_TILE {
            let p = t0 + t;
            let mut b = 0u8;
            for (l, &(lo, hi)) in g.range.iter().enumerate() {
                b |= u8::from(lo <= p && p <= hi) << l;
            }
            tile.vis[t] = b;
            s[t] = [f32::NEG_INFINITY; LANES];
        }
        for c in 0..GGML_FA_TILE / CHUNK {
            let chunk = c * CHUNK..(c + 1) * CHUNK;
            if tile.vis[chunk.clone()].iter().all(|&v| v == 0) {
                continue;
            }
            if kv.runs16 {
                // Sixteen slots of one block, each key element of all of them one run:
                // their scores here, eight keys in lanes, turned to queries in lanes.
                let (kb, vb) = kv.locate(t0 + chunk.start, dk, dv, CHUNK).ok_or(())?;
                for half in [0, 8] {
                    // SAFETY: `locate` checked that the 16 keys' `dk` strided elements
                    // lie in `kv.k`; `qt` holds `dk` rows of 8 queries.
                    let sc = unsafe {
                        score8(
                            qt.as_ptr() as *const f32,
                            dk,
                            kv.k.as_ptr().add(kb + half),
                            kv.k_stride,
                        )
                    };
                    let mut r = [_mm256_setzero_si256(); LANES];
                    for (d, a) in r.iter_mut().zip(sc) {
                        *d = _mm256_castps_si256(_mm256_mul_ps(a, vscale));
                    }
                    for (j, v) in transpose8(r).into_iter().enumerate() {
                        let t = chunk.start + half + j;
                        let v =
                            _mm256_blendv_ps(neg_inf, _mm256_castsi256_ps(v), mask_of(tile.vis[t]));
                        // SAFETY: 8 writable f32; storeu is unaligned.
                        unsafe { _mm256_storeu_ps(s[t].as_mut_ptr(), v) };
                    }
                }
                for (j, v) in tile.val[chunk.clone()].iter_mut().enumerate() {
                    *v = vb + j * kv.v_stride;
                }
            } else {
                for t in chunk.clone().filter(|&t| tile.vis[t] != 0) {
                    let (kb, vb) = kv.locate(t0 + t, dk, dv, 1).ok_or(())?;
                    tile.val[t] = vb;
                    for d in 0..dk {
                        kt[d * GGML_FA_TILE + t] =
                            half::f16::from_bits(kv.k[kb + d * kv.k_stride]).to_f32();
                    }
                }
            }
        }
        for t in 0..GGML_FA_TILE {
            if tile.vis[t] != 0 {
                tile.live[tile.nl] = t as u8;
                tile.nl += 1;
            }
        }
        // Slots not in 16-key runs: the scores from the transposed keys, KEYS at a time.
        let scattered = if kv.runs16 { 0 } else { tile.nl };
        for c in tile.live[..scattered].chunks(KEYS) {
            let mut acc = [_mm256_setzero_ps(); KEYS];
            let ts: [usize; KEYS] = std::array::from_fn(|j| usize::from(c[j.min(c.len() - 1)]));
            for (d, row) in kt.chunks_exact(GGML_FA_TILE).enumerate() {
                // SAFETY: 8 readable f32.
                let q = unsafe { _mm256_loadu_ps(qt[d].as_ptr()) };
                for j in 0..KEYS {
                    acc[j] = _mm256_fmadd_ps(q, _mm256_set1_ps(row[ts[j]]), acc[j]);
                }
            }
            for (j, &t) in c.iter().enumerate() {
                let t = usize::from(t);
                let v =
                    _mm256_blendv_ps(neg_inf, _mm256_mul_ps(acc[j], vscale), mask_of(tile.vis[t]));
                // SAFETY: 8 writable f32; storeu is unaligned.
                unsafe { _mm256_storeu_ps(s[t].as_mut_ptr(), v) };
            }
        }
    }
    Ok(())
}

/// The unscaled scores of 8 queries against 8 keys of a run, keys in lanes: `acc[l]`
/// lane `j` is query `l`'s score of key `j`, one fused multiply-add chain over the head
/// dimension from 0, as the reference computes each score. `qt` holds element `d` of
/// query `l` at `qt[d * 8 + l]`; element `d` of key `j` is at `k[d * k_stride + j]` (f16
/// bits). Each key element is widened once for the 8 queries; the chains are independent.
///
/// # Safety
/// `qt` must hold `8 * dk` readable f32 and `k` the 8 elements of every `d < dk` at
/// `d * k_stride`; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score8(qt: *const f32, dk: usize, k: *const u16, k_stride: usize) -> [__m256; 8] {
    let mut acc = [_mm256_setzero_ps(); LANES];
    for d in 0..dk {
        // SAFETY: the caller guarantees the 8 key elements and the 8 query elements.
        unsafe {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.add(d * k_stride) as *const __m128i));
            let q = qt.add(d * LANES);
            for (l, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_set1_ps(*q.add(l)), kv, *a);
            }
        }
    }
    acc
}

/// The second pass of [`attend_group`], tile by tile in order: per lane the running
/// maximum (and the rescale it asks of the output so far), the weights of the tile's
/// keys in place of their scores (ggml's `expf` on eight lanes) and the denominator
/// (each 16 weights summed pairwise, the tile's sum in f64), as the scalar; `m` and
/// `denom` carry the lanes' maxima and denominators from tile to tile.
#[target_feature(enable = "avx2,fma,f16c")]
fn weigh_tiles(
    n: usize,
    tiles: &mut [Tile],
    scores: &mut [TileLanes],
    m: &mut __m256,
    denom: &mut __m256,
) {
    let all = ((1u16 << n) - 1) as u8;
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let (mut mv, mut den) = (*m, *denom);
    for (tile, sw) in tiles.iter_mut().zip(scores.iter_mut()) {
        // SAFETY: 8 readable f32 per slot.
        let s: [__m256; GGML_FA_TILE] =
            std::array::from_fn(|t| unsafe { _mm256_loadu_ps(sw[t].as_ptr()) });
        let tile_max = s.iter().fold(neg_inf, |a, &b| _mm256_max_ps(a, b));
        let active = bits_of(_mm256_cmp_ps::<_CMP_NEQ_OQ>(tile_max, neg_inf)) & all;
        tile.active = active;
        if active == 0 {
            continue;
        }
        let m_new = _mm256_max_ps(mv, tile_max);
        let grow = active & bits_of(_mm256_cmp_ps::<_CMP_GT_OQ>(m_new, mv));
        tile.grow = grow;
        if grow != 0 {
            let (ml, mn) = (lanes(mv), lanes(m_new));
            let mut dn = lanes(den);
            for l in (0..n).filter(|l| grow >> l & 1 == 1) {
                tile.ms[l] = flint_core::math::expf_libc(ml[l] - mn[l]);
                dn[l] *= tile.ms[l];
            }
            // SAFETY: 8 readable f32.
            den = unsafe { _mm256_loadu_ps(dn.as_ptr()) };
        }
        let act = mask_of(active);
        mv = _mm256_blendv_ps(mv, m_new, act);
        let mut w = [_mm256_setzero_ps(); GGML_FA_TILE];
        let mut sum = [_mm256_setzero_pd(); 2];
        for (wc, sc) in w.chunks_exact_mut(16).zip(s.chunks_exact(16)) {
            for (wt, &st) in wc.iter_mut().zip(sc) {
                *wt = expf_ggml(_mm256_sub_ps(st, mv));
            }
            let part = widen(reduce16(wc));
            sum = [
                _mm256_add_pd(sum[0], part[0]),
                _mm256_add_pd(sum[1], part[1]),
            ];
        }
        let d64 = widen(den);
        let nd = narrow([_mm256_add_pd(d64[0], sum[0]), _mm256_add_pd(d64[1], sum[1])]);
        den = _mm256_blendv_ps(den, nd, act);
        for (a, v) in sw.iter_mut().zip(&w) {
            *a = lanes(*v);
        }
    }
    (*m, *denom) = (mv, den);
}

/// The third pass of [`attend_group`] for the output columns `col0..col0 + width`: `o`
/// (`n` rows of `width`) accumulates every tile's weighted values,
/// each tile's rescales first; per lane one fused multiply-add chain per element over
/// its visible keys, in order.
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_tiles(
    n: usize,
    tiles: &[Tile],
    weights: &[TileLanes],
    kv: &KvSource<'_>,
    col0: usize,
    width: usize,
    o: &mut [f32],
) {
    assert_eq!(o.len(), n * width, "accumulate_tiles: out length");
    let mut vals: [&[u16]; GGML_FA_TILE] = [&[]; GGML_FA_TILE];
    for (tile, wl) in tiles.iter().zip(weights) {
        if tile.active == 0 {
            continue;
        }
        for &t in &tile.live[..tile.nl] {
            let t = usize::from(t);
            let v0 = tile.val[t] + col0;
            vals[t] = &kv.v[v0..v0 + width];
        }
        for l in (0..n).filter(|l| tile.grow >> l & 1 == 1) {
            for x in &mut o[l * width..(l + 1) * width] {
                *x *= tile.ms[l];
            }
        }
        // The longest run of keys that all eight lanes see goes with all of them at once
        // (each value widened once for the eight); the keys before and after it lane by
        // lane. Each lane still adds its keys in order.
        let live = &tile.live[..tile.nl];
        let (a, b) = if n == LANES {
            all_lanes_run(live, &tile.vis)
        } else {
            (tile.nl, tile.nl)
        };
        let by_lane = |o: &mut [f32], keys: &[u8]| {
            for l in (0..n).filter(|l| tile.active >> l & 1 == 1) {
                let mine = keys
                    .iter()
                    .map(|&t| usize::from(t))
                    .filter(|&t| tile.vis[t] >> l & 1 == 1);
                accumulate(&mut o[l * width..(l + 1) * width], mine, &vals, wl, l);
            }
        };
        by_lane(o, &live[..a]);
        if a < b {
            accumulate_all(o, width, &live[a..b], &vals, wl);
        }
        by_lane(o, &live[b..]);
    }
}

/// The longest run `live[a..b]` of slots whose keys all eight lanes see (`(len, len)`
/// if none).
fn all_lanes_run(live: &[u8], vis: &[u8; GGML_FA_TILE]) -> (usize, usize) {
    let (mut best, mut start) = ((live.len(), live.len()), None);
    for (i, &t) in live.iter().enumerate().chain([(live.len(), &0)]) {
        let all = i < live.len() && vis[usize::from(t)] == u8::MAX;
        match (all, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if best.0 == live.len() || i - s > best.1 - best.0 {
                    best = (s, i);
                }
                start = None;
            }
            _ => {}
        }
    }
    best
}

/// `o` (the eight lanes' outputs, `width` columns each) += the weighted values of the
/// slots `keys` (in order), which every lane sees: per lane and column one fused
/// multiply-add chain over the keys, as [`accumulate`]; each value widened once for the
/// eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_all(
    o: &mut [f32],
    width: usize,
    keys: &[u8],
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; LANES]; GGML_FA_TILE],
) {
    assert_eq!(o.len(), LANES * width, "accumulate_all: out length");
    for &t in keys {
        assert!(
            vals[usize::from(t)].len() >= width,
            "accumulate_all: value length"
        );
    }
    let mut e = 0;
    while e + 8 <= width {
        // SAFETY: e + 8 <= width <= every value row's length (asserted) and each of `o`'s
        // eight rows; loadu/storeu are unaligned.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); LANES];
            for (l, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.as_ptr().add(l * width + e));
            }
            for &t in keys {
                let t = usize::from(t);
                let x = _mm256_cvtph_ps(_mm_loadu_si128(vals[t].as_ptr().add(e) as *const __m128i));
                for (l, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(wl[t][l]), x, *a);
                }
            }
            for (l, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(l * width + e), *a);
            }
        }
        e += 8;
    }
    for l in 0..LANES {
        for i in e..width {
            let mut acc = o[l * width + i];
            for &t in keys {
                let t = usize::from(t);
                acc = wl[t][l].mul_add(half::f16::from_bits(vals[t][i]).to_f32(), acc);
            }
            o[l * width + i] = acc;
        }
    }
}

/// `o[e] = fma(w[t][lane], v_t[e], o[e])` over the keys `mine` in order, for every
/// element `e` of one query's output: 32 elements (four vectors) side by side, then
/// eight, then one at a time with the scalar's fused multiply-add.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate(
    o: &mut [f32],
    mine: impl Iterator<Item = usize> + Clone,
    vals: &[&[u16]; GGML_FA_TILE],
    wl: &[[f32; LANES]; GGML_FA_TILE],
    lane: usize,
) {
    let dv = o.len();
    let mut e = 0;
    while e + 32 <= dv {
        // SAFETY: e + 32 <= dv = every value row's length and `o`'s; loadu/storeu are
        // unaligned.
        unsafe {
            let mut acc: [__m256; 4] =
                std::array::from_fn(|i| _mm256_loadu_ps(o.as_ptr().add(e + 8 * i)));
            for t in mine.clone() {
                let w = _mm256_set1_ps(wl[t][lane]);
                let v = vals[t].as_ptr().add(e);
                for (i, a) in acc.iter_mut().enumerate() {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(v.add(8 * i) as *const __m128i));
                    *a = _mm256_fmadd_ps(w, x, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(e + 8 * i), *a);
            }
        }
        e += 32;
    }
    while e + 8 <= dv {
        // SAFETY: as above, for eight elements.
        unsafe {
            let mut acc = _mm256_loadu_ps(o.as_ptr().add(e));
            for t in mine.clone() {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(vals[t].as_ptr().add(e) as *const __m128i));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(wl[t][lane]), x, acc);
            }
            _mm256_storeu_ps(o.as_mut_ptr().add(e), acc);
        }
        e += 8;
    }
    for (i, x) in o.iter_mut().enumerate().skip(e) {
        let mut acc = *x;
        for t in mine.clone() {
            acc = wl[t][lane].mul_add(half::f16::from_bits(vals[t][i]).to_f32(), acc);
        }
        *x = acc;
    }
}

/// Paged attention over every sequence of `p`, in groups of up to [`LANES`] queries
/// that share a sequence and a KV head ([`super::paged_attention_in_groups`]); the same
/// contract and checks as the scalar `kv::paged_attention`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (checked at device open).
pub(crate) unsafe fn paged_attention(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<(), HalError> {
    let run = |g: &LaneGroup<'_>, src: &KvSource<'_>, o: &mut [f32]| {
        // SAFETY: the caller guarantees AVX2, FMA and F16C.
        unsafe { attend_group(g, src, p.scale, o.len() / g.q.len(), o) }
    };
    super::paged_attention_in_groups(kv, p, out, LANES, &run)
}
