//! `flint perplexity`.

use clap::Args;
use rayon::prelude::*;

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
/// negative log-likelihood is llama.cpp's `log_softmax` (f32 exponentials summed in f64;
/// [`nll_of`]), the rows scored on every core.
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
    let mut states = RecurrentStates::new(dm, n_seq)?;
    let tables: Vec<Vec<u32>> = (0..n_seq)
        .map(|s| (s * per_seq..(s + 1) * per_seq).map(|b| b as u32).collect())
        .collect();
    let slots: Vec<[u32; 1]> = (0..n_seq).map(|s| [s as u32]).collect();
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
        let per_row: Vec<f64> = scored
            .par_iter()
            .map(|&(s, j)| {
                let row = &logits[(s * rows + j) * vocab..][..vocab];
                nll_of(row, chunks[s][first + j + 1] as usize)
            })
            .collect();
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

/// The negative log-likelihood of `tok` under `row`'s softmax: llama.cpp's
/// `log_softmax` (tools/perplexity: the maximum subtracted, each logit's exponential
/// summed in f64), with the exponentials of [`exp_lanes`] in place of `expf` calls.
fn nll_of(row: &[f32], tok: usize) -> f64 {
    const L: usize = 16;
    let mut mx = [f32::NEG_INFINITY; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for (m, &v) in mx.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let m = chunks
        .remainder()
        .iter()
        .chain(&mx)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let mut acc = [0.0f64; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        let mut x = [0.0f32; L];
        for (x, &v) in x.iter_mut().zip(c) {
            *x = v - m;
        }
        for (a, e) in acc.iter_mut().zip(exp_lanes(x)) {
            *a += f64::from(e);
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| f64::from((v - m).exp()))
        .sum();
    let sum = acc.iter().sum::<f64>() + tail;
    sum.ln() - f64::from(row[tok] - m)
}

/// `exp(x)` for 16 values at most 0 (logits less their maximum), in a form the compiler
/// vectorizes: `x / ln 2 = n + f` with `n` an integer and `|f| <= 1/2`, `2^f` by its
/// degree-6 Taylor polynomial in `f ln 2` (relative error below 2e-7, as `expf`'s last
/// bit), `2^n` built in the exponent bits; below -87 (where `expf` is subnormal or 0)
/// the result is 0.
fn exp_lanes(x: [f32; 16]) -> [f32; 16] {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for |n| < 2^8.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let mut out = [0.0f32; 16];
    for (o, &v) in out.iter_mut().zip(&x) {
        let v = v.max(-87.0);
        // Round to nearest by adding and taking away 1.5 * 2^23 (`round` is a libm call
        // without SSE4.1, and would stop the vectorization).
        let n = (v * LOG2E + 12_582_912.0) - 12_582_912.0;
        let r = (v - n * LN2_HI) - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        *o = if v > -87.0 { p * scale } else { 0.0 };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_lanes_is_expf_to_its_last_bits() {
        let mut worst = 0.0f64;
        for i in 0..=100_000u32 {
            let x = -90.0 * i as f32 / 100_000.0;
            let want = f64::from(x.exp());
            let got = f64::from(exp_lanes([x; 16])[0]);
            if x > -87.0 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                assert!(got == 0.0 && want < 2e-38, "{x}: {got} against {want}");
            }
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn nll_is_llamacpps_log_softmax() {
        // llama.cpp's formula with expf calls, in f64.
        let row: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        for tok in [0, 17, 999] {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&l| f64::from((l - m).exp())).sum();
            let want = sum.ln() - f64::from(row[tok] - m);
            let got = nll_of(&row, tok);
            assert!((got - want).abs() < 1e-6, "{tok}: {got} against {want}");
        }
    }
}
