//! `flint perplexity`.

use clap::Args;

use super::CliError;
use crate::forward::{profile, Batch, BatchSeq, RecurrentStates, Session};
use crate::kv::GroupKind;
use crate::model::{load_on_device, resolve_path};

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
    /// Tokens per batch, as llama-perplexity's `-b`: `batch / ctx` chunks (at least one)
    /// go through the model together.
    #[arg(short = 'b', long, default_value_t = 2048)]
    pub batch: usize,
}

/// Runs `flint perplexity` as llama.cpp's `llama-perplexity` does: the tokens cut into
/// chunks of `--ctx`, each chunk starting with BOS (replacing its first token) when the
/// model adds one, and the second half of every chunk scored (so every scored token has
/// at least `ctx/2` tokens of context). Prints the perplexity on stdout.
///
/// As llama-perplexity, `--batch / --ctx` chunks run as sequences of one batch, and
/// logits are computed only for the scored half: each group of chunks is two steps, the
/// first halves without logits, then the second halves with every row's. Each token's
/// negative log-likelihood is llama.cpp's `log_softmax` (f32 `expf` summed in f64), the
/// rows scored on every core.
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
    let t_load = std::time::Instant::now();
    let lm = load_on_device(&path, None, true)?;
    let load_s = t_load.elapsed().as_secs_f64();
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
    let dm = &lm.device_model;
    let vocab = dm.spec().vocab;
    let n_seq = (args.batch / ctx).clamp(1, n_chunks);
    let first = ctx / 2;
    // One KV region per sequence of the batch; a Gated DeltaNet model's states, one
    // slot per sequence (its block in the recurrent group).
    let bs = Session::BLOCK_SIZE;
    let per_seq = ctx.div_ceil(bs);
    let mut kv = dm.alloc_kv(n_seq * per_seq, bs)?;
    let mut states = RecurrentStates::new(dm.spec(), n_seq);
    let tables: Vec<Vec<u32>> = (0..n_seq)
        .map(|s| (s * per_seq..(s + 1) * per_seq).map(|b| b as u32).collect())
        .collect();
    let slots: Vec<[u32; 1]> = (0..n_seq).map(|s| [s as u32]).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "perplexity: {n_chunks} chunks of {ctx} tokens, {n_seq} per batch of {} tokens \
         (model loaded in {load_s:.2}s)",
        n_seq * ctx
    );
    let (mut nll, mut count) = (0.0f64, 0usize);
    let t0 = std::time::Instant::now();
    for c0 in (0..n_chunks).step_by(n_seq) {
        let k = n_seq.min(n_chunks - c0);
        let chunks: Vec<Vec<u32>> = (c0..c0 + k)
            .map(|c| {
                let mut chunk = ids[c * ctx..(c + 1) * ctx].to_vec();
                if let (true, Some(b)) = (tok.add_bos(), tok.bos()) {
                    chunk[0] = b;
                }
                chunk
            })
            .collect();
        let batch = |part: std::ops::Range<usize>, all_logits: bool| Batch {
            seqs: (0..k)
                .map(|s| BatchSeq {
                    tokens: &chunks[s][part.clone()],
                    start_pos: part.start as u32,
                    block_tables: dm
                        .kv_groups()
                        .iter()
                        .map(|g| match g.kind {
                            GroupKind::Recurrent => &slots[s][..],
                            _ => tables[s].as_slice(),
                        })
                        .collect(),
                    all_logits,
                })
                .collect(),
            block_size: bs,
        };
        if first > 0 {
            dm.forward(&mut kv, &mut states, &batch(0..first, false))?;
        }
        let logits = dm.forward(&mut kv, &mut states, &batch(first..ctx, true))?;
        // Row `j` of sequence `s` is position `first + j`; it predicts the next token.
        let rows = ctx - first;
        let scored: Vec<(usize, usize)> = (0..k)
            .flat_map(|s| (0..rows - 1).map(move |j| (s, j)))
            .collect();
        let per_row = score_rows(&scored, threads, |&(s, j)| {
            let row = &logits[(s * rows + j) * vocab..][..vocab];
            nll_of(row, chunks[s][first + j + 1] as usize)
        });
        nll += per_row.iter().sum::<f64>();
        count += per_row.len();
        eprintln!(
            "chunk {}/{n_chunks}: running perplexity {:.4}",
            c0 + k,
            (nll / count as f64).exp()
        );
    }
    let ppl = (nll / count as f64).exp();
    println!("{ppl:.4}");
    eprintln!(
        "{count} tokens scored in {n_chunks} chunks of {ctx}; {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    if let Some(t) = profile::take_report("perplexity") {
        eprint!("{t}");
    }
    Ok(())
}

/// `f(item)` for every item, on `threads` scoped threads over contiguous parts; the
/// results in the items' order.
fn score_rows<T: Sync>(items: &[T], threads: usize, f: impl Fn(&T) -> f64 + Sync) -> Vec<f64> {
    let part = items.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|sc| {
        let handles: Vec<_> = items
            .chunks(part)
            .map(|c| sc.spawn(|| c.iter().map(&f).collect::<Vec<f64>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The negative log-likelihood of `tok` under `row`'s softmax, as llama.cpp's
/// `log_softmax` (tools/perplexity): the maximum subtracted, `expf` of each logit summed
/// in f64.
fn nll_of(row: &[f32], tok: usize) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| f64::from((l - m).exp())).sum();
    sum.ln() - f64::from(row[tok] - m)
}
