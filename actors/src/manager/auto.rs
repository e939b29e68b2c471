//! The manager's side of automatic failover: it feeds the proxies' link reports to the pure
//! policy (`taskd_core::auto`), asks it again whenever the job changes or the time it asked
//! for comes, and carries out its decisions: each one is a log line, a count in
//! `taskd_auto_decisions_total`, a progress event, and a move starts one operation whose report
//! says `trigger: auto`.

use super::Manager;
use crate::progress::ProgressKind;
use crate::telemetry;
use actix::prelude::*;
use std::time::Duration;
use taskd_core::auto::{
    AutoConfig, AutoDecision, AutoPolicy, AutoReason, DeviceKey, Evaluation, JobGate, Links,
};
use taskd_core::command::Target;
use taskd_core::ledger::Submitted;
use taskd_core::operation::{OperationReport, Outcome, Trigger};
use taskd_core::protocol::LinkReport;
use taskd_core::{JobLedger, JobState, OperationId, SwitchCommand};
use tokio::sync::oneshot;

/// The policy and what the manager keeps for it.
pub(super) struct Auto {
    policy: AutoPolicy,
    /// The wake-up armed, and when it fires.
    timer: Option<(Duration, SpawnHandle)>,
    /// The automatic operation in flight.
    op: Option<OperationId>,
    /// Waiters for [`AwaitAutoSettled`].
    settled: Vec<SettleWaiter>,
    /// Moves off a link that is down or degraded abort the collectives in flight and finish
    /// the step on the backup instead of pausing at the next boundary
    /// ([`Manager::with_auto_in_flight`]).
    in_flight: bool,
}

/// The links an [`AwaitAutoSettled`] waits for, and where to answer.
type SettleWaiter = (Vec<(DeviceKey, Links)>, oneshot::Sender<bool>);

/// What the job allows now.
fn gate(l: &JobLedger) -> JobGate {
    if l.in_flight().is_some() || l.verifying().is_some() {
        JobGate::OperationRunning
    } else if l.state() != JobState::Running {
        JobGate::NotRunning
    } else if !l.is_verified() {
        JobGate::Unverified
    } else {
        JobGate::Ready
    }
}

impl Manager {
    /// Turns automatic failover on with `cfg` (see [`taskd_core::auto`]); the proxies must
    /// probe their links (`Proxy::probe_links`, or the `link_probe` the manager's transport
    /// tells them).
    pub fn with_auto(mut self, cfg: AutoConfig) -> Self {
        tracing::info!(?cfg, "automatic failover on");
        self.auto = Some(Auto {
            policy: AutoPolicy::new(cfg),
            timer: None,
            op: None,
            settled: Vec::new(),
            in_flight: false,
        });
        self
    }

    /// Makes the automatic failover's moves to the backup NIC in-flight moves
    /// (`taskd_core::inflight`): the collectives stuck on the failed link are aborted and the
    /// step finishes on the backup, instead of a pause that waits for the step in flight.
    /// Every training process must have an in-flight side (taskd's Gloo switch has one): an
    /// abort a rank cannot make fails the move. Needs [`Manager::with_auto`] first.
    pub fn with_auto_in_flight(mut self, on: bool) -> Self {
        if let Some(a) = self.auto.as_mut() {
            a.in_flight = on;
            tracing::info!(
                on,
                "automatic moves off a failed link abort the collectives in flight"
            );
        }
        self
    }

    /// Whether automatic failover is on.
    pub fn auto_failover(&self) -> bool {
        self.auto.is_some()
    }

    /// A proxy's link report.
    pub(super) fn auto_links(&mut self, r: LinkReport, ctx: &mut Context<Self>) {
        self.observer.received("link_report");
        let now = self.now();
        let Some(auto) = self.auto.as_mut() else {
            tracing::debug!(node = %r.node, device = r.device.0, "link report ignored: automatic failover is off");
            return;
        };
        if self.ledger.table().rank_of(&r.node, r.device).is_none() {
            tracing::warn!(node = %r.node, device = r.device.0, "link report of a device the job does not have");
            return;
        }
        let key = DeviceKey {
            node: r.node.clone(),
            device: r.device,
        };
        let changed = if r.from_kernel {
            auto.policy
                .link_changed_by_kernel(key, r.links.clone(), now)
        } else {
            auto.policy.link_changed(key, r.links.clone(), now)
        };
        if changed {
            tracing::info!(node = %r.node, device = r.device.0, primary = %r.links.primary, backup = %r.links.backup, "links changed");
        }
        let progress = ProgressKind::Links { report: r, at: now };
        self.observer.progress().publish_auto(None, progress);
        self.auto_evaluate(ctx);
    }

