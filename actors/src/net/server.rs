//! The server side of the transport: accepts connections, admits registrations, keeps one
//! *slot* per registered peer (its outbox, what was received from it, its connection) and
//! declares peers lost.
//!
//! A slot outlives its connection, which is how a reconnect of the same process is told from a
//! new process: a registration with the slot's incarnation resumes it (nothing lost, nothing
//! repeated); one with another incarnation while the slot is disconnected replaces it (the old
//! process is declared lost first); one while the slot is connected is a duplicate and is
//! refused. What a role does with its peers is its `Host` (the manager for proxies, a proxy
//! for workers).

use super::frame::End;
use super::heartbeat::Liveness;
use super::limits::{ConnLimits, Connections};
use super::liveness::LocalProcess;
use super::outbound::outbound;
use super::outbox::Outbox;
use super::pb;
use super::session::{Delivery, Inbound, Session};
use super::{NetConfig, NetError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status, Streaming};

/// Why a registration is refused, in words the operator of the refused process can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    /// The registration is wrong and will stay wrong (wrong job, rank, node, role).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Refusal {
            code: Code::InvalidArgument,
            message: message.into(),
        }
    }

    /// Not yet: retry later.
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Refusal {
            code: Code::Unavailable,
            message: message.into(),
        }
    }
}

/// An admitted registration: the peer's key (its node, its rank) and what to tell it.
pub(crate) struct Admitted {
    pub key: String,
    pub ack: pb::RegisterAck,
}

/// What a role does with the peers that connect to it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The role that registers here.
    fn role(&self) -> pb::Role;
    /// Checks a registration against what this side knows (job, rank table, node).
    fn admit(&self, reg: &pb::Register) -> Result<Admitted, Refusal>;
    /// A new peer is up; messages to it go into `outbox`.
    fn connected(&self, key: &str, outbox: Arc<Outbox<pb::down::Body>>);
    /// A sequenced message from the peer, in order.
    fn deliver(&self, key: &str, body: pb::up::Body) -> Delivery;
    /// An unsequenced message (a ping); the answer, if any, goes straight back.
    fn unsequenced(&self, key: &str, body: pb::up::Body) -> Option<pb::down::Body>;
    /// The peer is gone for good; `goodbye`: it said so itself (it stopped on purpose), rather
    /// than its connection or its process ending under it.
    fn lost(&self, key: &str, reason: String, goodbye: bool);
}

/// Queue depth of one peer's outbox.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueueDepth {
    /// Messages sent and not yet acknowledged now.
    pub queued: usize,
    /// The most ever queued at once: how close a slow peer came to being reset.
    pub high_water: usize,
    /// The bound (`NetConfig::queue_capacity`); reaching it resets the peer's connection.
    pub capacity: usize,
}

struct Slot {
    incarnation: String,
    /// The peer's process, when it said which: its end cuts the reconnect window short.
    process: Option<LocalProcess>,
    /// Bumped by every connection; a session whose id is not the slot's is stale.
    conn: u64,
    connected: bool,
    remote: Option<SocketAddr>,
    outbox: Arc<Outbox<pb::down::Body>>,
    received: Arc<AtomicU64>,
    deliver_lock: Arc<tokio::sync::Mutex<()>>,
    control: Option<mpsc::Sender<Box<pb::down::Body>>>,
    /// Dropping it ends the connection's session.
    stop: Option<watch::Sender<bool>>,
}

/// The registered peers of one server: their connections and queue depths. Cheap to share
/// ([`ManagerNode::peers`](super::ManagerNode::peers), [`ProxyNode::peers`](super::ProxyNode::peers)).
pub struct Registry {
    incarnation: String,
    net: NetConfig,
    role: pb::Role,
    slots: Mutex<HashMap<String, Slot>>,
    shutting_down: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// Sends an unsequenced message (a pong) to the peer's live connection, if any.
    pub(crate) fn send_unsequenced(&self, key: &str, body: pb::down::Body) -> bool {
        let slots = self.slots.lock();
        slots
            .get(key)
            .and_then(|s| s.control.as_ref())
            .is_some_and(|c| c.try_send(Box::new(body)).is_ok())
    }

    /// The queue towards peer `key` (its registration key: the node name on a manager's
    /// server, the rank on a proxy's); `None` for a peer that never registered.
    pub fn queue_depth(&self, key: &str) -> Option<QueueDepth> {
        let slots = self.slots.lock();
        slots.get(key).map(|s| QueueDepth {
            queued: s.outbox.len(),
            high_water: s.outbox.high_water(),
            capacity: s.outbox.capacity(),
        })
    }

