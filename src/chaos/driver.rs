//! Carries one [`Schedule`] out on a simulated job and checks the invariants as it goes.
//!
//! The driver waits only on events (the manager's progress feed and replies, the training
//! loop's step counters), each wait bounded: an operation that never ends, a manager that never
//! verifies, training that never moves are findings (invariant `bounded` or `held`), not hangs
//! of the campaign. A run stops at its first violation.
//!
//! The invariants, by the name a violation carries:
//!
//! - `one_result`: every admitted command gets exactly one final result (one `Finished` event
//!   and the same report from `AwaitResult`); a repeated uuid returns that result and never
//!   runs twice, also on a manager started after the one that ran it (the in-process job's
//!   managers share their journal of finished operations, as `taskd manager --state-dir`
//!   keeps it). A uuid whose manager died before its final result has no result to return:
//!   the journal kept its admission, and a later manager refuses it as interrupted
//!   (observation `interrupted_uuid_refused_by_a_later_manager`); running it again breaks
//!   the invariant.
//! - `uuid_reuse`: a uuid reused with another request is refused as such once the uuid has a
//!   result, on whichever manager.
//! - `inconsistent_collective`: no collective ran on a group whose members disagreed on its
//!   NICs (`Fabric::collectives_on_inconsistent_groups`), and HCCL's rules were kept
//!   (`Fabric::violations`: `hccl_rule`).
//! - `groups_consistent` and `nic_table`: whenever the job is quiet and `running`, every
//!   group agrees and the manager's NIC table is the fabric's.
//! - `held`: while the manager says `running`, training progresses (no rank is held without
//!   an operation that will release it).
//! - `bounded`: every wait ends in time (a result, a stopping manager, re-registration).
//! - `not_running`: after the recovery contract's steps (every lost process back, `recover`
//!   when the job is `paused`), the job runs and a new switch succeeds (`final_switch`).
//! - `hold_bounded`: in schedules with an odd seed no operator recovers at the end: a job
//!   that does not run must have training stopped by the manager's hold policy within its
//!   bound ([`HOLD_BOUND`]), and run again once its processes restart as new incarnations.
//!
//! Recovery schedules ([`Schedule::recovery`]: process recovery on, every node's launcher
//! following the manager's orders, `driver/recovery.rs`) add:
//!
//! - `one_restart_per_fault`: one fault (a killed process, or a stop of training) leads to at
//!   most one restart of the job: the manager's restart count (`restarts().done`), the
//!   highest restart number any launcher was ordered and the restarts the launchers carried
//!   out never exceed the faults injected; each fault with budget left is followed by exactly
//!   one restart, after which the job runs on its default NICs, every group agreeing; with
//!   the budget spent, the job ends (every node's launcher is ordered `End`) instead.
//! - `only_new_incarnations_count`: while the processes a stop retired are the only ones
//!   (the launchers have not restarted them), the manager counts no rank back, never reports
//!   the stop finished and never says `running`: an old process that registers again (its
//!   node was cut off during the stop) is told to stop again, not counted.
//! - `no_stop_without_hold`: a proxy lost with nothing in flight (and no process dead) leaves
//!   the job `degraded`: no launcher is ordered anything, no stop of training begins (with a
//!   hold bound far shorter than the time the proxy stays away), training goes on, and the
//!   job runs again once the proxy is back and verified.

use super::schedule::{
    Disruption, Interrupt, NicFault, Schedule, Step, Switch, Target, DEVICES, NODES,
};
use crate::sim::{FinalState, SimConfig, Simulation};
use actix::{Handler, Message};
use recovery::Book;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use taskd_actors::manager::{
    AwaitCallsAnswered, AwaitRegistered, AwaitResult, AwaitVerification, Recover, Recovery,
    Submission,
};
use taskd_actors::{LocalJob, LocalJobError, Manager, ProgressEvent, ProgressKind};
use taskd_core::command::Target as CmdTarget;
use taskd_core::ledger::RecoverTo;
use taskd_core::operation::{JobState, OperationReport};
use taskd_core::protocol::Phase;
use taskd_core::{
    DeviceId, GlobalRank, HcclCode, JobId, NodeName, OperationId, PhaseDeadlines, SubmitError,
    SwitchCommand,
};
use taskd_hal_mock::NicSetFault;
use tokio::sync::broadcast::{self, error::TryRecvError};

/// Every phase deadline of a schedule's job.
pub const PHASE_DEADLINE: Duration = Duration::from_millis(300);
/// How long a simulated HCCL call waits for its peers.
pub const HCCL_TIMEOUT: Duration = Duration::from_secs(1);
/// The most a schedule waits for an operation's result, a stopping manager or a manager's
/// verification: far above any deadline sum, so only a stuck product passes it.
pub const WAIT: Duration = Duration::from_secs(20);
/// The most a schedule waits for training to progress a few steps.
pub const TRAIN_WAIT: Duration = Duration::from_secs(10);
/// The hold policy's bound at the end of a schedule no operator recovers.
pub const HOLD_BOUND: Duration = Duration::from_millis(500);

