//! Stopping training: the way out of a hold that nothing else ends.
//!
//! The manager tells every rank to stop training ([`DirectiveKind::StopTraining`]): a rank
//! held at its gate, or arriving there, gets a stop instead of a resume, its training loop
//! ends and its process exits with a failure. Nothing else is touched (no NIC call). The
//! launcher restarts the processes (MindCluster's process-level recovery, torchrun's
//! `--max-restarts`, taskd's agent under msrun, ...): each new incarnation registers on its
//! default NIC. Once every rank's old process has gone and a new one has registered, a
//! verification round rebuilds the NIC table from the new processes' reports (forgetting the
//! old one) and the job is `running` again when every group agrees.
//!
//! While it lasts the stop is [`StopPhase::Stopping`] (ranks have neither confirmed it nor
//! gone) then [`StopPhase::Restarting`] (ranks whose new process has not registered yet); no
//! switch, recovery or verification runs meanwhile.

use super::{JobLedger, SubmitError};
use crate::display::short_list;
use crate::ids::{GlobalRank, OperationId};
use crate::operation::{Action, JobState};
use crate::protocol::{Directive, DirectiveKind, NodeReply, Phase, ReplyBody};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

/// Who stopped training.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopBy {
    /// An operator (`taskd recover --stop-training`, the control API).
    Operator,
    /// The manager's hold policy: the job was held past its bound with nobody acting.
    Policy,
    /// ClusterD (its stop-train or kill signal), when the manager is its client.
    Clusterd,
}

impl StopBy {
    /// The name in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            StopBy::Operator => "operator",
            StopBy::Policy => "policy",
            StopBy::Clusterd => "clusterd",
        }
    }
}

/// Where a stop of training stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopPhase {
    /// Ranks have neither confirmed the stop nor gone.
    Stopping,
    /// Every old process stopped; ranks whose new process has not registered yet.
    Restarting,
    /// Every rank is back as a new process (the verification round judges them).
    Restarted,
}

impl StopPhase {
    /// The name in logs, `taskd status` and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            StopPhase::Stopping => "stopping",
            StopPhase::Restarting => "restarting",
            StopPhase::Restarted => "restarted",
        }
    }
}

/// Training stopped by the manager, from the stop until every rank is back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingStop {
    /// The stop's id (its directive's operation id).
    pub id: OperationId,
    /// Who decided.
    pub by: StopBy,
    /// Why, one line (what every training process logs).
    pub reason: String,
    /// Ranks whose old process has neither confirmed the stop nor gone.
    pub stopping: BTreeSet<GlobalRank>,
    /// Ranks whose old process has gone.
    pub gone: BTreeSet<GlobalRank>,
    /// Ranks whose new process has not registered yet.
    pub not_back: BTreeSet<GlobalRank>,
    /// When it was sent, on the manager's clock.
    pub at: Duration,
}

impl TrainingStop {
    /// Where it stands.
    pub fn phase(&self) -> StopPhase {
        if !self.stopping.is_empty() {
            StopPhase::Stopping
        } else if !self.not_back.is_empty() {
            StopPhase::Restarting
        } else {
            StopPhase::Restarted
        }
    }

    /// What it waits for, in one line.
    pub fn waiting_for(&self) -> String {
        match self.phase() {
            StopPhase::Stopping => format!(
                "ranks {} have not stopped yet",
                short_list(self.stopping.iter())
            ),
            StopPhase::Restarting => format!(
                "ranks {} are not back yet (the launcher restarts their processes)",
                short_list(self.not_back.iter())
            ),
            StopPhase::Restarted => "every rank is back".to_owned(),
        }
    }
}

impl fmt::Display for TrainingStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "training stopped by {} ({}): {}; {}",
            self.by.as_str(),
            self.phase().as_str(),
            self.reason,
            self.waiting_for()
        )
    }
}

