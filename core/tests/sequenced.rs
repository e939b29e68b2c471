//! Scripted tests of a switch driven by ClusterD: the sequenced operation, the ledger's checks
//! and the sequencer's reports, against a world of ranks (`common/world.rs`) that fails the
//! test if the gates ever open onto ranks that disagree.
//!
//! The job is `job-a`, 2 nodes x 4 devices (ranks 0..8).

mod common;

use common::world::{ids, Reply, World};
use common::*;
use taskd_core::clusterd::{
    Origin, Pending, RankList, Report, Signal, Stage, CODE_FAILED, CODE_OK,
};
use taskd_core::ledger::{StopBy, Submitted};
use taskd_core::operation::{Awaiting, OperationError};
use taskd_core::protocol::{DirectiveKind, Phase};
use taskd_core::{GlobalRank, JobState, OperationId, Outcome, SubmitError};

fn world() -> World {
    World::new(Layout::new(2, 4), secs(900))
}

fn pause(u: &str) -> Signal {
    Signal::Pause { uuid: u.into() }
}

fn resume(u: &str) -> Signal {
    Signal::Continue { uuid: u.into() }
}

fn stop_complete(code: i32) -> impl Fn(&Report) -> bool {
    move |r| matches!(r, Report::StopComplete { code: c, .. } if *c == code)
}

fn recover_status(code: i32) -> impl Fn(&Report) -> bool {
    move |r| matches!(r, Report::RecoverStatus { code: c, .. } if *c == code)
}

fn one(reports: Vec<Report>, want: impl Fn(&Report) -> bool) {
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(want(&reports[0]), "{reports:?}");
}

/// How many stops of training were broadcast.
fn stops_sent(w: &World) -> usize {
    w.sent
        .iter()
        .filter(|d| matches!(d.kind, DirectiveKind::StopTraining { .. }))
        .count()
}

/// ClusterD stopped training: nothing in flight, the stop under way is ClusterD's and was
/// broadcast once, and no gate ever opened (a held rank gets the stop instead of a resume).
fn stopped_by_clusterd(w: &World, why: &str) {
    assert!(w.ledger.in_flight().is_none() && w.seq.current().is_none());
    let stop = w.ledger.training_stop().expect("training is stopped");
    assert_eq!(stop.by, StopBy::Clusterd, "{stop}");
    assert!(stop.reason.contains(why), "{stop}");
    assert_eq!(w.ledger.state(), JobState::NeedsRecovery);
    assert_eq!(stops_sent(w), 1, "{:?}", w.sent);
    assert!(!w.sent.iter().any(|d| d.kind == DirectiveKind::Resume));
}

/// Pause `u` and hold: ClusterD gets its StopComplete only once every rank holds.
fn paused(w: &mut World, u: &str) {
    assert!(w.signal(pause(u)).is_empty(), "no report before the pause");
    assert!(
        w.answer(|_, _| Reply::Correct).is_empty(),
        "sampled: not yet"
    );
    one(w.answer(|_, _| Reply::Correct), stop_complete(CODE_OK));
    let op = w.ledger.in_flight().expect("the operation holds");
    assert_eq!(op.awaiting(), Some(Awaiting::Targets));
    assert!(w.pending.is_none(), "nothing is broadcast while holding");
}

/// Pause `u1` and switch rank 2; rank 6 fails its NIC-set and rank 3 the rollback: the groups
/// may disagree, nothing resumes, and ClusterD's answer is `false`.
fn held_by_a_failed_rollback(w: &mut World) {
    paused(w, "u1");
    w.switch(&ids(&[2]), &[true]);
    let fail = |bad: u32| {
        move |_, r: GlobalRank| {
            if r.0 == bad {
                Reply::Failed
            } else {
                Reply::Correct
            }
        }
    };
    assert!(w.answer(fail(6)).is_empty(), "not before the rollback");
    one(w.answer(fail(3)), |r| {
        *r == Report::SwitchResult { ok: false }
    });
}

