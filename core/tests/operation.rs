//! Scripted tests of the operation state machine, one protocol story each (`docs/protocol.md`).
//!
//! The job is 2 nodes x 4 devices (ranks 0..8); the groups are `world`, `tp_0`/`tp_1` (per
//! node) and `dp_0..dp_3` (per device index). The operation starts at t = 100 s; deadlines are
//! pause 30 s, switch 20 s, rollback 25 s, resume 10 s.

mod common;

use common::*;
use taskd_core::operation::OperationError;
use taskd_core::protocol::{DirectiveKind, NodeReply, Phase, RankError, ReplyBody};
use taskd_core::{
    Action, DeviceId, Direction, Event, GlobalRank, HcclCode, JobState, LinkHealth, NicSide,
    OperationReport, Outcome,
};

const ALL: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
const NODE0: [u32; 4] = [0, 1, 2, 3];
const NODE1: [u32; 4] = [4, 5, 6, 7];

/// Ranks 1 (node-0 device 1) and 6 (node-1 device 2) to their backup NIC.
fn to_backup() -> (Harness, Vec<Action>) {
    Harness::start(
        Layout::new(2, 4),
        &[(1, true), (6, true)],
        &[(1, false), (6, false)],
        secs(100),
    )
}

/// Rank 1 to backup and rank 6 back to primary (6 is on backup now).
fn mixed() -> (Harness, Vec<Action>) {
    Harness::start(
        Layout::new(2, 4),
        &[(1, true), (6, false)],
        &[(1, false), (6, true)],
        secs(100),
    )
}

fn rank_failed(rank: u32, phase: Phase, error: RankError) -> OperationError {
    OperationError::RankFailed {
        rank: GlobalRank(rank),
        phase,
        error,
    }
}

// ---------------------------------------------------------------------------------------------
// The happy path
// ---------------------------------------------------------------------------------------------

#[test]
fn happy_path_samples_pauses_at_max_step_switches_and_resumes() {
    let (mut h, first) = to_backup();
    let id = h.id;
    assert_eq!(
        first,
        entered(
            id,
            DirectiveKind::Sample {
                targets: h.plan.targets.clone()
            },
            1,
            secs(130)
        )
    );
    assert_eq!(h.op.phase(), Phase::Sample);
    assert_eq!(h.pending(), ALL.to_vec());

    // node-0 answers: all in step 7. Nothing happens until every rank did.
    assert_eq!(h.sampled(secs(101), &NODE0, |_| 7), vec![]);
    assert_eq!(h.pending(), NODE1.to_vec());
    // node-1: rank 5 is already one step further.
    let a = h.sampled(secs(102), &NODE1, |r| if r == 5 { 8 } else { 7 });
    assert_eq!(
        a,
        entered(id, DirectiveKind::PauseAt { step: 8 }, 2, secs(132))
    );
    assert_eq!(h.op.phase(), Phase::Pause);
    assert_eq!(h.pending(), ALL.to_vec());

    assert_eq!(h.paused(secs(103), &NODE1, 8), vec![]);
    let a = h.paused(secs(104), &NODE0, 8);
    // Every rank calls, so the directive goes to every rank with the operator's targets.
    assert_eq!(
        a,
        entered(
            id,
            DirectiveKind::Switch {
                targets: vec![
                    (GlobalRank(1), NicSide::Backup),
                    (GlobalRank(6), NicSide::Backup)
                ],
                // Three quarters of the 20 s switch phase.
                call_timeout: secs(15),
            },
            3,
            secs(124)
        )
    );

    assert_eq!(h.applied(secs(105), Phase::Switch, &NODE0), vec![]);
    let a = h.applied(secs(107), Phase::Switch, &NODE1);
    assert_eq!(a, entered(id, DirectiveKind::Resume, 4, secs(117)));

    let a = h.resumed(secs(108), &ALL);
    assert_eq!(finishes(&a).len(), 1);
    assert_eq!(a.len(), 1, "only the Finish: {a:?}");
    assert_eq!(
        h.report(),
        OperationReport {
            applied: true,
            pause_step: Some(8),
            // Rank 5 was a step ahead of the others.
            sampled_steps: Some((7, 8)),
            // pause: 100 -> 104, switch: 104 -> 107, resume: 107 -> 108.
            phases: durations(Some(4), Some(3), None, Some(1), 8),
            stall: Some(millis(700)),
            ..OperationReport::new(
                id,
                Direction::ToBackup,
                h.plan.targets.clone(),
                Outcome::Succeeded
            )
        }
    );
    assert_eq!(
        h.phases(),
        vec![Phase::Sample, Phase::Pause, Phase::Switch, Phase::Resume]
    );
}

#[test]
fn ranks_one_step_apart_pause_at_the_later_step_whoever_answers_first() {
    // The later step arrives first, then the earlier one: T is still the maximum.
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &NODE1, |_| 42);
    let a = h.sampled(secs(101), &NODE0, |_| 41);
    assert_eq!(broadcasts(&a)[0].kind, DirectiveKind::PauseAt { step: 42 });
    h.paused(secs(102), &ALL, 42);
    h.applied(secs(103), Phase::Switch, &ALL);
    h.resumed(secs(104), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.pause_step, Some(42));

    // The other way round.
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &NODE0, |r| if r == 0 { 42 } else { 41 });
    let a = h.sampled(secs(101), &NODE1, |_| 41);
    assert_eq!(broadcasts(&a)[0].kind, DirectiveKind::PauseAt { step: 42 });
}

