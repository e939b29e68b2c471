//! The worker API for training processes: a [`Worker`] for one global rank, its
//! [`StepGate`], and its connection to the proxy of its node.
//!
//! ```no_run
//! use taskd_actors::net::{RemoteWorker, RemoteWorkerConfig};
//! # fn hal() -> Box<dyn taskd_core::RankHal> { unimplemented!() }
//! # fn train_one_step(_: u64) {}
//! let cfg = RemoteWorkerConfig::new("job-1".into(), taskd_core::GlobalRank(3), "127.0.0.1:9602");
//! let worker = RemoteWorker::start(cfg, hal()).expect("worker started");
//! let gate = worker.gate();
//! for step in 1..=1000 {
//!     train_one_step(step);
//!     gate.step_completed(step); // one atomic load unless an operation holds the rank here
//! }
//! worker.stop();
//! ```
//!
//! [`RemoteWorker`] runs on threads of its own (an actix system for the worker actor and its
//! connection, and the HAL's thread, [`ThreadedRankHal`]), so the training loop only ever
//! calls the gate.
//! [`WorkerNode`] is the same worker for code that already runs an actix system (many workers
//! in one process, as the benchmark does).

use super::client::{Client, ClientHost, ClientState};
use super::outbox::{self, Outbox, Sticky};
use super::session::Delivery;
use super::tls::TlsPem;
use super::{pb, wire, NetConfig, NetError};
use crate::background::Background;
use crate::gate::StepGate;
use crate::hal_exec::ThreadedRankHal;
use crate::transport::hand_over;
use crate::worker::{StopWorker, Worker, WorkerConfig};
use actix::prelude::*;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use taskd_core::protocol::WorkerToProxy;
use taskd_core::{DeviceId, GlobalRank, JobId, NodeName, RankHal, TaskRankHal};
use tokio::sync::{mpsc, oneshot, watch};

/// Who the worker is and where its proxy is.
#[derive(Clone, Debug)]
pub struct RemoteWorkerConfig {
    /// The job; the proxy refuses a worker of another job.
    pub job: JobId,
    /// This process's global rank.
    pub rank: GlobalRank,
    /// The proxy of this node, `HOST:PORT`.
    pub proxy: String,
    /// The node this rank expects to be on; `None`: the proxy's node.
    pub node: Option<NodeName>,
    /// `MS_ENABLE_TFT` of this process enables `TSP:1`.
    pub tsp: bool,
    /// The job restart its launcher started this process for (`TASKD_RESTART_COUNT`).
    pub generation: u32,
    /// The hang watch's timeout ([`crate::worker::WorkerConfig::hang_timeout`]).
    pub hang_timeout: Option<Duration>,
    /// Mutual TLS towards the proxy; `None`: plain HTTP/2 (the proxy listens on loopback by
    /// default).
    pub tls: Option<TlsPem>,
    /// Queue bound, connect timeout and backoff; heartbeats are the proxy's.
    pub net: NetConfig,
}

impl RemoteWorkerConfig {
    /// Defaults: `tsp` from this process's `MS_ENABLE_TFT`, the generation from its
    /// `TASKD_RESTART_COUNT` (0 when unset or not a count), the hang watch from
    /// [`taskd_core::env::hang_timeout`] (none when its variables are malformed: the roles'
    /// configuration refuses them with the variable's name), no TLS, default transport knobs.
    pub fn new(job: JobId, rank: GlobalRank, proxy: impl Into<String>) -> Self {
        use taskd_core::env;
        let tft = std::env::var(env::MS_ENABLE_TFT).ok();
        let tsp = env::tsp_enabled(tft.as_deref());
        RemoteWorkerConfig {
            job,
            rank,
            proxy: proxy.into(),
            node: None,
            tsp,
            generation: env::restart_count(&env::process_env),
            hang_timeout: env::hang_timeout(&env::process_env, tsp).ok().flatten(),
            tls: None,
            net: NetConfig::default(),
        }
    }
}

