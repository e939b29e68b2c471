//! Property tests of a switch driven by ClusterD (`core/src/clusterd.rs`).
//!
//! A random job and a ClusterD that runs its own state machine (pause, then the switch, then
//! continue; a failed switch sends it to stop_train, a failed pause to killMaster) and keeps
//! each awaited report in a one-slot buffer, as the real one does. Between its steps the world
//! does random things: ranks answer correctly, fail, stay silent or apply without answering;
//! deadlines fire (ClusterD or a rank is slow); ClusterD delivers its last message again or
//! sends killMaster; the manager is told to stop; ClusterD resets the job's flow (the signal
//! stream ends: a new session starts, and reports owed to the old one are dropped, as the
//! client drops them). Random rank lists include bad ones.
//!
//! Properties: every report is the one ClusterD awaits, and there is no report when it awaits
//! none (exactly one per request, never unsolicited); once the world goes quiet every awaited
//! report has come; the gates open, and an operation holds, only when every rank holds the same
//! view of the NICs (checked by the world on every resume and hold); `result: true` means every
//! rank holds the targets' new sides, `result: false` means nothing changed or the job is not
//! running; a running job at the end holds one view, equal to the manager's NIC table.
//! Training stops only on ClusterD's word, once: a stop of training is broadcast only after a
//! `stop_train` or `killMaster` and never while an operation runs (the world carries it out as
//! the manager does, and the ledger refuses one under an operation), and after a `killMaster`
//! training is stopped once the world goes quiet.

mod common;

use common::world::{ids, Reply, World};
use common::*;
use proptest::prelude::*;
use taskd_core::clusterd::{Pending, Report, Signal, Stage, CODE_OK};
use taskd_core::ledger::StopBy;
use taskd_core::protocol::{DirectiveKind, Phase};
use taskd_core::{GlobalRank, JobState};

/// One move of the world.
#[derive(Clone, Debug)]
enum Move {
    /// ClusterD takes its next step, if it awaits nothing.
    Next,
    /// ClusterD delivers its last message again.
    Again,
    /// ClusterD gives up and restarts the job.
    Kill,
    /// The ranks answer the directive in flight, each as the seed says.
    Answer(u64),
    /// The deadline armed last fires.
    Fire,
    /// The manager is stopping (SIGTERM): the operation in flight ends safely.
    Abort,
    /// ClusterD resets the job's flow: the session ends, a new one starts.
    Reset,
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    let m = prop_oneof![
        6 => Just(Move::Next),
        8 => any::<u64>().prop_map(Move::Answer),
        1 => Just(Move::Again),
        1 => Just(Move::Kill),
        1 => Just(Move::Fire),
        1 => Just(Move::Abort),
        1 => Just(Move::Reset),
    ];
    prop::collection::vec(m, 0..60)
}

/// A rank list ClusterD might send: mostly valid targets (rank numbers are taken modulo the
/// world size when sent), sometimes a bad one.
fn rank_list() -> impl Strategy<Value = (Vec<String>, Vec<bool>)> {
    let good = prop::collection::btree_map(0u32..64, any::<bool>(), 1..4).prop_map(|m| {
        let (r, o): (Vec<u32>, Vec<bool>) = m.into_iter().unzip();
        (ids(&r), o)
    });
    let bad = prop_oneof![
        Just((ids(&[1, 1]), vec![true, true])),
        Just((ids(&[1]), vec![true, false])),
        Just((vec!["x".to_string()], vec![true])),
        Just((ids(&[99]), vec![true])),
    ];
    prop_oneof![8 => good, 1 => bad]
}

/// `list` for a job of `world` ranks: good lists' ranks taken modulo the world (once each).
fn fit(list: &(Vec<String>, Vec<bool>), world: u32) -> (Vec<String>, Vec<bool>) {
    let (ranks, ops) = list;
    let bad = ranks.len() != ops.len() || ranks.iter().any(|r| r == "99" || r == "x");
    if bad || ranks.windows(2).any(|w| w[0] == w[1]) {
        return list.clone();
    }
    let mut seen = std::collections::BTreeMap::new();
    for (r, o) in ranks.iter().zip(ops) {
        seen.entry(r.parse::<u32>().unwrap() % world).or_insert(*o);
    }
    let (r, o): (Vec<u32>, Vec<bool>) = seen.into_iter().unzip();
    (ids(&r), o)
}

