//! `flint dump`: one tensor dequantized to little-endian f32, in GGUF element order
//! (the contiguous first dimension fastest), streamed row block by row block so a
//! tensor larger than memory can be dumped.

use std::io::{BufWriter, Write};

use clap::Args;
use flint_core::GgmlType;

use super::inspect::open_gguf;
use super::CliError;

/// Arguments of `flint dump`.
#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    /// GGUF file.
    pub model: std::path::PathBuf,
    /// Tensor name.
    pub tensor: String,
    /// Write here instead of stdout.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Elements dequantized per step (bounded memory whatever the tensor size).
const CHUNK_ELEMS: usize = 1 << 20;

/// Runs `flint dump`.
pub fn run(args: &DumpArgs) -> Result<(), CliError> {
    let f = open_gguf(&args.model)?;
    let t = f.tensor(&args.tensor).ok_or_else(|| {
        let mut names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        let hint = if names.is_empty() {
            "the file has no tensors".to_string()
        } else {
            format!(
                "the file has {} tensors, e.g. {}",
                names.len(),
                names.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            )
        };
        CliError::new(format!(
            "{}: no tensor named '{}' ({hint}; `flint inspect` lists them)",
            args.model.display(),
            args.tensor
        ))
    })?;
    if matches!(t.ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
        return Err(CliError::new(format!(
            "tensor '{}' has type {}, an activation-only encoding that Flint does not dequantize",
            t.name, t.ty
        )));
    }
    let data = f.tensor_data(t);
    // Whole blocks per step: the reader guaranteed dims[0] is a multiple of the block.
    let blocks_per_chunk = (CHUNK_ELEMS / t.ty.block_size()).max(1);
    let chunk_bytes = blocks_per_chunk * t.ty.type_size();

    let (sink, what): (Box<dyn Write>, String) = match &args.out {
        Some(p) => (
            Box::new(
                std::fs::File::create(p)
                    .map_err(|e| CliError::new(format!("cannot create {}: {e}", p.display())))?,
            ),
            p.display().to_string(),
        ),
        None => (Box::new(std::io::stdout().lock()), "stdout".to_string()),
    };
    let mut w = BufWriter::with_capacity(1 << 20, sink);
    let mut vals: Vec<f32> = Vec::new();
    let mut bytes: Vec<u8> = Vec::new();
    for src in data.chunks(chunk_bytes) {
        let n = src.len() / t.ty.type_size() * t.ty.block_size();
        vals.clear();
        vals.resize(n, 0.0);
        to_f32(t.ty, src, &mut vals).map_err(|e| {
            CliError::new(format!(
                "tensor '{}' ({}): cannot dequantize: {e}",
                t.name, t.ty
            ))
        })?;
        bytes.clear();
        bytes.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
        match w.write_all(&bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(CliError::new(format!("cannot write to {what}: {e}"))),
        }
    }
    match w.flush() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(format!("cannot write to {what}: {e}"))),
    }
}

/// Dequantizes block and float types through `flint_core::dequantize`; the plain
/// integer types and F64 (which it leaves out) are converted here, as numpy's
/// `astype(float32)` would.
fn to_f32(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    fn conv<const N: usize>(src: &[u8], dst: &mut [f32], f: fn([u8; N]) -> f32) {
        for (c, o) in src.chunks_exact(N).zip(dst.iter_mut()) {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            *o = f(a);
        }
    }
    match ty {
        GgmlType::I8 => conv::<1>(src, dst, |b| b[0] as i8 as f32),
        GgmlType::I16 => conv::<2>(src, dst, |b| i16::from_le_bytes(b) as f32),
        GgmlType::I32 => conv::<4>(src, dst, |b| i32::from_le_bytes(b) as f32),
        GgmlType::I64 => conv::<8>(src, dst, |b| i64::from_le_bytes(b) as f32),
        GgmlType::F64 => conv::<8>(src, dst, |b| f64::from_le_bytes(b) as f32),
        _ => return flint_core::dequantize(ty, src, dst).map_err(|e| e.to_string()),
    }
    Ok(())
}
