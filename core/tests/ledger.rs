//! Scripted tests of the job ledger: admission (every [`SubmitError`]), registration, the NIC
//! table, repeated ids, and the job state after failed operations.
//!
//! The job is `job-a`, 2 nodes x 4 devices (ranks 0..8) unless a test says otherwise.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use taskd_core::ledger::{
    FinishedOperation, RecoverTo, RecoveryStarted, RegisterError, RequestFingerprint, StopBy,
    StopPhase, Submitted, HISTORY_LEN,
};
use taskd_core::operation::OperationError;
use taskd_core::protocol::{
    Directive, DirectiveKind, GateReport, NodeReply, Phase, ReplyBody, WorkerHello, WorkerReport,
};
use taskd_core::verify::VerifyReport;
use taskd_core::{
    Action, DeviceId, Event, GlobalRank, HcclCode, HcclSetup, JobId, JobLedger, JobState,
    LibraryName, Missing, NicSide, NodeName, OperationId, OperationReport, Outcome, SubmitError,
    SwitchCapabilities, SwitchCommand, Trigger, ValidationError,
};

fn hello(layout: &Layout, rank: u32, capabilities: SwitchCapabilities) -> WorkerHello {
    WorkerHello {
        job: job(),
        node: layout.node_of(GlobalRank(rank)),
        rank: GlobalRank(rank),
        capabilities,
        instance: taskd_core::Instance::UNKNOWN,
        generation: 0,
    }
}

/// A ledger with every worker of `layout` registered and able to switch, its NIC
/// configuration verified (every rank on primary).
fn ledger(layout: &Layout) -> JobLedger {
    let mut l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    for r in 0..layout.world() {
        l.register(hello(layout, r, SwitchCapabilities::ALL))
            .expect("valid registration");
    }
    assert_eq!(l.registered(), layout.world() as usize);
    let v = verify(&mut l, layout, &BTreeSet::new(), secs(0));
    assert_eq!(v.job_state(), Some(JobState::Running), "{v}");
    l
}

/// Runs a verification round in which every rank reports `backup` on its backup NIC with an
/// open gate; returns its report.
fn verify(
    l: &mut JobLedger,
    layout: &Layout,
    backup: &BTreeSet<GlobalRank>,
    now: Duration,
) -> VerifyReport {
    assert!(l.verify_due(), "a verification is owed");
    verify_with(l, layout, now, op_id(0xfeed), |r| {
        layout.report(r, backup, GateReport::default())
    })
}

/// Starts a round under `id` and answers it with `report` for every rank.
fn verify_with(
    l: &mut JobLedger,
    layout: &Layout,
    now: Duration,
    id: OperationId,
    report: impl Fn(GlobalRank) -> WorkerReport,
) -> VerifyReport {
    let a = l.start_verification(id, now);
    answer_verification(l, layout, a, now, report)
}

/// Answers a verification round's broadcasts (and any resume of orphaned gates) until it ends.
fn answer_verification(
    l: &mut JobLedger,
    layout: &Layout,
    first: Vec<Action>,
    now: Duration,
    report: impl Fn(GlobalRank) -> WorkerReport,
) -> VerifyReport {
    let mut todo = first;
    for _ in 0..8 {
        let Some(d) = broadcasts(&todo).last().map(|d| (*d).clone()) else {
            panic!("no broadcast in {todo:?}");
        };
        let replies = match d.kind {
            DirectiveKind::Verify => layout.verified(d.op, &report),
            DirectiveKind::Resume => {
                // Only the gates of an orphaned operation are opened, under its own id.
                assert!(layout
                    .ranks()
                    .iter()
                    .any(|r| report(*r).gate.op == Some(d.op)));
                let mut by_node: BTreeMap<NodeName, Vec<_>> = BTreeMap::new();
                for r in layout.ranks() {
                    by_node
                        .entry(layout.node_of(r))
                        .or_default()
                        .push(rank_reply(
                            d.op,
                            r.0,
                            Phase::Resume,
                            ReplyBody::Resumed { stalled: secs(0) },
                        ));
                }
                by_node
                    .into_iter()
                    .map(|(node, replies)| NodeReply {
                        node,
                        op: d.op,
                        phase: Phase::Resume,
                        replies,
                        health: vec![],
                    })
                    .collect()
            }
            other => panic!("unexpected directive {other:?}"),
        };
        let mut next = Vec::new();
        for nr in replies {
            next = l.handle(Event::Replies(nr), now);
            if !next.is_empty() {
                break;
            }
        }
        if let Some(Action::Verified(v)) = next.last() {
            assert!(l.verifying().is_none());
            return (**v).clone();
        }
        todo = next;
    }
    panic!("the verification did not end");
}

/// Everything a refused command must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    on_backup: Vec<GlobalRank>,
    in_flight: Option<OperationId>,
    phase: Option<Phase>,
    history: Vec<OperationReport>,
    state: JobState,
    registered: usize,
}

fn snapshot(l: &JobLedger) -> Snapshot {
    Snapshot {
        on_backup: l.ranks_on_backup().collect(),
        in_flight: l.in_flight().map(|o| o.id()),
        phase: l.phase(),
        history: l.history().cloned().collect(),
        state: l.state(),
        registered: l.registered(),
    }
}

/// How a rank answers one directive in [`drive`].
#[derive(Clone, Debug)]
enum Answer {
    Correct,
    Silent,
    Body(ReplyBody),
}

/// Carries out the actions of an operation against `layout`'s workers: every broadcast is
/// answered per rank as `answer` says (correct replies by default), per node, until the
/// operation finishes; when nobody has anything left to say the armed deadline fires.
/// Returns the final report and every directive broadcast.
fn drive(
    l: &mut JobLedger,
    layout: &Layout,
    first: Vec<Action>,
    now: &mut Duration,
    answer: impl Fn(Phase, u32) -> Answer,
) -> (OperationReport, Vec<Directive>) {
    let mut sent = Vec::new();
    let mut todo = first;
    let mut token = None;
    for _ in 0..32 {
        for a in &todo {
            match a {
                Action::Finish(r) => {
                    assert!(matches!(todo.last(), Some(Action::Finish(_))));
                    assert!(l.in_flight().is_none(), "the ledger settled the finish");
                    return ((**r).clone(), sent);
                }
                Action::ArmDeadline { token: t, .. } => token = Some(*t),
                Action::Broadcast(d) => sent.push(d.clone()),
                Action::Verified(v) => panic!("no verification runs during an operation: {v}"),
                Action::Held(h) => panic!("only a sequenced operation holds: {h:?}"),
            }
        }
        let d = sent.last().expect("a directive was sent").clone();
        let phase = d.phase();
        let mut by_node: BTreeMap<NodeName, Vec<_>> = BTreeMap::new();
        for r in 0..layout.world() {
            let body = match answer(phase, r) {
                Answer::Silent => continue,
                Answer::Body(b) => b,
                Answer::Correct => match &d.kind {
                    DirectiveKind::Sample { .. } => ReplyBody::Sampled {
                        in_step: 10,
                        in_flight: false,
                    },
                    DirectiveKind::PauseAt { step } => ReplyBody::Paused { step: *step },
                    DirectiveKind::Switch { targets, .. } => ReplyBody::Applied {
                        calls: layout.calls(GlobalRank(r), targets),
                    },
                    DirectiveKind::Rollback {
                        targets, restate, ..
                    } => ReplyBody::Applied {
                        calls: layout.rollback_calls(GlobalRank(r), targets, restate),
                    },
                    DirectiveKind::Resume => ReplyBody::Resumed { stalled: secs(1) },
                    DirectiveKind::Verify => panic!("an operation never verifies"),
                    DirectiveKind::StopTraining { .. } => ReplyBody::Stopped { at_step: Some(9) },
                    DirectiveKind::AbortInFlight { .. } => ReplyBody::Aborted {
                        in_step: 10,
                        collectives: Vec::new(),
                    },
                    DirectiveKind::SwitchInFlight { targets, .. } => ReplyBody::Applied {
                        calls: layout.calls(GlobalRank(r), targets),
                    },
                },
            };
            by_node
                .entry(layout.node_of(GlobalRank(r)))
                .or_default()
                .push(rank_reply(d.op, r, phase, body));
        }
        *now += secs(1);
        let mut next = Vec::new();
        for (node, replies) in by_node {
            let nr = NodeReply {
                node,
                op: d.op,
                phase,
                replies,
                health: vec![],
            };
            next = l.handle(Event::Replies(nr), *now);
            if !next.is_empty() {
                break;
            }
        }
        if next.is_empty() {
            *now += secs(60);
            next = l.handle(
                Event::Deadline {
                    token: token.expect("armed"),
                },
                *now,
            );
        }
        todo = next;
    }
    panic!("the operation did not finish; sent {sent:#?}");
}

