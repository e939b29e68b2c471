//! Carries one [`ProcSchedule`] out on a job of processes ([`ProcJob`]) and checks the
//! recovery contract's invariants from outside, through the control API and what the
//! simulated ranks report when they stop. Every wait is on an event (a role's line, the
//! control API's answer, the operation's stream) or a poll of the status with a bounded
//! deadline; the only sleeps are the faults' own lengths (how long a process stays frozen
//! or a link cut).
//!
//! The invariants, by the name a violation carries (the in-process campaign's, read from
//! outside):
//!
//! - `one_result`: an admitted uuid is never accepted again as new, and every final result
//!   the control API gives for a uuid (when it ran, asked again later, on a manager started
//!   after the one that ran it) is the first one. A uuid whose manager was killed before its
//!   result has none to give: a later manager refuses it (observation
//!   `interrupted_uuid_refused`).
//! - `bounded`: every operation ends within its deadlines plus the hold bound plus the
//!   length of the faults that froze it; every control call answers; the manager and the
//!   proxies stay up unless killed (`crash` otherwise).
//! - `not_running` and `final_switch`: after the faults heal and every process is back (and,
//!   with an even seed, an operator's `recover --to as-is` when the job does not run), the
//!   job runs, verified, with every rank registered and none lost, for longer than a broken
//!   connection may go unnoticed ([`LOSS_BOUND`]), and then a new switch succeeds.
//! - `hold_bounded`: with an odd seed no operator recovers: a job that does not run must
//!   have training stopped by the hold policy within its bound.
//! - `groups_consistent`, `nic_table`, `hccl_rule`: at the end every rank's view of each of
//!   its groups is its fellow members' view, the manager's NIC table is what the ranks hold,
//!   and no rank saw one of HCCL's rules broken.

use super::job::{
    JobError, ProcEnv, ProcJob, HOLD_BOUND, JOURNAL_TIMEOUT, LOSS_BOUND, NODES, PATIENCE,
    PHASE_DEADLINE, PPN,
};
use super::schedule::{Fault, LandAt, ProcSchedule, Step, Target};
use crate::chaos::answers::Answers;
use crate::chaos::driver::{RunResult, Stop, Violation};
use crate::chaos::relay::LinkMode;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use taskd_actors::control::proto::{recover_reply::Outcome, JobStatus, RefusalKind};
use taskd_actors::control::{ClientError, Progress, Switching};
use taskd_core::command::Target as CmdTarget;
use taskd_core::{DeviceId, JobId, NodeName, OperationId, OperationSummary, SwitchCommand};

/// How long past the hold bound a job may stay not running before the check fails: the
/// poll's period and a loaded machine's delays.
pub const HOLD_SLACK: Duration = Duration::from_secs(5);
/// The most the end of a schedule waits for the job to run again.
pub const SETTLE: Duration = Duration::from_secs(60);
/// The most a switch waits for the job to be ready.
const READY: Duration = Duration::from_secs(10);
/// How often the status is polled.
const POLL: Duration = Duration::from_millis(50);

type Checked<T = ()> = Result<T, Stop>;

/// Runs `schedule` on a job of processes started as `env` says.
pub fn run(env: &ProcEnv, schedule: &ProcSchedule) -> RunResult {
    let started = Instant::now();
    let mut out = RunResult {
        seed: schedule.seed,
        ..RunResult::default()
    };
    let job = match ProcJob::start(env, schedule.seed) {
        Ok(j) => j,
        Err(e) => {
            out.violations.push(Violation {
                seed: schedule.seed,
                invariant: "bounded",
                detail: format!("the job of processes did not start: {e}"),
            });
            out.elapsed = started.elapsed();
            return out;
        }
    };
    let dir = job.dir.clone();
    let mut d = Driver {
        job,
        schedule,
        out,
        answers: Answers::default(),
        admitted: Vec::new(),
        not_recorded: BTreeSet::new(),
        clock: started,
        at: "start".into(),
    };
    let ok = d
        .steps()
        .and_then(|()| d.settle())
        .and_then(|()| d.end())
        .is_ok();
    if !ok {
        let tails = d.job.stderr_tails(25);
        d.out.log.extend(tails.lines().map(str::to_owned));
        d.out.log.push(format!("logs kept in {}", dir.display()));
    }
    let mut out = d.out;
    drop(d.job);
    if ok {
        let _ = std::fs::remove_dir_all(&dir);
    }
    out.elapsed = started.elapsed();
    out
}