#[test]
fn a_rank_that_holds_at_the_wrong_step_fails_the_pause_and_changes_nothing() {
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &ALL, |r| if r < 4 { 41 } else { 42 });
    assert_eq!(h.paused(secs(102), &[0, 1, 2], 42), vec![]);
    let a = h.one(secs(103), 3, Phase::Pause, ReplyBody::Paused { step: 41 });
    assert_eq!(a, entered(h.id, DirectiveKind::Resume, 3, secs(113)));
    h.resumed(secs(104), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(OperationError::WrongPauseStep {
            rank: GlobalRank(3),
            got: 41,
            expected: 42
        })
    );
    assert!(!r.applied);
    assert!(!r.rolled_back);
    assert_eq!(r.pause_step, None);
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(r.phases, durations(Some(3), None, None, Some(1), 4));
    assert_eq!(h.phases(), vec![Phase::Sample, Phase::Pause, Phase::Resume]);
}

// ---------------------------------------------------------------------------------------------
// Failure and rollback
// ---------------------------------------------------------------------------------------------

#[test]
fn hal_failure_in_switch_rolls_back_with_previous_values_and_resumes() {
    let (mut h, _) = mixed();
    let id = h.id;
    h.run_to_switch(100, 9);
    // Ranks 0..4 applied; rank 5's HCCL call on tp_1 failed.
    assert_eq!(h.applied(secs(103), Phase::Switch, &NODE0), vec![]);
    let err = hal_failure("tp_1", HcclCode::RoceConnect);
    let a = h.one(secs(105), 5, Phase::Switch, ReplyBody::Failed(err.clone()));
    // Not while ranks 4, 6 and 7 may still be inside their switch calls (a late call would
    // pair with a peer's rollback call): once they answered, every rank re-applies the
    // targets' old state.
    assert_eq!(a, vec![]);
    let a = h.applied(secs(105), Phase::Switch, &[4, 6, 7]);
    assert_eq!(
        a,
        entered(
            id,
            DirectiveKind::Rollback {
                targets: vec![
                    (GlobalRank(1), NicSide::Primary),
                    (GlobalRank(6), NicSide::Backup)
                ],
                restate: vec![],
                call_timeout: DEADLINES.call_timeout(Phase::Rollback),
            },
            4,
            secs(130)
        )
    );
    assert_eq!(h.op.phase(), Phase::Rollback);
    assert_eq!(h.pending(), ALL.to_vec());

    // The late switch answers of 4, 6, 7 steer nothing.
    assert_eq!(h.applied(secs(106), Phase::Switch, &[4, 6, 7]), vec![]);
    assert_eq!(h.pending(), ALL.to_vec());

    assert_eq!(h.applied(secs(107), Phase::Rollback, &NODE1), vec![]);
    let a = h.applied(secs(108), Phase::Rollback, &NODE0);
    assert_eq!(a, entered(id, DirectiveKind::Resume, 5, secs(118)));
    h.resumed(secs(109), &ALL);

    assert_eq!(
        h.report(),
        OperationReport {
            error: Some(rank_failed(5, Phase::Switch, err.clone())),
            rank_errors: vec![(GlobalRank(5), Phase::Switch, err)],
            rolled_back: true,
            pause_step: Some(9),
            sampled_steps: Some((9, 9)),
            // pause 100 -> 102, switch 102 -> 105, rollback 105 -> 108, resume 108 -> 109.
            phases: durations(Some(2), Some(3), Some(3), Some(1), 9),
            stall: Some(millis(700)),
            ..OperationReport::new(
                id,
                Direction::Mixed,
                h.plan.targets.clone(),
                Outcome::Failed
            )
        }
    );
    let text = h.report().to_string();
    assert!(text.contains("failed"), "{text}");
    assert!(text.contains("rolled back: true, job running"), "{text}");
    assert!(text.contains("rank 5 failed in switch"), "{text}");
}

#[test]
fn a_failure_during_rollback_finishes_failed_and_keeps_the_job_paused() {
    let (mut h, _) = mixed();
    h.run_to_switch(100, 9);
    let switch_err = hal_failure("world", HcclCode::Network);
    h.one(
        secs(103),
        0,
        Phase::Switch,
        ReplyBody::Failed(switch_err.clone()),
    );
    // The rollback waits for every other rank's answer to the switch.
    assert_eq!(h.op.phase(), Phase::Switch);
    let others = h.all_but(&[0]);
    h.applied(secs(103), Phase::Switch, &others);
    assert_eq!(h.op.phase(), Phase::Rollback);
    assert_eq!(h.applied(secs(104), Phase::Rollback, &[0, 1, 3]), vec![]);
    let rb_err = hal_failure("dp_2", HcclCode::Timeout);
    let a = h.one(
        secs(106),
        2,
        Phase::Rollback,
        ReplyBody::Failed(rb_err.clone()),
    );
    // Finish, and nothing else: no Resume, the gates stay shut.
    assert_eq!(a.len(), 1);
    assert_eq!(finishes(&a).len(), 1);
    assert_eq!(
        h.phases(),
        vec![Phase::Sample, Phase::Pause, Phase::Switch, Phase::Rollback]
    );
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(rank_failed(0, Phase::Switch, switch_err.clone()))
    );
    assert_eq!(
        r.rollback_error,
        Some(rank_failed(2, Phase::Rollback, rb_err.clone()))
    );
    assert_eq!(
        r.rank_errors,
        vec![
            (GlobalRank(0), Phase::Switch, switch_err),
            (GlobalRank(2), Phase::Rollback, rb_err)
        ]
    );
    assert!(!r.rolled_back);
    assert!(!r.applied);
    assert_eq!(r.job_state, JobState::Paused);
    assert_eq!(r.pause_step, Some(9));
    assert_eq!(r.phases, durations(Some(2), Some(1), Some(3), None, 6));
    assert!(
        r.to_string().contains("rolled back: false, job paused"),
        "{r}"
    );

    // The remaining rollback answers arrive after the finish: ignored, still no Resume.
    assert_eq!(h.applied(secs(107), Phase::Rollback, &NODE1), vec![]);
    assert!(!h.phases().contains(&Phase::Resume));
}

