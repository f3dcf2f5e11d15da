//! Deterministic synthetic checkpoints (`flint synth`).
//!
//! Two kinds of recipe share this module:
//! - [`flint`]: the Flint MoE architecture ([`Preset::Tiny`], [`Preset::Bench`]).
//! - [`dense`]: the dense families llama.cpp runs (`llama`, `qwen2`, `qwen3`, `gemma3`),
//!   written with the keys, tensor names and shapes llama.cpp's `convert_hf_to_gguf.py`
//!   writes for them, so that llama.cpp loads them unchanged.
//! - [`moe`]: the mixture-of-experts families llama.cpp runs (`qwen3moe`, `glm4moe`,
//!   `mimo2`, `gpt-oss`), written the same way.
//! - [`gemma4`]: Gemma 4 (the 26B-A4B MoE and E2B layouts), written the same way.
//! - [`qwen35moe`]: Qwen 3.5 MoE (Gated DeltaNet and gated attention layers), written the
//!   same way.
//!
//! Both fill tensors the same way. Weights are random but scaled so activations stay in a
//! realistic range: matrices `N(0, 1/in)` (unit-variance outputs for unit-variance
//! inputs), norm weights `1 + N(0, 0.05)`, embeddings `N(0, 1)` unless a recipe says
//! otherwise. Every tensor has its own PRNG stream seeded from the seed and the tensor's
//! name ([`tensor_rng`]), and tensors are generated in parallel but added in plan order,
//! so the output is the same byte for byte whatever the thread count. The full-size
//! presets draw their quantized matrices block by block from pools of quantized random
//! blocks of the same spread ([`Fill::Pooled`]) instead of quantizing every value.
//!
//! The llama.cpp families' recipes describe a file as a [`SynthFile`], which is made in
//! memory (tests) or streamed to disk a few tensors at a time ([`SynthFile::write`],
//! `flint synth`): a full-size file is larger than memory.
//!
//! Tokenizers come from [`vocab`]: a byte-level BPE learnt here (no network, no files),
//! or a real vocabulary copied from another GGUF and truncated.

pub mod dense;
pub mod flint;
pub mod gemma4;
pub mod moe;
pub mod qwen35moe;
pub mod vocab;

use flint_core::GgmlType;
use flint_loader::gguf::{GgufError, GgufWriter, Value};
use rayon::prelude::*;

use crate::sample::Rng;

pub use flint::{param_count, synth, synth_model, write_synth, Preset, SynthConfig};
pub use vocab::{build_vocab, SynthVocab};

/// A synthesis failure (writer, quantizer, vocabulary), with what was being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthError(pub String);

impl std::fmt::Display for SynthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SynthError {}

/// A writer error as a [`SynthError`].
pub(crate) fn writer_err(e: GgufError) -> SynthError {
    SynthError(e.to_string())
}

/// FNV-1a of the name, mixed with the seed: one PRNG stream per tensor.
pub(crate) fn tensor_rng(seed: u64, name: &str) -> Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// How to fill one tensor.
#[derive(Clone, Debug)]
pub(crate) enum Fill {
    /// `N(mean, std)` from the tensor's own stream.
    Normal { mean: f32, std: f32 },
    /// These values, in GGUF element order (computed tensors such as `rope_freqs`).
    Values(Vec<f32>),
    /// A quantized matrix whose blocks are drawn, by the tensor's own stream, from a
    /// pool of [`POOL_BLOCKS`] blocks quantized from `N(mean, std)` values: the values
    /// of such a tensor have the spread of `Normal`'s, at the cost of a copy per block
    /// instead of quantizing every value (the full-size presets, whose tens of billions
    /// of values would take hours to quantize on two cores).
    Pooled { mean: f32, std: f32 },
}

impl Fill {
    /// A weight matrix of `inp` inputs: `N(0, gain^2 / inp)`.
    pub(crate) fn matrix(inp: usize, gain: f32) -> Self {
        Fill::Normal {
            mean: 0.0,
            std: gain / (inp as f32).sqrt(),
        }
    }