fn start(l: &mut JobLedger, cmd: &SwitchCommand, id: OperationId, now: Duration) -> Vec<Action> {
    match l.submit(cmd, id, now) {
        Ok(Submitted::Started { id: got, actions }) => {
            assert_eq!(got, id);
            assert_eq!(l.in_flight().map(|o| o.id()), Some(id));
            actions
        }
        other => panic!("expected a start, got {other:?}"),
    }
}

fn run(
    l: &mut JobLedger,
    layout: &Layout,
    targets: &[(u32, bool)],
    id: OperationId,
    now: &mut Duration,
    answer: impl Fn(Phase, u32) -> Answer,
) -> (OperationReport, Vec<Directive>) {
    let first = start(l, &layout.command(targets), id, *now);
    drive(l, layout, first, now, answer)
}

fn fail_switch_on(rank: u32) -> impl Fn(Phase, u32) -> Answer {
    move |p, r| {
        if p == Phase::Switch && r == rank {
            Answer::Body(ReplyBody::Failed(hal_failure(
                "world",
                HcclCode::RoceConnect,
            )))
        } else {
            Answer::Correct
        }
    }
}

fn backup_of(l: &JobLedger) -> Vec<u32> {
    l.ranks_on_backup().map(|r| r.0).collect()
}

// ---------------------------------------------------------------------------------------------
// The NIC table
// ---------------------------------------------------------------------------------------------

#[test]
fn a_good_switch_updates_the_nic_table_and_a_switch_back_restores_it() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(100);
    assert_eq!(backup_of(&l), Vec::<u32>::new());

    let first = start(
        &mut l,
        &layout.command(&[(1, true), (6, true)]),
        op_id(1),
        now,
    );
    assert_eq!(l.phase(), Some(Phase::Sample));
    assert_eq!(
        first,
        entered(
            op_id(1),
            DirectiveKind::Sample {
                targets: layout.plan(&[(1, true), (6, true)]).targets
            },
            1,
            secs(130)
        )
    );
    let (r, sent) = drive(&mut l, &layout, first, &mut now, |_, _| Answer::Correct);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.pause_step, Some(10));
    assert_eq!(
        sent.iter().map(Directive::phase).collect::<Vec<_>>(),
        vec![Phase::Sample, Phase::Pause, Phase::Switch, Phase::Resume]
    );
    assert_eq!(backup_of(&l), vec![1, 6]);
    assert!(l.uses_backup(GlobalRank(6)));
    assert!(!l.uses_backup(GlobalRank(2)));
    assert_eq!(l.state(), JobState::Running);
    assert_eq!(l.result_of(op_id(1)), Some(&r));
    assert_eq!(l.phase(), None);

    // Switch rank 6 back; rank 2's HCCL call fails: the rollback puts 6 back on its backup,
    // the value it had, and the table does not move.
    let (r, sent) = run(
        &mut l,
        &layout,
        &[(6, false)],
        op_id(2),
        &mut now,
        fail_switch_on(2),
    );
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.rolled_back && !r.applied);
    assert_eq!(
        sent[3].kind,
        DirectiveKind::Rollback {
            targets: vec![(GlobalRank(6), NicSide::Backup)],
            restate: vec![],
            call_timeout: DEADLINES.call_timeout(Phase::Rollback),
        }
    );
    assert_eq!(backup_of(&l), vec![1, 6]);
    assert_eq!(l.state(), JobState::Running);

    // Again, cleanly.
    let (r, sent) = run(
        &mut l,
        &layout,
        &[(6, false)],
        op_id(3),
        &mut now,
        |_, _| Answer::Correct,
    );
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(
        sent[2].kind,
        DirectiveKind::Switch {
            targets: vec![(GlobalRank(6), NicSide::Primary)],
            call_timeout: DEADLINES.call_timeout(Phase::Switch),
        }
    );
    assert_eq!(backup_of(&l), vec![1]);
    assert_eq!(
        l.history().map(|r| r.id).collect::<Vec<_>>(),
        vec![op_id(1), op_id(2), op_id(3)]
    );
}

#[test]
fn a_rejected_or_paused_operation_leaves_the_nic_table_alone() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);

    // Link down: node-0 reports rank 1's backup link down.
    let first = start(&mut l, &layout.command(&[(1, true)]), op_id(1), now);
    let nr = NodeReply {
        node: "node-0".into(),
        op: op_id(1),
        phase: Phase::Sample,
        replies: vec![],
        health: vec![taskd_core::LinkHealth::new(DeviceId(1), true, false)],
    };
    assert!(!first.is_empty());
    let a = l.handle(Event::Replies(nr), now);
    let (r, _) = drive(&mut l, &layout, a, &mut now, |_, _| Answer::Correct);
    assert_eq!(r.outcome, Outcome::Rejected);
    assert_eq!(backup_of(&l), Vec::<u32>::new());
    assert_eq!(l.state(), JobState::Running);

    // Switch failure, then a rollback failure: the job is held.
    let (r, _) = run(
        &mut l,
        &layout,
        &[(1, true)],
        op_id(2),
        &mut now,
        |p, r| match (p, r) {
            (Phase::Switch, 3) | (Phase::Rollback, 0) => {
                Answer::Body(ReplyBody::Failed(hal_failure("world", HcclCode::Internal)))
            }
            _ => Answer::Correct,
        },
    );
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(!r.rolled_back);
    assert_eq!(r.job_state, JobState::Paused);
    assert_eq!(l.state(), JobState::Paused);
    assert_eq!(backup_of(&l), Vec::<u32>::new());
}

// ---------------------------------------------------------------------------------------------
// Admission: every SubmitError, with nothing changed
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_job_is_refused_and_changes_nothing() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let before = snapshot(&l);
    let mut cmd = layout.command(&[(1, true)]);
    cmd.job = JobId("job-b".into());
    assert_eq!(
        l.submit(&cmd, op_id(1), secs(0)),
        Err(SubmitError::UnknownJob {
            job: JobId("job-b".into()),
            known: job()
        })
    );
    assert_eq!(snapshot(&l), before);
    // The id was not used up.
    start(&mut l, &layout.command(&[(1, true)]), op_id(1), secs(0));
}

