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
//!
//! Each box is a stage of [`Operation`] with its own data: the sample's step range, the pause
//! step, the tally of call digests per group (switch and rollback), the resume's refusals and
//! stall. A [`OperationKind::Recovery`] has no way back: any failure before its resume ends it
//! with the job held.
//!
//! A [`OperationKind::Sequenced`] operation (ClusterD's client, [`crate::clusterd`]) runs the
//! same stages, but an outside driver sequences them: after the pause, and again after the
//! switch (or its rollback), it *holds* every rank and waits for its next command (the targets,
//! the resume, a stop), with a deadline. Its commands are in `operation/sequenced.rs`.

use crate::assessment::VerifyReport;
use crate::command::{Direction, RankTarget, SwitchPlan};
use crate::display::short_list;
use crate::hal::NicSide;
use crate::ids::{GlobalRank, NodeName, OperationId};
use crate::inflight::{CollectivePosition, RedoError};
pub use crate::job_state::JobState;
use crate::protocol::{
    AppliedCall, Directive, DirectiveKind, NodeReply, Phase, RankError, ReplyBody,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

mod sequenced;
pub use sequenced::{Awaiting, CommandError};

/// How long each phase may take before the operation fails.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDeadlines {
    /// Each of the two pause parts (sample, pause): covers up to two training steps.
    pub pause: Duration,
    /// Every rank's NIC-set calls for the switch.
    pub switch: Duration,
    /// Every rank's NIC-set calls re-applying the previous state.
    pub rollback: Duration,
    /// Every rank's gate opening (and a verification round).
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
    /// The time a rank's NIC-set calls get in the switch or the rollback: three quarters of
    /// the phase's deadline. A framework's switch function is handed it, so that a collective
    /// switch one rank gave up on ends on every rank before the phase does, and the rollback
    /// meets ranks that are out of their calls.
    pub fn call_timeout(&self, p: Phase) -> Duration {
        self.for_phase(p) * 3 / 4
    }

    fn for_phase(&self, p: Phase) -> Duration {
        match p {
            Phase::Sample | Phase::Pause | Phase::Abort => self.pause,
            Phase::Switch => self.switch,
            Phase::Rollback => self.rollback,
            Phase::Resume | Phase::Verify | Phase::Stop => self.resume,
        }
    }
}

/// Input to the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Replies from one node.
    Replies(NodeReply),
    /// A deadline armed by [`Action::ArmDeadline`] fired.
    Deadline {
        /// The armed deadline's token (a stale one is ignored).
        token: u64,
    },
    /// A worker is gone (connection closed, heartbeats missed).
    WorkerLost {
        /// The rank whose worker is gone.
        rank: GlobalRank,
        /// Why, for the report.
        reason: String,
    },
    /// The manager is stopping: end the operation safely now (roll back what may have been
    /// switched, open the gates) instead of leaving ranks held.
    Abort {
        /// Why, for the report.
        reason: String,
    },
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
    /// A pause, a switch and a resume each started by an outside driver (ClusterD): the
    /// operation holds every rank between them, waiting for the next command (see
    /// [`Action::Held`]). A failed switch rolls back and holds again; a hold that outlives
    /// its deadline resumes.
    Sequenced,
}

/// Who asked for an operation.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// An operator (the control API, the CLI, a launcher): every operation unless said
    /// otherwise.
    #[default]
    Operator,
    /// The automatic failover policy ([`crate::auto`]).
    Auto,
}

impl Trigger {
    /// The name used in logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Operator => "operator",
            Trigger::Auto => "auto",
        }
    }
}

/// Output of the machine, to be carried out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send to every node (and through it, every worker).
    Broadcast(Directive),
    /// Fire [`Event::Deadline`] with this token at `at` (replaces any earlier deadline).
    ArmDeadline {
        /// The token the [`Event::Deadline`] carries back.
        token: u64,
        /// The phase it bounds.
        phase: Phase,
        /// When it fires, on the clock the caller hands in.
        at: Duration,
    },
    /// The one final result. Nothing follows it.
    Finish(Box<OperationReport>),
    /// A verification round ended (see [`crate::verify`]); the ledger has applied it.
    Verified(Box<VerifyReport>),
    /// A [`OperationKind::Sequenced`] operation holds every rank and waits for its next
    /// command.
    Held(HoldPoint),
}

/// Where a [`OperationKind::Sequenced`] operation holds (see [`Action::Held`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldPoint {
    /// Every rank holds after `step`; the operation waits for its targets or its resume.
    Paused {
        /// The step every rank holds after.
        step: u64,
    },
    /// The switch is over and every group agrees; the operation waits for its resume.
    /// `applied`: the new NIC state is in effect; `false`: the switch failed and the rollback
    /// restored the previous one.
    Switched {
        /// Whether the new NIC state is in effect.
        applied: bool,
    },
}

/// How an operation ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The targets' new NIC state is in effect on every group and every gate is open.
    Succeeded,
    /// Something went wrong; the report says what and where the job stands.
    Failed,
    /// Refused before anything changed (validation, or a target NIC's link is down).
    Rejected,
}