#[test]
fn rollback_deadline_or_disagreement_keeps_the_job_paused() {
    // Deadline: ranks 6 and 7 never answer the rollback.
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &[0, 1, 2, 3, 4, 5, 6]);
    h.one(
        secs(122),
        7,
        Phase::Switch,
        ReplyBody::Failed(hal_failure("tp_1", HcclCode::Timeout)),
    );
    assert_eq!(h.op.phase(), Phase::Rollback);
    assert_eq!(h.token(), 4);
    h.applied(secs(123), Phase::Rollback, &[0, 1, 2, 3, 4, 5]);
    let a = h.fire(secs(147));
    assert_eq!(a.len(), 1);
    let r = h.report();
    assert_eq!(
        r.rollback_error,
        Some(OperationError::Timeout {
            phase: Phase::Rollback,
            deadline: secs(25),
            missing: "6, 7".into()
        })
    );
    assert!(
        matches!(
            r.error,
            Some(OperationError::RankFailed {
                rank: GlobalRank(7),
                phase: Phase::Switch,
                ..
            })
        ),
        "{:?}",
        r.error
    );
    assert!(!r.rolled_back);
    assert_eq!(r.job_state, JobState::Paused);
    assert_eq!(r.phases, durations(Some(2), Some(20), Some(25), None, 47));
    assert!(!h.phases().contains(&Phase::Resume));

    // Disagreement: every rank answers the rollback, but rank 4 made a different dp_0 call.
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.one(
        secs(103),
        7,
        Phase::Switch,
        ReplyBody::Failed(hal_failure("tp_1", HcclCode::Para)),
    );
    h.applied(secs(103), Phase::Switch, &[0, 1, 2, 3, 4, 5, 6]);
    h.applied(secs(104), Phase::Rollback, &[0, 1, 2, 3, 5, 6, 7]);
    let mut calls = h.calls(4, Phase::Rollback);
    assert_eq!(calls[0].group, "tp_1");
    calls[0].digest ^= 1;
    let a = h.one(secs(105), 4, Phase::Rollback, ReplyBody::Applied { calls });
    assert_eq!(a.len(), 1, "finish only: {a:?}");
    let r = h.report();
    assert!(
        matches!(
            &r.rollback_error,
            Some(OperationError::GroupDisagrees { group, phase: Phase::Rollback, detail })
                if group == "tp_1" && detail.contains("from ranks 4") && detail.contains("from ranks 5, 6, 7")
        ),
        "{:?}",
        r.rollback_error
    );
    assert!(!r.rolled_back);
    assert_eq!(r.job_state, JobState::Paused);
}

/// Ranks still inside their switch calls at the deadline: a rollback call would pair with one
/// of their late calls on some group, so nothing more is called and every gate stays shut.
#[test]
fn switch_deadline_with_ranks_inside_their_calls_ends_paused_without_a_rollback() {
    let (mut h, _) = mixed();
    h.run_to_switch(100, 3);
    assert_eq!(h.token(), 3);
    h.applied(secs(110), Phase::Switch, &NODE0);
    let a = h.fire(secs(122));
    assert!(broadcasts(&a).is_empty(), "{a:?}");
    assert_eq!(finishes(&a).len(), 1);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(OperationError::Timeout {
            phase: Phase::Switch,
            deadline: secs(20),
            missing: "4, 5, 6, 7".into()
        })
    );
    assert!(!r.rolled_back && !r.applied);
    assert_eq!(r.job_state, JobState::Paused);
    assert_eq!(r.phases, durations(Some(2), Some(20), None, None, 22));
    assert_eq!(
        h.op.left_in_calls(),
        Some((
            Phase::Switch,
            [4, 5, 6, 7].into_iter().map(GlobalRank).collect()
        ))
    );
    assert!(!h.phases().contains(&Phase::Rollback));
    assert!(!h.phases().contains(&Phase::Resume));
}

#[test]
fn pause_deadline_resumes_with_nothing_changed() {
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &ALL, |_| 5);
    h.paused(secs(102), &NODE0, 5);
    let a = h.fire(secs(131));
    assert_eq!(a, entered(h.id, DirectiveKind::Resume, 3, secs(141)));
    h.resumed(secs(132), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(OperationError::Timeout {
            phase: Phase::Pause,
            deadline: secs(30),
            missing: "4, 5, 6, 7".into()
        })
    );
    assert!(!r.applied);
    assert!(!r.rolled_back);
    assert_eq!(r.pause_step, None);
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(r.phases, durations(Some(31), None, None, Some(1), 32));
    assert_eq!(h.phases(), vec![Phase::Sample, Phase::Pause, Phase::Resume]);
}

