//! `flint-hal-tt`: the Tenstorrent backend (under construction).

use flint_hal::BackendEntry;

/// The backends this crate registers.
pub fn backends() -> Vec<BackendEntry> {
    Vec::new()
}
