//! The manager: one per job. It admits commands through the [`JobLedger`], runs the operation
//! state machine, carries out its actions (broadcasts, deadlines, the final report) and
//! delivers each result to whoever waits for it. With automatic failover on, it also runs the
//! policy's decisions (`manager/auto.rs`).

mod auto;

pub use auto::AwaitAutoSettled;

mod clusterd;

mod faults;

mod hold;

mod journal_writer;

mod last_words;

mod waiters;

pub use faults::ReportFault;
pub use hold::{HoldPolicy, SetHoldPolicy, StopTraining, DEFAULT_HOLD_BOUND};
pub use last_words::{LastWordsHost, SetLastWords, DEFAULT_LAST_WORDS_BOUND};

pub use clusterd::{
    AttachClusterd, ClusterdLink, ClusterdLinkChanged, ClusterdSessionEnded, ClusterdSignal,
    ClusterdSwitch,
};

use crate::journal::OperationJournal;
use crate::observer::{self, Observer};
use crate::progress::ProgressFeed;
use crate::telemetry;
use crate::transport::{Deliver, Link};
use actix::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd_core::ledger::{LostRank as LostRankOf, Registered, Submitted};
use taskd_core::ledger::{ProcessRecovery, RecoverTo, RecoveryStarted, Restarts};
use taskd_core::operation::{Action, Event, OperationReport, Trigger};
use taskd_core::protocol::{Directive, Phase, ProxyToManager};
use taskd_core::verify::VerifyReport;
use taskd_core::{
    GlobalRank, JobId, JobLedger, JobState, NodeName, OperationId, PhaseDeadlines, RankTable,
    SubmitError, SwitchCommand,
};
use tokio::sync::oneshot;
use tracing::Span;

/// How often a journal that cannot be written is tried again.
const JOURNAL_RETRY: Duration = Duration::from_secs(1);

/// A journal write that takes this long is logged.
const JOURNAL_SLOW: Duration = Duration::from_secs(1);

/// How long the manager waits for a journal write by default
/// ([`Manager::with_journal_timeout`]): past it the journal is failing.
pub const DEFAULT_JOURNAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The manager actor: the job's [`JobLedger`], the links to the nodes' proxies, the deadline
/// armed and whoever waits for a result. What it shows of its work (spans, metrics, the
/// progress feed) is the business of the observer it tells what happens
/// (`actors/src/observer.rs`).
pub struct Manager {
    ledger: JobLedger,
    epoch: Instant,
    nodes: BTreeMap<NodeName, Link<Directive>>,
    deadline: Option<SpawnHandle>,
    /// Whoever waits for a result, a round's report, registrations or calls answered.
    waiters: waiters::Waiters,
    observer: Observer,
    /// ClusterD's side, when the manager is its client (`manager/clusterd.rs`).
    clusterd: Option<clusterd::Side>,
    /// Automatic failover, when on ([`Manager::with_auto`]).
    auto: Option<auto::Auto>,
    /// Where every final result is recorded for the next manager ([`Manager::with_journal`]).
    /// Written on a thread of its own (`manager/journal_writer.rs`).
    journal: Option<journal_writer::JournalWriter>,
    /// The timers of the ledger's bounds: the hold's and the stop's (`manager/hold.rs`).
    bounds: hold::Bounds,
    /// The last stop of training whose end was said ("the job runs again").
    stop_announced: Option<OperationId>,
    /// The host of the last-words checkpoint before a stop, and its bound
    /// (`manager/last_words.rs`).
    last_words: Option<(Arc<dyn LastWordsHost>, Duration)>,
    /// The stop whose last words were asked for.
    last_words_asked: Option<OperationId>,
    /// The last journal write's error while the journal cannot be written (nothing new is
    /// admitted then); `None` while it can.
    journal_failing: Option<String>,
    /// The longest the manager waits for a journal write ([`Manager::with_journal_timeout`]).
    journal_timeout: Duration,
}

impl Manager {
    /// A manager of job `job`, laid out as `table`, bounding each phase by `deadlines`.
    pub fn new(job: JobId, table: RankTable, deadlines: PhaseDeadlines) -> Self {
        let observer = Observer::new(table.world_size());
        let ledger = JobLedger::new(job, table, deadlines);
        Manager {
            ledger,
            epoch: Instant::now(),
            nodes: BTreeMap::new(),
            deadline: None,
            waiters: waiters::Waiters::default(),
            observer,
            clusterd: None,
            auto: None,
            journal: None,
            bounds: hold::Bounds::default(),
            stop_announced: None,
            last_words: None,
            last_words_asked: None,
            journal_failing: None,
            journal_timeout: DEFAULT_JOURNAL_TIMEOUT,
        }
    }

