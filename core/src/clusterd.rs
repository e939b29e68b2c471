//! ClusterD as the driver of a job's switches: its signals, the three reports the manager owes
//! it, and the [`Sequencer`] that ties them to one
//! [`OperationKind::Sequenced`](crate::operation::OperationKind::Sequenced) operation.
//!
//! In a MindCluster cluster the platform calls ClusterD, which drives the job's manager in three
//! steps (`docs/clusterd.md`):
//!
//! 1. `ProcessManageSignal{stopTrain, [pause_train], uuid U}`: pause every rank at one step
//!    boundary, then `ReportStopComplete` (code 0, or [`CODE_FAILED`]).
//! 2. `SwitchRankList{rankID, op}` on another stream: switch, then `ReplySwitchNicResult`
//!    (`true`, or `false` once the rollback has run).
//! 3. `ProcessManageSignal{changeStrategy, [change_strategy], "continue", uuid U}`: resume, then
//!    `ReportRecoverStatus` (code 0, or [`CODE_FAILED`]).
//!
//! The rules the sequencer keeps, because ClusterD keeps each report in a one-slot buffer that
//! the *next* request reads: exactly one report per request, never one without a request; a
//! duplicate delivery (the same pause uuid, the same rank list within one pause) is not a new
//! request and gets no second report; a switch result is reported only when every group agrees
//! again (after the switch, or after its rollback) or the operation is over. `stop_train` and
//! `killMaster` never release ranks onto groups that may disagree: the operation stops at a
//! hold point with every gate shut, and then ClusterD's decision is carried out: training
//! stops ([`Step::stop_training`]), every rank's process exits for its launcher to restart it.
//!
//! Every request comes with its [`Origin`]: the client's signal-stream session it arrived in
//! and the `jobId` ClusterD named. A request for another job is refused, answered to that job
//! (ClusterD files a report under the job it names: an answer under this job's id would sit in
//! this job's one-slot buffer). Every report is addressed ([`Outgoing`]) to the session whose
//! request it answers: ClusterD resets the job's flow whenever that signal stream ends, so the
//! client sends it only while that stream is open and drops it after. The end of a session
//! ends the flow it drove ([`Sequencer::on_session_end`]): nobody will `continue` it.
//!
//! Pure like the rest of `core`: it takes signals, the ledger and the time, and returns the
//! ledger's actions to carry out, the reports to send and notes to log.

use crate::command::{decimal_id, RankTarget, SwitchPlan};
use crate::ids::{GlobalRank, OperationId};
use crate::ledger::{JobLedger, JobState, SequenceError, SubmitError};
use crate::operation::{Action, CommandError, HoldPoint, OperationReport};
use crate::rank_table::RankTable;
use crate::summary::OperationSummary;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// ClusterD's names and numbers

/// `ProcessManageSignal.signalType` of the keep-alive ClusterD sends every 5 s.
pub const KEEP_ALIVE: &str = "keep-alive";
/// `signalType` of a pause or stop (the action says which).
pub const STOP_TRAIN_SIGNAL: &str = "stopTrain";
/// `signalType` of a strategy change (`continue` resumes).
pub const CHANGE_STRATEGY_SIGNAL: &str = "changeStrategy";
/// `signalType` telling the job it is about to be restarted.
pub const KILL_MASTER_SIGNAL: &str = "killMaster";
/// The action of a pause: hold training at a step boundary until told to continue.
pub const PAUSE_TRAIN_ACTION: &str = "pause_train";
/// The action of a stop: stop training (ClusterD's recovery follows).
pub const STOP_TRAIN_ACTION: &str = "stop_train";
/// The action of a strategy change.
pub const CHANGE_STRATEGY_ACTION: &str = "change_strategy";
/// The strategy that resumes training after a pause.
pub const CONTINUE_STRATEGY: &str = "continue";
/// `ClientInfo.role` the manager registers with (ClusterD only logs it).
pub const ROLE: &str = "taskd";
/// A report's `Status.code` for success.
pub const CODE_OK: i32 = 0;
/// A report's `Status.code` for "pause failed" / "resume failed" (ClusterD's
/// `UnRecoverTrainError`: it then stops and restarts the job).
pub const CODE_FAILED: i32 = 499;
/// ClusterD's gRPC port (`clusterd-grpc-svc`).
pub const DEFAULT_PORT: u16 = 8899;
/// How long a pause ClusterD started waits for ClusterD's next signal: ClusterD's own wait for
/// each report. (Not the manager's hold bound, `ledger::DEFAULT_HOLD_BOUND`: that one stops
/// training of a job left held; this one ends a pause ClusterD went quiet on.)
pub const DEFAULT_SIGNAL_WAIT: Duration = Duration::from_secs(15 * 60);

// ---------------------------------------------------------------------------------------------
// Where requests come from and reports go

/// Where a request came from: the client's signal-stream session (one per
/// `SubscribeProcessManageSignal`; the switch stream of a session belongs to it) and the job
/// the message names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The session, numbered by the client.
    pub session: u64,
    /// The message's `jobId`. ClusterD fills it with the job's id; empty is taken as this job.
    pub job: String,
}

