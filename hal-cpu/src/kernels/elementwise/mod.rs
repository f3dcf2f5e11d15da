//! Element-wise ops with SIMD, lane for lane the scalar definitions in
//! `flint_core::math` (the scalar paths are in `crate::ops` and `crate::kv`).

pub(crate) mod avx2;
pub(crate) mod avx512;
