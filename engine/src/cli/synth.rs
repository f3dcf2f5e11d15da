//! `flint synth`.

use clap::Args;

use super::CliError;

/// Arguments of `flint synth`.
#[derive(Debug, Clone, Args)]
pub struct SynthArgs {
    /// Preset: tiny or bench.
    #[arg(long)]
    pub preset: String,
    /// Output file.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs `flint synth`.
pub fn run(_args: &SynthArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint synth` is not implemented in this build yet",
    ))
}