    /// A norm weight: `mean * (1 + N(0, 0.05))`.
    pub(crate) fn norm(mean: f32) -> Self {
        Fill::Normal {
            mean,
            std: 0.05 * mean,
        }
    }
}

/// Blocks in a [`Fill::Pooled`] pool: 16 MiB of values per pool for 256-element blocks,
/// so that two rows of a matrix share a block sequence with negligible odds.
pub(crate) const POOL_BLOCKS: usize = 1 << 16;

/// The pooled fills of a plan, quantized once per encoding and spread: (type, mean and
/// std bits) -> the pool's blocks.
pub(crate) type Pools = std::collections::HashMap<(GgmlType, u32, u32), Vec<u8>>;

/// The key of a pooled fill.
fn pool_key(ty: GgmlType, mean: f32, std: f32) -> (GgmlType, u32, u32) {
    (ty, mean.to_bits(), std.to_bits())
}

/// The pools the planned tensors with [`Fill::Pooled`] draw from, each quantized from its
/// own stream (seeded by the seed, the type and the spread).
fn make_pools(seed: u64, planned: &[Planned]) -> Result<Pools, SynthError> {
    let mut pools = Pools::new();
    for t in planned {
        let Fill::Pooled { mean, std } = t.fill else {
            continue;
        };
        let key = pool_key(t.ty, mean, std);
        if pools.contains_key(&key) {
            continue;
        }
        let name = format!("pool.{}.{:08x}.{:08x}", t.ty, key.1, key.2);
        let block = t.ty.block_size();
        let pool = Planned::new(
            name,
            t.ty,
            vec![block, POOL_BLOCKS],
            Fill::Normal { mean, std },
        );
        pools.insert(
            key,
            make_tensor_in_chunks(seed, &pool, MAKE_CHUNK_ELEMS, &pools)?,
        );
    }
    Ok(pools)
}

/// One tensor of a recipe.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<usize>,
    pub fill: Fill,
}

impl Planned {
    pub(crate) fn new(name: String, ty: GgmlType, dims: Vec<usize>, fill: Fill) -> Self {
        Planned {
            name,
            ty,
            dims,
            fill,
        }
    }
}

/// The tensors of a plan: name, encoding and dims (GGUF order), in file order.
pub(crate) fn plan_layout(planned: Vec<Planned>) -> Vec<(String, GgmlType, Vec<usize>)> {
    planned
        .into_iter()
        .map(|t| (t.name, t.ty, t.dims))
        .collect()
}

/// Parameters of a plan (all tensor elements).
pub(crate) fn plan_params(planned: &[Planned]) -> usize {
    planned
        .iter()
        .map(|t| t.dims.iter().product::<usize>())
        .sum()
}

/// `general.file_type` of a llama.cpp-family recipe: 0 (all f32) or 15 (mostly Q4_K_M).
pub(crate) fn file_type(quantized: bool) -> u32 {
    if quantized {
        15
    } else {
        0
    }
}

/// The encoding of a matrix whose rows have `row` elements (F32 unless `quantized`):
/// `hi` picks the higher-precision half of the mix. K-quants need rows of whole
/// 256-blocks; other rows fall back as llama-quantize does (Q4_K to Q5_0, Q6_K to Q8_0).
pub(crate) fn matrix_type(quantized: bool, row: usize, hi: bool) -> GgmlType {
    if !quantized {
        return GgmlType::F32;
    }
    match (row.is_multiple_of(256), hi) {
        (true, false) => GgmlType::Q4_K,
        (true, true) => GgmlType::Q6_K,
        (false, false) => GgmlType::Q5_0,
        (false, true) => GgmlType::Q8_0,
    }
}