    /// An operation ended: the policy learns how its own did, or what an operator moved,
    /// and may act now.
    pub(super) fn auto_finished(&mut self, report: &OperationReport, ctx: &mut Context<Self>) {
        let Some(auto) = self.auto.as_mut() else {
            return;
        };
        if auto.op == Some(report.id) {
            auto.op = None;
            auto.policy
                .finished(report.outcome == Outcome::Succeeded && report.applied);
        } else if report.applied {
            let keys: Vec<DeviceKey> = report
                .targets
                .iter()
                .map(|t| DeviceKey {
                    node: t.node.clone(),
                    device: t.device,
                })
                .collect();
            auto.policy.operator_moved(&keys);
        }
        self.auto_evaluate(ctx);
    }

    /// The automatic operation `id` was withdrawn before it ran (its admission could not be
    /// journaled): the policy hears it as refused, as when the ledger refuses one.
    pub(super) fn auto_withdrawn(&mut self, id: OperationId) {
        let now = self.now();
        let Some(auto) = self.auto.as_mut().filter(|a| a.op == Some(id)) else {
            return;
        };
        auto.op = None;
        let refused = auto.policy.refused(now);
        self.publish_decisions(&refused);
    }

    /// Asks the policy what to do now and does it.
    pub(super) fn auto_evaluate(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        let gate = gate(&self.ledger);
        let ledger = &self.ledger;
        let Some(auto) = self.auto.as_mut() else {
            return;
        };
        let side_of = |k: &DeviceKey| {
            let rank = ledger.table().rank_of(&k.node, k.device)?;
            Some(ledger.side_of(rank))
        };
        let mut eval = auto.policy.evaluate(gate, &side_of, now);
        self.auto_arm(eval.wake_at, now, ctx);
        if eval.moves().next().is_some() {
            self.auto_start(&mut eval, now, ctx);
        } else {
            self.publish_decisions(&eval.decisions);
        }
        self.wake_settled();
    }

    /// Arms the wake-up the policy asked for (replacing another one).
    fn auto_arm(&mut self, at: Option<Duration>, now: Duration, ctx: &mut Context<Self>) {
        let Some(auto) = self.auto.as_mut() else {
            return;
        };
        if auto.timer.as_ref().map(|(t, _)| *t) == at {
            return;
        }
        if let Some((_, h)) = auto.timer.take() {
            ctx.cancel_future(h);
        }
        if let Some(at) = at {
            let h = ctx.run_later(at.saturating_sub(now), |act, ctx| {
                if let Some(a) = act.auto.as_mut() {
                    a.timer = None;
                }
                act.auto_evaluate(ctx);
            });
            auto.timer = Some((at, h));
        }
    }

