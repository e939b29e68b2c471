//! The proxy: one per node. It relays each directive to the node's workers and fans their
//! replies in, so the manager handles one reply per node instead of one per rank. During the
//! sample phase it adds the link health of the node's targeted devices, read from the node HAL.
//! When the manager runs automatic failover, it also probes both links of every device of the
//! node at a fixed interval and reports each device whose links changed
//! ([`Proxy::probe_links`]).

use crate::telemetry;
use crate::transport::{Deliver, Link};
use actix::prelude::*;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd_core::auto::Links;
use taskd_core::protocol::{
    AfterStop, Directive, DirectiveKind, Gone, LinkReport, NodeReply, Phase, ProxyToManager,
    RankReply, ReplyBody, WorkerHello, WorkerToProxy,
};
use taskd_core::{
    DeviceId, GlobalRank, HalErrorKind, Instance, JobId, LinkHealth, NodeHal, NodeName,
    OperationId, SideState,
};
use tracing::Span;

/// Replies being gathered for one directive.
struct FanIn {
    op: OperationId,
    phase: Phase,
    waiting: BTreeSet<GlobalRank>,
    replies: Vec<RankReply>,
    /// `None` while the node HAL is still being read.
    health: Option<Vec<LinkHealth>>,
    /// Whether a [`PARTIAL_REPLY_AFTER`] send of the replies so far is armed.
    partial_armed: bool,
}

/// How long replies wait for the node's slowest rank before the proxy sends them anyway: the
/// manager then knows which rank the node still waits for (its status names that rank, not
/// every rank of the node). Longer than a phase takes when no rank is slow, so a healthy
/// node still sends one reply a phase.
const PARTIAL_REPLY_AFTER: Duration = Duration::from_millis(250);

/// The proxy actor of one node: its state is the node's worker links, their introductions
/// (replayed to a new manager) and the fan-in of the directive in flight. Start it with
/// [`Proxy::new`], then tell it about workers ([`WorkerConnected`]) and managers
/// ([`ManagerConnected`]) as the transport sees them.
pub struct Proxy {
    job: JobId,
    node: NodeName,
    upstream: Link<ProxyToManager>,
    workers: BTreeMap<GlobalRank, Link<Directive>>,
    /// Every connected worker's introduction, sent again to a manager that (re)connects.
    hellos: BTreeMap<GlobalRank, WorkerHello>,
    node_hal: Arc<Mutex<Box<dyn NodeHal>>>,
    fan_in: Option<FanIn>,
    /// The span of the operation being relayed (same uuid as the manager's), and of its
    /// phase, so this node's logs line up with the manager's and the workers'.
    op_span: Option<(OperationId, Span)>,
    phase_span: Span,
    probe: Option<LinkProbe>,
    /// Where the node's launcher takes the manager's orders (taskd's agent), if it does.
    launcher: Option<LauncherOrders>,
    /// The last order handed to the launcher: each is handed once.
    ordered: Option<AfterStop>,
    /// The order of the stop being relayed, until the node's workers answered it (or
    /// [`ORDER_AFTER`] passed): their answers reach the manager before the launcher kills
    /// them.
    pending_order: Option<(OperationId, AfterStop, String)>,
}

/// How long an order for the launcher waits for the node's workers to answer their stop.
const ORDER_AFTER: Duration = Duration::from_secs(2);

/// What the manager asks of a node's launcher through its proxy, once per stop of training
/// (see [`AfterStop`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LauncherOrder {
    /// Stop every worker of the node and start them all again, as restart `number` of the
    /// job: every node does so for the same stop, so the job starts again as one.
    Restart {
        /// The job's restart count once this one is done (the workers' generation).
        number: u32,
        /// Why, one line.
        reason: String,
    },
    /// Stop every worker and end the job on this node: no restart is left.
    End {
        /// Why, one line.
        reason: String,
    },
}

/// Where a proxy hands its launcher's orders (called on the proxy's thread; it must not
/// block).
pub type LauncherOrders = Arc<dyn Fn(LauncherOrder) + Send + Sync>;

