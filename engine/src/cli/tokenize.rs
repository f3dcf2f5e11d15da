//! `flint tokenize`.

use clap::Args;

use super::CliError;

/// Arguments of `flint tokenize`.
#[derive(Debug, Clone, Args)]
pub struct TokenizeArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Text to tokenize.
    pub text: String,
    /// Prepend BOS.
    #[arg(long)]
    pub bos: bool,
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
}

/// Runs `flint tokenize`.
pub fn run(_args: &TokenizeArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint tokenize` is not implemented in this build yet",
    ))
}
