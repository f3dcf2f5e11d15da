//! IQ4_XS weights · Q8_K activations (`avx2.rs`; the scalar fallback is
//! `flint_core::dot::vec_dot`, whose order every level here keeps).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
