//! The worker: one per training process. It owns the rank's HAL and step gate and answers
//! the manager's directives (through its proxy).
//!
//! The worker holds its rank's HAL as a [`TaskRankHal`] and awaits its calls one job at a
//! time, so HCCL's calls stay strictly sequential per rank and the actor answers the gate
//! and its proxy meanwhile; a blocking HAL's calls run on a thread that owns it
//! ([`crate::ThreadedRankHal`], [`crate::hal_exec`]).

use crate::gate::{GateEvent, StepGate};
use crate::hal_exec::{caught, HalPanicked};
use crate::hang_watch::{self, Change, HangWatch};
use crate::telemetry;
use crate::transport::{Deliver, Link};
use actix::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, GroupView, Phase, RankError, RankReply, ReplyBody,
    StallNotice, WorkerHello, WorkerReport, WorkerToProxy,
};
use taskd_core::{
    plan_calls, GlobalRank, GroupCall, Instance, JobId, NicSide, NodeName, OperationId,
    SwitchCapabilities, TaskRankHal,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span};

/// Who a worker is.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The job, sent in the worker's hello.
    pub job: JobId,
    /// The node the process runs on, checked by the manager against the rank table.
    pub node: NodeName,
    /// The process's global rank.
    pub rank: GlobalRank,
    /// `MS_ENABLE_TFT` of this process enables `TSP:1`.
    pub tsp: bool,
    /// The job restart its launcher started this process for (`TASKD_RESTART_COUNT`).
    pub generation: u32,
    /// The hang watch's timeout (`crate::hang_watch`); `None`: no watch
    /// ([`taskd_core::env::hang_timeout`] reads it).
    pub hang_timeout: Option<Duration>,
}

enum HalJob {
    Capabilities {
        tsp: bool,
        reply: oneshot::Sender<SwitchCapabilities>,
    },
    /// What this rank has applied to each of its groups.
    Report(oneshot::Sender<Result<Vec<GroupView>, RankError>>),
    /// Apply each round of `(rank, side)` in turn (a switch has one, a rollback two).
    Apply {
        rounds: Vec<Vec<(GlobalRank, NicSide)>>,
        /// The time the calls have (the directive's).
        call_timeout: Duration,
        reply: oneshot::Sender<Result<Vec<AppliedCall>, RankError>>,
        /// The phase's span, entered for the calls.
        span: Span,
    },
}

/// A new process's instance: random, never [`Instance::UNKNOWN`].
fn new_instance() -> Instance {
    let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
    Instance((hi ^ lo) | 1)
}

/// Called once when the worker stops: the in-process transport's "connection closed".
pub type Farewell = Box<dyn FnOnce(GlobalRank) + Send>;

/// The worker actor of one rank: it answers directives from the gate (sample, pause,
/// resume) and from its HAL (switch, rollback, verify), and reports gate events upstream.
/// Built with [`Worker::new`]; the training loop only ever sees the gate.
pub struct Worker {
    cfg: WorkerConfig,
    gate: Arc<StepGate>,
    upstream: Link<WorkerToProxy>,
    hal: mpsc::UnboundedSender<HalJob>,
    /// The HAL and its jobs until the actor starts the task that makes the calls.
    hal_home: Option<(Box<dyn TaskRankHal>, mpsc::UnboundedReceiver<HalJob>)>,
    /// Set when the HAL panicked: every job since fails with it.
    hal_panic: Arc<parking_lot::Mutex<Option<HalPanicked>>>,
    farewell: Option<Farewell>,
    /// The span of the operation in progress (same uuid as the manager's) and of its phase.
    op_span: Option<(OperationId, Span)>,
    phase_span: Span,
    /// Whether this rank counts in `taskd_ranks_held`.
    held: bool,
    /// Which process of the rank this is (drawn when the worker is made): a stop sent again to
    /// old processes names theirs.
    instance: Instance,
    /// The in-flight operation whose collectives this rank aborted and has not finished on
    /// rebuilt groups yet: its resume gives the waiting collectives up.
    aborted: Option<OperationId>,
}