#[test]
fn missing_workers_are_named() {
    let layout = Layout::new(2, 4);
    let mut l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    for r in [0, 1, 2, 3, 4, 6, 7] {
        l.register(hello(&layout, r, SwitchCapabilities::ALL))
            .unwrap();
    }
    let before = snapshot(&l);
    let e = l.submit(&layout.command(&[(1, true)]), op_id(1), secs(0));
    assert_eq!(
        e,
        Err(SubmitError::WorkersMissing {
            registered: 7,
            expected: 8,
            missing: "5".into()
        })
    );
    assert_eq!(snapshot(&l), before);
    assert!(e.unwrap_err().to_string().contains("missing ranks: 5"));

    // Nobody registered on a 2 x 16 job: the list is cut short.
    let big = Layout::new(2, 16);
    let mut l = JobLedger::new(job(), big.table.clone(), DEADLINES);
    assert_eq!(
        l.submit(&big.command(&[(1, true)]), op_id(1), secs(0)),
        Err(SubmitError::WorkersMissing {
            registered: 0,
            expected: 32,
            missing: "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... (32 in all)".into()
        })
    );

    // A worker lost between operations must register again before the next one.
    let mut l = ledger(&layout);
    assert_eq!(
        l.worker_lost(
            GlobalRank(4),
            taskd_core::ledger::LostRank::died("closed"),
            secs(1)
        ),
        vec![]
    );
    assert!(!l.is_registered(GlobalRank(4)));
    assert_eq!(l.state(), JobState::NeedsRecovery);
    assert_eq!(
        l.lost_ranks()
            .map(|(r, lost)| (r, lost.why.as_str()))
            .collect::<Vec<_>>(),
        [(GlobalRank(4), "closed")]
    );
    // A rank never registered (or already lost) is not lost again.
    l.worker_lost(
        GlobalRank(4),
        taskd_core::ledger::LostRank::died("again"),
        secs(1),
    );
    assert_eq!(
        l.lost_ranks()
            .map(|(r, lost)| (r, lost.why.as_str()))
            .collect::<Vec<_>>(),
        [(GlobalRank(4), "closed")]
    );
    assert!(matches!(
        l.submit(&layout.command(&[(1, true)]), op_id(2), secs(2)),
        Err(SubmitError::WorkersMissing { registered: 7, ref missing, .. }) if missing == "4"
    ));
    l.register(hello(&layout, 4, SwitchCapabilities::ALL))
        .unwrap();
    assert_eq!(l.lost_ranks().count(), 0, "back: no longer lost");
    verify(&mut l, &layout, &BTreeSet::new(), secs(3));
    assert_eq!(l.state(), JobState::Running);
    start(&mut l, &layout.command(&[(1, true)]), op_id(2), secs(3));
}

#[test]
fn a_second_command_while_one_runs_is_busy_with_the_id_in_flight() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let first = start(&mut l, &layout.command(&[(1, true)]), op_id(1), now);
    let before = snapshot(&l);
    assert_eq!(
        l.submit(&layout.command(&[(2, true)]), op_id(2), secs(1)),
        Err(SubmitError::Busy {
            in_flight: op_id(1)
        })
    );
    // The same id again is the operation in flight, not a second one.
    assert_eq!(
        l.submit(&layout.command(&[(1, true)]), op_id(1), secs(1)),
        Ok(Submitted::InFlight(op_id(1)))
    );
    assert_eq!(snapshot(&l), before);
    let (r, _) = drive(&mut l, &layout, first, &mut now, |_, _| Answer::Correct);
    assert_eq!(r.id, op_id(1));
    assert_eq!(l.history().count(), 1);
    // Once it is done, the refused id can run.
    start(&mut l, &layout.command(&[(2, true)]), op_id(2), now);
}

#[test]
fn every_validation_error_is_refused_as_invalid() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let before = snapshot(&l);
    let target = |node: &str, device: u32, use_backup: bool| taskd_core::command::Target {
        node: node.into(),
        device: DeviceId(device),
        use_backup,
    };
    let cmd = |targets| SwitchCommand {
        job: job(),
        id: None,
        targets,
    };
    let cases = vec![
        (cmd(vec![]), ValidationError::NoTargets),
        (
            cmd(vec![target("node-0", 0, true), target("node-9", 0, true)]),
            ValidationError::UnknownNode {
                node: "node-9".into(),
                known: "node-0, node-1".into(),
            },
        ),
        (
            cmd(vec![target("node-1", 4, true)]),
            ValidationError::UnknownDevice {
                node: "node-1".into(),
                device: DeviceId(4),
                devices: "0, 1, 2, 3".into(),
            },
        ),
        (
            cmd(vec![target("node-1", 1, true), target("node-1", 1, false)]),
            ValidationError::ConflictingTarget {
                node: "node-1".into(),
                device: DeviceId(1),
                rank: GlobalRank(5),
            },
        ),
    ];
    for (c, want) in cases {
        let got = l.submit(&c, op_id(1), secs(0));
        assert_eq!(got, Err(SubmitError::Invalid(want.clone())));
        // The error reads as the validation error itself.
        assert_eq!(got.unwrap_err().to_string(), want.to_string());
        assert_eq!(snapshot(&l), before);
    }

    // The ClusterD form's own errors (unequal lists, a device that is not a number) happen
    // while building the command; they convert into the same Invalid refusal.
    let mut ops = BTreeMap::new();
    ops.insert(
        "node-0".to_string(),
        (vec!["0".to_string(), "1".to_string()], vec![true]),
    );
    let e = SwitchCommand::from_nic_ops(job(), None, &ops).unwrap_err();
    assert_eq!(
        SubmitError::from(e),
        SubmitError::Invalid(ValidationError::LengthMismatch {
            node: "node-0".into(),
            devs: 2,
            ops: 1
        })
    );
    ops.insert("node-0".to_string(), (vec!["one".to_string()], vec![true]));
    let e = SwitchCommand::from_nic_ops(job(), None, &ops).unwrap_err();
    assert_eq!(
        SubmitError::from(e),
        SubmitError::Invalid(ValidationError::BadDevice {
            node: "node-0".into(),
            value: "one".into()
        })
    );

    // A duplicate with the same op is harmless: kept once.
    let first = start(
        &mut l,
        &cmd(vec![target("node-1", 1, true), target("node-1", 1, true)]),
        op_id(1),
        secs(0),
    );
    match &first[0] {
        Action::Broadcast(Directive {
            kind: DirectiveKind::Sample { targets },
            ..
        }) => assert_eq!(targets.len(), 1),
        a => panic!("{a:?}"),
    }
}

