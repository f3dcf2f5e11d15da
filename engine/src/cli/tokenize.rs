//! `flint tokenize`: the token ids of a text, as llama.cpp's tokenizer gives them
//! (special-token text is not parsed as special; BOS only with `--bos`).

use clap::Args;
use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::Tokenizer;

use super::{err, CliError};

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
pub fn run(args: &TokenizeArgs) -> Result<(), CliError> {
    let path = flint_loader::fetch::resolve_model_path(args.model.model.as_deref()).map_err(err)?;
    let file = GgufFile::open(&path).map_err(err)?;
    let tok = Tokenizer::from_gguf(&file)
        .map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
    let ids = token_ids(&tok, &args.text, args.bos)?;
    super::write_stdout(&format!("{}\n", format_ids(&ids, args.json)))
}

/// The ids `flint tokenize` prints: no special-token parsing, BOS first only if asked.
pub fn token_ids(tok: &Tokenizer, text: &str, bos: bool) -> Result<Vec<u32>, CliError> {
    let mut ids = Vec::new();
    if bos {
        ids.push(
            tok.bos()
                .ok_or_else(|| CliError::new("--bos given but the model defines no BOS token"))?,
        );
    }
    ids.extend(tok.tokenize(text, false, false));
    Ok(ids)
}

/// Space-separated ids, or a JSON array.
pub fn format_ids(ids: &[u32], json: bool) -> String {
    let parts: Vec<String> = ids.iter().map(u32::to_string).collect();
    if json {
        format!("[{}]", parts.join(","))
    } else {
        parts.join(" ")
    }
}
