//! The legacy 32-quant blocks Q8_0, Q5_0 and Q4_0 · Q8_0 activations, which share their
//! kernels: tinyBLAS's order (`tinyblas.rs`), one file per SIMD level, the panels of a
//! prompt batch (`panel.rs` with VNNI, `panel_avx2.rs` without), and Q8_0 and Q5_0
//! repacked at staging (`kernels/mod.rs` has the map).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tinyblas;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
pub(crate) mod x16;
