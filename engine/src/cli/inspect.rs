//! `flint inspect`.

use clap::Args;

use super::CliError;

/// Arguments of `flint inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// GGUF file.
    pub model: std::path::PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print the staging census of this device.
    #[arg(long)]
    pub device: Option<String>,
}

/// Runs `flint inspect`.
pub fn run(_args: &InspectArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint inspect` is not implemented in this build yet",
    ))
}