struct Driver<'a> {
    job: ProcJob,
    schedule: &'a ProcSchedule,
    out: RunResult,
    answers: Answers,
    /// Every uuid the manager admitted, with its command.
    admitted: Vec<(String, SwitchCommand)>,
    /// The uuids whose result said it was not journaled (`journal_error`): a manager started
    /// before a later write succeeded refuses them as interrupted, as the docs say.
    not_recorded: BTreeSet<String>,
    clock: Instant,
    at: String,
}

/// The name a refusal is counted under.
fn refusal_name(kind: RefusalKind) -> &'static str {
    kind.as_str_name()
}

impl Driver<'_> {
    fn log(&mut self, line: String) {
        self.out.log(self.clock, line);
    }

    /// Records a violation; the run stops.
    fn fail(&mut self, invariant: &'static str, detail: String) -> Stop {
        self.out.fail(self.clock, &self.at, invariant, detail)
    }

    fn harness(&mut self, e: JobError) -> Stop {
        self.fail("bounded", e.to_string())
    }

    fn observe(&mut self, what: &'static str) {
        self.out.observe(what);
    }

    fn tally(&mut self, kind: &'static str) {
        self.out.tally(kind);
    }

    fn command(&self, id: u128, targets: &[Target]) -> SwitchCommand {
        SwitchCommand {
            job: JobId(self.job.job.clone()),
            id: Some(OperationId(uuid::Uuid::from_u128(id))),
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
            match step {
                Step::Switch {
                    id,
                    targets,
                    at,
                    fault,
                } => {
                    self.tally(match targets.iter().all(|t| t.backup) {
                        true => "switch",
                        false => "switchback",
                    });
                    self.until_ready()?;
                    let cmd = self.command(*id, targets);
                    self.switch(cmd, *at, fault.as_ref())?;
                }
                Step::Fault(f) => self.fault(f)?,
                Step::Repeat { of } => {
                    self.tally("repeated_uuid");
                    if let Step::Switch { id, targets, .. } = &self.schedule.steps[*of] {
                        let cmd = self.command(*id, targets);
                        self.switch(cmd, LandAt::Accepted, None)?;
                    }
                }
                Step::Recover => self.recover()?,
            }
            self.alive()?;
        }
        Ok(())
    }

    /// Waits (polling the status, at most [`READY`]) until every worker is registered and
    /// the table verified, or the job does not run (a switch then meets the job as a fault
    /// left it, and may be refused).
    fn until_ready(&mut self) -> Checked {
        let deadline = Instant::now() + READY;
        loop {
            let st = self.job.status(0).map_err(|e| self.harness(e))?;
            if quiet(&st, NODES * PPN) || st.state != "running" {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.observe("switch_before_the_job_was_ready");
                return Ok(());
            }
            // A poll of the status, bounded by the deadline above.
            std::thread::sleep(POLL);
        }
    }

    /// The manager and the proxies run unless the campaign killed them.
    fn alive(&mut self) -> Checked {
        match self.job.crashed() {
            Some(what) => Err(self.fail("crash", what)),
            None => Ok(()),
        }
    }

    /// Injects `f` and heals it after its length.
    fn fault(&mut self, f: &Fault) -> Checked {
        if f.is_disk() {
            if !self.disk(f, true)? {
                return Ok(());
            }
            // The fault's length: how long the disk stays full or frozen.
            std::thread::sleep(Duration::from_millis(f.length_ms()));
            self.disk(f, false)?;
            return Ok(());
        }
        *self.out.faults.entry(f.kind()).or_default() += 1;
        self.log(format!("fault: {f}"));
        let hold = Duration::from_millis(f.length_ms());
        let r = match f {
            Fault::KillManager => self.job.restart_manager(),
            Fault::KillProxy(k) => self.job.restart_proxy(*k),
            Fault::KillWorker(r) => {
                self.job.kill_worker(*r);
                self.job.restart_worker(*r)
            }
            Fault::Freeze { proxy, .. } => {
                self.job.freeze(*proxy, true);
                // The fault's length: how long the process stays frozen.
                std::thread::sleep(hold);
                self.job.freeze(*proxy, false);
                Ok(())
            }
            Fault::Cut { node, .. } | Fault::Blackhole { node, .. } => {
                let mode = match f {
                    Fault::Cut { .. } => LinkMode::Cut,
                    _ => LinkMode::Blackhole,
                };
                self.job.link(*node, mode);
                // The fault's length: how long the link stays down.
                std::thread::sleep(hold);
                self.job.link(*node, LinkMode::Pass);
                Ok(())
            }
            Fault::FillDisk { .. } | Fault::FreezeDisk { .. } => unreachable!("handled above"),
        };
        self.log("fault healed".into());
        r.map_err(|e| self.harness(e))
    }

    /// Lands (`on`) or heals the disk fault `f`; `false` when the state directory has no file
    /// system of its own (the fault is skipped, and said so).
    fn disk(&mut self, f: &Fault, on: bool) -> Checked<bool> {
        let done = match f {
            Fault::FillDisk { .. } => self.job.fill_disk(on),
            _ => self.job.freeze_disk(on),
        };
        match done {
            Ok(()) if on => {
                *self.out.faults.entry(f.kind()).or_default() += 1;
                self.log(format!("fault: {f}"));
                Ok(true)
            }
            Ok(()) => {
                self.log("fault healed".into());
                Ok(true)
            }
            Err(why) if on => {
                self.log(format!("fault skipped ({f}): {why}"));
                self.observe("disk_fault_skipped");
                Ok(false)
            }
            Err(why) => Err(self.fail("bounded", format!("healing {f}: {why}"))),
        }
    }

    /// Submits `cmd`; lands `fault` when phase `at` starts; checks the result.
    fn switch(&mut self, cmd: SwitchCommand, at: LandAt, fault: Option<&Fault>) -> Checked {
        if at == LandAt::Before {
            if let Some(f) = fault {
                return self.switch_during(cmd, f);
            }
        }
        let uuid = cmd.id.map(|i| i.to_string()).unwrap_or_default();
        let keep = cmd.clone();
        let mut client = self.job.client();
        let submitted = self
            .job
            .bounded("a submission", async move { client.submit(&cmd).await });
        let op = match submitted {
            Err(e) => return Err(self.harness(e)),
            Ok(Err(ClientError::Refused { kind, reason, .. })) => {
                self.log(format!("refused ({}): {reason}", refusal_name(kind)));
                self.observe(refusal_name(kind));
                self.refused_repeat(&uuid, &reason)?;
                // The fault lands all the same: the operator's command met it.
                return fault.map_or(Ok(()), |f| self.fault(f));
            }
            Ok(Err(e)) => return Err(self.fail("bounded", format!("the submission failed: {e}"))),
            Ok(Ok(op)) => op,
        };
        // The operation in flight answered for its uuid sent again started nothing new.
        let started = !op.known && !op.in_flight;
        if let Err(e) = self.answers.accepted(&uuid, !started) {
            return Err(self.fail("one_result", e));
        }
        if started {
            self.out.operations += 1;
            self.admitted.push((uuid.clone(), keep));
        }
        let (reached_tx, reached) = tokio::sync::oneshot::channel();
        let task = self.job.runtime().spawn(follow(op, at, reached_tx));
        let _ = self.job.bounded("the phase", reached);
        let mut killed_manager = false;
        if let Some(f) = fault {
            killed_manager = *f == Fault::KillManager;
            self.fault(f)?;
        }
        let bound = op_bound(fault);
        let rt = self.job.runtime();
        let got = rt.block_on(async { tokio::time::timeout(bound, task).await });
        match got {
            Err(_) => Err(self.fail(
                "bounded",
                format!("uuid {uuid} had no result within {bound:?}"),
            )),
            Ok(Err(join)) => Err(self.fail("bounded", format!("following {uuid}: {join}"))),
            Ok(Ok(Err(e))) if killed_manager => {
                self.log(format!("the result of {uuid} died with the manager: {e}"));
                self.observe("result_lost_with_the_killed_manager");
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(self.fail("bounded", format!("uuid {uuid}: {e}"))),
            Ok(Ok(Ok(summary))) => self.answered(&uuid, &summary),
        }
    }

    /// Lands the disk fault `f`, submits `cmd` while it holds (its admission meets it: the
    /// manager refuses the switch, or runs it when the record still fits), heals it after its
    /// length and follows the switch to its result.
    fn switch_during(&mut self, cmd: SwitchCommand, f: &Fault) -> Checked {
        let landed = self.disk(f, true)?;
        let started = Instant::now();
        let heal_at = started + Duration::from_millis(f.length_ms());
        let uuid = cmd.id.map(|i| i.to_string()).unwrap_or_default();
        let keep = cmd.clone();
        let mut client = self.job.client();
        let task = self.job.runtime().spawn(async move {
            let op = client.submit(&cmd).await?;
            let known = (op.known, op.in_flight);
            op.result().await.map(|s| (known, s))
        });
        // The fault's length, then it heals (the switch may wait for it meanwhile).
        std::thread::sleep(heal_at.saturating_duration_since(Instant::now()));
        if landed {
            self.disk(f, false)?;
        }
        let bound = op_bound(Some(f));
        let rt = self.job.runtime();
        let got = rt.block_on(async { tokio::time::timeout(bound, task).await });
        match got {
            Err(_) => Err(self.fail(
                "bounded",
                format!("uuid {uuid} had no answer within {bound:?}"),
            )),
            Ok(Err(join)) => Err(self.fail("bounded", format!("following {uuid}: {join}"))),
            Ok(Ok(Err(ClientError::Refused { kind, reason, .. }))) => {
                self.log(format!("refused ({}): {reason}", refusal_name(kind)));
                self.observe(refusal_name(kind));
                self.refused_repeat(&uuid, &reason)
            }
            Ok(Ok(Err(e))) => Err(self.fail("bounded", format!("uuid {uuid}: {e}"))),
            Ok(Ok(Ok(((known, in_flight), summary)))) => {
                let fresh = !known && !in_flight;
                if let Err(e) = self.answers.accepted(&uuid, !fresh) {
                    return Err(self.fail("one_result", e));
                }
                if fresh {
                    self.out.operations += 1;
                    self.admitted.push((uuid.clone(), keep));
                }
                self.answered(&uuid, &summary)
            }
        }
    }

    fn answered(&mut self, uuid: &str, s: &OperationSummary) -> Checked {
        self.log(format!(
            "{uuid}: {} (applied {}, rolled back {}, job {})",
            s.result, s.applied, s.rolled_back, s.job_state
        ));
        if let Some(why) = &s.journal_error {
            self.log(format!("{uuid}: its result is not journaled: {why}"));
            self.observe("result_not_journaled");
            self.not_recorded.insert(uuid.to_owned());
        }
        if s.uuid != uuid {
            return Err(self.fail(
                "one_result",
                format!("asked for {uuid}, answered {}", s.uuid),
            ));
        }
        self.answers
            .answered(uuid, s)
            .map_err(|e| self.fail("one_result", e))
    }

    /// A refusal of a uuid that has a result breaks `one_result`: the uuid must return it.
    fn refused_repeat(&mut self, uuid: &str, reason: &str) -> Checked {
        if self.not_recorded.contains(uuid) && reason.contains("stopped before its result") {
            // Its result said it was not journaled, and a manager started since refuses it as
            // interrupted: what the docs promise for such a result.
            self.observe("not_journaled_result_refused_as_interrupted");
            return Ok(());
        }
        match self.answers.first(uuid) {
            Some(first) => {
                let first = format!("{first:?}");
                Err(self.fail(
                    "one_result",
                    format!("uuid {uuid} answered {first} before and is refused now: {reason}"),
                ))
            }
            None => {
                if self.admitted.iter().any(|(u, _)| u == uuid) {
                    self.observe("interrupted_uuid_refused");
                }
                Ok(())
            }
        }
    }

    /// `recover --to as-is`; any answer is fine, no answer within [`op_bound`] is not. While
    /// it waits, the launcher restarts the workers that exit (a recovery may wait for ranks
    /// whose training the hold policy stopped meanwhile).
    fn recover(&mut self) -> Checked {
        self.tally("recover");
        let mut c = self.job.client();
        let job = self.job.job.clone();
        let task = self
            .job
            .runtime()
            .spawn(async move { c.recover(&job, "as-is").await });
        let bound = op_bound(None);
        let started = Instant::now();
        let deadline = started + bound;
        while !task.is_finished() {
            if Instant::now() > deadline {
                task.abort();
                return Err(self.fail("bounded", format!("recover had no answer within {bound:?}")));
            }
            self.restart_exited_workers()?;
            // A poll of the call, bounded by the deadline above.
            std::thread::sleep(POLL);
        }
        match self.job.runtime().block_on(task) {
            Err(e) => Err(self.fail("bounded", format!("recover: {e}"))),
            Ok(Err(e)) => Err(self.fail("bounded", format!("recover failed: {e}"))),
            Ok(Ok(r)) => {
                let what = match &r.outcome {
                    Some(Outcome::Operation(_)) => "recover_re_stated",
                    Some(Outcome::Verification(_)) => "recover_verified",
                    Some(Outcome::Refused(_)) => "recover_refused",
                    Some(Outcome::Stopped(_)) => "recover_stopped_training",
                    None => "recover_no_outcome",
                };
                let took = started.elapsed();
                self.log(format!(
                    "recover: {what} after {took:?}, job {}",
                    r.job_state
                ));
                self.observe(what);
                Ok(())
            }
        }
    }
}