impl Outcome {
    /// The name used in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum OperationError {
    /// A rank answered a directive with a failure.
    #[error("rank {rank} failed in {phase}: {error}")]
    RankFailed {
        /// The rank that failed.
        rank: GlobalRank,
        /// The phase whose directive failed.
        phase: Phase,
        /// The rank's own account.
        error: RankError,
    },
    /// A phase's deadline passed with ranks still to answer.
    #[error("{phase} phase passed its deadline of {deadline:?}; no answer from ranks {missing}")]
    Timeout {
        /// The phase that ran out of time.
        phase: Phase,
        /// Its deadline.
        deadline: Duration,
        /// The ranks that did not answer, as a short list.
        missing: String,
    },
    /// A rank's worker was lost while the operation ran.
    #[error("rank {rank} was lost during {phase}: {reason}")]
    WorkerLost {
        /// The lost rank.
        rank: GlobalRank,
        /// The phase running when it was lost.
        phase: Phase,
        /// Why, as the transport tells it.
        reason: String,
    },
    /// A target's link on the side it is to move to is down (found while sampling, before
    /// anything changed).
    #[error("the {side} NIC link of {node}:{device} (rank {rank}) is down; switching onto it would fail")]
    LinkDown {
        /// The target's node.
        node: NodeName,
        /// The target's device.
        device: crate::ids::DeviceId,
        /// The target's rank.
        rank: GlobalRank,
        /// The side whose link is down.
        side: NicSide,
    },
    /// A target's NIC link state could not be read (the probe failed or timed out).
    #[error("the state of the {side} NIC link of {node}:{device} (rank {rank}) is unknown ({reason}); a switch onto it is refused")]
    LinkUnknown {
        /// The target's node.
        node: NodeName,
        /// The target's device.
        device: crate::ids::DeviceId,
        /// The target's rank.
        rank: GlobalRank,
        /// The side whose link state is unknown.
        side: NicSide,
        /// Why the state could not be read.
        reason: String,
    },
    /// The members of a group made different calls, not all of them reported theirs, or one
    /// called groups out of the planned order.
    #[error("group {group} disagrees after {phase}: {detail}")]
    GroupDisagrees {
        /// The group.
        group: String,
        /// The switch or the rollback.
        phase: Phase,
        /// What disagrees, with the digests and ranks.
        detail: String,
    },
    /// An in-flight operation's sample found ranks whose training process has no in-flight
    /// side: they could not abort their collectives in flight. Nothing was aborted or
    /// switched; the gates opened again.
    #[error("{}: an in-flight move needs every training process to abort its collectives in flight (taskd's Gloo switch can); nothing was aborted. Run the move without aborting in flight, or restart the job", crate::display::ranks_with(ranks, "has no in-flight side", "have no in-flight side"))]
    NoInFlightSide {
        /// The ranks without one, as a short list.
        ranks: String,
    },
    /// A rank held after another step than the pause step.
    #[error("rank {rank} paused after step {got}, expected {expected}")]
    WrongPauseStep {
        /// The rank.
        rank: GlobalRank,
        /// The step it held after.
        got: u64,
        /// The pause step.
        expected: u64,
    },
    /// The manager stopped the operation ([`Event::Abort`]).
    #[error("aborted during {phase}: {reason}")]
    Aborted {
        /// The phase running.
        phase: Phase,
        /// Why the manager is stopping.
        reason: String,
    },
    /// A [`OperationKind::Sequenced`] operation held past its hold deadline without its next
    /// command: it resumed on the NIC state the groups agree on.
    #[error("held {held:?} waiting for {awaiting}, which never came; resumed")]
    HoldExpired {
        /// The hold deadline.
        held: Duration,
        /// What it waited for ("its targets", "its resume").
        awaiting: String,
    },
    /// A [`OperationKind::Sequenced`] operation was told to stop: it ended at a hold point
    /// without resuming, so training stays held on groups that agree.
    #[error("stopped in {phase}: {reason}; training stays held")]
    Stopped {
        /// The phase it stopped in.
        phase: Phase,
        /// Who stopped it and why.
        reason: String,
    },
}

/// Time spent in each phase; `None` where the phase did not run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDurations {
    /// Sample and pause together: from the request until every rank held.
    pub pause: Option<Duration>,
    /// The switch, from its broadcast until every rank answered or it failed.
    pub switch: Option<Duration>,
    /// The rollback, likewise.
    pub rollback: Option<Duration>,
    /// The resume, likewise.
    pub resume: Option<Duration>,
    /// From the first broadcast to the report.
    pub total: Duration,
}

/// The final result of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationReport {
    /// The operation's id.
    pub id: OperationId,
    /// Which way the targets moved.
    pub direction: Direction,
    /// The targets, resolved, in the operator's order.
    pub targets: Vec<RankTarget>,
    /// How it ended.
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
    /// Time spent in each phase.
    pub phases: PhaseDurations,
    /// Longest time any rank's training was held at the gate, as the ranks reported it.
    pub stall: Option<Duration>,
    /// Ranks lost during the operation.
    pub lost_ranks: Vec<GlobalRank>,
    /// Where the training job stands after the operation.
    pub job_state: JobState,
    /// Who asked for it.
    #[serde(default)]
    pub trigger: Trigger,
    /// Why the manager could not record this result in its journal, when it could not: the
    /// result is not durable (a manager restarted before a later write succeeds does not know
    /// it, and runs its uuid again or refuses it as interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_error: Option<String>,
    /// When the job is left not running (a failed rollback, a lost process): what that leads
    /// to under the manager's hold policy, for a person (`stop training after 300s held`, or
    /// `hold until an operator acts`). `None` when the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
}

