//! `flint chat`: an interactive conversation in the terminal.
//!
//! Each turn renders the whole history with the model's chat template (as `flint run
//! --chat` does for one turn) and streams the answer to stdout; the prompt (`> `) and
//! notes go to stderr. The KV of the conversation stays in one [`Session`]: when the
//! new turn's tokens begin with every token already fed, only the rest is computed,
//! otherwise (the template re-tokenized an earlier answer differently) the session
//! starts over from the first token.
//!
//! Ctrl-C: the process keeps SIGINT for itself (a handler thread on unix). During an
//! answer it raises a flag that the generation callback reads before each token, so the
//! answer stops at the next token and the partial answer stays in the history; at the
//! prompt, the first Ctrl-C says how to quit and a second one in a row exits (status 0).

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use clap::Args;
use flint_loader::chat::{ChatMessage, ChatTemplate};
use flint_loader::tokenizer::StreamDecoder;

use super::{err, CliError};
use crate::forward::Session;
use crate::model::{load_on_device, resolve_path};
use crate::sample::{FinishReason, Sampler, StopConditions};
use crate::sched::{generate, Flow};

/// Arguments of `flint chat`.
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Most tokens of one answer.
    #[arg(short = 'n', long, default_value_t = 1024)]
    pub n: usize,
    /// Sampling.
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Sampling seed (the same seed and inputs give the same conversation).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A system message at the start of the conversation (kept by /reset).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Tokens the conversation may hold (capped at the model's context length).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Print each turn's templated prompt on stderr before the answer.
    #[arg(long)]
    pub verbose_prompt: bool,
    /// Device backend [default: $FLINT_DEVICE, else cpu].
    #[arg(long)]
    pub device: Option<String>,
}

/// What Ctrl-C does now: stop the answer, or count towards quitting at the prompt.
#[derive(Debug, Default)]
struct Interrupt {
    answering: AtomicBool,
    stop: AtomicBool,
    at_prompt: AtomicUsize,
}

impl Interrupt {
    /// An answer starts: Ctrl-C stops it.
    fn begin_answer(&self) {
        self.stop.store(false, Ordering::SeqCst);
        self.answering.store(true, Ordering::SeqCst);
    }

    /// The answer is over; true when Ctrl-C stopped it.
    fn end_answer(&self) -> bool {
        self.answering.store(false, Ordering::SeqCst);
        self.stop.swap(false, Ordering::SeqCst)
    }

    /// A line was entered: the count of Ctrl-Cs at the prompt starts again.
    fn line_entered(&self) {
        self.at_prompt.store(0, Ordering::SeqCst);
    }

    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// One SIGINT: during an answer, stop it; at the prompt, the first says how to
    /// quit, the second in a row exits.
    fn on_sigint(&self) {
        if self.answering.load(Ordering::SeqCst) {
            self.stop.store(true, Ordering::SeqCst);
        } else if self.at_prompt.fetch_add(1, Ordering::SeqCst) >= 1 {
            let _ = std::io::stdout().flush();
            eprintln!();
            std::process::exit(0);
        } else {
            eprint!("\n(Ctrl-C again, /exit or Ctrl-D to quit)\n> ");
        }
    }
}

/// Takes SIGINT away from its default action (ending the process) and hands each one
/// to [`Interrupt::on_sigint`] on a thread of its own. The handler is in place when this
/// returns.
#[cfg(unix)]
fn install_sigint(state: Arc<Interrupt>) -> Result<(), CliError> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(format!("starting the Ctrl-C handler: {e}")))?;
    let mut sig = rt
        .block_on(async { signal(SignalKind::interrupt()) })
        .map_err(|e| CliError::new(format!("installing the Ctrl-C handler: {e}")))?;
    std::thread::Builder::new()
        .name("flint-chat-sigint".into())
        .spawn(move || {
            rt.block_on(async move {
                while sig.recv().await.is_some() {
                    state.on_sigint();
                }
            })
        })
        .map_err(|e| CliError::new(format!("starting the Ctrl-C handler: {e}")))?;
    Ok(())
}

/// Elsewhere Ctrl-C keeps its default action.
#[cfg(not(unix))]
fn install_sigint(_state: Arc<Interrupt>) -> Result<(), CliError> {
    Ok(())
}

/// What a line typed at the prompt asks for.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Exit,
    Reset,
    Empty,
    Unknown(&'a str),
    Message(&'a str),
}

fn parse_input(line: &str) -> Input<'_> {
    let text = line.trim_end_matches(['\n', '\r']);
    match text.trim() {
        "" => Input::Empty,
        "/exit" | "/quit" => Input::Exit,
        "/reset" => Input::Reset,
        c if c.starts_with('/') && !c.contains(char::is_whitespace) => Input::Unknown(c),
        _ => Input::Message(text),
    }
}

