//! `flint inspect`: a GGUF file's metadata (long arrays summarised), its tensor table
//! (type, shape, bytes), the bytes per type, the model description (whether Flint runs the
//! file and, if not, the key or tensor that stops it), and with `--device` the staging
//! census of that device.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::Args;
use flint_core::GgmlType;
use flint_hal::{StagingPlan, Tier, WeightDesc, WeightKind, WeightSource};
use flint_loader::config::{Activation, FfnDesc, Mixer, ModelDesc, NormPlacement, RopeKind};
use flint_loader::gguf::{Array, GgufFile, Value};
use flint_loader::ConfigError;

use super::{err, CliError};

/// Arguments of `flint inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// GGUF file.
    pub model: std::path::PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print the staging census of this device.
    #[arg(long)]
    pub device: Option<String>,
}

/// Array elements shown in text output before `... (N total)`.
const TEXT_ARRAY_ITEMS: usize = 8;
/// Arrays up to this length are given whole in JSON; longer ones are cut to their head.
const JSON_ARRAY_FULL: usize = 64;
const JSON_ARRAY_HEAD: usize = 16;

/// Opens a model file for the CLI, with an error that names the file and the problem.
pub(crate) fn open_gguf(path: &std::path::Path) -> Result<GgufFile, CliError> {
    GgufFile::open(path).map_err(|e| match e {
        flint_loader::GgufError::Io { .. } => err(e),
        e => CliError::new(format!("{}: invalid GGUF file: {e}", path.display())),
    })
}

/// Runs `flint inspect`.
pub fn run(args: &InspectArgs) -> Result<(), CliError> {
    let f = open_gguf(&args.model)?;
    let config = ModelDesc::from_gguf(&f);
    // A valid description is necessary; the engine assembling the model is what makes
    // the file run.
    let assembly = match &config {
        Ok(_) => crate::model::model_from_gguf(&f)
            .err()
            .map(|e| e.to_string()),
        Err(_) => None,
    };
    let verdict = Verdict {
        desc: &config,
        assembly,
    };
    // The census of both arms: blocks kept where the device can (the default), and
    // everything expanded (FLINT_KEEP_QUANT=0).
    let plan = match &args.device {
        Some(d) => Some((
            d.clone(),
            vec![
                (Arm::KeepQuant, staging_plan(&f, d, true)?),
                (Arm::Expanded, staging_plan(&f, d, false)?),
            ],
        )),
        None => None,
    };
    let out = if args.json {
        let mut s =
            serde_json::to_string_pretty(&json(&f, &args.model, &verdict, &plan)).map_err(err)?;
        s.push('\n');
        s
    } else {
        text(&f, &args.model, &verdict, &plan)
    };
    super::write_stdout(&out)
}

/// Bytes and tensor counts per type, in type-id order.
fn per_type(f: &GgufFile) -> BTreeMap<u32, (GgmlType, usize, u64)> {
    let mut m: BTreeMap<u32, (GgmlType, usize, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = m.entry(t.ty.id()).or_insert((t.ty, 0, 0));
        e.1 += 1;
        e.2 += t.n_bytes as u64;
    }
    m
}

