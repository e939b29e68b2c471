//! The manager as ClusterD's client, end to end: a simulated job (the production actors on the
//! simulated fabric, training on their own threads), the manager's ClusterD client, and a fake
//! ClusterD (`clusterd_support`) that runs each switch as the real one does and fails the test
//! on any report it did not ask for. Every scenario runs twice: against a fake that serves its
//! streams as grpc-go (ClusterD's server: headers only with a stream's first message) and
//! against one that sends headers at once. Every scenario ends with the invariant: every
//! communication group agrees on its NIC configuration.

mod clusterd_support;
mod common;

use clusterd_support::{FakeClusterd, Got, Headers, SWITCH_FAILED, SWITCH_FINISHED};
use common::{
    assert_consistent_end, await_progress, cmd, fail_rank_1s_switch_and_rollback, ranks,
    restart_after_stop, small, WAIT,
};
use std::time::Duration;
use taskd::actors::clusterd::{ClusterdClient, ClusterdConfig};
use taskd::core::ledger::StopBy;
use taskd::core::operation::{JobState, OperationError, OperationReport};
use taskd::core::{DeviceId, GlobalRank, HcclCode, JobId, NodeName};
use taskd::hal_mock::NicSetFault;
use taskd::sim::Simulation;

/// Each scenario `name(headers)` as two tests, `name::grpc_go` and `name::headers_at_once`.
macro_rules! against_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[test]
            fn grpc_go() {
                super::$name(Headers::WithFirstMessage)
            }
            #[test]
            fn headers_at_once() {
                super::$name(Headers::AtOnce)
            }
        }
    )*};
}

against_both!(
    a_switch_and_back_as_clusterd_runs_them,
    a_failed_nic_set_answers_false_after_the_rollback_and_the_job_stays_consistent,
    clusterd_restarted_between_two_switches,
    clusterd_restarted_while_the_job_is_held_resumes_it_and_the_new_one_switches,
    clusterd_restarted_during_the_switch_leaves_every_group_agreeing,
    the_switch_stream_ended_alone_is_subscribed_again_alone_and_the_switch_goes_on,
    the_signal_stream_ended_mid_flow_ends_the_flow_and_the_next_pause_is_accepted,
    a_duplicate_switch_rank_list_neither_switches_nor_answers_twice,
    a_pause_and_a_continue_delivered_twice_are_answered_once,
    a_continue_or_a_rank_list_out_of_order_is_answered_once_and_changes_nothing,
    a_pause_then_kill_master_stops_training_answers_nothing_and_the_restarted_job_runs,
    a_failed_rollback_then_stop_train_stops_training_and_the_restarted_job_runs,
    a_failed_rollback_then_kill_master_stops_training_and_the_restarted_job_runs,
    a_pause_while_an_operator_switch_runs_is_refused_as_busy,
    signals_for_another_job_are_refused_under_that_job_and_change_nothing,
    a_signal_stream_silent_from_the_start_is_given_up_and_the_session_is_never_up,
);

fn sim() -> Simulation {
    Simulation::start(&small()).expect("the simulated job starts")
}

/// A simulated job, a fake ClusterD and the job's manager as its client, first session up.
fn setup(headers: Headers) -> (Simulation, FakeClusterd, ClusterdClient) {
    let sim = sim();
    let fake = FakeClusterd::start_with("sim", headers);
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

/// ClusterD's `what` stopped training: every training loop ends at its gate (a held rank gets
/// the stop instead of a resume), the stop is ClusterD's, and nothing runs until the launcher
/// restarts the processes.
fn training_stopped_by_clusterd(sim: &Simulation, what: &str) {
    assert!(
        sim.training().wait_ended(WAIT),
        "training was never stopped"
    );
    let s = sim.job().status(0).unwrap();
    let stop = s.training_stop.expect("a stop under way");
    assert_eq!(stop.by, StopBy::Clusterd, "{stop}");
    assert!(stop.reason.contains(what), "{stop}");
    assert!(s.in_flight.is_none(), "{:?}", s.in_flight);
}

/// ClusterD pauses and switches rank 0; rank 1's switch call and its rollback call fail: the
/// answer is `false`, the world group is left split, the job `paused` with every rank held.
fn held_by_a_failed_rollback(sim: &Simulation, fake: &FakeClusterd) {
    let f = sim.fabric();
    fail_rank_1s_switch_and_rollback(f);
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[0], &[true]);
    assert!(!fake.switch_result(), "the switch and its rollback failed");
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::Paused, "{s:?}");
    assert!(s.in_flight.is_none() && s.training_stop.is_none(), "{s:?}");
    assert!(!sim.fabric().check_consistency().is_consistent());
}

