//! The manager's book of one job: who registered, which ranks use their backup NIC, the
//! operation in flight and the results of past ones. It admits commands (every check that
//! needs no round trip to the ranks: job, targets, registrations, capabilities, job state,
//! verification; `docs/protocol.md` states the rules) and drives the [`Operation`] machine.
//!
//! The ledger does no I/O, yet a uuid's answer can outlive the manager: every final result is
//! handed out as a [`FinishedOperation`] ([`JobLedger::take_finished`]) for the manager to
//! record where it survives a restart, and a new ledger is seeded with those records
//! ([`JobLedger::seed`]), so a repeated uuid returns the earlier result and a reused one is
//! refused as before the restart.

use crate::command::{SwitchCommand, SwitchPlan, ValidationError};
use crate::display::short_list;
use crate::hal::{NicSide, SwitchCapabilities};
use crate::ids::{GlobalRank, Instance, JobId, NodeName, OperationId};
pub use crate::operation::JobState;
use crate::operation::{
    Action, CommandError, Event, Operation, OperationKind, OperationReport, Outcome,
    PhaseDeadlines, Trigger,
};
use crate::protocol::{Gone, NodeReply, Phase, ReplyBody, WorkerHello};
use crate::rank_table::RankTable;
use crate::verify::{Assessment, Verification, VerifyReport, VerifyStep};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

mod activity;
mod hold;
mod knowledge;
mod stall;
mod stop;
mod uuids;
use activity::Activity;
pub use hold::{HoldNews, HoldPolicy, DEFAULT_HOLD_BOUND};
use knowledge::NicKnowledge;
pub use stall::{StallOutcome, StalledRank};
pub use stop::{
    LastWords, ProcessRecovery, Restarts, StopBy, StopPhase, TrainingStop, DEFAULT_STOP_BOUND,
};
pub use uuids::{AdmittedOperation, FinishedOperation, RequestFingerprint, HISTORY_LEN};
use uuids::{Seen, UuidMemory};

/// Why a command was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum SubmitError {
    /// The command is for another job: the client reached the wrong manager.
    #[error("job \"{job}\" is not managed here (this manager runs job \"{known}\")")]
    UnknownJob {
        /// The job the command names.
        job: JobId,
        /// The one job this manager runs.
        known: JobId,
    },
    /// Some rank of the rank table has no worker registered. Every rank pauses and calls HCCL
    /// (not only the targets), so one absent process blocks every switch.
    #[error("only {registered} of {expected} workers are registered (missing ranks: {missing}); wait until every training process has started")]
    WorkersMissing {
        /// Workers registered now.
        registered: usize,
        /// The rank table's world size.
        expected: usize,
        /// The absent ranks as [`short_list`] writes them: a job of thousands of ranks still
        /// gets a one-line message.
        missing: String,
    },
    /// An operation or a verification round is running: one at a time, since both hold
    /// every rank at its step gate.
    #[error("operation {in_flight} is still running; wait for its result")]
    Busy {
        /// What runs now (an operation's or a verification round's id): the id to wait for.
        in_flight: OperationId,
    },
    /// The command does not fit the rank table (unknown node or device, conflicting
    /// targets, ...): refused before any rank is involved.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Some rank's backend would accept the NIC switch and switch nothing (HCCL without L2
    /// retry or RDMA links, a framework without TSP), leaving the NIC table wrong. Checked on every rank, not
    /// only the targets: every member of a group makes the call.
    #[error(
        "{} switch NICs: {missing}; fix the environment of those processes and restart them",
        crate::display::ranks_with(ranks, "cannot", "cannot")
    )]
    CapabilityMissing {
        /// The ranks that cannot switch, abbreviated for a message.
        ranks: String,
        /// Every setting missing on any of them, as their backends named it
        /// ([`SwitchCapabilities::missing`]), so one message sends the operator to all of them.
        missing: String,
    },
    /// A failed operation left the job held or without a process; switching now would plan
    /// from a NIC table that may not be true. Recovery comes first.
    #[error("the job is {state} (after a failed operation, or a rank lost or restarted since the last verification); run `taskd recover` (or wait for the lost ranks to come back) before any new switch")]
    NotRunning {
        /// The job's state now (never `Running`).
        state: JobState,
    },
    /// The manager has not heard from every rank what it applied since the last event that
    /// could change it (start, a reconnect, a recovery): a plan from a guessed NIC table could
    /// leave a group split.
    #[error("the NIC configuration of the job is not verified yet ({why}); switches wait until every rank has reported what it applied")]
    Unverified {
        /// What the verification still waits for (the last round's report, or that no round
        /// ran yet).
        why: String,
    },
    /// Ranks have not answered the NIC-set calls of an operation that ended without them (its
    /// deadline passed, or they were lost): a new call now would pair, on some group, with one
    /// of their late calls. HCCL's own timeout ends those calls; a rank's answer, or its report
    /// in a verification round (made after its calls), clears it.
    #[error("{} not answered the NIC-set calls of operation {op} yet (HCCL's timeout ends them); recover once they have", crate::display::ranks_with(ranks, "has", "have"))]
    InCalls {
        /// The operation whose calls they have not answered.
        op: OperationId,
        /// The ranks, abbreviated for a message.
        ranks: String,
    },
    /// The uuid's operation was admitted by an earlier manager of the job, which stopped
    /// before its final result: what it applied, if anything, is what this manager's
    /// verification found. It is not run a second time under the same uuid.
    #[error("operation {id} was started by an earlier manager of this job, which stopped before its result; the NIC state it left is what `taskd status` shows (verified by this manager); submit again with a new uuid to switch")]
    Interrupted {
        /// The uuid.
        id: OperationId,
    },
    /// A recovery was asked for a job that is running with a verified NIC table.
    #[error("the job is {state}: nothing to recover")]
    NothingToRecover {
        /// The job's state (`Running`).
        state: JobState,
    },
    /// Training was stopped and the processes are restarting (see [`TrainingStop`]): nothing
    /// runs until every rank is back and verified.
    #[error("training was stopped ({reason}); {waiting}: the job runs again once every rank's new process registered and the verification round found every group agreeing")]
    TrainingStopped {
        /// Why training was stopped.
        reason: String,
        /// What the stop waits for.
        waiting: String,
    },
    #[error("operation id {id} was already used for a different request (other targets); use a new uuid for a new request")]
    /// The id ran (or runs) with other targets: a new request needs a new id.
    IdReused {
        /// The reused id.
        id: OperationId,
    },
    /// The manager's journal (`--state-dir`) cannot be written: a result now could not be
    /// made durable (after a restart its uuid would run again), so nothing new is admitted
    /// until a write succeeds again.
    #[error("the manager's operation journal cannot be written ({why}); no operation starts until it can (free space or fix the state directory; the manager retries every second)")]
    JournalFailing {
        /// The last write's error, naming the file.
        why: String,
    },
}