#[test]
fn pause_switch_continue_reports_once_each_and_updates_the_table() {
    let mut w = world();
    paused(&mut w, "u1");
    assert!(w.switch(&ids(&[1, 5]), &[true, true]).is_empty());
    let sw = w.pending.clone().expect("the switch is broadcast");
    assert!(matches!(sw.kind, DirectiveKind::Switch { .. }));
    one(w.answer(|_, _| Reply::Correct), |r| {
        *r == Report::SwitchResult { ok: true }
    });
    assert_eq!(w.view(), vec![1, 5]);
    assert_eq!(
        w.ledger.in_flight().and_then(|o| o.awaiting()),
        Some(Awaiting::Resume)
    );
    // Still held: the table follows once the operation is over.
    assert!(w.signal(resume("u1")).is_empty());
    one(w.settle(), recover_status(CODE_OK));
    assert_eq!(w.table(), vec![1, 5]);
    assert_eq!(w.ledger.state(), JobState::Running);
    let r = w.ledger.history().last().expect("a result").clone();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert!(r.applied && r.pause_step == Some(10));
    assert_eq!(w.reports.len(), 3);
    // And back, in a second flow.
    paused(&mut w, "u2");
    w.switch(&ids(&[1, 5]), &[false, false]);
    one(w.settle(), |r| *r == Report::SwitchResult { ok: true });
    w.signal(resume("u2"));
    one(w.settle(), recover_status(CODE_OK));
    assert_eq!(w.table(), Vec::<u32>::new());
    assert_eq!(w.view(), Vec::<u32>::new());
}

#[test]
fn a_failed_switch_reports_false_only_after_the_rollback() {
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[2]), &[true]);
    // Rank 6 fails its NIC-set: the answer is not yet false, the rollback runs first.
    let got = w.answer(|_, r| {
        if r == GlobalRank(6) {
            Reply::Failed
        } else {
            Reply::Correct
        }
    });
    assert!(got.is_empty(), "{got:?}");
    let rb = w.pending.clone().expect("the rollback is broadcast");
    assert!(matches!(rb.kind, DirectiveKind::Rollback { .. }), "{rb:?}");
    one(w.answer(|_, _| Reply::Correct), |r| {
        *r == Report::SwitchResult { ok: false }
    });
    assert_eq!(w.view(), Vec::<u32>::new(), "rolled back everywhere");
    // ClusterD continues (or stops); either way the job is consistent and runs after continue.
    w.signal(resume("u1"));
    one(w.settle(), recover_status(CODE_OK));
    let r = w.ledger.history().last().unwrap().clone();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.rolled_back && !r.applied);
    assert_eq!((w.ledger.state(), w.table()), (JobState::Running, vec![]));
}

#[test]
fn a_failed_rollback_reports_false_and_keeps_every_gate_shut() {
    let mut w = world();
    held_by_a_failed_rollback(&mut w);
    assert!(w.ledger.in_flight().is_none());
    assert_eq!(w.ledger.state(), JobState::Paused);
    assert!(!w.sent.iter().any(|d| d.kind == DirectiveKind::Resume));
    // A continue now is answered truthfully: training does not run.
    one(w.signal(resume("u1")), recover_status(CODE_FAILED));
    // stop_train: training is held, which is what ClusterD asks for; then it stops, and
    // the processes restart on their default NICs (the groups' split goes with them).
    assert_eq!(stops_sent(&w), 0);
    one(
        w.signal(Signal::StopTrain { uuid: "s1".into() }),
        stop_complete(CODE_OK),
    );
    stopped_by_clusterd(&w, "stop_train s1");
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    // Another stop_train while the stop lasts is answered, and stops nothing twice.
    one(
        w.signal(Signal::StopTrain { uuid: "s2".into() }),
        stop_complete(CODE_OK),
    );
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    assert_eq!(stops_sent(&w), 1);
}

#[test]
fn kill_master_after_a_failed_rollback_stops_training_and_answers_nothing() {
    let mut w = world();
    held_by_a_failed_rollback(&mut w);
    assert_eq!((w.ledger.state(), stops_sent(&w)), (JobState::Paused, 0));
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    stopped_by_clusterd(&w, "killMaster k1");
    // Every rank confirms: the stop waits for the new processes.
    assert!(w.settle().is_empty());
    assert_eq!(w.reports.len(), 2, "{:?}", w.reports);
}

