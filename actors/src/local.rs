//! A whole job in one process: the manager, one proxy per node and one worker per rank as
//! actors on one actix system (on a thread of its own), wired with the in-process transport.
//! The simulator and most tests run this; the calls here block the caller, so a test or a
//! launcher can drive a job from plain code.

use crate::gate::StepGate;
use crate::hal_exec::WorkerHal;
use crate::manager::{
    AwaitRegistered, AwaitResult, AwaitVerification, Drain, GetStatus, Manager, ManagerStatus,
    ProxyConnected, Recover, Recovery, StopManager, Submission, Submit,
};
use crate::progress::{ProgressEvent, ProgressFeed};
use crate::proxy::{ManagerConnected, Proxy, WorkerConnected, WorkerDisconnected};
use crate::transport::actor_link;
use crate::worker::{StopWorker, Worker, WorkerConfig};
use actix::prelude::*;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::ledger::RecoverTo;
use taskd_core::operation::OperationReport;
use taskd_core::rank_table::RankSlot;
use taskd_core::verify::VerifyReport;
use taskd_core::{
    GlobalRank, JobId, NodeHal, OperationId, PhaseDeadlines, RankHal, RankTable, SubmitError,
    SwitchCommand,
};

/// What a local job is made of.
pub struct LocalJobConfig {
    pub job: JobId,
    pub table: RankTable,
    pub deadlines: PhaseDeadlines,
}

/// One rank's HAL and whether its process enables `TSP:1`.
pub struct RankParts {
    pub hal: Box<dyn RankHal>,
    pub tsp: bool,
}

/// [`RankParts`] with the HAL run as the worker is told ([`WorkerHal`]: a thread of its own,
/// a shared pool, a task): what the simulator hands [`LocalJob::start`] for thousands of
/// ranks in one process.
pub struct RankSpec {
    /// The rank's HAL and where its calls run.
    pub hal: WorkerHal,
    /// Whether the rank's process enables `TSP:1`.
    pub tsp: bool,
}