/// Why a command to a sequenced operation was not carried out. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    /// No operation runs.
    #[error("no operation is in flight")]
    NothingInFlight,
    /// The targets cannot be switched (see [`SubmitError`]).
    #[error(transparent)]
    Refused(#[from] SubmitError),
    /// The operation cannot take this command now.
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// What a registration led to.
#[derive(Clone, Debug, PartialEq)]
pub enum Registered {
    /// The process counts as the rank's.
    Counted,
    /// The process is one a stop of training ended (it came back after a cut): not counted;
    /// carry out the actions (the stop, sent to it again).
    Retired(Vec<Action>),
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RegisterError {
    /// The worker belongs to another job: a misconfigured manager address.
    #[error("worker of job \"{got}\" registered with the manager of job \"{expected}\"")]
    WrongJob {
        /// This manager's job.
        expected: JobId,
        /// The job the worker said it runs.
        got: JobId,
    },
    /// The rank is beyond the rank table: the worker and the manager read different tables.
    #[error("rank {rank} is not in the rank table (world size {world})")]
    UnknownRank {
        /// The rank the worker claimed.
        rank: GlobalRank,
        /// The table's world size (valid ranks are `0..world`).
        world: usize,
    },
    /// The rank runs on another node than the table says, so directives for it would go
    /// through the wrong proxy.
    #[error(
        "rank {rank} registered from node \"{got}\" but the rank table puts it on \"{expected}\""
    )]
    WrongNode {
        /// The rank the worker claimed.
        rank: GlobalRank,
        /// The node the rank table assigns to it.
        expected: NodeName,
        /// The node the worker said it runs on.
        got: NodeName,
    },
}

/// What a submission led to.
#[derive(Clone, Debug, PartialEq)]
pub enum Submitted {
    /// A new operation started; carry out the actions.
    Started {
        /// The operation's id (the command's own, or the one the caller generated).
        id: OperationId,
        /// The first directives and deadlines, for the manager to carry out.
        actions: Vec<Action>,
    },
    /// The id already ran: its result (it is not run again).
    Known(Box<OperationReport>),
    /// The id is the operation in flight: wait for its result.
    InFlight(OperationId),
}

/// A rank whose process the manager lost sight of, until a process of it registers again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRank {
    /// What was seen, for people.
    pub why: String,
    /// How it went: died, ended cleanly, or unreachable (it may train on).
    pub how: Gone,
    /// The process that went, when known.
    pub instance: Instance,
    /// The job restart its launcher started it for (0: the first start, or not known).
    #[serde(default)]
    pub generation: u32,
}

impl LostRank {
    /// A process that died (`why`), instance not known.
    pub fn died(why: impl Into<String>) -> Self {
        Self::new(why, Gone::Died)
    }

    /// A rank whose proxy cannot be reached (`why`).
    pub fn unreachable(why: impl Into<String>) -> Self {
        Self::new(why, Gone::Unreachable)
    }

    /// A process that ended cleanly (`why`).
    pub fn ended(why: impl Into<String>) -> Self {
        Self::new(why, Gone::Ended)
    }

    fn new(why: impl Into<String>, how: Gone) -> Self {
        LostRank {
            why: why.into(),
            how,
            instance: Instance::UNKNOWN,
            generation: 0,
        }
    }

    /// The same, of process `instance`.
    pub fn of(self, instance: Instance) -> Self {
        LostRank { instance, ..self }
    }
}

