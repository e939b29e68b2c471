//! The operation state machine: one switch, from the first pause request to the final result.
//!
//! Pure: [`Operation::start`] and [`Operation::handle`] take events and the current time and
//! return [`Action`]s (directives to broadcast, deadlines to arm, the final report). The
//! runtime delivers replies and fires deadlines; the machine decides everything else.
//!
//! ```text
//!  Sample ──all sampled──▶ Pause ──all paused(T)──▶ Switch ──all applied, digests agree──▶ Resume ─▶ done
//!    │                       │                        │ any failure / deadline / lost           ▲
//!    └── failure ────────────┴──▶ Resume (nothing     ▼                                          │
//!        (link down: rejected)     was changed)     Rollback ──all applied──────────────────────┘
//!                                                     │ failure / deadline
//!                                                     ▼
//!                                            done, job stays paused
//! ```

use crate::command::{Direction, RankTarget, SwitchPlan};
use crate::display::short_list;
use crate::hal::NicSide;
use crate::ids::{GlobalRank, NodeName, OperationId};
use crate::protocol::{
    AppliedCall, Directive, DirectiveKind, NodeReply, Phase, RankError, ReplyBody,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// How long each phase may take before the operation fails.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDeadlines {
    /// Each of the two pause parts (sample, pause): covers up to two training steps.
    pub pause: Duration,
    pub switch: Duration,
    pub rollback: Duration,
    pub resume: Duration,
}

impl Default for PhaseDeadlines {
    /// Minutes, sized for real steps of seconds to a minute and HCCL calls that renegotiate
    /// links; far below the reference system's two hours.
    fn default() -> Self {
        PhaseDeadlines {
            pause: Duration::from_secs(300),
            switch: Duration::from_secs(300),
            rollback: Duration::from_secs(300),
            resume: Duration::from_secs(60),
        }
    }
}

impl PhaseDeadlines {
    fn for_phase(&self, p: Phase) -> Duration {
        match p {
            Phase::Sample | Phase::Pause => self.pause,
            Phase::Switch => self.switch,
            Phase::Rollback => self.rollback,
            Phase::Resume | Phase::Verify => self.resume,
        }
    }
}

/// Input to the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Replies from one node.
    Replies(NodeReply),
    /// A deadline armed by [`Action::ArmDeadline`] fired.
    Deadline { token: u64 },
    /// A worker is gone (connection closed, heartbeats missed).
    WorkerLost { rank: GlobalRank, reason: String },
    /// The manager is stopping: end the operation safely now (roll back what may have been
    /// switched, open the gates) instead of leaving ranks held.
    Abort { reason: String },
}

/// What an operation is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    /// An operator's (or a policy's) switch: a failure rolls back and resumes.
    Switch,
    /// An operator's recovery of a job whose groups may disagree: it re-states one NIC
    /// configuration for the ranks in doubt. A failure never resumes (there is no consistent
    /// state to go back to): the job stays held for the operator.
    Recovery,
}

/// Output of the machine, to be carried out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send to every node (and through it, every worker).
    Broadcast(Directive),
    /// Fire [`Event::Deadline`] with this token at `at` (replaces any earlier deadline).
    ArmDeadline {
        token: u64,
        phase: Phase,
        at: Duration,
    },
    /// The one final result. Nothing follows it.
    Finish(Box<OperationReport>),
    /// A verification round ended (see [`crate::verify`]); the ledger has applied it.
    Verified(Box<crate::verify::VerifyReport>),
}

/// How an operation ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    /// Refused before anything changed (validation, or a target NIC's link is down).
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
        }
    }
}