/// A llama.cpp-family file up to its architecture keys, in the converter's order:
/// `general.architecture`, `general.type`, `general.name`, `{arch}.*` (`hparams`),
/// `general.file_type`.
pub(crate) fn begin_file(
    arch: &str,
    name: &str,
    hparams: Vec<(&'static str, Value)>,
    file_type: u32,
) -> Result<GgufWriter, SynthError> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch).map_err(writer_err)?;
    w.add("general.type", "model").map_err(writer_err)?;
    w.add("general.name", name).map_err(writer_err)?;
    for (k, v) in hparams {
        w.add(&format!("{arch}.{k}"), v).map_err(writer_err)?;
    }
    w.add("general.file_type", file_type).map_err(writer_err)?;
    Ok(w)
}

/// The rest of a file [`begin_file`] started: `general.quantization_version` and the
/// tokenizer keys; the planned tensors come when the file is made ([`SynthFile`]).
pub(crate) fn finish_file(
    mut w: GgufWriter,
    tokenizer: Vec<(String, Value)>,
    planned: Vec<Planned>,
    seed: u64,
) -> Result<SynthFile, SynthError> {
    w.add("general.quantization_version", 2u32)
        .map_err(writer_err)?;
    for (k, v) in tokenizer {
        w.add(&k, v).map_err(writer_err)?;
    }
    Ok(SynthFile {
        meta: w,
        planned,
        seed,
    })
}

/// A llama.cpp-family checkpoint described but not generated yet: its metadata and its
/// planned tensors. [`SynthFile::into_writer`] generates it in memory (tests);
/// [`SynthFile::write`] streams it to disk a few tensors at a time, for files larger
/// than memory (the full-size presets).
#[derive(Debug)]
pub struct SynthFile {
    meta: GgufWriter,
    planned: Vec<Planned>,
    seed: u64,
}

/// Encoded bytes [`SynthFile::write`] generates at once at most (a single larger tensor
/// alone): with the chunked generation of [`make_tensor`] this bounds the memory a
/// write takes, whatever the file's size.
const WRITE_BATCH_BYTES: usize = 512 << 20;

impl SynthFile {
    /// Parameters (all tensor elements).
    pub fn params(&self) -> usize {
        plan_params(&self.planned)
    }

