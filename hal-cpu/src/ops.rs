//! The element-wise ops and routing (f32, plain loops that the compiler vectorises;
//! rayon where the work is large enough).

use flint_core::math;
use flint_hal::{HalError, RoutingConfig};
use rayon::prelude::*;

/// RMSNorm of every row of `dim` values (core reference, row by row).
pub(crate) fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, out: &mut [f32]) {
    check_norm_shapes(x.len(), out.len(), weight, dim);
    // Rows in parallel, 16 at a time, each computed as `math::rms_norm` computes it.
    x.par_chunks(16 * dim)
        .zip(out.par_chunks_mut(16 * dim))
        .for_each(|(xs, os)| rms_rows(xs, weight, eps, dim, os));
}

/// `residual += delta`, then the RMSNorm of every row of the sum into `out`: per chunk
/// of rows, in parallel (a prompt batch's sum is too large to leave to one thread ahead
/// of the norm).
pub(crate) fn add_rms_norm(
    residual: &mut [f32],
    delta: &[f32],
    weight: Option<&[f32]>,
    eps: f32,
    dim: usize,
    out: &mut [f32],
) {
    assert_eq!(residual.len(), delta.len(), "add_rms_norm: delta length");
    check_norm_shapes(residual.len(), out.len(), weight, dim);
    residual
        .par_chunks_mut(16 * dim)
        .zip(delta.par_chunks(16 * dim))
        .zip(out.par_chunks_mut(16 * dim))
        .for_each(|((rs, ds), os)| {
            for (r, &d) in rs.iter_mut().zip(ds) {
                *r += d;
            }
            rms_rows(rs, weight, eps, dim, os);
        });
}

fn check_norm_shapes(x_len: usize, out_len: usize, weight: Option<&[f32]>, dim: usize) {
    assert!(
        dim > 0 && x_len == out_len && x_len.is_multiple_of(dim),
        "rms_norm: {x_len} values into {out_len} with dim {dim}"
    );
    if let Some(w) = weight {
        assert_eq!(w.len(), dim, "rms_norm: weight length");
    }
}

/// The rows of `xs` normalised into `os`, each as `math::rms_norm` computes it.
fn rms_rows(xs: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, os: &mut [f32]) {
    let mut xr = xs.chunks_exact(dim);
    let mut or = os.chunks_exact_mut(dim);
    // Eight rows at a time, then four, then two: their sums of squares are independent
    // chains (each row's own chain in order), where one row alone waits on every add.
    fn group<const N: usize>(
        xr: &mut std::slice::ChunksExact<'_, f32>,
        or: &mut std::slice::ChunksExactMut<'_, f32>,
        weight: Option<&[f32]>,
        eps: f32,
    ) {
        let xs: [&[f32]; N] = std::array::from_fn(|_| xr.next().unwrap_or(&[]));
        let scales = rms_scales(&xs, eps);
        for (xv, sc) in xs.iter().zip(scales) {
            if let Some(o) = or.next() {
                rms_apply(xv, sc, weight, o);
            }
        }
    }
    while xr.len() >= 8 {
        group::<8>(&mut xr, &mut or, weight, eps);
    }
    if xr.len() >= 4 {
        group::<4>(&mut xr, &mut or, weight, eps);
    }
    if xr.len() >= 2 {
        group::<2>(&mut xr, &mut or, weight, eps);
    }
    for (xv, o) in xr.zip(or) {
        math::rms_norm(xv, weight, eps, o);
    }
}

/// The RMSNorm scale of each of `N` rows of equal length, as `math::rms_norm` computes
/// it: the f32 squares summed in f64 in order, the mean rounded to f32,
/// `1 / sqrtf(mean + eps)`.
fn rms_scales<const N: usize>(x: &[&[f32]; N], eps: f32) -> [f32; N] {
    let n = x[0].len();
    let rows: [&[f32]; N] = std::array::from_fn(|r| &x[r][..n]);
    let mut sum = [0.0f64; N];
    for i in 0..n {
        for r in 0..N {
            let v = rows[r][i];
            sum[r] += (v * v) as f64;
        }
    }
    sum.map(|s| {
        let mean = (s / n as f64) as f32;
        1.0 / libm::sqrtf(mean + eps)
    })
}

/// `out = x * scale * w` (or `x * scale`), in `math::rms_norm`'s order.
fn rms_apply(x: &[f32], scale: f32, weight: Option<&[f32]>, out: &mut [f32]) {
    match weight {
        Some(w) => {
            for ((o, &v), &wv) in out.iter_mut().zip(x).zip(w) {
                *o = v * scale * wv;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale;
            }
        }
    }
}

/// What a RoPE call's angles depend on (everything but the pairing), by bits.
#[derive(Debug, PartialEq)]
struct RopeKey {
    n_rot: usize,
    base: u32,
    freq_scale: u32,
    freq_factors: Option<Vec<u32>>,
    yarn: Option<[u32; 5]>,
}

impl RopeKey {
    fn of(cfg: &math::RopeConfig<'_>) -> Self {
        Self {
            n_rot: cfg.n_rot,
            base: cfg.base.to_bits(),
            freq_scale: cfg.freq_scale.to_bits(),
            freq_factors: cfg
                .freq_factors
                .map(|f| f.iter().map(|v| v.to_bits()).collect()),
            yarn: cfg.yarn.map(yarn_bits),
        }
    }