/// Waits for the final report of the operation in flight (`progress` subscribed before it
/// could end).
fn final_report(
    progress: &mut tokio::sync::broadcast::Receiver<taskd::actors::ProgressEvent>,
) -> OperationReport {
    await_progress(progress, "a final report", |ev| ev.report().cloned())
}

fn a_switch_and_back_as_clusterd_runs_them(headers: Headers) {
    let (sim, fake, c) = setup(headers);

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
    assert_eq!(fake.switch_nic(&[1, 6], &[false, false]), SWITCH_FINISHED);
    fake.wait_sessions(3);
    assert!(sim.fabric().ranks_on_backup().is_empty());
    assert_eq!(fake.answers(), vec![SWITCH_FINISHED]);
    end(sim, &fake, c);
}

fn a_failed_nic_set_answers_false_after_the_rollback_and_the_job_stays_consistent(
    headers: Headers,
) {
    let (mut sim, fake, c) = setup(headers);
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
    // ClusterD's way on after a failed switch: stop_train. The held operation ends (held,
    // answered once), then training stops.
    fake.stop_train(&format!("{uuid}-stop"));
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    training_stopped_by_clusterd(&sim, "stop_train");
    let s = sim.job().status(2).unwrap();
    assert!(s.recent.iter().any(|r| r.rolled_back), "{:?}", s.recent);
    assert!(s.ranks_on_backup.is_empty());
    // ClusterD resets the job; the launcher restarts the processes; the job runs again.
    fake.reset_streams();
    fake.wait_sessions(2);
    restart_after_stop(&mut sim, StopBy::Clusterd);
    end(sim, &fake, c);
}

fn clusterd_restarted_between_two_switches(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    assert_eq!(fake.switch_nic(&[2], &[true]), SWITCH_FINISHED);
    fake.assert_clean();
    let addr = fake.kill();
    // A new ClusterD on the same address: the client finds it by itself.
    let fake = FakeClusterd::start_at("sim", addr, headers);
    fake.wait_sessions(1);
    assert_eq!(fake.switch_nic(&[2, 7], &[false, true]), SWITCH_FINISHED);
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[7]));
    end(sim, &fake, c);
}

fn clusterd_restarted_while_the_job_is_held_resumes_it_and_the_new_one_switches(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let mut progress = sim.job().subscribe_progress();
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    // ClusterD dies with the job held: its flow is gone with it. The job does not wait for
    // the hold bound (15 minutes by default): it resumes on the NICs every group agrees on.
    let addr = fake.kill();
    let r = final_report(&mut progress);
    assert!(
        matches!(&r.error, Some(OperationError::Aborted { reason, .. }) if reason.contains("signal stream closed")),
        "{r}"
    );
    assert_eq!(r.job_state, JobState::Running, "{r}");
    let fake = FakeClusterd::start_at("sim", addr, headers);
    fake.wait_sessions(1);
    // The new ClusterD's first pause is accepted (not refused with 499, which would make
    // ClusterD kill the job), and nothing of the old flow reaches it.
    assert_eq!(fake.switch_nic(&[3], &[true]), SWITCH_FINISHED);
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[3]));
    end(sim, &fake, c);
}

