//! A journal whose write takes longer than the heartbeat loss time: the manager waits for it
//! off its thread, so its transport keeps its proxy connected meanwhile, and the operation
//! runs once its admission is durable (its deadlines counted from there; the operator is told
//! it is accepted only then) and ends journaled.

mod support;

use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::{control_when_registered, spawn_proxy, start_rank, switch_on_node_0};
use taskd_actors::control::{self, ControlConfig, ControlServer};
use taskd_actors::journal::{JournalError, MemoryJournal, OperationJournal};
use taskd_actors::net::{ClientState, ManagerNode, ManagerNodeConfig, NetConfig};
use taskd_actors::Manager;
use taskd_core::ledger::{AdmittedOperation, FinishedOperation};
use taskd_core::{GlobalRank, JobId, PhaseDeadlines, RankTable};
use taskd_hal_mock::SoloLayout;
use tokio::sync::watch;

/// Heartbeats every 50 ms, a peer lost after 200 ms of silence.
fn net() -> NetConfig {
    NetConfig {
        heartbeat_interval: Duration::from_millis(50),
        missed_heartbeats: 4,
        backoff_initial: Duration::from_millis(20),
        ..NetConfig::default()
    }
}

/// How long the test holds the admission's write: several loss times, and longer than the
/// pause deadline.
const HELD: Duration = Duration::from_millis(1500);

/// Phase deadlines shorter than [`HELD`]: counted from the admission, the first would pass
/// during the write.
fn deadlines() -> PhaseDeadlines {
    PhaseDeadlines {
        pause: Duration::from_millis(1000),
        ..PhaseDeadlines::default()
    }
}

/// A journal in memory whose first admission blocks until the test releases it.
struct HeldJournal {
    inner: MemoryJournal,
    entered: parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    release: parking_lot::Mutex<mpsc::Receiver<()>>,
}

impl OperationJournal for HeldJournal {
    fn load(&self) -> Vec<FinishedOperation> {
        self.inner.load()
    }
    fn interrupted(&self) -> Vec<AdmittedOperation> {
        self.inner.interrupted()
    }
    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError> {
        if let Some(entered) = self.entered.lock().take() {
            let _ = entered.send(());
            let _ = self.release.lock().recv();
        }
        self.inner.admit(op)
    }
    fn record(&self, op: FinishedOperation) -> Result<(), JournalError> {
        self.inner.record(op)
    }
}

/// The manager with `journal` and its control API on an actix system of their own, its proxy
/// on another (so a manager's thread that blocks cannot stall the proxy).
fn start_job(journal: Arc<HeldJournal>) -> (ControlServer, ProxyNodeParts) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let cfg = ManagerNodeConfig {
                job: JobId("sj".into()),
                table: RankTable::uniform(1, 2),
                deadlines: deadlines(),
                listen: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                net: net(),
            };
            let manager = Manager::new(cfg.job.clone(), cfg.table.clone(), cfg.deadlines)
                .with_journal(journal);
            let m = ManagerNode::spawn_with(cfg, actix::Actor::start(manager))
                .await
                .unwrap();
            let ctl = control::serve(
                m.manager().clone(),
                ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId("sj".into())),
            )
            .unwrap();
            tx.send((ctl, m.local_addr().to_string())).unwrap();
            std::mem::forget(m);
        });
        sys.run().unwrap();
    });
    let (ctl, manager_addr) = rx.recv().unwrap();
    (ctl, start_proxy(manager_addr))
}

/// What the test needs of the proxy: its workers' address and its upstream connection.
struct ProxyNodeParts {
    addr: String,
    upstream: watch::Receiver<ClientState>,
    system: actix::System,
}

fn start_proxy(manager: String) -> ProxyNodeParts {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let p = spawn_proxy("sj", manager, 0, net()).await;
            tx.send(ProxyNodeParts {
                addr: p.local_addr().to_string(),
                upstream: p.upstream_state(),
                system: actix::System::current(),
            })
            .unwrap();
            std::mem::forget(p);
        });
        sys.run().unwrap();
    });
    rx.recv().unwrap()
}

/// Asserts that `upstream` stays registered for `held` (it would leave `Registered` were the
/// manager silent past the loss time).
async fn stays_registered(upstream: &mut watch::Receiver<ClientState>, held: Duration) {
    let until = tokio::time::Instant::now() + held;
    loop {
        let state = upstream.borrow_and_update().clone();
        assert!(
            matches!(state, ClientState::Registered(_)),
            "the proxy lost the manager while its journal was being written: {state:?}"
        );
        if tokio::time::timeout_at(until, upstream.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

#[test]
fn a_slow_journal_write_stalls_neither_the_transport_nor_the_deadlines() {
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let (release, release_rx) = mpsc::channel();
    let journal = Arc::new(HeldJournal {
        inner: MemoryJournal::default(),
        entered: parking_lot::Mutex::new(Some(entered_tx)),
        release: parking_lot::Mutex::new(release_rx),
    });
    let (ctl, mut proxy) = start_job(journal.clone());
    let start = |r| start_rank("sj", r, &proxy.addr, SoloLayout::new(1, 2), net());
    let ranks = [start(0), start(1)];
    let (rt, mut control) = control_when_registered(&ctl, "sj");

    let cmd = switch_on_node_0("sj", 0, true);
    // Submitted on a task of the test's runtime: a manager whose thread blocks in the write
    // would not answer it before the write is released.
    let submitted = rt.spawn(async move { control.submit(&cmd).await.map(|s| (s, control)) });
    rt.block_on(entered).expect("the admission's write started");
    // The write is held: the manager's transport still answers its proxy's heartbeats.
    rt.block_on(stays_registered(&mut proxy.upstream, HELD));
    // The operator is told "accepted" only once the admission is durable: a uuid it saw
    // accepted is known to any later manager (while the write is held, no answer).
    assert!(
        !submitted.is_finished(),
        "accepted before its admission was durable"
    );
    release.send(()).unwrap();
    let (switching, mut control) = rt.block_on(submitted).unwrap().unwrap();

    let r = rt.block_on(switching.result()).unwrap();
    assert_eq!(r.result, "succeeded", "{r:#?}");
    assert_eq!(r.journal_error, None);
    let journaled = journal.load();
    assert!(
        journaled
            .iter()
            .any(|op| op.report.id.0.to_string() == r.uuid),
        "the result is journaled: {journaled:?}"
    );
    assert!(
        journal.interrupted().is_empty(),
        "its admission is forgotten"
    );
    let st = rt.block_on(control.status("sj", 0)).unwrap();
    assert!(st.lost_ranks.is_empty(), "{:?}", st.lost_ranks);
    assert_eq!(st.ranks_on_backup, [0]);
    for r in &ranks {
        assert!(r.solo.views_agree(), "every group of a rank agrees");
        assert_eq!(r.solo.ranks_on_backup(), [GlobalRank(0)]);
    }
    for r in ranks {
        r.stop();
    }
    proxy.system.stop();
}