/// Runs `flint chat` until `/exit`, end of input, or a second Ctrl-C at the prompt.
pub fn run(args: &ChatArgs) -> Result<(), CliError> {
    if args.n == 0 {
        return Err(CliError::Usage("-n must be at least 1".into()));
    }
    let path = resolve_path(args.model.model.as_deref())?;
    let lm = load_on_device(&path, args.device.as_deref(), true)?;
    let tok = &lm.tokenizer;
    let file = flint_loader::gguf::GgufFile::open(&path)
        .map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
    let template = ChatTemplate::from_gguf(&file, tok).map_err(err)?;
    let cap = args
        .ctx
        .clamp(2, lm.device_model.spec().context_length.max(2));
    let mut session = Session::new(&lm.device_model, cap)?;
    let cfg = args.sampling.config(args.seed);
    let stop = StopConditions {
        eog_ids: tok.eog_ids().collect(),
        stop_strings: Vec::new(),
    };
    let interrupt = Arc::new(Interrupt::default());
    install_sigint(interrupt.clone())?;

    let start: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let mut history = start.clone();
    let mut sampler = Sampler::new(cfg.clone());
    // The tokens in the session's KV, in order.
    let mut fed: Vec<u32> = Vec::new();
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    eprintln!(
        "flint chat: {name} on {} ({cap} tokens of context). /reset starts over, /exit or \
         Ctrl-D quits, Ctrl-C stops an answer.",
        lm.device_model.device().name()
    );
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    loop {
        eprint!("> ");
        let mut line = String::new();
        let n = input
            .read_line(&mut line)
            .map_err(|e| CliError::new(format!("reading stdin: {e}")))?;
        if n == 0 {
            eprintln!();
            return Ok(());
        }
        interrupt.line_entered();
        let text = match parse_input(&line) {
            Input::Exit => return Ok(()),
            Input::Empty => continue,
            Input::Reset => {
                history = start.clone();
                fed.clear();
                session.clear();
                sampler = Sampler::new(cfg.clone());
                eprintln!("(the conversation starts over)");
                continue;
            }
            Input::Unknown(c) => {
                eprintln!("unknown command {c}: /reset starts over, /exit quits");
                continue;
            }
            Input::Message(t) => t,
        };
        history.push(ChatMessage::new("user", text));
        let prompt_text = match template.render(&history, true) {
            Ok(p) => p,
            Err(e) => {
                history.pop();
                eprintln!("error: the chat template failed: {e}");
                continue;
            }
        };
        // The template writes BOS itself and its markers are special tokens.
        let tokens = tok.tokenize(&prompt_text, false, true);
        if tokens.len() >= cap {
            history.pop();
            eprintln!(
                "the conversation would hold {} tokens, more than the {cap} of --ctx; /reset \
                 starts over (or run with a larger --ctx)",
                tokens.len()
            );
            continue;
        }
        let reuse = !fed.is_empty() && tokens.len() > fed.len() && tokens.starts_with(&fed);
        if !reuse {
            session.clear();
            fed.clear();
        }
        let new = &tokens[fed.len()..];
        if args.verbose_prompt {
            eprintln!(
                "[prompt: {} tokens, {} of them already in the KV cache]\n{prompt_text}[end of prompt]",
                tokens.len(),
                fed.len()
            );
        }
        let max_new = args.n.min(cap - tokens.len());

        let mut dec = StreamDecoder::new();
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        let mut io_err: Option<std::io::Error> = None;
        interrupt.begin_answer();
        let generated = generate(&mut session, new, max_new, &mut sampler, &stop, &mut |id| {
            if interrupt.stop_requested() {
                return Flow::Stop;
            }
            let piece = dec.push(tok, id);
            answer.push_str(&piece);
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                io_err = Some(e);
                return Flow::Stop;
            }
            Flow::Continue
        });
        let stopped = interrupt.end_answer();
        let g = match generated {
            Ok(g) => g,
            Err(e) => {
                // The session's KV is in an unknown state: the next turn starts over.
                session.clear();
                return Err(e.into());
            }
        };
        if !stopped {
            let rest = dec.finish();
            answer.push_str(&rest);
            let _ = out.write_all(rest.as_bytes());
        }
        let _ = out.write_all(b"\n");
        let _ = out.flush();
        drop(out);
        if let Some(e) = io_err {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(CliError::new(format!("writing to stdout: {e}")));
        }
        // Every generated token but the last went through the session; the last too
        // when an end-of-generation token followed it.
        fed.extend_from_slice(new);
        let in_kv = match g.finish {
            FinishReason::Eos => g.tokens.len(),
            _ => g.tokens.len().saturating_sub(1),
        };
        fed.extend_from_slice(&g.tokens[..in_kv]);
        if stopped {
            eprintln!("(answer stopped)");
        }
        history.push(ChatMessage::new("assistant", answer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_messages_are_told_apart() {
        assert_eq!(parse_input("/exit\n"), Input::Exit);
        assert_eq!(parse_input("  /reset \r\n"), Input::Reset);
        assert_eq!(parse_input("\n"), Input::Empty);
        assert_eq!(parse_input("/help\n"), Input::Unknown("/help"));
        assert_eq!(
            parse_input("/ is a path separator\n"),
            Input::Message("/ is a path separator")
        );
        assert_eq!(parse_input("Hello there\n"), Input::Message("Hello there"));
    }

    #[test]
    fn ctrl_c_stops_an_answer_and_the_flag_is_cleared_for_the_next() {
        let i = Interrupt::default();
        i.begin_answer();
        assert!(!i.stop_requested());
        i.on_sigint();
        assert!(i.stop_requested());
        assert!(i.end_answer());
        i.begin_answer();
        assert!(!i.stop_requested());
        assert!(!i.end_answer());
        // At the prompt the first Ctrl-C only counts (a second would exit the process,
        // which the chat_cli integration test checks).
        i.on_sigint();
        assert_eq!(i.at_prompt.load(Ordering::SeqCst), 1);
        i.line_entered();
        assert_eq!(i.at_prompt.load(Ordering::SeqCst), 0);
    }
}
