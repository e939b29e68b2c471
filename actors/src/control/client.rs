//! A typed client of taskd's `Control` service, for the CLI, tests, benchmarks and tools:
//! connect (TLS and bearer token optional), read the status, wait for registrations, switch and
//! follow the phases, or switch and wait for the result.

use super::proto::{self, control_client, switch_event::Event, RefusalKind};
use crate::net::{TlsError, TlsPem};
use taskd_core::{OperationSummary, SwitchCommand};
use tonic::transport::{Channel, Endpoint};

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not `HOST:PORT`.
    #[error("bad address {0:?}: expected HOST:PORT")]
    Address(String),
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Nothing answers at the address (or the TLS handshake failed): the transport's error
    /// and every cause under it (a bare "transport error" tells nobody anything).
    #[error(
        "cannot connect to {addr}: {}",
        crate::net::client::error_chain(source)
    )]
    Connect {
        /// The address tried.
        addr: String,
        /// The transport's error.
        source: tonic::transport::Error,
    },
    /// The call failed: unauthenticated, rate-limited, unknown job, manager gone.
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    /// The manager refused the command; nothing ran.
    #[error("refused ({code} {}): {reason}", super::codes::name(*code))]
    Refused {
        /// The code (see [`super::codes`]).
        code: i32,
        /// What kind of refusal.
        kind: RefusalKind,
        /// Why, in words.
        reason: String,
    },
    /// The server's answer broke the protocol (a stream without its result).
    #[error("the control API answered out of protocol: {0}")]
    Protocol(&'static str),
}

/// A connection to one manager's control port.
#[derive(Clone)]
pub struct ControlClient {
    inner: control_client::ControlClient<Channel>,
    token: Option<String>,
}

impl ControlClient {
    /// Connects to `addr` (`HOST:PORT`), over TLS when `tls` is given.
    pub async fn connect(addr: &str, tls: Option<&TlsPem>) -> Result<ControlClient, ClientError> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|_| ClientError::Address(addr.to_owned()))?
            .tcp_nodelay(true);
        if let Some(t) = tls {
            endpoint = endpoint
                .tls_config(t.client_config(addr))
                .map_err(|e| TlsError::Config(crate::net::client::error_chain(&e)))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        Ok(ControlClient {
            inner: control_client::ControlClient::new(channel),
            token: None,
        })
    }

    /// Sends `authorization: Bearer <token>` with every call from now on.
    pub fn with_token(mut self, token: Option<String>) -> ControlClient {
        self.token = token;
        self
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(v) = self
            .token
            .as_ref()
            .and_then(|t| format!("Bearer {t}").parse().ok())
        {
            req.metadata_mut().insert("authorization", v);
        }
        req
    }

    /// The job as its manager sees it, with up to `recent` past results (newest last).
    pub async fn status(
        &mut self,
        job: &str,
        recent: u32,
    ) -> Result<proto::JobStatus, ClientError> {
        let req = self.request(proto::StatusRequest {
            job_id: job.to_owned(),
            recent,
        });
        Ok(self.inner.get_status(req).await?.into_inner())
    }

    /// Waits until exactly `count` workers are registered (`None`: every expected one).
    pub async fn wait_registered(
        &mut self,
        job: &str,
        count: Option<u32>,
    ) -> Result<proto::JobStatus, ClientError> {
        let req = self.request(proto::WaitRegisteredRequest {
            job_id: job.to_owned(),
            count,
        });
        Ok(self.inner.wait_registered(req).await?.into_inner())
    }

    /// Sends `req` and returns its event stream as it comes.
    pub async fn switch(
        &mut self,
        req: proto::SwitchRequest,
    ) -> Result<tonic::Streaming<proto::SwitchEvent>, ClientError> {
        let req = self.request(req);
        Ok(self.inner.switch(req).await?.into_inner())
    }

    /// Submits `cmd` and returns once the manager accepted it (`Err(Refused)` otherwise);
    /// follow it with [`Switching`].
    pub async fn submit(&mut self, cmd: &SwitchCommand) -> Result<Switching, ClientError> {
        let mut events = self.switch(request_of(cmd, true)).await?;
        match next_event(&mut events).await? {
            Event::Accepted(a) => Ok(Switching {
                uuid: a.uuid,
                known: a.known,
                in_flight: a.in_flight,
                events,
            }),
            Event::Refused(r) => Err(refused(r)),
            _ => Err(ClientError::Protocol("an event before `accepted`")),
        }
    }

    /// Submits `cmd` and waits for its result.
    pub async fn run(&mut self, cmd: &SwitchCommand) -> Result<OperationSummary, ClientError> {
        self.submit(cmd).await?.result().await
    }

    /// Recovers a job that is not running (`to`: primary, backup or as-is) and waits for the
    /// outcome.
    pub async fn recover(
        &mut self,
        job: &str,
        to: &str,
    ) -> Result<proto::RecoverReply, ClientError> {
        let req = self.request(proto::RecoverRequest {
            job_id: job.to_owned(),
            to: to.to_owned(),
            ..Default::default()
        });
        Ok(self.inner.recover(req).await?.into_inner())
    }

    /// Stops training on every rank, for `reason` (empty: the operator's default); answers
    /// once the stop is sent (`GetStatus` follows the restart).
    pub async fn stop_training(
        &mut self,
        job: &str,
        reason: &str,
    ) -> Result<proto::RecoverReply, ClientError> {
        let req = self.request(proto::RecoverRequest {
            job_id: job.to_owned(),
            stop_training: true,
            reason: reason.to_owned(),
            ..Default::default()
        });
        Ok(self.inner.recover(req).await?.into_inner())
    }
}

