//! A simulated training job: one task per rank, each step a blocking all-reduce on every group
//! of the rank (the training operator, [`Collective::TRAINING`]), every few steps an
//! evaluation all-reduce on the world group (an operator of a size not issued before,
//! [`Collective::evaluation`]), then the step-boundary hook (where a pause holds the rank).
//!
//! It reproduces what makes pausing hard on real hardware: a rank that stops calling
//! collectives leaves its peers blocked inside one (until the HCCL timeout), so a wrong pause
//! protocol deadlocks the simulation just as it would a real job.
//!
//! A rank is a task, not a thread: the ranks of a job run on a small runtime of their own
//! ([`TrainingOptions::threads`] threads), a rank waiting in a collective or held at its step
//! boundary is a parked task, and a job of 16,384 ranks costs a few hundred bytes per rank
//! instead of two thread stacks. To the rank nothing changes: it waits in the collective until
//! its peers arrive, and in its hook until the hook lets it go.

use crate::fabric::{deadline_after, Fabric, WORLD_GROUP};
use crate::operator::Collective;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::{GlobalRank, HalErrorKind, StepOutcome};

/// How the simulated training behaves.
///
/// Why: tests want fast steps; demos want visible ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainingOptions {
    /// Simulated compute per step, spent before the step's collectives. Default 2 ms.
    pub step_time: Duration,
    /// Every this many steps, the step ends with an evaluation: an all-reduce on the world
    /// group of a size no earlier step used, so HCCL sees an operator it has not issued
    /// before, which after a switch runs on the default NIC ([`crate::operator`]). Default 3;
    /// 0 never evaluates.
    pub eval_every: u64,
    /// Threads the ranks' tasks run on. Default: the machine's cores, at most 4.
    pub threads: usize,
}

impl Default for TrainingOptions {
    fn default() -> Self {
        TrainingOptions {
            step_time: Duration::from_millis(2),
            eval_every: 3,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
        }
    }
}

/// Why a rank's training loop ended.
///
/// Why: a test distinguishes a clean stop from a job that died under it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RankExit {
    /// It completed the step given to [`SimTraining::stop_after`].
    Stopped,
    /// The fabric was shut down.
    Shutdown,
    /// Its own process was killed.
    Killed,
    /// A peer died (`HCCL_E_REMOTE`): the job needs process-level recovery.
    PeerLost,
    /// The step hook panicked.
    Panicked,
    /// The manager stopped training (the step hook said [`StepOutcome::Stop`]): the process
    /// exits (the fabric sees it die) and its launcher restarts it.
    TrainingStopped,
}

/// The end state of a simulated training run.
///
/// Why: lets a test assert "every rank finished the same step, nothing failed" in one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainingSummary {
    /// Steps completed, by global rank.
    pub steps: Vec<u64>,
    /// Collectives that returned an error (not counting those ended by shutdown).
    pub collective_failures: u64,
    /// Why each rank's loop ended, by global rank.
    pub exits: Vec<RankExit>,
}

impl TrainingSummary {
    /// Fewest steps any rank completed.
    pub fn min_steps(&self) -> u64 {
        self.steps.iter().copied().min().unwrap_or(0)
    }

    /// Most steps any rank completed.
    pub fn max_steps(&self) -> u64 {
        self.steps.iter().copied().max().unwrap_or(0)
    }
}

/// What a rank waits for at a step boundary before its next step: then it goes on, or stops.
pub type Hold<'a> = Pin<Box<dyn Future<Output = StepOutcome> + Send + 'a>>;

/// The hook a simulated rank calls at every step boundary, after it completed `step` (1 for
/// the first): `None` to go on at once, or what to wait for first (a pause holds the rank
/// there). The simulated form of [`taskd_core::StepBoundary`], for ranks that are tasks.
///
/// Why not `StepBoundary`: its call blocks the calling thread while the rank is held, and a
/// rank here is a task sharing its thread with thousands of others.
pub trait StepHook: Send + Sync {
    /// Step `step` completed.
    fn step_completed(&self, step: u64) -> Option<Hold<'_>>;
}

/// A step hook that never pauses.
///
/// Why: the training loop needs a hook per rank even when a test does not pause it.
#[derive(Copy, Clone, Debug, Default)]
pub struct NoPause;

impl StepHook for NoPause {
    fn step_completed(&self, _step: u64) -> Option<Hold<'_>> {
        None
    }
}

