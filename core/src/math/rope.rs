//! NeoX rotary position embedding.
//!
//! For `i < n_rot/2` the pair `(x[i], x[i + n_rot/2])` is rotated by the angle
//! `pos * base^(-2i/n_rot)`; dims `>= n_rot` pass through.
//!
//! The angles are computed the way ggml's CPU `rope` computes them (no YaRN, frequency
//! scale 1): `theta_scale = powf(base, -2/n_rot)` once, then `theta_0 = pos` (as f32)
//! and `theta_{i+1} = theta_i * theta_scale`, multiplied in f32 one step at a time, and
//! `cosf`/`sinf` of each. Computing `pos * powf(base, -2i/n_rot)` directly would be a
//! little more accurate, but it drifts from llama.cpp by a few ulp of the angle, which
//! at positions in the thousands is visible in the rotated values; agreeing with the
//! external oracle matters more here. Against ggml's `rope_ext` (tests/math_ggml.rs):
//! 285 of 288 values bit-exact, the rest within 2.4e-7, up to position 70000.

/// Applies NeoX RoPE to one head in place (see the module docs).
///
/// # Panics
/// If `n_rot` is odd or larger than `head.len()`.
pub fn rope_neox(head: &mut [f32], pos: u32, n_rot: usize, base: f32) {
    assert!(n_rot.is_multiple_of(2), "rope_neox: n_rot {n_rot} is odd");
    assert!(
        n_rot <= head.len(),
        "rope_neox: n_rot {n_rot} exceeds head size {}",
        head.len()
    );
    if n_rot == 0 {
        return;
    }
    let half = n_rot / 2;
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..half {
        let (c, s) = (
            super::libc::cosf_glibc(theta),
            super::libc::sinf_glibc(theta),
        );
        let x0 = head[i];
        let x1 = head[i + half];
        // ggml's `rotate_pairs` as GCC compiles it for x86 (contraction on, the default
        // in GNU C): the first product of each line becomes a fused multiply-add.
        head[i] = libm::fmaf(x0, c, -(x1 * s));
        head[i + half] = libm::fmaf(x0, s, x1 * c);
        theta *= theta_scale;
    }
}

/// Applies [`rope_neox`] to every head of `head_dim` values in `x` (all heads of one
/// token, same position).
///
/// # Panics
/// If `head_dim` is 0 or does not divide `x.len()`, or as [`rope_neox`].
pub fn rope_neox_heads(x: &mut [f32], head_dim: usize, pos: u32, n_rot: usize, base: f32) {
    assert!(head_dim > 0, "rope_neox_heads: head_dim is 0");
    assert_eq!(
        x.len() % head_dim,
        0,
        "rope_neox_heads: x is not whole heads"
    );
    for h in x.chunks_exact_mut(head_dim) {
        rope_neox(h, pos, n_rot, base);
    }
}
