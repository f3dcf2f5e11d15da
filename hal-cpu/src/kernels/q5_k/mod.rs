//! Q5_K weights · Q8_K activations: one file per SIMD level and the eight-row panels of
//! a prompt batch (`panel_avx2.rs`, every level; `kernels/mod.rs` has the map).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
