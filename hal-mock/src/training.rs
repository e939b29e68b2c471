//! A simulated training job: one thread per rank, each step a blocking all-reduce on every
//! group of the rank (the training operator, [`Collective::TRAINING`]), every few steps an
//! evaluation all-reduce on the world group (an operator of a size not issued before,
//! [`Collective::evaluation`]), then the step-boundary hook (where a pause holds the rank).
//!
//! It reproduces what makes pausing hard on real hardware: a rank that stops calling
//! collectives leaves its peers blocked inside one (until the HCCL timeout), so a wrong pause
//! protocol deadlocks the simulation just as it would a real job.

use crate::fabric::{deadline_after, Fabric, WORLD_GROUP};
use crate::operator::Collective;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use taskd_core::{GlobalRank, HalErrorKind, StepBoundary};

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
}

impl Default for TrainingOptions {
    fn default() -> Self {
        TrainingOptions {
            step_time: Duration::from_millis(2),
            eval_every: 3,
        }
    }
}

/// Why a rank's training thread ended.
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
    /// Why each rank's thread ended, by global rank.
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

/// A step hook that never pauses.
///
/// Why: the training loop needs a hook per rank even when a test does not pause it.
#[derive(Copy, Clone, Debug, Default)]
pub struct NoPause;

impl StepBoundary for NoPause {
    fn step_completed(&self, _step: u64) {}
}

/// `world` hooks that never pause, for [`SimTraining::start`].
pub fn no_pause_hooks(world: u32) -> Vec<Arc<dyn StepBoundary>> {
    (0..world)
        .map(|_| Arc::new(NoPause) as Arc<dyn StepBoundary>)
        .collect()
}

struct TrainState {
    /// Last step each rank completed.
    completed: Vec<u64>,
    /// Last step each rank started.
    started: Vec<u64>,
    failures: u64,
    stop_after: Option<u64>,
    running: usize,
}

struct Shared {
    state: Mutex<TrainState>,
    cv: Condvar,
}

/// Decrements the running count when a rank thread ends, even by panic.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.state.lock().running -= 1;
        self.0.cv.notify_all();
    }
}

/// A running simulated training job (one thread per rank).
///
/// Why: the control plane's pause/switch/resume must be tested against a loop that really
/// blocks in collectives, not against a counter.
pub struct SimTraining {
    fabric: Arc<Fabric>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<RankExit>>,
}

impl SimTraining {
    /// Starts one thread per rank. Each step: `opts.step_time` of simulated compute, then a
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
    /// If `hooks.len()` is not the fabric's world size.
    pub fn start(
        fabric: Arc<Fabric>,
        hooks: Vec<Arc<dyn StepBoundary>>,
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
                started: vec![0; world],
                failures: 0,
                stop_after: None,
                running: world,
            }),
            cv: Condvar::new(),
        });
        let threads = hooks
            .into_iter()
            .enumerate()
            .map(|(r, hook)| {
                let rank = GlobalRank(r as u32);
                let fabric = Arc::clone(&fabric);
                let shared = Arc::clone(&shared);
                let opts = opts.clone();
                std::thread::Builder::new()
                    .name(format!("sim-rank-{r}"))
                    .spawn(move || {
                        let running = Running(shared);
                        run_rank(&fabric, &running.0, hook.as_ref(), rank, &opts)
                    })
                    .expect("spawning a simulated rank thread")
            })
            .collect();
        SimTraining {
            fabric,
            shared,
            threads,
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
        self.shared
            .state
            .lock()
            .completed
            .iter()
            .copied()
            .min()
            .unwrap_or(0)
    }

    /// Most steps any rank completed.
    pub fn max_steps(&self) -> u64 {
        self.shared
            .state
            .lock()
            .completed
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Waits until every rank completed at least `n` steps. Returns `false` on timeout or
    /// when every rank thread has ended first.
    pub fn wait_min_steps(&self, n: u64, timeout: Duration) -> bool {
        let deadline = deadline_after(timeout);
        let mut st = self.shared.state.lock();
        loop {
            if st.completed.iter().all(|c| *c >= n) {
                return true;
            }
            if st.running == 0 {
                return false;
            }
            match deadline {
                None => self.shared.cv.wait(&mut st),
                Some(d) => {
                    if self.shared.cv.wait_until(&mut st, d).timed_out() {
                        return st.completed.iter().all(|c| *c >= n);
                    }
                }
            }
        }
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
        let started = st.started.iter().copied().max().unwrap_or(0);
        let stop = step.max(started);
        let stop = st.stop_after.map_or(stop, |s| s.min(stop));
        st.stop_after = Some(stop);
        self.shared.cv.notify_all();
        stop
    }

    /// Joins every rank thread. Call it after [`SimTraining::stop_after`] or
    /// [`Fabric::shutdown`]; otherwise it waits for ever (a rank blocked in its hook or in a
    /// collective never ends by itself).
    pub fn join(self) -> TrainingSummary {
        let exits = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap_or(RankExit::Panicked))
            .collect();
        let st = self.shared.state.lock();
        TrainingSummary {
            steps: st.completed.clone(),
            collective_failures: st.failures,
            exits,
        }
    }
}