/// The state of the training job after an operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Training runs; every group agrees on its NIC configuration.
    Running,
    /// Training is held at the step gate because groups may disagree on their NICs:
    /// resuming would hang or corrupt training. An operator must intervene.
    Paused,
    /// A process is gone; the job needs process-level recovery.
    NeedsRecovery,
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::NeedsRecovery => "needs_recovery",
        }
    }
}

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum OperationError {
    #[error("rank {rank} failed in {phase}: {error}")]
    RankFailed {
        rank: GlobalRank,
        phase: Phase,
        error: RankError,
    },
    #[error("{phase} phase passed its deadline of {deadline:?}; no answer from ranks {missing}")]
    Timeout {
        phase: Phase,
        deadline: Duration,
        missing: String,
    },
    #[error("rank {rank} was lost during {phase}: {reason}")]
    WorkerLost {
        rank: GlobalRank,
        phase: Phase,
        reason: String,
    },
    #[error("the {side} NIC link of {node}:{device} (rank {rank}) is down; switching onto it would fail")]
    LinkDown {
        node: NodeName,
        device: crate::ids::DeviceId,
        rank: GlobalRank,
        side: NicSide,
    },
    #[error("the state of the {side} NIC link of {node}:{device} (rank {rank}) is unknown ({reason}); a switch onto it is refused")]
    LinkUnknown {
        node: NodeName,
        device: crate::ids::DeviceId,
        rank: GlobalRank,
        side: NicSide,
        reason: String,
    },
    #[error("group {group} disagrees after {phase}: {detail}")]
    GroupDisagrees {
        group: String,
        phase: Phase,
        detail: String,
    },
    #[error("rank {rank} paused after step {got}, expected {expected}")]
    WrongPauseStep {
        rank: GlobalRank,
        got: u64,
        expected: u64,
    },
    #[error("aborted during {phase}: {reason}")]
    Aborted { phase: Phase, reason: String },
}

/// Time spent in each phase; `None` where the phase did not run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDurations {
    /// Sample and pause together: from the request until every rank held.
    pub pause: Option<Duration>,
    pub switch: Option<Duration>,
    pub rollback: Option<Duration>,
    pub resume: Option<Duration>,
    pub total: Duration,
}

/// The final result of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationReport {
    pub id: OperationId,
    pub direction: Direction,
    pub targets: Vec<RankTarget>,
    pub outcome: Outcome,
    /// The first failure; later ones are in `rank_errors`.
    pub error: Option<OperationError>,
    /// Why the rollback failed, when it did (the job then stays paused).
    pub rollback_error: Option<OperationError>,
    /// Every rank's own error, in the order they arrived.
    pub rank_errors: Vec<(GlobalRank, Phase, RankError)>,
    /// Whether a rollback restored the previous NIC state on every group.
    pub rolled_back: bool,
    /// Whether the targets' new NIC state is in effect (the NIC table must follow it).
    pub applied: bool,
    /// The step every rank stopped after, if they all paused.
    pub pause_step: Option<u64>,
    /// `(lowest, highest)` step the ranks reported being in when the pause was requested
    /// (ranks may be a step apart; the pause step is the highest).
    pub sampled_steps: Option<(u64, u64)>,
    pub phases: PhaseDurations,
    /// Longest time any rank's training was held at the gate, as the ranks reported it.
    pub stall: Option<Duration>,
    /// Ranks lost during the operation.
    pub lost_ranks: Vec<GlobalRank>,
    pub job_state: JobState,
}

/// One operation in flight.
#[derive(Clone, Debug)]
pub struct Operation {
    id: OperationId,
    kind: OperationKind,
    plan: SwitchPlan,
    previous: Vec<(GlobalRank, bool)>,
    deadlines: PhaseDeadlines,
    all_ranks: BTreeSet<GlobalRank>,
    phase: Phase,
    pending: BTreeSet<GlobalRank>,
    lost: BTreeMap<GlobalRank, String>,
    max_step: u64,
    min_step: Option<u64>,
    pause_step: Option<u64>,
    started: Duration,
    phase_started: Duration,
    durations: PhaseDurations,
    error: Option<OperationError>,
    rollback_error: Option<OperationError>,
    rank_errors: Vec<(GlobalRank, Phase, RankError)>,
    /// Per group: digest -> reporting ranks, for the phase being applied.
    digests: BTreeMap<String, (u32, BTreeMap<u64, Vec<GlobalRank>>)>,
    /// A rank whose calls were not in the planner's order.
    out_of_order: Option<(GlobalRank, String)>,
    switch_sent: bool,
    applied: bool,
    rolled_back: bool,
    stall: Option<Duration>,
    token: u64,
    finished: bool,
    /// `(rank, phase)` of every failure already in `rank_errors`, so a duplicated
    /// delivery of the same failure is reported once.
    errored: BTreeSet<(GlobalRank, Phase)>,
    /// a rank answered the resume with a failure: its gate is not known to be open.
    resume_failed: bool,
}