fn dims_str(d: &[usize]) -> String {
    let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn human(bytes: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

fn text(
    f: &GgufFile,
    path: &std::path::Path,
    verdict: &Verdict<'_>,
    plan: &Option<(String, Vec<(Arm, StagingPlan)>)>,
) -> String {
    let mut s = String::new();
    let total: u64 = f.tensors().iter().map(|t| t.n_bytes as u64).sum();
    let _ = writeln!(s, "file: {}", path.display());
    let _ = writeln!(
        s,
        "GGUF v{}, {} bytes ({}), {} metadata keys, {} tensors, alignment {}, data at offset {}",
        f.version(),
        f.len(),
        human(f.len() as u64),
        f.metadata().len(),
        f.tensors().len(),
        f.alignment(),
        f.data_start()
    );
    if f.shard_count() > 1 {
        let _ = writeln!(
            s,
            "split model: {} shards, opened from the first (the figures above are its own; the tensor table covers every shard)",
            f.shard_count()
        );
    }
    let _ = writeln!(s, "\nmetadata:");
    let kw = f
        .metadata()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let tw = f
        .metadata()
        .map(|(_, v)| v.type_name().len())
        .max()
        .unwrap_or(0);
    for (k, v) in f.metadata() {
        let mut val = v.summary(TEXT_ARRAY_ITEMS).to_string();
        if val.chars().count() > 200 {
            val = val.chars().take(200).collect::<String>() + " ...";
        }
        let _ = writeln!(s, "  {k:kw$}  {:tw$}  {val}", v.type_name());
    }
    let _ = writeln!(s, "\ntensors:");
    let nw = f
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "  {:>5}  {:nw$}  {:7}  {:24}  {:>14}  {:>14}",
        "#", "name", "type", "dims", "elements", "bytes"
    );
    for (i, t) in f.tensors().iter().enumerate() {
        let _ = writeln!(
            s,
            "  {i:>5}  {:nw$}  {:7}  {:24}  {:>14}  {:>14}",
            t.name,
            t.ty.name(),
            dims_str(&t.dims),
            t.n_elements,
            t.n_bytes
        );
    }
    let _ = writeln!(s, "\nbytes per type:");
    for (ty, n, bytes) in per_type(f).values() {
        let pct = if total > 0 {
            100.0 * *bytes as f64 / total as f64
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "  {:7}  {n:>5} tensors  {bytes:>14} bytes  {:>11}  {pct:5.1}%",
            ty.name(),
            human(*bytes)
        );
    }
    let _ = writeln!(
        s,
        "  {:7}  {:>5} tensors  {total:>14} bytes  {:>11}",
        "total",
        f.tensors().len(),
        human(total)
    );
    let _ = writeln!(s, "\nmodel:");
    match (verdict.desc, &verdict.assembly) {
        (Ok(c), None) => {
            let _ = writeln!(
                s,
                "  runs: yes ({} model; every key and tensor accounted for)",
                c.arch.name()
            );
            for line in describe(c) {
                let _ = writeln!(s, "  {line}");
            }
        }
        (Ok(c), Some(e)) => {
            let _ = writeln!(
                s,
                "  runs: no: the {} description is valid, but the engine cannot assemble it: {e}",
                c.arch.name()
            );
            for line in describe(c) {
                let _ = writeln!(s, "  {line}");
            }
        }
        (Err(e), _) => {
            let _ = writeln!(s, "  runs: no: {e}");
        }
    }
    if let Some((dev, arms)) = plan {
        for (arm, p) in arms {
            let _ = writeln!(s, "\nstaging census on device '{dev}', {}:", arm.label());
            let kept = p.weights.iter().filter(|w| w.kept_quant).count();
            let expanded = p
                .weights
                .iter()
                .filter(|w| w.source_ty != w.staged_ty)
                .count();
            let _ = writeln!(
                s,
                "  resident:     {:>14} bytes  {}",
                p.resident_bytes(),
                human(p.resident_bytes())
            );
            let _ = writeln!(
                s,
                "  expert tier:  {:>14} bytes  {}",
                p.expert_tier_bytes(),
                human(p.expert_tier_bytes())
            );
            let _ = writeln!(
                s,
                "  streamed:     {:>14} bytes  {} per use",
                p.streamed_bytes(),
                human(p.streamed_bytes())
            );
            let _ = writeln!(
                s,
                "  {kept} tensors keep their block encoding, {expanded} are expanded"
            );
            let streamed = p
                .weights
                .iter()
                .filter(|w| w.tier == Tier::Streamed)
                .count();
            let _ = writeln!(s, "  {streamed} tensors streamed");
        }
    }
    s
}

/// Whether Flint runs the file: its description, and when that is valid, the engine's
/// assembly error if any.
struct Verdict<'a> {
    desc: &'a Result<ModelDesc, ConfigError>,
    assembly: Option<String>,
}