/// The simulated job every schedule runs on: 2 nodes x 4 devices, 1 ms steps, short
/// deadlines and HCCL timeouts.
pub fn sim_config() -> SimConfig {
    SimConfig {
        nodes: NODES,
        devices_per_node: DEVICES,
        step_time: Duration::from_millis(1),
        steps_between: 1,
        deadlines: PhaseDeadlines {
            pause: PHASE_DEADLINE,
            switch: PHASE_DEADLINE,
            rollback: PHASE_DEADLINE,
            resume: PHASE_DEADLINE,
        },
        hccl_timeout: HCCL_TIMEOUT,
        ..SimConfig::default()
    }
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The seed whose schedule broke it (`taskd chaos --first-seed SEED --seeds 1` again).
    pub seed: u64,
    /// Which invariant (see the module docs).
    pub invariant: &'static str,
    /// What happened, at which step.
    pub detail: String,
}

/// What one schedule did and found.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The schedule's seed.
    pub seed: u64,
    /// At most one: the run stops at the first.
    pub violations: Vec<Violation>,
    /// Operations the managers admitted (switches and recoveries).
    pub operations: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// An operator's unusual commands (concurrent, repeated or reused uuids, recoveries), by
    /// kind.
    pub commands: BTreeMap<&'static str, u64>,
    /// Behaviour worth knowing that breaks no invariant, by kind.
    pub observations: BTreeMap<&'static str, u64>,
    /// What happened, step by step.
    pub log: Vec<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl RunResult {
    /// Adds `line` to the log, stamped with the time since the run `started`.
    pub(super) fn log(&mut self, started: Instant, line: String) {
        let ms = started.elapsed().as_secs_f64() * 1e3;
        self.log.push(format!("{ms:9.1} ms  {line}"));
    }

    /// Records (and logs) that `invariant` broke while the run was `at` a step: the run stops.
    pub(super) fn fail(
        &mut self,
        started: Instant,
        at: &str,
        invariant: &'static str,
        detail: String,
    ) -> Stop {
        let detail = format!("{detail} (during: {at})");
        self.log(started, format!("VIOLATION {invariant}: {detail}"));
        self.violations.push(Violation {
            seed: self.seed,
            invariant,
            detail,
        });
        Stop
    }

    /// Counts one behaviour worth knowing.
    pub(super) fn observe(&mut self, what: &'static str) {
        *self.observations.entry(what).or_default() += 1;
    }

    /// Counts one of an operator's unusual commands.
    pub(super) fn tally(&mut self, kind: &'static str) {
        *self.commands.entry(kind).or_default() += 1;
    }
}

/// Why the run stops early: a violation was recorded.
#[derive(Debug)]
pub(super) struct Stop;

type Checked<T = ()> = Result<T, Stop>;

/// An admitted operation.
struct Op {
    id: OperationId,
    /// Which manager (0 the first, +1 per restart) admitted it.
    epoch: u32,
    result: Option<OperationReport>,
}

/// The progress feed of one manager, filtered for final results.
struct Watch {
    rx: broadcast::Receiver<ProgressEvent>,
    finished: Vec<OperationReport>,
    /// The last phase an operation started.
    phase: Option<(OperationId, Phase)>,
}

impl Watch {
    fn new(job: &LocalJob) -> Watch {
        Watch {
            rx: job.subscribe_progress(),
            finished: Vec::new(),
            phase: None,
        }
    }

    fn keep(&mut self, ev: &ProgressEvent) {
        match &ev.kind {
            ProgressKind::Finished(r) => self.finished.push((**r).clone()),
            ProgressKind::PhaseStarted { phase, .. } => self.phase = Some((ev.op, *phase)),
            _ => {}
        }
    }

    /// Whether `id` started `phase` or a later one.
    fn reached(&self, id: OperationId, phase: Phase) -> bool {
        self.phase.is_some_and(|(op, p)| op == id && p >= phase)
    }