#[test]
fn sample_deadline_resumes_with_nothing_changed() {
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &[0, 1, 2, 3, 4, 5, 7], |_| 5);
    let a = h.fire(secs(130));
    assert_eq!(a, entered(h.id, DirectiveKind::Resume, 2, secs(140)));
    h.resumed(secs(131), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(OperationError::Timeout {
            phase: Phase::Sample,
            deadline: secs(30),
            missing: "6".into()
        })
    );
    assert!(!r.applied && !r.rolled_back);
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(h.phases(), vec![Phase::Sample, Phase::Resume]);
}

#[test]
fn resume_deadline_finishes_failed_and_the_job_is_not_known_to_run() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &ALL);
    h.resumed(secs(104), &[0, 1, 2, 3, 4, 5, 6]);
    let a = h.fire(secs(113));
    assert_eq!(a.len(), 1);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error,
        Some(OperationError::Timeout {
            phase: Phase::Resume,
            deadline: secs(10),
            missing: "7".into()
        })
    );
    // The switch itself went through on every group: the NIC table must follow it.
    assert!(r.applied);
    assert_eq!(r.job_state, JobState::NeedsRecovery);
}

#[test]
fn a_rank_that_fails_to_resume_leaves_the_job_not_running() {
    // After a good switch.
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &ALL);
    h.resumed(secs(104), &[0, 1, 2, 4, 5, 6, 7]);
    let err = RankError {
        group: Some("tp_0".into()),
        hal: Some(taskd_core::HalError::new(
            "HcclCommResume",
            HcclCode::Internal,
            "resume",
        )),
        message: "HcclCommResume failed".into(),
    };
    let a = h.one(secs(105), 3, Phase::Resume, ReplyBody::Failed(err.clone()));
    assert_eq!(finishes(&a).len(), 1);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.error, Some(rank_failed(3, Phase::Resume, err.clone())));
    assert!(r.applied);
    assert!(!r.rolled_back);
    assert_ne!(
        r.job_state,
        JobState::Running,
        "rank 3's gate is not known to be open"
    );

    // After a failed pause (nothing changed): the same holds.
    let (mut h, _) = to_backup();
    h.one(secs(101), 0, Phase::Sample, ReplyBody::Failed(err.clone()));
    h.resumed(secs(102), &[0, 1, 2, 4, 5, 6, 7]);
    h.one(secs(103), 3, Phase::Resume, ReplyBody::Failed(err));
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_ne!(r.job_state, JobState::Running);
}

// ---------------------------------------------------------------------------------------------
// Link health in the sample phase
// ---------------------------------------------------------------------------------------------

fn health(device: u32, primary_up: bool, backup_up: bool) -> LinkHealth {
    LinkHealth::new(DeviceId(device), primary_up, backup_up)
}

fn sample_with_health(
    h: &mut Harness,
    node: u32,
    ranks: &[u32],
    hs: Vec<LinkHealth>,
) -> Vec<Action> {
    let replies = ranks
        .iter()
        .map(|r| {
            rank_reply(
                h.id,
                *r,
                Phase::Sample,
                ReplyBody::Sampled {
                    in_step: 3,
                    in_flight: false,
                },
            )
        })
        .collect();
    let nr = NodeReply {
        node: h.layout.node_name(node),
        op: h.id,
        phase: Phase::Sample,
        replies,
        health: hs,
    };
    h.send(Event::Replies(nr), secs(101))
}

#[test]
fn link_down_in_the_sample_phase_rejects_and_reopens_the_gates() {
    let (mut h, _) = to_backup();
    // node-1 reports its targeted device 2 (rank 6) has no backup link; node-0 has not answered.
    let a = sample_with_health(&mut h, 1, &NODE1, vec![health(2, true, false)]);
    assert_eq!(a, entered(h.id, DirectiveKind::Resume, 2, secs(111)));
    // node-0's sample answer comes late: ignored.
    assert_eq!(h.sampled(secs(101), &NODE0, |_| 3), vec![]);
    h.resumed(secs(102), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Rejected);
    assert_eq!(
        r.error,
        Some(OperationError::LinkDown {
            node: "node-1".into(),
            device: DeviceId(2),
            rank: GlobalRank(6),
            side: NicSide::Backup
        })
    );
    assert!(!r.applied && !r.rolled_back);
    assert_eq!(r.pause_step, None);
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(h.phases(), vec![Phase::Sample, Phase::Resume]);
    assert!(r.to_string().contains("rejected"), "{r}");

    // Switching back onto a down primary is refused the same way.
    let (mut h, _) = mixed();
    sample_with_health(&mut h, 1, &NODE1, vec![health(2, false, true)]);
    h.resumed(secs(102), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Rejected);
    assert!(matches!(
        r.error,
        Some(OperationError::LinkDown {
            rank: GlobalRank(6),
            side: NicSide::Primary,
            ..
        })
    ));
}

