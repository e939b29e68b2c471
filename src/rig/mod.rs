//! The hardware-in-the-loop rig: one node's NPUs training an all-reduce loop under the
//! production control plane, switched to their backup NICs and back.
//!
//! `examples/hil_rig.rs` is the command line; this module is the rig, so tests drive exactly
//! what the example runs.
//!
//! **What runs.** One thread per local device (rank `r` on `devices[r]`). Each thread sets its
//! device (`aclrtSetDevice`), makes a stream and two device buffers, and joins every
//! communicator it is a member of with `HcclCommInitRootInfo`: the world group (all ranks) and
//! any extra groups of [`RigConfig::extra_groups`] (each from a root info of its own, generated
//! by the main thread after `aclInit` and `aclrtSetDevice` of the group's first member). Its
//! communicators become an [`AscendRankHal`](taskd_hal_ascend::AscendRankHal), the production
//! rank HAL, shared between the training loop and the rank's [`taskd_actors::Worker`] behind a
//! mutex (so one rank's HCCL calls stay sequential, as HCCL requires). The manager, the node's
//! proxy and the workers are the production actors in one process ([`LocalJob`]); the proxy
//! reads link health through [`AscendNodeHal`](taskd_hal_ascend::AscendNodeHal) (DCMI) or,
//! without DCMI, through [`UnmonitoredNodeHal`].
//!
//! **Training.** Each step, every rank spends [`RigConfig::compute`] on the host (standing in
//! for the forward and backward passes), then all-reduces (sum) a buffer of
//! [`RigConfig::elements`] `f32` values, each equal to `rank + 1`, on each of its groups in a
//! fixed order, waits for the stream, checks that every element is the sum of the members'
//! `rank + 1`, records the time the collectives took, and calls its step gate
//! ([`taskd_actors::StepGate`], core's `StepBoundary`). An all-reduce that fails ends that
//! rank's training; a wrong sum is counted.
//!
//! **Operations.** [`Rig::switch`] submits a command for some local devices to the in-process
//! manager and blocks until its final result, then trains [`RigConfig::window`] + 1 more steps,
//! so that each operation has three latency windows (min / median / max over every rank's
//! steps in the window):
//!
//! - *before*: the `window` steps up to the last step any rank had completed at submission;
//! - *during*: the steps after that, up to and including the first step after the resume
//!   (pause step `T` + 1): the steps run while the operation was in flight, and the first
//!   collective on the new NIC configuration, where real HCCL re-establishes its links;
//! - *after*: the `window` steps after that.
//!
//! The pause itself happens at the step gate, outside the timed collectives: its length is the
//! operation's stall, reported beside the windows.
//!
//! **Compute time.** The default 2 ms per step stands in for real work; `--compute-ms 0` runs a
//! bare all-reduce loop (steps of tens of microseconds against the stubs), which the tests use
//! as the hardest case for the pause: the ranks' pause requests then arrive many steps apart,
//! and every rank still answers at once from the step its gate published.
//!
//! **Invariants** ([`RigReport::invariants`]): every operation got exactly one final result;
//! no collective failed and every sum was right; the manager's NIC table matches what the
//! operations reported applied; the job is running; training progressed after the last
//! operation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use taskd_actors::{LocalJob, LocalJobConfig, LocalJobError, RankParts};
use taskd_core::command::Target;
use taskd_core::env::EnvLookup;
use taskd_core::operation::{JobState, OperationReport};
use taskd_core::summary::ms;
use taskd_core::{
    env as flags, DeviceId, GlobalRank, GroupInfo, HalError, JobId, LinkHealth, NodeHal, NodeName,
    OperationSummary, PhaseDeadlines, RankHal, RankTable, SubmitError, SwitchCommand,
};
use taskd_hal_ascend::result::{self, acl::AclInit};
use taskd_hal_ascend::sys::acl::AclLib;
use taskd_hal_ascend::sys::dcmi::DcmiLib;
use taskd_hal_ascend::sys::hccl::HcclLib;
use taskd_hal_ascend::LoadError;

mod report;
mod start;
mod training;

pub use report::{parse_devices, Invariant, LatencyWindow, OperationRecord, RigCommand, RigReport};
use start::*;
use training::*;