/// The most an operation may take: every phase's deadline (sample and pause count apart,
/// a rollback may follow the switch), the hold bound, the faults' own length, and time for a
/// killed role to come back on a loaded machine.
fn op_bound(fault: Option<&Fault>) -> Duration {
    // A frozen state directory holds the admission's and the result's writes each up to the
    // journal timeout.
    let journal = if fault.is_some_and(Fault::is_disk) {
        JOURNAL_TIMEOUT * 2
    } else {
        Duration::ZERO
    };
    PHASE_DEADLINE * 5
        + HOLD_BOUND
        + Duration::from_millis(fault.map_or(0, Fault::length_ms))
        + journal
        + PATIENCE
}

/// Follows `op`, telling `reached` when phase `at` started (or at once for `accepted`, or
/// when the operation ends first); its result.
async fn follow(
    mut op: Switching,
    at: LandAt,
    reached: tokio::sync::oneshot::Sender<()>,
) -> Result<OperationSummary, ClientError> {
    let mut reached = Some(reached);
    // Accepted: the operation is under way already.
    if !matches!(at, LandAt::Phase(_)) {
        reached.take().map(|r| r.send(()));
    }
    loop {
        match op.next().await {
            Ok(Progress::Phase(p)) => {
                if matches!(at, LandAt::Phase(ph) if p.phase == ph.as_str()) && p.kind == "started"
                {
                    reached.take().map(|r| r.send(()));
                }
            }
            Ok(Progress::Finished(s)) => return Ok(s),
            Err(e) => return Err(e),
        }
    }
}

