//! Stopping training, and the job-wide restart built on it: the way out of a hold that nothing
//! else ends, and of a lost process.
//!
//! The manager tells every rank to stop training ([`DirectiveKind::StopTraining`]): a rank
//! held at its gate, or arriving there, gets a stop instead of a resume, its training loop
//! ends and its process exits with a failure. Nothing else is touched (no NIC call). The stop
//! also says what the launchers do next ([`AfterStop`]): with process recovery on
//! ([`JobLedger::set_process_recovery`]) every node's launcher (taskd's agent) starts all its
//! workers again, once, together, as restart `n` of the job; without it the launcher does what
//! it does by itself. Each new process registers on its default NIC under a new
//! [`Instance`]. Once every rank is back, a verification round rebuilds the NIC table from the
//! new processes' reports (forgetting the old one) and the job is `running` again when every
//! group agrees.
//!
//! **Only a new process counts as back.** The stop records the instance every rank had
//! (registered, or last seen before it was lost); those instances are *retired*. A rank is
//! back when a process of another instance registers. A retired instance that registers
//! again (a node cut off during the stop, whose old processes trained on) is not counted: the
//! stop is sent to it again, for it alone ([`DirectiveKind::StopTraining`]'s `only`), with the
//! same [`AfterStop`], so its launcher restarts it too.
//!
//! While it lasts the stop is [`StopPhase::Stopping`] (old processes have neither confirmed it
//! nor died) then [`StopPhase::Restarting`] (ranks whose new process has not registered yet);
//! no switch, recovery or verification runs meanwhile. It has a bound
//! ([`JobLedger::stop_deadline`]): past it, the stop is overdue, and says which ranks it still
//! waits for and why (unreachable, old process back, not restarted yet).

use super::{JobLedger, SubmitError};
use crate::display::short_list;
use crate::ids::{GlobalRank, Instance, OperationId};
use crate::operation::{Action, JobState};
use crate::protocol::{AfterStop, Directive, DirectiveKind, Gone, NodeReply, Phase, ReplyBody};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// The default bound on a stop: long enough for a large job's processes to start again
/// (framework start-up, checkpoint load), short enough that a stuck stop is named the same
/// day.
pub const DEFAULT_STOP_BOUND: Duration = Duration::from_secs(600);

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
    /// A rank's process died and process recovery restarts the whole job.
    Fault,
}

impl StopBy {
    /// The name in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            StopBy::Operator => "operator",
            StopBy::Policy => "policy",
            StopBy::Clusterd => "clusterd",
            StopBy::Fault => "fault",
        }
    }
}

/// Where a stop of training stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopPhase {
    /// The last-words checkpoint is being taken; the stop goes out once it answered.
    LastWords,
    /// Old processes have neither confirmed the stop nor died.
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
            StopPhase::LastWords => "last_words",
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
    /// What the launchers do once the processes stopped.
    #[serde(default)]
    pub then: AfterStop,
    /// Ranks whose old process has neither confirmed the stop nor died.
    pub stopping: BTreeSet<GlobalRank>,
    /// Ranks whose new process has not registered yet.
    pub not_back: BTreeSet<GlobalRank>,
    /// Ranks whose old process showed up again after the stop (and was sent it again), until
    /// a new process of the rank registers.
    #[serde(default)]
    pub old_back: BTreeSet<GlobalRank>,
    /// Ranks among `stopping` and `not_back` whose proxy cannot be reached now.
    #[serde(default)]
    pub unreachable: BTreeSet<GlobalRank>,
    /// When it was sent, on the manager's clock.
    pub at: Duration,
    /// Whether it passed its bound without every rank back.
    #[serde(default)]
    pub overdue: bool,
    /// The last step any rank had finished when it stopped (from the ranks' answers).
    #[serde(default)]
    pub trained_to: Option<u64>,
    /// The last-words checkpoint taken before the stop, when the manager has a host for one
    /// (MindIO's dump): `None` without such a host or until it answered.
    #[serde(default)]
    pub last_words: Option<LastWords>,
    /// The ranks whose process had died when the stop began (what the last-words host is
    /// told: they cannot save).
    #[serde(default)]
    pub dead: BTreeSet<GlobalRank>,
    /// The stop's directive while the last-words checkpoint is taken (it goes out after).
    #[serde(skip)]
    held_back: Option<Directive>,
}

/// What the last-words checkpoint before a stop came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastWords {
    /// Whether a checkpoint was taken.
    pub taken: bool,
    /// What the host said, one line (why not, when not).
    pub detail: String,
}

