//! Float weights (F32, F16, BF16) against f32 activations: the encodings, and their
//! AVX2 kernel (`avx2.rs`); below AVX2 the matmul loops over [`FloatKind::get`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use flint_core::GgmlType;

use crate::kernels::f16_to_f32;

/// Float weight encodings computed against f32 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatKind {
    F32,
    F16,
    BF16,
}

impl FloatKind {
    pub(crate) fn of(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::F32 => Some(FloatKind::F32),
            GgmlType::F16 => Some(FloatKind::F16),
            GgmlType::BF16 => Some(FloatKind::BF16),
            _ => None,
        }
    }

    /// Element `i` of a row of bytes.
    #[inline(always)]
    pub(crate) fn get(self, w: &[u8], i: usize) -> f32 {
        match self {
            FloatKind::F32 => {
                f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
            }
            FloatKind::F16 => f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
            FloatKind::BF16 => {
                f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16)
            }
        }
    }
}