impl Origin {
    /// A request of this job in `session`.
    pub fn new(session: u64, job: impl Into<String>) -> Origin {
        Origin {
            session,
            job: job.into(),
        }
    }
}

/// A report with its address: the session whose request it answers (the client sends it
/// only while that session's signal stream is open) and the `jobId` it is filed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The session that asked.
    pub session: u64,
    /// The job it answers for: this job, or the other job a refused request named.
    pub job: String,
    /// The report.
    pub report: Report,
}

// ---------------------------------------------------------------------------------------------
// Signals

/// One `ProcessManageSignal`, as the manager acts on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// ClusterD is alive; nothing to do.
    KeepAlive,
    /// Pause every rank (`stopTrain` + `pause_train`).
    Pause {
        /// ClusterD's id of the flow; `continue` names it again.
        uuid: String,
    },
    /// Stop training (`stopTrain` + `stop_train`).
    StopTrain {
        /// ClusterD's id of the flow.
        uuid: String,
    },
    /// The job is about to be restarted (`killMaster`).
    KillMaster {
        /// ClusterD's id of the flow.
        uuid: String,
    },
    /// Resume after a pause (`changeStrategy` + `change_strategy` + `continue`).
    Continue {
        /// The pause's uuid.
        uuid: String,
    },
    /// Anything else (other strategies, other flows): logged, not answered.
    Other {
        /// What it was, for the log.
        detail: String,
    },
}

impl Signal {
    /// Reads a `ProcessManageSignal`'s fields.
    pub fn parse(signal_type: &str, actions: &[String], strategy: &str, uuid: &str) -> Signal {
        let has = |a: &str| actions.iter().any(|x| x == a);
        let uuid = uuid.to_owned();
        match signal_type {
            KEEP_ALIVE => Signal::KeepAlive,
            KILL_MASTER_SIGNAL => Signal::KillMaster { uuid },
            STOP_TRAIN_SIGNAL if has(PAUSE_TRAIN_ACTION) => Signal::Pause { uuid },
            STOP_TRAIN_SIGNAL if has(STOP_TRAIN_ACTION) => Signal::StopTrain { uuid },
            CHANGE_STRATEGY_SIGNAL if has(CHANGE_STRATEGY_ACTION) && strategy == CONTINUE_STRATEGY => {
                Signal::Continue { uuid }
            }
            _ => Signal::Other {
                detail: format!(
                    "signalType {signal_type:?}, actions {actions:?}, changeStrategy {strategy:?}, uuid {uuid:?}"
                ),
            },
        }
    }

    /// Its name in logs and the `type` label of `taskd_clusterd_signals_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Signal::KeepAlive => "keep_alive",
            Signal::Pause { .. } => "pause_train",
            Signal::StopTrain { .. } => "stop_train",
            Signal::KillMaster { .. } => "kill_master",
            Signal::Continue { .. } => "continue",
            Signal::Other { .. } => "other",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The switch's targets

/// Why a `SwitchRankList` cannot be switched. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RankListError {
    /// No rank at all.
    #[error("the rank list is empty")]
    Empty,
    /// `rankID` and `op` differ in length.
    #[error("{ranks} rank ids but {ops} ops: ClusterD sends one op per rank")]
    LengthMismatch {
        /// `rankID`'s length.
        ranks: usize,
        /// `op`'s length.
        ops: usize,
    },
    /// A rank id that is not a number as ClusterD writes one ([`crate::command::decimal_id`]).
    #[error("rank id {0:?} is not a global rank number (decimal digits only, no spaces or signs)")]
    NotANumber(String),
    /// A rank the rank table does not have.
    #[error("rank {rank} is not in the job's rank table (ranks 0..{world})")]
    UnknownRank {
        /// The rank.
        rank: GlobalRank,
        /// The job's world size.
        world: usize,
    },
    /// The same rank twice.
    #[error("rank {0} is listed twice")]
    Duplicate(GlobalRank),
}

/// The targets of a `SwitchRankList` (global rank ids, `op[i]` true: to the backup NIC),
/// resolved against the job's rank table.
pub fn plan_rank_list(
    table: &RankTable,
    ranks: &[String],
    ops: &[bool],
) -> Result<SwitchPlan, RankListError> {
    if ranks.len() != ops.len() {
        return Err(RankListError::LengthMismatch {
            ranks: ranks.len(),
            ops: ops.len(),
        });
    }
    if ranks.is_empty() {
        return Err(RankListError::Empty);
    }
    let mut seen = BTreeSet::new();
    let mut targets = Vec::with_capacity(ranks.len());
    for (id, &use_backup) in ranks.iter().zip(ops) {
        let rank = decimal_id(id)
            .map(GlobalRank)
            .ok_or_else(|| RankListError::NotANumber(id.clone()))?;
        let slot = table.slot(rank).ok_or(RankListError::UnknownRank {
            rank,
            world: table.world_size(),
        })?;
        if !seen.insert(rank) {
            return Err(RankListError::Duplicate(rank));
        }
        targets.push(RankTarget {
            node: slot.node.clone(),
            device: slot.device,
            rank,
            use_backup,
        });
    }
    Ok(SwitchPlan { targets })
}

