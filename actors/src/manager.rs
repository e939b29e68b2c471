//! The manager: one per job. It admits commands through the [`JobLedger`], runs the operation
//! state machine, carries out its actions (broadcasts, deadlines, the final report) and
//! delivers each result to whoever waits for it.

use crate::progress::{ProgressFeed, ProgressKind};
use crate::telemetry;
use crate::transport::{Deliver, Link};
use actix::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use taskd_core::ledger::Submitted;
use taskd_core::ledger::{RecoverTo, RecoveryStarted};
use taskd_core::operation::{Action, Event, OperationReport, Outcome};
use taskd_core::protocol::{Directive, DirectiveKind, Phase, ProxyToManager};
use taskd_core::verify::VerifyReport;
use taskd_core::{
    GlobalRank, JobId, JobLedger, JobState, NodeName, OperationId, PhaseDeadlines, RankTable,
    SubmitError, SwitchCommand,
};
use tokio::sync::oneshot;
use tracing::Span;

pub struct Manager {
    ledger: JobLedger,
    epoch: Instant,
    nodes: BTreeMap<NodeName, Link<Directive>>,
    deadline: Option<SpawnHandle>,
    waiters: HashMap<OperationId, Vec<oneshot::Sender<OperationReport>>>,
    /// Waiters for a registered-worker count (`None`: every worker registered and the job's
    /// NIC configuration verified).
    registered_waiters: Vec<(Option<usize>, oneshot::Sender<()>)>,
    /// Waiters for a verification round's report.
    verify_waiters: HashMap<OperationId, Vec<oneshot::Sender<VerifyReport>>>,
    /// Ranks that registered and are gone, with why; a rank leaves when it registers again.
    lost: BTreeMap<GlobalRank, String>,
    op_span: Option<Span>,
    phase_span: Option<Span>,
    progress: ProgressFeed,
    /// The operation in flight: its id and start; the phase running and its start.
    op_started: Option<(OperationId, Instant)>,
    phase_started: Option<(Phase, Instant)>,
    /// Ranks the phase in flight still waits for, as last published.
    waiting: usize,
}

impl Manager {
    pub fn new(job: JobId, table: RankTable, deadlines: PhaseDeadlines) -> Self {
        let expected = table.world_size();
        metrics::gauge!(telemetry::WORKERS_EXPECTED).set(expected as f64);
        metrics::gauge!(telemetry::WORKERS_REGISTERED).set(0.0);
        metrics::gauge!(telemetry::OPERATION_IN_FLIGHT).set(0.0);
        metrics::gauge!(telemetry::RANKS_ON_BACKUP).set(0.0);
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(0.0);
        set_job_state(JobState::Running);
        Manager {
            ledger: JobLedger::new(job, table, deadlines),
            epoch: Instant::now(),
            nodes: BTreeMap::new(),
            deadline: None,
            waiters: HashMap::new(),
            registered_waiters: Vec::new(),
            verify_waiters: HashMap::new(),
            lost: BTreeMap::new(),
            op_span: None,
            phase_span: None,
            progress: ProgressFeed::new(),
            op_started: None,
            phase_started: None,
            waiting: 0,
        }
    }

    /// Where this manager publishes the progress of its operations. Take it before starting
    /// the actor to subscribe from outside; [`SubscribeProgress`] does the same through the
    /// actor's address.
    pub fn progress(&self) -> ProgressFeed {
        self.progress.clone()
    }

    fn publish(&self, kind: ProgressKind) {
        if let Some((op, started)) = self.op_started {
            self.progress.publish(op, started.elapsed(), kind);
        }
    }

    /// Ends the phase running, if any: logs it and tells the progress feed.
    fn end_phase(&mut self) {
        let Some((phase, started)) = self.phase_started.take() else {
            return;
        };
        let took = started.elapsed();
        if let Some(span) = self.phase_span.take() {
            span.in_scope(
                || tracing::info!(%phase, took_ms = took.as_secs_f64() * 1e3, "phase finished"),
            );
        }
        self.publish(ProgressKind::PhaseFinished { phase, took });
    }

