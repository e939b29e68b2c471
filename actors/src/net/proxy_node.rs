//! A node's proxy process side of the transport: connected to the manager as a client, and the
//! server its node's workers connect to. The [`Proxy`] actor is created once the manager has
//! admitted the node (the manager's rank table names the node and its ranks); until then
//! workers are asked to retry.

use super::client::{Client, ClientHost, ClientState};
use super::manager_node::encode_directive;
use super::outbox::{self, Outbox, Sticky};
use super::server::{self, Admitted, Host, NetService, QueueDepth, Refusal, Registry};
use super::session::Delivery;
use super::tls::TlsPem;
use super::{pb, wire, NetConfig, NetError};
use crate::proxy::{LauncherOrders, Proxy, WorkerConnected, WorkerDisconnected, WorkerExited};
use crate::transport::{actor_link, hand_over, Link};
use actix::prelude::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use taskd_core::protocol::{Directive, Gone, ProxyToManager, WorkerToProxy};
use taskd_core::{DeviceId, GlobalRank, JobId, NodeHal, NodeName};
use tokio::sync::{oneshot, watch};

/// What a proxy process runs.
pub struct ProxyNodeConfig {
    /// The job; the manager refuses a proxy of another job.
    pub job: JobId,
    /// The manager, `HOST:PORT`.
    pub manager: String,
    /// The node's name; `None`: the manager names it from `node_rank`.
    pub node: Option<NodeName>,
    /// The node's index in the rank table (MindCluster's node rank), when the proxy knows it
    /// rather than its name; with both, the manager checks they agree.
    pub node_rank: Option<u32>,
    /// The node's ranks when known (a rank table file): the manager checks they agree.
    pub ranks: Vec<GlobalRank>,
    /// Where the node's workers connect.
    pub listen: SocketAddr,
    /// Makes the node's HAL once the manager has said which node this is.
    pub node_hal: NodeHalFactory,
    /// Mutual TLS, both towards the manager and for the workers' port; `None`: plain
    /// HTTP/2 (a trusted network only).
    pub tls: Option<TlsPem>,
    /// The transport's knobs for both sides: the workers' server, and the connection to the
    /// manager (whose heartbeat settings the manager dictates, see [`NetConfig`]).
    pub net: NetConfig,
    /// Where the node's launcher (taskd's agent) takes the manager's orders, when it does
    /// ([`crate::proxy::LauncherOrder`]).
    pub launcher: Option<LauncherOrders>,
}

impl ProxyNodeConfig {
    /// The proxy of a node of `job` connecting to `manager` (`HOST:PORT`), whose HAL
    /// `node_hal` makes once admitted; the rest as `taskd proxy` defaults it: the node found
    /// by the manager (set `node` or `node_rank`), its workers' port on loopback
    /// ([`DEFAULT_PROXY_PORT`](super::DEFAULT_PROXY_PORT)), plain HTTP/2, the default
    /// [`NetConfig`].
    pub fn new(
        job: JobId,
        manager: impl Into<String>,
        node_hal: impl FnOnce(&NodeAssignment) -> Box<dyn NodeHal> + Send + 'static,
    ) -> Self {
        ProxyNodeConfig {
            job,
            manager: manager.into(),
            node: None,
            node_rank: None,
            ranks: Vec::new(),
            listen: SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, super::DEFAULT_PROXY_PORT)),
            node_hal: Box::new(node_hal),
            tls: None,
            net: NetConfig::default(),
            launcher: None,
        }
    }
}

/// Builds a proxy's node HAL from what the manager told it about the node.
pub type NodeHalFactory = Box<dyn FnOnce(&NodeAssignment) -> Box<dyn NodeHal> + Send>;

/// What the manager told the proxy about its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAssignment {
    /// Which node this proxy is (named or found by node rank).
    pub node: NodeName,
    /// The node's ranks and the physical die each runs on: the workers that may register
    /// here, and the devices the node HAL probes.
    pub ranks: BTreeMap<GlobalRank, DeviceId>,
    /// Ranks in the whole job.
    pub world_size: u32,
    /// Nodes in the whole job.
    pub node_count: u32,
    /// When the manager started (milliseconds since the Unix epoch): one instant every
    /// process of the job shares, e.g. to align simulated training steps across nodes.
    pub job_epoch_unix_ms: u64,
}

struct Ready {
    proxy: Addr<Proxy>,
    assignment: NodeAssignment,
}

/// State shared by the proxy's two sides.
struct Shared {
    job: JobId,
    ready: OnceLock<Ready>,
    upstream: OnceLock<Arc<Client>>,
    workers: OnceLock<Arc<Registry>>,
}

/// A running proxy. Lives on an actix system.
pub struct ProxyNode {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    upstream: Arc<Client>,
    registry: Arc<Registry>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    client: Option<tokio::task::JoinHandle<()>>,
}