/// Where the proxy placed this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRegistration {
    /// The node the proxy serves.
    pub node: NodeName,
    /// The physical die the manager's rank table puts this rank on.
    pub device: DeviceId,
    /// Ranks in the whole job.
    pub world_size: u32,
    /// Nodes in the whole job.
    pub node_count: u32,
    /// When the job's manager started (Unix ms).
    pub job_epoch_unix_ms: u64,
}

fn encode_worker_msg(m: WorkerToProxy) -> pb::up::Body {
    pb::up::Body::Worker(wire::worker_msg_to_pb(m))
}

/// The hello must reach a proxy that forgot this worker.
fn sticky_worker(b: &pb::up::Body) -> Sticky {
    match b {
        pb::up::Body::Worker(pb::WorkerMessage {
            kind: Some(pb::worker_message::Kind::Hello(_)),
        }) => Sticky::Keep(0),
        _ => Sticky::No,
    }
}

struct Upstream {
    cfg: RemoteWorkerConfig,
    capabilities: taskd_core::SwitchCapabilities,
    gate: Arc<StepGate>,
    hal: Mutex<Option<Box<dyn TaskRankHal>>>,
    outbox: Arc<Outbox<pb::up::Body>>,
    worker: OnceLock<Addr<Worker>>,
    registration: watch::Sender<Option<WorkerRegistration>>,
    pings: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl ClientHost for Upstream {
    fn register(&self) -> pb::Register {
        pb::Register {
            role: pb::Role::Worker as i32,
            job: self.cfg.job.0.clone(),
            node: self
                .cfg
                .node
                .as_ref()
                .map(|n| n.0.clone())
                .unwrap_or_default(),
            ranks: vec![self.cfg.rank.0],
            capabilities: Some(wire::caps_to_pb(&self.capabilities)),
            ..Default::default()
        }
    }

    fn placed(&self, ack: &pb::RegisterAck, _fresh: bool) {
        let reg = WorkerRegistration {
            node: NodeName(ack.node.clone()),
            device: DeviceId(ack.slots.first().map_or(0, |s| s.device)),
            world_size: ack.world_size,
            node_count: ack.node_count,
            job_epoch_unix_ms: ack.job_epoch_unix_ms,
        };
        if self.worker.get().is_none() {
            if let Some(hal) = self.hal.lock().take() {
                let worker = Worker::new(
                    WorkerConfig {
                        job: self.cfg.job.clone(),
                        node: reg.node.clone(),
                        rank: self.cfg.rank,
                        tsp: self.cfg.tsp,
                        generation: self.cfg.generation,
                        hang_timeout: self.cfg.hang_timeout,
                    },
                    hal,
                    self.gate.clone(),
                    outbox::link(self.outbox.clone(), encode_worker_msg),
                )
                .start();
                let _ = self.worker.set(worker);
            }
        }
        self.registration.send_replace(Some(reg));
    }

    fn deliver(&self, body: pb::down::Body) -> Delivery {
        let worker = self.worker.get().cloned();
        Box::pin(async move {
            let d = match body {
                pb::down::Body::Directive(d) => {
                    wire::directive_from_pb(d).map_err(|e| e.to_string())?
                }
                other => return Err(format!("the proxy sent an unexpected frame: {other:?}")),
            };
            let worker = worker.ok_or("a directive before registration")?;
            hand_over(worker, d).await.map_err(str::to_owned)
        })
    }

    fn unsequenced(&self, body: pb::down::Body) {
        if let pb::down::Body::Pong(p) = body {
            if let Some(tx) = self.pings.lock().remove(&p.id) {
                let _ = tx.send(());
            }
        }
    }
}

/// A worker and its connection, on the current actix system.
pub struct WorkerNode {
    upstream: Arc<Upstream>,
    client: Arc<Client>,
    task: Option<tokio::task::JoinHandle<()>>,
    next_ping: AtomicU64,
}

impl WorkerNode {
    /// Starts connecting to the proxy; the worker actor starts once registered. Returns at
    /// once. Call it from inside an actix system. A blocking HAL comes on a thread of its
    /// own ([`ThreadedRankHal`]).
    pub fn spawn(
        cfg: RemoteWorkerConfig,
        mut hal: Box<dyn TaskRankHal>,
        gate: Arc<StepGate>,
    ) -> Self {
        let capabilities = crate::worker::rank_capabilities(hal.capabilities(), cfg.tsp);
        let outbox = Outbox::new(cfg.net.queue_capacity, Some(sticky_worker));
        let client = Client::new(cfg.proxy.clone(), outbox.clone());
        let tls = cfg.tls.as_ref().map(|t| t.client_config(&cfg.proxy));
        let net = cfg.net.clone();
        let upstream = Arc::new(Upstream {
            cfg,
            capabilities,
            gate,
            hal: Mutex::new(Some(hal)),
            outbox,
            worker: OnceLock::new(),
            registration: watch::channel(None).0,
            pings: Mutex::new(HashMap::new()),
        });
        let task = actix_rt::spawn(client.clone().run(tls, net, upstream.clone()));
        WorkerNode {
            upstream,
            client,
            task: Some(task),
            next_ping: AtomicU64::new(1),
        }
    }

