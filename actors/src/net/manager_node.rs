//! The manager's process side of the transport: the [`Manager`] actor and the port its
//! proxies connect to. Nothing else is served there: operators use the control port
//! ([`crate::control::serve`] in front of [`ManagerNode::manager`]).

use super::limits::ConnLimits;
use super::outbox::{self, Outbox};
use super::server::{self, Admitted, Host, NetService, QueueDepth, Refusal, Registry};
use super::session::Delivery;
use super::tls::TlsPem;
use super::{pb, wire, NetConfig, NetError};
use crate::manager::{Manager, ProxyConnected, ProxyDisconnected};
use crate::transport::hand_over;
use crate::unix_ms;
use actix::prelude::*;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use taskd_core::protocol::{Directive, ProxyToManager};
use taskd_core::{GlobalRank, JobId, NodeName, PhaseDeadlines, RankTable};
use tokio::sync::oneshot;

/// What a manager process runs.
#[derive(Clone, Debug)]
pub struct ManagerNodeConfig {
    /// The job; proxies of another job are refused at registration.
    pub job: JobId,
    /// The job's rank table: which node's proxy answers for which ranks.
    pub table: RankTable,
    /// Deadlines of every operation's phases.
    pub deadlines: PhaseDeadlines,
    /// Where proxies connect (port 0: any free port; see [`ManagerNode::local_addr`]).
    pub listen: SocketAddr,
    /// Mutual TLS for the proxy port; `None` serves plain HTTP/2 (a trusted network only).
    pub tls: Option<TlsPem>,
    /// Heartbeats, queue bounds and timeouts; told to every proxy at registration.
    pub net: NetConfig,
}

/// A running manager: the actor and its server. Lives on an actix system.
pub struct ManagerNode {
    manager: Addr<Manager>,
    local_addr: SocketAddr,
    registry: Arc<Registry>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

pub(crate) fn encode_directive(d: Directive) -> pb::down::Body {
    pb::down::Body::Directive(wire::directive_to_pb(d))
}

impl ManagerNode {
    /// Starts the manager actor and listens. Call it from inside an actix system.
    pub async fn spawn(cfg: ManagerNodeConfig) -> Result<ManagerNode, NetError> {
        let manager = Manager::new(cfg.job.clone(), cfg.table.clone(), cfg.deadlines).start();
        Self::spawn_with(cfg, manager).await
    }

    /// Serves an already started manager actor.
    pub async fn spawn_with(
        cfg: ManagerNodeConfig,
        manager: Addr<Manager>,
    ) -> Result<ManagerNode, NetError> {
        let (incoming, local_addr) = server::bind(cfg.listen).await?;
        let ranks_of = cfg
            .table
            .nodes()
            .iter()
            .map(|n| (n.clone(), cfg.table.ranks_of(n)))
            .collect();
        let host = ManagerHost {
            manager: manager.clone(),
            job: cfg.job.clone(),
            table: cfg.table.clone(),
            ranks_of,
            epoch: Epoch::new(unix_ms()),
            link_probe_ms: cfg
                .net
                .link_probe
                .map_or(0, |d| d.as_millis().max(1) as u64),
        };
        let limits = ConnLimits::transport("manager", cfg.table.nodes().len());
        let net = NetService::new(host, cfg.net.clone(), limits);
        let registry = net.registry();
        let (tx, server) = net.serve(incoming, cfg.tls.as_ref(), "manager's")?;
        tracing::info!(%local_addr, job = %cfg.job, "manager listening");
        Ok(ManagerNode {
            manager,
            local_addr,
            registry,
            shutdown: Some(tx),
            server: Some(server),
        })
    }

    /// The address proxies connect to (with the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The manager actor, for messages the transport does not carry (submit, status,
    /// progress), e.g. from the control API in the same process.
    pub fn manager(&self) -> &Addr<Manager> {
        &self.manager
    }

    /// Messages queued for a node's proxy and not yet acknowledged.
    pub fn queue_depth(&self, node: &NodeName) -> Option<QueueDepth> {
        self.registry.queue_depth(&node.0)
    }

