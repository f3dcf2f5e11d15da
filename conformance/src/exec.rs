//! Running one case on one device.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use flint_hal::{
    AttnSeq, DeltaNetShape, Device, ExpertRow, HalError, HalErrorKind, KvLayout, Op,
    PagedAttention, RoutingConfig, WeightDesc, WeightHandle, WeightKind, WeightSource, NO_BLOCK,
};

use crate::case::{AttnSpec, Case, RopeSpec, Shape, Sinks};
use crate::check::{compare, unchanged, Guarded};
use crate::data::random_weight;
use crate::reference;
use crate::rng::CaseRng;

/// What became of a case.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Within tolerance; the largest NMSE seen.
    Pass {
        /// Largest NMSE over the case's outputs.
        nmse: f64,
    },
    /// Wrong, non-finite, out of bounds, a panic or an unexpected error.
    Fail {
        /// What went wrong.
        message: String,
    },
    /// The device does not support it.
    Skipped {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// `pass`, `FAIL` or `not supported`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Pass { .. } => "pass",
            Outcome::Fail { .. } => "FAIL",
            Outcome::Skipped { .. } => "not supported",
        }
    }
}

/// Why a case stopped early.
enum Stop {
    Fail(String),
}

impl From<String> for Stop {
    fn from(s: String) -> Self {
        Stop::Fail(s)
    }
}

type Res<T> = Result<T, Stop>;

/// Maps a device error: `Unsupported` is a skip only if the device never claimed the
/// op (it did, or we would not be here), so it is a failure naming the broken claim.
fn dev_err(op: &str, e: HalError) -> Stop {
    if e.kind == HalErrorKind::Unsupported {
        Stop::Fail(format!(
            "{op}: returned Unsupported although supports() claims it: {e}"
        ))
    } else {
        Stop::Fail(format!("{op}: {e}"))
    }
}

/// Runs `case` on `dev`: skipped when `supports` says no, failed on a wrong result, an
/// error, a non-finite value, an out-of-bounds write or a panic.
pub fn run_case(dev: &dyn Device, case: &Case) -> Outcome {
    for &op in case.required_ops() {
        let ty = if op.takes_weight() { case.ty } else { None };
        if !dev.supports(op, ty) {
            let what = match ty {
                Some(t) => format!("{op} on {t}"),
                None => op.to_string(),
            };
            return Outcome::Skipped {
                reason: format!("{} does not support {what}", dev.name()),
            };
        }
    }
    let r = catch_unwind(AssertUnwindSafe(|| execute(dev, case)));
    match r {
        Ok(Ok(nmse)) => Outcome::Pass { nmse },
        Ok(Err(Stop::Fail(message))) => Outcome::Fail { message },
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            Outcome::Fail {
                message: format!("panicked: {msg}"),
            }
        }
    }
}

fn execute(dev: &dyn Device, case: &Case) -> Res<f64> {
    let mut rng = CaseRng::new(case.seed);
    match (&case.shape, case.op) {
        (Shape::Weight { k, n, .. }, Op::Stage) => stage_case(dev, case, *k, *n, &mut rng),
        (Shape::Weight { k, n, m }, Op::Matmul) => matmul_case(dev, case, *k, *n, *m, &mut rng),
        (Shape::Weight { k, n, m }, Op::GetRows) => get_rows_case(dev, case, *k, *n, *m, &mut rng),
        (
            Shape::Tower {
                k,
                n,
                experts,
                tokens,
                routed,
            },
            Op::ExpertMatmul,
        ) => expert_case(dev, case, *k, *n, *experts, *tokens, *routed, &mut rng),
        (Shape::Rows { rows, dim, heads }, Op::RmsNorm) => {
            rms_case(dev, case, *rows, *dim, *heads, &mut rng)
        }
        (Shape::Rows { rows, dim, .. }, Op::AddRmsNorm) => {
            add_rms_case(dev, case, *rows, *dim, &mut rng)
        }
        (Shape::Rope(spec), Op::Rope) => rope_case(dev, case, spec, &mut rng),
        (Shape::Bias { rows, dim }, Op::AddBias) => bias_case(dev, case, *rows, *dim, &mut rng),
        (Shape::Flat { n }, op) => flat_case(dev, case, op, *n, &mut rng),
        (Shape::Scatter { dst, src, dim }, Op::ScatterAddWeighted) => {
            scatter_case(dev, case, *dst, *src, *dim, &mut rng)
        }
        (
            Shape::Route {
                rows,
                experts,
                k,
                gating,
                bias,
                normalize,
                scale,
            },
            Op::RouteTopK,
        ) => {
            let cfg = RoutingConfig {
                k: *k,
                gating: *gating,
                normalize: *normalize,
                scale: *scale,
            };
            route_case(dev, case, *rows, *experts, *bias, &cfg, &mut rng)
        }
        (Shape::Attn(spec), Op::WriteKv | Op::PagedAttention) => {
            attn_case(dev, case, spec, &mut rng)
        }
        (
            Shape::Conv {
                tokens,
                channels,
                d_conv,
                split,
            },
            Op::SsmConvSilu,
        ) => conv_case(dev, case, *tokens, *channels, *d_conv, *split, &mut rng),
        (
            Shape::Delta {
                tokens,
                shape,
                split,
            },
            Op::GatedDeltaNet,
        ) => delta_case(dev, case, *tokens, shape, *split, &mut rng),
        (shape, op) => Err(Stop::Fail(format!(
            "suite bug: no runner for {op} with shape {shape}"
        ))),
    }
}

