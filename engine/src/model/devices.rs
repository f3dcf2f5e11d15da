//! The device registry of this build: every backend the engine links.

use flint_hal::{DeviceOptions, DeviceRef, HalError, Registry};

/// The registry with every backend this build links (`cpu`, `tt`).
pub fn registry() -> Registry {
    let mut r = Registry::new();
    for entry in flint_hal_cpu::backends() {
        r.register(entry);
    }
    for entry in flint_hal_tt::backends() {
        r.register(entry);
    }
    r
}

/// Opens `name` (or `FLINT_DEVICE`, else `cpu`) with options from the environment.
pub fn open(name: Option<&str>) -> Result<DeviceRef, HalError> {
    let reg = registry();
    let opts = DeviceOptions::from_env()?;
    let name = name
        .map(str::to_string)
        .unwrap_or_else(Registry::selected_name);
    reg.open(&name, &opts)
}