/// The manager's state for one job.
#[derive(Debug)]
pub struct JobLedger {
    job: JobId,
    table: RankTable,
    workers: BTreeMap<GlobalRank, WorkerHello>,
    /// Ranks that registered and are gone; a rank leaves when it registers again.
    lost: BTreeMap<GlobalRank, LostRank>,
    /// The NIC table and how far every rank's report confirmed it.
    nics: NicKnowledge,
    /// What runs now: nothing, an operation or a verification round (never both).
    activity: Activity,
    /// The ranks that have not answered the NIC-set phase an operation ended in
    /// ([`Operation::left_in_calls`]), until they do.
    in_calls: Option<InCalls>,
    /// The uuids known: finished, seeded from earlier managers, not yet journaled.
    uuids: UuidMemory,
    state: JobState,
    deadlines: PhaseDeadlines,
    /// Training stopped, until every rank is back ([`JobLedger::stop_training`]).
    stop: Option<TrainingStop>,
    /// The last stop that ended.
    last_stop: Option<TrainingStop>,
    /// What a job left not running leads to, in words (the manager's hold policy), written
    /// into the report of every operation that leaves the job not running.
    hold_note: Option<String>,
    /// The hold bound and the hold it follows (`ledger/hold.rs`).
    hold: hold::Hold,
    /// Process recovery coordinated by the manager, when on.
    recovery: Option<ProcessRecovery>,
    /// The job's restarts so far.
    restarts: Restarts,
    /// A job-wide restart owed for a fault, until it starts.
    owed_restart: Option<stop::OwedRestart>,
    /// The process of each rank the last stop ended: never counted as back.
    retired: stop::Retired,
    /// The bound on a stop of training.
    stop_bound: Duration,
    /// Whether a last-words checkpoint is taken before every stop (the manager hosts one).
    last_words_host: bool,
    /// Ranks whose hang watch says their loop finished no step for its timeout.
    stalled: BTreeMap<GlobalRank, StalledRank>,
}

/// Which NIC configuration a recovery re-states for the ranks in doubt.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoverTo {
    /// Every rank in doubt to its primary NIC.
    Primary,
    /// Every rank in doubt to its backup NIC.
    Backup,
    /// Every rank in doubt to the side the manager's NIC table has for it.
    AsIs,
}

impl RecoverTo {
    /// The name used on the command line and in the control API.
    pub fn as_str(self) -> &'static str {
        match self {
            RecoverTo::Primary => "primary",
            RecoverTo::Backup => "backup",
            RecoverTo::AsIs => "as-is",
        }
    }
}

/// How a recovery starts.
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryStarted {
    /// Ranks are in doubt: an operation re-states them (wait for its result).
    Operation {
        /// The recovery operation's id: its result arrives like a switch's.
        id: OperationId,
        /// The first directives and deadlines, for the manager to carry out.
        actions: Vec<Action>,
    },
    /// Nothing is in doubt: a verification round establishes the state (and opens held
    /// gates if every group agrees).
    Verification {
        /// The verification round's id.
        id: OperationId,
        /// The round's query to every rank and its deadline.
        actions: Vec<Action>,
    },
}

impl JobLedger {
    /// The book of a job that has just started: no worker registered, every rank on its
    /// primary NIC as far as the ledger knows, and that not yet verified, so the first switch
    /// waits for every rank to register and report what it applied.
    pub fn new(job: JobId, table: RankTable, deadlines: PhaseDeadlines) -> Self {
        JobLedger {
            job,
            table,
            workers: BTreeMap::new(),
            lost: BTreeMap::new(),
            nics: NicKnowledge::default(),
            activity: Activity::Idle,
            in_calls: None,
            uuids: UuidMemory::default(),
            state: JobState::Running,
            deadlines,
            stop: None,
            last_stop: None,
            hold_note: Some(HoldPolicy::default().to_string()),
            hold: hold::Hold::default(),
            recovery: None,
            restarts: Restarts::default(),
            owed_restart: None,
            retired: BTreeMap::new(),
            stalled: BTreeMap::new(),
            stop_bound: DEFAULT_STOP_BOUND,
            last_words_host: false,
        }
    }

    /// Seeds the ledger with the final results of earlier managers of this job, oldest first
    /// (a journal's records, see [`JobLedger::take_finished`]): a command under one of their
    /// uuids gets that result when it is the same request and is refused as
    /// [`SubmitError::IdReused`] when it is another, as on the manager that ran it. The newest
    /// [`HISTORY_LEN`] are kept. They are not this manager's [`history`](Self::history).
    pub fn seed(&mut self, earlier: impl IntoIterator<Item = FinishedOperation>) {
        self.uuids.seed(earlier);
    }

    /// Seeds the ledger with the operations earlier managers admitted and did not finish (a
    /// journal's records of them, see [`JobLedger::take_admitted`]): a command under one of
    /// their uuids is refused as [`SubmitError::Interrupted`] when it is the same request and
    /// as [`SubmitError::IdReused`] when it is another.
    pub fn seed_interrupted(&mut self, ops: impl IntoIterator<Item = AdmittedOperation>) {
        self.uuids.seed_interrupted(ops);
    }

