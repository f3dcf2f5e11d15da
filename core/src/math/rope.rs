//! Rotary position embedding as ggml's CPU `rope` computes it, for every model family
//! that uses plain RoPE: both pairings, linear frequency scaling, per-pair frequency
//! factors and YaRN.
//!
//! For pair `i < n_rot/2` of a head at position `pos`, the angle starts from
//! `theta_i = pos * base^(-2i/n_rot)` and is adjusted by [`RopeConfig`]:
//!
//! 1. `theta_extrap = theta_i / freq_factors[i]` (factor 1 without factors: Llama 3's
//!    `rope_freqs.weight` divides the low frequencies);
//! 2. `theta_interp = freq_scale * theta_extrap` (linear scaling, `freq_scale = 1/factor`);
//! 3. without YaRN, or with `ext_factor == 0`, the angle is `theta_interp`; with YaRN it
//!    mixes the two, `theta = theta_interp * (1 - r) + theta_extrap * r` where
//!    `r = ramp(i) * ext_factor` and `ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)`,
//!    `low`/`high` being the correction dims of [`yarn_corr_dims`];
//! 4. the cosine and sine are multiplied by `mscale`: `attn_factor` (1 without YaRN),
//!    times `1 + 0.1 * ln(1/freq_scale)` when `ext_factor != 0`.
//!
//! Then [`RopeKind::Normal`] rotates `(x[2i], x[2i+1])` and [`RopeKind::Neox`] rotates
//! `(x[i], x[i + n_rot/2])`: `x0' = x0*cos - x1*sin`, `x1' = x0*sin + x1*cos`. Dims
//! `>= n_rot` pass through.
//!
//! The float operations follow ggml's order (`ggml_rope_cache_init`, `rope_yarn`,
//! `rotate_pairs` in `ggml-cpu/ops.cpp`, `ggml_rope_yarn_corr_dims` in `ggml.c`):
//! `theta_scale = powf(base, -2/n_rot)` once, then `theta_0 = pos` (as f32) and
//! `theta_{i+1} = theta_i * theta_scale`, multiplied in f32 one step at a time; glibc's
//! `cosf`/`sinf` of each angle; and the fused multiply-adds that GCC makes of ggml's C
//! on x86-64 (contraction on, the default in GNU C and C++): the first product of each
//! `a*b ± c*d` line is fused. Computing `pos * powf(base, -2i/n_rot)` directly would be a
//! little more accurate, but it drifts from llama.cpp by a few ulp of the angle, which at
//! positions in the thousands is visible in the rotated values; agreeing with the
//! external oracle matters more here. Against ggml's `rope_ext` (tests/math_ggml.rs),
//! every case is bit-exact up to position 131071.

use core::fmt;

use super::libc::{cosf_glibc, sinf_glibc};

/// Which dims of a head RoPE rotates together (ggml's `GGML_ROPE_TYPE_NORMAL` and
/// `GGML_ROPE_TYPE_NEOX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeKind {
    /// Adjacent pairs `(x[2i], x[2i+1])`: Llama, Mistral, gpt-oss... (llama.cpp's
    /// `LLAMA_ROPE_TYPE_NORM`).
    Normal,
    /// Pairs half a rotation apart, `(x[i], x[i + n_rot/2])`: Gemma, Qwen, Flint.
    Neox,
}

/// YaRN parameters (ggml's `ext_factor`, `attn_factor`, `beta_fast`, `beta_slow`,
/// `n_ctx_orig`), used together with [`RopeConfig::freq_scale`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Extrapolation mix (0: pure interpolation, and no magnitude correction; usually 1).
    pub ext_factor: f32,
    /// Magnitude multiplier of every cosine and sine.
    pub attn_factor: f32,
    /// Rotations per context above which a pair is extrapolated (usually 32).
    pub beta_fast: f32,
    /// Rotations per context below which a pair is interpolated (usually 1).
    pub beta_slow: f32,
    /// The context length the model was trained with.
    pub n_ctx_orig: u32,
}

/// The rotation of one head (see the module docs): what ggml's `rope_ext` takes, minus
/// the tensor shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig<'a> {
    /// Which dims are paired.
    pub kind: RopeKind,
    /// Rotated dims: even, at most the head size.
    pub n_rot: usize,
    /// Frequency base (`rope.freq_base`).
    pub base: f32,
    /// Linear frequency scale: 1, or `1 / rope.scaling.factor` for linear and YaRN
    /// scaling.
    pub freq_scale: f32,
    /// Per-pair divisors of the angle, `n_rot / 2` values (Llama 3's `rope_freqs.weight`).
    pub freq_factors: Option<&'a [f32]>,
    /// YaRN; `None` is ggml's `ext_factor = 0`, `attn_factor = 1`.
    pub yarn: Option<Yarn>,
}

