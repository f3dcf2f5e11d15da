//! `flint logits`.

use clap::Args;

use super::CliError;

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

/// Runs `flint logits`.
pub fn run(_args: &LogitsArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint logits` is not implemented in this build yet",
    ))
}