/// What ClusterD sent last.
#[derive(Clone, Debug)]
enum Sent {
    Signal(Signal),
    Switch(Vec<String>, Vec<bool>),
}

/// ClusterD's side: where its flow stands and the report its one-slot buffer waits for.
struct ClusterD {
    flow: Flow,
    awaiting: Option<&'static str>,
    last: Option<Sent>,
    lists: Vec<(Vec<String>, Vec<bool>)>,
    n: usize,
    /// How many directives were broadcast when ClusterD first sent stop_train or killMaster.
    first_stop: Option<usize>,
    /// ClusterD sent killMaster.
    killed: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Flow {
    Idle,
    /// Paused: the switch comes next.
    Paused(String),
    /// The switch worked: continue comes next.
    Switched(String),
    /// The switch failed: stop_train comes next.
    SwitchFailed,
    /// The pause failed: killMaster comes next.
    PauseFailed,
    /// Waiting for a report.
    Waiting(String),
}

impl ClusterD {
    fn send(&mut self, w: &mut World, s: Sent) -> Vec<Report> {
        self.last = Some(s.clone());
        if let Sent::Signal(Signal::StopTrain { .. } | Signal::KillMaster { .. }) = &s {
            self.first_stop.get_or_insert(w.sent.len());
            self.killed |= matches!(s, Sent::Signal(Signal::KillMaster { .. }));
        }
        match s {
            Sent::Signal(sig) => w.signal(sig),
            Sent::Switch(r, o) => w.switch(&r, &o),
        }
    }

    fn next(&mut self, w: &mut World) -> Vec<Report> {
        if self.awaiting.is_some() {
            return Vec::new();
        }
        self.n += 1;
        let (sent, awaits, flow) = match std::mem::replace(&mut self.flow, Flow::Idle) {
            Flow::Idle => {
                let u = format!("u{}", self.n);
                let s = Signal::Pause { uuid: u.clone() };
                (Sent::Signal(s), Some("stop_complete"), Flow::Waiting(u))
            }
            Flow::Paused(u) => {
                let (r, o) = fit(&self.lists[self.n % self.lists.len()], w.layout.world());
                (Sent::Switch(r, o), Some("switch_result"), Flow::Waiting(u))
            }
            Flow::Switched(u) => {
                let s = Signal::Continue { uuid: u.clone() };
                (Sent::Signal(s), Some("recover_status"), Flow::Waiting(u))
            }
            Flow::SwitchFailed => {
                let s = Signal::StopTrain {
                    uuid: format!("s{}", self.n),
                };
                (
                    Sent::Signal(s),
                    Some("stop_complete"),
                    Flow::Waiting(String::new()),
                )
            }
            Flow::PauseFailed => {
                let s = Signal::KillMaster {
                    uuid: format!("k{}", self.n),
                };
                (Sent::Signal(s), None, Flow::Idle)
            }
            Flow::Waiting(_) => unreachable!("awaits a report"),
        };
        self.awaiting = awaits;
        self.flow = flow;
        self.send(w, sent)
    }

