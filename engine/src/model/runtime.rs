//! Loading a model for the commands: resolve the path, read the file, build the
//! tokenizer, open the device and stage the weights, with a progress bar on stderr.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::Tokenizer;

use super::{model_from_gguf, Model, ModelError};
use crate::forward::DeviceModel;

/// A model ready to run on a device, with its tokenizer.
#[derive(Debug)]
pub struct LoadedModel {
    /// Where it came from.
    pub path: PathBuf,
    /// The tensors (zero-copy views of the mapped file).
    pub model: Model,
    /// The tokenizer of the file.
    pub tokenizer: Tokenizer,
    /// The staged model.
    pub device_model: DeviceModel,
    /// Wall time of the whole load.
    pub load_time: Duration,
}

/// Resolves `-m` / `FLINT_MODEL` / the default model (fetched on first use).
pub fn resolve_path(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    flint_loader::fetch::resolve_model_path(explicit).map_err(|e| ModelError::new(e.to_string()))
}

/// Loads `path` onto the device `device` (or `FLINT_DEVICE`, else cpu). Shows a progress
/// bar on stderr when `progress` is set.
pub fn load_on_device(
    path: &Path,
    device: Option<&str>,
    progress: bool,
) -> Result<LoadedModel, ModelError> {
    let t0 = Instant::now();
    // Open the device first: a wrong device name should fail before a long load.
    let dev = crate::devices::open(device).map_err(|e| ModelError::new(e.to_string()))?;
    let file =
        GgufFile::open(path).map_err(|e| ModelError::new(format!("{}: {e}", path.display())))?;
    let model = model_from_gguf(&file)?;
    let tokenizer = Tokenizer::from_gguf(&file)
        .map_err(|e| ModelError::new(format!("tokenizer of {}: {e}", path.display())))?;
    let bar = if progress {
        let b =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        b.set_message(format!("loading {}", path.display()));
        Some(b)
    } else {
        None
    };
    let device_model = DeviceModel::stage(&model, dev, &mut |done, total| {
        if let Some(b) = &bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(LoadedModel {
        path: path.to_path_buf(),
        model,
        tokenizer,
        device_model,
        load_time: t0.elapsed(),
    })
}