#[test]
fn an_unknown_target_link_rejects_with_the_reason_not_as_down() {
    let (mut h, _) = to_backup();
    // node-1's DCMI probe of device 2's backup NIC did not answer in time.
    let unknown = health(2, true, true).with_unknown(
        NicSide::Backup,
        "dcmi_get_device_network_health of card 1 chip 1 did not answer within 1s",
    );
    let a = sample_with_health(&mut h, 1, &NODE1, vec![unknown]);
    assert_eq!(a, entered(h.id, DirectiveKind::Resume, 2, secs(111)));
    h.resumed(secs(102), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Rejected);
    assert_eq!(
        r.error,
        Some(OperationError::LinkUnknown {
            node: "node-1".into(),
            device: DeviceId(2),
            rank: GlobalRank(6),
            side: NicSide::Backup,
            reason: "dcmi_get_device_network_health of card 1 chip 1 did not answer within 1s"
                .into(),
        })
    );
    let msg = r.error.as_ref().unwrap().to_string();
    assert!(
        msg.contains("backup NIC link of node-1:2") && msg.contains("within 1s"),
        "{msg}"
    );
    assert!(!r.applied && !r.rolled_back);

    // An unknown primary does not stop a move to backup: the primary is what is left.
    let (mut h, _) = to_backup();
    let primary_unknown = health(2, true, true).with_unknown(NicSide::Primary, "probe failed");
    assert_eq!(
        sample_with_health(&mut h, 1, &NODE1, vec![primary_unknown]),
        vec![]
    );
}

#[test]
fn a_down_link_on_the_other_side_or_an_untargeted_device_is_no_reason_to_reject() {
    let (mut h, _) = to_backup();
    // Rank 6 goes to backup: its primary being down is why the operator switches.
    // Device 3 of node-1 is not a target. Device 2 of node-0 is not a target either.
    assert_eq!(
        sample_with_health(
            &mut h,
            1,
            &NODE1,
            vec![health(2, false, true), health(3, false, false)]
        ),
        vec![]
    );
    let a = sample_with_health(
        &mut h,
        0,
        &NODE0,
        vec![health(1, false, true), health(2, false, false)],
    );
    assert_eq!(broadcasts(&a)[0].kind, DirectiveKind::PauseAt { step: 3 });
    // Health on a later phase's message is not looked at.
    let nr = NodeReply {
        node: "node-1".into(),
        op: h.id,
        phase: Phase::Pause,
        replies: vec![],
        health: vec![health(2, false, false)],
    };
    assert_eq!(h.send(Event::Replies(nr), secs(102)), vec![]);
    assert_eq!(h.op.phase(), Phase::Pause);
}

// ---------------------------------------------------------------------------------------------
// Cross-rank agreement on the calls
// ---------------------------------------------------------------------------------------------

/// Every rank but `odd` answers the switch correctly; `odd` answers with `calls`.
fn switch_with(odd: u32, calls: Vec<taskd_core::protocol::AppliedCall>) -> Harness {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    let others = h.all_but(&[odd]);
    assert_eq!(h.applied(secs(103), Phase::Switch, &others), vec![]);
    let a = h.one(secs(104), odd, Phase::Switch, ReplyBody::Applied { calls });
    assert_eq!(
        broadcasts(&a)[0].kind,
        DirectiveKind::Rollback {
            targets: vec![
                (GlobalRank(1), NicSide::Primary),
                (GlobalRank(6), NicSide::Primary)
            ],
            restate: vec![],
            call_timeout: DEADLINES.call_timeout(Phase::Rollback),
        },
        "{a:?}"
    );
    h.applied(secs(105), Phase::Rollback, &ALL);
    h.resumed(secs(106), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.rolled_back);
    assert!(!r.applied);
    assert_eq!(r.job_state, JobState::Running);
    h
}

#[test]
fn two_members_reporting_different_digests_fail_the_switch_and_roll_back() {
    let (h, _) = to_backup();
    // Rank 3's calls: tp_0 (rank 1 is a member) and world; it reports a different world call.
    let mut calls = h.calls(3, Phase::Switch);
    assert_eq!(
        calls.iter().map(|c| c.group.as_str()).collect::<Vec<_>>(),
        vec!["tp_0", "world"]
    );
    calls[1].digest = calls[1].digest.wrapping_add(1);
    let h = switch_with(3, calls);
    let r = h.report();
    match r.error {
        Some(OperationError::GroupDisagrees {
            group,
            phase,
            detail,
        }) => {
            assert_eq!(group, "world");
            assert_eq!(phase, Phase::Switch);
            assert!(detail.contains("from ranks 3"), "{detail}");
            assert!(
                detail.contains("from ranks 0, 1, 2, 4, 5, 6, 7"),
                "{detail}"
            );
        }
        e => panic!("expected a disagreement, got {e:?}"),
    }
}

#[test]
fn fewer_reporters_than_the_group_size_fail_the_switch_and_roll_back() {
    let (h, _) = to_backup();
    // Rank 2 leaves out its dp_2 call (dp_2 = ranks 2 and 6; rank 6 is a target).
    let calls: Vec<_> = h
        .calls(2, Phase::Switch)
        .into_iter()
        .filter(|c| c.group != "dp_2")
        .collect();
    assert_eq!(calls.len(), 2);
    let h = switch_with(2, calls);
    assert_eq!(
        h.report().error,
        Some(OperationError::GroupDisagrees {
            group: "dp_2".into(),
            phase: Phase::Switch,
            detail: "1 of 2 members reported the call".into()
        })
    );
}

