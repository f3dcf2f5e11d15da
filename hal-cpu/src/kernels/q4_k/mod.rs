//! Q4_K weights · Q8_K activations: one file per SIMD level, the panels of a prompt
//! batch, and the layout repacked at staging (`kernels/mod.rs` has the map).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
pub(crate) mod x16;
