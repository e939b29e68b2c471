//! Property tests of the recovery contract in the ledger (docs/recovery.md).
//!
//! A random job and a random world: what every rank has applied (each rank believes a set of
//! ranks is on backup; ranks may disagree), where every gate stands (idle, armed or held for
//! some orphaned operation), and a random sequence of registrations, losses, verification
//! rounds (answered in random node order, some ranks silent) and submissions. An oracle
//! computed from the world says what each round must conclude; the ledger must agree, and it
//! must never admit a switch or open a gate it should not.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use taskd_core::ledger::Submitted;
use taskd_core::protocol::{
    DirectiveKind, GateReport, NodeReply, Phase, ReplyBody, WorkerHello, WorkerReport,
};
use taskd_core::{
    Action, Event, GlobalRank, JobLedger, JobState, OperationId, SubmitError, SwitchCapabilities,
};

/// One rank of the world.
#[derive(Clone, Debug)]
struct RankState {
    /// The ranks this process believes are on backup (its view of every group it is in).
    backup: BTreeSet<GlobalRank>,
    /// The orphaned operation its gate serves (if any), and whether training holds.
    gate: Option<(u128, bool)>,
    /// Whether it answers a verification.
    answers: bool,
}

/// What the world does next.
#[derive(Clone, Debug)]
enum Step {
    Lose(u32),
    Register(u32),
    Verify,
    Submit,
}

#[derive(Clone, Debug)]
struct Case {
    nodes: u32,
    per_node: u32,
    ranks: Vec<RankState>,
    steps: Vec<Step>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=3, 1u32..=4).prop_flat_map(|(nodes, per_node)| {
        let world = nodes * per_node;
        let shared: BTreeSet<GlobalRank> = BTreeSet::new();
        let rank = (
            prop::collection::btree_set(0..world, 0..=2),
            prop::option::weighted(0.3, (1u128..=2, any::<bool>())),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.8),
        )
            .prop_map(move |(own, gate, answers, agree)| RankState {
                // Most ranks agree on one shared view (here: none on backup); some carry
                // their own.
                backup: if agree {
                    shared.clone()
                } else {
                    own.into_iter().map(GlobalRank).collect()
                },
                gate,
                answers,
            });
        let step = prop_oneof![
            (0..world).prop_map(Step::Lose),
            (0..world).prop_map(Step::Register),
            Just(Step::Verify),
            Just(Step::Verify),
            Just(Step::Submit),
        ];
        (
            Just(nodes),
            Just(per_node),
            prop::collection::vec(rank, world as usize),
            prop::collection::vec(step, 0..12),
        )
            .prop_map(|(nodes, per_node, ranks, steps)| Case {
                nodes,
                per_node,
                ranks,
                steps,
            })
    })
}

fn hello(layout: &Layout, rank: u32) -> WorkerHello {
    WorkerHello {
        job: job(),
        node: layout.node_of(GlobalRank(rank)),
        rank: GlobalRank(rank),
        capabilities: SwitchCapabilities::ALL,
        instance: taskd_core::Instance::UNKNOWN,
        generation: 0,
    }
}

struct World {
    layout: Layout,
    ranks: Vec<RankState>,
    registered: BTreeSet<u32>,
    ledger: JobLedger,
    next_id: u128,
}

impl World {
    fn report(&self, r: GlobalRank) -> WorkerReport {
        let s = &self.ranks[r.0 as usize];
        let gate = match s.gate {
            Some((op, held)) => GateReport {
                op: Some(op_id(op)),
                held_after: held.then_some(7),
            },
            None => GateReport::default(),
        };
        self.layout.report(r, &s.backup, gate)
    }

    /// What a complete round must conclude about the world.
    fn oracle(&self) -> (bool, bool, BTreeSet<GlobalRank>) {
        let views: BTreeSet<&BTreeSet<GlobalRank>> = self.ranks.iter().map(|s| &s.backup).collect();
        let one_view = views.len() == 1;
        // A view only matters where a group sees it: with several views the judgement can still
        // be "consistent" when the differing ranks are in no shared group, which the world's
        // layout (world group of everyone) rules out. So: consistent iff one view.
        let held = self.ranks.iter().any(|s| matches!(s.gate, Some((_, true))));
        let union = self
            .ranks
            .iter()
            .flat_map(|s| s.backup.iter().copied())
            .collect();
        (one_view, held, union)
    }

