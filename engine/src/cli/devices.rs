//! `flint devices`: one line per registered backend.

use clap::Args;

use super::CliError;

/// Arguments of `flint devices`.
#[derive(Debug, Clone, Args)]
pub struct DevicesArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `flint devices`. Exits 1 when `FLINT_DEVICE` names no registered backend.
pub fn run(args: &DevicesArgs) -> Result<(), CliError> {
    let reg = crate::model::devices::registry();
    let selected = flint_hal::Registry::selected_name();
    reg.check_name(&selected)
        .map_err(|e| CliError::new(format!("FLINT_DEVICE={selected}: {e}")))?;
    let rows = reg.availability();
    // The selected backend opened as a run would open it: its own description (the cpu
    // device's SIMD level, threads and weight layout), or why it does not open.
    let opened = rows
        .iter()
        .find(|a| a.name == selected && a.status.is_ok())
        .map(|_| {
            flint_hal::DeviceOptions::from_env()
                .and_then(|opts| reg.open(&selected, &opts))
                .map(|d| d.description())
        });
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|a| {
                let open = opened.as_ref().filter(|_| a.name == selected);
                serde_json::json!({
                    "name": a.name,
                    "summary": a.summary,
                    "available": a.status.is_ok() && !matches!(open, Some(Err(_))),
                    "found": a.status.as_ref().ok().and_then(|f| f.clone()),
                    "reason": a.status.as_ref().err().map(|e| e.to_string())
                        .or_else(|| open.and_then(|o| o.as_ref().err()).map(|e| e.to_string())),
                    "selected": a.name == selected,
                    "description": open.and_then(|o| o.as_ref().ok()),
                })
            })
            .collect();
        return super::write_stdout(&format!("{}\n", serde_json::Value::Array(v)));
    }
    let mut out = String::new();
    for a in &rows {
        let mark = if a.name == selected { "*" } else { " " };
        let found = match &a.status {
            Ok(Some(f)) => format!(" (found: {f})"),
            _ => String::new(),
        };
        let open = opened.as_ref().filter(|_| a.name == selected);
        out += &match (&a.status, open) {
            (Ok(_), Some(Ok(desc))) => format!(
                "{mark} {:<6} available    {}{found}; opened: {desc}\n",
                a.name, a.summary
            ),
            (Ok(_), Some(Err(e))) => format!("{mark} {:<6} unavailable  {e}\n", a.name),
            (Ok(_), None) => format!("{mark} {:<6} available    {}{found}\n", a.name, a.summary),
            (Err(e), _) => format!("{mark} {:<6} unavailable  {e}\n", a.name),
        };
    }
    super::write_stdout(&out)
}