/// A [`RopeConfig`] that cannot be applied to a head; names the field at fault.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeError {
    /// `n_rot` is odd or larger than the head.
    BadNRot {
        /// The rotated dims asked for.
        n_rot: usize,
        /// The head size.
        head_dim: usize,
    },
    /// A scalar parameter is not a finite positive number (or, for `ext_factor` and
    /// `attn_factor`, not finite).
    BadValue {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: f32,
    },
    /// `freq_factors` does not hold `n_rot / 2` values.
    FactorsLength {
        /// `n_rot / 2`.
        expected: usize,
        /// The number of factors given.
        found: usize,
    },
    /// A frequency factor is not a finite positive number.
    BadFactor {
        /// Its index.
        index: usize,
        /// Its value.
        value: f32,
    },
}

impl fmt::Display for RopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RopeError::BadNRot { n_rot, head_dim } => write!(
                f,
                "rope: n_rot {n_rot} must be even and at most the head size {head_dim}"
            ),
            RopeError::BadValue { what, value } => write!(f, "rope: {what} is {value}"),
            RopeError::FactorsLength { expected, found } => write!(
                f,
                "rope: {found} frequency factors, expected n_rot/2 = {expected}"
            ),
            RopeError::BadFactor { index, value } => {
                write!(f, "rope: frequency factor {index} is {value}")
            }
        }
    }
}

impl<'a> RopeConfig<'a> {
    /// Plain NeoX RoPE: no scaling, no factors, no YaRN.
    pub const fn neox(n_rot: usize, base: f32) -> Self {
        Self {
            kind: RopeKind::Neox,
            n_rot,
            base,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        }
    }

    /// Whether the angles are the plain `pos * base^(-2i/n_rot)` (no scaling, factors,
    /// YaRN or magnitude change), whatever the pairing.
    pub fn is_plain(&self) -> bool {
        self.freq_scale == 1.0 && self.freq_factors.is_none() && self.yarn.is_none()
    }

    /// Checks that this rotation applies to heads of `head_dim` values.
    pub fn check(&self, head_dim: usize) -> Result<(), RopeError> {
        if !self.n_rot.is_multiple_of(2) || self.n_rot > head_dim {
            return Err(RopeError::BadNRot {
                n_rot: self.n_rot,
                head_dim,
            });
        }
        let positive = |what: &'static str, value: f32| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(RopeError::BadValue { what, value })
            }
        };
        positive("base", self.base)?;
        positive("freq_scale", self.freq_scale)?;
        if let Some(ff) = self.freq_factors {
            if ff.len() != self.n_rot / 2 {
                return Err(RopeError::FactorsLength {
                    expected: self.n_rot / 2,
                    found: ff.len(),
                });
            }
            if let Some((index, &value)) = ff
                .iter()
                .enumerate()
                .find(|(_, v)| !(v.is_finite() && **v > 0.0))
            {
                return Err(RopeError::BadFactor { index, value });
            }
        }
        if let Some(y) = self.yarn {
            for (what, value) in [("ext_factor", y.ext_factor), ("attn_factor", y.attn_factor)] {
                if !value.is_finite() {
                    return Err(RopeError::BadValue { what, value });
                }
            }
            if y.ext_factor != 0.0 {
                positive("beta_fast", y.beta_fast)?;
                positive("beta_slow", y.beta_slow)?;
                positive("n_ctx_orig", y.n_ctx_orig as f32)?;
            }
        }
        Ok(())
    }

    /// The cosines and sines of position `pos`, one per pair (`cs.len() == n_rot / 2`),
    /// magnitude-scaled as the module docs say.
    ///
    /// # Panics
    /// If `cs.len() != n_rot / 2`, or if `freq_factors` has fewer than `n_rot / 2` values.
    pub fn angles(&self, pos: u32, cs: &mut [(f32, f32)]) {
        assert_eq!(
            cs.len(),
            self.n_rot / 2,
            "rope: {} angles for n_rot {}",
            cs.len(),
            self.n_rot
        );
        self.each_angle(pos, |i, c| cs[i] = c);
    }

    /// Calls `f(i, (cos_i, sin_i))` for every pair `i < n_rot / 2` in order.
    fn each_angle(&self, pos: u32, mut f: impl FnMut(usize, (f32, f32))) {
        let half = self.n_rot / 2;
        if half == 0 {
            return;
        }
        let theta_scale = libm::powf(self.base, -2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        if self.is_plain() {
            // The general loop below with factor 1, scale 1 and mscale 1, all exact.
            for i in 0..half {
                f(i, (cosf_glibc(theta), sinf_glibc(theta)));
                theta *= theta_scale;
            }
            return;
        }
        let ff = self.freq_factors.map(|ff| &ff[..half]);
        let (ext_factor, mut mscale) = self
            .yarn
            .map_or((0.0, 1.0), |y| (y.ext_factor, y.attn_factor));
        let corr = match self.yarn {
            Some(y) if ext_factor != 0.0 => {
                // `rope_yarn`'s magnitude correction (`1.0f + 0.1f * logf(...)`, fused).
                mscale *= libm::fmaf(0.1, libm::logf(1.0 / self.freq_scale), 1.0);
                yarn_corr_dims(
                    self.n_rot,
                    y.n_ctx_orig,
                    self.base,
                    y.beta_fast,
                    y.beta_slow,
                )
            }
            _ => [0.0; 2],
        };
        for i in 0..half {
            let theta_extrap = theta / ff.map_or(1.0, |ff| ff[i]);
            let theta_interp = self.freq_scale * theta_extrap;
            let t = if ext_factor != 0.0 {
                // `rope_yarn_ramp`: y = (i0/2 - low) / MAX(0.001f, high - low).
                let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                libm::fmaf(theta_interp, 1.0 - ramp_mix, theta_extrap * ramp_mix)
            } else {
                theta_interp
            };
            f(i, (cosf_glibc(t) * mscale, sinf_glibc(t) * mscale));
            theta *= theta_scale;
        }
    }
}

