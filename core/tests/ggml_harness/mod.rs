//! What the tests against ggml's C harnesses (`tools/golden/*_golden.c`,
//! `fa_ggml_avx2.c`) share: the harnesses' input generator, a reader of their binary
//! output, and a bit-for-bit comparison.

#![allow(dead_code)]

/// The harnesses' generator: xorshift32, the top 24 bits as a float in [-1, 1).
pub struct Rng(pub u32);

impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 >> 8) as f32 * (1.0 / 8_388_608.0) - 1.0
    }

    pub fn vec(&mut self, n: usize, f: impl Fn(f32) -> f32) -> Vec<f32> {
        (0..n).map(|_| f(self.next())).collect()
    }
}

/// Reads a harness's output one case part at a time (little-endian f32, or f64).
pub struct Golden<'a>(pub &'a [u8]);

impl Golden<'_> {
    pub fn take(&mut self, n: usize) -> Vec<f32> {
        let (head, rest) = self.0.split_at(4 * n);
        self.0 = rest;
        head.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    pub fn take_f64(&mut self) -> f64 {
        let (head, rest) = self.0.split_at(8);
        self.0 = rest;
        f64::from_le_bytes(head.try_into().expect("8 bytes"))
    }
}

/// `got` equals `want` bit for bit.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: {a} vs ggml {b}");
    }
}