    /// Marks the finished operation `id` in the history as one whose result the manager could
    /// not journal (`why`), so whoever asks for it later is told too.
    pub fn note_not_journaled(&mut self, id: OperationId, why: &str) {
        self.uuids.note_not_journaled(id, why);
    }

    /// Hands out the operations admitted since the last call, oldest first, for the manager
    /// to record before the operation's first directive, where a later manager can
    /// [`seed_interrupted`](Self::seed_interrupted) from those it never finished.
    pub fn take_admitted(&mut self) -> Vec<AdmittedOperation> {
        self.uuids.take_admitted()
    }

    /// Hands out the final results since the last call, oldest first, for the manager to
    /// record where a later manager can [`seed`](Self::seed) from them. A ledger nobody takes
    /// them from keeps only the newest [`HISTORY_LEN`].
    pub fn take_finished(&mut self) -> Vec<FinishedOperation> {
        self.uuids.take_finished()
    }

    /// Whether the NIC table comes from every rank's report (see [`crate::verify`]).
    pub fn is_verified(&self) -> bool {
        self.nics.is_verified()
    }

    /// The verification round in flight.
    pub fn verifying(&self) -> Option<&Verification> {
        self.activity.verification()
    }

    /// The last verification round's report.
    pub fn last_verification(&self) -> Option<&VerifyReport> {
        self.nics.last_round()
    }

    /// Whether a verification round should start now: one is owed, every rank is registered,
    /// and neither an operation nor a round runs.
    pub fn verify_due(&self) -> bool {
        self.nics.round_owed()
            && self.activity.is_idle()
            && self.workers.len() == self.table.world_size()
            && !self.stop_blocks_verification()
    }

    /// Starts a verification round under `id` (see [`JobLedger::verify_due`]).
    pub fn start_verification(&mut self, id: OperationId, now: Duration) -> Vec<Action> {
        let (v, actions) =
            Verification::start(id, self.workers.keys().copied(), self.deadlines.resume, now);
        self.nics.round_started();
        self.activity = Activity::Verifying(Box::new(v));
        actions
    }

    fn settle_verification(&mut self, report: VerifyReport) -> Vec<Action> {
        self.activity = Activity::Idle;
        match self.nics.settle_round(&report) {
            Some(state) => self.state = state,
            // Some rank did not answer: nothing is established; ask again when it returns.
            None => {
                if self.state == JobState::Running {
                    self.state = JobState::NeedsRecovery;
                }
            }
        }
        self.stop_verified();
        vec![Action::Verified(Box::new(report))]
    }

    /// Starts a recovery of a job that is not running (see [`RecoverTo`]). Ranks in doubt are
    /// the targets of the operation that left the job this way and the ranks of every group
    /// the last verification found disagreeing.
    pub fn recover(
        &mut self,
        to: RecoverTo,
        id: OperationId,
        now: Duration,
    ) -> Result<RecoveryStarted, SubmitError> {
        self.activity.check_idle()?;
        self.refuse_while_stopped()?;
        if self.state == JobState::Running && self.nics.is_verified() {
            return Err(SubmitError::NothingToRecover { state: self.state });
        }
        self.check_registered()?;
        if let Some(c) = &self.in_calls {
            return Err(SubmitError::InCalls {
                op: c.op,
                ranks: short_list(&c.ranks),
            });
        }
        let doubt = self.ranks_in_doubt();
        if doubt.is_empty() {
            let actions = self.start_verification(id, now);
            return Ok(RecoveryStarted::Verification { id, actions });
        }
        let targets = doubt
            .into_iter()
            .filter_map(|rank| {
                let slot = self.table.slot(rank)?;
                let use_backup = match to {
                    RecoverTo::Primary => false,
                    RecoverTo::Backup => true,
                    RecoverTo::AsIs => self.nics.table().uses_backup(rank),
                };
                Some(crate::command::RankTarget {
                    node: slot.node.clone(),
                    device: slot.device,
                    rank,
                    use_backup,
                })
            })
            .collect();
        let targets: Vec<_> = targets;
        // `as-is` can tell the two dies of one NPU opposite sides, which HCCL refuses in one
        // call: then the operator must pick one side.
        crate::command::check_partners(&targets)?;
        let plan = crate::command::SwitchPlan { targets };
        let (op, actions) =
            Operation::start_recovery(id, plan, self.table.all_ranks(), self.deadlines, now);
        self.activity = Activity::Operating(Box::new(op));
        let actions = self.settle(actions);
        Ok(RecoveryStarted::Operation { id, actions })
    }

    /// Ranks whose NIC state is not known to agree across their groups.
    fn ranks_in_doubt(&self) -> BTreeSet<GlobalRank> {
        let mut doubt: BTreeSet<GlobalRank> = self
            .nics
            .assessment()
            .map(Assessment::ranks_in_doubt)
            .unwrap_or_default();
        if let Some(last) = self.uuids.last_finished() {
            if last.job_state != JobState::Running {
                doubt.extend(last.targets.iter().map(|t| t.rank));
            }
        }
        doubt
    }

    fn check_registered(&self) -> Result<(), SubmitError> {
        if self.workers.len() < self.table.world_size() {
            let missing: Vec<GlobalRank> = self
                .table
                .all_ranks()
                .filter(|r| !self.workers.contains_key(r))
                .collect();
            return Err(SubmitError::WorkersMissing {
                registered: self.workers.len(),
                expected: self.table.world_size(),
                missing: short_list(&missing),
            });
        }
        Ok(())
    }

