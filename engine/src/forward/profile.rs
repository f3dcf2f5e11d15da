//! Per-op wall-clock timings of the device forward, to see where a step's time goes
//! (`FLINT_PROFILE=1`; off by default, and then one relaxed atomic load per op).
//!
//! `flint bench` prints a table per phase (the 512-token prefill, the decode at c=1, the
//! decode steps of the aggregate test) and `flint run` one for the whole run, on standard
//! error. A time is what the calling thread sees of a device call: its launch, the
//! parallel work of every worker, and the wait for it. `step` is the whole forward step.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// 0: not read yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Times of the finished steps kept so far (per op: calls, nanoseconds), and of the
/// step in progress.
struct Tally {
    kept: Vec<(&'static str, u64, u64)>,
    pending: Vec<(&'static str, u64)>,
}

static TALLY: Mutex<Tally> = Mutex::new(Tally {
    kept: Vec::new(),
    pending: Vec::new(),
});

fn tally() -> std::sync::MutexGuard<'static, Tally> {
    TALLY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `FLINT_PROFILE` asks for timings (read once).
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var("FLINT_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

impl Tally {
    fn end_step(&mut self, keep: bool) {
        let pending = std::mem::take(&mut self.pending);
        if keep {
            for (op, ns) in pending {
                match self.kept.iter_mut().find(|e| e.0 == op) {
                    Some(e) => {
                        e.1 += 1;
                        e.2 += ns;
                    }
                    None => self.kept.push((op, 1, ns)),
                }
            }
        }
    }

    fn report(&mut self, title: &str) -> Option<String> {
        self.end_step(true);
        let kept = std::mem::take(&mut self.kept);
        if kept.is_empty() {
            return None;
        }
        let step_ns = kept
            .iter()
            .find(|e| e.0 == "step")
            .map_or(0, |e| e.2)
            .max(1);
        let mut s = format!(
            "profile: {title}\n{:<16} {:>8} {:>12} {:>12} {:>7}\n",
            "op", "calls", "us/call", "ms total", "% step"
        );
        for (op, calls, ns) in &kept {
            s.push_str(&format!(
                "{op:<16} {calls:>8} {:>12.1} {:>12.3} {:>6.1}%\n",
                *ns as f64 / *calls as f64 / 1e3,
                *ns as f64 / 1e6,
                100.0 * *ns as f64 / step_ns as f64
            ));
        }
        Some(s)
    }
}

/// Adds one call of `op` that took `ns` to the step in progress.
pub fn record(op: &'static str, ns: u64) {
    tally().pending.push((op, ns));
}

/// Ends a step: its times join the tally when `keep`, else they are dropped (a phase
/// that wants decode steps only drops the steps that carried prompt tokens).
pub fn end_step(keep: bool) {
    if enabled() {
        tally().end_step(keep);
    }
}

/// The table of everything kept since the last call (a step in progress counts), which
/// it then clears; `None` when profiling is off or nothing was kept.
pub fn take_report(title: &str) -> Option<String> {
    if !enabled() {
        return None;
    }
    tally().report(title)
}

/// Evaluates a device call, timing it under `op` when profiling is on.
macro_rules! timed {
    ($op:expr, $e:expr) => {{
        if $crate::forward::profile::enabled() {
            let t0 = std::time::Instant::now();
            let r = $e;
            $crate::forward::profile::record($op, t0.elapsed().as_nanos() as u64);
            r
        } else {
            $e
        }
    }};
}
pub(crate) use timed;

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn kept_and_dropped_steps() {
        let mut t = Tally {
            kept: Vec::new(),
            pending: Vec::new(),
        };
        t.pending.push(("step", 2_000));
        t.pending.push(("matmul", 1_000));
        t.end_step(true);
        t.pending.push(("step", 9_000));
        t.end_step(false);
        let r = t.report("t").expect("a report");
        let line = r
            .lines()
            .find(|l| l.starts_with("matmul"))
            .expect("matmul line");
        assert!(line.trim_end().ends_with("50.0%"), "{line}");
        let step = r
            .lines()
            .find(|l| l.starts_with("step"))
            .expect("step line");
        assert!(step.contains(" 1 "), "one kept step: {step}");
        assert!(t.report("again").is_none());
    }
}
