use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use flint_core::GgmlType;

use crate::HalError;

/// Bytes shared between the loader (usually a memory map) and the devices that stage
/// weights from it without copying. `memmap2::Mmap` and `Vec<u8>` both qualify.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Called by a device that keeps its own copy of a weight (repacked, say) with the
/// weight's byte range: the owner of the buffer may give those pages back to the system.
/// The bytes must stay readable and unchanged (a mapping drops its pages and reads them
/// again from the file on access); only the memory they hold goes.
pub type ReleaseHook = Arc<dyn Fn(Range<usize>) + Send + Sync>;

/// A byte range inside [`SharedBytes`]: where one tensor's data lies.
#[derive(Clone)]
pub struct WeightSource {
    bytes: SharedBytes,
    range: Range<usize>,
    release: Option<ReleaseHook>,
}

impl WeightSource {
    /// The `range` of `bytes`. Fails when the range does not lie inside the bytes.
    pub fn new(bytes: SharedBytes, range: Range<usize>) -> Result<Self, HalError> {
        let len = (*bytes).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(HalError::invalid(format!(
                "weight byte range {}..{} is outside a buffer of {len} bytes",
                range.start, range.end
            )));
        }
        Ok(Self {
            bytes,
            range,
            release: None,
        })
    }

    /// The same source, with a hook through which a device that no longer reads these
    /// bytes lets their owner release the memory ([`ReleaseHook`]).
    pub fn with_release(mut self, hook: ReleaseHook) -> Self {
        self.release = Some(hook);
        self
    }

    /// Whether the owner of the bytes can take their memory back
    /// ([`release_resident`](Self::release_resident) does something).
    pub fn can_release(&self) -> bool {
        self.release.is_some()
    }

    /// Tells the owner of the bytes that this source's range need not stay in memory
    /// (a hint: the bytes stay readable; nothing happens without a hook).
    pub fn release_resident(&self) {
        if let Some(hook) = &self.release {
            hook(self.range.clone());
        }
    }

    /// [`release_resident`](Self::release_resident) for bytes `part` of this source (a
    /// device that copies a large weight piece by piece hands each piece back as it
    /// goes, so that the copy and the source are never both whole in memory). A part
    /// past the end is clipped.
    pub fn release_resident_part(&self, part: Range<usize>) {
        if let Some(hook) = &self.release {
            let len = self.range.len();
            let (s, e) = (part.start.min(len), part.end.min(len));
            if s < e {
                hook(self.range.start + s..self.range.start + e);
            }
        }
    }

    /// A source owning `data` (tests, synthesised weights).
    pub fn from_vec(data: Vec<u8>) -> Self {
        let len = data.len();
        Self {
            bytes: Arc::new(data),
            range: 0..len,
            release: None,
        }
    }

    /// The tensor's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.range.clone()]
    }

    /// The shared buffer the bytes lie in (for backends that keep a reference instead
    /// of copying).
    pub fn shared(&self) -> &SharedBytes {
        &self.bytes
    }

    /// The byte range inside [`shared`](Self::shared).
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when the range is empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightSource")
            .field("range", &self.range)
            .finish()
    }
}

/// What a weight is used for; lets a device plan placement (expert towers are the
/// bulk of a MoE and the first candidates for streaming).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightKind {
    /// A matrix `[in, out]` used by `matmul`.
    Matrix,
    /// An expert tower `[in, out, E]` used by `expert_matmul`.
    ExpertTower,
    /// An embedding table `[d, V]` used by `get_rows` (and possibly `matmul` when tied).
    Embedding,
}

/// A weight to stage: its GGUF name, encoding, shape and raw bytes.
#[derive(Clone, Debug)]
pub struct WeightDesc {
    /// The tensor's name in the GGUF (for error messages and placement plans).
    pub name: String,
    /// Block encoding as stored in the file.
    pub ty: GgmlType,
    /// Shape in GGUF order (first dimension contiguous): `[in, out]` or `[in, out, E]`.
    pub dims: Vec<usize>,
    /// What the weight is used for.
    pub kind: WeightKind,
    /// The bytes, exactly as in the file.
    pub data: WeightSource,
}