/// One rank's report of one group: its members and the rank's view of their NICs.
pub(crate) type GroupView = (Vec<u32>, Option<Vec<bool>>);

/// What the ranks reported when they stopped: rank -> group -> (members, view), and the
/// rule violations they saw.
#[derive(Default)]
pub(crate) struct Views {
    pub(crate) groups: BTreeMap<String, BTreeMap<u32, GroupView>>,
    pub(crate) world_backup: BTreeMap<u32, BTreeSet<u32>>,
    pub(crate) violations: Vec<String>,
}

impl Views {
    /// Adds rank lines (`sim views:` JSON).
    pub(crate) fn parse(lines: &[String]) -> Result<Views, String> {
        let mut v = Views::default();
        for line in lines {
            let j: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("{line:?}: {e}"))?;
            let rank = j["rank"].as_u64().ok_or(format!("no rank in {line}"))? as u32;
            for g in j["groups"].as_array().into_iter().flatten() {
                let name = g["name"].as_str().unwrap_or_default().to_owned();
                let members: Vec<u32> = serde_json::from_value(g["members"].clone())
                    .map_err(|e| format!("{line}: {e}"))?;
                let view: Option<Vec<bool>> = serde_json::from_value(g["view"].clone())
                    .map_err(|e| format!("{line}: {e}"))?;
                if name == "world" {
                    let on: BTreeSet<u32> = view
                        .iter()
                        .flat_map(|v| members.iter().zip(v).filter(|(_, b)| **b).map(|(m, _)| *m))
                        .collect();
                    v.world_backup.insert(rank, on);
                }
                v.groups
                    .entry(name)
                    .or_default()
                    .insert(rank, (members, view));
            }
            for x in j["violations"].as_array().into_iter().flatten() {
                v.violations.push(format!("rank {rank}: {x}"));
            }
        }
        Ok(v)
    }

    /// The first group whose members disagree, in words.
    pub(crate) fn disagreement(&self) -> Option<String> {
        self.groups.iter().find_map(|(name, by_rank)| {
            let mut it = by_rank.iter();
            let (r0, first) = it.next()?;
            it.find(|(_, x)| *x != first).map(|(r, x)| {
                format!("group {name}: rank {r0} holds {first:?}, rank {r} holds {x:?}")
            })
        })
    }
}