/// The link probing of a proxy whose manager runs automatic failover.
struct LinkProbe {
    every: Duration,
    /// Rounds run at `origin + k * every` (Unix ms), the same instants on every node, so
    /// links that fail together are seen in the same round everywhere.
    origin_unix_ms: u64,
    devices: Vec<DeviceId>,
    /// The links last reported, per device.
    reported: BTreeMap<DeviceId, Links>,
    /// A round is running: a slow HAL never gets a second one on top.
    busy: bool,
    /// The node HAL said a link changed ([`NodeHal::watch`]) while a round ran: another
    /// round follows it.
    again: bool,
    /// The next round reads the links because the node HAL said they changed.
    kernel: bool,
}

impl Proxy {
    /// The proxy of `node` in `job`, reading link health through `node_hal` (on a blocking
    /// thread, so a slow probe never stalls the relay) and answering the manager through
    /// `upstream`. No worker is known until the transport reports one.
    pub fn new(
        job: JobId,
        node: NodeName,
        node_hal: Box<dyn NodeHal>,
        upstream: Link<ProxyToManager>,
    ) -> Self {
        Proxy {
            job,
            node,
            upstream,
            workers: BTreeMap::new(),
            hellos: BTreeMap::new(),
            node_hal: Arc::new(Mutex::new(node_hal)),
            fan_in: None,
            op_span: None,
            phase_span: Span::none(),
            probe: None,
            launcher: None,
            ordered: None,
            pending_order: None,
        }
    }

    /// Hands the manager's orders for the node's launcher ([`LauncherOrder`]) to `orders`:
    /// what taskd's agent, the node's process manager, acts on.
    pub fn with_launcher(mut self, orders: LauncherOrders) -> Self {
        self.launcher = Some(orders);
        self
    }

    /// Hands the launcher the order of stop `op` that waits, if any.
    fn release_order(&mut self, op: OperationId) {
        if let Some((_, then, reason)) = self.pending_order.take_if(|(o, _, _)| *o == op) {
            self.order_launcher(then, &reason);
        }
    }

    /// A stop of training reached the node: hands the launcher its order, once per stop
    /// (the same stop sent again to old processes of the node orders nothing new).
    fn order_launcher(&mut self, then: AfterStop, reason: &str) {
        let order = match then {
            AfterStop::Launcher => return,
            AfterStop::Restart { number } => LauncherOrder::Restart {
                number,
                reason: reason.to_owned(),
            },
            AfterStop::End => LauncherOrder::End {
                reason: reason.to_owned(),
            },
        };
        if self.ordered == Some(then) {
            return;
        }
        self.ordered = Some(then);
        match &self.launcher {
            Some(orders) => {
                tracing::warn!(node = %self.node, order = ?order, "handing the launcher the manager's order");
                orders(order);
            }
            None => {
                tracing::warn!(node = %self.node, order = ?order, "the manager ordered the node's launcher, but no launcher takes orders from this proxy: the processes end and their launcher decides")
            }
        }
    }

    /// Probes both links of each of `devices` every `every` (the first round at once, then
    /// at `origin_unix_ms + k * every`, a time every node of the job shares: the manager's
    /// start) and sends the manager a [`LinkReport`] for each device whose links changed since
    /// the last report; a probe that fails reports the device's links unknown.
    pub fn probe_links(
        mut self,
        every: Duration,
        origin_unix_ms: u64,
        devices: Vec<DeviceId>,
    ) -> Self {
        self.probe = Some(LinkProbe {
            every,
            origin_unix_ms,
            devices,
            reported: BTreeMap::new(),
            busy: false,
            again: false,
            kernel: false,
        });
        self
    }

