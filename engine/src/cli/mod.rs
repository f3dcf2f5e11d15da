//! The `flint` command line (contract: `shared/spec/CLI.md`).
//!
//! Each subcommand lives in its own module with a `run` function. Results go to stdout;
//! progress, stats and warnings to stderr. Exit status: 0 success, 1 runtime failure,
//! 2 bad usage (clap's, or a [`CliError::Usage`]); [`CliError`] maps every failure to its
//! message and exit status in one place. Nothing outside `cli` imports it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::model::ModelError;
use crate::sample::SamplerConfig;
use crate::sched::EngineError;

pub mod bench;
pub mod chat;
pub mod devices;
pub mod dump;
pub mod inspect;
pub mod logging;
pub mod logits;
pub mod model_path;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;

/// A failure of a subcommand: printed on stderr as `error: {message}`, one paragraph
/// that says what was wrong and, where possible, what to do; the process exits with
/// [`CliError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The model could not be loaded or run.
    #[error("{0}")]
    Model(#[from] ModelError),
    /// The engine failed while serving requests.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The command line asks for something it cannot (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Any other runtime failure (a file that cannot be read or written, a port that
    /// cannot be bound).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// A runtime failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self::Failed(message.into())
    }

    /// The exit status: 2 for bad usage, 1 for every runtime failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Model(_) | Self::Engine(_) | Self::Failed(_) => 1,
        }
    }
}

/// Anything displayable becomes a CLI error with its message.
pub fn err(e: impl std::fmt::Display) -> CliError {
    CliError::new(e.to_string())
}

/// Writes a command's whole output to stdout. A reader that closes the pipe early
/// (`flint devices | head -1`) is not an error; any other write failure is.
pub fn write_stdout(out: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(format!("cannot write to stdout: {e}"))),
    }
}

/// Flint: an LLM inference engine for quantized Mixture-of-Experts models in GGUF.
#[derive(Debug, Parser)]
#[command(name = "flint", version, about, long_about = None)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Every subcommand of `flint`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text from a prompt (streamed to stdout).
    Run(run::RunArgs),
    /// Chat with the model in the terminal (its chat template, history, streaming).
    Chat(chat::ChatArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Measure prefill, decode and aggregate throughput.
    Bench(bench::BenchArgs),
    /// Print a GGUF file's metadata, tensors and bytes per type.
    Inspect(inspect::InspectArgs),
    /// Write one tensor dequantized to little-endian f32.
    Dump(dump::DumpArgs),
    /// Print the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Teacher-forced top-K logits per position.
    Logits(logits::LogitsArgs),
    /// Perplexity of a model over a text file.
    Perplexity(perplexity::PerplexityArgs),
    /// Write a synthetic Flint checkpoint.
    Synth(synth::SynthArgs),
    /// List the registered device backends and whether each is available.
    Devices(devices::DevicesArgs),
}

/// The model flag shared by the subcommands that load a model.
#[derive(Debug, Clone, Args)]
pub struct ModelArg {
    /// GGUF model file [default: $FLINT_MODEL, else the default model, fetched on first use]
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<PathBuf>,
}

/// The sampling flags of `flint run` and `flint chat` (the seed is each command's own).
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top probability (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
}

impl SamplingArgs {
    /// The sampler these flags ask for, with `seed`.
    pub fn config(&self, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed,
            ..SamplerConfig::greedy()
        }
    }
}

/// Runs the parsed command line.
pub fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(a) => run::run(&a),
        Command::Chat(a) => chat::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Dump(a) => dump::run(&a),
        Command::Tokenize(a) => tokenize::run(&a),
        Command::Logits(a) => logits::run(&a),
        Command::Perplexity(a) => perplexity::run(&a),
        Command::Synth(a) => synth::run(&a),
        Command::Devices(a) => devices::run(&a),
    }
}

#[cfg(test)]
mod tests {
    use flint_hal::{HalError, HalErrorKind};

    use super::*;

    #[test]
    fn usage_exits_2_and_every_runtime_failure_1() {
        assert_eq!(CliError::Usage("--ctx 0".into()).exit_code(), 2);
        assert_eq!(CliError::new("cannot read f.txt").exit_code(), 1);
        let model = ModelError::from(HalError::out_of_memory("KV pool"));
        assert_eq!(CliError::from(model).exit_code(), 1);
        let engine = EngineError::from(ModelError::new("bad token"));
        assert_eq!(CliError::from(engine).exit_code(), 1);
    }

    #[test]
    fn a_device_error_keeps_its_kind_and_message_up_to_the_cli() {
        let staged = ModelError::Device {
            context: "staging 'blk.0.attn_q.weight' on tt".into(),
            source: HalError::out_of_memory("DRAM budget"),
        };
        let e = CliError::from(EngineError::from(staged));
        let CliError::Engine(EngineError::Model(m)) = &e else {
            panic!("not an engine error: {e:?}");
        };
        assert_eq!(m.hal_kind(), Some(HalErrorKind::OutOfMemory));
        assert_eq!(
            e.to_string(),
            "forward failed: staging 'blk.0.attn_q.weight' on tt: out of memory: DRAM budget"
        );
        assert_eq!(ModelError::new("no such tensor").hal_kind(), None);
    }
}