fn encode_proxy_msg(m: ProxyToManager) -> pb::up::Body {
    pb::up::Body::Proxy(wire::proxy_msg_to_pb(m))
}

/// Sticky keys of link reports: one per device, above every rank's.
const LINK_KEYS: u64 = 1 << 32;

/// "worker up" must reach a manager that forgot this node; "worker lost" voids it. A new
/// manager also needs the latest links of every device (the proxy reports changes only).
fn sticky_proxy(b: &pb::up::Body) -> Sticky {
    use pb::proxy_message::Kind;
    match b {
        pb::up::Body::Proxy(pb::ProxyMessage {
            kind: Some(Kind::WorkerUp(h)),
        }) => Sticky::Keep(u64::from(h.rank)),
        pb::up::Body::Proxy(pb::ProxyMessage {
            kind: Some(Kind::Links(l)),
        }) => Sticky::Keep(LINK_KEYS | u64::from(l.device)),
        pb::up::Body::Proxy(pb::ProxyMessage {
            kind: Some(Kind::WorkerLost(l)),
        }) => Sticky::Drop(u64::from(l.rank)),
        _ => Sticky::No,
    }
}

impl ProxyNode {
    /// Listens for workers and starts connecting to the manager; returns at once. Call it
    /// from inside an actix system.
    pub async fn spawn(cfg: ProxyNodeConfig) -> Result<ProxyNode, NetError> {
        let (incoming, local_addr) = server::bind(cfg.listen).await?;
        let shared = Arc::new(Shared {
            job: cfg.job.clone(),
            ready: OnceLock::new(),
            upstream: OnceLock::new(),
            workers: OnceLock::new(),
        });
        let outbox = Outbox::new(cfg.net.queue_capacity, Some(sticky_proxy));
        let upstream = Client::new(cfg.manager.clone(), outbox.clone());
        let _ = shared.upstream.set(upstream.clone());
        // A node's workers, when known; a node of 256 otherwise (more NPUs than a node has).
        let peers = if cfg.ranks.is_empty() {
            256
        } else {
            cfg.ranks.len()
        };
        let net = NetService::new(
            ProxyHost {
                shared: shared.clone(),
            },
            cfg.net.clone(),
            super::limits::ConnLimits::transport("proxy", peers),
        );
        let registry = net.registry();
        let _ = shared.workers.set(registry.clone());
        let (tx, server) = net.serve(incoming, cfg.tls.as_ref(), "proxy's")?;
        let host = Arc::new(Upstream {
            shared: shared.clone(),
            node: cfg.node,
            node_rank: cfg.node_rank,
            ranks: cfg.ranks,
            node_hal: Mutex::new(Some(cfg.node_hal)),
            launcher: Mutex::new(cfg.launcher),
            outbox,
        });
        let tls = cfg.tls.as_ref().map(|t| t.client_config(&cfg.manager));
        // Local: the proxy actor is started from the client's task.
        let client = actix_rt::spawn(upstream.clone().run(tls, cfg.net, host));
        tracing::info!(%local_addr, manager = %cfg.manager, "proxy listening");
        Ok(ProxyNode {
            local_addr,
            shared,
            upstream,
            registry,
            shutdown: Some(tx),
            server: Some(server),
            client: Some(client),
        })
    }

    /// Where the node's launcher reports a worker's process that ended (see
    /// [`WorkerExited`]), once the manager admitted the node.
    pub fn exits(&self) -> Option<Recipient<WorkerExited>> {
        self.shared.ready.get().map(|r| r.proxy.clone().recipient())
    }

    /// The address workers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection to the manager.
    pub fn upstream_state(&self) -> watch::Receiver<ClientState> {
        self.upstream.state()
    }

    /// Waits until the manager admitted the node (or refused it).
    pub async fn assigned(&self) -> Result<NodeAssignment, NetError> {
        let mut state = self.upstream.state();
        loop {
            if let Some(r) = self.shared.ready.get() {
                return Ok(r.assignment.clone());
            }
            match &*state.borrow_and_update() {
                ClientState::Refused(reason) => {
                    return Err(NetError::Refused {
                        server: self.upstream.server().to_owned(),
                        reason: reason.clone(),
                    })
                }
                ClientState::Stopped => return Err(NetError::Stopped),
                _ => {}
            }
            if state.changed().await.is_err() {
                return Err(NetError::Stopped);
            }
        }
    }

