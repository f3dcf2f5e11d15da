//! `flint synth`.

use clap::Args;

use super::CliError;
use crate::synth::{param_count, write_synth, Preset};

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
pub fn run(args: &SynthArgs) -> Result<(), CliError> {
    let preset = Preset::from_name(&args.preset).ok_or_else(|| {
        CliError::new(format!(
            "unknown preset '{}': the presets are tiny and bench",
            args.preset
        ))
    })?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_message("tensors");
    let t0 = std::time::Instant::now();
    write_synth(preset, args.seed, &args.out, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(super::err)?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({} preset, seed {}, {:.1}M parameters) in {:.1}s",
        args.out.display(),
        args.preset,
        args.seed,
        param_count(preset) as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
