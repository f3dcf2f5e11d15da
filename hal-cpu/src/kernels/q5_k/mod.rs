//! Q5_K weights · Q8_K activations: one file per SIMD level (`kernels/mod.rs` has the
//! map).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
