//! The element-wise ops, routing and paged attention (f32, plain loops that the
//! compiler vectorises; rayon where the work is large enough).

use std::any::Any;

use flint_core::math;
use flint_hal::{HalError, KvBuffer, KvLayout, PagedAttention, RoutingConfig, NO_BLOCK};
use rayon::prelude::*;

/// RMSNorm of every row of `dim` values (core reference, row by row).
pub(crate) fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, out: &mut [f32]) {
    check_norm_shapes(x.len(), out.len(), weight, dim);
    // Rows in parallel, 16 at a time, each computed as `math::rms_norm` computes it.
    x.par_chunks(16 * dim)
        .zip(out.par_chunks_mut(16 * dim))
        .for_each(|(xs, os)| rms_rows(xs, weight, eps, dim, os));
}

/// `residual += delta`, then the RMSNorm of every row of the sum into `out`: per chunk
/// of rows, in parallel (a prompt batch's sum is too large to leave to one thread ahead
/// of the norm).
pub(crate) fn add_rms_norm(
    residual: &mut [f32],
    delta: &[f32],
    weight: Option<&[f32]>,
    eps: f32,
    dim: usize,
    out: &mut [f32],
) {
    assert_eq!(residual.len(), delta.len(), "add_rms_norm: delta length");
    check_norm_shapes(residual.len(), out.len(), weight, dim);
    residual
        .par_chunks_mut(16 * dim)
        .zip(delta.par_chunks(16 * dim))
        .zip(out.par_chunks_mut(16 * dim))
        .for_each(|((rs, ds), os)| {
            for (r, &d) in rs.iter_mut().zip(ds) {
                *r += d;
            }
            rms_rows(rs, weight, eps, dim, os);
        });
}

fn check_norm_shapes(x_len: usize, out_len: usize, weight: Option<&[f32]>, dim: usize) {
    assert!(
        dim > 0 && x_len == out_len && x_len.is_multiple_of(dim),
        "rms_norm: {x_len} values into {out_len} with dim {dim}"
    );
    if let Some(w) = weight {
        assert_eq!(w.len(), dim, "rms_norm: weight length");
    }
}

/// The rows of `xs` normalised into `os`, each as `math::rms_norm` computes it.
fn rms_rows(xs: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, os: &mut [f32]) {
    let mut xr = xs.chunks_exact(dim);
    let mut or = os.chunks_exact_mut(dim);
    // Eight rows at a time, then four, then two: their sums of squares are independent
    // chains (each row's own chain in order), where one row alone waits on every add.
    fn group<const N: usize>(
        xr: &mut std::slice::ChunksExact<'_, f32>,
        or: &mut std::slice::ChunksExactMut<'_, f32>,
        weight: Option<&[f32]>,
        eps: f32,
    ) {
        let xs: [&[f32]; N] = std::array::from_fn(|_| xr.next().unwrap_or(&[]));
        let scales = rms_scales(&xs, eps);
        for (xv, sc) in xs.iter().zip(scales) {
            if let Some(o) = or.next() {
                rms_apply(xv, sc, weight, o);
            }
        }
    }
    while xr.len() >= 8 {
        group::<8>(&mut xr, &mut or, weight, eps);
    }
    if xr.len() >= 4 {
        group::<4>(&mut xr, &mut or, weight, eps);
    }
    if xr.len() >= 2 {
        group::<2>(&mut xr, &mut or, weight, eps);
    }
    for (xv, o) in xr.zip(or) {
        math::rms_norm(xv, weight, eps, o);
    }
}

/// The RMSNorm scale of each of `N` rows of equal length, as `math::rms_norm` computes
/// it: the f32 squares summed in f64 in order, the mean rounded to f32,
/// `1 / sqrtf(mean + eps)`.
fn rms_scales<const N: usize>(x: &[&[f32]; N], eps: f32) -> [f32; N] {
    let n = x[0].len();
    let rows: [&[f32]; N] = std::array::from_fn(|r| &x[r][..n]);
    let mut sum = [0.0f64; N];
    for i in 0..n {
        for r in 0..N {
            let v = rows[r][i];
            sum[r] += (v * v) as f64;
        }
    }
    sum.map(|s| {
        let mean = (s / n as f64) as f32;
        1.0 / libm::sqrtf(mean + eps)
    })
}

/// `out = x * scale * w` (or `x * scale`), in `math::rms_norm`'s order.
fn rms_apply(x: &[f32], scale: f32, weight: Option<&[f32]>, out: &mut [f32]) {
    match weight {
        Some(w) => {
            for ((o, &v), &wv) in out.iter_mut().zip(x).zip(w) {
                *o = v * scale * wv;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale;
            }
        }
    }
}