    /// Process recovery coordinated by this manager (see
    /// [`JobLedger::set_process_recovery`]): a rank whose process died restarts the whole job
    /// through every node's launcher, at most `recovery.max_restarts` times.
    pub fn with_process_recovery(mut self, recovery: Option<ProcessRecovery>) -> Self {
        self.ledger.set_process_recovery(recovery);
        self
    }

    /// Bounds every stop of training: past it, the stop is overdue and says what it waits for.
    pub fn with_stop_bound(mut self, bound: Duration) -> Self {
        self.ledger.set_stop_bound(bound);
        self
    }

    /// Waits for a journal write at most `bound` (default [`DEFAULT_JOURNAL_TIMEOUT`]): a
    /// write that takes longer (a file system that does not answer) is a failing journal's.
    /// The manager handles nothing else while it waits (that keeps its records, directives
    /// and results in order), so the bound is also how long a journal can keep the manager
    /// from answering its status, its losses and its signals.
    pub fn with_journal_timeout(mut self, bound: Duration) -> Self {
        self.journal_timeout = bound;
        if let Some(w) = self.journal.as_mut() {
            w.set_bound(bound);
        }
        self
    }

    /// Records every operation in `journal` when it is admitted and its final result before
    /// anyone is told it, and answers the uuids already recorded there (an earlier manager's,
    /// `actors/src/journal.rs`) as the manager that ran them: a repeated uuid gets the earlier
    /// result, a reused one is refused, and one whose manager stopped before its result is
    /// refused as interrupted.
    pub fn with_journal(mut self, journal: Arc<dyn OperationJournal>) -> Self {
        let earlier = journal.load();
        if !earlier.is_empty() {
            tracing::info!(
                operations = earlier.len(),
                "the operation journal remembers earlier results"
            );
        }
        let interrupted = journal.interrupted();
        for op in &interrupted {
            tracing::warn!(id = %op.id, "an earlier manager stopped before this operation's result; its uuid is refused");
        }
        self.ledger.seed(earlier);
        self.ledger.seed_interrupted(interrupted);
        self.journal = Some(journal_writer::JournalWriter::spawn(
            journal,
            self.journal_timeout,
        ));
        metrics::gauge!(telemetry::JOURNAL_FAILING).set(0.0);
        self
    }

    /// Where this manager publishes the progress of its operations. Take it before starting
    /// the actor to subscribe from outside; [`SubscribeProgress`] does the same through the
    /// actor's address.
    pub fn progress(&self) -> ProgressFeed {
        self.observer.progress()
    }

