//! Paged attention with SIMD (the scalar path is `crate::kv::paged_attention`).
//!
//! Every kernel here computes, for each (query row, head), exactly what
//! `flint_core::math::attend_ggml_tiled` computes for it alone (llama.cpp's tiled CPU
//! flash attention, operation for operation): tiles of 64 keys aligned on absolute
//! positions, each score one fused multiply-add chain over the head dimension, ggml's
//! AVX-512 `expf`, the 16-weight pairwise sum, the f64 denominator sum, and per output
//! element one fused multiply-add chain over the tile's visible keys. The SIMD lanes hold
//! several queries (or several keys) side by side, never a reordered sum, so the results
//! are equal bit for bit (`tests/attention_simd.rs`).
//!
//! - `avx512.rs`: sixteen lanes; queries in lanes for prompt batches (their scores
//!   computed keys in lanes and transposed), keys in lanes for decode rows.
//! - `avx2.rs`: eight lanes, queries in lanes (scores as in `avx512.rs`).
//!
//! In llama.cpp's order (`crate::kv::FloatOrder::LlamaCpp`), calls of fewer than 64
//! query rows (decode steps, short prompts) take llama.cpp's other path instead,
//! `flint_core::math::attend_ggml_one_chunk` (the output held in f16, one key at a
//! time): `one_chunk.rs`.
//!
//! This file holds what they share: the lane groups, where a group's keys and values lie,
//! the last step of each query, and the driver that splits a step into groups.

use flint_core::math::GGML_FA_TILE;
use flint_hal::{HalError, KvBuffer, PagedAttention, NO_BLOCK};
use rayon::prelude::*;

use crate::kv::CpuKv;

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod one_chunk;

/// Keys per chunk of a tile: a 64-key tile is four chunks of 16, the run of slots a cache
/// block of a multiple of 16 stores together.
pub(crate) const CHUNK: usize = 16;

/// One group of queries that share a sequence and a KV head.
pub(crate) struct LaneGroup<'a> {
    /// The queries (`head_dim_k` each), at most the kernel's lane count.
    pub q: Vec<&'a [f32]>,
    /// Per query: the first and the last visible position (inclusive).
    pub range: Vec<(usize, usize)>,
    /// Per query: its sink logit.
    pub sink: Vec<Option<f32>>,
    /// How many of the pool's threads the group may use: the pool's threads over the
    /// step's groups, at least 1. A kernel that splits a group's work over threads keeps
    /// every operation (the group's result does not depend on it).
    pub spread: usize,
}

/// Where the keys and values of one sequence and one KV head lie.
pub(crate) struct KvSource<'a> {
    /// Keys (`CpuKv::k`, f16 bits): element `d` of a key is `d * k_stride` after its
    /// element 0.
    pub k: &'a [u16],
    /// See `k`.
    pub k_stride: usize,
    /// Value rows (`CpuKv::v`, f16 bits): the value of the slot after a slot is
    /// `v_stride` later.
    pub v: &'a [u16],
    /// See `v`.
    pub v_stride: usize,
    /// Whether the 16 slots from every position that is a multiple of 16 are one run
    /// (keys one apart, values `v_stride` apart): a block size that is a multiple of 16.
    pub runs16: bool,
    /// Position -> the index of its key's element 0 in `k` and of its value in `v`, or
    /// `None` if the position is not mapped to a live block.
    pub at: &'a (dyn Fn(usize) -> Option<(usize, usize)> + Sync),
}

impl<'a> KvSource<'a> {
    /// The key and value of position `p`, after checking that the key's `dk` strided
    /// elements (and, with `run`, those of the `run - 1` slots after it) and the value's
    /// `dv` lie inside the cache; `None` if `p` is not mapped.
    pub(crate) fn locate(
        &self,
        p: usize,
        dk: usize,
        dv: usize,
        run: usize,
    ) -> Option<(usize, usize)> {
        let (kb, vb) = (self.at)(p)?;
        if dk > 0 {
            assert!(
                kb + (dk - 1) * self.k_stride + run <= self.k.len(),
                "attention: key of position {p} outside the cache"
            );
        }
        assert!(
            vb + (run - 1) * self.v_stride + dv <= self.v.len(),
            "attention: value of position {p} outside the cache"
        );
        Some((kb, vb))
    }
}

