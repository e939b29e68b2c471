//! The client side of the transport: connects to the server (a worker to its proxy, a proxy
//! to the manager), registers, runs the connection, and when it ends reconnects with backoff
//! and registers again, resuming the session when the server still has it.
//!
//! A refusal that will not change by retrying (wrong job, rank, node or role) ends the client
//! and is reported as [`ClientState::Refused`]; so does a duplicate that is still refused after
//! twice the loss time (a real second process, not the ghost of a restarted one).

use super::backoff::Backoff;
use super::frame::End;
use super::heartbeat::Liveness;
use super::outbound::{outbound, OutboundTx};
use super::outbox::Outbox;
use super::pb;
use super::session::{Delivery, Inbound, Session};
use super::NetConfig;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::Code;

/// Where the client is.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientState {
    /// Not registered (yet, or since the connection dropped).
    Connecting {
        /// Failed attempts since the last registered connection (0 before the first try).
        attempts: u32,
        /// Why the last attempt or connection failed; `None` before the first try.
        last_error: Option<String>,
    },
    /// Registered on a live connection; the server's answer (its incarnation, heartbeat
    /// settings, whether it resumed our session).
    Registered(Box<pb::RegisterAck>),
    /// The server refused the registration for good; the client stopped.
    Refused(String),
    /// Its node stopped it, or said goodbye; it never connects again.
    Stopped,
}

/// What the role behind a client does.
pub(crate) trait ClientHost: Send + Sync + 'static {
    /// The registration (the client fills in incarnation, resume, version and process).
    fn register(&self) -> pb::Register;
    /// The server accepted the registration and placed the client (node, ranks, devices,
    /// the job's size): the host takes its place from `ack`, starting its actor the first
    /// time. `fresh`: the server had no session for this client (the first time, or it
    /// forgot it): anything unacknowledged is void and sticky messages were queued again.
    fn placed(&self, ack: &pb::RegisterAck, fresh: bool);
    /// A sequenced message from the server, in order.
    fn deliver(&self, body: pb::down::Body) -> Delivery;
    /// An unsequenced message (a pong).
    fn unsequenced(&self, body: pb::down::Body);
}

/// One client: its outbox, its state, its unsequenced channel.
///
/// The transport's own machinery: each [`ProxyNode`](super::ProxyNode) and
/// [`RemoteWorker`](super::RemoteWorker) runs one, and callers follow its [`ClientState`]
/// through them rather than hold a `Client`.
pub(crate) struct Client {
    server: String,
    incarnation: String,
    outbox: Arc<Outbox<pb::up::Body>>,
    control: Mutex<Option<mpsc::Sender<Box<pb::up::Body>>>>,
    state: watch::Sender<ClientState>,
    stop: watch::Sender<bool>,
}

/// A registered connection: the server's frames, ours, and its registration answer.
struct Link {
    inbound: tonic::Streaming<pb::Down>,
    outbound: OutboundTx<pb::Up>,
    ack: pb::RegisterAck,
}

enum Attempt {
    Retry(String),
    Conflict(String),
    Fatal(String),
}

impl Client {
    /// A client for `server` (`HOST:PORT`) sending what is pushed into `outbox`, with a fresh
    /// incarnation id: the server tells this process from an earlier one by it. Nothing
    /// happens until [`run`](Self::run).
    pub(crate) fn new(server: String, outbox: Arc<Outbox<pb::up::Body>>) -> Arc<Client> {
        Arc::new(Client {
            server,
            incarnation: uuid::Uuid::new_v4().to_string(),
            outbox,
            control: Mutex::new(None),
            state: watch::channel(ClientState::Connecting {
                attempts: 0,
                last_error: None,
            })
            .0,
            stop: watch::channel(false).0,
        })
    }

    /// The server address, as given.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// Follows the connection's state: a caller waits on it for registration or refusal.
    pub(crate) fn state(&self) -> watch::Receiver<ClientState> {
        self.state.subscribe()
    }

    /// Sends an unsequenced message (a ping) on the live connection, if any.
    pub(crate) fn send_unsequenced(&self, body: pb::up::Body) -> bool {
        self.control
            .lock()
            .as_ref()
            .is_some_and(|c| c.try_send(Box::new(body)).is_ok())
    }