    /// Keys of the peers with a live connection.
    pub fn connected(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .slots
            .lock()
            .iter()
            .filter(|(_, s)| s.connected)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Ends every connection (the server is stopping); peers are not declared lost.
    pub(crate) fn shutdown(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        for s in self.slots.lock().values_mut() {
            s.stop = None;
            s.control = None;
        }
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

fn role_name(r: pb::Role) -> &'static str {
    match r {
        pb::Role::Manager => "manager",
        pb::Role::Proxy => "proxy",
        pb::Role::Worker => "worker",
        pb::Role::Unspecified => "unspecified role",
    }
}

/// The `TaskNet` service of one server, over `host`.
pub(crate) struct NetService<H: Host> {
    inner: Arc<Inner<H>>,
}

impl<H: Host> Clone for NetService<H> {
    fn clone(&self) -> Self {
        NetService {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<H> {
    host: H,
    registry: Arc<Registry>,
    /// The port's connections: a registered one is past its first request.
    connections: Arc<Connections>,
}

impl<H: Host> NetService<H> {
    /// The service of `host`, its connections held within `limits`.
    pub(crate) fn new(host: H, net: NetConfig, limits: ConnLimits) -> Self {
        let role = host.role();
        NetService {
            inner: Arc::new(Inner {
                connections: Connections::new("transport", limits),
                host,
                registry: Arc::new(Registry {
                    incarnation: uuid::Uuid::new_v4().to_string(),
                    net,
                    role,
                    slots: Mutex::new(HashMap::new()),
                    shutting_down: Default::default(),
                }),
            }),
        }
    }

    pub(crate) fn registry(&self) -> Arc<Registry> {
        self.inner.registry.clone()
    }

    /// The tonic service, with the configured message size limits.
    pub(crate) fn into_server(self) -> pb::task_net_server::TaskNetServer<Self> {
        let max = self.inner.registry.net.max_message_bytes;
        pb::task_net_server::TaskNetServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }

    /// Serves the connections of `listener` (with TLS when given, within the service's
    /// connection limits) until the returned sender is used or dropped; `role` names the
    /// server in the log of a failure ("the proxy's").
    pub(crate) fn serve(
        self,
        listener: tokio::net::TcpListener,
        tls: Option<&super::tls::TlsPem>,
        role: &'static str,
    ) -> Result<(oneshot::Sender<()>, tokio::task::JoinHandle<()>), NetError> {
        let incoming = super::limits::incoming(listener, self.inner.connections.clone());
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder
                .tls_config(tls.server_config()?)
                .map_err(|e| super::tls::TlsError::Config(super::client::error_chain(&e)))?;
        }
        let router = builder.add_service(self.into_server());
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::error!(error = %e, "the {role} server failed");
            }
        });
        Ok((tx, server))
    }
}

enum Decision {
    New,
    Resume,
    /// The slot of another (or a forgotten) process of the same peer: declare it lost first.
    Replace(String),
}

impl<H: Host> Inner<H> {
    fn lose(self: &Arc<Self>, key: &str, reason: String, goodbye: bool) {
        tracing::warn!(peer = %key, role = role_name(self.registry.role), %reason, "peer lost");
        self.host.lost(key, reason, goodbye);
    }

    /// A connection's session ended.
    fn ended(self: &Arc<Self>, key: String, conn: u64, end: End) {
        let net = &self.registry.net;
        let mut slots = self.registry.slots.lock();
        let Some(slot) = slots.get_mut(&key) else {
            return;
        };
        if slot.conn != conn {
            return; // a newer connection took over
        }
        slot.connected = false;
        slot.control = None;
        slot.stop = None;
        match end {
            End::Stopped => {}
            End::Closed(ref why) if !self.registry.is_shutting_down() => {
                tracing::info!(peer = %key, ?end, "connection closed; waiting for a reconnect");
                let inner = self.clone();
                let wait = net.loss_after();
                let (process, why) = (slot.process.clone(), why.clone());
                tokio::spawn(async move {
                    // The window, cut short when the peer's process is known to have ended.
                    let started = tokio::time::Instant::now();
                    let ended = match &process {
                        Some(p) if p.ends_within(wait).await => Some(p.pid),
                        _ => None,
                    };
                    let reason = match ended {
                        Some(pid) => {
                            format!("connection closed ({why}) and its process (pid {pid}) ended")
                        }
                        None => {
                            tokio::time::sleep_until(started + wait).await;
                            end.describe(wait)
                        }
                    };
                    let gone = {
                        let mut slots = inner.registry.slots.lock();
                        match slots.get(&key) {
                            Some(s) if s.conn == conn && !s.connected => slots.remove(&key),
                            _ => None,
                        }
                    };
                    if let Some(s) = gone {
                        s.outbox.close(reason.clone());
                        inner.lose(&key, reason, false);
                    }
                });
            }
            End::Closed(_) => {}
            _ => {
                let s = slots.remove(&key).expect("present above");
                drop(slots);
                let reason = end.describe(net.loss_after());
                s.outbox.close(reason.clone());
                let goodbye = matches!(end, End::Goodbye(_));
                self.lose(&key, reason, goodbye);
            }
        }
    }
}

/// The per-connection inbound handler: hands messages to the host.
struct SlotInbound<H: Host> {
    inner: Arc<Inner<H>>,
    key: String,
}

impl<H: Host> Inbound<pb::up::Body> for SlotInbound<H> {
    fn deliver(&self, body: pb::up::Body) -> Delivery {
        self.inner.host.deliver(&self.key, body)
    }