    /// The one job this ledger (and its manager) serves.
    pub fn job(&self) -> &JobId {
        &self.job
    }

    /// Where each rank runs: the ledger admits registrations and targets against it.
    pub fn table(&self) -> &RankTable {
        &self.table
    }

    /// Whether training runs, is held after a failure, or lost a process.
    pub fn state(&self) -> JobState {
        self.state
    }

    /// The per-phase deadlines every operation of this job runs with.
    pub fn deadlines(&self) -> &PhaseDeadlines {
        &self.deadlines
    }

    /// Records a worker. A repeated registration of the same rank replaces the earlier one
    /// (a reconnect, or a new process). A process a stop of training ended (a retired
    /// instance, see `ledger/stop.rs`) is not recorded: the stop goes to it again.
    pub fn register(&mut self, hello: WorkerHello) -> Result<Registered, RegisterError> {
        if hello.job != self.job {
            return Err(RegisterError::WrongJob {
                expected: self.job.clone(),
                got: hello.job,
            });
        }
        let slot = self
            .table
            .slot(hello.rank)
            .ok_or(RegisterError::UnknownRank {
                rank: hello.rank,
                world: self.table.world_size(),
            })?;
        if slot.node != hello.node {
            return Err(RegisterError::WrongNode {
                rank: hello.rank,
                expected: slot.node.clone(),
                got: hello.node,
            });
        }
        // A process a stop ended, or one started for an earlier job restart than the one
        // under way (a node whose processes first register during the restart): an old
        // process, sent the stop again, never counted as back.
        if self.is_retired(hello.rank, hello.instance)
            || (self.stop.is_some() && hello.generation < self.restarts.done)
        {
            return Ok(Registered::Retired(
                self.stop_old_back(hello.rank, hello.instance),
            ));
        }
        // A process that registers again (a reconnect, or a new process on primary) may
        // have another NIC configuration than the table says: ask every rank again.
        self.nics.doubt();
        self.stop_registered(hello.rank);
        self.lost.remove(&hello.rank);
        self.stalled.remove(&hello.rank);
        // A manager started after the job's restarts counts on from the processes' own.
        self.restarts.done = self.restarts.done.max(hello.generation);
        self.workers.insert(hello.rank, hello);
        Ok(Registered::Counted)
    }

    /// The ranks that have not answered the NIC-set phase the last operation ended in, and that
    /// operation ([`SubmitError::InCalls`]); `None` once every rank has.
    pub fn ranks_in_calls(&self) -> Option<(OperationId, &BTreeSet<GlobalRank>)> {
        self.in_calls.as_ref().map(|c| (c.op, &c.ranks))
    }

    /// How many ranks have a worker registered (at most [`expected`](Self::expected)).
    pub fn registered(&self) -> usize {
        self.workers.len()
    }

    /// The world size: how many workers must register before anything can switch.
    pub fn expected(&self) -> usize {
        self.table.world_size()
    }

    /// Whether `rank` has a worker registered now (one that was lost is no longer).
    pub fn is_registered(&self, rank: GlobalRank) -> bool {
        self.workers.contains_key(&rank)
    }