/// Per query, after the last tile: the sink, then the normalisation, with the scalar's
/// arithmetic (`o` holds one query's unnormalised output, `m` its running maximum and
/// `denom` its running sum of weights).
pub(crate) fn finish_query(o: &mut [f32], m: f32, denom: f32, sink: Option<f32>) {
    let mut dn = denom;
    if let Some(sk) = sink {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sk > m {
            ms = flint_core::math::expf_libc(m - sk);
            for x in o.iter_mut() {
                *x *= ms;
            }
        } else {
            vs = flint_core::math::expf_libc(sk - m);
        }
        // `S = S * ms + vs`, fused as GCC compiles it (the scalar path does the same).
        dn = dn.mul_add(ms, vs);
    }
    let inv = if dn == 0.0 { 0.0 } else { 1.0 / dn };
    for x in o.iter_mut() {
        *x *= inv;
    }
}

/// Tiles from which a kernel spreads one group over threads (1024 keys): below, the
/// hand-offs cost about what the split saves.
pub(crate) const SPREAD_TILES: usize = 16;

/// Tiles a kernel scores, weighs and adds up at a time on one thread: the window's
/// scores and weights stay in the core's caches between the passes. A spread group takes
/// all its tiles at once.
pub(crate) const TILE_WINDOW: usize = 64;

/// How a three-pass kernel walks a group's keys: the 64-key tiles (aligned on absolute
/// positions) from the first any query sees to the last, spread over `spread` threads
/// (from [`SPREAD_TILES`] tiles on, the group's [`LaneGroup::spread`]; else 1), in
/// windows of `win` tiles (all of them when spread, else [`TILE_WINDOW`]).
pub(crate) struct TilePlan {
    pub t_first: usize,
    pub n_tiles: usize,
    pub spread: usize,
    pub win: usize,
}

impl TilePlan {
    pub(crate) fn of(g: &LaneGroup<'_>) -> Self {
        let first = g.range.iter().map(|r| r.0).min().unwrap_or(0);
        let last = g.range.iter().map(|r| r.1).max().unwrap_or(0);
        let t_first = first / GGML_FA_TILE * GGML_FA_TILE;
        let n_tiles = (last - t_first) / GGML_FA_TILE + 1;
        let spread = if n_tiles >= SPREAD_TILES {
            g.spread.max(1)
        } else {
            1
        };
        let win = if spread > 1 {
            n_tiles
        } else {
            TILE_WINDOW.min(n_tiles)
        };
        TilePlan {
            t_first,
            n_tiles,
            spread,
            win,
        }
    }

    /// Per window in order: its tile count and its first position.
    pub(crate) fn windows(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.n_tiles).step_by(self.win).map(|w0| {
            (
                self.win.min(self.n_tiles - w0),
                self.t_first + w0 * GGML_FA_TILE,
            )
        })
    }
}

/// Runs `f(first, tiles, scores)` over consecutive parts of a group's `tiles` and their
/// `scores` (`first`: the index of the part's first tile): one part when `spread` is 1,
/// else twice as many parts as threads (so that a slow thread does not hold the rest)
/// on the pool.
pub(crate) fn over_tile_parts<T: Send, S: Send>(
    spread: usize,
    tiles: &mut [T],
    scores: &mut [S],
    f: impl Fn(usize, &mut [T], &mut [S]) -> Result<(), ()> + Sync,
) -> Result<(), ()> {
    if spread <= 1 {
        return f(0, tiles, scores);
    }
    let per = tiles.len().div_ceil(2 * spread).max(1);
    tiles
        .par_chunks_mut(per)
        .zip(scores.par_chunks_mut(per))
        .enumerate()
        .try_for_each(|(part, (t, s))| f(part * per, t, s))
}