impl Worker {
    /// A worker for `cfg.rank` driving `hal`, replying through `upstream`. `gate` is the one
    /// the training loop calls. A blocking HAL comes on a thread of its own
    /// ([`crate::ThreadedRankHal`]).
    pub fn new(
        cfg: WorkerConfig,
        hal: Box<dyn TaskRankHal>,
        gate: Arc<StepGate>,
        upstream: Link<WorkerToProxy>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Worker {
            cfg,
            gate,
            upstream,
            hal: tx,
            hal_home: Some((hal, rx)),
            hal_panic: Arc::default(),
            farewell: None,
            op_span: None,
            phase_span: Span::none(),
            held: false,
            instance: new_instance(),
            aborted: None,
        }
    }

    /// Which process of the rank this worker is.
    pub fn instance(&self) -> Instance {
        self.instance
    }

    /// Makes the NIC-set calls of a switch or a rollback (`rounds` in turn) and answers with
    /// them; only while training is held at the step gate.
    fn set_nics(
        &mut self,
        ctx: &mut Context<Self>,
        (op, phase): (OperationId, Phase),
        (rounds, call_timeout): (Vec<Vec<(GlobalRank, NicSide)>>, Duration),
        span: Span,
    ) {
        if self.gate.held_step().is_none() {
            self.fail(
                op,
                phase,
                "refusing to touch HCCL groups: training is not held at the step gate".into(),
            );
            return;
        }
        let (tx, rx) = oneshot::channel();
        let job = HalJob::Apply {
            rounds,
            call_timeout,
            reply: tx,
            span,
        };
        self.on_hal(ctx, (op, phase), job, rx, false, |calls, _| {
            ReplyBody::Applied { calls }
        });
    }

    /// Ends the collectives in flight through the framework's in-flight side (off the actor's
    /// thread) and answers with where each group stands.
    fn abort_in_flight(
        &mut self,
        ctx: &mut Context<Self>,
        op: OperationId,
        targets: Vec<(GlobalRank, NicSide)>,
    ) {
        let Some(f) = self.gate.in_flight() else {
            self.fail(
                op,
                Phase::Abort,
                "this training process cannot abort its collectives in flight: its framework \
                 registered no in-flight side (taskd's Gloo switch has one)"
                    .into(),
            );
            return;
        };
        self.aborted = Some(op);
        let in_step = self.gate.last_step().map_or(0, |s| s + 1);
        let started = Instant::now();
        let call = actix_rt::task::spawn_blocking(move || f.abort(&targets));
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(call).map(move |res, act, _| {
                metrics::histogram!(telemetry::IN_FLIGHT_ABORT_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                let body = match res {
                    Ok(Ok(collectives)) => ReplyBody::Aborted {
                        in_step,
                        collectives,
                    },
                    Ok(Err(e)) => ReplyBody::Failed(RankError::worker(format!(
                        "aborting the collectives in flight: {e}"
                    ))),
                    Err(e) => ReplyBody::Failed(RankError::worker(format!(
                        "aborting the collectives in flight: the call ended: {e}"
                    ))),
                };
                act.reply(op, Phase::Abort, body);
            }),
        );
    }

