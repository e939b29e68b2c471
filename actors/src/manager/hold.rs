//! No training held for ever: the manager's hold policy, its stop of training, and the
//! re-statement it runs by itself.
//!
//! A job that is not `running` after an operation (a failed rollback, a recovery that could
//! not re-state, a lost process) may hold training at every gate. The policy bounds that:
//!
//! - [`HoldPolicy::StopAfter`] (the default, [`DEFAULT_HOLD_BOUND`]): once the job has not
//!   run for the bound with nobody making it run, the manager stops training
//!   ([`StopTraining`]); the launcher restarts the processes and the job runs again on their
//!   default NICs.
//! - [`HoldPolicy::Hold`] (opt-in): the job waits for an operator, however long.
//!
//! Either way, while an operator is needed the manager says so at WARN with the command to
//! run. When a verification round finds exactly the interrupted operation's targets in
//! doubt, each group's views clean (a network cut during the switch), the manager re-states
//! them as-is by itself, once per hold, through a normal recovery
//! ([`taskd_core::JobLedger::restates_by_itself`]).

use super::Manager;
use crate::telemetry;
use actix::prelude::*;
use std::time::Duration;
use taskd_core::ledger::{RecoverTo, RecoveryStarted, StopBy};
use taskd_core::{JobState, OperationId, SubmitError};

/// The default bound on a hold: as long as an operation's default switch phase.
pub const DEFAULT_HOLD_BOUND: Duration = Duration::from_secs(300);

/// What a job that does not run leads to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HoldPolicy {
    /// Stop training once the job has not run for this long with nobody making it run.
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

/// The policy and the hold it watches.
#[derive(Default)]
pub(super) struct Hold {
    pub(super) policy: HoldPolicy,
    /// Since when (manager clock) the job has not run, while it does not.
    since: Option<Duration>,
    /// The wake-up at the bound.
    timer: Option<SpawnHandle>,
    /// Whether this hold's re-statement by itself was tried.
    restated: bool,
}

/// Stop training on every rank, for `reason` (one line): what an operator, the policy and
/// ClusterD's stop-train and kill signals ask. Resolves with the stop's id.
#[derive(Message)]
#[rtype(result = "Result<OperationId, SubmitError>")]
pub struct StopTraining {
    /// Why, one line: every training process logs it.
    pub reason: String,
    /// Who decided.
    pub by: StopBy,
}

impl Handler<StopTraining> for Manager {
    type Result = Result<OperationId, SubmitError>;

    fn handle(&mut self, m: StopTraining, ctx: &mut Self::Context) -> Self::Result {
        self.stop_training(m.by, m.reason, ctx)
    }
}

/// Sets what a job that does not run leads to (see [`HoldPolicy`]); a hold under way is
/// judged by the new policy from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetHoldPolicy(pub HoldPolicy);

impl Handler<SetHoldPolicy> for Manager {
    type Result = ();

    fn handle(&mut self, SetHoldPolicy(p): SetHoldPolicy, ctx: &mut Self::Context) {
        tracing::info!(policy = %p, "hold policy");
        self.hold.policy = p;
        self.ledger.set_hold_note(p.to_string());
        self.cancel_hold_timer(ctx);
        self.watch_hold(ctx);
    }
}

impl Manager {
    /// What a job that does not run leads to (default: [`HoldPolicy::StopAfter`]
    /// [`DEFAULT_HOLD_BOUND`]).
    pub fn with_hold_policy(mut self, policy: HoldPolicy) -> Self {
        self.hold.policy = policy;
        self.ledger.set_hold_note(policy.to_string());
        self
    }

    /// Stops training (see [`StopTraining`]): for an operator, the policy and ClusterD.
    pub(super) fn stop_training(
        &mut self,
        by: StopBy,
        reason: String,
        ctx: &mut Context<Self>,
    ) -> Result<OperationId, SubmitError> {
        let id = OperationId(uuid::Uuid::new_v4());
        let actions = self
            .ledger
            .stop_training(id, by, reason.clone(), self.now())?;
        tracing::error!(%id, by = by.as_str(), %reason, "stopping training on every rank: the launcher restarts the processes, which come back on their default NIC");
        metrics::counter!(telemetry::TRAINING_STOPS, "by" => by.as_str()).increment(1);
        self.cancel_hold_timer(ctx);
        self.run(actions, ctx);
        self.job_changed();
        Ok(id)
    }

