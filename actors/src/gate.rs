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
//! Two more things reach a held training thread:
//!
//! - **A call to run on it** ([`StepGate::call_on_training_thread`]): a framework's switch
//!   function must run on the thread that owns the device context and the streams, the one
//!   held here. The worker's HAL thread hands the call over and waits for its answer; the
//!   training thread runs it inside `step_completed`, then goes back to holding.
//! - **A stop** ([`StepGate::stop_training`]): the manager stopped training. A held thread
//!   (or one arriving at a boundary) gets [`StepOutcome::Stop`] instead of a resume, at every
//!   boundary from then on: the process ends its loop, and its launcher restarts it.
//!
//! And one thing a training thread may wait for before its first step:
//!
//! - **The whole job** ([`StepGate::wait_job_whole`]): the manager starts a verification round
//!   only once every rank of the job is registered, so the first one that asks this rank
//!   ([`StepGate::job_whole`]) says that every peer's process has come up. A restarted rank of
//!   a framework whose peers find each other through addresses kept from before the restart
//!   (MindSpore's CPU collectives) waits here, so that its first collective does not run ahead
//!   of a peer still starting.
//!
//! A simulated rank that is a task rather than a thread (the simulator runs thousands in one
//! process) calls [`StepGate::step_completed_or_hold`] instead: the same step, the same state
//! machine and events, only a hold is a future to await instead of a blocked thread.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use taskd_core::inflight::InFlightFramework;
use taskd_core::protocol::GateReport;
use taskd_core::{OperationId, StepBoundary, StepOutcome};

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
    /// Training was stopped; the gate never holds or runs a call again.
    #[error("training was stopped: {0}")]
    Stopped(String),
    /// A call for the training thread, which is not held at the gate (or holds as a task,
    /// which cannot run a blocking call).
    #[error("training is not held at the step gate: nothing can run on its thread")]
    NotHeld,
    /// The call did not answer within its time (it may still be running on the training
    /// thread, which then goes on holding once it returns).
    #[error("the call on the training thread did not return within {0:?}")]
    CallTimedOut(Duration),
    /// The call ended without an answer (it panicked).
    #[error("the call on the training thread ended without an answer (it panicked)")]
    CallLost,
}