    /// The switch of an in-flight operation: the framework's switch call (through the HAL,
    /// as any switch) rebuilds off the training thread and re-issues from `redo`.
    fn switch_in_flight(
        &mut self,
        ctx: &mut Context<Self>,
        op: OperationId,
        (targets, call_timeout): (Vec<(GlobalRank, NicSide)>, Duration),
        redo: Vec<taskd_core::inflight::RedoPoint>,
        span: Span,
    ) {
        let Some(f) = self.gate.in_flight() else {
            self.fail(
                op,
                Phase::Switch,
                "this training process has no in-flight side to finish the step with".into(),
            );
            return;
        };
        f.arm_switch(redo);
        let (tx, rx) = oneshot::channel();
        let job = HalJob::Apply {
            rounds: vec![targets.clone()],
            call_timeout,
            reply: tx,
            span,
        };
        if self.hal.send(job).is_err() {
            self.fail(op, Phase::Switch, "the worker's HAL task is gone".into());
            return;
        }
        // `Err(None)`: the HAL's task ended without an answer (the actor says why).
        let answered = async move {
            let calls = match rx.await {
                Ok(Ok(calls)) => calls,
                Ok(Err(e)) => return Err(Some(e)),
                Err(_) => return Err(None),
            };
            // A framework HAL made the in-flight call itself (it took the redo points). A HAL
            // that only moves the communicators (HCCL's NIC set) leaves the rebuild and the
            // redo to the framework's in-flight side, called here, off the actor's thread.
            if let Some(redo) = f.take_switch() {
                let ranks: Vec<u32> = targets.iter().map(|(r, _)| r.0).collect();
                let flags: Vec<bool> = targets.iter().map(|(_, s)| s.use_backup()).collect();
                let done = actix_rt::task::spawn_blocking(move || {
                    f.switch(&ranks, &flags, &redo, call_timeout)
                })
                .await;
                let failed = match done {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("the framework's in-flight switch: {e}")),
                    Err(e) => Some(format!("the framework's in-flight switch ended: {e}")),
                };
                if let Some(why) = failed {
                    return Err(Some(RankError::worker(why)));
                }
            }
            Ok(calls)
        };
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(answered).map(move |res, act, _| {
                let body = match res {
                    Ok(calls) => {
                        if act.aborted == Some(op) {
                            // The step goes on on the rebuilt groups.
                            act.aborted = None;
                        }
                        ReplyBody::Applied { calls }
                    }
                    Err(Some(e)) => ReplyBody::Failed(e),
                    Err(None) => ReplyBody::Failed(RankError::worker(act.hal_gone())),
                };
                act.reply(op, Phase::Switch, body);
            }),
        );
    }

    /// Opens the spans of `op` (a new operation gets a new span) and its `phase`.
    fn enter_phase(&mut self, op: OperationId, phase: Phase) {
        if !matches!(&self.op_span, Some((id, _)) if *id == op) {
            let span = tracing::info_span!(
                parent: None,
                "operation",
                uuid = %op,
                job = %self.cfg.job,
                node = %self.cfg.node,
                rank = self.cfg.rank.0,
                role = "worker",
            );
            self.op_span = Some((op, span));
        }
        let op_span = &self.op_span.as_ref().expect("just set").1;
        self.phase_span = tracing::info_span!(
            parent: op_span,
            "phase",
            uuid = %op,
            phase = phase.as_str(),
            role = "worker",
            rank = self.cfg.rank.0,
        );
    }

    /// The span of `op`'s phase, if `op` is the operation in progress.
    fn span_of(&self, op: OperationId) -> Span {
        match &self.op_span {
            Some((id, _)) if *id == op => self.phase_span.clone(),
            _ => Span::none(),
        }
    }

    /// Registers what runs when the worker stops (see [`Farewell`]).
    pub fn with_farewell(mut self, f: Farewell) -> Self {
        self.farewell = Some(f);
        self
    }

    fn reply(&self, op: OperationId, phase: Phase, body: ReplyBody) {
        let _entered = self.span_of(op).entered();
        match &body {
            ReplyBody::Failed(e) => tracing::warn!(%phase, error = %e, "replying: failed"),
            _ => tracing::debug!(%phase, "replying"),
        }
        telemetry::message("out", "reply");
        let r = RankReply {
            rank: self.cfg.rank,
            op,
            phase,
            body,
        };
        if let Err(e) = self.upstream.send(WorkerToProxy::Reply(r)) {
            tracing::warn!(rank = self.cfg.rank.0, error = %e, "reply lost: proxy unreachable");
        }
    }

    /// Hands `job` to the HAL's task and, when it answers on `rx`, replies to `(op, phase)`
    /// with `ok(answer, self)`, or with the rank's failure; `ends_op` closes the operation's
    /// spans after the reply (a verification is one round).
    fn on_hal<T: 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        (op, phase): (OperationId, Phase),
        job: HalJob,
        rx: oneshot::Receiver<Result<T, RankError>>,
        ends_op: bool,
        ok: impl FnOnce(T, &mut Self) -> ReplyBody + 'static,
    ) {
        if self.hal.send(job).is_err() {
            self.fail(op, phase, "the worker's HAL task is gone".into());
            return;
        }
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(rx).map(move |res, act, _| {
                let body = match res {
                    Ok(Ok(answer)) => ok(answer, act),
                    Ok(Err(e)) => ReplyBody::Failed(e),
                    Err(_) => ReplyBody::Failed(RankError::worker(act.hal_gone())),
                };
                act.reply(op, phase, body);
                if ends_op {
                    act.phase_span = Span::none();
                    act.op_span = None;
                }
            }),
        );
    }

    /// Keeps `taskd_ranks_held` counting this rank once while its training is held.
    fn set_held(&mut self, held: bool) {
        if held != self.held {
            self.held = held;
            metrics::gauge!(telemetry::RANKS_HELD).increment(if held { 1.0 } else { -1.0 });
            if held {
                tracing::info!(rank = self.cfg.rank.0, "training held at the step gate");
            }
        }
    }

    /// Stops training for good (see [`DirectiveKind::StopTraining`]) and says so once, at
    /// ERROR: it ends this training process.
    fn stop_training(&mut self, op: OperationId, reason: &str) {
        // How far training got, read before the stop arms the gate.
        let at_step = self.gate.last_step();
        if self.gate.stop_training(reason) {
            tracing::error!(rank = self.cfg.rank.0, %reason, "the manager stopped training; the training loop ends at its step gate");
            metrics::counter!(telemetry::TRAINING_STOPS).increment(1);
        }
        self.set_held(false);
        self.reply(op, Phase::Stop, ReplyBody::Stopped { at_step });
        self.phase_span = Span::none();
        self.op_span = None;
    }

    fn fail(&self, op: OperationId, phase: Phase, message: String) {
        self.reply(op, phase, ReplyBody::Failed(RankError::worker(message)));
    }

    /// Why a HAL job ended without an answer: the HAL's panic, when it panicked.
    fn hal_gone(&self) -> String {
        match &*self.hal_panic.lock() {
            Some(p) => p.to_string(),
            None => "the worker's HAL task stopped during the call".into(),
        }
    }
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let addr = ctx.address();
        self.gate.set_notify(move |ev| addr.do_send(GateNotice(ev)));
        if let Some(timeout) = self.cfg.hang_timeout {
            let mut watch = HangWatch::new(timeout, Instant::now());
            tracing::info!(
                rank = self.cfg.rank.0,
                ?timeout,
                "hang watch on: a rank that finishes no step for the timeout is reported hung"
            );
            ctx.run_interval(watch.period(), move |act, _| act.watch_progress(&mut watch));
        }
        if let Some((hal, jobs)) = self.hal_home.take() {
            let task = hal_task(self.cfg.rank, hal, jobs, self.hal_panic.clone());
            ctx.spawn(actix::fut::wrap_future(task));
        }
        let (tx, rx) = oneshot::channel();
        let job = HalJob::Capabilities {
            tsp: self.cfg.tsp,
            reply: tx,
        };
        if self.hal.send(job).is_err() {
            tracing::error!(rank = self.cfg.rank.0, "the worker's HAL task is gone");
            ctx.stop();
            return;
        }
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(rx).map(|caps, act, ctx| {
                let Ok(caps) = caps else {
                    tracing::error!(rank = act.cfg.rank.0, error = %act.hal_gone(), "no capabilities from the HAL: the worker stops");
                    ctx.stop();
                    return;
                };
                let hello = WorkerHello {
                    job: act.cfg.job.clone(),
                    node: act.cfg.node.clone(),
                    rank: act.cfg.rank,
                    capabilities: caps,
                    instance: act.instance,
                    generation: act.cfg.generation,
                };
                telemetry::message("out", "hello");
                if act.upstream.send(WorkerToProxy::Hello(hello)).is_err() {
                    ctx.stop();
                }
            }),
        );
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.gate.shutdown();
        self.set_held(false);
        if let Some(f) = self.farewell.take() {
            f(self.cfg.rank);
        }
        // Closing the channel ends the HAL's task (and a HAL's own thread after its current
        // call).
        let (tx, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.hal, tx));
    }
}