#[test]
fn a_rank_that_cannot_switch_refuses_the_command() {
    let layout = Layout::new(2, 4);
    let all = SwitchCapabilities::ALL;
    let no_tsp = || all.clone().with_tsp(false);
    let no_rdma = || SwitchCapabilities::lacking([HcclSetup::NO_RDMA]);
    let cases = [
        (no_tsp(), "MS_ENABLE_TFT without TSP:1"),
        (
            SwitchCapabilities::lacking([HcclSetup::L2_RETRY_OFF]),
            "HCCL_OP_RETRY_ENABLE without L2:1",
        ),
        (no_rdma(), "no RDMA links"),
        // Another backend's, in its own words.
        (
            SwitchCapabilities::lacking([Missing::new(
                LibraryName::new("acme"),
                "ACME_MULTIRAIL=0",
            )]),
            "ACME_MULTIRAIL=0",
        ),
    ];
    for (caps, missing) in cases {
        // An untargeted rank counts too: every rank calls HCCL.
        for rank in [0, 5, 7] {
            let mut l = ledger(&layout);
            l.register(hello(&layout, rank, caps.clone())).unwrap();
            assert_eq!(l.registered(), 8, "a reconnect replaces, it does not add");
            let before = snapshot(&l);
            assert_eq!(
                l.submit(&layout.command(&[(1, true)]), op_id(1), secs(0)),
                Err(SubmitError::CapabilityMissing {
                    ranks: rank.to_string(),
                    missing: missing.into()
                })
            );
            assert_eq!(snapshot(&l), before);
            // Fixed and restarted: once its report agrees, it runs.
            l.register(hello(&layout, rank, all.clone())).unwrap();
            verify(&mut l, &layout, &BTreeSet::new(), secs(0));
            start(&mut l, &layout.command(&[(1, true)]), op_id(1), secs(0));
        }
    }

    // Two ranks with different gaps: both ranks and both gaps are named.
    let mut l = ledger(&layout);
    l.register(hello(&layout, 2, no_tsp())).unwrap();
    l.register(hello(&layout, 5, no_rdma())).unwrap();
    assert_eq!(
        l.submit(&layout.command(&[(1, true)]), op_id(1), secs(0)),
        Err(SubmitError::CapabilityMissing {
            ranks: "2, 5".into(),
            missing: "MS_ENABLE_TFT without TSP:1, no RDMA links".into()
        })
    );
}

#[test]
fn after_a_failed_rollback_the_job_is_not_running_until_acknowledged() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let (r, sent) = run(
        &mut l,
        &layout,
        &[(6, true)],
        op_id(1),
        &mut now,
        |p, r| match (p, r) {
            (Phase::Switch, 6) => Answer::Body(ReplyBody::Failed(hal_failure(
                "tp_1",
                HcclCode::RoceConnect,
            ))),
            (Phase::Rollback, 7) => Answer::Silent,
            _ => Answer::Correct,
        },
    );
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(!r.rolled_back);
    assert!(!sent.iter().any(|d| d.kind == DirectiveKind::Resume));
    assert_eq!(l.state(), JobState::Paused);

    let before = snapshot(&l);
    assert_eq!(
        l.submit(&layout.command(&[(6, true)]), op_id(2), now),
        Err(SubmitError::NotRunning {
            state: JobState::Paused
        })
    );
    assert_eq!(snapshot(&l), before);
    // The failed operation's id still answers with its result.
    assert!(matches!(
        l.submit(&layout.command(&[(6, true)]), op_id(1), now),
        Ok(Submitted::Known(k)) if *k == r
    ));

    // Rank 7 has not answered the rollback: a recovery now could pair with its late calls.
    assert!(matches!(
        l.recover(RecoverTo::AsIs, op_id(3), now),
        Err(SubmitError::InCalls { op, ref ranks }) if op == op_id(1) && ranks == "7"
    ));
    late_answer(&mut l, &layout, op_id(1), 7, Phase::Rollback, now);
    // The operator re-states the ranks in doubt (the failed operation's targets) as the NIC
    // table has them; every group then agrees again and the job runs.
    let started = l.recover(RecoverTo::AsIs, op_id(3), now).unwrap();
    let RecoveryStarted::Operation { id, actions } = started else {
        panic!("ranks are in doubt: {started:?}");
    };
    assert_eq!(id, op_id(3));
    let (rec, sent) = drive(&mut l, &layout, actions, &mut now, |_, _| Answer::Correct);
    assert_eq!(rec.outcome, Outcome::Succeeded, "{rec}");
    assert!(sent.iter().any(|d| matches!(&d.kind, DirectiveKind::Switch { targets, .. } if targets.iter().any(|(r, side)| r.0 == 6 && *side == NicSide::Primary))));
    assert_eq!(l.state(), JobState::Running);
    // A round confirms the recovery before the next switch is admitted.
    assert!(matches!(
        l.submit(&layout.command(&[(6, true)]), op_id(2), now),
        Err(SubmitError::Unverified { .. })
    ));
    verify(&mut l, &layout, &BTreeSet::new(), now);
    start(&mut l, &layout.command(&[(6, true)]), op_id(2), now);
}

#[test]
fn an_abort_before_the_switch_resumes_at_once() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(10);
    let a = start(&mut l, &layout.command(&[(2, true)]), op_id(2), now);
    assert_eq!(broadcast_phases(&a), vec![Phase::Sample]);
    let a = l.abort("the manager is stopping (SIGTERM)".into(), now);
    assert_eq!(
        broadcast_phases(&a),
        vec![Phase::Resume],
        "nothing was switched: resume"
    );
    let (r, _) = drive(&mut l, &layout, a, &mut now, |_, _| Answer::Correct);
    assert!(
        matches!(
            r.error,
            Some(OperationError::Aborted {
                phase: Phase::Sample,
                ..
            })
        ),
        "{r}"
    );
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(l.state(), JobState::Running);
}

/// `rank`'s answer to `op`'s `phase`, arriving after the operation ended without it: its
/// NIC-set calls returned (failed, as late calls do).
fn late_answer(
    l: &mut JobLedger,
    layout: &Layout,
    op: OperationId,
    rank: u32,
    phase: Phase,
    now: Duration,
) {
    let body = ReplyBody::Failed(hal_failure("tp_1", HcclCode::Timeout));
    let nr = NodeReply {
        node: layout.node_of(GlobalRank(rank)),
        op,
        phase,
        replies: vec![rank_reply(op, rank, phase, body)],
        health: vec![],
    };
    assert_eq!(l.handle(Event::Replies(nr), now), vec![], "nothing runs");
}

#[test]
fn a_switch_that_ends_with_ranks_inside_their_calls_leaves_no_call_to_pair_with() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(10);
    let a = start(&mut l, &layout.command(&[(2, true)]), op_id(1), now);
    // Ranks 3 and 5 are still inside their switch calls at the deadline.
    let (r, sent) = drive(&mut l, &layout, a, &mut now, |phase, r| match (phase, r) {
        (Phase::Switch, 3 | 5) => Answer::Silent,
        _ => Answer::Correct,
    });
    assert!(
        !sent.iter().any(|d| matches!(
            d.kind,
            DirectiveKind::Rollback { .. } | DirectiveKind::Resume
        )),
        "no HCCL call may meet theirs, and no gate opens: {sent:?}"
    );
    assert_eq!(
        (r.outcome, r.job_state),
        (Outcome::Failed, JobState::Paused)
    );
    let in_calls = |l: &mut JobLedger, now| match l.recover(RecoverTo::Primary, op_id(2), now) {
        Err(SubmitError::InCalls { op, ranks }) => (op, ranks),
        other => panic!("{other:?}"),
    };
    assert_eq!(in_calls(&mut l, now), (op_id(1), "3, 5".to_owned()));
    // An answer to another phase or operation does not count.
    late_answer(&mut l, &layout, op_id(9), 3, Phase::Switch, now);
    late_answer(&mut l, &layout, op_id(1), 3, Phase::Rollback, now);
    assert_eq!(in_calls(&mut l, now), (op_id(1), "3, 5".to_owned()));
    late_answer(&mut l, &layout, op_id(1), 3, Phase::Switch, now);
    assert_eq!(in_calls(&mut l, now), (op_id(1), "5".to_owned()));
    late_answer(&mut l, &layout, op_id(1), 5, Phase::Switch, now);
    assert!(matches!(
        l.recover(RecoverTo::Primary, op_id(2), now),
        Ok(RecoveryStarted::Operation { .. })
    ));
}

