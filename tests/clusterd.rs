//! The manager as ClusterD's client, end to end: a simulated job (the production actors on the
//! simulated fabric, training on their own threads), the manager's ClusterD client, and a fake
//! ClusterD (`clusterd_support`) that runs each switch as the real one does and fails the test
//! on any report it did not ask for. Every scenario ends with the invariant: every
//! communication group agrees on its NIC configuration.

mod clusterd_support;
mod common;

use clusterd_support::FakeClusterd;
use common::{assert_consistent_end, await_progress, cmd, ranks, small};
use std::time::Duration;
use taskd::actors::clusterd::{ClusterdClient, ClusterdConfig};
use taskd::actors::RecoveryResult;
use taskd::core::ledger::RecoverTo;
use taskd::core::operation::JobState;
use taskd::core::{DeviceId, GlobalRank, HcclCode, JobId, NodeName};
use taskd::hal_mock::NicSetFault;
use taskd::sim::Simulation;

fn sim() -> Simulation {
    Simulation::start(&small()).expect("the simulated job starts")
}

/// A simulated job, a fake ClusterD and the job's manager as its client, first session up.
fn setup() -> (Simulation, FakeClusterd, ClusterdClient) {
    let sim = sim();
    let fake = FakeClusterd::start("sim");
    let c = client(&sim, &fake);
    (sim, fake, c)
}

/// Training goes on, ClusterD saw no rule broken, and every group agrees on its NICs.
fn end(sim: Simulation, fake: &FakeClusterd, c: ClusterdClient) {
    sim.train(2).unwrap();
    fake.assert_clean();
    c.shutdown();
    assert_consistent_end(&sim.finish());
}

/// The manager of `sim` as the client of ClusterD at `fake`, reconnecting fast.
fn client(sim: &Simulation, fake: &FakeClusterd) -> ClusterdClient {
    let mut cfg = ClusterdConfig::new(fake.addr().to_string(), JobId("sim".into()));
    cfg.retry_min = Duration::from_millis(10);
    cfg.retry_max = Duration::from_millis(100);
    let c = ClusterdClient::start(sim.job().manager(), cfg).expect("the client starts");
    fake.wait_sessions(1);
    c
}

#[test]
fn a_switch_and_back_as_clusterd_runs_them() {
    let (sim, fake, c) = setup();

    // Step by step, checking what the job holds at each one.
    let uuid = fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    let s = sim.job().status(0).unwrap();
    let link = s.clusterd.expect("the manager is ClusterD's client");
    assert!(link.connected, "{link:?}");
    assert_eq!(link.driving.as_deref(), Some(uuid.as_str()));
    // The operator's path shares the operation: refused as busy while ClusterD holds the job.
    let busy = sim
        .job()
        .submit(cmd(&[("node-0", 3, true)]))
        .unwrap_err()
        .to_string();
    assert!(busy.contains("still running"), "{busy}");
    fake.switch(&[1, 6], &[true, true]);
    assert!(fake.switch_result());
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[1, 6]));
    fake.resume(&uuid);
    assert_eq!(fake.recover_status().0, 0);
    fake.reset_streams();
    fake.wait_sessions(2);
    sim.train(2).unwrap();
    let s = sim.job().status(1).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.ranks_on_backup, ranks(&[1, 6]));
    assert!(s.recent[0].applied);

    // And back, as one flow.
    assert!(fake.switch_nic(&[1, 6], &[false, false]));
    fake.wait_sessions(3);
    assert!(sim.fabric().ranks_on_backup().is_empty());
    end(sim, &fake, c);
}

#[test]
fn a_failed_nic_set_answers_false_after_the_rollback_and_the_job_stays_consistent() {
    let (sim, fake, c) = setup();
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(5), NicSetFault::Fail(HcclCode::Network));
    let uuid = fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[4, 6], &[true, true]);
    assert!(!fake.switch_result(), "the NIC-set of rank 5 failed");
    // The answer came after the rollback: every group agrees on the previous state.
    assert!(sim.fabric().check_consistency().is_consistent());
    assert!(sim.fabric().ranks_on_backup().is_empty());
    let s = sim.job().status(1).unwrap();
    assert!(s.in_flight.is_some(), "still held, waiting for ClusterD");
    // ClusterD's way on after a failed switch: stop_train. Training stays held, consistent.
    fake.stop_train(&format!("{uuid}-stop"));
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    let s = sim.job().status(2).unwrap();
    assert_eq!(s.state, JobState::Paused);
    assert!(s.recent.iter().any(|r| r.rolled_back), "{:?}", s.recent);
    assert!(s.ranks_on_backup.is_empty());
    // An operator (or the job's restart) brings it back: the targets of the stopped
    // operation are re-stated as the NIC table has them (primary), then every gate opens.
    match sim.job().recover(RecoverTo::AsIs).unwrap() {
        RecoveryResult::Operation(r) => {
            assert_eq!(r.job_state, JobState::Running, "{r}");
            assert!(r.targets.iter().all(|t| !t.use_backup), "{r}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Running);
    end(sim, &fake, c);
}

#[test]
fn clusterd_restarted_between_two_switches() {
    let (sim, fake, c) = setup();
    assert!(fake.switch_nic(&[2], &[true]));
    fake.assert_clean();
    let addr = fake.kill();
    // A new ClusterD on the same address: the client finds it by itself.
    let fake = FakeClusterd::start_at("sim", addr);
    fake.wait_sessions(1);
    assert!(fake.switch_nic(&[2, 7], &[false, true]));
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[7]));
    end(sim, &fake, c);
}