    /// Ranks that registered and are gone ([`worker_lost`](Self::worker_lost)), ascending,
    /// with why; a rank leaves once it registers again.
    pub fn lost_ranks(&self) -> impl Iterator<Item = (GlobalRank, &LostRank)> + '_ {
        self.lost.iter().map(|(rank, l)| (*rank, l))
    }

    /// Whether training ended on every rank: no process registered, and every rank's last
    /// one ended cleanly.
    pub fn all_ended(&self) -> bool {
        self.workers.is_empty()
            && self.lost.len() == self.table.world_size()
            && self.lost.values().all(|l| l.how == Gone::Ended)
    }

    /// Ranks using their backup NIC, ascending.
    pub fn ranks_on_backup(&self) -> impl Iterator<Item = GlobalRank> + '_ {
        self.nics.table().ranks_on_backup()
    }

    /// Whether the NIC table has `rank` on its backup NIC (see [`side_of`](Self::side_of)).
    pub fn uses_backup(&self, rank: GlobalRank) -> bool {
        self.nics.table().uses_backup(rank)
    }

    /// The side the NIC table has for `rank`.
    pub fn side_of(&self, rank: GlobalRank) -> NicSide {
        self.nics.table().side_of(rank)
    }

    /// The running operation, if any (a verification round is not one).
    pub fn in_flight(&self) -> Option<&Operation> {
        self.activity.operation()
    }

    /// Finished operations, oldest first.
    pub fn history(&self) -> impl DoubleEndedIterator<Item = &OperationReport> {
        self.uuids.history()
    }

    /// The final report of a finished operation still in the history (the last
    /// [`HISTORY_LEN`]) or among the results the ledger was [seeded](Self::seed) with, so a
    /// client that lost the answer can ask again.
    pub fn result_of(&self, id: OperationId) -> Option<&OperationReport> {
        self.uuids.result_of(id)
    }

    /// Admits an operator's command under `id` (the command's own, or one the caller
    /// generated).
    pub fn submit(
        &mut self,
        cmd: &SwitchCommand,
        id: OperationId,
        now: Duration,
    ) -> Result<Submitted, SubmitError> {
        self.submit_by(Trigger::Operator, cmd, id, now)
    }

    /// [`JobLedger::submit`] for whoever `trigger` names: the same rules, and the report says
    /// who asked.
    pub fn submit_by(
        &mut self,
        trigger: Trigger,
        cmd: &SwitchCommand,
        id: OperationId,
        now: Duration,
    ) -> Result<Submitted, SubmitError> {
        if cmd.job != self.job {
            return Err(SubmitError::UnknownJob {
                job: cmd.job.clone(),
                known: self.job.clone(),
            });
        }
        if let Some(seen) = self.seen(cmd, id) {
            return seen;
        }
        self.activity.check_idle()?;
        let plan = cmd.resolve(&self.table)?;
        self.refuse_while_stopped()?;
        // Missing ranks first: the most specific reason while a lost process is away.
        self.check_registered()?;
        if self.state != JobState::Running {
            return Err(SubmitError::NotRunning { state: self.state });
        }
        self.check_capabilities()?;
        if !self.nics.is_verified() {
            return Err(self.unverified());
        }
        let previous = plan
            .targets
            .iter()
            .map(|t| (t.rank, self.side_of(t.rank)))
            .collect();
        let (op, actions) = Operation::start_by(
            trigger,
            id,
            plan,
            previous,
            self.table.all_ranks(),
            self.deadlines,
            now,
        );
        self.uuids.record_admitted(AdmittedOperation {
            id,
            fingerprint: RequestFingerprint::of(&op.plan().targets),
        });
        self.activity = Activity::Operating(Box::new(op));
        let actions = self.settle(actions);
        Ok(Submitted::Started { id, actions })
    }

    /// [`JobLedger::submit_by`] for a move inside the step: the same rules, and the operation
    /// aborts the collectives in flight instead of pausing at a boundary
    /// ([`Operation::set_in_flight`]). A request already known answers as before.
    pub fn submit_in_flight(
        &mut self,
        trigger: Trigger,
        cmd: &SwitchCommand,
        id: OperationId,
        now: Duration,
    ) -> Result<Submitted, SubmitError> {
        let known = self.seen(cmd, id).is_some();
        let submitted = self.submit_by(trigger, cmd, id, now)?;
        if !known {
            if let (Submitted::Started { id: started, .. }, Activity::Operating(op)) =
                (&submitted, &mut self.activity)
            {
                if op.id() == *started {
                    op.set_in_flight();
                }
            }
        }
        Ok(submitted)
    }

    /// Every rank makes the NIC-set call in a switch (not only targets), so every rank must be
    /// able to.
    fn check_capabilities(&self) -> Result<(), SubmitError> {
        let unable: Vec<(GlobalRank, SwitchCapabilities)> = self
            .workers
            .values()
            .filter(|w| !w.capabilities.can_switch())
            .map(|w| (w.rank, w.capabilities.clone()))
            .collect();
        if !unable.is_empty() {
            let ranks: Vec<GlobalRank> = unable.iter().map(|(r, _)| *r).collect();
            // Name what is missing on any of the ranks, not only on the first one: with rank 2
            // lacking TSP and rank 5 lacking RDMA, the message must send the operator to both
            // flags.
            let common = unable
                .into_iter()
                .fold(SwitchCapabilities::ALL, |acc, (_, c)| acc.and(c));
            return Err(SubmitError::CapabilityMissing {
                ranks: short_list(&ranks),
                missing: common.to_string(),
            });
        }
        Ok(())
    }

    fn unverified(&self) -> SubmitError {
        SubmitError::Unverified {
            why: self.nics.unverified_why(),
        }
    }

    /// Starts a sequenced operation under `id` (an outside driver's pause, see
    /// [`crate::operation::OperationKind::Sequenced`]): admitted like a switch, except that its
    /// targets come later ([`JobLedger::switch_sequenced`]). Each hold waits at most `hold`;
    /// with `stop`, it ends at its first hold, every rank held.
    pub fn start_sequenced(
        &mut self,
        id: OperationId,
        hold: Duration,
        stop: Option<String>,
        now: Duration,
    ) -> Result<Vec<Action>, SubmitError> {
        self.activity.check_idle()?;
        self.refuse_while_stopped()?;
        self.check_registered()?;
        if self.state != JobState::Running {
            return Err(SubmitError::NotRunning { state: self.state });
        }
        if !self.nics.is_verified() {
            return Err(self.unverified());
        }
        let ranks = self.table.all_ranks();
        let (op, actions) = Operation::start_sequenced(id, ranks, self.deadlines, hold, stop, now);
        self.activity = Activity::Operating(Box::new(op));
        Ok(self.settle(actions))
    }

    /// The targets of the sequenced operation in flight: checked like a command's (the two
    /// dies of one NPU, every rank able to switch), then switched from the NIC table's state.
    pub fn switch_sequenced(
        &mut self,
        plan: SwitchPlan,
        now: Duration,
    ) -> Result<Vec<Action>, SequenceError> {
        let Some(op) = self.activity.operation() else {
            return Err(SequenceError::NothingInFlight);
        };
        if op.kind() != OperationKind::Sequenced {
            return Err(CommandError::NotSequenced(op.id()).into());
        }
        if plan.targets.is_empty() {
            return Err(SequenceError::Refused(ValidationError::NoTargets.into()));
        }
        crate::command::check_partners(&plan.targets).map_err(SubmitError::from)?;
        self.check_capabilities()?;
        let previous = plan
            .targets
            .iter()
            .map(|t| (t.rank, self.side_of(t.rank)))
            .collect();
        let op = self.activity.operation_mut().expect("checked above");
        let actions = op.command_switch(plan, previous, now)?;
        Ok(self.settle(actions))
    }

    /// Resumes the sequenced operation in flight (at once if it holds, else at its next hold).
    pub fn resume_sequenced(&mut self, now: Duration) -> Result<Vec<Action>, SequenceError> {
        self.command(|op| op.command_resume(now))
    }

    /// Stops the sequenced operation in flight at a hold point, every rank held (at once if it
    /// holds, else at its next hold).
    pub fn stop_sequenced(
        &mut self,
        reason: String,
        now: Duration,
    ) -> Result<Vec<Action>, SequenceError> {
        self.command(|op| op.command_stop(reason, now))
    }

    /// Gives the operation in flight a command and settles what it did.
    fn command(
        &mut self,
        f: impl FnOnce(&mut Operation) -> Result<Vec<Action>, CommandError>,
    ) -> Result<Vec<Action>, SequenceError> {
        let op = self
            .activity
            .operation_mut()
            .ok_or(SequenceError::NothingInFlight)?;
        let actions = f(op)?;
        Ok(self.settle(actions))
    }

    /// The answer for an id that ran or runs: its result or the operation in flight when `cmd`
    /// is the same request (`Interrupted` for one an earlier manager never finished), `IdReused`
    /// when it is another. `None` for a new id.
    fn seen(&self, cmd: &SwitchCommand, id: OperationId) -> Option<Result<Submitted, SubmitError>> {
        let in_flight = self.activity.operation().filter(|op| op.id() == id);
        // A result first, then the operation in flight, then an earlier manager's interrupted
        // admission.
        let (known, answer) = match (self.uuids.seen(id), in_flight) {
            (
                Some(Seen::Finished {
                    fingerprint,
                    report,
                }),
                _,
            ) => (fingerprint, Ok(Submitted::Known(Box::new(report.clone())))),
            (_, Some(op)) => {
                let answer = Ok(Submitted::InFlight(id));
                (RequestFingerprint::of(&op.plan().targets), answer)
            }
            (Some(Seen::Interrupted { fingerprint }), None) => {
                (fingerprint.clone(), Err(SubmitError::Interrupted { id }))
            }
            (None, None) => return None,
        };
        // A command that does not resolve is not the request that ran.
        let same = cmd
            .resolve(&self.table)
            .is_ok_and(|plan| RequestFingerprint::of(&plan.targets) == known);
        if same {
            Some(answer)
        } else {
            Some(Err(SubmitError::IdReused { id }))
        }
    }

    /// Feeds an event to the operation or verification round in flight (ignored when none
    /// is).
    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Action> {
        if let Event::Replies(nr) = &event {
            self.answered_calls(nr);
            self.stop_replies(nr);
        }
        let v = match &mut self.activity {
            Activity::Idle => return Vec::new(),
            Activity::Operating(op) => {
                let actions = op.handle(event, now);
                return self.settle(actions);
            }
            Activity::Verifying(v) => v,
        };
        let step = match event {
            Event::Replies(nr) => v.on_replies(nr, now),
            Event::Deadline { token } => v.on_deadline(token, now),
            Event::WorkerLost { rank, .. } => v.on_lost(rank, now),
            Event::Abort { .. } => {
                // Nothing to undo: a round changes nothing.
                self.activity = Activity::Idle;
                self.nics.round_dropped();
                None
            }
        };
        match step {
            None => Vec::new(),
            Some(VerifyStep::Act(actions)) => actions,
            Some(VerifyStep::Done(report)) => self.settle_verification(report),
        }
    }

    /// A rank's process is out of sight (`how`): unregisters the rank and fails the
    /// operation in flight, if any (it needed the rank). Then, with nothing running:
    ///
    /// - `died`: the job needs its process back (`needs_recovery`); with process recovery on,
    ///   a restart of the whole job is owed ([`JobLedger::restart_due`]), unless the process
    ///   is one a stop under way ended;
    /// - `unreachable`: the job is `degraded` (no gate holds the rank; it may train on);
    /// - `ended`: training ended on the rank; nothing else changes.
    ///
    /// It returns to running once the rank registers again and a verification round finds
    /// every group agreeing. A report about another process than the registered one (an old
    /// one, `instance` known) changes nothing. A rank with no process registered that died
    /// (a crash before registering; `lost.generation`, the job restart it was started for)
    /// owes a restart the same way, unless it is an old process of a restart under way.
    pub fn worker_lost(&mut self, rank: GlobalRank, lost: LostRank, now: Duration) -> Vec<Action> {
        let Some(current) = self.workers.get(&rank).map(|w| w.instance) else {
            self.lost_unregistered(rank, lost, now);
            return Vec::new();
        };
        if lost.instance.is_known() && current.is_known() && current != lost.instance {
            return Vec::new();
        }
        let ended_by_stop = self.is_retired(rank, current);
        self.workers.remove(&rank);
        self.stalled.remove(&rank);
        let LostRank { why, how, .. } = lost.clone();
        self.lost.insert(rank, lost.of(current));
        self.stop_lost(rank, how);
        self.nics.doubt();
        let busy = !self.activity.is_idle();
        let actions = self.handle(
            Event::WorkerLost {
                rank,
                reason: why.clone(),
            },
            now,
        );
        if !busy {
            self.state = match (self.state, how) {
                (JobState::Running, Gone::Unreachable) => JobState::Degraded,
                (JobState::Running | JobState::Degraded, Gone::Died) => JobState::NeedsRecovery,
                (state, _) => state,
            };
        }
        if how == Gone::Died && !ended_by_stop {
            self.owe_restart(format!("rank {rank} lost: {why}"), now);
        }
        actions
    }

    /// A rank with no process registered is reported gone: a process that died before it
    /// registered owes a restart (unless a restart under way started it for an earlier
    /// generation: an old process); an unreachable rank already lost becomes known dead.
    fn lost_unregistered(&mut self, rank: GlobalRank, lost: LostRank, now: Duration) {
        if lost.how != Gone::Died {
            return;
        }
        if self.stop.is_some() && lost.generation < self.restarts.done {
            return;
        }
        let why = lost.why.clone();
        match self.lost.get_mut(&rank) {
            // Known dead already: the first word stands.
            Some(l) if l.how == Gone::Died && l.generation >= lost.generation => {}
            Some(l) => *l = lost,
            None => {
                self.lost.insert(rank, lost);
            }
        }
        self.stop_lost(rank, Gone::Died);
        if self.activity.is_idle() && matches!(self.state, JobState::Degraded | JobState::Running) {
            self.state = JobState::NeedsRecovery;
        }
        self.owe_restart(format!("rank {rank} lost: {why}"), now);
    }

    /// Ends the operation in flight safely because the manager is stopping (see
    /// [`Event::Abort`]); the actions still have to be carried out, and its result comes
    /// as usual.
    pub fn abort(&mut self, reason: String, now: Duration) -> Vec<Action> {
        self.handle(Event::Abort { reason }, now)
    }

    /// The phase of the operation in flight.
    pub fn phase(&self) -> Option<Phase> {
        self.activity.operation().map(Operation::phase)
    }

    /// What a job left not running leads to, in words (the manager's hold policy): every later
    /// report of an operation that leaves the job not running carries it
    /// ([`OperationReport::hold`]), in the history and the journal alike.
    pub fn set_hold_note(&mut self, note: impl Into<String>) {
        self.hold_note = Some(note.into());
    }

    /// Applies a finish: NIC table, job state, history.
    fn settle(&mut self, mut actions: Vec<Action>) -> Vec<Action> {
        for a in &mut actions {
            if let Action::Finish(report) = a {
                if report.job_state != JobState::Running {
                    report.hold.clone_from(&self.hold_note);
                }
                if report.applied {
                    self.nics.table_mut().apply(&report.targets);
                }
                self.state = report.job_state;
                match report.job_state {
                    // Back to running by itself once every lost rank returns and agrees.
                    JobState::NeedsRecovery => {
                        self.nics.doubt();
                    }
                    // Confirm a recovery with every rank's report.
                    JobState::Running
                        if self.activity.operation().map(Operation::kind)
                            == Some(crate::operation::OperationKind::Recovery)
                            && report.outcome == Outcome::Succeeded =>
                    {
                        self.nics.doubt();
                    }
                    _ => {}
                }
                self.uuids.record_finished(report);
                self.in_calls = self.activity.operation().and_then(|op| {
                    let (phase, ranks) = op.left_in_calls()?;
                    Some(InCalls {
                        op: op.id(),
                        phase,
                        ranks,
                    })
                });
                self.activity = Activity::Idle;
            }
        }
        actions
    }
}

/// The ranks an operation ended without in its NIC-set phase ([`Operation::left_in_calls`]).
#[derive(Clone, Debug)]
struct InCalls {
    op: OperationId,
    phase: Phase,
    ranks: BTreeSet<GlobalRank>,
}

impl JobLedger {
    /// Takes the ranks that answered off [`JobLedger::in_calls`]: a late answer to the phase
    /// (its calls returned), or a verification report (a worker makes it after its calls).
    fn answered_calls(&mut self, nr: &NodeReply) {
        let Some(c) = self.in_calls.as_mut() else {
            return;
        };
        for r in &nr.replies {
            let late_answer = r.op == c.op
                && r.phase == c.phase
                && matches!(r.body, ReplyBody::Applied { .. } | ReplyBody::Failed(_));
            if late_answer || matches!(r.body, ReplyBody::Verified(_)) {
                c.ranks.remove(&r.rank);
            }
        }
        if c.ranks.is_empty() {
            self.in_calls = None;
        }
    }
}