    /// A report arrives: it must be the awaited one; the flow moves on.
    fn receive(&mut self, w: &World, r: &Report) {
        let Some(want) = self.awaiting.take() else {
            panic!("a report nobody awaits: {r:?}");
        };
        assert_eq!(r.kind(), want, "ClusterD awaits {want}, got {r:?}");
        let Flow::Waiting(u) = std::mem::replace(&mut self.flow, Flow::Idle) else {
            panic!("a report outside a wait");
        };
        self.flow = match r {
            Report::StopComplete { code, .. } if *code == CODE_OK && !u.is_empty() => {
                Flow::Paused(u)
            }
            Report::StopComplete { .. } if !u.is_empty() => Flow::PauseFailed,
            Report::StopComplete { .. } => Flow::Idle,
            Report::SwitchResult { ok: true } => {
                let Some(Sent::Switch(ranks, ops)) = &self.last else {
                    panic!("a switch result without a switch");
                };
                // Every rank holds the targets' new sides.
                assert!(w.views_agree(), "{:?}", w.views);
                let view = w.view();
                for (id, op) in ranks.iter().zip(ops) {
                    let rank: u32 = id.parse().unwrap();
                    assert_eq!(view.contains(&rank), *op, "rank {rank} in {view:?}");
                }
                Flow::Switched(u)
            }
            Report::SwitchResult { ok: false } => {
                // Nothing changed, or the job is held for an operator (a rollback failed).
                let held = w.ledger.in_flight().is_none() && w.ledger.state() != JobState::Running;
                if !held {
                    assert!(w.views_agree(), "{:?}", w.views);
                    assert_eq!(w.view(), w.table(), "a false result left the NICs changed");
                }
                Flow::SwitchFailed
            }
            Report::RecoverStatus { .. } => Flow::Idle,
        };
    }

    /// The flow is reset (ClusterD's state machine is back in INIT); the manager's session
    /// ends and a new one starts.
    fn reset(&mut self, w: &mut World) {
        self.awaiting = None;
        self.flow = Flow::Idle;
        self.last = None;
        let ended = w.from.session;
        w.from.session += 1;
        w.session_end(ended);
    }

