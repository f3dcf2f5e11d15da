//! The generator of the C harnesses under `tools/golden/` that call ggml's compiled x86
//! kernels (`mxfp4_ggml.c`, `kquant_x86_ggml.c`): a 32-bit LCG, its top 16 bits, so that a
//! test rebuilds the harness's blocks value for value.

/// `state = state * 1103515245 + 12345`, giving `state >> 16`.
pub struct Lcg(pub u32);

impl Lcg {
    /// The next 16 bits.
    pub fn next16(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1103515245).wrapping_add(12345);
        self.0 >> 16
    }
}