#[test]
fn duplicates_are_not_answered_twice() {
    let mut w = world();
    paused(&mut w, "u1");
    assert!(w.signal(pause("u1")).is_empty(), "the pause again");
    w.switch(&ids(&[0]), &[true]);
    one(w.settle(), |r| *r == Report::SwitchResult { ok: true });
    let sent = w.sent.len();
    assert!(w.switch(&ids(&[0]), &[true]).is_empty(), "the same list");
    assert!(
        w.switch(&ids(&[0, 4]), &[true, true]).is_empty(),
        "another list"
    );
    assert_eq!(w.sent.len(), sent, "nothing switched again");
    w.signal(resume("u1"));
    assert!(w.signal(resume("u1")).is_empty(), "the continue again");
    one(w.settle(), recover_status(CODE_OK));
    // After the operation ended, the same list is still a duplicate; a new one has no pause.
    assert!(w.switch(&ids(&[0]), &[true]).is_empty());
    one(w.switch(&ids(&[4]), &[true]), |r| {
        *r == Report::SwitchResult { ok: false }
    });
    assert_eq!(w.reports.len(), 4);
    assert_eq!(w.table(), vec![0]);
}

#[test]
fn a_pause_while_the_journal_cannot_be_written_is_refused_and_a_later_one_runs() {
    let mut w = world();
    let failing = SubmitError::JournalFailing {
        why: "writing /state/operations.json: No space left on device".into(),
    };
    let reports = w.signal_admitting(pause("u1"), Err(failing));
    one(reports.clone(), stop_complete(CODE_FAILED));
    let Report::StopComplete { info, .. } = &reports[0] else {
        unreachable!()
    };
    assert!(
        info.contains("pause u1 refused") && info.contains("journal"),
        "{info}"
    );
    assert!(w.ledger.in_flight().is_none() && w.seq.current().is_none());
    assert!(w.sent.is_empty(), "no rank was paused: {:?}", w.sent);
    // Once a write succeeds again, ClusterD's next pause is a new flow and runs.
    paused(&mut w, "u2");
}

#[test]
fn bad_rank_lists_are_refused_with_false_and_change_nothing() {
    for (ranks, ops) in [
        (ids(&[8]), vec![true]),              // not in the table
        (ids(&[1, 1]), vec![true, true]),     // twice
        (ids(&[1, 2]), vec![true]),           // lengths differ
        (vec!["x".to_string()], vec![true]),  // not a number
        (vec![" 2".to_string()], vec![true]), // not as ClusterD writes a number
        (vec![], vec![]),                     // empty
        (ids(&[0, 1]), vec![true, false]),    // two dies of one NPU, opposite sides
    ] {
        let mut w = world();
        paused(&mut w, "u1");
        let sent = w.sent.len();
        one(w.switch(&ranks, &ops), |r| {
            *r == Report::SwitchResult { ok: false }
        });
        assert_eq!(w.sent.len(), sent, "{ranks:?}: nothing broadcast");
        let op = w.ledger.in_flight().expect("still holding");
        assert_eq!(op.awaiting(), Some(Awaiting::Targets), "{ranks:?}");
        w.signal(resume("u1"));
        one(w.settle(), recover_status(CODE_OK));
        assert_eq!(w.table(), Vec::<u32>::new());
    }
}

#[test]
fn stop_and_kill_while_paused_end_the_hold_then_stop_training() {
    // stop_train while holding: the operation ends, every gate stays shut, one report, and
    // training stops.
    let mut w = world();
    paused(&mut w, "u1");
    one(
        w.signal(Signal::StopTrain { uuid: "s1".into() }),
        stop_complete(CODE_OK),
    );
    stopped_by_clusterd(&w, "stop_train s1");
    let r = w.ledger.history().last().unwrap().clone();
    assert!(
        matches!(r.error, Some(OperationError::Stopped { .. })),
        "{r}"
    );
    assert_eq!(
        r.job_state,
        JobState::Paused,
        "the operation ended held: {r}"
    );
    assert!(
        w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty(),
        "the stop again"
    );

    // killMaster after the switch: the owed answers are dropped, the operation ends held on
    // the switched state (the groups agree, the table follows), then training stops.
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[4]), &[true]);
    one(w.settle(), |r| *r == Report::SwitchResult { ok: true });
    assert!(w
        .signal(Signal::KillMaster { uuid: "u1".into() })
        .is_empty());
    stopped_by_clusterd(&w, "killMaster u1");
    assert_eq!(w.table(), vec![4]);
    assert_eq!(w.view(), vec![4]);

    // killMaster while the switch runs: it finishes (a rollback if it fails) and stops at the
    // hold, never resuming; only then does training stop. No report is sent for the switch
    // ClusterD gave up on.
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[4]), &[true]);
    assert!(w
        .signal(Signal::KillMaster { uuid: "u1".into() })
        .is_empty());
    assert_eq!(
        stops_sent(&w),
        0,
        "not while the ranks are in their NIC calls"
    );
    assert!(w.settle().is_empty());
    stopped_by_clusterd(&w, "killMaster u1");
    assert_eq!(
        w.reports.len(),
        1,
        "only the pause's answer: {:?}",
        w.reports
    );
}

