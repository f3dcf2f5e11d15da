//! Paged attention with SIMD (the scalar path is `crate::kv::paged_attention`).

pub(crate) mod avx512;
