//! The step gate: where a training loop stops at a step boundary during an operation.
//!
//! The training thread calls [`StepGate::step_completed`] after every step. With no
//! operation pending this is one atomic load. During an operation the gate runs the two-phase
//! pause of DESIGN section 3:
//!
//! 1. **Sample** ([`StepGate::sample`]): at its next boundary (after step `s`) the thread
//!    reports that it is in step `s + 1` and will hold, at the latest, after finishing it.
//! 2. **Pause** ([`StepGate::pause_at`]): the manager picks `T` = the largest step any rank
//!    is in. A rank holding before `T` is released to run on to `T`; every rank holds after
//!    exactly `T`. No rank can pass `T` because its own bound is `s + 1 <= T`, and no rank
//!    waits for a peer that is held earlier than `T` for longer than one round trip.
//!
//! Stopping every rank "now" instead would deadlock: a rank blocked in a collective waits for a
//! peer that is already held. [`StepGate::resume`] opens the gate.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use taskd_core::{OperationId, StepBoundary};

/// What the gate tells its worker, from the training thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateEvent {
    /// Phase A: the rank is in `in_step` and holds after it unless told otherwise.
    Sampled { op: OperationId, in_step: u64 },
    /// Phase B: the rank holds after finishing `step`.
    Held { op: OperationId, step: u64 },
    /// The rank holds at the bound its sample set; not a pause (the pause step may be later).
    HeldProvisionally { op: OperationId, step: u64 },
    /// The training loop passed the pause step: the protocol was broken.
    Overran {
        op: OperationId,
        step: u64,
        bound: u64,
    },
}

/// Why a gate request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("the gate is serving operation {busy}, not {asked}")]
    OtherOperation {
        busy: OperationId,
        asked: OperationId,
    },
    #[error("pause at step {asked} requested, but this rank already holds after step {held}")]
    PastPauseStep { asked: u64, held: u64 },
    #[error("the gate was shut down")]
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No operation: boundaries pass.
    Idle,
    /// Report the step at the next boundary.
    Sampling,
    /// Hold after finishing this step: provisionally (the bound a sample sets, which the
    /// pause step may raise) or as the manager's pause step.
    HoldAfter { step: u64, pause_step: bool },
    /// The worker is stopping: never hold again.
    Shutdown,
}

struct Inner {
    mode: Mode,
    op: Option<OperationId>,
    /// The step the training thread holds after, and since when.
    held: Option<(u64, Instant)>,
    /// Time held during the current operation.
    stalled: Duration,
}

type Notify = Box<dyn Fn(GateEvent) + Send + Sync>;

/// One rank's step gate. Shared between the worker (control) and the training thread.
pub struct StepGate {
    armed: AtomicBool,
    inner: Mutex<Inner>,
    released: Condvar,
    /// Signalled when an operation arms the gate (see [`StepGate::wait_armed`]).
    armed_cv: Condvar,
    notify: OnceLock<Notify>,
}

impl Default for StepGate {
    fn default() -> Self {
        Self::new()
    }
}