impl From<RankParts> for RankSpec {
    fn from(p: RankParts) -> Self {
        RankSpec {
            hal: WorkerHal::Thread(p.hal),
            tsp: p.tsp,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LocalJobError {
    #[error("{what}: expected {expected}, got {got}")]
    Mismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("the actor system stopped unexpectedly")]
    SystemGone,
    #[error("the command was refused: {0}")]
    Refused(#[from] SubmitError),
    #[error("operation {0} is unknown to the manager")]
    UnknownOperation(OperationId),
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
}

/// A running in-process job.
pub struct LocalJob {
    /// The manager in charge (a new one after [`LocalJob::restart_manager`]).
    manager: Mutex<(Addr<Manager>, ProgressFeed)>,
    proxies: Vec<Addr<Proxy>>,
    config: (JobId, RankTable, PhaseDeadlines),
    workers: Vec<Addr<Worker>>,
    gates: Vec<Arc<StepGate>>,
    system: System,
    thread: Option<std::thread::JoinHandle<()>>,
    client: tokio::runtime::Runtime,
}

/// How a recovery ended (see [`LocalJob::recover`]).
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryResult {
    /// The ranks in doubt were re-stated by this operation.
    Operation(Box<OperationReport>),
    /// Nothing was in doubt: this verification round established the job's state.
    Verification(VerifyReport),
}

/// The actors of a local job, as started on its actix system.
struct Actors {
    manager: Addr<Manager>,
    progress: ProgressFeed,
    proxies: Vec<Addr<Proxy>>,
    workers: Vec<Addr<Worker>>,
}

impl Actors {
    /// Starts the manager, a proxy per node and a worker per rank, wired in-process. Call it
    /// inside the actix system.
    fn start(
        cfg: &LocalJobConfig,
        nodes: Vec<Box<dyn NodeHal>>,
        ranks: Vec<RankSpec>,
        gates: &[Arc<StepGate>],
    ) -> Actors {
        let table = &cfg.table;
        let manager = Manager::new(cfg.job.clone(), table.clone(), cfg.deadlines);
        let progress = manager.progress();
        let manager = manager.start();
        let mut proxies = Vec::new();
        for (node, hal) in table.nodes().iter().zip(nodes) {
            let proxy =
                Proxy::new(cfg.job.clone(), node.clone(), hal, actor_link(&manager)).start();
            manager.do_send(ProxyConnected {
                node: node.clone(),
                link: actor_link(&proxy),
            });
            proxies.push(proxy);
        }
        let workers = ranks
            .into_iter()
            .enumerate()
            .map(|(r, parts)| {
                let slot = table.slot(GlobalRank(r as u32)).expect("rank in table");
                let node_idx = table
                    .nodes()
                    .iter()
                    .position(|n| *n == slot.node)
                    .expect("node in table");
                start_worker(cfg, slot, parts, gates[r].clone(), &proxies[node_idx])
            })
            .collect();
        Actors {
            manager,
            progress,
            proxies,
            workers,
        }
    }
}

/// Starts the worker of `slot` behind `proxy`; its stop tells the proxy its connection closed.
fn start_worker(
    cfg: &LocalJobConfig,
    slot: &RankSlot,
    parts: RankSpec,
    gate: Arc<StepGate>,
    proxy: &Addr<Proxy>,
) -> Addr<Worker> {
    let farewell_proxy = proxy.clone();
    let worker = Worker::with_hal(
        WorkerConfig {
            job: cfg.job.clone(),
            node: slot.node.clone(),
            rank: slot.rank,
            tsp: parts.tsp,
        },
        parts.hal,
        gate,
        actor_link(proxy),
    )
    .with_farewell(Box::new(move |rank| {
        farewell_proxy.do_send(WorkerDisconnected {
            rank,
            reason: "worker process exited (connection closed)".into(),
        })
    }));
    let addr = worker.start();
    proxy.do_send(WorkerConnected {
        rank: slot.rank,
        link: actor_link(&addr),
    });
    addr
}

impl LocalJob {
    /// Starts the actors. `nodes[i]` is the HAL of the table's i-th node, `ranks[r]` the
    /// parts of global rank `r` ([`RankParts`], or a [`RankSpec`]).
    pub fn start<R: Into<RankSpec>>(
        cfg: LocalJobConfig,
        nodes: Vec<Box<dyn NodeHal>>,
        ranks: Vec<R>,
    ) -> Result<LocalJob, LocalJobError> {
        let ranks: Vec<RankSpec> = ranks.into_iter().map(Into::into).collect();
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
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("taskd-actors".into())
            .spawn(move || {
                let sys = System::new();
                sys.block_on(async move {
                    let started = Actors::start(&cfg, nodes, ranks, &worker_gates);
                    let _ = tx.send((System::current(), started));
                });
                sys.run().ok();
            })
            .expect("spawning the actor thread");
        let (system, actors) = rx.recv().map_err(|_| LocalJobError::SystemGone)?;
        let Actors {
            manager,
            progress,
            proxies,
            workers,
        } = actors;
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        Ok(LocalJob {
            manager: Mutex::new((manager, progress)),
            proxies,
            config,
            workers,
            gates,
            system,
            thread: Some(thread),
            client,
        })
    }

    /// Stops the manager at once, as a `kill -9` would (nothing is finished or rolled back),
    /// and starts a new one that the proxies connect to: their workers introduce themselves
    /// again and the new manager verifies what they applied. Subscribe to progress again
    /// afterwards (the feed is the new manager's).
    pub fn restart_manager(&self) -> Result<(), LocalJobError> {
        let old = self.manager();
        let _ = self.client.block_on(old.send(StopManager));
        let (job, table, deadlines) = self.config.clone();
        let proxies = self.proxies.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        self.system.arbiter().spawn(async move {
            let manager = Manager::new(job, table.clone(), deadlines);
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

    /// The manager's progress feed (see [`crate::progress`]): subscribe before submitting to
    /// see an operation from its start.
    pub fn subscribe_progress(&self) -> tokio::sync::broadcast::Receiver<ProgressEvent> {
        self.manager.lock().1.subscribe()
    }

    /// The step gate of `rank`, for its training loop.
    pub fn gate(&self, rank: GlobalRank) -> Arc<StepGate> {
        self.gates[rank.0 as usize].clone()
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

    pub fn status(&self, recent: usize) -> Result<ManagerStatus, LocalJobError> {
        self.client
            .block_on(self.manager().send(GetStatus { recent }))
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Stops one worker as if its process died: its proxy sees the connection close.
    pub fn kill_worker(&self, rank: GlobalRank) {
        self.workers[rank.0 as usize].do_send(StopWorker);
    }

    /// Opens every gate for good and stops the actors.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for g in &self.gates {
            g.shutdown();
        }
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LocalJob {
    fn drop(&mut self) {
        self.stop();
    }
}
