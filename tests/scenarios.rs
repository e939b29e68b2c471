//! Whole operations through the actors on the simulated fabric. Every test ends with the
//! invariant: every communication group agrees on its NIC configuration (or, where a failure
//! leaves the job paused, training never ran on a group that disagreed).

mod common;

use common::{assert_consistent_end, await_armed, cmd, deadlines, ranks, small};
use std::collections::BTreeMap;
use std::time::Duration;
use taskd::actors::manager::Submission;
use taskd::actors::{LocalJobError, RecoveryResult};
use taskd::core::ledger::RecoverTo;
use taskd::core::operation::{JobState, OperationError, OperationReport, Outcome};
use taskd::core::{
    DeviceId, GlobalRank, HcclCode, JobId, OperationId, SubmitError, SwitchCommand, ValidationError,
};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{SimConfig, Simulation};

fn run(sim: &Simulation, c: SwitchCommand) -> OperationReport {
    sim.job().run(c).expect("the command is admitted")
}

#[test]
fn switch_to_backup_and_back_on_several_nodes() {
    let sim = Simulation::start(&SimConfig {
        nodes: 3,
        ..small()
    })
    .unwrap();
    let to_backup = cmd(&[
        ("node-0", 1, true),
        ("node-2", 0, true),
        ("node-2", 3, true),
    ]);
    let r = run(&sim, to_backup);
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert!(r.applied && !r.rolled_back && r.error.is_none());
    assert_eq!(r.job_state, JobState::Running);
    let t = r.pause_step.expect("every rank paused");
    assert!(r.phases.pause.is_some() && r.phases.switch.is_some() && r.phases.resume.is_some());
    assert!(r.phases.rollback.is_none());
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[1, 8, 11]));
    assert!(sim.fabric().check_consistency().is_consistent());
    // Training went on after the pause step.
    sim.train(2).unwrap();
    assert!(sim.training().min_steps() >= t + 2);

    let back = cmd(&[
        ("node-0", 1, false),
        ("node-2", 0, false),
        ("node-2", 3, false),
    ]);
    let r = run(&sim, back);
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[]));
    let status = sim.job().status(10).unwrap();
    assert_eq!(status.recent.len(), 2);
    assert!(status.ranks_on_backup.is_empty());
    sim.train(1).unwrap();
    let end = sim.finish();
    assert_consistent_end(&end);
    assert!(end.violations.is_empty(), "{:?}", end.violations);
}