/// What the rig runs.
#[derive(Clone, Debug)]
pub struct RigConfig {
    /// The job's id, as the manager and the operation records show it.
    pub job: JobId,
    /// This node's name in the rank table and in commands.
    pub node: NodeName,
    /// Local devices, as *logical* ids (what `aclrtSetDevice` takes); rank `r` runs on
    /// `devices[r]`. The rig's commands ([`Rig::switch`], `--switch`) name devices the same
    /// way. The rank table and the commands sent to the manager carry each device's physical
    /// id, which the rig asks DCMI for (`dcmi_get_device_phyid_from_logicid`); without DCMI
    /// it takes the logical ids for physical ones, which holds on a host that does not
    /// renumber its devices (no container).
    pub devices: Vec<DeviceId>,
    /// Communicators besides the world group, each as its members (global ranks) in group-rank
    /// order. Every rank joins the world group first, then its extra groups in this order.
    pub extra_groups: Vec<Vec<GlobalRank>>,
    /// `f32` elements per all-reduce.
    pub elements: usize,
    /// Host time spent per step before the collectives, standing in for forward and backward
    /// passes (not timed as all-reduce latency). See the module docs on why it is not zero.
    pub compute: Duration,
    /// Steps per latency window.
    pub window: u64,
    /// Every this many steps, training ends the step with an evaluation: an all-reduce on the
    /// world communicator of an element count no recent step used, an operator HCCL has not
    /// issued before (see [`RigReport::collectives_on_default_nic`]). 0: never.
    pub eval_every: u64,
    /// Deadlines of every operation's phases, as the manager applies them.
    pub deadlines: PhaseDeadlines,
    /// How long to wait for setup or for training to make progress before giving up.
    pub progress_timeout: Duration,
}

impl RigConfig {
    /// `n` devices `0..n`, no extra groups, 1 Ki elements, 2 ms of compute per step, windows
    /// of 5 steps.
    pub fn new(n: u32) -> Self {
        RigConfig {
            job: JobId("hil-rig".into()),
            node: NodeName("node-0".into()),
            devices: (0..n).map(DeviceId).collect(),
            extra_groups: Vec::new(),
            elements: 1024,
            compute: Duration::from_millis(2),
            window: 5,
            eval_every: 0,
            deadlines: PhaseDeadlines::default(),
            progress_timeout: Duration::from_secs(120),
        }
    }

    /// Extra groups pairing ranks `(0, 1), (2, 3), ...` (a trailing odd rank stays alone in
    /// the world group).
    pub fn pairs(n: usize) -> Vec<Vec<GlobalRank>> {
        (0..n as u32 / 2)
            .map(|k| vec![GlobalRank(2 * k), GlobalRank(2 * k + 1)])
            .collect()
    }

    fn validate(&self) -> Result<(), RigError> {
        let n = self.devices.len();
        if n == 0 {
            return Err(RigError::Setup("the rig needs at least one device".into()));
        }
        let distinct: BTreeSet<_> = self.devices.iter().collect();
        if distinct.len() != n {
            return Err(RigError::Setup("a device is listed twice".into()));
        }
        if self.elements == 0 {
            return Err(RigError::Setup("elements must be at least 1".into()));
        }
        for g in &self.extra_groups {
            let members: BTreeSet<_> = g.iter().collect();
            if g.is_empty() || members.len() != g.len() {
                return Err(RigError::Setup(format!(
                    "extra group {g:?} is empty or lists a rank twice"
                )));
            }
            if let Some(r) = g.iter().find(|r| r.0 as usize >= n) {
                return Err(RigError::Setup(format!(
                    "extra group {g:?} names rank {r}, but the rig has ranks 0..{n}"
                )));
            }
        }
        Ok(())
    }

    /// World first, then the extra groups.
    fn all_groups(&self) -> Vec<Vec<GlobalRank>> {
        let world = (0..self.devices.len() as u32).map(GlobalRank).collect();
        std::iter::once(world)
            .chain(self.extra_groups.iter().cloned())
            .collect()
    }
}

