//! An in-flight operation, scripted: sample, abort, the switch with its redo points, resume;
//! and its failures, which resume without a rollback.

use std::collections::BTreeMap;
use std::time::Duration;
use taskd_core::inflight::{CollectivePosition, RedoPoint};
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, NodeReply, Phase, RankError, RankReply, ReplyBody,
};
use taskd_core::{
    Action, DeviceId, Event, GlobalRank, NicSide, NodeName, Operation, OperationId, Outcome,
    PhaseDeadlines, RankTarget, SwitchPlan,
};

const WORLD: u32 = 4;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn start() -> (Operation, Vec<Action>) {
    let plan = SwitchPlan {
        targets: (2..4)
            .map(|r| RankTarget {
                node: NodeName("node-1".into()),
                device: DeviceId(r - 2),
                rank: GlobalRank(r),
                use_backup: true,
            })
            .collect(),
    };
    let previous = vec![
        (GlobalRank(2), NicSide::Primary),
        (GlobalRank(3), NicSide::Primary),
    ];
    let (mut op, actions) = Operation::start(
        OperationId(uuid::Uuid::from_u128(7)),
        plan,
        previous,
        (0..WORLD).map(GlobalRank),
        PhaseDeadlines::default(),
        ms(0),
    );
    op.set_in_flight();
    (op, actions)
}