    /// Publishes the in-flight phase's count of ranks still to answer, when it changed.
    fn publish_waiting(&mut self) {
        let Some(op) = self.ledger.in_flight() else {
            return;
        };
        let (phase, waiting) = (op.phase(), op.pending().len());
        // A phase that just ended is announced by the next one's broadcast instead.
        let current = self.phase_started.map(|(p, _)| p);
        if current == Some(phase) && waiting != self.waiting {
            self.waiting = waiting;
            metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(waiting as f64);
            self.publish(ProgressKind::Waiting { phase, waiting });
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn run(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for a in actions {
            match a {
                Action::Broadcast(d) => self.broadcast(d, ctx),
                Action::ArmDeadline { token, phase, at } => {
                    if let Some(h) = self.deadline.take() {
                        ctx.cancel_future(h);
                    }
                    let after = at.saturating_sub(self.now());
                    let span = self.phase_span.clone().unwrap_or_else(Span::none);
                    span.in_scope(|| tracing::debug!(%phase, ?after, "deadline armed"));
                    self.deadline = Some(ctx.run_later(after, move |act, ctx| {
                        act.deadline = None;
                        let now = act.now();
                        let actions = act.ledger.handle(Event::Deadline { token }, now);
                        act.run(actions, ctx);
                    }));
                }
                Action::Finish(report) => self.finish(*report, ctx),
                Action::Verified(report) => self.verified(*report, ctx),
            }
        }
    }

    /// Starts a verification round when one is owed and can run (see
    /// [`taskd_core::verify`]).
    fn maybe_verify(&mut self, ctx: &mut Context<Self>) {
        if !self.ledger.verify_due() {
            return;
        }
        let id = OperationId(uuid::Uuid::new_v4());
        tracing::info!(%id, ranks = self.ledger.registered(), "verifying what every rank applied");
        let actions = self.ledger.start_verification(id, self.now());
        self.run(actions, ctx);
    }

    fn verified(&mut self, report: VerifyReport, ctx: &mut Context<Self>) {
        if let Some(h) = self.deadline.take() {
            ctx.cancel_future(h);
        }
        self.phase_started = None;
        match report.job_state() {
            Some(JobState::Running) => tracing::info!(%report, "verified: the job runs"),
            Some(state) => tracing::error!(
                %report,
                job_state = state.as_str(),
                "verification found groups that disagree on their NICs; run `taskd recover`"
            ),
            None => {
                tracing::warn!(%report, "verification incomplete; asking again later");
                // A rank that registered but does not answer: ask again after the deadline.
                let again = self.ledger.deadlines().resume;
                ctx.run_later(again, |act, ctx| act.maybe_verify(ctx));
            }
        }
        for w in self.verify_waiters.remove(&report.id).unwrap_or_default() {
            let _ = w.send(report.clone());
        }
        self.update_gauges();
    }

    fn broadcast(&mut self, d: Directive, ctx: &mut Context<Self>) {
        let phase = d.phase();
        self.end_phase();
        let waiting = self
            .ledger
            .in_flight()
            .map(|op| op.pending().len())
            .unwrap_or(0);
        let pause_step = match d.kind {
            DirectiveKind::PauseAt { step } => Some(step),
            _ => None,
        };
        if let Some(op) = &self.op_span {
            let span = tracing::info_span!(
                parent: op,
                "phase",
                uuid = %d.op,
                phase = phase.as_str(),
                role = "manager"
            );
            span.in_scope(|| tracing::info!(waiting, pause_step, "phase started"));
            self.phase_span = Some(span);
        }
        self.phase_started = Some((phase, Instant::now()));
        self.waiting = waiting;
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(waiting as f64);
        self.publish(ProgressKind::PhaseStarted {
            phase,
            waiting,
            pause_step,
        });
        let mut gone = Vec::new();
        for (node, link) in &self.nodes {
            telemetry::message("out", phase.as_str());
            if let Err(e) = link.send(d.clone()) {
                gone.push((node.clone(), e));
            }
        }
        for (node, e) in gone {
            self.node_gone(&node, &format!("sending to its proxy failed: {e}"), ctx);
        }
    }

    fn node_gone(&mut self, node: &NodeName, reason: &str, ctx: &mut Context<Self>) {
        self.nodes.remove(node);
        let ranks = self.ledger.table().ranks_of(node);
        for rank in ranks {
            if self.ledger.is_registered(rank) {
                let now = self.now();
                let reason = format!("proxy of {node}: {reason}");
                self.lost.insert(rank, reason.clone());
                let actions = self.ledger.worker_lost(rank, reason, now);
                self.run(actions, ctx);
            }
        }
        self.publish_waiting();
        self.update_gauges();
    }

    fn finish(&mut self, report: OperationReport, ctx: &mut Context<Self>) {
        if let Some(h) = self.deadline.take() {
            ctx.cancel_future(h);
        }
        self.end_phase();
        let span = self.op_span.take().unwrap_or_else(Span::none);
        span.in_scope(|| match report.outcome {
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
        });
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
        self.update_gauges();
        metrics::gauge!(telemetry::OPERATION_PENDING_RANKS).set(0.0);
        self.publish(ProgressKind::Finished(Box::new(report.clone())));
        self.op_started = None;
        self.waiting = 0;
        for w in self.waiters.remove(&report.id).unwrap_or_default() {
            let _ = w.send(report.clone());
        }
        self.maybe_verify(ctx);
    }

    /// Book-keeping of an operation the ledger just started: spans, progress, gauges; then
    /// carries out its first actions.
    fn operation_started(
        &mut self,
        id: OperationId,
        span: Span,
        actions: Vec<Action>,
        ctx: &mut Context<Self>,
    ) {
        let direction = self
            .ledger
            .in_flight()
            .map(|op| op.plan().direction().as_str())
            .unwrap_or("mixed");
        span.record("direction", direction);
        span.in_scope(|| tracing::info!(direction, "operation started"));
        self.op_span = Some(span);
        self.op_started = Some((id, Instant::now()));
        self.phase_started = None;
        if let Some(op) = self.ledger.in_flight() {
            self.publish(ProgressKind::Started {
                job: self.ledger.job().clone(),
                direction: op.plan().direction(),
                targets: op.plan().targets.clone(),
                ranks: self.ledger.expected(),
            });
        }
        self.update_gauges();
        self.run(actions, ctx);
    }

    fn update_gauges(&mut self) {
        let n = self.ledger.registered();
        let verified = self.ledger.is_verified() && self.ledger.verifying().is_none();
        let all = self.ledger.expected();
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.registered_waiters)
            .into_iter()
            .partition(|(want, _)| match want {
                Some(want) => *want == n,
                None => n == all && verified,
            });
        self.registered_waiters = waiting;
        for (_, tx) in ready {
            let _ = tx.send(());
        }
        metrics::gauge!(telemetry::WORKERS_REGISTERED).set(self.ledger.registered() as f64);
        metrics::gauge!(telemetry::OPERATION_IN_FLIGHT).set(if self.ledger.in_flight().is_some() {
            1.0
        } else {
            0.0
        });
        metrics::gauge!(telemetry::RANKS_ON_BACKUP)
            .set(self.ledger.ranks_on_backup().count() as f64);
        set_job_state(self.ledger.state());
    }
}

/// `taskd_job_state{state}`: 1 for `state`, 0 for the others.
fn set_job_state(state: JobState) {
    for s in [JobState::Running, JobState::Paused, JobState::NeedsRecovery] {
        metrics::gauge!(telemetry::JOB_STATE, "state" => s.as_str()).set(if s == state {
            1.0
        } else {
            0.0
        });
    }
}

impl Actor for Manager {
    type Context = Context<Self>;
}

/// A proxy's connection is up; directives for its node go through `link`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProxyConnected {
    pub node: NodeName,
    pub link: Link<Directive>,
}