// ---------------------------------------------------------------------------------------------
// Reports

/// One report to ClusterD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// `ReportStopComplete{status{code, info}}`: the answer to a pause or a stop.
    StopComplete {
        /// [`CODE_OK`] or [`CODE_FAILED`].
        code: i32,
        /// What happened, for ClusterD's log.
        info: String,
    },
    /// `ReplySwitchNicResult{result}`: the answer to a `SwitchRankList`.
    SwitchResult {
        /// Whether the new NIC state is in effect.
        ok: bool,
    },
    /// `ReportRecoverStatus{status{code, info}, strategy: "continue"}`: the answer to a
    /// `continue`.
    RecoverStatus {
        /// [`CODE_OK`] or [`CODE_FAILED`].
        code: i32,
        /// What happened, for ClusterD's log.
        info: String,
    },
}

impl Report {
    /// Its name in logs and the `report` label of `taskd_clusterd_reports_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Report::StopComplete { .. } => "stop_complete",
            Report::SwitchResult { .. } => "switch_result",
            Report::RecoverStatus { .. } => "recover_status",
        }
    }

    /// Whether it reports success.
    pub fn ok(&self) -> bool {
        match self {
            Report::StopComplete { code, .. } | Report::RecoverStatus { code, .. } => {
                *code == CODE_OK
            }
            Report::SwitchResult { ok } => *ok,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The sequencer

/// How loud a [`Note`] is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Level {
    /// The normal course.
    Info,
    /// Not the normal course, handled.
    Warn,
    /// A refusal or a request that cannot be honoured.
    Error,
}

/// Something for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// How loud.
    pub level: Level,
    /// What happened.
    pub text: String,
}

/// What one input led to: the ledger's actions to carry out (their holds and results come
/// back through [`Sequencer::on_actions`]), the reports to send in order, notes to log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// The ledger's actions.
    pub actions: Vec<Action>,
    /// Reports to ClusterD, in order, each with its address.
    pub reports: Vec<Outgoing>,
    /// For the log.
    pub notes: Vec<Note>,
    /// ClusterD stopped training, for this reason (one line): once the actions are carried
    /// out, stop training on every rank ([`JobLedger::stop_training`] with
    /// [`StopBy::Clusterd`](crate::ledger::StopBy::Clusterd)). Only asked when nothing is in
    /// flight and no stop is under way, so the ledger accepts it.
    pub stop_training: Option<String>,
}

impl Step {
    fn note(&mut self, level: Level, text: impl Into<String>) {
        self.notes.push(Note {
            level,
            text: text.into(),
        });
    }

    fn report(&mut self, to: &Origin, report: Report) {
        self.reports.push(Outgoing {
            session: to.session,
            job: to.job.clone(),
            report,
        });
    }
}

/// What handling one signal works with: where it came from (with the job resolved: never
/// empty), the ledger, an unused operation id, the time, and the step being decided.
struct Cx<'a> {
    from: Origin,
    ledger: &'a mut JobLedger,
    fresh: OperationId,
    now: Duration,
    step: Step,
    /// The manager's verdict on starting an operation (see [`Sequencer::on_signal`]).
    admit: Result<(), SubmitError>,
}

/// A report owed to ClusterD, in the order of the requests.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Owed {
    StopComplete,
    SwitchResult,
    RecoverStatus,
}

/// `(rankID, op)` of a `SwitchRankList`.
type RankList = (Vec<String>, Vec<bool>);

/// The sequenced operation ClusterD drives, and its requests so far.
#[derive(Clone, Debug)]
struct Driven {
    uuid: String,
    /// The pause's origin: the reports of the operation go there.
    from: Origin,
    op: OperationId,
    switch: Option<RankList>,
    continued: bool,
    /// The `stop_train` uuids it was told (a stop delivered again is not a new request).
    stops: BTreeSet<String>,
    /// It was told `killMaster`: it ends held.
    killed: bool,
    /// Why ClusterD stopped training (its `stop_train` or `killMaster`): once the operation
    /// is over, training stops.
    stop_reason: Option<String>,
}

/// The ClusterD side of the manager: which sequenced operation ClusterD drives and which
/// reports it is owed.
#[derive(Clone, Debug)]
pub struct Sequencer {
    /// How long a pause it started waits for ClusterD's next signal.
    signal_wait: Duration,
    current: Option<Driven>,
    owed: Vec<Owed>,
    /// The last operation ClusterD drove, once over (a late duplicate or `continue` names it).
    last: Option<Driven>,
    /// A `stop_train` that came while the gates were opening: it pauses again once they are.
    stop_after: Option<(String, Origin)>,
    /// A `killMaster` that came while an operator's operation ran: training stops once it
    /// has ended (the reason).
    kill_after: Option<String>,
    /// Signals answered at once (refused, or nothing to do), newest last: delivered again,
    /// they are not answered twice.
    answered: VecDeque<(&'static str, String)>,
    /// The last rank list answered with no pause in effect (one delivered again is not a new
    /// request: only a new pause comes before a new switch).
    orphan_list: Option<RankList>,
}

/// How many signals answered at once the sequencer remembers.
const ANSWERED: usize = 64;

impl Sequencer {
    /// A sequencer whose pauses wait at most `signal_wait` for ClusterD's next signal.
    pub fn new(signal_wait: Duration) -> Sequencer {
        Sequencer {
            signal_wait,
            current: None,
            owed: Vec::new(),
            last: None,
            stop_after: None,
            kill_after: None,
            answered: VecDeque::new(),
            orphan_list: None,
        }
    }