impl Driver<'_> {
    /// Heals everything, brings every process back, and waits until the job runs, verified
    /// and quiet; an even seed's operator recovers a job that does not run.
    fn settle(&mut self) -> Checked {
        self.at = "the end: every fault healed".into();
        self.log(self.at.clone());
        self.job.heal_all();
        let deadline = Instant::now() + SETTLE;
        let mut not_running_since: Option<Instant> = None;
        let mut in_flight_since: Option<(String, Instant)> = None;
        let mut last_recover: Option<Instant> = None;
        let mut quiet_since: Option<Instant> = None;
        let expected = NODES * PPN;
        loop {
            self.alive()?;
            self.restart_exited_workers()?;
            let st = self.job.status(0).map_err(|e| self.harness(e))?;
            // Quiet for longer than a connection may stay down unnoticed: no link the faults
            // broke is still waiting to be declared lost.
            if !quiet(&st, expected) {
                quiet_since = None;
            } else if quiet_since.get_or_insert_with(Instant::now).elapsed() > LOSS_BOUND + POLL {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.fail("not_running", format!("after {SETTLE:?}: {}", brief(&st))));
            }
            self.in_flight_bounded(&st, &mut in_flight_since)?;
            let held = st.state != "running" && st.training_stop.is_none();
            if !held {
                not_running_since = None;
            } else {
                let since = *not_running_since.get_or_insert_with(Instant::now);
                if self.schedule.seed % 2 == 1 && since.elapsed() > HOLD_BOUND + HOLD_SLACK {
                    return Err(self.fail(
                        "hold_bounded",
                        format!(
                            "not running for {:?} and training not stopped: {}",
                            since.elapsed(),
                            brief(&st)
                        ),
                    ));
                }
                let due = !last_recover.is_some_and(|t| t.elapsed() <= Duration::from_secs(2));
                if self.schedule.seed % 2 == 0 && due && st.in_calls.is_none() {
                    last_recover = Some(Instant::now());
                    self.recover()?;
                }
            }
            // A poll of the status, bounded by the deadline above.
            std::thread::sleep(POLL);
        }
    }

    fn in_flight_bounded(
        &mut self,
        st: &JobStatus,
        since: &mut Option<(String, Instant)>,
    ) -> Checked {
        let Some(f) = st.in_flight.as_ref().filter(|f| !f.uuid.is_empty()) else {
            *since = None;
            return Ok(());
        };
        if !since.as_ref().is_some_and(|(u, _)| *u == f.uuid) {
            *since = Some((f.uuid.clone(), Instant::now()));
        }
        let t = since.as_ref().map(|(_, t)| t.elapsed()).unwrap_or_default();
        if t > op_bound(None) {
            return Err(self.fail(
                "bounded",
                format!("{} still in flight ({}) after {t:?}", f.uuid, f.phase),
            ));
        }
        Ok(())
    }

    fn restart_exited_workers(&mut self) -> Checked {
        for (r, code) in self.job.exited_workers() {
            self.observe(match code {
                Some(1) => "worker_exit_training_stopped",
                Some(2) => "worker_exit_refused",
                _ => "worker_exit_other",
            });
            self.log(format!(
                "worker {r} exited ({code:?}); its launcher starts it again"
            ));
            self.job.restart_worker(r).map_err(|e| self.harness(e))?;
        }
        Ok(())
    }
}

