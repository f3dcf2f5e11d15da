//! Paged attention with AVX-512: up to 16 query heads that read the same KV head of the
//! same sequence (the heads of a GQA group, for every query row of the sequence in the
//! step) attend together, one query per SIMD lane.
//!
//! Bit-identical to `flint_core::math::attend_ggml_tiled` run on each (row, head) alone
//! (the scalar path in `ops.rs`), because every lane does exactly the scalar's operations
//! in the scalar's order: a score is one fused multiply-add chain over the head dimension
//! (a lane per query, the key element broadcast), tiles of 64 keys aligned on absolute
//! positions, ggml's AVX-512 `expf`, the 16-weight pairwise sum and the f64 denominator
//! sum, and per lane and output element one fused multiply-add chain over the tile's keys.
//! A lane for which a whole tile is invisible skips it, as the scalar loop does.
//! `tests/attention_simd.rs` checks the equality bit for bit.
//!
//! Why lanes over queries rather than over keys or the head dimension: a score's chain
//! over the head dimension must stay sequential to match the reference, and the keys of
//! a GQA group are shared by all its heads and rows, so each key element is loaded once
//! and broadcast to up to 16 queries.

use std::arch::x86_64::*;

use flint_core::math::GGML_FA_TILE;
use flint_hal::{HalError, KvBuffer, PagedAttention, NO_BLOCK};
use rayon::prelude::*;

use super::act::expf_ggml;
use crate::ops::CpuKv;

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

/// One group of queries that share a sequence and a KV head.
pub(crate) struct LaneGroup<'a> {
    /// The queries (`head_dim_k` each), at most [`LANES`].
    pub q: Vec<&'a [f32]>,
    /// Per query: the first and the last visible position (inclusive).
    pub range: Vec<(usize, usize)>,
    /// Per query: its sink logit.
    pub sink: Vec<Option<f32>>,
}

/// Attends the queries of `g` over keys and values found through `kv_at` (position ->
/// key and value rows, or `None` if the position is not mapped), writing `dv` values per
/// query to `out`. Errors if a visible position is not mapped.
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn attend_group<'k>(
    g: &LaneGroup<'_>,
    kv_at: &dyn Fn(usize) -> Option<(&'k [f32], &'k [f32])>,
    scale: f32,
    dv: usize,
    out: &mut [f32],
) -> Result<(), ()> {
    let n = g.q.len();
    assert!(n > 0 && n <= LANES && g.range.len() == n && g.sink.len() == n);
    assert_eq!(out.len(), n * dv, "attend_group: out length");
    let dk = g.q[0].len();
    // Queries transposed: qt[d] holds element d of every lane's query.
    let qt: Vec<__m512> = (0..dk)
        .map(|d| {
            let mut a = [0f32; LANES];
            for (l, q) in g.q.iter().enumerate() {
                a[l] = q[d];
            }
            // SAFETY: 16 readable f32.
            unsafe { _mm512_loadu_ps(a.as_ptr()) }
        })
        .collect();
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
    let mut vals: [&[f32]; GGML_FA_TILE] = [&[]; GGML_FA_TILE];
    let mut keys: [&[f32]; GGML_FA_TILE] = [&[]; GGML_FA_TILE];
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
            let vm = _mm512_cmple_epi32_mask(lo_v, pv) & _mm512_cmple_epi32_mask(pv, hi_v);
            vis[t] = vm;
            s[t] = neg_inf;
            if vm == 0 {
                continue;
            }
            let (k, v) = kv_at(p).ok_or(())?;
            assert!(k.len() >= dk, "attend_group: key length");
            vals[t] = v;
            keys[t] = k;
            live[nl] = t as u8;
            nl += 1;
        }
        const KEYS: usize = 4;
        for c in live[..nl].chunks(KEYS) {
            let mut acc = [_mm512_setzero_ps(); KEYS];
            let ks: [&[f32]; KEYS] =
                std::array::from_fn(|j| &keys[usize::from(c[j.min(c.len() - 1)])][..dk]);
            let qt = &qt[..dk];
            for d in 0..dk {
                for j in 0..KEYS {
                    acc[j] = _mm512_fmadd_ps(qt[d], _mm512_set1_ps(ks[j][d]), acc[j]);
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
        // Up to four lanes that see the same keys (the heads of one query row) go
        // together, so that each value block loaded feeds all of them.
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
            for &t in &live[..nl] {
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
            let mine = &mine[..nm];
            match lanes {
                4 => accumulate::<4>(o, dv, mine, &vals, &wl, l),
                3 => accumulate::<3>(o, dv, mine, &vals, &wl, l),
                2 => accumulate::<2>(o, dv, mine, &vals, &wl, l),
                _ => accumulate::<1>(o, dv, mine, &vals, &wl, l),
            }
            l += lanes;
        }
        t0 += GGML_FA_TILE;
    }
    // The sink, then the normalisation: per lane, the scalar's arithmetic.
    for l in 0..n {
        let o = &mut out[l * dv..(l + 1) * dv];
        let ml = lane(m, l);
        let mut dn = lane(denom, l);
        if let Some(sk) = g.sink[l] {
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if sk > ml {
                ms = flint_core::math::expf_libc(ml - sk);
                for x in o.iter_mut() {
                    *x *= ms;
                }
            } else {
                vs = flint_core::math::expf_libc(sk - ml);
            }
            // `S = S * ms + vs`, fused as GCC compiles it (the scalar path does the same).
            dn = dn.mul_add(ms, vs);
        }
        let inv = if dn == 0.0 { 0.0 } else { 1.0 / dn };
        for x in o.iter_mut() {
            *x *= inv;
        }
    }
    Ok(())
}

/// `o` (the outputs of lanes `l0..l0 + L`, `dv` values each) += the weighted values of
/// the keys `mine` (tile slots, in order): per lane and output element one fused
/// multiply-add chain over the keys, as the reference. Four groups of 16 elements side by
/// side (independent chains), each value block loaded once for the `L` lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn accumulate<const L: usize>(
    o: &mut [f32],
    dv: usize,
    mine: &[u8],
    vals: &[&[f32]; GGML_FA_TILE],
    wl: &[[f32; LANES]; GGML_FA_TILE],
    l0: usize,
) {
    const CHUNKS: usize = 4;
    assert_eq!(o.len(), L * dv, "accumulate: output length");
    let full = dv / (16 * CHUNKS) * (16 * CHUNKS);
    for d0 in (0..full).step_by(16 * CHUNKS) {
        let mut acc = [[_mm512_setzero_ps(); CHUNKS]; L];
        for (k, ak) in acc.iter_mut().enumerate() {
            for (c, a) in ak.iter_mut().enumerate() {
                // SAFETY: k * dv + d0 + 16 * CHUNKS <= o.len(); loadu is unaligned.
                *a = unsafe { _mm512_loadu_ps(o.as_ptr().add(k * dv + d0 + 16 * c)) };
            }
        }
        for &t in mine {
            let t = usize::from(t);
            let v = &vals[t][d0..d0 + 16 * CHUNKS];
            let mut wt = [_mm512_setzero_ps(); L];
            for (k, w) in wt.iter_mut().enumerate() {
                *w = _mm512_set1_ps(wl[t][l0 + k]);
            }
            for c in 0..CHUNKS {
                // SAFETY: `v` holds 16 * CHUNKS readable f32.
                let vv = unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * c)) };
                for k in 0..L {
                    acc[k][c] = _mm512_fmadd_ps(wt[k], vv, acc[k][c]);
                }
            }
        }
        for (k, ak) in acc.iter().enumerate() {
            for (c, a) in ak.iter().enumerate() {
                // SAFETY: as the loads above; storeu is unaligned.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(k * dv + d0 + 16 * c), *a) };
            }
        }
    }
    for k in 0..L {
        for d in full..dv {
            let mut acc = o[k * dv + d];
            for &t in mine {
                acc = wl[usize::from(t)][l0 + k].mul_add(vals[usize::from(t)][d], acc);
            }
            o[k * dv + d] = acc;
        }
    }
}

