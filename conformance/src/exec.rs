//! Running one case on one device.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use flint_hal::{
    AttnSeq, DeltaNetShape, Device, HalError, HalErrorKind, IndexTensor, IndexView, KvLayout, Op,
    PagedAttention, RoutingConfig, Tensor, View, ViewMut, WeightDesc, WeightHandle, WeightKind,
    WeightSource, NO_BLOCK,
};

use crate::case::{AttnSpec, Case, RopeSpec, Shape, Sinks};
use crate::check::{compare, unchanged, DeviceGuarded, Guarded};
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

/// An input in a new tensor of the device under test, as the engine stages its
/// activations (`upload_new`).
fn put(dev: &dyn Device, x: &[f32]) -> Res<Tensor> {
    dev.upload_new(x)
        .map_err(|e| Stop::Fail(format!("upload of {} values: {e}", x.len())))
}

/// Index lists (ids, positions, slots, block tables) as the device's index tensor, the
/// way the engine hands them over each step.
fn put_indices(dev: &dyn Device, ids: &[u32]) -> Res<IndexTensor> {
    dev.upload_indices(ids.to_vec())
        .map_err(|e| Stop::Fail(format!("upload of {} indices: {e}", ids.len())))
}

/// A tensor's (or a view's) values, downloaded.
fn get(dev: &dyn Device, v: View<'_>) -> Res<Vec<f32>> {
    let mut h = vec![0f32; v.len()];
    dev.download(v, &mut h)
        .map_err(|e| Stop::Fail(format!("download of {} values: {e}", h.len())))?;
    Ok(h)
}

/// A guarded output on the device under test.
fn out_tensor(dev: &dyn Device, len: usize) -> Res<DeviceGuarded> {
    Ok(DeviceGuarded::new(dev, len)?)
}

/// A plain tensor of `len` values on the device under test (not guarded: a result the
/// case compares with another of the device's own).
fn alloc(dev: &dyn Device, len: usize) -> Res<Tensor> {
    dev.alloc(len)
        .map_err(|e| Stop::Fail(format!("alloc: {e}")))
}

/// The first index where `a` and `b` differ in their bits (`b` at least as long).
fn first_bit_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// A guarded in-place operand on the device under test, holding `data`.
fn inout_tensor(dev: &dyn Device, data: &[f32]) -> Res<DeviceGuarded> {
    Ok(DeviceGuarded::from_slice(dev, data)?)
}

/// Downloads a guarded tensor and checks its guards.
fn fetch(dev: &dyn Device, t: &DeviceGuarded, what: &str) -> Res<Guarded> {
    let g = t.fetch(dev)?;
    g.check(what)?;
    Ok(g)
}

/// An input that the op must leave alone: still `want`, bit for bit.
fn unchanged_on(dev: &dyn Device, what: &str, t: &Tensor, want: &[f32]) -> Res<()> {
    Ok(unchanged(what, &get(dev, t.view())?, want)?)
}

/// Runs `case` on `dev`: skipped when `supports` says no, failed on a wrong result, an
/// error, a non-finite value, an out-of-bounds write or a panic.
pub fn run_case(dev: &dyn Device, case: &Case) -> Outcome {
    for &op in case.required_ops() {
        let ty = if op.takes_weight() {
            case.weight_type()
        } else {
            None
        };
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
        (Shape::Weight { k, n, m }, Op::MatmulGlu) => {
            matmul_glu_case(dev, case, *k, *n, *m, &mut rng)
        }
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
            add_rms_case(dev, case, *rows, *dim, false, &mut rng)
        }
        (Shape::Rows { rows, dim, .. }, Op::PostNormAddRmsNorm) => {
            add_rms_case(dev, case, *rows, *dim, true, &mut rng)
        }
        (Shape::Rope(spec), Op::Rope) => rope_case(dev, case, spec, false, &mut rng),
        (Shape::Rope(spec), Op::NormRope) => rope_case(dev, case, spec, true, &mut rng),
        (Shape::Bias { rows, dim }, Op::AddBias) => bias_case(dev, case, *rows, *dim, &mut rng),
        (Shape::Flat { n }, Op::Copy) => copy_case(dev, case, *n, &mut rng),
        (Shape::Chain { rows, k, n }, Op::Copy) => {
            transfers_case(dev, case, *rows, *k, *n, &mut rng)
        }
        (Shape::Flat { n }, op) => flat_case(dev, case, op, *n, &mut rng),
        (Shape::Scatter { dst, src, dim }, Op::ScatterAddWeighted) => {
            scatter_case(dev, case, *dst, *src, *dim, &mut rng)
        }
        (Shape::Heads { rows, heads, dim }, op) => {
            heads_case(dev, case, op, *rows, *heads, *dim, &mut rng)
        }
        (Shape::AddId { rows, table, dim }, Op::AddId) => {
            add_id_case(dev, case, *rows, *table, *dim, &mut rng)
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
                expert_scale,
            },
            Op::RouteTopK,
        ) => {
            let cfg = RoutingConfig {
                k: *k,
                gating: *gating,
                normalize: *normalize,
                scale: *scale,
            };
            route_case(
                dev,
                case,
                *rows,
                *experts,
                *bias,
                *expert_scale,
                &cfg,
                &mut rng,
            )
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
        .weight_type()
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
    let xt = put(dev, &x)?;
    let mut out = out_tensor(dev, m * n)?;
    dev.matmul(h.as_ref(), xt.view(), m, out.body_mut())
        .map_err(|e| dev_err("matmul", e))?;
    let out = fetch(dev, &out, "out")?;
    unchanged_on(dev, "x", &xt, &x)?;
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
    let xt = put(dev, &x)?;
    let mut outs = heights
        .iter()
        .map(|&h| out_tensor(dev, m * h))
        .collect::<Res<Vec<DeviceGuarded>>>()?;
    {
        let ws: Vec<&dyn flint_hal::Weight> = handles.iter().map(|h| h.as_ref()).collect();
        let mut bodies: Vec<ViewMut<'_>> = outs.iter_mut().map(|o| o.body_mut()).collect();
        dev.matmul_multi(&ws, xt.view(), m, &mut bodies)
            .map_err(|e| dev_err("matmul_multi", e))?;
    }
    unchanged_on(dev, "x", &xt, &x)?;
    let mut worst = 0f64;
    for (i, ((h, out), wf)) in handles.iter().zip(&outs).zip(&floats).enumerate() {
        let out = fetch(dev, out, &format!("out {i}"))?;
        let want = reference::matmul_f32(wf, k, &x, m);
        worst = worst.max(compare(
            &format!("out {i}"),
            out.body(),
            &want,
            case.tolerance,
        )?);
        let mut alone_t = alloc(dev, m * heights[i])?;
        dev.matmul(h.as_ref(), xt.view(), m, alone_t.view_mut())
            .map_err(|e| dev_err("matmul", e))?;
        let alone = get(dev, alone_t.view())?;
        if let Some(j) = first_bit_difference(&alone, out.body()) {
            return Err(Stop::Fail(format!(
                "out {i}[{j}]: matmul_multi gave {} where matmul of the weight alone gives {}",
                out.body()[j],
                alone[j]
            )));
        }
    }
    Ok(worst)
}