impl WeightDesc {
    /// Checks that the byte length matches type and shape; the error names the tensor.
    pub fn validate(&self) -> Result<(), HalError> {
        let n: Option<usize> = self.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let row = self.dims.first().copied().unwrap_or(0);
        let rows = n.and_then(|n| n.checked_div(row.max(1)));
        let expect = match (self.ty.row_bytes(row), rows) {
            (Some(rb), Some(rows)) => rb.checked_mul(rows),
            _ => None,
        };
        match expect {
            Some(e) if e == self.data.len() => Ok(()),
            Some(e) => Err(HalError::invalid(format!(
                "tensor '{}' ({} {:?}) should hold {e} bytes, got {}",
                self.name,
                self.ty,
                self.dims,
                self.data.len()
            ))),
            None => Err(HalError::invalid(format!(
                "tensor '{}' has shape {:?} that is not a whole number of {} blocks",
                self.name, self.dims, self.ty
            ))),
        }
    }

    /// Rows of the (per-expert) matrix: `dims[1]`, or 1 for a vector.
    pub fn out_features(&self) -> usize {
        self.dims.get(1).copied().unwrap_or(1)
    }

    /// Contiguous length of a row: `dims[0]`.
    pub fn in_features(&self) -> usize {
        self.dims.first().copied().unwrap_or(0)
    }

    /// Number of experts for a tower (`dims[2]`), 1 otherwise.
    pub fn experts(&self) -> usize {
        self.dims.get(2).copied().unwrap_or(1)
    }
}

/// Where a staged weight lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Held in device memory for the life of the model.
    Resident,
    /// Expert towers held in device memory in their own tier.
    ExpertResident,
    /// Streamed from the host on every use.
    Streamed,
}

/// What a device did with a weight it staged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedInfo {
    /// The tensor's name.
    pub name: String,
    /// Encoding in the file.
    pub source_ty: GgmlType,
    /// Encoding the device computes from: `source_ty` when kept, else what it expanded
    /// to (BF16, F16 or F32).
    pub staged_ty: GgmlType,
    /// Shape in GGUF order.
    pub dims: Vec<usize>,
    /// True when the block encoding is kept as it is.
    pub kept_quant: bool,
    /// Where it lives.
    pub tier: Tier,
    /// Bytes the device holds for it.
    pub resident_bytes: u64,
    /// Bytes it reads from the host on every use.
    pub streamed_bytes: u64,
}

/// A weight staged on a device. Only the device that made it may use it; handing it to
/// another device is a caller bug and panics.
pub trait Weight: Send + Sync + fmt::Debug {
    /// What the device did with it.
    fn info(&self) -> &StagedInfo;
    /// For the owning device to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// A shared handle to a staged weight.
pub type WeightHandle = Arc<dyn Weight>;

/// One entry of a [`StagingPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedWeight {
    /// The tensor's name.
    pub name: String,
    /// Encoding in the file.
    pub source_ty: GgmlType,
    /// Encoding it would be staged as.
    pub staged_ty: GgmlType,
    /// Whether the block encoding would be kept.
    pub kept_quant: bool,
    /// Where it would live.
    pub tier: Tier,
    /// Bytes the device would hold.
    pub resident_bytes: u64,
    /// Bytes it would stream per use.
    pub streamed_bytes: u64,
}

/// A device's placement decision for a whole model, before anything is staged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagingPlan {
    /// One entry per weight, in the order given.
    pub weights: Vec<PlannedWeight>,
}

impl StagingPlan {
    /// Bytes held resident outside the expert tier.
    pub fn resident_bytes(&self) -> u64 {
        self.sum(|w| w.tier == Tier::Resident)
    }

    /// Bytes held in the expert tier.
    pub fn expert_tier_bytes(&self) -> u64 {
        self.sum(|w| w.tier == Tier::ExpertResident)
    }

    /// Bytes streamed from the host per use.
    pub fn streamed_bytes(&self) -> u64 {
        self.weights.iter().map(|w| w.streamed_bytes).sum()
    }

    fn sum(&self, f: impl Fn(&PlannedWeight) -> bool) -> u64 {
        self.weights
            .iter()
            .filter(|w| f(w))
            .map(|w| w.resident_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A part is offset by the source's start and clipped to its end; an empty or
    /// wholly clipped part calls nothing; without a hook nothing happens.
    #[test]
    fn release_resident_part_offsets_and_clips() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let src = WeightSource::new(Arc::new(vec![0u8; 100]), 10..60)
            .expect("range")
            .with_release(Arc::new(move |r| {
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(r)
            }));
        src.release_resident_part(0..20);
        src.release_resident_part(20..80);
        src.release_resident_part(55..90);
        src.release_resident_part(7..7);
        src.release_resident();
        let got = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(got, vec![10..30, 30..60, 10..60]);
        let plain = WeightSource::new(Arc::new(vec![0u8; 8]), 0..8).expect("range");
        plain.release_resident_part(0..4);
        assert!(!plain.can_release());
    }
}
