//! A hung rank, with HCCL's watchdog off (`TSP:1`): the training loops of a job stop
//! finishing steps (a collective that never completes blocks every member), the workers' hang
//! watches say so, and with process recovery the manager restarts the whole job once; the
//! new processes train and switch. Ends with the invariant: every group agrees on its NICs.

mod common;

use common::{cmd, status_until, WAIT};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;
use taskd::actors::proxy::LauncherOrder;
use taskd::actors::{LocalJob, LocalJobConfig, LocalJobOptions, NodeLaunchers, RankParts};
use taskd::core::ledger::{ProcessRecovery, StopBy};
use taskd::core::operation::{JobState, Outcome};
use taskd::core::{GlobalRank, JobId, NodeHal, PhaseDeadlines, RankHal, RankTable, StepOutcome};
use taskd::hal_mock::{Fabric, FabricConfig};

/// The hang watch's timeout in this test: short, so the test is quick; the default is HCCL's
/// execution timeout.
const HANG_TIMEOUT: Duration = Duration::from_millis(150);

fn ranks(fabric: &Arc<Fabric>) -> Vec<RankParts> {
    (0..2)
        .map(|r| RankParts {
            hal: Box::new(fabric.rank_hal(GlobalRank(r))) as Box<dyn RankHal>,
            tsp: true,
        })
        .collect()
}

/// Rank `rank`'s training loop on `fabric`: each step an all-reduce in each of its groups,
/// then the gate, until the gate stops it or a collective fails (a peer's process was
/// killed). With `hang_before`, the rank hangs before that step's collectives (its peers then
/// wait in them) until `released` is set, then goes on. Returns the last step it finished.
/// The one node's job of two ranks on `fabric`, every rank registered.
fn start(fabric: &Arc<Fabric>, options: LocalJobOptions) -> LocalJob {
    let job = LocalJob::start_with(
        LocalJobConfig {
            job: JobId("sim".into()),
            table: RankTable::uniform(1, 2),
            deadlines: PhaseDeadlines::default(),
        },
        options,
        vec![Box::new(fabric.node_hal(0)) as Box<dyn NodeHal>],
        ranks(fabric),
    )
    .unwrap();
    job.wait_registered(WAIT).unwrap();
    job
}

fn train(
    job: &LocalJob,
    fabric: &Arc<Fabric>,
    rank: u32,
    hang_before: Option<u64>,
    released: Arc<AtomicBool>,
) -> JoinHandle<u64> {
    let gate = job.gate(GlobalRank(rank));
    let fabric = fabric.clone();
    std::thread::spawn(move || {
        let groups = fabric.groups_of(GlobalRank(rank));
        let mut step = 0;
        loop {
            if hang_before == Some(step + 1) {
                while !released.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(5));
                }
            }
            for g in &groups {
                if fabric.all_reduce(&g.name, GlobalRank(rank), 1.0).is_err() {
                    return step;
                }
            }
            step += 1;
            if let StepOutcome::Stop(_) = gate.step_completed(step) {
                return step;
            }
        }
    })
}

/// Ends the test's job: training stops, every group agrees on its NICs, the processes'
/// communicators go away (a loop waiting in a collective for a peer that stopped returns).
/// The last step each loop finished.
fn end(
    job: LocalJob,
    fabric: &Arc<Fabric>,
    loops: impl IntoIterator<Item = JoinHandle<u64>>,
) -> Vec<u64> {
    job.stop_training("end of the test").unwrap();
    let c = fabric.check_consistency();
    assert!(c.is_consistent(), "groups disagree: {c}");
    fabric.shutdown();
    let last = loops.into_iter().map(|l| l.join().unwrap()).collect();
    job.shutdown();
    last
}

