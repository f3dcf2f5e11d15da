//! The GGML tensor types as GGUF stores them.

use core::fmt;

/// Every GGML tensor type Flint knows, with its GGUF id as the discriminant.
///
/// "Block" is the unit of a quantized encoding: `block_size()` elements stored in
/// `type_size()` bytes. Float types have a block of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

/// A GGUF type id that Flint does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeError {
    /// The id found in the file.
    pub id: u32,
}

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown GGML tensor type id {}", self.id)
    }
}

/// A buffer whose length does not fit the block format it is read or written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The type has no implementation for this operation (for example quantizing to
    /// an IQ type).
    Unsupported(GgmlType),
    /// `bytes` is not a whole number of blocks of the type.
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// The length given.
        bytes: usize,
    },
    /// The element counts of source and destination disagree.
    LengthMismatch {
        /// Elements the encoded side holds.
        expected: usize,
        /// Elements the other side holds.
        found: usize,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Unsupported(t) => write!(f, "operation not supported for {t}"),
            FormatError::PartialBlock { ty, bytes } => write!(
                f,
                "{bytes} bytes is not a whole number of {ty} blocks ({} bytes each)",
                ty.type_size()
            ),
            FormatError::LengthMismatch { expected, found } => {
                write!(
                    f,
                    "length mismatch: expected {expected} elements, found {found}"
                )
            }
        }
    }
}

/// Super-block size of the K-quants and most IQ types.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The 25 weight types that `gguf.quants.dequantize` (llama.cpp's Python reference)
    /// dequantizes, and so the ones checked bit for bit against its golden vectors.
    pub const DEQUANTIZABLE: [GgmlType; 25] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The type with this GGUF id.
    pub fn from_id(id: u32) -> Result<Self, TypeError> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| *t as u32 == id)
            .ok_or(TypeError { id })
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name llama.cpp uses (`"Q4_K"`, `"F32"`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// The type whose [`name`](Self::name) is `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use crate::blocks::*;
        use core::mem::size_of;
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 => size_of::<BlockQ4_0>(),
            Q4_1 => size_of::<BlockQ4_1>(),
            Q5_0 => size_of::<BlockQ5_0>(),
            Q5_1 => size_of::<BlockQ5_1>(),
            Q8_0 => size_of::<BlockQ8_0>(),
            Q8_1 => size_of::<BlockQ8_1>(),
            Q2_K => size_of::<BlockQ2K>(),
            Q3_K => size_of::<BlockQ3K>(),
            Q4_K => size_of::<BlockQ4K>(),
            Q5_K => size_of::<BlockQ5K>(),
            Q6_K => size_of::<BlockQ6K>(),
            Q8_K => size_of::<BlockQ8K>(),
            IQ2_XXS => size_of::<BlockIQ2XXS>(),
            IQ2_XS => size_of::<BlockIQ2XS>(),
            IQ3_XXS => size_of::<BlockIQ3XXS>(),
            IQ1_S => size_of::<BlockIQ1S>(),
            IQ4_NL => size_of::<BlockIQ4NL>(),
            IQ3_S => size_of::<BlockIQ3S>(),
            IQ2_S => size_of::<BlockIQ2S>(),
            IQ4_XS => size_of::<BlockIQ4XS>(),
            IQ1_M => size_of::<BlockIQ1M>(),
            TQ1_0 => size_of::<BlockTQ1_0>(),
            TQ2_0 => size_of::<BlockTQ2_0>(),
            MXFP4 => size_of::<BlockMXFP4>(),
        }
    }

    /// True for the block-quantized types (everything but the plain numeric types).
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::I8
                | GgmlType::I16
                | GgmlType::I32
                | GgmlType::I64
                | GgmlType::F64
        )
    }

    /// Bytes taken by a row of `n` elements, or `None` when `n` is not a whole number of
    /// blocks or the product overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// The activation type ggml pairs with this weight type in a dot product
    /// (`vec_dot_type`): Q8_K for the K-quants and IQ types, Q8_0/Q8_1 for the legacy
    /// types, the type itself for float types.
    pub fn vec_dot_type(self) -> GgmlType {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
            Q4_1 | Q5_1 => Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S
            | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => Q8_K,
            other => other,
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), Err(TypeError { id: 4 }));
        assert_eq!(GgmlType::from_id(1000), Err(TypeError { id: 1000 }));
    }

    #[test]
    fn sizes_match_ggml() {
        // (type, block elements, block bytes) as in ggml.c's type_traits.
        let expect = [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::IQ2_XXS, 256, 66),
            (GgmlType::IQ2_XS, 256, 74),
            (GgmlType::IQ3_XXS, 256, 98),
            (GgmlType::IQ1_S, 256, 50),
            (GgmlType::IQ4_NL, 32, 18),
            (GgmlType::IQ3_S, 256, 110),
            (GgmlType::IQ2_S, 256, 82),
            (GgmlType::IQ4_XS, 256, 136),
            (GgmlType::IQ1_M, 256, 56),
            (GgmlType::TQ1_0, 256, 54),
            (GgmlType::TQ2_0, 256, 66),
            (GgmlType::MXFP4, 32, 17),
        ];
        for (t, bs, ts) in expect {
            assert_eq!((t.block_size(), t.type_size()), (bs, ts), "{t}");
        }
    }
}