impl TrainingStop {
    /// Where training resumes and what was lost, in one line, once the ranks answered: with
    /// a last-words checkpoint, after the last step any rank finished (the checkpoint is of
    /// that step), nothing lost; without one, from the job's last periodic checkpoint.
    pub fn resume_note(&self) -> Option<String> {
        let lw = self.last_words.as_ref()?;
        Some(match (lw.taken, self.trained_to) {
            (true, Some(step)) => format!(
                "last-words checkpoint taken ({}); training resumes after step {step}, the last step any rank finished: no step lost",
                lw.detail
            ),
            (true, None) => format!("last-words checkpoint taken ({})", lw.detail),
            (false, Some(step)) => format!(
                "no last-words checkpoint ({}); training resumes from the job's last periodic checkpoint: the steps after it, up to step {step}, are lost",
                lw.detail
            ),
            (false, None) => format!(
                "no last-words checkpoint ({}); training resumes from the job's last periodic checkpoint",
                lw.detail
            ),
        })
    }
}

impl TrainingStop {
    /// Where it stands.
    pub fn phase(&self) -> StopPhase {
        if self.held_back.is_some() {
            StopPhase::LastWords
        } else if !self.stopping.is_empty() {
            StopPhase::Stopping
        } else if !self.not_back.is_empty() {
            StopPhase::Restarting
        } else {
            StopPhase::Restarted
        }
    }

    /// What it waits for, in one line, with why for each group of ranks: unreachable (their
    /// node's proxy is not connected), an old process back, or not confirmed / not restarted
    /// yet.
    pub fn waiting_for(&self) -> String {
        let phase = self.phase();
        match phase {
            StopPhase::Restarted => return "every rank is back".to_owned(),
            StopPhase::LastWords => {
                return "the last-words checkpoint is being taken; the stop goes out once it is"
                    .to_owned()
            }
            _ => {}
        }
        let waiting = match phase {
            StopPhase::Stopping => &self.stopping,
            _ => &self.not_back,
        };
        let unreachable: Vec<_> = waiting.intersection(&self.unreachable).collect();
        let old: Vec<_> = waiting
            .intersection(&self.old_back)
            .filter(|r| !self.unreachable.contains(r))
            .collect();
        let rest: Vec<_> = waiting
            .iter()
            .filter(|r| !self.unreachable.contains(r) && !self.old_back.contains(r))
            .collect();
        let mut parts = Vec::new();
        if !unreachable.is_empty() {
            parts.push(format!(
                "ranks {} are unreachable (their node's proxy is not connected)",
                short_list(unreachable)
            ));
        }
        if !old.is_empty() {
            parts.push(format!(
                "ranks {} are old processes that came back and were told to stop again",
                short_list(old)
            ));
        }
        if !rest.is_empty() {
            parts.push(match phase {
                StopPhase::Stopping => {
                    format!("ranks {} have not stopped yet", short_list(rest))
                }
                _ => format!(
                    "ranks {} are not back yet ({})",
                    short_list(rest),
                    self.then.describe()
                ),
            });
        }
        parts.join("; ")
    }
}

impl fmt::Display for TrainingStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "training stopped by {} ({}{}): {}; {}",
            self.by.as_str(),
            self.phase().as_str(),
            if self.overdue { ", overdue" } else { "" },
            self.reason,
            self.waiting_for()
        )
    }
}

/// Process recovery coordinated by the manager: a lost process restarts the whole job, once,
/// together, at most `max_restarts` times.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecovery {
    /// How many restarts the job may have in all.
    pub max_restarts: u32,
}

/// A job-wide restart owed for a fault, until it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OwedRestart {
    /// What happened, one line.
    pub(super) cause: String,
    /// When, on the manager's clock.
    pub(super) at: Duration,
}

/// The restarts of the job so far, and the fault that led to the one under way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    /// Restarts begun so far (the one under way included).
    pub done: u32,
    /// The budget, with process recovery on.
    pub max: Option<u32>,
    /// The fault behind the last restart and when it happened (manager clock).
    pub cause: Option<(String, Duration)>,
}

impl JobLedger {
    /// Turns process recovery coordinated by the manager on (`Some`) or off: with it, a rank
    /// whose process died stops training on every rank and every node's launcher restarts
    /// all its workers together ([`AfterStop::Restart`]), at most `max_restarts` times in
    /// all, then ends the job ([`AfterStop::End`]); every stop of training is such a restart.
    pub fn set_process_recovery(&mut self, recovery: Option<ProcessRecovery>) {
        self.recovery = recovery;
        self.restarts.max = recovery.map(|r| r.max_restarts);
    }

    /// The job's restarts so far.
    pub fn restarts(&self) -> &Restarts {
        &self.restarts
    }

    /// Bounds every stop of training (default [`DEFAULT_STOP_BOUND`]).
    pub fn set_stop_bound(&mut self, bound: Duration) {
        self.stop_bound = bound;
    }