impl OperationReport {
    /// The report of operation `id` with `outcome` and nothing else known: no error, nothing
    /// applied or rolled back, no pause, no phase timed, no rank lost, the job running, the
    /// operator's. For tools and tests that make reports; the fields that differ are set with
    /// `OperationReport { applied: true, ..OperationReport::new(..) }`.
    pub fn new(
        id: OperationId,
        direction: Direction,
        targets: Vec<RankTarget>,
        outcome: Outcome,
    ) -> Self {
        OperationReport {
            id,
            direction,
            targets,
            outcome,
            error: None,
            rollback_error: None,
            rank_errors: Vec::new(),
            rolled_back: false,
            applied: false,
            pause_step: None,
            sampled_steps: None,
            phases: PhaseDurations::default(),
            stall: None,
            lost_ranks: Vec::new(),
            job_state: JobState::Running,
            trigger: Trigger::Operator,
            journal_error: None,
            hold: None,
        }
    }
}

/// One operation in flight.
///
/// The operation is always in one stage (sampling, pausing, applying, rolling back, resuming,
/// done), which carries what only that stage needs; what outlives a stage (the failures, the
/// pause's record, the phase durations) sits beside it.
#[derive(Clone, Debug)]
pub struct Operation {
    id: OperationId,
    kind: OperationKind,
    trigger: Trigger,
    plan: SwitchPlan,
    /// What a rollback re-applies: every target with the side it had before.
    previous: RollbackTargets,
    deadlines: PhaseDeadlines,
    /// Every rank of the job: every one answers every broadcast, unless it is lost.
    all_ranks: BTreeSet<GlobalRank>,
    /// Ranks lost so far, and why. A lost rank is owed no answer in any later phase.
    lost: BTreeMap<GlobalRank, String>,
    started: Duration,
    durations: PhaseDurations,
    /// The operation's cause of failure: the first one outside the rollback (which keeps its
    /// own, see [`Stage::RollingBack`]).
    error: Option<OperationError>,
    rank_errors: RankErrors,
    pause: PauseRecord,
    round: Round,
    stage: Stage,
    /// A [`OperationKind::Sequenced`] operation's commands and hold deadline.
    seq: Option<sequenced::Commands>,
    /// The operation moves the job inside the step: after the sample, every rank aborts its
    /// collectives in flight instead of pausing at a boundary ([`Operation::set_in_flight`]).
    in_flight: bool,
}

/// Where an operation stands, with the data only that stage needs.
#[derive(Clone, Debug)]
enum Stage {
    /// Every rank reports the step it is in: `(lowest, highest)` reported so far, and the
    /// ranks that said they have no in-flight side (which an in-flight operation needs).
    Sampling {
        steps: Option<(u64, u64)>,
        without_side: Vec<GlobalRank>,
    },
    /// Every rank finishes `step` and holds after it.
    Pausing { step: u64 },
    /// Every rank ends its collectives in flight and reports where each group stands (an
    /// in-flight operation, instead of the pause).
    Aborting {
        positions: BTreeMap<GlobalRank, Vec<CollectivePosition>>,
    },
    /// Every rank applies the switch and reports its calls.
    Applying(Tally),
    /// Every rank re-applies [`Operation::previous`] and reports its calls. `error` is the
    /// rollback's own failure: it ends the operation with the job paused.
    RollingBack {
        tally: Tally,
        error: Option<OperationError>,
    },
    /// Every rank opens its step gate.
    Resuming(Resuming),
    /// Every rank holds; a [`OperationKind::Sequenced`] operation waits for its next command.
    /// `nic` is what it did to the targets' NICs so far.
    Holding { nic: NicChange },
    /// The report is out; `ended_in` is the phase the operation ended in.
    Done { ended_in: Phase },
}

impl Stage {
    fn phase(&self) -> Phase {
        match self {
            Stage::Sampling { .. } => Phase::Sample,
            Stage::Pausing { .. } => Phase::Pause,
            Stage::Aborting { .. } => Phase::Abort,
            Stage::Applying(_) => Phase::Switch,
            Stage::RollingBack { .. } => Phase::Rollback,
            Stage::Resuming(_) => Phase::Resume,
            // The job is paused while it holds.
            Stage::Holding { .. } => Phase::Pause,
            Stage::Done { ended_in } => *ended_in,
        }
    }

    /// The stages on the way to the switch. A failure in one of them is the operation's
    /// cause; the rollback and the resume are already the way out of a failure.
    fn is_forward(&self) -> bool {
        matches!(
            self,
            Stage::Sampling { .. }
                | Stage::Pausing { .. }
                | Stage::Aborting { .. }
                | Stage::Applying(_)
        )
    }
}

/// The resume stage's data.
#[derive(Clone, Debug)]
struct Resuming {
    /// The NIC configuration the gates open on.
    nic: NicChange,
    /// Ranks that answered the resume with a failure: their gates are not known to be open,
    /// so the job is not known to run.
    refused: BTreeSet<GlobalRank>,
    /// The longest time a rank reports its training was held.
    stall: Option<Duration>,
}

/// What an operation did to the targets' NICs, as it resumes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum NicChange {
    /// The pause failed: no rank was told to switch.
    Unchanged,
    /// Every group applied the switch and agrees on it.
    Applied,
    /// The switch failed and every group agrees on the restored previous state.
    RolledBack,
}

/// What the pause established, for the report.
#[derive(Copy, Clone, Debug, Default)]
struct PauseRecord {
    /// `(lowest, highest)` step the ranks were in, once every rank answered the sample.
    sampled: Option<(u64, u64)>,
    /// The step every rank holds after, once every rank confirmed it. The switch is broadcast
    /// at that moment: this is `Some` exactly when the switch was sent.
    held_after: Option<u64>,
}