impl Operation {
    /// Starts an operation over `ranks` (every rank of the job). `previous` is the targets'
    /// current state, `(rank, use_backup)`, used for rollback.
    pub fn start(
        id: OperationId,
        plan: SwitchPlan,
        previous: Vec<(GlobalRank, bool)>,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let all_ranks: BTreeSet<GlobalRank> = ranks.into_iter().collect();
        // Only targets whose state the switch changes are rolled back: re-stating an unchanged
        // one could tell two dies of one NPU opposite sides in one call, which HCCL refuses.
        let commanded: BTreeMap<GlobalRank, bool> = plan.rank_flags().into_iter().collect();
        let previous: Vec<(GlobalRank, bool)> = previous
            .into_iter()
            .filter(|(r, was)| commanded.get(r) != Some(was))
            .collect();
        let mut op = Operation {
            id,
            kind: OperationKind::Switch,
            plan,
            previous,
            deadlines,
            pending: all_ranks.clone(),
            all_ranks,
            phase: Phase::Sample,
            lost: BTreeMap::new(),
            max_step: 0,
            min_step: None,
            pause_step: None,
            started: now,
            phase_started: now,
            durations: PhaseDurations::default(),
            error: None,
            rollback_error: None,
            rank_errors: Vec::new(),
            digests: BTreeMap::new(),
            out_of_order: None,
            switch_sent: false,
            applied: false,
            rolled_back: false,
            stall: None,
            token: 0,
            finished: false,
            errored: BTreeSet::new(),
            resume_failed: false,
        };
        let kind = DirectiveKind::Sample {
            targets: op.plan.targets.clone(),
        };
        let actions = op.enter(Phase::Sample, kind, now);
        (op, actions)
    }

    /// Starts a recovery (see [`OperationKind::Recovery`]): `plan` re-states the ranks in
    /// doubt; `previous` is what the rollback re-applies if the re-statement fails on some
    /// rank before the others made their calls.
    pub fn start_recovery(
        id: OperationId,
        plan: SwitchPlan,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let (mut op, actions) = Operation::start(id, plan, Vec::new(), ranks, deadlines, now);
        op.kind = OperationKind::Recovery;
        (op, actions)
    }

    pub fn id(&self) -> OperationId {
        self.id
    }

