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
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|a| {
                serde_json::json!({
                    "name": a.name,
                    "summary": a.summary,
                    "available": a.status.is_ok(),
                    "reason": a.status.as_ref().err().map(|e| e.to_string()),
                    "selected": a.name == selected,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    for a in &rows {
        let mark = if a.name == selected { "*" } else { " " };
        match &a.status {
            Ok(()) => println!("{mark} {:<6} available    {}", a.name, a.summary),
            Err(e) => println!("{mark} {:<6} unavailable  {e}", a.name),
        }
    }
    Ok(())
}