    /// Takes what is already published.
    fn drain(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(ev) => self.keep(&ev),
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    fn results_of(&self, id: OperationId) -> Vec<&OperationReport> {
        self.finished.iter().filter(|r| r.id == id).collect()
    }
}

/// What the disruptions of a switch left to do once it ends.
#[derive(Default)]
struct Aftermath {
    /// The manager was killed: the operations have no result to wait for.
    manager_killed: bool,
    /// The manager was stopped; what it returned.
    drained: Option<Option<Box<OperationReport>>>,
    /// A node's proxy to start again.
    proxy: Option<usize>,
    /// A second operation was admitted too.
    second: Option<OperationId>,
    /// A rank's process was killed (process recovery): the job restarts.
    killed_rank: bool,
}

/// Runs `schedule` and checks it.
pub fn run(schedule: &Schedule) -> RunResult {
    let started = Instant::now();
    let mut out = RunResult {
        seed: schedule.seed,
        ..RunResult::default()
    };
    let cfg = SimConfig {
        process_recovery: schedule.recovery,
        ..sim_config()
    };
    let mut sim = match Simulation::start(&cfg) {
        Ok(sim) => sim,
        Err(e) => {
            out.violations.push(Violation {
                seed: schedule.seed,
                invariant: "bounded",
                detail: format!("the simulated job did not start: {e}"),
            });
            return out;
        }
    };
    let mut d = Driver::new(&mut sim, schedule, out);
    let ok = d.steps().and_then(|()| d.end()).is_ok();
    let mut out = d.out;
    if ok {
        check_final(&sim.finish(), schedule.seed, &mut out);
    } else {
        // Wake everything a stuck run left blocked, so its threads end.
        sim.fabric().shutdown();
        drop(sim);
    }
    out.elapsed = started.elapsed();
    out
}

/// The checks on the stopped job.
fn check_final(end: &FinalState, seed: u64, out: &mut RunResult) {
    let mut fail = |invariant, detail: String| {
        if out.violations.is_empty() {
            out.violations.push(Violation {
                seed,
                invariant,
                detail,
            })
        }
    };
    if end.collectives_on_inconsistent_groups > 0 {
        fail(
            "inconsistent_collective",
            format!(
                "{} collectives ran on groups that disagreed (job {})",
                end.collectives_on_inconsistent_groups, end.job_state
            ),
        );
    }
    if !end.violations.is_empty() {
        fail("hccl_rule", end.violations.join("; "));
    }
    if end.job_state == JobState::Running && !end.groups_consistent {
        fail("groups_consistent", end.consistency.clone());
    }
    if end.job_state == JobState::Running && end.ranks_on_backup != end.manager_on_backup {
        fail(
            "nic_table",
            format!(
                "at the end the manager has ranks {:?} on backup, the fabric {:?}",
                end.manager_on_backup, end.ranks_on_backup
            ),
        );
    }
}

struct Driver<'a> {
    sim: &'a mut Simulation,
    schedule: &'a Schedule,
    rt: tokio::runtime::Runtime,
    out: RunResult,
    epoch: u32,
    ops: Vec<Op>,
    /// The uuid and command of each switch of the schedule, by index.
    switches: Vec<(OperationId, SwitchCommand)>,
    disconnected: BTreeSet<u32>,
    links_down: BTreeSet<(u32, u32)>,
    killed: Option<u32>,
    /// A recovery schedule's book of faults, restarts and the proxy away.
    book: Option<Book>,
    /// The step being carried out, for violation details.
    at: String,
    clock: Instant,
}

