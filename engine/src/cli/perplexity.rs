//! `flint perplexity`.

use clap::Args;

use super::CliError;

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

/// Runs `flint perplexity`.
pub fn run(_args: &PerplexityArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint perplexity` is not implemented in this build yet",
    ))
}
