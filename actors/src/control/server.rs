//! The control server: `Recover` and `Control` on one port, on a runtime thread of its own, in
//! front of the manager actor.

use super::codes;
use super::convert;
use super::guard::{Guard, GuardConfig};
use super::proto::{self, control_server::ControlServer as ControlService, switch_event};
use super::recover::{self, recover_server::RecoverServer};
use crate::manager::{AwaitResult, GetStatus, Manager, Submission, Submit, SubscribeProgress};
use crate::progress::{ProgressEvent, ProgressKind};
use actix::Addr;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use taskd_core::command::Target;
use taskd_core::{DeviceId, JobId, NodeName, OperationId, SwitchCommand};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// How long requests in progress may finish after a shutdown was asked for.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// TLS for the control port. With `client_ca_pem`, clients must present a certificate signed
/// by that CA (mutual TLS).
#[derive(Clone, Debug)]
pub struct ControlTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS setup failed: {0}")]
    Tls(String),
    #[error("cannot start the control server's runtime: {0}")]
    Runtime(std::io::Error),
}

/// A running control server. Dropping it stops it.
pub struct ControlServer {
    local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// The address it listens on (with the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, finishes the requests in progress and returns.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves the control API for `job` at `addr` in front of `manager`.
pub fn serve(
    addr: SocketAddr,
    manager: Addr<Manager>,
    job: JobId,
    guard: GuardConfig,
    tls: Option<ControlTls>,
) -> Result<ControlServer, ServeError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServeError::Bind { addr, source })?;
    let tls = tls
        .map(|t| {
            let mut c = ServerTlsConfig::new().identity(Identity::from_pem(t.cert_pem, t.key_pem));
            if let Some(ca) = t.client_ca_pem {
                c = c.client_ca_root(Certificate::from_pem(ca));
            }
            c
        })
        .map(Some)
        .unwrap_or(None);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("taskd-control")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let guard = Arc::new(Guard::new(guard));
    let recover = RecoverSvc {
        manager: manager.clone(),
        job: job.clone(),
        guard: guard.clone(),
    };
    let control = ControlSvc {
        manager,
        job,
        guard,
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| ServeError::Tls(e.to_string()))?;
    }
    let (tx, rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("taskd-control".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "control listener unusable");
                        return;
                    }
                };
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let stopping = Arc::new(tokio::sync::Notify::new());
                let stop_signal = stopping.clone();
                let serving = builder
                    .add_service(RecoverServer::new(recover))
                    .add_service(ControlService::new(control))
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = rx.await;
                        stop_signal.notify_one();
                    });
                // Requests in progress (a client waiting for a result) get a grace period;
                // a client that keeps its connection open does not hold the shutdown forever.
                let give_up = async {
                    stopping.notified().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                };
                tokio::select! {
                    res = serving => {
                        if let Err(e) = res {
                            tracing::error!(error = %e, "control server stopped");
                        }
                    }
                    _ = give_up => tracing::warn!("control server: connections still open after the grace period; closing them"),
                }
            })
        })
        .map_err(ServeError::Runtime)?;
    tracing::info!(%local_addr, "control API listening");
    Ok(ControlServer {
        local_addr,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

fn info_json(v: serde_json::Value) -> String {
    v.to_string()
}

fn server_gone() -> recover::Status {
    recover::Status {
        code: codes::SERVER_ERROR,
        info: "the manager is not answering".into(),
    }
}

/// ClusterD's operator API.
struct RecoverSvc {
    manager: Addr<Manager>,
    job: JobId,
    guard: Arc<Guard>,
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl recover::recover_server::Recover for RecoverSvc {
    async fn switch_nic_track(
        &self,
        req: Request<recover::SwitchNics>,
    ) -> Result<Response<recover::Status>, Status> {
        self.guard.check(&req)?;
        let m = req.into_inner();
        if m.job_id.is_empty() {
            return Ok(Response::new(recover::Status {
                code: codes::CLIENT_ERROR,
                info: "jobID is empty".into(),
            }));
        }
        let ops: BTreeMap<String, (Vec<String>, Vec<bool>)> = m
            .nic_ops
            .into_iter()
            .map(|(node, l)| (node, (l.dev, l.op)))
            .collect();
        let cmd = match SwitchCommand::from_nic_ops(JobId(m.job_id), None, &ops) {
            Ok(c) => c,
            Err(e) => {
                return Ok(Response::new(recover::Status {
                    code: codes::PARAMETER_INVALID,
                    info: e.to_string(),
                }))
            }
        };
        let Ok(res) = self.manager.send(Submit(cmd)).await else {
            return Ok(Response::new(server_gone()));
        };
        let status = match res {
            Ok(Submission::Started(id)) | Ok(Submission::InFlight(id)) => recover::Status {
                code: codes::OK,
                info: info_json(serde_json::json!({"uuid": id.to_string(), "state": "started"})),
            },
            Ok(Submission::Known(r)) => recover::Status {
                code: codes::OK,
                info: convert::result_json(&r),
            },
            Err(e) => recover::Status {
                code: codes::for_submit_error(&e),
                info: e.to_string(),
            },
        };
        Ok(Response::new(status))
    }

    type SubscribeSwitchNicSignalStream = Boxed<recover::SwitchNicResponse>;

    async fn subscribe_switch_nic_signal(
        &self,
        req: Request<recover::SwitchNicRequest>,
    ) -> Result<Response<Self::SubscribeSwitchNicSignalStream>, Status> {
        self.guard.check(&req)?;
        let job = req.into_inner().job_id;
        let (tx, rx) = mpsc::channel(1);
        let reply = |msg: String| recover::SwitchNicResponse {
            job_id: job.clone(),
            msg,
        };
        if job != self.job.0 {
            let msg = info_json(serde_json::json!({
                "code": codes::JOB_NOT_EXIST,
                "error": format!("job {job:?} is not managed here (this manager runs {:?})", self.job.0),
            }));
            let _ = tx.send(Ok(reply(msg))).await;
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        let status = self
            .manager
            .send(GetStatus { recent: 0 })
            .await
            .map_err(|_| Status::unavailable("the manager is not answering"))?;
        match status.in_flight {
            None => {
                let msg = info_json(serde_json::json!({
                    "result": "none",
                    "message": "no operation is in flight",
                }));
                let _ = tx.send(Ok(reply(msg))).await;
            }
            Some((id, _)) => {
                let manager = self.manager.clone();
                let job = job.clone();
                tokio::spawn(async move {
                    let msg = match manager.send(AwaitResult(id)).await {
                        Ok(Some(r)) => convert::result_json(&r),
                        _ => info_json(serde_json::json!({
                            "code": codes::SERVER_ERROR,
                            "error": "the manager stopped before the operation finished",
                        })),
                    };
                    let _ = tx
                        .send(Ok(recover::SwitchNicResponse { job_id: job, msg }))
                        .await;
                });
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn health_check(
        &self,
        req: Request<recover::ClientInfo>,
    ) -> Result<Response<recover::Status>, Status> {
        self.guard.check(&req)?;
        let info = req.into_inner();
        if !info.job_id.is_empty() && info.job_id != self.job.0 {
            return Ok(Response::new(recover::Status {
                code: codes::JOB_NOT_EXIST,
                info: format!("job {:?} is not managed here", info.job_id),
            }));
        }
        let Ok(s) = self.manager.send(GetStatus { recent: 0 }).await else {
            return Ok(Response::new(server_gone()));
        };
        Ok(Response::new(recover::Status {
            code: codes::OK,
            info: info_json(serde_json::json!({
                "job": s.job.0,
                "state": s.state.as_str(),
                "workers_registered": s.workers_registered,
                "workers_expected": s.workers_expected,
                "operation_in_flight": s.in_flight.map(|(id, _)| id.to_string()),
            })),
        }))
    }
}

/// taskd's own control service.
struct ControlSvc {
    manager: Addr<Manager>,
    job: JobId,
    guard: Arc<Guard>,
}

fn refused(code: i32, reason: impl Into<String>) -> proto::SwitchEvent {
    proto::SwitchEvent {
        event: Some(switch_event::Event::Refused(proto::Refused {
            code,
            reason: reason.into(),
        })),
    }
}

#[tonic::async_trait]
impl proto::control_server::Control for ControlSvc {
    async fn get_status(
        &self,
        req: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::JobStatus>, Status> {
        self.guard.check(&req)?;
        let r = req.into_inner();
        if r.job_id != self.job.0 {
            return Err(Status::not_found(format!(
                "job {:?} is not managed here (this manager runs {:?})",
                r.job_id, self.job.0
            )));
        }
        let s = self
            .manager
            .send(GetStatus {
                recent: r.recent as usize,
            })
            .await
            .map_err(|_| Status::unavailable("the manager is not answering"))?;
        Ok(Response::new(convert::status(&s)))
    }

    type SwitchStream = Boxed<proto::SwitchEvent>;

    async fn switch(
        &self,
        req: Request<proto::SwitchRequest>,
    ) -> Result<Response<Self::SwitchStream>, Status> {
        self.guard.check(&req)?;
        let r = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let stream = Box::pin(ReceiverStream::new(rx));
        let id = if r.uuid.is_empty() {
            None
        } else {
            match r.uuid.parse::<OperationId>() {
                Ok(id) => Some(id),
                Err(e) => {
                    let _ = tx
                        .send(Ok(refused(
                            codes::CLIENT_ERROR,
                            format!("uuid {:?} is not a UUID: {e}", r.uuid),
                        )))
                        .await;
                    return Ok(Response::new(stream));
                }
            }
        };
        let cmd = SwitchCommand {
            job: JobId(r.job_id),
            id,
            targets: r
                .targets
                .iter()
                .map(|t| Target {
                    node: NodeName(t.node.clone()),
                    device: DeviceId(t.device),
                    use_backup: t.use_backup,
                })
                .collect(),
        };
        let manager = self.manager.clone();
        tokio::spawn(async move {
            // Subscribe before submitting so no phase of this operation is missed.
            let mut progress = if r.wait {
                manager.send(SubscribeProgress).await.ok()
            } else {
                None
            };
            let Ok(res) = manager.send(Submit(cmd)).await else {
                let _ = tx
                    .send(Ok(refused(
                        codes::SERVER_ERROR,
                        "the manager is not answering",
                    )))
                    .await;
                return;
            };
            let (id, known) = match res {
                Err(e) => {
                    let _ = tx
                        .send(Ok(refused(codes::for_submit_error(&e), e.to_string())))
                        .await;
                    return;
                }
                Ok(Submission::Known(r)) => {
                    let _ = tx.send(Ok(accepted(r.id, true))).await;
                    let _ = tx.send(Ok(result_event(&r))).await;
                    return;
                }
                Ok(s) => (s.id(), false),
            };
            let _ = tx.send(Ok(accepted(id, known))).await;
            if !r.wait {
                return;
            }
            if let Some(rx) = progress.as_mut() {
                if let Some(report) = forward_phases(id, rx, &tx).await {
                    let _ = tx.send(Ok(result_event(&report))).await;
                    return;
                }
            }
            match manager.send(AwaitResult(id)).await {
                Ok(Some(report)) => {
                    let _ = tx.send(Ok(result_event(&report))).await;
                }
                _ => {
                    let _ = tx
                        .send(Ok(refused(
                            codes::SERVER_ERROR,
                            "the manager stopped before the operation finished",
                        )))
                        .await;
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// Streams the phases of operation `id` until its final report, which it returns. `None` if
/// the feed ended first (the caller then asks the manager for the result).
async fn forward_phases(
    id: OperationId,
    rx: &mut tokio::sync::broadcast::Receiver<ProgressEvent>,
    tx: &mpsc::Sender<Result<proto::SwitchEvent, Status>>,
) -> Option<taskd_core::operation::OperationReport> {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return None,
        };
        if ev.op != id {
            continue;
        }
        let at_ms = ev.at.as_secs_f64() * 1e3;
        let phase = match ev.kind {
            ProgressKind::Finished(report) => return Some(*report),
            ProgressKind::PhaseStarted {
                phase,
                waiting,
                pause_step,
            } => proto::PhaseEvent {
                uuid: id.to_string(),
                phase: phase.as_str().into(),
                at_ms,
                kind: "started".into(),
                waiting: waiting as u32,
                pause_step,
                took_ms: None,
            },
            ProgressKind::Waiting { phase, waiting } => proto::PhaseEvent {
                uuid: id.to_string(),
                phase: phase.as_str().into(),
                at_ms,
                kind: "waiting".into(),
                waiting: waiting as u32,
                pause_step: None,
                took_ms: None,
            },
            ProgressKind::PhaseFinished { phase, took } => proto::PhaseEvent {
                uuid: id.to_string(),
                phase: phase.as_str().into(),
                at_ms,
                kind: "finished".into(),
                waiting: 0,
                pause_step: None,
                took_ms: Some(took.as_secs_f64() * 1e3),
            },
            _ => continue,
        };
        let event = proto::SwitchEvent {
            event: Some(switch_event::Event::Phase(phase)),
        };
        if tx.send(Ok(event)).await.is_err() {
            return None;
        }
    }
}

fn accepted(id: OperationId, known: bool) -> proto::SwitchEvent {
    proto::SwitchEvent {
        event: Some(switch_event::Event::Accepted(proto::Accepted {
            uuid: id.to_string(),
            known,
        })),
    }
}

fn result_event(r: &taskd_core::operation::OperationReport) -> proto::SwitchEvent {
    proto::SwitchEvent {
        event: Some(switch_event::Event::Result(convert::result(r))),
    }
}