/// The description in a few lines of text (no tensor names: each line is a fact the
/// forward uses).
fn describe(c: &ModelDesc) -> Vec<String> {
    let n = c.n_layers();
    let sliding = c.layers.iter().filter(|l| l.sliding).count();
    let mut out = vec![format!(
        "{n} layers, d {}, {} query heads, {} KV heads, head sizes {}/{}, vocabulary {}{}, context_length {}",
        c.d,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim_k,
        c.head_dim_v,
        c.vocab,
        if c.tied_output { " (tied output)" } else { "" },
        c.context_length
    )];
    if let Some(dn) = c.delta_net {
        let k = c
            .layers
            .iter()
            .filter(|l| l.mixer == Mixer::DeltaNet)
            .count();
        let gated = c.layers.iter().filter(|l| l.attn_gate).count();
        out.push(format!(
            "mixers: {k} Gated DeltaNet layers ({} key heads, {} value heads of {}, convolution of {}), {} attention layers ({gated} with an output gate)",
            dn.shape.heads_k,
            dn.shape.heads_v,
            dn.shape.head_dim,
            dn.conv_kernel,
            n - k
        ));
    }
    let mut attn = format!(
        "attention: scale {} {}",
        c.attn_scale,
        if c.q_prescaled {
            "applied to Q before attention"
        } else {
            "on q.k"
        }
    );
    if let Some(w) = c.window {
        let _ = write!(attn, ", window {w} on {sliding} of {n} layers");
    }
    let qk = c.layers.iter().filter(|l| l.qk_norm).count();
    if qk > 0 {
        let _ = write!(attn, ", QK norm on {qk} layers");
    }
    let sinks = c.layers.iter().filter(|l| l.sinks).count();
    if sinks > 0 {
        let _ = write!(attn, ", sinks on {sinks} layers");
    }
    let biased = c
        .layers
        .iter()
        .filter(|l| l.biases != Default::default())
        .count();
    if biased > 0 {
        let _ = write!(attn, ", biases on {biased} layers");
    }
    if c.layers.iter().any(|l| l.n_kv_heads != c.n_kv_heads) {
        let kv: Vec<String> = c.layers.iter().map(|l| l.n_kv_heads.to_string()).collect();
        let _ = write!(attn, ", KV heads per layer [{}]", kv.join(", "));
    }
    if c.value_scale != 1.0 {
        let _ = write!(attn, ", output scaled by {}", c.value_scale);
    }
    if c.layers.iter().any(|l| {
        (l.head_dim_k, l.head_dim_v, l.n_rot) != (c.head_dim_k, c.head_dim_v, c.rope.n_rot)
    }) {
        let dims: Vec<String> = c
            .layers
            .iter()
            .map(|l| format!("{}/{}", l.head_dim_k, l.n_rot))
            .collect();
        let _ = write!(
            attn,
            ", head size / rotated dims per layer [{}]",
            dims.join(", ")
        );
    }
    if c.v_norm {
        attn.push_str(", V RMS-normed");
    }
    let shared: Vec<String> = c
        .layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.kv_source.map(|s| format!("{i}->{s}")))
        .collect();
    if !shared.is_empty() {
        let _ = write!(
            attn,
            ", KV read from an earlier layer [{}]",
            shared.join(", ")
        );
    }
    out.push(attn);
    if c.per_layer_input > 0 {
        out.push(format!(
            "per-layer token embeddings: {} per layer",
            c.per_layer_input
        ));
    }
    let mut bases: Vec<f32> = Vec::new();
    let mut scales: Vec<f32> = Vec::new();
    for l in &c.layers {
        if !bases.contains(&l.rope_base) {
            bases.push(l.rope_base);
        }
        if !scales.contains(&l.rope_freq_scale) {
            scales.push(l.rope_freq_scale);
        }
    }
    let list = |v: &[f32]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut rope = format!(
        "rope: {}, {} dims, bases {}, frequency scales {}",
        match c.rope.kind {
            RopeKind::Normal => "normal",
            RopeKind::Neox => "neox",
        },
        c.rope.n_rot,
        list(&bases),
        list(&scales)
    );
    if c.rope.freq_factors {
        rope.push_str(", frequency factors from the file");
    }
    if let Some(y) = &c.rope.yarn {
        let _ = write!(
            rope,
            ", yarn (ext {}, attn {}, beta {}/{}, original context {})",
            y.ext_factor, y.attn_factor, y.beta_fast, y.beta_slow, y.n_ctx_orig
        );
    }
    out.push(rope);
    let act = match c.activation {
        Activation::Silu => "SiLU",
        Activation::GeluTanh => "GELU-tanh",
        Activation::SwigluOai => "clamped SwiGLU (gpt-oss)",
    };
    let dense = c
        .layers
        .iter()
        .filter(|l| matches!(l.ffn, FfnDesc::Dense { .. }))
        .count();
    let mut ffn = format!("ffn: {act}, {dense} dense layers");
    if let Some(m) = &c.moe {
        let _ = write!(
            ffn,
            ", {} MoE layers ({} experts of width {}, {} used, {:?} gating{}{}{}{}, shared experts {})",
            n - dense,
            m.experts,
            m.expert_width,
            m.used,
            m.gating,
            if m.router_bias { ", router bias" } else { "" },
            if m.expert_biases { ", expert biases" } else { "" },
            if m.normalize { ", renormalised" } else { "" },
            if m.scale != 1.0 {
                format!(", scaled by {}", m.scale)
            } else {
                String::new()
            },
            m.shared_count
        );
        if m.router_input_scale {
            ffn.push_str(", the router on the normed residual times ffn_gate_inp.scale");
        }
        if m.shared_gate {
            ffn.push_str(", the shared expert times sigmoid(ffn_gate_inp_shexp . x)");
        }
        if m.expert_out_scale {
            ffn.push_str(", per-expert output scale");
        }
        if c.layers.iter().any(|l| {
            matches!(
                l.ffn,
                FfnDesc::Moe {
                    parallel_dense: Some(_),
                    ..
                }
            )
        }) {
            ffn.push_str(", a dense MLP beside the experts on MoE layers");
        }
    }
    out.push(ffn);
    let mut norms = format!(
        "norms: eps {}, {}",
        c.rms_eps,
        match c.norms {
            NormPlacement::Pre => "before attention and FFN",
            NormPlacement::PrePost => "before and after attention and FFN",
        }
    );
    if c.embed_scale != 1.0 {
        let _ = write!(norms, "; embeddings scaled by {}", c.embed_scale);
    }
    if let Some(cap) = c.logit_softcap {
        let _ = write!(norms, "; logits soft-capped at {cap}");
    }
    if c.ffn_norm_tensor != "ffn_norm" {
        let _ = write!(norms, "; the FFN norm is {}", c.ffn_norm_tensor);
    }
    out.push(norms);
    if !c.skipped_layers.is_empty() {
        let b: Vec<String> = c.skipped_layers.iter().map(|i| i.to_string()).collect();
        out.push(format!(
            "skipped: NextN/MTP blocks {} (their tensors are not read)",
            b.join(", ")
        ));
    }
    out
}