#[test]
fn a_mixed_command_moves_some_ranks_each_way() {
    let sim = Simulation::start(&small()).unwrap();
    let r = run(&sim, cmd(&[("node-0", 0, true), ("node-1", 2, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    // node-0:0 back to primary, node-0:2 and node-1:1 to backup, node-1:2 stays on backup.
    let r = run(
        &sim,
        cmd(&[
            ("node-0", 0, false),
            ("node-0", 2, true),
            ("node-1", 1, true),
        ]),
    );
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(r.direction.as_str(), "mixed");
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[2, 5, 6]));
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_hal_failure_rolls_back_and_training_resumes() {
    let sim = Simulation::start(&small()).unwrap();
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(5), NicSetFault::Fail(HcclCode::Network));
    let r = run(&sim, cmd(&[("node-1", 0, true), ("node-1", 2, true)]));
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.rolled_back && !r.applied);
    assert_eq!(r.job_state, JobState::Running);
    match &r.error {
        Some(OperationError::RankFailed { rank, error, .. }) => {
            assert_eq!(*rank, GlobalRank(5));
            assert_eq!(error.hal.as_ref().unwrap().hccl(), Some(HcclCode::Network));
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(r.phases.rollback.is_some());
    assert!(sim.fabric().ranks_on_backup().is_empty());
    sim.train(3).unwrap();
    // The job is usable again: the same switch now succeeds.
    let r = run(&sim, cmd(&[("node-1", 0, true), ("node-1", 2, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[4, 6]));
    let end = sim.finish();
    assert_consistent_end(&end);
}

/// Rank 1 hangs in its switch call past the switch deadline: a rollback call now would pair with
/// its late call on some group, so the operation ends paused without calling HCCL again, and a
/// recovery waits until rank 1 has answered.
#[test]
fn a_hang_past_the_switch_deadline_ends_paused_and_recovery_waits_for_the_late_call() {
    let mut cfg = small();
    cfg.deadlines.switch = Duration::from_millis(150);
    let sim = Simulation::start(&cfg).unwrap();
    sim.fabric().inject_nic_set_fault(
        GlobalRank(1),
        NicSetFault::Hang {
            duration: Duration::from_millis(600),
            code: HcclCode::Timeout,
        },
    );
    let calls_before = sim.fabric().nic_set_log().len();
    let r = run(&sim, cmd(&[("node-0", 0, true)]));
    assert_eq!(r.outcome, Outcome::Failed, "{r}");
    assert!(
        matches!(
            r.error,
            Some(OperationError::Timeout {
                phase: taskd::core::protocol::Phase::Switch,
                ..
            })
        ),
        "{r}"
    );
    assert!(!r.rolled_back && r.phases.rollback.is_none(), "{r}");
    assert_eq!(r.job_state, JobState::Paused);
    // The operation ended at its 150 ms deadline; rank 1 hangs for 600 ms from its call and
    // answers only after that: the status names it among the ranks inside the calls.
    let (op, in_calls) = sim
        .job()
        .status(0)
        .unwrap()
        .in_calls
        .expect("ranks are inside the switch's calls");
    assert_eq!(op, r.id);
    assert!(in_calls.contains(&GlobalRank(1)), "{in_calls:?}");
    // The recovery re-states rank 0 once rank 1's calls are over; nothing else ran meanwhile.
    let rec = common::recover_when_calls_answered(&sim, RecoverTo::Primary);
    assert_eq!(sim.job().status(0).unwrap().in_calls, None);
    let RecoveryResult::Operation(rec) = rec else {
        panic!("rank 0 is in doubt: {rec:?}");
    };
    assert_eq!(rec.outcome, Outcome::Succeeded, "{rec}");
    assert!(sim.fabric().nic_set_log().len() > calls_before);
    assert!(
        sim.fabric().violations().is_empty(),
        "{:?}",
        sim.fabric().violations()
    );
    sim.job().wait_registered(common::WAIT).unwrap();
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Running);
    sim.train(2).unwrap();
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_hang_past_the_rollback_deadline_keeps_the_job_paused() {
    let mut cfg = small();
    cfg.deadlines = deadlines(Duration::from_millis(5_000));
    cfg.deadlines.rollback = Duration::from_millis(100);
    let sim = Simulation::start(&cfg).unwrap();
    // Rank 1 makes two calls per switch (tp_0, world): the first fails, so every rank answers
    // and the rollback goes out; there rank 1's first call hangs past the rollback deadline.
    let f = sim.fabric();
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Fail(HcclCode::Network));
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::ZERO));
    f.inject_nic_set_fault(
        GlobalRank(1),
        NicSetFault::Hang {
            duration: Duration::from_millis(600),
            code: HcclCode::Timeout,
        },
    );
    let r = run(&sim, cmd(&[("node-0", 0, true)]));
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(!r.rolled_back);
    assert_eq!(r.job_state, JobState::Paused, "{r}");
    assert!(
        matches!(
            r.rollback_error,
            Some(OperationError::Timeout {
                phase: taskd::core::protocol::Phase::Rollback,
                ..
            })
        ),
        "{r}"
    );
    // A paused job refuses new commands until an operator steps in.
    let e = sim.job().run(cmd(&[("node-0", 2, true)])).unwrap_err();
    assert!(matches!(
        e,
        LocalJobError::Refused(SubmitError::NotRunning {
            state: JobState::Paused
        })
    ));
    let end = sim.finish();
    // The truthful state: the job stayed paused, so no collective ran while groups disagreed.
    assert_eq!(end.job_state, JobState::Paused);
    assert_eq!(end.collectives_on_inconsistent_groups, 0);
}

#[test]
fn every_validation_error_is_typed_and_changes_nothing() {
    let sim = Simulation::start(&SimConfig {
        tsp_off: vec![],
        ..small()
    })
    .unwrap();
    let calls_before = sim.fabric().nic_set_log().len();
    let refused = |c: SwitchCommand| match sim.job().submit(c) {
        Err(LocalJobError::Refused(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut wrong_job = cmd(&[("node-0", 0, true)]);
    wrong_job.job = JobId("other".into());
    assert!(matches!(refused(wrong_job), SubmitError::UnknownJob { .. }));
    assert_eq!(
        refused(cmd(&[])),
        SubmitError::Invalid(ValidationError::NoTargets)
    );
    let e = refused(cmd(&[("node-7", 0, true)]));
    assert!(e.to_string().contains("node-7"), "{e}");
    assert!(matches!(
        e,
        SubmitError::Invalid(ValidationError::UnknownNode { .. })
    ));
    let e = refused(cmd(&[("node-1", 4, true)]));
    assert!(matches!(
        e,
        SubmitError::Invalid(ValidationError::UnknownDevice {
            device: DeviceId(4),
            ..
        })
    ));
    let e = refused(cmd(&[("node-1", 1, true), ("node-1", 1, false)]));
    assert!(matches!(
        e,
        SubmitError::Invalid(ValidationError::ConflictingTarget {
            rank: GlobalRank(5),
            ..
        })
    ));
    // ClusterD's form: dev and op lists of different lengths.
    let mut ops = BTreeMap::new();
    ops.insert(
        "node-0".to_string(),
        (vec!["0".to_string()], vec![true, false]),
    );
    assert!(matches!(
        SwitchCommand::from_nic_ops(JobId("sim".into()), None, &ops),
        Err(ValidationError::LengthMismatch {
            devs: 1,
            ops: 2,
            ..
        })
    ));
    // Nothing ran, nothing changed.
    assert_eq!(sim.fabric().nic_set_log().len(), calls_before);
    assert!(sim.job().status(10).unwrap().recent.is_empty());
    assert!(sim.fabric().ranks_on_backup().is_empty());

    // A worker that is gone: not every expected worker is registered.
    sim.job().kill_worker(GlobalRank(7));
    sim.job()
        .wait_registered_count(Some(7), Duration::from_secs(10))
        .unwrap();
    let e = refused(cmd(&[("node-0", 0, true)]));
    assert!(
        matches!(&e, SubmitError::WorkersMissing { registered: 7, expected: 8, missing } if missing == "7"),
        "{e}"
    );
    assert_eq!(sim.fabric().nic_set_log().len(), calls_before);
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_rank_without_tsp_is_refused() {
    let sim = Simulation::start(&SimConfig {
        tsp_off: vec![GlobalRank(3)],
        ..small()
    })
    .unwrap();
    let e = sim.job().submit(cmd(&[("node-0", 0, true)])).unwrap_err();
    assert!(
        matches!(&e, LocalJobError::Refused(SubmitError::CapabilityMissing { ranks, missing })
            if ranks == "3" && missing.contains("TSP:1")),
        "{e}"
    );
    assert!(sim.fabric().nic_set_log().is_empty());
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn l2_retry_off_is_caught_not_silently_succeeded() {
    let sim = Simulation::start(&SimConfig {
        l2_retry_off: vec![GlobalRank(6)],
        ..small()
    })
    .unwrap();
    let e = sim.job().submit(cmd(&[("node-1", 2, true)])).unwrap_err();
    assert!(
        matches!(&e, LocalJobError::Refused(SubmitError::CapabilityMissing { ranks, missing })
            if ranks == "6" && missing.contains("HCCL_OP_RETRY_ENABLE")),
        "{e}"
    );
    assert!(sim.fabric().nic_set_log().is_empty());
    assert!(sim.fabric().ranks_on_backup().is_empty());
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_repeated_uuid_returns_the_known_result_and_never_runs_twice() {
    let sim = Simulation::start(&small()).unwrap();
    let id = OperationId(uuid::Uuid::from_u128(42));
    let mut c = cmd(&[("node-0", 3, true)]);
    c.id = Some(id);
    let first = run(&sim, c.clone());
    assert_eq!(first.outcome, Outcome::Succeeded, "{first:?}");
    let calls = sim.fabric().nic_set_log().len();
    match sim.job().submit(c).unwrap() {
        Submission::Known(r) => assert_eq!(*r, first),
        other => panic!("expected the known result, got {other:?}"),
    }
    assert_eq!(sim.fabric().nic_set_log().len(), calls);
    assert_eq!(sim.job().status(10).unwrap().recent.len(), 1);
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_second_command_while_one_is_in_flight_is_busy() {
    let sim = Simulation::start(&small()).unwrap();
    // Keep the first operation in its switch phase for a while.
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(0), NicSetFault::Slow(Duration::from_millis(300)));
    let first = sim.job().submit(cmd(&[("node-0", 0, true)])).unwrap();
    let Submission::Started(id) = first else {
        panic!("expected a new operation, got {first:?}");
    };
    let e = sim.job().submit(cmd(&[("node-1", 0, true)])).unwrap_err();
    assert!(
        matches!(e, LocalJobError::Refused(SubmitError::Busy { in_flight }) if in_flight == id),
        "{e}"
    );
    // The same id again is not "busy": it is the operation in flight.
    let mut again = cmd(&[("node-0", 0, true)]);
    again.id = Some(id);
    assert_eq!(sim.job().submit(again).unwrap(), Submission::InFlight(id));
    let r = sim.job().wait(id).unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[0]));
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn switching_onto_a_down_link_is_rejected_before_anything_changes() {
    let sim = Simulation::start(&small()).unwrap();
    // node-1:2's backup NIC is the port of its partner die, node-1:3.
    sim.fabric().set_link(1, DeviceId(3), false);
    let r = run(&sim, cmd(&[("node-1", 2, true)]));
    assert_eq!(r.outcome, Outcome::Rejected, "{r}");
    assert!(matches!(
        r.error,
        Some(OperationError::LinkDown {
            rank: GlobalRank(6),
            ..
        })
    ));
    assert_eq!(r.job_state, JobState::Running);
    assert!(sim.fabric().nic_set_log().is_empty());
    sim.fabric().set_link(1, DeviceId(3), true);
    sim.train(1).unwrap();
    let end = sim.finish();
    assert_consistent_end(&end);
}

#[test]
fn a_worker_lost_mid_operation_fails_it_and_asks_for_recovery() {
    let sim = Simulation::start(&small()).unwrap();
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(2), NicSetFault::Slow(Duration::from_millis(200)));
    let sub = sim.job().submit(cmd(&[("node-0", 2, true)])).unwrap();
    // The process of rank 6 dies: HCCL sees it gone and its worker's connection closes.
    sim.fabric().kill_rank(GlobalRank(6));
    sim.job().kill_worker(GlobalRank(6));
    let r = sim.job().wait(sub.id()).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r}");
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    assert_eq!(r.lost_ranks, ranks(&[6]));
    assert!(matches!(
        r.error,
        Some(OperationError::WorkerLost {
            rank: GlobalRank(6),
            ..
        })
    ));
    let end = sim.finish();
    assert_eq!(end.job_state, JobState::NeedsRecovery);
    assert_eq!(end.collectives_on_inconsistent_groups, 0);
}

#[test]
fn a_failed_swap_of_two_partner_dies_rolls_back_cleanly() {
    // Without evaluations: an operator first issued between the two operations would be left
    // split by this rollback (see the next test); here only the training operator runs.
    let sim = Simulation::start(&SimConfig {
        eval_every: 0,
        ..small()
    })
    .unwrap();
    let r = run(&sim, cmd(&[("node-0", 0, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    // Both dies of NPU 0 to backup: they swap ports. Rank 3 fails its first call.
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(3), NicSetFault::Fail(HcclCode::Internal));
    let r = run(&sim, cmd(&[("node-0", 0, true), ("node-0", 1, true)]));
    assert_eq!(r.outcome, Outcome::Failed, "{r}");
    // The rollback re-states only rank 1 (rank 0 was already on backup), so it never tells
    // the two dies opposite sides in one call.
    assert!(r.rolled_back, "{r:?}");
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[0]));
    // Opposite sides for the two dies in one command are refused up front.
    let e = sim
        .job()
        .submit(cmd(&[("node-0", 0, false), ("node-0", 1, true)]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            LocalJobError::Refused(SubmitError::Invalid(
                ValidationError::PartnerConflict { .. }
            ))
        ),
        "{e}"
    );
    let end = sim.finish();
    assert_consistent_end(&end);
    assert!(end.violations.is_empty(), "{:?}", end.violations);
}

/// HCCL applies a NIC set to the operators a group issued so far. Operation 2 re-lists rank 0
/// (already on backup) with its partner; rank 3's call fails and the others apply, so an
/// operator first issued between the two operations has rank 0 on its backup NIC on every
/// member except rank 3. The rollback puts rank 1 back, and re-states rank 0 on its backup NIC
/// in a second call (telling the two dies opposite sides in one call is refused): every
/// member's operators agree again.
#[test]
fn a_rollback_restates_an_unchanged_target_so_no_operator_is_left_split() {
    // An evaluation every step: every step between the operations issues a new operator.
    let sim = Simulation::start(&SimConfig {
        eval_every: 1,
        ..small()
    })
    .unwrap();
    let r = run(&sim, cmd(&[("node-0", 0, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    sim.train(2).unwrap();
    let fabric = sim.fabric().clone();
    assert!(
        fabric.check_consistency().is_consistent(),
        "new operators alone split nothing"
    );
    assert!(fabric.collectives_on_default_nic() >= 2);
    let calls_before = fabric.nic_set_log().len();
    fabric.inject_nic_set_fault(GlobalRank(3), NicSetFault::Fail(HcclCode::Internal));
    let r = run(&sim, cmd(&[("node-0", 0, true), ("node-0", 1, true)]));
    assert_eq!((r.outcome, r.rolled_back), (Outcome::Failed, true), "{r}");
    let report = fabric.check_consistency();
    assert!(report.is_consistent(), "{report}");
    // Rank 3 re-stated rank 0 alone, after the call that put rank 1 back.
    let restated: Vec<_> = fabric.nic_set_log()[calls_before..]
        .iter()
        .filter(|c| c.rank == GlobalRank(3) && c.group == taskd::hal_mock::WORLD_GROUP)
        .map(|c| (c.ranks.clone(), c.use_backup.clone()))
        .collect();
    assert_eq!(restated.len(), 3, "switch, rollback, restate: {restated:?}");
    assert_eq!(restated[2].1, vec![true], "{restated:?}");
    assert_eq!(fabric.ranks_on_backup(), ranks(&[0]));
    sim.train(2).unwrap();
    let end = sim.finish();
    assert_eq!(end.collectives_on_inconsistent_groups, 0);
    assert_eq!(end.ranks_on_backup, end.manager_on_backup);
    assert_consistent_end(&end);
}

/// Ranks one step apart when the pause is requested: rank 1 has finished step 5 and waits in
/// step 6's all-reduce for rank 0, which has not yet reached its boundary after step 5. A
/// "stop at your next boundary" protocol would hold rank 0 after 5 while rank 1 can never
/// finish 6: a deadlock. Rank 1 answers although its training thread is blocked; the two-phase
/// pause picks T = 6 and both ranks hold after it.
#[test]
fn a_pause_requested_while_ranks_are_a_step_apart_completes_without_deadlock() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use taskd::actors::{LocalJob, LocalJobConfig, RankParts};
    use taskd::core::{NodeHal, RankHal, RankTable, StepBoundary};
    use taskd::hal_mock::{Fabric, FabricConfig};

    let fabric = Fabric::new(FabricConfig::new(1, 2));
    let job = LocalJob::start(
        LocalJobConfig {
            job: JobId("sim".into()),
            table: RankTable::uniform(1, 2),
            deadlines: deadlines(Duration::from_millis(10_000)),
        },
        vec![Box::new(fabric.node_hal(0)) as Box<dyn NodeHal>],
        (0..2)
            .map(|r| RankParts {
                hal: Box::new(fabric.rank_hal(GlobalRank(r))) as Box<dyn RankHal>,
                tsp: true,
            })
            .collect(),
    )
    .unwrap();
    job.wait_registered(Duration::from_secs(10)).unwrap();

    // Rank 0 stops before its boundary after step 5 until the test opens this latch.
    let latch = Arc::new((Mutex::new((false, false)), Condvar::new())); // (arrived, open)
                                                                        // Every rank stops after step 10 (past the pause at 7), so nobody is left in a collective.
    let stop_after = Arc::new(AtomicU64::new(10));
    let trainers: Vec<_> = (0..2u32)
        .map(|r| {
            let fabric = fabric.clone();
            let gate = job.gate(GlobalRank(r));
            let latch = latch.clone();
            let stop_after = stop_after.clone();
            std::thread::spawn(move || {
                let groups = fabric.groups_of(GlobalRank(r));
                let mut step = 0;
                while step < stop_after.load(Ordering::Acquire) {
                    step += 1;
                    for g in &groups {
                        fabric.all_reduce(&g.name, GlobalRank(r), 1.0).unwrap();
                    }
                    if r == 0 && step == 5 {
                        let (m, cv) = &*latch;
                        let mut st = m.lock().unwrap();
                        st.0 = true;
                        cv.notify_all();
                        while !st.1 {
                            st = cv.wait(st).unwrap();
                        }
                    }
                    assert!(!StepBoundary::step_completed(&*gate, step).is_stop());
                }
                step
            })
        })
        .collect();

    // Wait until rank 0 sits before its boundary and rank 1 waits in step 6's collective.
    {
        let (m, cv) = &*latch;
        let mut st = m.lock().unwrap();
        while !st.0 {
            st = cv.wait(st).unwrap();
        }
    }
    // Rank 1 completed step 5 (its gate published it) before it joined step 6's collective. A
    // member is listed as waiting until its call returns, even in a round already complete,
    // so the listing alone could still be step 5's.
    let gate1 = job.gate(GlobalRank(1));
    assert!(fabric.wait_activity(Duration::from_secs(10), |a| {
        gate1.last_step() == Some(5)
            && a.waiting_in_collective
                .iter()
                .any(|(_, r)| *r == GlobalRank(1))
    }));

    let sub = job.submit(cmd(&[("node-0", 1, true)])).unwrap();
    // Both workers armed their gates (the sample request reached them).
    for r in 0..2 {
        await_armed(&job, r);
    }
    {
        let (m, cv) = &*latch;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    }
    let r = job.wait(sub.id()).unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    // Rank 0 was still in step 5, rank 1 already in step 6: they paused after 6.
    assert_eq!(r.sampled_steps, Some((5, 6)));
    assert_eq!(r.pause_step, Some(6));

    // Both train on in the new configuration up to the common last step.
    let steps: Vec<u64> = trainers.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(steps, vec![10, 10]);
    job.shutdown();
    assert!(fabric.check_consistency().is_consistent());
    assert_eq!(fabric.ranks_on_backup(), ranks(&[1]));
    assert_eq!(fabric.collectives_on_inconsistent_groups(), 0);
    assert!(fabric.violations().is_empty(), "{:?}", fabric.violations());
}

#[test]
fn progress_events_follow_the_operation_phase_by_phase() {
    use taskd::actors::ProgressKind;
    let sim = Simulation::start(&small()).unwrap();
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(1), NicSetFault::Fail(HcclCode::Network));
    let mut events = Vec::new();
    let report = sim
        .job()
        .run_with_progress(cmd(&[("node-0", 1, true)]), |e| events.push(e.clone()))
        .unwrap();
    assert_eq!(report.outcome, Outcome::Failed, "{report}");
    assert!(report.rolled_back);

    assert!(
        matches!(&events[0].kind, ProgressKind::Started { ranks: 8, targets, .. } if targets.len() == 1)
    );
    assert_eq!(
        events.last().unwrap().report(),
        Some(&report),
        "the report is last"
    );
    assert!(events.iter().all(|e| e.op == report.id));
    assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
    let steps: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            ProgressKind::PhaseStarted { phase, .. } => Some(format!("+{phase}")),
            ProgressKind::PhaseFinished { phase, .. } => Some(format!("-{phase}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        [
            "+sample",
            "-sample",
            "+pause",
            "-pause",
            "+switch",
            "-switch",
            "+rollback",
            "-rollback",
            "+resume",
            "-resume"
        ]
    );
    // Within a phase the count of ranks still to answer only goes down.
    let mut waiting = usize::MAX;
    for e in &events {
        match &e.kind {
            ProgressKind::PhaseStarted { waiting: w, .. } => waiting = *w,
            ProgressKind::Waiting { waiting: w, .. } => {
                assert!(*w < waiting, "{events:#?}");
                waiting = *w;
            }
            _ => {}
        }
    }
    assert_consistent_end(&sim.finish());
}

/// HCCL keeps a NIC set for the operators issued before it; the training loop's evaluations
/// (each a new operator) run on the default NIC while ranks are switched. That is no
/// disagreement: every member issued them alike, the invariant holds, and they are counted.
#[test]
fn evaluations_after_a_switch_run_on_the_default_nic_and_every_group_stays_consistent() {
    let sim = Simulation::start(&SimConfig {
        eval_every: 2,
        ..small()
    })
    .unwrap();
    sim.train(4).unwrap();
    assert_eq!(
        sim.fabric().collectives_on_default_nic(),
        0,
        "nothing switched yet"
    );
    let r = run(&sim, cmd(&[("node-1", 0, true), ("node-1", 1, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    sim.train(6).unwrap();
    let while_switched = sim.fabric().collectives_on_default_nic();
    assert!(while_switched >= 2, "{while_switched}");
    assert!(sim.fabric().check_consistency().is_consistent());
    let r = run(&sim, cmd(&[("node-1", 0, false), ("node-1", 1, false)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    sim.train(6).unwrap();
    // Switched back: new operators and old ones use the same (default) NIC again. At most the
    // evaluation of the step the pause held after ran before the switch back.
    assert!(sim.fabric().collectives_on_default_nic() <= while_switched + 1);
    let end = sim.finish();
    assert_consistent_end(&end);
    assert_eq!(end.collective_failures, 0);
    assert!(end.violations.is_empty(), "{:?}", end.violations);
}

/// What an operator meets who moves traffic off a NIC for maintenance: once the port is down,
/// every collective of an operator issued before the switch keeps running on the backup NIC,
/// but a new operator (an evaluation) runs on the default NIC and fails there. taskd cannot
/// move it: HCCL offers no call to set the NIC of operators issued later.
#[test]
fn maintenance_on_a_switched_nic_fails_only_operators_first_issued_after_the_switch() {
    let sim = Simulation::start(&SimConfig {
        eval_every: 2,
        ..small()
    })
    .unwrap();
    let r = run(&sim, cmd(&[("node-1", 2, true)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    // Maintenance takes node-1/dev-2's port down.
    sim.fabric().set_link(1, DeviceId(2), false);
    sim.train(6).unwrap();
    let failures = sim.training().collective_failures();
    let on_default = sim.fabric().collectives_on_default_nic();
    assert!(on_default >= 2, "{on_default}");
    // Each evaluation failed on every one of the world group's 8 members; training did not.
    assert_eq!(failures % 8, 0, "{failures}");
    assert!(
        failures >= 8 * (on_default - 1),
        "{failures} failures, {on_default} on default"
    );
    assert!(sim.fabric().check_consistency().is_consistent());
    // Switching back onto the port that is down is refused.
    let r = run(&sim, cmd(&[("node-1", 2, false)]));
    assert_eq!(r.outcome, Outcome::Rejected, "{r}");
    assert!(
        matches!(r.error, Some(OperationError::LinkDown { .. })),
        "{r:?}"
    );
    sim.fabric().set_link(1, DeviceId(2), true);
    let r = run(&sim, cmd(&[("node-1", 2, false)]));
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    let end = sim.finish();
    assert_consistent_end(&end);
    assert!(end.violations.is_empty(), "{:?}", end.violations);
}

/// HCCL switches a die only when both dies of its NPU are visible to the job: a die whose
/// partner is not in the job's rank table is refused at submission, naming both, and nothing
/// runs.
#[test]
fn a_die_whose_partner_is_not_in_the_job_is_refused_naming_both() {
    let sim = Simulation::start(&SimConfig {
        devices_per_node: 3,
        ..small()
    })
    .unwrap();
    let e = sim.job().submit(cmd(&[("node-1", 2, true)])).unwrap_err();
    match &e {
        LocalJobError::Refused(SubmitError::Invalid(ValidationError::PartnerNotInJob {
            device,
            partner,
            ..
        })) => assert_eq!((*device, *partner), (DeviceId(2), DeviceId(3))),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("partner die node-1:3"), "{e}");
    assert!(sim.fabric().nic_set_log().is_empty());
    // Its partner-less die can still go back to (stay on) its own NIC; the others switch.
    assert_eq!(
        run(&sim, cmd(&[("node-1", 2, false)])).outcome,
        Outcome::Succeeded
    );
    assert_eq!(
        run(&sim, cmd(&[("node-1", 0, true)])).outcome,
        Outcome::Succeeded
    );
    let end = sim.finish();
    assert_consistent_end(&end);
}