    /// What the operation is for.
    pub fn kind(&self) -> OperationKind {
        self.kind
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn plan(&self) -> &SwitchPlan {
        &self.plan
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Ranks the current phase still waits for.
    pub fn pending(&self) -> &BTreeSet<GlobalRank> {
        &self.pending
    }

    /// Feeds one event; returns what to do. After [`Action::Finish`] every event is ignored.
    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match event {
            Event::Replies(nr) => self.on_replies(nr),
            Event::Deadline { token } => {
                if token != self.token {
                    return Vec::new();
                }
                let missing = short_list(&self.pending);
                self.fail(OperationError::Timeout {
                    phase: self.phase,
                    deadline: self.deadlines.for_phase(self.phase),
                    missing,
                });
                return self.after_failure(now);
            }
            Event::WorkerLost { rank, reason } => {
                if !self.all_ranks.contains(&rank) || self.lost.contains_key(&rank) {
                    return Vec::new();
                }
                self.pending.remove(&rank);
                self.lost.insert(rank, reason.clone());
                self.fail(OperationError::WorkerLost {
                    rank,
                    phase: self.phase,
                    reason,
                });
            }
            Event::Abort { reason } => {
                // Not in the rollback or the resume: those are already the safe way out.
                if matches!(self.phase, Phase::Sample | Phase::Pause | Phase::Switch) {
                    self.fail(OperationError::Aborted {
                        phase: self.phase,
                        reason,
                    });
                }
            }
        }
        self.advance(now)
    }

    fn on_replies(&mut self, nr: NodeReply) {
        if nr.op != self.id {
            return;
        }
        if nr.phase == Phase::Sample && self.phase == Phase::Sample {
            self.check_health(&nr);
        }
        for r in nr.replies {
            if r.op != self.id {
                continue;
            }
            if let ReplyBody::Failed(e) = &r.body {
                // Late failures (a switch that fails while the rollback is queued) are kept
                // for the report even though they no longer steer the operation.
                // only for ranks of the job, and once per rank and phase: a
                // transport that delivers a message twice must not double the report.
                if self.all_ranks.contains(&r.rank) && self.errored.insert((r.rank, r.phase)) {
                    self.rank_errors.push((r.rank, r.phase, e.clone()));
                }
            }
            // a body that does not answer its phase's directive (say `Sampled`
            // tagged `Pause`, or `Resumed` tagged `Switch`) is not an answer: before, it took
            // the rank off `pending`, so the switch could be sent to a rank that never confirmed
            // it held, or a switch be taken as applied by a rank that reported no calls. The
            // rank stays pending; the phase's deadline covers it.
            if !body_answers(r.phase, &r.body) {
                continue;
            }
            if r.phase != self.phase || !self.pending.remove(&r.rank) {
                continue;
            }
            match r.body {
                ReplyBody::Sampled { in_step } => {
                    self.max_step = self.max_step.max(in_step);
                    self.min_step = Some(self.min_step.map_or(in_step, |m| m.min(in_step)));
                }
                ReplyBody::Paused { step } => {
                    let expected = self.pause_step.unwrap_or(self.max_step);
                    if step != expected {
                        self.fail(OperationError::WrongPauseStep {
                            rank: r.rank,
                            got: step,
                            expected,
                        });
                    }
                }
                ReplyBody::Applied { calls } => self.record_calls(r.rank, &calls),
                // Not an answer to any phase of an operation (`body_answers` filtered it).
                ReplyBody::Verified(_) => {}
                ReplyBody::Resumed { stalled } => {
                    self.stall = Some(self.stall.map_or(stalled, |s| s.max(stalled)))
                }
                ReplyBody::Failed(error) => {
                    // remember that a gate may have stayed shut (see `finish`).
                    if r.phase == Phase::Resume {
                        self.resume_failed = true;
                    }
                    self.fail(OperationError::RankFailed {
                        rank: r.rank,
                        phase: r.phase,
                        error,
                    })
                }
            }
        }
    }

    fn check_health(&mut self, nr: &NodeReply) {
        let down: Vec<OperationError> = nr
            .health
            .iter()
            .flat_map(|h| {
                self.plan
                    .targets
                    .iter()
                    .filter(move |t| t.node == nr.node && t.device == h.device)
                    .map(|t| (t, NicSide::from_use_backup(t.use_backup)))
                    .filter(move |(_, side)| !h.is_up(*side))
                    .map(move |(t, side)| match h.unknown(side) {
                        Some(reason) => OperationError::LinkUnknown {
                            node: t.node.clone(),
                            device: t.device,
                            rank: t.rank,
                            side,
                            reason: reason.to_owned(),
                        },
                        None => OperationError::LinkDown {
                            node: t.node.clone(),
                            device: t.device,
                            rank: t.rank,
                            side,
                        },
                    })
            })
            .collect();
        for e in down {
            self.fail(e);
        }
    }

    fn record_calls(&mut self, rank: GlobalRank, calls: &[AppliedCall]) {
        for w in calls.windows(2) {
            if w[0].group >= w[1].group && self.out_of_order.is_none() {
                self.out_of_order = Some((rank, w[1].group.clone()));
            }
        }
        for c in calls {
            let entry = self
                .digests
                .entry(c.group.clone())
                .or_insert_with(|| (c.group_size, BTreeMap::new()));
            entry.0 = entry.0.max(c.group_size);
            entry.1.entry(c.digest).or_default().push(rank);
        }
    }

    /// Every group called agrees: one digest, reported by every member.
    fn check_agreement(&self) -> Result<(), OperationError> {
        if let Some((rank, group)) = &self.out_of_order {
            return Err(OperationError::GroupDisagrees {
                group: group.clone(),
                phase: self.phase,
                detail: format!("rank {rank} called it out of the planned order"),
            });
        }
        for (group, (size, by_digest)) in &self.digests {
            if by_digest.len() > 1 {
                let detail = by_digest
                    .iter()
                    .map(|(d, ranks)| format!("{d:016x} from ranks {}", short_list(ranks)))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(OperationError::GroupDisagrees {
                    group: group.clone(),
                    phase: self.phase,
                    detail: format!("members made different calls: {detail}"),
                });
            }
            let reporters: usize = by_digest.values().map(Vec::len).sum();
            if reporters != *size as usize {
                return Err(OperationError::GroupDisagrees {
                    group: group.clone(),
                    phase: self.phase,
                    detail: format!("{reporters} of {size} members reported the call"),
                });
            }
        }
        Ok(())
    }

    /// Records a failure. In the rollback it is the rollback's own; otherwise the first one
    /// is the operation's cause and later ones only add to `rank_errors`.
    fn fail(&mut self, e: OperationError) {
        let slot = if self.phase == Phase::Rollback {
            &mut self.rollback_error
        } else {
            &mut self.error
        };
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn advance(&mut self, now: Duration) -> Vec<Action> {
        if self.failure_unhandled() {
            return self.after_failure(now);
        }
        if !self.pending.is_empty() {
            return Vec::new();
        }
        match self.phase {
            Phase::Sample => {
                let t = self.max_step;
                self.pause_step = Some(t);
                self.enter(Phase::Pause, DirectiveKind::PauseAt { step: t }, now)
            }
            Phase::Pause => {
                self.durations.pause = Some(now - self.started);
                self.switch_sent = true;
                let targets = self.plan.rank_flags();
                self.enter(Phase::Switch, DirectiveKind::Switch { targets }, now)
            }
            Phase::Switch => {
                self.durations.switch = Some(now - self.phase_started);
                match self.check_agreement() {
                    Ok(()) => {
                        self.applied = true;
                        self.enter(Phase::Resume, DirectiveKind::Resume, now)
                    }
                    Err(e) => {
                        self.fail(e);
                        self.after_failure(now)
                    }
                }
            }
            Phase::Rollback => {
                self.durations.rollback = Some(now - self.phase_started);
                match self.check_agreement() {
                    Ok(()) => {
                        self.rolled_back = true;
                        self.enter(Phase::Resume, DirectiveKind::Resume, now)
                    }
                    Err(e) => {
                        self.fail(e);
                        self.finish(now)
                    }
                }
            }
            Phase::Resume => {
                self.durations.resume = Some(now - self.phase_started);
                self.finish(now)
            }
            Phase::Verify => Vec::new(),
        }
    }

    /// Whether a failure was recorded that the current phase is not already the answer to.
    /// A failure during the resume only goes into the report: the gates open either way.
    fn failure_unhandled(&self) -> bool {
        match self.phase {
            Phase::Sample | Phase::Pause | Phase::Switch => self.error.is_some(),
            Phase::Rollback => self.rollback_error.is_some(),
            Phase::Resume | Phase::Verify => false,
        }
    }

    fn after_failure(&mut self, now: Duration) -> Vec<Action> {
        if self.kind == OperationKind::Recovery
            && matches!(self.phase, Phase::Sample | Phase::Pause | Phase::Switch)
        {
            // No consistent state to go back to: keep every gate shut for the operator.
            self.record_failed_phase(now);
            return self.finish(now);
        }
        match self.phase {
            // Nothing was changed yet: open the gates.
            Phase::Sample | Phase::Pause => {
                if self.phase == Phase::Pause {
                    self.durations.pause = Some(now - self.started);
                }
                self.enter(Phase::Resume, DirectiveKind::Resume, now)
            }
            Phase::Switch => {
                self.durations.switch = Some(now - self.phase_started);
                let targets = self.previous.clone();
                self.enter(Phase::Rollback, DirectiveKind::Rollback { targets }, now)
            }
            // A rollback that fails leaves groups that may disagree: stay paused.
            Phase::Rollback => {
                self.durations.rollback = Some(now - self.phase_started);
                self.finish(now)
            }
            // The gates may not all be open: the job is not known to run.
            Phase::Resume | Phase::Verify => {
                self.durations.resume = Some(now - self.phase_started);
                self.finish(now)
            }
        }
    }

    /// Records how long the phase that just failed ran.
    fn record_failed_phase(&mut self, now: Duration) {
        match self.phase {
            Phase::Sample | Phase::Pause => self.durations.pause = Some(now - self.started),
            Phase::Switch => self.durations.switch = Some(now - self.phase_started),
            _ => {}
        }
    }

    fn enter(&mut self, phase: Phase, kind: DirectiveKind, now: Duration) -> Vec<Action> {
        self.phase = phase;
        self.phase_started = now;
        self.pending = self
            .all_ranks
            .iter()
            .filter(|r| !self.lost.contains_key(r))
            .copied()
            .collect();
        self.digests.clear();
        self.out_of_order = None;
        self.token += 1;
        let directive = Directive { op: self.id, kind };
        let mut actions = vec![Action::Broadcast(directive)];
        if self.pending.is_empty() {
            // Every rank is gone: nobody can answer.
            actions.extend(self.finish(now));
            return actions;
        }
        actions.push(Action::ArmDeadline {
            token: self.token,
            phase,
            at: now + self.deadlines.for_phase(phase),
        });
        actions
    }

    fn finish(&mut self, now: Duration) -> Vec<Action> {
        self.finished = true;
        self.durations.total = now - self.started;
        // a rank that answered the resume with a failure is not known to train
        // again, like one that did not answer before the deadline; before, the job was
        // reported `running` (even after a switch that was not rolled back).
        let resumed = self.phase == Phase::Resume && self.pending.is_empty() && !self.resume_failed;
        let outcome = match &self.error {
            None if resumed => Outcome::Succeeded,
            Some(OperationError::LinkDown { .. } | OperationError::LinkUnknown { .. })
                if !self.switch_sent =>
            {
                Outcome::Rejected
            }
            _ => Outcome::Failed,
        };
        let error = match (&self.error, resumed) {
            (Some(e), _) => Some(e.clone()),
            (None, false) => Some(OperationError::Timeout {
                phase: Phase::Resume,
                deadline: self.deadlines.resume,
                missing: short_list(&self.pending),
            }),
            (None, true) => None,
        };
        let job_state = if !self.lost.is_empty() {
            JobState::NeedsRecovery
        } else if !resumed {
            if self.phase == Phase::Resume {
                JobState::NeedsRecovery
            } else {
                JobState::Paused
            }
        } else {
            JobState::Running
        };
        let report = OperationReport {
            id: self.id,
            direction: self.plan.direction(),
            targets: self.plan.targets.clone(),
            outcome,
            error,
            rollback_error: self.rollback_error.clone(),
            rank_errors: std::mem::take(&mut self.rank_errors),
            rolled_back: self.rolled_back,
            applied: self.applied && !self.rolled_back,
            // Only when every rank held there: the switch is sent after the last `paused`.
            pause_step: self.pause_step.filter(|_| self.switch_sent),
            sampled_steps: self
                .min_step
                .filter(|_| self.pause_step.is_some())
                .map(|lo| (lo, self.max_step)),
            phases: self.durations.clone(),
            stall: self.stall,
            lost_ranks: self.lost.keys().copied().collect(),
            job_state,
        };
        vec![Action::Finish(Box::new(report))]
    }
}

/// whether `body` is an answer to a directive of `phase` (a failure answers any).
fn body_answers(phase: Phase, body: &ReplyBody) -> bool {
    matches!(
        (phase, body),
        (_, ReplyBody::Failed(_))
            | (Phase::Sample, ReplyBody::Sampled { .. })
            | (Phase::Pause, ReplyBody::Paused { .. })
            | (Phase::Switch | Phase::Rollback, ReplyBody::Applied { .. })
            | (Phase::Resume, ReplyBody::Resumed { .. })
    )
}

impl fmt::Display for OperationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operation {} ({}, {} targets): {}",
            self.id,
            self.direction,
            self.targets.len(),
            self.outcome.as_str()
        )?;
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        if self.outcome == Outcome::Failed {
            write!(
                f,
                " (rolled back: {}, job {})",
                self.rolled_back,
                self.job_state.as_str()
            )?;
        }
        Ok(())
    }
}