    /// Tells the observer how many ranks the phase in flight still waits for.
    fn observe_waiting(&mut self) {
        if let Some(op) = self.ledger.in_flight() {
            self.observer.waiting(op.phase(), op.pending().len());
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn run(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        let followed = self.clusterd_follow(&actions);
        self.run_from(actions.into_iter(), followed, ctx);
    }

    /// Carries out `actions`, then what ClusterD's side decided of them. A final result is
    /// journaled before anything else happens: the actions after it, and ClusterD's, wait
    /// for its write ([`Manager::finish`]).
    fn run_from(
        &mut self,
        mut actions: std::vec::IntoIter<Action>,
        followed: Option<clusterd::Followed>,
        ctx: &mut Context<Self>,
    ) {
        while let Some(a) = actions.next() {
            match a {
                Action::Broadcast(d) => self.broadcast(d, ctx),
                Action::ArmDeadline { token, phase, at } => {
                    if let Some(h) = self.deadline.take() {
                        ctx.cancel_future(h);
                    }
                    let after = at.saturating_sub(self.now());
                    self.observer.deadline_armed(phase, after);
                    self.deadline = Some(ctx.run_later(after, move |act, ctx| {
                        act.deadline = None;
                        let now = act.now();
                        let actions = act.ledger.handle(Event::Deadline { token }, now);
                        act.run(actions, ctx);
                    }));
                }
                Action::Finish(report) => {
                    return self.finish(*report, ctx, move |act, ctx| {
                        act.run_from(actions, followed, ctx)
                    });
                }
                Action::Verified(report) => self.verified(*report, ctx),
                Action::Held(at) => self.observer.held(at),
            }
        }
        if let Some(f) = followed {
            self.clusterd_after(f, ctx);
        }
    }

    /// Starts a verification round when one is owed and can run (see
    /// [`taskd_core::verify`]).
    fn maybe_verify(&mut self, ctx: &mut Context<Self>) {
        if !self.ledger.verify_due() {
            return;
        }
        let id = OperationId(uuid::Uuid::new_v4());
        self.observer
            .verification_started(id, self.ledger.registered());
        let actions = self.ledger.start_verification(id, self.now());
        self.run(actions, ctx);
    }

    fn verified(&mut self, report: VerifyReport, ctx: &mut Context<Self>) {
        if let Some(h) = self.deadline.take() {
            ctx.cancel_future(h);
        }
        self.observer.verification_done(&report);
        // A rank that registered but did not report: ask again, soon when it answered with a
        // failure (not set up yet), after the deadline when it did not answer.
        if let Some(again) = report.ask_again_after(self.ledger.deadlines().resume) {
            ctx.run_later(again, |act, ctx| act.maybe_verify(ctx));
        }
        self.waiters.round_done(&report);
        self.job_changed();
        let ended = self.ledger.last_training_stop().map(|s| s.id);
        let newly_ended = ended.filter(|id| self.stop_announced != Some(*id));
        self.stop_announced = ended;
        self.after_verification(newly_ended, ctx);
        self.auto_evaluate(ctx);
    }

    fn broadcast(&mut self, d: Directive, ctx: &mut Context<Self>) {
        let waiting = self
            .ledger
            .in_flight()
            .map(|op| op.pending().len())
            .unwrap_or(0);
        // A stop of training is no operation's phase (`manager/hold.rs` reports it).
        if d.phase() != Phase::Stop {
            self.observer.phase_started(&d, waiting);
        }
        let mut gone = Vec::new();
        for (node, link) in &self.nodes {
            self.observer.sent(d.phase());
            if let Err(e) = link.send(d.clone()) {
                gone.push((node.clone(), e));
            }
        }
        for (node, e) in gone {
            self.node_gone(&node, &format!("sending to its proxy failed: {e}"), ctx);
        }
    }

    /// A node's proxy is out of reach: its ranks are unreachable, not known dead (their
    /// processes may train on, see [`taskd_core::protocol::Gone::Unreachable`]).
    fn node_gone(&mut self, node: &NodeName, reason: &str, ctx: &mut Context<Self>) {
        self.nodes.remove(node);
        let ranks = self.ledger.table().ranks_of(node);
        for rank in ranks {
            if self.ledger.is_registered(rank) {
                let now = self.now();
                let lost = LostRankOf::unreachable(format!("proxy of {node}: {reason}"));
                let actions = self.ledger.worker_lost(rank, lost, now);
                self.run(actions, ctx);
            }
        }
        self.observe_waiting();
        self.job_changed();
        self.follow_bounds(ctx);
    }

    /// An operation's final result: journaled, then published (the observer, its waiters,
    /// the policy), then `then` carries on with what followed it.
    fn finish(
        &mut self,
        mut report: OperationReport,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        if let Some(h) = self.deadline.take() {
            ctx.cancel_future(h);
        }
        self.journal(ctx, move |act, failed, ctx| {
            if let Some(why) = failed {
                act.ledger.note_not_journaled(report.id, &why);
                report.journal_error = Some(why);
            }
            act.observer.operation_finished(&report, &act.ledger);
            act.wake_registered();
            act.waiters.finished(&report);
            act.maybe_verify(ctx);
            act.follow_bounds(ctx);
            act.auto_finished(&report, ctx);
            then(act, ctx);
        });
    }

    /// Records the ledger's new admissions and final results in the journal, in that order:
    /// an admission before the operation's first directive, a result before it is published
    /// (a client that saw a result can count on a new manager knowing it). The writes run on
    /// the journal's thread (`manager/journal_writer.rs`) and the actor waits for them
    /// (`ctx.wait`: it handles nothing else meanwhile, while its thread keeps serving the
    /// transport and the control API), at most its journal timeout; then `then` carries on,
    /// with the error of a write that failed or did not finish in time, for the report of a
    /// result that is not durable to say so, or for an admission to be withdrawn. A write that
    /// fails does not stop the operation, but nothing new is admitted until the journal can be
    /// written again ([`Manager::when_journal_ready`]). With nothing to write (or no journal),
    /// `then` runs at once.
    fn journal(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Option<String>, &mut Context<Self>) + 'static,
    ) {
        use journal_writer::Write;
        let (admitted, finished) = (self.ledger.take_admitted(), self.ledger.take_finished());
        let writes: Vec<_> = (admitted.into_iter().map(Write::Admit))
            .chain(finished.into_iter().map(|op| Write::Record(Box::new(op))))
            .collect();
        let Some(writer) = self.journal.as_ref().filter(|_| !writes.is_empty()) else {
            return then(self, None, ctx);
        };
        // Behind a write that has not returned (a file system that does not answer), these
        // would wait as long: they go to the thread, but nobody waits for them.
        let stuck = writer.busy_for().filter(|t| *t >= self.journal_timeout);
        let written = writer.write(writes);
        if let Some(t) = stuck {
            let why = not_finished(t);
            self.journal_failed(why.clone(), ctx);
            return then(self, Some(why), ctx);
        }
        let started = Instant::now();
        let bound = self.journal_timeout;
        let bounded = async move {
            tokio::time::timeout(bound, written)
                .await
                .unwrap_or_else(|_| Some(not_finished(bound)))
        };
        ctx.wait(bounded.into_actor(self).map(move |failed, act, ctx| {
            let took = started.elapsed();
            if took >= JOURNAL_SLOW {
                tracing::warn!(?took, "the operation journal's write was slow (a busy disk?); the manager's transport kept running meanwhile");
            }
            if let Some(why) = &failed {
                act.journal_failed(why.clone(), ctx);
            }
            then(act, failed, ctx)
        }));
    }

    /// A journal write failed with `why`: say so (status, metrics) and retry every second
    /// until a write succeeds.
    fn journal_failed(&mut self, why: String, ctx: &mut Context<Self>) {
        metrics::counter!(telemetry::JOURNAL_WRITE_FAILURES_TOTAL).increment(1);
        if self.journal_failing.replace(why).is_none() {
            metrics::gauge!(telemetry::JOURNAL_FAILING).set(1.0);
            ctx.run_later(JOURNAL_RETRY, Self::retry_journal);
        }
    }

    /// Writes the journal again on its thread, waiting for it as for any write; again after
    /// [`JOURNAL_RETRY`] while it fails. While an earlier write has not returned, it only
    /// waits for the next try.
    fn retry_journal(&mut self, ctx: &mut Context<Self>) {
        if self.journal_failing.is_none() {
            return;
        }
        self.flush_journal(ctx, |_, failed, ctx| {
            if failed.is_some() {
                ctx.run_later(JOURNAL_RETRY, Self::retry_journal);
            }
        });
    }

    /// Writes everything the journal holds again, waiting for it at most the journal timeout,
    /// then `then` with the failure (`None`: the journal is writable again). When a write has
    /// not returned for the journal timeout, nothing is written and the failure says so; one
    /// still within it (the withdrawal of a refused admission, say) is waited behind.
    fn flush_journal(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Option<String>, &mut Context<Self>) + 'static,
    ) {
        let Some(writer) = self.journal.as_ref() else {
            return then(self, None, ctx);
        };
        if let Some(t) = writer.busy_for().filter(|t| *t >= self.journal_timeout) {
            let why = not_finished(t);
            self.journal_failing = Some(why.clone());
            return then(self, Some(why), ctx);
        }
        let written = writer.write(vec![journal_writer::Write::Flush]);
        let bound = self.journal_timeout;
        let bounded = async move {
            tokio::time::timeout(bound, written)
                .await
                .unwrap_or_else(|_| Some(not_finished(bound)))
        };
        ctx.wait(bounded.into_actor(self).map(|failed, act, ctx| {
            match &failed {
                None => act.journal_writable(),
                Some(why) => {
                    act.journal_failing = Some(why.clone());
                    metrics::counter!(telemetry::JOURNAL_WRITE_FAILURES_TOTAL).increment(1);
                }
            }
            then(act, failed, ctx)
        }));
    }