#[test]
fn stop_train_with_nothing_held_pauses_then_stops_training() {
    let mut w = world();
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    assert_eq!(stops_sent(&w), 0, "the ranks are paused at one step first");
    one(w.settle(), stop_complete(CODE_OK));
    stopped_by_clusterd(&w, "stop_train s1");
}

#[test]
fn kill_master_with_nothing_held_stops_training_at_once() {
    let mut w = world();
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    stopped_by_clusterd(&w, "killMaster k1");
    assert!(w.settle().is_empty());
    assert!(w.reports.is_empty(), "{:?}", w.reports);
}

#[test]
fn during_an_operators_switch_nothing_is_stopped_under_it_and_kill_master_stops_after() {
    let mut w = world();
    let cmd = w.layout.command(&[(2, true)]);
    let id = OperationId(uuid::Uuid::from_u128(78));
    let Ok(Submitted::Started { actions, .. }) = w.ledger.submit(&cmd, id, w.now) else {
        panic!("admitted");
    };
    w.run_actions(actions);
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    one(
        w.signal(Signal::StopTrain { uuid: "s1".into() }),
        stop_complete(CODE_FAILED),
    );
    assert_eq!(w.ledger.in_flight().map(|o| o.id()), Some(id));
    assert!(w.ledger.training_stop().is_none());
    assert_eq!(stops_sent(&w), 0);
    // The operator's switch runs to its end (its gates open: it is not ClusterD's hold);
    // then killMaster's stop of training comes.
    w.settle();
    assert_eq!(w.ledger.history().last().map(|r| r.id), Some(id));
    assert_eq!(w.table(), vec![2]);
    let stop = w.ledger.training_stop().expect("training is stopped");
    assert!(stop.reason.contains("killMaster k1"), "{stop}");
    assert_eq!(stops_sent(&w), 1);
}

#[test]
fn a_hold_without_a_command_resumes_at_its_deadline() {
    let mut w = world();
    paused(&mut w, "u1");
    assert!(w.fire().is_empty(), "no request is open: nothing to report");
    assert!(matches!(
        w.pending.as_ref().map(|d| &d.kind),
        Some(DirectiveKind::Resume)
    ));
    w.settle();
    let r = w.ledger.history().last().unwrap().clone();
    assert!(
        matches!(&r.error, Some(OperationError::HoldExpired { awaiting, .. }) if awaiting == "its targets"),
        "{r}"
    );
    assert_eq!(w.ledger.state(), JobState::Running);
    // ClusterD's late switch has no pause to run in; its late continue finds training running.
    one(w.switch(&ids(&[0]), &[true]), |r| {
        *r == Report::SwitchResult { ok: false }
    });
    one(w.signal(resume("u1")), recover_status(CODE_OK));
}

#[test]
fn a_pause_that_fails_answers_499_and_resumes() {
    let mut w = world();
    w.signal(pause("u1"));
    w.answer(|_, _| Reply::Correct);
    // Rank 7 never confirms it holds: the pause deadline passes.
    assert!(w
        .answer(|_, r| if r == GlobalRank(7) {
            Reply::Silent
        } else {
            Reply::Correct
        })
        .is_empty());
    w.fire();
    one(w.settle(), stop_complete(CODE_FAILED));
    assert_eq!(w.ledger.state(), JobState::Running);
    assert!(w.ledger.in_flight().is_none());
}

