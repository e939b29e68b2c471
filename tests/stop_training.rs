//! No training held for ever, through the actors on the simulated fabric: a job a failed
//! rollback left `paused` is stopped by the hold policy once its bound passed (or by an
//! operator, when the policy holds), every rank's training loop ends at its gate, the
//! launcher restarts the processes as new incarnations on their default NIC, and the job is
//! `running` again. Every test ends with the invariant: every group agrees on its NICs.

mod common;

use common::{
    assert_consistent_end, assert_running_again, cmd, fail_rank_1s_switch_and_rollback,
    restart_after_stop, small, WAIT,
};
use std::time::Duration;
use taskd::actors::manager::HoldPolicy;
use taskd::actors::LocalJobError;
use taskd::core::ledger::StopBy;
use taskd::core::operation::JobState;
use taskd::core::SubmitError;
use taskd::hal_mock::RankExit;
use taskd::sim::Simulation;

/// Rank 1's first switch call and its rollback call fail: the world group is left split and
/// the job `paused`, every rank held. Returns what the operation's report says comes next.
fn paused_by_a_failed_rollback(sim: &Simulation) -> String {
    let f = sim.fabric();
    fail_rank_1s_switch_and_rollback(f);
    let r = sim.job().run(cmd(&[("node-0", 0, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Paused, "{r}");
    r.hold
        .expect("a report of a job left not running says what that leads to")
}

#[test]
fn a_job_held_past_its_bound_is_stopped_restarted_and_runs_again() {
    let mut sim = Simulation::start(&small()).unwrap();
    // A bound far below the test's patience: the stop comes from the policy, not the test.
    sim.job()
        .set_hold_policy(HoldPolicy::StopAfter(Duration::from_millis(50)))
        .unwrap();
    let then = paused_by_a_failed_rollback(&sim);
    assert_eq!(then, "stop training after 50ms held");
    // The policy stops training: every loop ends at its gate.
    assert!(
        sim.training().wait_ended(WAIT),
        "training was never stopped"
    );
    let s = sim.job().status(0).unwrap();
    let stop = s.training_stop.expect("a stop under way");
    assert_eq!(stop.by, StopBy::Policy);
    assert!(stop.reason.contains("paused"), "{}", stop.reason);
    // Nothing runs while the processes restart.
    let refused = sim.job().run(cmd(&[("node-0", 0, true)])).unwrap_err();
    assert!(
        matches!(
            refused,
            LocalJobError::Refused(SubmitError::TrainingStopped { .. })
        ),
        "{refused}"
    );
    let exits = sim.restart_processes().unwrap();
    assert!(
        exits.iter().all(|e| *e == RankExit::TrainingStopped),
        "{exits:?}"
    );
    assert_running_again(&sim, StopBy::Policy);
    // The job switches again on its new processes.
    let r = sim.job().run(cmd(&[("node-1", 2, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Running, "{r}");
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn with_the_hold_policy_an_operator_stops_training_and_the_job_runs_again() {
    let mut sim = Simulation::start(&small()).unwrap();
    sim.job().set_hold_policy(HoldPolicy::Hold).unwrap();
    let then = paused_by_a_failed_rollback(&sim);
    assert_eq!(then, "hold until an operator acts");
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Paused);
    sim.job()
        .stop_training("the operator gave up on the recovery")
        .unwrap();
    assert!(
        sim.training().wait_ended(WAIT),
        "training was never stopped"
    );
    // A second stop while the first lasts is refused, naming what it waits for: the ranks'
    // replies that they stopped (the loops ended, the replies may still be on their way) or
    // their new processes.
    let again = sim.job().stop_training("again").unwrap_err().to_string();
    assert!(
        again.contains("have not stopped yet") || again.contains("are not back yet"),
        "{again}"
    );
    sim.restart_processes().unwrap();
    assert_running_again(&sim, StopBy::Operator);
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn a_running_job_stopped_by_an_operator_restarts_and_runs_again() {
    let mut sim = Simulation::start(&small()).unwrap();
    // A running job may be stopped too: every loop ends at its next boundary.
    sim.job().stop_training("maintenance").unwrap();
    assert!(sim.training().wait_ended(WAIT));
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::NeedsRecovery);
    // Ranks that trained on are a step apart.
    restart_after_stop(&mut sim, StopBy::Operator);
    assert_consistent_end(&sim.finish());
}

#[test]
fn an_operator_stops_training_through_the_control_api_and_status_follows_the_restart() {
    use taskd::actors::control::proto::recover_reply::Outcome;
    use taskd::actors::control::{serve, ControlClient, ControlConfig};
    let mut sim = Simulation::start(&small()).unwrap();
    sim.job().set_hold_policy(HoldPolicy::Hold).unwrap();
    let _ = paused_by_a_failed_rollback(&sim);
    let control = ControlConfig::new("127.0.0.1:0".parse().unwrap(), "sim".into());
    let server = serve(sim.job().manager().clone(), control).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = server.local_addr().to_string();
    let mut client = rt.block_on(ControlClient::connect(&addr, None)).unwrap();
    let reply = rt
        .block_on(client.stop_training("sim", "the NICs of node-0 are being replaced"))
        .unwrap();
    let Some(Outcome::Stopped(stop)) = reply.outcome else {
        panic!("not stopped: {reply:?}");
    };
    assert_eq!(
        (stop.by.as_str(), stop.reason.as_str()),
        ("operator", "the NICs of node-0 are being replaced")
    );
    assert!(
        sim.training().wait_ended(WAIT),
        "training was never stopped"
    );
    // Every old process confirmed the stop; the launcher has not restarted them yet.
    let status = rt.block_on(client.status("sim", 0)).unwrap();
    let t = status.training_stop.expect("the stop is under way");
    assert_eq!(t.phase, "restarting", "{t:?}");
    assert_eq!(t.not_back.len(), 8, "{t:?}");
    sim.restart_processes().unwrap();
    let status = rt.block_on(client.status("sim", 0)).unwrap();
    assert_eq!(status.state, "running");
    assert!(status.training_stop.is_none());
    assert_eq!(
        status.last_training_stop.map(|t| t.phase).as_deref(),
        Some("restarted")
    );
    drop(client);
    drop(rt);
    server.shutdown();
    assert_consistent_end(&sim.finish());
}
