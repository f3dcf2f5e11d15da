//! `flint run`.

use clap::Args;

use std::io::Write;

use flint_loader::tokenizer::StreamDecoder;

use super::{err, CliError};
use crate::forward::Session;
use crate::model::{load_on_device, resolve_path};
use crate::sample::{Sampler, StopConditions};
use crate::sched::{generate, Flow};

/// Arguments of `flint run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long, value_name = "F")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n: usize,
    /// Sampling.
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Device backend [default: $FLINT_DEVICE, else cpu].
    #[arg(long)]
    pub device: Option<String>,
}

/// Runs `flint run`: generated text only on stdout, streamed; progress and a stats
/// line (load time, prompt tok/s, generation tok/s) on stderr.
pub fn run(args: &RunArgs) -> Result<(), CliError> {
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| CliError::new(format!("cannot read prompt file {}: {e}", f.display())))?,
        (Some(_), Some(_)) => {
            return Err(CliError::new(
                "give the prompt either with -p or with --prompt-file, not both",
            ))
        }
        (None, None) => {
            return Err(CliError::new(
                "no prompt: give one with -p TEXT or --prompt-file FILE",
            ))
        }
    };
    let path = resolve_path(args.model.model.as_deref())?;
    let lm = load_on_device(&path, args.device.as_deref(), true)?;
    let tok = &lm.tokenizer;
    let prompt_text = if args.chat {
        let file = flint_loader::gguf::GgufFile::open(&path).map_err(err)?;
        chat_prompt(&file, tok, &text)?
    } else {
        text
    };
    // With --chat the template writes BOS itself and its markers are special tokens.
    let prompt = if args.chat {
        tok.tokenize(&prompt_text, false, true)
    } else {
        tok.tokenize(&prompt_text, true, false)
    };
    let max_len = prompt.len() + args.n + 1;
    let mut session = Session::new(&lm.device_model, max_len)?;
    let cfg = args.sampling.config(args.seed);
    let mut sampler = Sampler::new(cfg);
    let stop = StopConditions {
        eog_ids: tok.eog_ids().collect(),
        stop_strings: Vec::new(),
    };
    let mut dec = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    let mut io_err: Option<std::io::Error> = None;
    let g = generate(
        &mut session,
        &prompt,
        args.n,
        &mut sampler,
        &stop,
        &mut |id| {
            let piece = dec.push(tok, id);
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                io_err = Some(e);
                return Flow::Stop;
            }
            Flow::Continue
        },
    )?;
    let rest = dec.finish();
    let _ = out.write_all(rest.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
    if let Some(e) = io_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(CliError::new(format!("writing to stdout: {e}")));
        }
    }
    let s = g.stats;
    eprintln!(
        "load {:.2}s | prompt {} tok, {:.1} tok/s | generation {} tok, {:.1} tok/s | device {}",
        lm.load_time.as_secs_f64(),
        s.prompt_tokens,
        s.prompt_tok_s(),
        s.generated,
        s.gen_tok_s(),
        lm.device_model.device().name()
    );
    if let Some(t) = crate::forward::profile::take_report("run (prompt and generation)") {
        eprint!("{t}");
    }
    Ok(())
}

/// The user's text wrapped in the model's chat template (one user turn, the assistant
/// turn opened).
fn chat_prompt(
    file: &flint_loader::gguf::GgufFile,
    tok: &flint_loader::tokenizer::Tokenizer,
    text: &str,
) -> Result<String, CliError> {
    use flint_loader::chat::{ChatMessage, ChatTemplate};
    let t = ChatTemplate::from_gguf(file, tok).map_err(err)?;
    t.render(&[ChatMessage::new("user", text)], true)
        .map_err(err)
}
