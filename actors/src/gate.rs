//! The step gate: where a training loop stops at a step boundary during an operation.
//!
//! The training thread calls [`StepGate::step_completed`] after every step. With no operation
//! pending this is one atomic load and one uncontended compare-and-swap on a word the gate
//! owns: no lock, no system call. The swap publishes the step just completed, so that a pause
//! request is answered at once, from the worker's thread, even while the training thread waits
//! in a collective for its peers.
//!
//! During an operation the gate runs the two-phase pause (`docs/protocol.md`):
//!
//! 1. **Sample** ([`StepGate::sample`]): the rank reports the step it is in, `c` (the last one
//!    it completed, plus one), and from then on holds, at the latest, after finishing `c`.
//! 2. **Pause** ([`StepGate::pause_at`]): the manager picks `T` = the largest `c` of any rank.
//!    A rank holding before `T` is released to run on to `T`; every rank holds after exactly
//!    `T`.
//!
//! Why this cannot deadlock: a rank's bound is the step it was in when it was asked, so it never
//! has to go back; ranks are at most one step apart (every step ends in collectives over all of
//! them), so `T` is at most one more than any rank's bound; and a rank blocked in a collective
//! still answers the sample, because the answer comes from the published step, not from the
//! training thread. Stopping every rank "at its next boundary" instead deadlocks: a rank held
//! after step `s` leaves a peer waiting in step `s + 1`'s collective forever. Answering only at
//! the next boundary deadlocks too, when the pause requests reach the ranks at different times
//! and a rank that got it early already holds while a late one waits for it in a collective.
//!
//! [`StepGate::resume`] opens the gate. One training thread calls a gate; any thread may
//! control it.
//!
//! A simulated rank that is a task rather than a thread (the simulator runs thousands in one
//! process) calls [`StepGate::step_completed_or_hold`] instead: the same step, the same state
//! machine and events, only a hold is a future to await instead of a blocked thread.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use taskd_core::protocol::GateReport;
use taskd_core::{OperationId, StepBoundary};

/// The high bit of the gate word: an operation is pending, boundaries take the slow path.
const ARMED: u64 = 1 << 63;
/// Set once the training thread completed a step: until then the gate cannot tell which step
/// it is in (a process may start at any step, resuming from a checkpoint).
const SEEN: u64 = 1 << 62;
/// The rest of the gate word: the step the training thread last completed.
const STEP: u64 = !(ARMED | SEEN);

/// What the gate tells its worker, from the training thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateEvent {
    /// Phase A, answered late: the rank had not completed a step when asked, so it answers at
    /// its first boundary: it is in `in_step` and holds after it unless told otherwise.
    Sampled {
        /// The operation that asked.
        op: OperationId,
        /// The step the rank is now in (its first completed step plus one).
        in_step: u64,
    },
    /// Phase B: the rank holds after finishing `step`.
    Held {
        /// The operation the gate holds for.
        op: OperationId,
        /// The step just completed: the pause step.
        step: u64,
    },
    /// The rank holds at the bound its sample set; not a pause (the pause step may be later).
    HeldProvisionally {
        /// The operation the gate holds for.
        op: OperationId,
        /// The step just completed: the bound from the sample.
        step: u64,
    },
    /// The training loop passed the pause step: the protocol was broken.
    Overran {
        /// The operation whose bound was passed.
        op: OperationId,
        /// The step the loop completed.
        step: u64,
        /// The step it should have held after.
        bound: u64,
    },
}