fn clusterd_restarted_during_the_switch_leaves_every_group_agreeing(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let mut progress = sim.job().subscribe_progress();
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[0, 5], &[true, true]);
    // Killed while the ranks switch (or just after): either the switch is rolled back or
    // it completed; the job runs again on NICs every group agrees on, without waiting for
    // the hold bound.
    let addr = fake.kill();
    let r = final_report(&mut progress);
    assert_eq!(r.job_state, JobState::Running, "{r}");
    assert!(sim.fabric().check_consistency().is_consistent());
    let on_backup = sim.fabric().ranks_on_backup();
    assert!(
        on_backup.is_empty() || on_backup == ranks(&[0, 5]),
        "{on_backup:?}"
    );
    let fake = FakeClusterd::start_at("sim", addr, headers);
    fake.wait_sessions(1);
    assert_eq!(fake.switch_nic(&[0, 5], &[false, false]), SWITCH_FINISHED);
    assert!(sim.fabric().ranks_on_backup().is_empty());
    end(sim, &fake, c);
}

/// ClusterD ends its switch stream only with a reset; a proxy in between may cut it alone.
/// Only that stream is subscribed again: a new signal stream would reset ClusterD's flow.
fn the_switch_stream_ended_alone_is_subscribed_again_alone_and_the_switch_goes_on(
    headers: Headers,
) {
    let (sim, fake, c) = setup(headers);
    let uuid = fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    let held: u64 = info
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the pause step in {info:?}"));
    fake.cut_switch_stream();
    fake.wait_switch_subscriptions(2);
    assert_eq!(fake.subscriptions(), (1, 2), "the signal stream was kept");
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

/// The end of the signal stream is the end of ClusterD's flow (it resets the job whenever
/// that stream goes away): the held job resumes at once, nothing owed to the old flow is
/// sent, and the next pause is a new flow, accepted.
fn the_signal_stream_ended_mid_flow_ends_the_flow_and_the_next_pause_is_accepted(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let mut progress = sim.job().subscribe_progress();
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[2], &[true]);
    assert!(fake.switch_result());
    fake.cut_signal_stream();
    let r = final_report(&mut progress);
    assert_eq!(r.job_state, JobState::Running, "{r}");
    // The switch was done and answered, so every group agrees on it: the job kept it.
    assert!(r.applied, "{r}");
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[2]));
    fake.wait_sessions(2);
    assert_eq!(fake.switch_nic(&[2], &[false]), SWITCH_FINISHED);
    assert!(sim.fabric().ranks_on_backup().is_empty());
    end(sim, &fake, c);
}

fn a_duplicate_switch_rank_list_neither_switches_nor_answers_twice(headers: Headers) {
    let (sim, fake, c) = setup(headers);
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
    assert_eq!(fake.switch_nic(&[3, 5], &[false, false]), SWITCH_FINISHED);
    assert_eq!(
        sim.fabric().nic_set_log().len() - calls_before,
        2 * one_switch
    );
    assert!(sim.fabric().ranks_on_backup().is_empty());
    end(sim, &fake, c);
}

fn a_pause_and_a_continue_delivered_twice_are_answered_once(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let uuid = fake.pause();
    // The same pause again (ClusterD retries a send it thinks failed): no second pause.
    fake.signal("stopTrain", &["pause_train"], "", &uuid);
    assert_eq!(fake.stop_complete().0, 0);
    fake.switch(&[1], &[true]);
    assert!(fake.switch_result());
    fake.resume(&uuid);
    fake.signal("changeStrategy", &["change_strategy"], "continue", &uuid);
    assert_eq!(fake.recover_status().0, 0);
    // A delivery that came after its answer is not answered again: a last continue makes
    // it so, and the slots stay empty (assert_clean).
    fake.signal("changeStrategy", &["change_strategy"], "continue", &uuid);
    fake.reset_streams();
    fake.wait_sessions(2);
    assert_eq!(fake.switch_nic(&[1], &[false]), SWITCH_FINISHED);
    end(sim, &fake, c);
}