fn desc(case: &Case, dims: Vec<usize>, kind: WeightKind, bytes: Vec<u8>) -> Res<WeightDesc> {
    let ty = case
        .ty
        .ok_or_else(|| Stop::Fail("suite bug: weight case without a type".into()))?;
    // As in a memory-mapped GGUF, the tensor lies inside a larger shared buffer, between
    // other bytes: a backend that reads the whole buffer, or ignores the range's start,
    // computes garbage. The offset keeps the 32-byte alignment GGUF guarantees.
    const PAD: usize = 64;
    let len = bytes.len();
    let mut shared = Vec::with_capacity(len + 2 * PAD);
    shared.extend((0..PAD).map(|i| (i as u8).wrapping_mul(37) ^ 0xa5));
    shared.extend_from_slice(&bytes);
    shared.extend((0..PAD).map(|i| (i as u8).wrapping_mul(91) ^ 0x5a));
    let data = WeightSource::new(Arc::new(shared), PAD..PAD + len)
        .map_err(|e| Stop::Fail(format!("suite bug: {e}")))?;
    Ok(WeightDesc {
        name: format!("conformance.{}", case.name()),
        ty,
        dims,
        kind,
        data,
    })
}

fn stage(dev: &dyn Device, d: &WeightDesc) -> Res<WeightHandle> {
    dev.stage(d).map_err(|e| dev_err("stage", e))
}

fn weight_ty(case: &Case) -> Res<flint_hal::GgmlType> {
    case.ty
        .ok_or_else(|| Stop::Fail("suite bug: weight case without a type".into()))
}

/// Staging: the info describes the weight; wrong byte lengths are `InvalidInput`.
fn stage_case(dev: &dyn Device, case: &Case, k: usize, n: usize, rng: &mut CaseRng) -> Res<f64> {
    let ty = weight_ty(case)?;
    let (bytes, _) = random_weight(ty, k, n, rng)?;
    let d = desc(case, vec![k, n], WeightKind::Matrix, bytes.clone())?;
    let h = stage(dev, &d)?;
    let info = h.info();
    if info.name != d.name || info.source_ty != ty || info.dims != d.dims {
        return Err(Stop::Fail(format!(
            "staged info describes another weight: name {:?}, source {}, dims {:?}",
            info.name, info.source_ty, info.dims
        )));
    }
    if info.kept_quant && info.staged_ty != ty {
        return Err(Stop::Fail(format!(
            "staged info says kept_quant but staged_ty is {} (source {ty})",
            info.staged_ty
        )));
    }
    if info.resident_bytes + info.streamed_bytes == 0 {
        return Err(Stop::Fail(
            "staged info reports no resident and no streamed bytes".into(),
        ));
    }
    // One byte short: the contract says InvalidInput, not a panic or a success.
    let mut short = bytes;
    short.pop();
    let bad = desc(case, vec![k, n], WeightKind::Matrix, short)?;
    match dev.stage(&bad) {
        Err(e) if e.kind == HalErrorKind::InvalidInput => Ok(0.0),
        Err(e) => Err(Stop::Fail(format!(
            "staging a weight one byte short: expected InvalidInput, got {e}"
        ))),
        Ok(_) => Err(Stop::Fail(
            "staging a weight one byte short succeeded (expected InvalidInput)".into(),
        )),
    }
}

fn matmul_case(
    dev: &dyn Device,
    case: &Case,
    k: usize,
    n: usize,
    m: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    if case.label == "multi" {
        return matmul_multi_case(dev, case, k, n, m, rng);
    }
    let ty = weight_ty(case)?;
    let (bytes, wf) = random_weight(ty, k, n, rng)?;
    // `tied`: the token embedding doubling as the output projection.
    let kind = if case.label == "tied" {
        WeightKind::Embedding
    } else {
        WeightKind::Matrix
    };
    let h = stage(dev, &desc(case, vec![k, n], kind, bytes)?)?;
    let x = rng.vec(m * k, -1.0, 1.0);
    let want = reference::matmul_f32(&wf, k, &x, m);
    let x_before = x.clone();
    let mut out = Guarded::new(m * n);
    dev.matmul(h.as_ref(), &x, m, out.body_mut())
        .map_err(|e| dev_err("matmul", e))?;
    out.check("out")?;
    unchanged("x", &x, &x_before)?;
    Ok(compare("out", out.body(), &want, case.tolerance)?)
}

