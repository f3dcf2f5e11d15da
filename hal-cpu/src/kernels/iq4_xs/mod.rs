//! IQ4_XS weights · Q8_K activations (`avx2.rs`: tiles of activation rows, every SIMD
//! level; `vnni.rs`: a decode's matvec, four weight rows at a time; the scalar fallback
//! is `flint_core::dot::vec_dot`, whose order every level here keeps).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