impl<'a> Driver<'a> {
    fn new(sim: &'a mut Simulation, schedule: &'a Schedule, out: RunResult) -> Driver<'a> {
        Driver {
            sim,
            schedule,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a current-thread runtime"),
            out,
            epoch: 0,
            ops: Vec::new(),
            switches: Vec::new(),
            disconnected: BTreeSet::new(),
            links_down: BTreeSet::new(),
            killed: None,
            book: schedule.recovery.map(Book::new),
            at: "start".into(),
            clock: Instant::now(),
        }
    }

    fn job(&self) -> &LocalJob {
        self.sim.job()
    }

    fn log(&mut self, line: String) {
        self.out.log(self.clock, line);
    }

    /// Records a violation; the run stops.
    fn fail(&mut self, invariant: &'static str, detail: String) -> Stop {
        self.out.fail(self.clock, &self.at, invariant, detail)
    }

    fn count(&mut self, fault: &'static str) {
        *self.out.faults.entry(fault).or_default() += 1;
    }

    fn tally_command(&mut self, kind: &'static str) {
        self.out.tally(kind);
    }

    fn observe(&mut self, what: &'static str) {
        self.out.observe(what);
    }

    /// Sends `msg` to the manager in charge and waits at most `wait` for the answer.
    fn ask<M>(&mut self, msg: M, wait: Duration, what: &str) -> Checked<M::Result>
    where
        M: Message + Send + 'static,
        M::Result: Send + 'static,
        Manager: Handler<M>,
    {
        let fut = self.job().manager().send(msg);
        match self
            .rt
            .block_on(async { tokio::time::timeout(wait, fut).await })
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(self.fail("bounded", format!("the manager vanished before {what}"))),
            Err(_) => Err(self.fail("bounded", format!("no {what} within {wait:?}"))),
        }
    }

    fn status(&mut self) -> Checked<taskd_actors::ManagerStatus> {
        match self.job().status(usize::MAX) {
            Ok(s) => Ok(s),
            Err(e) => Err(self.fail("bounded", format!("no status: {e}"))),
        }
    }

    fn command(&self, id: OperationId, targets: &[Target]) -> SwitchCommand {
        SwitchCommand {
            job: JobId("sim".into()),
            id: Some(id),
            targets: targets
                .iter()
                .map(|t| CmdTarget {
                    node: NodeName::uniform(t.node),
                    device: DeviceId(t.device),
                    use_backup: t.backup,
                })
                .collect(),
        }
    }

    fn steps(&mut self) -> Checked {
        for (i, step) in self.schedule.steps.iter().enumerate() {
            self.at = format!("step {i}: {step}");
            self.log(self.at.clone());
            if self.job_ended() {
                self.log("  (the job ended: its restart budget was spent)".into());
                break;
            }
            match step {
                Step::Train(n) => self.train(*n)?,
                Step::Fault { rank, fault } => self.nic_fault(*rank, *fault),
                Step::Link { node, device, up } => self.link(*node, *device, *up),
                Step::Switch(sw) => self.switch(sw)?,
                Step::Repeat { of } => self.repeat(*of, None)?,
                Step::Reuse { of, targets } => self.repeat(*of, Some(targets))?,
                Step::Reconnect { rank, then } => self.reconnect(*rank, then.as_ref())?,
                Step::RestartManager => self.restart_manager()?,
                Step::Recover(to) => self.recover_step(*to)?,
                Step::KillProcess { rank } => self.kill_process(*rank)?,
                Step::KillRank { rank } => self.kill_rank(*rank)?,
                Step::StopWhileCut { node, by } => self.stop_while_cut(*node, by)?,
                Step::ProxyAway { node } => self.proxy_away(*node)?,
                Step::ProxyBack { node } => self.proxy_back(*node)?,
            }
            self.check_fabric()?;
        }
        Ok(())
    }

    fn nic_fault(&mut self, rank: u32, fault: NicFault) {
        let (kind, fault) = match fault {
            NicFault::Fail(code) => ("nic_fail", NicSetFault::Fail(code)),
            NicFault::Hang(d) => (
                "nic_hang",
                NicSetFault::Hang {
                    duration: d,
                    code: HcclCode::Timeout,
                },
            ),
            NicFault::Slow(d) => ("nic_slow", NicSetFault::Slow(d)),
        };
        self.count(kind);
        self.sim
            .fabric()
            .inject_nic_set_fault(GlobalRank(rank), fault);
    }

    fn link(&mut self, node: u32, device: u32, up: bool) {
        if up {
            self.links_down.remove(&(node, device));
        } else {
            self.count("link_down");
            self.links_down.insert((node, device));
        }
        self.sim.fabric().set_link(node, DeviceId(device), up);
    }

    /// Whether every process of the job is connected and alive (then the job can be quiet).
    fn whole(&self) -> bool {
        self.disconnected.is_empty() && self.killed.is_none()
    }

    /// Trains `n` steps if the manager says the job runs; it must progress.
    fn train(&mut self, n: u64) -> Checked {
        if !self.whole() {
            self.log("  (no training: a process is away)".into());
            return Ok(());
        }
        let state = self.status()?.state;
        // A proxy away with nothing in flight: the job is degraded and trains on.
        let trains = match self.proxy_away_node() {
            Some(_) => JobState::Degraded,
            None => JobState::Running,
        };
        if state != trains {
            self.log(format!("  (no training: the job is {state})"));
            return Ok(());
        }
        let t = self.sim.training();
        let target = t.max_steps() + n;
        if t.wait_min_steps(target, TRAIN_WAIT) {
            return Ok(());
        }
        let detail = self.held_detail(target);
        Err(self.fail("held", detail))
    }

    /// Which ranks hold, and for which operation, when training does not progress.
    fn held_detail(&self, target: u64) -> String {
        let t = self.sim.training();
        let ranks: Vec<String> = (0..NODES * DEVICES)
            .map(|r| {
                let gate = self.job().gate(GlobalRank(r)).report();
                format!(
                    "rank {r}: step {}, gate {:?}",
                    t.steps_completed(GlobalRank(r)),
                    gate
                )
            })
            .collect();
        format!(
            "the manager says {} but training did not reach step {target} within \
             {TRAIN_WAIT:?}: {}",
            if self.proxy_away_node().is_some() {
                "degraded"
            } else {
                "running"
            },
            ranks.join("; ")
        )
    }

    /// What must hold at every step: no collective on disagreeing groups, HCCL's rules.
    fn check_fabric(&mut self) -> Checked {
        let f = self.sim.fabric();
        let bad = f.collectives_on_inconsistent_groups();
        if bad > 0 {
            let v = f.violations().join("; ");
            return Err(self.fail(
                "inconsistent_collective",
                format!("{bad} collectives ran on groups that disagreed: {v}"),
            ));
        }
        let v = f.violations();
        if !v.is_empty() {
            return Err(self.fail("hccl_rule", v.join("; ")));
        }
        Ok(())
    }

    /// Waits until the manager verified every rank, then checks the quiet job; while a
    /// process is away, until the manager registered every one that is not. (Each change of
    /// who is away is waited for before the next, so the count moves one way to its target.)
    fn settle(&mut self) -> Checked {
        if !self.whole() || self.proxy_away_node().is_some() {
            let away = self.disconnected.len()
                + usize::from(self.killed.is_some_and(|k| !self.disconnected.contains(&k)))
                + self.proxy_away_node().map_or(0, |_| DEVICES as usize);
            let live = (NODES * DEVICES) as usize - away;
            self.ask(
                AwaitRegistered(Some(live)),
                WAIT,
                "registration of every connected rank",
            )?;
            return Ok(());
        }
        self.ask(
            AwaitRegistered(None),
            WAIT,
            "verification of every rank by the manager",
        )?;
        self.check_quiet()
    }

    /// When quiet and running: every group agrees and the NIC table is the fabric's.
    fn check_quiet(&mut self) -> Checked {
        self.check_fabric()?;
        let st = self.status()?;
        if st.state != JobState::Running || st.in_flight.is_some() {
            return Ok(());
        }
        let c = self.sim.fabric().check_consistency();
        if !c.is_consistent() {
            return Err(self.fail(
                "groups_consistent",
                format!("the manager says running, but {c}"),
            ));
        }
        let fabric = self.sim.fabric().ranks_on_backup();
        if st.ranks_on_backup != fabric {
            return Err(self.fail(
                "nic_table",
                format!(
                    "quiet and running, the manager has ranks {:?} on backup, the fabric {:?}",
                    st.ranks_on_backup, fabric
                ),
            ));
        }
        Ok(())
    }

    /// Submits `cmd` as a new command: `Some(id)` when admitted, `None` when refused.
    fn admit(&mut self, cmd: SwitchCommand) -> Checked<Option<OperationId>> {
        let id = cmd.id;
        match self.job().submit(cmd) {
            Ok(Submission::Started(id)) => {
                self.admitted(id);
                Ok(Some(id))
            }
            Ok(other) => Err(self.fail(
                "one_result",
                format!("the new uuid {id:?} was answered with {other:?}"),
            )),
            Err(LocalJobError::Refused(e)) => {
                self.log(format!("  refused: {e}"));
                Ok(None)
            }
            Err(e) => Err(self.fail("bounded", format!("submitting: {e}"))),
        }
    }

    fn admitted(&mut self, id: OperationId) {
        self.log(format!("  admitted {id}"));
        self.out.operations += 1;
        self.ops.push(Op {
            id,
            epoch: self.epoch,
            result: None,
        });
    }

    fn switch(&mut self, sw: &Switch) -> Checked {
        let id = OperationId(uuid::Uuid::from_u128(sw.id));
        let cmd = self.command(id, &sw.targets);
        self.switches.push((id, cmd.clone()));
        let mut watch = Watch::new(self.job());
        let Some(id) = self.admit(cmd)? else {
            return Ok(());
        };
        let mut after = Aftermath::default();
        for (phase, d) in &sw.during {
            let reached = self.await_phase(&mut watch, id, *phase)?;
            let when = if reached { "at" } else { "after the end of" };
            self.log(format!("  {d:?} {when} {phase}"));
            self.disrupt(d, id, sw.id, &mut after)?;
        }
        self.conclude(id, watch, after)
    }

    /// Waits until `id` starts `phase` or a later one (`true`), or ends first (`false`).
    fn await_phase(&mut self, w: &mut Watch, id: OperationId, phase: Phase) -> Checked<bool> {
        if !w.results_of(id).is_empty() {
            return Ok(false);
        }
        if w.reached(id, phase) {
            return Ok(true);
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let ev = self
                .rt
                .block_on(async { tokio::time::timeout_at(deadline, w.rx.recv()).await });
            match ev {
                Ok(Ok(ev)) => {
                    w.keep(&ev);
                    if w.reached(id, phase) {
                        return Ok(true);
                    }
                    if matches!(ev.kind, ProgressKind::Finished(_)) && ev.op == id {
                        return Ok(false);
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) => return Ok(false),
                Err(_) => {
                    return Err(self.fail(
                        "bounded",
                        format!("operation {id} neither reached {phase} nor ended within {WAIT:?}"),
                    ))
                }
            }
        }
    }

    fn disrupt(
        &mut self,
        d: &Disruption,
        id: OperationId,
        raw: u128,
        after: &mut Aftermath,
    ) -> Checked {
        match d {
            Disruption::KillManager => {
                self.count("manager_kill");
                self.restart_manager_now()?;
                after.manager_killed = true;
            }
            Disruption::Drain => {
                self.count("manager_stop");
                match self.job().drain("SIGTERM (chaos)", WAIT) {
                    Ok(r) => after.drained = Some(r.map(Box::new)),
                    Err(e) => return Err(self.fail("bounded", format!("stopping manager: {e}"))),
                }
            }
            Disruption::Disconnect { rank } => {
                self.count("worker_disconnect");
                self.disconnected.insert(*rank);
                self.job().disconnect_worker(GlobalRank(*rank));
            }
            Disruption::KillProxy { node } => {
                self.count("proxy_kill");
                self.job().kill_proxy(*node as usize);
                after.proxy = Some(*node as usize);
            }
            Disruption::Concurrent { targets, same_id } => {
                after.second = self.concurrent(id, raw, targets, *same_id)?;
            }
            Disruption::Reconnect { rank } => {
                if self.disconnected.remove(rank) {
                    self.job().reconnect_worker(GlobalRank(*rank));
                }
            }
            Disruption::RestartProxy { node } => {
                if after.proxy.take().is_some() {
                    self.restart_proxy(*node as usize);
                }
            }
            Disruption::LinkDown { node, device } => self.link(*node, *device, false),
            Disruption::KillRank { rank } => {
                self.kill_rank_only(*rank);
                after.killed_rank = true;
            }
        }
        Ok(())
    }

    /// A second command while `first` runs: busy, or (same uuid) the operation in flight.
    fn concurrent(
        &mut self,
        first: OperationId,
        raw: u128,
        targets: &[Target],
        same_id: bool,
    ) -> Checked<Option<OperationId>> {
        self.tally_command("concurrent");
        let id = if same_id {
            first
        } else {
            OperationId(uuid::Uuid::from_u128(raw ^ 1))
        };
        let res = self.job().submit(self.command(id, targets));
        self.log(format!("  second command: {res:?}"));
        match res {
            Ok(Submission::Started(second)) if !same_id => {
                self.admitted(second);
                Ok(Some(second))
            }
            Ok(Submission::Started(_)) => Err(self.fail(
                "one_result",
                format!("uuid {first} started a second operation while (or after) it ran"),
            )),
            Ok(Submission::InFlight(x)) if x == first && same_id => Ok(None),
            // The first one ended already: its result is checked with it.
            Ok(Submission::Known(r)) if r.id == first && same_id => Ok(None),
            Ok(other) => {
                Err(self.fail("one_result", format!("a concurrent command got {other:?}")))
            }
            Err(LocalJobError::Refused(_)) => Ok(None),
            Err(e) => Err(self.fail("bounded", format!("submitting: {e}"))),
        }
    }

    /// Sees the admitted operations of a switch through to their results (unless their
    /// manager died) and the disruptions' aftermath, then lets the job settle.
    fn conclude(&mut self, id: OperationId, mut w: Watch, after: Aftermath) -> Checked {
        let ids: Vec<OperationId> = std::iter::once(id).chain(after.second).collect();
        if after.manager_killed {
            w.drain();
            for id in ids {
                let ends: Vec<OperationReport> = w.results_of(id).into_iter().cloned().collect();
                if ends.len() > 1 {
                    let n = ends.len();
                    return Err(self.fail(
                        "one_result",
                        format!("operation {id} has {n} final results"),
                    ));
                }
                self.log(format!(
                    "  {id}: its manager died; final results: {}",
                    ends.len()
                ));
                self.record(id, ends.into_iter().next());
            }
            if let Some(node) = after.proxy {
                self.restart_proxy(node);
            }
        } else {
            let mut results = Vec::new();
            for id in ids {
                results.push(self.one_result(id, &mut w)?);
            }
            if let Some(Some(d)) = &after.drained {
                if !results.iter().any(|r| r == &**d) {
                    return Err(self.fail(
                        "one_result",
                        format!(
                            "the stopping manager returned {d}, not the result of the operation"
                        ),
                    ));
                }
            }
            // A dead proxy comes back before the stopped manager's successor starts.
            if let Some(node) = after.proxy {
                self.restart_proxy(node);
            }
            if after.drained.is_some() {
                self.restart_manager_now()?;
            }
        }
        if after.killed_rank {
            return self.follow_restart();
        }
        self.settle()
    }

    /// Starts a dead proxy again: every worker of its node connects to it, also one whose
    /// own connection was cut while the proxy was down.
    fn restart_proxy(&mut self, node: usize) {
        self.job().restart_proxy(node);
        self.disconnected.retain(|r| *r / DEVICES != node as u32);
    }

    /// Records the result of the latest admission of `id` (an earlier manager may have run it
    /// too).
    fn record(&mut self, id: OperationId, result: Option<OperationReport>) {
        if let Some(op) = self.ops.iter_mut().rev().find(|o| o.id == id) {
            op.result = result;
        }
    }

    /// Waits for `id`'s result; it must be the one final result its manager published.
    fn one_result(&mut self, id: OperationId, w: &mut Watch) -> Checked<OperationReport> {
        let Some(r) = self.ask(AwaitResult(id), WAIT, "final result")? else {
            return Err(self.fail(
                "one_result",
                format!("the manager does not know operation {id}"),
            ));
        };
        // The final event is published before the result is handed out.
        w.drain();
        let ends = w.results_of(id);
        if ends.len() != 1 || *ends[0] != r {
            let n = ends.len();
            return Err(self.fail(
                "one_result",
                format!("operation {id}: {n} final results published, result {r}"),
            ));
        }
        self.log(format!("  result: {r}"));
        self.record(id, Some(r.clone()));
        Ok(r)
    }

    /// The `of`-th switch's uuid again: with its own request (`None`) or another one. Its
    /// earlier result, whichever manager produced it, must come back (managers of the job
    /// share their journal of finished operations, as a manager with `--state-dir` keeps
    /// it): a repeated uuid never runs again, a reused one is refused. A uuid whose manager
    /// died before its final result has none: it is refused as interrupted.
    fn repeat(&mut self, of: usize, other: Option<&Vec<Target>>) -> Checked {
        let Some((id, cmd)) = self.switches.get(of).cloned() else {
            return Ok(());
        };
        self.tally_command(if other.is_some() {
            "reused_uuid"
        } else {
            "repeated_uuid"
        });
        let cmd = other.map_or(cmd, |t| self.command(id, t));
        let admitted = self.ops.iter().filter(|o| o.id == id).count();
        let (ran_on, known) = self
            .ops
            .iter()
            .rev()
            .filter(|o| o.id == id)
            .find_map(|o| Some((o.epoch, o.result.clone()?)))
            .unzip();
        // The same request is the one that ran under the uuid (a reuse may have run first).
        let same = known.as_ref().map_or(true, |k| same_request(&cmd, k));
        let w = Watch::new(self.job());
        let res = self.job().submit(cmd);
        self.log(format!("  answer: {res:?}"));
        let broken = match (res, known) {
            (Ok(Submission::Known(r)), Some(k)) if *r == k && same => {
                if other.is_some() {
                    self.observe("reused_uuid_answered_with_earlier_result");
                }
                if ran_on < Some(self.epoch) {
                    self.observe("uuid_answered_by_a_later_manager");
                }
                return Ok(());
            }
            (Ok(Submission::Started(new)), None) if admitted == 0 => {
                self.admitted(new);
                return self.conclude(new, w, Aftermath::default());
            }
            (Ok(Submission::Started(_)), None) => {
                "its manager stopped before its result, and it ran again".to_string()
            }
            (Err(LocalJobError::Refused(SubmitError::Interrupted { .. })), None)
                if admitted > 0 && other.is_none() =>
            {
                self.observe("interrupted_uuid_refused_by_a_later_manager");
                return Ok(());
            }
            (Err(LocalJobError::Refused(SubmitError::IdReused { .. })), Some(_)) if !same => {
                if ran_on < Some(self.epoch) {
                    self.observe("reused_uuid_refused_by_a_later_manager");
                }
                return Ok(());
            }
            (Err(LocalJobError::Refused(_)), None) => return Ok(()),
            (Err(LocalJobError::Refused(e)), Some(_)) if same => {
                format!("the same request was refused ({e})")
            }
            (Err(LocalJobError::Refused(e)), Some(_)) => {
                format!("another request was refused as {e:?}, not as a reused uuid")
            }
            (Err(e), _) => return Err(self.fail("bounded", format!("submitting: {e}"))),
            (answer, known) => format!("it was answered {answer:?} (its result: {known:?})"),
        };
        let invariant = if same { "one_result" } else { "uuid_reuse" };
        let managers = self.epoch + 1;
        Err(self.fail(
            invariant,
            format!("uuid {id} ran {admitted} time(s) on {managers} manager(s): {broken}"),
        ))
    }

    /// A lost worker returns; `then` happens before the manager could verify it.
    fn reconnect(&mut self, rank: u32, then: Option<&Interrupt>) -> Checked {
        if !self.disconnected.remove(&rank) {
            return Ok(());
        }
        self.job().reconnect_worker(GlobalRank(rank));
        match then {
            None => {}
            Some(Interrupt::RestartManager) => {
                self.count("manager_kill");
                self.restart_manager_now()?;
            }
            Some(Interrupt::StopManager) => {
                self.count("manager_stop");
                match self.job().drain("SIGTERM (chaos)", WAIT) {
                    Ok(None) => {}
                    Ok(Some(r)) => {
                        return Err(self.fail(
                            "one_result",
                            format!(
                                "stopping while it verified, the manager ended an operation: {r}"
                            ),
                        ))
                    }
                    Err(e) => return Err(self.fail("bounded", format!("stopping manager: {e}"))),
                }
                self.restart_manager_now()?;
            }
            Some(Interrupt::Disconnect { rank }) => {
                self.count("worker_disconnect");
                self.disconnected.insert(*rank);
                self.job().disconnect_worker(GlobalRank(*rank));
            }
            Some(Interrupt::Switch { id, targets }) => {
                let id = OperationId(uuid::Uuid::from_u128(*id));
                let w = Watch::new(self.job());
                if let Some(id) = self.admit(self.command(id, targets))? {
                    return self.conclude(id, w, Aftermath::default());
                }
            }
        }
        self.settle()
    }

    /// Kills the manager in charge and starts a new one (nothing else waits).
    fn restart_manager_now(&mut self) -> Checked {
        if let Err(e) = self.job().restart_manager() {
            return Err(self.fail("bounded", format!("restarting the manager: {e}")));
        }
        self.epoch += 1;
        Ok(())
    }

    fn restart_manager(&mut self) -> Checked {
        self.count("manager_kill");
        self.restart_manager_now()?;
        self.settle()
    }

    fn kill_process(&mut self, rank: u32) -> Checked {
        self.count("process_kill");
        self.sim.fabric().kill_rank(GlobalRank(rank));
        self.job().kill_worker(GlobalRank(rank));
        self.killed = Some(rank);
        self.settle()
    }

    /// An operator's `recover`: refused on a running, verified job; otherwise it must end.
    fn recover_step(&mut self, to: RecoverTo) -> Checked {
        let st = self.status()?;
        if st.state == JobState::Running && st.verified {
            let res = self.ask(Recover { to, id: None }, WAIT, "answer to recover")?;
            return match res {
                Err(SubmitError::NothingToRecover { .. } | SubmitError::Busy { .. }) => Ok(()),
                other => Err(self.fail(
                    "not_running",
                    format!("recover on a running, verified job answered {other:?}"),
                )),
            };
        }
        self.recover(to)?;
        self.settle()
    }

    /// Runs a recovery to its end; returns the job state it established, if it ran.
    fn recover(&mut self, to: RecoverTo) -> Checked<Option<JobState>> {
        self.tally_command("recover");
        let mut w = Watch::new(self.job());
        let mut started = self.ask(Recover { to, id: None }, WAIT, "answer to recover")?;
        self.log(format!("  recover --to {}: {started:?}", to.as_str()));
        // Ranks still inside an earlier operation's NIC-set calls: the manager refuses until
        // they answer (each late call ends by HCCL's timeout at the latest). A patient
        // operator asks again then.
        if matches!(started, Err(SubmitError::InCalls { .. })) {
            self.observe("recover_waited_for_late_calls");
            self.ask(AwaitCallsAnswered, WAIT, "the late NIC-set calls to end")?;
            w = Watch::new(self.job());
            started = self.ask(Recover { to, id: None }, WAIT, "answer to recover")?;
            self.log(format!("  recover --to {}: {started:?}", to.as_str()));
        }
        match started {
            Err(_) => Ok(None),
            Ok(Recovery::Operation(id)) => {
                self.admitted(id);
                Ok(Some(self.one_result(id, &mut w)?.job_state))
            }
            Ok(Recovery::Verification(id)) => {
                let v = self.ask(AwaitVerification(id), WAIT, "verification")?;
                let Some(v) = v else {
                    return Err(self.fail("bounded", format!("verification {id} is unknown")));
                };
                self.log(format!("  verification: {v}"));
                Ok(v.job_state())
            }
        }
    }
}