    /// Whether `cfg` has these angles (without allocating).
    fn matches(&self, cfg: &math::RopeConfig<'_>) -> bool {
        let same_factors = match (&self.freq_factors, cfg.freq_factors) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == y.to_bits())
            }
            _ => false,
        };
        self.n_rot == cfg.n_rot
            && self.base == cfg.base.to_bits()
            && self.freq_scale == cfg.freq_scale.to_bits()
            && same_factors
            && self.yarn == cfg.yarn.map(yarn_bits)
    }
}

fn yarn_bits(y: math::Yarn) -> [u32; 5] {
    [
        y.ext_factor.to_bits(),
        y.attn_factor.to_bits(),
        y.beta_fast.to_bits(),
        y.beta_slow.to_bits(),
        y.n_ctx_orig,
    ]
}

/// The cosines and sines of one RoPE call's angles: per position, `n_rot / 2` pairs.
#[derive(Debug)]
pub(crate) struct RopeTable {
    key: RopeKey,
    positions: Vec<u32>,
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    /// The angles of `positions` as `math::rope` computes them
    /// (`math::RopeConfig::angles`), rows in parallel.
    pub(crate) fn new(positions: &[u32], cfg: &math::RopeConfig<'_>) -> Self {
        let half = cfg.n_rot / 2;
        let mut cs = vec![(0f32, 0f32); positions.len() * half];
        if half > 0 {
            cs.par_chunks_mut(half)
                .zip(positions.par_iter())
                .for_each(|(row, &pos)| cfg.angles(pos, row));
        }
        Self {
            key: RopeKey::of(cfg),
            positions: positions.to_vec(),
            cs,
        }
    }

    /// Whether this table holds the angles of exactly this call.
    pub(crate) fn matches(&self, positions: &[u32], cfg: &math::RopeConfig<'_>) -> bool {
        self.key.matches(cfg) && self.positions == positions
    }
}

/// RoPE in place on `[rows, n_heads * head_dim]`: `math::rope` on every head, with the
/// angles from `table` (made for these positions and parameters), pairs as `kind` says,
/// rows in parallel. `fma`: the CPU has FMA instructions (the fused multiply-adds
/// inline).
pub(crate) fn rope(
    x: &mut [f32],
    table: &RopeTable,
    kind: math::RopeKind,
    n_heads: usize,
    head_dim: usize,
    fma: bool,
) {
    let _ = fma;
    let n_rot = table.key.n_rot;
    let positions = &table.positions;
    let row = n_heads * head_dim;
    assert!(row > 0, "rope: empty rows");
    assert_eq!(x.len(), positions.len() * row, "rope: x length");
    assert!(
        n_rot.is_multiple_of(2) && n_rot <= head_dim,
        "rope: n_rot {n_rot}, head size {head_dim}"
    );
    if n_rot == 0 {
        return;
    }
    let half = n_rot / 2;
    x.par_chunks_mut(row * 8)
        .zip(table.cs.par_chunks(half * 8))
        .for_each(|(xs, css)| {
            for (xr, cs) in xs.chunks_exact_mut(row).zip(css.chunks_exact(half)) {
                for h in xr.chunks_exact_mut(head_dim) {
                    #[cfg(target_arch = "x86_64")]
                    if fma {
                        // SAFETY: the caller checked FMA (the device's SIMD level).
                        unsafe { crate::kernels::elementwise::avx2::rope_rotate(h, kind, cs) };
                        continue;
                    }
                    rope_rotate(h, kind, cs);
                }
            }
        });
}

/// One head's rotation by `cs` as `math::rope_rotate` computes it (ggml's
/// `rotate_pairs` as GCC contracts it), with `f32::mul_add` for the fused
/// multiply-adds; inlined into the FMA kernel of `kernels::elementwise::avx2`.
#[inline(always)]
pub(crate) fn rope_rotate(h: &mut [f32], kind: math::RopeKind, cs: &[(f32, f32)]) {
    let rot =
        |x0: f32, x1: f32, (c, s): (f32, f32)| (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c));
    match kind {
        math::RopeKind::Normal => {
            for (p, &c) in h.chunks_exact_mut(2).zip(cs) {
                (p[0], p[1]) = rot(p[0], p[1], c);
            }
        }
        math::RopeKind::Neox => {
            let half = cs.len();
            let (lo, hi) = h.split_at_mut(half);
            for ((a, b), &c) in lo.iter_mut().zip(&mut hi[..half]).zip(cs) {
                (*a, *b) = rot(*a, *b, c);
            }
        }
    }
}

/// `x[r * bias.len() + j] += bias[j]` for every row `r` (lengths checked by the caller).
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Top-k routing of each row of logits (core reference per row).
pub(crate) fn route_topk(
    logits: &[f32],
    n_experts: usize,
    bias: Option<&[f32]>,
    cfg: &RoutingConfig,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<(), HalError> {
    assert!(
        n_experts > 0 && logits.len().is_multiple_of(n_experts),
        "route_topk: logits length"
    );
    let rows = logits.len() / n_experts;
    let k = cfg.k;
    assert!(
        ids.len() == rows * k && weights.len() == rows * k,
        "route_topk: output lengths"
    );
    for r in 0..rows {
        math::route_topk(
            &logits[r * n_experts..(r + 1) * n_experts],
            bias,
            k,
            cfg.gating,
            cfg.normalize,
            cfg.scale,
            &mut ids[r * k..(r + 1) * k],
            &mut weights[r * k..(r + 1) * k],
        )
        .map_err(|e| HalError::invalid(format!("route_topk: {e}")))?;
    }
    Ok(())
}