/// What a RoPE call's angles depend on (everything but the pairing), by bits.
#[derive(Debug, PartialEq)]
struct RopeKey {
    n_rot: usize,
    base: u32,
    freq_scale: u32,
    freq_factors: Option<Vec<u32>>,
    yarn: Option<[u32; 5]>,
}

impl RopeKey {
    fn of(cfg: &math::RopeConfig<'_>) -> Self {
        Self {
            n_rot: cfg.n_rot,
            base: cfg.base.to_bits(),
            freq_scale: cfg.freq_scale.to_bits(),
            freq_factors: cfg
                .freq_factors
                .map(|f| f.iter().map(|v| v.to_bits()).collect()),
            yarn: cfg.yarn.map(yarn_bits),
        }
    }

    /// Whether `cfg` has these angles (without allocating).
    fn matches(&self, cfg: &math::RopeConfig<'_>) -> bool {
        let same_factors = match (&self.freq_factors, cfg.freq_factors) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == y.to_bits())
            }
            _ => false,
        };
        self.n_rot == cfg.n_rot
            && self.base == cfg.base.to_bits()
            && self.freq_scale == cfg.freq_scale.to_bits()
            && same_factors
            && self.yarn == cfg.yarn.map(yarn_bits)
    }
}

fn yarn_bits(y: math::Yarn) -> [u32; 5] {
    [
        y.ext_factor.to_bits(),
        y.attn_factor.to_bits(),
        y.beta_fast.to_bits(),
        y.beta_slow.to_bits(),
        y.n_ctx_orig,
    ]
}

/// The cosines and sines of one RoPE call's angles: per position, `n_rot / 2` pairs.
#[derive(Debug)]
pub(crate) struct RopeTable {
    key: RopeKey,
    positions: Vec<u32>,
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    /// The angles of `positions` as `math::rope` computes them
    /// (`math::RopeConfig::angles`), rows in parallel.
    pub(crate) fn new(positions: &[u32], cfg: &math::RopeConfig<'_>) -> Self {
        let half = cfg.n_rot / 2;
        let mut cs = vec![(0f32, 0f32); positions.len() * half];
        if half > 0 {
            cs.par_chunks_mut(half)
                .zip(positions.par_iter())
                .for_each(|(row, &pos)| cfg.angles(pos, row));
        }
        Self {
            key: RopeKey::of(cfg),
            positions: positions.to_vec(),
            cs,
        }
    }

    /// Whether this table holds the angles of exactly this call.
    pub(crate) fn matches(&self, positions: &[u32], cfg: &math::RopeConfig<'_>) -> bool {
        self.key.matches(cfg) && self.positions == positions
    }
}

/// RoPE in place on `[rows, n_heads * head_dim]`: `math::rope` on every head, with the
/// angles from `table` (made for these positions and parameters), pairs as `kind` says,
/// rows in parallel. `fma`: the CPU has FMA instructions (the fused multiply-adds
/// inline).
pub(crate) fn rope(
    x: &mut [f32],
    table: &RopeTable,
    kind: math::RopeKind,
    n_heads: usize,
    head_dim: usize,
    fma: bool,
) {
    let _ = fma;
    let n_rot = table.key.n_rot;
    let positions = &table.positions;
    let row = n_heads * head_dim;
    assert!(row > 0, "rope: empty rows");
    assert_eq!(x.len(), positions.len() * row, "rope: x length");
    assert!(
        n_rot.is_multiple_of(2) && n_rot <= head_dim,
        "rope: n_rot {n_rot}, head size {head_dim}"
    );
    if n_rot == 0 {
        return;
    }
    let half = n_rot / 2;
    x.par_chunks_mut(row * 8)
        .zip(table.cs.par_chunks(half * 8))
        .for_each(|(xs, css)| {
            for (xr, cs) in xs.chunks_exact_mut(row).zip(css.chunks_exact(half)) {
                for h in xr.chunks_exact_mut(head_dim) {
                    #[cfg(target_arch = "x86_64")]
                    if fma {
                        // SAFETY: the caller checked FMA (the device's SIMD level).
                        unsafe { crate::kernels::avx2::rope_rotate(h, kind, cs) };
                        continue;
                    }
                    rope_rotate(h, kind, cs);
                }
            }
        });
}