/// Runs `f(col0, width, o)` over the output columns of `n` queries of `dv` values
/// (`out`): `o` holds the `n` rows' columns `col0..col0 + width` and `f` adds to it. One
/// part, `out` itself, when `spread` is 1; else (`out` must hold zeros) parts of a
/// multiple of 16 columns, twice as many as threads, each from zeros on the pool, copied
/// into `out` after.
pub(crate) fn over_column_parts(
    spread: usize,
    n: usize,
    dv: usize,
    out: &mut [f32],
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    if spread <= 1 {
        return f(0, dv, out);
    }
    let width = dv.div_ceil(2 * spread).next_multiple_of(CHUNK).max(CHUNK);
    let parts: Vec<Vec<f32>> = (0..dv.div_ceil(width))
        .into_par_iter()
        .map(|part| {
            let col0 = part * width;
            let w = width.min(dv - col0);
            let mut o = vec![0f32; n * w];
            f(col0, w, &mut o);
            o
        })
        .collect();
    for (part, o) in parts.iter().enumerate() {
        let (col0, w) = (part * width, o.len() / n);
        for i in 0..n {
            out[i * dv + col0..i * dv + col0 + w].copy_from_slice(&o[i * w..(i + 1) * w]);
        }
    }
}

/// A kernel that attends one lane group: its queries, where their keys and values lie,
/// and its output (`dv` values per query); `Err` when a visible position is not mapped.
pub(crate) type GroupKernel<'k> =
    dyn Fn(&LaneGroup<'_>, &KvSource<'_>, &mut [f32]) -> Result<(), ()> + Sync + 'k;

/// Sequence, KV head, and the (query row, head) pairs of one lane group.
type WorkItem = (usize, usize, Vec<(usize, usize)>);

