//! Which model file a command uses: `-m MODEL`, else `$FLINT_MODEL`, else the default
//! model in the cache (fetched on first use; see `flint_loader::fetch`).

use std::path::{Path, PathBuf};

use crate::cli::{CliError, ModelArg};

/// Resolves the model path of a command from its `-m` flag, `$FLINT_MODEL` or the
/// default model (fetching it when absent). An explicit path that does not exist is an
/// error naming it and where it came from.
pub fn resolve(arg: &ModelArg) -> Result<PathBuf, CliError> {
    resolve_path(arg.model.as_deref())
}

/// [`resolve`] for a bare optional path.
pub fn resolve_path(explicit: Option<&Path>) -> Result<PathBuf, CliError> {
    let from_env =
        explicit.is_none() && std::env::var_os("FLINT_MODEL").is_some_and(|v| !v.is_empty());
    let path = flint_loader::fetch::resolve_model_path(explicit).map_err(crate::cli::err)?;
    if (explicit.is_some() || from_env) && !path.exists() {
        let origin = if explicit.is_some() {
            "-m"
        } else {
            "FLINT_MODEL"
        };
        return Err(CliError::new(format!(
            "model file {} (from {origin}) does not exist",
            path.display()
        )));
    }
    Ok(path)
}