    /// The job may have stopped or started running: follows the hold (see the module).
    pub(super) fn watch_hold(&mut self, ctx: &mut Context<Self>) {
        let l = &self.ledger;
        let held = l.state() != JobState::Running && l.training_stop().is_none();
        if !held {
            self.cancel_hold_timer(ctx);
            self.hold.since = None;
            self.hold.restated = false;
            return;
        }
        let now = self.now();
        let since = *self.hold.since.get_or_insert(now);
        if l.in_flight().is_some() || self.hold.timer.is_some() {
            return;
        }
        let HoldPolicy::StopAfter(bound) = self.hold.policy else {
            self.warn_operator_needed(None);
            return;
        };
        let left = (since + bound).saturating_sub(now);
        self.warn_operator_needed(Some(left));
        self.hold.timer = Some(ctx.run_later(left, |act, ctx| {
            act.hold.timer = None;
            act.hold_expired(ctx);
        }));
    }

    fn cancel_hold_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.hold.timer.take() {
            ctx.cancel_future(h);
        }
    }

    /// The bound passed: stops training unless the job runs again or an operation (a
    /// recovery) is under way, whose end looks again.
    fn hold_expired(&mut self, ctx: &mut Context<Self>) {
        let l = &self.ledger;
        if l.state() == JobState::Running || l.training_stop().is_some() || l.in_flight().is_some()
        {
            self.watch_hold(ctx);
            return;
        }
        let HoldPolicy::StopAfter(bound) = self.hold.policy else {
            return;
        };
        let cause = l.history().next_back().map_or_else(
            || "no operation".to_owned(),
            |r| match &r.error {
                Some(e) => format!("operation {}: {e}", r.id),
                None => format!("operation {}", r.id),
            },
        );
        let reason = format!(
            "the job was {} for {bound:?} with no operator's recovery (after {cause}); hold policy: {}",
            l.state(),
            self.hold.policy
        );
        if let Err(e) = self.stop_training(StopBy::Policy, reason, ctx) {
            tracing::warn!(error = %e, "the hold policy could not stop training; looking again");
            self.watch_hold(ctx);
        }
    }

    /// Says at WARN that an operator is needed, with the commands to run.
    fn warn_operator_needed(&self, left: Option<Duration>) {
        let job = self.ledger.job();
        let then = match left {
            Some(d) => format!("otherwise training stops by itself in {d:?}"),
            None => "the hold policy waits for an operator".to_owned(),
        };
        tracing::warn!(
            state = %self.ledger.state(),
            "training is held and needs an operator: run `taskd recover --job {job} --to as-is` (or primary/backup), or `taskd recover --job {job} --stop-training`; {then}"
        );
    }

    /// After a verification round: re-states by itself what a cut during a switch left
    /// (once per hold), then follows the hold.
    pub(super) fn after_verification(&mut self, ctx: &mut Context<Self>) {
        if !self.hold.restated && self.ledger.restates_by_itself() {
            self.hold.restated = true;
            let id = OperationId(uuid::Uuid::new_v4());
            let span = super::observer::recover_span(id, self.ledger.job(), RecoverTo::AsIs);
            let now = self.now();
            match span.in_scope(|| self.ledger.recover(RecoverTo::AsIs, id, now)) {
                Ok(RecoveryStarted::Operation { id, actions }) => {
                    span.in_scope(|| tracing::warn!(%id, "the interrupted operation's targets disagree, each group cleanly on one side: re-stating them as-is by itself"));
                    let _durable = self.operation_started(id, span, actions, ctx);
                }
                Ok(RecoveryStarted::Verification { actions, .. }) => self.run(actions, ctx),
                Err(e) => span.in_scope(
                    || tracing::warn!(error = %e, "the re-statement by itself was refused"),
                ),
            }
        }
        self.watch_hold(ctx);
    }
}
