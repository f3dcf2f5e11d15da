use std::fmt;

/// What kind of failure a [`HalError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalErrorKind {
    /// The backend cannot be used on this machine (missing runtime library, missing
    /// symbol, wrong ABI version, no device). The message says why.
    Unavailable,
    /// No backend of that name is registered. The message lists the known ones.
    UnknownDevice,
    /// The backend does not implement this op or block encoding.
    Unsupported,
    /// The backend ran out of memory (device DRAM, KV pool, host allocation).
    OutOfMemory,
    /// A weight or request that the backend refuses (for example a weight whose byte
    /// length does not match its type and shape). The message names it.
    InvalidInput,
    /// The backend's runtime reported a failure while executing.
    Runtime,
}

impl fmt::Display for HalErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HalErrorKind::Unavailable => "device unavailable",
            HalErrorKind::UnknownDevice => "unknown device",
            HalErrorKind::Unsupported => "not supported",
            HalErrorKind::OutOfMemory => "out of memory",
            HalErrorKind::InvalidInput => "invalid input",
            HalErrorKind::Runtime => "runtime failure",
        })
    }
}

/// The error type of every fallible [`Device`](crate::Device) method.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct HalError {
    /// What went wrong, for programs.
    pub kind: HalErrorKind,
    /// What went wrong, for people: names the device, op, tensor or library at fault.
    pub message: String,
}

impl HalError {
    /// An error of `kind` with `message`.
    pub fn new(kind: HalErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Shorthand for [`HalErrorKind::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(HalErrorKind::Unsupported, message)
    }

    /// Shorthand for [`HalErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(HalErrorKind::Unavailable, message)
    }

    /// Shorthand for [`HalErrorKind::InvalidInput`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(HalErrorKind::InvalidInput, message)
    }

    /// Shorthand for [`HalErrorKind::OutOfMemory`].
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::new(HalErrorKind::OutOfMemory, message)
    }

    /// Shorthand for [`HalErrorKind::Runtime`].
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(HalErrorKind::Runtime, message)
    }
}