/// `matmul_multi` on three weights of different heights sharing the input: each output
/// against the reference, and bit for bit against the device's own `matmul` of that
/// weight alone (the contract: one call instead of several, the same numbers).
fn matmul_multi_case(
    dev: &dyn Device,
    case: &Case,
    k: usize,
    n: usize,
    m: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let ty = weight_ty(case)?;
    let heights = [n, n + 3, 2 * n + 1];
    let mut handles = Vec::new();
    let mut floats = Vec::new();
    for &h in &heights {
        let (bytes, wf) = random_weight(ty, k, h, rng)?;
        handles.push(stage(
            dev,
            &desc(case, vec![k, h], WeightKind::Matrix, bytes)?,
        )?);
        floats.push(wf);
    }
    let x = rng.vec(m * k, -1.0, 1.0);
    let x_before = x.clone();
    let mut outs: Vec<Guarded> = heights.iter().map(|&h| Guarded::new(m * h)).collect();
    {
        let ws: Vec<&dyn flint_hal::Weight> = handles.iter().map(|h| h.as_ref()).collect();
        let mut bodies: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.body_mut()).collect();
        dev.matmul_multi(&ws, &x, m, &mut bodies)
            .map_err(|e| dev_err("matmul_multi", e))?;
    }
    unchanged("x", &x, &x_before)?;
    let mut worst = 0f64;
    for (i, ((h, out), wf)) in handles.iter().zip(&outs).zip(&floats).enumerate() {
        out.check(&format!("out {i}"))?;
        let want = reference::matmul_f32(wf, k, &x, m);
        worst = worst.max(compare(
            &format!("out {i}"),
            out.body(),
            &want,
            case.tolerance,
        )?);
        let mut alone = vec![0f32; m * heights[i]];
        dev.matmul(h.as_ref(), &x, m, &mut alone)
            .map_err(|e| dev_err("matmul", e))?;
        if let Some(j) = (0..alone.len()).find(|&j| alone[j].to_bits() != out.body()[j].to_bits()) {
            return Err(Stop::Fail(format!(
                "out {i}[{j}]: matmul_multi gave {} where matmul of the weight alone gives {}",
                out.body()[j],
                alone[j]
            )));
        }
    }
    Ok(worst)
}

#[allow(clippy::too_many_arguments)]
fn expert_case(
    dev: &dyn Device,
    case: &Case,
    k: usize,
    n: usize,
    experts: usize,
    tokens: usize,
    routed: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let ty = weight_ty(case)?;
    let (bytes, wf) = random_weight(ty, k, n * experts, rng)?;
    let h = stage(
        dev,
        &desc(case, vec![k, n, experts], WeightKind::ExpertTower, bytes)?,
    )?;
    let x = rng.vec(tokens * k, -1.0, 1.0);
    // Expert 0 stays unused; the last expert gets several rows from different tokens.
    let mut rows: Vec<ExpertRow> = (0..routed)
        .map(|i| ExpertRow {
            input_row: (i % tokens) as u32,
            expert: (1 + rng.below(experts - 1)) as u32,
        })
        .collect();
    rows[0].expert = (experts - 1) as u32;
    rows[routed - 1].expert = (experts - 1) as u32;
    let mut want = Vec::with_capacity(routed * n);
    for r in &rows {
        let e = r.expert as usize;
        let t = r.input_row as usize;
        want.extend(reference::matmul_f32(
            &wf[e * n * k..(e + 1) * n * k],
            k,
            &x[t * k..(t + 1) * k],
            1,
        ));
    }
    let mut out = Guarded::new(routed * n);
    dev.expert_matmul(h.as_ref(), &x, &rows, out.body_mut())
        .map_err(|e| dev_err("expert_matmul", e))?;
    out.check("out")?;
    let worst = compare("out", out.body(), &want, case.tolerance)?;
    // `expert_matmul_multi` with a second tower of the same shape on the same rows (a
    // layer's gate and up projections): each output bit for bit the tower's own
    // `expert_matmul`.
    let (bytes2, _) = random_weight(ty, k, n * experts, rng)?;
    let h2 = stage(
        dev,
        &desc(case, vec![k, n, experts], WeightKind::ExpertTower, bytes2)?,
    )?;
    let mut alone2 = vec![0f32; routed * n];
    dev.expert_matmul(h2.as_ref(), &x, &rows, &mut alone2)
        .map_err(|e| dev_err("expert_matmul", e))?;
    let mut outs = [Guarded::new(routed * n), Guarded::new(routed * n)];
    {
        let [o1, o2] = &mut outs;
        dev.expert_matmul_multi(
            &[h.as_ref(), h2.as_ref()],
            &x,
            &rows,
            &mut [o1.body_mut(), o2.body_mut()],
        )
        .map_err(|e| dev_err("expert_matmul_multi", e))?;
    }
    for (i, (got, alone)) in outs.iter().zip([out.body(), &alone2[..]]).enumerate() {
        got.check(&format!("multi out {i}"))?;
        if let Some(j) = (0..alone.len()).find(|&j| alone[j].to_bits() != got.body()[j].to_bits()) {
            return Err(Stop::Fail(format!(
                "multi out {i}[{j}]: expert_matmul_multi gave {} where expert_matmul of the \
                 tower alone gives {}",
                got.body()[j],
                alone[j]
            )));
        }
    }
    Ok(worst)
}