    /// What the launchers do after the next stop: with process recovery, one more restart of
    /// the job or, with none left, its end.
    fn next_after_stop(&self) -> AfterStop {
        match self.recovery {
            None => AfterStop::Launcher,
            Some(r) if self.restarts.done >= r.max_restarts => AfterStop::End,
            Some(_) => AfterStop::Restart {
                number: self.restarts.done + 1,
            },
        }
    }

    /// Stops training on every rank, for `reason` (one line), under `id`: the directive to
    /// broadcast. Refused while an operation runs (its own deadlines end it first) and while
    /// a stop is under way (unless it is overdue: a new stop then replaces it); a
    /// verification round in flight is dropped (it changes nothing).
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
        // An overdue stop, or one a new fault superseded, is replaced.
        if !self.stop.as_ref().is_some_and(|s| s.overdue) && self.owed_restart.is_none() {
            self.refuse_while_stopped()?;
        }
        let then = self.next_after_stop();
        if let AfterStop::Restart { number } = then {
            self.restarts.done = number;
            let cause = self.owed_restart.take().map_or_else(
                || (format!("stopped by {}: {reason}", by.as_str()), now),
                |o| (o.cause, o.at),
            );
            self.restarts.cause = Some(cause);
        }
        self.owed_restart = None;
        self.stalled.clear();
        // Not operating: at most a verification round runs, dropped (it changes nothing).
        self.activity = super::Activity::Idle;
        // The processes this stop ends: every registered one, and the last one seen of each
        // rank that is lost now (an unreachable one may train on).
        for (rank, w) in &self.workers {
            self.retired.insert(*rank, w.instance);
        }
        for (rank, l) in &self.lost {
            if l.instance.is_known() {
                self.retired.insert(*rank, l.instance);
            }
        }
        let unreachable: BTreeSet<GlobalRank> = self
            .lost
            .iter()
            .filter(|(_, l)| l.how == Gone::Unreachable)
            .map(|(r, _)| *r)
            .collect();
        let stopping = self.workers.keys().chain(&unreachable).copied().collect();
        let dead = self
            .lost
            .iter()
            .filter(|(_, l)| l.how == Gone::Died)
            .map(|(r, _)| *r)
            .collect();
        let d = Directive {
            op: id,
            kind: DirectiveKind::StopTraining {
                reason: reason.clone(),
                then,
                only: Vec::new(),
            },
        };
        let (held_back, actions) = if self.last_words_host {
            (Some(d), Vec::new())
        } else {
            (None, vec![Action::Broadcast(d)])
        };
        self.stop = Some(TrainingStop {
            id,
            by,
            reason: reason.clone(),
            then,
            stopping,
            not_back: self.table.all_ranks().collect(),
            old_back: BTreeSet::new(),
            unreachable,
            at: now,
            overdue: false,
            trained_to: None,
            last_words: None,
            dead,
            held_back,
        });
        self.state = JobState::NeedsRecovery;
        self.hold.reset();
        self.nics.doubt();
        Ok(actions)
    }

    /// Takes a last-words checkpoint before every stop of training from now on
    /// ([`StopPhase::LastWords`]): the stop's directive waits for
    /// [`JobLedger::last_words_taken`].
    pub fn set_last_words_host(&mut self, on: bool) {
        self.last_words_host = on;
    }

    /// The last-words checkpoint before the stop under way came to `outcome`: the stop goes
    /// out now (the actions). Nothing when no stop waits for one.
    pub fn last_words_taken(&mut self, outcome: LastWords) -> Vec<Action> {
        let Some(s) = self.stop.as_mut() else {
            return Vec::new();
        };
        let Some(d) = s.held_back.take() else {
            return Vec::new();
        };
        s.last_words = Some(outcome);
        vec![Action::Broadcast(d)]
    }

    /// The stop under way, if any.
    pub fn training_stop(&self) -> Option<&TrainingStop> {
        self.stop.as_ref()
    }

    /// The last stop that ended (every rank came back), if any.
    pub fn last_training_stop(&self) -> Option<&TrainingStop> {
        self.last_stop.as_ref()
    }

    /// When the stop under way passes its bound (manager clock), unless it already has.
    pub fn stop_deadline(&self) -> Option<Duration> {
        self.stop
            .as_ref()
            .filter(|s| !s.overdue && s.phase() != StopPhase::Restarted)
            .map(|s| s.at + self.stop_bound)
    }

    /// The stop's bound passed at `now`: marks it overdue and returns what it still waits
    /// for, for the manager to say at ERROR; `None` when nothing is overdue. An overdue stop
    /// goes on (every rank that comes back still counts), and a new stop may replace it.
    pub fn stop_overdue(&mut self, now: Duration) -> Option<String> {
        let due = self.stop_deadline().filter(|d| *d <= now)?;
        let s = self.stop.as_mut()?;
        s.overdue = true;
        Some(format!(
            "the stop of training {} has not ended {:?} after it was sent: {}",
            s.id,
            now.saturating_sub(due) + self.stop_bound,
            s.waiting_for()
        ))
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
            if r.op != s.id || r.phase != Phase::Stop {
                continue;
            }
            if let ReplyBody::Stopped { at_step } = r.body {
                s.stopping.remove(&r.rank);
                s.trained_to = s.trained_to.max(at_step);
            }
        }
    }

    /// A rank's process is out of sight: `how` decides whether that ends its part of the
    /// stop (it died or ended) or leaves it waiting (unreachable: it may train on).
    pub(super) fn stop_lost(&mut self, rank: GlobalRank, how: Gone) {
        if let Some(s) = self.stop.as_mut() {
            if how == Gone::Unreachable {
                if s.stopping.contains(&rank) || s.not_back.contains(&rank) {
                    s.unreachable.insert(rank);
                }
            } else {
                s.stopping.remove(&rank);
                s.unreachable.remove(&rank);
            }
        }
    }

    /// Whether `instance` of `rank` is a process a stop ended (it must not count as back).
    pub(super) fn is_retired(&self, rank: GlobalRank, instance: Instance) -> bool {
        instance.is_known() && self.retired.get(&rank) == Some(&instance)
    }

    /// A retired process of `rank` registered again: the stop goes to it again, alone.
    pub(super) fn stop_old_back(&mut self, rank: GlobalRank, instance: Instance) -> Vec<Action> {
        let Some(s) = self.stop.as_mut() else {
            // Its stop ended without it (every rank came back as new processes): stop it
            // all the same, as the last stop said.
            let Some(last) = self.last_stop.as_ref() else {
                return Vec::new();
            };
            return vec![resend(last, instance)];
        };
        s.old_back.insert(rank);
        s.unreachable.remove(&rank);
        vec![resend(s, instance)]
    }

    /// A rank registered a process that no stop retired.
    pub(super) fn stop_registered(&mut self, rank: GlobalRank) {
        if let Some(s) = self.stop.as_mut() {
            s.stopping.remove(&rank);
            s.not_back.remove(&rank);
            s.old_back.remove(&rank);
            s.unreachable.remove(&rank);
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

    /// A process no stop ended died (`cause`, at `now`): with process recovery, a restart of
    /// the job is owed, unless one is owed already. During a restart that is a process of the
    /// new incarnation failing: the restart under way is superseded by the next.
    pub(super) fn owe_restart(&mut self, cause: String, now: Duration) {
        if self.recovery.is_none() || self.owed_restart.is_some() {
            return;
        }
        self.owed_restart = Some(OwedRestart { cause, at: now });
    }

    /// Whether a job-wide restart is owed and can start now (nothing runs): the manager then
    /// calls [`JobLedger::restart_job`].
    pub fn restart_due(&self) -> bool {
        self.owed_restart.is_some() && self.activity.operation().is_none()
    }

    /// The fault a job-wide restart is owed for, while it is.
    pub fn restart_owed(&self) -> Option<&str> {
        self.owed_restart.as_ref().map(|o| o.cause.as_str())
    }

    /// Starts the restart owed ([`JobLedger::restart_due`]) under `id`: a stop of training
    /// by [`StopBy::Fault`] whose launchers restart every worker (or end the job when the
    /// budget is spent).
    ///
    /// # Errors
    /// As [`JobLedger::stop_training`]; nothing is owed: [`SubmitError::NothingToRecover`].
    pub fn restart_job(
        &mut self,
        id: OperationId,
        now: Duration,
    ) -> Result<Vec<Action>, SubmitError> {
        let Some(owed) = self.owed_restart.clone() else {
            return Err(SubmitError::NothingToRecover { state: self.state });
        };
        let reason = match self.next_after_stop() {
            AfterStop::End => format!(
                "{}; no restart left ({} done): the job ends",
                owed.cause, self.restarts.done
            ),
            _ => format!("{}; restarting every rank's process", owed.cause),
        };
        self.stop_training(id, StopBy::Fault, reason, now)
    }
}

/// The stop `s`, sent again to the old process `instance` alone.
fn resend(s: &TrainingStop, instance: Instance) -> Action {
    Action::Broadcast(Directive {
        op: s.id,
        kind: DirectiveKind::StopTraining {
            reason: s.reason.clone(),
            then: s.then,
            only: vec![instance],
        },
    })
}

/// The instance each rank's stopped process had, for [`JobLedger`]'s book.
pub(super) type Retired = BTreeMap<GlobalRank, Instance>;

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
