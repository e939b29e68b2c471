//! The manager's side of ClusterD's client (`actors/src/clusterd/`): ClusterD's signals come in
//! as messages, go through the [`Sequencer`] (`core/src/clusterd.rs`) into the same
//! [`taskd_core::JobLedger`] the control API uses, and the reports it owes go back to the
//! client, which sends them. An operation ClusterD drives is one operation of the job like any
//! other: the control API sees it in flight and is refused as busy while it runs, and ClusterD's
//! pause is refused while an operator's switch runs.

use super::Manager;
use actix::prelude::*;
use std::time::Duration;
use taskd_core::clusterd::{Level, Origin, Outgoing, Sequencer, Signal, Step};
use taskd_core::ledger::StopBy;
use taskd_core::operation::Action;
use taskd_core::{JobLedger, OperationId};
use tokio::sync::mpsc::UnboundedSender;
use tracing::Span;

/// What the sequencer decided about a batch of the ledger's actions, and the operation in
/// flight before it decided (a `stop_train` left owed may start one).
pub(super) struct Followed {
    step: Step,
    before: Option<OperationId>,
}

/// The manager's ClusterD state: the sequencer, where reports go and how the link stands.
pub(crate) struct Side {
    seq: Sequencer,
    reports: UnboundedSender<Outgoing>,
    link: ClusterdLink,
}

/// Whether the manager is ClusterD's client and how its session stands (`taskd status`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterdLink {
    /// ClusterD's `HOST:PORT`.
    pub addr: String,
    /// Whether a session is up (Init and Register answered, the signal stream's first message
    /// in, the switch subscription sent).
    pub connected: bool,
    /// The last change of the link, for people.
    pub detail: String,
    /// The uuid of the pause ClusterD drives now.
    pub driving: Option<String>,
}

/// Makes the manager ClusterD's client (sent by [`crate::clusterd::ClusterdClient::start`]):
/// its pauses wait at most `signal_wait` for ClusterD's next signal, its reports go to `reports`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachClusterd {
    /// ClusterD's `HOST:PORT`, for status and logs.
    pub addr: String,
    /// How long a pause ClusterD started waits for ClusterD's next signal.
    pub signal_wait: Duration,
    /// Where the reports owed to ClusterD go.
    pub reports: UnboundedSender<Outgoing>,
}

/// A `ProcessManageSignal` from ClusterD.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterdSignal {
    /// The signal.
    pub signal: Signal,
    /// The session it came in and the job it names.
    pub from: Origin,
}

/// A `SwitchRankList` from ClusterD.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterdSwitch {
    /// Global rank ids.
    pub ranks: Vec<String>,
    /// `op[i]` true: rank `ranks[i]` to its backup NIC.
    pub ops: Vec<bool>,
    /// The session it came in and the job it names.
    pub from: Origin,
}

/// The client's session `session` with ClusterD ended (its signal stream closed): ClusterD
/// has reset the job's flow, so the flow that session drove ends
/// ([`Sequencer::on_session_end`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterdSessionEnded {
    /// The session.
    pub session: u64,
}

/// The client's session with ClusterD went up or down.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterdLinkChanged {
    /// Whether a session is up now.
    pub connected: bool,
    /// What happened, for people.
    pub detail: String,
}

impl Side {
    /// The link as `taskd status` shows it.
    pub(crate) fn status(&self) -> ClusterdLink {
        ClusterdLink {
            driving: self.seq.current().map(|(u, _)| u.to_owned()),
            ..self.link.clone()
        }
    }
}

impl Handler<AttachClusterd> for Manager {
    type Result = ();

    fn handle(&mut self, m: AttachClusterd, _: &mut Self::Context) {
        self.clusterd = Some(Side {
            seq: Sequencer::new(m.signal_wait),
            reports: m.reports,
            link: ClusterdLink {
                addr: m.addr,
                connected: false,
                detail: "connecting".into(),
                driving: None,
            },
        });
        self.job_changed();
    }
}

impl Handler<ClusterdLinkChanged> for Manager {
    type Result = ();

    fn handle(&mut self, m: ClusterdLinkChanged, _: &mut Self::Context) {
        if let Some(side) = self.clusterd.as_mut() {
            side.link.connected = m.connected;
            side.link.detail = m.detail;
        }
    }
}

impl Handler<ClusterdSignal> for Manager {
    type Result = ();

    /// ClusterD's `stop_train` and `killMaster` are decided here, by the sequencer
    /// (`Sequencer::on_signal`), and carried out by `Manager::clusterd_step`: the driven
    /// operation ends held, then the manager stops training ([`super::StopTraining`]'s path,
    /// by [`StopBy::Clusterd`]).
    fn handle(&mut self, m: ClusterdSignal, ctx: &mut Self::Context) {
        let fresh = OperationId(uuid::Uuid::new_v4());
        let span = signal_span(&m.signal);
        // Only a pause starts an operation; the journal is proven writable for it alone.
        let admit = match m.signal {
            Signal::Pause { .. } => self.journal_ready(),
            _ => Ok(()),
        };
        self.clusterd_input(span, ctx, |seq, ledger, now| {
            seq.on_signal(&m.signal, &m.from, ledger, fresh, now, admit)
        });
    }
}

impl Handler<ClusterdSessionEnded> for Manager {
    type Result = ();