impl Handler<Deliver<Directive>> for Worker {
    type Result = ();

    fn handle(&mut self, Deliver(d): Deliver<Directive>, ctx: &mut Self::Context) {
        telemetry::message("in", d.phase().as_str());
        if !d.kind.is_for(self.instance) {
            // A stop sent again to another (an old) process of this rank.
            return;
        }
        let op = d.op;
        let phase = d.phase();
        self.enter_phase(op, phase);
        let span = self.phase_span.clone();
        let _entered = span.enter();
        tracing::debug!("directive received");
        match d.kind {
            DirectiveKind::Sample { .. } => match self.gate.sample(op) {
                Ok(Some(in_step)) => {
                    let in_flight = self.gate.in_flight().is_some();
                    self.reply(op, phase, ReplyBody::Sampled { in_step, in_flight })
                }
                // No step completed yet: the gate answers at the first boundary.
                Ok(None) => {}
                Err(e) => self.fail(op, phase, e.to_string()),
            },
            DirectiveKind::PauseAt { step } => {
                if let Err(e) = self.gate.pause_at(op, step) {
                    self.fail(op, phase, e.to_string());
                }
            }
            DirectiveKind::Switch {
                targets,
                call_timeout,
            } => self.set_nics(
                ctx,
                (op, phase),
                (vec![targets], call_timeout),
                span.clone(),
            ),
            DirectiveKind::Rollback {
                targets,
                restate,
                call_timeout,
            } => {
                let rounds = vec![targets, restate];
                self.set_nics(ctx, (op, phase), (rounds, call_timeout), span.clone())
            }
            DirectiveKind::StopTraining { reason, .. } => self.stop_training(op, &reason),
            DirectiveKind::AbortInFlight { targets } => self.abort_in_flight(ctx, op, targets),
            DirectiveKind::SwitchInFlight {
                targets,
                call_timeout,
                redo,
            } => self.switch_in_flight(ctx, op, (targets, call_timeout), redo, span.clone()),
            DirectiveKind::Verify => {
                // A round starts only once every rank is registered.
                self.gate.job_whole();
                let (tx, rx) = oneshot::channel();
                self.on_hal(
                    ctx,
                    (op, phase),
                    HalJob::Report(tx),
                    rx,
                    true,
                    |groups, act| {
                        ReplyBody::Verified(WorkerReport {
                            groups,
                            gate: act.gate.report(),
                        })
                    },
                );
            }
            DirectiveKind::Resume => {
                if let (Some(aborted), Some(f)) = (self.aborted.take(), self.gate.in_flight()) {
                    // The move did not finish the step here: the waiting collectives fail
                    // their callers (the recovery path of a failed collective).
                    let reason = format!("the in-flight move {aborted} did not finish");
                    tracing::warn!(%reason, "giving the collectives in flight up");
                    drop(actix_rt::task::spawn_blocking(move || f.give_up(&reason)));
                }
                let stalled = self.gate.resume(op);
                // Opened (it serves no operation now), or left to a later operation's hold.
                if self.gate.report().op.is_none() {
                    self.set_held(false);
                }
                tracing::debug!(stalled_ms = stalled.as_secs_f64() * 1e3, "gate opened");
                self.reply(op, phase, ReplyBody::Resumed { stalled });
                // The operation is over for this rank: close its spans.
                self.phase_span = Span::none();
                self.op_span = None;
            }
        }
    }
}