    /// Bytes of the tensors' data (without the alignment padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.planned.iter().map(|t| planned_bytes(t) as u64).sum()
    }

    /// The whole file in memory, with its parameter count; `progress(done, total)` in
    /// tensors after each tensor.
    pub fn into_writer(
        self,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<(GgufWriter, usize), SynthError> {
        let mut w = self.meta;
        let pools = make_pools(self.seed, &self.planned)?;
        add_tensors(&mut w, &self.planned, self.seed, &pools, progress)?;
        Ok((w, plan_params(&self.planned)))
    }

    /// Writes the file at `path`, the same bytes as [`SynthFile::into_writer`] makes,
    /// holding at most [`WRITE_BATCH_BYTES`] of tensors (or one larger tensor) and their
    /// working buffers at once; `progress(done, total)` in tensor bytes after each
    /// tensor. Returns the parameter count. A failed write removes the partial file.
    pub fn write(
        &self,
        path: &std::path::Path,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<usize, SynthError> {
        let r = self.write_inner(path, progress);
        if r.is_err() {
            let _ = std::fs::remove_file(path);
        }
        r.map(|()| self.params())
    }

    fn write_inner(
        &self,
        path: &std::path::Path,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<(), SynthError> {
        let io = |e: GgufError| SynthError(format!("writing {}: {e}", path.display()));
        let layout = plan_layout(self.planned.clone());
        let mut out = self.meta.stream_file(path, &layout).map_err(io)?;
        let total = self.tensor_bytes();
        let mut done = 0u64;
        progress(done, total);
        let pools = make_pools(self.seed, &self.planned)?;
        let mut rest = &self.planned[..];
        while !rest.is_empty() {
            let mut n = 1;
            let mut bytes = planned_bytes(&rest[0]);
            while n < rest.len() && bytes + planned_bytes(&rest[n]) <= WRITE_BATCH_BYTES {
                bytes += planned_bytes(&rest[n]);
                n += 1;
            }
            let (batch, tail) = rest.split_at(n);
            let datas: Vec<Result<Vec<u8>, SynthError>> = batch
                .par_iter()
                .map(|t| make_tensor(self.seed, t, &pools))
                .collect();
            for data in datas {
                let data = data?;
                out.put(&data).map_err(io)?;
                done += data.len() as u64;
                progress(done, total);
            }
            rest = tail;
        }
        out.finish().map_err(io)
    }
}

/// The encoded bytes of one planned tensor (0 for rows that are not whole blocks, which
/// [`make_tensor`] refuses).
fn planned_bytes(t: &Planned) -> usize {
    let n: usize = t.dims.iter().product();
    let row = t.dims.first().copied().unwrap_or(1).max(1);
    t.ty.row_bytes(row).map_or(0, |b| b * (n / row))
}

/// Elements [`make_tensor`] draws and quantizes at a time (whole rows, at least one).
const MAKE_CHUNK_ELEMS: usize = 1 << 24;

/// The encoded bytes of one planned tensor. The values are drawn from the tensor's own
/// stream a chunk of rows at a time, each chunk quantized in parallel before the next is
/// drawn, so the f32 values of a large tensor are never all in memory.
pub(crate) fn make_tensor(seed: u64, t: &Planned, pools: &Pools) -> Result<Vec<u8>, SynthError> {
    make_tensor_in_chunks(seed, t, MAKE_CHUNK_ELEMS, pools)
}

/// [`make_tensor`], drawing about `chunk_elems` values at a time (whole rows, at least
/// one): the bytes do not depend on it.
fn make_tensor_in_chunks(
    seed: u64,
    t: &Planned,
    chunk_elems: usize,
    pools: &Pools,
) -> Result<Vec<u8>, SynthError> {
    let n: usize = t.dims.iter().product();
    if let Fill::Values(v) = &t.fill {
        if v.len() != n {
            return Err(SynthError(format!(
                "{}: {} values for a shape of {n} elements",
                t.name,
                v.len()
            )));
        }
    }
    let row = t.dims[0];
    let row_bytes = t.ty.row_bytes(row).ok_or_else(|| {
        SynthError(format!(
            "{}: rows of {row} are not whole {} blocks",
            t.name, t.ty
        ))
    })?;
    let n_rows = n.checked_div(row).unwrap_or(0);
    let mut out = vec![0u8; row_bytes * n_rows];
    if n == 0 || row_bytes == 0 {
        return Ok(out);
    }
    let mut rng = tensor_rng(seed, &t.name);
    if let Fill::Pooled { mean, std } = t.fill {
        let pool = pools
            .get(&pool_key(t.ty, mean, std))
            .ok_or_else(|| SynthError(format!("{}: no pool of {} blocks", t.name, t.ty)))?;
        let bb = t.ty.type_size();
        for dst in out.chunks_exact_mut(bb) {
            let i = (rng.next_u64() % POOL_BLOCKS as u64) as usize;
            dst.copy_from_slice(&pool[i * bb..(i + 1) * bb]);
        }
        return Ok(out);
    }
    // Quantize a few hundred rows per task: rows are independent.
    let task_rows = 256;
    let chunk_rows = (chunk_elems / row).clamp(1, n_rows.max(1));
    let mut vals = Vec::with_capacity(chunk_rows * row);
    for (c, dst) in out.chunks_mut(row_bytes * chunk_rows).enumerate() {
        let rows = dst.len() / row_bytes;
        let first = c * chunk_rows * row;
        vals.clear();
        match &t.fill {
            Fill::Normal { mean, std } => {
                vals.extend((0..rows * row).map(|_| mean + std * rng.normal()));
            }
            Fill::Values(v) => vals.extend_from_slice(&v[first..first + rows * row]),
            Fill::Pooled { .. } => {
                return Err(SynthError(format!(
                    "{}: a pooled fill drawn value by value",
                    t.name
                )))
            }
        }
        dst.par_chunks_mut(row_bytes * task_rows)
            .zip(vals.par_chunks(row * task_rows))
            .try_for_each(|(dst, src)| flint_core::quant::quantize(t.ty, src, dst))
            .map_err(|e| SynthError(format!("quantizing {} as {}: {e}", t.name, t.ty)))?;
    }
    Ok(out)
}

/// Generates the planned tensors (in parallel) and adds them to `w` in plan order.
/// `progress(done, total)` after each tensor.
pub(crate) fn add_tensors(
    w: &mut GgufWriter,
    planned: &[Planned],
    seed: u64,
    pools: &Pools,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), SynthError> {
    let total = planned.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let datas: Vec<Result<Vec<u8>, SynthError>> = planned
        .par_iter()
        .map(|t| {
            let r = make_tensor(seed, t, pools);
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress(n, total);
            r
        })
        .collect();
    for (t, data) in planned.iter().zip(datas) {
        w.add_tensor(&t.name, t.ty, &t.dims, data?)
            .map_err(writer_err)?;
    }
    Ok(())
}

/// Writes `w` to `path`.
pub(crate) fn write_file(w: &GgufWriter, path: &std::path::Path) -> Result<(), SynthError> {
    w.write_file(path)
        .map_err(|e| SynthError(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor drawn and quantized a row, a few rows or all at a time has the same
    /// bytes, for a drawn and a given fill.
    #[test]
    fn chunked_generation_gives_the_same_bytes() {
        let values: Vec<f32> = (0..512 * 7).map(|i| (i as f32 * 0.37).sin()).collect();
        for (ty, fill) in [
            (GgmlType::Q4_K, Fill::matrix(512, 1.0)),
            (GgmlType::Q6_K, Fill::Values(values)),
            (GgmlType::F32, Fill::norm(1.0)),
        ] {
            let t = Planned::new("blk.0.t.weight".into(), ty, vec![512, 7], fill);
            let whole = make_tensor_in_chunks(9, &t, usize::MAX, &Pools::new()).unwrap();
            assert_eq!(whole.len(), ty.row_bytes(512).unwrap() * 7);
            for chunk in [1, 512, 3 * 512 + 5] {
                assert!(
                    make_tensor_in_chunks(9, &t, chunk, &Pools::new()).unwrap() == whole,
                    "{ty} in chunks of {chunk}"
                );
            }
        }
    }

    /// A pooled tensor: the same bytes for the same seed, other bytes for another,
    /// every block one of its pool's, and values with the spread asked for.
    #[test]
    fn pooled_blocks_come_from_the_pool_with_the_spread_asked_for() {
        let std = 0.05;
        let plan = |name: &str| {
            Planned::new(
                name.into(),
                GgmlType::Q4_K,
                vec![1024, 96],
                Fill::Pooled { mean: 0.0, std },
            )
        };
        let planned = [plan("a.weight"), plan("b.weight")];
        let pools = make_pools(3, &planned).unwrap();
        assert_eq!(pools.len(), 1, "one pool per type and spread");
        let pool = &pools[&pool_key(GgmlType::Q4_K, 0.0, std)];
        let bb = GgmlType::Q4_K.type_size();
        assert_eq!(pool.len(), POOL_BLOCKS * bb);
        let a = make_tensor(3, &planned[0], &pools).unwrap();
        assert!(a == make_tensor(3, &planned[0], &pools).unwrap());
        assert!(a != make_tensor(3, &planned[1], &pools).unwrap());
        let blocks: std::collections::HashSet<&[u8]> = pool.chunks_exact(bb).collect();
        assert!(a.chunks_exact(bb).all(|b| blocks.contains(b)));
        let v = flint_core::dequant::dequantize_to_vec(GgmlType::Q4_K, &a).unwrap();
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((sd / std as f64 - 1.0).abs() < 0.05, "spread {sd}");
    }
}