#[test]
fn both_paths_share_one_operation_at_a_time() {
    let mut w = world();
    paused(&mut w, "u1");
    let held = w.seq.current().map(|(_, id)| id).unwrap();
    let cmd = w.layout.command(&[(2, true)]);
    let got = w
        .ledger
        .submit(&cmd, OperationId(uuid::Uuid::from_u128(77)), w.now);
    assert_eq!(got, Err(SubmitError::Busy { in_flight: held }));
    // The other way round: an operator's switch in flight refuses ClusterD's pause.
    w.signal(resume("u1"));
    w.settle();
    let id = OperationId(uuid::Uuid::from_u128(78));
    w.ledger.submit(&cmd, id, w.now).expect("admitted");
    one(w.signal(pause("u2")), stop_complete(CODE_FAILED));
    assert!(w.seq.current().is_none());
    assert_eq!(w.ledger.in_flight().map(|o| o.id()), Some(id));
    let _ = Phase::Switch;
}

#[test]
fn a_stopping_manager_resumes_a_held_job_and_answers_what_is_owed() {
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[2]), &[true]);
    // The switch is in flight when the manager is told to stop: it ends safely (the switch
    // completes or rolls back, then the gates open) and ClusterD still gets its one answer.
    let actions = w.ledger.abort("SIGTERM".into(), w.now);
    let got = w.run_actions(actions);
    assert!(got.is_empty(), "{got:?}");
    // The ranks are still inside their switch calls: the rollback waits for their answers.
    assert!(matches!(
        w.pending.as_ref().map(|d| &d.kind),
        Some(DirectiveKind::Switch { .. })
    ));
    let got = w.settle();
    assert_eq!(got, vec![Report::SwitchResult { ok: false }], "{got:?}");
    let r = w.ledger.history().last().unwrap().clone();
    assert!(
        matches!(r.error, Some(OperationError::Aborted { .. })),
        "{r}"
    );
    assert!(r.rolled_back, "{r}");
    assert_eq!(w.ledger.state(), JobState::Running);
    assert_eq!(w.table(), Vec::<u32>::new());
    // ClusterD's continue now finds training running.
    one(w.signal(resume("u1")), recover_status(CODE_OK));
}

#[test]
fn a_signal_for_another_job_is_refused_under_that_job_and_changes_nothing() {
    let mut w = world();
    w.from = Origin::new(1, "job-b");
    // A pause naming job-b: nothing pauses, and the refusal is filed under job-b, so this
    // job's own one-slot buffer stays empty.
    one(w.signal(pause("u1")), stop_complete(CODE_FAILED));
    assert!(w.ledger.in_flight().is_none() && w.pending.is_none());
    assert!(w.seq.current().is_none());
    let sent = w.sent_to.last().unwrap();
    assert_eq!((sent.session, sent.job.as_str()), (1, "job-b"));
    let Report::StopComplete { info, .. } = &sent.report else {
        panic!("{sent:?}")
    };
    assert!(
        info.contains("\"job-b\"") && info.contains("\"job-a\""),
        "{info}"
    );
    one(w.signal(resume("u1")), recover_status(CODE_FAILED));
    assert!(w.signal(Signal::KillMaster { uuid: "k".into() }).is_empty());
    one(w.switch(&ids(&[1]), &[true]), |r| {
        *r == Report::SwitchResult { ok: false }
    });
    assert!(
        w.sent_to.iter().all(|o| o.job == "job-b"),
        "{:?}",
        w.sent_to
    );
    assert!(w.sent.is_empty(), "nothing was broadcast to the ranks");
    // The job's own pause (an empty jobId is the job's too) runs as usual.
    w.from = Origin::new(1, "");
    paused(&mut w, "u2");
    assert_eq!(w.sent_to.last().unwrap().job, "job-a");
    w.signal(resume("u2"));
    one(w.settle(), recover_status(CODE_OK));
}

#[test]
fn reports_are_addressed_to_the_session_of_the_pause() {
    let mut w = world();
    w.from = Origin::new(7, "job-a");
    paused(&mut w, "u1");
    w.switch(&ids(&[1]), &[true]);
    w.settle();
    w.signal(resume("u1"));
    w.settle();
    assert_eq!(w.sent_to.len(), 3);
    assert!(w.sent_to.iter().all(|o| o.session == 7 && o.job == "job-a"));
}

