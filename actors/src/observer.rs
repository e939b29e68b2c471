//! What the manager shows of its work: its spans, its metrics and its progress feed.
//!
//! The [`crate::manager::Manager`] actor keeps only the job's state and answers messages; it
//! tells an [`Observer`] what happened (an operation started, a phase started, ranks
//! answered, the report is out, a verification round ended, a worker registered) and the
//! observer turns that into the `operation` and `phase` spans, the metrics named in
//! [`crate::telemetry`] and the events of the [`ProgressFeed`]. The observer never changes
//! the job; the actor never touches a span, a metric or the feed.

use crate::progress::{ProgressFeed, ProgressKind};
use crate::telemetry;
use std::time::{Duration, Instant};
use taskd_core::command::SwitchPlan;
use taskd_core::ledger::{RecoverTo, RegisterError};
use taskd_core::operation::{HoldPoint, OperationReport, Outcome, Trigger};
use taskd_core::protocol::{Directive, DirectiveKind, Phase};
use taskd_core::verify::VerifyReport;
use taskd_core::{GlobalRank, JobId, JobLedger, JobState, OperationId, SubmitError, SwitchCommand};
use tracing::Span;

/// The manager's telemetry: the operation and phase being watched, and the feed.
#[derive(Debug)]
pub(crate) struct Observer {
    progress: ProgressFeed,
    /// The operation in flight.
    op: Option<WatchedOperation>,
    /// The phase whose directive went out last (an operation's or a verification round's).
    phase: Option<WatchedPhase>,
    /// Ranks the phase in flight still waits for, as last published.
    waiting: usize,
    /// Ranks the phase in flight waited for when it started.
    phase_ranks: usize,
}

#[derive(Debug)]
struct WatchedOperation {
    id: OperationId,
    started: Instant,
    span: Span,
}

#[derive(Debug)]
struct WatchedPhase {
    phase: Phase,
    started: Instant,
    /// A child of the operation's span (a verification round's phase has none).
    span: Option<Span>,
}

/// The span of a switch command (an operator's, or the automatic failover's: `trigger`); the
/// ledger admits it inside it.
pub(crate) fn submit_span(id: OperationId, cmd: &SwitchCommand, trigger: Trigger) -> Span {
    tracing::info_span!(
        "operation",
        uuid = %id,
        job = %cmd.job,
        targets = cmd.targets.len(),
        direction = tracing::field::Empty,
        role = "manager",
        trigger = trigger.as_str(),
    )
}

/// The span of a recovery; the ledger admits it inside it.
pub(crate) fn recover_span(id: OperationId, job: &JobId, to: RecoverTo) -> Span {
    tracing::info_span!(
        "operation",
        uuid = %id,
        job = %job,
        targets = tracing::field::Empty,
        direction = tracing::field::Empty,
        role = "manager",
        recover_to = to.as_str(),
    )
}

/// The span of an operation ClusterD drives (its pause `clusterd_uuid`); the targets come with
/// its switch ([`Observer::targets_known`]).
pub(crate) fn clusterd_span(id: OperationId, job: &JobId, clusterd_uuid: &str) -> Span {
    tracing::info_span!(
        "operation",
        uuid = %id,
        job = %job,
        targets = tracing::field::Empty,
        direction = tracing::field::Empty,
        role = "manager",
        driver = "clusterd",
        clusterd_uuid,
    )
}

impl Observer {
    /// An observer of a job of `expected` ranks: sets every gauge to its idle value.
    pub(crate) fn new(expected: usize) -> Self {
        metrics::gauge!(telemetry::WORKERS_EXPECTED).set(expected as f64);
        metrics::gauge!(telemetry::WORKERS_REGISTERED).set(0.0);
        metrics::gauge!(telemetry::OPERATION_IN_FLIGHT).set(0.0);
        metrics::gauge!(telemetry::RANKS_ON_BACKUP).set(0.0);
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(0.0);
        set_job_state(JobState::Running);
        Observer {
            progress: ProgressFeed::new(),
            op: None,
            phase: None,
            waiting: 0,
            phase_ranks: 0,
        }
    }