    /// A write of everything the journal holds succeeded after a failure.
    fn journal_writable(&mut self) {
        if self.journal_failing.take().is_some() {
            tracing::warn!(
                "the operation journal can be written again: operations are admitted again"
            );
            metrics::gauge!(telemetry::JOURNAL_FAILING).set(0.0);
        }
    }

    /// `Ok` when the journal can take a new operation now, else
    /// [`SubmitError::JournalFailing`] with the last error. It writes nothing: the retries
    /// every [`JOURNAL_RETRY`] find when it can again (the commands of the operator try at
    /// once, [`Manager::when_journal_ready`]).
    fn journal_ready(&mut self) -> Result<(), SubmitError> {
        match (&self.journal, &self.journal_failing) {
            (Some(_), Some(why)) => Err(SubmitError::JournalFailing { why: why.clone() }),
            _ => Ok(()),
        }
    }

    /// Calls `then` with whether the journal can take a new operation: at once while it can;
    /// while it cannot, after a write of everything it holds (bounded by the journal timeout,
    /// and not tried behind a write that has not returned), so an operator's command finds a
    /// journal that can be written again at once, not at the next retry.
    fn when_journal_ready(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Result<(), SubmitError>, &mut Context<Self>) + 'static,
    ) {
        if self.journal_ready().is_ok() {
            return then(self, Ok(()), ctx);
        }
        self.flush_journal(ctx, |act, failed, ctx| {
            let ready = match failed {
                None => Ok(()),
                Some(why) => Err(SubmitError::JournalFailing { why }),
            };
            then(act, ready, ctx)
        });
    }

    /// An operation the ledger just started under `span`: once its admission is durable,
    /// tells the observer, then carries out its first actions.
    ///
    /// The receiver fires once the admission is durable (`Ok`): the operator's answer
    /// ("started") waits for it, so a uuid the operator saw accepted is known to any later
    /// manager. When the admission cannot be written (the write failed or did not finish
    /// within the journal timeout), nothing of the operation runs: it is withdrawn from the
    /// ledger (and its admission from the journal, should the write land later), and the
    /// receiver gets the refusal ([`SubmitError::JournalFailing`]).
    fn operation_started(
        &mut self,
        id: OperationId,
        span: Span,
        actions: Vec<Action>,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<Result<(), SubmitError>> {
        let admitted = Instant::now();
        let (durable, rx) = oneshot::channel();
        self.journal(ctx, move |act, failed, ctx| {
            if let Some(why) = failed {
                act.withdraw(id, &span, why.clone());
                let _ = durable.send(Err(SubmitError::JournalFailing { why }));
                return;
            }
            let _ = durable.send(Ok(()));
            // The first phase starts once its admission is durable: its deadline counts from
            // there, not from the admission (a slow disk fails no operation by itself).
            let waited = admitted.elapsed();
            let actions = actions.into_iter().map(|a| match a {
                Action::ArmDeadline { token, phase, at } => Action::ArmDeadline {
                    token,
                    phase,
                    at: at + waited,
                },
                a => a,
            });
            let plan = act.ledger.in_flight().map(|op| op.plan());
            let (job, ranks) = (act.ledger.job(), act.ledger.expected());
            act.observer.operation_started(id, span, job, plan, ranks);
            act.job_changed();
            act.run(actions.collect(), ctx);
        });
        rx
    }

    /// Takes back operation `id`, whose admission could not be written (`why`), before any
    /// of its actions ran: the ledger forgets it, and so does the journal (its admission may
    /// land once the file system answers again; the withdrawal follows it there).
    fn withdraw(&mut self, id: OperationId, span: &Span, why: String) {
        if self.ledger.withdraw(id) {
            if let Some(w) = &self.journal {
                drop(w.write(vec![journal_writer::Write::Withdraw(id)]));
            }
        }
        let e = SubmitError::JournalFailing { why };
        self.observer.command_refused(span, &e);
        self.auto_withdrawn(id);
        self.job_changed();
    }

    /// The job's registrations, operation, NIC table or state may have changed.
    fn job_changed(&mut self) {
        self.observer.job_changed(&self.ledger);
        self.wake_registered();
        self.wake_calls_answered();
    }

    /// Resolves the [`AwaitCallsAnswered`] waiters once no rank is left inside calls.
    fn wake_calls_answered(&mut self) {
        if self.ledger.ranks_in_calls().is_none() {
            self.waiters.calls_answered();
        }
    }

    /// Resolves the registration waiters whose condition holds.
    fn wake_registered(&mut self) {
        let n = self.ledger.registered();
        let verified = self.ledger.is_verified() && self.ledger.verifying().is_none();
        let all = self.ledger.expected();
        self.waiters.wake_registered(n, all, verified);
    }
}

