//! `flint synth`.

use clap::Args;

use super::CliError;
use crate::synth::dense::{synth_dense, DenseRecipe, Family, VocabSource};
use crate::synth::gemma4::{synth_gemma4, Gemma4Recipe};
use crate::synth::moe::{synth_moe, MoeFamily, MoeRecipe};
use crate::synth::qwen35moe::{synth_qwen35moe, Qwen35MoeRecipe};
use crate::synth::{param_count, write_file, write_synth, Preset};

/// Arguments of `flint synth`.
#[derive(Debug, Clone, Args)]
pub struct SynthArgs {
    /// Architecture: flint, llama, qwen2, qwen3, gemma3, qwen3moe, glm4moe, mimo2, gpt-oss,
    /// gemma4 or qwen35moe.
    #[arg(long, default_value = "flint")]
    pub arch: String,
    /// Preset: tiny or bench (gemma3 also tiny-4b and tiny-27b; glm4moe and mimo2
    /// tiny-nextn; qwen3moe tiny-bias; gemma4 tiny-e2b).
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
        let (w, params) = match &recipe {
            Recipe::Dense(r) => synth_dense(r, args.seed, source, &progress),
            Recipe::Moe(r) => synth_moe(r, args.seed, source, &progress),
            Recipe::Gemma4(r) => synth_gemma4(r, args.seed, source, &progress),
            Recipe::Qwen35Moe(r) => synth_qwen35moe(r, args.seed, source, &progress),
        }
        .map_err(super::err)?;
        write_file(&w, &args.out).map_err(super::err)?;
        params
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