    /// The feed progress events are published on.
    pub(crate) fn progress(&self) -> ProgressFeed {
        self.progress.clone()
    }

    /// The span of the phase running, to enter while its answers are handled.
    pub(crate) fn phase_span(&self) -> Span {
        self.phase
            .as_ref()
            .and_then(|p| p.span.clone())
            .unwrap_or_else(Span::none)
    }

    /// A control message came in.
    pub(crate) fn received(&self, kind: &'static str) {
        telemetry::message("in", kind);
    }

    /// The ledger's view of the job may have changed: registered workers, the operation in
    /// flight, the NIC table, the job's state.
    pub(crate) fn job_changed(&self, ledger: &JobLedger) {
        metrics::gauge!(telemetry::WORKERS_REGISTERED).set(ledger.registered() as f64);
        let in_flight = if ledger.in_flight().is_some() {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(telemetry::OPERATION_IN_FLIGHT).set(in_flight);
        metrics::gauge!(telemetry::RANKS_ON_BACKUP).set(ledger.ranks_on_backup().count() as f64);
        let unreachable = ledger
            .lost_ranks()
            .filter(|(_, l)| l.how == taskd_core::protocol::Gone::Unreachable)
            .count();
        metrics::gauge!(telemetry::RANKS_UNREACHABLE).set(unreachable as f64);
        metrics::gauge!(telemetry::RANKS_HUNG).set(ledger.stalled_ranks().count() as f64);
        set_job_state(ledger.state());
    }

    /// A worker's registration was accepted or refused (`registered` of `expected` now).
    pub(crate) fn registration(
        &self,
        rank: GlobalRank,
        result: Result<(), &RegisterError>,
        registered: usize,
        expected: usize,
    ) {
        match result {
            Ok(()) => {
                tracing::debug!(rank = rank.0, "worker registered");
                if registered == expected {
                    tracing::info!(workers = registered, "every worker registered");
                }
            }
            Err(e) => tracing::error!(error = %e, "registration refused"),
        }
    }

    /// A command was refused before it could run.
    pub(crate) fn command_refused(&self, span: &Span, e: &SubmitError) {
        span.in_scope(|| tracing::warn!(error = %e, "command refused"));
        metrics::counter!(telemetry::OPERATIONS_TOTAL, "result" => "rejected", "direction" => "none")
            .increment(1);
    }

    /// The ledger started operation `id` of `plan` (`None` if it is over already) under
    /// `span`, over `ranks` ranks.
    pub(crate) fn operation_started(
        &mut self,
        id: OperationId,
        span: Span,
        job: &JobId,
        plan: Option<&SwitchPlan>,
        ranks: usize,
    ) {
        // An operation ClusterD drives learns its targets with its switch (`targets_known`).
        let direction = match plan {
            Some(p) if p.targets.is_empty() => None,
            Some(p) => Some(p.direction().as_str()),
            None => Some("mixed"),
        };
        if let Some(direction) = direction {
            span.record("direction", direction);
        }
        span.in_scope(|| tracing::info!(direction, "operation started"));
        self.op = Some(WatchedOperation {
            id,
            started: Instant::now(),
            span,
        });
        self.phase = None;
        if let Some(plan) = plan {
            self.publish(ProgressKind::Started {
                job: job.clone(),
                direction: plan.direction(),
                targets: plan.targets.clone(),
                ranks,
            });
        }
    }

    /// Directive `d` goes out to every node; `waiting` ranks must answer it. Ends the phase
    /// before it.
    pub(crate) fn phase_started(&mut self, d: &Directive, waiting: usize) {
        let phase = d.phase();
        self.end_phase();
        let pause_step = match d.kind {
            DirectiveKind::PauseAt { step } => Some(step),
            _ => None,
        };
        let span = self.op.as_ref().map(|op| {
            let span = tracing::info_span!(
                parent: &op.span,
                "phase",
                uuid = %d.op,
                phase = phase.as_str(),
                role = "manager"
            );
            span.in_scope(|| tracing::info!(waiting, pause_step, "phase started"));
            span
        });
        self.phase = Some(WatchedPhase {
            phase,
            started: Instant::now(),
            span,
        });
        self.waiting = waiting;
        self.phase_ranks = waiting;
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(waiting as f64);
        self.publish(ProgressKind::PhaseStarted {
            phase,
            waiting,
            pause_step,
        });
    }

    /// The directive of `phase` was sent to one node.
    pub(crate) fn sent(&self, phase: Phase) {
        telemetry::message("out", phase.as_str());
    }

    /// The phase's deadline fires in `after`.
    pub(crate) fn deadline_armed(&self, phase: Phase, after: Duration) {
        self.phase_span()
            .in_scope(|| tracing::debug!(%phase, ?after, "deadline armed"));
    }

    /// The operation in flight is in `phase` and waits for `waiting` ranks: published when
    /// the count went down by a 64th of the phase's ranks or more since it was last, or to
    /// none (every change, up to 64 ranks; at most 64 events a phase, whatever the size of the
    /// job: the manager of a thousand nodes gets a reply a node). A phase that just ended is
    /// announced by the next one's start instead.
    pub(crate) fn waiting(&mut self, phase: Phase, waiting: usize) {
        let current = self.phase.as_ref().map(|p| p.phase);
        if current != Some(phase) || waiting == self.waiting {
            return;
        }
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(waiting as f64);
        let step = (self.phase_ranks / 64).max(1);
        if waiting == 0 || self.waiting.abs_diff(waiting) >= step {
            self.waiting = waiting;
            self.publish(ProgressKind::Waiting { phase, waiting });
        }
    }

    /// The span of the operation in flight (none when idle).
    pub(crate) fn operation_span(&self) -> Span {
        self.op
            .as_ref()
            .map_or_else(Span::none, |op| op.span.clone())
    }

    /// The operation in flight learnt its targets (ClusterD's switch).
    pub(crate) fn targets_known(&self, plan: &SwitchPlan) {
        if plan.targets.is_empty() {
            return;
        }
        if let Some(op) = &self.op {
            let direction = plan.direction().as_str();
            op.span.record("direction", direction);
            op.span.record("targets", plan.targets.len());
        }
    }

    /// Every rank holds; the operation waits for its driver's next command.
    pub(crate) fn held(&mut self, at: HoldPoint) {
        self.end_phase();
        self.waiting = 0;
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(0.0);
        self.operation_span().in_scope(|| match at {
            HoldPoint::Paused { step } => {
                tracing::info!(step, "every rank holds; waiting for ClusterD's switch")
            }
            HoldPoint::Switched { applied } => {
                tracing::info!(
                    applied,
                    "switch over; every rank holds; waiting for ClusterD's continue"
                )
            }
        });
    }

    /// The operation's report is out; `ledger` has settled it.
    pub(crate) fn operation_finished(&mut self, report: &OperationReport, ledger: &JobLedger) {
        self.end_phase();
        let span = self
            .op
            .as_ref()
            .map_or_else(Span::none, |op| op.span.clone());
        span.in_scope(|| log_report(report));
        count_report(report);
        self.job_changed(ledger);
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(0.0);
        self.publish(ProgressKind::Finished(Box::new(report.clone())));
        self.op = None;
        self.waiting = 0;
    }

    /// A verification round `id` over `ranks` starts.
    pub(crate) fn verification_started(&self, id: OperationId, ranks: usize) {
        tracing::info!(%id, ranks, "verifying what every rank applied");
    }

    /// A verification round ended with `report`.
    pub(crate) fn verification_done(&mut self, report: &VerifyReport) {
        self.phase = None;
        match report.job_state() {
            Some(JobState::Running) => tracing::info!(%report, "verified: the job runs"),
            Some(state) => tracing::error!(
                %report,
                job_state = state.as_str(),
                "verification found groups that disagree on their NICs; run `taskd recover`"
            ),
            None => tracing::warn!(%report, "verification incomplete; asking again later"),
        }
    }

    /// Ends the phase running, if any: logs it and tells the progress feed.
    fn end_phase(&mut self) {
        let Some(WatchedPhase {
            phase,
            started,
            span,
        }) = self.phase.take()
        else {
            return;
        };
        let took = started.elapsed();
        if let Some(span) = span {
            span.in_scope(
                || tracing::info!(%phase, took_ms = took.as_secs_f64() * 1e3, "phase finished"),
            );
        }
        self.publish(ProgressKind::PhaseFinished { phase, took });
    }

    /// Publishes `kind` for the operation in flight (nothing when none is).
    fn publish(&self, kind: ProgressKind) {
        if let Some(op) = &self.op {
            self.progress.publish(op.id, op.started.elapsed(), kind);
        }
    }
}

fn log_report(report: &OperationReport) {
    match report.outcome {
        Outcome::Succeeded => tracing::info!(%report, "operation finished"),
        Outcome::Rejected => tracing::warn!(%report, "operation rejected"),
        Outcome::Failed if report.job_state == JobState::Running => {
            tracing::warn!(%report, "operation failed")
        }
        Outcome::Failed => tracing::error!(
            %report,
            job_state = report.job_state.as_str(),
            "operation failed and the job is NOT running: groups may disagree on their NICs; operator action required"
        ),
    }
}

/// The report's counter, phase durations and stall.
fn count_report(report: &OperationReport) {
    let direction = report.direction.as_str();
    metrics::counter!(telemetry::OPERATIONS_TOTAL, "result" => report.outcome.as_str(), "direction" => direction)
        .increment(1);
    let phases = [
        ("pause", report.phases.pause),
        ("switch", report.phases.switch),
        ("resume", report.phases.resume),
        ("rollback", report.phases.rollback),
        ("total", Some(report.phases.total)),
    ];
    for (phase, d) in phases {
        if let Some(d) = d {
            metrics::histogram!(telemetry::PHASE_DURATION, "phase" => phase)
                .record(d.as_secs_f64());
        }
    }
    if let Some(stall) = report.stall {
        metrics::histogram!(telemetry::TRAINING_STALL).record(stall.as_secs_f64());
    }
}

/// `taskd_job_state{state}`: 1 for `state`, 0 for the others.
fn set_job_state(state: JobState) {
    for s in [
        JobState::Running,
        JobState::Paused,
        JobState::NeedsRecovery,
        JobState::Degraded,
    ] {
        metrics::gauge!(telemetry::JOB_STATE, "state" => s.as_str()).set(if s == state {
            1.0
        } else {
            0.0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::command::{RankTarget, SwitchPlan};
    use taskd_core::{DeviceId, NodeName};

    fn count_waiting(ranks: usize, per_reply: usize) -> (usize, Option<usize>) {
        let mut o = Observer::new(ranks);
        let mut rx = o.progress().subscribe();
        let id = OperationId(uuid::Uuid::from_u128(1));
        let plan = SwitchPlan {
            targets: vec![RankTarget {
                node: NodeName("node-0".into()),
                device: DeviceId(0),
                rank: GlobalRank(0),
                use_backup: true,
            }],
        };
        let job = JobId("j".into());
        o.operation_started(id, Span::none(), &job, Some(&plan), ranks);
        let d = Directive {
            op: id,
            kind: DirectiveKind::Resume,
        };
        o.phase_started(&d, ranks);
        let mut left = ranks;
        while left > 0 {
            left -= per_reply.min(left);
            o.waiting(Phase::Resume, left);
        }
        let mut n = 0;
        let mut last = None;
        while let Ok(ev) = rx.try_recv() {
            if let ProgressKind::Waiting { waiting, .. } = ev.kind {
                n += 1;
                last = Some(waiting);
            }
        }
        (n, last)
    }

    #[test]
    fn a_large_phase_publishes_its_countdown_in_steps_and_a_small_one_every_change() {
        // 16 ranks a node, 1,024 nodes: a 64th of the phase at a time, and the end.
        let (n, last) = count_waiting(16_384, 16);
        assert!((64..=65).contains(&n), "{n}");
        assert_eq!(last, Some(0));
        // Up to 64 ranks, every answer shows.
        assert_eq!(count_waiting(64, 16), (4, Some(0)));
        assert_eq!(count_waiting(8, 1), (8, Some(0)));
    }
}