/// One broadcast and the answers it still waits for.
#[derive(Clone, Debug)]
struct Round {
    /// The token of the deadline armed for it. Each round arms a new one: a deadline with an
    /// older token belongs to a phase that is over.
    token: u64,
    started: Duration,
    /// Ranks that owe an answer (lost ranks never do).
    pending: BTreeSet<GlobalRank>,
}

/// The calls the members of each group reported for the switch or rollback in flight.
#[derive(Clone, Debug, Default)]
struct Tally {
    groups: BTreeMap<String, GroupTally>,
    /// The first rank whose calls were not in the planner's order (sorted by group name), and
    /// the group where it showed.
    out_of_order: Option<(GlobalRank, String)>,
}

/// One group's entry of a [`Tally`].
#[derive(Clone, Debug, Default)]
struct GroupTally {
    /// The group's size, as its members report it.
    size: u32,
    /// Per digest of the call, the members that reported it.
    by_digest: BTreeMap<u64, Vec<GlobalRank>>,
}

impl Tally {
    fn record(&mut self, rank: GlobalRank, calls: &[AppliedCall]) {
        for w in calls.windows(2) {
            if w[0].group >= w[1].group && self.out_of_order.is_none() {
                self.out_of_order = Some((rank, w[1].group.clone()));
            }
        }
        for c in calls {
            let g = self.groups.entry(c.group.clone()).or_default();
            g.size = g.size.max(c.group_size);
            g.by_digest.entry(c.digest).or_default().push(rank);
        }
    }

    /// Every group called agrees: one digest, reported by every member, in the planned order.
    fn check(&self, phase: Phase) -> Result<(), OperationError> {
        let disagrees = |group: &str, detail: String| OperationError::GroupDisagrees {
            group: group.to_owned(),
            phase,
            detail,
        };
        if let Some((rank, group)) = &self.out_of_order {
            return Err(disagrees(
                group,
                format!("rank {rank} called it out of the planned order"),
            ));
        }
        for (group, g) in &self.groups {
            if g.by_digest.len() > 1 {
                let detail = g
                    .by_digest
                    .iter()
                    .map(|(d, ranks)| format!("{d:016x} from ranks {}", short_list(ranks)))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(disagrees(
                    group,
                    format!("members made different calls: {detail}"),
                ));
            }
            let reporters: usize = g.by_digest.values().map(Vec::len).sum();
            if reporters != g.size as usize {
                return Err(disagrees(
                    group,
                    format!("{reporters} of {} members reported the call", g.size),
                ));
            }
        }
        Ok(())
    }
}

/// Every rank's own failure, in the order they arrived.
#[derive(Clone, Debug, Default)]
struct RankErrors {
    list: Vec<(GlobalRank, Phase, RankError)>,
    /// `(rank, phase)` of every entry of `list`: a transport that delivers a failure twice
    /// must not double it in the report.
    seen: BTreeSet<(GlobalRank, Phase)>,
}

impl RankErrors {
    fn record(&mut self, rank: GlobalRank, phase: Phase, e: &RankError) {
        if self.seen.insert((rank, phase)) {
            self.list.push((rank, phase, e.clone()));
        }
    }
}

impl Operation {
    /// Starts an operator's operation over `ranks` (every rank of the job). `previous` is the
    /// targets' current side, used for rollback.
    pub fn start(
        id: OperationId,
        plan: SwitchPlan,
        previous: Vec<(GlobalRank, NicSide)>,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        Operation::start_by(Trigger::Operator, id, plan, previous, ranks, deadlines, now)
    }

    /// [`Operation::start`] for whoever `trigger` names (the report says who).
    pub fn start_by(
        trigger: Trigger,
        id: OperationId,
        plan: SwitchPlan,
        previous: Vec<(GlobalRank, NicSide)>,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let ranks = ranks.into_iter().collect();
        let origin = (OperationKind::Switch, trigger);
        Operation::begin(origin, id, plan, previous, ranks, deadlines, now)
    }

    /// Starts a recovery (see [`OperationKind::Recovery`]): `plan` re-states the ranks in
    /// doubt. A failure ends it with every gate shut: nothing is rolled back.
    pub fn start_recovery(
        id: OperationId,
        plan: SwitchPlan,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let ranks = ranks.into_iter().collect();
        let origin = (OperationKind::Recovery, Trigger::Operator);
        Operation::begin(origin, id, plan, Vec::new(), ranks, deadlines, now)
    }

    fn begin(
        (kind, trigger): (OperationKind, Trigger),
        id: OperationId,
        plan: SwitchPlan,
        previous: Vec<(GlobalRank, NicSide)>,
        all_ranks: BTreeSet<GlobalRank>,
        deadlines: PhaseDeadlines,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let previous = RollbackTargets::new(&plan, previous);
        let targets = plan.targets.clone();
        let mut op = Operation {
            id,
            kind,
            trigger,
            plan,
            previous,
            deadlines,
            round: Round {
                token: 0,
                started: now,
                pending: all_ranks.clone(),
            },
            all_ranks,
            lost: BTreeMap::new(),
            started: now,
            durations: PhaseDurations::default(),
            error: None,
            rank_errors: RankErrors::default(),
            pause: PauseRecord::default(),
            stage: Stage::Sampling {
                steps: None,
                without_side: Vec::new(),
            },
            seq: None,
            in_flight: false,
        };
        let sampling = Stage::Sampling {
            steps: None,
            without_side: Vec::new(),
        };
        let actions = op.enter(sampling, DirectiveKind::Sample { targets }, now);
        (op, actions)
    }