impl Actor for Manager {
    type Context = Context<Self>;
}

/// The failure of a journal write that has not returned after `t`.
fn not_finished(t: Duration) -> String {
    format!(
        "a write of the operation journal has not finished after {:.1}s (its file system does not answer?)",
        t.as_secs_f64()
    )
}

/// A proxy's connection is up; directives for its node go through `link`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProxyConnected {
    /// The proxy's node; a second connection for the node replaces the first.
    pub node: NodeName,
    /// Where the node's directives go from now on.
    pub link: Link<Directive>,
}

/// A proxy's connection closed: every rank of the node is lost.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProxyDisconnected {
    /// The node whose proxy is gone.
    pub node: NodeName,
    /// What the transport saw (closed, heartbeats missed), for the lost ranks' reason.
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
                self.observer.received("worker_up");
                let (rank, instance) = (hello.rank, hello.instance);
                let res = self.ledger.register(hello);
                let (registered, expected) = (self.ledger.registered(), self.ledger.expected());
                self.observer
                    .registration(rank, res.as_ref().map(|_| ()), registered, expected);
                if let Ok(Registered::Retired(actions)) = res {
                    tracing::warn!(rank = rank.0, %instance, "a process that training was stopped on registered again (its node was cut off during the stop): stopping it again");
                    self.run(actions, ctx);
                }
                self.job_changed();
                self.maybe_verify(ctx);
                self.follow_bounds(ctx);
            }
            ProxyToManager::WorkerLost {
                rank,
                reason,
                how,
                instance,
                generation,
            } => {
                self.observer.received("worker_lost");
                let lost = LostRankOf {
                    why: reason,
                    how,
                    instance,
                    generation,
                };
                let actions = self.ledger.worker_lost(rank, lost, now);
                self.job_changed();
                self.observe_waiting();
                self.run(actions, ctx);
                self.maybe_verify(ctx);
                self.follow_bounds(ctx);
                if self.ledger.all_ended() {
                    tracing::info!("training ended on every rank: every process ended cleanly");
                }
            }
            ProxyToManager::Reply(nr) => {
                self.observer.received("node_reply");
                let span = self.observer.phase_span();
                let actions = span.in_scope(|| self.ledger.handle(Event::Replies(nr), now));
                self.observe_waiting();
                self.run(actions, ctx);
                self.wake_calls_answered();
            }
            ProxyToManager::Links(report) => self.auto_links(report, ctx),
            ProxyToManager::Stall(notice) => {
                self.observer.received("stall");
                self.rank_stalled(notice, ctx);
            }
        }
    }
}