    /// One round of link probes, on the blocking pool (the HAL may take its time).
    fn probe_round(&mut self, ctx: &mut Context<Self>) {
        let Some(p) = self.probe.as_mut().filter(|p| !p.busy) else {
            return;
        };
        p.busy = true;
        let kernel = std::mem::take(&mut p.kernel);
        let devices = p.devices.clone();
        let hal = self.node_hal.clone();
        let node = self.node.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut hal = hal.lock();
            devices
                .into_iter()
                .map(|dev| (dev, probe_device(&mut **hal, &node, dev)))
                .collect::<Vec<_>>()
        });
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(read).map(move |res, act, ctx| {
                let again = act.probe.as_mut().is_some_and(|p| {
                    p.busy = false;
                    std::mem::take(&mut p.again)
                });
                act.report_links(res.unwrap_or_default(), kernel);
                if again {
                    act.probe_round(ctx);
                }
            }),
        );
    }

    /// Arms the next round at the next multiple of the interval since the origin (re-aligned
    /// every round, so a slow round never makes the nodes drift apart).
    fn next_probe_round(&mut self, ctx: &mut Context<Self>) {
        let Some(p) = self.probe.as_ref() else {
            return;
        };
        let every = (p.every.as_millis() as u64).max(1);
        let since = crate::unix_ms().saturating_sub(p.origin_unix_ms);
        let wait = Duration::from_millis(every - since % every);
        ctx.run_later(wait, |act, ctx| {
            act.probe_round(ctx);
            act.next_probe_round(ctx);
        });
    }

    /// Sends the manager the devices of `probed` whose links changed state since the last
    /// report, with their reasons now (a reason that changes alone, a degraded link's loss, is
    /// not sent again); after the node HAL said a link changed (`kernel`), also those with a
    /// side down (the system's word now, where a probe round may have seen it first).
    fn report_links(&mut self, probed: Vec<(DeviceId, Links)>, kernel: bool) {
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        let mut changed = Vec::new();
        for (device, links) in probed {
            let down = matches!(links.primary, SideState::Down(_))
                || matches!(links.backup, SideState::Down(_));
            if p.reported
                .get(&device)
                .is_some_and(|l| l.same_states(&links))
                && !(kernel && down)
            {
                continue;
            }
            p.reported.insert(device, links.clone());
            changed.push(LinkReport {
                node: self.node.clone(),
                device,
                links,
                from_kernel: kernel,
            });
        }
        for report in changed {
            tracing::info!(node = %self.node, device = report.device.0, primary = %report.links.primary, backup = %report.links.backup, "links changed");
            telemetry::message("out", "link_report");
            self.up(ProxyToManager::Links(report));
        }
    }

    /// Enters the spans of `d`'s operation and phase (a new operation gets a new span).
    fn enter_phase(&mut self, d: &Directive) {
        if !matches!(&self.op_span, Some((op, _)) if *op == d.op) {
            let span = tracing::info_span!(
                parent: None,
                "operation",
                uuid = %d.op,
                job = %self.job,
                node = %self.node,
                role = "proxy",
                targets = tracing::field::Empty,
            );
            self.op_span = Some((d.op, span));
        }
        let op_span = &self.op_span.as_ref().expect("just set").1;
        if let DirectiveKind::Sample { targets } = &d.kind {
            op_span.record("targets", targets.len());
        }
        self.phase_span = tracing::info_span!(
            parent: op_span,
            "phase",
            uuid = %d.op,
            phase = d.phase().as_str(),
            role = "proxy",
            node = %self.node,
        );
    }

    fn up(&self, msg: ProxyToManager) {
        if let Err(e) = self.upstream.send(msg) {
            tracing::warn!(node = %self.node, error = %e, "manager unreachable");
        }
    }

    /// Sends what has been gathered: everything once complete, or early when a rank failed
    /// (the manager starts the rollback without waiting for the slowest rank).
    fn flush(&mut self, force: bool) {
        let Some(f) = self.fan_in.as_mut() else {
            return;
        };
        let complete = f.waiting.is_empty() && f.health.is_some();
        // Complete: send (even with no replies: it carries the health). Forced: send only
        // what there is.
        let send = complete || (force && !f.replies.is_empty());
        if !send {
            return;
        }
        let reply = NodeReply {
            node: self.node.clone(),
            op: f.op,
            phase: f.phase,
            replies: std::mem::take(&mut f.replies),
            health: f.health.clone().unwrap_or_default(),
        };
        if complete {
            self.fan_in = None;
        }
        self.phase_span.in_scope(|| {
            tracing::debug!(
                replies = reply.replies.len(),
                complete,
                "node reply sent to the manager"
            )
        });
        let resumed = complete && reply.phase == Phase::Resume;
        let stopped = (complete && reply.phase == Phase::Stop).then_some(reply.op);
        telemetry::message("out", "node_reply");
        self.up(ProxyToManager::Reply(reply));
        if let Some(op) = stopped {
            self.release_order(op);
        }
        if resumed {
            // The operation is over on this node: close its spans.
            self.phase_span = Span::none();
            self.op_span = None;
        }
    }

    /// Arms the send of the replies gathered so far, unless one is armed: a node waiting on a
    /// slow rank tells the manager what the others answered.
    fn arm_partial(&mut self, ctx: &mut Context<Self>) {
        let Some(f) = self.fan_in.as_mut().filter(|f| !f.partial_armed) else {
            return;
        };
        f.partial_armed = true;
        let (op, phase) = (f.op, f.phase);
        ctx.run_later(PARTIAL_REPLY_AFTER, move |act, _| {
            let Some(f) = act
                .fan_in
                .as_mut()
                .filter(|f| f.op == op && f.phase == phase)
            else {
                return;
            };
            f.partial_armed = false;
            // Only while a rank is still to answer: the last replies go with the node's link
            // health (a sample's health gates the switch), never ahead of it.
            if f.replies.is_empty() || f.waiting.is_empty() {
                return;
            }
            // The replies only: the node's link health comes with its last reply.
            let reply = NodeReply {
                node: act.node.clone(),
                op,
                phase,
                replies: std::mem::take(&mut f.replies),
                health: Vec::new(),
            };
            let waiting = f.waiting.len();
            act.phase_span.in_scope(|| {
                tracing::debug!(
                    replies = reply.replies.len(),
                    waiting,
                    "partial node reply: a rank is slow"
                )
            });
            telemetry::message("out", "node_reply");
            act.up(ProxyToManager::Reply(reply));
        });
    }

    fn lose_worker(&mut self, rank: GlobalRank, reason: String, how: Gone) {
        let instance = self
            .hellos
            .remove(&rank)
            .map_or(Instance::UNKNOWN, |h| h.instance);
        if self.workers.remove(&rank).is_none() {
            return;
        }
        self.phase_span.in_scope(
            || tracing::warn!(node = %self.node, rank = rank.0, %reason, how = how.as_str(), "worker lost"),
        );
        telemetry::message("out", "worker_lost");
        self.up(ProxyToManager::WorkerLost {
            rank,
            reason,
            how,
            instance,
            generation: 0,
        });
        if let Some(f) = self.fan_in.as_mut() {
            f.waiting.remove(&rank);
        }
        self.flush(false);
    }
}