/// Paged attention over every sequence of `p`, in groups of up to `lanes` queries that
/// share a sequence and a KV head, each group attended by `run` on rayon's threads;
/// the same contract and checks as the scalar `kv::paged_attention`.
pub(crate) fn paged_attention_in_groups(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
    lanes: usize,
    run: &GroupKernel<'_>,
) -> Result<(), HalError> {
    let l = *kv.layout();
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    crate::kv::query_owners(&l, p, out.len())?;
    let queries = p.q.host();
    let group = nh / hkv;
    let rv = hkv * dv;
    // Work items: (sequence, KV head, up to `lanes` (row, head) queries).
    let mut items: Vec<WorkItem> = Vec::new();
    for (si, s) in p.seqs.iter().enumerate() {
        for kvh in 0..hkv {
            let mut qs = Vec::with_capacity(lanes);
            for t in 0..s.positions.len() {
                for h in kvh * group..(kvh + 1) * group {
                    qs.push((s.q_start + t, h));
                    if qs.len() == lanes {
                        items.push((si, kvh, std::mem::take(&mut qs)));
                    }
                }
            }
            if !qs.is_empty() {
                items.push((si, kvh, qs));
            }
        }
    }
    let spread = (rayon::current_num_threads() / items.len().max(1)).max(1);
    let attend = |(si, kvh, qs): &WorkItem, o: &mut [f32]| -> Result<(), ()> {
        let seq = &p.seqs[*si];
        let mut g = LaneGroup {
            q: Vec::with_capacity(qs.len()),
            range: Vec::with_capacity(qs.len()),
            sink: Vec::with_capacity(qs.len()),
            spread,
        };
        for &(r, h) in qs {
            let pos = seq.positions.host()[r - seq.q_start] as usize;
            let lo = flint_core::math::window_start(pos, p.window);
            g.q.push(&queries[(r * nh + h) * dk..(r * nh + h + 1) * dk]);
            g.range.push((lo, pos));
            g.sink.push(p.sinks.map(|s| s.host()[h]));
        }
        let at = |j: usize| {
            let b = *seq.block_table.host().get(j / bs)?;
            if b == NO_BLOCK || b as usize >= l.num_blocks {
                return None;
            }
            let slot = b as usize * bs + j % bs;
            Some((kv.key_base(slot, *kvh), slot * rv + kvh * dv))
        };
        let src = KvSource {
            k: &kv.k,
            k_stride: bs,
            v: &kv.v,
            v_stride: rv,
            runs16: bs.is_multiple_of(CHUNK),
            at: &at,
        };
        run(&g, &src, o)
    };
    let freed = || {
        HalError::invalid(
            "paged_attention: a visible position maps to a freed (NO_BLOCK) or out-of-range block",
        )
    };
    // Output row of each query: `r * nh + h`. Where every work item's rows are one
    // ascending run (one KV head, or one row per item), the items attend straight into
    // their part of `out`; else each into its own buffer, copied to its rows after.
    let first_row = |item: &WorkItem| item.2.first().map_or(0, |&(r, h)| r * nh + h);
    let runs = items.iter().all(|item| {
        item.2
            .windows(2)
            .all(|w| w[1].0 * nh + w[1].1 == w[0].0 * nh + w[0].1 + 1)
    });
    if runs {
        let mut order: Vec<&WorkItem> = items.iter().collect();
        order.sort_by_key(|item| first_row(item));
        let total = out.len() / dv;
        let mut parts: Vec<(&WorkItem, &mut [f32])> = Vec::with_capacity(order.len());
        let mut rest = &mut out[..];
        let mut at = 0;
        for item in order {
            let (r0, len) = (first_row(item), item.2.len());
            if r0 < at || r0 + len > total {
                return Err(HalError::invalid(
                    "paged_attention: a query row owned twice",
                ));
            }
            let (gap, tail) = std::mem::take(&mut rest).split_at_mut((r0 - at) * dv);
            // Rows no query owns stay zero, as every owned one is written.
            gap.fill(0.0);
            let (mine, tail) = tail.split_at_mut(len * dv);
            parts.push((item, mine));
            rest = tail;
            at = r0 + len;
        }
        rest.fill(0.0);
        return parts
            .into_par_iter()
            .try_for_each(|(item, o)| attend(item, o))
            .map_err(|()| freed());
    }
    // Each work item owns the output rows of its queries: the tasks write them in
    // parallel (no result buffers gathered and copied on one thread afterwards).
    let mut rows: Vec<Option<&mut [f32]>> = out.chunks_mut(dv).map(Some).collect();
    let mut work: Vec<(&WorkItem, Vec<&mut [f32]>)> = Vec::with_capacity(items.len());
    for item in &items {
        let mut mine = Vec::with_capacity(item.2.len());
        for &(r, h) in &item.2 {
            let row = rows
                .get_mut(r * nh + h)
                .and_then(Option::take)
                .ok_or_else(|| HalError::invalid("paged_attention: a query row owned twice"))?;
            mine.push(row);
        }
        work.push((item, mine));
    }
    // Rows no query owns stay zero, as every owned one is written.
    for row in rows.into_iter().flatten() {
        row.fill(0.0);
    }
    work.into_par_iter()
        .try_for_each(|(item, mut dst)| {
            let mut o = vec![0f32; item.2.len() * dv];
            attend(item, &mut o)?;
            for (d, v) in dst.iter_mut().zip(o.chunks_exact(dv)) {
                d.copy_from_slice(v);
            }
            Ok(())
        })
        .map_err(|()| freed())?;
    Ok(())
}

/// Paged attention of a call of fewer than 64 query rows in llama.cpp's order (`crate::kv::FloatOrder::one_chunk`) with
/// `one_chunk.rs`, in groups of up to 16 queries that share a sequence and a KV head.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (checked at device open).
pub(crate) unsafe fn paged_attention_one_chunk(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<(), HalError> {
    let run = |g: &LaneGroup<'_>, src: &KvSource<'_>, o: &mut [f32]| {
        // SAFETY: the caller guarantees AVX2, FMA and F16C.
        unsafe { one_chunk::attend_one_chunk(g, src, p.scale, o.len() / g.q.len(), o) }
    };
    paged_attention_in_groups(kv, p, out, 16, &run)
}