    /// Starts the operation of the evaluation's moves, then publishes its decisions (a move
    /// under the operation's id, before the operation's own events).
    fn auto_start(&mut self, eval: &mut Evaluation, now: Duration, ctx: &mut Context<Self>) {
        let cmd = SwitchCommand {
            job: self.ledger.job().clone(),
            id: None,
            targets: eval
                .moves()
                .map(|d| Target {
                    node: d.node.clone(),
                    device: d.device,
                    use_backup: d.action.side().is_some_and(|s| s.use_backup()),
                })
                .collect(),
        };
        let id = OperationId(uuid::Uuid::new_v4());
        let span = crate::observer::submit_span(id, &cmd, Trigger::Auto);
        let res = match self.journal_ready() {
            Ok(()) => span.in_scope(|| {
                // A move off a link that failed (every target to its backup NIC) cannot wait
                // for the step in flight: that step is stuck on the link.
                let off_failed =
                    !cmd.targets.is_empty() && cmd.targets.iter().all(|t| t.use_backup);
                if self.auto.as_ref().is_some_and(|a| a.in_flight) && off_failed {
                    self.ledger.submit_in_flight(Trigger::Auto, &cmd, id, now)
                } else {
                    self.ledger.submit_by(Trigger::Auto, &cmd, id, now)
                }
            }),
            Err(e) => Err(e),
        };
        match res {
            Ok(Submitted::Started { id, actions }) => {
                for d in eval.decisions.iter_mut().filter(|d| d.is_move()) {
                    d.operation = Some(id);
                }
                self.publish_decisions(&eval.decisions);
                if let Some(a) = self.auto.as_mut() {
                    a.op = Some(id);
                }
                let _durable = self.operation_started(id, span, actions, ctx);
            }
            other => {
                // The job changed under the policy (a fresh uuid is never known or in flight).
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(s) => format!("{s:?}"),
                };
                span.in_scope(|| tracing::warn!(error = %why, "automatic operation refused"));
                self.publish_decisions(&eval.decisions);
                let refused = match self.auto.as_mut() {
                    Some(a) => a.policy.refused(now),
                    None => Vec::new(),
                };
                self.publish_decisions(&refused);
            }
        }
    }

    /// Each decision: one log line, one count, one progress event.
    fn publish_decisions(&self, decisions: &[AutoDecision]) {
        let progress = self.observer.progress();
        for d in decisions {
            telemetry::auto_decision(d);
            let (node, device) = (&d.node, d.device.0);
            let (action, reason) = (d.action.as_str(), d.reason.as_str());
            let op = d.operation.map(|id| id.to_string());
            if needs_attention(d) {
                tracing::warn!(%node, device, action, reason, operation = op, "automatic failover: {d}");
            } else {
                tracing::info!(%node, device, action, reason, operation = op, "automatic failover: {d}");
            }
            progress.publish_auto(d.operation, ProgressKind::Decision(d.clone()));
        }
    }

    /// Resolves the [`AwaitAutoSettled`] waiters whose condition holds.
    fn wake_settled(&mut self) {
        let idle = gate(&self.ledger) != JobGate::OperationRunning;
        let Some(auto) = self.auto.as_mut() else {
            return;
        };
        let quiet = idle && auto.op.is_none() && auto.timer.is_none();
        let policy = &auto.policy;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut auto.settled)
            .into_iter()
            .partition(|(links, _)| {
                quiet
                    && links
                        .iter()
                        .all(|(k, l)| policy.links(k).is_some_and(|p| p.same_states(l)))
            });
        auto.settled = waiting;
        for (_, tx) in ready {
            let _ = tx.send(true);
        }
    }
}

/// Whether a decision is one an operator should look at: a link failed, or a move could not
/// happen for a reason that will not pass by itself.
fn needs_attention(d: &AutoDecision) -> bool {
    matches!(
        d.reason,
        AutoReason::PrimaryDown
            | AutoReason::BackupDown
            | AutoReason::PrimaryDegraded
            | AutoReason::BackupDegraded
            | AutoReason::Flapping
            | AutoReason::FailedBefore
            | AutoReason::Refused
    )
}

/// Resolves once automatic failover has settled: the policy's view of every device in `links`
/// is the given one, no operation or verification runs, and the policy waits for nothing but
/// a new link report or a change of the job. Answers `false` at once when automatic failover
/// is off (and if the manager stops first).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct AwaitAutoSettled {
    /// The links each device is expected to report.
    pub links: Vec<(DeviceKey, Links)>,
}

impl Handler<AwaitAutoSettled> for Manager {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, m: AwaitAutoSettled, _: &mut Self::Context) -> Self::Result {
        let Some(auto) = self.auto.as_mut() else {
            return Box::pin(async { false });
        };
        let (tx, rx) = oneshot::channel();
        auto.settled.push((m.links, tx));
        self.wake_settled();
        Box::pin(async move { rx.await.unwrap_or(false) })
    }
}