fn a_continue_or_a_rank_list_out_of_order_is_answered_once_and_changes_nothing(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let calls_before = sim.fabric().nic_set_log().len();
    // A rank list with no pause in effect: refused, nothing switched, answered false once.
    fake.switch(&[4], &[true]);
    assert!(!fake.switch_result());
    // A continue for no pause: training runs, which is what it asks; answered once.
    fake.resume("no-such-pause");
    let (code, info) = fake.recover_status();
    assert_eq!(code, 0, "{info}");
    assert_eq!(sim.fabric().nic_set_log().len(), calls_before);
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Running);
    fake.reset_streams();
    fake.wait_sessions(2);
    assert_eq!(fake.switch_nic(&[4], &[true]), SWITCH_FINISHED);
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[4]));
    end(sim, &fake, c);
}

fn a_pause_then_kill_master_stops_training_answers_nothing_and_the_restarted_job_runs(
    headers: Headers,
) {
    let (mut sim, fake, c) = setup(headers);
    fake.pause();
    assert_eq!(fake.stop_complete().0, 0);
    let mut progress = sim.job().subscribe_progress();
    fake.kill_master("restart-1");
    // killMaster has no answer; the operation ends with every rank held on agreeing groups,
    // then training stops.
    let r = final_report(&mut progress);
    assert_eq!(r.job_state, JobState::Paused, "{r}");
    assert!(!r.applied && r.pause_step.is_some(), "{r}");
    training_stopped_by_clusterd(&sim, "killMaster restart-1");
    // ClusterD resets after killMaster: both streams end.
    fake.reset_streams();
    fake.wait_sessions(2);
    // ClusterD's next pause is refused truthfully (499) while the processes restart.
    fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 499, "{info}");
    assert!(info.contains("training"), "{info}");
    restart_after_stop(&mut sim, StopBy::Clusterd);
    // The restarted job switches as ClusterD runs it.
    fake.reset_streams();
    fake.wait_sessions(3);
    assert_eq!(fake.switch_nic(&[4], &[true]), SWITCH_FINISHED);
    assert_eq!(sim.fabric().ranks_on_backup(), ranks(&[4]));
    end(sim, &fake, c);
}

/// A failed rollback holds the job; ClusterD's `signal` (its reports checked there) stops
/// training, named in the stop's reason by `what`; ClusterD resets the job, the launcher
/// restarts the processes and the job runs again.
fn stopped_after_a_failed_rollback(headers: Headers, signal: fn(&FakeClusterd), what: &str) {
    let (mut sim, fake, c) = setup(headers);
    held_by_a_failed_rollback(&sim, &fake);
    signal(&fake);
    training_stopped_by_clusterd(&sim, what);
    fake.reset_streams();
    fake.wait_sessions(2);
    restart_after_stop(&mut sim, StopBy::Clusterd);
    end(sim, &fake, c);
}

fn a_failed_rollback_then_stop_train_stops_training_and_the_restarted_job_runs(headers: Headers) {
    // ClusterD's way on after a failed switch: stop_train, answered once, in this session.
    let stop = |fake: &FakeClusterd| {
        fake.stop_train("stop-1");
        let (code, info) = fake.stop_complete();
        assert_eq!(code, 0, "{info}");
    };
    stopped_after_a_failed_rollback(headers, stop, "stop_train stop-1");
}

fn a_failed_rollback_then_kill_master_stops_training_and_the_restarted_job_runs(headers: Headers) {
    // killMaster has no answer (the fake fails the test on one it did not ask for).
    let kill = |fake: &FakeClusterd| fake.kill_master("restart-1");
    stopped_after_a_failed_rollback(headers, kill, "killMaster restart-1");
}

