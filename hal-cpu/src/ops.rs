//! The element-wise ops and routing (f32, plain loops that the compiler vectorises;
//! rayon where the work is large enough).

use flint_core::math;
use flint_hal::{HalError, RoutingConfig};

use crate::SimdLevel;
use rayon::prelude::*;

/// Rows a parallel task of [`rms_norm`] / [`add_rms_norm`] takes.
const NORM_ROWS: usize = 16;

/// RMSNorm of every row of `dim` values, each as `math::rms_norm` computes it, with the
/// sums of squares of several rows at once at `level`.
pub(crate) fn rms_norm(
    x: &[f32],
    weight: Option<&[f32]>,
    eps: f32,
    dim: usize,
    out: &mut [f32],
    level: SimdLevel,
) {
    check_norm_shapes(x.len(), out.len(), weight, dim);
    x.par_chunks(NORM_ROWS * dim)
        .zip(out.par_chunks_mut(NORM_ROWS * dim))
        .for_each(|(xs, os)| rms_rows(xs, weight, eps, dim, os, level));
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
    level: SimdLevel,
) {
    assert_eq!(residual.len(), delta.len(), "add_rms_norm: delta length");
    check_norm_shapes(residual.len(), out.len(), weight, dim);
    residual
        .par_chunks_mut(NORM_ROWS * dim)
        .zip(delta.par_chunks(NORM_ROWS * dim))
        .zip(out.par_chunks_mut(NORM_ROWS * dim))
        .for_each(|((rs, ds), os)| {
            for (r, &d) in rs.iter_mut().zip(ds) {
                *r += d;
            }
            rms_rows(rs, weight, eps, dim, os, level);
        });
}