impl Worker {
    /// One sample of the hang watch; a change goes upstream.
    fn watch_progress(&mut self, watch: &mut HangWatch) {
        let sample = hang_watch::Sample {
            last_step: self.gate.last_step(),
            resting: self.gate.held_step().is_some() || self.gate.stopped().is_some(),
        };
        let notice = match watch.observe(sample, Instant::now()) {
            None => return,
            Some(Change::Stalled {
                last_step,
                stalled_for,
            }) => {
                tracing::error!(rank = self.cfg.rank.0, last_step, ?stalled_for, "training finished no step for the hang watch's timeout: reporting this rank hung");
                StallNotice {
                    rank: self.cfg.rank,
                    instance: self.instance,
                    last_step,
                    stalled_for: Some(stalled_for),
                }
            }
            Some(Change::Progressing { last_step }) => {
                tracing::warn!(
                    rank = self.cfg.rank.0,
                    last_step,
                    "training finished a step again after a stall"
                );
                StallNotice {
                    rank: self.cfg.rank,
                    instance: self.instance,
                    last_step,
                    stalled_for: None,
                }
            }
        };
        telemetry::message("out", "stall");
        if let Err(e) = self.upstream.send(WorkerToProxy::Stall(notice)) {
            tracing::warn!(rank = self.cfg.rank.0, error = %e, "the stall notice could not be sent");
        }
    }
}

/// A gate event, delivered from the training thread.
#[derive(Message)]
#[rtype(result = "()")]
struct GateNotice(GateEvent);

impl Handler<GateNotice> for Worker {
    type Result = ();

