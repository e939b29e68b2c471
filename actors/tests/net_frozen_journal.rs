//! A journal that does not answer (a frozen file system, a hung NFS server) or that fails (a
//! full disk) when an operation is admitted: the command is refused (`JOURNAL_FAILING`), none
//! of it runs, and the manager keeps answering its status, its losses and its stop meanwhile.
//! A uuid refused so is unknown afterwards: once the journal can be written, the same command
//! runs, once.

mod support;

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::{control_when_registered, spawn_proxy, start_rank, switch_on_node_0};
use taskd_actors::control::proto::RefusalKind;
use taskd_actors::control::{self, ClientError, ControlClient, ControlConfig, ControlServer};
use taskd_actors::journal::{JournalError, MemoryJournal, OperationJournal};
use taskd_actors::manager::Drain;
use taskd_actors::net::{ManagerNode, ManagerNodeConfig, NetConfig};
use taskd_actors::Manager;
use taskd_core::ledger::{AdmittedOperation, FinishedOperation};
use taskd_core::{GlobalRank, JobId, OperationId, PhaseDeadlines, RankTable, SwitchCommand};
use taskd_hal_mock::SoloLayout;

/// Heartbeats every 50 ms, a peer lost after 200 ms of silence.
fn net() -> NetConfig {
    NetConfig {
        heartbeat_interval: Duration::from_millis(50),
        missed_heartbeats: 4,
        backoff_initial: Duration::from_millis(20),
        ..NetConfig::default()
    }
}

/// How long the manager waits for a journal write.
const BOUND: Duration = Duration::from_millis(300);

/// The most a test waits for an answer the manager owes within [`BOUND`] (a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);

/// A journal in memory whose admissions block while it is frozen, and fail while it is full.
#[derive(Default)]
struct Disk {
    inner: MemoryJournal,
    frozen: Mutex<bool>,
    thawed: Condvar,
    full: AtomicBool,
    /// Every admission that reached the journal, in order.
    admitted: Mutex<Vec<OperationId>>,
}

impl Disk {
    fn freeze(&self, frozen: bool) {
        *self.frozen.lock() = frozen;
        self.thawed.notify_all();
    }
}

impl OperationJournal for Disk {
    fn load(&self) -> Vec<FinishedOperation> {
        self.inner.load()
    }
    fn interrupted(&self) -> Vec<AdmittedOperation> {
        self.inner.interrupted()
    }
    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError> {
        let mut frozen = self.frozen.lock();
        while *frozen {
            self.thawed.wait(&mut frozen);
        }
        drop(frozen);
        if self.full.load(Ordering::SeqCst) {
            return Err(JournalError::Write {
                path: "operations.json".into(),
                source: std::io::Error::from_raw_os_error(28),
            });
        }
        self.admitted.lock().push(op.id);
        self.inner.admit(op)
    }
    fn record(&self, op: FinishedOperation) -> Result<(), JournalError> {
        self.inner.record(op)
    }
    fn withdraw(&self, id: OperationId) -> Result<(), JournalError> {
        self.inner.withdraw(id)
    }
}

/// The manager (journal `disk`, bound [`BOUND`]) and its control API on an actix system of
/// their own; the manager's address and the proxy's.
fn start_manager(disk: Arc<Disk>) -> (ControlServer, actix::Addr<Manager>, String) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let cfg = ManagerNodeConfig {
                job: JobId("fj".into()),
                table: RankTable::uniform(1, 2),
                deadlines: PhaseDeadlines::default(),
                listen: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                net: net(),
            };
            let manager = Manager::new(cfg.job.clone(), cfg.table.clone(), cfg.deadlines)
                .with_journal_timeout(BOUND)
                .with_journal(disk);
            let m = ManagerNode::spawn_with(cfg, actix::Actor::start(manager))
                .await
                .unwrap();
            let ctl = control::serve(
                m.manager().clone(),
                ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId("fj".into())),
            )
            .unwrap();
            tx.send((ctl, m.manager().clone(), m.local_addr().to_string()))
                .unwrap();
            std::mem::forget(m);
        });
        sys.run().unwrap();
    });
    rx.recv().unwrap()
}

/// A proxy for node 0 on an actix system of its own; its workers' address.
fn start_proxy(manager: String) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let p = spawn_proxy("fj", manager, 0, net()).await;
            tx.send(p.local_addr().to_string()).unwrap();
            std::mem::forget(p);
        });
        sys.run().unwrap();
    });
    rx.recv().unwrap()
}

fn command(uuid: u128) -> SwitchCommand {
    SwitchCommand {
        id: Some(OperationId(uuid::Uuid::from_u128(uuid))),
        ..switch_on_node_0("fj", 0, true)
    }
}