fn get_rows_case(
    dev: &dyn Device,
    case: &Case,
    d: usize,
    vocab: usize,
    m: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let ty = weight_ty(case)?;
    let (bytes, wf) = random_weight(ty, d, vocab, rng)?;
    let h = stage(
        dev,
        &desc(case, vec![d, vocab], WeightKind::Embedding, bytes)?,
    )?;
    // First and last row, a repeat, the rest random.
    let mut ids: Vec<u32> = vec![(vocab - 1) as u32, 0];
    while ids.len() < m {
        ids.push(rng.below(vocab) as u32);
    }
    ids.push(ids[0]);
    let mut want = Vec::with_capacity(ids.len() * d);
    for &i in &ids {
        want.extend_from_slice(&wf[i as usize * d..(i as usize + 1) * d]);
    }
    let mut out = Guarded::new(ids.len() * d);
    dev.get_rows(h.as_ref(), &ids, out.body_mut())
        .map_err(|e| dev_err("get_rows", e))?;
    out.check("out")?;
    let e = compare("out", out.body(), &want, case.tolerance)?;
    // An id past the table is InvalidInput, not a panic or a read out of bounds.
    let mut out = Guarded::new(2 * d);
    match dev.get_rows(h.as_ref(), &[0, vocab as u32], out.body_mut()) {
        Err(err) if err.kind == HalErrorKind::InvalidInput => {}
        Err(err) => {
            return Err(Stop::Fail(format!(
                "get_rows with id {vocab} >= V: expected InvalidInput, got {err}"
            )))
        }
        Ok(()) => {
            return Err(Stop::Fail(format!(
                "get_rows with id {vocab} >= V succeeded (expected InvalidInput)"
            )))
        }
    }
    out.check("out (bad id)")?;
    Ok(e)
}

fn rms_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    dim: usize,
    heads: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let n = rows * heads * dim;
    let mut x = rng.vec(n, -1.0, 1.0);
    // Heads (or rows) of very different magnitudes: a chunk normalised with another
    // chunk's statistics is far off.
    for (c, chunk) in x.chunks_exact_mut(dim).enumerate() {
        let mag = 4f32.powi((c % 8) as i32 - 3);
        chunk.iter_mut().for_each(|v| *v *= mag);
    }
    let weight = if case.label == "no-weight" {
        None
    } else {
        Some(rng.vec(dim, 0.5, 1.5))
    };
    let eps = 1e-6;
    let want = reference::rms_norm_rows(&x, weight.as_deref(), eps, dim);
    let x_before = x.clone();
    let mut out = Guarded::new(n);
    dev.rms_norm(&x, weight.as_deref(), eps, dim, out.body_mut())
        .map_err(|e| dev_err("rms_norm", e))?;
    out.check("out")?;
    unchanged("x", &x, &x_before)?;
    // Every chunk on its own, so that one bad head is not averaged away.
    let mut worst = 0.0f64;
    for (c, (g, w)) in out
        .body()
        .chunks_exact(dim)
        .zip(want.chunks_exact(dim))
        .enumerate()
    {
        let what = if heads > 1 {
            format!("out row {} head {}", c / heads, c % heads)
        } else {
            format!("out row {c}")
        };
        worst = worst.max(compare(&what, g, w, case.tolerance)?);
    }
    Ok(worst)
}

fn add_rms_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    dim: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let n = rows * dim;
    let residual0 = rng.vec(n, -1.0, 1.0);
    let delta = rng.vec(n, -0.5, 0.5);
    let weight = rng.vec(dim, 0.5, 1.5);
    let eps = 1e-5;
    let want_res: Vec<f32> = residual0.iter().zip(&delta).map(|(a, b)| a + b).collect();
    let want_out = reference::rms_norm_rows(&want_res, Some(&weight), eps, dim);
    let mut res = Guarded::from_slice(&residual0);
    let mut out = Guarded::new(n);
    dev.add_rms_norm(res.body_mut(), &delta, &weight, eps, dim, out.body_mut())
        .map_err(|e| dev_err("add_rms_norm", e))?;
    res.check("residual")?;
    out.check("out")?;
    // The residual is checked too: rmsnorm is scale-invariant, so a residual that got
    // the delta (or itself) twice can still give a correct-looking output.
    let a = compare(
        "residual after the call",
        res.body(),
        &want_res,
        case.tolerance,
    )?;
    let b = compare("out", out.body(), &want_out, case.tolerance)?;
    Ok(a.max(b))
}