/// Admit a command. On success the operation runs; wait for it with [`AwaitResult`].
#[derive(Message)]
#[rtype(result = "Result<Submission, SubmitError>")]
pub struct Submit(pub SwitchCommand);

/// What a submission led to: the ledger's [`Submitted`] without the first directives and
/// deadlines of a new operation (`Submitted::Started`'s actions), which the manager carries
/// out itself and no caller may see or run again.
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
    /// The operation's id in every case: the one to wait on with [`AwaitResult`].
    pub fn id(&self) -> OperationId {
        match self {
            Submission::Started(id) | Submission::InFlight(id) => *id,
            Submission::Known(r) => r.id,
        }
    }
}

impl Handler<Submit> for Manager {
    type Result = ResponseFuture<Result<Submission, SubmitError>>;

    fn handle(&mut self, Submit(cmd): Submit, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.when_journal_ready(ctx, move |act, ready, ctx| {
            act.submit(cmd, ready, false, tx, ctx);
        });
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(stopped())) })
    }
}

/// An operator's command to be run as an in-flight move (`taskd_core::inflight`): the
/// collectives in flight are aborted and the step is finished on the rebuilt groups, instead
/// of a pause at the next step boundary. Answered as [`Submit`].
#[derive(Message)]
#[rtype(result = "Result<Submission, SubmitError>")]
pub struct SubmitInFlight(pub SwitchCommand);

impl Handler<SubmitInFlight> for Manager {
    type Result = ResponseFuture<Result<Submission, SubmitError>>;

    fn handle(
        &mut self,
        SubmitInFlight(cmd): SubmitInFlight,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.when_journal_ready(ctx, move |act, ready, ctx| {
            act.submit(cmd, ready, true, tx, ctx);
        });
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(stopped())) })
    }
}

