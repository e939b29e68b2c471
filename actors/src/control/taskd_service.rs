//! taskd's own `Control` service (`proto/control.proto`): status, waiting for registrations,
//! and submit-and-wait with the phases as they happen. Typed messages only.

use super::codes;
use super::convert;
use super::proto::{self, switch_event, RefusalKind};
use crate::manager::{
    AwaitRegistered, AwaitResult, AwaitVerification, GetStatus, Manager, Recover, Recovery,
    StopTraining, Submission, Submit, SubmitInFlight, SubscribeProgress,
};
use crate::progress::{ProgressEvent, ProgressKind};
use actix::Addr;
use std::pin::Pin;
use taskd_core::command::Target;
use taskd_core::ledger::RecoverTo;
use taskd_core::operation::OperationReport;
use taskd_core::{DeviceId, JobId, NodeName, OperationId, SwitchCommand};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

type Events = mpsc::Sender<Result<proto::SwitchEvent, Status>>;

/// The `Control` service in front of a manager.
pub(crate) struct ControlSvc {
    manager: Addr<Manager>,
    job: JobId,
}

impl ControlSvc {
    pub(crate) fn new(manager: Addr<Manager>, job: JobId) -> ControlSvc {
        ControlSvc { manager, job }
    }

    fn check_job(&self, job: &str) -> Result<(), Status> {
        if job == self.job.0 {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "job {job:?} is not managed here (this manager runs {:?})",
                self.job.0
            )))
        }
    }

    async fn status(&self, recent: usize) -> Result<proto::JobStatus, Status> {
        let s = self
            .manager
            .send(GetStatus { recent })
            .await
            .map_err(|_| Status::unavailable("the manager is not answering"))?;
        Ok(convert::status(&s))
    }
}

fn event(e: switch_event::Event) -> proto::SwitchEvent {
    proto::SwitchEvent { event: Some(e) }
}

fn refused(code: i32, kind: RefusalKind, reason: impl Into<String>) -> proto::SwitchEvent {
    event(switch_event::Event::Refused(proto::Refused {
        code,
        reason: reason.into(),
        kind: kind.into(),
    }))
}

/// `accepted` for `id`: `known` when it ran before (its result follows at once), `in_flight`
/// when it is the operation running (nothing new started).
fn accepted(id: OperationId, known: bool, in_flight: bool) -> proto::SwitchEvent {
    event(switch_event::Event::Accepted(proto::Accepted {
        uuid: id.to_string(),
        known,
        in_flight,
    }))
}

fn result_event(r: &OperationReport) -> proto::SwitchEvent {
    event(switch_event::Event::Result(convert::result(r)))
}

fn gone() -> proto::SwitchEvent {
    refused(
        codes::SERVER_ERROR,
        RefusalKind::Unavailable,
        "the manager stopped before the operation finished",
    )
}

/// The command of a `SwitchRequest`; why not when its uuid is not a UUID.
fn command(r: proto::SwitchRequest) -> Result<SwitchCommand, String> {
    let id = if r.uuid.is_empty() {
        None
    } else {
        Some(
            r.uuid
                .parse::<OperationId>()
                .map_err(|e| format!("uuid {:?} is not a UUID: {e}", r.uuid))?,
        )
    };
    Ok(SwitchCommand {
        job: JobId(r.job_id),
        id,
        targets: r
            .targets
            .into_iter()
            .map(|t| Target {
                node: NodeName(t.node),
                device: DeviceId(t.device),
                use_backup: t.use_backup,
            })
            .collect(),
    })
}

