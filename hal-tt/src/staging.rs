//! Keep-quant staging: which arrangement each weight gets (kept blocks, or expanded to a
//! float encoding: see [`arrangement`]), how an expert tower is sliced, and the staging
//! plan against the DRAM budget.

use flint_core::GgmlType;
use flint_hal::{HalError, PlannedWeight, StagingPlan, Tier, WeightDesc, WeightKind};

/// The share of DRAM the plan leaves free for KV caches and activation buffers: 1/16.
pub const RESERVE_DIVISOR: u64 = 16;

/// The float encodings the host can expand to.
pub const EXPANSION_TYPES: [GgmlType; 3] = [GgmlType::BF16, GgmlType::F16, GgmlType::F32];

/// The expansion target named by `FLINT_TT_EXPAND` (`bf16`, `f16` or `f32`), or `None`
/// when it is unset or empty: then each arm's own rule applies (see [`arrangement`]).
/// Another value is an error naming the variable.
pub fn expansion_from_env() -> Result<Option<GgmlType>, HalError> {
    match std::env::var("FLINT_TT_EXPAND") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "bf16" => Ok(Some(GgmlType::BF16)),
            "f16" => Ok(Some(GgmlType::F16)),
            "f32" => Ok(Some(GgmlType::F32)),
            other => Err(HalError::invalid(format!(
                "FLINT_TT_EXPAND={other:?} is not bf16, f16 or f32"
            ))),
        },
    }
}

/// Encodings the host can expand: the float types and every block encoding that
/// `flint_core::dequant` decodes.
pub fn expandable(ty: GgmlType) -> bool {
    GgmlType::DEQUANTIZABLE.contains(&ty)
}

/// In the keep-quant arm, an F32 or F16 tensor of at most this many bytes (in its own
/// encoding) is staged in its own encoding instead of BF16: 16 MiB, more than the router
/// of any current MoE (DeepSeek V3: 7 MiB). Narrowing such a tensor saves next to
/// nothing, and routers decide discrete expert choices that a BF16 rounding flips.
pub const SMALL_FLOAT_BYTES: u64 = 16 << 20;

/// How one weight is staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrangement {
    /// The encoding the device computes from.
    pub staged_ty: GgmlType,
    /// True when the file's blocks are staged verbatim.
    pub kept: bool,
}

/// The arrangement of a weight of encoding `ty` holding `bytes` bytes in the file:
///
/// - keep-quant on and `ty` a block encoding the device admits: kept verbatim;
/// - else, when `expand_to` is given (`FLINT_TT_EXPAND`), expanded to it;
/// - else, in the keep-quant arm, expanded **without loss**: a block encoding the device
///   does not admit to F32 (every block encoding decodes to values that F32 holds
///   exactly; BF16 or F16 would round them), an F32/F16 tensor of at most
///   [`SMALL_FLOAT_BYTES`] left in its encoding, a larger float tensor to BF16;
/// - else (the BF16 arm) expanded to BF16;
/// - an encoding the host cannot decode is an error naming encoding and tensor.
pub fn arrangement(
    name: &str,
    ty: GgmlType,
    bytes: u64,
    keep_quant: bool,
    expand_to: Option<GgmlType>,
    admits: impl Fn(GgmlType) -> bool,
) -> Result<Arrangement, HalError> {
    if keep_quant && ty.is_quantized() && admits(ty) {
        return Ok(Arrangement {
            staged_ty: ty,
            kept: true,
        });
    }
    if !expandable(ty) {
        let to = expand_to.unwrap_or(GgmlType::BF16);
        return Err(HalError::unsupported(format!(
            "tensor '{name}': encoding {ty} can be neither kept on the Tenstorrent device nor \
             expanded to {to}"
        )));
    }
    let staged_ty = match expand_to {
        Some(t) => t,
        None if !keep_quant => GgmlType::BF16,
        None if ty.is_quantized() => GgmlType::F32,
        None if matches!(ty, GgmlType::F32 | GgmlType::F16) && bytes <= SMALL_FLOAT_BYTES => ty,
        None => GgmlType::BF16,
    };
    Ok(Arrangement {
        staged_ty,
        kept: false,
    })
}

/// The matrix geometry of a weight: `(in, out, experts)`.
pub fn geometry(desc: &WeightDesc) -> Result<(usize, usize, usize), HalError> {
    if desc.dims.is_empty() || desc.dims.len() > 3 {
        return Err(HalError::invalid(format!(
            "tensor '{}' has shape {:?}: a weight is [in], [in, out] or [in, out, E]",
            desc.name, desc.dims
        )));
    }
    if desc.kind == WeightKind::ExpertTower && desc.dims.len() != 3 {
        return Err(HalError::invalid(format!(
            "expert tower '{}' has shape {:?}, expected [in, out, E]",
            desc.name, desc.dims
        )));
    }
    Ok((desc.in_features(), desc.out_features(), desc.experts()))
}

/// Bytes of one staged matrix slice `[in, out]` in `ty`.
pub fn slice_bytes(ty: GgmlType, in_f: usize, out_f: usize, name: &str) -> Result<usize, HalError> {
    ty.row_bytes(in_f)
        .and_then(|r| r.checked_mul(out_f))
        .ok_or_else(|| {
            HalError::invalid(format!(
                "tensor '{name}': a row of {in_f} values is not a whole number of {ty} blocks"
            ))
        })
}