    /// Makes the operation move the job inside the step (before any reply was handled: the
    /// sample is the same either way): after the sample, every rank aborts its collectives in
    /// flight ([`DirectiveKind::AbortInFlight`]), the switch rebuilds the groups and redoes
    /// them from the point the ranks agree on ([`DirectiveKind::SwitchInFlight`]), and the
    /// gates open. No pause step is asked for, and a failure is not rolled back (the old
    /// plane's connections are gone): the gates open and the workers give their framework's
    /// waiting collectives up, the recovery path of a failed collective.
    pub fn set_in_flight(&mut self) {
        self.in_flight = true;
    }

    /// Whether the operation moves the job inside the step ([`Operation::set_in_flight`]).
    pub fn is_in_flight(&self) -> bool {
        self.in_flight
    }

    /// The operation's id.
    pub fn id(&self) -> OperationId {
        self.id
    }

    /// After the operation ended in its switch or rollback phase: that phase and the ranks that
    /// had not answered it (still inside their NIC-set calls, or lost). Their late calls would
    /// pair with the next operation's on some group: [`crate::ledger::JobLedger`] waits for
    /// their answers first.
    pub fn left_in_calls(&self) -> Option<(Phase, BTreeSet<GlobalRank>)> {
        let Stage::Done { ended_in } = self.stage else {
            return None;
        };
        if !matches!(ended_in, Phase::Switch | Phase::Rollback) {
            return None;
        }
        let ranks: BTreeSet<GlobalRank> = self
            .round
            .pending
            .iter()
            .chain(self.lost.keys())
            .copied()
            .collect();
        (!ranks.is_empty()).then_some((ended_in, ranks))
    }

    /// What the operation is for.
    pub fn kind(&self) -> OperationKind {
        self.kind
    }

    /// Who asked for it.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// The phase running (after the finish: the phase the operation ended in).
    pub fn phase(&self) -> Phase {
        self.stage.phase()
    }

    /// The targets, resolved.
    pub fn plan(&self) -> &SwitchPlan {
        &self.plan
    }

    /// Whether the final report is out.
    pub fn is_finished(&self) -> bool {
        matches!(self.stage, Stage::Done { .. })
    }

    /// Ranks the current phase still waits for.
    pub fn pending(&self) -> &BTreeSet<GlobalRank> {
        &self.round.pending
    }

    /// Feeds one event; returns what to do. After [`Action::Finish`] every event is ignored.
    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Action> {
        if self.is_finished() {
            return Vec::new();
        }
        match event {
            Event::Replies(nr) => self.on_replies(nr),
            Event::Deadline { token } => return self.on_deadline(token, now),
            Event::WorkerLost { rank, reason } => {
                if !self.all_ranks.contains(&rank) || self.lost.contains_key(&rank) {
                    return Vec::new();
                }
                self.round.pending.remove(&rank);
                self.lost.insert(rank, reason.clone());
                let phase = self.phase();
                self.fail(OperationError::WorkerLost {
                    rank,
                    phase,
                    reason,
                });
                if self.is_holding() {
                    return self.leave_hold(now);
                }
            }
            Event::Abort { reason } => {
                // A sequenced operation does not hold again for its driver: it resumes at its
                // next hold point.
                if let Some(seq) = self.seq.as_mut() {
                    seq.resume_at_hold();
                }
                if self.stage.is_forward() || self.is_holding() {
                    let phase = self.phase();
                    self.fail(OperationError::Aborted { phase, reason });
                }
                if self.is_holding() {
                    return self.leave_hold(now);
                }
            }
        }
        self.advance(now)
    }

    fn on_deadline(&mut self, token: u64, now: Duration) -> Vec<Action> {
        if token != self.round.token {
            return Vec::new();
        }
        if self.is_holding() {
            return self.hold_expired(now);
        }
        let phase = self.phase();
        self.fail(OperationError::Timeout {
            phase,
            deadline: self.deadlines.for_phase(phase),
            missing: short_list(&self.round.pending),
        });
        self.after_failure(now)
    }

    fn on_replies(&mut self, nr: NodeReply) {
        if nr.op != self.id {
            return;
        }
        if nr.phase == Phase::Sample && matches!(self.stage, Stage::Sampling { .. }) {
            self.check_health(&nr);
        }
        for r in nr.replies {
            if r.op != self.id {
                continue;
            }
            // Every failure of a rank of the job goes into the report, late ones too (a switch
            // that fails while the rollback is queued), though they no longer steer anything.
            if let ReplyBody::Failed(e) = &r.body {
                if self.all_ranks.contains(&r.rank) {
                    self.rank_errors.record(r.rank, r.phase, e);
                }
            }
            // Only an answer to the directive in flight takes a rank off `pending`: a body
            // that does not answer its phase (`Sampled` tagged `Pause`, `Resumed` tagged
            // `Switch`) leaves it pending, so the switch goes only to ranks that confirmed
            // they hold, and a switch counts as applied only by ranks that reported their
            // calls. The phase's deadline covers a rank that never answers properly.
            if !body_answers(r.phase, &r.body)
                || r.phase != self.phase()
                || !self.round.pending.remove(&r.rank)
            {
                continue;
            }
            self.on_answer(r.rank, r.body);
        }
    }