#[test]
fn the_switch_stream_cut_while_paused_is_subscribed_again_and_the_switch_goes_on() {
    let (sim, fake, c) = setup();
    let uuid = fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    let held: u64 = info
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the pause step in {info:?}"));
    fake.cut_switch_stream();
    // The client starts a new session (Init, Register, both streams); the job stays held.
    fake.wait_sessions(2);
    let s = sim.job().status(0).unwrap();
    assert!(s.in_flight.is_some());
    assert_eq!(
        s.clusterd.and_then(|l| l.driving).as_deref(),
        Some(uuid.as_str())
    );
    fake.switch(&[0], &[true]);
    assert!(fake.switch_result());
    // Held all along: no rank went past the pause step.
    assert_eq!(sim.training().max_steps(), held);
    fake.resume(&uuid);
    assert_eq!(fake.recover_status().0, 0);
    let r = sim.job().status(1).unwrap().recent[0].clone();
    assert_eq!(r.pause_step, Some(held));
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[0]));
    end(sim, &fake, c);
}

#[test]
fn a_duplicate_switch_rank_list_neither_switches_nor_answers_twice() {
    let (sim, fake, c) = setup();
    let calls_before = sim.fabric().nic_set_log().len();
    let uuid = fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[3, 5], &[true, true]);
    // Delivered again: not a second switch, not a second answer (the slot stays empty).
    fake.send_switch(&[3, 5], &[true, true]);
    assert!(fake.switch_result());
    let one_switch = sim.fabric().nic_set_log().len() - calls_before;
    assert!(one_switch > 0);
    fake.resume(&uuid);
    assert_eq!(fake.recover_status().0, 0);
    fake.reset_streams();
    fake.wait_sessions(2);
    // The next switch finds its slot empty (a second answer would sit there) and switches
    // back with as many calls as the first: the duplicate made none.
    assert!(fake.switch_nic(&[3, 5], &[false, false]));
    assert_eq!(
        sim.fabric().nic_set_log().len() - calls_before,
        2 * one_switch
    );
    assert!(sim.fabric().ranks_on_backup().is_empty());
    end(sim, &fake, c);
}

#[test]
fn a_pause_then_kill_master_keeps_every_rank_held_and_answers_nothing() {
    let (sim, fake, c) = setup();
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    let mut progress = sim.job().subscribe_progress();
    fake.kill_master("restart-1");
    // killMaster has no answer; the operation ends with every rank held on agreeing groups.
    let r = await_progress(&mut progress, "a final report", |ev| ev.report().cloned());
    assert_eq!(r.job_state, JobState::Paused, "{r}");
    let s = sim.job().status(1).unwrap();
    assert_eq!(s.state, JobState::Paused);
    assert!(s.in_flight.is_none());
    let r = &s.recent[0];
    assert!(!r.applied && r.pause_step.is_some(), "{r:?}");
    assert!(sim.fabric().check_consistency().is_consistent());
    // ClusterD's next pause is refused truthfully (499) while the job is held.
    fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 499, "{info}");
    // The job's restart re-verifies every rank; here an operator's recover does the same.
    assert!(matches!(
        sim.job().recover(RecoverTo::AsIs).unwrap(),
        RecoveryResult::Verification(_)
    ));
    end(sim, &fake, c);
}

#[test]
fn a_pause_while_an_operator_switch_runs_is_refused_as_busy() {
    let (sim, fake, c) = setup();
    // An operator's switch whose NIC-set hangs a while: it is in flight when ClusterD pauses.
    sim.fabric().inject_nic_set_fault(
        GlobalRank(0),
        NicSetFault::Hang {
            duration: Duration::from_millis(300),
            code: HcclCode::Timeout,
        },
    );
    let cmd = sim.command(&[(NodeName("node-1".into()), vec![DeviceId(1)])], true);
    let id = sim.job().submit(cmd).unwrap().id();
    fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 499, "{info}");
    assert!(info.contains(&id.to_string()), "{info}");
    let r = sim.job().wait(id).unwrap();
    assert!(r.rolled_back, "{r}");
    end(sim, &fake, c);
}