/// A proxy's connection closed: every rank of the node is lost.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProxyDisconnected {
    pub node: NodeName,
    pub reason: String,
}

impl Handler<ProxyConnected> for Manager {
    type Result = ();
    fn handle(&mut self, m: ProxyConnected, _: &mut Self::Context) {
        self.nodes.insert(m.node, m.link);
    }
}

impl Handler<ProxyDisconnected> for Manager {
    type Result = ();
    fn handle(&mut self, m: ProxyDisconnected, ctx: &mut Self::Context) {
        self.node_gone(&m.node, &m.reason, ctx);
    }
}

impl Handler<Deliver<ProxyToManager>> for Manager {
    type Result = ();

    fn handle(&mut self, Deliver(m): Deliver<ProxyToManager>, ctx: &mut Self::Context) {
        let now = self.now();
        match m {
            ProxyToManager::WorkerUp(hello) => {
                telemetry::message("in", "worker_up");
                let rank = hello.rank;
                match self.ledger.register(hello) {
                    Ok(()) => {
                        self.lost.remove(&rank);
                        tracing::debug!(rank = rank.0, "worker registered");
                        if self.ledger.registered() == self.ledger.expected() {
                            tracing::info!(
                                workers = self.ledger.registered(),
                                "every worker registered"
                            );
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "registration refused"),
                }
                self.update_gauges();
                self.maybe_verify(ctx);
            }
            ProxyToManager::WorkerLost { rank, reason } => {
                telemetry::message("in", "worker_lost");
                if self.ledger.is_registered(rank) {
                    self.lost.insert(rank, reason.clone());
                }
                let actions = self.ledger.worker_lost(rank, reason, now);
                self.update_gauges();
                self.publish_waiting();
                self.run(actions, ctx);
                self.maybe_verify(ctx);
            }
            ProxyToManager::Reply(nr) => {
                telemetry::message("in", "node_reply");
                let span = self.phase_span.clone().unwrap_or_else(Span::none);
                let actions = span.in_scope(|| self.ledger.handle(Event::Replies(nr), now));
                self.publish_waiting();
                self.run(actions, ctx);
            }
        }
    }
}

/// Admit a command. On success the operation runs; wait for it with [`AwaitResult`].
#[derive(Message)]
#[rtype(result = "Result<Submission, SubmitError>")]
pub struct Submit(pub SwitchCommand);

/// What a submission led to.
#[derive(Clone, Debug, PartialEq)]
pub enum Submission {
    /// A new operation is running.
    Started(OperationId),
    /// The id ran before: its result (never run twice).
    Known(Box<OperationReport>),
    /// The id is the operation in flight.
    InFlight(OperationId),
}

impl Submission {
    pub fn id(&self) -> OperationId {
        match self {
            Submission::Started(id) | Submission::InFlight(id) => *id,
            Submission::Known(r) => r.id,
        }
    }
}

impl Handler<Submit> for Manager {
    type Result = Result<Submission, SubmitError>;