/// Both links of `device`, or unknown when the probe fails.
fn probe_device(hal: &mut dyn NodeHal, node: &NodeName, device: DeviceId) -> Links {
    let started = Instant::now();
    let res = hal.link_health(device);
    telemetry::hal_call("link_health", res.is_ok(), started.elapsed());
    match res {
        Ok(h) => Links::from_health(&h),
        Err(e) => {
            telemetry::hal_error("link_health", &e);
            tracing::debug!(%node, device = device.0, error = %e, "link probe failed: links unknown");
            Links::unknown(&e.to_string())
        }
    }
}

impl Actor for Proxy {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.probe.is_some() {
            let addr = ctx.address();
            let watching = self
                .node_hal
                .lock()
                .watch(Box::new(move || addr.do_send(LinksChanged)));
            tracing::info!(node = %self.node, kernel_events = watching, "probing links");
            self.probe_round(ctx);
            self.next_probe_round(ctx);
        }
    }
}

/// The node HAL says a link of the node changed: read the links now.
#[derive(Message)]
#[rtype(result = "()")]
struct LinksChanged;

impl Handler<LinksChanged> for Proxy {
    type Result = ();

    fn handle(&mut self, _: LinksChanged, ctx: &mut Self::Context) {
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        p.kernel = true;
        if p.busy {
            p.again = true;
        } else {
            self.probe_round(ctx);
        }
    }
}

/// A worker's connection is up; directives for it go through `link`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerConnected {
    /// The worker's rank; a second connection for the rank replaces the first.
    pub rank: GlobalRank,
    /// Where directives for the rank go from now on.
    pub link: Link<Directive>,
}

/// A worker's connection closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerDisconnected {
    /// The rank whose worker is gone; the proxy reports it lost to the manager.
    pub rank: GlobalRank,
    /// What the transport saw, passed on as the lost rank's reason.
    pub reason: String,
    /// Whether the worker ended on purpose (it said goodbye) or died.
    pub how: Gone,
}

