//! `TaskAdmin`: a small service the manager serves beside `TaskNet`, for tests, benchmarks and
//! tools on the job's own network: submit a command, wait for its report, read the status,
//! wait for registrations, follow progress. Reports and status travel as the JSON of their
//! `taskd-core` / `taskd-actors` types. Operators use the control port instead
//! ([`crate::control`]).

use super::tls::TlsPem;
use super::{pb, NetError};
use crate::manager::{
    AwaitRegistered, AwaitResult, GetStatus, Manager, ManagerStatus, Submission, Submit,
    SubscribeProgress,
};
use crate::progress::ProgressEvent;
use actix::Addr;
use std::pin::Pin;
use taskd_core::command::Target;
use taskd_core::operation::OperationReport;
use taskd_core::{DeviceId, JobId, NodeName, OperationId, SubmitError, SwitchCommand};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// The server half, in front of a manager actor.
pub struct AdminService {
    manager: Addr<Manager>,
}

impl AdminService {
    pub fn new(manager: Addr<Manager>) -> Self {
        AdminService { manager }
    }

    pub fn into_server(
        self,
        max_message_bytes: usize,
    ) -> pb::task_admin_server::TaskAdminServer<Self> {
        pb::task_admin_server::TaskAdminServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

fn gone<E>(_: E) -> Status {
    Status::unavailable("the manager stopped")
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("taskd types serialize")
}

fn status_json(s: &ManagerStatus) -> Result<Response<pb::StatusReply>, Status> {
    Ok(Response::new(pb::StatusReply {
        status_json: json(s),
    }))
}

type ProgressStream = Pin<Box<dyn Stream<Item = Result<pb::ProgressReply, Status>> + Send>>;

#[tonic::async_trait]
impl pb::task_admin_server::TaskAdmin for AdminService {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitReply>, Status> {
        let r = req.into_inner();
        let id =
            if r.id.is_empty() {
                None
            } else {
                Some(r.id.parse::<OperationId>().map_err(|e| {
                    Status::invalid_argument(format!("operation id {:?}: {e}", r.id))
                })?)
            };
        let cmd = SwitchCommand {
            job: JobId(r.job),
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
        };
        use pb::submit_reply::Outcome;
        let reply = match self.manager.send(Submit(cmd)).await.map_err(gone)? {
            Ok(Submission::Started(id)) => pb::SubmitReply {
                outcome: Some(Outcome::Started(id.to_string())),
                refused_message: String::new(),
            },
            Ok(Submission::InFlight(id)) => pb::SubmitReply {
                outcome: Some(Outcome::InFlight(id.to_string())),
                refused_message: String::new(),
            },
            Ok(Submission::Known(r)) => pb::SubmitReply {
                outcome: Some(Outcome::KnownReportJson(json(&*r))),
                refused_message: String::new(),
            },
            Err(e) => pb::SubmitReply {
                outcome: Some(Outcome::RefusedJson(json(&e))),
                refused_message: e.to_string(),
            },
        };
        Ok(Response::new(reply))
    }

    async fn await_result(
        &self,
        req: Request<pb::AwaitResultRequest>,
    ) -> Result<Response<pb::ReportReply>, Status> {
        let id: OperationId = req
            .into_inner()
            .id
            .parse()
            .map_err(|e| Status::invalid_argument(format!("operation id: {e}")))?;
        let r = self.manager.send(AwaitResult(id)).await.map_err(gone)?;
        Ok(Response::new(match r {
            Some(r) => pb::ReportReply {
                known: true,
                report_json: json(&r),
            },
            None => pb::ReportReply {
                known: false,
                report_json: String::new(),
            },
        }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let recent = req.into_inner().recent as usize;
        let s = self
            .manager
            .send(GetStatus { recent })
            .await
            .map_err(gone)?;
        status_json(&s)
    }

    async fn await_registered(
        &self,
        req: Request<pb::AwaitRegisteredRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let count = req.into_inner().count.map(|c| c as usize);
        self.manager
            .send(AwaitRegistered(count))
            .await
            .map_err(gone)?;
        let s = self
            .manager
            .send(GetStatus { recent: 0 })
            .await
            .map_err(gone)?;
        status_json(&s)
    }

    type WatchProgressStream = ProgressStream;

    async fn watch_progress(
        &self,
        _req: Request<pb::WatchProgressRequest>,
    ) -> Result<Response<Self::WatchProgressStream>, Status> {
        let rx = self.manager.send(SubscribeProgress).await.map_err(gone)?;
        let stream = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|ev| {
            // A lagging watcher loses the oldest events, never the manager's time.
            ev.ok().map(|ev| {
                Ok(pb::ProgressReply {
                    event_json: json(&ev),
                })
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("cannot reach the manager at {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("the manager answered {0}")]
    Rpc(#[from] Status),
    #[error("the command was refused: {0}")]
    Refused(SubmitError),
    #[error("operation {0} is unknown to the manager")]
    UnknownOperation(OperationId),
    #[error("the manager sent something unreadable: {0}")]
    Decode(String),
}

fn decode<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, AdminError> {
    serde_json::from_str(s).map_err(|e| AdminError::Decode(e.to_string()))
}

/// The client half: drives a manager from a test, a benchmark or a tool.
#[derive(Clone)]
pub struct AdminClient {
    inner: pb::task_admin_client::TaskAdminClient<Channel>,
}

impl AdminClient {
    /// Connects to the manager's transport port (`HOST:PORT`).
    pub async fn connect(addr: &str, tls: Option<&TlsPem>) -> Result<AdminClient, AdminError> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|_| NetError::Address(addr.to_owned()))?
            .tcp_nodelay(true);
        if let Some(t) = tls {
            endpoint = endpoint
                .tls_config(t.client_config(addr))
                .map_err(|e| NetError::Tls(super::tls::TlsError::Config(e.to_string())))?;
        }
        let channel = endpoint.connect().await.map_err(|e| AdminError::Connect {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(AdminClient {
            inner: pb::task_admin_client::TaskAdminClient::new(channel)
                .max_decoding_message_size(64 << 20),
        })
    }

    /// Admits a command; returns at once.
    pub async fn submit(&mut self, cmd: &SwitchCommand) -> Result<Submission, AdminError> {
        let req = pb::SubmitRequest {
            job: cmd.job.0.clone(),
            id: cmd.id.map(|i| i.to_string()).unwrap_or_default(),
            targets: cmd
                .targets
                .iter()
                .map(|t| pb::Target {
                    node: t.node.0.clone(),
                    device: t.device.0,
                    use_backup: t.use_backup,
                })
                .collect(),
        };
        let reply = self.inner.submit(req).await?.into_inner();
        use pb::submit_reply::Outcome;
        let parse_id = |s: String| {
            s.parse::<OperationId>()
                .map_err(|e| AdminError::Decode(e.to_string()))
        };
        match reply.outcome {
            Some(Outcome::Started(id)) => Ok(Submission::Started(parse_id(id)?)),
            Some(Outcome::InFlight(id)) => Ok(Submission::InFlight(parse_id(id)?)),
            Some(Outcome::KnownReportJson(r)) => Ok(Submission::Known(Box::new(decode(&r)?))),
            Some(Outcome::RefusedJson(e)) => Err(AdminError::Refused(decode(&e)?)),
            None => Err(AdminError::Decode(
                "a submit reply without an outcome".into(),
            )),
        }
    }

    /// Waits for the final report of an operation.
    pub async fn wait(&mut self, id: OperationId) -> Result<OperationReport, AdminError> {
        let r = self
            .inner
            .await_result(pb::AwaitResultRequest { id: id.to_string() })
            .await?
            .into_inner();
        if !r.known {
            return Err(AdminError::UnknownOperation(id));
        }
        decode(&r.report_json)
    }

    /// Submits and waits.
    pub async fn run(&mut self, cmd: &SwitchCommand) -> Result<OperationReport, AdminError> {
        match self.submit(cmd).await? {
            Submission::Known(r) => Ok(*r),
            other => self.wait(other.id()).await,
        }
    }

    pub async fn status(&mut self, recent: usize) -> Result<ManagerStatus, AdminError> {
        let r = self
            .inner
            .status(pb::StatusRequest {
                recent: recent as u32,
            })
            .await?
            .into_inner();
        decode(&r.status_json)
    }

    /// Waits until exactly `count` workers are registered (`None`: every expected one).
    pub async fn await_registered(
        &mut self,
        count: Option<usize>,
    ) -> Result<ManagerStatus, AdminError> {
        let r = self
            .inner
            .await_registered(pb::AwaitRegisteredRequest {
                count: count.map(|c| c as u32),
            })
            .await?
            .into_inner();
        decode(&r.status_json)
    }

    /// Follows the manager's progress feed from now on.
    pub async fn watch_progress(&mut self) -> Result<ProgressWatch, AdminError> {
        let s = self
            .inner
            .watch_progress(pb::WatchProgressRequest {})
            .await?
            .into_inner();
        Ok(ProgressWatch { inner: s })
    }
}

/// Progress events, in order, as the manager publishes them.
pub struct ProgressWatch {
    inner: tonic::Streaming<pb::ProgressReply>,
}

impl ProgressWatch {
    /// The next event; `None` when the manager ended the stream.
    pub async fn next(&mut self) -> Option<Result<ProgressEvent, AdminError>> {
        match self.inner.message().await {
            Ok(Some(r)) => Some(decode(&r.event_json)),
            Ok(None) => None,
            Err(s) => Some(Err(AdminError::Rpc(s))),
        }
    }
}