/// `world` hooks that never pause, for [`SimTraining::start`].
pub fn no_pause_hooks(world: u32) -> Vec<Arc<dyn StepHook>> {
    (0..world)
        .map(|_| Arc::new(NoPause) as Arc<dyn StepHook>)
        .collect()
}

struct TrainState {
    /// Last step each rank completed.
    completed: Vec<u64>,
    /// How many ranks completed exactly each step (their last): the first key is the fewest
    /// steps any rank completed, the last the most, without a pass over every rank.
    by_step: BTreeMap<u64, usize>,
    /// The latest step any rank started.
    max_started: u64,
    failures: u64,
    stop_after: Option<u64>,
    running: usize,
}

impl TrainState {
    fn min(&self) -> u64 {
        self.by_step.keys().next().copied().unwrap_or(0)
    }

    fn max(&self) -> u64 {
        self.by_step.keys().next_back().copied().unwrap_or(0)
    }

    /// Rank `r` completed `step`; whether the fewest steps any rank completed went up.
    fn complete(&mut self, r: usize, step: u64) -> bool {
        let min_before = self.min();
        let old = std::mem::replace(&mut self.completed[r], step);
        if let Some(n) = self.by_step.get_mut(&old) {
            *n -= 1;
            if *n == 0 {
                self.by_step.remove(&old);
            }
        }
        *self.by_step.entry(step).or_default() += 1;
        self.min() != min_before
    }
}

struct Shared {
    state: Mutex<TrainState>,
    /// Signalled when the fewest completed steps goes up, a failure is counted or a rank's
    /// loop ends: what [`SimTraining::wait_min_steps`] waits for.
    cv: Condvar,
}

/// Decrements the running count when a rank's task ends, even by panic.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.state.lock().running -= 1;
        self.0.cv.notify_all();
    }
}

/// A running simulated training job (one task per rank).
///
/// Why: the control plane's pause/switch/resume must be tested against a loop that really
/// blocks in collectives, not against a counter.
pub struct SimTraining {
    fabric: Arc<Fabric>,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<RankExit>>,
}