/// The node's launcher saw a worker's process end (with `code`): what a worker that never
/// registered, or whose goodbye hid an exit with an error, cannot say itself.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerExited {
    /// The rank whose process ended.
    pub rank: GlobalRank,
    /// Its exit status (0: a clean end), or how it ended, for people.
    pub status: String,
    /// Whether it ended cleanly.
    pub clean: bool,
    /// The job restart the launcher started it for (0: the first start).
    pub generation: u32,
}

impl Handler<WorkerExited> for Proxy {
    type Result = ();
    fn handle(&mut self, m: WorkerExited, _: &mut Self::Context) {
        let how = if m.clean { Gone::Ended } else { Gone::Died };
        let reason = format!("its process ended ({})", m.status);
        if self.workers.contains_key(&m.rank) {
            self.lose_worker(m.rank, reason, how);
            return;
        }
        tracing::warn!(node = %self.node, rank = m.rank.0, %reason, how = how.as_str(), "worker process ended");
        telemetry::message("out", "worker_lost");
        self.up(ProxyToManager::WorkerLost {
            rank: m.rank,
            reason,
            how,
            instance: Instance::UNKNOWN,
            generation: m.generation,
        });
    }
}

/// A manager (a new one, after the last one died) is reachable through `link`: every worker
/// of the node introduces itself to it again, so it can verify what they applied.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ManagerConnected {
    /// The new manager's link; the old one is dropped.
    pub link: Link<ProxyToManager>,
}

impl Handler<ManagerConnected> for Proxy {
    type Result = ();
    fn handle(&mut self, m: ManagerConnected, _: &mut Self::Context) {
        self.upstream = m.link;
        // Whatever was being gathered was for the old manager.
        self.fan_in = None;
        let held = self.hellos.len();
        tracing::info!(node = %self.node, workers = held, "manager connected: introducing the node's workers");
        for hello in self.hellos.values().cloned().collect::<Vec<_>>() {
            telemetry::message("out", "worker_up");
            self.up(ProxyToManager::WorkerUp(hello));
        }
        // The new manager knows no link yet: the next round reports every device.
        if let Some(p) = self.probe.as_mut() {
            p.reported.clear();
        }
    }
}

impl Handler<WorkerConnected> for Proxy {
    type Result = ();
    fn handle(&mut self, m: WorkerConnected, _: &mut Self::Context) {
        self.workers.insert(m.rank, m.link);
    }
}

impl Handler<WorkerDisconnected> for Proxy {
    type Result = ();
    fn handle(&mut self, m: WorkerDisconnected, _: &mut Self::Context) {
        self.lose_worker(m.rank, m.reason, m.how);
    }
}

impl Handler<Deliver<Directive>> for Proxy {
    type Result = ();