/// Whether `cmd` asks for what `ran` did: the same devices to the same sides, in any order.
fn same_request(cmd: &SwitchCommand, ran: &OperationReport) -> bool {
    let asked: BTreeSet<(&NodeName, DeviceId, bool)> = cmd
        .targets
        .iter()
        .map(|t| (&t.node, t.device, t.use_backup))
        .collect();
    let done: BTreeSet<(&NodeName, DeviceId, bool)> = ran
        .targets
        .iter()
        .map(|t| (&t.node, t.device, t.use_backup))
        .collect();
    asked == done
}

mod end;
mod recovery;

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> FinalState {
        FinalState {
            steps_completed: 10,
            ranks_on_backup: vec![GlobalRank(1)],
            manager_on_backup: vec![GlobalRank(1)],
            groups_consistent: true,
            consistency: "all 7 groups consistent".into(),
            collectives_on_inconsistent_groups: 0,
            collective_failures: 0,
            collectives_on_default_nic: 0,
            violations: Vec::new(),
            job_state: JobState::Running,
        }
    }

    fn judge(end: FinalState) -> Vec<&'static str> {
        let mut out = RunResult::default();
        check_final(&end, 9, &mut out);
        out.violations.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn the_stopped_job_is_judged_by_the_invariants() {
        assert!(judge(clean()).is_empty());
        let bad = FinalState {
            collectives_on_inconsistent_groups: 2,
            ..clean()
        };
        assert_eq!(judge(bad), ["inconsistent_collective"]);
        let bad = FinalState {
            manager_on_backup: Vec::new(),
            ..clean()
        };
        assert_eq!(judge(bad), ["nic_table"]);
        let bad = FinalState {
            groups_consistent: false,
            ..clean()
        };
        assert_eq!(judge(bad), ["groups_consistent"]);
        let bad = FinalState {
            violations: vec!["mismatched arguments".into()],
            ..clean()
        };
        assert_eq!(judge(bad), ["hccl_rule"]);
        // A job that does not run (a process died for good) is not held to its NIC table.
        let lost = FinalState {
            manager_on_backup: Vec::new(),
            job_state: JobState::NeedsRecovery,
            ..clean()
        };
        assert!(judge(lost).is_empty());
    }

    #[test]
    fn the_schedules_job_is_small_and_fast() {
        let cfg = sim_config();
        assert_eq!(cfg.ranks(), 8);
        assert!(cfg.validate().is_ok());
        assert!(cfg.hccl_timeout > cfg.deadlines.switch);
        assert!(WAIT > cfg.hccl_timeout * 4);
    }
}
