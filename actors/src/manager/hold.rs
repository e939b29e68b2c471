//! The manager's side of the ledger's bounds: the hold bound (no training held for ever), the
//! bound on a stop of training, the job-wide restart after a lost process, and the
//! re-statement it runs by itself.
//!
//! The rules are the ledger's (`core/src/ledger/hold.rs`, `core/src/ledger/stop.rs`): when a
//! job is held, when its bound passes, when a stop is overdue, when a restart is owed. This
//! module arms one timer per bound at the instant the ledger names, says what happens at
//! WARN or ERROR with the command an operator would run, and carries out what the ledger
//! decides (a stop of training, a restart).

use super::Manager;
use crate::telemetry;
use actix::prelude::*;
use std::time::Duration;
use taskd_core::ledger::{HoldNews, RecoverTo, RecoveryStarted, StopBy, StopPhase};
use taskd_core::protocol::AfterStop;
use taskd_core::{JobState, OperationId, SubmitError};

pub use taskd_core::ledger::{HoldPolicy, DEFAULT_HOLD_BOUND};

/// The manager's timers for the ledger's bounds.
#[derive(Default)]
pub(super) struct Bounds {
    /// The wake-up at the hold bound.
    hold: Option<SpawnHandle>,
    /// The wake-up at the stop's bound.
    stop: Option<SpawnHandle>,
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

/// Sets what a held job leads to (see [`HoldPolicy`]); a hold under way is judged by the new
/// policy from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetHoldPolicy(pub HoldPolicy);

impl Handler<SetHoldPolicy> for Manager {
    type Result = ();

    fn handle(&mut self, SetHoldPolicy(p): SetHoldPolicy, ctx: &mut Self::Context) {
        tracing::info!(policy = %p, "hold policy");
        self.ledger.set_hold_policy(p);
        self.follow_bounds(ctx);
    }
}

impl Manager {
    /// What a held job leads to (default: [`HoldPolicy::StopAfter`] [`DEFAULT_HOLD_BOUND`]).
    pub fn with_hold_policy(mut self, policy: HoldPolicy) -> Self {
        self.ledger.set_hold_policy(policy);
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
        let then = self
            .ledger
            .training_stop()
            .map_or(AfterStop::Launcher, |s| s.then);
        tracing::error!(%id, by = by.as_str(), %reason, then = %then.describe(), "stopping training on every rank; the new processes come back on their default NIC");
        metrics::counter!(telemetry::TRAINING_STOPS, "by" => by.as_str()).increment(1);
        if let AfterStop::Restart { .. } = then {
            metrics::counter!(telemetry::JOB_RESTARTS).increment(1);
        }
        self.run(actions, ctx);
        self.job_changed();
        self.follow_bounds(ctx);
        Ok(id)
    }

    /// Starts the job-wide restart the ledger owes for a lost process, once nothing runs.
    pub(super) fn maybe_restart(&mut self, ctx: &mut Context<Self>) {
        if !self.ledger.restart_due() {
            return;
        }
        let id = OperationId(uuid::Uuid::new_v4());
        match self.ledger.restart_job(id, self.now()) {
            Ok(actions) => {
                let stop = self.ledger.training_stop();
                let (reason, then) = stop.map_or_else(
                    || (String::new(), AfterStop::Launcher),
                    |s| (s.reason.clone(), s.then),
                );
                tracing::error!(%id, %reason, then = %then.describe(), "a fault ended training (a process died or hung): stopping training on every rank");
                metrics::counter!(telemetry::TRAINING_STOPS, "by" => StopBy::Fault.as_str())
                    .increment(1);
                if let AfterStop::Restart { .. } = then {
                    metrics::counter!(telemetry::JOB_RESTARTS).increment(1);
                }
                self.run(actions, ctx);
                self.job_changed();
            }
            Err(e) => tracing::warn!(error = %e, "the job-wide restart could not start yet"),
        }
    }

    /// After anything that may change the job's holds and stops: starts a restart owed,
    /// follows the hold (says when it begins and ends) and re-arms both bounds' timers.
    pub(super) fn follow_bounds(&mut self, ctx: &mut Context<Self>) {
        self.maybe_restart(ctx);
        self.take_last_words(ctx);
        match self.ledger.follow_hold(self.now()) {
            Some(HoldNews::Began { left }) => self.warn_operator_needed(left),
            Some(HoldNews::Ended) if self.ledger.state() == JobState::Running => {
                tracing::info!("training runs again: the job is no longer held");
            }
            _ => {}
        }
        self.arm_hold(ctx);
        self.arm_stop_bound(ctx);
    }

    fn arm_hold(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.bounds.hold.take() {
            ctx.cancel_future(h);
        }
        let Some(at) = self.ledger.hold_deadline() else {
            return;
        };
        let after = at.saturating_sub(self.now());
        self.bounds.hold = Some(ctx.run_later(after, |act, ctx| {
            act.bounds.hold = None;
            act.hold_expired(ctx);
        }));
    }

    /// The hold bound passed: stops training, as the ledger says.
    fn hold_expired(&mut self, ctx: &mut Context<Self>) {
        match self.ledger.hold_expired(self.now()) {
            Some(reason) => {
                if let Err(e) = self.stop_training(StopBy::Policy, reason, ctx) {
                    tracing::warn!(error = %e, "the hold policy could not stop training; looking again");
                    self.follow_bounds(ctx);
                }
            }
            None => self.follow_bounds(ctx),
        }
    }

    fn arm_stop_bound(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.bounds.stop.take() {
            ctx.cancel_future(h);
        }
        let Some(at) = self.ledger.stop_deadline() else {
            return;
        };
        let after = at.saturating_sub(self.now());
        self.bounds.stop = Some(ctx.run_later(after, |act, ctx| {
            act.bounds.stop = None;
            if let Some(why) = act.ledger.stop_overdue(act.now()) {
                let job = act.ledger.job().clone();
                tracing::error!(
                    "{why}; find out why those processes are not back, or stop training again (`taskd recover --job {job} --stop-training`)"
                );
                metrics::counter!(telemetry::TRAINING_STOPS_OVERDUE).increment(1);
                act.job_changed();
            }
            act.follow_bounds(ctx);
        }));
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

    /// A verification round ended. When it closed a stop of training, says that the job runs
    /// again (after which restart, for what, how long after the fault); re-states by itself
    /// what a cut during a switch left (once per hold); then follows the bounds.
    pub(super) fn after_verification(
        &mut self,
        stop_ended: Option<OperationId>,
        ctx: &mut Context<Self>,
    ) {
        self.say_running_again(stop_ended);
        if self.ledger.take_restatement() {
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
        self.follow_bounds(ctx);
    }

    /// The stop `stop_ended` ended with the round just verified: says so, once.
    fn say_running_again(&self, stop_ended: Option<OperationId>) {
        let l = &self.ledger;
        let (Some(ended), Some(last)) = (stop_ended, l.last_training_stop()) else {
            return;
        };
        if last.id != ended || last.phase() != StopPhase::Restarted {
            return;
        }
        let now = self.now();
        match (last.then, &l.restarts().cause) {
            (AfterStop::Restart { number }, Some((cause, at))) => tracing::info!(
                state = %l.state(),
                "the job runs again after restart {number}{} ({cause}): {:.1?} after the fault",
                l.restarts().max.map_or(String::new(), |m| format!(" of {m}")),
                now.saturating_sub(*at)
            ),
            _ => tracing::info!(
                state = %l.state(),
                "every rank is back after the stop of training ({}): {:.1?} after the stop",
                last.reason,
                now.saturating_sub(last.at)
            ),
        }
    }
}
