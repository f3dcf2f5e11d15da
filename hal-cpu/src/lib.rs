//! `flint-hal-cpu`: the CPU backend (under construction).

use flint_hal::BackendEntry;

/// The backends this crate registers.
pub fn backends() -> Vec<BackendEntry> {
    Vec::new()
}