impl Manager {
    /// Admits `cmd` (when the journal is `ready`) and answers `tx`: a new operation once its
    /// admission is durable (refused when it cannot be written), a known result or the
    /// operation in flight at once, a refusal.
    fn submit(
        &mut self,
        cmd: SwitchCommand,
        ready: Result<(), SubmitError>,
        in_flight: bool,
        tx: oneshot::Sender<Result<Submission, SubmitError>>,
        ctx: &mut Context<Self>,
    ) {
        let id = cmd.id.unwrap_or_else(|| OperationId(uuid::Uuid::new_v4()));
        let now = self.now();
        let span = observer::submit_span(id, &cmd, Trigger::Operator);
        let res = ready.and_then(|()| {
            span.in_scope(|| match in_flight {
                true => self
                    .ledger
                    .submit_in_flight(Trigger::Operator, &cmd, id, now),
                false => self.ledger.submit(&cmd, id, now),
            })
        });
        let answer = match res {
            Ok(Submitted::Started { id, actions }) => {
                // Answered once the admission is durable (the journal's write is awaited).
                let durable = self.operation_started(id, span, actions, ctx);
                actix::spawn(async move {
                    let admitted = durable.await.unwrap_or_else(|_| Err(stopped()));
                    let _ = tx.send(admitted.map(|()| Submission::Started(id)));
                });
                return;
            }
            Ok(Submitted::Known(mut r)) => {
                // A result kept without its targets (a large request is journaled by its
                // fingerprint) is the request repeated now: its targets are these.
                if r.targets.is_empty() {
                    if let Ok(plan) = cmd.resolve(self.ledger.table()) {
                        r.targets = plan.targets;
                    }
                }
                Ok(Submission::Known(r))
            }
            Ok(Submitted::InFlight(id)) => Ok(Submission::InFlight(id)),
            Err(e) => {
                self.observer.command_refused(&span, &e);
                Err(e)
            }
        };
        let _ = tx.send(answer);
    }
}

/// The answer to a command whose manager stopped before it could say whether the command
/// was admitted durably: nothing may be passed off as accepted.
fn stopped() -> SubmitError {
    SubmitError::JournalFailing {
        why: "the manager stopped before the command's admission was written".into(),
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
            let rx = self.waiters.result(id);
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
        MessageResult(self.observer.progress().subscribe())
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
        let rx = self.waiters.registered(m.0);
        self.wake_registered();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// Resolves once every rank has answered the NIC-set phase the last operation ended in (at
/// once if none is left inside its calls): when a recovery refused with
/// [`SubmitError::InCalls`] can be asked again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AwaitCallsAnswered;

impl Handler<AwaitCallsAnswered> for Manager {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: AwaitCallsAnswered, _: &mut Self::Context) -> Self::Result {
        let rx = self.waiters.calls();
        self.wake_calls_answered();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// A rank whose worker registered and is gone (process exited, connection closed, heartbeats
/// missed, its proxy unreachable), and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LostRank {
    /// The rank.
    pub rank: GlobalRank,
    /// What its proxy or the transport saw, verbatim.
    pub reason: String,
    /// Died, ended cleanly, or unreachable (it may train on).
    #[serde(default)]
    pub how: taskd_core::protocol::Gone,
}

/// A snapshot of the job as the manager sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManagerStatus {
    /// The job the manager runs.
    pub job: JobId,
    /// Running, held after a failure, or missing a process.
    pub state: JobState,
    /// Workers registered now; switches wait until it equals `workers_expected`.
    pub workers_registered: usize,
    /// The rank table's world size.
    pub workers_expected: usize,
    /// Proxies connected now (one per node when all is well).
    pub nodes_connected: usize,
    /// The manager's NIC table: ranks on their backup NIC, ascending.
    pub ranks_on_backup: Vec<GlobalRank>,
    /// The operation or verification round running, and its phase.
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
    /// The ClusterD client's link, when the manager is ClusterD's client.
    #[serde(default)]
    pub clusterd: Option<ClusterdLink>,
    /// The operation that ended while these ranks were still inside its NIC-set calls, and the
    /// ranks, until each has answered ([`SubmitError::InCalls`]).
    #[serde(default)]
    pub in_calls: Option<(OperationId, Vec<GlobalRank>)>,
    /// Training stopped and the processes restarting (`stopping`, `restarting` and the ranks
    /// not back yet), while it lasts.
    #[serde(default)]
    pub training_stop: Option<taskd_core::ledger::TrainingStop>,
    /// The last stop of training that ended (every rank came back).
    #[serde(default)]
    pub last_training_stop: Option<taskd_core::ledger::TrainingStop>,
    /// The job's restarts (with process recovery on): how many, the budget, the last cause.
    #[serde(default)]
    pub restarts: Restarts,
    /// A lost process a job-wide restart is owed for, until it starts (an operation in flight
    /// ends first).
    #[serde(default)]
    pub restart_owed: Option<String>,
    /// Ranks whose training loop finished no step for their hang watch's timeout, ascending.
    #[serde(default)]
    pub stalled_ranks: Vec<taskd_core::ledger::StalledRank>,
    /// While the job is held: for how long, and when the hold policy stops training (`None`:
    /// it waits for an operator, or for the recovery in flight).
    #[serde(default)]
    pub hold: Option<(Duration, Option<Duration>)>,
    /// Why the journal (`--state-dir`) cannot be written now; `None` while it can. While it
    /// cannot, nothing new is admitted ([`SubmitError::JournalFailing`]).
    #[serde(default)]
    pub journal_error: Option<String>,
}

/// Ask for a [`ManagerStatus`] with up to `recent` past results.
#[derive(Message)]
#[rtype(result = "ManagerStatus")]
pub struct GetStatus {
    /// How many past results to include, newest last (the ledger keeps at most
    /// `HISTORY_LEN`).
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
            clusterd: self.clusterd.as_ref().map(clusterd::Side::status),
            in_calls: l
                .ranks_in_calls()
                .map(|(op, ranks)| (op, ranks.iter().copied().collect())),
            training_stop: l.training_stop().cloned(),
            last_training_stop: l.last_training_stop().cloned(),
            journal_error: self.journal_failing.clone(),
            recent: history.into_iter().rev().collect(),
            lost_ranks: l
                .lost_ranks()
                .map(|(rank, l)| LostRank {
                    rank,
                    reason: l.why.clone(),
                    how: l.how,
                })
                .collect(),
            restarts: l.restarts().clone(),
            restart_owed: l.restart_owed().map(str::to_owned),
            stalled_ranks: l.stalled_ranks().cloned().collect(),
            hold: l.held_since().filter(|_| l.is_held()).map(|since| {
                let now = self.now();
                let stops_in = l.hold_deadline().map(|d| d.saturating_sub(now));
                (now.saturating_sub(since), stops_in)
            }),
        })
    }
}