fn rope_case(dev: &dyn Device, case: &Case, spec: &RopeSpec, rng: &mut CaseRng) -> Res<f64> {
    let &RopeSpec {
        rows,
        heads,
        kv_heads,
        head_dim,
        n_rot,
        ..
    } = spec;
    // Positions up to a few thousand, or (`far`) up to 131071, always with 0 and the
    // edges of a 4096-token context.
    let (fixed, bound): (&[u32], usize) = if spec.far {
        (&[0, 1, 4095, 4096, 32768, 70000, 131071], 131_072)
    } else {
        (&[0, 1, 4095, 17, 2900], 5000)
    };
    let mut positions = fixed.to_vec();
    while positions.len() < rows {
        positions.push(rng.below(bound) as u32);
    }
    positions.truncate(rows);
    let factors: Option<Vec<f32>> = spec.factors.then(|| rng.vec(n_rot / 2, 1.0, 8.0));
    let p = flint_hal::RopeParams {
        n_heads: heads,
        head_dim,
        kind: spec.kind,
        n_rot,
        base: spec.base,
        freq_scale: spec.freq_scale,
        freq_factors: factors.as_deref(),
        yarn: spec.yarn,
    };
    // Queries, then (GQA) the keys of the same rows through a second call.
    let mut worst = 0.0f64;
    for (what, n_heads) in [("q", heads), ("k", kv_heads)] {
        if n_heads == 0 {
            continue;
        }
        let x0 = rng.vec(rows * n_heads * head_dim, -1.0, 1.0);
        let mut want = x0.clone();
        reference::rope(&mut want, &positions, head_dim, &p.config());
        let mut x = Guarded::from_slice(&x0);
        dev.rope(
            x.body_mut(),
            &positions,
            &flint_hal::RopeParams { n_heads, ..p },
        )
        .map_err(|e| dev_err("rope", e))?;
        x.check(what)?;
        worst = worst.max(compare(what, x.body(), &want, case.tolerance)?);
    }
    Ok(worst)
}

/// `add_bias` on `rows` rows of `dim`, then a bias whose length does not divide `x`,
/// which must be refused with `InvalidInput` and leave `x` as it was.
fn bias_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    dim: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let x0 = rng.vec(rows * dim, -4.0, 4.0);
    let bias = rng.vec(dim, -1.0, 1.0);
    let want = reference::add_bias(&x0, &bias);
    let mut x = Guarded::from_slice(&x0);
    dev.add_bias(x.body_mut(), &bias)
        .map_err(|e| dev_err("add_bias", e))?;
    x.check("x")?;
    let nmse = compare("x", x.body(), &want, case.tolerance)?;
    let long = rng.vec(rows * dim + 1, -1.0, 1.0);
    let mut y = x0.clone();
    match dev.add_bias(&mut y, &long) {
        Err(e) if e.kind == HalErrorKind::InvalidInput => {}
        Err(e) => {
            return Err(Stop::Fail(format!(
                "add_bias with a bias of {} values on x of {}: expected InvalidInput, got {e}",
                long.len(),
                y.len()
            )))
        }
        Ok(()) => {
            return Err(Stop::Fail(format!(
                "add_bias accepted a bias of {} values on x of {}",
                long.len(),
                y.len()
            )))
        }
    }
    if y != x0 {
        return Err(Stop::Fail(
            "add_bias changed x while refusing the call".into(),
        ));
    }
    Ok(nmse)
}

fn flat_case(dev: &dyn Device, case: &Case, op: Op, n: usize, rng: &mut CaseRng) -> Res<f64> {
    let a = rng.vec(n, -6.0, 6.0);
    let b = rng.vec(n, -2.0, 2.0);
    match op {
        Op::SiluMul | Op::GeluMul | Op::SwigluOaiMul => {
            // gpt-oss's clamp at 7 on both operands needs inputs beyond it.
            let (a, b) = if op == Op::SwigluOaiMul {
                (rng.vec(n, -10.0, 10.0), rng.vec(n, -10.0, 10.0))
            } else {
                (a, b)
            };
            let want = match op {
                Op::SiluMul => reference::silu_mul(&a, &b),
                Op::GeluMul => reference::gelu_mul(&a, &b),
                _ => reference::swiglu_oai_mul(&a, &b),
            };
            let mut out = Guarded::new(n);
            let r = match op {
                Op::SiluMul => dev.silu_mul(&a, &b, out.body_mut()),
                Op::GeluMul => dev.gelu_mul(&a, &b, out.body_mut()),
                _ => dev.swiglu_oai_mul(&a, &b, out.body_mut()),
            };
            r.map_err(|e| dev_err(op.name(), e))?;
            out.check("out")?;
            Ok(compare("out", out.body(), &want, case.tolerance)?)
        }
        Op::Add => {
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let mut acc = Guarded::from_slice(&a);
            dev.add(acc.body_mut(), &b).map_err(|e| dev_err("add", e))?;
            acc.check("acc")?;
            Ok(compare("acc", acc.body(), &want, case.tolerance)?)
        }
        Op::Scale => {
            let s = -0.37f32;
            let want: Vec<f32> = a.iter().map(|x| x * s).collect();
            let mut x = Guarded::from_slice(&a);
            dev.scale(x.body_mut(), s)
                .map_err(|e| dev_err("scale", e))?;
            x.check("x")?;
            Ok(compare("x", x.body(), &want, case.tolerance)?)
        }
        other => Err(Stop::Fail(format!(
            "suite bug: {other} is not element-wise"
        ))),
    }
}