/// Submits `cmd`; its refusal's kind and reason (panics when it is accepted, or when no
/// answer comes within [`PATIENCE`]).
fn refused(rt: &tokio::runtime::Runtime, c: &mut ControlClient, cmd: &SwitchCommand) -> String {
    let answer = rt.block_on(async { tokio::time::timeout(PATIENCE, c.submit(cmd)).await });
    match answer.expect("an answer within the bound") {
        Err(ClientError::Refused { kind, reason, .. }) => {
            assert_eq!(kind, RefusalKind::JournalFailing, "{reason}");
            reason
        }
        Err(e) => panic!("{e}"),
        Ok(s) => panic!("accepted ({}) though its admission was not written", s.uuid),
    }
}

/// Polls the status until `done` holds (at most [`PATIENCE`]).
fn until(
    rt: &tokio::runtime::Runtime,
    c: &mut ControlClient,
    what: &str,
    done: impl Fn(&taskd_actors::control::proto::JobStatus) -> bool,
) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let st = rt
            .block_on(async { tokio::time::timeout(PATIENCE, c.status("fj", 0)).await })
            .expect("the status answered within the bound")
            .unwrap();
        if done(&st) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {st:#?}");
        // A poll of the status, bounded by the deadline above.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_journal_that_does_not_answer_refuses_the_command_and_leaves_the_manager_answering() {
    let disk = Arc::new(Disk::default());
    let (ctl, manager, manager_addr) = start_manager(disk.clone());
    let proxy = start_proxy(manager_addr);
    let start = |r| start_rank("fj", r, &proxy, SoloLayout::new(1, 2), net());
    let mut ranks = vec![start(0), start(1)];
    let (rt, mut c) = control_when_registered(&ctl, "fj");

    disk.freeze(true);
    let reason = refused(&rt, &mut c, &command(1));
    assert!(reason.contains("has not finished"), "{reason}");
    // The write is still held: the manager answers, and says why nothing starts.
    let st = rt.block_on(c.status("fj", 0)).unwrap();
    assert!(st.journal_error.contains("has not finished"), "{st:#?}");
    assert!(st.in_flight.is_none(), "nothing runs: {st:#?}");
    assert!(st.ranks_on_backup.is_empty());
    // A second command is refused at once: nothing is handed to the journal behind the write
    // that has not returned.
    let started = std::time::Instant::now();
    refused(&rt, &mut c, &command(2));
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    // A lost rank is seen, and a stop is answered.
    ranks.pop().unwrap().stop();
    until(&rt, &mut c, "rank 1 lost", |st| {
        st.lost_ranks.iter().any(|l| l.rank == 1)
    });
    let drain = manager.send(Drain {
        reason: "test".into(),
    });
    let drained = rt.block_on(async { tokio::time::timeout(PATIENCE, drain).await });
    assert_eq!(drained.expect("the stop was answered").unwrap(), None);

    // The file system answers again: the admission lands, and its withdrawal after it.
    disk.freeze(false);
    let deadline = std::time::Instant::now() + PATIENCE;
    while disk.admitted.lock().is_empty() || !disk.interrupted().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            disk.interrupted()
        );
        // A poll of the journal, bounded by the deadline above.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        *disk.admitted.lock(),
        [OperationId(uuid::Uuid::from_u128(1))],
        "the second command never reached the journal"
    );
    assert!(ranks[0].solo.ranks_on_backup().is_empty(), "nothing ran");
    ranks.pop().unwrap().stop();
}

#[test]
fn an_admission_that_cannot_be_written_is_refused_and_runs_nothing() {
    let disk = Arc::new(Disk::default());
    let (ctl, _manager, manager_addr) = start_manager(disk.clone());
    let proxy = start_proxy(manager_addr);
    let start = |r| start_rank("fj", r, &proxy, SoloLayout::new(1, 2), net());
    let ranks = [start(0), start(1)];
    let (rt, mut c) = control_when_registered(&ctl, "fj");

    disk.full.store(true, Ordering::SeqCst);
    let reason = refused(&rt, &mut c, &command(7));
    assert!(reason.contains("operations.json"), "{reason}");
    let st = rt.block_on(c.status("fj", 0)).unwrap();
    assert!(st.in_flight.is_none(), "nothing runs: {st:#?}");
    assert!(!st.journal_error.is_empty(), "{st:#?}");
    assert!(disk.interrupted().is_empty() && disk.load().is_empty());
    for r in &ranks {
        assert!(r.solo.ranks_on_backup().is_empty(), "nothing ran");
    }

    // Space again: the same uuid is a new command, admitted durably, run once.
    disk.full.store(false, Ordering::SeqCst);
    let op = rt.block_on(c.submit(&command(7))).expect("admitted now");
    assert!(!op.known, "it never ran");
    let r = rt.block_on(op.result()).unwrap();
    assert_eq!(r.result, "succeeded", "{r:#?}");
    assert_eq!(
        *disk.admitted.lock(),
        [OperationId(uuid::Uuid::from_u128(7))]
    );
    for r in &ranks {
        assert_eq!(r.solo.ranks_on_backup(), [GlobalRank(0)]);
    }
    for r in ranks {
        r.stop();
    }
}
