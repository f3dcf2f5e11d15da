//! Logging setup: `FLINT_LOG` (tracing `EnvFilter` syntax, default `warn`) to stderr.

/// Installs the stderr subscriber once; later calls do nothing.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLINT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