#[test]
fn calls_reported_out_of_name_order_are_a_disagreement() {
    let (h, _) = to_backup();
    let mut calls = h.calls(2, Phase::Switch);
    assert_eq!(
        calls.iter().map(|c| c.group.as_str()).collect::<Vec<_>>(),
        vec!["dp_2", "tp_0", "world"]
    );
    calls.reverse();
    let h = switch_with(2, calls);
    assert_eq!(
        h.report().error,
        Some(OperationError::GroupDisagrees {
            group: "tp_0".into(),
            phase: Phase::Switch,
            detail: "rank 2 called it out of the planned order".into()
        })
    );
}

#[test]
fn the_same_group_reported_twice_is_a_disagreement() {
    let (h, _) = to_backup();
    let mut calls = h.calls(0, Phase::Switch);
    calls.push(calls.last().unwrap().clone());
    let h = switch_with(0, calls);
    assert!(matches!(
        h.report().error,
        Some(OperationError::GroupDisagrees { group, .. }) if group == "world"
    ));
}

// ---------------------------------------------------------------------------------------------
// Lost workers
// ---------------------------------------------------------------------------------------------

fn lost(rank: u32, phase: Phase) -> OperationError {
    OperationError::WorkerLost {
        rank: GlobalRank(rank),
        phase,
        reason: format!("connection of rank {rank} closed"),
    }
}

#[test]
fn worker_lost_in_sample_or_pause_resumes_the_others_and_needs_recovery() {
    for phase in [Phase::Sample, Phase::Pause] {
        let (mut h, _) = to_backup();
        if phase == Phase::Pause {
            h.sampled(secs(101), &ALL, |_| 2);
        }
        let a = h.lose(secs(102), 3);
        let token = if phase == Phase::Sample { 2 } else { 3 };
        assert_eq!(
            a,
            entered(h.id, DirectiveKind::Resume, token, secs(112)),
            "{phase}"
        );
        // The resume waits for the living only.
        assert_eq!(h.pending(), vec![0, 1, 2, 4, 5, 6, 7]);
        h.resumed(secs(103), &[0, 1, 2, 4, 5, 6, 7]);
        let r = h.report();
        assert_eq!(r.outcome, Outcome::Failed, "{phase}");
        assert_eq!(r.error, Some(lost(3, phase)));
        assert_eq!(r.lost_ranks, vec![GlobalRank(3)]);
        assert_eq!(r.job_state, JobState::NeedsRecovery);
        assert!(!r.applied && !r.rolled_back);
        assert!(!h.phases().contains(&Phase::Switch));
    }
}

/// A rank lost in the switch: every call on its groups can only time out, each member at its
/// own moment, so no rollback is called; the job waits, held, for the rank and a recovery.
#[test]
fn worker_lost_in_switch_ends_held_without_calling_hccl_again() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &[0, 1, 2]);
    let a = h.lose(secs(104), 3);
    // The live ranks still inside their switch calls answer first.
    assert!(broadcasts(&a).is_empty());
    let a = h.applied(secs(104), Phase::Switch, &[4, 5, 6, 7]);
    assert!(broadcasts(&a).is_empty(), "{a:?}");
    assert_eq!(finishes(&a).len(), 1);
    assert!(!h.phases().contains(&Phase::Rollback));
    assert!(!h.phases().contains(&Phase::Resume));
    let r = h.report();
    assert_eq!(r.error, Some(lost(3, Phase::Switch)));
    assert!(!r.rolled_back && r.rollback_error.is_none());
    assert_eq!(r.lost_ranks, vec![GlobalRank(3)]);
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    assert_eq!(
        h.op.left_in_calls(),
        Some((Phase::Switch, [GlobalRank(3)].into_iter().collect()))
    );
}

#[test]
fn worker_lost_in_rollback_finishes_at_once_without_resume() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &[0, 1, 2, 3, 4, 5, 6]);
    h.one(
        secs(122),
        7,
        Phase::Switch,
        ReplyBody::Failed(hal_failure("tp_1", HcclCode::Timeout)),
    );
    h.applied(secs(123), Phase::Rollback, &[0, 1]);
    let a = h.lose(secs(124), 6);
    assert_eq!(a.len(), 1);
    let r = h.report();
    assert_eq!(r.rollback_error, Some(lost(6, Phase::Rollback)));
    assert!(!r.rolled_back);
    assert_eq!(r.lost_ranks, vec![GlobalRank(6)]);
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    assert!(!h.phases().contains(&Phase::Resume));
}

#[test]
fn worker_lost_in_resume_after_a_good_switch_keeps_the_switch_and_needs_recovery() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &ALL);
    h.resumed(secs(104), &[0, 1, 2, 3, 4, 5]);
    assert_eq!(h.lose(secs(105), 7), vec![]);
    let a = h.resumed(secs(106), &[6]);
    assert_eq!(finishes(&a).len(), 1);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.error, Some(lost(7, Phase::Resume)));
    assert!(r.applied);
    assert_eq!(r.job_state, JobState::NeedsRecovery);
}

#[test]
fn losses_of_unknown_or_already_lost_ranks_are_ignored() {
    let (mut h, _) = to_backup();
    assert_eq!(h.lose(secs(101), 8), vec![]);
    assert_eq!(h.lose(secs(101), 1000), vec![]);
    assert_eq!(h.op.phase(), Phase::Sample);
    assert_eq!(h.pending(), ALL.to_vec());
    h.lose(secs(102), 2);
    assert_eq!(h.op.phase(), Phase::Resume);
    assert_eq!(h.lose(secs(103), 2), vec![]);
    h.resumed(secs(104), &h.all_but(&[2]));
    assert_eq!(h.report().lost_ranks, vec![GlobalRank(2)]);
}

