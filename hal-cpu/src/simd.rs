//! Run-time choice of the SIMD level.

use std::fmt;

use flint_hal::HalError;

/// The instruction sets a [`CpuDevice`](crate::CpuDevice) computes with.
///
/// Ordered: a level implies every level below it. Types without a kernel at the chosen
/// level use the next level down (AVX-512 falls back to AVX2 per type, AVX2 to the
/// `flint-core` scalar reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// The `flint-core` scalar reference kernels (and plain loops for float weights).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F + BW (+ the AVX2 set).
    Avx512,
    /// AVX-512 F + BW + VL + VNNI: the K-quant kernels fuse the scale multiply and the
    /// accumulation into one `vpdpwssd`.
    Avx512Vnni,
}

impl SimdLevel {
    /// The best level this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw");
            // The VNNI kernels also use 128/256-bit forms of AVX-512 instructions
            // (masked byte moves, `vpdpbusd` on ymm): VL.
            if avx512
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                return SimdLevel::Avx512Vnni;
            }
            if avx512 {
                return SimdLevel::Avx512;
            }
            if avx2 {
                return SimdLevel::Avx2;
            }
        }
        SimdLevel::Scalar
    }

    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
    ];

    /// The lower-case name (`scalar`, `avx2`, `avx512`, `avx512vnni`).
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parses a name as [`name`](Self::name) writes it.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            "avx512vnni" => Some(SimdLevel::Avx512Vnni),
            _ => None,
        }
    }

    /// Checks that this CPU can run `self`; the error names the level and the CPU's best.
    pub fn check(self) -> Result<Self, HalError> {
        let best = Self::detect();
        if self > best {
            return Err(HalError::unavailable(format!(
                "SIMD level {} is not supported by this CPU (best: {})",
                self.name(),
                best.name()
            )));
        }
        Ok(self)
    }

    /// The level `FLINT_CPU_SIMD` asks for (checked against the CPU), or the detected one
    /// when the variable is unset or empty.
    pub fn from_env() -> Result<Self, HalError> {
        match std::env::var("FLINT_CPU_SIMD") {
            Ok(v) if !v.trim().is_empty() => match Self::from_name(&v) {
                Some(l) => l.check(),
                None => Err(HalError::invalid(format!(
                    "FLINT_CPU_SIMD={v:?} is not one of scalar, avx2, avx512, avx512vnni"
                ))),
            },
            _ => Ok(Self::detect()),
        }
    }
}

/// Whether this CPU has AVX-512 VBMI (byte permutes: `vpermb`, `vpermt2b`), which some
/// kernels of the AVX-512 VNNI level use where it is present (Ice Lake and later, Zen 4;
/// not Cascade Lake). The answer is cached by `std` after the first call.
pub(crate) fn has_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has both AVX-512 VBMI and GFNI (`vgf2p8affineqb`: any bit
/// permutation within each byte), which the Q3_K decode kernel of the AVX-512 VNNI level
/// takes where both are present (Ice Lake and later, Zen 4). Cached by `std`.
pub(crate) fn has_vbmi_gfni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_vbmi() && std::arch::is_x86_feature_detected!("gfni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