/// `residual += rmsnorm(delta) * delta_weight`, then the RMSNorm of every row of the sum
/// times `weight` into `out`: per chunk of rows, in parallel, the chunk's normed delta
/// kept in the task (the same arithmetic as [`rms_norm`] into a buffer, then
/// [`add_rms_norm`] from it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_norm_add_rms_norm(
    residual: &mut [f32],
    delta: &[f32],
    delta_weight: &[f32],
    weight: &[f32],
    eps: f32,
    dim: usize,
    out: &mut [f32],
    level: SimdLevel,
) {
    assert_eq!(
        residual.len(),
        delta.len(),
        "post_norm_add_rms_norm: delta length"
    );
    check_norm_shapes(residual.len(), out.len(), Some(weight), dim);
    check_norm_shapes(delta.len(), residual.len(), Some(delta_weight), dim);
    residual
        .par_chunks_mut(NORM_ROWS * dim)
        .zip(delta.par_chunks(NORM_ROWS * dim))
        .zip(out.par_chunks_mut(NORM_ROWS * dim))
        .for_each(|((rs, ds), os)| {
            let mut normed = vec![0f32; ds.len()];
            rms_rows(ds, Some(delta_weight), eps, dim, &mut normed, level);
            for (r, &d) in rs.iter_mut().zip(normed.iter()) {
                *r += d;
            }
            rms_rows(rs, Some(weight), eps, dim, os, level);
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

/// The rows of `xs` (at most [`NORM_ROWS`]) normalised into `os`, each as
/// `math::rms_norm` computes it.
fn rms_rows(
    xs: &[f32],
    weight: Option<&[f32]>,
    eps: f32,
    dim: usize,
    os: &mut [f32],
    level: SimdLevel,
) {
    let n = xs.len() / dim;
    assert!(n <= NORM_ROWS, "rms_rows: {n} rows");
    let rows: [&[f32]; NORM_ROWS] = std::array::from_fn(|r| {
        if r < n {
            &xs[r * dim..(r + 1) * dim]
        } else {
            &[]
        }
    });
    let mut sums = [0f64; NORM_ROWS];
    let done = sum_squares(&rows[..n], dim, &mut sums[..n], level);
    // The rows left: eight, four, then two at a time (independent chains, each row's
    // own chain in order, where one row alone waits on every add), the last alone.
    let mut r = done;
    for g in [8, 4, 2, 1] {
        while n - r >= g {
            match g {
                8 => sum_squares_scalar::<8>(&rows[r..r + 8], &mut sums[r..r + 8]),
                4 => sum_squares_scalar::<4>(&rows[r..r + 4], &mut sums[r..r + 4]),
                2 => sum_squares_scalar::<2>(&rows[r..r + 2], &mut sums[r..r + 2]),
                _ => sum_squares_scalar::<1>(&rows[r..r + 1], &mut sums[r..r + 1]),
            }
            r += g;
        }
    }
    for ((x, o), &s) in rows.iter().zip(os.chunks_exact_mut(dim)).zip(&sums) {
        rms_apply(x, math::rms_scale_of_sum(s, dim, eps), weight, o);
    }
}

/// The sums of squares of the leading rows of `rows` that `level`'s kernels take
/// (groups of eight with AVX-512, of four with AVX2) into `sums`; returns how many.
fn sum_squares(rows: &[&[f32]], dim: usize, sums: &mut [f64], level: SimdLevel) -> usize {
    let mut r = 0;
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 {
        use crate::kernels::elementwise::avx512::sum_squares as k;
        while rows.len() - r >= 16 {
            // SAFETY: AVX-512F and AVX2 were checked against the CPU at device open.
            unsafe { k::<2>(&rows[r..r + 16], dim, &mut sums[r..r + 16]) };
            r += 16;
        }
        if rows.len() - r >= 8 {
            // SAFETY: as above.
            unsafe { k::<1>(&rows[r..r + 8], dim, &mut sums[r..r + 8]) };
            r += 8;
        }
    } else if level >= SimdLevel::Avx2 {
        use crate::kernels::elementwise::avx2::sum_squares as k;
        while rows.len() - r >= 16 {
            // SAFETY: AVX2 was checked against the CPU at device open.
            unsafe { k::<4>(&rows[r..r + 16], dim, &mut sums[r..r + 16]) };
            r += 16;
        }
        while rows.len() - r >= 4 {
            // SAFETY: as above.
            unsafe { k::<1>(&rows[r..r + 4], dim, &mut sums[r..r + 4]) };
            r += 4;
        }
    }
    let _ = (dim, sums, level);
    r
}

/// The sums of squares of `N` rows of equal length (`math::rms_norm`'s: the f32 squares
/// summed in f64 in order), the rows' chains side by side.
fn sum_squares_scalar<const N: usize>(rows: &[&[f32]], sums: &mut [f64]) {
    let rows: [&[f32]; N] = std::array::from_fn(|r| rows[r]);
    let n = rows[0].len();
    let mut sum = [0.0f64; N];
    for i in 0..n {
        for r in 0..N {
            let v = rows[r][i];
            sum[r] += (v * v) as f64;
        }
    }
    sums.copy_from_slice(&sum);
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

/// The heads of a row that [`norm_rope`] takes through its steps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub n_heads: usize,
    pub head_dim: usize,
    pub kind: math::RopeKind,
}

/// [`rms_norm`] of every head of `x` (`dim = head_dim`, times `weight`), then [`rope`]
/// by `table`, then times `scale` (where not 1), row by row: each row goes through the
/// three steps while it is in the core's caches, with the same arithmetic as the three
/// ops one after another (each head's norm is its own chain, whichever heads
/// [`rms_rows`] takes together).
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_rope(
    x: &mut [f32],
    weight: &[f32],
    eps: f32,
    table: &RopeTable,
    heads: Heads,
    scale: f32,
    level: SimdLevel,
    fma: bool,
) {
    let _ = fma;
    let Heads {
        n_heads,
        head_dim,
        kind,
    } = heads;
    let n_rot = table.key.n_rot;
    let row = n_heads * head_dim;
    assert!(row > 0, "norm_rope: empty rows");
    assert_eq!(x.len(), table.positions.len() * row, "norm_rope: x length");
    assert_eq!(weight.len(), head_dim, "norm_rope: weight length");
    assert!(
        n_rot.is_multiple_of(2) && n_rot <= head_dim,
        "norm_rope: n_rot {n_rot}, head size {head_dim}"
    );
    let half = n_rot / 2;
    let rows_per_task = 8;
    let chunk = |(xs, css): (&mut [f32], &[(f32, f32)])| {
        // The task's heads normed together ([`NORM_ROWS`] at a time, as `rms_norm` takes
        // them), then each row rotated, scaled and written back.
        let mut normed = vec![0f32; xs.len()];
        for (hs, os) in xs
            .chunks(NORM_ROWS * head_dim)
            .zip(normed.chunks_mut(NORM_ROWS * head_dim))
        {
            rms_rows(hs, Some(weight), eps, head_dim, os, level);
        }
        for (r, (xr, normed)) in xs
            .chunks_exact_mut(row)
            .zip(normed.chunks_exact_mut(row))
            .enumerate()
        {
            if half > 0 {
                let cs = &css[r * half..(r + 1) * half];
                for h in normed.chunks_exact_mut(head_dim) {
                    #[cfg(target_arch = "x86_64")]
                    if fma {
                        // SAFETY: the caller checked FMA (the device's SIMD level).
                        unsafe { crate::kernels::elementwise::avx2::rope_rotate(h, kind, cs) };
                        continue;
                    }
                    rope_rotate(h, kind, cs);
                }
            }
            if scale == 1.0 {
                xr.copy_from_slice(normed);
            } else {
                for (o, &v) in xr.iter_mut().zip(normed.iter()) {
                    *o = v * scale;
                }
            }
        }
    };
    if half == 0 {
        x.par_chunks_mut(row * rows_per_task)
            .for_each(|xs| chunk((xs, &[])));
    } else {
        x.par_chunks_mut(row * rows_per_task)
            .zip(table.cs.par_chunks(half * rows_per_task))
            .for_each(chunk);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums of squares of every level's kernels are the scalar chain's, bit for bit:
    /// the f64 sums themselves (the f32 scale rounds most order differences away, so the
    /// norm's output alone would hardly tell a reordered sum). Magnitudes from 2^-20 to
    /// 2^20 make every reordering round differently.
    #[test]
    fn sum_squares_keep_the_scalar_order() {
        let levels: Vec<SimdLevel> = SimdLevel::ALL
            .into_iter()
            .filter(|&l| l <= SimdLevel::detect())
            .collect();
        let mut seed = 5u64;
        for dim in [640usize, 643, 5] {
            let x: Vec<f32> = (0..16 * dim)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    u * 2f32.powi((i * 7919 % 41) as i32 - 20)
                })
                .collect();
            let rows: Vec<&[f32]> = x.chunks(dim).collect();
            let want: Vec<u64> = rows
                .iter()
                .map(|r| r.iter().fold(0f64, |s, &v| s + (v * v) as f64).to_bits())
                .collect();
            for &level in &levels {
                for n in [16usize, 8, 4] {
                    let mut sums = vec![0f64; n];
                    let done = sum_squares(&rows[..n], dim, &mut sums, level);
                    let got: Vec<u64> = sums[..done].iter().map(|s| s.to_bits()).collect();
                    assert_eq!(got, want[..done], "{level:?}, dim {dim}, {n} rows");
                }
            }
        }
    }
}
