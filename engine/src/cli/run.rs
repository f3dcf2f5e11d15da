//! `flint run`.

use clap::Args;

use super::CliError;

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

/// Runs `flint run`.
pub fn run(_args: &RunArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint run` is not implemented in this build yet",
    ))
}
