//! Intel AMX (Advanced Matrix Extensions): the tile registers and the TMUL unit of Xeon
//! Sapphire Rapids and later, which multiply a 16 x 64-byte int8 tile by a 64 x 16 one
//! into sixteen rows of sixteen i32 sums in one instruction (`tdpbssd`): 16384
//! multiply-adds against the 64 of a 512-bit `vpdpbusd`.
//!
//! Flint uses them for Q8_0 and Q5_0 matrices (`q8_0.rs`, five activation rows or
//! more; Q5_0 widened to Q8_0 blocks sixteen rows at a time), in the float order of
//! llama.cpp's AMX kernels (`flint_core::dot::ggml_x86::vec_dot_q8_0_q8_0_amx`: per
//! block the exact integer sum, then one FMA; `vec_dot_q5_0_q8_0_amx` the same for
//! Q5_0, which llama.cpp's AMX backend does not take), which need one scaling step per
//! 32 products where tinyBLAS's order needs eight; one to four activation rows take the
//! same order on AVX-512 VNNI (`rows.rs`), which streams the weight from memory faster
//! than the tiles do for so few rows. Q4_K and Q6_K matrices take llama.cpp's AMX order
//! for them (`vec_dot_q4_k_q8_k_amx` / `vec_dot_q6_k_q8_k_amx`) on AVX-512 VNNI, not on
//! the tiles: the four-row decode kernels and the prompt-batch panels with that order's
//! float steps (`kernels::dispatch::KAmx`). Where this process cannot run the tiles
//! ([`available`] is false: no AMX-INT8 in the CPU, the kernel or the hypervisor), Q8_0
//! and Q5_0 take the same order on AVX-512 VNNI for every number of rows
//! (`kernels::q0::panel::AmxOrder`, from 16-row groups where the layout repacks). The
//! device takes this path with `FLINT_CPU_AMX=1` at the AVX-512 VNNI level
//! (`CpuDevice::amx` says why it is off by default); its results then differ in the
//! last bits from the non-AMX orders the golden files were made with, are llama.cpp's
//! AMX build's on either path (`engine/tests/families.rs`,
//! `*_amx`: Q8_0 and Q4_K_M files), and are the same for a row whatever else is in the
//! call (one order for every number of activation rows, as llama.cpp's AMX build).
//!
//! The instructions are written as inline assembly (Rust's AMX intrinsics are not
//! stable); a thread loads the tile configuration once and keeps it.

/// The weight rows a matrix must have a multiple of to go on AMX: llama.cpp's AMX
/// buffer takes a matrix only when its output count is a multiple of two tiles' width
/// (`op->ne[0] % (TILE_N * 2)` in `ggml-cpu/amx/amx.cpp`); any other matrix keeps the
/// non-AMX order there, and so here.
pub const AMX_ROWS_MULTIPLE: usize = 32;

#[cfg(target_arch = "x86_64")]
pub(crate) mod q8_0;
#[cfg(target_arch = "x86_64")]
pub(crate) mod rows;

/// Whether this process can run AMX-INT8: the CPU reports AMX-TILE and AMX-INT8, the
/// kernel enabled the tile state (XCR0 bits 17 and 18), Linux granted this process the
/// tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), and a child process ran a tile multiply
/// and exited normally (a hypervisor that reports AMX but faults on it kills the child,
/// not this process). Checked once per process.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(probe)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn probe() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    let (leaf1, leaf7) = (__cpuid(1), __cpuid_count(7, 0));
    let osxsave = leaf1.ecx & (1 << 27) != 0;
    let amx = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0;
    if !osxsave || !amx {
        return false;
    }
    // SAFETY: OSXSAVE is set, so xgetbv may be executed.
    let xcr0 = unsafe { _xgetbv(0) };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permissions.
    if unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    } != 0
    {
        return false;
    }
    // SAFETY: the child only runs the tile instructions and `_exit` (no allocation, no
    // locks: safe after `fork` in a threaded process); the parent waits for it.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let ok = q8_0::self_test();
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        if libc::waitpid(pid, &mut status, 0) != pid {
            return false;
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn probe() -> bool {
    false
}