impl StepGate {
    pub fn new() -> Self {
        StepGate {
            armed: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                mode: Mode::Idle,
                op: None,
                held: None,
                stalled: Duration::ZERO,
            }),
            released: Condvar::new(),
            armed_cv: Condvar::new(),
            notify: OnceLock::new(),
        }
    }

    /// Sets where gate events go (the worker). Only the first call takes effect.
    pub fn set_notify(&self, f: impl Fn(GateEvent) + Send + Sync + 'static) {
        let _ = self.notify.set(Box::new(f));
    }

    fn emit(&self, ev: GateEvent) {
        if let Some(n) = self.notify.get() {
            n(ev);
        }
    }

    /// Called by the training thread after it finished `step`. Returns at once unless an
    /// operation holds this rank here.
    #[inline]
    pub fn step_completed(&self, step: u64) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        self.boundary_slow(step);
    }

    #[cold]
    fn boundary_slow(&self, step: u64) {
        let mut g = self.inner.lock();
        let op = match g.op {
            Some(op) => op,
            None => return,
        };
        match g.mode {
            Mode::Idle | Mode::Shutdown => return,
            Mode::Sampling => {
                g.mode = Mode::HoldAfter {
                    step: step + 1,
                    pause_step: false,
                };
                self.emit(GateEvent::Sampled {
                    op,
                    in_step: step + 1,
                });
                return;
            }
            Mode::HoldAfter { step: bound, .. } if step < bound => return,
            Mode::HoldAfter { step: bound, .. } if step > bound => {
                // Cannot happen with the two-phase protocol; hold anyway so the group calls
                // never run under a moving loop, and say so.
                self.emit(GateEvent::Overran { op, step, bound });
            }
            // Only the manager's pause step is reported: a provisional hold is not a pause.
            Mode::HoldAfter {
                pause_step: true, ..
            } => self.emit(GateEvent::Held { op, step }),
            Mode::HoldAfter { .. } => self.emit(GateEvent::HeldProvisionally { op, step }),
        }
        g.held = Some((step, Instant::now()));
        loop {
            self.released.wait(&mut g);
            match g.mode {
                Mode::HoldAfter { step: bound, .. } if bound <= step => continue,
                _ => break,
            }
        }
        if let Some((_, since)) = g.held.take() {
            g.stalled += since.elapsed();
        }
    }

    /// Phase A for operation `op`: report the step at the next boundary.
    pub fn sample(&self, op: OperationId) -> Result<(), GateError> {
        let mut g = self.inner.lock();
        match (g.mode, g.op) {
            (Mode::Shutdown, _) => return Err(GateError::Shutdown),
            (Mode::Idle, _) => {}
            (_, Some(busy)) if busy != op => {
                return Err(GateError::OtherOperation { busy, asked: op })
            }
            _ => {}
        }
        g.op = Some(op);
        g.mode = Mode::Sampling;
        g.stalled = Duration::ZERO;
        self.armed.store(true, Ordering::Release);
        self.armed_cv.notify_all();
        Ok(())
    }

    /// Phase B: hold after finishing step `step`. Emits [`GateEvent::Held`] when the rank
    /// holds there (at once if it already does).
    pub fn pause_at(&self, op: OperationId, step: u64) -> Result<(), GateError> {
        let mut g = self.inner.lock();
        match (g.mode, g.op) {
            (Mode::Shutdown, _) => return Err(GateError::Shutdown),
            (_, Some(busy)) if busy != op => {
                return Err(GateError::OtherOperation { busy, asked: op })
            }
            _ => {}
        }
        if let Some((held, _)) = g.held {
            if held > step {
                return Err(GateError::PastPauseStep { asked: step, held });
            }
        }
        g.op = Some(op);
        g.mode = Mode::HoldAfter {
            step,
            pause_step: true,
        };
        self.armed.store(true, Ordering::Release);
        self.armed_cv.notify_all();
        match g.held {
            Some((held, _)) if held == step => {
                drop(g);
                self.emit(GateEvent::Held { op, step });
            }
            Some(_) => {
                // Held at an earlier provisional bound: run on to `step`.
                self.released.notify_all();
            }
            None => {}
        }
        Ok(())
    }

    /// Whether an operation has armed the gate (the next boundary takes the slow path).
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    /// Whether the training thread holds at a boundary now, and after which step.
    pub fn held_step(&self) -> Option<u64> {
        self.inner.lock().held.map(|(s, _)| s)
    }

    /// Opens the gate. Returns how long training was held during this operation.
    pub fn resume(&self) -> Duration {
        let mut g = self.inner.lock();
        if g.mode != Mode::Shutdown {
            g.mode = Mode::Idle;
        }
        g.op = None;
        let mut stalled = g.stalled;
        if let Some((_, since)) = g.held {
            stalled += since.elapsed();
        }
        g.stalled = Duration::ZERO;
        self.armed.store(false, Ordering::Release);
        self.released.notify_all();
        stalled
    }

    /// Blocks until an operation arms the gate, the gate shuts down, or `timeout` passes;
    /// returns whether it is armed. For a loop with no work between boundaries (a benchmark's
    /// zero-time steps), which would otherwise spin through [`StepGate::step_completed`].
    pub fn wait_armed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.inner.lock();
        while !self.armed.load(Ordering::Acquire) && g.mode != Mode::Shutdown {
            if self.armed_cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        self.armed.load(Ordering::Acquire)
    }

    /// Opens the gate for good: the worker is stopping and nobody will resume it.
    pub fn shutdown(&self) {
        let mut g = self.inner.lock();
        g.mode = Mode::Shutdown;
        g.op = None;
        self.armed.store(false, Ordering::Release);
        self.released.notify_all();
        self.armed_cv.notify_all();
    }
}