    /// The pause uuid and operation ClusterD drives now.
    pub fn current(&self) -> Option<(&str, OperationId)> {
        self.current.as_ref().map(|d| (d.uuid.as_str(), d.op))
    }

    /// How many reports are owed.
    pub fn owed(&self) -> usize {
        self.owed.len()
    }

    /// A `ProcessManageSignal` from `from`. `fresh` is an unused operation id, taken if an
    /// operation starts. `admit` is the manager's own verdict on starting one, on what the
    /// ledger cannot see (its journal: [`SubmitError::JournalFailing`]); a pause it refuses is
    /// answered as failed, as a pause the ledger refuses is.
    pub fn on_signal(
        &mut self,
        signal: &Signal,
        from: &Origin,
        ledger: &mut JobLedger,
        fresh: OperationId,
        now: Duration,
        admit: Result<(), SubmitError>,
    ) -> Step {
        let mut step = Step::default();
        let key = match signal {
            Signal::Pause { uuid } | Signal::StopTrain { uuid } | Signal::Continue { uuid } => {
                Some((signal.kind(), uuid.clone()))
            }
            _ => None,
        };
        if let Some(key) = key.as_ref().filter(|k| self.answered.contains(k)) {
            step.note(
                Level::Warn,
                format!("{} {} delivered again: answered already", key.0, key.1),
            );
            return step;
        }
        let mut cx = Cx {
            from: resolve(from, ledger),
            ledger,
            fresh,
            now,
            step,
            admit,
        };
        if cx.from.job != cx.ledger.job().0 {
            refuse_foreign(signal, &mut cx);
        } else {
            self.dispatch(signal, &mut cx);
        }
        let step = cx.step;
        if let Some(key) = key.filter(|_| !step.reports.is_empty()) {
            if self.answered.len() == ANSWERED {
                self.answered.pop_front();
            }
            self.answered.push_back(key);
        }
        step
    }

    fn dispatch(&mut self, signal: &Signal, cx: &mut Cx<'_>) {
        match signal {
            Signal::KeepAlive => {}
            Signal::Pause { uuid } => self.pause(uuid, cx),
            Signal::StopTrain { uuid } => self.stop(uuid, cx),
            Signal::KillMaster { uuid } => self.kill(uuid, cx),
            Signal::Continue { uuid } => self.resume(uuid, cx),
            Signal::Other { detail } => cx.step.note(
                Level::Warn,
                format!("ClusterD signal not acted on (taskd switches NICs only): {detail}"),
            ),
        }
    }

    /// The client's signal-stream session `session` ended. ClusterD resets the job's flow
    /// whenever that stream ends, so nobody will read the reports owed to it or `continue` the
    /// operation it drove: the reports are dropped, and an operation not yet told to
    /// continue, stop or `killMaster` ends as a hold expiry ends it (it resumes on the NIC
    /// state every group agrees on, or stays held where that is not safe); the next pause is
    /// then a new flow.
    pub fn on_session_end(&mut self, session: u64, ledger: &mut JobLedger, now: Duration) -> Step {
        let mut step = Step::default();
        if let Some((uuid, _)) = self.stop_after.take_if(|(_, from)| from.session == session) {
            step.note(
                Level::Warn,
                format!("stop_train {uuid}: its session ended before the gates opened; not paused again"),
            );
        }
        let Some(cur) = self.current.as_ref().filter(|c| c.from.session == session) else {
            return step;
        };
        let uuid = cur.uuid.clone();
        for owed in self.owed.drain(..) {
            step.note(
                Level::Warn,
                format!("pause {uuid}: the {owed:?} report is dropped: ClusterD's flow ended with the session that asked for it"),
            );
        }
        if cur.continued || cur.killed || !cur.stops.is_empty() {
            step.note(
                Level::Info,
                format!(
                    "pause {uuid}: ClusterD's session ended; the operation ends as it was told"
                ),
            );
            return step;
        }
        let reason = format!(
            "ClusterD ended the flow of pause {uuid} (its signal stream closed) before continue"
        );
        step.note(
            Level::Warn,
            format!("{reason}: the operation resumes on the NIC state every group agrees on"),
        );
        step.actions = ledger.abort(reason, now);
        step
    }