fn directive(actions: &[Action]) -> Directive {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Broadcast(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a broadcast")
}

fn answer(op: &mut Operation, at: u64, body: impl Fn(u32) -> ReplyBody) -> Vec<Action> {
    let phase = op.phase();
    let replies = (0..WORLD)
        .map(|r| RankReply {
            rank: GlobalRank(r),
            op: op.id(),
            phase,
            body: body(r),
        })
        .collect();
    let nr = NodeReply {
        node: NodeName("node-0".into()),
        op: op.id(),
        phase,
        replies,
        health: Vec::new(),
    };
    op.handle(Event::Replies(nr), ms(at))
}

fn position(completed: u64, issued: u64) -> Vec<CollectivePosition> {
    vec![CollectivePosition {
        group: "0".into(),
        size: WORLD,
        completed,
        issued,
    }]
}

fn applied() -> ReplyBody {
    ReplyBody::Applied {
        calls: vec![AppliedCall {
            group: "framework".into(),
            group_size: WORLD,
            digest: 42,
        }],
    }
}

#[test]
fn an_in_flight_move_aborts_switches_from_the_agreed_point_and_resumes_without_a_pause() {
    let (mut op, actions) = start();
    assert!(matches!(
        directive(&actions).kind,
        DirectiveKind::Sample { .. }
    ));
    // Rank 3 is a step behind: the others are blocked in its collectives.
    let next = answer(&mut op, 1, |r| ReplyBody::Sampled {
        in_step: if r == 3 { 9 } else { 10 },
        in_flight: true,
    });
    let d = directive(&next);
    assert_eq!(d.phase(), Phase::Abort);
    assert!(matches!(&d.kind, DirectiveKind::AbortInFlight { targets } if targets.len() == 2));
    // Rank 0 finished collective 40 (its ring part ended first), the others did not.
    let next = answer(&mut op, 3, |r| ReplyBody::Aborted {
        in_step: 10,
        collectives: if r == 0 {
            position(41, 42)
        } else {
            position(40, 41)
        },
    });
    match directive(&next).kind {
        DirectiveKind::SwitchInFlight { targets, redo, .. } => {
            assert_eq!(
                targets,
                vec![
                    (GlobalRank(2), NicSide::Backup),
                    (GlobalRank(3), NicSide::Backup)
                ]
            );
            assert_eq!(
                redo,
                vec![RedoPoint {
                    group: "0".into(),
                    from: 40
                }]
            );
        }
        other => panic!("expected the in-flight switch, got {other:?}"),
    }
    let next = answer(&mut op, 20, |_| applied());
    assert!(matches!(directive(&next).kind, DirectiveKind::Resume));
    let done = answer(&mut op, 21, |_| ReplyBody::Resumed { stalled: ms(18) });
    let report = done
        .iter()
        .find_map(|a| match a {
            Action::Finish(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a final report");
    assert_eq!(report.outcome, Outcome::Succeeded);
    assert!(report.applied && !report.rolled_back);
    // No pause step was ever asked for: the step was finished where it stood.
    assert_eq!(report.pause_step, None);
    assert_eq!(report.phases.pause, Some(ms(3)));
}

#[test]
fn a_rank_that_cannot_abort_resumes_the_job_without_a_switch() {
    let (mut op, _) = start();
    answer(&mut op, 1, |_| ReplyBody::Sampled {
        in_step: 10,
        in_flight: true,
    });
    let next = answer(&mut op, 2, |r| {
        if r == 1 {
            ReplyBody::Failed(RankError::worker("no in-flight side"))
        } else {
            ReplyBody::Aborted {
                in_step: 10,
                collectives: position(5, 5),
            }
        }
    });
    assert!(matches!(directive(&next).kind, DirectiveKind::Resume));
    let done = answer(&mut op, 3, |_| ReplyBody::Resumed { stalled: ms(1) });
    let report = done
        .iter()
        .find_map(|a| match a {
            Action::Finish(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert!(!report.applied && !report.rolled_back);
}

#[test]
fn positions_that_give_no_redo_point_or_a_failed_switch_never_roll_back() {
    // A member missing from a group's reports: no point to agree on.
    let (mut op, _) = start();
    answer(&mut op, 1, |_| ReplyBody::Sampled {
        in_step: 10,
        in_flight: true,
    });
    let next = answer(&mut op, 2, |r| ReplyBody::Aborted {
        in_step: 10,
        collectives: if r == 2 { Vec::new() } else { position(5, 5) },
    });
    assert!(matches!(directive(&next).kind, DirectiveKind::Resume));

    // A rank's rebuild fails: resume (the old plane is gone), no rollback.
    let (mut op, _) = start();
    answer(&mut op, 1, |_| ReplyBody::Sampled {
        in_step: 10,
        in_flight: true,
    });
    answer(&mut op, 2, |_| ReplyBody::Aborted {
        in_step: 10,
        collectives: position(5, 6),
    });
    let next = answer(&mut op, 3, |r| {
        if r == 2 {
            ReplyBody::Failed(RankError::worker("building the groups on bak: timeout"))
        } else {
            applied()
        }
    });
    let kinds: BTreeMap<Phase, usize> = next
        .iter()
        .filter_map(|a| match a {
            Action::Broadcast(d) => Some(d.phase()),
            _ => None,
        })
        .fold(BTreeMap::new(), |mut m, p| {
            *m.entry(p).or_default() += 1;
            m
        });
    assert_eq!(
        kinds.keys().copied().collect::<Vec<_>>(),
        vec![Phase::Resume]
    );
}

#[test]
fn ranks_without_an_in_flight_side_fail_the_move_after_the_sample_before_any_abort() {
    let (mut op, _) = start();
    let next = answer(&mut op, 1, |r| ReplyBody::Sampled {
        in_step: 10,
        in_flight: r == 0,
    });
    // No abort is asked of anyone: the gates open again, nothing changed.
    let d = directive(&next);
    assert!(matches!(d.kind, DirectiveKind::Resume), "{:?}", d.kind);
    let done = answer(&mut op, 2, |_| ReplyBody::Resumed { stalled: ms(1) });
    let report = done
        .iter()
        .find_map(|a| match a {
            Action::Finish(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert!(!report.applied && !report.rolled_back);
    let error = report.error.expect("why it failed");
    assert_eq!(
        error,
        taskd_core::operation::OperationError::NoInFlightSide {
            ranks: "1, 2, 3".into()
        }
    );
    assert!(
        error
            .to_string()
            .starts_with("ranks 1, 2, 3 have no in-flight side"),
        "{error}"
    );
}
