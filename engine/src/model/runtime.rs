//! Loading a model for the commands: resolve the path, read the file, build the
//! tokenizer, open the device and stage the weights, with a progress bar on stderr.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flint_loader::gguf::{GgufFile, LoadMode, Residence};
use flint_loader::tokenizer::Tokenizer;

use super::{model_from_gguf, Model, ModelDesc, ModelError};
use crate::forward::DeviceModel;

/// A model ready to run on a device, with its tokenizer.
#[derive(Debug)]
pub struct LoadedModel {
    /// Where it came from.
    pub path: PathBuf,
    /// The tensors (zero-copy views of the file's bytes in memory).
    pub model: Model,
    /// The tokenizer of the file.
    pub tokenizer: Tokenizer,
    /// The staged model.
    pub device_model: DeviceModel,
    /// Where the file's bytes are held (`FLINT_LOAD`).
    pub residence: Residence,
    /// Wall time of the whole load.
    pub load_time: Duration,
}

/// Resolves `-m` / `FLINT_MODEL` / the default model (fetched on first use).
pub fn resolve_path(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    Ok(flint_loader::fetch::resolve_model_path(explicit)?)
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
    let dev = crate::model::devices::open(device)?;
    let bar = if progress {
        let b =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        b.set_message(format!("reading {}", path.display()));
        Some(b)
    } else {
        None
    };
    let show = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let open_err = |source| ModelError::File {
        path: path.to_path_buf(),
        source,
    };
    // The tokenizer first, from a mapping: building it allocates a few tens of MB for a
    // while, which should not stack on top of a copy of the whole file.
    let mapped = GgufFile::open(path).map_err(open_err)?;
    // The description before the tokenizer: a file with a feature Flint does not run is
    // refused by the key or tensor at fault, whatever else it lacks.
    ModelDesc::from_gguf(&mapped)?;
    let tokenizer = Tokenizer::from_gguf(&mapped).map_err(|source| ModelError::Tokenizer {
        path: path.to_path_buf(),
        source,
    })?;
    let file = match load_mode(dev.name())?.resolve(mapped.total_len()) {
        Residence::Mapped => mapped,
        Residence::HugePages => {
            drop(mapped);
            GgufFile::open_with(path, LoadMode::Copy, &mut |done, total| show(done, total))
                .map_err(open_err)?
        }
    };
    tracing::info!(path = %path.display(), residence = file.residence().describe(), "model file opened");
    let model = model_from_gguf(&file)?;
    if let Some(b) = &bar {
        b.set_message(format!("loading {}", path.display()));
    }
    let device_model = DeviceModel::stage(&model, dev, &mut |done, total| {
        show(done as u64, total as u64)
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(LoadedModel {
        path: path.to_path_buf(),
        residence: file.residence(),
        model,
        tokenizer,
        device_model,
        load_time: t0.elapsed(),
    })
}

/// How to hold the file for a device named `device`: `FLINT_LOAD` when set; else the
/// automatic choice for the CPU backend, which computes on the file's bytes where they lie
/// (so huge pages speed up every decode step), and a plain mapping for the others, which
/// stage copies of their own.
fn load_mode(device: &str) -> Result<LoadMode, ModelError> {
    if std::env::var_os(LoadMode::ENV).is_some() {
        return Ok(LoadMode::from_env()?);
    }
    Ok(if device == "cpu" {
        LoadMode::Auto
    } else {
        LoadMode::Map
    })
}