    fn pause(&mut self, uuid: &str, cx: &mut Cx<'_>) {
        if let Some(cur) = &self.current {
            if cur.uuid == uuid {
                cx.step.note(
                    Level::Warn,
                    format!("pause {uuid} delivered again: already in effect, not answered twice"),
                );
            } else {
                let info = format!(
                    "pause {uuid} refused: pause {} (operation {}) is in effect",
                    cur.uuid, cur.op
                );
                stop_failed(info, cx);
            }
            return;
        }
        if self.last.as_ref().is_some_and(|l| l.uuid == uuid) {
            cx.step.note(
                Level::Warn,
                format!("pause {uuid} delivered again after its operation ended: not a new pause"),
            );
            return;
        }
        let started = cx.admit.clone().and_then(|()| {
            cx.ledger
                .start_sequenced(cx.fresh, self.signal_wait, None, cx.now)
        });
        match started {
            Ok(actions) => {
                cx.step.note(
                    Level::Info,
                    format!("pause {uuid}: operation {} pauses every rank", cx.fresh),
                );
                self.drive(uuid, cx.from.clone(), cx.fresh, Owed::StopComplete);
                cx.step.actions = actions;
            }
            Err(e) => stop_failed(format!("pause {uuid} refused: {e}"), cx),
        }
    }

    fn drive(&mut self, uuid: &str, from: Origin, op: OperationId, owed: Owed) {
        self.orphan_list = None;
        self.current = Some(Driven {
            uuid: uuid.to_owned(),
            from,
            op,
            switch: None,
            continued: false,
            stops: BTreeSet::new(),
            killed: false,
            stop_reason: None,
        });
        self.owed.push(owed);
    }

    fn stop(&mut self, uuid: &str, cx: &mut Cx<'_>) {
        let reason = format!("ClusterD stop_train {uuid}");
        let told = |d: &Option<Driven>| d.as_ref().is_some_and(|d| d.stops.contains(uuid));
        if told(&self.current) || (self.current.is_none() && told(&self.last)) {
            cx.step.note(
                Level::Warn,
                format!("stop_train {uuid} delivered again: not answered twice"),
            );
            return;
        }
        if let Some(cur) = self.current.as_mut() {
            match cx.ledger.stop_sequenced(reason.clone(), cx.now) {
                Ok(actions) => {
                    cur.stops.insert(uuid.to_owned());
                    cur.stop_reason.get_or_insert(reason);
                    cx.step.note(
                        Level::Warn,
                        format!("stop_train {uuid}: training stays held at the next hold point"),
                    );
                    self.owed.push(Owed::StopComplete);
                    cx.step.actions = actions;
                }
                Err(SequenceError::Command(CommandError::Resuming(_))) => {
                    cx.step.note(
                        Level::Warn,
                        format!("stop_train {uuid} came while resuming: pausing again after"),
                    );
                    self.stop_after = Some((uuid.to_owned(), cx.from.clone()));
                }
                Err(e) => refuse_stop(uuid, &e.to_string(), cx),
            }
            return;
        }
        match cx.ledger.state() {
            // Not running, nothing in flight: no pause to hold the ranks first; they are held
            // (a failed rollback) or waiting at their gates, and a stop reaches them there.
            state if state != JobState::Running && cx.ledger.in_flight().is_none() => {
                let info = match cx.ledger.training_stop() {
                    Some(s) => format!("stop_train {uuid}: {s}"),
                    None => {
                        cx.step.stop_training = Some(reason);
                        format!("stop_train {uuid}: the job was {state}; training stops on every rank (the launcher restarts the processes)")
                    }
                };
                cx.step.note(Level::Warn, info.clone());
                cx.step.report(
                    &cx.from,
                    Report::StopComplete {
                        code: CODE_OK,
                        info,
                    },
                );
            }
            _ => match cx.ledger.start_sequenced(
                cx.fresh,
                self.signal_wait,
                Some(reason.clone()),
                cx.now,
            ) {
                Ok(actions) => {
                    cx.step.note(
                        Level::Warn,
                        format!(
                            "stop_train {uuid}: operation {} pauses every rank and keeps them held",
                            cx.fresh
                        ),
                    );
                    self.drive(uuid, cx.from.clone(), cx.fresh, Owed::StopComplete);
                    if let Some(cur) = self.current.as_mut() {
                        cur.stops.insert(uuid.to_owned());
                        cur.stop_reason = Some(reason);
                    }
                    cx.step.actions = actions;
                }
                Err(e) => refuse_stop(uuid, &e.to_string(), cx),
            },
        }
    }

    fn kill(&mut self, uuid: &str, cx: &mut Cx<'_>) {
        self.stop_after = None;
        for owed in self.owed.drain(..) {
            cx.step.note(
                Level::Warn,
                format!("killMaster {uuid}: the {owed:?} report is no longer awaited; not sent"),
            );
        }
        let reason = format!("ClusterD killMaster {uuid}: the job restarts");
        let Some(cur) = self.current.as_mut() else {
            let why = if let Some(s) = cx.ledger.training_stop() {
                format!("nothing more to stop ({s})")
            } else if let Some(op) = cx.ledger.in_flight() {
                let why = format!(
                    "operation {} runs; training stops once it has ended, not under it",
                    op.id()
                );
                self.kill_after = Some(reason);
                why
            } else {
                cx.step.stop_training = Some(reason);
                "training stops on every rank".to_owned()
            };
            cx.step.note(
                Level::Warn,
                format!("killMaster {uuid}: ClusterD restarts the job; {why}"),
            );
            return;
        };
        // Whatever the stop below answers, the operation ends (held, or by itself) and then
        // training stops: ClusterD restarts the job either way.
        cur.stop_reason.get_or_insert(reason.clone());
        match cx.ledger.stop_sequenced(reason, cx.now) {
            Ok(actions) => {
                if let Some(cur) = self.current.as_mut() {
                    cur.killed = true;
                }
                cx.step.note(
                    Level::Warn,
                    format!("killMaster {uuid}: every rank stays held until the job restarts"),
                );
                cx.step.actions = actions;
            }
            Err(e) => cx.step.note(
                Level::Warn,
                format!("killMaster {uuid}: the operation cannot stop ({e}); it ends by itself"),
            ),
        }
    }