    /// The rank this worker serves.
    pub fn rank(&self) -> GlobalRank {
        self.upstream.cfg.rank
    }

    /// The step gate: call [`StepGate::step_completed`] after every training step.
    pub fn gate(&self) -> Arc<StepGate> {
        self.upstream.gate.clone()
    }

    /// Follows the connection to the proxy (connecting, registered, refused, stopped).
    pub fn connection(&self) -> watch::Receiver<ClientState> {
        self.client.state()
    }

    /// Follows where the proxy placed this rank: `None` until the first registration, then
    /// the latest (a reconnect may register again).
    pub fn registration(&self) -> watch::Receiver<Option<WorkerRegistration>> {
        self.upstream.registration.subscribe()
    }

    /// Waits for the first registration, or the refusal.
    pub async fn registered(&self) -> Result<WorkerRegistration, NetError> {
        registered(self.registration(), self.connection(), self.client.server()).await
    }

    /// One round trip worker -> proxy -> manager -> proxy -> worker (or only to the proxy).
    pub async fn ping(&self, to_manager: bool, timeout: Duration) -> Result<Duration, NetError> {
        let id = self.next_ping.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.upstream.pings.lock().insert(id, tx);
        let started = Instant::now();
        let sent = self.client.send_unsequenced(pb::up::Body::Ping(pb::Ping {
            id,
            origin_rank: self.upstream.cfg.rank.0,
            to_manager,
        }));
        let res = if sent {
            tokio::time::timeout(timeout, rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        self.upstream.pings.lock().remove(&id);
        res.map(|_| started.elapsed())
            .ok_or(NetError::Timeout(timeout, "a pong"))
    }

    /// Opens the gate for good, says goodbye to the proxy (the rank is lost at once, with
    /// `reason`), stops the worker actor and the connection.
    pub async fn stop(mut self, reason: &str) {
        self.upstream.gate.shutdown();
        self.client
            .goodbye(reason.to_owned(), Duration::from_secs(1))
            .await;
        if let Some(w) = self.upstream.worker.get() {
            let _ = w.send(StopWorker).await;
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}

/// A ping asked for from another thread: to the manager or only the proxy, how long to wait,
/// and where the round trip's time goes.
type PingRequest = (bool, Duration, oneshot::Sender<Result<Duration, NetError>>);

#[derive(Default)]
struct Status {
    registration: Option<WorkerRegistration>,
    refused: Option<String>,
    stopped: bool,
}

/// A worker for one rank of a training process, on threads of its own.
pub struct RemoteWorker {
    gate: Arc<StepGate>,
    rank: GlobalRank,
    status: Arc<(Mutex<Status>, Condvar)>,
    watches: (
        watch::Receiver<Option<WorkerRegistration>>,
        watch::Receiver<ClientState>,
    ),
    pings: mpsc::UnboundedSender<PingRequest>,
    /// The worker's actix system; its stop request is the reason the proxy is told.
    thread: Background<String>,
}

impl RemoteWorker {
    /// Starts the worker of `cfg.rank` over `hal`, on a thread of its own, and connects to
    /// the proxy in the background (with retries). Returns at once; the gate works from the
    /// start (it stays open until an operation arms it).
    pub fn start(cfg: RemoteWorkerConfig, hal: Box<dyn RankHal>) -> Result<RemoteWorker, NetError> {
        let rank = cfg.rank;
        let hal = ThreadedRankHal::for_rank(rank, hal).map_err(NetError::HalThread)?;
        let gate = Arc::new(StepGate::new());
        let status = Arc::new((Mutex::new(Status::default()), Condvar::new()));
        let (pings, ping_rx) = mpsc::unbounded_channel();
        let (watch_tx, watch_rx) = std::sync::mpsc::channel();
        let (thread_gate, thread_status) = (gate.clone(), status.clone());
        let name = format!("taskd-worker-{}", rank.0);
        let thread = Background::spawn_actix(&name, move |stop| async move {
            let node = WorkerNode::spawn(cfg, Box::new(hal), thread_gate);
            let _ = watch_tx.send((node.registration(), node.connection()));
            // Mirror the connection's state for callers on other threads.
            let mirror = mirror_status(node.registration(), node.connection(), &thread_status);
            actix_rt::spawn(mirror);
            let reason = answer_pings(&node, ping_rx, stop).await;
            node.stop(&reason).await;
            let (m, cv) = &*thread_status;
            m.lock().stopped = true;
            cv.notify_all();
        })
        .map_err(|_| NetError::Stopped)?;
        let watches = watch_rx.recv().map_err(|_| NetError::Stopped)?;
        Ok(RemoteWorker {
            gate,
            rank,
            status,
            watches,
            pings,
            thread,
        })
    }

    /// The rank this worker serves.
    pub fn rank(&self) -> GlobalRank {
        self.rank
    }

    /// The step gate: call [`StepGate::step_completed`] after every training step.
    pub fn gate(&self) -> Arc<StepGate> {
        self.gate.clone()
    }

    /// Where the proxy placed this rank, once registered.
    pub fn registration(&self) -> Option<WorkerRegistration> {
        self.status.0.lock().registration.clone()
    }

    /// Blocks until registered with the proxy, refused, or `timeout`.
    pub fn wait_registered(&self, timeout: Duration) -> Result<WorkerRegistration, NetError> {
        let deadline = Instant::now() + timeout;
        let (m, cv) = &*self.status;
        let mut s = m.lock();
        loop {
            if let Some(r) = &s.registration {
                return Ok(r.clone());
            }
            if let Some(reason) = &s.refused {
                return Err(NetError::Refused {
                    server: "the proxy".into(),
                    reason: reason.clone(),
                });
            }
            if s.stopped {
                return Err(NetError::Stopped);
            }
            if cv.wait_until(&mut s, deadline).timed_out() {
                return Err(NetError::Timeout(
                    timeout,
                    "the registration with the proxy",
                ));
            }
        }
    }

    /// Resolves once registered with the proxy, or refused; for async callers (any runtime).
    pub async fn registered(&self) -> Result<WorkerRegistration, NetError> {
        let (reg, state) = self.watch();
        registered(reg, state, "the proxy").await
    }

    /// The registration and the connection's state as watch channels, to wait on from any
    /// runtime without holding the worker. The registration is published on the worker's
    /// actix thread before any directive of the proxy is handed to the worker.
    pub fn watch(
        &self,
    ) -> (
        watch::Receiver<Option<WorkerRegistration>>,
        watch::Receiver<ClientState>,
    ) {
        self.watches.clone()
    }

    /// The refusal, if the proxy refused this worker for good.
    pub fn refused(&self) -> Option<String> {
        self.status.0.lock().refused.clone()
    }

    /// Measures one round trip through the transport: to the proxy, or through it to the
    /// manager and back.
    pub fn ping(&self, to_manager: bool, timeout: Duration) -> Result<Duration, NetError> {
        let (tx, rx) = oneshot::channel();
        self.pings
            .send((to_manager, timeout, tx))
            .map_err(|_| NetError::Stopped)?;
        rx.blocking_recv().map_err(|_| NetError::Stopped)?
    }

    /// Stops the worker: the gate opens for good (a training loop held in it returns), the
    /// proxy is told the rank is leaving (`reason`), and the threads end.
    pub fn stop_with(mut self, reason: &str) {
        self.shutdown(reason);
    }

    /// [`RemoteWorker::stop_with`] "the training process stopped its worker".
    pub fn stop(self) {
        self.stop_with("the training process stopped its worker");
    }

    fn shutdown(&mut self, reason: &str) {
        self.gate.shutdown();
        self.thread.request_stop(reason.to_owned());
        self.thread.stop();
    }
}

/// The first registration `reg` shows, or why there will be none: `server`'s refusal, or the
/// end of the connection (`state`).
async fn registered(
    mut reg: watch::Receiver<Option<WorkerRegistration>>,
    mut state: watch::Receiver<ClientState>,
    server: &str,
) -> Result<WorkerRegistration, NetError> {
    loop {
        if let Some(r) = reg.borrow_and_update().clone() {
            return Ok(r);
        }
        match &*state.borrow_and_update() {
            ClientState::Refused(reason) => {
                return Err(NetError::Refused {
                    server: server.to_owned(),
                    reason: reason.clone(),
                })
            }
            ClientState::Stopped => return Err(NetError::Stopped),
            _ => {}
        }
        tokio::select! {
            r = reg.changed() => if r.is_err() { return Err(NetError::Stopped) },
            r = state.changed() => if r.is_err() { return Err(NetError::Stopped) },
        }
    }
}

/// Copies the registration and a refusal into `status` as they change, waking its waiters.
fn mirror_status(
    mut reg: watch::Receiver<Option<WorkerRegistration>>,
    mut conn: watch::Receiver<ClientState>,
    status: &Arc<(Mutex<Status>, Condvar)>,
) -> impl std::future::Future<Output = ()> + 'static {
    let status = status.clone();
    async move {
        loop {
            {
                let (m, cv) = &*status;
                let mut s = m.lock();
                if let Some(r) = reg.borrow_and_update().clone() {
                    s.registration = Some(r);
                }
                if let ClientState::Refused(r) = &*conn.borrow_and_update() {
                    s.refused = Some(r.clone());
                }
                cv.notify_all();
            }
            tokio::select! {
                r = reg.changed() => if r.is_err() { break },
                r = conn.changed() => if r.is_err() { break },
            }
        }
    }
}

/// Answers pings, one at a time, until the worker is stopped; returns the reason to give the
/// proxy.
async fn answer_pings(
    node: &WorkerNode,
    mut pings: mpsc::UnboundedReceiver<PingRequest>,
    mut stop: oneshot::Receiver<String>,
) -> String {
    let dropped = || "the worker's handle was dropped".to_owned();
    loop {
        tokio::select! {
            ping = pings.recv() => match ping {
                Some((to_manager, timeout, reply)) => {
                    let _ = reply.send(node.ping(to_manager, timeout).await);
                }
                None => return dropped(),
            },
            why = &mut stop => return why.unwrap_or_else(|_| dropped()),
        }
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        self.shutdown("the worker's handle was dropped");
    }
}
