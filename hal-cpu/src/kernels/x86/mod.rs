//! SIMD helpers shared by the kernels of several formats, per instruction set.

pub(crate) mod avx2;
pub(crate) mod avx512;