fn a_pause_while_an_operator_switch_runs_is_refused_as_busy(headers: Headers) {
    let (sim, fake, c) = setup(headers);
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

/// A signal naming another job used to pause this one and report success into this job's
/// slot; it is refused and answered under the job it named.
fn signals_for_another_job_are_refused_under_that_job_and_change_nothing(headers: Headers) {
    let (sim, fake, c) = setup(headers);
    let calls_before = sim.fabric().nic_set_log().len();
    fake.signal_for("other-job", "stopTrain", &["pause_train"], "", "u-other");
    let got = fake.wait_foreign_reports(1);
    assert_eq!(got[0].0, "other-job");
    let Got::Status(code, info) = &got[0].1 else {
        panic!("{got:?}")
    };
    assert_eq!(*code, 499, "{info}");
    assert!(
        info.contains("\"other-job\"") && info.contains("\"sim\""),
        "{info}"
    );
    let s = sim.job().status(0).unwrap();
    assert!(s.in_flight.is_none(), "{:?}", s.in_flight);
    assert_eq!(s.state, JobState::Running);
    fake.signal_for(
        "other-job",
        "changeStrategy",
        &["change_strategy"],
        "continue",
        "u-other",
    );
    let got = fake.wait_foreign_reports(2);
    assert!(
        matches!(&got[1], (job, Got::Status(499, _)) if job == "other-job"),
        "{got:?}"
    );
    // Training went on, nothing was switched, and the job's own flow works as ever.
    sim.train(2).unwrap();
    assert_eq!(sim.fabric().nic_set_log().len(), calls_before);
    assert_eq!(fake.switch_nic(&[6], &[true]), SWITCH_FINISHED);
    assert_eq!(fake.foreign_reports().len(), 2);
    end(sim, &fake, c);
}

/// With grpc-go, a signal stream that sends nothing sends no headers either: the wait for
/// them is bounded by the silence limit, the switch stream is never subscribed, and the
/// session never counts as up.
fn a_signal_stream_silent_from_the_start_is_given_up_and_the_session_is_never_up(headers: Headers) {
    let sim = sim();
    let fake = FakeClusterd::start_with("sim", headers);
    fake.mute_keep_alives(true);
    let mut cfg = ClusterdConfig::new(fake.addr().to_string(), JobId("sim".into()));
    cfg.retry_min = Duration::from_millis(10);
    cfg.retry_max = Duration::from_millis(20);
    cfg.silence = Duration::from_millis(200);
    let c = ClusterdClient::start(sim.job().manager(), cfg).expect("the client starts");
    // Given up and subscribed again, by itself; no switch subscription meanwhile.
    fake.wait_signal_subscriptions(3);
    assert_eq!(fake.subscriptions().1, 0);
    let link = sim.job().status(0).unwrap().clusterd.unwrap();
    assert!(!link.connected, "{link:?}");
    assert!(
        link.detail.contains("nothing from ClusterD for"),
        "{link:?}"
    );
    // ClusterD speaks again: the next session comes up and drives a switch.
    fake.mute_keep_alives(false);
    fake.wait_switch_subscriptions(1);
    assert_eq!(fake.switch_nic(&[5], &[true]), SWITCH_FINISHED);
    end(sim, &fake, c);
}

#[test]
fn a_failing_switch_is_answered_once_with_clusterds_failure() {
    let (mut sim, fake, c) = setup(Headers::WithFirstMessage);
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(2), NicSetFault::Fail(HcclCode::Network));
    assert_eq!(fake.switch_nic(&[2], &[true]), SWITCH_FAILED);
    assert_eq!(fake.answers(), vec![SWITCH_FAILED]);
    // The stop_train that follows a failed switch stops training; the launcher restarts it.
    training_stopped_by_clusterd(&sim, "stop_train");
    restart_after_stop(&mut sim, StopBy::Clusterd);
    end(sim, &fake, c);
}
