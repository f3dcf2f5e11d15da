//! Paired A/B timing of a change, step by step (cargo feature `ab-test`, off by default).
//!
//! Why: the development host's memory bandwidth switches between a slow and a fast state
//! every few seconds, so two runs of `flint bench` differ by up to 30%, and a change worth
//! 2% cannot be seen between runs, however many. Two consecutive decode steps, though,
//! nearly always run in the same state. So the change under test is written as
//!
//! ```ignore
//! if flint_hal::ab_test::variant() { new() } else { old() }
//! ```
//!
//! and with the feature on and `FLINT_AB=1`, [`variant`] alternates between `false` (A)
//! and `true` (B) at every forward step (the backend runs each step through
//! [`timed_step`]). Every 400 steps stderr gets the median over all B steps of the B
//! step's time over the mean of the A steps either side of it, with its quartiles (triples
//! whose times differ by more than 1.5x are skipped: a prefill next to a decode step).
//!
//! ```text
//! cargo build --release -p flint-engine --features flint-hal/ab-test
//! FLINT_AB=1 target/release/flint bench -m /tmp/bench.gguf --decode-tokens 2000
//! ```
//!
//! Without the feature (every normal build) [`variant`] is a constant `false` and
//! [`timed_step`] a plain call, so the A path is what ships.

#[cfg(feature = "ab-test")]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    static B: AtomicBool = AtomicBool::new(false);
    static TIMES: Mutex<Vec<(bool, f64)>> = Mutex::new(Vec::new());

    fn enabled() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| std::env::var("FLINT_AB").is_ok_and(|v| v.trim() == "1"))
    }

    pub fn variant() -> bool {
        enabled() && B.load(Ordering::Relaxed)
    }

    pub fn timed_step(step: &mut dyn FnMut()) {
        if !enabled() {
            return step();
        }
        let b = B.load(Ordering::Relaxed);
        let t = Instant::now();
        step();
        let us = t.elapsed().as_secs_f64() * 1e6;
        B.store(!b, Ordering::Relaxed);
        let mut times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
        times.push((b, us));
        if times.len().is_multiple_of(400) {
            report(&times);
        }
    }

    /// B over the mean of its two A neighbours, for every B step with both.
    pub(super) fn ratios(times: &[(bool, f64)]) -> Vec<f64> {
        let mut r: Vec<f64> = times
            .windows(3)
            .filter(|w| !w[0].0 && w[1].0 && !w[2].0)
            .filter_map(|w| {
                let (a0, b, a1) = (w[0].1, w[1].1, w[2].1);
                let (lo, hi) = (a0.min(b).min(a1), a0.max(b).max(a1));
                (lo > 0.0 && hi / lo <= 1.5).then(|| b / (0.5 * (a0 + a1)))
            })
            .collect();
        r.sort_by(f64::total_cmp);
        r
    }

    fn report(times: &[(bool, f64)]) {
        let r = ratios(times);
        if r.is_empty() {
            return;
        }
        let q = |f: f64| r[((r.len() - 1) as f64 * f).round() as usize];
        eprintln!(
            "ab-test: {} steps, {} B steps paired: B/A median {:.4} (quartiles {:.4} .. {:.4})",
            times.len(),
            r.len(),
            q(0.5),
            q(0.25),
            q(0.75)
        );
    }
}

/// Whether this step runs the B side of the change under test (always `false` without
/// the `ab-test` feature or without `FLINT_AB=1`).
#[cfg(feature = "ab-test")]
pub fn variant() -> bool {
    imp::variant()
}

/// Whether this step runs the B side of the change under test (always `false` without
/// the `ab-test` feature or without `FLINT_AB=1`).
#[cfg(not(feature = "ab-test"))]
#[inline(always)]
pub fn variant() -> bool {
    false
}

/// Runs one forward step; with the feature on and `FLINT_AB=1`, times it and switches
/// sides for the next.
#[cfg(feature = "ab-test")]
pub fn timed_step(step: &mut dyn FnMut()) {
    imp::timed_step(step)
}

/// Runs one forward step; with the feature on and `FLINT_AB=1`, times it and switches
/// sides for the next.
#[cfg(not(feature = "ab-test"))]
#[inline(always)]
pub fn timed_step(step: &mut dyn FnMut()) {
    step()
}

#[cfg(all(test, feature = "ab-test"))]
mod tests {
    #[test]
    fn ratios_pair_each_b_step_with_its_a_neighbours() {
        let t = [
            (false, 100.0),
            (true, 110.0),
            (false, 100.0),
            (true, 300.0), // next to a different kind of step: skipped
            (false, 100.0),
            (true, 90.0),
            (false, 80.0),
        ];
        let r = super::imp::ratios(&t);
        assert_eq!(r.len(), 2);
        assert!((r[0] - 1.0).abs() < 1e-12);
        assert!((r[1] - 1.1).abs() < 1e-12);
    }
}