#[test]
fn a_failed_recovery_keeps_every_gate_shut() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(10);
    let a = start(&mut l, &layout.command(&[(2, true)]), op_id(1), now);
    let (r, _) = drive(&mut l, &layout, a, &mut now, |phase, r| match (phase, r) {
        (Phase::Switch, 2) => {
            Answer::Body(ReplyBody::Failed(hal_failure("world", HcclCode::Network)))
        }
        (Phase::Rollback, 2) => Answer::Silent,
        _ => Answer::Correct,
    });
    assert_eq!(r.job_state, JobState::Paused);
    late_answer(&mut l, &layout, op_id(1), 2, Phase::Rollback, now);
    let RecoveryStarted::Operation { actions, .. } =
        l.recover(RecoverTo::Primary, op_id(2), now).unwrap()
    else {
        panic!("rank 2 is in doubt");
    };
    let (rec, sent) = drive(&mut l, &layout, actions, &mut now, |phase, r| {
        match (phase, r) {
            (Phase::Switch, 5) => {
                Answer::Body(ReplyBody::Failed(hal_failure("dp_1", HcclCode::Timeout)))
            }
            _ => Answer::Correct,
        }
    });
    assert_eq!(rec.outcome, Outcome::Failed);
    assert!(
        !sent.iter().any(|d| d.kind == DirectiveKind::Resume),
        "{sent:?}"
    );
    assert!(!sent
        .iter()
        .any(|d| matches!(d.kind, DirectiveKind::Rollback { .. })));
    assert_eq!(l.state(), JobState::Paused);
}

#[test]
fn a_worker_lost_mid_operation_leaves_the_job_needing_recovery() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let now = secs(10);
    let first = start(&mut l, &layout.command(&[(1, true)]), op_id(1), now);
    assert_eq!(first.len(), 2);
    let a = l.worker_lost(
        GlobalRank(3),
        taskd_core::ledger::LostRank::died("heartbeats missed"),
        secs(11),
    );
    assert_eq!(broadcast_phases(&a), vec![Phase::Resume]);
    assert!(!l.is_registered(GlobalRank(3)));
    let mut now = secs(11);
    let (r, _) = drive(&mut l, &layout, a, &mut now, |_, r| {
        if r == 3 {
            Answer::Silent
        } else {
            Answer::Correct
        }
    });
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.lost_ranks, vec![GlobalRank(3)]);
    assert_eq!(l.state(), JobState::NeedsRecovery);
    assert!(matches!(
        l.submit(&layout.command(&[(1, true)]), op_id(2), now),
        Err(SubmitError::WorkersMissing { ref missing, .. }) if missing == "3"
    ));
    assert!(matches!(
        l.recover(RecoverTo::AsIs, op_id(9), now),
        Err(SubmitError::WorkersMissing { .. })
    ));
    assert!(!l.verify_due());
    l.register(hello(&layout, 3, SwitchCapabilities::ALL))
        .unwrap();
    // The lost rank is back: a verification round finds every group agreeing, and the job
    // runs again by itself.
    let v = verify(&mut l, &layout, &BTreeSet::new(), now);
    assert_eq!(v.job_state(), Some(JobState::Running), "{v}");
    assert_eq!(l.state(), JobState::Running);
    start(&mut l, &layout.command(&[(1, true)]), op_id(2), now);
}

#[test]
fn a_restarted_manager_rebuilds_the_table_and_opens_orphaned_gates() {
    let layout = Layout::new(2, 4);
    let mut l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    for r in 0..layout.world() {
        l.register(hello(&layout, r, SwitchCapabilities::ALL))
            .unwrap();
    }
    assert!(matches!(
        l.submit(&layout.command(&[(1, true)]), op_id(2), secs(0)),
        Err(SubmitError::Unverified { .. })
    ));
    // The previous manager died after the switch of ranks 1 and 5 was applied everywhere,
    // before its resume: every gate holds for its operation.
    let backup: BTreeSet<GlobalRank> = ranks(&[1, 5]).into_iter().collect();
    let orphan = op_id(77);
    let gate = GateReport {
        op: Some(orphan),
        held_after: Some(12),
    };
    let a = l.start_verification(op_id(3), secs(1));
    let v = answer_verification(&mut l, &layout, a, secs(1), |r| {
        layout.report(r, &backup, gate.clone())
    });
    assert_eq!(v.released, vec![orphan], "{v}");
    assert_eq!(l.state(), JobState::Running);
    assert_eq!(l.ranks_on_backup().collect::<Vec<_>>(), ranks(&[1, 5]));
    start(&mut l, &layout.command(&[(1, false)]), op_id(4), secs(2));
}

#[test]
fn a_restarted_manager_keeps_disagreeing_groups_held() {
    let layout = Layout::new(2, 4);
    let mut l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    for r in 0..layout.world() {
        l.register(hello(&layout, r, SwitchCapabilities::ALL))
            .unwrap();
    }
    // Rank 6 did not apply the switch of rank 2 that every other rank applied.
    let applied: BTreeSet<GlobalRank> = ranks(&[2]).into_iter().collect();
    let gate = GateReport {
        op: Some(op_id(77)),
        held_after: Some(12),
    };
    let v = verify_with(&mut l, &layout, secs(1), op_id(3), |r| {
        let b = if r.0 == 6 {
            BTreeSet::new()
        } else {
            applied.clone()
        };
        layout.report(r, &b, gate.clone())
    });
    assert!(v.released.is_empty(), "{v}");
    assert_eq!(l.state(), JobState::Paused);
    let text = v.to_string();
    assert!(
        text.contains("world") && text.contains("ranks 6 say none on backup"),
        "{text}"
    );
    assert!(matches!(
        l.submit(&layout.command(&[(1, true)]), op_id(2), secs(2)),
        Err(SubmitError::NotRunning {
            state: JobState::Paused
        })
    ));
    // Recovery re-states the ranks in doubt: those whose side the groups disagree on (rank 2;
    // its partner, rank 3, is not told anything, so no call splits a die pair).
    let RecoveryStarted::Operation { actions, .. } =
        l.recover(RecoverTo::Primary, op_id(4), secs(2)).unwrap()
    else {
        panic!("groups disagree: ranks are in doubt");
    };
    let mut now = secs(2);
    let (rec, sent) = drive(&mut l, &layout, actions, &mut now, |_, _| Answer::Correct);
    assert_eq!(rec.outcome, Outcome::Succeeded, "{rec}");
    let switch = sent
        .iter()
        .find_map(|d| match &d.kind {
            DirectiveKind::Switch { targets, .. } => Some(targets.clone()),
            _ => None,
        })
        .expect("a switch");
    assert_eq!(switch, vec![(GlobalRank(2), NicSide::Primary)]);
    assert_eq!(l.state(), JobState::Running);
}

// ---------------------------------------------------------------------------------------------
// Repeated ids
// ---------------------------------------------------------------------------------------------

#[test]
fn the_report_says_who_asked_for_the_operation() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let (operator, _) = run(&mut l, &layout, &[(1, true)], op_id(1), &mut now, |_, _| {
        Answer::Correct
    });
    assert_eq!(operator.trigger, Trigger::Operator);
    let first = match l.submit_by(Trigger::Auto, &layout.command(&[(1, false)]), op_id(2), now) {
        Ok(Submitted::Started { actions, .. }) => actions,
        other => panic!("expected a start, got {other:?}"),
    };
    assert_eq!(l.in_flight().map(|o| o.trigger()), Some(Trigger::Auto));
    let auto = drive(&mut l, &layout, first, &mut now, |_, _| Answer::Correct).0;
    assert_eq!(
        (auto.trigger, auto.outcome),
        (Trigger::Auto, Outcome::Succeeded)
    );
    assert_eq!(
        l.result_of(op_id(2)).map(|r| r.trigger),
        Some(Trigger::Auto)
    );
    assert_eq!(backup_of(&l), Vec::<u32>::new());
}

