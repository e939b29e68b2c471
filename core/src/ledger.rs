//! The manager's book of one job: who registered, which ranks use their backup NIC, the
//! operation in flight and the results of past ones. It admits commands (every check of
//! DESIGN section 3 that needs no round trip) and drives the [`Operation`] machine.

use crate::command::{RankTarget, SwitchCommand, ValidationError};
use crate::display::short_list;
use crate::hal::SwitchCapabilities;
use crate::ids::{GlobalRank, JobId, NodeName, OperationId};
pub use crate::operation::JobState;
use crate::operation::{Action, Event, Operation, OperationReport, PhaseDeadlines};
use crate::protocol::{Phase, WorkerHello};
use crate::rank_table::RankTable;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// How many finished operations the ledger remembers (for repeated ids and status).
pub const HISTORY_LEN: usize = 256;

/// Why a command was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum SubmitError {
    #[error("job \"{job}\" is not managed here (this manager runs job \"{known}\")")]
    UnknownJob { job: JobId, known: JobId },
    #[error("only {registered} of {expected} workers are registered (missing ranks: {missing}); wait until every training process has started")]
    WorkersMissing {
        registered: usize,
        expected: usize,
        missing: String,
    },
    #[error("operation {in_flight} is still running; wait for its result")]
    Busy { in_flight: OperationId },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("ranks {ranks} cannot switch NICs: {missing}; fix the environment of those processes and restart them")]
    CapabilityMissing { ranks: String, missing: String },
    #[error(
        "the job is {state:?} after a failed operation; it needs an operator before any new switch"
    )]
    NotRunning { state: JobState },
    #[error("operation id {id} was already used for a different request (other targets); use a new uuid for a new request")]
    /// The id ran (or runs) with other targets: a new request needs a new id.
    IdReused {
        /// The reused id.
        id: OperationId,
    },
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RegisterError {
    #[error("worker of job \"{got}\" registered with the manager of job \"{expected}\"")]
    WrongJob { expected: JobId, got: JobId },
    #[error("rank {rank} is not in the rank table (world size {world})")]
    UnknownRank { rank: GlobalRank, world: usize },
    #[error(
        "rank {rank} registered from node \"{got}\" but the rank table puts it on \"{expected}\""
    )]
    WrongNode {
        rank: GlobalRank,
        expected: NodeName,
        got: NodeName,
    },
}

/// What a submission led to.
#[derive(Clone, Debug, PartialEq)]
pub enum Submitted {
    /// A new operation started; carry out the actions.
    Started {
        id: OperationId,
        actions: Vec<Action>,
    },
    /// The id already ran: its result (it is not run again).
    Known(Box<OperationReport>),
    /// The id is the operation in flight: wait for its result.
    InFlight(OperationId),
}

/// The manager's state for one job.
#[derive(Debug)]
pub struct JobLedger {
    job: JobId,
    table: RankTable,
    workers: BTreeMap<GlobalRank, WorkerHello>,
    on_backup: BTreeSet<GlobalRank>,
    in_flight: Option<Operation>,
    history: VecDeque<OperationReport>,
    state: JobState,
    deadlines: PhaseDeadlines,
}

impl JobLedger {
    pub fn new(job: JobId, table: RankTable, deadlines: PhaseDeadlines) -> Self {
        JobLedger {
            job,
            table,
            workers: BTreeMap::new(),
            on_backup: BTreeSet::new(),
            in_flight: None,
            history: VecDeque::new(),
            state: JobState::Running,
            deadlines,
        }
    }

    pub fn job(&self) -> &JobId {
        &self.job
    }

    pub fn table(&self) -> &RankTable {
        &self.table
    }

    pub fn state(&self) -> JobState {
        self.state
    }

    pub fn deadlines(&self) -> &PhaseDeadlines {
        &self.deadlines
    }

    /// Records a worker. A repeated registration of the same rank replaces the earlier one
    /// (a reconnect).
    pub fn register(&mut self, hello: WorkerHello) -> Result<(), RegisterError> {
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
        self.workers.insert(hello.rank, hello);
        Ok(())
    }

    pub fn registered(&self) -> usize {
        self.workers.len()
    }

    pub fn expected(&self) -> usize {
        self.table.world_size()
    }

    pub fn is_registered(&self, rank: GlobalRank) -> bool {
        self.workers.contains_key(&rank)
    }

