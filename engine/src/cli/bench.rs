//! `flint bench`.

use clap::Args;

use super::CliError;

/// Arguments of `flint bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Device backend [default: $FLINT_DEVICE, else cpu].
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `flint bench`.
pub fn run(_args: &BenchArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint bench` is not implemented in this build yet",
    ))
}
