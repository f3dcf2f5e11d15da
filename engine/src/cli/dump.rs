//! `flint dump`.

use clap::Args;

use super::CliError;

/// Arguments of `flint dump`.
#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    /// GGUF file.
    pub model: std::path::PathBuf,
    /// Tensor name.
    pub tensor: String,
    /// Write here instead of stdout.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Runs `flint dump`.
pub fn run(_args: &DumpArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint dump` is not implemented in this build yet",
    ))
}
