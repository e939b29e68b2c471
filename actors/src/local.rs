//! A whole job in one process: the manager, one proxy per node and one worker per rank as
//! actors on one actix system (on a thread of its own), wired with the in-process transport.
//! The simulator and most tests run this; the calls here block the caller, so a test or a
//! launcher can drive a job from plain code.

use crate::background::Background;
use crate::gate::StepGate;
use crate::hal_exec::ThreadedRankHal;
use crate::journal::{MemoryJournal, OperationJournal};
use crate::manager::HoldPolicy;
use crate::manager::{
    AwaitAutoSettled, AwaitCallsAnswered, AwaitRegistered, AwaitResult, AwaitVerification, Drain,
    GetStatus, Manager, ManagerStatus, ProxyConnected, ProxyDisconnected, Recover, Recovery,
    StopManager, Submission, Submit,
};
use crate::progress::{ProgressEvent, ProgressFeed};

mod restart;
use crate::proxy::{LauncherOrder, ManagerConnected, Proxy, WorkerConnected, WorkerDisconnected};
use crate::transport::{actor_link, Deliver, Link, Sender, TransportError};
use crate::worker::{StopWorker, Worker, WorkerConfig};
use actix::prelude::*;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::auto::{AutoConfig, DeviceKey, Links};
use taskd_core::ledger::{ProcessRecovery, RecoverTo};
use taskd_core::operation::OperationReport;
use taskd_core::protocol::{Gone, ProxyToManager, WorkerHello, WorkerToProxy};
use taskd_core::verify::VerifyReport;
use taskd_core::{
    GlobalRank, JobId, NodeHal, OperationId, PhaseDeadlines, RankHal, RankTable, SubmitError,
    SwitchCommand, TaskRankHal,
};

/// What a local job is made of.
pub struct LocalJobConfig {
    /// The job's id; commands for another job are refused.
    pub job: JobId,
    /// Nodes, devices and ranks: one proxy per node and one worker per rank are started.
    pub table: RankTable,
    /// Deadlines of every operation's phases.
    pub deadlines: PhaseDeadlines,
}

/// Where the launcher of each node takes the manager's orders in a local job: called with the
/// node's index in the rank table and the order its proxy handed (on the proxy's thread: it
/// must not block). See [`crate::proxy::LauncherOrders`].
pub type NodeLaunchers = Arc<dyn Fn(usize, LauncherOrder) + Send + Sync>;

/// What a local job runs besides switches, each off by default: automatic failover, process
/// recovery coordinated by the manager, and the launchers that follow its orders.
#[derive(Clone, Default)]
pub struct LocalJobOptions {
    /// Automatic failover: the manager runs the policy and every proxy probes its node's links.
    pub auto: Option<AutoConfig>,
    /// Process recovery coordinated by the manager (and every manager started after it): a
    /// lost process restarts the whole job ([`Manager::with_process_recovery`]).
    pub process_recovery: Option<ProcessRecovery>,
    /// Where every node's launcher takes the manager's orders ([`Proxy::with_launcher`]);
    /// without it, the proxies say that no launcher takes them.
    pub launchers: Option<NodeLaunchers>,
    /// Every worker's hang watch timeout ([`WorkerConfig::hang_timeout`]); `None`: no watch.
    pub hang_timeout: Option<Duration>,
}

/// One rank's HAL and whether its process enables `TSP:1`.
pub struct RankParts {
    /// The rank's device layer, moved onto a HAL thread of its own
    /// ([`ThreadedRankHal::for_rank`]).
    pub hal: Box<dyn RankHal>,
    /// Whether the rank's process enables `TSP:1` (`MS_ENABLE_TFT`): the HAL cannot know,
    /// and a switch is refused unless every rank does.
    pub tsp: bool,
}

/// A rank as its worker holds it: a HAL whose calls are futures (the simulated fabric's, or a
/// blocking HAL on its thread), what the simulator hands [`LocalJob::start`] for thousands
/// of ranks in one process.
pub struct RankSpec {
    /// The rank's HAL.
    pub hal: Box<dyn TaskRankHal>,
    /// Whether the rank's process enables `TSP:1`.
    pub tsp: bool,
}