/// The control API's request for `cmd`.
pub fn request_of(cmd: &SwitchCommand, wait: bool) -> proto::SwitchRequest {
    proto::SwitchRequest {
        abort_in_flight: false,
        job_id: cmd.job.0.clone(),
        uuid: cmd.id.map(|i| i.to_string()).unwrap_or_default(),
        targets: cmd
            .targets
            .iter()
            .map(|t| proto::Target {
                node: t.node.0.clone(),
                device: t.device.0,
                use_backup: t.use_backup,
                rank: 0,
            })
            .collect(),
        wait,
    }
}

fn refused(r: proto::Refused) -> ClientError {
    ClientError::Refused {
        code: r.code,
        kind: r.kind(),
        reason: r.reason,
    }
}

async fn next_event(s: &mut tonic::Streaming<proto::SwitchEvent>) -> Result<Event, ClientError> {
    loop {
        match s.message().await? {
            Some(proto::SwitchEvent { event: Some(e) }) => return Ok(e),
            Some(_) => continue,
            None => return Err(ClientError::Protocol("the stream ended without a result")),
        }
    }
}

/// What an accepted operation does next.
#[derive(Debug)]
// One value an operation, handed on at once: boxing the result would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum Progress {
    /// A phase started, its count of ranks to answer went down, or it finished.
    Phase(proto::PhaseEvent),
    /// The final result; nothing follows.
    Finished(OperationSummary),
}

/// An accepted operation: its phases, then its result.
pub struct Switching {
    /// The operation's UUID.
    pub uuid: String,
    /// `true` when the UUID had already run: its result comes at once.
    pub known: bool,
    /// `true` when the UUID is the operation in flight: nothing new started, its phases and
    /// result follow.
    pub in_flight: bool,
    events: tonic::Streaming<proto::SwitchEvent>,
}

impl Switching {
    /// The next phase event, or the result.
    pub async fn next(&mut self) -> Result<Progress, ClientError> {
        match next_event(&mut self.events).await? {
            Event::Phase(p) => Ok(Progress::Phase(p)),
            Event::Result(r) => Ok(Progress::Finished(OperationSummary::from(&r))),
            Event::Refused(r) => Err(refused(r)),
            Event::Accepted(_) => Err(ClientError::Protocol("a second `accepted`")),
        }
    }

    /// Skips the phases; the result.
    pub async fn result(mut self) -> Result<OperationSummary, ClientError> {
        loop {
            if let Progress::Finished(r) = self.next().await? {
                return Ok(r);
            }
        }
    }
}
