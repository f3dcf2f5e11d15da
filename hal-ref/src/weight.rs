//! Staging: which block encodings the reference device computes with, and the weight it
//! keeps (the tensor's bytes as they are in the file).

use std::any::Any;

use flint_core::{FormatError, GgmlType};
use flint_hal::{
    HalError, PlannedWeight, StagedInfo, Tier, Weight, WeightDesc, WeightKind, WeightSource,
};

/// A weight staged on the reference device: the file's bytes, kept where they lie (a
/// shared reference to the loader's buffer; nothing is copied or expanded).
#[derive(Debug)]
pub struct RefWeight {
    pub(crate) info: StagedInfo,
    pub(crate) src: WeightSource,
    pub(crate) ty: GgmlType,
    /// Elements per row (`dims[0]`).
    pub(crate) k: usize,
    /// Rows per matrix (per expert for a tower, `dims[1]`).
    pub(crate) n: usize,
    /// Experts (`dims[2]`; 1 for a matrix).
    pub(crate) e: usize,
    /// Bytes of one row of `k` elements.
    pub(crate) row_bytes: usize,
}

impl RefWeight {
    /// The bytes of matrix `expert` (0 for a plain matrix): `n` rows of `row_bytes`.
    pub(crate) fn matrix(&self, expert: usize) -> &[u8] {
        let len = self.n * self.row_bytes;
        &self.src.as_slice()[expert * len..(expert + 1) * len]
    }

    /// The bytes of row `r` counted over all matrices (`r < n * e`).
    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.src.as_slice()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

impl Weight for RefWeight {
    fn info(&self) -> &StagedInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Whether `flint_core::dot::dot_row_f32` (the matmuls) computes rows of `ty`: asked
/// once on a zero row of one block, so that the answer is core's own.
pub(crate) fn dot_supports(ty: GgmlType) -> bool {
    let n = ty.block_size();
    let Some(bytes) = ty.row_bytes(n) else {
        return false;
    };
    flint_core::dot::dot_row_f32(ty, &vec![0u8; bytes], &vec![0.0f32; n]).is_ok()
}

/// Whether `flint_core::dequant::dequantize` (`get_rows`) decodes `ty`: asked on one
/// zero block.
pub(crate) fn dequant_supports(ty: GgmlType) -> bool {
    let n = ty.block_size();
    let Some(bytes) = ty.row_bytes(n) else {
        return false;
    };
    flint_core::dequant::dequantize(ty, &vec![0u8; bytes], &mut vec![0.0f32; n]).is_ok()
}

/// A `flint-core` format error as a HAL error: an encoding core does not implement is
/// `Unsupported`, anything else (bytes that do not fit the shape) `InvalidInput`.
pub(crate) fn fmt_err(what: &str, e: FormatError) -> HalError {
    match e {
        FormatError::Unsupported(_) => HalError::unsupported(format!("ref: {what}: {e}")),
        _ => HalError::invalid(format!("ref: {what}: {e}")),
    }
}

/// `Unsupported` (naming tensor and encoding) when the device cannot compute with `w`:
/// an embedding needs dequantization (`get_rows`) or a dot product (a tied output
/// matrix), everything else a dot product.
pub(crate) fn check_usable(w: &WeightDesc) -> Result<(), HalError> {
    let ty = w.ty;
    let usable = match w.kind {
        WeightKind::Embedding => dequant_supports(ty) || dot_supports(ty),
        WeightKind::Matrix | WeightKind::ExpertTower => dot_supports(ty),
    };
    if usable {
        Ok(())
    } else {
        Err(HalError::unsupported(format!(
            "ref: tensor '{}' has type {ty}, which flint-core has no scalar kernel for",
            w.name
        )))
    }
}

/// What staging `w` does: it stays resident with its encoding kept.
pub(crate) fn planned(w: &WeightDesc) -> PlannedWeight {
    PlannedWeight {
        name: w.name.clone(),
        source_ty: w.ty,
        staged_ty: w.ty,
        kept_quant: true,
        tier: Tier::Resident,
        resident_bytes: w.data.len() as u64,
        streamed_bytes: 0,
    }
}

/// Stages `desc`: checks bytes against type and shape and the encoding against what
/// core computes, then keeps a reference to the bytes.
pub(crate) fn stage(desc: &WeightDesc) -> Result<RefWeight, HalError> {
    desc.validate()?;
    check_usable(desc)?;
    let ty = desc.ty;
    let k = desc.in_features();
    let row_bytes = ty.row_bytes(k).ok_or_else(|| {
        HalError::invalid(format!(
            "ref: tensor '{}': {k} is not a whole number of {ty} blocks",
            desc.name
        ))
    })?;
    let p = planned(desc);
    Ok(RefWeight {
        info: StagedInfo {
            name: p.name,
            source_ty: ty,
            staged_ty: ty,
            dims: desc.dims.clone(),
            kept_quant: p.kept_quant,
            tier: p.tier,
            resident_bytes: p.resident_bytes,
            streamed_bytes: p.streamed_bytes,
        },
        src: desc.data.clone(),
        ty,
        k,
        n: desc.out_features(),
        e: desc.experts(),
        row_bytes,
    })
}