/// What [`LocalJob::start`] takes for a rank: a [`RankSpec`], or [`RankParts`], whose
/// blocking HAL gets a thread of its own.
pub trait IntoRankSpec {
    /// Global rank `rank` as its worker holds it.
    ///
    /// # Errors
    /// When the HAL's thread cannot be started.
    fn into_rank_spec(self, rank: GlobalRank) -> std::io::Result<RankSpec>;
}

impl IntoRankSpec for RankSpec {
    fn into_rank_spec(self, _: GlobalRank) -> std::io::Result<RankSpec> {
        Ok(self)
    }
}

impl IntoRankSpec for RankParts {
    fn into_rank_spec(self, rank: GlobalRank) -> std::io::Result<RankSpec> {
        Ok(RankSpec {
            hal: Box::new(ThreadedRankHal::for_rank(rank, self.hal)?),
            tsp: self.tsp,
        })
    }
}

/// `ranks[r]` as global rank `r`'s worker holds it.
fn rank_specs<R: IntoRankSpec>(ranks: Vec<R>) -> Result<Vec<RankSpec>, LocalJobError> {
    ranks
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let rank = GlobalRank(i as u32);
            r.into_rank_spec(rank)
                .map_err(|source| LocalJobError::HalThread { rank, source })
        })
        .collect()
}

