//! `flint serve`.

use clap::Args;

use super::CliError;

/// Arguments of `flint serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Device backend [default: $FLINT_DEVICE, else cpu].
    #[arg(long)]
    pub device: Option<String>,
    /// Most sequences batched in one step.
    #[arg(long, default_value_t = 16)]
    pub max_num_seqs: usize,
    /// Bytes of KV cache.
    #[arg(long)]
    pub kv_memory: Option<u64>,
}

/// Runs `flint serve`.
pub fn run(_args: &ServeArgs) -> Result<(), CliError> {
    Err(CliError::new(
        "`flint serve` is not implemented in this build yet",
    ))
}