    /// Ranks using their backup NIC, ascending.
    pub fn ranks_on_backup(&self) -> impl Iterator<Item = GlobalRank> + '_ {
        self.on_backup.iter().copied()
    }

    pub fn uses_backup(&self, rank: GlobalRank) -> bool {
        self.on_backup.contains(&rank)
    }

    pub fn in_flight(&self) -> Option<&Operation> {
        self.in_flight.as_ref()
    }

    /// Finished operations, oldest first.
    pub fn history(&self) -> impl DoubleEndedIterator<Item = &OperationReport> {
        self.history.iter()
    }

    pub fn result_of(&self, id: OperationId) -> Option<&OperationReport> {
        self.history.iter().rev().find(|r| r.id == id)
    }

    /// Admits a command under `id` (the command's own, or one the caller generated).
    pub fn submit(
        &mut self,
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
        if let Some(op) = &self.in_flight {
            return Err(SubmitError::Busy { in_flight: op.id() });
        }
        if self.state != JobState::Running {
            return Err(SubmitError::NotRunning { state: self.state });
        }
        let plan = cmd.resolve(&self.table)?;
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
        // Every rank calls HCCL (not only targets), so every rank must be able to switch.
        let unable: Vec<(GlobalRank, SwitchCapabilities)> = self
            .workers
            .values()
            .filter(|w| !w.capabilities.can_switch())
            .map(|w| (w.rank, w.capabilities))
            .collect();
        if !unable.is_empty() {
            let ranks: Vec<GlobalRank> = unable.iter().map(|(r, _)| *r).collect();
            // name what is missing on any of the ranks, not only on the first one
            // (rank 2 without TSP and rank 5 without RDMA used to read "ranks 2, 5: MS_ENABLE_TFT
            // without TSP:1", sending the operator to the wrong flag for rank 5).
            let common =
                unable
                    .iter()
                    .fold(SwitchCapabilities::ALL, |acc, (_, c)| SwitchCapabilities {
                        tsp: acc.tsp && c.tsp,
                        l2_retry: acc.l2_retry && c.l2_retry,
                        rdma: acc.rdma && c.rdma,
                    });
            return Err(SubmitError::CapabilityMissing {
                ranks: short_list(&ranks),
                missing: common.missing().join(", "),
            });
        }
        let previous = plan
            .targets
            .iter()
            .map(|t| (t.rank, self.on_backup.contains(&t.rank)))
            .collect();
        let (op, actions) = Operation::start(
            id,
            plan,
            previous,
            self.table.all_ranks(),
            self.deadlines,
            now,
        );
        self.in_flight = Some(op);
        let actions = self.settle(actions);
        Ok(Submitted::Started { id, actions })
    }

    /// The answer for an id that ran or runs: its result or the operation in flight when `cmd`
    /// is the same request, `IdReused` when it is another. `None` for a new id.
    fn seen(&self, cmd: &SwitchCommand, id: OperationId) -> Option<Result<Submitted, SubmitError>> {
        let (targets, answer) = if let Some(r) = self.result_of(id) {
            (&r.targets, Submitted::Known(Box::new(r.clone())))
        } else {
            let op = self.in_flight.as_ref().filter(|op| op.id() == id)?;
            (&op.plan().targets, Submitted::InFlight(id))
        };
        if self.same_targets(cmd, targets) {
            Some(Ok(answer))
        } else {
            Some(Err(SubmitError::IdReused { id }))
        }
    }

    /// Whether `cmd` resolves to exactly `known` (in any order): a retry of the same request.
    fn same_targets(&self, cmd: &SwitchCommand, known: &[RankTarget]) -> bool {
        let key = |t: &RankTarget| (t.rank, t.use_backup);
        match cmd.resolve(&self.table) {
            Ok(plan) => {
                let new: BTreeSet<_> = plan.targets.iter().map(key).collect();
                new == known.iter().map(key).collect()
            }
            Err(_) => false,
        }
    }

    /// Feeds an event to the operation in flight (ignored when none is).
    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Action> {
        let Some(op) = self.in_flight.as_mut() else {
            return Vec::new();
        };
        let actions = op.handle(event, now);
        self.settle(actions)
    }

    /// A worker is gone. Fails the operation in flight, if any, and unregisters the rank.
    pub fn worker_lost(&mut self, rank: GlobalRank, reason: String, now: Duration) -> Vec<Action> {
        self.workers.remove(&rank);
        self.handle(Event::WorkerLost { rank, reason }, now)
    }

    /// The phase of the operation in flight.
    pub fn phase(&self) -> Option<Phase> {
        self.in_flight.as_ref().map(Operation::phase)
    }

    /// Applies a finish: NIC table, job state, history.
    fn settle(&mut self, actions: Vec<Action>) -> Vec<Action> {
        for a in &actions {
            if let Action::Finish(report) = a {
                if report.applied {
                    for t in &report.targets {
                        if t.use_backup {
                            self.on_backup.insert(t.rank);
                        } else {
                            self.on_backup.remove(&t.rank);
                        }
                    }
                }
                self.state = report.job_state;
                self.history.push_back((**report).clone());
                if self.history.len() > HISTORY_LEN {
                    self.history.pop_front();
                }
                self.in_flight = None;
            }
        }
        actions
    }

    /// Clears a `paused` or `needs_recovery` state once an operator has repaired the job.
    pub fn acknowledge_recovery(&mut self) {
        self.state = JobState::Running;
    }
}