/// Expert `e`'s bytes inside a tower's bytes, with the geometry checked: the slice lies
/// at `e * per` for `per = row_bytes(in) * out`, wholly inside the tensor, and the tower
/// holds exactly `E` slices.
pub fn expert_slice<'a>(
    name: &str,
    ty: GgmlType,
    (in_f, out_f, experts): (usize, usize, usize),
    bytes: &'a [u8],
    e: usize,
) -> Result<&'a [u8], HalError> {
    let per = slice_bytes(ty, in_f, out_f, name)?;
    let total = per.checked_mul(experts);
    if total != Some(bytes.len()) || e >= experts {
        return Err(HalError::invalid(format!(
            "tensor '{name}': expert {e} of {experts} ([{in_f}, {out_f}] {ty}, {per} bytes \
             each) does not lie in {} bytes",
            bytes.len()
        )));
    }
    let start = e * per;
    let s = &bytes[start..start + per];
    if !s.len().is_multiple_of(ty.type_size()) {
        return Err(HalError::invalid(format!(
            "tensor '{name}': expert {e} slice of {} bytes is not whole {ty} blocks",
            s.len()
        )));
    }
    Ok(s)
}

/// Expands `bytes` of encoding `ty` (a whole number of rows of `in_f`) to `to` (BF16,
/// F16 or F32, little-endian), through the core dequantizer and round-to-nearest-even.
pub fn expand(
    name: &str,
    ty: GgmlType,
    in_f: usize,
    bytes: &[u8],
    to: GgmlType,
) -> Result<Vec<u8>, HalError> {
    let row_bytes = slice_bytes(ty, in_f, 1, name)?;
    if row_bytes == 0 {
        return Ok(Vec::new());
    }
    let rows = bytes.len() / row_bytes;
    let mut out = Vec::with_capacity(rows * in_f * to.type_size());
    let mut row = vec![0.0f32; in_f];
    for r in bytes.chunks_exact(row_bytes) {
        flint_core::dequant::dequantize(ty, r, &mut row).map_err(|e| {
            HalError::unsupported(format!("tensor '{name}': cannot expand {ty} to {to}: {e}"))
        })?;
        match to {
            GgmlType::BF16 => {
                for &v in &row {
                    out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            GgmlType::F16 => {
                for &v in &row {
                    out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            GgmlType::F32 => {
                for &v in &row {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            other => {
                return Err(HalError::unsupported(format!(
                    "tensor '{name}': {other} is not an expansion target"
                )))
            }
        }
    }
    Ok(out)
}

/// Bytes a weight takes on the device in its arrangement.
pub fn staged_bytes(desc: &WeightDesc, arr: Arrangement) -> Result<u64, HalError> {
    let (in_f, out_f, e) = geometry(desc)?;
    let per = slice_bytes(arr.staged_ty, in_f, out_f, &desc.name)?;
    Ok((per as u64).saturating_mul(e as u64))
}

/// The staging plan: non-expert weights resident in the order given while they fit, then
/// expert towers in the expert tier while they fit; the rest streams from the host. The
/// budget is `dram_bytes` less a reserve of `dram_bytes / RESERVE_DIVISOR` for KV caches
/// and activations, less `other_bytes` (the norm weights and biases the engine uploads as
/// tensors).
pub fn plan(
    weights: &[WeightDesc],
    dram_bytes: u64,
    other_bytes: u64,
    keep_quant: bool,
    expand_to: Option<GgmlType>,
    admits: impl Fn(GgmlType) -> bool,
) -> Result<StagingPlan, HalError> {
    let mut left = (dram_bytes - dram_bytes / RESERVE_DIVISOR).saturating_sub(other_bytes);
    let mut entries: Vec<Option<PlannedWeight>> = vec![None; weights.len()];
    let mut sized = Vec::with_capacity(weights.len());
    for w in weights {
        let arr = arrangement(
            &w.name,
            w.ty,
            w.data.len() as u64,
            keep_quant,
            expand_to,
            &admits,
        )?;
        sized.push((arr, staged_bytes(w, arr)?));
    }
    for experts_pass in [false, true] {
        for (i, w) in weights.iter().enumerate() {
            let is_tower = w.kind == WeightKind::ExpertTower;
            if is_tower != experts_pass {
                continue;
            }
            let (arr, bytes) = sized[i];
            let fits = bytes <= left;
            if fits {
                left -= bytes;
            }
            let tier = match (fits, is_tower) {
                (false, _) => Tier::Streamed,
                (true, true) => Tier::ExpertResident,
                (true, false) => Tier::Resident,
            };
            entries[i] = Some(PlannedWeight {
                name: w.name.clone(),
                source_ty: w.ty,
                staged_ty: arr.staged_ty,
                kept_quant: arr.kept,
                tier,
                resident_bytes: if fits { bytes } else { 0 },
                streamed_bytes: if fits { 0 } else { bytes },
            });
        }
    }
    Ok(StagingPlan {
        weights: entries.into_iter().flatten().collect(),
    })
}
