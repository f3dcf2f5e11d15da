//! The KV cache (`CpuKv`, f16 in huge-page memory), its writes, and paged attention
//! (f32, plain loops that the compiler vectorises, rayon over rows and heads; the AVX-512
//! form is `kernels::attention`).

use std::any::Any;

use flint_core::math;
use flint_hal::{HalError, KvBuffer, KvLayout, PagedAttention, NO_BLOCK};
use rayon::prelude::*;

use crate::arena::{huge_aligned_anon, HUGE_PAGE};

/// One layer's KV cache in host memory: keys and values as f16 (their bits), as
/// llama.cpp's default cache types (`type_k`, `type_v` F16) keep them: the values a
/// forward writes are rounded to f16 (part of what llama.cpp's logits are), and reading
/// them back as f32 is exact. Half the bytes of f32 to read per decode step.
///
/// Keys lie transposed inside each block, `[block][KV head][head_dim_k][block_size]`:
/// element `d` of the keys of one block's consecutive slots is one contiguous run, so a
/// decode step scores 16 keys per SIMD instruction (`kernels::attention`, keys in lanes).
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

/// Key or value buffers from this size on are advised for huge pages (each then holds
/// less than one huge page more than it has touched).
const HUGE_CACHE_MIN: usize = HUGE_PAGE;

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

impl HugeU16 {
    /// Faults every page in now (`MADV_POPULATE_WRITE`, Linux 5.14+; a hint elsewhere).
    fn make_resident(&self) {
        #[cfg(target_os = "linux")]
        if self.len > 0 {
            let _ = self
                .map
                .advise_range(memmap2::Advice::PopulateWrite, self.start, self.len * 2);
        }
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
    fn make_resident(&mut self) {
        self.k.make_resident();
        self.v.make_resident();
    }
}

/// `dst[i]` = the f16 bits of `src[i]` (round to nearest even): with F16C eight at a time
/// (as `half`, which without `std` converts in software at a few ns per value).
fn f16_bits_from(dst: &mut [u16], src: &[f32], f16c: bool) {
    #[cfg(target_arch = "x86_64")]
    if f16c {
        // SAFETY: the caller saw F16C and AVX in the CPU's features (the device level).
        unsafe { crate::kernels::elementwise::avx2::f16_bits_from(dst, src) };
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
        unsafe { crate::kernels::elementwise::avx2::f32_from_f16_bits(dst, src) };
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
        for (t, &pos) in s.positions.host().iter().enumerate() {
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
            if pos as usize / bs >= s.block_table.host().len() {
                return Err(HalError::invalid(format!(
                    "paged_attention: sequence {si} position {pos} beyond its block table of {}",
                    s.block_table.len()
                )));
            }
        }
    }
    Ok(owner)
}

/// Where llama.cpp switches float orders with the size of a call, whether the cpu
/// device follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatOrder {
    /// One order per op whatever the call: llama.cpp's prompt-batch orders (tinyBLAS for
    /// F32 matrices of a multiple of 4 rows, the tiled flash attention,
    /// `flint_core::math::attend_ggml_tiled`), each row computed as if alone, so that a
    /// request's numbers never depend on what else is in the step, nor on how its
    /// prompt was chunked, nor on a recompute after preemption. The default.
    BatchInvariant,
    /// llama.cpp's orders for the call's size, as it computes a single sequence: one
    /// activation row of an F32 matrix in `ggml_vec_dot_f32`'s order, attention calls of
    /// fewer than 64 query rows (decode steps, short prompts) through its
    /// one-key-at-a-time path (`flint_core::math::attend_ggml_one_chunk`, the output
    /// held in f16). Decode steps then give llama.cpp's logits where the matmul orders
    /// agree (`engine/tests/families.rs`), and a request's numbers depend on the step.
    LlamaCpp,
}

impl FloatOrder {
    /// `FLINT_CPU_ORDER` (`batch`: [`FloatOrder::BatchInvariant`], `llamacpp`:
    /// [`FloatOrder::LlamaCpp`]) when set; else batch-invariant.
    pub fn choose() -> Result<Self, HalError> {
        match std::env::var("FLINT_CPU_ORDER") {
            Ok(v) => match v.trim() {
                "batch" => Ok(FloatOrder::BatchInvariant),
                "llamacpp" => Ok(FloatOrder::LlamaCpp),
                other => Err(HalError::invalid(format!(
                    "FLINT_CPU_ORDER={other:?} is not batch or llamacpp"
                ))),
            },
            Err(_) => Ok(FloatOrder::BatchInvariant),
        }
    }