    /// Nodes whose proxy is connected now.
    pub fn connected_nodes(&self) -> Vec<String> {
        self.registry.connected()
    }

    /// The registered proxies (queue depths, connections), shareable with other threads.
    pub fn peers(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Stops listening and ends every connection.
    pub async fn shutdown(mut self) {
        self.registry.shutdown();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), s).await;
        }
    }
}

/// The manager as the host of its proxies' connections.
struct ManagerHost {
    manager: Addr<Manager>,
    job: JobId,
    table: RankTable,
    ranks_of: BTreeMap<NodeName, Vec<GlobalRank>>,
    epoch: Epoch,
    /// Told to every proxy (0: do not probe links).
    link_probe_ms: u64,
}

/// The job's clock origin (Unix ms) this manager hands its proxies: its own start, unless the
/// first proxy to register carries the origin an earlier manager gave it. After a restart of
/// the manager the proxies that kept running register first, so the job keeps one origin and
/// a proxy restarted later gets the same one as the others.
struct Epoch {
    /// The origin, and whether any proxy was told it (then it never changes).
    state: parking_lot::Mutex<(u64, bool)>,
}

impl Epoch {
    fn new(own: u64) -> Self {
        Epoch {
            state: parking_lot::Mutex::new((own, false)),
        }
    }

    /// The origin to tell a proxy that carries `offered` (0: none).
    fn hand_out(&self, offered: u64) -> u64 {
        let mut s = self.state.lock();
        if !s.1 && offered > 0 && offered != s.0 {
            tracing::info!(
                origin_unix_ms = offered,
                "the job's clock origin is the one its proxies kept from an earlier manager"
            );
            s.0 = offered;
        }
        s.1 = true;
        s.0
    }
}