fn scatter_case(
    dev: &dyn Device,
    case: &Case,
    dst: usize,
    src: usize,
    dim: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let acc0 = rng.vec(dst * dim, -1.0, 1.0);
    let x = rng.vec(src * dim, -1.0, 1.0);
    // Row 0 gets several contributions, the last row none.
    let rows: Vec<u32> = (0..src)
        .map(|i| {
            if i % 3 == 0 {
                0
            } else {
                rng.below(dst - 1) as u32
            }
        })
        .collect();
    let weights = rng.vec(src, -1.0, 1.0);
    let mut want = acc0.clone();
    for (i, (&r, &w)) in rows.iter().zip(&weights).enumerate() {
        let r = r as usize;
        for c in 0..dim {
            want[r * dim + c] += w * x[i * dim + c];
        }
    }
    let mut acc = Guarded::from_slice(&acc0);
    dev.scatter_add_weighted(acc.body_mut(), &x, &rows, &weights, dim)
        .map_err(|e| dev_err("scatter_add_weighted", e))?;
    acc.check("acc")?;
    Ok(compare("acc", acc.body(), &want, case.tolerance)?)
}

fn route_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    experts: usize,
    with_bias: bool,
    cfg: &RoutingConfig,
    rng: &mut CaseRng,
) -> Res<f64> {
    // Distinct, well separated selection keys: a near-tie would make the choice depend
    // on rounding rather than on correctness.
    let mut logits = Vec::with_capacity(rows * experts);
    let bias = with_bias.then(|| {
        (0..experts)
            .map(|e| if e % 3 == 0 { 0.3 } else { 0.0 })
            .collect::<Vec<f32>>()
    });
    for _ in 0..rows {
        let mut perm: Vec<usize> = (0..experts).collect();
        rng.shuffle(&mut perm);
        logits.extend(
            perm.iter()
                .map(|&r| (r as f32 - experts as f32 / 2.0) * (4.0 / experts as f32)),
        );
    }
    let (want_ids, want_w) =
        reference::route_topk(&logits, experts, bias.as_deref(), cfg).map_err(Stop::Fail)?;
    let mut ids = vec![u32::MAX; rows * cfg.k];
    let mut w = Guarded::new(rows * cfg.k);
    dev.route_topk(
        &logits,
        experts,
        bias.as_deref(),
        cfg,
        &mut ids,
        w.body_mut(),
    )
    .map_err(|e| dev_err("route_topk", e))?;
    w.check("weights")?;
    if ids != want_ids {
        return Err(Stop::Fail(format!("ids {ids:?}, reference {want_ids:?}")));
    }
    Ok(compare("weights", w.body(), &want_w, case.tolerance)?)
}

/// The call boundaries of a case of `tokens` tokens split after `split` (0: one call).
fn pieces(tokens: usize, split: usize) -> Vec<(usize, usize)> {
    if split == 0 || split >= tokens {
        vec![(0, tokens)]
    } else {
        vec![(0, split), (split, tokens)]
    }
}

fn conv_case(
    dev: &dyn Device,
    case: &Case,
    tokens: usize,
    channels: usize,
    d_conv: usize,
    split: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let x = rng.vec(tokens * channels, -2.0, 2.0);
    let weight = rng.vec(channels * d_conv, -1.0, 1.0);
    // A sequence already under way: a non-zero window.
    let state0 = rng.vec(channels * (d_conv - 1), -2.0, 2.0);
    let (want, want_state) = reference::ssm_conv_silu(&x, &weight, d_conv, &state0);
    let mut out = Guarded::new(tokens * channels);
    let mut state = Guarded::from_slice(&state0);
    for (a, b) in pieces(tokens, split) {
        let piece = &mut out.body_mut()[a * channels..b * channels];
        dev.ssm_conv_silu(
            &x[a * channels..b * channels],
            &weight,
            d_conv,
            state.body_mut(),
            piece,
        )
        .map_err(|e| dev_err("ssm_conv_silu", e))?;
    }
    out.check("out")?;
    state.check("state")?;
    let e = compare("out", out.body(), &want, case.tolerance)?;
    Ok(e.max(compare("state", state.body(), &want_state, case.tolerance)?))
}

