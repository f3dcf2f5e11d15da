//! Running the suite on a device, and its report.

use std::time::Instant;

use flint_hal::{Device, GgmlType, Op};
use serde_json::json;

use crate::case::{all_cases, Case};
use crate::exec::{run_case, Outcome};

/// The seed of a run when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 0x00f1_1e57;

/// What to run.
#[derive(Clone, Debug)]
pub struct SuiteOptions {
    /// The run's seed; each case's seed derives from it and the case's identity.
    pub seed: u64,
    /// Only cases this selects (see [`Case::matches`]).
    pub filter: Option<String>,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        Self {
            seed: DEFAULT_SEED,
            filter: None,
        }
    }
}

/// One case and its outcome.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case.
    pub case: Case,
    /// What became of it.
    pub outcome: Outcome,
}

/// The results of one device.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    /// Registry name.
    pub device: String,
    /// The device's own description.
    pub description: String,
    /// The run's seed.
    pub seed: u64,
    /// The filter, if any.
    pub filter: Option<String>,
    /// Every selected case, in suite order.
    pub results: Vec<CaseResult>,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

/// Passed, failed, skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Passed cases.
    pub passed: usize,
    /// Failed cases.
    pub failed: usize,
    /// Cases the device does not support.
    pub skipped: usize,
}

impl Counts {
    /// Adds another device's counts.
    pub fn add(&mut self, o: Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.skipped += o.skipped;
    }

    /// `N passed, N failed, N skipped`.
    pub fn line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

impl DeviceReport {
    /// Case counts.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for r in &self.results {
            match r.outcome {
                Outcome::Pass { .. } => c.passed += 1,
                Outcome::Fail { .. } => c.failed += 1,
                Outcome::Skipped { .. } => c.skipped += 1,
            }
        }
        c
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail { .. }))
    }

    /// True when the case named `name` ([`Case::name`]) failed.
    pub fn failed(&self, name: &str) -> bool {
        self.failures().any(|r| r.case.name() == name)
    }

    /// The table: one line per (op, type) with the combined result of its cases
    /// (`FAIL` if any failed, `pass` if all that ran passed, `not supported` if none
    /// ran), the number of cases and the largest NMSE.
    pub fn table(&self) -> String {
        let mut rows: Vec<(Op, Option<GgmlType>, Vec<&CaseResult>)> = Vec::new();
        for r in &self.results {
            match rows
                .iter_mut()
                .find(|(op, ty, _)| *op == r.case.op && *ty == r.case.ty)
            {
                Some(row) => row.2.push(r),
                None => rows.push((r.case.op, r.case.ty, vec![r])),
            }
        }
        let mut s = format!(
            "{:<22} {:<8} {:<14} {:>5} {:>10}\n",
            "op", "type", "result", "cases", "max NMSE"
        );
        for (op, ty, rs) in rows {
            let fail = rs.iter().any(|r| matches!(r.outcome, Outcome::Fail { .. }));
            let ran: Vec<f64> = rs
                .iter()
                .filter_map(|r| match r.outcome {
                    Outcome::Pass { nmse } => Some(nmse),
                    _ => None,
                })
                .collect();
            let result = if fail {
                "FAIL"
            } else if !ran.is_empty() {
                "pass"
            } else {
                "not supported"
            };
            let nmse = if ran.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2e}", ran.iter().copied().fold(0.0, f64::max))
            };
            s.push_str(&format!(
                "{:<22} {:<8} {:<14} {:>5} {:>10}\n",
                op.name(),
                ty.map_or("-", |t| t.name()),
                result,
                rs.len(),
                nmse
            ));
        }
        s
    }

    /// One block per failure: what, where, why, and the command that replays it.
    pub fn failure_details(&self) -> String {
        let mut s = String::new();
        for r in self.failures() {
            if let Outcome::Fail { message } = &r.outcome {
                let filter = r.case.name();
                s.push_str(&format!(
                    "FAIL {} on {}: op {}, type {}, shape {}, case seed {:#x}\n  {}\n  replay: flint-conformance --device {} --filter '{}' --seed {}\n",
                    r.case.name(),
                    self.device,
                    r.case.op.name(),
                    r.case.ty.map_or("-", |t| t.name()),
                    r.case.shape,
                    r.case.seed,
                    message,
                    self.device,
                    filter,
                    self.seed
                ));
            }
        }
        s
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let c = self.counts();
        json!({
            "device": self.device,
            "description": self.description,
            "available": true,
            "seed": self.seed,
            "filter": self.filter,
            "seconds": self.seconds,
            "passed": c.passed,
            "failed": c.failed,
            "skipped": c.skipped,
            "cases": self.results.iter().map(|r| {
                let (result, nmse, message) = match &r.outcome {
                    Outcome::Pass { nmse } => ("pass", Some(*nmse), None),
                    Outcome::Fail { message } => ("fail", None, Some(message.clone())),
                    Outcome::Skipped { reason } => ("not supported", None, Some(reason.clone())),
                };
                json!({
                    "name": r.case.name(),
                    "op": r.case.op.name(),
                    "type": r.case.ty.map(|t| t.name()),
                    "label": r.case.label,
                    "shape": r.case.shape.to_string(),
                    "seed": r.case.seed,
                    "tolerance": r.case.tolerance,
                    "result": result,
                    "nmse": nmse,
                    "message": message,
                })
            }).collect::<Vec<_>>(),
        })
    }
}

/// Runs every selected case on `dev`.
pub fn run_suite(dev: &dyn Device, opts: &SuiteOptions) -> DeviceReport {
    let start = Instant::now();
    let results = all_cases(opts.seed)
        .into_iter()
        .filter(|c| opts.filter.as_deref().is_none_or(|f| c.matches(f)))
        .map(|case| {
            let outcome = run_case(dev, &case);
            CaseResult { case, outcome }
        })
        .collect();
    DeviceReport {
        device: dev.name().to_string(),
        description: dev.description(),
        seed: opts.seed,
        filter: opts.filter.clone(),
        results,
        seconds: start.elapsed().as_secs_f64(),
    }
}