/// Recover a job that is not running (see [`RecoverTo`] and docs/recovery.md): re-state the
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
    type Result = ResponseFuture<Result<Recovery, SubmitError>>;

    fn handle(&mut self, m: Recover, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.when_journal_ready(ctx, move |act, ready, ctx| act.recover(m, ready, tx, ctx));
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(stopped())) })
    }
}

impl Manager {
    /// Starts the recovery `m` (when the journal is `ready`) and answers `tx`, as
    /// [`Manager::submit`] does.
    fn recover(
        &mut self,
        m: Recover,
        ready: Result<(), SubmitError>,
        tx: oneshot::Sender<Result<Recovery, SubmitError>>,
        ctx: &mut Context<Self>,
    ) {
        let id = m.id.unwrap_or_else(|| OperationId(uuid::Uuid::new_v4()));
        let span = observer::recover_span(id, self.ledger.job(), m.to);
        let now = self.now();
        let res = ready.and_then(|()| span.in_scope(|| self.ledger.recover(m.to, id, now)));
        let answer = match res {
            Ok(RecoveryStarted::Operation { id, actions }) => {
                span.in_scope(|| tracing::warn!(to = m.to.as_str(), "recovery started"));
                // Answered once the admission is durable, as a submission is.
                let durable = self.operation_started(id, span, actions, ctx);
                actix::spawn(async move {
                    let admitted = durable.await.unwrap_or_else(|_| Err(stopped()));
                    let _ = tx.send(admitted.map(|()| Recovery::Operation(id)));
                });
                return;
            }
            Ok(RecoveryStarted::Verification { id, actions }) => {
                span.in_scope(|| tracing::warn!("recovery: nothing in doubt, verifying"));
                self.run(actions, ctx);
                self.job_changed();
                Ok(Recovery::Verification(id))
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "recovery refused"));
                Err(e)
            }
        };
        let _ = tx.send(answer);
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
            let rx = self.waiters.round(m.0);
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
        // A stopping manager starts nothing new.
        self.auto = None;
        let Some(id) = self.ledger.in_flight().map(|op| op.id()) else {
            // A verification round changes nothing: drop it.
            let actions = self.ledger.abort(m.reason, self.now());
            self.run(actions, ctx);
            return Box::pin(async { None });
        };
        tracing::warn!(%id, reason = %m.reason, "stopping: ending the operation in flight safely");
        let rx = self.waiters.result(id);
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