/// Why a gate request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The gate is armed for another operation: a late directive of an old operation must
    /// not move a hold that the current one relies on.
    #[error("the gate is serving operation {busy}, not {asked}")]
    OtherOperation {
        /// The operation the gate serves.
        busy: OperationId,
        /// The operation that asked.
        asked: OperationId,
    },
    /// The rank already holds after a later step than the pause step: it cannot go back, so
    /// the ranks could not all hold at the same boundary.
    #[error("pause at step {asked} requested, but this rank already holds after step {held}")]
    PastPauseStep {
        /// The pause step asked for.
        asked: u64,
        /// The step the rank holds after.
        held: u64,
    },
    /// The worker is stopping; the gate never holds again.
    #[error("the gate was shut down")]
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No operation: boundaries pass.
    Idle,
    /// Asked for the step before the first boundary: answer at the first boundary.
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
    /// The step the training thread last completed, while the gate is armed (the gate word
    /// holds it otherwise); `None` before its first boundary.
    last: Option<u64>,
    /// The step the training thread holds after, and since when.
    held: Option<(u64, Instant)>,
    /// Time held during the current operation.
    stalled: Duration,
}

type Notify = Box<dyn Fn(GateEvent) + Send + Sync>;

/// One rank's step gate. Shared between the worker (control) and the training thread.
pub struct StepGate {
    /// [`ARMED`] | the last completed step. Only the training thread's fast path writes it
    /// without the lock, and only while it is not armed.
    word: AtomicU64,
    inner: Mutex<Inner>,
    released: Condvar,
    /// The same signal for a rank that waits as a task ([`StepGate::step_completed_or_hold`]).
    released_task: tokio::sync::Notify,
    /// Signalled when an operation arms the gate (see [`StepGate::wait_armed`]).
    armed_cv: Condvar,
    /// The same signal for a task ([`StepGate::armed`]).
    armed_task: tokio::sync::Notify,
    notify: OnceLock<Notify>,
}

impl Default for StepGate {
    fn default() -> Self {
        Self::new()
    }
}

impl StepGate {
    /// An idle gate: boundaries pass until an operation arms it. Hand it to the worker and to
    /// the training loop (as its [`StepBoundary`]).
    pub fn new() -> Self {
        StepGate {
            word: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                mode: Mode::Idle,
                op: None,
                last: None,
                held: None,
                stalled: Duration::ZERO,
            }),
            released: Condvar::new(),
            released_task: tokio::sync::Notify::new(),
            armed_cv: Condvar::new(),
            armed_task: tokio::sync::Notify::new(),
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

    /// Called by the training thread after it finished `step` (1 for the first). Returns at
    /// once unless an operation holds this rank here.
    #[inline]
    pub fn step_completed(&self, step: u64) {
        if !self.try_pass(step) {
            self.boundary_slow(step)
        }
    }