impl SimTraining {
    /// Starts one task per rank. Each step: `opts.step_time` of simulated compute, then a
    /// blocking all-reduce on each of the rank's groups in the fabric's fixed global order
    /// (world, tp, dp: the same relative order on every rank, so no step can deadlock by
    /// itself), then `hooks[rank].step_completed(step)`.
    ///
    /// A failed collective does not retry or abandon the step: it is counted in
    /// [`SimTraining::collective_failures`] and the step carries on, so every rank's
    /// collective count, and hence its step number, stays aligned with its peers'. A rank
    /// stops on [`SimTraining::stop_after`], on [`Fabric::shutdown`], when killed, or when a
    /// peer died (`HCCL_E_REMOTE`).
    ///
    /// # Panics
    /// If `hooks.len()` is not the fabric's world size, or the runtime cannot start.
    pub fn start(
        fabric: Arc<Fabric>,
        hooks: Vec<Arc<dyn StepHook>>,
        opts: TrainingOptions,
    ) -> SimTraining {
        let world = fabric.world_size() as usize;
        assert_eq!(
            hooks.len(),
            world,
            "SimTraining needs one hook per rank (index = global rank)"
        );
        let shared = Arc::new(Shared {
            state: Mutex::new(TrainState {
                completed: vec![0; world],
                by_step: BTreeMap::from([(0, world)]),
                max_started: 0,
                failures: 0,
                stop_after: None,
                running: world,
            }),
            cv: Condvar::new(),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads.max(1))
            .thread_name("sim-ranks")
            .enable_time()
            .build()
            .expect("starting the simulated ranks' runtime");
        let tasks = hooks
            .into_iter()
            .enumerate()
            .map(|(r, hook)| {
                let rank = GlobalRank(r as u32);
                let fabric = Arc::clone(&fabric);
                let running = Running(Arc::clone(&shared));
                let opts = opts.clone();
                runtime.spawn(async move {
                    run_rank(&fabric, &running.0, hook.as_ref(), rank, &opts).await
                })
            })
            .collect();
        SimTraining {
            fabric,
            shared,
            runtime,
            tasks,
        }
    }

    /// The fabric the job runs on.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// Steps `rank` has completed (its counter is updated before its hook is called, so a
    /// rank paused after step `T` reads `T`). 0 for an unknown rank.
    pub fn steps_completed(&self, rank: GlobalRank) -> u64 {
        self.shared
            .state
            .lock()
            .completed
            .get(rank.0 as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Fewest steps any rank completed.
    pub fn min_steps(&self) -> u64 {
        self.shared.state.lock().min()
    }

    /// Most steps any rank completed.
    pub fn max_steps(&self) -> u64 {
        self.shared.state.lock().max()
    }

    /// Waits until every rank completed at least `n` steps. Returns `false` on timeout or
    /// when every rank's loop has ended first.
    pub fn wait_min_steps(&self, n: u64, timeout: Duration) -> bool {
        let deadline = deadline_after(timeout);
        let mut st = self.shared.state.lock();
        loop {
            if st.min() >= n {
                return true;
            }
            if st.running == 0 {
                return false;
            }
            match deadline {
                None => self.shared.cv.wait(&mut st),
                Some(d) => {
                    if self.shared.cv.wait_until(&mut st, d).timed_out() {
                        return st.min() >= n;
                    }
                }
            }
        }
    }

    /// Waits until every rank's loop has ended (a stop of training ends them at their gates).
    /// Returns `false` on timeout.
    pub fn wait_ended(&self, timeout: Duration) -> bool {
        let deadline = deadline_after(timeout);
        let mut st = self.shared.state.lock();
        while st.running > 0 {
            match deadline {
                None => self.shared.cv.wait(&mut st),
                Some(d) => {
                    if self.shared.cv.wait_until(&mut st, d).timed_out() {
                        return st.running == 0;
                    }
                }
            }
        }
        true
    }

    /// How many ranks' loops have not ended yet (training, blocked in a collective or held at
    /// their step boundary).
    pub fn running(&self) -> usize {
        self.shared.state.lock().running
    }

    /// Collectives that returned an error so far (not counting those ended by shutdown).
    pub fn collective_failures(&self) -> u64 {
        self.shared.state.lock().failures
    }

    /// Every rank stops after completing `step`, so nobody is left inside a collective.
    /// If some rank has already started a later step, everyone stops after that one instead;
    /// a stop can be moved earlier but never later once set. Returns the step every rank
    /// will stop after.
    pub fn stop_after(&self, step: u64) -> u64 {
        let mut st = self.shared.state.lock();
        let stop = step.max(st.max_started);
        let stop = st.stop_after.map_or(stop, |s| s.min(stop));
        st.stop_after = Some(stop);
        self.shared.cv.notify_all();
        stop
    }

    /// Waits for every rank's loop to end. Call it after [`SimTraining::stop_after`] or
    /// [`Fabric::shutdown`]; otherwise it waits for ever (a rank held in its hook or blocked in
    /// a collective never ends by itself). Call it from outside the ranks' runtime.
    pub fn join(self) -> TrainingSummary {
        let SimTraining {
            shared,
            runtime,
            tasks,
            ..
        } = self;
        let exits = runtime.block_on(async move {
            let mut exits = Vec::with_capacity(tasks.len());
            for t in tasks {
                exits.push(t.await.unwrap_or(RankExit::Panicked));
            }
            exits
        });
        let st = shared.state.lock();
        TrainingSummary {
            steps: st.completed.clone(),
            collective_failures: st.failures,
            exits,
        }
    }
}

async fn run_rank(
    fabric: &Fabric,
    shared: &Shared,
    hook: &dyn StepHook,
    rank: GlobalRank,
    opts: &TrainingOptions,
) -> RankExit {
    let r = rank.0 as usize;
    let groups = fabric.group_names_of(rank);
    let mut step = 0u64;
    loop {
        let next = step + 1;
        {
            let mut st = shared.state.lock();
            if st.stop_after.is_some_and(|s| next > s) {
                return RankExit::Stopped;
            }
            st.max_started = st.max_started.max(next);
        }
        if !opts.step_time.is_zero() {
            tokio::time::sleep(opts.step_time).await; // simulated compute, not synchronisation
        }
        let mut calls: Vec<(&str, Collective)> = groups
            .iter()
            .map(|g| (g.as_str(), Collective::TRAINING))
            .collect();
        if opts.eval_every > 0 && next % opts.eval_every == 0 {
            calls.push((WORLD_GROUP, Collective::evaluation(next / opts.eval_every)));
        }
        for (g, op) in calls {
            if let Err(exit) = collective(fabric, shared, rank, next, g, op).await {
                return exit;
            }
        }
        step = next;
        if shared.state.lock().complete(r, step) {
            shared.cv.notify_all();
        }
        if let Some(hold) = hook.step_completed(step) {
            if hold.await.is_stop() {
                // The process exits: its communicators go with it, and a peer already
                // waiting in the next step's collective learns it (HCCL_E_REMOTE).
                fabric.kill_rank(rank);
                return RankExit::TrainingStopped;
            }
        }
    }
}

/// One collective of a step. A failure is counted and the step carries on, unless it ends the
/// rank (shutdown, killed, a peer lost).
async fn collective(
    fabric: &Fabric,
    shared: &Shared,
    rank: GlobalRank,
    step: u64,
    group: &str,
    op: Collective,
) -> Result<(), RankExit> {
    let Err(e) = fabric.collective_async(group, rank, op, 1.0).await else {
        return Ok(());
    };
    if fabric.is_shut_down() {
        return Err(RankExit::Shutdown);
    }
    shared.state.lock().failures += 1;
    shared.cv.notify_all();
    if fabric.is_dead(rank) {
        return Err(RankExit::Killed);
    }
    if e.kind == HalErrorKind::PeerLost {
        return Err(RankExit::PeerLost);
    }
    tracing::debug!(rank = rank.0, step, error = %e, "sim training: collective failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use taskd_core::DeviceId;

    fn fast() -> TrainingOptions {
        TrainingOptions {
            step_time: Duration::from_millis(1),
            ..TrainingOptions::default()
        }
    }

    /// A step hook that holds every rank reaching `step` until released, counting them.
    struct Gate {
        step: u64,
        state: Mutex<(usize, bool)>, // (ranks held, released)
        cv: Condvar,
        released: tokio::sync::Notify,
    }

    impl Gate {
        fn new(step: u64) -> Arc<Gate> {
            Arc::new(Gate {
                step,
                state: Mutex::new((0, false)),
                cv: Condvar::new(),
                released: tokio::sync::Notify::new(),
            })
        }
        fn wait_held(&self, n: usize) -> bool {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let mut st = self.state.lock();
            while st.0 < n {
                if self.cv.wait_until(&mut st, deadline).timed_out() {
                    return false;
                }
            }
            true
        }
        fn release(&self) {
            self.state.lock().1 = true;
            self.released.notify_waiters();
        }
    }

    impl StepHook for Gate {
        fn step_completed(&self, step: u64) -> Option<Hold<'_>> {
            if step != self.step {
                return None;
            }
            self.state.lock().0 += 1;
            self.cv.notify_all();
            Some(Box::pin(async move {
                loop {
                    let released = self.released.notified();
                    tokio::pin!(released);
                    released.as_mut().enable();
                    if self.state.lock().1 {
                        return StepOutcome::Go;
                    }
                    released.await;
                }
            }))
        }
    }

    #[test]
    fn runs_steps_and_stops_cleanly() {
        let f = fabric(2, 4, 4);
        let t = SimTraining::start(Arc::clone(&f), no_pause_hooks(8), fast());
        assert!(t.wait_min_steps(10, Duration::from_secs(5)));
        let stop = t.stop_after(12);
        assert!(stop >= 12);
        let summary = t.join();
        assert_eq!(summary.steps, vec![stop; 8]);
        assert_eq!(summary.exits, vec![RankExit::Stopped; 8]);
        assert_eq!(summary.collective_failures, 0);
        assert!(f.check_consistency().is_consistent());
        assert!(f.violations().is_empty(), "{:?}", f.violations());
        assert_eq!(f.activity().waiting_in_collective, []);
    }

    #[test]
    fn a_rank_held_in_its_hook_blocks_its_peers_until_shutdown() {
        let f = fabric(2, 4, 4);
        let gate = Gate::new(3);
        let mut hooks = no_pause_hooks(8);
        hooks[3] = gate.clone();
        let t = SimTraining::start(Arc::clone(&f), hooks, fast());
        // Rank 3 stops at its step boundary and never calls the next collective: its seven
        // peers finish step 3 and then all sit in the world all-reduce of step 4. (Waiting for
        // the count first: a peer still waking from step 3's world all-reduce is seen waiting
        // in the world group too.)
        assert!(gate.wait_held(1));
        assert!(t.wait_min_steps(3, Duration::from_secs(5)));
        assert!(f.wait_activity(Duration::from_secs(5), |a| {
            a.waiting_in_collective.len() == 7
                && a.waiting_in_collective
                    .iter()
                    .all(|(g, r)| g == crate::WORLD_GROUP && r.0 != 3)
        }));
        for rank in 0..8 {
            assert_eq!(t.steps_completed(r(rank)), 3);
        }
        assert!(!t.wait_min_steps(4, Duration::from_millis(50)));
        assert_eq!((t.min_steps(), t.max_steps()), (3, 3));
        // Only the end of the simulation frees them.
        f.shutdown();
        gate.release();
        let summary = t.join();
        assert_eq!(summary.exits, vec![RankExit::Shutdown; 8]);
        assert_eq!(summary.steps, vec![3; 8]);
        assert_eq!(summary.collective_failures, 0);
    }

    /// Starts `opts` training on a 2 x 4 fabric, holds every rank after step 5, moves rank 2
    /// (node-0/dev-2, whose port then goes down) to its backup NIC, trains to step 10 or
    /// later. Returns the fabric, the summary and the step training stopped after.
    fn switch_at_step_5_with_the_primary_down(
        opts: TrainingOptions,
    ) -> (Arc<Fabric>, TrainingSummary, u64) {
        let f = fabric(2, 4, 4);
        let gate = Gate::new(5);
        let hooks: Vec<Arc<dyn StepHook>> =
            (0..8).map(|_| gate.clone() as Arc<dyn StepHook>).collect();
        let t = SimTraining::start(Arc::clone(&f), hooks, opts);
        // Every rank finishes step 5 and waits at the boundary: no collective in flight.
        assert!(gate.wait_held(8));
        assert_eq!(f.activity().waiting_in_collective, []);
        // node-0/dev-2's port flaps; every worker moves rank 2 onto its backup NIC.
        f.set_link(0, DeviceId(2), false);
        assert_all_ok(&switch_all(&f, &[(2, true)]));
        assert!(f.check_consistency().is_consistent());
        gate.release();
        assert!(t.wait_min_steps(10, Duration::from_secs(5)));
        let stop = t.stop_after(10);
        (f, t.join(), stop)
    }

    #[test]
    fn pause_at_a_step_boundary_switch_and_resume_loses_nothing() {
        let opts = TrainingOptions {
            eval_every: 0,
            ..fast()
        };
        let (f, summary, _) = switch_at_step_5_with_the_primary_down(opts);
        assert_eq!(summary.collective_failures, 0);
        assert_eq!(summary.min_steps(), summary.max_steps());
        assert_eq!(f.ranks_on_backup(), [r(2)]);
        assert_eq!(f.collectives_on_default_nic(), 0);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn evaluations_after_a_switch_run_on_the_default_nic_and_fail_where_it_is_down() {
        // Evaluations at steps 3, 6, 9, ...: each a new operator. The one at step 3 (before
        // the switch) and every later one start on the default NIC.
        let (f, summary, stop) = switch_at_step_5_with_the_primary_down(fast());
        let after_switch = (6..=stop).filter(|s| s % 3 == 0).count() as u64;
        assert!(after_switch >= 2, "stopped after {stop}");
        // Training's operator kept the switch: only the evaluations failed, on every member of
        // the world group, because rank 2 sends them on its primary port, which is down.
        assert_eq!(summary.collective_failures, 8 * after_switch);
        assert_eq!(f.collectives_on_default_nic(), after_switch);
        assert_eq!(summary.min_steps(), summary.max_steps());
        // The members agree about every operator: nothing is inconsistent, nothing violated.
        let report = f.check_consistency();
        assert!(report.is_consistent(), "{report}");
        assert_eq!(f.collectives_on_inconsistent_groups(), 0);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
        assert_eq!(f.ranks_on_backup(), [r(2)]);
        let eval = Collective::evaluation(stop / 3);
        assert_eq!(
            f.operator_view(WORLD_GROUP, r(2), eval).unwrap(),
            [false; 8],
            "a new operator is on the default NIC"
        );
        let training = f
            .operator_view(WORLD_GROUP, r(2), Collective::TRAINING)
            .unwrap();
        assert!(training[2], "the training operator kept the switch");
    }

    #[test]
    fn a_killed_process_ends_the_job() {
        let f = fabric(1, 4, 2);
        let t = SimTraining::start(Arc::clone(&f), no_pause_hooks(4), fast());
        assert!(t.wait_min_steps(3, Duration::from_secs(5)));
        f.kill_rank(r(2));
        let summary = t.join();
        assert_eq!(
            summary.exits,
            [
                RankExit::PeerLost,
                RankExit::PeerLost,
                RankExit::Killed,
                RankExit::PeerLost
            ]
        );
        assert!(summary.collective_failures >= 4);
    }
}