/// One head's rotation by `cs` as `math::rope_rotate` computes it (ggml's
/// `rotate_pairs` as GCC contracts it), with `f32::mul_add` for the fused
/// multiply-adds; inlined into the FMA kernel of `kernels::avx2`.
#[inline(always)]
pub(crate) fn rope_rotate(h: &mut [f32], kind: math::RopeKind, cs: &[(f32, f32)]) {
    let rot =
        |x0: f32, x1: f32, (c, s): (f32, f32)| (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c));
    match kind {
        math::RopeKind::Normal => {
            for (p, &c) in h.chunks_exact_mut(2).zip(cs) {
                (p[0], p[1]) = rot(p[0], p[1], c);
            }
        }
        math::RopeKind::Neox => {
            let half = cs.len();
            let (lo, hi) = h.split_at_mut(half);
            for ((a, b), &c) in lo.iter_mut().zip(&mut hi[..half]).zip(cs) {
                (*a, *b) = rot(*a, *b, c);
            }
        }
    }
}

/// `x[r * bias.len() + j] += bias[j]` for every row `r` (lengths checked by the caller).
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Top-k routing of each row of logits (core reference per row).
pub(crate) fn route_topk(
    logits: &[f32],
    n_experts: usize,
    bias: Option<&[f32]>,
    cfg: &RoutingConfig,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<(), HalError> {
    assert!(
        n_experts > 0 && logits.len().is_multiple_of(n_experts),
        "route_topk: logits length"
    );
    let rows = logits.len() / n_experts;
    let k = cfg.k;
    assert!(
        ids.len() == rows * k && weights.len() == rows * k,
        "route_topk: output lengths"
    );
    for r in 0..rows {
        math::route_topk(
            &logits[r * n_experts..(r + 1) * n_experts],
            bias,
            k,
            cfg.gating,
            cfg.normalize,
            cfg.scale,
            &mut ids[r * k..(r + 1) * k],
            &mut weights[r * k..(r + 1) * k],
        )
        .map_err(|e| HalError::invalid(format!("route_topk: {e}")))?;
    }
    Ok(())
}

/// One layer's KV cache in host memory: keys and values as f16 (their bits), as
/// llama.cpp's default cache types (`type_k`, `type_v` F16) keep them: the values a
/// forward writes are rounded to f16 (part of what llama.cpp's logits are), and reading
/// them back as f32 is exact. Half the bytes of f32 to read per decode step.
///
/// Keys lie transposed inside each block, `[block][KV head][head_dim_k][block_size]`:
/// element `d` of the keys of one block's consecutive slots is one contiguous run, so a
/// decode step scores 16 keys per SIMD instruction (`kernels::attn`, keys in lanes).
/// `CpuKv::key_base` gives where a key starts; its elements are `block_size` apart.
/// Values stay one row per slot (`[slot][KV head][head_dim_v]`): the output sums read
/// whole value rows.
#[derive(Debug)]
pub struct CpuKv {
    layout: KvLayout,
    /// `[num_blocks, n_kv_heads, head_dim_k, block_size]`, f16 bits.
    pub(crate) k: HugeU16,
    /// `[num_slots, n_kv_heads * head_dim_v]`, f16 bits.
    pub(crate) v: HugeU16,
}

/// Transparent huge pages are 2 MiB on x86-64.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Key or value buffers from this size on are advised for huge pages (each then holds
/// less than one huge page more than it has touched).
const HUGE_CACHE_MIN: usize = HUGE_PAGE;

/// `bytes` of zeroed anonymous memory starting on a huge-page boundary: the mapping and
/// the offset of that boundary in it. With `huge`, the range is advised for transparent
/// huge pages (advice only: on small pages the memory is merely slower to stream).
pub(crate) fn huge_aligned_anon(
    bytes: usize,
    huge: bool,
) -> std::io::Result<(memmap2::MmapMut, usize)> {
    let total = bytes
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| std::io::Error::other("size overflows"))?;
    let map = memmap2::MmapMut::map_anon(total)?;
    let start = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
    #[cfg(unix)]
    if huge {
        let _ = map.advise_range(memmap2::Advice::HugePage, start, bytes);
    }
    #[cfg(not(unix))]
    let _ = huge;
    Ok((map, start))
}

/// Zeroed `u16`s in an anonymous mapping, advised for transparent huge pages when it is
/// large: a decode step reads a long context's cache in scattered runs of a few KB,
/// after the step's weights have pushed it out of the caches and out of the TLB, so that
/// on small pages nearly every run costs a page walk. A small cache (a short `flint run` session) stays on small pages, where a huge
/// page per buffer would only raise the resident memory.
pub(crate) struct HugeU16 {
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
}