    fn resume(&mut self, uuid: &str, cx: &mut Cx<'_>) {
        let current = self.current.as_mut();
        match current {
            Some(cur) if cur.uuid == uuid => {
                if cur.continued {
                    cx.step.note(
                        Level::Warn,
                        format!("continue {uuid} delivered again: not answered twice"),
                    );
                    return;
                }
                cur.continued = true;
                match cx.ledger.resume_sequenced(cx.now) {
                    Ok(actions) => {
                        cx.step
                            .note(Level::Info, format!("continue {uuid}: resuming"));
                        self.owed.push(Owed::RecoverStatus);
                        cx.step.actions = actions;
                    }
                    Err(e) => refuse_continue(uuid, &e.to_string(), cx),
                }
            }
            Some(cur) => {
                let why = format!("pause {} (operation {}) holds training", cur.uuid, cur.op);
                refuse_continue(uuid, &why, cx);
            }
            None if self
                .last
                .as_ref()
                .is_some_and(|l| l.uuid == uuid && l.continued) =>
            {
                cx.step.note(
                    Level::Warn,
                    format!("continue {uuid} delivered again: not answered twice"),
                );
            }
            None => {
                if let Some(last) = self.last.as_mut().filter(|l| l.uuid == uuid) {
                    last.continued = true;
                }
                let (code, info) = if cx.ledger.state() == JobState::Running {
                    (CODE_OK, format!("continue {uuid}: training runs"))
                } else {
                    let state = cx.ledger.state();
                    (CODE_FAILED, format!("continue {uuid}: the job is {state}"))
                };
                let late = self.last.as_ref().is_some_and(|l| l.uuid == uuid);
                let level = if late { Level::Warn } else { Level::Error };
                cx.step
                    .note(level, format!("{info} (no pause of that uuid in effect)"));
                cx.step
                    .report(&cx.from, Report::RecoverStatus { code, info });
            }
        }
    }

    /// A `SwitchRankList` from `from`.
    pub fn on_switch(
        &mut self,
        ranks: &[String],
        ops: &[bool],
        from: &Origin,
        ledger: &mut JobLedger,
        now: Duration,
    ) -> Step {
        let mut step = Step::default();
        let from = resolve(from, ledger);
        if from.job != ledger.job().0 {
            step.note(
                Level::Error,
                format!(
                    "SwitchRankList {ranks:?} names job {:?}, but this manager runs job {:?}: refused, nothing changed; result false",
                    from.job,
                    ledger.job().0
                ),
            );
            step.report(&from, Report::SwitchResult { ok: false });
            return step;
        }
        let list = (ranks.to_vec(), ops.to_vec());
        let Some(cur) = self.current.as_mut() else {
            let known = self.last.as_ref().and_then(|l| l.switch.as_ref()) == Some(&list)
                || self.orphan_list.as_ref() == Some(&list);
            if known {
                step.note(
                    Level::Warn,
                    "SwitchRankList delivered again after its operation ended: not a new switch, not answered",
                );
            } else {
                step.note(
                    Level::Error,
                    format!("SwitchRankList {ranks:?} refused: no pause is in effect (switches need ClusterD's pause first); result false"),
                );
                step.report(&from, Report::SwitchResult { ok: false });
                self.orphan_list = Some(list);
            }
            return step;
        };
        if let Some(first) = &cur.switch {
            let (level, text) = if *first == list {
                (Level::Warn, "delivered again: already switched in this pause, not switched or answered twice")
            } else {
                (Level::Error, "ignored: ClusterD sends one switch per pause and has its answer; a second answer would be read by its next switch")
            };
            step.note(level, format!("SwitchRankList {ranks:?} {text}"));
            return step;
        }
        cur.switch = Some(list);
        let result = plan_rank_list(ledger.table(), ranks, ops)
            .map_err(|e| e.to_string())
            .and_then(|plan| {
                ledger
                    .switch_sequenced(plan, now)
                    .map_err(|e| e.to_string())
            });
        match result {
            Ok(actions) => {
                step.note(
                    Level::Info,
                    format!("SwitchRankList {ranks:?} {ops:?}: switching"),
                );
                self.owed.push(Owed::SwitchResult);
                step.actions = actions;
            }
            Err(e) => {
                step.note(
                    Level::Error,
                    format!("SwitchRankList {ranks:?} {ops:?} refused, nothing changed: {e}; result false"),
                );
                step.report(&from, Report::SwitchResult { ok: false });
            }
        }
        step
    }