    /// Whether a call of `p`'s query rows takes the one-key-at-a-time path: in
    /// llama.cpp's order, fewer than `flint_core::math::GGML_FA_TILE_Q` rows.
    pub(crate) fn one_chunk(self, p: &PagedAttention<'_>, head_dim_k: usize) -> bool {
        self == FloatOrder::LlamaCpp
            && p.q.len() / (p.n_heads * head_dim_k).max(1) < flint_core::math::GGML_FA_TILE_Q
    }
}

/// Paged attention in `order`'s attention order, parallel over (query row, head).
pub(crate) fn paged_attention(
    kv: &CpuKv,
    p: &PagedAttention<'_>,
    order: FloatOrder,
    out: &mut [f32],
) -> Result<(), HalError> {
    let l = kv.layout;
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    let owner = query_owners(&l, p, out.len())?;
    let queries = p.q.host();
    let group = nh / hkv;
    let rv = hkv * dv;
    let num_blocks = l.num_blocks;
    let one_chunk = order.one_chunk(p, dk);
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
            let q = &queries[(r * nh + h) * dk..(r * nh + h + 1) * dk];
            let kvh = h / group;
            let pos = pos as usize;
            let lo = math::window_start(pos, p.window);
            // Gather the visible keys and values, then attend as llama.cpp's CPU flash
            // attention does (`attend_ggml_tiled`; in llama.cpp's order, below 64 rows,
            // `attend_ggml_one_chunk`): Gemma 3 turns one-ulp differences there into
            // visible logit differences.
            let n = pos + 1 - lo;
            let (mut kbits, mut vbits) = (Vec::with_capacity(n * dk), Vec::with_capacity(n * dv));
            for j in lo..=pos {
                let b = seq.block_table.host()[j / bs];
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
            f32_from_f16_bits(&mut kbuf, &kbits, false);
            f32_from_f16_bits(&mut vbuf, &vbits, false);
            let ks: Vec<&[f32]> = (0..n).map(|i| &kbuf[i * dk..(i + 1) * dk]).collect();
            let vs: Vec<&[f32]> = (0..n).map(|i| &vbuf[i * dv..(i + 1) * dv]).collect();
            let sink = p.sinks.map(|s| s.host()[h]);
            if one_chunk {
                math::attend_ggml_one_chunk(
                    math::GgmlCpuBuild::Avx512,
                    q,
                    &ks,
                    &vs,
                    p.scale,
                    sink,
                    o,
                );
            } else {
                math::attend_ggml_tiled(
                    math::GgmlCpuBuild::Avx512,
                    q,
                    &ks,
                    &vs,
                    lo,
                    p.scale,
                    sink,
                    o,
                );
            }
        });
    if bad.into_inner() {
        return Err(HalError::invalid(
            "paged_attention: a visible position maps to a freed (NO_BLOCK) or out-of-range block",
        ));
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident kilobytes of the mapping of this process that starts at or holds `addr`
    /// (`Rss:` of its `/proc/self/smaps` entry).
    fn resident_kib(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut holds = false;
        for line in smaps.lines() {
            let head = line.split(' ').next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                let (a, b) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16));
                if let (Ok(a), Ok(b)) = (a, b) {
                    holds = a <= addr && addr < b;
                }
            } else if holds && line.starts_with("Rss:") {
                return line[4..]
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn a_pool_made_resident_has_every_page_in_memory() {
        // 2048 blocks of 16 slots, 1 KV head of 256: 16 MiB of keys, 16 MiB of values.
        let layout = KvLayout {
            num_blocks: 2048,
            block_size: 16,
            n_kv_heads: 1,
            head_dim_k: 256,
            head_dim_v: 256,
        };
        let mut kv = CpuKv::new(&layout).unwrap();
        let (k, v) = (kv.k.as_ptr() as usize, kv.v.as_ptr() as usize);
        let want = (kv.k.len() * 2 / 1024) as u64;
        assert!(resident_kib(k) < want, "fresh keys are not resident yet");
        kv.make_resident();
        assert!(
            resident_kib(k) >= want,
            "keys: {} of {want} KiB",
            resident_kib(k)
        );
        assert!(
            resident_kib(v) >= want,
            "values: {} of {want} KiB",
            resident_kib(v)
        );
        assert!(kv.k.iter().all(|&x| x == 0) && kv.v.iter().all(|&x| x == 0));
    }
}
