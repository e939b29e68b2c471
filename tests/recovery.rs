//! The recovery contract through the actors on the simulated fabric: a manager that dies or
//! stops mid-operation never leaves a job held, a restarted manager rebuilds its NIC table from
//! what the ranks applied, and a job left paused by a failed rollback has a way back. Every
//! test ends with the invariant: every communication group agrees on its NIC configuration.

mod common;

use common::{
    assert_consistent_end, cmd, fail_rank_1s_switch_and_rollback, small, submit_until, WAIT,
};
use std::time::Duration;
use taskd::actors::RecoveryResult;
use taskd::core::ledger::RecoverTo;
use taskd::core::operation::{JobState, OperationError, Outcome};
use taskd::core::protocol::Phase;
use taskd::core::GlobalRank;
use taskd::hal_mock::NicSetFault;
use taskd::sim::Simulation;

/// Kills the manager once it started `phase`; a new one must adopt the orphaned operation.
/// The kill lands in that phase or a little later (replies keep arriving until the manager
/// handles the kill), so the checks hold for any later point too; `expect_backup`, when
/// given, is the only possible outcome.
fn kill_manager_during(phase: Phase, expect_backup: Option<&[u32]>) {
    let sim = Simulation::start(&small()).unwrap();
    submit_until(
        &sim,
        cmd(&[("node-0", 1, true), ("node-1", 2, true)]),
        phase,
    );
    sim.job().restart_manager().unwrap();
    // The new manager waits for every rank's report, opens the orphaned gates onto groups
    // that agree, and runs.
    sim.job().wait_registered(WAIT).unwrap();
    let status = sim.job().status(4).unwrap();
    assert_eq!(status.state, JobState::Running, "{status:?}");
    assert!(status.verified);
    let v = status.last_verification.expect("a verification ran");
    assert!(v.released.len() <= 1, "{v}");
    assert!(sim.fabric().check_consistency().is_consistent());
    assert_eq!(status.ranks_on_backup, sim.fabric().ranks_on_backup());
    if let Some(expect) = expect_backup {
        let on_backup: Vec<GlobalRank> = expect.iter().map(|r| GlobalRank(*r)).collect();
        assert_eq!(status.ranks_on_backup, on_backup);
    }
    // Training goes on, and the next switch is admitted and runs.
    sim.train(2).unwrap();
    let again = sim
        .job()
        .run(cmd(&[("node-0", 1, true), ("node-1", 2, true)]))
        .unwrap();
    assert_eq!(again.outcome, Outcome::Succeeded, "{again}");
    sim.train(1).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn a_manager_killed_during_the_pause_leaves_no_rank_held() {
    kill_manager_during(Phase::Pause, None);
}

#[test]
fn a_manager_killed_during_the_switch_is_replaced_by_one_that_adopts_the_result() {
    // Every rank applies the switch (their calls complete without a manager); the new
    // manager learns it from their reports.
    kill_manager_during(Phase::Switch, Some(&[1, 6]));
}

#[test]
fn a_stopping_manager_rolls_back_and_resumes_before_it_goes() {
    let sim = Simulation::start(&small()).unwrap();
    // Rank 3's first NIC-set call takes half a second, so the switch is still in flight when
    // the drain arrives (a HAL call of the simulator otherwise ends within microseconds).
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(3), NicSetFault::Slow(Duration::from_millis(500)));
    submit_until(&sim, cmd(&[("node-0", 3, true)]), Phase::Switch);
    let r = sim
        .job()
        .drain("SIGTERM", WAIT)
        .unwrap()
        .expect("an operation was in flight");
    assert_eq!(r.outcome, Outcome::Failed, "{r}");
    assert!(
        matches!(
            r.error,
            Some(OperationError::Aborted {
                phase: Phase::Switch,
                ..
            })
        ),
        "{r}"
    );
    assert!(r.rolled_back, "{r}");
    assert_eq!(r.job_state, JobState::Running);
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn a_paused_job_is_recovered_by_the_operator() {
    let sim = Simulation::start(&small()).unwrap();
    // Rank 1 makes two calls per switch (tp_0, world): the first fails, and so does its
    // second rollback call: world is left split and the job stays paused.
    let f = sim.fabric();
    fail_rank_1s_switch_and_rollback(f);
    let r = sim.job().run(cmd(&[("node-0", 0, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Paused, "{r}");
    assert!(!f.check_consistency().is_consistent());

    let rec = sim.job().recover(RecoverTo::Primary).unwrap();
    let RecoveryResult::Operation(rec) = rec else {
        panic!("rank 0 is in doubt: {rec:?}");
    };
    assert_eq!(rec.outcome, Outcome::Succeeded, "{rec}");
    assert_eq!(rec.job_state, JobState::Running);
    sim.job().wait_registered(WAIT).unwrap();
    let status = sim.job().status(0).unwrap();
    assert_eq!(status.state, JobState::Running);
    assert!(status.verified && status.ranks_on_backup.is_empty());
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn recover_on_a_running_job_says_there_is_nothing_to_do() {
    let sim = Simulation::start(&small()).unwrap();
    let e = sim.job().recover(RecoverTo::AsIs).unwrap_err();
    assert!(e.to_string().contains("nothing to recover"), "{e}");
    assert_consistent_end(&sim.finish());
}