    /// Connects a worker that lives in this process to the proxy, as a worker's connection
    /// would: directives for `rank` go to `to_worker`, and what the worker sends (its hello,
    /// its replies) goes through the returned link. For ranks simulated beside their proxy (the
    /// scale benchmark); a training process connects over the network instead. Refused until
    /// the manager admitted the node ([`ProxyNode::assigned`]), and for a rank of another node.
    pub fn attach_local(
        &self,
        rank: GlobalRank,
        to_worker: Link<Directive>,
    ) -> Result<Link<WorkerToProxy>, NetError> {
        let refused = |reason: String| NetError::Refused {
            server: format!("the proxy at {}", self.local_addr),
            reason,
        };
        let ready = self
            .shared
            .ready
            .get()
            .ok_or_else(|| refused("the manager has not admitted this node yet".into()))?;
        if !ready.assignment.ranks.contains_key(&rank) {
            return Err(refused(format!(
                "rank {rank} does not run on node {}",
                ready.assignment.node
            )));
        }
        ready.proxy.do_send(WorkerConnected {
            rank,
            link: to_worker,
        });
        Ok(actor_link(&ready.proxy))
    }

    /// The registered workers (queue depths, connections), shareable with other threads.
    pub fn peers(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Messages queued for a worker and not yet acknowledged.
    pub fn queue_depth(&self, rank: GlobalRank) -> Option<QueueDepth> {
        self.registry.queue_depth(&rank.0.to_string())
    }

    /// Says goodbye to the manager (its ranks are lost at once, not after the loss time) and
    /// stops.
    pub async fn shutdown(mut self, reason: &str) {
        self.upstream
            .goodbye(reason.to_owned(), Duration::from_secs(1))
            .await;
        self.registry.shutdown();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(c) = self.client.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), c).await;
        }
        if let Some(s) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), s).await;
        }
        if let Some(r) = self.shared.ready.get() {
            r.proxy.do_send(StopProxy);
        }
    }
}

/// Stops the proxy actor.
#[derive(Message)]
#[rtype(result = "()")]
struct StopProxy;

