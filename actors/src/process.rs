//! The roles of a job as processes of their own: what `taskd manager`, `taskd proxy` and
//! `taskd worker` do between reading their configuration and waiting for a signal, so that
//! the binaries only parse flags, print and map errors to exit codes.
//!
//! - [`ManagerProcess`]: the manager node (its proxies' port) and, optionally, the operators'
//!   control API and ClusterD's client in front of the same manager actor; one start, one
//!   shutdown.
//! - [`ProxyIdentity`]: which node a proxy is, from its flags, its environment and the job's
//!   rank table, refused with a typed [`IdentityError`] before anything starts.
//! - [`LateRankHal`]: a rank HAL that exists before the job's shape is known and is filled in
//!   once registration has told it (simulated ranks are built from the world size).
//! - [`ShutdownSignals`]: SIGINT, SIGTERM and SIGHUP, each ending a role the same way.
//! - [`rank_table`]: the job's HCCL rank table file, read with a size bound.

pub mod rank_table;

use crate::clusterd::{ClusterdClient, ClusterdConfig, ClusterdError};
use crate::control::{self, ControlConfig, ControlServer, ServeError};
use crate::journal::{FileJournal, JournalError};
use crate::manager::{Drain, Manager};
use crate::net::{ManagerNode, ManagerNodeConfig, NetError};
use actix::Actor as _;
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use taskd_core::auto::AutoConfig;
use taskd_core::operation::OperationReport;
use taskd_core::{
    GlobalRank, GroupInfo, GroupRank, HalError, HcclCode, NodeName, RankHal, RankTable,
    SwitchCapabilities,
};