/// Why starting or driving a local job failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalJobError {
    /// Not one node HAL per node, or not one rank HAL per rank of the table.
    #[error("{what}: expected {expected}, got {got}")]
    Mismatch {
        /// Which list is the wrong length (`node HALs`, `rank HALs`).
        what: &'static str,
        /// What the rank table needs.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A rank's HAL thread could not be started.
    #[error("cannot start the HAL thread of rank {rank}: {source}")]
    HalThread {
        /// The rank.
        rank: GlobalRank,
        /// Why.
        source: std::io::Error,
    },
    /// The actix system's thread is gone (a panic in an actor, or the job was shut down).
    #[error("the actor system stopped unexpectedly")]
    SystemGone,
    /// The manager refused the command; nothing ran.
    #[error("the command was refused: {0}")]
    Refused(#[from] SubmitError),
    /// The manager neither runs nor remembers the operation (its history and the journal
    /// its successors learn from are bounded, and an operation cut off by a manager's death
    /// has no result).
    #[error("operation {0} is unknown to the manager")]
    UnknownOperation(OperationId),
    /// A wait gave up after the given time; the text names what was waited for.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// A wait for the automatic failover asked of a job that does not run it.
    #[error("automatic failover is off in this job")]
    AutoOff,
}

/// One proxy per node of `table`, connected to `manager` (probing links when `auto` is on,
/// handing the launchers' orders to `launchers` when given).
fn start_proxies(
    job: &JobId,
    table: &RankTable,
    nodes: Vec<Box<dyn NodeHal>>,
    manager: &Addr<Manager>,
    (auto, launchers): (Option<AutoConfig>, Option<NodeLaunchers>),
) -> Vec<Addr<Proxy>> {
    let mut proxies = Vec::new();
    // Every node probes at the same instants.
    let origin = crate::unix_ms();
    for (i, (node, hal)) in table.nodes().iter().zip(nodes).enumerate() {
        let mut proxy = Proxy::new(job.clone(), node.clone(), hal, actor_link(manager));
        if let Some(a) = auto {
            let devices = table.devices_of(node).map(|(d, _)| d).collect();
            proxy = proxy.probe_links(a.link_probe, origin, devices);
        }
        if let Some(l) = &launchers {
            let l = l.clone();
            proxy = proxy.with_launcher(Arc::new(move |order| l(i, order)));
        }
        let proxy = proxy.start();
        manager.do_send(ProxyConnected {
            node: node.clone(),
            link: actor_link(&proxy),
        });
        proxies.push(proxy);
    }
    proxies
}

/// A manager for `job`, recording its results in `journal` (and answering the uuids it
/// holds), with automatic failover when `auto` is given and process recovery when
/// `recovery` is.
fn new_manager(
    job: &JobId,
    table: &RankTable,
    deadlines: PhaseDeadlines,
    (auto, recovery): (Option<AutoConfig>, Option<ProcessRecovery>),
    journal: Arc<dyn OperationJournal>,
) -> Manager {
    let m = Manager::new(job.clone(), table.clone(), deadlines)
        .with_journal(journal)
        .with_process_recovery(recovery);
    match auto {
        Some(cfg) => m.with_auto(cfg),
        None => m,
    }
}

/// A running in-process job.
pub struct LocalJob {
    /// The manager in charge (a new one after [`LocalJob::restart_manager`]).
    manager: Mutex<(Addr<Manager>, ProgressFeed)>,
    proxies: Vec<Addr<Proxy>>,
    config: (JobId, RankTable, PhaseDeadlines),
    /// Automatic failover, when on (a restarted manager runs it too).
    auto: Option<AutoConfig>,
    /// Process recovery coordinated by the manager, when on (a restarted manager too).
    recovery: Option<ProcessRecovery>,
    /// Every worker's hang watch timeout (a restarted rank's too).
    hang_timeout: Option<Duration>,
    /// The finished operations of every manager of the job: a restarted manager answers a
    /// repeated uuid with the earlier result, as one with `--state-dir` does.
    journal: Arc<MemoryJournal>,
    /// Each rank's worker, its connection to its proxy (cut and restored by the fault hooks)
    /// and its gate: a new set for a new incarnation ([`LocalJob::restart_ranks`]).
    ranks: Mutex<Incarnation>,
    /// What a job that does not run leads to (a restarted manager keeps it).
    hold: Mutex<HoldPolicy>,
    /// The actix system of the actors, for work spawned on it later.
    system: System,
    /// The system's thread; the actors stop when it is stopped.
    actors: Background,
    client: tokio::runtime::Runtime,
}

/// The processes of the job's ranks, as one incarnation.
struct Incarnation {
    /// Which start of the job's processes this is (0: the first), as a launcher numbers them
    /// (`TASKD_RESTART_COUNT`).
    generation: u32,
    workers: Vec<Addr<Worker>>,
    uplinks: Vec<Arc<Uplink>>,
    gates: Vec<Arc<StepGate>>,
}

/// How a recovery ended (see [`LocalJob::recover`]).
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryResult {
    /// The ranks in doubt were re-stated by this operation.
    Operation(Box<OperationReport>),
    /// Nothing was in doubt: this verification round established the job's state.
    Verification(VerifyReport),
}

impl LocalJob {
    /// Starts the actors. `nodes[i]` is the HAL of the table's i-th node, `ranks[r]` the
    /// parts of global rank `r` ([`RankParts`], or a [`RankSpec`]).
    pub fn start<R: IntoRankSpec>(
        cfg: LocalJobConfig,
        nodes: Vec<Box<dyn NodeHal>>,
        ranks: Vec<R>,
    ) -> Result<LocalJob, LocalJobError> {
        Self::start_with_auto(cfg, None, nodes, ranks)
    }

    /// [`LocalJob::start`], with automatic failover when `auto` is given: the manager runs
    /// the policy and every proxy probes its node's links every `auto.link_probe`.
    pub fn start_with_auto<R: IntoRankSpec>(
        cfg: LocalJobConfig,
        auto: Option<AutoConfig>,
        nodes: Vec<Box<dyn NodeHal>>,
        ranks: Vec<R>,
    ) -> Result<LocalJob, LocalJobError> {
        let options = LocalJobOptions {
            auto,
            ..LocalJobOptions::default()
        };
        Self::start_with(cfg, options, nodes, ranks)
    }

    /// [`LocalJob::start`] with `options`: automatic failover, process recovery coordinated by
    /// the manager, the launchers that take its orders.
    pub fn start_with<R: IntoRankSpec>(
        cfg: LocalJobConfig,
        options: LocalJobOptions,
        nodes: Vec<Box<dyn NodeHal>>,
        ranks: Vec<R>,
    ) -> Result<LocalJob, LocalJobError> {
        let LocalJobOptions {
            auto,
            process_recovery: recovery,
            launchers,
            hang_timeout,
        } = options;
        let ranks = rank_specs(ranks)?;
        let table = cfg.table.clone();
        let config = (cfg.job.clone(), cfg.table.clone(), cfg.deadlines);
        if nodes.len() != table.nodes().len() {
            return Err(LocalJobError::Mismatch {
                what: "node HALs",
                expected: table.nodes().len(),
                got: nodes.len(),
            });
        }
        if ranks.len() != table.world_size() {
            return Err(LocalJobError::Mismatch {
                what: "rank HALs",
                expected: table.world_size(),
                got: ranks.len(),
            });
        }
        let gates: Vec<Arc<StepGate>> = (0..ranks.len())
            .map(|_| Arc::new(StepGate::new()))
            .collect();
        let worker_gates = gates.clone();
        let uplinks: Vec<Arc<Uplink>> = (0..ranks.len()).map(|_| Arc::default()).collect();
        let worker_uplinks = uplinks.clone();
        let journal = Arc::new(MemoryJournal::default());
        let first_journal: Arc<dyn OperationJournal> = journal.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let actors = Background::spawn_actix("taskd-actors", move |stop| async move {
            let manager = new_manager(
                &cfg.job,
                &table,
                cfg.deadlines,
                (auto, recovery),
                first_journal,
            );
            let progress = manager.progress();
            let manager = manager.start();
            let proxies = start_proxies(&cfg.job, &table, nodes, &manager, (auto, launchers));
            let workers: Vec<Addr<Worker>> = ranks
                .into_iter()
                .enumerate()
                .map(|(r, parts)| {
                    let process = Process {
                        rank: GlobalRank(r as u32),
                        generation: 0,
                        hang_timeout,
                    };
                    let link = (worker_gates[r].clone(), worker_uplinks[r].clone());
                    start_worker(&cfg.job, &table, process, parts, &proxies, link)
                })
                .collect();
            let _ = tx.send((System::current(), manager, proxies, workers, progress));
            let _ = stop.await;
        })
        .expect("spawning the actor thread");
        let Ok((system, manager, proxies, workers, progress)) = rx.recv() else {
            if let Err(p) = actors.join() {
                tracing::error!(error = %p, "the job's actors did not start");
            }
            return Err(LocalJobError::SystemGone);
        };
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        Ok(LocalJob {
            manager: Mutex::new((manager, progress)),
            proxies,
            config,
            auto,
            recovery,
            hang_timeout,
            journal,
            ranks: Mutex::new(Incarnation {
                generation: 0,
                workers,
                uplinks,
                gates,
            }),
            hold: Mutex::new(HoldPolicy::default()),
            system,
            actors,
            client,
        })
    }

    /// Stops the manager at once, as a `kill -9` would (nothing is finished or rolled back),
    /// and starts a new one that the proxies connect to: their workers introduce themselves
    /// again and the new manager verifies what they applied. The new manager knows every
    /// result its predecessors journaled (a repeated uuid returns it); an operation cut off
    /// has none. Subscribe to progress again afterwards (the feed is the new manager's).
    pub fn restart_manager(&self) -> Result<(), LocalJobError> {
        let old = self.manager();
        let _ = self.client.block_on(old.send(StopManager));
        let (job, table, deadlines) = self.config.clone();
        let proxies = self.proxies.clone();
        let features = (self.auto, self.recovery);
        let journal: Arc<dyn OperationJournal> = self.journal.clone();
        let hold = *self.hold.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        self.system.arbiter().spawn(async move {
            let manager =
                new_manager(&job, &table, deadlines, features, journal).with_hold_policy(hold);
            let progress = manager.progress();
            let addr = manager.start();
            for (node, proxy) in table.nodes().iter().zip(&proxies) {
                addr.do_send(ProxyConnected {
                    node: node.clone(),
                    link: actor_link(proxy),
                });
                proxy.do_send(ManagerConnected {
                    link: actor_link(&addr),
                });
            }
            let _ = tx.send((addr, progress));
        });
        let fresh = rx.recv().map_err(|_| LocalJobError::SystemGone)?;
        *self.manager.lock() = fresh;
        Ok(())
    }

    /// Stops the manager the way SIGTERM does: the operation in flight, if any, ends safely
    /// first (within `timeout`); returns its result. The manager stays up (stop it with
    /// [`LocalJob::shutdown`] or replace it with [`LocalJob::restart_manager`]).
    pub fn drain(
        &self,
        reason: &str,
        timeout: Duration,
    ) -> Result<Option<OperationReport>, LocalJobError> {
        let fut = self.manager().send(Drain {
            reason: reason.to_owned(),
        });
        self.client
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .map_err(|_| LocalJobError::Timeout(timeout, "the operation in flight to end"))?
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Recovers a job that is not running (see [`RecoverTo`]) and waits for the outcome.
    pub fn recover(&self, to: RecoverTo) -> Result<RecoveryResult, LocalJobError> {
        let m = self.manager();
        let started = self
            .client
            .block_on(m.send(Recover { to, id: None }))
            .map_err(|_| LocalJobError::SystemGone)??;
        match started {
            Recovery::Operation(id) => {
                let r = self.wait(id)?;
                // A recovery that worked is confirmed by a verification round: return after it.
                self.client
                    .block_on(m.send(AwaitRegistered(None)))
                    .map_err(|_| LocalJobError::SystemGone)?;
                Ok(RecoveryResult::Operation(Box::new(r)))
            }
            Recovery::Verification(id) => self
                .client
                .block_on(m.send(AwaitVerification(id)))
                .map_err(|_| LocalJobError::SystemGone)?
                .map(RecoveryResult::Verification)
                .ok_or(LocalJobError::UnknownOperation(id)),
        }
    }

    /// Runs `fut` (a message to the manager, say) to its end on this job's client, handing
    /// every progress event `events` receives meanwhile to `on_progress` in order (then those
    /// already published when it ends). A subscriber that lagged loses the oldest events.
    pub fn drive<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
        events: &mut tokio::sync::broadcast::Receiver<ProgressEvent>,
        mut on_progress: impl FnMut(&ProgressEvent),
    ) -> T {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        self.client.block_on(async {
            tokio::pin!(fut);
            let mut open = true;
            loop {
                tokio::select! {
                    biased;
                    ev = events.recv(), if open => match ev {
                        Ok(ev) => on_progress(&ev),
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => open = false,
                    },
                    out = &mut fut => {
                        loop {
                            match events.try_recv() {
                                Ok(ev) => on_progress(&ev),
                                Err(TryRecvError::Lagged(_)) => {}
                                Err(_) => break,
                            }
                        }
                        return out;
                    }
                }
            }
        })
    }

    /// Waits (at most `timeout`, handing progress events to `on_progress` like
    /// [`LocalJob::drive`]) until automatic failover has settled with the manager seeing
    /// `links` (see [`AwaitAutoSettled`]).
    pub fn await_auto_settled(
        &self,
        links: Vec<(DeviceKey, Links)>,
        timeout: Duration,
        events: &mut tokio::sync::broadcast::Receiver<ProgressEvent>,
        on_progress: impl FnMut(&ProgressEvent),
    ) -> Result<(), LocalJobError> {
        let settled = self.manager().send(AwaitAutoSettled { links });
        // The timer is created inside the client's runtime.
        let bounded = async { tokio::time::timeout(timeout, settled).await };
        match self.drive(bounded, events, on_progress) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(LocalJobError::AutoOff),
            Ok(Err(_)) => Err(LocalJobError::SystemGone),
            Err(_) => Err(LocalJobError::Timeout(
                timeout,
                "automatic failover to settle",
            )),
        }
    }
    /// The manager's progress feed (see [`crate::progress`]): subscribe before submitting to
    /// see an operation from its start.
    pub fn subscribe_progress(&self) -> tokio::sync::broadcast::Receiver<ProgressEvent> {
        self.manager.lock().1.subscribe()
    }

    /// The step gate of `rank`, for its training loop.
    pub fn gate(&self, rank: GlobalRank) -> Arc<StepGate> {
        self.ranks.lock().gates[rank.0 as usize].clone()
    }

    /// The manager in charge now.
    pub fn manager(&self) -> Addr<Manager> {
        self.manager.lock().0.clone()
    }

    /// Blocks until every worker registered, or `timeout`.
    pub fn wait_registered(&self, timeout: Duration) -> Result<(), LocalJobError> {
        self.wait_registered_count(None, timeout)
    }

    /// Blocks until exactly `count` workers are registered (`None`: all), or `timeout`.
    pub fn wait_registered_count(
        &self,
        count: Option<usize>,
        timeout: Duration,
    ) -> Result<(), LocalJobError> {
        let fut = self.manager().send(AwaitRegistered(count));
        self.client
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .map_err(|_| LocalJobError::Timeout(timeout, "every worker to register"))?
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Blocks until every rank has answered the NIC-set phase the last operation ended in (see
    /// [`SubmitError::InCalls`]), or `timeout`.
    pub fn wait_calls_answered(&self, timeout: Duration) -> Result<(), LocalJobError> {
        let fut = self.manager().send(AwaitCallsAnswered);
        self.client
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .map_err(|_| LocalJobError::Timeout(timeout, "every rank to answer its NIC-set calls"))?
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Admits a command; returns at once.
    pub fn submit(&self, cmd: SwitchCommand) -> Result<Submission, LocalJobError> {
        let res = self
            .client
            .block_on(self.manager().send(Submit(cmd)))
            .map_err(|_| LocalJobError::SystemGone)?;
        Ok(res?)
    }

    /// Blocks until the operation's final result.
    pub fn wait(&self, id: OperationId) -> Result<OperationReport, LocalJobError> {
        self.client
            .block_on(self.manager().send(AwaitResult(id)))
            .map_err(|_| LocalJobError::SystemGone)?
            .ok_or(LocalJobError::UnknownOperation(id))
    }

    /// Submits and waits.
    pub fn run(&self, cmd: SwitchCommand) -> Result<OperationReport, LocalJobError> {
        let sub = self.submit(cmd)?;
        match sub {
            Submission::Known(r) => Ok(*r),
            other => self.wait(other.id()),
        }
    }

    /// Submits and waits like [`LocalJob::run`], handing every progress event of the
    /// operation to `on_progress` as it happens (on this thread), the final
    /// [`crate::ProgressKind::Finished`] last. A repeated uuid returns the known result
    /// without events.
    pub fn run_with_progress(
        &self,
        cmd: SwitchCommand,
        mut on_progress: impl FnMut(&ProgressEvent),
    ) -> Result<OperationReport, LocalJobError> {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        let mut events = self.subscribe_progress();
        let id = match self.submit(cmd)? {
            Submission::Known(r) => return Ok(*r),
            other => other.id(),
        };
        let result = self.manager().send(AwaitResult(id));
        self.client.block_on(async {
            tokio::pin!(result);
            loop {
                tokio::select! {
                    biased;
                    ev = events.recv() => match ev {
                        Ok(ev) if ev.op == id => on_progress(&ev),
                        Ok(_) | Err(RecvError::Lagged(_)) => {}
                        // The manager is gone: the result says how.
                        Err(RecvError::Closed) => {
                            return result
                                .await
                                .map_err(|_| LocalJobError::SystemGone)?
                                .ok_or(LocalJobError::UnknownOperation(id));
                        }
                    },
                    res = &mut result => {
                        // The final event is published before the result is sent: drain.
                        loop {
                            match events.try_recv() {
                                Ok(ev) if ev.op == id => on_progress(&ev),
                                Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                                Err(_) => break,
                            }
                        }
                        return res
                            .map_err(|_| LocalJobError::SystemGone)?
                            .ok_or(LocalJobError::UnknownOperation(id));
                    }
                }
            }
        })
    }

    /// The manager's view of the job now, with up to `recent` past results (newest last).
    pub fn status(&self, recent: usize) -> Result<ManagerStatus, LocalJobError> {
        self.client
            .block_on(self.manager().send(GetStatus { recent }))
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Stops one worker as if its process died: its proxy sees the connection close.
    pub fn kill_worker(&self, rank: GlobalRank) {
        self.ranks.lock().workers[rank.0 as usize].do_send(StopWorker);
    }

    /// Cuts the connection between `rank`'s worker and its proxy, as a network fault does: the
    /// process lives on (its training loop, its gate as it stands, a HAL call under way), the
    /// proxy sees the connection close and the manager loses the rank; the worker's messages
    /// are lost until [`LocalJob::reconnect_worker`].
    pub fn disconnect_worker(&self, rank: GlobalRank) {
        let Some(node) = self.node_index(rank) else {
            return;
        };
        self.ranks.lock().uplinks[rank.0 as usize].cut();
        self.proxies[node].do_send(WorkerDisconnected {
            rank,
            reason: "connection to the worker closed (fault injected)".into(),
            how: Gone::Died,
        });
    }

    /// Restores a connection [`LocalJob::disconnect_worker`] cut: the worker introduces itself
    /// to its proxy again, as a reconnecting worker does, and the manager verifies what it has
    /// applied.
    pub fn reconnect_worker(&self, rank: GlobalRank) {
        if let Some(node) = self.node_index(rank) {
            self.attach(rank, &self.proxies[node]);
        }
    }

    /// Stops the proxy of the table's `node`-th node as if its process died: the manager loses
    /// every rank of the node, and their workers lose their proxy (each process lives on, its
    /// gate as it stands). Bring it back with [`LocalJob::restart_proxy`], and restart no
    /// manager before that (a new manager would reach the dead proxy).
    pub fn kill_proxy(&self, node: usize) {
        let Some(name) = self.config.1.nodes().get(node).cloned() else {
            return;
        };
        let ranks = self.ranks.lock();
        for rank in self.config.1.ranks_of(&name) {
            ranks.uplinks[rank.0 as usize].cut();
        }
        drop(ranks);
        // Whatever the dead proxy still had to say is lost.
        self.proxies[node].do_send(ManagerConnected {
            link: Arc::new(Severed),
        });
        self.manager().do_send(ProxyDisconnected {
            node: name,
            reason: "the proxy process died (fault injected)".into(),
        });
    }

    /// Starts the proxy [`LocalJob::kill_proxy`] stopped again, as a new process: it knows no
    /// worker, connects to the manager in charge, and the node's workers connect to it and
    /// introduce themselves.
    pub fn restart_proxy(&self, node: usize) {
        let Some(name) = self.config.1.nodes().get(node).cloned() else {
            return;
        };
        let proxy = &self.proxies[node];
        let ranks = self.config.1.ranks_of(&name);
        for rank in &ranks {
            proxy.do_send(WorkerDisconnected {
                rank: *rank,
                reason: "the proxy restarted".into(),
                how: Gone::Unreachable,
            });
        }
        let manager = self.manager();
        proxy.do_send(ManagerConnected {
            link: actor_link(&manager),
        });
        manager.do_send(ProxyConnected {
            node: name,
            link: actor_link(proxy),
        });
        for rank in ranks {
            self.attach(rank, proxy);
        }
    }

    /// Connects `rank`'s worker to `proxy` and repeats its introduction.
    fn attach(&self, rank: GlobalRank, proxy: &Addr<Proxy>) {
        let r = rank.0 as usize;
        let ranks = self.ranks.lock();
        proxy.do_send(WorkerConnected {
            rank,
            link: actor_link(&ranks.workers[r]),
        });
        ranks.uplinks[r].connect(actor_link(proxy));
        if let Some(hello) = ranks.uplinks[r].hello() {
            proxy.do_send(Deliver(WorkerToProxy::Hello(hello)));
        }
    }

    /// The index in the rank table's node list of `rank`'s node.
    fn node_index(&self, rank: GlobalRank) -> Option<usize> {
        let table = &self.config.1;
        let slot = table.slot(rank)?;
        table.nodes().iter().position(|n| *n == slot.node)
    }

    /// Opens every gate for good and stops the actors.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for g in &self.ranks.lock().gates {
            g.shutdown();
        }
        self.actors.stop();
    }
}

/// Which process of a rank a worker is.
#[derive(Copy, Clone)]
struct Process {
    rank: GlobalRank,
    /// The job restart it was started for.
    generation: u32,
    hang_timeout: Option<Duration>,
}

/// Starts `process`'s worker (with its step gate and its connection to the proxy of its node)
/// and connects it to that proxy.
fn start_worker(
    job: &JobId,
    table: &RankTable,
    process: Process,
    parts: RankSpec,
    proxies: &[Addr<Proxy>],
    (gate, uplink): (Arc<StepGate>, Arc<Uplink>),
) -> Addr<Worker> {
    let slot = table.slot(process.rank).expect("rank in table");
    let node_idx = table
        .nodes()
        .iter()
        .position(|n| *n == slot.node)
        .expect("node in table");
    let proxy = proxies[node_idx].clone();
    let farewell_proxy = proxy.clone();
    uplink.connect(actor_link(&proxy));
    let worker = Worker::new(
        WorkerConfig {
            job: job.clone(),
            node: slot.node.clone(),
            rank: slot.rank,
            tsp: parts.tsp,
            generation: process.generation,
            hang_timeout: process.hang_timeout,
        },
        parts.hal,
        gate,
        uplink,
    )
    .with_farewell(Box::new(move |rank| {
        farewell_proxy.do_send(WorkerDisconnected {
            rank,
            reason: "worker process exited (connection closed)".into(),
            how: Gone::Died,
        })
    }));
    let addr = worker.start();
    proxy.do_send(WorkerConnected {
        rank: slot.rank,
        link: actor_link(&addr),
    });
    addr
}

/// A worker's connection to its proxy, which the fault hooks cut and restore. It keeps the
/// worker's introduction, to repeat it on a reconnect as a worker reconnecting over the network
/// does.
#[derive(Default)]
struct Uplink {
    to: Mutex<Option<Link<WorkerToProxy>>>,
    hello: Mutex<Option<WorkerHello>>,
}

impl Uplink {
    fn connect(&self, link: Link<WorkerToProxy>) {
        *self.to.lock() = Some(link);
    }

    fn cut(&self) {
        *self.to.lock() = None;
    }

    fn hello(&self) -> Option<WorkerHello> {
        self.hello.lock().clone()
    }
}

impl Sender<WorkerToProxy> for Uplink {
    fn send(&self, msg: WorkerToProxy) -> Result<(), TransportError> {
        if let WorkerToProxy::Hello(h) = &msg {
            *self.hello.lock() = Some(h.clone());
        }
        match self.to.lock().as_ref() {
            Some(link) => link.send(msg),
            None => Err(TransportError::Closed),
        }
    }
}

/// The manager's end of a dead proxy's connection: every message is lost.
struct Severed;

impl Sender<ProxyToManager> for Severed {
    fn send(&self, _: ProxyToManager) -> Result<(), TransportError> {
        Err(TransportError::Closed)
    }
}

impl Drop for LocalJob {
    fn drop(&mut self) {
        self.stop();
    }
}