fn list<T: std::fmt::Display>(v: impl IntoIterator<Item = T>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl ManagerHost {
    /// The node a registering proxy is: the one it names, or the one its node rank is; both
    /// must agree with the rank table when both are given.
    fn node_of(&self, reg: &pb::Register) -> Result<NodeName, Refusal> {
        let nodes = self.table.nodes();
        let by_rank = reg.node_rank.map(|k| {
            nodes.get(k as usize).cloned().ok_or_else(|| {
                Refusal::invalid(format!(
                    "node rank {k} is out of range: job {} has {} nodes (0..{})",
                    self.job,
                    nodes.len(),
                    nodes.len()
                ))
            })
        });
        if reg.node.is_empty() {
            return by_rank.unwrap_or_else(|| {
                Err(Refusal::invalid(
                    "the proxy named neither its node nor its node rank",
                ))
            });
        }
        let named = NodeName(reg.node.clone());
        if !self.table.has_node(&named) {
            return Err(Refusal::invalid(format!(
                "node {:?} is not in the rank table of job {} (nodes: {})",
                named.0,
                self.job,
                list(nodes.iter().take(16).map(|n| &n.0))
            )));
        }
        if let Some(Ok(n)) = &by_rank {
            if *n != named {
                return Err(Refusal::invalid(format!(
                    "the proxy says it is node {:?} with node rank {}, but node rank {} is {:?} in the rank table",
                    named.0,
                    reg.node_rank.unwrap_or_default(),
                    reg.node_rank.unwrap_or_default(),
                    n.0
                )));
            }
        }
        Ok(named)
    }

    /// What an admitted proxy of `node` is told: its job, its slots, the job's shape, the
    /// common clock origin (`epoch_unix_ms`, see [`Epoch`]) and how often to probe its links.
    fn ack(&self, node: &NodeName, epoch_unix_ms: u64) -> pb::RegisterAck {
        pb::RegisterAck {
            job: self.job.0.clone(),
            node: node.0.clone(),
            slots: self
                .table
                .devices_of(node)
                .map(|(d, r)| pb::Slot {
                    device: d.0,
                    rank: r.0,
                })
                .collect(),
            world_size: self.table.world_size() as u32,
            node_count: self.table.nodes().len() as u32,
            job_epoch_unix_ms: epoch_unix_ms,
            link_probe_ms: self.link_probe_ms,
            ..Default::default()
        }
    }
}

impl Host for ManagerHost {
    fn role(&self) -> pb::Role {
        pb::Role::Proxy
    }

    fn admit(&self, reg: &pb::Register) -> Result<Admitted, Refusal> {
        if reg.job != self.job.0 {
            return Err(Refusal::invalid(format!(
                "this manager runs job {:?}, not {:?}: check MINDX_TASK_ID / --job-id of the proxy",
                self.job.0, reg.job
            )));
        }
        let node = self.node_of(reg)?;
        let expected = &self.ranks_of[&node];
        if !reg.ranks.is_empty() {
            let mut claimed: Vec<u32> = reg.ranks.clone();
            claimed.sort_unstable();
            let want: Vec<u32> = expected.iter().map(|r| r.0).collect();
            if claimed != want {
                return Err(Refusal::invalid(format!(
                    "the proxy of {} claims ranks [{}] but the manager's rank table gives it [{}]: the two rank tables differ",
                    node,
                    list(&claimed),
                    list(&want)
                )));
            }
        }
        let ack = self.ack(&node, self.epoch.hand_out(reg.job_epoch_unix_ms));
        Ok(Admitted { key: node.0, ack })
    }

    fn connected(&self, key: &str, outbox: Arc<Outbox<pb::down::Body>>) {
        self.manager.do_send(ProxyConnected {
            node: NodeName(key.to_owned()),
            link: outbox::link(outbox, encode_directive),
        });
    }

    fn deliver(&self, key: &str, body: pb::up::Body) -> Delivery {
        let manager = self.manager.clone();
        let node = NodeName(key.to_owned());
        let msg = match body {
            pb::up::Body::Proxy(m) => wire::proxy_msg_from_pb(m).map_err(|e| e.to_string()),
            other => Err(format!("a proxy sent an unexpected frame: {other:?}")),
        };
        let msg = msg.and_then(|m| {
            let from_node = match &m {
                ProxyToManager::WorkerUp(h) => h.node == node,
                ProxyToManager::Reply(r) => r.node == node,
                ProxyToManager::WorkerLost { rank, .. } => self.ranks_of[&node].contains(rank),
                ProxyToManager::Links(l) => l.node == node,
                ProxyToManager::Stall(n) => self.ranks_of[&node].contains(&n.rank),
            };
            if from_node {
                Ok(m)
            } else {
                Err(format!(
                    "the proxy of {node} sent a message about another node: {m:?}"
                ))
            }
        });
        Box::pin(async move {
            match msg {
                Ok(m) => hand_over(manager, m).await.map_err(str::to_owned),
                Err(e) => {
                    tracing::error!(%node, error = %e, "message from a proxy dropped");
                    Ok(())
                }
            }
        })
    }

    fn unsequenced(&self, _key: &str, body: pb::up::Body) -> Option<pb::down::Body> {
        match body {
            pb::up::Body::Ping(p) => Some(pb::down::Body::Pong(pb::Pong {
                id: p.id,
                origin_rank: p.origin_rank,
            })),
            _ => None,
        }
    }

    fn lost(&self, key: &str, reason: String, _goodbye: bool) {
        // A proxy that said goodbye stopped, not its workers: its ranks are unreachable
        // either way.
        self.manager.do_send(ProxyDisconnected {
            node: NodeName(key.to_owned()),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Epoch;

    #[test]
    fn the_first_proxy_decides_the_origin_and_it_never_changes_after() {
        let kept = Epoch::new(2_000);
        assert_eq!(kept.hand_out(1_000), 1_000, "a proxy of an earlier manager");
        assert_eq!(
            kept.hand_out(0),
            1_000,
            "a proxy started since gets the same"
        );
        assert_eq!(kept.hand_out(1_500), 1_000, "told once: fixed");

        let own = Epoch::new(2_000);
        assert_eq!(own.hand_out(0), 2_000, "a fresh job: the manager's start");
        assert_eq!(own.hand_out(1_000), 2_000, "too late to adopt another");
    }
}