/// Why a role could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The transport could not start (its port, its TLS).
    #[error(transparent)]
    Net(#[from] NetError),
    /// The control API could not start.
    #[error("control API: {0}")]
    Control(#[from] ServeError),
    /// ClusterD's client could not start.
    #[error(transparent)]
    Clusterd(#[from] ClusterdError),
    /// The signal handlers could not be installed.
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
    /// The state directory's journal of finished operations cannot be used (the message
    /// names the file and what to do).
    #[error(transparent)]
    Journal(#[from] JournalError),
}

// ---------------------------------------------------------------------------------------------
// Signals

/// The signals that end a long-running role: SIGINT (Ctrl-C), SIGTERM (a supervisor) and
/// SIGHUP (a closed terminal or session). Each one stops the role cleanly, saying goodbye to
/// its peers, rather than killing it where it stands.
pub struct ShutdownSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Installs the handlers; from now on these signals no longer kill the process. Call it
    /// inside a tokio runtime, before starting the role, so an early signal is not lost.
    pub fn install() -> Result<ShutdownSignals, ProcessError> {
        use tokio::signal::unix::{signal, SignalKind};
        let one = |k: SignalKind| signal(k).map_err(ProcessError::Signals);
        Ok(ShutdownSignals {
            int: one(SignalKind::interrupt())?,
            term: one(SignalKind::terminate())?,
            hup: one(SignalKind::hangup())?,
        })
    }

    /// Waits for the next of them and names it (`"SIGTERM"`, ...).
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
        }
    }

    /// Runs `work` until it finishes (`Ok`) or a signal comes first (`Err`, naming it).
    pub async fn or_signal<F: Future>(&mut self, work: F) -> Result<F::Output, &'static str> {
        tokio::select! {
            out = work => Ok(out),
            sig = self.recv() => Err(sig),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Manager

/// What a manager process runs.
#[derive(Clone, Debug)]
pub struct ManagerProcessConfig {
    /// The manager and the port its proxies connect to.
    pub node: ManagerNodeConfig,
    /// The operators' control API, when served (in front of the same manager actor).
    pub control: Option<ControlConfig>,
    /// ClusterD, when the manager is its client (beside the control API: both drive the same
    /// manager, one operation at a time).
    pub clusterd: Option<ClusterdConfig>,
    /// Automatic failover, when on: the manager runs the policy and tells its proxies to
    /// probe their links every `link_probe`.
    pub auto: Option<AutoConfig>,
    /// With `auto`: its moves off a failed link abort the collectives in flight and finish
    /// the step on the backup (`--abort-in-flight`, [`Manager::with_auto_in_flight`]).
    pub abort_in_flight: bool,
    /// Where the manager keeps what must survive its restart (`--state-dir`): the journal of
    /// finished operations ([`crate::journal::FileJournal`]), so a repeated uuid returns the
    /// earlier result. `None`: results live in memory only and a restarted manager runs a
    /// repeated uuid again.
    pub state_dir: Option<PathBuf>,
    /// The longest the manager waits for a write of its journal (`--journal-timeout-ms`):
    /// past it the journal is failing (a file system that does not answer).
    pub journal_timeout: std::time::Duration,
    /// What a job that does not run leads to (`--hold-policy`, `--hold-bound-ms`).
    pub hold: crate::manager::HoldPolicy,
    /// Process recovery coordinated by the manager (`--process-recovery`,
    /// `--max-restarts`).
    pub recovery: Option<taskd_core::ledger::ProcessRecovery>,
    /// The bound on a stop of training (`--stop-bound-ms`).
    pub stop_bound: std::time::Duration,
}

/// A running manager process: the manager node, its control API and its ClusterD client.
/// Lives on an actix system.
pub struct ManagerProcess {
    node: ManagerNode,
    control: Option<ControlServer>,
    clusterd: Option<(String, ClusterdClient)>,
}

impl ManagerProcess {
    /// Starts the manager, listens for proxies and serves the control API. Nothing is left
    /// running when it fails (a journal in `state_dir` that cannot be used is refused before
    /// anything starts). Call it from inside an actix system.
    pub async fn start(cfg: ManagerProcessConfig) -> Result<ManagerProcess, ProcessError> {
        let mut node_cfg = cfg.node.clone();
        let mut manager = Manager::new(
            node_cfg.job.clone(),
            node_cfg.table.clone(),
            node_cfg.deadlines,
        )
        .with_hold_policy(cfg.hold)
        .with_process_recovery(cfg.recovery)
        .with_stop_bound(cfg.stop_bound)
        .with_journal_timeout(cfg.journal_timeout);
        if let Some(dir) = &cfg.state_dir {
            let journal = FileJournal::open(dir, &node_cfg.job)?;
            tracing::info!(journal = %journal.path().display(), "finished operations are journaled");
            manager = manager.with_journal(Arc::new(journal));
        }
        if let Some(auto) = cfg.auto {
            node_cfg.net.link_probe = Some(auto.link_probe);
            manager = manager
                .with_auto(auto)
                .with_auto_in_flight(cfg.abort_in_flight);
        }
        let node = ManagerNode::spawn_with(node_cfg, manager.start()).await?;
        let control = match cfg.control {
            None => None,
            Some(c) => {
                let served = control::serve(node.manager().clone(), c);
                match served {
                    Ok(s) => Some(s),
                    Err(e) => {
                        node.shutdown().await;
                        return Err(e.into());
                    }
                }
            }
        };
        let clusterd = match cfg.clusterd {
            None => None,
            Some(c) => {
                let addr = c.addr.clone();
                match ClusterdClient::start(node.manager().clone(), c) {
                    Ok(client) => Some((addr, client)),
                    Err(e) => {
                        if let Some(c) = control {
                            c.shutdown();
                        }
                        node.shutdown().await;
                        return Err(e.into());
                    }
                }
            }
        };
        Ok(ManagerProcess {
            node,
            control,
            clusterd,
        })
    }

    /// ClusterD's address, when the manager is its client.
    pub fn clusterd_addr(&self) -> Option<&str> {
        self.clusterd.as_ref().map(|(a, _)| a.as_str())
    }

    /// The address proxies connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.node.local_addr()
    }

    /// The control API's address, when served.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control.as_ref().map(ControlServer::local_addr)
    }

    /// The manager node (its actor, its peers).
    pub fn node(&self) -> &ManagerNode {
        &self.node
    }

    /// Ends the operation in flight safely (see [`crate::manager::Drain`]): resolves with its
    /// result once it is over, or at once with `None` when nothing runs. Bounded by the
    /// operation's own phase deadlines (a rollback and a resume at most).
    pub async fn drain(&self, reason: &str) -> Option<OperationReport> {
        self.node
            .manager()
            .send(Drain {
                reason: reason.to_owned(),
            })
            .await
            .ok()
            .flatten()
    }

    /// Stops ClusterD's client and the control API, then the manager node and every
    /// connection.
    pub async fn shutdown(mut self) {
        if let Some((_, c)) = self.clusterd.take() {
            c.shutdown();
        }
        if let Some(c) = self.control.take() {
            c.shutdown();
        }
        self.node.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Proxy identity

/// Why a proxy cannot tell which node it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Neither a node name nor a node rank.
    #[error(
        "which node is this? give --node-rank (or set MS_NODE_RANK, or RANK and \
         LOCAL_WORLD_SIZE) or --node-name"
    )]
    Unknown,
    /// The named node has no ranks in the rank table.
    #[error("node {0} is not in the rank table")]
    NodeNotInTable(NodeName),
    /// The node rank is past the rank table's nodes.
    #[error("node rank {rank} is not in the rank table (it has {nodes} nodes: 0..{nodes})")]
    RankNotInTable {
        /// The node rank given.
        rank: u32,
        /// Nodes in the table.
        nodes: usize,
    },
}

