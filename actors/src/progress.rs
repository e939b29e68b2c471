//! What an operation is doing, as it happens: the manager's progress feed.
//!
//! The manager publishes one [`ProgressEvent`] when an operation starts, when each phase
//! starts, as the phase's count of ranks still to answer goes down, when each phase ends, and
//! once with the final report; with automatic failover on, also when a device's links change
//! ([`ProgressKind::Links`]) and for every decision of the policy ([`ProgressKind::Decision`]).
//! Anyone may subscribe ([`ProgressFeed::subscribe`], or the
//! manager's [`crate::manager::SubscribeProgress`] message): a CLI showing live progress, a
//! control API streaming it to an operator. A subscriber that falls behind loses the oldest
//! events (`RecvError::Lagged`), never the manager's time; the final report is the last event
//! of an operation, so a lagging subscriber still gets it.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use taskd_core::auto::AutoDecision;
use taskd_core::command::{Direction, RankTarget};
use taskd_core::operation::OperationReport;
use taskd_core::protocol::{LinkReport, Phase};
use taskd_core::{JobId, OperationId};
use tokio::sync::broadcast;

/// Events buffered per subscriber before the oldest are dropped.
pub const PROGRESS_BUFFER: usize = 1024;

/// One step of one operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressEvent {
    /// The operation; for a link change or a decision that held a move back (no operation),
    /// the nil UUID ([`NO_OPERATION`]).
    pub op: OperationId,
    /// Time since the operation started (the manager's clock); zero for a link change or a
    /// decision (which carry the manager's time).
    pub at: Duration,
    /// What happened.
    pub kind: ProgressKind,
}

/// The `op` of an event that belongs to no operation.
pub const NO_OPERATION: OperationId = OperationId(uuid::Uuid::nil());

/// The kinds of [`ProgressEvent`], in the order an operation emits them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressKind {
    /// The command was admitted; the operation runs over `ranks` ranks.
    Started {
        /// The job.
        job: JobId,
        /// To backup, to primary, or mixed.
        direction: Direction,
        /// The targets, resolved to ranks.
        targets: Vec<RankTarget>,
        /// Every rank of the job: all of them pause and call HCCL, not only the targets.
        ranks: usize,
    },
    /// A phase's directive went out to every node; `waiting` ranks must answer.
    /// `pause_step` is the step every rank finishes before holding (the pause phase only).
    PhaseStarted {
        /// The phase that started.
        phase: Phase,
        /// Ranks whose answer the phase needs.
        waiting: usize,
        /// The step every rank holds after (`Some` for the pause phase only).
        pause_step: Option<u64>,
    },
    /// Answers came in: `waiting` ranks of the phase are still to answer.
    Waiting {
        /// The phase in flight.
        phase: Phase,
        /// Ranks still to answer; never more than the phase started with.
        waiting: usize,
    },
    /// The phase is over (every rank answered, or it failed), after `took`.
    PhaseFinished {
        /// The phase that ended.
        phase: Phase,
        /// From its directive to its last answer or its failure.
        took: Duration,
    },
    /// The one final result. Nothing follows it for this operation.
    Finished(Box<OperationReport>),
    /// Automatic failover: the manager learned that a device's links changed (at `at` on its
    /// clock).
    Links {
        /// The report, as the node's proxy sent it.
        report: LinkReport,
        /// When the manager handled it (since it started).
        at: Duration,
    },
    /// Automatic failover: one decision of the policy. A move comes right before the
    /// `Started` of its operation, under the operation's id.
    Decision(AutoDecision),
}

impl ProgressEvent {
    /// The final report, if this is the last event of its operation.
    pub fn report(&self) -> Option<&OperationReport> {
        match &self.kind {
            ProgressKind::Finished(r) => Some(r),
            _ => None,
        }
    }
}

/// Where a manager publishes progress; clone it freely, subscribe from any thread.
#[derive(Clone, Debug)]
pub struct ProgressFeed {
    tx: broadcast::Sender<ProgressEvent>,
}

impl Default for ProgressFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressFeed {
    /// A feed nobody listens to yet; each subscriber gets its own buffer of
    /// [`PROGRESS_BUFFER`] events.
    pub fn new() -> Self {
        ProgressFeed {
            tx: broadcast::channel(PROGRESS_BUFFER).0,
        }
    }

    /// Every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ProgressEvent> {
        self.tx.subscribe()
    }

    pub(crate) fn publish(&self, op: OperationId, at: Duration, kind: ProgressKind) {
        // Nobody listening is fine.
        let _ = self.tx.send(ProgressEvent { op, at, kind });
    }

    /// An event of the automatic failover, of operation `op` when it started one.
    pub(crate) fn publish_auto(&self, op: Option<OperationId>, kind: ProgressKind) {
        self.publish(op.unwrap_or(NO_OPERATION), Duration::ZERO, kind);
    }
}