#[test]
fn a_repeated_id_returns_the_known_result_and_never_runs_twice() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let (ok, _) = run(&mut l, &layout, &[(1, true)], op_id(1), &mut now, |_, _| {
        Answer::Correct
    });
    let (failed, _) = run(
        &mut l,
        &layout,
        &[(2, true)],
        op_id(2),
        &mut now,
        fail_switch_on(0),
    );
    assert_eq!(ok.outcome, Outcome::Succeeded);
    assert_eq!(failed.outcome, Outcome::Failed);
    let before = snapshot(&l);

    // The same ids with the same requests: the stored results, nothing started.
    assert_eq!(
        l.submit(&layout.command(&[(1, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok.clone())))
    );
    assert_eq!(
        l.submit(&layout.command(&[(2, true)]), op_id(2), now),
        Ok(Submitted::Known(Box::new(failed.clone())))
    );
    assert_eq!(snapshot(&l), before);
    assert_eq!(backup_of(&l), vec![1]);

    // Also while another operation runs (not `busy`: the answer is known).
    start(&mut l, &layout.command(&[(3, true)]), op_id(3), now);
    assert_eq!(
        l.submit(&layout.command(&[(1, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok)))
    );
    assert_eq!(l.in_flight().map(|o| o.id()), Some(op_id(3)));
}

#[test]
fn a_reused_id_with_another_request_is_refused_naming_it() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let (ok, _) = run(
        &mut l,
        &layout,
        &[(1, true), (6, true)],
        op_id(1),
        &mut now,
        |_, _| Answer::Correct,
    );
    assert_eq!(ok.outcome, Outcome::Succeeded);
    let before = snapshot(&l);
    // The same targets in another order are the same request.
    assert_eq!(
        l.submit(&layout.command(&[(6, true), (1, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok.clone())))
    );
    // Another device, another direction, one target fewer or an invalid one: refused.
    for other in [
        layout.command(&[(1, true), (5, true)]),
        layout.command(&[(1, false), (6, false)]),
        layout.command(&[(1, true)]),
        SwitchCommand {
            targets: vec![taskd_core::command::Target {
                node: NodeName("node-9".into()),
                device: DeviceId(0),
                use_backup: true,
            }],
            ..layout.command(&[(1, true)])
        },
    ] {
        let e = l.submit(&other, op_id(1), now).unwrap_err();
        assert_eq!(e, SubmitError::IdReused { id: op_id(1) });
        assert!(e.to_string().contains(&op_id(1).to_string()), "{e}");
    }
    assert_eq!(snapshot(&l), before);

    // The operation in flight: the same request waits for it, another is refused (not busy).
    start(&mut l, &layout.command(&[(3, true)]), op_id(3), now);
    let in_flight = snapshot(&l);
    assert_eq!(
        l.submit(&layout.command(&[(3, true)]), op_id(3), now),
        Ok(Submitted::InFlight(op_id(3)))
    );
    assert_eq!(
        l.submit(&layout.command(&[(3, false)]), op_id(3), now),
        Err(SubmitError::IdReused { id: op_id(3) })
    );
    assert_eq!(snapshot(&l), in_flight);
}

#[test]
fn the_history_keeps_the_last_results() {
    // Two dies: a die moves to its backup NIC only with its partner in the job.
    let layout = Layout::new(1, 2);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    for i in 0..=HISTORY_LEN as u128 {
        let flag = i % 2 == 0;
        let (r, _) = run(&mut l, &layout, &[(0, flag)], op_id(i), &mut now, |_, _| {
            Answer::Correct
        });
        assert_eq!(r.outcome, Outcome::Succeeded);
    }
    assert_eq!(l.history().count(), HISTORY_LEN);
    assert_eq!(
        l.result_of(op_id(0)),
        None,
        "the oldest result is forgotten"
    );
    assert!(l.result_of(op_id(1)).is_some());
    assert_eq!(l.history().next().map(|r| r.id), Some(op_id(1)));
    assert_eq!(
        l.history().next_back().map(|r| r.id),
        Some(op_id(HISTORY_LEN as u128))
    );
}

/// The ledger of a new manager of the same job (every rank registered and verified again),
/// seeded with what `earlier` handed out.
fn restarted(layout: &Layout, earlier: &mut JobLedger) -> JobLedger {
    let mut l = ledger(layout);
    l.seed(earlier.take_finished());
    l
}

/// Runs two operations on `l`: uuid 1 moves ranks 1 and 6 to backup and succeeds, uuid 2
/// moves rank 2 and fails (rank 0's switch call fails, the rollback works). Returns their
/// reports and the time after them.
fn two_results(l: &mut JobLedger, layout: &Layout) -> (OperationReport, OperationReport, Duration) {
    let mut now = secs(0);
    let (ok, _) = run(
        l,
        layout,
        &[(1, true), (6, true)],
        op_id(1),
        &mut now,
        |_, _| Answer::Correct,
    );
    let (failed, _) = run(
        l,
        layout,
        &[(2, true)],
        op_id(2),
        &mut now,
        fail_switch_on(0),
    );
    (ok, failed, now)
}

#[test]
fn every_final_result_is_handed_out_once_for_the_journal() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    assert!(l.take_finished().is_empty(), "nothing finished yet");
    let (ok, failed, _) = two_results(&mut l, &layout);
    let out = l.take_finished();
    let ids: Vec<OperationId> = out.iter().map(|f| f.report.id).collect();
    assert_eq!(ids, [op_id(1), op_id(2)], "oldest first");
    assert_eq!(out[0].report, ok);
    assert_eq!(out[1].report, failed);
    assert_eq!(out[0], FinishedOperation::of(&ok));
    assert_eq!(
        out[0].fingerprint,
        RequestFingerprint::of(
            &layout
                .command(&[(6, true), (1, true)])
                .resolve(&layout.table)
                .unwrap()
                .targets
        ),
        "the targets in any order"
    );
    assert!(
        l.take_finished().is_empty(),
        "each result is handed out once"
    );
    // A record survives its serialized form unchanged (the file journal stores JSON).
    let json = serde_json::to_string(&out[1]).unwrap();
    let back: FinishedOperation = serde_json::from_str(&json).unwrap();
    assert_eq!(back, out[1]);
}