#[test]
fn when_every_rank_is_lost_the_operation_finishes_at_once() {
    // A one-die job moves back to primary (to backup would need the partner die in the job).
    let (mut h, _) = Harness::start(Layout::new(1, 1), &[(0, false)], &[(0, true)], secs(100));
    let a = h.lose(secs(101), 0);
    // The resume is still sent (a reconnecting worker may read it), then the result.
    assert_eq!(broadcast_phases(&a), vec![Phase::Resume]);
    assert_eq!(finishes(&a).len(), 1);
    assert!(matches!(a.last(), Some(Action::Finish(_))));
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    assert_eq!(r.lost_ranks, vec![GlobalRank(0)]);
}

// ---------------------------------------------------------------------------------------------
// What must be ignored
// ---------------------------------------------------------------------------------------------

#[test]
fn stale_deadline_tokens_are_ignored() {
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &ALL, |_| 4);
    assert_eq!(h.token(), 2);
    // The sample deadline (token 1) fires after the phase moved on: nothing.
    assert_eq!(h.send(Event::Deadline { token: 1 }, secs(130)), vec![]);
    assert_eq!(h.send(Event::Deadline { token: 0 }, secs(130)), vec![]);
    assert_eq!(h.send(Event::Deadline { token: 99 }, secs(130)), vec![]);
    assert_eq!(h.op.phase(), Phase::Pause);
    assert_eq!(h.pending(), ALL.to_vec());
    h.paused(secs(131), &ALL, 4);
    h.applied(secs(132), Phase::Switch, &ALL);
    for t in 1..=3 {
        assert_eq!(h.send(Event::Deadline { token: t }, secs(200)), vec![]);
    }
    assert_eq!(h.op.phase(), Phase::Resume);
    h.resumed(secs(201), &ALL);
    assert_eq!(h.report().outcome, Outcome::Succeeded);
}

#[test]
fn replies_for_other_operations_or_other_phases_are_ignored() {
    let (mut h, _) = to_backup();
    let other = op_id(7);
    // A whole message for another operation, with a failure and a down link in it.
    let nr = NodeReply {
        node: "node-0".into(),
        op: other,
        phase: Phase::Sample,
        replies: vec![rank_reply(
            other,
            0,
            Phase::Sample,
            ReplyBody::Failed(hal_failure("world", HcclCode::Network)),
        )],
        health: vec![health(1, false, false)],
    };
    assert_eq!(h.send(Event::Replies(nr), secs(101)), vec![]);
    // Our message carrying one rank reply of another operation.
    let nr = NodeReply {
        node: "node-0".into(),
        op: h.id,
        phase: Phase::Sample,
        replies: vec![
            rank_reply(
                other,
                1,
                Phase::Sample,
                ReplyBody::Sampled {
                    in_step: 1,
                    in_flight: false,
                },
            ),
            rank_reply(
                other,
                2,
                Phase::Sample,
                ReplyBody::Failed(hal_failure("world", HcclCode::Network)),
            ),
        ],
        health: vec![],
    };
    assert_eq!(h.send(Event::Replies(nr), secs(101)), vec![]);
    // Replies for a later phase while sampling.
    assert_eq!(h.paused(secs(101), &ALL, 0), vec![]);
    assert_eq!(h.applied(secs(101), Phase::Switch, &ALL), vec![]);
    assert_eq!(h.resumed(secs(101), &ALL), vec![]);
    // Rank 0 answers for real (so T = 2 below comes from it too) ...
    assert_eq!(
        h.one(
            secs(101),
            0,
            Phase::Sample,
            ReplyBody::Sampled {
                in_step: 2,
                in_flight: false
            }
        ),
        vec![]
    );
    // ... and a reply from a rank the job does not have, with a huge step, is ignored.
    let nr = NodeReply {
        node: "node-1".into(),
        op: h.id,
        phase: Phase::Sample,
        replies: vec![rank_reply(
            h.id,
            8,
            Phase::Sample,
            ReplyBody::Sampled {
                in_step: 900,
                in_flight: false,
            },
        )],
        health: vec![],
    };
    assert_eq!(h.send(Event::Replies(nr), secs(101)), vec![]);
    assert_eq!(h.op.phase(), Phase::Sample);
    assert_eq!(h.pending(), vec![1, 2, 3, 4, 5, 6, 7]);

    let a = h.sampled(secs(102), &[1, 2, 3, 4, 5, 6, 7], |_| 2);
    assert_eq!(broadcasts(&a)[0].kind, DirectiveKind::PauseAt { step: 2 });
    // A late sample answer in the pause phase.
    assert_eq!(h.sampled(secs(102), &[0], |_| 50), vec![]);
    h.paused(secs(103), &ALL, 2);
    h.applied(secs(104), Phase::Switch, &ALL);
    h.resumed(secs(105), &ALL);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.pause_step, Some(2));
    assert_eq!(
        r.rank_errors,
        vec![],
        "other operations' failures are not ours"
    );
}