/// Which node a proxy is, as far as it knows before the manager admits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyIdentity {
    /// The node's name; `None`: the manager names it from `node_rank`.
    pub node: Option<NodeName>,
    /// The node's rank, when known.
    pub node_rank: Option<u32>,
    /// The node's ranks when a rank table names them (the manager checks they agree).
    pub ranks: Vec<GlobalRank>,
}

impl ProxyIdentity {
    /// The node from a name (first), else its rank: in the rank table when there is one
    /// (the table's node at that index), else `node-K`.
    pub fn resolve(
        name: Option<NodeName>,
        node_rank: Option<u32>,
        table: Option<&RankTable>,
    ) -> Result<ProxyIdentity, IdentityError> {
        let node = match (name, node_rank, table) {
            (Some(n), _, _) => n,
            (None, Some(k), Some(t)) => {
                t.nodes()
                    .get(k as usize)
                    .cloned()
                    .ok_or(IdentityError::RankNotInTable {
                        rank: k,
                        nodes: t.nodes().len(),
                    })?
            }
            (None, Some(k), None) => NodeName::uniform(k),
            (None, None, _) => return Err(IdentityError::Unknown),
        };
        let ranks = match table {
            Some(t) => match t.ranks_of(&node) {
                r if r.is_empty() => return Err(IdentityError::NodeNotInTable(node)),
                r => r,
            },
            None => Vec::new(),
        };
        Ok(ProxyIdentity {
            node: Some(node),
            node_rank,
            ranks,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A rank HAL filled in after registration

/// How long a call to a [`LateRankHal`] waits for its real HAL: longer than a registration
/// takes, shorter than a phase deadline.
pub const LATE_HAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A rank HAL handed to the worker before the job's shape is known (a simulated rank is built
/// from the world size and node count registration reports), until [`LateRankHalSlot::install`]
/// puts the real one in.
///
/// The manager starts a verification round as soon as a rank registers, so its question can
/// reach the worker before the real HAL is in (a restarted process did so about once in 35
/// relaunches): a call waits for it, at most [`LATE_HAL_WAIT`], instead of answering "not set
/// up yet", which the manager does not count as an answer (it waited a whole resume deadline,
/// then another, before the job was verified). Past the wait the call answers unavailable.
pub struct LateRankHal {
    inner: Arc<Late>,
    capabilities: SwitchCapabilities,
    wait: std::time::Duration,
}

/// The real HAL once installed, and who waits for it.
#[derive(Default)]
struct Late {
    hal: Mutex<Option<Box<dyn RankHal>>>,
    installed: parking_lot::Condvar,
    /// Calls waiting for the HAL now.
    waiting: std::sync::atomic::AtomicUsize,
}

/// Where the real HAL of a [`LateRankHal`] goes.
#[derive(Clone)]
pub struct LateRankHalSlot(Arc<Late>);

impl LateRankHal {
    /// A HAL reporting `capabilities` (known up front: they are the process's configuration),
    /// and the slot its real HAL goes into; calls wait for it at most [`LATE_HAL_WAIT`].
    pub fn new(capabilities: SwitchCapabilities) -> (LateRankHal, LateRankHalSlot) {
        Self::waiting(capabilities, LATE_HAL_WAIT)
    }

    /// [`LateRankHal::new`] whose calls wait for the real HAL at most `wait`.
    pub fn waiting(
        capabilities: SwitchCapabilities,
        wait: std::time::Duration,
    ) -> (LateRankHal, LateRankHalSlot) {
        let inner = Arc::new(Late::default());
        let slot = LateRankHalSlot(inner.clone());
        (
            LateRankHal {
                inner,
                capabilities,
                wait,
            },
            slot,
        )
    }

    /// Runs `f` on the real HAL, waiting for it to be installed (at most the wait).
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut dyn RankHal) -> Result<T, HalError>,
    ) -> Result<T, HalError> {
        use std::sync::atomic::Ordering;
        let deadline = std::time::Instant::now() + self.wait;
        let mut hal = self.inner.hal.lock();
        while hal.is_none() {
            self.inner.waiting.fetch_add(1, Ordering::SeqCst);
            let waited = self.inner.installed.wait_until(&mut hal, deadline);
            self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
            if waited.timed_out() && hal.is_none() {
                return Err(not_ready());
            }
        }
        f(hal.as_mut().expect("installed").as_mut())
    }
}

impl LateRankHalSlot {
    /// Puts the real HAL in; every later call goes to it, and the calls waiting for it go on.
    pub fn install(&self, hal: Box<dyn RankHal>) {
        *self.0.hal.lock() = Some(hal);
        self.0.installed.notify_all();
    }

    /// How many calls wait for the HAL now.
    pub fn waiting(&self) -> usize {
        self.0.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn not_ready() -> HalError {
    HalError::new(
        "HcclGetCommName",
        HcclCode::Unavail,
        "the rank's HAL is not set up yet",
    )
}

impl RankHal for LateRankHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        self.call(|h| h.groups())
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        self.call(|h| h.set_working_nic(group, ranks, use_backup))
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.capabilities.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::rank_table::RankSlot;
    use taskd_core::DeviceId;

    #[test]
    fn a_proxy_is_named_by_flag_table_or_rank() {
        let t = RankTable::uniform(2, 2);
        let id = ProxyIdentity::resolve(None, Some(1), Some(&t)).unwrap();
        assert_eq!(id.node, Some(NodeName("node-1".into())));
        assert_eq!(id.ranks, vec![GlobalRank(2), GlobalRank(3)]);
        let id = ProxyIdentity::resolve(None, Some(7), None).unwrap();
        assert_eq!(
            (id.node, id.ranks),
            (Some(NodeName("node-7".into())), vec![])
        );
        let id = ProxyIdentity::resolve(Some("node-0".into()), Some(5), Some(&t)).unwrap();
        assert_eq!(id.ranks, vec![GlobalRank(0), GlobalRank(1)]);
        assert_eq!(
            ProxyIdentity::resolve(None, None, Some(&t)),
            Err(IdentityError::Unknown)
        );
        assert_eq!(
            ProxyIdentity::resolve(None, Some(2), Some(&t)),
            Err(IdentityError::RankNotInTable { rank: 2, nodes: 2 })
        );
        let e = ProxyIdentity::resolve(Some("node-9".into()), None, Some(&t)).unwrap_err();
        assert_eq!(e.to_string(), "node node-9 is not in the rank table");
        let named = RankTable::new(vec![RankSlot {
            node: "10.0.0.1".into(),
            device: DeviceId(0),
            rank: GlobalRank(0),
        }])
        .unwrap();
        let id = ProxyIdentity::resolve(None, Some(0), Some(&named)).unwrap();
        assert_eq!(id.node, Some(NodeName("10.0.0.1".into())));
    }

    struct Fixed;

    impl RankHal for Fixed {
        fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
            Ok(Vec::new())
        }
        fn set_working_nic(
            &mut self,
            _: &str,
            _: &[GroupRank],
            _: &[bool],
        ) -> Result<(), HalError> {
            Ok(())
        }
        fn capabilities(&mut self) -> SwitchCapabilities {
            SwitchCapabilities::ALL
        }
    }

    #[test]
    fn a_late_hal_answers_unavailable_when_never_installed_within_its_wait() {
        let caps = taskd_core::HcclSetup {
            l2_retry: false,
            rdma: true,
        }
        .capabilities();
        let (mut hal, slot) =
            LateRankHal::waiting(caps.clone(), std::time::Duration::from_millis(20));
        let e = hal.groups().unwrap_err();
        assert!(e.to_string().contains("not set up yet"), "{e}");
        assert!(hal.set_working_nic("g", &[], &[]).is_err());
        assert_eq!(hal.capabilities(), caps);
        slot.install(Box::new(Fixed));
        assert_eq!(hal.groups().unwrap(), Vec::new());
        assert!(hal.set_working_nic("g", &[], &[]).is_ok());
        assert_eq!(
            hal.capabilities(),
            caps,
            "its own capabilities, not the inner HAL's"
        );
    }

    /// The verification round's question can reach a new worker before its HAL is installed:
    /// the call waits for it and answers, instead of "not set up yet" (which cost the job two
    /// resume deadlines before it was verified).
    #[test]
    fn a_call_before_the_hal_is_installed_waits_for_it() {
        let (mut hal, slot) = LateRankHal::new(SwitchCapabilities::ALL);
        let asked = std::thread::spawn(move || hal.groups());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while slot.waiting() == 0 {
            assert!(
                std::time::Instant::now() < deadline && !asked.is_finished(),
                "the call answered without waiting for its HAL"
            );
            std::thread::yield_now();
        }
        slot.install(Box::new(Fixed));
        assert_eq!(asked.join().unwrap().unwrap(), Vec::new());
        assert_eq!(slot.waiting(), 0);
    }
}
