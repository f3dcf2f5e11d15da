//! The worker loop: `Device::run_step` and `Device::run_session` run the engine's forward
//! steps on a pool worker while the other workers stay awake for their parallel work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::device::CpuDevice;

/// Polls for work a waiting worker makes before it starts yielding its core to other
/// threads between polls (`CpuDevice::run_step`).
const SPIN_POLLS: u32 = 256;

/// How long a waiting worker stays awake without work during a step (longer than the
/// serial parts of a decode step: its attention, the norms) before it goes back to
/// rayon's sleep.
const SPIN_IDLE_LIMIT: std::time::Duration = std::time::Duration::from_micros(200);

/// A `run_session` in progress: the worker running its body, and the other workers
/// kept awake for its steps.
#[derive(Debug)]
pub(crate) struct SessionState {
    /// The pool index of the worker that runs the session's body.
    owner: usize,
    /// Set when the body returns (or panics): the waiting workers leave.
    done: AtomicBool,
    /// Workers now waiting for the session's parallel work.
    waiting: std::sync::atomic::AtomicUsize,
}

/// Keeps a worker awake for parallel work until `done`, taking each op's tasks as soon
/// as they appear: left to rayon, workers fall asleep during the serial parts of a step
/// (a decode's attention, the norms) and the next matmul starts on one thread while
/// they wake up. Returns after `SPIN_IDLE_LIMIT` without work (a long serial stretch:
/// back to rayon, which sleeps and is woken for the next parallel work).
fn wait_for_work(done: &AtomicBool) {
    // Idle polls since the last work, and when the idling began.
    let mut idle = 0u32;
    let mut idle_since = std::time::Instant::now();
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        if idle == 0 {
            idle_since = std::time::Instant::now();
        }
        idle = idle.saturating_add(1);
        if idle < SPIN_POLLS {
            std::hint::spin_loop();
        } else if idle_since.elapsed() > SPIN_IDLE_LIMIT {
            break;
        } else {
            // Let any other runnable thread (a shared machine) have the core.
            std::thread::yield_now();
        }
    }
}

/// Sets `done` however a step or session ends, a panic included.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl CpuDevice {
    /// `Device::run_step`: the step on a pool worker, the other workers awake for it.
    pub(crate) fn step_on_workers(&self, step: &mut (dyn FnMut() + Send)) {
        // Every op inside runs on a pool worker (`install` from a worker is a plain
        // call), its parallel parts spread to the other workers by work stealing.
        if self.threads < 2 {
            return self.pool.install(|| flint_hal::ab_test::timed_step(step));
        }
        if let Some(me) = self.pool.current_thread_index() {
            // Already on a worker: inside `run_session`, or a caller's own `install`.
            let session = self
                .session
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(s) = session.filter(|s| s.owner == me) {
                // The session's waiting workers leave after a long idle stretch (the
                // body waited between steps); send them back.
                if s.waiting.load(Ordering::Acquire) == 0 {
                    s.waiting.store(self.threads - 1, Ordering::Release);
                    self.pool.spawn_broadcast(move |ctx| {
                        if ctx.index() != s.owner {
                            wait_for_work(&s.done);
                            s.waiting.fetch_sub(1, Ordering::AcqRel);
                        }
                    });
                }
            }
            return flint_hal::ab_test::timed_step(step);
        }
        // From a foreign thread: the step runs on worker 0 while the others stay awake
        // for its parallel work.
        let done = AtomicBool::new(false);
        let step = std::sync::Mutex::new(step);
        self.pool.broadcast(|ctx| {
            if ctx.index() == 0 {
                let _done = SetOnDrop(&done);
                let mut step = step.lock().unwrap_or_else(|e| e.into_inner());
                flint_hal::ab_test::timed_step(&mut **step);
            } else {
                wait_for_work(&done);
            }
        });
    }

    /// `Device::run_session`: the body on one pool worker, each `run_step` inside it a
    /// plain call there.
    pub(crate) fn session_on_workers(&self, body: &mut (dyn FnMut() + Send)) {
        if self.threads < 2 || self.pool.current_thread_index().is_some() {
            return self.pool.install(body);
        }
        // The body runs on one worker, and every `run_step` inside it is a plain call
        // there: no hand-off from the caller's thread at the start of each step, no
        // wake-up of the caller at its end (tens of microseconds each, on the order of
        // a small model's whole decode step).
        self.pool.install(|| {
            let Some(owner) = self.pool.current_thread_index() else {
                return body();
            };
            let state = Arc::new(SessionState {
                owner,
                done: AtomicBool::new(false),
                waiting: std::sync::atomic::AtomicUsize::new(0),
            });
            *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(state.clone());
            // However the body ends, a panic included: the waiting workers leave and the
            // session is over.
            struct End<'a>(&'a CpuDevice, &'a SessionState);
            impl Drop for End<'_> {
                fn drop(&mut self) {
                    self.1.done.store(true, Ordering::Release);
                    *self.0.session.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
            }
            let _end = End(self, &state);
            body();
        })
    }
}