    fn unsequenced(&self, body: pb::up::Body) {
        if let Some(reply) = self.inner.host.unsequenced(&self.key, body) {
            self.inner.registry.send_unsequenced(&self.key, reply);
        }
    }
}

type DownStream = Pin<Box<dyn Stream<Item = Result<pb::Down, Status>> + Send>>;

#[tonic::async_trait]
impl<H: Host> pb::task_net_server::TaskNet for NetService<H> {
    type SessionStream = DownStream;

    async fn session(
        &self,
        req: Request<Streaming<pb::Up>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let inner = self.inner.clone();
        let net = inner.registry.net.clone();
        let remote = req.remote_addr();
        let mut inbound = req.into_inner();
        let reg = read_registration(&mut inbound, &net).await?;
        let want = inner.host.role();
        check_role(want, &reg)?;
        let admitted = inner
            .host
            .admit(&reg)
            .map_err(|r| Status::new(r.code, r.message))?;
        let key = admitted.key;
        let (control_tx, control_rx) = mpsc::channel(64);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (claim, replaced) = inner.claim(&key, &reg, remote, control_tx, stop_tx)?;
        if let Some(peer) = remote {
            inner.connections.served(peer);
        }
        if let Some(reason) = replaced {
            inner.lose(&key, reason, false);
        }
        if !claim.resumed {
            inner.host.connected(&key, claim.outbox.clone());
        }
        tracing::info!(
            peer = %key,
            role = role_name(want),
            remote = ?remote,
            resumed = claim.resumed,
            "registered"
        );
        let mut ack = admitted.ack;
        ack.server_incarnation = inner.registry.incarnation.clone();
        ack.resumed = claim.resumed;
        ack.received = claim.received.load(std::sync::atomic::Ordering::Acquire);
        ack.heartbeat_interval_ms = net.heartbeat_interval.as_millis() as u64;
        ack.missed_heartbeats = net.missed_heartbeats;
        let registered = pb::Down {
            seq: 0,
            ack: 0,
            body: Some(pb::down::Body::Registered(ack)),
        };
        let (tx, stream) = outbound(claim.received, registered);
        let session = Session::<pb::Up, pb::Down> {
            inbound,
            outbound: tx,
            outbox: claim.outbox,
            epoch: claim.epoch,
            deliver_lock: claim.deliver_lock,
            control: control_rx,
            liveness: Arc::new(Liveness::new(net.heartbeat_interval, net.missed_heartbeats)),
            stop: stop_rx,
            ack_every: super::session::ack_every(net.queue_capacity),
        };
        let handler = Arc::new(SlotInbound {
            inner: inner.clone(),
            key: key.clone(),
        });
        let conn = claim.conn;
        tokio::spawn(async move {
            let end = session.run(handler).await;
            inner.ended(key, conn, end);
        });
        Ok(Response::new(Box::pin(stream.map(Ok))))
    }
}

/// The first frame of a connection: its registration, within the registration timeout.
async fn read_registration(
    inbound: &mut Streaming<pb::Up>,
    net: &NetConfig,
) -> Result<pb::Register, Status> {
    let first = tokio::time::timeout(net.register_timeout, inbound.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "no registration within {:?} of connecting",
                net.register_timeout
            ))
        })??;
    match first.and_then(|f| f.body) {
        Some(pb::up::Body::Register(r)) if !r.incarnation.is_empty() => Ok(r),
        Some(pb::up::Body::Register(_)) => Err(Status::invalid_argument(
            "the registration carries no incarnation id",
        )),
        _ => Err(Status::invalid_argument(
            "the first frame of a connection must be a registration",
        )),
    }
}