/// Submits `cmd` (as an in-flight move with `in_flight`, [`SubmitInFlight`]) and streams what
/// happens to `tx`: accepted or refused; with `wait`, each phase and the result.
async fn drive(
    manager: Addr<Manager>,
    cmd: SwitchCommand,
    (wait, in_flight): (bool, bool),
    tx: Events,
) {
    // Subscribe before submitting so no phase of this operation is missed.
    let mut progress = if wait {
        manager.send(SubscribeProgress).await.ok()
    } else {
        None
    };
    let submitted = match in_flight {
        true => manager.send(SubmitInFlight(cmd)).await,
        false => manager.send(Submit(cmd)).await,
    };
    let id = match submitted {
        Err(_) => {
            let _ = tx.send(Ok(gone())).await;
            return;
        }
        Ok(Err(e)) => {
            let kind = codes::refusal_kind(&e);
            let _ = tx
                .send(Ok(refused(codes::control_code(&e), kind, e.to_string())))
                .await;
            return;
        }
        Ok(Ok(Submission::Known(r))) => {
            let _ = tx.send(Ok(accepted(r.id, true, false))).await;
            let _ = tx.send(Ok(result_event(&r))).await;
            return;
        }
        Ok(Ok(s)) => s,
    };
    let in_flight = matches!(id, Submission::InFlight(_));
    let id = id.id();
    let _ = tx.send(Ok(accepted(id, false, in_flight))).await;
    if !wait {
        return;
    }
    if let Some(rx) = progress.as_mut() {
        if let Some(report) = forward_phases(id, rx, &tx).await {
            let _ = tx.send(Ok(result_event(&report))).await;
            return;
        }
    }
    let last = match manager.send(AwaitResult(id)).await {
        Ok(Some(report)) => result_event(&report),
        _ => gone(),
    };
    let _ = tx.send(Ok(last)).await;
}

/// Runs a recovery on `manager` and waits for its outcome.
async fn recover(
    manager: &Addr<Manager>,
    to: RecoverTo,
) -> Result<proto::recover_reply::Outcome, Status> {
    use proto::recover_reply::Outcome;
    let gone = |_| Status::unavailable("the manager is not answering");
    let started = manager.send(Recover { to, id: None }).await.map_err(gone)?;
    match started {
        Err(e) => Ok(Outcome::Refused(proto::Refused {
            code: codes::control_code(&e),
            reason: e.to_string(),
            kind: codes::refusal_kind(&e).into(),
        })),
        Ok(Recovery::Operation(id)) => match manager.send(AwaitResult(id)).await.map_err(gone)? {
            Some(r) => {
                // A recovery that worked is confirmed by a verification round: answer after it.
                manager.send(AwaitRegistered(None)).await.map_err(gone)?;
                Ok(Outcome::Operation(convert::result(&r)))
            }
            None => Err(Status::unavailable(
                "the manager stopped during the recovery",
            )),
        },
        Ok(Recovery::Verification(id)) => {
            match manager.send(AwaitVerification(id)).await.map_err(gone)? {
                Some(v) => Ok(Outcome::Verification(convert::verification(&v))),
                None => Err(Status::unavailable(
                    "the manager stopped during the verification",
                )),
            }
        }
    }
}