#[test]
fn duplicate_replies_are_ignored() {
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &NODE0, |_| 5);
    // A repeated answer of rank 0 with another step must not move T.
    assert_eq!(h.sampled(secs(101), &[0], |_| 77), vec![]);
    let a = h.sampled(secs(102), &NODE1, |_| 5);
    assert_eq!(broadcasts(&a)[0].kind, DirectiveKind::PauseAt { step: 5 });
    h.paused(secs(103), &ALL, 5);
    // Rank 0 applies correctly, then a garbled copy of its answer arrives: only the first counts.
    h.applied(secs(104), Phase::Switch, &[0]);
    let mut bad = h.calls(0, Phase::Switch);
    bad[0].digest ^= 0xff;
    assert_eq!(
        h.one(
            secs(104),
            0,
            Phase::Switch,
            ReplyBody::Applied { calls: bad }
        ),
        vec![]
    );
    let a = h.applied(secs(105), Phase::Switch, &h.all_but(&[0]));
    assert_eq!(broadcast_phases(&a), vec![Phase::Resume]);
    h.resumed(secs(106), &ALL);
    assert_eq!(h.resumed(secs(106), &ALL), vec![], "after finish");
    assert_eq!(h.report().outcome, Outcome::Succeeded);
}

#[test]
fn a_duplicated_failure_is_reported_once() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    let err = hal_failure("tp_1", HcclCode::Network);
    h.one(secs(103), 5, Phase::Switch, ReplyBody::Failed(err.clone()));
    // The transport delivers it again (a reconnect replays the last message).
    assert_eq!(
        h.one(secs(103), 5, Phase::Switch, ReplyBody::Failed(err.clone())),
        vec![]
    );
    let others = h.all_but(&[5]);
    h.applied(secs(103), Phase::Switch, &others);
    h.applied(secs(104), Phase::Rollback, &ALL);
    h.resumed(secs(105), &ALL);
    let r = h.report();
    assert_eq!(r.rank_errors, vec![(GlobalRank(5), Phase::Switch, err)]);
    assert!(r.rolled_back);
}

#[test]
fn a_reply_whose_body_does_not_answer_its_phase_is_not_an_answer() {
    // Rank 3 answers the pause with a step sample instead of `paused`: it has not confirmed it
    // holds, so the switch must not be sent on its account.
    let (mut h, _) = to_backup();
    h.sampled(secs(101), &ALL, |_| 6);
    h.paused(secs(102), &h.all_but(&[3]), 6);
    let a = h.one(
        secs(102),
        3,
        Phase::Pause,
        ReplyBody::Sampled {
            in_step: 6,
            in_flight: false,
        },
    );
    assert_eq!(a, vec![], "no switch on a non-answer");
    assert_eq!(h.pending(), vec![3]);
    // Same for the switch: a `resumed` is not an `applied`.
    h.paused(secs(103), &[3], 6);
    assert_eq!(h.op.phase(), Phase::Switch);
    h.applied(secs(104), Phase::Switch, &h.all_but(&[4]));
    assert_eq!(
        h.one(
            secs(104),
            4,
            Phase::Switch,
            ReplyBody::Resumed { stalled: secs(1) }
        ),
        vec![]
    );
    assert_eq!(h.pending(), vec![4]);
    let a = h.applied(secs(105), Phase::Switch, &[4]);
    assert_eq!(broadcast_phases(&a), vec![Phase::Resume]);
}

#[test]
fn after_finish_every_event_is_ignored() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 1);
    h.applied(secs(103), Phase::Switch, &ALL);
    h.resumed(secs(104), &ALL);
    let before = h.report();
    let n = h.log.len();
    assert!(h.op.is_finished());
    assert_eq!(h.fire(secs(200)), vec![]);
    for t in 0..6 {
        assert_eq!(h.send(Event::Deadline { token: t }, secs(200)), vec![]);
    }
    assert_eq!(h.lose(secs(200), 0), vec![]);
    assert_eq!(
        h.one(
            secs(200),
            1,
            Phase::Resume,
            ReplyBody::Failed(hal_failure("world", HcclCode::Drv))
        ),
        vec![]
    );
    for phase in [Phase::Sample, Phase::Pause, Phase::Switch, Phase::Rollback] {
        assert_eq!(
            h.one(
                secs(200),
                2,
                phase,
                ReplyBody::Failed(hal_failure("world", HcclCode::Drv))
            ),
            vec![]
        );
    }
    assert_eq!(h.log.len(), n);
    assert_eq!(h.report(), before);
}

#[test]
fn an_abort_during_the_switch_rolls_back_then_resumes() {
    let (mut h, _) = to_backup();
    h.run_to_switch(100, 5);
    let a = h.send(
        Event::Abort {
            reason: "the manager is stopping".into(),
        },
        secs(103),
    );
    // Every rank is still inside its switch calls: the rollback waits for their answers.
    assert!(a.is_empty());
    let all = h.all_ranks();
    let a = h.applied(secs(103), Phase::Switch, &all);
    assert_eq!(broadcast_phases(&a), vec![Phase::Rollback]);
    // A second abort during the rollback changes nothing: the rollback is the way out.
    let a = h.send(
        Event::Abort {
            reason: "again".into(),
        },
        secs(103),
    );
    assert!(a.is_empty());
    h.applied(secs(104), Phase::Rollback, &all);
    h.resumed(secs(105), &all);
    let r = h.report();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.rolled_back && !r.applied);
    assert!(matches!(
        r.error,
        Some(OperationError::Aborted {
            phase: Phase::Switch,
            ..
        })
    ));
    assert_eq!(r.job_state, JobState::Running);
}