impl JobLedger {
    /// Stops training on every rank, for `reason` (one line), under `id`: the directive to
    /// broadcast. Refused while an operation runs (its own deadlines end it first) and while
    /// a stop is under way; a verification round in flight is dropped (it changes nothing).
    ///
    /// # Errors
    /// [`SubmitError::Busy`], [`SubmitError::TrainingStopped`].
    pub fn stop_training(
        &mut self,
        id: OperationId,
        by: StopBy,
        reason: String,
        now: Duration,
    ) -> Result<Vec<Action>, SubmitError> {
        if let Some(op) = self.activity.operation() {
            return Err(SubmitError::Busy { in_flight: op.id() });
        }
        self.refuse_while_stopped()?;
        // Not operating: at most a verification round runs, dropped (it changes nothing).
        self.activity = super::Activity::Idle;
        self.stop = Some(TrainingStop {
            id,
            by,
            reason: reason.clone(),
            stopping: self.workers.keys().copied().collect(),
            gone: self
                .table
                .all_ranks()
                .filter(|r| !self.workers.contains_key(r))
                .collect(),
            not_back: self.table.all_ranks().collect(),
            at: now,
        });
        self.state = JobState::NeedsRecovery;
        self.nics.doubt();
        let d = Directive {
            op: id,
            kind: DirectiveKind::StopTraining { reason },
        };
        Ok(vec![Action::Broadcast(d)])
    }

    /// The stop under way, if any.
    pub fn training_stop(&self) -> Option<&TrainingStop> {
        self.stop.as_ref()
    }

    /// The last stop that ended (every rank came back), if any.
    pub fn last_training_stop(&self) -> Option<&TrainingStop> {
        self.last_stop.as_ref()
    }

    /// Refuses what cannot run while training is stopped and the processes restart.
    pub(super) fn refuse_while_stopped(&self) -> Result<(), SubmitError> {
        match &self.stop {
            Some(s) => Err(SubmitError::TrainingStopped {
                reason: s.reason.clone(),
                waiting: s.waiting_for(),
            }),
            None => Ok(()),
        }
    }

    /// A stop's confirmations.
    pub(super) fn stop_replies(&mut self, nr: &NodeReply) {
        let Some(s) = self.stop.as_mut() else {
            return;
        };
        for r in &nr.replies {
            if r.op == s.id && r.phase == Phase::Stop && r.body == ReplyBody::Stopped {
                s.stopping.remove(&r.rank);
            }
        }
    }

    /// A rank's old process has gone.
    pub(super) fn stop_lost(&mut self, rank: GlobalRank) {
        if let Some(s) = self.stop.as_mut() {
            s.stopping.remove(&rank);
            s.gone.insert(rank);
        }
    }

    /// A rank registered: a new process, once its old one has gone.
    pub(super) fn stop_registered(&mut self, rank: GlobalRank) {
        if let Some(s) = self.stop.as_mut() {
            if s.gone.contains(&rank) {
                s.not_back.remove(&rank);
            }
        }
    }

    /// Whether a stop still keeps the verification round from running.
    pub(super) fn stop_blocks_verification(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.phase() != StopPhase::Restarted)
    }

    /// A verification round of the new processes ended: the stop is over. What the old
    /// processes left (calls never answered) went with them.
    pub(super) fn stop_verified(&mut self) {
        if self.stop.as_ref().map(TrainingStop::phase) == Some(StopPhase::Restarted) {
            self.last_stop = self.stop.take();
            self.in_calls = None;
        }
    }
}

impl JobLedger {
    /// Whether a round's disagreement is one the manager re-states by itself (as-is, through
    /// a normal recovery): exactly the targets of the operation that left the job this way,
    /// each group's views clean (no failed call leaving a group's operators split, no rank on
    /// two sides, every member reporting), and no rank still inside that operation's calls.
    /// A network cut during the switch phase leaves this: one node switched, one not.
    pub fn restates_by_itself(&self) -> bool {
        let (Some(a), Some(last)) = (self.nics.assessment(), self.uuids.last_finished()) else {
            return false;
        };
        if last.job_state == JobState::Running || self.in_calls.is_some() || a.consistent() {
            return false;
        }
        let targets: BTreeSet<GlobalRank> = last.targets.iter().map(|t| t.rank).collect();
        let in_doubt = a.ranks_in_doubt();
        a.disagreements
            .iter()
            .all(|d| d.kind == crate::verify::DisagreementKind::Views)
            && !in_doubt.is_empty()
            && in_doubt.is_subset(&targets)
    }
}