/// The vendor libraries the rig runs on. DCMI is optional.
pub struct RigLibraries {
    /// HCCL: the communicators, the collectives and the NIC switch.
    pub hccl: Arc<HcclLib>,
    /// ACL: devices, streams and device memory for the collectives.
    pub acl: Arc<AclLib>,
    /// `Err` when DCMI could not be loaded: the proxy then uses [`UnmonitoredNodeHal`].
    pub dcmi: Result<DcmiLib, LoadError>,
}

impl RigLibraries {
    /// Finds the libraries as a worker does (`taskd_hal_ascend::search`).
    pub fn open(env: EnvLookup<'_>) -> Result<Self, LoadError> {
        Ok(RigLibraries {
            hccl: Arc::new(HcclLib::open(env)?),
            acl: Arc::new(AclLib::open(env)?),
            dcmi: DcmiLib::open(env),
        })
    }

    /// One line per library: which file was loaded.
    pub fn describe(&self) -> String {
        let dcmi = match &self.dcmi {
            Ok(d) => d.path().display().to_string(),
            Err(e) => format!("not loaded ({e})").replace('\n', " "),
        };
        format!(
            "hccl: {}\nacl:  {}\ndcmi: {dcmi}\n",
            self.hccl.path().display(),
            self.acl.path().display()
        )
    }
}

/// The node HAL when DCMI is unavailable: every NIC reported up.
///
/// With it the proxy never refuses a switch because a link is down; HCCL is then the only
/// judge of whether a NIC works. The rig's report says which node HAL ran.
pub struct UnmonitoredNodeHal;

impl NodeHal for UnmonitoredNodeHal {
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        Ok(LinkHealth::new(device, true, true))
    }
}