/// `matmul_glu` (SiLU for a few rows, GELU for a batch): against the reference's two
/// matmuls and activation, and bit for bit against the device's own `matmul_multi` and
/// activation op (the contract: one call instead of several, the same numbers).
fn matmul_glu_case(
    dev: &dyn Device,
    case: &Case,
    k: usize,
    n: usize,
    m: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let ty = weight_ty(case)?;
    let glu = if m < 16 {
        flint_hal::Glu::Silu
    } else {
        flint_hal::Glu::GeluTanh
    };
    let (gb, gf) = random_weight(ty, k, n, rng)?;
    let (ub, uf) = random_weight(ty, k, n, rng)?;
    let g = stage(dev, &desc(case, vec![k, n], WeightKind::Matrix, gb)?)?;
    let u = stage(dev, &desc(case, vec![k, n], WeightKind::Matrix, ub)?)?;
    let x = rng.vec(m * k, -1.0, 1.0);
    let (gw, uw) = (
        reference::matmul_f32(&gf, k, &x, m),
        reference::matmul_f32(&uf, k, &x, m),
    );
    let want = match glu {
        flint_hal::Glu::Silu => reference::silu_mul(&gw, &uw),
        _ => reference::gelu_mul(&gw, &uw),
    };
    let xt = put(dev, &x)?;
    let (mut s0, mut s1) = (out_tensor(dev, m * n)?, out_tensor(dev, m * n)?);
    let mut out = out_tensor(dev, m * n)?;
    dev.matmul_glu(
        g.as_ref(),
        u.as_ref(),
        xt.view(),
        m,
        glu,
        [s0.body_mut(), s1.body_mut()],
        out.body_mut(),
    )
    .map_err(|e| dev_err("matmul_glu", e))?;
    let got = fetch(dev, &out, "out")?;
    unchanged_on(dev, "x", &xt, &x)?;
    let worst = compare("out", got.body(), &want, case.tolerance)?;
    // The device's own ops, one after another.
    let (mut gp, mut up, mut apart) = (alloc(dev, m * n)?, alloc(dev, m * n)?, alloc(dev, m * n)?);
    dev.matmul_multi(
        &[g.as_ref(), u.as_ref()],
        xt.view(),
        m,
        &mut [gp.view_mut(), up.view_mut()],
    )
    .map_err(|e| dev_err("matmul_multi", e))?;
    match glu {
        flint_hal::Glu::Silu => dev.silu_mul(gp.view(), up.view(), apart.view_mut()),
        _ => dev.gelu_mul(gp.view(), up.view(), apart.view_mut()),
    }
    .map_err(|e| dev_err("activation", e))?;
    let apart = get(dev, apart.view())?;
    if let Some(j) = first_bit_difference(&apart, got.body()) {
        return Err(Stop::Fail(format!(
            "out[{j}]: matmul_glu gave {} where matmul_multi and the activation give {}",
            got.body()[j],
            apart[j]
        )));
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
    // Each token goes to `routed / tokens` experts (routed row `i` reads token
    // `i / fanout`). Expert 0 stays unused; the last expert gets several rows from
    // different tokens.
    if !routed.is_multiple_of(tokens) {
        return Err(Stop::Fail(format!(
            "case shape: {routed} routed rows is not a multiple of {tokens} tokens"
        )));
    }
    let fanout = routed / tokens;
    let mut ids: Vec<u32> = (0..routed)
        .map(|_| (1 + rng.below(experts - 1)) as u32)
        .collect();
    ids[0] = (experts - 1) as u32;
    ids[routed - 1] = (experts - 1) as u32;
    let mut want = Vec::with_capacity(routed * n);
    for (i, &e) in ids.iter().enumerate() {
        let (e, t) = (e as usize, i / fanout);
        want.extend(reference::matmul_f32(
            &wf[e * n * k..(e + 1) * n * k],
            k,
            &x[t * k..(t + 1) * k],
            1,
        ));
    }
    let xt = put(dev, &x)?;
    // The ids as the engine hands them: an index tensor of the device.
    let idt = put_indices(dev, &ids)?;
    let rows = idt.view();
    let mut out_t = out_tensor(dev, routed * n)?;
    dev.expert_matmul(h.as_ref(), xt.view(), rows, out_t.body_mut())
        .map_err(|e| dev_err("expert_matmul", e))?;
    let out = fetch(dev, &out_t, "out")?;
    unchanged_on(dev, "x", &xt, &x)?;
    let worst = compare("out", out.body(), &want, case.tolerance)?;
    // `expert_matmul_multi` with a second tower of the same shape on the same rows (a
    // layer's gate and up projections): each output bit for bit the tower's own
    // `expert_matmul`.
    let (bytes2, _) = random_weight(ty, k, n * experts, rng)?;
    let h2 = stage(
        dev,
        &desc(case, vec![k, n, experts], WeightKind::ExpertTower, bytes2)?,
    )?;
    let mut alone2_t = out_tensor(dev, routed * n)?;
    dev.expert_matmul(h2.as_ref(), xt.view(), rows, alone2_t.body_mut())
        .map_err(|e| dev_err("expert_matmul", e))?;
    let alone2 = fetch(dev, &alone2_t, "out")?;
    let mut outs = [out_tensor(dev, routed * n)?, out_tensor(dev, routed * n)?];
    {
        let [o1, o2] = &mut outs;
        dev.expert_matmul_multi(
            &[h.as_ref(), h2.as_ref()],
            xt.view(),
            rows,
            &mut [o1.body_mut(), o2.body_mut()],
        )
        .map_err(|e| dev_err("expert_matmul_multi", e))?;
    }
    for (i, (got, alone)) in outs.iter().zip([out.body(), alone2.body()]).enumerate() {
        let got = fetch(dev, got, &format!("multi out {i}"))?;
        if let Some(j) = first_bit_difference(alone, got.body()) {
            return Err(Stop::Fail(format!(
                "multi out {i}[{j}]: expert_matmul_multi gave {} where expert_matmul of the \
                 tower alone gives {}",
                got.body()[j],
                alone[j]
            )));
        }
    }
    // An expert id beyond the tower, read from the device: an error, not a crash.
    let mut bad = ids.clone();
    bad[routed / 2] = experts as u32;
    let badt = put_indices(dev, &bad)?;
    let mut sink = out_tensor(dev, routed * n)?;
    match dev.expert_matmul(h.as_ref(), xt.view(), badt.view(), sink.body_mut()) {
        Err(e) if e.kind == HalErrorKind::InvalidInput => {}
        Err(e) => {
            return Err(Stop::Fail(format!(
                "expert id {experts} of {experts} experts: {:?} error, want InvalidInput ({e})",
                e.kind
            )))
        }
        Ok(()) => {
            return Err(Stop::Fail(format!(
                "expert id {experts} of {experts} experts was accepted"
            )))
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
    // The ids from the device's index tensor (a range inside it, as a step's token ids
    // are), then from host memory.
    let mut packed = vec![7u32];
    packed.extend_from_slice(&ids);
    let idx = put_indices(dev, &packed)?;
    let mut e = 0f64;
    for (how, ids_v) in [
        ("device ids", idx.slice(1..packed.len())),
        ("host ids", IndexView::from(&ids)),
    ] {
        let mut out_t = out_tensor(dev, ids.len() * d)?;
        dev.get_rows(h.as_ref(), ids_v, out_t.body_mut())
            .map_err(|e| dev_err(&format!("get_rows ({how})"), e))?;
        let out = fetch(dev, &out_t, "out")?;
        e = e.max(compare(how, out.body(), &want, case.tolerance)?);
    }
    // An id past the table is InvalidInput, not a panic or a read out of bounds.
    let mut out = out_tensor(dev, 2 * d)?;
    let bad = put_indices(dev, &[0, vocab as u32])?;
    match dev.get_rows(h.as_ref(), bad.view(), out.body_mut()) {
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
    fetch(dev, &out, "out (bad id)")?;
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
    let xt = put(dev, &x)?;
    let wt = weight.as_deref().map(|w| put(dev, w)).transpose()?;
    let mut out_t = out_tensor(dev, n)?;
    dev.rms_norm(
        xt.view(),
        wt.as_ref().map(Tensor::view),
        eps,
        dim,
        out_t.body_mut(),
    )
    .map_err(|e| dev_err("rms_norm", e))?;
    let out = fetch(dev, &out_t, "out")?;
    unchanged_on(dev, "x", &xt, &x)?;
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

/// `add_rms_norm`, or with `post` `post_norm_add_rms_norm` (the delta normed by its own
/// weight first): the residual and the output against the reference.
fn add_rms_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    dim: usize,
    post: bool,
    rng: &mut CaseRng,
) -> Res<f64> {
    let n = rows * dim;
    let residual0 = rng.vec(n, -1.0, 1.0);
    let mut delta = rng.vec(n, -0.5, 0.5);
    let weight = rng.vec(dim, 0.5, 1.5);
    let eps = 1e-5;
    let delta_weight = if post {
        // Rows of very different magnitudes: a row normed with another's statistics is
        // far off.
        for (r, row) in delta.chunks_exact_mut(dim).enumerate() {
            let mag = 4f32.powi((r % 8) as i32 - 3);
            row.iter_mut().for_each(|v| *v *= mag);
        }
        Some(rng.vec(dim, 0.5, 1.5))
    } else {
        None
    };
    let added = match &delta_weight {
        Some(w) => reference::rms_norm_rows(&delta, Some(w), eps, dim),
        None => delta.clone(),
    };
    let want_res: Vec<f32> = residual0.iter().zip(&added).map(|(a, b)| a + b).collect();
    let want_out = reference::rms_norm_rows(&want_res, Some(&weight), eps, dim);
    let mut res_t = inout_tensor(dev, &residual0)?;
    let (dt, wt) = (put(dev, &delta)?, put(dev, &weight)?);
    let mut out_t = out_tensor(dev, n)?;
    match &delta_weight {
        None => dev
            .add_rms_norm(
                res_t.body_mut(),
                dt.view(),
                wt.view(),
                eps,
                dim,
                out_t.body_mut(),
            )
            .map_err(|e| dev_err("add_rms_norm", e))?,
        Some(w) => {
            let dwt = put(dev, w)?;
            let mut scratch = out_tensor(dev, n)?;
            dev.post_norm_add_rms_norm(
                res_t.body_mut(),
                dt.view(),
                dwt.view(),
                wt.view(),
                eps,
                dim,
                scratch.body_mut(),
                out_t.body_mut(),
            )
            .map_err(|e| dev_err("post_norm_add_rms_norm", e))?
        }
    }
    let res = fetch(dev, &res_t, "residual")?;
    let out = fetch(dev, &out_t, "out")?;
    unchanged_on(dev, "delta", &dt, &delta)?;
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

/// `rope` on queries and (GQA) keys, or with `fused` `norm_rope` (a head norm first, a
/// pre-scale on the queries): against the reference's ops one after another.
fn rope_case(
    dev: &dyn Device,
    case: &Case,
    spec: &RopeSpec,
    fused: bool,
    rng: &mut CaseRng,
) -> Res<f64> {
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
    // The factors as the engine holds them: a tensor of the device.
    let factors_t = factors.as_deref().map(|f| put(dev, f)).transpose()?;
    let p = flint_hal::RopeParams {
        n_heads: heads,
        head_dim,
        kind: spec.kind,
        n_rot,
        base: spec.base,
        freq_scale: spec.freq_scale,
        freq_factors: factors_t.as_ref().map(Tensor::view),
        yarn: spec.yarn,
    };
    let eps = 1e-6;
    // Queries, then (GQA) the keys of the same rows through a second call.
    let mut worst = 0.0f64;
    for (what, n_heads, scale) in [("q", heads, 0.0625f32), ("k", kv_heads, 1.0)] {
        if n_heads == 0 {
            continue;
        }
        let mut x0 = rng.vec(rows * n_heads * head_dim, -1.0, 1.0);
        let w = rng.vec(head_dim, 0.5, 1.5);
        let mut want = if fused {
            // Heads of very different magnitudes: a head normed with another's
            // statistics is far off.
            for (c, chunk) in x0.chunks_exact_mut(head_dim).enumerate() {
                let mag = 4f32.powi((c % 8) as i32 - 3);
                chunk.iter_mut().for_each(|v| *v *= mag);
            }
            reference::rms_norm_rows(&x0, Some(&w), eps, head_dim)
        } else {
            x0.clone()
        };
        let host = flint_hal::RopeParams {
            n_heads,
            freq_factors: factors.as_deref().map(View::from),
            ..p
        };
        reference::rope(&mut want, &positions, head_dim, &host.config());
        let mut xt = inout_tensor(dev, &x0)?;
        let pt = put_indices(dev, &positions)?;
        let pd = flint_hal::RopeParams { n_heads, ..p };
        if fused {
            want.iter_mut().for_each(|v| *v *= scale);
            let wt = put(dev, &w)?;
            let mut scratch = out_tensor(dev, x0.len())?;
            dev.norm_rope(
                xt.body_mut(),
                wt.view(),
                eps,
                pt.view(),
                &pd,
                scale,
                scratch.body_mut(),
            )
            .map_err(|e| dev_err("norm_rope", e))?;
        } else {
            dev.rope(xt.body_mut(), pt.view(), &pd)
                .map_err(|e| dev_err("rope", e))?;
        }
        let x = fetch(dev, &xt, what)?;
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
    let mut xt = inout_tensor(dev, &x0)?;
    let bt = put(dev, &bias)?;
    dev.add_bias(xt.body_mut(), bt.view())
        .map_err(|e| dev_err("add_bias", e))?;
    let x = fetch(dev, &xt, "x")?;
    let nmse = compare("x", x.body(), &want, case.tolerance)?;
    let long = rng.vec(rows * dim + 1, -1.0, 1.0);
    let long_t = put(dev, &long)?;
    let mut yt = put(dev, &x0)?;
    match dev.add_bias(yt.view_mut(), long_t.view()) {
        Err(e) if e.kind == HalErrorKind::InvalidInput => {}
        Err(e) => {
            return Err(Stop::Fail(format!(
                "add_bias with a bias of {} values on x of {}: expected InvalidInput, got {e}",
                long.len(),
                x0.len()
            )))
        }
        Ok(()) => {
            return Err(Stop::Fail(format!(
                "add_bias accepted a bias of {} values on x of {}",
                long.len(),
                x0.len()
            )))
        }
    }
    if get(dev, yt.view())? != x0 {
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
            let (at, bt) = (put(dev, &a)?, put(dev, &b)?);
            let mut out_t = out_tensor(dev, n)?;
            let r = match op {
                Op::SiluMul => dev.silu_mul(at.view(), bt.view(), out_t.body_mut()),
                Op::GeluMul => dev.gelu_mul(at.view(), bt.view(), out_t.body_mut()),
                _ => dev.swiglu_oai_mul(at.view(), bt.view(), out_t.body_mut()),
            };
            r.map_err(|e| dev_err(op.name(), e))?;
            let out = fetch(dev, &out_t, "out")?;
            unchanged_on(dev, "gate", &at, &a)?;
            unchanged_on(dev, "up", &bt, &b)?;
            Ok(compare("out", out.body(), &want, case.tolerance)?)
        }
        Op::Add => {
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let mut acc_t = inout_tensor(dev, &a)?;
            let bt = put(dev, &b)?;
            dev.add(acc_t.body_mut(), bt.view())
                .map_err(|e| dev_err("add", e))?;
            let acc = fetch(dev, &acc_t, "acc")?;
            Ok(compare("acc", acc.body(), &want, case.tolerance)?)
        }
        Op::Scale => {
            let s = -0.37f32;
            let want: Vec<f32> = a.iter().map(|x| x * s).collect();
            let mut xt = inout_tensor(dev, &a)?;
            dev.scale(xt.body_mut(), s)
                .map_err(|e| dev_err("scale", e))?;
            let x = fetch(dev, &xt, "x")?;
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
    if !src.is_multiple_of(dst) {
        return Err(Stop::Fail(format!(
            "case shape: {src} routed rows is not a multiple of {dst} tokens"
        )));
    }
    let fanout = src / dst;
    let acc0 = rng.vec(dst * dim, -1.0, 1.0);
    let x = rng.vec(src * dim, -1.0, 1.0);
    let weights = rng.vec(src, -1.0, 1.0);
    // In order of the routed rows, as the combine must add them.
    let mut want = acc0.clone();
    for (i, &w) in weights.iter().enumerate() {
        let r = i / fanout;
        for c in 0..dim {
            want[r * dim + c] += w * x[i * dim + c];
        }
    }
    let mut acc_t = inout_tensor(dev, &acc0)?;
    let (xt, wt) = (put(dev, &x)?, put(dev, &weights)?);
    dev.scatter_add_weighted(acc_t.body_mut(), xt.view(), wt.view(), dim)
        .map_err(|e| dev_err("scatter_add_weighted", e))?;
    let acc = fetch(dev, &acc_t, "acc")?;
    unchanged_on(dev, "weights", &wt, &weights)?;
    Ok(compare("acc", acc.body(), &want, case.tolerance)?)
}

/// Qwen 3.5's element-wise steps against f64 loops written here.
fn heads_case(
    dev: &dyn Device,
    case: &Case,
    op: Op,
    rows: usize,
    heads: usize,
    dim: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let n = rows * heads * dim;
    let sig = |x: f32| (1.0 / (1.0 + (-f64::from(x)).exp())) as f32;
    match op {
        Op::Sigmoid => {
            let x0 = rng.vec(n, -8.0, 8.0);
            let want: Vec<f32> = x0.iter().map(|&x| sig(x)).collect();
            let mut xt = inout_tensor(dev, &x0)?;
            dev.sigmoid(xt.body_mut())
                .map_err(|e| dev_err("sigmoid", e))?;
            let x = fetch(dev, &xt, "x")?;
            Ok(compare("x", x.body(), &want, case.tolerance)?)
        }
        Op::Mul => {
            // The gated attention: as long as `acc`; the shared expert's gate: one value
            // per row.
            let per_row = case.label == "per-row";
            let acc0 = rng.vec(n, -2.0, 2.0);
            let x = rng.vec(if per_row { rows } else { n }, -2.0, 2.0);
            let per = n / x.len();
            let want: Vec<f32> = acc0
                .iter()
                .enumerate()
                .map(|(i, &a)| a * x[i / per])
                .collect();
            let mut acc_t = inout_tensor(dev, &acc0)?;
            let xt = put(dev, &x)?;
            dev.mul(acc_t.body_mut(), xt.view())
                .map_err(|e| dev_err("mul", e))?;
            let acc = fetch(dev, &acc_t, "acc")?;
            unchanged_on(dev, "x", &xt, &x)?;
            Ok(compare("acc", acc.body(), &want, case.tolerance)?)
        }
        Op::Deinterleave => {
            // Each head's `dim` queries, then its `dim` gate values.
            let src = rng.vec(2 * n, -2.0, 2.0);
            let (mut wq, mut wg) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for head in src.chunks_exact(2 * dim) {
                wq.extend_from_slice(&head[..dim]);
                wg.extend_from_slice(&head[dim..]);
            }
            let st = put(dev, &src)?;
            let mut outs = [out_tensor(dev, n)?, out_tensor(dev, n)?];
            {
                let [a, b] = &mut outs;
                dev.deinterleave(st.view(), dim, &mut [a.body_mut(), b.body_mut()])
                    .map_err(|e| dev_err("deinterleave", e))?;
            }
            let q = fetch(dev, &outs[0], "queries")?;
            let g = fetch(dev, &outs[1], "gate")?;
            exact("queries", q.body(), &wq)?;
            exact("gate", g.body(), &wg)?;
            Ok(0.0)
        }
        Op::DeltaNetGate => {
            let alpha0 = rng.vec(rows * heads, -4.0, 4.0);
            let dt = rng.vec(heads, -1.0, 1.0);
            // Negative decay rates, as the models' `ssm_a` (-exp(A_log)).
            let a = rng.vec(heads, -3.0, -0.1);
            let want: Vec<f32> = alpha0
                .iter()
                .enumerate()
                .map(|(i, &al)| {
                    let x = f64::from(al) + f64::from(dt[i % heads]);
                    let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
                    (softplus * f64::from(a[i % heads])) as f32
                })
                .collect();
            let mut at = inout_tensor(dev, &alpha0)?;
            let (dtt, rt) = (put(dev, &dt)?, put(dev, &a)?);
            dev.delta_net_gate(at.body_mut(), dtt.view(), rt.view())
                .map_err(|e| dev_err("delta_net_gate", e))?;
            let got = fetch(dev, &at, "alpha")?;
            Ok(compare("alpha", got.body(), &want, case.tolerance)?)
        }
        Op::L2Norm => {
            // Heads of very different sizes: each normalised by its own.
            let mut x0 = rng.vec(n, -1.0, 1.0);
            for (h, head) in x0.chunks_exact_mut(dim).enumerate() {
                let m = [0.01f32, 1.0, 30.0][h % 3];
                head.iter_mut().for_each(|v| *v *= m);
            }
            let eps = 1e-6f32;
            let mut want = Vec::with_capacity(n);
            for head in x0.chunks_exact(dim) {
                let ss: f64 = head.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                let inv = 1.0 / (ss + f64::from(eps)).sqrt();
                want.extend(head.iter().map(|&v| (f64::from(v) * inv) as f32));
            }
            let mut xt = inout_tensor(dev, &x0)?;
            dev.l2_norm(xt.body_mut(), dim, eps)
                .map_err(|e| dev_err("l2_norm", e))?;
            let x = fetch(dev, &xt, "x")?;
            Ok(compare("x", x.body(), &want, case.tolerance)?)
        }
        other => Err(Stop::Fail(format!(
            "suite bug: {other} has no case of heads"
        ))),
    }
}

fn add_id_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    table: usize,
    dim: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let x0 = rng.vec(rows * dim, -1.0, 1.0);
    let tab = rng.vec(table * dim, -1.0, 1.0);
    // Every row of the table but the first, the last one twice or more.
    let mut ids: Vec<u32> = (0..rows)
        .map(|_| (1 + rng.below(table - 1)) as u32)
        .collect();
    ids[0] = (table - 1) as u32;
    ids[rows - 1] = (table - 1) as u32;
    let mut want = x0.clone();
    for (r, &e) in ids.iter().enumerate() {
        let e = e as usize;
        for c in 0..dim {
            want[r * dim + c] += tab[e * dim + c];
        }
    }
    let mut x_t = inout_tensor(dev, &x0)?;
    let tt = put(dev, &tab)?;
    let idt = put_indices(dev, &ids)?;
    dev.add_id(x_t.body_mut(), tt.view(), idt.view(), dim)
        .map_err(|e| dev_err("add_id", e))?;
    let x = fetch(dev, &x_t, "x")?;
    unchanged_on(dev, "table", &tt, &tab)?;
    let worst = compare("x", x.body(), &want, case.tolerance)?;
    // An id beyond the table: an error, not a crash.
    let mut bad = ids;
    bad[rows / 2] = table as u32;
    let badt = put_indices(dev, &bad)?;
    match dev.add_id(x_t.body_mut(), tt.view(), badt.view(), dim) {
        Err(e) if e.kind == HalErrorKind::InvalidInput => Ok(worst),
        Err(e) => Err(Stop::Fail(format!(
            "id {table} of a {table}-row table: {:?} error, want InvalidInput ({e})",
            e.kind
        ))),
        Ok(()) => Err(Stop::Fail(format!(
            "id {table} of a {table}-row table was accepted"
        ))),
    }
}

fn route_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    experts: usize,
    with_bias: bool,
    with_scale: bool,
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
    let scale = with_scale.then(|| rng.vec(experts, 0.25, 2.0));
    let (want_ids, want_w) =
        reference::route_topk(&logits, experts, bias.as_deref(), scale.as_deref(), cfg)
            .map_err(Stop::Fail)?;
    // Ids and weights into tensors of the device, as the engine keeps them.
    let mut ids_t = dev
        .alloc_indices(rows * cfg.k)
        .map_err(|e| dev_err("alloc_indices", e))?;
    let mut w_t = out_tensor(dev, rows * cfg.k)?;
    let lt = put(dev, &logits)?;
    let bt = bias.as_deref().map(|b| put(dev, b)).transpose()?;
    let st = scale.as_deref().map(|s| put(dev, s)).transpose()?;
    dev.route_topk(
        lt.view(),
        experts,
        bt.as_ref().map(Tensor::view),
        st.as_ref().map(Tensor::view),
        cfg,
        ids_t.view_mut(),
        w_t.body_mut(),
    )
    .map_err(|e| dev_err("route_topk", e))?;
    let w = fetch(dev, &w_t, "weights")?;
    let mut ids = vec![u32::MAX; rows * cfg.k];
    dev.download_indices(ids_t.view(), &mut ids)
        .map_err(|e| dev_err("download_indices", e))?;
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
    let mut out_t = out_tensor(dev, tokens * channels)?;
    let mut state_t = inout_tensor(dev, &state0)?;
    let (xt, wt) = (put(dev, &x)?, put(dev, &weight)?);
    for (a, b) in pieces(tokens, split) {
        let piece = out_t.body_mut().into_slice(a * channels..b * channels);
        dev.ssm_conv_silu(
            xt.slice(a * channels..b * channels),
            wt.view(),
            d_conv,
            state_t.body_mut(),
            piece,
        )
        .map_err(|e| dev_err("ssm_conv_silu", e))?;
    }
    let out = fetch(dev, &out_t, "out")?;
    let state = fetch(dev, &state_t, "state")?;
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
    let mut out_t = out_tensor(dev, tokens * vl)?;
    let mut state_t = inout_tensor(dev, &state0)?;
    let (qt, kt, vt) = (put(dev, &q)?, put(dev, &k)?, put(dev, &v)?);
    let (gt, bt) = (put(dev, &g)?, put(dev, &beta)?);
    for (a, b) in pieces(tokens, split) {
        let piece = out_t.body_mut().into_slice(a * vl..b * vl);
        dev.gated_delta_net(
            shape,
            qt.slice(a * ql..b * ql),
            kt.slice(a * ql..b * ql),
            vt.slice(a * vl..b * vl),
            gt.slice(a * hv..b * hv),
            bt.slice(a * hv..b * hv),
            state_t.body_mut(),
            piece,
        )
        .map_err(|e| dev_err("gated_delta_net", e))?;
    }
    let out = fetch(dev, &out_t, "out")?;
    let state = fetch(dev, &state_t, "state")?;
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
    // The sinks as the engine holds them: a tensor of the device.
    let sinks_t = sinks.as_deref().map(|v| put(dev, v)).transpose()?;

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
            let (kjt, vjt) = (put(dev, &kj)?, put(dev, &vj)?);
            let st = put_indices(dev, &slots)?;
            dev.write_kv(kv.as_mut(), kjt.view(), vjt.view(), st.view())
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
            let (kt, vt) = (put(dev, &kb)?, put(dev, &vb)?);
            let st = put_indices(dev, &slots)?;
            dev.write_kv(kv.as_mut(), kt.view(), vt.view(), st.view())
                .map_err(|e| dev_err("write_kv", e))?;
        }
    }

    // Attend each group with its own tables and compare.
    let qt = put(dev, &q)?;
    for (g, (kv, seqs)) in groups.iter().enumerate() {
        // Every sequence's positions and block table in one index tensor, as a step
        // packs them.
        let mut packed = Vec::new();
        let mut at = Vec::with_capacity(2 * s.seqs.len());
        for (i, _) in s.seqs.iter().enumerate() {
            for list in [&positions[i], &seqs[i].table] {
                at.push(packed.len()..packed.len() + list.len());
                packed.extend_from_slice(list);
            }
        }
        let idx = put_indices(dev, &packed)?;
        let attn_seqs: Vec<AttnSeq<'_>> = (0..s.seqs.len())
            .map(|i| AttnSeq {
                q_start: q_start[i],
                positions: idx.slice(at[2 * i].clone()),
                block_table: idx.slice(at[2 * i + 1].clone()),
            })
            .collect();
        let p = PagedAttention {
            q: qt.view(),
            seqs: &attn_seqs,
            n_heads: hq,
            scale,
            sinks: sinks_t.as_ref().map(Tensor::view),
            window: s.window,
        };
        let mut out_t = out_tensor(dev, n_rows * hq * dv)?;
        dev.paged_attention(kv.as_ref(), &p, out_t.body_mut())
            .map_err(|e| dev_err("paged_attention", e))?;
        let out = fetch(dev, &out_t, "out")?;
        unchanged_on(dev, "q", &qt, &q)?;
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

/// `Err` naming the first value of `got` that is not `want`'s, bit for bit.
fn exact(what: &str, got: &[f32], want: &[f32]) -> Res<()> {
    if got.len() != want.len() {
        return Err(Stop::Fail(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        )));
    }
    match first_bit_difference(got, want) {
        Some(i) => Err(Stop::Fail(format!(
            "{what}[{i}]: {} where {} was copied",
            got[i], want[i]
        ))),
        None => Ok(()),
    }
}

/// `copy` on the device: a whole tensor into a new one; sub-ranges at offsets between
/// two tensors; disjoint sub-ranges of one tensor, both ways. Every value is checked bit
/// for bit, and nothing outside the destination range may change.
fn copy_case(dev: &dyn Device, case: &Case, n: usize, rng: &mut CaseRng) -> Res<f64> {
    let a = rng.vec(n, -100.0, 100.0);
    let copy = |src: View<'_>, dst: ViewMut<'_>| dev.copy(src, dst).map_err(|e| dev_err("copy", e));
    match case.label {
        "whole" => {
            let src = put(dev, &a)?;
            let mut dst = alloc(dev, n)?;
            // `alloc` promises zeros.
            if let Some(i) = get(dev, dst.view())?.iter().position(|v| v.to_bits() != 0) {
                return Err(Stop::Fail(format!(
                    "a new tensor of {n} values is not zeroed at index {i}"
                )));
            }
            copy(src.view(), dst.view_mut())?;
            exact("dst", &get(dev, dst.view())?, &a)?;
            unchanged_on(dev, "src", &src, &a)?;
        }
        "between" => {
            // Into a longer tensor, at offsets that differ from the source's; then one
            // value from the source's last slot to the destination's first.
            let m = n + 37;
            let b = rng.vec(m, -100.0, 100.0);
            let len = n / 2 + rng.below(n / 4);
            let so = 1 + rng.below(n - len - 1);
            let mut d_off = 1 + rng.below(m - len - 1);
            if d_off == so {
                d_off += 1;
            }
            let src = put(dev, &a)?;
            let mut dst = inout_tensor(dev, &b)?;
            copy(
                src.slice(so..so + len),
                dst.body_mut().into_slice(d_off..d_off + len),
            )?;
            copy(src.slice(n - 1..n), dst.body_mut().into_slice(0..1))?;
            let mut want = b.clone();
            want[d_off..d_off + len].copy_from_slice(&a[so..so + len]);
            want[0] = a[n - 1];
            let got = fetch(dev, &dst, "dst")?;
            exact("dst", got.body(), &want)?;
            unchanged_on(dev, "src", &src, &a)?;
        }
        "within" => {
            // One tensor split in two: a range of the first part into the second, then a
            // range of the second part, overlapping what the first copy wrote, back into
            // the first.
            let mid = n / 2 - 3;
            let l1 = 100 + rng.below(100);
            let (s1, d1) = (5 + rng.below(mid - l1 - 5), 7 + rng.below(n - mid - l1 - 7));
            let l2 = 50 + rng.below(50);
            let s2 = (d1 + l1 / 2).min(n - mid - l2);
            let d2 = 1 + rng.below(mid - l2 - 1);
            let mut t = inout_tensor(dev, &a)?;
            {
                let (mut lo, mut hi) = t.body_mut().split_at(mid);
                copy(lo.as_view().slice(s1..s1 + l1), hi.slice_mut(d1..d1 + l1))?;
                copy(hi.as_view().slice(s2..s2 + l2), lo.slice_mut(d2..d2 + l2))?;
            }
            let mut want = a.clone();
            want.copy_within(s1..s1 + l1, mid + d1);
            want.copy_within(mid + s2..mid + s2 + l2, d2);
            let got = fetch(dev, &t, "tensor")?;
            exact("tensor", got.body(), &want)?;
        }
        other => {
            return Err(Stop::Fail(format!("suite bug: no copy case {other:?}")));
        }
    }
    Ok(0.0)
}

/// Host-device traffic of what happened between `before` and now, checked against an
/// expected number of uploads and downloads of `values` each.
fn traffic(
    dev: &dyn Device,
    before: &flint_hal::Transfers,
    what: &str,
    uploads: u64,
    downloads: u64,
    values: usize,
) -> Res<()> {
    let d = dev.transfers().since(before);
    let bytes = 4 * values as u64;
    let want = (uploads, uploads * bytes, downloads, downloads * bytes);
    let got = (d.uploads, d.upload_bytes, d.downloads, d.download_bytes);
    if got != want {
        return Err(Stop::Fail(format!(
            "{what}: {} uploads of {} bytes and {} downloads of {} bytes counted, expected \
             {} and {}, {} and {}",
            got.0, got.1, got.2, got.3, want.0, want.1, want.2, want.3
        )));
    }
    Ok(())
}

/// The count of host-device transfers: each upload and download of `n` values is one
/// call of `4n` bytes (an index tensor's too), and a chain of ops on the device's
/// tensors (`rms_norm`, `matmul` by a staged F32 weight, `add`, `scale`, `rope` at
/// positions from the index tensor) moves nothing between the uploads of its inputs and
/// the download of its result, which must still be right, and passes no host argument
/// when the index tensor is in the device's memory.
fn transfers_case(
    dev: &dyn Device,
    case: &Case,
    rows: usize,
    k: usize,
    n: usize,
    rng: &mut CaseRng,
) -> Res<f64> {
    let (bytes, wf) = random_weight(flint_hal::GgmlType::F32, k, n, rng)?;
    let h = stage(dev, &desc(case, vec![k, n], WeightKind::Matrix, bytes)?)?;
    let x = rng.vec(rows * k, -1.0, 1.0);
    let norm = rng.vec(k, 0.5, 1.5);
    let r = rng.vec(rows * n, -1.0, 1.0);
    let (eps, s) = (1e-6f32, -0.37f32);
    let mut want = reference::matmul_f32(
        &wf,
        k,
        &reference::rms_norm_rows(&x, Some(&norm), eps, k),
        rows,
    );
    want.iter_mut().zip(&r).for_each(|(y, r)| *y = (*y + r) * s);
    // Then RoPE over heads of 8 (n is a multiple of 8), at positions far apart.
    let hd = 8;
    let positions: Vec<u32> = (0..rows).map(|i| (i * 37 + 5) as u32).collect();
    let rope = flint_hal::RopeParams::neox(n / hd, hd, hd, 10000.0);
    reference::rope(&mut want, &positions, hd, &rope.config());

    // Scratch first, as the engine allocates it ahead of its steps.
    let (mut normed, mut y) = (alloc(dev, rows * k)?, alloc(dev, rows * n)?);

    let mut inputs = Vec::new();
    for (what, v) in [("x", &x), ("norm weight", &norm), ("residual", &r)] {
        let t0 = dev.transfers();
        inputs.push(put(dev, v)?);
        traffic(dev, &t0, &format!("upload_new of {what}"), 1, 0, v.len())?;
    }
    let [xt, nt, rt] = &inputs[..] else {
        return Err(Stop::Fail("suite bug: three inputs".into()));
    };
    let t0 = dev.transfers();
    let pt = put_indices(dev, &positions)?;
    traffic(dev, &t0, "upload_indices of the positions", 1, 0, rows)?;

    let t0 = dev.transfers();
    dev.rms_norm(xt.view(), Some(nt.view()), eps, k, normed.view_mut())
        .map_err(|e| dev_err("rms_norm", e))?;
    dev.matmul(h.as_ref(), normed.view(), rows, y.view_mut())
        .map_err(|e| dev_err("matmul", e))?;
    dev.add(y.view_mut(), rt.view())
        .map_err(|e| dev_err("add", e))?;
    dev.scale(y.view_mut(), s)
        .map_err(|e| dev_err("scale", e))?;
    dev.rope(y.view_mut(), pt.view(), &rope)
        .map_err(|e| dev_err("rope", e))?;
    traffic(
        dev,
        &t0,
        "rms_norm, matmul, add, scale, rope on device tensors",
        0,
        0,
        0,
    )?;
    // A device that took the index tensor into its own memory reads the positions
    // there; one that keeps index lists on the host (host-memory devices, and devices
    // that hand each kernel its lists as arguments, as `vk` does with RoPE's angles)
    // may count them as arguments.
    let args = dev.transfers().since(&t0).arg_bytes;
    if matches!(pt, IndexTensor::Device(_)) && args != 0 {
        return Err(Stop::Fail(format!(
            "rms_norm, matmul, add, scale, rope on device tensors passed {args} bytes of \
             host arguments (the positions are in the index tensor)"
        )));
    }

    let t0 = dev.transfers();
    let mut got = vec![0f32; rows * n];
    dev.download(y.view(), &mut got)
        .map_err(|e| Stop::Fail(format!("download: {e}")))?;
    traffic(dev, &t0, "download of the result", 0, 1, got.len())?;
    let nmse = compare("result", &got, &want, case.tolerance)?;

    // Sub-ranges: an upload into a range of a tensor, the download of a range.
    let part = 1 + rng.below(k - 1);
    let t0 = dev.transfers();
    dev.upload(&r[..part], normed.slice_mut(3..3 + part))
        .map_err(|e| Stop::Fail(format!("upload: {e}")))?;
    traffic(dev, &t0, &format!("upload of {part} values"), 1, 0, part)?;
    let t0 = dev.transfers();
    let mut back = vec![0f32; part];
    dev.download(normed.slice(3..3 + part), &mut back)
        .map_err(|e| Stop::Fail(format!("download: {e}")))?;
    traffic(dev, &t0, &format!("download of {part} values"), 0, 1, part)?;
    exact("uploaded range", &back, &r[..part])?;

    // `download_tensor` is one download too, whether or not the tensor is already host memory.
    let t0 = dev.transfers();
    let last = dev
        .download_tensor(y)
        .map_err(|e| Stop::Fail(format!("download_tensor: {e}")))?;
    traffic(dev, &t0, "download_tensor of the result", 0, 1, last.len())?;
    exact("download_tensor of the result", &last, &got)?;
    Ok(nmse)
}