    /// A rank's answer to the directive in flight (`body` answers it, see [`body_answers`]).
    fn on_answer(&mut self, rank: GlobalRank, body: ReplyBody) {
        let phase = self.phase();
        let failure = match (&mut self.stage, body) {
            (
                Stage::Sampling {
                    steps,
                    without_side,
                },
                ReplyBody::Sampled { in_step, in_flight },
            ) => {
                if !in_flight {
                    without_side.push(rank);
                }
                *steps = Some(steps.map_or((in_step, in_step), |(lo, hi)| {
                    (lo.min(in_step), hi.max(in_step))
                }));
                None
            }
            (Stage::Aborting { positions }, ReplyBody::Aborted { collectives, .. }) => {
                positions.insert(rank, collectives);
                None
            }
            (Stage::Pausing { step }, ReplyBody::Paused { step: got }) => {
                (got != *step).then_some(OperationError::WrongPauseStep {
                    rank,
                    got,
                    expected: *step,
                })
            }
            (Stage::Applying(tally), ReplyBody::Applied { calls })
            | (Stage::RollingBack { tally, .. }, ReplyBody::Applied { calls }) => {
                tally.record(rank, &calls);
                None
            }
            (Stage::Resuming(r), ReplyBody::Resumed { stalled }) => {
                r.stall = Some(r.stall.map_or(stalled, |s| s.max(stalled)));
                None
            }
            (stage, ReplyBody::Failed(error)) => {
                if let Stage::Resuming(r) = stage {
                    r.refused.insert(rank);
                }
                Some(OperationError::RankFailed { rank, phase, error })
            }
            // No other body answers the phase in flight.
            _ => None,
        };
        if let Some(e) = failure {
            self.fail(e);
        }
    }

    /// A node's link health, with its sample answers: a target whose new side's link is down
    /// fails the operation before anything is switched.
    fn check_health(&mut self, nr: &NodeReply) {
        let down: Vec<OperationError> = nr
            .health
            .iter()
            .flat_map(|h| {
                self.plan
                    .targets
                    .iter()
                    .filter(move |t| t.node == nr.node && t.device == h.device)
                    .filter(move |t| !h.is_up(t.side()))
                    .map(move |t| match h.unknown(t.side()) {
                        Some(reason) => OperationError::LinkUnknown {
                            node: t.node.clone(),
                            device: t.device,
                            rank: t.rank,
                            side: t.side(),
                            reason: reason.to_owned(),
                        },
                        None => OperationError::LinkDown {
                            node: t.node.clone(),
                            device: t.device,
                            rank: t.rank,
                            side: t.side(),
                        },
                    })
            })
            .collect();
        for e in down {
            self.fail(e);
        }
    }

    /// Records a failure. In the rollback it is the rollback's own; otherwise the first one
    /// is the operation's cause and later ones only add to the rank errors.
    fn fail(&mut self, e: OperationError) {
        let slot = match &mut self.stage {
            Stage::RollingBack { error, .. } => error,
            _ => &mut self.error,
        };
        slot.get_or_insert(e);
    }

    /// Whether a failure was recorded that the current stage is not already the answer to.
    /// A failure during the resume only goes into the report: the gates open either way.
    fn failure_unhandled(&self) -> bool {
        match &self.stage {
            Stage::RollingBack { error, .. } => error.is_some(),
            // A hold is left by a command, a lost rank, an abort or its deadline, each of which
            // leaves it at once; a failure recorded before it (a switch that was rolled back)
            // is already answered.
            Stage::Resuming(_) | Stage::Holding { .. } | Stage::Done { .. } => false,
            _ => self.error.is_some(),
        }
    }