    /// Actions the ledger produced (from any input): a hold or the end of the driven
    /// operation settles the reports owed. `fresh` is an unused id for a pause that a
    /// `stop_train` left owed.
    pub fn on_actions(
        &mut self,
        actions: &[Action],
        ledger: &mut JobLedger,
        fresh: OperationId,
        now: Duration,
    ) -> Step {
        let mut step = Step::default();
        for a in actions {
            match a {
                Action::Held(at) => self.held(*at, &mut step),
                Action::Finish(r) if self.current.as_ref().is_some_and(|c| c.op == r.id) => {
                    self.finished(r, &mut step)
                }
                _ => {}
            }
        }
        if let Some((uuid, from)) = self.stop_after.take_if(|_| self.current.is_none()) {
            let stop = Signal::StopTrain { uuid };
            let mut again = self.on_signal(&stop, &from, ledger, fresh, now, Ok(()));
            step.actions.append(&mut again.actions);
            step.reports.append(&mut again.reports);
            step.notes.append(&mut again.notes);
            step.stop_training = step.stop_training.or(again.stop_training);
        }
        let free = ledger.in_flight().is_none() && self.current.is_none();
        if let Some(reason) = self.kill_after.take_if(|_| free) {
            if ledger.training_stop().is_none() && step.stop_training.is_none() {
                step.note(
                    Level::Warn,
                    format!(
                        "{reason}: the operation it waited for ended; training stops on every rank"
                    ),
                );
                step.stop_training = Some(reason);
            }
        }
        step
    }

    /// Only the sequencer starts sequenced operations, and one runs at a time: a hold is the
    /// driven operation's.
    fn held(&mut self, at: HoldPoint, step: &mut Step) {
        let Some(to) = self.current.as_ref().map(|c| c.from.clone()) else {
            return;
        };
        let (owed, report) = match at {
            HoldPoint::Paused { step: s } => (
                Owed::StopComplete,
                Report::StopComplete {
                    code: CODE_OK,
                    info: format!("every rank holds after step {s}"),
                },
            ),
            HoldPoint::Switched { applied } => {
                (Owed::SwitchResult, Report::SwitchResult { ok: applied })
            }
        };
        if let Some(i) = self.owed.iter().position(|o| *o == owed) {
            self.owed.remove(i);
            step.report(&to, report);
        }
    }