    fn handle(&mut self, Submit(cmd): Submit, ctx: &mut Self::Context) -> Self::Result {
        let id = cmd.id.unwrap_or_else(|| OperationId(uuid::Uuid::new_v4()));
        let now = self.now();
        let span = tracing::info_span!(
            "operation",
            uuid = %id,
            job = %cmd.job,
            targets = cmd.targets.len(),
            direction = tracing::field::Empty,
            role = "manager",
        );
        let res = span.in_scope(|| self.ledger.submit(&cmd, id, now));
        match res {
            Ok(Submitted::Started { id, actions }) => {
                self.operation_started(id, span, actions, ctx);
                Ok(Submission::Started(id))
            }
            Ok(Submitted::Known(r)) => Ok(Submission::Known(r)),
            Ok(Submitted::InFlight(id)) => Ok(Submission::InFlight(id)),
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "command refused"));
                metrics::counter!(telemetry::OPERATIONS_TOTAL, "result" => "rejected", "direction" => "none")
                    .increment(1);
                Err(e)
            }
        }
    }
}

/// Wait for the final result of an operation. `None` if the id is unknown.
#[derive(Message)]
#[rtype(result = "Option<OperationReport>")]
pub struct AwaitResult(pub OperationId);

impl Handler<AwaitResult> for Manager {
    type Result = ResponseFuture<Option<OperationReport>>;