    fn advance(&mut self, now: Duration) -> Vec<Action> {
        if self.failure_unhandled() {
            // A rank still inside its switch calls would pair a late call with its peers'
            // rollback call on the same group (HCCL matches calls by order): the rollback waits
            // for every live rank's answer to the switch. The switch deadline bounds the wait.
            if matches!(self.stage, Stage::Applying(_)) && !self.round.pending.is_empty() {
                return Vec::new();
            }
            return self.after_failure(now);
        }
        if !self.round.pending.is_empty() {
            return Vec::new();
        }
        let took = now - self.round.started;
        match &self.stage {
            Stage::Sampling {
                steps,
                without_side,
            } if self.in_flight => {
                self.pause.sampled = *steps;
                if !without_side.is_empty() {
                    // Checked before anything is aborted: a rank that cannot abort would fail
                    // the abort after its peers aborted, and send them all to a restart.
                    let mut ranks = without_side.clone();
                    ranks.sort();
                    self.fail(OperationError::NoInFlightSide {
                        ranks: short_list(&ranks),
                    });
                    return self.after_failure(now);
                }
                let aborting = Stage::Aborting {
                    positions: BTreeMap::new(),
                };
                let targets = self.plan.rank_sides();
                self.enter(aborting, DirectiveKind::AbortInFlight { targets }, now)
            }
            Stage::Aborting { positions } => {
                self.durations.pause = Some(now - self.started);
                match crate::inflight::agree(positions) {
                    Ok(redo) => {
                        let applying = Stage::Applying(Tally::default());
                        let switch = DirectiveKind::SwitchInFlight {
                            targets: self.plan.rank_sides(),
                            call_timeout: self.deadlines.call_timeout(Phase::Switch),
                            redo,
                        };
                        self.enter(applying, switch, now)
                    }
                    Err(e) => {
                        let group = match &e {
                            RedoError::Incomplete { group, .. }
                            | RedoError::SizeDisagrees { group, .. }
                            | RedoError::Impossible { group, .. }
                            | RedoError::AheadOfIssue { group, .. } => group.clone(),
                        };
                        self.fail(OperationError::GroupDisagrees {
                            group,
                            phase: Phase::Abort,
                            detail: e.to_string(),
                        });
                        self.after_failure(now)
                    }
                }
            }
            Stage::Sampling { steps, .. } => {
                self.pause.sampled = *steps;
                // The pause step is the highest any rank is in: every rank can reach it.
                let step = steps.map_or(0, |(_, highest)| highest);
                self.enter(
                    Stage::Pausing { step },
                    DirectiveKind::PauseAt { step },
                    now,
                )
            }
            Stage::Pausing { step } => {
                self.pause.held_after = Some(*step);
                self.durations.pause = Some(now - self.started);
                if self.kind == OperationKind::Sequenced {
                    let at = HoldPoint::Paused { step: *step };
                    return self.hold(NicChange::Unchanged, at, now);
                }
                let targets = self.plan.rank_sides();
                let applying = Stage::Applying(Tally::default());
                let call_timeout = self.deadlines.call_timeout(Phase::Switch);
                let switch = DirectiveKind::Switch {
                    targets,
                    call_timeout,
                };
                self.enter(applying, switch, now)
            }
            Stage::Applying(tally) => {
                self.durations.switch = Some(took);
                match tally.check(Phase::Switch) {
                    Ok(()) => self.resume_or_hold(NicChange::Applied, now),
                    Err(e) => {
                        self.fail(e);
                        self.after_failure(now)
                    }
                }
            }
            Stage::RollingBack { tally, .. } => {
                self.durations.rollback = Some(took);
                match tally.check(Phase::Rollback) {
                    Ok(()) => self.resume_or_hold(NicChange::RolledBack, now),
                    Err(e) => {
                        self.fail(e);
                        self.finish(now)
                    }
                }
            }
            Stage::Resuming(_) => {
                self.durations.resume = Some(took);
                self.finish(now)
            }
            // Holding waits for a command, not for ranks.
            Stage::Holding { .. } | Stage::Done { .. } => Vec::new(),
        }
    }

    /// The way out of a failure in the current stage.
    fn after_failure(&mut self, now: Duration) -> Vec<Action> {
        let took = now - self.round.started;
        if self.kind == OperationKind::Recovery && self.stage.is_forward() {
            // No consistent state to go back to: keep every gate shut for the operator.
            match self.stage {
                Stage::Applying(_) => self.durations.switch = Some(took),
                _ => self.durations.pause = Some(now - self.started),
            }
            return self.finish(now);
        }
        match self.stage {
            // Nothing was changed yet: open the gates. (A failed sample records no pause
            // time; a failed pause does.)
            Stage::Sampling { .. } => self.resume(NicChange::Unchanged, now),
            Stage::Pausing { .. } => {
                self.durations.pause = Some(now - self.started);
                self.resume(NicChange::Unchanged, now)
            }
            // The collectives in flight may be aborted: open the gates; each worker that
            // aborted gives its framework's waiting collectives up (the recovery path).
            Stage::Aborting { .. } => {
                self.durations.pause = Some(now - self.started);
                self.resume(NicChange::Unchanged, now)
            }
            // Nothing to roll back onto: the old plane's connections are gone.
            Stage::Applying(_) if self.in_flight => {
                self.durations.switch = Some(took);
                self.resume(NicChange::Unchanged, now)
            }
            Stage::Applying(_) => {
                self.durations.switch = Some(took);
                // A rollback call must meet its peers' rollback calls. Ranks still inside their
                // switch calls (the switch deadline passed) would pair a late call with a
                // peer's rollback call on some group, and a lost rank's groups cannot complete
                // a call at all (HCCL matches a group's calls by order, and each member gives
                // up at its own moment): call HCCL no more, keep every gate shut, and leave the
                // job to a verification and `recover` once every rank has answered.
                if !self.round.pending.is_empty() || !self.lost.is_empty() {
                    return self.finish(now);
                }
                let rolling_back = Stage::RollingBack {
                    tally: Tally::default(),
                    error: None,
                };
                let RollbackTargets { targets, restate } = self.previous.clone();
                let call_timeout = self.deadlines.call_timeout(Phase::Rollback);
                let rollback = DirectiveKind::Rollback {
                    targets,
                    restate,
                    call_timeout,
                };
                self.enter(rolling_back, rollback, now)
            }
            // A rollback that fails leaves groups that may disagree: stay paused.
            Stage::RollingBack { .. } => {
                self.durations.rollback = Some(took);
                self.finish(now)
            }
            // The gates may not all be open: the job is not known to run.
            Stage::Resuming(_) => {
                self.durations.resume = Some(took);
                self.finish(now)
            }
            Stage::Holding { .. } => self.leave_hold(now),
            Stage::Done { .. } => Vec::new(),
        }
    }

    fn resume(&mut self, nic: NicChange, now: Duration) -> Vec<Action> {
        let resuming = Stage::Resuming(Resuming {
            nic,
            refused: BTreeSet::new(),
            stall: None,
        });
        self.enter(resuming, DirectiveKind::Resume, now)
    }