#[test]
fn the_end_of_the_session_ends_its_held_flow_and_the_next_pause_is_accepted() {
    let mut w = world();
    paused(&mut w, "u1");
    // Another session's end is not this flow's.
    assert!(w.session_end(2).is_empty());
    assert!(w.ledger.in_flight().is_some());
    // ClusterD reset the flow (its stream ended): nobody will continue it. The job resumes
    // at once instead of holding for the hold bound, and nothing is reported.
    assert!(w.session_end(1).is_empty());
    assert!(matches!(
        w.pending.as_ref().map(|d| &d.kind),
        Some(DirectiveKind::Resume)
    ));
    assert!(w.settle().is_empty(), "no report for an ended session");
    let r = w.ledger.history().last().unwrap().clone();
    assert!(
        matches!(r.error, Some(OperationError::Aborted { .. })),
        "{r}"
    );
    assert_eq!(w.ledger.state(), JobState::Running);
    // The next session's pause is a new flow, accepted and answered once.
    w.from = Origin::new(2, "job-a");
    paused(&mut w, "u2");
    assert_eq!(w.sent_to.last().unwrap().session, 2);
}

#[test]
fn the_end_of_the_session_during_a_switch_rolls_back_and_after_it_keeps_it() {
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[1, 5]), &[true, true]);
    // The session ends while the switch runs: its result is owed to nobody any more, and
    // the switch is rolled back (nobody will continue it) before the gates open.
    assert!(w.session_end(1).is_empty());
    let got = w.settle();
    assert!(got.is_empty(), "{got:?}");
    let r = w.ledger.history().last().unwrap().clone();
    assert!(r.rolled_back && !r.applied, "{r}");
    assert_eq!(w.ledger.state(), JobState::Running);
    assert_eq!((w.table(), w.view()), (vec![], vec![]));
    // A late continue of the old uuid finds training running.
    one(w.signal(resume("u1")), recover_status(CODE_OK));
    // The session ends after the switch was answered: every group agrees on the new NICs,
    // so the job resumes on them.
    w.from = Origin::new(2, "job-a");
    paused(&mut w, "u2");
    w.switch(&ids(&[1, 5]), &[true, true]);
    one(w.settle(), |r| *r == Report::SwitchResult { ok: true });
    assert!(w.session_end(2).is_empty());
    assert!(w.settle().is_empty());
    assert_eq!(w.ledger.state(), JobState::Running);
    assert_eq!((w.table(), w.view()), (vec![1, 5], vec![1, 5]));
}

#[test]
fn the_end_of_the_session_after_continue_or_stop_lets_the_operation_end_as_told() {
    let mut w = world();
    paused(&mut w, "u1");
    w.signal(resume("u1"));
    assert!(w.session_end(1).is_empty());
    assert!(w.settle().is_empty(), "the RecoverStatus is dropped");
    assert_eq!(w.ledger.state(), JobState::Running);
    let r = w.ledger.history().last().unwrap().clone();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    // A stop_train'd pause ends held, unanswered, and training stops (ClusterD decided).
    w.from = Origin::new(2, "job-a");
    w.sent.clear(); // the first flow's resume is not this one's
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    assert!(w.session_end(2).is_empty());
    assert!(w.settle().is_empty());
    stopped_by_clusterd(&w, "stop_train s1");
}

#[test]
fn a_kill_master_while_pausing_ends_held_then_stops_training_when_its_session_ends() {
    let mut w = world();
    assert!(w.signal(pause("u1")).is_empty());
    assert!(w.answer(|_, _| Reply::Correct).is_empty(), "sampled");
    // killMaster before every rank holds, then ClusterD's reset ends the session: the
    // operation still ends held, nothing is answered, and training stops once it has.
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    assert!(w.session_end(1).is_empty());
    assert_eq!(stops_sent(&w), 0);
    assert!(w.settle().is_empty());
    stopped_by_clusterd(&w, "killMaster k1");
    assert!(w.reports.is_empty(), "{:?}", w.reports);
}

// ---------------------------------------------------------------------------------------------
// The sequencer's own states: the stage of the operation ClusterD drives, the one pending
// action, the requests it knows by kind and uuid.