/// Refuses a peer of the wrong role, saying where it should register instead.
fn check_role(want: pb::Role, reg: &pb::Register) -> Result<(), Status> {
    if reg.role == want as i32 {
        return Ok(());
    }
    let got = pb::Role::try_from(reg.role).unwrap_or(pb::Role::Unspecified);
    let hint = match (want, got) {
        (pb::Role::Proxy, pb::Role::Worker) => {
            ": workers register with the proxy of their node, not with the manager"
        }
        (pb::Role::Worker, pb::Role::Proxy) => {
            ": proxies register with the manager of the job, not with another proxy"
        }
        _ => "",
    };
    Err(Status::invalid_argument(format!(
        "a {} tried to register with a server that accepts only a {}{hint}",
        role_name(got),
        role_name(want)
    )))
}

/// What a connection takes over from its peer's slot.
struct Claim {
    outbox: Arc<Outbox<pb::down::Body>>,
    received: Arc<AtomicU64>,
    deliver_lock: Arc<tokio::sync::Mutex<()>>,
    epoch: u64,
    conn: u64,
    resumed: bool,
}

impl<H: Host> Inner<H> {
    /// Gives the connection of `key` its slot: a new one, the same process's (resuming when
    /// the peer says it talked to this server), or a forgotten or replaced process's (then
    /// the reason the old one is lost comes back too). A second live process is refused.
    fn claim(
        &self,
        key: &str,
        reg: &pb::Register,
        remote: Option<SocketAddr>,
        control: mpsc::Sender<Box<pb::down::Body>>,
        stop: watch::Sender<bool>,
    ) -> Result<(Claim, Option<String>), Status> {
        let reg_ = &self.registry;
        let net = &reg_.net;
        let mut slots = reg_.slots.lock();
        let decision = match slots.get(key) {
            None => Decision::New,
            Some(s) if s.incarnation == reg.incarnation => {
                let resumable = reg
                    .resume
                    .as_ref()
                    .is_some_and(|r| r.server_incarnation == reg_.incarnation);
                if resumable {
                    Decision::Resume
                } else {
                    Decision::Replace(s.incarnation.clone())
                }
            }
            Some(s) if s.connected => {
                let from = s.remote.map(|a| format!(" from {a}")).unwrap_or_default();
                return Err(Status::already_exists(format!(
                    "{} {key} is already registered by another live process (incarnation {}, connected{from}); a second one is refused. If that process is gone, it is declared lost within {:?}: retry then",
                    role_name(reg_.role),
                    s.incarnation,
                    net.loss_after()
                )));
            }
            Some(s) => Decision::Replace(s.incarnation.clone()),
        };
        let mut replaced = None;
        if let Decision::Replace(old) = &decision {
            let s = slots.remove(key).expect("present above");
            let reason = format!(
                "its process was replaced by a new one (incarnation {} after {old})",
                reg.incarnation
            );
            s.outbox.close(reason.clone());
            replaced = Some(reason);
        }
        let slot = slots.entry(key.to_owned()).or_insert_with(|| Slot {
            incarnation: reg.incarnation.clone(),
            process: reg.process.as_ref().and_then(LocalProcess::from_pb),
            conn: 0,
            connected: false,
            remote: None,
            outbox: Outbox::new(net.queue_capacity, None),
            received: Arc::new(AtomicU64::new(0)),
            deliver_lock: Default::default(),
            control: None,
            stop: None,
        });
        let resumed = matches!(decision, Decision::Resume);
        if resumed {
            if let Some(r) = &reg.resume {
                slot.outbox.ack(r.received);
            }
        }
        slot.conn += 1;
        slot.connected = true;
        slot.remote = remote;
        slot.control = Some(control);
        slot.stop = Some(stop); // ends the previous connection, if any
        let claim = Claim {
            epoch: slot.outbox.attach(),
            outbox: slot.outbox.clone(),
            received: slot.received.clone(),
            deliver_lock: slot.deliver_lock.clone(),
            conn: slot.conn,
            resumed,
        };
        Ok((claim, replaced))
    }
}

/// Binds a listener (port 0 picks a free port) for a tonic server.
pub(crate) async fn bind(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), NetError> {
    super::limits::bind(addr)
        .await
        .map_err(|source| NetError::Bind {
            addr: addr.to_string(),
            source,
        })
}
