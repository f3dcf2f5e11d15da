//! Q3_K weights · Q8_K activations (`avx2.rs`: one weight row against several
//! activation rows, every SIMD level, and four weight rows against one activation row,
//! the AVX2 level's decode matvec; `vnni.rs`: that matvec on AVX-512 VNNI;
//! `panel_avx2.rs`: the prompt-batch panels of every level; `perm.rs`: blocks arranged at
//! staging for the VBMI matvec; the scalar fallback is
//! `flint_core::dot::vec_dot`, whose order every level here keeps).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_avx2;
pub(crate) mod perm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