fn list(ranks: &[u32], ops: &[bool]) -> RankList {
    RankList::new(&ids(ranks), ops)
}

#[test]
fn the_stage_follows_clusterds_requests() {
    let mut w = world();
    assert_eq!(w.seq.stage(), None);
    paused(&mut w, "u1");
    assert_eq!(w.seq.stage(), Some(&Stage::Paused));
    w.switch(&ids(&[1]), &[true]);
    let switching = Stage::Switching(list(&[1], &[true]));
    assert_eq!(w.seq.stage(), Some(&switching));
    one(w.settle(), |r| *r == Report::SwitchResult { ok: true });
    assert_eq!(
        w.seq.stage(),
        Some(&switching),
        "switched, still the pause's list"
    );
    w.signal(resume("u1"));
    let continued = Stage::Continued(Some(list(&[1], &[true])));
    assert_eq!(w.seq.stage(), Some(&continued));
    assert!(continued.told_to_end());
    one(w.settle(), recover_status(CODE_OK));
    assert_eq!((w.seq.stage(), w.seq.owed()), (None, 0));
    // A stop_train during the switch: the operation is stopping, keeping its list.
    paused(&mut w, "u2");
    w.switch(&ids(&[1]), &[false]);
    assert!(w.signal(Signal::StopTrain { uuid: "s2".into() }).is_empty());
    let stopping = Stage::Stopping {
        reason: "ClusterD stop_train s2".into(),
        list: Some(list(&[1], &[false])),
    };
    assert_eq!(w.seq.stage(), Some(&stopping));
    assert_eq!(w.seq.owed(), 2, "the switch result and the stop's answer");
    let got = w.settle();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], Report::SwitchResult { ok: true });
    assert!(stop_complete(CODE_OK)(&got[1]), "{got:?}");
    let stop = w.ledger.training_stop().expect("training stops");
    assert!(stop.reason.contains("stop_train s2"), "{stop}");
    assert_eq!(w.seq.stage(), None);
}

#[test]
fn a_continue_after_stop_train_leaves_the_operation_stopping() {
    let mut w = world();
    paused(&mut w, "u1");
    w.switch(&ids(&[2]), &[true]);
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    // ClusterD's continue after its stop_train: taken (answered once the operation is over),
    // and the stop still wins: every gate stays shut.
    assert!(w.signal(resume("u1")).is_empty());
    assert!(matches!(w.seq.stage(), Some(Stage::Stopping { .. })));
    assert!(w.signal(resume("u1")).is_empty(), "the continue again");
    let got = w.settle();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], Report::SwitchResult { ok: true });
    assert!(stop_complete(CODE_OK)(&got[1]), "{got:?}");
    assert!(recover_status(CODE_FAILED)(&got[2]), "{got:?}");
    stopped_by_clusterd(&w, "stop_train s1");
}

#[test]
fn a_rank_list_after_continue_is_the_pauses_one_refused_once() {
    let mut w = world();
    paused(&mut w, "u1");
    w.signal(resume("u1"));
    assert_eq!(w.seq.stage(), Some(&Stage::Continued(None)));
    one(w.switch(&ids(&[3]), &[true]), |r| {
        *r == Report::SwitchResult { ok: false }
    });
    assert_eq!(
        w.seq.stage(),
        Some(&Stage::Continued(Some(list(&[3], &[true]))))
    );
    assert!(
        w.switch(&ids(&[3]), &[true]).is_empty(),
        "the same list again"
    );
    one(w.settle(), recover_status(CODE_OK));
    assert_eq!(w.table(), Vec::<u32>::new());
}

#[test]
fn a_stop_train_while_resuming_is_pending_and_pauses_again_after() {
    let mut w = world();
    paused(&mut w, "u1");
    assert!(w.signal(resume("u1")).is_empty());
    assert!(matches!(
        w.pending.as_ref().map(|d| &d.kind),
        Some(DirectiveKind::Resume)
    ));
    // Too late to keep this operation held: the stop waits for it to end.
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    let from = w.from.clone();
    assert_eq!(
        w.seq.pending(),
        Some(&Pending::StopTrainAgain {
            uuid: "s1".into(),
            from
        })
    );
    assert!(
        w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty(),
        "the stop again"
    );
    // The first operation ends (its continue answered), a new pause holds every rank, and
    // the stop is answered once they hold; then training stops.
    let got = w.settle();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(recover_status(CODE_OK)(&got[0]), "{got:?}");
    assert!(stop_complete(CODE_OK)(&got[1]), "{got:?}");
    assert_eq!(w.seq.pending(), None);
    let stop = w.ledger.training_stop().expect("training stops");
    assert!(stop.reason.contains("stop_train s1"), "{stop}");
    assert_eq!(stops_sent(&w), 1);
}