    fn finished(&mut self, r: &OperationReport, step: &mut Step) {
        let summary = OperationSummary::from(r).to_string();
        let to = self
            .current
            .as_ref()
            .map(|c| c.from.clone())
            .unwrap_or_default();
        for owed in std::mem::take(&mut self.owed) {
            let report = match owed {
                Owed::StopComplete => {
                    let held = r.pause_step.is_some() && r.job_state == JobState::Paused;
                    Report::StopComplete {
                        code: if held { CODE_OK } else { CODE_FAILED },
                        info: summary.clone(),
                    }
                }
                Owed::SwitchResult => Report::SwitchResult { ok: r.applied },
                Owed::RecoverStatus => Report::RecoverStatus {
                    code: if r.job_state == JobState::Running {
                        CODE_OK
                    } else {
                        CODE_FAILED
                    },
                    info: summary.clone(),
                },
            };
            step.report(&to, report);
        }
        let level = if r.job_state == JobState::Running {
            Level::Info
        } else {
            Level::Error
        };
        step.note(level, format!("ClusterD's operation ended: {summary}"));
        // ClusterD's stop_train or killMaster ended the operation first, as they always have
        // (at a hold point, every gate shut, no NIC call), and only now, with nothing in
        // flight, does training stop. The ledger's refusal of a stop while an operation runs stays as it is: the
        // held operation's end settles its reports, history and NIC table as any other, and
        // a switch or rollback still calling the NICs finishes first instead of being cut.
        if let Some(reason) = self.current.as_mut().and_then(|c| c.stop_reason.take()) {
            step.note(
                Level::Warn,
                format!(
                    "{reason}: training stops on every rank (the launcher restarts the processes)"
                ),
            );
            step.stop_training = Some(reason);
        }
        self.last = self.current.take();
    }
}

fn refuse_stop(uuid: &str, why: &str, cx: &mut Cx<'_>) {
    stop_failed(
        format!("stop_train {uuid}: training could not be stopped: {why}"),
        cx,
    );
}

/// Logs `info` and answers the pause or stop with 499.
fn stop_failed(info: String, cx: &mut Cx<'_>) {
    cx.step.note(Level::Error, info.clone());
    cx.step.report(
        &cx.from,
        Report::StopComplete {
            code: CODE_FAILED,
            info,
        },
    );
}

fn refuse_continue(uuid: &str, why: &str, cx: &mut Cx<'_>) {
    let info = format!("continue {uuid} refused: {why}");
    cx.step.note(Level::Error, info.clone());
    cx.step.report(
        &cx.from,
        Report::RecoverStatus {
            code: CODE_FAILED,
            info,
        },
    );
}

/// `from` with its job resolved: an empty `jobId` is this job's.
fn resolve(from: &Origin, ledger: &JobLedger) -> Origin {
    let job = if from.job.is_empty() {
        ledger.job().0.clone()
    } else {
        from.job.clone()
    };
    Origin::new(from.session, job)
}

/// A signal that names another job: nothing is done; a request is answered as failed, under
/// the job it named (the job whose flow asked, if any), so nothing lands in this job's slots.
fn refuse_foreign(signal: &Signal, cx: &mut Cx<'_>) {
    let why = format!(
        "ClusterD's {} names job {:?}, but this manager runs job {:?}: refused, nothing done",
        signal.kind(),
        cx.from.job,
        cx.ledger.job().0
    );
    cx.step.note(Level::Error, why.clone());
    let report = match signal {
        Signal::Pause { .. } | Signal::StopTrain { .. } => Report::StopComplete {
            code: CODE_FAILED,
            info: why,
        },
        Signal::Continue { .. } => Report::RecoverStatus {
            code: CODE_FAILED,
            info: why,
        },
        Signal::KeepAlive | Signal::KillMaster { .. } | Signal::Other { .. } => return,
    };
    cx.step.report(&cx.from, report);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn signals_read_as_clusterd_sends_them() {
        let p = |t: &str, a: &[&str], s: &str| Signal::parse(t, &strings(a), s, "U");
        assert_eq!(p("keep-alive", &[], ""), Signal::KeepAlive);
        assert_eq!(
            p("stopTrain", &["pause_train"], ""),
            Signal::Pause { uuid: "U".into() }
        );
        assert_eq!(
            p("stopTrain", &["stop_train"], ""),
            Signal::StopTrain { uuid: "U".into() }
        );
        assert_eq!(
            p("changeStrategy", &["change_strategy"], "continue"),
            Signal::Continue { uuid: "U".into() }
        );
        assert_eq!(
            p("killMaster", &[], ""),
            Signal::KillMaster { uuid: "U".into() }
        );
        // Other strategies and flows are not ours; the casing is ClusterD's exactly.
        for (t, a, s) in [
            ("changeStrategy", &["change_strategy"][..], "retry"),
            ("changeStrategy", &[][..], "continue"),
            ("stoptrain", &["pause_train"][..], ""),
            ("hotSwitch", &["pause_train"][..], ""),
        ] {
            assert!(matches!(p(t, a, s), Signal::Other { .. }), "{t} {a:?} {s}");
        }
        assert_eq!(p("keep-alive", &[], "").kind(), "keep_alive");
        assert_eq!(p("stopTrain", &["pause_train"], "").kind(), "pause_train");
    }

    #[test]
    fn rank_lists_resolve_against_the_table() {
        let t = RankTable::uniform(2, 8);
        let plan = plan_rank_list(&t, &strings(&["0", "8", "15"]), &[true, true, false]).unwrap();
        let got: Vec<_> = plan
            .targets
            .iter()
            .map(|x| (x.node.0.as_str(), x.device.0, x.rank.0, x.use_backup))
            .collect();
        assert_eq!(
            got,
            vec![
                ("node-0", 0, 0, true),
                ("node-1", 0, 8, true),
                ("node-1", 7, 15, false)
            ]
        );
        let e = |r: &[&str], o: &[bool]| plan_rank_list(&t, &strings(r), o).unwrap_err();
        assert_eq!(e(&[], &[]), RankListError::Empty);
        assert_eq!(
            e(&["1"], &[true, false]),
            RankListError::LengthMismatch { ranks: 1, ops: 2 }
        );
        assert_eq!(e(&["-1"], &[true]), RankListError::NotANumber("-1".into()));
        // ClusterD writes ranks as plain decimals: anything else names no rank.
        for bad in [" 2", "2 ", "+2", "02", "", "２"] {
            assert_eq!(
                e(&[bad], &[true]),
                RankListError::NotANumber(bad.into()),
                "{bad:?}"
            );
        }
        assert!(e(&[" 2"], &[true])
            .to_string()
            .contains("\" 2\" is not a global rank number (decimal digits only"));
        assert_eq!(
            e(&["16"], &[true]),
            RankListError::UnknownRank {
                rank: GlobalRank(16),
                world: 16
            }
        );
        assert_eq!(
            e(&["3", "3"], &[true, true]),
            RankListError::Duplicate(GlobalRank(3))
        );
        assert_eq!(
            e(&["16"], &[true]).to_string(),
            "rank 16 is not in the job's rank table (ranks 0..16)"
        );
    }

    #[test]
    fn a_report_knows_its_kind_and_result() {
        let r = Report::StopComplete {
            code: CODE_FAILED,
            info: String::new(),
        };
        assert_eq!((r.kind(), r.ok()), ("stop_complete", false));
        let r = Report::SwitchResult { ok: true };
        assert_eq!((r.kind(), r.ok()), ("switch_result", true));
        let r = Report::RecoverStatus {
            code: CODE_OK,
            info: String::new(),
        };
        assert_eq!((r.kind(), r.ok()), ("recover_status", true));
    }
}