#[test]
fn a_seeded_ledger_answers_earlier_uuids_like_the_manager_that_ran_them() {
    let layout = Layout::new(2, 4);
    let mut first = ledger(&layout);
    let (ok, failed, now) = two_results(&mut first, &layout);
    let mut l = restarted(&layout, &mut first);
    let before = snapshot(&l);
    assert!(
        before.history.is_empty(),
        "earlier results are not this manager's history"
    );

    // The same requests (in any order): the earlier results, nothing started.
    assert_eq!(
        l.submit(&layout.command(&[(6, true), (1, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok.clone())))
    );
    assert_eq!(
        l.submit(&layout.command(&[(2, true)]), op_id(2), now),
        Ok(Submitted::Known(Box::new(failed.clone())))
    );
    assert_eq!(l.result_of(op_id(1)), Some(&ok));
    // Another request under a known uuid: refused, naming it.
    for (other, id) in [
        (layout.command(&[(1, true)]), op_id(1)),
        (layout.command(&[(1, false), (6, false)]), op_id(1)),
        (layout.command(&[(2, true), (5, true)]), op_id(2)),
    ] {
        assert_eq!(l.submit(&other, id, now), Err(SubmitError::IdReused { id }));
    }
    assert_eq!(snapshot(&l), before);
    assert!(
        l.take_finished().is_empty(),
        "seeded results are not handed out again"
    );

    // While another operation runs the answer is known too (not `busy`).
    start(&mut l, &layout.command(&[(3, true)]), op_id(3), now);
    assert_eq!(
        l.submit(&layout.command(&[(1, true), (6, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok)))
    );
    assert_eq!(l.in_flight().map(|o| o.id()), Some(op_id(3)));
}

/// A manager that stopped mid-operation leaves its admission in the journal and no result:
/// the next manager refuses that uuid for the same request (it is not run twice), as reused
/// for another, and starts a new uuid as usual.
#[test]
fn a_uuid_admitted_by_a_manager_that_stopped_before_its_result_is_refused_as_interrupted() {
    let layout = Layout::new(2, 4);
    let mut first = ledger(&layout);
    let (ok, _, now) = two_results(&mut first, &layout);
    let to_backup = layout.command(&[(3, true)]);
    start(&mut first, &to_backup, op_id(3), now);
    let admitted = first.take_admitted();
    let ids: Vec<OperationId> = admitted.iter().map(|a| a.id).collect();
    assert_eq!(ids, [op_id(1), op_id(2), op_id(3)], "each start, once");
    assert!(first.take_admitted().is_empty());
    // What a journal keeps when the manager stops now: uuid 3 admitted and not finished.
    let mut l = restarted(&layout, &mut first);
    l.seed_interrupted(admitted.into_iter().filter(|a| a.id == op_id(3)));
    let before = snapshot(&l);

    assert_eq!(
        l.submit(&to_backup, op_id(3), now),
        Err(SubmitError::Interrupted { id: op_id(3) })
    );
    assert_eq!(
        l.submit(&layout.command(&[(4, true)]), op_id(3), now),
        Err(SubmitError::IdReused { id: op_id(3) })
    );
    // A finished uuid still gets its result.
    assert_eq!(
        l.submit(&layout.command(&[(1, true), (6, true)]), op_id(1), now),
        Ok(Submitted::Known(Box::new(ok)))
    );
    assert_eq!(snapshot(&l), before, "nothing started");
    start(&mut l, &to_backup, op_id(4), now);
}

/// An operation whose admission could not be journaled is withdrawn before any of its
/// actions runs: the ledger is as before the command, nothing is handed to the journal, and
/// the same uuid starts afresh later.
#[test]
fn an_operation_withdrawn_before_its_first_action_leaves_no_trace() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let before = snapshot(&l);
    let cmd = layout.command(&[(3, true)]);
    start(&mut l, &cmd, op_id(7), secs(1));
    assert!(!l.withdraw(op_id(8)), "not the operation in flight");
    assert!(l.withdraw(op_id(7)));
    assert_eq!(snapshot(&l), before, "nothing runs, nothing changed");
    assert!(l.take_admitted().is_empty(), "no admission to journal");
    assert!(l.take_finished().is_empty(), "no result either");
    assert!(!l.withdraw(op_id(7)), "once");
    start(&mut l, &cmd, op_id(7), secs(2));
}

#[test]
fn a_ledger_keeps_the_newest_seeded_results() {
    let layout = Layout::new(1, 2);
    let mut first = ledger(&layout);
    let mut now = secs(0);
    for i in 0..=HISTORY_LEN as u128 {
        run(
            &mut first,
            &layout,
            &[(0, i % 2 == 0)],
            op_id(i),
            &mut now,
            |_, _| Answer::Correct,
        );
    }
    let records = first.take_finished();
    assert_eq!(
        records.len(),
        HISTORY_LEN,
        "an untaken outbox stays bounded"
    );
    let mut l = ledger(&layout);
    l.seed(records.clone());
    assert_eq!(l.result_of(op_id(0)), None, "the oldest is forgotten");
    assert_eq!(l.result_of(op_id(1)).map(|r| r.id), Some(op_id(1)));
    // One more pushes the oldest seeded one out.
    let mut extra = records[0].clone();
    extra.report.id = op_id(1000);
    l.seed([extra]);
    assert_eq!(l.result_of(op_id(1)), None);
    assert!(l.result_of(op_id(2)).is_some() && l.result_of(op_id(1000)).is_some());
}

/// The uuid check's notion of "the same request": every target's rank and side, as a set.
fn request(layout: &Layout, cmd: &SwitchCommand) -> BTreeSet<(u32, bool)> {
    cmd.targets
        .iter()
        .map(|t| {
            let n: u32 = t.node.0.trim_start_matches("node-").parse().unwrap();
            (n * layout.per_node + t.device.0, t.use_backup)
        })
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever ran (succeeded or failed, in any order), a ledger seeded with the handed-out
    /// results answers every earlier uuid as the manager that ran it: the same request gets
    /// the earlier report, another one is refused, and nothing starts.
    #[test]
    fn seeded_ledgers_answer_earlier_uuids_as_their_manager_did(
        ops in proptest::collection::vec(
            (proptest::collection::btree_map(0u32..8, proptest::bool::ANY, 1..4), proptest::option::of(0u32..8)),
            1..6,
        ),
        probes in proptest::collection::vec(
            (0usize..6, proptest::collection::vec((0u32..8, proptest::bool::ANY), 1..4)),
            1..8,
        ),
    ) {
        let layout = Layout::new(2, 4);
        let mut first = ledger(&layout);
        let mut now = secs(0);
        let mut ran = Vec::new();
        for (i, (targets, fail)) in ops.iter().enumerate() {
            let targets: Vec<(u32, bool)> = targets.iter().map(|(r, b)| (*r, *b)).collect();
            let cmd = layout.command(&targets);
            let fail = *fail;
            let answer = move |p: Phase, r: u32| match fail {
                Some(f) if r == f => fail_switch_on(f)(p, r),
                _ => Answer::Correct,
            };
            let id = op_id(i as u128 + 1);
            let (report, _) = run(&mut first, &layout, &targets, id, &mut now, answer);
            ran.push((id, cmd, report));
            if first.state() != JobState::Running {
                break;
            }
        }
        let mut l = restarted(&layout, &mut first);
        let before = snapshot(&l);
        for (k, targets) in probes {
            let (id, cmd, report) = &ran[k % ran.len()];
            proptest::prop_assert_eq!(
                l.submit(cmd, *id, now),
                Ok(Submitted::Known(Box::new(report.clone())))
            );
            let other = layout.command(&targets);
            let expected = if request(&layout, &other) == request(&layout, cmd) {
                Ok(Submitted::Known(Box::new(report.clone())))
            } else {
                Err(SubmitError::IdReused { id: *id })
            };
            proptest::prop_assert_eq!(l.submit(&other, *id, now), expected);
        }
        proptest::prop_assert_eq!(snapshot(&l), before);
    }
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

#[test]
fn registration_errors_are_named_and_register_nothing() {
    let layout = Layout::new(2, 4);
    let mut l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    l.register(hello(&layout, 0, SwitchCapabilities::ALL))
        .unwrap();

    let mut h = hello(&layout, 1, SwitchCapabilities::ALL);
    h.job = JobId("job-b".into());
    assert_eq!(
        l.register(h),
        Err(RegisterError::WrongJob {
            expected: job(),
            got: JobId("job-b".into())
        })
    );

    let h = WorkerHello {
        job: job(),
        node: "node-1".into(),
        rank: GlobalRank(8),
        capabilities: SwitchCapabilities::ALL,
        instance: taskd_core::Instance::UNKNOWN,
        generation: 0,
    };
    assert_eq!(
        l.register(h),
        Err(RegisterError::UnknownRank {
            rank: GlobalRank(8),
            world: 8
        })
    );

    let mut h = hello(&layout, 5, SwitchCapabilities::ALL);
    h.node = "node-0".into();
    let e = l.register(h).unwrap_err();
    assert_eq!(
        e,
        RegisterError::WrongNode {
            rank: GlobalRank(5),
            expected: "node-1".into(),
            got: "node-0".into()
        }
    );
    assert!(e.to_string().contains("node-1"), "{e}");

    assert_eq!(l.registered(), 1);
    assert!(l.is_registered(GlobalRank(0)));
    for r in [1, 5, 8] {
        assert!(!l.is_registered(GlobalRank(r)));
    }
    // A reconnect of rank 0 replaces it.
    l.register(hello(&layout, 0, SwitchCapabilities::ALL))
        .unwrap();
    assert_eq!(l.registered(), 1);
    assert_eq!(l.expected(), 8);
}

#[test]
fn events_without_an_operation_are_ignored() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    assert_eq!(l.handle(Event::Deadline { token: 1 }, secs(0)), vec![]);
    let nr = NodeReply {
        node: "node-0".into(),
        op: op_id(1),
        phase: Phase::Sample,
        replies: vec![rank_reply(
            op_id(1),
            0,
            Phase::Sample,
            ReplyBody::Sampled {
                in_step: 1,
                in_flight: false,
            },
        )],
        health: vec![],
    };
    assert_eq!(l.handle(Event::Replies(nr), secs(0)), vec![]);
    assert_eq!(l.state(), JobState::Running);
    assert_eq!(l.history().count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Stopping training
// ---------------------------------------------------------------------------------------------

/// Every rank's answer to a stop, one reply per node.
fn answer_stop(l: &mut JobLedger, layout: &Layout, stop: OperationId, now: Duration) {
    let mut by_node: BTreeMap<NodeName, Vec<_>> = BTreeMap::new();
    for r in layout.ranks() {
        by_node
            .entry(layout.node_of(r))
            .or_default()
            .push(rank_reply(
                stop,
                r.0,
                Phase::Stop,
                ReplyBody::Stopped { at_step: Some(9) },
            ));
    }
    for (node, replies) in by_node {
        let nr = NodeReply {
            node,
            op: stop,
            phase: Phase::Stop,
            replies,
            health: vec![],
        };
        assert_eq!(l.handle(Event::Replies(nr), now), vec![], "nothing runs");
    }
}

#[test]
fn a_stop_of_training_lasts_until_every_rank_is_back_and_forgets_the_old_nic_table() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(0);
    let (r, _) = run(&mut l, &layout, &[(6, true)], op_id(1), &mut now, |_, _| {
        Answer::Correct
    });
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(backup_of(&l), vec![6]);

    let actions = l
        .stop_training(op_id(2), StopBy::Operator, "maintenance".into(), now)
        .unwrap();
    assert_eq!(
        broadcasts(&actions)[0].kind,
        DirectiveKind::StopTraining {
            reason: "maintenance".into(),
            then: taskd_core::protocol::AfterStop::Launcher,
            only: Vec::new(),
        }
    );
    assert_eq!(l.state(), JobState::NeedsRecovery);
    let stop = l.training_stop().expect("under way").clone();
    assert_eq!(
        (stop.by, stop.phase(), stop.stopping.len()),
        (StopBy::Operator, StopPhase::Stopping, 8)
    );
    // Nothing else runs meanwhile, and each refusal says what the stop waits for.
    for refused in [
        l.submit(&layout.command(&[(1, true)]), op_id(3), now)
            .map(drop),
        l.recover(RecoverTo::Primary, op_id(3), now).map(drop),
        l.stop_training(op_id(3), StopBy::Policy, "again".into(), now)
            .map(drop),
    ] {
        assert!(
            matches!(&refused, Err(SubmitError::TrainingStopped { waiting, .. }) if waiting.contains("have not stopped")),
            "{refused:?}"
        );
    }
    answer_stop(&mut l, &layout, op_id(2), now);
    assert_eq!(
        l.training_stop().map(|s| s.phase()),
        Some(StopPhase::Restarting)
    );
    // The old processes exit; their new incarnations register one by one.
    for r in 0..layout.world() {
        assert!(l
            .worker_lost(
                GlobalRank(r),
                taskd_core::ledger::LostRank::died("exited"),
                now
            )
            .is_empty());
    }
    for r in 0..layout.world() {
        assert!(!l.verify_due(), "no round before every rank is back");
        l.register(hello(&layout, r, SwitchCapabilities::ALL))
            .unwrap();
    }
    assert!(l.training_stop().unwrap().not_back.is_empty());
    // The new processes applied nothing: the table comes from them, not from before.
    let v = verify(&mut l, &layout, &BTreeSet::new(), now);
    assert_eq!(v.job_state(), Some(JobState::Running), "{v}");
    assert_eq!(l.state(), JobState::Running);
    assert!(backup_of(&l).is_empty());
    assert!(l.training_stop().is_none());
    let last = l.last_training_stop().expect("remembered");
    assert_eq!((last.id, last.phase()), (op_id(2), StopPhase::Restarted));
    start(&mut l, &layout.command(&[(1, true)]), op_id(4), now);
}

/// What every rank reports after a cut during the switch of rank 6 to its backup NIC: node-1
/// applied it, node-0 did not, every gate held for operation 1; rank 0 also has `extra` on
/// backup.
fn cut_views(layout: &Layout, extra: Option<u32>) -> impl Fn(GlobalRank) -> WorkerReport + '_ {
    move |r: GlobalRank| {
        let mut b: BTreeSet<GlobalRank> = if r.0 >= 4 {
            ranks(&[6]).into_iter().collect()
        } else {
            BTreeSet::new()
        };
        if let Some(x) = extra.filter(|_| r.0 == 0) {
            b.insert(GlobalRank(x));
        }
        let held = GateReport {
            op: Some(op_id(1)),
            held_after: Some(10),
        };
        layout.report(r, &b, held)
    }
}

#[test]
fn only_the_interrupted_targets_split_cleanly_are_restated_by_the_manager_itself() {
    let layout = Layout::new(2, 4);
    let mut l = ledger(&layout);
    let mut now = secs(10);
    // A cut during the switch: node-1's ranks applied it but their answers were lost.
    let a = start(&mut l, &layout.command(&[(6, true)]), op_id(1), now);
    let (r, _) = drive(&mut l, &layout, a, &mut now, |phase, r| match (phase, r) {
        (Phase::Switch, 4..=7) => Answer::Silent,
        _ => Answer::Correct,
    });
    assert_eq!(r.job_state, JobState::Paused);
    assert!(
        !l.restates_by_itself(),
        "ranks are still inside their calls"
    );
    for rank in 4..=7 {
        late_answer(&mut l, &layout, op_id(1), rank, Phase::Switch, now);
    }
    verify_with(&mut l, &layout, now, op_id(2), cut_views(&layout, None));
    assert_eq!(l.state(), JobState::Paused);
    assert!(
        l.restates_by_itself(),
        "exactly the target, each view clean"
    );
    // A rank in doubt that was no target of the operation: an operator decides.
    l.register(hello(&layout, 0, SwitchCapabilities::ALL))
        .unwrap();
    verify_with(&mut l, &layout, now, op_id(3), cut_views(&layout, Some(1)));
    assert_eq!(l.state(), JobState::Paused);
    assert!(!l.restates_by_itself());
}