    fn handle(&mut self, m: ClusterdSessionEnded, ctx: &mut Self::Context) {
        let span = self.observer.operation_span();
        self.clusterd_input(span, ctx, |seq, ledger, now| {
            seq.on_session_end(m.session, ledger, now)
        });
    }
}

impl Handler<ClusterdSwitch> for Manager {
    type Result = ();

    fn handle(&mut self, m: ClusterdSwitch, ctx: &mut Self::Context) {
        let span = self.observer.operation_span();
        self.clusterd_input(span, ctx, |seq, ledger, now| {
            seq.on_switch(&m.ranks, &m.ops, &m.from, ledger, now)
        });
    }
}

/// The span of one `ProcessManageSignal`.
fn signal_span(signal: &Signal) -> Span {
    let uuid = match signal {
        Signal::Pause { uuid }
        | Signal::StopTrain { uuid }
        | Signal::KillMaster { uuid }
        | Signal::Continue { uuid } => uuid.as_str(),
        Signal::KeepAlive | Signal::Other { .. } => "",
    };
    tracing::info_span!(
        "clusterd_signal",
        signal = signal.kind(),
        clusterd_uuid = uuid,
        role = "manager"
    )
}

impl Manager {
    fn in_flight_id(&self) -> Option<OperationId> {
        self.ledger.in_flight().map(|op| op.id())
    }

    /// Hands one of ClusterD's inputs to the sequencer under `span`, then carries out what it
    /// decided. Nothing when the manager is not ClusterD's client.
    fn clusterd_input(
        &mut self,
        span: Span,
        ctx: &mut Context<Self>,
        input: impl FnOnce(&mut Sequencer, &mut JobLedger, Duration) -> Step,
    ) {
        let now = self.now();
        let before = self.in_flight_id();
        let Some(side) = self.clusterd.as_mut() else {
            return;
        };
        let step = span.in_scope(|| input(&mut side.seq, &mut self.ledger, now));
        if let Some(op) = self.ledger.in_flight() {
            self.observer.targets_known(op.plan());
        }
        self.clusterd_step(step, before, &span, ctx);
    }

    /// What the sequencer decided: log its notes, send its reports, carry out its actions (a
    /// new operation is announced first).
    fn clusterd_step(
        &mut self,
        step: Step,
        before: Option<OperationId>,
        span: &Span,
        ctx: &mut Context<Self>,
    ) {
        span.in_scope(|| {
            for n in &step.notes {
                match n.level {
                    Level::Info => tracing::info!("{}", n.text),
                    Level::Warn => tracing::warn!("{}", n.text),
                    Level::Error => tracing::error!("{}", n.text),
                }
            }
        });
        self.send_reports(step.reports);
        let stop = step.stop_training;
        match self.in_flight_id().filter(|id| Some(*id) != before) {
            Some(id) => {
                let uuid = self
                    .clusterd
                    .as_ref()
                    .and_then(|s| s.seq.current())
                    .map_or(String::new(), |(u, _)| u.to_owned());
                let span = super::observer::clusterd_span(id, self.ledger.job(), &uuid);
                let _durable = self.operation_started(id, span, step.actions, ctx);
            }
            None => {
                self.job_changed();
                self.run(step.actions, ctx);
            }
        }
        if let Some(reason) = stop {
            // The sequencer asks only with nothing in flight and no stop under way.
            if let Err(e) = span.in_scope(|| self.stop_training(StopBy::Clusterd, reason, ctx)) {
                span.in_scope(
                    || tracing::error!(error = %e, "ClusterD's stop of training was refused"),
                );
            }
        }
        self.observe_waiting();
    }

    /// Hands the ledger's `actions` to the sequencer (a hold or the end of ClusterD's
    /// operation settles the reports it owes); returns what it decided, to carry out after
    /// `actions` with [`Manager::clusterd_after`]. `None` when the manager is not ClusterD's
    /// client or nothing concerns it.
    pub(super) fn clusterd_follow(&mut self, actions: &[Action]) -> Option<Followed> {
        let interesting = actions
            .iter()
            .any(|a| matches!(a, Action::Held(_) | Action::Finish(_)));
        if !interesting {
            return None;
        }
        let now = self.now();
        let before = self.in_flight_id();
        let side = self.clusterd.as_mut()?;
        let fresh = OperationId(uuid::Uuid::new_v4());
        let step = side.seq.on_actions(actions, &mut self.ledger, fresh, now);
        Some(Followed { step, before })
    }

    /// Carries out what [`Manager::clusterd_follow`] decided.
    pub(super) fn clusterd_after(&mut self, f: Followed, ctx: &mut Context<Self>) {
        let span = self.observer.operation_span();
        self.clusterd_step(f.step, f.before, &span, ctx);
    }

    fn send_reports(&mut self, reports: Vec<Outgoing>) {
        let Some(side) = self.clusterd.as_ref() else {
            return;
        };
        for r in reports {
            let (kind, ok) = (r.report.kind(), r.report.ok());
            tracing::info!(report = kind, ok, session = r.session, job = %r.job, "report owed to ClusterD");
            if side.reports.send(r).is_err() {
                tracing::error!("the ClusterD client is gone: a report owed to ClusterD is lost");
            }
        }
    }
}