/// Why the rig could not start or run a command.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    /// A configuration the rig cannot run (no device, a device twice, a bad group); the text
    /// names it.
    #[error("bad rig setup: {0}")]
    Setup(String),
    /// A vendor library could not be loaded or lacks a function.
    #[error("{0}")]
    Library(#[from] LoadError),
    /// A rank's HCCL or ACL setup failed before training (device, stream, memory, a
    /// communicator).
    #[error("rank {rank} (device {device}) could not start: {error}")]
    RankInit {
        /// The rank.
        rank: u32,
        /// Its logical device id ([`RigConfig::devices`]).
        device: u32,
        /// The failed call's error, as text.
        error: String,
    },
    /// The in-process job could not start or be driven.
    #[error(transparent)]
    Job(#[from] LocalJobError),
    /// The slowest rank completed no step for the given time (at the given step).
    #[error("training made no progress for {0:?} (fewest steps completed: {1})")]
    Stuck(Duration, u64),
    /// A script or stdin line that is not a command: the line and what is wrong with it.
    #[error("bad command {0:?}: {1}")]
    Command(String, String),
}

// ---------------------------------------------------------------------------------------------
// The rig

/// A running rig.
pub struct Rig {
    cfg: RigConfig,
    table: RankTable,
    /// Per rank, the physical id of its device (the rank table's).
    physical: Vec<DeviceId>,
    acl: Arc<AclLib>,
    /// How the rig holds the Ascend runtime, so that it lets go of its own reference only.
    acl_init: AclInit,
    job: Option<LocalJob>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    node_hal: String,
    /// Per rank, its groups as HCCL names them, in the order the rank joined them.
    rank_groups: Vec<Vec<GroupInfo>>,
    operations: Vec<OperationRecord>,
    /// Operations that reached the manager (not refused at submission).
    admitted: usize,
    on_backup: BTreeSet<GlobalRank>,
    /// Operations whose NIC changes took effect: their pause step and targets.
    applied: Vec<(u64, Vec<(GlobalRank, bool)>)>,
    steps_at_last_operation: u64,
}

impl Rig {
    /// Starts the ranks, the actors and training; returns once every rank completed one step
    /// (HCCL refuses a NIC switch on a group that never ran a collective).
    ///
    /// `env` gives the ranks' switch capabilities as a worker reads them:
    /// `HCCL_OP_RETRY_ENABLE` (`L2:1`), `TASKD_HCCL_RDMA` and `MS_ENABLE_TFT` (`TSP:1`), and
    /// the DCMI probe timeout (`TASKD_DCMI_TIMEOUT_MS`).
    pub fn start(cfg: RigConfig, libs: RigLibraries, env: EnvLookup<'_>) -> Result<Rig, RigError> {
        cfg.validate()?;
        let caps = taskd_hal_ascend::rank::capabilities_from_env(env);
        let tsp = flags::tsp_enabled(flags::get(env, flags::MS_ENABLE_TFT).as_deref());
        let acl_init = result::acl::init(&libs.acl).map_err(|e| RigError::Setup(e.to_string()))?;
        let shared = Arc::new(Shared::new(cfg.devices.len()));
        let rt = Runtime {
            hccl: libs.hccl,
            acl: libs.acl,
        };
        let p = match prepare(&cfg, &rt, libs.dcmi, caps, &shared, env) {
            Ok(p) => p,
            Err(e) => {
                let _ = result::acl::release(&rt.acl, acl_init);
                return Err(e);
            }
        };
        let ranks = p
            .ranks
            .0
            .into_iter()
            .map(|h| RankParts {
                hal: Box::new(SharedRankHal(h)) as Box<dyn RankHal>,
                tsp,
            })
            .collect();
        let config = LocalJobConfig {
            job: cfg.job.clone(),
            table: p.table.clone(),
            deadlines: cfg.deadlines,
        };
        let job = match LocalJob::start(config, vec![p.node.hal], ranks) {
            Ok(j) => j,
            Err(e) => return Err(p.starting.abort(true, e.into())),
        };
        if let Err(e) = job.wait_registered(cfg.progress_timeout) {
            job.shutdown();
            return Err(p.starting.abort(true, e.into()));
        }
        for (r, tx) in p.starting.gates.iter().enumerate() {
            let _ = tx.send(Some(job.gate(GlobalRank(r as u32))));
        }
        let rig = Rig {
            cfg,
            table: p.table,
            physical: p.node.physical,
            acl: rt.acl,
            acl_init,
            job: Some(job),
            shared,
            threads: p.starting.threads,
            node_hal: p.node.description,
            rank_groups: p.ranks.1,
            operations: Vec::new(),
            admitted: 0,
            on_backup: BTreeSet::new(),
            applied: Vec::new(),
            steps_at_last_operation: 0,
        };
        rig.train(1)?;
        Ok(rig)
    }

    /// The configuration the rig was started with.
    pub fn config(&self) -> &RigConfig {
        &self.cfg
    }

    /// Which node HAL the proxy uses.
    pub fn node_hal(&self) -> &str {
        &self.node_hal
    }

    /// Per rank, its communicators as HCCL names them (with their members), in the order the
    /// rank joined them: world first.
    pub fn rank_groups(&self) -> &[Vec<GroupInfo>] {
        &self.rank_groups
    }

    /// Every communicator once, sorted by HCCL's name: the order in which the planner makes
    /// its calls.
    pub fn groups(&self) -> Vec<GroupInfo> {
        let mut all: Vec<GroupInfo> = self.rank_groups.iter().flatten().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.dedup_by(|a, b| a.name == b.name);
        all
    }

    /// The communicators, one line each, in planner order.
    pub fn groups_text(&self) -> String {
        self.groups()
            .iter()
            .map(|g| {
                let m: Vec<String> = g.members.iter().map(|r| r.0.to_string()).collect();
                format!("communicator {:?}: ranks {}\n", g.name, m.join(","))
            })
            .collect()
    }

    fn job(&self) -> &LocalJob {
        self.job.as_ref().expect("the job runs until finish")
    }

    /// Fewest steps any rank completed.
    pub fn min_steps(&self) -> u64 {
        self.shared.min_steps()
    }

    /// Blocks until every rank trained `steps` more steps than the furthest rank had.
    pub fn train(&self, steps: u64) -> Result<(), RigError> {
        let target = self.shared.max_steps() + steps;
        if self
            .shared
            .wait_min_steps(target, self.cfg.progress_timeout)
        {
            Ok(())
        } else {
            Err(RigError::Stuck(
                self.cfg.progress_timeout,
                self.shared.min_steps(),
            ))
        }
    }

    /// Runs one command.
    pub fn execute(&mut self, cmd: &RigCommand) -> Result<Option<&OperationRecord>, RigError> {
        match cmd {
            RigCommand::Train(n) => self.train(*n).map(|()| None),
            RigCommand::Switch {
                devices,
                use_backup,
            } => self.switch(devices, *use_backup).map(Some),
        }
    }

    /// Moves `devices` of this node to their backup NIC (`use_backup`) or back, through the
    /// manager; blocks until the final result and the after-window were trained.
    pub fn switch(
        &mut self,
        devices: &[DeviceId],
        use_backup: bool,
    ) -> Result<&OperationRecord, RigError> {
        let window = self.cfg.window;
        let s0 = self.shared.max_steps();
        let cmd = self.command(devices, use_backup);
        let report: Result<OperationReport, SubmitError> = match self.job().run(cmd.clone()) {
            Ok(r) => {
                self.admitted += 1;
                Ok(r)
            }
            Err(LocalJobError::Refused(e)) => Err(e),
            Err(e) => return Err(e.into()),
        };
        let running = self.job().status(0)?.state == JobState::Running;
        let end = match &report {
            Ok(r) => r.pause_step.map_or(self.shared.max_steps(), |t| t + 1),
            Err(_) => s0,
        };
        self.steps_at_last_operation = self.shared.max_steps().max(end);
        if running {
            let target = end + window;
            if !self
                .shared
                .wait_min_steps(target, self.cfg.progress_timeout)
            {
                return Err(RigError::Stuck(
                    self.cfg.progress_timeout,
                    self.shared.min_steps(),
                ));
            }
        }
        let windows = vec![
            self.window("before", s0.saturating_sub(window) + 1, s0),
            self.window("during", s0 + 1, end),
            self.window("after", end + 1, if running { end + window } else { end }),
        ];
        let summary = match report {
            Ok(r) => {
                self.note_applied(&r);
                OperationSummary::from(&r)
            }
            Err(refusal) => OperationSummary {
                journal_error: None,
                hold: None,
                job_state: if running { "running" } else { "paused" }.into(),
                ..OperationSummary::rejected(&cmd, self.table(), &refusal)
            },
        };
        let record = OperationRecord {
            devices: devices.iter().map(|d| d.0).collect(),
            use_backup,
            summary,
            windows,
        };
        self.operations.push(record);
        Ok(self.operations.last().expect("just pushed"))
    }

    /// A command moving `devices` (logical ids, as the rig names them) to their backup NIC or
    /// back, naming each by its physical id as the manager's rank table does. A device that is
    /// not one of the rig's keeps its number (the manager then refuses it, naming it).
    fn command(&self, devices: &[DeviceId], use_backup: bool) -> SwitchCommand {
        let physical = |d: &DeviceId| {
            let r = self.cfg.devices.iter().position(|x| x == d);
            r.map_or(*d, |r| self.physical[r])
        };
        SwitchCommand {
            job: self.cfg.job.clone(),
            id: None,
            targets: devices
                .iter()
                .map(|d| Target {
                    node: self.cfg.node.clone(),
                    device: physical(d),
                    use_backup,
                })
                .collect(),
        }
    }

    /// Follows an operation whose NIC changes took effect: the NIC table it implies, and when
    /// (its pause step) for [`RigReport::collectives_on_default_nic`].
    fn note_applied(&mut self, r: &OperationReport) {
        if !r.applied {
            return;
        }
        for t in &r.targets {
            if t.use_backup {
                self.on_backup.insert(t.rank);
            } else {
                self.on_backup.remove(&t.rank);
            }
        }
        let step = r.pause_step.unwrap_or_else(|| self.shared.max_steps());
        let targets = r.targets.iter().map(|t| (t.rank, t.use_backup)).collect();
        self.applied.push((step, targets));
    }

    /// The collectives that ran on the default NIC of a switched communicator, by HCCL's
    /// per-operator rule (docs/a3-node.md): only the evaluations, each an
    /// operator not issued since the count last came round, on the world communicator. One
    /// at step `s` whose count was first issued at step `first` ran with rank `r` on its
    /// default NIC when `r` was on its backup NIC at `s` by a switch applied before `first`
    /// (after the pause step `t < first`: the operator did not exist yet).
    fn collectives_on_default_nic(&self, steps: u64) -> u64 {
        let (every, elements) = (self.cfg.eval_every, self.cfg.elements);
        let mut first_issue: std::collections::HashMap<u64, u64> = Default::default();
        let mut count = 0;
        for step in 1..=steps {
            let Some(size) = evaluation_count(every, elements, step) else {
                continue;
            };
            // The operator (this count) exists since its first issue; a switch applied after
            // a step reaches the operators issued by then.
            let first = *first_issue.entry(size).or_insert(step);
            let mut switched_at: BTreeMap<GlobalRank, u64> = BTreeMap::new();
            for (t, targets) in self.applied.iter().filter(|(t, _)| *t < step) {
                for (rank, backup) in targets {
                    if *backup {
                        switched_at.insert(*rank, *t);
                    } else {
                        switched_at.remove(rank);
                    }
                }
            }
            count += u64::from(switched_at.values().any(|t| *t < first));
        }
        count
    }

    fn window(&self, label: &'static str, first: u64, last: u64) -> LatencyWindow {
        let st = self.shared.lock();
        let mut v: Vec<Duration> = st
            .latency
            .iter()
            .flat_map(|per_rank| {
                (first..=last).filter_map(move |s| per_rank.get(s.checked_sub(1)? as usize))
            })
            .copied()
            .collect();
        v.sort();
        LatencyWindow {
            label,
            first_step: first,
            last_step: last,
            samples: v.len(),
            min_ms: v.first().copied().map(ms),
            median_ms: v.get(v.len() / 2).copied().map(ms),
            max_ms: v.last().copied().map(ms),
        }
    }

    /// Stops training at a common step (nobody is left inside a collective), stops the actors,
    /// releases every communicator, stream and buffer on its rank's thread, lets go of its
    /// reference to the Ascend runtime, and reports.
    pub fn finish(mut self) -> RigReport {
        let job = self.job.take().expect("finish once");
        let status = job.status(usize::MAX).ok();
        let state = status.as_ref().map_or(JobState::NeedsRecovery, |s| s.state);
        let mut progressed = true;
        if state == JobState::Running {
            let stop = self.shared.stop_after(self.shared.max_steps() + 1);
            progressed = self.shared.wait_min_steps(stop, self.cfg.progress_timeout);
        } else {
            // Held ranks must not train on groups that may disagree: they leave the loop as
            // soon as their gate opens.
            self.shared.stop_after(0);
        }
        job.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Err(e) = result::acl::release(&self.acl, self.acl_init) {
            self.shared.lock().errors.push(e.to_string());
        }
        let steps_completed = self.shared.min_steps();
        let ranks_on_backup: Vec<u32> = status
            .as_ref()
            .map(|s| s.ranks_on_backup.iter().map(|r| r.0).collect())
            .unwrap_or_default();
        let results = status.as_ref().map_or(0, |s| s.recent.len());
        let invariants = self.invariants(&ranks_on_backup, results, state, progressed);
        let st = self.shared.lock();
        RigReport {
            devices: self.cfg.devices.iter().map(|d| d.0).collect(),
            physical_devices: self.physical.iter().map(|d| d.0).collect(),
            groups: self.groups(),
            node_hal: self.node_hal.clone(),
            operations: std::mem::take(&mut self.operations),
            steps_completed,
            collective_errors: st.errors.clone(),
            wrong_results: st.wrong_results,
            collectives_on_default_nic: self.collectives_on_default_nic(steps_completed),
            ranks_on_backup,
            expected_on_backup: self.on_backup.iter().map(|r| r.0).collect(),
            job_state: state.as_str().into(),
            invariants,
        }
    }

    /// The invariants of [`RigReport::invariants`], from the manager's final status.
    fn invariants(
        &self,
        ranks_on_backup: &[u32],
        results: usize,
        state: JobState,
        progressed: bool,
    ) -> Vec<Invariant> {
        let st = self.shared.lock();
        let steps_completed = st.completed.iter().copied().min().unwrap_or(0);
        let expected_on_backup: Vec<u32> = self.on_backup.iter().map(|r| r.0).collect();
        let clean = st.errors.is_empty() && st.wrong_results == 0;
        vec![
            Invariant {
                name: "one final result per operation",
                ok: results == self.admitted,
                detail: format!(
                    "{} operations reached the manager, it reports {results} results",
                    self.admitted
                ),
            },
            Invariant {
                name: "collectives succeeded with the right sums",
                ok: clean,
                detail: if clean {
                    "every all-reduce succeeded and returned the sum of its members".into()
                } else {
                    let errors = st.errors.join("; ");
                    format!("{} wrong sums; errors: {errors}", st.wrong_results)
                },
            },
            Invariant {
                name: "NIC table matches the results",
                ok: ranks_on_backup == expected_on_backup,
                detail: format!(
                    "manager: {ranks_on_backup:?} on backup, operations imply \
                     {expected_on_backup:?}"
                ),
            },
            Invariant {
                name: "job running",
                ok: state == JobState::Running,
                detail: state.as_str().into(),
            },
            Invariant {
                name: "training progressed after the last operation",
                ok: progressed && steps_completed > self.steps_at_last_operation,
                detail: format!(
                    "every rank completed {steps_completed} steps; the last operation ended by \
                     step {}",
                    self.steps_at_last_operation
                ),
            },
        ]
    }

    /// The rank table (node, device, rank).
    pub fn table(&self) -> &RankTable {
        &self.table
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // A rig dropped without finish (an error path): stop everything, wait for nobody.
        if let Some(job) = self.job.take() {
            self.shared.stop_after(0);
            job.shutdown();
        }
    }
}

/// The header printed before training: devices, groups, libraries, node HAL.
pub fn header_text(cfg: &RigConfig, libs: &RigLibraries) -> String {
    let devs: Vec<String> = cfg.devices.iter().map(|d| d.0.to_string()).collect();
    let mut s = format!(
        "rig: job {} node {} devices {} ({} ranks), {} f32 per all-reduce, {:?} compute per \
         step, windows of {} steps\n",
        cfg.job,
        cfg.node,
        devs.join(","),
        cfg.devices.len(),
        cfg.elements,
        cfg.compute,
        cfg.window
    );
    for (i, g) in cfg.all_groups().iter().enumerate() {
        let m: Vec<String> = g.iter().map(|r| r.0.to_string()).collect();
        let _ = writeln!(
            s,
            "group {}: ranks {}",
            if i == 0 {
                "world".into()
            } else {
                format!("#{i}")
            },
            m.join(",")
        );
    }
    s.push_str(&libs.describe());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::SideState;

    #[test]
    fn commands_parse() {
        assert_eq!(RigCommand::parse("train 7").unwrap(), RigCommand::Train(7));
        assert_eq!(
            RigCommand::parse(" switch 0,1 ").unwrap(),
            RigCommand::Switch {
                devices: vec![DeviceId(0), DeviceId(1)],
                use_backup: true
            }
        );
        assert_eq!(
            RigCommand::parse("back 3").unwrap(),
            RigCommand::Switch {
                devices: vec![DeviceId(3)],
                use_backup: false
            }
        );
        for bad in ["", "switch", "switch a", "jump 1", "train x", "back 1 2"] {
            assert!(RigCommand::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_is_validated() {
        assert!(RigConfig::new(2).validate().is_ok());
        assert!(RigConfig::new(0).validate().is_err());
        let mut c = RigConfig::new(2);
        c.devices = vec![DeviceId(1), DeviceId(1)];
        assert!(c.validate().is_err());
        let mut c = RigConfig::new(2);
        c.extra_groups = vec![vec![GlobalRank(0), GlobalRank(2)]];
        assert!(c.validate().is_err());
        c.extra_groups = vec![vec![GlobalRank(0), GlobalRank(0)]];
        assert!(c.validate().is_err());
        assert_eq!(
            RigConfig::pairs(5),
            vec![
                vec![GlobalRank(0), GlobalRank(1)],
                vec![GlobalRank(2), GlobalRank(3)]
            ]
        );
    }

    #[test]
    fn unmonitored_node_hal_reports_every_nic_up() {
        let mut h = UnmonitoredNodeHal;
        let l = h.link_health(DeviceId(3)).unwrap();
        assert_eq!((l.primary, l.backup), (SideState::Up, SideState::Up));
    }
}