    fn handle(&mut self, GateNotice(ev): GateNotice, _ctx: &mut Self::Context) {
        match ev {
            GateEvent::Sampled { op, in_step } => {
                let in_flight = self.gate.in_flight().is_some();
                self.reply(op, Phase::Sample, ReplyBody::Sampled { in_step, in_flight })
            }
            GateEvent::Held { op, step } => {
                self.set_held(true);
                self.reply(op, Phase::Pause, ReplyBody::Paused { step })
            }
            GateEvent::HeldProvisionally { op, step } => {
                tracing::trace!(rank = self.cfg.rank.0, %op, step, "holding until the pause step is known")
            }
            GateEvent::Overran { op, step, bound } => self.fail(
                op,
                Phase::Pause,
                format!("training ran past the pause step: finished {step}, bound {bound}"),
            ),
        }
    }
}

/// Stops the worker, as if its process had died.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopWorker;

impl Handler<StopWorker> for Worker {
    type Result = ();

    fn handle(&mut self, _: StopWorker, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// What one process has applied, per group. Owned by the HAL's task, which makes every call;
/// a new process starts with nothing applied (HCCL's default).
type Applied = BTreeMap<String, GroupApplied>;

/// What one process has applied to one group.
#[derive(Default)]
struct GroupApplied {
    /// The members it set to their backup NIC.
    on_backup: BTreeSet<GlobalRank>,
    /// The targets of its last call on the group when that call failed (see
    /// [`GroupView::unsettled`]).
    unsettled: BTreeSet<GlobalRank>,
}

/// What this rank lacks for a switch: the HAL's answer (its backend's) with this process's
/// own `tsp` (`MS_ENABLE_TFT`), which no HAL knows. The one place the two are joined.
pub(crate) fn rank_capabilities(hal_says: SwitchCapabilities, tsp: bool) -> SwitchCapabilities {
    hal_says.with_tsp(tsp)
}

/// Hands the worker's jobs to its HAL, one at a time: a job starts once the one before ended,
/// so the rank's calls are strictly sequential. Ends when the worker drops the channel. A
/// panic in the HAL ends its job (whose answer is then missing) and takes the HAL out of
/// service: `panicked` says why, and the jobs after it end unanswered too.
async fn hal_task(
    rank: GlobalRank,
    mut hal: Box<dyn TaskRankHal>,
    mut jobs: mpsc::UnboundedReceiver<HalJob>,
    panicked: Arc<parking_lot::Mutex<Option<HalPanicked>>>,
) {
    let mut applied = Applied::new();
    while let Some(job) = jobs.recv().await {
        if panicked.lock().is_some() {
            continue;
        }
        if let Err(p) = caught(run_job(rank, hal.as_mut(), &mut applied, job)).await {
            tracing::error!(rank = rank.0, error = %p, "this rank's HAL is out of service");
            *panicked.lock() = Some(p);
        }
    }
}

async fn run_job(rank: GlobalRank, hal: &mut dyn TaskRankHal, applied: &mut Applied, job: HalJob) {
    match job {
        HalJob::Capabilities { tsp, reply } => {
            let _ = reply.send(rank_capabilities(hal.capabilities(), tsp));
        }
        HalJob::Report(reply) => {
            let _ = reply.send(report(hal, applied).await);
        }
        HalJob::Apply {
            rounds,
            call_timeout,
            reply,
            span,
        } => {
            hal.set_call_timeout(call_timeout);
            let res = apply_rounds(rank, hal, &rounds, applied)
                .instrument(span)
                .await;
            let _ = reply.send(res);
        }
    }
}

/// [`apply`] for each round in turn, a group's calls in one phase reported as one
/// ([`AppliedCall::record`]). A failed round does not stop the next: its peers wait in its
/// calls. The first failure is reported.
async fn apply_rounds(
    rank: GlobalRank,
    hal: &mut dyn TaskRankHal,
    rounds: &[Vec<(GlobalRank, NicSide)>],
    applied: &mut Applied,
) -> Result<Vec<AppliedCall>, RankError> {
    let mut calls = Vec::new();
    let mut first_error = None;
    for round in rounds.iter().filter(|r| !r.is_empty()) {
        match apply(rank, hal, round, applied).await {
            Ok(made) => made
                .into_iter()
                .for_each(|c| AppliedCall::record(&mut calls, c)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(calls), Err)
}

/// Every group of this process with the members this process set to their backup NIC.
async fn report(hal: &mut dyn TaskRankHal, applied: &Applied) -> Result<Vec<GroupView>, RankError> {
    let started = Instant::now();
    let groups = hal.groups().await;
    telemetry::hal_call("groups", groups.is_ok(), started.elapsed());
    let groups = groups.map_err(RankError::hal)?;
    let mut views: Vec<GroupView> = groups
        .into_iter()
        .map(|g| {
            let a = applied.get(&g.name);
            GroupView {
                on_backup: a
                    .map(|a| a.on_backup.iter().copied().collect())
                    .unwrap_or_default(),
                unsettled: a
                    .map(|a| a.unsettled.iter().copied().collect())
                    .unwrap_or_default(),
                size: g.members.len() as u32,
                group: g.name,
            }
        })
        .collect();
    views.sort_by(|a, b| a.group.cmp(&b.group));
    Ok(views)
}

/// One planned call with what is needed after it: its group's size and, for each of its
/// group ranks, the global rank.
struct Planned {
    call: GroupCall,
    group_size: u32,
    targets: Vec<GlobalRank>,
}

/// Reads this rank's groups and plans its calls (see [`apply`]). The group lists are dropped
/// here: a rank that waits in a rendezvous keeps only its plan (a world group of 16,384
/// members is 64 KiB a rank, and in a simulation thousands of ranks wait at once).
async fn plan(
    hal: &mut dyn TaskRankHal,
    targets: &[(GlobalRank, NicSide)],
) -> Result<Vec<Planned>, RankError> {
    let started = Instant::now();
    let groups = hal.groups().await;
    telemetry::hal_call("groups", groups.is_ok(), started.elapsed());
    if let Err(e) = &groups {
        telemetry::hal_error("groups", e);
    }
    let groups = groups.map_err(RankError::hal)?;
    Ok(plan_calls(&groups, targets)
        .into_iter()
        .map(|call| {
            let members = groups
                .iter()
                .find(|g| g.name == call.group)
                .map_or(&[][..], |g| &g.members[..]);
            let targets = call
                .ranks
                .iter()
                .filter_map(|gr| members.get(gr.0 as usize).copied())
                .collect();
            Planned {
                group_size: members.len() as u32,
                targets,
                call,
            }
        })
        .collect())
}

/// Plans and makes every call for this rank. A failed group does not stop the remaining
/// ones: peers of those groups are already waiting in the collective call, and a rank that
/// skipped them would leave them hanging. The first failure is reported.
async fn apply(
    rank: GlobalRank,
    hal: &mut dyn TaskRankHal,
    targets: &[(GlobalRank, NicSide)],
    applied: &mut Applied,
) -> Result<Vec<AppliedCall>, RankError> {
    let mut calls = Vec::new();
    let mut first_error = None;
    for p in plan(hal, targets).await? {
        let call = p.call;
        let t = Instant::now();
        let use_backup = call.use_backup();
        // The call is made inside its span, on whichever thread makes it.
        let span = tracing::debug_span!("hal_call", op = "set_working_nic", group = %call.group);
        let made = span.in_scope(|| hal.set_working_nic(&call.group, &call.ranks, &use_backup));
        let res = made.instrument(span).await;
        telemetry::hal_call("set_working_nic", res.is_ok(), t.elapsed());
        if let Err(e) = &res {
            telemetry::hal_error("set_working_nic", e);
        }
        match res {
            Ok(()) => {
                // The call set exactly the targets that are members of this group.
                let view = applied.entry(call.group.clone()).or_default();
                view.unsettled.clear();
                for (m, side) in p.targets.iter().zip(&call.sides) {
                    match side {
                        NicSide::Backup => view.on_backup.insert(*m),
                        NicSide::Primary => view.on_backup.remove(m),
                    };
                }
                calls.push(AppliedCall {
                    group: call.group.clone(),
                    group_size: p.group_size,
                    digest: call.digest(),
                })
            }
            Err(e) => {
                tracing::warn!(rank = rank.0, group = %call.group, error = %e, "NIC set failed");
                // Whether any of the group's operators took the change is not known.
                applied.entry(call.group.clone()).or_default().unsettled =
                    p.targets.iter().copied().collect();
                first_error.get_or_insert(RankError::in_group(call.group.clone(), e));
            }
        }
    }
    match first_error {
        None => Ok(calls),
        Some(e) => Err(e),
    }
}