impl HugeU16 {
    /// `len` zeros, or the error of the mapping.
    fn zeroed(len: usize) -> std::io::Result<Self> {
        let bytes = len
            .checked_mul(2)
            .ok_or_else(|| std::io::Error::other("size overflows"))?;
        let (map, start) = huge_aligned_anon(bytes, bytes >= HUGE_CACHE_MIN)?;
        Ok(Self { map, start, len })
    }
}

impl std::ops::Deref for HugeU16 {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        bytemuck::cast_slice(&self.map[self.start..self.start + self.len * 2])
    }
}

impl std::ops::DerefMut for HugeU16 {
    fn deref_mut(&mut self) -> &mut [u16] {
        bytemuck::cast_slice_mut(&mut self.map[self.start..self.start + self.len * 2])
    }
}

impl std::fmt::Debug for HugeU16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeU16({} values)", self.len)
    }
}

impl CpuKv {
    pub(crate) fn new(layout: &KvLayout) -> Result<Self, HalError> {
        let nk = layout
            .num_slots()
            .checked_mul(layout.n_kv_heads * layout.head_dim_k);
        let nv = layout
            .num_slots()
            .checked_mul(layout.n_kv_heads * layout.head_dim_v);
        let (Some(nk), Some(nv)) = (nk, nv) else {
            return Err(HalError::out_of_memory(format!(
                "KV layout {layout:?} overflows"
            )));
        };
        let alloc = |n: usize| -> Result<HugeU16, HalError> {
            HugeU16::zeroed(n).map_err(|e| {
                HalError::out_of_memory(format!(
                    "KV cache of {} bytes ({layout:?}): {e}",
                    n.saturating_mul(2)
                ))
            })
        };
        Ok(Self {
            layout: *layout,
            k: alloc(nk)?,
            v: alloc(nv)?,
        })
    }

    /// Index in `k` of element 0 of KV head `kvh`'s key at `slot`; element `d` is at
    /// `key_base + d * block_size`.
    #[inline]
    pub(crate) fn key_base(&self, slot: usize, kvh: usize) -> usize {
        let l = &self.layout;
        let (b, s) = (slot / l.block_size, slot % l.block_size);
        (b * l.n_kv_heads + kvh) * l.head_dim_k * l.block_size + s
    }
}