#[test]
fn a_hung_collective_restarts_the_job_once_and_the_new_processes_train_and_switch() {
    let fabric = Fabric::new(FabricConfig::new(1, 2));
    let (orders_tx, orders) = mpsc::channel();
    let orders_tx = parking_lot::Mutex::new(orders_tx);
    let launchers: NodeLaunchers = Arc::new(move |node, order| {
        let _ = orders_tx.lock().send((node, order));
    });
    let job = start(
        &fabric,
        LocalJobOptions {
            process_recovery: Some(ProcessRecovery { max_restarts: 2 }),
            launchers: Some(launchers),
            hang_timeout: Some(HANG_TIMEOUT),
            ..LocalJobOptions::default()
        },
    );

    // Both loops finish 5 steps; rank 0 hangs before step 6's collectives, and rank 1 waits in
    // them for good.
    let released = Arc::new(AtomicBool::new(false));
    let hung = [
        train(&job, &fabric, 0, Some(6), released.clone()),
        train(&job, &fabric, 1, None, released.clone()),
    ];

    // The manager restarts the job: the node's launcher is ordered restart 1, once.
    let (node, order) = orders.recv_timeout(WAIT).expect("a launcher order");
    let LauncherOrder::Restart { number, reason } = order else {
        panic!("expected a restart, got {order:?}");
    };
    assert_eq!((node, number), (0, 1));
    assert!(
        reason.contains("hung") && reason.contains("after step 5"),
        "{reason}"
    );
    let s = job.status(0).unwrap();
    let stop = s.training_stop.expect("the stop is under way");
    assert_eq!(stop.by, StopBy::Fault);
    assert!(
        s.stalled_ranks.is_empty(),
        "the stop ends the stalled processes: {:?}",
        s.stalled_ranks
    );
    assert_eq!(s.restarts.done, 1);

    // The launcher kills the hung processes and starts new ones (new communicators: a new
    // fabric), which train.
    fabric.kill_rank(GlobalRank(0));
    released.store(true, Ordering::Release);
    for h in hung {
        assert_eq!(
            h.join().unwrap(),
            5,
            "the hung loops finished no step after 5"
        );
    }
    let fabric = Fabric::new(FabricConfig::new(1, 2));
    job.restart_ranks(ranks(&fabric), WAIT).unwrap();
    job.wait_registered(WAIT).unwrap();
    let never = Arc::new(AtomicBool::new(false));
    let trainers: Vec<_> = (0..2)
        .map(|r| train(&job, &fabric, r, None, never.clone()))
        .collect();
    let r = job.run(cmd(&[("node-0", 1, true)])).unwrap();
    assert_eq!(
        (r.outcome, r.job_state),
        (Outcome::Succeeded, JobState::Running),
        "{r}"
    );
    let s = job.status(0).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.restarts.done, 1, "one restart for both hung ranks");
    let last = s.last_training_stop.expect("the stop ended");
    assert!(last.reason.contains("hung"), "{}", last.reason);
    assert!(orders.try_recv().is_err(), "no second order");

    end(job, &fabric, trainers);
}

/// Polls the manager's status until `until` holds (bounded by [`WAIT`]).
#[test]
fn without_process_recovery_hung_ranks_are_shown_until_they_step_again() {
    let fabric = Fabric::new(FabricConfig::new(1, 2));
    let job = start(
        &fabric,
        LocalJobOptions {
            hang_timeout: Some(HANG_TIMEOUT),
            ..LocalJobOptions::default()
        },
    );
    let released = Arc::new(AtomicBool::new(false));
    let loops = [
        train(&job, &fabric, 0, Some(4), released.clone()),
        train(&job, &fabric, 1, None, released.clone()),
    ];
    let s = status_until(&job, |s| s.stalled_ranks.len() == 2);
    assert!(
        s.stalled_ranks.iter().all(|h| h.last_step == 3),
        "{:?}",
        s.stalled_ranks
    );
    assert!(s
        .stalled_ranks
        .iter()
        .all(|h| h.stalled_for >= HANG_TIMEOUT));
    assert_eq!(s.state, JobState::Running, "nothing restarts the job");
    assert!(s.restart_owed.is_none() && s.training_stop.is_none());

    // Rank 0 was slow, not dead: it comes back, both loops step again, and the stall is over.
    released.store(true, Ordering::Release);
    status_until(&job, |s| s.stalled_ranks.is_empty());
    let r = job.run(cmd(&[("node-0", 0, true)])).unwrap();
    assert_eq!(
        (r.outcome, r.job_state),
        (Outcome::Succeeded, JobState::Running),
        "{r}"
    );
    let last = end(job, &fabric, loops);
    assert!(last.iter().all(|s| *s > 3), "{last:?}");
}