    /// Says goodbye (after everything queued before), waits up to `wait` for the server to
    /// acknowledge it, and stops.
    pub(crate) async fn goodbye(&self, reason: String, wait: Duration) {
        let registered = matches!(*self.state.borrow(), ClientState::Registered(_));
        if registered
            && self
                .outbox
                .push(pb::up::Body::Goodbye(pb::Goodbye { reason }))
                .is_ok()
        {
            // Until the server acknowledged it, or the connection is gone (the server is
            // stopping too), or `wait` passed.
            let mut state = self.state.subscribe();
            let disconnected = async {
                loop {
                    if !matches!(*state.borrow_and_update(), ClientState::Registered(_)) {
                        return;
                    }
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = self.outbox.drained() => {}
                _ = disconnected => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        self.stop();
    }

    /// Ends the connection and the reconnection loop.
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Connects, registers and keeps the connection up until stopped or refused.
    pub(crate) async fn run(
        self: Arc<Self>,
        tls: Option<ClientTlsConfig>,
        net: NetConfig,
        host: Arc<dyn ClientHost>,
    ) {
        let mut backoff = Backoff::new(net.backoff_initial, net.backoff_max);
        let received = Arc::new(AtomicU64::new(0));
        let deliver_lock = Arc::new(tokio::sync::Mutex::new(()));
        let mut server_incarnation: Option<String> = None;
        let mut attempts = 0u32;
        let mut first_conflict: Option<Instant> = None;
        let mut stop = self.stop.subscribe();
        loop {
            if self.stopping() {
                break;
            }
            attempts += 1;
            let outcome = self
                .attempt(tls.clone(), &net, &*host, &received, &server_incarnation)
                .await;
            let error = match outcome {
                Ok(link) => {
                    first_conflict = None;
                    backoff.reset();
                    attempts = 0;
                    let shared = (&received, &deliver_lock);
                    match self
                        .serve(link, &host, shared, &mut server_incarnation, &stop)
                        .await
                    {
                        Some(why) => why,
                        None => break,
                    }
                }
                Err(Attempt::Fatal(msg)) => {
                    tracing::error!(server = %self.server, reason = %msg, "registration refused");
                    self.state.send_replace(ClientState::Refused(msg));
                    return;
                }
                Err(Attempt::Conflict(msg)) => {
                    let patience = net.loss_after() * 2;
                    if first_conflict.is_none() {
                        // Said at once: a real second process is the likelier case.
                        tracing::warn!(server = %self.server, reason = %msg, "registration refused as a duplicate; retrying for {patience:?} in case the other registration is this process's own predecessor, then giving up");
                    }
                    let since = *first_conflict.get_or_insert_with(Instant::now);
                    if since.elapsed() > patience {
                        tracing::error!(server = %self.server, reason = %msg, "registration refused");
                        self.state.send_replace(ClientState::Refused(msg));
                        return;
                    }
                    msg
                }
                Err(Attempt::Retry(msg)) => msg,
            };
            if attempts == 1 || attempts % 20 == 0 {
                tracing::info!(server = %self.server, attempts, error = %error, "not connected; retrying");
            }
            self.state.send_replace(ClientState::Connecting {
                attempts,
                last_error: Some(error),
            });
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                _ = stop.changed() => {}
            }
        }
        self.state.send_replace(ClientState::Stopped);
    }

    /// Runs one registered connection until it ends; returns why (to retry), or `None` when
    /// the client is stopping.
    async fn serve(
        &self,
        link: Link,
        host: &Arc<dyn ClientHost>,
        (received, deliver_lock): (&Arc<AtomicU64>, &Arc<tokio::sync::Mutex<()>>),
        server_incarnation: &mut Option<String>,
        stop: &watch::Receiver<bool>,
    ) -> Option<String> {
        let Link {
            inbound,
            outbound,
            ack,
        } = link;
        let fresh = !ack.resumed;
        if fresh {
            received.store(0, Ordering::Release);
            if server_incarnation.is_some() {
                self.outbox.renew();
            }
        } else {
            self.outbox.ack(ack.received);
        }
        *server_incarnation = Some(ack.server_incarnation.clone());
        let epoch = self.outbox.attach();
        let (control_tx, control_rx) = mpsc::channel(64);
        *self.control.lock() = Some(control_tx);
        let interval = Duration::from_millis(ack.heartbeat_interval_ms.max(1));
        let liveness = Arc::new(Liveness::new(interval, ack.missed_heartbeats));
        host.placed(&ack, fresh);
        self.state
            .send_replace(ClientState::Registered(Box::new(ack)));
        let session = Session::<pb::Down, pb::Up> {
            inbound,
            outbound,
            outbox: self.outbox.clone(),
            epoch,
            deliver_lock: deliver_lock.clone(),
            control: control_rx,
            liveness,
            stop: stop.clone(),
            ack_every: super::session::ack_every(self.outbox.capacity()),
        };
        let handler = Arc::new(HostInbound(host.clone()));
        let end = session.run(handler).await;
        *self.control.lock() = None;
        self.state.send_replace(ClientState::Connecting {
            attempts: 0,
            last_error: Some(format!("{end:?}")),
        });
        if self.stopping() {
            return None;
        }
        tracing::warn!(server = %self.server, ?end, "connection ended; reconnecting");
        Some(match end {
            End::Goodbye(r) => format!("the server stopped: {r}"),
            other => format!("{other:?}"),
        })
    }

    async fn attempt(
        &self,
        tls: Option<ClientTlsConfig>,
        net: &NetConfig,
        host: &dyn ClientHost,
        received: &Arc<AtomicU64>,
        server_incarnation: &Option<String>,
    ) -> Result<Link, Attempt> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.server))
            .map_err(|e| Attempt::Fatal(format!("bad server address {:?}: {e}", self.server)))?
            .connect_timeout(net.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Attempt::Fatal(format!("TLS setup: {}", error_chain(&e))))?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            Attempt::Retry(format!(
                "cannot connect to {}: {}",
                self.server,
                error_chain(&e)
            ))
        })?;
        let mut client = pb::task_net_client::TaskNetClient::new(channel)
            .max_decoding_message_size(net.max_message_bytes)
            .max_encoding_message_size(net.max_message_bytes);
        let mut reg = host.register();
        reg.incarnation = self.incarnation.clone();
        reg.version = env!("CARGO_PKG_VERSION").to_owned();
        reg.process = super::liveness::LocalProcess::current()
            .as_ref()
            .map(Into::into);
        reg.resume = server_incarnation.as_ref().map(|s| pb::SessionResume {
            server_incarnation: s.clone(),
            received: received.load(Ordering::Acquire),
        });
        let register = pb::Up {
            seq: 0,
            ack: 0,
            body: Some(pb::up::Body::Register(reg)),
        };
        let (tx, stream) = outbound(received.clone(), register);
        let call = tokio::time::timeout(net.register_timeout, client.session(stream));
        let response = match call.await {
            Err(_) => return Err(Attempt::Retry("no answer to the registration".into())),
            Ok(Err(status)) => {
                let msg = status.message().to_owned();
                return Err(match status.code() {
                    Code::InvalidArgument | Code::PermissionDenied | Code::FailedPrecondition => {
                        Attempt::Fatal(msg)
                    }
                    Code::AlreadyExists => Attempt::Conflict(msg),
                    _ => Attempt::Retry(format!("{:?}: {msg}", status.code())),
                });
            }
            Ok(Ok(r)) => r,
        };
        let mut inbound = response.into_inner();
        let first = tokio::time::timeout(net.register_timeout, inbound.message()).await;
        match first {
            Ok(Ok(Some(pb::Down {
                body: Some(pb::down::Body::Registered(ack)),
                ..
            }))) => Ok(Link {
                inbound,
                outbound: tx,
                ack,
            }),
            Ok(Err(status)) => Err(Attempt::Retry(status.message().to_owned())),
            _ => Err(Attempt::Retry(
                "the server did not acknowledge the registration".into(),
            )),
        }
    }
}

/// The whole chain of a transport error ("transport error: tcp connect error: refused"); a
/// cause that only repeats what is said already is left out.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let text = x.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = x.source();
    }
    s
}

struct HostInbound(Arc<dyn ClientHost>);

impl Inbound<pb::down::Body> for HostInbound {
    fn deliver(&self, body: pb::down::Body) -> Delivery {
        self.0.deliver(body)
    }

    fn unsequenced(&self, body: pb::down::Body) {
        self.0.unsequenced(body)
    }
}
