//! The devices of this build: the one registry of `flint-backends`, and opening a device
//! by name or from the environment.

use flint_hal::{DeviceOptions, DeviceRef, HalError, Registry};

/// The registry with every backend this build links (`cpu`, `ref`, `tt`), from
/// [`flint_backends`].
pub use flint_backends::registry;

/// Opens `name` (or `FLINT_DEVICE`, else `cpu`) with options from the environment.
pub fn open(name: Option<&str>) -> Result<DeviceRef, HalError> {
    let reg = registry();
    let opts = DeviceOptions::from_env()?;
    let name = name
        .map(str::to_string)
        .unwrap_or_else(Registry::selected_name);
    reg.open(&name, &opts)
}