/// Sequence, KV head, and the (query row, head) pairs of one lane group.
type WorkItem = (usize, usize, Vec<(usize, usize)>);

/// Paged attention over every sequence of `p`, in groups of up to [`LANES`] queries
/// that share a sequence and a KV head; the same contract and checks as the scalar
/// `ops::paged_attention`.
///
/// # Safety
/// The CPU must have AVX-512F (checked at device open).
pub(crate) unsafe fn paged_attention(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<(), HalError> {
    let l = *kv.layout();
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    crate::ops::query_owners(&l, p, out.len())?;
    let group = nh / hkv;
    let (rk, rv) = (hkv * dk, hkv * dv);
    // Work items: (sequence, KV head, up to 16 (row, head) queries).
    let mut items: Vec<WorkItem> = Vec::new();
    for (si, s) in p.seqs.iter().enumerate() {
        for kvh in 0..hkv {
            let mut qs = Vec::with_capacity(LANES);
            for t in 0..s.positions.len() {
                for h in kvh * group..(kvh + 1) * group {
                    qs.push((s.q_start + t, h));
                    if qs.len() == LANES {
                        items.push((si, kvh, std::mem::take(&mut qs)));
                    }
                }
            }
            if !qs.is_empty() {
                items.push((si, kvh, qs));
            }
        }
    }
    let results: Vec<Result<Vec<f32>, ()>> = items
        .par_iter()
        .map(|(si, kvh, qs)| {
            let seq = &p.seqs[*si];
            let mut g = LaneGroup {
                q: Vec::with_capacity(qs.len()),
                range: Vec::with_capacity(qs.len()),
                sink: Vec::with_capacity(qs.len()),
            };
            for &(r, h) in qs {
                let pos = seq.positions[r - seq.q_start] as usize;
                let lo = match p.window {
                    Some(w) => (pos + 1).saturating_sub(w),
                    None => 0,
                };
                g.q.push(&p.q[(r * nh + h) * dk..(r * nh + h + 1) * dk]);
                g.range.push((lo, pos));
                g.sink.push(p.sinks.map(|s| s[h]));
            }
            let kv_at = |j: usize| {
                let b = *seq.block_table.get(j / bs)?;
                if b == NO_BLOCK || b as usize >= l.num_blocks {
                    return None;
                }
                let slot = b as usize * bs + j % bs;
                Some((
                    &kv.k[slot * rk + kvh * dk..slot * rk + (kvh + 1) * dk],
                    &kv.v[slot * rv + kvh * dv..slot * rv + (kvh + 1) * dv],
                ))
            };
            let mut o = vec![0f32; qs.len() * dv];
            // SAFETY: the caller guarantees AVX-512F.
            unsafe { attend_group(&g, &kv_at, p.scale, dv, &mut o) }?;
            Ok(o)
        })
        .collect();
    out.fill(0.0);
    for ((_, _, qs), res) in items.iter().zip(results) {
        let o = res.map_err(|()| {
            HalError::invalid(
                "paged_attention: a visible position maps to a freed (NO_BLOCK) or out-of-range block",
            )
        })?;
        for (i, &(r, h)) in qs.iter().enumerate() {
            out[(r * nh + h) * dv..(r * nh + h + 1) * dv].copy_from_slice(&o[i * dv..(i + 1) * dv]);
        }
    }
    Ok(())
}