/// YaRN's correction dims `[low, high]` (ggml's `ggml_rope_yarn_corr_dims`): the pair
/// indices where the angle stops being extrapolated (`beta_fast` rotations over the
/// original context) and where it becomes fully interpolated (`beta_slow` rotations),
/// floored / ceiled and clamped to `[0, n_rot - 1]`.
pub fn yarn_corr_dims(
    n_rot: usize,
    n_ctx_orig: u32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    // n_dims * logf(n_ctx_orig / (n_rot * 2 * pi)) / (2 * logf(base)), all in f32.
    let dim = |rotations: f32| {
        n_rot as f32 * libm::logf(n_ctx_orig as f32 / (rotations * 2.0 * core::f32::consts::PI))
            / (2.0 * libm::logf(base))
    };
    let start = libm::floorf(dim(beta_fast));
    let end = libm::ceilf(dim(beta_slow));
    // ggml's MAX(0, start) and MIN(n_dims - 1, end).
    let low = if 0.0 > start { 0.0 } else { start };
    let top = (n_rot as f32) - 1.0;
    let high = if top < end { top } else { end };
    [low, high]
}

/// Rotates pair `i` of a head whose first `2 * half` dims are rotated, by `(c, s)`:
/// ggml's `rotate_pairs` as GCC compiles it for x86 (contraction on, the default in GNU C
/// and C++): the first product of each line becomes a fused multiply-add.
#[inline(always)]
fn rotate_pair(head: &mut [f32], kind: RopeKind, half: usize, i: usize, (c, s): (f32, f32)) {
    let (j0, j1) = match kind {
        RopeKind::Normal => (2 * i, 2 * i + 1),
        RopeKind::Neox => (i, i + half),
    };
    let (x0, x1) = (head[j0], head[j1]);
    head[j0] = libm::fmaf(x0, c, -(x1 * s));
    head[j1] = libm::fmaf(x0, s, x1 * c);
}

/// Rotates the first `n_rot = 2 * cs.len()` dims of one head by the cosines and sines
/// `cs` (from [`RopeConfig::angles`]), pairing them as `kind` says.
///
/// # Panics
/// If `2 * cs.len()` exceeds `head.len()`.
pub fn rope_rotate(head: &mut [f32], kind: RopeKind, cs: &[(f32, f32)]) {
    let half = cs.len();
    assert!(
        2 * half <= head.len(),
        "rope: n_rot {} exceeds head size {}",
        2 * half,
        head.len()
    );
    for (i, &c) in cs.iter().enumerate() {
        rotate_pair(head, kind, half, i, c);
    }
}

/// Applies RoPE to one head at position `pos` in place (see the module docs).
///
/// # Panics
/// If [`RopeConfig::check`] refuses `cfg` for a head of `head.len()`.
pub fn rope(head: &mut [f32], pos: u32, cfg: &RopeConfig<'_>) {
    if let Err(e) = cfg.check(head.len()) {
        panic!("{e}");
    }
    let half = cfg.n_rot / 2;
    cfg.each_angle(pos, |i, c| rotate_pair(head, cfg.kind, half, i, c));
}

/// Applies [`rope`] to every head of `head_dim` values in `x` (all heads of one token,
/// same position).
///
/// # Panics
/// If `head_dim` is 0 or does not divide `x.len()`, or as [`rope`].
pub fn rope_heads(x: &mut [f32], head_dim: usize, pos: u32, cfg: &RopeConfig<'_>) {
    assert!(head_dim > 0, "rope_heads: head_dim is 0");
    assert_eq!(x.len() % head_dim, 0, "rope_heads: x is not whole heads");
    for h in x.chunks_exact_mut(head_dim) {
        rope(h, pos, cfg);
    }
}

/// Applies plain NeoX RoPE ([`RopeConfig::neox`]) to one head in place.
///
/// # Panics
/// If `n_rot` is odd or larger than `head.len()`.
pub fn rope_neox(head: &mut [f32], pos: u32, n_rot: usize, base: f32) {
    rope(head, pos, &RopeConfig::neox(n_rot, base));
}

/// Applies [`rope_neox`] to every head of `head_dim` values in `x` (all heads of one
/// token, same position).
///
/// # Panics
/// If `head_dim` is 0 or does not divide `x.len()`, or as [`rope_neox`].
pub fn rope_neox_heads(x: &mut [f32], head_dim: usize, pos: u32, n_rot: usize, base: f32) {
    rope_heads(x, head_dim, pos, &RopeConfig::neox(n_rot, base));
}