fn delta_case(
    dev: &dyn Device,
    case: &Case,
    tokens: usize,
    shape: &DeltaNetShape,
    split: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let (d, ql, vl, hv) = (shape.head_dim, shape.qk_len(), shape.v_len(), shape.heads_v);
    // q and k L2-normalised per head, as the layer feeds them; decays exp(g) in
    // (0.3, 1), beta in (0, 1); a state already under way.
    let l2 = |mut x: Vec<f32>| {
        for row in x.chunks_exact_mut(d) {
            let n = row.iter().map(|a| a * a).sum::<f32>().sqrt();
            row.iter_mut().for_each(|a| *a /= n);
        }
        x
    };
    let q = l2(rng.vec(tokens * ql, -1.0, 1.0));
    let k = l2(rng.vec(tokens * ql, -1.0, 1.0));
    let v = rng.vec(tokens * vl, -1.0, 1.0);
    let g = rng.vec(tokens * hv, -1.2, -0.01);
    let beta = rng.vec(tokens * hv, 0.01, 0.99);
    let state0 = rng.vec(shape.state_len(), -0.5, 0.5);
    let (want, want_state) = reference::gated_delta_net(shape, &q, &k, &v, &g, &beta, &state0);
    let mut out = Guarded::new(tokens * vl);
    let mut state = Guarded::from_slice(&state0);
    for (a, b) in pieces(tokens, split) {
        let piece = &mut out.body_mut()[a * vl..b * vl];
        dev.gated_delta_net(
            shape,
            &q[a * ql..b * ql],
            &k[a * ql..b * ql],
            &v[a * vl..b * vl],
            &g[a * hv..b * hv],
            &beta[a * hv..b * hv],
            state.body_mut(),
            piece,
        )
        .map_err(|e| dev_err("gated_delta_net", e))?;
    }
    out.check("out")?;
    state.check("state")?;
    let e = compare("out", out.body(), &want, case.tolerance)?;
    Ok(e.max(compare("state", state.body(), &want_state, case.tolerance)?))
}

/// One sequence's data in one KV group.
struct SeqData {
    /// Keys per position, `[ctx, n_kv * dk]`.
    k: Vec<f32>,
    /// Values per position, `[ctx, n_kv * dv]`.
    v: Vec<f32>,
    /// Block table.
    table: Vec<u32>,
}

