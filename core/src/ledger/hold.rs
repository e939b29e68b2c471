//! No training held for ever: the hold bound, a rule of the ledger.
//!
//! A job whose gates may hold training with nothing under way to release them (a failed
//! rollback left it `paused`, a process died, an operation lost a rank) is *held*. The policy
//! bounds that: [`HoldPolicy::StopAfter`] (the default, [`DEFAULT_HOLD_BOUND`]) stops training
//! once the job has been held for the bound with nobody making it run
//! ([`JobLedger::hold_expired`]); [`HoldPolicy::Hold`] waits for an operator, however long.
//!
//! What is not a hold, so starts no bound: a job `degraded` because a node's proxy cannot be
//! reached while no operation ran (nothing holds its ranks; they train on), ranks that ended
//! cleanly, a stop of training under way (it has a bound of its own,
//! [`JobLedger::stop_deadline`]) and a job-wide restart owed ([`JobLedger::restart_due`]).
//! The bound counts while a recovery runs, but only expires once nothing runs.

use super::JobLedger;
use crate::operation::JobState;
use std::time::Duration;

/// The default bound on a hold: as long as an operation's default switch phase.
pub const DEFAULT_HOLD_BOUND: Duration = Duration::from_secs(300);

/// What a held job leads to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HoldPolicy {
    /// Stop training once the job has been held this long with nobody making it run.
    StopAfter(Duration),
    /// Hold until an operator acts.
    Hold,
}

impl Default for HoldPolicy {
    fn default() -> Self {
        HoldPolicy::StopAfter(DEFAULT_HOLD_BOUND)
    }
}

impl std::fmt::Display for HoldPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldPolicy::StopAfter(d) => write!(f, "stop training after {d:?} held"),
            HoldPolicy::Hold => f.write_str("hold until an operator acts"),
        }
    }
}

/// The hold the ledger follows.
#[derive(Clone, Debug, Default)]
pub(super) struct Hold {
    pub(super) policy: HoldPolicy,
    /// Since when (manager clock) the job is held, while it is.
    since: Option<Duration>,
    /// Whether this hold's re-statement by itself was tried.
    restated: bool,
}

impl Hold {
    /// The hold is over (the job runs, or a stop took over).
    pub(super) fn reset(&mut self) {
        self.since = None;
        self.restated = false;
    }
}

/// What changed in the hold, for the manager to say.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HoldNews {
    /// The job became held: an operator is needed; with a bound, training stops by itself
    /// after `left`.
    Began {
        /// Time left before the policy stops training (`None`: it waits for an operator).
        left: Option<Duration>,
    },
    /// The job is no longer held.
    Ended,
}

impl JobLedger {
    /// Sets what a held job leads to; a hold under way is judged by the new policy from now
    /// on. The reports of operations that leave the job not running say it.
    pub fn set_hold_policy(&mut self, policy: HoldPolicy) {
        self.hold.policy = policy;
        self.hold_note = Some(policy.to_string());
    }

    /// What a held job leads to.
    pub fn hold_policy(&self) -> HoldPolicy {
        self.hold.policy
    }

    /// Whether the job is held: its gates may hold training and nothing under way will
    /// release them (see the module).
    pub fn is_held(&self) -> bool {
        matches!(self.state, JobState::Paused | JobState::NeedsRecovery)
            && self.stop.is_none()
            && self.owed_restart.is_none()
    }

    /// Since when (manager clock) the job is held, while it is.
    pub fn held_since(&self) -> Option<Duration> {
        self.hold.since
    }

    /// Follows the hold after anything that may have changed it (call after every event the
    /// ledger took): whether it began or ended now.
    pub fn follow_hold(&mut self, now: Duration) -> Option<HoldNews> {
        match (self.is_held(), self.hold.since) {
            (true, None) => {
                self.hold.since = Some(now);
                let left = match self.hold.policy {
                    HoldPolicy::StopAfter(bound) => Some(bound),
                    HoldPolicy::Hold => None,
                };
                Some(HoldNews::Began { left })
            }
            (true, Some(_)) => None,
            (false, since) => {
                self.hold.reset();
                since.map(|_| HoldNews::Ended)
            }
        }
    }

    /// When the hold bound passes (manager clock): while the job is held under
    /// [`HoldPolicy::StopAfter`] and no operation runs (a recovery in flight is waited for).
    pub fn hold_deadline(&self) -> Option<Duration> {
        let since = self.hold.since.filter(|_| self.is_held())?;
        match self.hold.policy {
            HoldPolicy::StopAfter(bound) if self.activity.operation().is_none() => {
                Some(since + bound)
            }
            _ => None,
        }
    }

    /// The bound passed at `now`: the reason to stop training with (one line), or `None`
    /// while it has not (the job runs again, an operation runs, the policy changed).
    pub fn hold_expired(&self, now: Duration) -> Option<String> {
        self.hold_deadline().filter(|d| *d <= now)?;
        let HoldPolicy::StopAfter(bound) = self.hold.policy else {
            return None;
        };
        let cause = self.history().next_back().map_or_else(
            || "no operation".to_owned(),
            |r| match &r.error {
                Some(e) => format!("operation {}: {e}", r.id),
                None => format!("operation {}", r.id),
            },
        );
        Some(format!(
            "the job was {} for {bound:?} with no operator's recovery (after {cause}); hold policy: {}",
            self.state, self.hold.policy
        ))
    }

    /// Whether to re-state, by itself and once per hold, what a cut during a switch left
    /// ([`JobLedger::restates_by_itself`]); marks it tried.
    pub fn take_restatement(&mut self) -> bool {
        if self.hold.restated || !self.restates_by_itself() {
            return false;
        }
        self.hold.restated = true;
        true
    }
}