fn quiet(st: &JobStatus, expected: u32) -> bool {
    st.state == "running"
        && st.journal_error.is_empty()
        && st.verified
        && st.workers_registered == expected
        && st.lost_ranks.is_empty()
        && st.training_stop.is_none()
        && !st.in_flight.as_ref().is_some_and(|f| !f.uuid.is_empty())
}

fn brief(st: &JobStatus) -> String {
    format!(
        "state {}, verified {}, {} of {} registered, lost {:?}, in flight {:?}, training stop {:?}",
        st.state,
        st.verified,
        st.workers_registered,
        st.workers_expected,
        st.lost_ranks.iter().map(|l| l.rank).collect::<Vec<_>>(),
        st.in_flight.as_ref().map(|f| (&f.uuid, &f.phase)),
        st.training_stop.as_ref().map(|t| &t.phase),
    )
}

impl Driver<'_> {
    /// The job runs: a new switch must succeed, every admitted uuid must answer as it did,
    /// and the ranks must hold what the manager's table says.
    fn end(&mut self) -> Checked {
        self.at = "the end: a new switch".into();
        self.log(self.at.clone());
        let st = self.job.status(0).map_err(|e| self.harness(e))?;
        let back = !st.ranks_on_backup.contains(&PPN);
        let id = uuid::Uuid::from_u64_pair(self.schedule.seed, 0xf1).as_u128();
        let cmd = self.command(
            id,
            &[Target {
                node: 1,
                device: 0,
                backup: back,
            }],
        );
        let before = self.out.operations;
        self.switch(cmd.clone(), LandAt::Accepted, None)?;
        let uuid = cmd.id.map(|i| i.to_string()).unwrap_or_default();
        match self.answers.first(&uuid) {
            Some(a) if a.result == "succeeded" && self.out.operations > before => {}
            other => {
                let what = format!("{other:?}");
                return Err(self.fail("final_switch", format!("the new switch ended {what}")));
            }
        }
        self.at = "the end: every uuid asked again".into();
        self.log(self.at.clone());
        for (_, cmd) in self.admitted.clone() {
            self.switch(cmd, LandAt::Accepted, None)?;
        }
        self.at = "the end: the ranks' views".into();
        self.log(self.at.clone());
        let st = self.job.status(0).map_err(|e| self.harness(e))?;
        let table: BTreeSet<u32> = st.ranks_on_backup.iter().copied().collect();
        self.views_match(&table)
    }

    /// Stops every worker and checks its report against `table` and its group's members.
    fn views_match(&mut self, table: &BTreeSet<u32>) -> Checked {
        let mut lines = Vec::new();
        for r in self.job.stop_workers() {
            lines.push(r.map_err(|e| self.fail("bounded", e.to_string()))?);
        }
        let views = Views::parse(&lines).map_err(|e| self.fail("bounded", e))?;
        if !views.violations.is_empty() {
            return Err(self.fail("hccl_rule", views.violations.join("; ")));
        }
        if let Some(d) = views.disagreement() {
            return Err(self.fail("groups_consistent", d));
        }
        for (rank, on) in &views.world_backup {
            if on != table {
                return Err(self.fail(
                    "nic_table",
                    format!("the manager has ranks {table:?} on backup, rank {rank} holds {on:?}"),
                ));
            }
        }
        self.log(format!("every group agrees; ranks on backup {table:?}"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(rank: u32, world: [bool; 4]) -> String {
        serde_json::json!({
            "rank": rank,
            "groups": [
                {"name": "world", "members": [0, 1, 2, 3], "view": world},
                {"name": format!("dp_{}", rank % 2), "members": [rank % 2, rank % 2 + 2],
                 "view": [world[(rank % 2) as usize], world[(rank % 2 + 2) as usize]]},
            ],
            "violations": [],
        })
        .to_string()
    }

    #[test]
    fn views_that_agree_pass() {
        let all: Vec<String> = (0..4)
            .map(|r| line(r, [false, false, true, false]))
            .collect();
        let v = Views::parse(&all).unwrap();
        assert_eq!(v.disagreement(), None);
        assert!(v.world_backup.values().all(|on| on == &BTreeSet::from([2])));
    }

    #[test]
    fn a_rank_that_disagrees_is_caught() {
        let mut all: Vec<String> = (0..3)
            .map(|r| line(r, [false, false, true, false]))
            .collect();
        all.push(line(3, [false, false, false, false]));
        let v = Views::parse(&all).unwrap();
        let d = v.disagreement().expect("rank 3 disagrees");
        assert!(d.contains("group world"), "{d}");
    }
}