    /// [`StepGate::step_completed`] for a training loop that is a task: `None` when the rank
    /// goes on at once (one atomic load and one compare-and-swap with no operation pending),
    /// otherwise the hold, a future that resolves when the gate lets the rank go on. The
    /// state machine, the events and the rules are those of [`StepGate::step_completed`].
    #[inline]
    pub fn step_completed_or_hold(&self, step: u64) -> Option<impl Future<Output = ()> + '_> {
        if self.try_pass(step) {
            return None;
        }
        let mut g = self.inner.lock();
        if !self.boundary_enter(&mut g, step) {
            return None;
        }
        drop(g);
        Some(async move {
            loop {
                let released = self.released_task.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                {
                    let mut g = self.inner.lock();
                    if !Self::holds(&g, step) {
                        Self::boundary_leave(&mut g);
                        return;
                    }
                }
                released.await;
            }
        })
    }

    /// The fast path: publishes `step` unless the gate is armed (then `false`).
    #[inline]
    fn try_pass(&self, step: u64) -> bool {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur & ARMED != 0 {
                return false;
            }
            match self.word.compare_exchange_weak(
                cur,
                SEEN | (step & STEP),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    #[cold]
    fn boundary_slow(&self, step: u64) {
        let mut g = self.inner.lock();
        if self.boundary_enter(&mut g, step) {
            while Self::holds(&g, step) {
                self.released.wait(&mut g);
            }
            Self::boundary_leave(&mut g);
        }
    }

    /// Whether a rank held after `step` must go on holding.
    fn holds(g: &Inner, step: u64) -> bool {
        matches!(g.mode, Mode::HoldAfter { step: bound, .. } if bound <= step)
    }

    /// The rank holds no more: its stall is counted.
    fn boundary_leave(g: &mut Inner) {
        if let Some((_, since)) = g.held.take() {
            g.stalled += since.elapsed();
        }
    }

    /// A boundary of an armed gate: updates the state, emits the event; whether the rank must
    /// now hold (the caller waits until [`StepGate::holds`] is false, then
    /// [`StepGate::boundary_leave`]).
    ///
    /// Events are emitted with the lock released, so a notify callback may call back into
    /// the gate. A hold is recorded before its event goes out (whoever reacts to `Held` sees
    /// [`StepGate::held_step`]), and the condition is checked again after it, since a resume
    /// may have come in between.
    fn boundary_enter(&self, g: &mut MutexGuard<'_, Inner>, step: u64) -> bool {
        g.last = Some(step);
        // Nobody else writes the step bits while the lock is held (the fast path only runs
        // on this thread), so keep the word current for the next sample.
        let armed = self.word.load(Ordering::Acquire) & ARMED;
        self.word
            .store(armed | SEEN | (step & STEP), Ordering::Release);
        let op = match (g.op, g.mode) {
            (Some(op), Mode::Sampling) => {
                // The late answer to a sample: in the next step, holding after it.
                g.mode = Mode::HoldAfter {
                    step: step + 1,
                    pause_step: false,
                };
                MutexGuard::unlocked(g, || {
                    self.emit(GateEvent::Sampled {
                        op,
                        in_step: step + 1,
                    })
                });
                return false;
            }
            (Some(op), Mode::HoldAfter { .. }) => op,
            _ => return false,
        };
        let event = match g.mode {
            Mode::HoldAfter { step: bound, .. } if step < bound => return false,
            // Cannot happen with the two-phase protocol; hold anyway so the group calls never
            // run under a moving loop, and say so.
            Mode::HoldAfter { step: bound, .. } if step > bound => {
                GateEvent::Overran { op, step, bound }
            }
            // Only the manager's pause step is reported: a provisional hold is not a pause.
            Mode::HoldAfter {
                pause_step: true, ..
            } => GateEvent::Held { op, step },
            _ => GateEvent::HeldProvisionally { op, step },
        };
        g.held = Some((step, Instant::now()));
        MutexGuard::unlocked(g, || self.emit(event));
        true
    }

    /// Wakes whoever holds at a boundary (a thread or a task) to check whether it may go on.
    fn wake_held(&self) {
        self.released.notify_all();
        self.released_task.notify_waiters();
    }

    /// Wakes whoever waits for an operation to arm the gate (a thread or a task).
    fn wake_armed(&self) {
        self.armed_cv.notify_all();
        self.armed_task.notify_waiters();
    }

    /// Phase A for operation `op`: returns the step this rank is in, after which it holds at
    /// the latest (unless [`StepGate::pause_at`] raises the bound). `None` when the training
    /// thread has not completed a step yet: it answers with [`GateEvent::Sampled`] at its first
    /// boundary.
    ///
    /// A gate armed for another operation is taken over: the manager starts an operation only
    /// when the one before is over for it, so the other one was orphaned (its manager died)
    /// and a recovery takes its place. The bound stays: a held rank keeps holding.
    pub fn sample(&self, op: OperationId) -> Result<Option<u64>, GateError> {
        let mut g = self.inner.lock();
        if g.mode == Mode::Shutdown {
            return Err(GateError::Shutdown);
        }
        let prev = self.word.fetch_or(ARMED, Ordering::AcqRel);
        if prev & ARMED == 0 {
            // From here on the training thread's boundaries take the lock and update `last`.
            g.last = (prev & SEEN != 0).then_some(prev & STEP);
            g.stalled = Duration::ZERO;
        }
        g.op = Some(op);
        self.wake_armed();
        let in_step = match (g.mode, g.last) {
            // Asked again for the same operation: the answer stands.
            (Mode::HoldAfter { step, .. }, _) => step,
            (_, Some(last)) => last + 1,
            (_, None) => {
                g.mode = Mode::Sampling;
                return Ok(None);
            }
        };
        g.mode = Mode::HoldAfter {
            step: in_step,
            pause_step: false,
        };
        Ok(Some(in_step))
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
        let prev = self.word.fetch_or(ARMED, Ordering::AcqRel);
        if prev & ARMED == 0 {
            g.last = (prev & SEEN != 0).then_some(prev & STEP);
        }
        g.op = Some(op);
        g.mode = Mode::HoldAfter {
            step,
            pause_step: true,
        };
        self.wake_armed();
        match g.held {
            Some((held, _)) if held == step => {
                drop(g);
                self.emit(GateEvent::Held { op, step });
            }
            Some(_) => {
                // Held at an earlier provisional bound: run on to `step`.
                self.wake_held();
            }
            None => {}
        }
        Ok(())
    }

    /// Where the gate stands: the operation it serves and the step it holds after.
    pub fn report(&self) -> GateReport {
        let g = self.inner.lock();
        GateReport {
            op: g.op,
            held_after: g.held.map(|(s, _)| s),
        }
    }

    /// Whether an operation has armed the gate (boundaries take the slow path).
    pub fn is_armed(&self) -> bool {
        self.word.load(Ordering::Acquire) & ARMED != 0
    }

    /// Whether the training thread holds at a boundary now, and after which step.
    pub fn held_step(&self) -> Option<u64> {
        self.inner.lock().held.map(|(s, _)| s)
    }

    /// The step the training thread last completed (`None` before its first boundary).
    pub fn last_step(&self) -> Option<u64> {
        let g = self.inner.lock();
        let w = self.word.load(Ordering::Acquire);
        if w & ARMED != 0 {
            g.last
        } else {
            (w & SEEN != 0).then_some(w & STEP)
        }
    }

    /// Opens the gate if it serves `op` (or no operation). Returns how long training was held
    /// during that operation (zero, and the gate unchanged, when it serves another one: a
    /// late resume must never open a gate a later operation holds).
    pub fn resume(&self, op: OperationId) -> Duration {
        let mut g = self.inner.lock();
        if g.op.is_some_and(|busy| busy != op) {
            return Duration::ZERO;
        }
        if g.mode != Mode::Shutdown {
            g.mode = Mode::Idle;
        }
        g.op = None;
        let mut stalled = g.stalled;
        if let Some((_, since)) = g.held {
            stalled += since.elapsed();
        }
        g.stalled = Duration::ZERO;
        self.disarm(&g);
        self.wake_held();
        stalled
    }

    /// Clears [`ARMED`], leaving the last completed step in the word for the next sample.
    fn disarm(&self, g: &Inner) {
        if self.word.load(Ordering::Acquire) & ARMED != 0 {
            let w = g.last.map_or(0, |l| SEEN | (l & STEP));
            self.word.store(w, Ordering::Release);
        }
    }

    /// Blocks until an operation arms the gate, the gate shuts down, or `timeout` passes;
    /// returns whether it is armed. For a loop with no work between boundaries (a benchmark's
    /// zero-time steps), which would otherwise spin through [`StepGate::step_completed`].
    pub fn wait_armed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.inner.lock();
        while !self.is_armed() && g.mode != Mode::Shutdown {
            if self.armed_cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        self.is_armed()
    }

    /// [`StepGate::wait_armed`] for a loop that is a task: resolves once an operation arms the
    /// gate or it shuts down.
    pub async fn armed(&self) {
        loop {
            let armed = self.armed_task.notified();
            tokio::pin!(armed);
            armed.as_mut().enable();
            if self.is_armed() || self.inner.lock().mode == Mode::Shutdown {
                return;
            }
            armed.await;
        }
    }

    /// Opens the gate for good: the worker is stopping and nobody will resume it.
    pub fn shutdown(&self) {
        let mut g = self.inner.lock();
        g.mode = Mode::Shutdown;
        g.op = None;
        self.disarm(&g);
        self.wake_held();
        self.wake_armed();
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
    fn idle_gate_never_holds_and_publishes_the_step() {
        let (g, rx) = gate();
        for s in 1..1000 {
            g.step_completed(s);
        }
        assert!(rx.try_recv().is_err());
        assert_eq!(g.held_step(), None);
        assert_eq!(g.last_step(), Some(999));
        assert!(!g.is_armed());
    }

    #[test]
    fn sample_answers_at_once_then_pause_holds_exactly_at_t() {
        let (g, rx) = gate();
        g.step_completed(4);
        // The training thread finished step 4: it is in step 5, and says so without having
        // to reach a boundary.
        assert_eq!(g.sample(op(1)), Ok(Some(5)));
        assert!(g.is_armed());
        // The manager picks T = 6 (a peer was a step ahead).
        g.pause_at(op(1), 6).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(5); // passes: 5 < 6
                g.step_completed(6); // holds here
                g.step_completed(7);
                7
            })
        };
        assert_eq!(rx.recv().unwrap(), GateEvent::Held { op: op(1), step: 6 });
        assert_eq!(g.held_step(), Some(6));
        assert!(!trainer.is_finished());
        g.resume(op(1));
        assert_eq!(trainer.join().unwrap(), 7);
        assert_eq!(g.held_step(), None);
        // The step went on being published after the operation.
        assert_eq!(g.last_step(), Some(7));
        assert_eq!(g.sample(op(2)), Ok(Some(8)));
        g.resume(op(2));
    }

    #[test]
    fn a_rank_that_is_a_task_holds_and_goes_on_exactly_as_a_thread() {
        let (g, rx) = gate();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // No operation: nothing to wait for, and the step is published.
        assert!(g.step_completed_or_hold(4).is_none());
        assert_eq!(g.sample(op(1)), Ok(Some(5)));
        g.pause_at(op(1), 6).unwrap();
        // Armed, below the pause step: passes.
        assert!(g.step_completed_or_hold(5).is_none());
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                let hold = g
                    .step_completed_or_hold(6)
                    .expect("holds after the pause step");
                // The task's hold resolves only once the gate opens.
                rt.block_on(hold);
                g.held_step()
            })
        };
        assert_eq!(rx.recv().unwrap(), GateEvent::Held { op: op(1), step: 6 });
        assert_eq!(g.held_step(), Some(6));
        // A resume for another operation opens nothing.
        assert_eq!(g.resume(op(2)), Duration::ZERO);
        assert!(g.resume(op(1)) > Duration::ZERO);
        assert_eq!(trainer.join().unwrap(), None);
        assert_eq!(g.last_step(), Some(6));
        // A task waiting for an operation wakes when one arms the gate.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let waiter = {
            let g = g.clone();
            std::thread::spawn(move || rt.block_on(g.armed()))
        };
        assert_eq!(g.sample(op(3)), Ok(Some(7)));
        waiter.join().unwrap();
        g.resume(op(3));
    }

    #[test]
    fn provisional_hold_is_released_to_the_later_pause_step() {
        let (g, rx) = gate();
        g.step_completed(3);
        assert_eq!(g.sample(op(2)), Ok(Some(4)));
        // Asked again (a repeated directive): the same answer.
        assert_eq!(g.sample(op(2)), Ok(Some(4)));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(4); // holds provisionally
                g.step_completed(5); // holds at T = 5
            })
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 4, .. }
        ));
        g.pause_at(op(2), 5).unwrap();
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 5, .. }
        ));
        let stalled = g.resume(op(2));
        trainer.join().unwrap();
        assert!(stalled > Duration::ZERO);
    }

    #[test]
    fn pause_at_the_held_step_reports_at_once() {
        let (g, rx) = gate();
        g.step_completed(1);
        assert_eq!(g.sample(op(3)), Ok(Some(2)));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || g.step_completed(2))
        };
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
        g.resume(op(3));
        trainer.join().unwrap();
    }

    #[test]
    fn another_operation_is_refused_and_shutdown_frees_the_thread() {
        let (g, rx) = gate();
        g.step_completed(0);
        assert_eq!(g.sample(op(4)), Ok(Some(1)));
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
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 1, .. }
        ));
        g.shutdown();
        trainer.join().unwrap();
        assert_eq!(g.sample(op(6)), Err(GateError::Shutdown));
    }

    #[test]
    fn a_recovery_takes_over_an_orphaned_hold_and_a_stale_resume_opens_nothing() {
        let (g, rx) = gate();
        g.step_completed(8);
        assert_eq!(g.sample(op(10)), Ok(Some(9)));
        g.pause_at(op(10), 9).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(9); // holds for operation 10, whose manager then dies
                g.step_completed(10);
            })
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 9, .. }
        ));
        assert_eq!(
            g.report(),
            GateReport {
                op: Some(op(10)),
                held_after: Some(9)
            }
        );
        // A new manager's recovery takes the gate over: still held, after the same step.
        assert_eq!(g.sample(op(11)), Ok(Some(9)));
        g.pause_at(op(11), 9).unwrap();
        assert!(matches!(rx.recv().unwrap(), GateEvent::Held { op: o, step: 9 } if o == op(11)));
        // The dead operation's late resume opens nothing; the recovery's does.
        assert_eq!(g.resume(op(10)), Duration::ZERO);
        assert_eq!(g.held_step(), Some(9));
        assert!(!trainer.is_finished());
        assert!(g.resume(op(11)) > Duration::ZERO);
        trainer.join().unwrap();
        assert_eq!(g.report(), GateReport::default());
    }

    #[test]
    fn before_its_first_boundary_a_rank_answers_at_that_boundary() {
        // A process resuming from a checkpoint starts at step 100; asked before it completed
        // a step, it cannot know where it is until its first boundary.
        let (g, rx) = gate();
        assert_eq!(g.last_step(), None);
        assert_eq!(g.sample(op(7)), Ok(None));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(100); // answers: in step 101
                g.step_completed(101); // holds provisionally
            })
        };
        assert_eq!(
            rx.recv().unwrap(),
            GateEvent::Sampled {
                op: op(7),
                in_step: 101
            }
        );
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::HeldProvisionally { step: 101, .. }
        ));
        g.pause_at(op(7), 101).unwrap();
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 101, .. }
        ));
        g.resume(op(7));
        trainer.join().unwrap();
        assert_eq!(g.last_step(), Some(101));
    }

    #[test]
    fn events_go_out_with_the_lock_released_and_the_hold_recorded() {
        let g = Arc::new(StepGate::new());
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let weak = Arc::downgrade(&g);
        g.set_notify(move |e| {
            let gate = weak.upgrade().expect("the test keeps the gate");
            // A callback may call back into the gate: it must not find the lock taken.
            let locked = gate.inner.is_locked();
            let held = if locked { None } else { gate.held_step() };
            tx.lock().send((e, locked, held)).unwrap();
        });
        assert_eq!(g.sample(op(9)), Ok(None));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.step_completed(10); // answers the sample: in step 11
                g.step_completed(11); // holds provisionally, then at the pause step
                g.step_completed(12);
            })
        };
        assert_eq!(
            rx.recv().unwrap(),
            (
                GateEvent::Sampled {
                    op: op(9),
                    in_step: 11
                },
                false,
                None
            )
        );
        assert_eq!(
            rx.recv().unwrap(),
            (
                GateEvent::HeldProvisionally {
                    op: op(9),
                    step: 11
                },
                false,
                Some(11)
            )
        );
        g.pause_at(op(9), 11).unwrap();
        assert_eq!(
            rx.recv().unwrap(),
            (
                GateEvent::Held {
                    op: op(9),
                    step: 11
                },
                false,
                Some(11)
            )
        );
        g.resume(op(9));
        trainer.join().unwrap();

        // A loop that jumps past its bound is held and reported, the same way.
        assert_eq!(g.sample(op(10)), Ok(Some(13)));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || g.step_completed(20))
        };
        assert_eq!(
            rx.recv().unwrap(),
            (
                GateEvent::Overran {
                    op: op(10),
                    step: 20,
                    bound: 13
                },
                false,
                Some(20)
            )
        );
        g.resume(op(10));
        trainer.join().unwrap();
    }
}