fn run_rank(
    fabric: &Fabric,
    shared: &Shared,
    hook: &dyn StepBoundary,
    rank: GlobalRank,
    opts: &TrainingOptions,
) -> RankExit {
    let r = rank.0 as usize;
    let groups: Vec<String> = fabric.groups_of(rank).into_iter().map(|g| g.name).collect();
    let mut step = 0u64;
    loop {
        let next = step + 1;
        {
            let mut st = shared.state.lock();
            if st.stop_after.is_some_and(|s| next > s) {
                return RankExit::Stopped;
            }
            st.started[r] = next;
        }
        if !opts.step_time.is_zero() {
            std::thread::sleep(opts.step_time); // simulated compute, not synchronisation
        }
        let mut calls: Vec<(&str, Collective)> = groups
            .iter()
            .map(|g| (g.as_str(), Collective::TRAINING))
            .collect();
        if opts.eval_every > 0 && next % opts.eval_every == 0 {
            calls.push((WORLD_GROUP, Collective::evaluation(next / opts.eval_every)));
        }
        for (g, op) in calls {
            if let Err(exit) = collective(fabric, shared, rank, next, g, op) {
                return exit;
            }
        }
        step = next;
        {
            shared.state.lock().completed[r] = step;
            shared.cv.notify_all();
        }
        hook.step_completed(step);
    }
}

/// One collective of a step. A failure is counted and the step carries on, unless it ends the
/// rank (shutdown, killed, a peer lost).
fn collective(
    fabric: &Fabric,
    shared: &Shared,
    rank: GlobalRank,
    step: u64,
    group: &str,
    op: Collective,
) -> Result<(), RankExit> {
    let Err(e) = fabric.collective(group, rank, op, 1.0) else {
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
    }

    impl Gate {
        fn new(step: u64) -> Arc<Gate> {
            Arc::new(Gate {
                step,
                state: Mutex::new((0, false)),
                cv: Condvar::new(),
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
            self.cv.notify_all();
        }
    }

    impl StepBoundary for Gate {
        fn step_completed(&self, step: u64) {
            if step != self.step {
                return;
            }
            let mut st = self.state.lock();
            st.0 += 1;
            self.cv.notify_all();
            while !st.1 {
                self.cv.wait(&mut st);
            }
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
        // peers finish step 3 and then all sit in the world all-reduce of step 4.
        assert!(gate.wait_held(1));
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
        let hooks: Vec<Arc<dyn StepBoundary>> = (0..8)
            .map(|_| gate.clone() as Arc<dyn StepBoundary>)
            .collect();
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