    fn kill(&mut self, w: &mut World) -> Vec<Report> {
        self.n += 1;
        self.awaiting = None;
        self.flow = Flow::Idle;
        let s = Signal::KillMaster {
            uuid: format!("k{}", self.n),
        };
        self.send(w, Sent::Signal(s))
    }
}

/// How rank `r` answers under `seed`: most of the time every rank answers correctly; else one
/// rank (of up to 12) fails, stays silent or applies without answering.
fn reply(seed: u64, r: GlobalRank) -> Reply {
    if seed % 10 < 7 || (seed >> 8) % 12 != u64::from(r.0) {
        return Reply::Correct;
    }
    match (seed >> 16) % 3 {
        0 => Reply::Failed,
        1 => Reply::Silent,
        _ => Reply::DoneSilently,
    }
}

fn play(nodes: u32, per_node: u32, lists: Vec<(Vec<String>, Vec<bool>)>, script: Vec<Move>) {
    play_checking(nodes, per_node, lists, script, |_| {});
}

/// [`play`], with `check` after every move of the world.
fn play_checking(
    nodes: u32,
    per_node: u32,
    lists: Vec<(Vec<String>, Vec<bool>)>,
    script: Vec<Move>,
    check: impl Fn(&World),
) {
    let mut w = World::new(Layout::new(nodes, per_node), secs(900));
    let mut cd = ClusterD {
        flow: Flow::Idle,
        awaiting: None,
        last: None,
        lists,
        n: 0,
        first_stop: None,
        killed: false,
    };
    let step = |w: &mut World, cd: &mut ClusterD, m: &Move| {
        let before = w.sent_to.len();
        match m {
            Move::Next => cd.next(w),
            Move::Again => match cd.last.clone() {
                Some(Sent::Signal(s)) => {
                    let got = w.signal(s);
                    assert!(
                        got.is_empty(),
                        "a message delivered again was answered: {got:?}"
                    );
                    got
                }
                Some(Sent::Switch(r, o)) => {
                    let got = w.switch(&r, &o);
                    assert!(
                        got.is_empty(),
                        "a rank list delivered again was answered: {got:?}"
                    );
                    got
                }
                None => Vec::new(),
            },
            Move::Kill => cd.kill(w),
            Move::Answer(seed) => w.answer(|_, r| reply(*seed, r)),
            Move::Fire => w.fire(),
            Move::Abort => {
                let actions = w.ledger.abort("stopping".into(), w.now);
                w.run_actions(actions)
            }
            Move::Reset => {
                cd.reset(w);
                Vec::new()
            }
        };
        // What the client sends: the reports of the current session (it drops the others).
        let session = w.from.session;
        let reports: Vec<Report> = w.sent_to[before..]
            .iter()
            .filter(|o| o.session == session)
            .map(|o| o.report.clone())
            .collect();
        for r in &reports {
            cd.receive(w, r);
        }
        check(w);
    };
    for m in &script {
        step(&mut w, &mut cd, m);
    }
    // The world goes quiet: ranks answer, ClusterD follows its flow, deadlines fire when
    // nothing else moves. Every awaited report comes.
    for _ in 0..200 {
        let quiet = cd.awaiting.is_none()
            && w.ledger.in_flight().is_none()
            && matches!(cd.flow, Flow::Idle)
            && w.pending.is_none();
        if quiet {
            break;
        }
        let m = if w.pending.is_some() {
            Move::Answer(0)
        } else if cd.awaiting.is_none() && !matches!(cd.flow, Flow::Idle) {
            Move::Next
        } else {
            Move::Fire
        };
        step(&mut w, &mut cd, &m);
    }
    assert_eq!(cd.awaiting, None, "ClusterD still awaits a report");
    assert!(w.ledger.in_flight().is_none(), "an operation never ended");
    let stops: Vec<usize> = (w.sent.iter().enumerate())
        .filter(|(_, d)| matches!(d.kind, DirectiveKind::StopTraining { .. }))
        .map(|(i, _)| i)
        .collect();
    assert!(stops.len() <= 1, "training stopped twice: {stops:?}");
    if let Some(&i) = stops.first() {
        let after = cd.first_stop.is_some_and(|s| s <= i);
        assert!(
            after,
            "training stopped without ClusterD's stop_train or killMaster"
        );
        let stop = w
            .ledger
            .training_stop()
            .expect("the stop lasts: no process came back");
        assert_eq!(stop.by, StopBy::Clusterd);
    }
    if cd.killed {
        assert_eq!(stops.len(), 1, "killMaster did not stop training");
    }
    if w.ledger.state() == JobState::Running {
        assert_eq!(
            w.view(),
            w.table(),
            "the NIC table is not what the ranks hold"
        );
    }
}

/// The sequencer's own state against the world's: it drives exactly the operation in flight
/// (only ClusterD starts operations here), at a stage ClusterD's requests explain, and what it
/// has pending waits for that operation: a `stop_train` to take again only while ClusterD's
/// operation is resuming, a stop of training never (that one waits for an operator's).
fn the_sequencers_state_matches_the_world(w: &World) {
    let driving = w.seq.current().map(|(_, id)| id);
    assert_eq!(driving, w.ledger.in_flight().map(|o| o.id()));
    match w.seq.stage() {
        None => assert_eq!(w.seq.owed(), 0),
        Some(Stage::Stopping { reason, .. }) => assert!(reason.starts_with("ClusterD ")),
        Some(_) => {}
    }
    match w.seq.pending() {
        None => {}
        Some(Pending::StopTrainAgain { from, .. }) => {
            assert!(driving.is_some(), "a stop_train waits for no operation");
            assert_eq!(
                w.ledger.phase(),
                Some(Phase::Resume),
                "a stop_train pending while the operation can still hold"
            );
            assert_eq!(from.session, w.from.session, "pending for an ended session");
        }
        Some(p @ Pending::StopTraining { .. }) => panic!("no operator's operation: {p:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn clusterd_gets_exactly_the_reports_it_awaits_and_the_gates_open_only_on_agreement(
        nodes in 1u32..=3,
        per_node in 1u32..=4,
        lists in prop::collection::vec(rank_list(), 1..4),
        script in moves(),
    ) {
        play(nodes, per_node, lists, script);
    }

    #[test]
    fn the_sequencer_drives_the_operation_in_flight_and_nothing_pending_outlives_it(
        nodes in 1u32..=3,
        per_node in 1u32..=4,
        lists in prop::collection::vec(rank_list(), 1..4),
        script in moves(),
    ) {
        play_checking(nodes, per_node, lists, script, the_sequencers_state_matches_the_world);
    }
}

#[test]
fn a_clean_run_switches_and_comes_back() {
    let lists = vec![(ids(&[0, 2]), vec![true, true])];
    play(2, 4, lists, vec![Move::Next]);
}