impl KvBuffer for CpuKv {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// `dst[i]` = the f16 bits of `src[i]` (round to nearest even): with F16C eight at a time
/// (as `half`, which without `std` converts in software at a few ns per value).
fn f16_bits_from(dst: &mut [u16], src: &[f32], f16c: bool) {
    #[cfg(target_arch = "x86_64")]
    if f16c {
        // SAFETY: the caller saw F16C and AVX in the CPU's features (the device level).
        unsafe { crate::kernels::avx2::f16_bits_from(dst, src) };
        return;
    }
    let _ = f16c;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

/// `dst[i]` = the f16 `src[i]` as f32 (exact): with F16C eight at a time.
pub(crate) fn f32_from_f16_bits(dst: &mut [f32], src: &[u16], f16c: bool) {
    #[cfg(target_arch = "x86_64")]
    if f16c {
        // SAFETY: the caller saw F16C and AVX in the CPU's features (the device level).
        unsafe { crate::kernels::avx2::f32_from_f16_bits(dst, src) };
        return;
    }
    let _ = f16c;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(x).to_f32();
    }
}

pub(crate) fn write_kv(
    kv: &mut CpuKv,
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    f16c: bool,
) -> Result<(), HalError> {
    let l = kv.layout;
    let rk = l.n_kv_heads * l.head_dim_k;
    let rv = l.n_kv_heads * l.head_dim_v;
    assert_eq!(k.len(), slots.len() * rk, "write_kv: k length");
    assert_eq!(v.len(), slots.len() * rv, "write_kv: v length");
    let mut key = vec![0u16; rk];
    for (i, &s) in slots.iter().enumerate() {
        let s = s as usize;
        if s >= l.num_slots() {
            return Err(HalError::invalid(format!(
                "write_kv: slot {s} outside a cache of {} slots",
                l.num_slots()
            )));
        }
        f16_bits_from(&mut key, &k[i * rk..(i + 1) * rk], f16c);
        for (kvh, row) in key.chunks_exact(l.head_dim_k.max(1)).enumerate() {
            let base = kv.key_base(s, kvh);
            for (d, &x) in row.iter().enumerate() {
                kv.k[base + d * l.block_size] = x;
            }
        }
        f16_bits_from(
            &mut kv.v[s * rv..(s + 1) * rv],
            &v[i * rv..(i + 1) * rv],
            f16c,
        );
    }
    Ok(())
}

/// Checks a paged-attention call against the cache layout `l` and an output of
/// `out_len` values (misuse panics, as the HAL documents; a position beyond its block
/// table is an error) and returns, per query row, its sequence and position.
pub(crate) fn query_owners(
    l: &KvLayout,
    p: &PagedAttention<'_>,
    out_len: usize,
) -> Result<Vec<Option<(usize, u32)>>, HalError> {
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    assert!(
        hkv > 0 && nh.is_multiple_of(hkv),
        "paged_attention: {nh} heads over {hkv} KV heads"
    );
    assert_eq!(p.q.len() % (nh * dk).max(1), 0, "paged_attention: q length");
    let n_rows = p.q.len() / (nh * dk).max(1);
    assert_eq!(out_len, n_rows * nh * dv, "paged_attention: out length");
    if let Some(s) = p.sinks {
        assert_eq!(s.len(), nh, "paged_attention: sinks length");
    }
    let mut owner: Vec<Option<(usize, u32)>> = vec![None; n_rows];
    for (si, s) in p.seqs.iter().enumerate() {
        for (t, &pos) in s.positions.iter().enumerate() {
            let r = s.q_start + t;
            assert!(
                r < n_rows,
                "paged_attention: sequence {si} row {r} beyond q"
            );
            assert!(
                owner[r].is_none(),
                "paged_attention: row {r} in two sequences"
            );
            owner[r] = Some((si, pos));
            // Every position the query reads must be mapped to a real block.
            if pos as usize / bs >= s.block_table.len() {
                return Err(HalError::invalid(format!(
                    "paged_attention: sequence {si} position {pos} beyond its block table of {}",
                    s.block_table.len()
                )));
            }
        }
    }
    Ok(owner)
}

/// Paged attention, parallel over (query row, head).
pub(crate) fn paged_attention(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
    f16c: bool,
) -> Result<(), HalError> {
    let l = kv.layout;
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    let owner = query_owners(&l, p, out.len())?;
    let group = nh / hkv;
    let rv = hkv * dv;
    let num_blocks = l.num_blocks;
    let bad = std::sync::atomic::AtomicBool::new(false);
    out.par_chunks_mut(dv.max(1))
        .enumerate()
        .for_each(|(idx, o)| {
            let (r, h) = (idx / nh, idx % nh);
            let Some((si, pos)) = owner[r] else {
                o.fill(0.0);
                return;
            };
            let seq = &p.seqs[si];
            let q = &p.q[(r * nh + h) * dk..(r * nh + h + 1) * dk];
            let kvh = h / group;
            let pos = pos as usize;
            let lo = math::window_start(pos, p.window);
            // Gather the visible keys and values, then attend as llama.cpp's CPU flash
            // attention does for a prompt batch (`attend_ggml_tiled`): Gemma 3 turns
            // one-ulp differences there into visible logit differences.
            let n = pos + 1 - lo;
            let (mut kbits, mut vbits) = (Vec::with_capacity(n * dk), Vec::with_capacity(n * dv));
            for j in lo..=pos {
                let b = seq.block_table[j / bs];
                if b == NO_BLOCK || b as usize >= num_blocks {
                    // A freed block inside the visible range is a caller error; never read it.
                    bad.store(true, std::sync::atomic::Ordering::Relaxed);
                    o.fill(0.0);
                    return;
                }
                let slot = b as usize * bs + j % bs;
                let base = kv.key_base(slot, kvh);
                kbits.extend((0..dk).map(|d| kv.k[base + d * bs]));
                vbits.extend_from_slice(&kv.v[slot * rv + kvh * dv..slot * rv + (kvh + 1) * dv]);
            }
            let (mut kbuf, mut vbuf) = (vec![0f32; n * dk], vec![0f32; n * dv]);
            f32_from_f16_bits(&mut kbuf, &kbits, f16c);
            f32_from_f16_bits(&mut vbuf, &vbits, f16c);
            let ks: Vec<&[f32]> = (0..n).map(|i| &kbuf[i * dk..(i + 1) * dk]).collect();
            let vs: Vec<&[f32]> = (0..n).map(|i| &vbuf[i * dv..(i + 1) * dv]).collect();
            let sink = p.sinks.map(|s| s[h]);
            math::attend_ggml_tiled(q, &ks, &vs, lo, p.scale, sink, o);
        });
    if bad.into_inner() {
        return Err(HalError::invalid(
            "paged_attention: a visible position maps to a freed (NO_BLOCK) or out-of-range block",
        ));
    }
    Ok(())
}