/// A call waiting for the held training thread.
type Call = Box<dyn FnOnce() + Send>;

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
    /// Why training was stopped, once it was: every boundary from then on says so.
    stopped: Option<String>,
    /// A call handed to the held training thread, not started yet.
    call: Option<Call>,
    /// Whether the training thread holds as a thread (it can run a call) rather than a task.
    thread_held: bool,
    /// The manager has asked this rank in a verification round (see [`StepGate::job_whole`]).
    whole: bool,
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
    /// Signalled when the job is whole (see [`StepGate::wait_job_whole`]).
    whole_cv: Condvar,
    notify: OnceLock<Notify>,
    /// The training process's framework side of an in-flight move, once it registered one
    /// ([`StepGate::set_in_flight`]).
    in_flight: OnceLock<Arc<dyn InFlightFramework>>,
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
                stopped: None,
                call: None,
                thread_held: false,
                whole: false,
            }),
            released: Condvar::new(),
            released_task: tokio::sync::Notify::new(),
            armed_cv: Condvar::new(),
            armed_task: tokio::sync::Notify::new(),
            whole_cv: Condvar::new(),
            notify: OnceLock::new(),
            in_flight: OnceLock::new(),
        }
    }

    /// Registers how this training process aborts its collectives in flight and finishes
    /// the step on rebuilt groups (an in-flight move, `taskd_core::inflight`): the worker
    /// finds it here. Only the first call takes effect; `false` when one was registered.
    pub fn set_in_flight(&self, f: Arc<dyn InFlightFramework>) -> bool {
        self.in_flight.set(f).is_ok()
    }

    /// The framework's side of an in-flight move, if the process registered one.
    pub fn in_flight(&self) -> Option<Arc<dyn InFlightFramework>> {
        self.in_flight.get().cloned()
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
    /// once unless an operation holds this rank here; while it holds, the thread runs the
    /// calls handed to it ([`StepGate::call_on_training_thread`]). [`StepOutcome::Stop`]
    /// once training was stopped: the loop must end.
    #[inline]
    pub fn step_completed(&self, step: u64) -> StepOutcome {
        if self.try_pass(step) {
            StepOutcome::Go
        } else {
            self.boundary_slow(step)
        }
    }

    /// [`StepGate::step_completed`] for a training loop that is a task: `None` when the rank
    /// goes on at once (one atomic load and one compare-and-swap with no operation pending),
    /// otherwise a future that resolves when the gate lets the rank go on, or tells it to
    /// stop. The state machine, the events and the rules are those of
    /// [`StepGate::step_completed`]; a task runs no calls (it is not a thread).
    #[inline]
    pub fn step_completed_or_hold(
        &self,
        step: u64,
    ) -> Option<impl Future<Output = StepOutcome> + '_> {
        if self.try_pass(step) {
            return None;
        }
        let mut g = self.inner.lock();
        let stopped = g.stopped.is_some();
        let hold = !stopped && self.boundary_enter(&mut g, step);
        if !hold && !stopped {
            return None;
        }
        drop(g);
        Some(async move {
            if hold {
                loop {
                    let released = self.released_task.notified();
                    tokio::pin!(released);
                    released.as_mut().enable();
                    {
                        let mut g = self.inner.lock();
                        if !Self::holds(&g, step) {
                            Self::boundary_leave(&mut g);
                            break;
                        }
                    }
                    released.await;
                }
            }
            Self::outcome(&self.inner.lock())
        })
    }

    /// Go on, or the stop.
    fn outcome(g: &Inner) -> StepOutcome {
        match &g.stopped {
            Some(why) => StepOutcome::Stop(why.clone()),
            None => StepOutcome::Go,
        }
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
    fn boundary_slow(&self, step: u64) -> StepOutcome {
        let mut g = self.inner.lock();
        // Marked before the hold's event goes out: whoever reacts to it may hand a call over.
        g.thread_held = true;
        if g.stopped.is_none() && self.boundary_enter(&mut g, step) {
            loop {
                if let Some(call) = g.call.take() {
                    // A panic in the call must not unwind out of the gate: its caller sees the
                    // answer lost.
                    MutexGuard::unlocked(&mut g, || {
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
                    });
                    continue;
                }
                if !Self::holds(&g, step) {
                    break;
                }
                self.released.wait(&mut g);
            }
            Self::boundary_leave(&mut g);
        }
        g.thread_held = false;
        Self::outcome(&g)
    }

    /// Whether a rank held after `step` must go on holding (never once training stopped).
    fn holds(g: &Inner, step: u64) -> bool {
        g.stopped.is_none()
            && matches!(g.mode, Mode::HoldAfter { step: bound, .. } if bound <= step)
    }

    /// Runs `f` on the training thread held at this gate and returns its answer, waiting at
    /// most `wait` for it. The held thread runs it inside its `step_completed`, then goes on
    /// holding. Refused when the training thread is not held (nothing may run on it while it
    /// trains) or training was stopped. A call the thread has not started when `wait` ends
    /// is withdrawn; one it has started goes on to its end, and the thread runs a later call
    /// after it.
    ///
    /// # Errors
    /// [`GateError::NotHeld`], [`GateError::Stopped`], [`GateError::CallTimedOut`],
    /// [`GateError::CallLost`] (`f` panicked).
    pub fn call_on_training_thread<R: Send + 'static>(
        &self,
        wait: Duration,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, GateError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut g = self.inner.lock();
            if let Some(why) = &g.stopped {
                return Err(GateError::Stopped(why.clone()));
            }
            if !g.thread_held || g.held.is_none() || g.call.is_some() {
                return Err(GateError::NotHeld);
            }
            g.call = Some(Box::new(move || {
                let _ = tx.send(f());
            }));
        }
        self.released.notify_all();
        match rx.recv_timeout(wait) {
            Ok(answer) => Ok(answer),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // Not started yet: withdraw it (one caller at a time: the slot is this one's).
                self.inner.lock().call = None;
                Err(GateError::CallTimedOut(wait))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(GateError::CallLost),
        }
    }

    /// Stops training for good: a rank held at the gate, or arriving at a boundary from now
    /// on, gets [`StepOutcome::Stop`] with `reason`, and the gate never holds, resumes or
    /// runs a call again. Returns whether this call stopped it (`false`: it already was).
    pub fn stop_training(&self, reason: &str) -> bool {
        let mut g = self.inner.lock();
        if g.stopped.is_some() {
            return false;
        }
        g.stopped = Some(reason.to_owned());
        g.op = None;
        g.call = None;
        // Every boundary takes the slow path from now on, and finds the stop there.
        self.word.fetch_or(ARMED, Ordering::AcqRel);
        self.wake_held();
        self.wake_armed();
        true
    }

    /// Why training was stopped, once it was.
    pub fn stopped(&self) -> Option<String> {
        self.inner.lock().stopped.clone()
    }

    /// Resolves, with the reason, once training was stopped: for a process whose training
    /// loop runs elsewhere and which must then exit for its launcher to restart it.
    pub async fn training_stopped(&self) -> String {
        loop {
            let armed = self.armed_task.notified();
            tokio::pin!(armed);
            armed.as_mut().enable();
            if let Some(why) = self.stopped() {
                return why;
            }
            armed.await;
        }
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
        if let Some(why) = &g.stopped {
            return Err(GateError::Stopped(why.clone()));
        }
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
        if let Some(why) = &g.stopped {
            return Err(GateError::Stopped(why.clone()));
        }
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
        if g.op.is_some_and(|busy| busy != op) || g.stopped.is_some() {
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

    /// Clears [`ARMED`], leaving the last completed step in the word for the next sample. A
    /// stopped gate stays armed: its boundaries must find the stop.
    fn disarm(&self, g: &Inner) {
        if g.stopped.is_none() && self.word.load(Ordering::Acquire) & ARMED != 0 {
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
        self.whole_cv.notify_all();
    }

    /// The manager asked this rank in a verification round, which it starts only once every
    /// rank of the job is registered: the job is whole. Called by the worker.
    pub fn job_whole(&self) {
        let mut g = self.inner.lock();
        if !g.whole {
            g.whole = true;
            self.whole_cv.notify_all();
        }
    }

    /// Blocks until the job is whole ([`StepGate::job_whole`]), the gate shuts down, or
    /// `timeout` passes (`None`: no bound); returns whether the job is whole.
    pub fn wait_job_whole(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.inner.lock();
        while !g.whole && g.mode != Mode::Shutdown {
            match deadline {
                Some(d) => {
                    if self.whole_cv.wait_until(&mut g, d).timed_out() {
                        break;
                    }
                }
                None => self.whole_cv.wait(&mut g),
            }
        }
        g.whole
    }
}

impl StepBoundary for StepGate {
    fn step_completed(&self, step: u64) -> StepOutcome {
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

    /// The boundary let the rank go on.
    fn go(o: StepOutcome) {
        assert_eq!(o, StepOutcome::Go);
    }

    fn gate() -> (Arc<StepGate>, mpsc::Receiver<GateEvent>) {
        let g = Arc::new(StepGate::new());
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        g.set_notify(move |e| tx.lock().send(e).unwrap());
        (g, rx)
    }

    #[test]
    fn a_thread_waiting_for_the_whole_job_is_let_go_by_the_first_round_or_a_shutdown() {
        let (g, _rx) = gate();
        assert!(!g.wait_job_whole(Some(Duration::ZERO)), "no round yet");
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let g = g.clone();
            std::thread::spawn(move || {
                tx.send(()).unwrap();
                g.wait_job_whole(None)
            })
        };
        rx.recv().unwrap();
        g.job_whole();
        assert!(waiter.join().unwrap());
        g.job_whole(); // a later round changes nothing
        assert!(g.wait_job_whole(Some(Duration::ZERO)));

        let (g, _rx) = gate();
        let waiter = {
            let g = g.clone();
            std::thread::spawn(move || g.wait_job_whole(None))
        };
        g.shutdown();
        assert!(
            !waiter.join().unwrap(),
            "a stopping worker lets it go, not whole"
        );
    }

    #[test]
    fn idle_gate_never_holds_and_publishes_the_step() {
        let (g, rx) = gate();
        for s in 1..1000 {
            go(g.step_completed(s));
        }
        assert!(rx.try_recv().is_err());
        assert_eq!(g.held_step(), None);
        assert_eq!(g.last_step(), Some(999));
        assert!(!g.is_armed());
    }

    #[test]
    fn sample_answers_at_once_then_pause_holds_exactly_at_t() {
        let (g, rx) = gate();
        go(g.step_completed(4));
        // The training thread finished step 4: it is in step 5, and says so without having
        // to reach a boundary.
        assert_eq!(g.sample(op(1)), Ok(Some(5)));
        assert!(g.is_armed());
        // The manager picks T = 6 (a peer was a step ahead).
        g.pause_at(op(1), 6).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                go(g.step_completed(5)); // passes: 5 < 6
                go(g.step_completed(6)); // holds here
                go(g.step_completed(7));
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
                go(rt.block_on(hold));
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
        go(g.step_completed(3));
        assert_eq!(g.sample(op(2)), Ok(Some(4)));
        // Asked again (a repeated directive): the same answer.
        assert_eq!(g.sample(op(2)), Ok(Some(4)));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                go(g.step_completed(4)); // holds provisionally
                go(g.step_completed(5)); // holds at T = 5
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
        go(g.step_completed(1));
        assert_eq!(g.sample(op(3)), Ok(Some(2)));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || go(g.step_completed(2)))
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
        go(g.step_completed(0));
        assert_eq!(g.sample(op(4)), Ok(Some(1)));
        assert!(matches!(
            g.pause_at(op(5), 3),
            Err(GateError::OtherOperation { .. })
        ));
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                go(g.step_completed(1));
                go(g.step_completed(2));
                go(g.step_completed(3));
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
        go(g.step_completed(8));
        assert_eq!(g.sample(op(10)), Ok(Some(9)));
        g.pause_at(op(10), 9).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                go(g.step_completed(9)); // holds for operation 10, whose manager then dies
                go(g.step_completed(10));
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
                go(g.step_completed(100)); // answers: in step 101
                go(g.step_completed(101)); // holds provisionally
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
                go(g.step_completed(10)); // answers the sample: in step 11
                go(g.step_completed(11)); // holds provisionally, then at the pause step
                go(g.step_completed(12));
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
            std::thread::spawn(move || go(g.step_completed(20)))
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

    #[test]
    fn a_stop_reaches_a_held_thread_and_every_later_boundary() {
        let (g, rx) = gate();
        go(g.step_completed(3));
        assert_eq!(g.sample(op(20)), Ok(Some(4)));
        g.pause_at(op(20), 4).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                let at_hold = g.step_completed(4);
                (at_hold, g.step_completed(5))
            })
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 4, .. }
        ));
        assert!(g.stop_training("the rollback failed"));
        assert!(!g.stop_training("again"), "the first reason stands");
        let stop = StepOutcome::Stop("the rollback failed".into());
        assert_eq!(trainer.join().unwrap(), (stop.clone(), stop.clone()));
        // Nothing holds, resumes or samples a stopped gate again.
        assert_eq!(g.resume(op(20)), Duration::ZERO);
        assert_eq!(g.step_completed(6), stop);
        assert_eq!(
            g.sample(op(21)),
            Err(GateError::Stopped("the rollback failed".into()))
        );
        assert_eq!(g.stopped().as_deref(), Some("the rollback failed"));
        // A rank that is a task learns it the same way.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let hold = g
            .step_completed_or_hold(7)
            .expect("a stopped gate never passes");
        assert_eq!(rt.block_on(hold), stop);
        assert_eq!(rt.block_on(g.training_stopped()), "the rollback failed");
    }

    #[test]
    fn a_call_runs_on_the_held_training_thread_then_the_thread_holds_on() {
        let (g, rx) = gate();
        // Not held: nothing may run on a thread that trains.
        assert_eq!(
            g.call_on_training_thread(Duration::from_secs(5), || ()),
            Err(GateError::NotHeld)
        );
        go(g.step_completed(1));
        assert_eq!(g.sample(op(30)), Ok(Some(2)));
        g.pause_at(op(30), 2).unwrap();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || {
                let me = std::thread::current().id();
                (me, g.step_completed(2))
            })
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 2, .. }
        ));
        let ran_on = g
            .call_on_training_thread(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        // A second call (the rollback) runs there too; a panicking one answers as lost.
        let again = g
            .call_on_training_thread(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        assert_eq!(
            g.call_on_training_thread(Duration::from_secs(60), || panic!("the framework")),
            Err::<(), _>(GateError::CallLost)
        );
        assert_eq!(g.held_step(), Some(2), "still held after its calls");
        g.resume(op(30));
        let (trainer_id, outcome) = trainer.join().unwrap();
        go(outcome);
        assert_eq!((ran_on, again), (trainer_id, trainer_id));
        assert_ne!(ran_on, std::thread::current().id());
    }

    #[test]
    fn a_call_the_thread_never_starts_is_withdrawn_at_its_deadline() {
        let (g, rx) = gate();
        go(g.step_completed(1));
        assert_eq!(g.sample(op(31)), Ok(Some(2)));
        g.pause_at(op(31), 2).unwrap();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let trainer = {
            let g = g.clone();
            std::thread::spawn(move || g.step_completed(2))
        };
        assert!(matches!(
            rx.recv().unwrap(),
            GateEvent::Held { step: 2, .. }
        ));
        // The first call blocks the training thread (a framework function that hangs) ...
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let blocker = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.call_on_training_thread(Duration::from_secs(60), move || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
            })
        };
        // ... so a second one, posted once the first started, is never started and is
        // withdrawn when its wait ends.
        started_rx.recv().unwrap();
        assert_eq!(
            g.call_on_training_thread(Duration::from_millis(1), || 7),
            Err(GateError::CallTimedOut(Duration::from_millis(1)))
        );
        assert!(g.inner.lock().call.is_none());
        release_tx.send(()).unwrap();
        assert_eq!(blocker.join().unwrap(), Ok(()));
        g.resume(op(31));
        go(trainer.join().unwrap());
    }
}
