//! `flint perplexity`.

use clap::Args;

use super::CliError;
use crate::forward::Session;
use crate::model::{load_on_device, resolve_path};
use crate::sched::PREFILL_CHUNK;

/// Arguments of `flint perplexity`.
#[derive(Debug, Clone, Args)]
pub struct PerplexityArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Text file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: std::path::PathBuf,
    /// Context length per chunk.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
}

/// Runs `flint perplexity` as llama.cpp's `llama-perplexity` does: the tokens cut into
/// chunks of `--ctx`, each chunk starting with BOS (replacing its first token) when the
/// model adds one, and the second half of every chunk scored (so every scored token has
/// at least `ctx/2` tokens of context). Prints the perplexity on stdout.
pub fn run(args: &PerplexityArgs) -> Result<(), CliError> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", args.file.display())))?;
    if args.ctx < 4 {
        return Err(CliError::new(format!(
            "--ctx {} is too small (at least 4)",
            args.ctx
        )));
    }
    let path = resolve_path(args.model.model.as_deref())?;
    let lm = load_on_device(&path, None, true)?;
    let tok = &lm.tokenizer;
    let ids = tok.tokenize(&text, false, false);
    let ctx = args.ctx.min(lm.model.spec.context_length);
    let n_chunks = ids.len() / ctx;
    if n_chunks == 0 {
        return Err(CliError::new(format!(
            "the file has {} tokens, fewer than one chunk of --ctx {ctx}",
            ids.len()
        )));
    }
    let vocab = lm.model.spec.vocab;
    let mut s = Session::new(&lm.device_model, ctx)?;
    let (mut nll, mut count) = (0.0f64, 0usize);
    let t0 = std::time::Instant::now();
    for c in 0..n_chunks {
        let mut chunk = ids[c * ctx..(c + 1) * ctx].to_vec();
        if tok.add_bos() {
            if let Some(b) = tok.bos() {
                chunk[0] = b;
            }
        }
        s.clear();
        let mut logits = Vec::with_capacity(ctx * vocab);
        for part in chunk.chunks(PREFILL_CHUNK) {
            logits.extend(s.feed(part, true)?);
        }
        for i in ctx / 2..ctx - 1 {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = m as f64
                + row
                    .iter()
                    .map(|&l| ((l - m) as f64).exp())
                    .sum::<f64>()
                    .ln();
            nll += lse - row[chunk[i + 1] as usize] as f64;
            count += 1;
        }
        eprintln!(
            "chunk {}/{n_chunks}: running perplexity {:.4}",
            c + 1,
            (nll / count as f64).exp()
        );
    }
    let ppl = (nll / count as f64).exp();
    println!("{ppl:.4}");
    eprintln!(
        "{count} tokens scored in {n_chunks} chunks of {ctx}; {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