    fn handle(&mut self, Deliver(d): Deliver<Directive>, ctx: &mut Self::Context) {
        telemetry::message("in", d.phase().as_str());
        // A new directive supersedes the previous one: send what it still holds.
        self.flush(true);
        self.enter_phase(&d);
        let span = self.phase_span.clone();
        let _entered = span.enter();
        tracing::debug!(workers = self.workers.len(), "relaying the directive");
        if let DirectiveKind::StopTraining { then, reason, only } = &d.kind {
            let for_node =
                only.is_empty() || self.hellos.values().any(|h| only.contains(&h.instance));
            if for_node && *then != AfterStop::Launcher {
                // Handed once the workers answered (in `flush`), or after a bound.
                self.pending_order = Some((d.op, *then, reason.clone()));
                let op = d.op;
                ctx.run_later(ORDER_AFTER, move |act, _| act.release_order(op));
            }
        }
        // The workers the directive is for (a stop sent again names old processes).
        let addressed: BTreeSet<GlobalRank> = self
            .workers
            .keys()
            .filter(|r| {
                let instance = self.hellos.get(r).map_or(Instance::UNKNOWN, |h| h.instance);
                d.kind.is_for(instance)
            })
            .copied()
            .collect();
        let mut fan_in = FanIn {
            op: d.op,
            phase: d.phase(),
            waiting: addressed.clone(),
            replies: Vec::new(),
            health: Some(Vec::new()),
            partial_armed: false,
        };
        if let DirectiveKind::Sample { targets } = &d.kind {
            let devices: BTreeSet<_> = targets
                .iter()
                .filter(|t| t.node == self.node)
                .map(|t| t.device)
                .collect();
            if !devices.is_empty() {
                fan_in.health = None;
                let hal = self.node_hal.clone();
                let node = self.node.clone();
                let op = d.op;
                let span = span.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let _entered = span.enter();
                    let mut hal = hal.lock();
                    devices
                        .into_iter()
                        .filter_map(|dev| {
                            let started = Instant::now();
                            let res = hal.link_health(dev);
                            telemetry::hal_call("link_health", res.is_ok(), started.elapsed());
                            match res {
                                Ok(h) => Some(h),
                                Err(e) => {
                                    telemetry::hal_error("link_health", &e);
                                    // Unknown health does not block the switch: HCCL decides.
                                    // A node HAL that cannot read health at all said so when
                                    // the proxy started: not a warning at every switch.
                                    if e.kind == HalErrorKind::NotSupported {
                                        tracing::debug!(%node, device = dev.0, error = %e, "link health not monitored");
                                    } else {
                                        tracing::warn!(%node, device = dev.0, error = %e, "link health unknown");
                                    }
                                    None
                                }
                            }
                        })
                        .collect::<Vec<_>>()
                });
                ctx.spawn(
                    actix::fut::wrap_future::<_, Self>(read).map(move |res, act, _| {
                        if let Some(f) = act.fan_in.as_mut().filter(|f| f.op == op) {
                            f.health = Some(res.unwrap_or_default());
                        }
                        act.flush(false);
                    }),
                );
            }
        }
        self.fan_in = Some(fan_in);
        let mut gone = Vec::new();
        for (rank, link) in self.workers.iter().filter(|(r, _)| addressed.contains(r)) {
            telemetry::message("out", d.phase().as_str());
            if let Err(e) = link.send(d.clone()) {
                gone.push((*rank, e));
            }
        }
        for (rank, e) in gone {
            self.lose_worker(
                rank,
                format!("sending to the worker failed: {e}"),
                Gone::Died,
            );
        }
        self.flush(false);
    }
}

impl Handler<Deliver<WorkerToProxy>> for Proxy {
    type Result = ();

    fn handle(&mut self, Deliver(m): Deliver<WorkerToProxy>, ctx: &mut Self::Context) {
        match m {
            WorkerToProxy::Hello(hello) => {
                telemetry::message("in", "hello");
                if hello.job != self.job || hello.node != self.node {
                    tracing::error!(
                        node = %self.node, rank = hello.rank.0, job = %hello.job,
                        "worker of another job or node refused"
                    );
                    self.workers.remove(&hello.rank);
                    return;
                }
                telemetry::message("out", "worker_up");
                self.hellos.insert(hello.rank, hello.clone());
                self.up(ProxyToManager::WorkerUp(hello));
            }
            WorkerToProxy::Stall(n) => {
                telemetry::message("in", "stall");
                telemetry::message("out", "stall");
                self.up(ProxyToManager::Stall(n));
            }
            WorkerToProxy::Reply(r) => {
                telemetry::message("in", "reply");
                let failed = matches!(r.body, ReplyBody::Failed(_));
                if let ReplyBody::Failed(e) = &r.body {
                    self.phase_span.in_scope(|| {
                        tracing::warn!(rank = r.rank.0, phase = %r.phase, error = %e, "rank failed")
                    });
                }
                let expected = match self.fan_in.as_mut() {
                    Some(f) if f.op == r.op && f.phase == r.phase => {
                        f.waiting.remove(&r.rank).then_some(f)
                    }
                    _ => None,
                };
                match expected {
                    Some(f) => {
                        f.replies.push(r);
                        self.flush(failed);
                        self.arm_partial(ctx);
                    }
                    None => {
                        // Late (a switch finishing after the rollback was sent): pass it on.
                        telemetry::message("out", "node_reply");
                        self.up(ProxyToManager::Reply(NodeReply {
                            node: self.node.clone(),
                            op: r.op,
                            phase: r.phase,
                            replies: vec![r],
                            health: Vec::new(),
                        }));
                    }
                }
            }
        }
    }
}
