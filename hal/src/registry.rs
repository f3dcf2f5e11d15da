use std::fmt;

use crate::{DeviceRef, HalError, HalErrorKind};

/// Options every backend receives when opened, read from the environment by
/// [`DeviceOptions::from_env`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Worker threads (`FLINT_THREADS`); `None` = all cores.
    pub threads: Option<usize>,
    /// Keep block encodings as they are where the device can (`FLINT_KEEP_QUANT`,
    /// default on; `0` selects expansion).
    pub keep_quant: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            threads: None,
            keep_quant: true,
        }
    }
}

impl DeviceOptions {
    /// Reads `FLINT_THREADS` and `FLINT_KEEP_QUANT`. A value that does not parse is an
    /// error naming the variable.
    pub fn from_env() -> Result<Self, HalError> {
        let mut o = Self::default();
        if let Ok(v) = std::env::var("FLINT_THREADS") {
            let v = v.trim();
            if !v.is_empty() {
                match v.parse::<usize>() {
                    Ok(n) if n > 0 => o.threads = Some(n),
                    _ => {
                        return Err(HalError::invalid(format!(
                            "FLINT_THREADS={v:?} is not a positive integer"
                        )))
                    }
                }
            }
        }
        if let Ok(v) = std::env::var("FLINT_KEEP_QUANT") {
            o.keep_quant = match v.trim() {
                "" | "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                other => {
                    return Err(HalError::invalid(format!(
                        "FLINT_KEEP_QUANT={other:?} is not 0 or 1"
                    )))
                }
            };
        }
        Ok(o)
    }
}

/// A registered backend: its name and how to probe and open it.
#[derive(Clone)]
pub struct BackendEntry {
    /// The name `FLINT_DEVICE` selects it by.
    pub name: &'static str,
    /// One line for `flint devices`.
    pub summary: &'static str,
    /// Cheap check whether the backend can be opened here; the error says why not.
    /// `Ok(Some(..))` names what it found (a device, its memory) for `flint devices`.
    pub probe: fn() -> Result<Option<String>, HalError>,
    /// Opens the device.
    pub open: fn(&DeviceOptions) -> Result<DeviceRef, HalError>,
}

impl fmt::Debug for BackendEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendEntry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The backends known to this build, in registration order.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    entries: Vec<BackendEntry>,
}

/// Availability of one backend, as `flint devices` prints it.
#[derive(Clone, Debug)]
pub struct Availability {
    /// The backend's name.
    pub name: &'static str,
    /// Its one-line summary.
    pub summary: &'static str,
    /// `Ok` when it can be opened (with what the probe found, if it says), else why
    /// not.
    pub status: Result<Option<String>, HalError>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a backend; a later entry with the same name replaces the earlier one.
    pub fn register(&mut self, entry: BackendEntry) {
        self.entries.retain(|e| e.name != entry.name);
        self.entries.push(entry);
    }

    /// Registered names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&BackendEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Probes every backend.
    pub fn availability(&self) -> Vec<Availability> {
        self.entries
            .iter()
            .map(|e| Availability {
                name: e.name,
                summary: e.summary,
                status: (e.probe)(),
            })
            .collect()
    }

    /// Checks that `name` is registered; the error lists the known names.
    pub fn check_name(&self, name: &str) -> Result<&BackendEntry, HalError> {
        self.get(name).ok_or_else(|| {
            HalError::new(
                HalErrorKind::UnknownDevice,
                format!(
                    "no device named '{name}'; known devices: {}",
                    self.names().join(", ")
                ),
            )
        })
    }

    /// Opens the backend `name`. Unknown names are `UnknownDevice` (listing the known
    /// ones); a backend that cannot run here is `Unavailable` with the reason.
    pub fn open(&self, name: &str, opts: &DeviceOptions) -> Result<DeviceRef, HalError> {
        let entry = self.check_name(name)?;
        (entry.probe)()?;
        (entry.open)(opts)
    }

    /// The device name the environment selects: `FLINT_DEVICE`, else `cpu`.
    pub fn selected_name() -> String {
        match std::env::var("FLINT_DEVICE") {
            Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
            _ => "cpu".to_string(),
        }
    }

    /// Opens the device the environment selects, with options from the environment.
    pub fn open_from_env(&self) -> Result<DeviceRef, HalError> {
        let opts = DeviceOptions::from_env()?;
        self.open(&Self::selected_name(), &opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Result<Option<String>, HalError> {
        Err(HalError::unavailable("no runtime library found"))
    }

    fn never_open(_: &DeviceOptions) -> Result<DeviceRef, HalError> {
        Err(HalError::runtime("not reached"))
    }

    #[test]
    fn unknown_name_lists_known_devices() {
        let mut r = Registry::new();
        r.register(BackendEntry {
            name: "tt",
            summary: "test",
            probe: unavailable,
            open: never_open,
        });
        let e = r.open("nonsense", &DeviceOptions::default()).unwrap_err();
        assert_eq!(e.kind, HalErrorKind::UnknownDevice);
        assert!(
            e.message.contains("nonsense") && e.message.contains("tt"),
            "{e}"
        );
        let e = r.open("tt", &DeviceOptions::default()).unwrap_err();
        assert_eq!(e.kind, HalErrorKind::Unavailable);
        assert!(e.message.contains("no runtime library"));
    }
}