impl StepBoundary for StepGate {
    fn step_completed(&self, step: u64) {
        StepGate::step_completed(self, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    fn op(n: u128) -> OperationId {
        OperationId(uuid::Uuid::from_u128(n))
    }

    fn gate() -> (Arc<StepGate>, mpsc::Receiver<GateEvent>) {
        let g = Arc::new(StepGate::new());
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        g.set_notify(move |e| tx.lock().send(e).unwrap());
        (g, rx)
    }

    #[test]
    fn idle_gate_never_holds() {
        let (g, rx) = gate();
        for s in 1..1000 {
            g.step_completed(s);
        }
        assert!(rx.try_recv().is_err());
        assert_eq!(g.held_step(), None);
    }

    #[test]
    fn sample_then_pause_holds_exactly_at_t_and_resume_releases() {
        let (g, rx) = gate();
        g.sample(op(1)).unwrap();
        // The training thread finishes step 4: it is in step 5 and reports so.
        g.step_completed(4);
        assert_eq!(
            rx.recv().unwrap(),
            GateEvent::Sampled {
                op: op(1),
                in_step: 5
            }
        );
        // The manager picks T = 6 (a peer was a step ahead).
        g.pause_at(op(1), 6).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(5); // passes: 5 < 6
                g.step_completed(6); // holds here
                7
            })
        };
        assert_eq!(rx.recv().unwrap(), GateEvent::Held { op: op(1), step: 6 });
        assert_eq!(g.held_step(), Some(6));
        assert!(!trainer.is_finished());
        g.resume();
        assert_eq!(trainer.join().unwrap(), 7);
        assert_eq!(g.held_step(), None);
    }

    #[test]
    fn provisional_hold_is_released_to_the_later_pause_step() {
        let (g, rx) = gate();
        g.sample(op(2)).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(3); // sampled: in step 4, provisional bound 4
                g.step_completed(4); // holds provisionally
                g.step_completed(5); // holds at T = 5
            })
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Sampled { in_step: 4, .. }
        ));
        // The provisional hold after step 4 is silent: it is not the pause step.
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 4, .. }
        ));
        g.pause_at(op(2), 5).unwrap();
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 5, .. }
        ));
        let stalled = g.resume();
        trainer.join().unwrap();
        assert!(stalled > Duration::ZERO);
    }

    #[test]
    fn pause_at_the_held_step_reports_at_once() {
        let (g, rx) = gate();
        g.sample(op(3)).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(1);
                g.step_completed(2);
            })
        };
        assert!(matches!(rx.recv().unwrap(), GateEvent::Sampled { .. }));
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 2, .. }
        ));
        g.pause_at(op(3), 2).unwrap();
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 2, .. }
        ));
        assert_eq!(
            g.pause_at(op(3), 1),
            Err(GateError::PastPauseStep { asked: 1, held: 2 })
        );
        g.resume();
        trainer.join().unwrap();
    }

    #[test]
    fn another_operation_is_refused_and_shutdown_frees_the_thread() {
        let (g, rx) = gate();
        g.sample(op(4)).unwrap();
        assert!(matches!(
            g.pause_at(op(5), 3),
            Err(GateError::OtherOperation { .. })
        ));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(1);
                g.step_completed(2);
                g.step_completed(3);
            })
        };
        assert!(matches!(rx.recv().unwrap(), GateEvent::Sampled { .. }));
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 2, .. }
        ));
        g.shutdown();
        trainer.join().unwrap();
        assert_eq!(g.sample(op(6)), Err(GateError::Shutdown));
    }
}