/// An operator's stop of training: answered once the stop is sent (the restart is the
/// launcher's, and `GetStatus` follows it).
async fn stop_training(
    manager: &Addr<Manager>,
    reason: String,
) -> Result<proto::recover_reply::Outcome, Status> {
    use proto::recover_reply::Outcome;
    let gone = |_| Status::unavailable("the manager is not answering");
    let reason = if reason.trim().is_empty() {
        "an operator stopped training (taskd recover --stop-training)".to_owned()
    } else {
        reason.lines().next().unwrap_or_default().to_owned()
    };
    let by = taskd_core::ledger::StopBy::Operator;
    match manager
        .send(StopTraining { reason, by })
        .await
        .map_err(gone)?
    {
        Err(e) => Ok(Outcome::Refused(proto::Refused {
            code: codes::control_code(&e),
            reason: e.to_string(),
            kind: codes::refusal_kind(&e).into(),
        })),
        Ok(_) => {
            let status = manager.send(GetStatus { recent: 0 }).await.map_err(gone)?;
            let stop = status.training_stop.as_ref().map(convert::training_stop);
            Ok(Outcome::Stopped(stop.unwrap_or_default()))
        }
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl proto::control_server::Control for ControlSvc {
    async fn get_status(
        &self,
        req: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::JobStatus>, Status> {
        let r = req.into_inner();
        self.check_job(&r.job_id)?;
        Ok(Response::new(self.status(r.recent as usize).await?))
    }

    type SwitchStream = Boxed<proto::SwitchEvent>;

    async fn switch(
        &self,
        req: Request<proto::SwitchRequest>,
    ) -> Result<Response<Self::SwitchStream>, Status> {
        let r = req.into_inner();
        let how = (r.wait, r.abort_in_flight);
        let (tx, rx) = mpsc::channel(16);
        match command(r) {
            Ok(cmd) => {
                tokio::spawn(drive(self.manager.clone(), cmd, how, tx));
            }
            Err(reason) => {
                let refusal = refused(codes::CLIENT_ERROR, RefusalKind::Malformed, reason);
                let _ = tx.send(Ok(refusal)).await;
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn recover(
        &self,
        req: Request<proto::RecoverRequest>,
    ) -> Result<Response<proto::RecoverReply>, Status> {
        let r = req.into_inner();
        self.check_job(&r.job_id)?;
        if r.stop_training {
            let outcome = stop_training(&self.manager, r.reason).await?;
            let job_state = self.status(0).await?.state;
            return Ok(Response::new(proto::RecoverReply {
                outcome: Some(outcome),
                job_state,
            }));
        }
        let to = match r.to.as_str() {
            "primary" => RecoverTo::Primary,
            "backup" => RecoverTo::Backup,
            "as-is" | "as_is" => RecoverTo::AsIs,
            other => {
                return Err(Status::invalid_argument(format!(
                    "recover to {other:?}: expected primary, backup or as-is"
                )))
            }
        };
        let outcome = recover(&self.manager, to).await?;
        let job_state = self.status(0).await?.state;
        Ok(Response::new(proto::RecoverReply {
            outcome: Some(outcome),
            job_state,
        }))
    }

    async fn wait_registered(
        &self,
        req: Request<proto::WaitRegisteredRequest>,
    ) -> Result<Response<proto::JobStatus>, Status> {
        let r = req.into_inner();
        self.check_job(&r.job_id)?;
        self.manager
            .send(AwaitRegistered(r.count.map(|c| c as usize)))
            .await
            .map_err(|_| Status::unavailable("the manager is not answering"))?;
        Ok(Response::new(self.status(0).await?))
    }
}

/// Streams the phases of operation `id` until its final report, which it returns. `None` if
/// the feed ended first (the caller then asks the manager for the result).
async fn forward_phases(
    id: OperationId,
    rx: &mut broadcast::Receiver<ProgressEvent>,
    tx: &Events,
) -> Option<OperationReport> {
    use broadcast::error::RecvError;
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return None,
        };
        if ev.op != id {
            continue;
        }
        let phase = match ev.kind {
            ProgressKind::Finished(report) => return Some(*report),
            kind => match phase_event(id, ev.at, kind) {
                Some(p) => p,
                None => continue,
            },
        };
        if tx
            .send(Ok(event(switch_event::Event::Phase(phase))))
            .await
            .is_err()
        {
            return None;
        }
    }
}

/// A progress event of operation `id` as `Control` streams it; `None` for those it does not.
fn phase_event(
    id: OperationId,
    at: std::time::Duration,
    kind: ProgressKind,
) -> Option<proto::PhaseEvent> {
    let base = |phase: taskd_core::protocol::Phase, kind: &str| proto::PhaseEvent {
        uuid: id.to_string(),
        phase: phase.as_str().into(),
        at_ms: at.as_secs_f64() * 1e3,
        kind: kind.into(),
        waiting: 0,
        pause_step: None,
        took_ms: None,
    };
    Some(match kind {
        ProgressKind::PhaseStarted {
            phase,
            waiting,
            pause_step,
        } => proto::PhaseEvent {
            waiting: waiting as u32,
            pause_step,
            ..base(phase, "started")
        },
        ProgressKind::Waiting { phase, waiting } => proto::PhaseEvent {
            waiting: waiting as u32,
            ..base(phase, "waiting")
        },
        ProgressKind::PhaseFinished { phase, took } => proto::PhaseEvent {
            took_ms: Some(took.as_secs_f64() * 1e3),
            ..base(phase, "finished")
        },
        ProgressKind::Started { .. }
        | ProgressKind::Finished(_)
        | ProgressKind::Links { .. }
        | ProgressKind::Decision(_) => return None,
    })
}