impl Handler<StopProxy> for Proxy {
    type Result = ();
    fn handle(&mut self, _: StopProxy, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// The proxy as a client of the manager.
struct Upstream {
    shared: Arc<Shared>,
    node: Option<NodeName>,
    node_rank: Option<u32>,
    ranks: Vec<GlobalRank>,
    node_hal: Mutex<Option<NodeHalFactory>>,
    launcher: Mutex<Option<LauncherOrders>>,
    outbox: Arc<Outbox<pb::up::Body>>,
}

impl ClientHost for Upstream {
    fn register(&self) -> pb::Register {
        pb::Register {
            role: pb::Role::Proxy as i32,
            job: self.shared.job.0.clone(),
            node: self.node.as_ref().map(|n| n.0.clone()).unwrap_or_default(),
            node_rank: self.node_rank,
            ranks: self.ranks.iter().map(|r| r.0).collect(),
            job_epoch_unix_ms: self
                .shared
                .ready
                .get()
                .map_or(0, |r| r.assignment.job_epoch_unix_ms),
            ..Default::default()
        }
    }

    fn placed(&self, ack: &pb::RegisterAck, _fresh: bool) {
        if self.shared.ready.get().is_some() {
            return;
        }
        let Some(make_hal) = self.node_hal.lock().take() else {
            return;
        };
        let node = NodeName(ack.node.clone());
        let assignment = NodeAssignment {
            node: node.clone(),
            ranks: ack
                .slots
                .iter()
                .map(|s| (GlobalRank(s.rank), DeviceId(s.device)))
                .collect(),
            world_size: ack.world_size,
            node_count: ack.node_count,
            job_epoch_unix_ms: ack.job_epoch_unix_ms,
        };
        let hal = make_hal(&assignment);
        let mut proxy = Proxy::new(
            self.shared.job.clone(),
            node.clone(),
            hal,
            outbox::link(self.outbox.clone(), encode_proxy_msg),
        );
        if ack.link_probe_ms > 0 {
            let every = Duration::from_millis(ack.link_probe_ms);
            let devices = assignment.ranks.values().copied().collect();
            proxy = proxy.probe_links(every, ack.job_epoch_unix_ms, devices);
        }
        if let Some(orders) = self.launcher.lock().take() {
            proxy = proxy.with_launcher(orders);
        }
        let proxy = proxy.start();
        tracing::info!(%node, ranks = assignment.ranks.len(), "proxy admitted by the manager");
        let _ = self.shared.ready.set(Ready { proxy, assignment });
    }

    fn deliver(&self, body: pb::down::Body) -> Delivery {
        let proxy = self.shared.ready.get().map(|r| r.proxy.clone());
        Box::pin(async move {
            let d = match body {
                pb::down::Body::Directive(d) => {
                    wire::directive_from_pb(d).map_err(|e| e.to_string())?
                }
                other => return Err(format!("the manager sent an unexpected frame: {other:?}")),
            };
            let proxy = proxy.ok_or("a directive before the node was admitted")?;
            hand_over(proxy, d).await.map_err(str::to_owned)
        })
    }

    fn unsequenced(&self, body: pb::down::Body) {
        if let pb::down::Body::Pong(p) = body {
            if let Some(w) = self.shared.workers.get() {
                w.send_unsequenced(&p.origin_rank.to_string(), pb::down::Body::Pong(p));
            }
        }
    }
}

/// The proxy as the host of its workers' connections.
struct ProxyHost {
    shared: Arc<Shared>,
}

impl ProxyHost {
    fn rank_of(key: &str) -> GlobalRank {
        GlobalRank(key.parse().expect("worker keys are rank numbers"))
    }
}

impl Host for ProxyHost {
    fn role(&self) -> pb::Role {
        pb::Role::Worker
    }

    fn admit(&self, reg: &pb::Register) -> Result<Admitted, Refusal> {
        if reg.job != self.shared.job.0 {
            return Err(Refusal::invalid(format!(
                "this proxy serves job {:?}, not {:?}: check MINDX_TASK_ID / --job-id of the worker",
                self.shared.job.0, reg.job
            )));
        }
        let Some(ready) = self.shared.ready.get() else {
            return Err(Refusal::unavailable(
                "this proxy is not admitted by the manager yet; retry",
            ));
        };
        let a = &ready.assignment;
        let [rank] = reg.ranks[..] else {
            return Err(Refusal::invalid(format!(
                "a worker registers exactly one rank, not {:?}",
                reg.ranks
            )));
        };
        let rank = GlobalRank(rank);
        let Some(device) = a.ranks.get(&rank) else {
            let ranks: Vec<String> = a.ranks.keys().map(|r| r.0.to_string()).collect();
            return Err(Refusal::invalid(format!(
                "rank {rank} does not run on node {} (its ranks: {}): connect to the proxy of its own node",
                a.node,
                ranks.join(", ")
            )));
        };
        if !reg.node.is_empty() && reg.node != a.node.0 {
            return Err(Refusal::invalid(format!(
                "the worker expects node {:?} but this proxy is node {:?}",
                reg.node, a.node.0
            )));
        }
        Ok(Admitted {
            key: rank.0.to_string(),
            ack: pb::RegisterAck {
                job: self.shared.job.0.clone(),
                node: a.node.0.clone(),
                slots: vec![pb::Slot {
                    device: device.0,
                    rank: rank.0,
                }],
                world_size: a.world_size,
                node_count: a.node_count,
                job_epoch_unix_ms: a.job_epoch_unix_ms,
                ..Default::default()
            },
        })
    }

    fn connected(&self, key: &str, outbox: Arc<Outbox<pb::down::Body>>) {
        if let Some(r) = self.shared.ready.get() {
            r.proxy.do_send(WorkerConnected {
                rank: Self::rank_of(key),
                link: outbox::link(outbox, encode_directive),
            });
        }
    }

    fn deliver(&self, key: &str, body: pb::up::Body) -> Delivery {
        let proxy = self.shared.ready.get().map(|r| r.proxy.clone());
        let rank = Self::rank_of(key);
        let msg = match body {
            pb::up::Body::Worker(m) => wire::worker_msg_from_pb(m).map_err(|e| e.to_string()),
            other => Err(format!("a worker sent an unexpected frame: {other:?}")),
        };
        Box::pin(async move {
            let m = msg?;
            let claimed = match &m {
                WorkerToProxy::Hello(h) => h.rank,
                WorkerToProxy::Reply(r) => r.rank,
                WorkerToProxy::Stall(n) => n.rank,
            };
            if claimed != rank {
                tracing::error!(
                    rank = rank.0,
                    claimed = claimed.0,
                    "a worker spoke for another rank; dropped"
                );
                return Ok(());
            }
            let proxy = proxy.ok_or("the proxy is not running")?;
            hand_over(proxy, m).await.map_err(str::to_owned)
        })
    }

    fn unsequenced(&self, key: &str, body: pb::up::Body) -> Option<pb::down::Body> {
        let pb::up::Body::Ping(p) = body else {
            return None;
        };
        let rank = Self::rank_of(key).0;
        if !p.to_manager {
            return Some(pb::down::Body::Pong(pb::Pong {
                id: p.id,
                origin_rank: rank,
            }));
        }
        if let Some(up) = self.shared.upstream.get() {
            up.send_unsequenced(pb::up::Body::Ping(pb::Ping {
                id: p.id,
                origin_rank: rank,
                to_manager: true,
            }));
        }
        None
    }

    fn lost(&self, key: &str, reason: String, goodbye: bool) {
        if let Some(r) = self.shared.ready.get() {
            r.proxy.do_send(WorkerDisconnected {
                rank: Self::rank_of(key),
                reason,
                // A worker says goodbye when its process stops it (the training script's
                // end); an exit with an error is its launcher's to report.
                how: if goodbye { Gone::Ended } else { Gone::Died },
            });
        }
    }
}
