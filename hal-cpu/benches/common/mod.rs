//! Helpers shared by the hal-cpu benches that are configured from the environment.

/// The environment variable `name` as a number, or `default` when unset or not one.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
