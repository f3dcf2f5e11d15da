//! The `flint` command line (contract: `shared/spec/CLI.md`).
//!
//! Each subcommand lives in its own module with a `run` function. Results go to stdout;
//! progress, stats and warnings to stderr. Exit status: 0 success, 1 runtime failure
//! (a [`CliError`] printed as one paragraph), 2 bad usage (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod bench;
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

/// A runtime failure of a subcommand: printed on stderr as `error: {message}`, exit 1.
#[derive(Debug)]
pub struct CliError {
    /// One paragraph: what was wrong and, where possible, what to do.
    pub message: String,
}

impl CliError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// Anything displayable becomes a CLI error with its message.
pub fn err(e: impl std::fmt::Display) -> CliError {
    CliError::new(e.to_string())
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

/// Runs the parsed command line.
pub fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(a) => run::run(&a),
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