    /// Moves to `stage` and broadcasts its directive to every rank not lost.
    fn enter(&mut self, stage: Stage, kind: DirectiveKind, now: Duration) -> Vec<Action> {
        let phase = stage.phase();
        self.stage = stage;
        self.round = Round {
            token: self.round.token + 1,
            started: now,
            pending: self
                .all_ranks
                .iter()
                .filter(|r| !self.lost.contains_key(r))
                .copied()
                .collect(),
        };
        let directive = Directive { op: self.id, kind };
        let mut actions = vec![Action::Broadcast(directive)];
        if self.round.pending.is_empty() {
            // Every rank is gone: nobody can answer.
            actions.extend(self.finish(now));
            return actions;
        }
        actions.push(Action::ArmDeadline {
            token: self.round.token,
            phase,
            at: now + self.deadlines.for_phase(phase),
        });
        actions
    }

    fn finish(&mut self, now: Duration) -> Vec<Action> {
        let ended_in = self.phase();
        let stage = std::mem::replace(&mut self.stage, Stage::Done { ended_in });
        self.durations.total = now - self.started;
        let (nic, resumed, stall, rollback_error) = match stage {
            // Running again needs every gate known open: an answered resume from every rank
            // not lost, none of them a failure (a refusal is no better than no answer).
            Stage::Resuming(r) => {
                let resumed = self.round.pending.is_empty() && r.refused.is_empty();
                (Some(r.nic), resumed, r.stall, None)
            }
            Stage::RollingBack { error, .. } => (None, false, None, error),
            // Stopped while holding: the groups agree on `nic`, the gates stay shut.
            Stage::Holding { nic } => (Some(nic), false, None, None),
            _ => (None, false, None, None),
        };
        let outcome = match &self.error {
            None if resumed => Outcome::Succeeded,
            Some(OperationError::LinkDown { .. } | OperationError::LinkUnknown { .. })
                if self.pause.held_after.is_none() =>
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
                missing: short_list(&self.round.pending),
            }),
            (None, true) => None,
        };
        let job_state = if !self.lost.is_empty() {
            JobState::NeedsRecovery
        } else if resumed {
            JobState::Running
        } else if ended_in == Phase::Resume {
            JobState::NeedsRecovery
        } else {
            JobState::Paused
        };
        let report = OperationReport {
            journal_error: None,
            hold: None,
            id: self.id,
            direction: self.plan.direction(),
            targets: self.plan.targets.clone(),
            outcome,
            error,
            rollback_error,
            rank_errors: std::mem::take(&mut self.rank_errors.list),
            rolled_back: nic == Some(NicChange::RolledBack),
            applied: nic == Some(NicChange::Applied),
            pause_step: self.pause.held_after,
            sampled_steps: self.pause.sampled,
            phases: self.durations.clone(),
            stall,
            lost_ranks: self.lost.keys().copied().collect(),
            job_state,
            trigger: self.trigger,
        };
        vec![Action::Finish(Box::new(report))]
    }
}

/// What a rollback re-applies: every target with the side it had before, in two rounds.
///
/// Unchanged targets are re-stated too because HCCL keeps a NIC setting per operator
/// (`hal-mock/src/operator.rs`): a member whose switch call failed still has an operator issued
/// since the last switch on its default NIC, while the members whose call succeeded moved that
/// operator's unchanged targets as well; only re-stating them brings every member back to one
/// configuration. An unchanged target whose partner die the switch changed goes in the second
/// round (`restate`): in the first, the two dies of one NPU would be told opposite sides in one
/// call, which HCCL refuses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollbackTargets {
    /// Re-applied first: every target but those of `restate`.
    pub targets: Vec<(GlobalRank, NicSide)>,
    /// Re-applied in a second call per group, after `targets`.
    pub restate: Vec<(GlobalRank, NicSide)>,
}

impl RollbackTargets {
    /// Splits `previous` (every target of `plan` with the side it had) into the two rounds.
    pub(crate) fn new(plan: &SwitchPlan, previous: Vec<(GlobalRank, NicSide)>) -> Self {
        let commanded: BTreeMap<GlobalRank, NicSide> = plan.rank_sides().into_iter().collect();
        let changed: BTreeSet<(&NodeName, crate::ids::DeviceId)> = plan
            .targets
            .iter()
            .filter(|t| {
                previous
                    .iter()
                    .any(|(r, was)| *r == t.rank && *was != t.side())
            })
            .map(|t| (&t.node, t.device))
            .collect();
        let partner_changed = |r: GlobalRank| {
            plan.targets
                .iter()
                .find(|t| t.rank == r)
                .is_some_and(|t| changed.contains(&(&t.node, t.device.partner())))
        };
        let (restate, targets) = previous
            .into_iter()
            .partition(|(r, was)| commanded.get(r) == Some(was) && partner_changed(*r));
        RollbackTargets { targets, restate }
    }
}

/// Whether `body` is an answer to a directive of `phase` (a failure answers any).
fn body_answers(phase: Phase, body: &ReplyBody) -> bool {
    matches!(
        (phase, body),
        (_, ReplyBody::Failed(_))
            | (Phase::Sample, ReplyBody::Sampled { .. })
            | (Phase::Pause, ReplyBody::Paused { .. })
            | (Phase::Abort, ReplyBody::Aborted { .. })
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
        if let Some(e) = &self.journal_error {
            write!(
                f,
                "; NOT JOURNALED, a restarted manager would not know it: {e}"
            )?;
        }
        if let Some(h) = &self.hold {
            write!(f, "; the job does not run: {h}")?;
        }
        Ok(())
    }
}
