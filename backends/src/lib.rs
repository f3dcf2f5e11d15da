//! `flint-backends`: the one list of Flint backends.
//!
//! [`registry`] registers every backend this build links. The engine (`FLINT_DEVICE`,
//! `flint devices`) and the `flint-conformance` runner both take their devices from it,
//! so a new backend is added in one place: its crate as a dependency here and one line in
//! [`registry`]. The crate depends on the HAL and the backend crates only, so the
//! conformance runner stays below the engine.

#![forbid(unsafe_code)]

use flint_hal::Registry;

/// The registry of this build: every backend it links, in the order `flint devices`
/// lists them (`cpu`, `ref`, `tt`, `vk`). Each backend crate says what it registers through
/// its `backends()` function.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    let all = [
        flint_hal_cpu::backends(),
        flint_hal_ref::backends(),
        flint_hal_tt::backends(),
        flint_hal_vk::backends(),
    ];
    for entry in all.into_iter().flatten() {
        r.register(entry);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every backend crate's entries are registered, each name once.
    #[test]
    fn lists_every_linked_backend_once() {
        let names = registry().names();
        assert_eq!(names, vec!["cpu", "ref", "tt", "vk"]);
    }
}