    fn run_verification(&mut self) {
        if !self.ledger.verify_due() {
            return;
        }
        self.next_id += 1;
        let id = op_id(1000 + self.next_id);
        let mut todo = self
            .ledger
            .start_verification(id, secs(self.next_id as u64));
        let complete = self.ranks.iter().all(|s| s.answers);
        let mut resumed = Vec::new();
        while let Some(d) = broadcasts(&todo).last().map(|d| (*d).clone()) {
            let token = todo.iter().find_map(|a| match a {
                Action::ArmDeadline { token, .. } => Some(*token),
                _ => None,
            });
            let mut by_node: BTreeMap<_, Vec<_>> = BTreeMap::new();
            for r in self.layout.ranks() {
                if !self.ranks[r.0 as usize].answers {
                    continue;
                }
                let body = match d.kind {
                    DirectiveKind::Verify => ReplyBody::Verified(self.report(r)),
                    DirectiveKind::Resume => {
                        resumed.push(d.op);
                        ReplyBody::Resumed { stalled: secs(0) }
                    }
                    ref other => panic!("a round sent {other:?}"),
                };
                by_node
                    .entry(self.layout.node_of(r))
                    .or_default()
                    .push(rank_reply(d.op, r.0, d.phase(), body));
            }
            let mut next = Vec::new();
            for (node, replies) in by_node {
                let nr = NodeReply {
                    node,
                    op: d.op,
                    phase: d.phase(),
                    replies,
                    health: vec![],
                };
                next = self
                    .ledger
                    .handle(Event::Replies(nr), secs(self.next_id as u64));
                if !next.is_empty() {
                    break;
                }
            }
            if next.is_empty() {
                next = self.ledger.handle(
                    Event::Deadline {
                        token: token.expect("a round arms its deadline"),
                    },
                    secs(self.next_id as u64 + 1),
                );
            }
            if let Some(Action::Verified(v)) = next.last() {
                let (consistent, held, union) = self.oracle();
                if !complete {
                    // Nothing is established without every report.
                    assert_eq!(v.job_state(), None, "{v}");
                    assert!(!self.ledger.is_verified());
                    assert!(v.released.is_empty());
                    assert!(resumed.is_empty(), "a gate was opened on a partial view");
                    assert_ne!(self.ledger.state(), JobState::Running);
                } else if consistent {
                    assert_eq!(self.ledger.state(), JobState::Running, "{v}");
                    assert_eq!(
                        self.ledger.ranks_on_backup().collect::<BTreeSet<_>>(),
                        union
                    );
                    // Every orphaned operation's gates were opened, each once, under its id.
                    let orphans: BTreeSet<OperationId> = self
                        .ranks
                        .iter()
                        .filter_map(|s| s.gate.map(|(op, _)| op_id(op)))
                        .collect();
                    assert_eq!(resumed.iter().copied().collect::<BTreeSet<_>>(), orphans);
                    for s in &mut self.ranks {
                        s.gate = None;
                    }
                } else {
                    assert!(
                        resumed.is_empty(),
                        "a gate was opened onto groups that disagree"
                    );
                    let want = if held {
                        JobState::Paused
                    } else {
                        JobState::NeedsRecovery
                    };
                    assert_eq!(self.ledger.state(), want, "{v}");
                    assert!(!v.assessment.as_ref().unwrap().disagreements.is_empty());
                }
                return;
            }
            todo = next;
        }
    }

    fn submit(&mut self) {
        self.next_id += 1;
        let cmd = self.layout.command(&[(0, true)]);
        let ready = self.ledger.is_verified()
            && self.ledger.state() == JobState::Running
            && self.registered.len() == self.ranks.len()
            && self.ledger.in_flight().is_none()
            && self.ledger.verifying().is_none();
        match self
            .ledger
            .submit(&cmd, op_id(5000 + self.next_id), secs(0))
        {
            Ok(Submitted::Started { actions, .. }) => {
                assert!(
                    ready,
                    "admitted a switch on an unverified or not running job"
                );
                // End it at once (abort before anything changed) to keep the world simple.
                let a = self.ledger.abort("test".into(), secs(1));
                assert!(broadcasts(&a).iter().all(|d| d.phase() == Phase::Resume));
                let _ = actions;
                let mut by_node: BTreeMap<_, Vec<_>> = BTreeMap::new();
                let d = broadcasts(&a)[0].clone();
                for r in self.layout.ranks() {
                    by_node
                        .entry(self.layout.node_of(r))
                        .or_default()
                        .push(rank_reply(
                            d.op,
                            r.0,
                            Phase::Resume,
                            ReplyBody::Resumed { stalled: secs(0) },
                        ));
                }
                for (node, replies) in by_node {
                    let nr = NodeReply {
                        node,
                        op: d.op,
                        phase: Phase::Resume,
                        replies,
                        health: vec![],
                    };
                    self.ledger.handle(Event::Replies(nr), secs(2));
                }
                assert!(self.ledger.in_flight().is_none());
            }
            Ok(other) => panic!("a fresh id: {other:?}"),
            Err(e) => assert!(
                !ready
                    || matches!(
                        e,
                        SubmitError::Invalid(_) | SubmitError::CapabilityMissing { .. }
                    ),
                "a ready job refused: {e}"
            ),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    })]

    /// Every complete round concludes what the world says; no switch is admitted before one;
    /// no gate is opened onto disagreeing groups or on a partial view; a lost rank that returns
    /// brings the job back to running only through a round that finds every group agreeing.
    #[test]
    fn the_recovery_contract_holds_in_any_world(case in case()) {
        let layout = Layout::new(case.nodes, case.per_node);
        let ledger = JobLedger::new(job(), layout.table.clone(), DEADLINES);
        let mut w = World { layout, ranks: case.ranks.clone(), registered: BTreeSet::new(), ledger, next_id: 0 };
        for r in 0..w.ranks.len() as u32 {
            w.ledger.register(hello(&w.layout, r)).unwrap();
            w.registered.insert(r);
        }
        w.submit();
        w.run_verification();
        for step in &case.steps {
            match step {
                Step::Lose(r) => {
                    w.ledger.worker_lost(GlobalRank(*r), taskd_core::ledger::LostRank::died("lost"), secs(0));
                    w.registered.remove(r);
                    assert!(!w.ledger.is_verified());
                    assert_ne!(w.ledger.state(), JobState::Running);
                }
                Step::Register(r) => {
                    w.ledger.register(hello(&w.layout, *r)).unwrap();
                    w.registered.insert(*r);
                    // A returning process (or a reconnect) owes a round.
                    assert!(!w.ledger.is_verified());
                }
                Step::Verify => w.run_verification(),
                Step::Submit => w.submit(),
            }
        }
    }
}
