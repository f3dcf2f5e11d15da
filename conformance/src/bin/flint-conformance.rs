//! `flint-conformance [--device NAME|all] [--filter OP] [--seed S] [--json]`: runs the
//! conformance suite on one or every registered backend (see `shared/spec/CLI.md`).
//!
//! Exit status: 0 when nothing failed; 1 when a case failed, the named device is
//! unknown (the message lists the known ones) or cannot be opened; 2 on bad usage
//! (including a `--filter` that selects no case).

use std::process::ExitCode;

use clap::Parser;
use flint_conformance::{registry, run_suite, Counts, SuiteOptions, DEFAULT_SEED};
use flint_hal::{DeviceOptions, HalErrorKind, Registry};
use serde_json::json;

/// Runs the Flint conformance suite against a backend.
#[derive(Debug, Parser)]
#[command(name = "flint-conformance", version)]
struct Args {
    /// Backend name, or `all` for every registered backend that is available here
    /// (default: FLINT_DEVICE, else cpu).
    #[arg(long, value_name = "NAME|all")]
    device: Option<String>,
    /// Only cases of op OP, whose name (`op/TYPE[label]`) starts with OP, or whose
    /// label contains it.
    #[arg(long, value_name = "OP")]
    filter: Option<String>,
    /// The run's seed; failures print it so a case can be replayed.
    #[arg(long, value_name = "S", value_parser = parse_seed)]
    seed: Option<u64>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// A seed in decimal or `0x` hex.
fn parse_seed(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse::<u64>(),
    };
    r.map_err(|_| format!("'{s}' is not a seed (a u64, decimal or 0x hex)"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let reg = registry();
    let name = args.device.clone().unwrap_or_else(Registry::selected_name);
    let opts = SuiteOptions {
        seed: args.seed.unwrap_or(DEFAULT_SEED),
        filter: args.filter.clone(),
    };
    let dev_opts = match DeviceOptions::from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("flint-conformance: {e}");
            return ExitCode::from(1);
        }
    };

    // The devices to run, and those `all` leaves out with their reason.
    let mut targets: Vec<&'static str> = Vec::new();
    let mut unavailable: Vec<(&'static str, String)> = Vec::new();
    if name == "all" {
        for a in reg.availability() {
            match a.status {
                Ok(_) => targets.push(a.name),
                Err(e) => unavailable.push((a.name, e.to_string())),
            }
        }
    } else {
        match reg.check_name(&name) {
            Ok(e) => targets.push(e.name),
            Err(e) => {
                eprintln!("flint-conformance: {e}");
                return ExitCode::from(1);
            }
        }
    }

    if let Some(f) = &opts.filter {
        if !flint_conformance::all_cases(opts.seed)
            .iter()
            .any(|c| c.matches(f))
        {
            eprintln!(
                "flint-conformance: --filter {f:?} selects no case (ops: {})",
                flint_hal::Op::ALL.map(|o| o.name()).join(", ")
            );
            // A typo in a filter must not pass as a clean run.
            return ExitCode::from(2);
        }
    }

    let mut total = Counts::default();
    let mut open_failed = false;
    let mut json_devices = Vec::new();
    for (n, why) in &unavailable {
        if !args.json {
            println!("device {n}: unavailable ({why}); not run");
        }
        json_devices.push(json!({"device": n, "available": false, "reason": why}));
    }
    for n in targets {
        let dev = match reg.open(n, &dev_opts) {
            Ok(d) => d,
            Err(e) => {
                // A device named explicitly must open; with `all`, one that probed
                // available but fails to open is a failure too.
                open_failed = true;
                let kind = if e.kind == HalErrorKind::Unavailable {
                    "unavailable"
                } else {
                    "failed to open"
                };
                if args.json {
                    json_devices
                        .push(json!({"device": n, "available": false, "reason": e.to_string()}));
                } else {
                    eprintln!("flint-conformance: device {n} {kind}: {e}");
                }
                continue;
            }
        };
        let report = run_suite(dev.as_ref(), &opts);
        total.add(report.counts());
        if args.json {
            json_devices.push(report.to_json());
        } else {
            println!(
                "device {}: {} (seed {}{}; {:.1} s)",
                report.device,
                report.description,
                report.seed,
                opts.filter
                    .as_deref()
                    .map(|f| format!(", filter {f}"))
                    .unwrap_or_default(),
                report.seconds
            );
            print!("{}", report.table());
            let details = report.failure_details();
            if !details.is_empty() {
                print!("{details}");
            }
            println!("{}: {}", report.device, report.counts().line());
        }
    }
    if args.json {
        let v = json!({
            "seed": opts.seed,
            "filter": opts.filter,
            "devices": json_devices,
            "passed": total.passed,
            "failed": total.failed,
            "skipped": total.skipped,
        });
        println!("{v}");
    } else {
        println!("{}", total.line());
    }
    if total.failed > 0 || open_failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