    fn handle(&mut self, AwaitResult(id): AwaitResult, _: &mut Self::Context) -> Self::Result {
        if let Some(r) = self.ledger.result_of(id) {
            let r = r.clone();
            return Box::pin(async move { Some(r) });
        }
        if self.ledger.in_flight().is_some_and(|op| op.id() == id) {
            let (tx, rx) = oneshot::channel();
            self.waiters.entry(id).or_default().push(tx);
            return Box::pin(async move { rx.await.ok() });
        }
        Box::pin(async { None })
    }
}

/// Subscribe to the manager's progress feed (see [`crate::progress`]): every event published
/// after this message is handled, for every operation.
#[derive(Message)]
#[rtype(result = "tokio::sync::broadcast::Receiver<crate::progress::ProgressEvent>")]
pub struct SubscribeProgress;

impl Handler<SubscribeProgress> for Manager {
    type Result = MessageResult<SubscribeProgress>;

    fn handle(&mut self, _: SubscribeProgress, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.progress.subscribe())
    }
}

/// Resolves once exactly this many workers are registered (`None`: every expected worker, and
/// the verification round that follows found what every rank applied).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AwaitRegistered(pub Option<usize>);

impl Handler<AwaitRegistered> for Manager {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, m: AwaitRegistered, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.registered_waiters.push((m.0, tx));
        self.update_gauges();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// A rank whose worker registered and is gone (process exited, connection closed, heartbeats
/// missed), and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LostRank {
    pub rank: GlobalRank,
    pub reason: String,
}

/// A snapshot of the job as the manager sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManagerStatus {
    pub job: JobId,
    pub state: JobState,
    pub workers_registered: usize,
    pub workers_expected: usize,
    pub nodes_connected: usize,
    pub ranks_on_backup: Vec<GlobalRank>,
    pub in_flight: Option<(OperationId, Phase)>,
    /// Ranks the phase in flight still waits for.
    pub pending_ranks: Vec<GlobalRank>,
    /// The most recent results, newest last.
    pub recent: Vec<OperationReport>,
    /// Ranks that registered and are gone (until they register again), ascending.
    #[serde(default)]
    pub lost_ranks: Vec<LostRank>,
    /// Whether the NIC table comes from every rank's report (switches wait until it does).
    #[serde(default)]
    pub verified: bool,
    /// The last verification round: what it found (groups that disagree, gates it opened).
    #[serde(default)]
    pub last_verification: Option<VerifyReport>,
}

/// Ask for a [`ManagerStatus`] with up to `recent` past results.
#[derive(Message)]
#[rtype(result = "ManagerStatus")]
pub struct GetStatus {
    pub recent: usize,
}

impl Handler<GetStatus> for Manager {
    type Result = MessageResult<GetStatus>;

    fn handle(&mut self, m: GetStatus, _: &mut Self::Context) -> Self::Result {
        let l = &self.ledger;
        let history: Vec<_> = l.history().rev().take(m.recent).cloned().collect();
        MessageResult(ManagerStatus {
            job: l.job().clone(),
            state: l.state(),
            workers_registered: l.registered(),
            workers_expected: l.expected(),
            nodes_connected: self.nodes.len(),
            ranks_on_backup: l.ranks_on_backup().collect(),
            in_flight: l
                .in_flight()
                .map(|op| (op.id(), op.phase()))
                .or_else(|| l.verifying().map(|v| (v.id(), v.phase()))),
            pending_ranks: l
                .in_flight()
                .map(|op| op.pending().iter().copied().collect())
                .or_else(|| l.verifying().map(|v| v.pending().iter().copied().collect()))
                .unwrap_or_default(),
            verified: l.is_verified(),
            last_verification: l.last_verification().cloned(),
            recent: history.into_iter().rev().collect(),
            lost_ranks: self
                .lost
                .iter()
                .map(|(rank, reason)| LostRank {
                    rank: *rank,
                    reason: reason.clone(),
                })
                .collect(),
        })
    }
}

