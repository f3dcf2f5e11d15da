//! `flint logits`.

use clap::Args;

use std::io::Write;

use super::CliError;
use crate::forward::{DeviceModel, Session};
use crate::model::{load_on_device, resolve_path, ModelError};
use crate::sched::PREFILL_CHUNK;

/// Arguments of `flint logits`.
#[derive(Debug, Clone, Args)]
pub struct LogitsArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Text file to score.
    #[arg(long, value_name = "F")]
    pub text_file: std::path::PathBuf,
    /// Entries per position.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `flint logits`: teacher-forced over the file's tokens (BOS first), per position
/// the top K `[id, logit]` and the log-sum-exp of all logits, as in `shared/golden`.
pub fn run(args: &LogitsArgs) -> Result<(), CliError> {
    let text = std::fs::read_to_string(&args.text_file)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", args.text_file.display())))?;
    let path = resolve_path(args.model.model.as_deref())?;
    let lm = load_on_device(&path, None, true)?;
    let ids = lm.tokenizer.tokenize(&text, true, false);
    if ids.is_empty() {
        return Err(CliError::new("the text has no tokens"));
    }
    let rows = teacher_forced_logits(&lm.device_model, &ids, args.top)?;
    let mut out = std::io::stdout().lock();
    let w = |e: std::io::Error| CliError::new(format!("writing to stdout: {e}"));
    if args.json {
        let positions: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({ "lse": r.lse, "top": r.top.iter().map(|&(i, l)| serde_json::json!([i, l])).collect::<Vec<_>>() }))
            .collect();
        let v = serde_json::json!({ "ids": ids, "positions": positions });
        writeln!(out, "{v}").map_err(w)?;
    } else {
        for (p, r) in rows.iter().enumerate() {
            let top: Vec<String> = r.top.iter().map(|(i, l)| format!("{i}:{l:.4}")).collect();
            writeln!(out, "{p}\t{}\tlse={:.4}\t{}", ids[p], r.lse, top.join(" ")).map_err(w)?;
        }
    }
    Ok(())
}

/// One position of [`teacher_forced_logits`].
#[derive(Clone, Debug, PartialEq)]
pub struct PositionLogits {
    /// Log-sum-exp of all logits.
    pub lse: f32,
    /// The best `(id, logit)` pairs, best first.
    pub top: Vec<(u32, f32)>,
}

/// Top-`k` logits and log-sum-exp at every position of `ids`, fed in chunks on the device
/// forward.
pub fn teacher_forced_logits(
    dm: &DeviceModel,
    ids: &[u32],
    k: usize,
) -> Result<Vec<PositionLogits>, ModelError> {
    let vocab = dm.spec().vocab;
    let mut s = Session::new(dm, ids.len())?;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(PREFILL_CHUNK) {
        let logits = s.feed(chunk, true)?;
        for row in logits.chunks(vocab) {
            out.push(summarise(row, k));
        }
    }
    Ok(out)
}

/// Log-sum-exp and top-`k` of one row of logits.
pub fn summarise(row: &[f32], k: usize) -> PositionLogits {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| ((l - m) as f64).exp()).sum();
    let lse = m + sum.ln() as f32;
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    if k > 0 {
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
        });
    }
    idx.truncate(k);
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    PositionLogits {
        lse,
        top: idx.into_iter().map(|i| (i, row[i as usize])).collect(),
    }
}
