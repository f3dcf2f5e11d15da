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
//! so the output is the same byte for byte whatever the thread count.
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

/// The rest of a file [`begin_file`] started: `general.quantization_version`, the
/// tokenizer keys, then the planned tensors; returns it with its parameter count.
pub(crate) fn finish_file(
    mut w: GgufWriter,
    tokenizer: Vec<(String, Value)>,
    planned: &[Planned],
    seed: u64,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(GgufWriter, usize), SynthError> {
    w.add("general.quantization_version", 2u32)
        .map_err(writer_err)?;
    for (k, v) in tokenizer {
        w.add(&k, v).map_err(writer_err)?;
    }
    add_tensors(&mut w, planned, seed, progress)?;
    Ok((w, plan_params(planned)))
}

/// The encoded bytes of one planned tensor.
pub(crate) fn make_tensor(seed: u64, t: &Planned) -> Result<Vec<u8>, SynthError> {
    let n: usize = t.dims.iter().product();
    let vals: Vec<f32> = match &t.fill {
        Fill::Normal { mean, std } => {
            let mut rng = tensor_rng(seed, &t.name);
            (0..n).map(|_| mean + std * rng.normal()).collect()
        }
        Fill::Values(v) if v.len() == n => v.clone(),
        Fill::Values(v) => {
            return Err(SynthError(format!(
                "{}: {} values for a shape of {n} elements",
                t.name,
                v.len()
            )))
        }
    };
    let row = t.dims[0];
    let row_bytes = t.ty.row_bytes(row).ok_or_else(|| {
        SynthError(format!(
            "{}: rows of {row} are not whole {} blocks",
            t.name, t.ty
        ))
    })?;
    let mut out = vec![0u8; row_bytes * (n / row)];
    // Quantize a few hundred rows per task: rows are independent.
    let chunk_rows = 256;
    out.par_chunks_mut(row_bytes * chunk_rows)
        .zip(vals.par_chunks(row * chunk_rows))
        .try_for_each(|(dst, src)| flint_core::quant::quantize(t.ty, src, dst))
        .map_err(|e| SynthError(format!("quantizing {} as {}: {e}", t.name, t.ty)))?;
    Ok(out)
}

/// Generates the planned tensors (in parallel) and adds them to `w` in plan order.
/// `progress(done, total)` after each tensor.
pub(crate) fn add_tensors(
    w: &mut GgufWriter,
    planned: &[Planned],
    seed: u64,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), SynthError> {
    let total = planned.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let datas: Vec<Result<Vec<u8>, SynthError>> = planned
        .par_iter()
        .map(|t| {
            let r = make_tensor(seed, t);
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
