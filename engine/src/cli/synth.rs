//! `flint synth`.

use clap::Args;

use super::CliError;
use crate::synth::dense::{dense_file, DenseRecipe, Family, VocabSource};
use crate::synth::gemma4::{gemma4_file, Gemma4Recipe};
use crate::synth::moe::{moe_file, MoeFamily, MoeRecipe};
use crate::synth::qwen35moe::{qwen35moe_file, Qwen35MoeRecipe};
use crate::synth::{param_count, write_synth, Preset};

/// Arguments of `flint synth`.
#[derive(Debug, Clone, Args)]
pub struct SynthArgs {
    /// Architecture: flint, llama, qwen2, qwen3, gemma3, qwen3moe, glm4moe, mimo2, gpt-oss,
    /// gemma4 or qwen35moe.
    #[arg(long, default_value = "flint")]
    pub arch: String,
    /// Preset: tiny or bench (gemma3 also tiny-4b and tiny-27b; glm4moe and mimo2
    /// tiny-nextn; qwen3moe tiny-bias and full; gemma4 tiny-e2b).
    #[arg(long)]
    pub preset: String,
    /// Output file.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A GGUF file whose tokenizer the checkpoint copies (llama.cpp families), cut to
    /// --vocab-size ordinary tokens plus every special token.
    #[arg(long)]
    pub vocab: Option<std::path::PathBuf>,
    /// Ordinary tokens kept from --vocab (default 8192).
    #[arg(long, requires = "vocab")]
    pub vocab_size: Option<usize>,
}

/// Ordinary tokens kept from `--vocab` when `--vocab-size` is not given.
pub const DEFAULT_VOCAB_SIZE: usize = 8192;

/// Runs `flint synth`.
pub fn run(args: &SynthArgs) -> Result<(), CliError> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_message("tensors");
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let t0 = std::time::Instant::now();
    let params = if args.arch == "flint" {
        if args.vocab.is_some() {
            return Err(CliError::new(
                "--vocab applies to the llama.cpp families (llama, qwen2, qwen3, gemma3, qwen3moe, glm4moe, mimo2, gpt-oss, gemma4, qwen35moe), not flint",
            ));
        }
        let preset = Preset::from_name(&args.preset).ok_or_else(|| {
            CliError::new(format!(
                "unknown preset '{}' for flint: the presets are tiny and bench",
                args.preset
            ))
        })?;
        write_synth(preset, args.seed, &args.out, &progress).map_err(super::err)?;
        param_count(preset)
    } else {
        enum Recipe {
            Dense(DenseRecipe),
            Moe(MoeRecipe),
            Gemma4(Gemma4Recipe),
            Qwen35Moe(Qwen35MoeRecipe),
        }
        let unknown_preset = |presets: &[&str]| {
            CliError::new(format!(
                "unknown preset '{}' for {}: the presets are {}",
                args.preset,
                args.arch,
                presets.join(", ")
            ))
        };
        let recipe = if let Some(family) = Family::from_name(&args.arch) {
            Recipe::Dense(
                DenseRecipe::of(family, &args.preset)
                    .ok_or_else(|| unknown_preset(family.presets()))?,
            )
        } else if let Some(family) = MoeFamily::from_name(&args.arch) {
            Recipe::Moe(
                MoeRecipe::of(family, &args.preset)
                    .ok_or_else(|| unknown_preset(family.presets()))?,
            )
        } else if args.arch == "gemma4" {
            Recipe::Gemma4(
                Gemma4Recipe::of(&args.preset)
                    .ok_or_else(|| unknown_preset(&Gemma4Recipe::PRESETS))?,
            )
        } else if args.arch == "qwen35moe" {
            Recipe::Qwen35Moe(
                Qwen35MoeRecipe::of(&args.preset)
                    .ok_or_else(|| unknown_preset(&Qwen35MoeRecipe::PRESETS))?,
            )
        } else {
            return Err(CliError::new(format!(
                "unknown architecture '{}': flint synth writes flint, llama, qwen2, qwen3, gemma3, qwen3moe, glm4moe, mimo2, gpt-oss, gemma4 and qwen35moe",
                args.arch
            )));
        };
        let vocab_size = args.vocab_size.unwrap_or(DEFAULT_VOCAB_SIZE);
        if vocab_size == 0 {
            return Err(CliError::new("--vocab-size must be at least 1"));
        }
        let vocab_file = match &args.vocab {
            Some(p) => Some(flint_loader::gguf::GgufFile::open(p).map_err(|e| {
                CliError::new(format!("reading the vocabulary {}: {e}", p.display()))
            })?),
            None => None,
        };
        let source = match &vocab_file {
            Some(f) => VocabSource::File(f, vocab_size),
            None => VocabSource::Builtin,
        };
        let file = match &recipe {
            Recipe::Dense(r) => dense_file(r, args.seed, source),
            Recipe::Moe(r) => moe_file(r, args.seed, source),
            Recipe::Gemma4(r) => gemma4_file(r, args.seed, source),
            Recipe::Qwen35Moe(r) => qwen35moe_file(r, args.seed, source),
        }
        .map_err(super::err)?;
        // Streamed to disk a few tensors at a time: the full-size presets are larger
        // than memory. Progress in bytes: a bar on a terminal, else a line per 5%.
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} {wide_bar} {bytes}/{total_bytes} ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("writing {}", args.out.display()));
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let last_step = std::sync::atomic::AtomicU64::new(0);
        let bytes_progress = |done: u64, total: u64| {
            bar.set_length(total);
            bar.set_position(done);
            let step = (done * 20).checked_div(total).unwrap_or(0);
            if !tty && step > last_step.swap(step, std::sync::atomic::Ordering::Relaxed) {
                eprintln!(
                    "synth: {:.2} of {:.2} GB ({}%) in {:.0}s",
                    done as f64 / 1e9,
                    total as f64 / 1e9,
                    step * 5,
                    t0.elapsed().as_secs_f64()
                );
            }
        };
        file.write(&args.out, &bytes_progress).map_err(super::err)?
    };
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({} {} preset, seed {}, {:.1}M parameters) in {:.1}s",
        args.out.display(),
        args.arch,
        args.preset,
        args.seed,
        params as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