#[test]
fn a_stop_train_pending_is_dropped_with_its_session() {
    let mut w = world();
    paused(&mut w, "u1");
    w.signal(resume("u1"));
    w.signal(Signal::StopTrain { uuid: "s1".into() });
    assert!(w.seq.pending().is_some());
    assert!(w.session_end(1).is_empty());
    assert_eq!(w.seq.pending(), None);
    assert!(w.settle().is_empty(), "the session's reports are dropped");
    assert_eq!(w.ledger.state(), JobState::Running);
    assert!(w.ledger.training_stop().is_none());
}

#[test]
fn kill_master_then_stop_train_while_resuming_stop_training_once() {
    let mut w = world();
    paused(&mut w, "u1");
    w.signal(resume("u1"));
    // killMaster as the gates open: too late to hold, the operation ends by itself and then
    // training stops; a stop_train after it is answered by that stop, and no new pause starts.
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    assert!(
        matches!(w.seq.stage(), Some(Stage::Stopping { reason, .. }) if reason.contains("killMaster k1"))
    );
    assert!(w.signal(Signal::StopTrain { uuid: "s1".into() }).is_empty());
    assert!(matches!(
        w.seq.pending(),
        Some(Pending::StopTrainAgain { .. })
    ));
    let got = w.settle();
    one(got, stop_complete(CODE_OK));
    assert_eq!(w.seq.pending(), None);
    assert!(w.seq.current().is_none() && w.ledger.in_flight().is_none());
    let stop = w.ledger.training_stop().expect("training stops");
    assert_eq!(stop.by, StopBy::Clusterd);
    assert!(stop.reason.contains("killMaster k1"), "{stop}");
    assert_eq!(stops_sent(&w), 1);
    assert!(
        !w.sent
            .iter()
            .any(|d| matches!(d.kind, DirectiveKind::Sample { .. }) && d.op != w.sent[0].op),
        "no second pause: {:?}",
        w.sent
    );
}

#[test]
fn kill_master_during_an_operators_switch_is_pending_until_it_ends() {
    let mut w = world();
    let cmd = w.layout.command(&[(2, true)]);
    let id = OperationId(uuid::Uuid::from_u128(78));
    let Ok(Submitted::Started { actions, .. }) = w.ledger.submit(&cmd, id, w.now) else {
        panic!("admitted");
    };
    w.run_actions(actions);
    assert!(w
        .signal(Signal::KillMaster { uuid: "k1".into() })
        .is_empty());
    assert_eq!(
        w.seq.pending(),
        Some(&Pending::StopTraining {
            reason: "ClusterD killMaster k1: the job restarts".into()
        })
    );
    assert_eq!(w.seq.stage(), None, "not ClusterD's operation");
    w.settle();
    assert_eq!(w.seq.pending(), None);
    assert!(w.ledger.training_stop().is_some());
}

#[test]
fn a_request_is_known_by_its_kind_and_uuid() {
    let mut w = world();
    let failing = SubmitError::JournalFailing {
        why: "writing /state/operations.json: No space left on device".into(),
    };
    one(
        w.signal_admitting(pause("u1"), Err(failing)),
        stop_complete(CODE_FAILED),
    );
    assert!(w.signal(pause("u1")).is_empty(), "the same pause again");
    // The same uuid in another kind of request is another request.
    one(w.signal(resume("u1")), recover_status(CODE_OK));
    assert!(w.signal(resume("u1")).is_empty(), "the same continue again");
    assert!(w.signal(Signal::StopTrain { uuid: "u1".into() }).is_empty());
    one(w.settle(), stop_complete(CODE_OK));
    stopped_by_clusterd(&w, "stop_train u1");
}