fn attn_case(dev: &dyn Device, case: &Case, s: &AttnSpec, rng: &mut CaseRng) -> Res<f64> {
    let (hq, hkv, dk, dv, bs) = (
        s.n_heads,
        s.n_kv_heads,
        s.head_dim_k,
        s.head_dim_v,
        s.block_size,
    );
    let blocks_of = |ctx: usize| ctx.div_ceil(bs);
    let needed: usize = s.seqs.iter().map(|q| blocks_of(q.ctx)).sum();
    // Spare blocks so that ids are sparse and tables are not contiguous.
    let num_blocks = needed + 3;
    let layout = KvLayout {
        num_blocks,
        block_size: bs,
        n_kv_heads: hkv,
        head_dim_k: dk,
        head_dim_v: dv,
    };

    // Queries, laid out with the sequences' rows in reverse order so that q_start is not
    // simply the running sum in call order.
    let n_rows: usize = s.seqs.iter().map(|q| q.n_q).sum();
    let q = rng.vec(n_rows * hq * dk, -1.0, 1.0);
    let mut q_start = vec![0usize; s.seqs.len()];
    let mut at = 0;
    for (i, sq) in s.seqs.iter().enumerate().rev() {
        q_start[i] = at;
        at += sq.n_q;
    }
    let positions: Vec<Vec<u32>> = s
        .seqs
        .iter()
        .map(|sq| ((sq.ctx - sq.n_q) as u32..sq.ctx as u32).collect())
        .collect();
    let scale = s.sharpness / (dk as f32).sqrt();
    let sinks: Option<Vec<f32>> = match s.sinks {
        Sinks::None => None,
        Sinks::BelowMax => Some(rng.vec(hq, -1.5, 0.0)),
        Sinks::AboveMax => Some(rng.vec(hq, 8.0, 10.0)),
    };

    let mut worst = 0.0f64;
    let mut groups: Vec<(Box<dyn flint_hal::KvBuffer>, Vec<SeqData>)> = Vec::new();
    // Pools of each group: a different shuffle per group, so the same position lands in
    // different block ids in each group.
    let mut prev_pool: Option<Vec<u32>> = None;
    for _g in 0..s.groups {
        let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
        let mut tries = 0;
        loop {
            rng.shuffle(&mut pool);
            match &prev_pool {
                Some(p) if p.iter().zip(&pool).any(|(a, b)| a == b) => {
                    tries += 1;
                    if tries > 10_000 {
                        return Err(Stop::Fail(
                            "suite bug: no block permutation differs everywhere".into(),
                        ));
                    }
                }
                _ => break,
            }
        }
        prev_pool = Some(pool.clone());
        let mut next = 0usize;
        let mut seqs = Vec::new();
        for sq in &s.seqs {
            let nb = blocks_of(sq.ctx);
            let mut table: Vec<u32> = pool[next..next + nb].to_vec();
            next += nb;
            if s.drop_old_blocks {
                if let Some(w) = s.window {
                    // Positions below the first query's window are never read.
                    let first_q = sq.ctx - sq.n_q;
                    let lo = flint_core::math::window_start(first_q, Some(w));
                    for (b, id) in table.iter_mut().enumerate() {
                        if (b + 1) * bs <= lo {
                            *id = NO_BLOCK;
                        }
                    }
                }
            }
            seqs.push(SeqData {
                k: rng.vec(sq.ctx * hkv * dk, -1.0, 1.0),
                v: rng.vec(sq.ctx * hkv * dv, -1.0, 1.0),
                table,
            });
        }
        let kv = dev.alloc_kv(&layout).map_err(|e| dev_err("alloc_kv", e))?;
        groups.push((kv, seqs));
    }

    // Write every group through its own slot mapping.
    for (kv, seqs) in groups.iter_mut() {
        // (seq, position) of every token to write, in shuffled order.
        let mut tokens: Vec<(usize, usize)> = Vec::new();
        for (si, sq) in s.seqs.iter().enumerate() {
            for p in 0..sq.ctx {
                if seqs[si].table[p / bs] != NO_BLOCK {
                    tokens.push((si, p));
                }
            }
        }
        rng.shuffle(&mut tokens);
        let slot = |(si, p): (usize, usize)| seqs[si].table[p / bs] * bs as u32 + (p % bs) as u32;
        if s.overwrite {
            // Garbage first for a third of the tokens; the real write must replace it.
            let junk: Vec<(usize, usize)> = tokens.iter().step_by(3).copied().collect();
            let kj = rng.vec(junk.len() * hkv * dk, 5.0, 9.0);
            let vj = rng.vec(junk.len() * hkv * dv, 5.0, 9.0);
            let slots: Vec<u32> = junk.iter().map(|&t| slot(t)).collect();
            dev.write_kv(kv.as_mut(), &kj, &vj, &slots)
                .map_err(|e| dev_err("write_kv", e))?;
        }
        let chunks = if s.overwrite { 3 } else { 1 };
        let per = tokens.len().div_ceil(chunks);
        for chunk in tokens.chunks(per.max(1)) {
            let mut kb = Vec::with_capacity(chunk.len() * hkv * dk);
            let mut vb = Vec::with_capacity(chunk.len() * hkv * dv);
            let mut slots = Vec::with_capacity(chunk.len());
            for &(si, p) in chunk {
                kb.extend_from_slice(&seqs[si].k[p * hkv * dk..(p + 1) * hkv * dk]);
                vb.extend_from_slice(&seqs[si].v[p * hkv * dv..(p + 1) * hkv * dv]);
                slots.push(slot((si, p)));
            }
            dev.write_kv(kv.as_mut(), &kb, &vb, &slots)
                .map_err(|e| dev_err("write_kv", e))?;
        }
    }

    // Attend each group with its own tables and compare.
    let q_before = q.clone();
    for (g, (kv, seqs)) in groups.iter().enumerate() {
        let attn_seqs: Vec<AttnSeq<'_>> = s
            .seqs
            .iter()
            .enumerate()
            .map(|(i, _)| AttnSeq {
                q_start: q_start[i],
                positions: &positions[i],
                block_table: &seqs[i].table,
            })
            .collect();
        let p = PagedAttention {
            q: &q,
            seqs: &attn_seqs,
            n_heads: hq,
            scale,
            sinks: sinks.as_deref(),
            window: s.window,
        };
        let mut out = Guarded::new(n_rows * hq * dv);
        dev.paged_attention(kv.as_ref(), &p, out.body_mut())
            .map_err(|e| dev_err("paged_attention", e))?;
        out.check("out")?;
        unchanged("q", &q, &q_before)?;
        for (i, sq) in s.seqs.iter().enumerate() {
            let rows = q_start[i]..q_start[i] + sq.n_q;
            let want = reference::attention(
                hq,
                hkv,
                dk,
                dv,
                scale,
                sinks.as_deref(),
                s.window,
                &q[rows.start * hq * dk..rows.end * hq * dk],
                &positions[i],
                &seqs[i].k,
                &seqs[i].v,
            );
            let got = &out.body()[rows.start * hq * dv..rows.end * hq * dv];
            let what = if s.groups > 1 {
                format!("group {g} seq {i}")
            } else {
                format!("seq {i}")
            };
            worst = worst.max(compare(&what, got, &want, case.tolerance)?);
        }
    }
    Ok(worst)
}