fn value_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) => array_json(a, usize::MAX),
    }
}

fn array_json(a: &Array, take: usize) -> serde_json::Value {
    let n = a.len().min(take);
    serde_json::Value::Array(
        (0..n)
            .filter_map(|i| a.get(i))
            .map(|v| value_json(&v))
            .collect(),
    )
}

fn json(
    f: &GgufFile,
    path: &std::path::Path,
    verdict: &Verdict<'_>,
    plan: &Option<(String, Vec<(Arm, StagingPlan)>)>,
) -> serde_json::Value {
    use serde_json::json;
    let mut meta = serde_json::Map::new();
    for (k, v) in f.metadata() {
        let entry = match v {
            Value::Array(a) if a.len() > JSON_ARRAY_FULL => json!({
                "type": v.type_name(),
                "len": a.len(),
                "truncated": true,
                "value": array_json(a, JSON_ARRAY_HEAD),
            }),
            Value::Array(a) => {
                json!({ "type": v.type_name(), "len": a.len(), "value": value_json(v) })
            }
            _ => json!({ "type": v.type_name(), "value": value_json(v) }),
        };
        meta.insert(k.to_string(), entry);
    }
    let tensors: Vec<_> = f
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "type": t.ty.name(), "dims": t.dims,
                "n_elements": t.n_elements, "n_bytes": t.n_bytes, "offset": t.start,
                "shard": t.shard,
            })
        })
        .collect();
    let mut types = serde_json::Map::new();
    for (ty, n, bytes) in per_type(f).values() {
        types.insert(
            ty.name().to_string(),
            json!({ "tensors": n, "bytes": bytes }),
        );
    }
    let total: u64 = f.tensors().iter().map(|t| t.n_bytes as u64).sum();
    let model = match (verdict.desc, &verdict.assembly) {
        (Ok(c), assembly) => {
            let mut m = json!({ "architecture": c.arch.name(), "valid": assembly.is_none(),
                                "description_valid": true, "block_count": c.n_layers(),
                                "context_length": c.context_length, "description": describe(c) });
            if let Some(e) = assembly {
                m["error"] = json!(e);
            }
            m
        }
        (Err(e), _) => {
            json!({ "valid": false, "description_valid": false, "error": e.to_string() })
        }
    };
    let mut out = json!({
        "file": path.display().to_string(),
        "version": f.version(),
        "file_bytes": f.len(),
        "alignment": f.alignment(),
        "data_offset": f.data_start(),
        "shards": f.shard_count(),
        "metadata": meta,
        "tensor_count": f.tensors().len(),
        "tensors": tensors,
        "bytes_per_type": types,
        "tensor_bytes": total,
        "model": model,
    });
    if let Some((dev, arms)) = plan {
        let arms_json: Vec<serde_json::Value> = arms.iter().map(|(arm, p)| json!({
            "device": dev,
            "arm": arm.key(),
            "resident_bytes": p.resident_bytes(),
            "expert_tier_bytes": p.expert_tier_bytes(),
            "streamed_bytes": p.streamed_bytes(),
            "weights": p.weights.iter().map(|w| json!({
                "name": w.name, "source_type": w.source_ty.name(), "staged_type": w.staged_ty.name(),
                "kept_quant": w.kept_quant, "tier": format!("{:?}", w.tier),
                "resident_bytes": w.resident_bytes, "streamed_bytes": w.streamed_bytes,
            })).collect::<Vec<_>>(),
        })).collect();
        out["staging"] = serde_json::Value::Array(arms_json);
    }
    out
}