/// Recover a job that is not running (see [`RecoverTo`] and README "Recovery"): re-state the
/// ranks in doubt, or, when none is, verify what every rank applied.
#[derive(Message)]
#[rtype(result = "Result<Recovery, SubmitError>")]
pub struct Recover {
    /// The side the ranks in doubt are re-stated to.
    pub to: RecoverTo,
    /// The recovery's id (generated when absent).
    pub id: Option<OperationId>,
}

/// What a recovery started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// An operation re-states the ranks in doubt: wait for it with [`AwaitResult`].
    Operation(OperationId),
    /// A verification round: wait for it with [`AwaitVerification`].
    Verification(OperationId),
}

impl Handler<Recover> for Manager {
    type Result = Result<Recovery, SubmitError>;

    fn handle(&mut self, m: Recover, ctx: &mut Self::Context) -> Self::Result {
        let id = m.id.unwrap_or_else(|| OperationId(uuid::Uuid::new_v4()));
        let span = tracing::info_span!(
            "operation",
            uuid = %id,
            job = %self.ledger.job(),
            targets = tracing::field::Empty,
            direction = tracing::field::Empty,
            role = "manager",
            recover_to = m.to.as_str(),
        );
        let now = self.now();
        let res = span.in_scope(|| self.ledger.recover(m.to, id, now));
        match res {
            Ok(RecoveryStarted::Operation { id, actions }) => {
                span.in_scope(|| tracing::warn!(to = m.to.as_str(), "recovery started"));
                self.operation_started(id, span, actions, ctx);
                Ok(Recovery::Operation(id))
            }
            Ok(RecoveryStarted::Verification { id, actions }) => {
                span.in_scope(|| tracing::warn!("recovery: nothing in doubt, verifying"));
                self.run(actions, ctx);
                self.update_gauges();
                Ok(Recovery::Verification(id))
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "recovery refused"));
                Err(e)
            }
        }
    }
}

/// Wait for a verification round's report (`None`: not running and not known).
#[derive(Message)]
#[rtype(result = "Option<VerifyReport>")]
pub struct AwaitVerification(pub OperationId);

impl Handler<AwaitVerification> for Manager {
    type Result = ResponseFuture<Option<VerifyReport>>;

    fn handle(&mut self, m: AwaitVerification, _: &mut Self::Context) -> Self::Result {
        if let Some(r) = self.ledger.last_verification().filter(|r| r.id == m.0) {
            let r = r.clone();
            return Box::pin(async move { Some(r) });
        }
        if self.ledger.verifying().is_some_and(|v| v.id() == m.0) {
            let (tx, rx) = oneshot::channel();
            self.verify_waiters.entry(m.0).or_default().push(tx);
            return Box::pin(async move { rx.await.ok() });
        }
        Box::pin(async { None })
    }
}

/// The manager is stopping: end the operation in flight safely (roll back what may have been
/// switched, open every gate) and resolve with its result once it is over (`None`: nothing
/// was running). The caller bounds the wait; the manager keeps running until it stops it.
#[derive(Message)]
#[rtype(result = "Option<OperationReport>")]
pub struct Drain {
    /// Why, for the report and the log.
    pub reason: String,
}

impl Handler<Drain> for Manager {
    type Result = ResponseFuture<Option<OperationReport>>;

    fn handle(&mut self, m: Drain, ctx: &mut Self::Context) -> Self::Result {
        let Some(id) = self.ledger.in_flight().map(|op| op.id()) else {
            // A verification round changes nothing: drop it.
            let actions = self.ledger.abort(m.reason, self.now());
            self.run(actions, ctx);
            return Box::pin(async { None });
        };
        tracing::warn!(%id, reason = %m.reason, "stopping: ending the operation in flight safely");
        let (tx, rx) = oneshot::channel();
        self.waiters.entry(id).or_default().push(tx);
        let now = self.now();
        let actions = self.ledger.abort(m.reason, now);
        self.run(actions, ctx);
        Box::pin(async move { rx.await.ok() })
    }
}

/// Stops the manager actor at once, as if its process died (nothing is finished).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopManager;

impl Handler<StopManager> for Manager {
    type Result = ();
    fn handle(&mut self, _: StopManager, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