/// One arm of the staging census.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Block encodings kept where the device admits them.
    KeepQuant,
    /// Every block encoding expanded (`FLINT_KEEP_QUANT=0`).
    Expanded,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Arm::KeepQuant => "keep-quant arm",
            Arm::Expanded => "expanded arm (FLINT_KEEP_QUANT=0)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Arm::KeepQuant => "keep_quant",
            Arm::Expanded => "expanded",
        }
    }
}

/// The device's placement plan for every tensor of the file (zero-copy descriptors),
/// with block encodings kept (`keep_quant`) or expanded.
fn staging_plan(f: &GgufFile, device: &str, keep_quant: bool) -> Result<StagingPlan, CliError> {
    let reg = crate::model::devices::registry();
    let mut opts = flint_hal::DeviceOptions::from_env()
        .map_err(|e| CliError::new(format!("cannot open device '{device}': {e}")))?;
    opts.keep_quant = keep_quant;
    let dev = reg
        .open(device, &opts)
        .map_err(|e| CliError::new(format!("cannot open device '{device}': {e}")))?;
    let mut descs = Vec::with_capacity(f.tensors().len());
    for t in f.tensors() {
        let kind = if t.dims.len() == 3 {
            WeightKind::ExpertTower
        } else if t.name == "token_embd.weight" {
            WeightKind::Embedding
        } else {
            WeightKind::Matrix
        };
        let src = f.tensor_bytes(t);
        let data = WeightSource::new(src.bytes, src.range)
            .map_err(|e| CliError::new(format!("tensor '{}': {e}", t.name)))?;
        descs.push(WeightDesc {
            name: t.name.clone(),
            ty: t.ty,
            dims: t.dims.clone(),
            kind,
            data,
        });
    }
    // Every tensor of the file is a desc here, norms and biases included.
    dev.plan(&descs, 0)
        .map_err(|e| CliError::new(format!("device '{device}' cannot plan this model: {e}")))
}
