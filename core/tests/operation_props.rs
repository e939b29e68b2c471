//! Property tests of the operation state machine against a simulated world.
//!
//! A random job (1..=3 nodes x 1..=4 ranks, groups `world` + `tp_{node}` + `dp_{device}`),
//! random targets and previous NIC state, and a world that answers every broadcast per rank
//! with the reply a real worker would send (digests from `plan_calls` + `GroupCall::digest`),
//! a failure, silence, duplicates, late or foreign replies, a reply that does not answer the
//! phase, garbled calls, or the loss of the worker; messages arrive in random order and
//! deadlines fire at random (current and stale tokens). The world keeps its own record of what
//! every rank really said and checks the machine's decisions against it.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use taskd_core::operation::OperationError;
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, NodeReply, Phase, RankError, RankReply, ReplyBody,
};
use taskd_core::{
    Action, Event, GlobalRank, HcclCode, JobState, LinkHealth, NicSide, Operation, OperationId,
    OperationReport, Outcome, PhaseDeadlines,
};

const STEP: Duration = Duration::from_secs(10);
const DL: PhaseDeadlines = PhaseDeadlines {
    pause: STEP,
    switch: STEP,
    rollback: STEP,
    resume: STEP,
};

/// The world's random choices. Proptest shrinks the vector towards zeros and shorter, so an
/// exhausted or zeroed dice means "behave": answer correctly, deliver in order.
struct Dice {
    v: Vec<u8>,
    i: usize,
}

impl Dice {
    fn roll(&mut self, default: u8) -> u8 {
        let x = self.v.get(self.i).copied().unwrap_or(default);
        self.i += 1;
        x
    }
    fn pick(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        self.roll(0) as usize % n
    }
}

/// How one rank answers one directive.
#[derive(Copy, Clone, Debug, PartialEq)]
enum Choice {
    Correct,
    Failed,
    Silent,
    Duplicate,
    /// The correct reply plus a late copy of an earlier answer or a foreign operation's reply.
    Stale,
    /// The right kind of reply with wrong content (a step off, garbled calls).
    Garbled,
    /// A reply tagged with the phase whose body answers another phase.
    Mismatched,
    /// The worker dies (sometimes after its reply left).
    Lost,
}

/// A rank misbehaves with probability about `chaos / 256`; then `y` says how.
fn choice(x: u8, chaos: u8, y: u8) -> Choice {
    if u16::from(x) + u16::from(chaos) <= 255 {
        return Choice::Correct;
    }
    match y {
        0..=50 => Choice::Failed,
        51..=89 => Choice::Silent,
        90..=119 => Choice::Duplicate,
        120..=159 => Choice::Stale,
        160..=199 => Choice::Garbled,
        200..=219 => Choice::Mismatched,
        _ => Choice::Lost,
    }
}

/// What the world knows about one broadcast: the first reply each rank gave to it (tagged with
/// its phase, for this operation) while it was the machine's current phase.
#[derive(Debug)]
struct Window {
    directive: Directive,
    first: BTreeMap<GlobalRank, ReplyBody>,
}

impl Window {
    fn phase(&self) -> Phase {
        self.directive.phase()
    }
}

struct World {
    layout: Layout,
    id: OperationId,
    targets: Vec<(GlobalRank, NicSide)>,
    /// The rollback's two rounds: `targets`, then `restate`.
    previous: (Flags, Flags),
    plan_targets: Vec<taskd_core::command::RankTarget>,
    steps: BTreeMap<GlobalRank, u64>,
    dice: Dice,
    chaos: u8,
    /// Which phases the chaos applies to: bit `i` for the `i`-th of
    /// sample, pause, switch, rollback, resume.
    wild: u8,
    now: Duration,
    started: Duration,
    op: Operation,
    /// Messages on their way to the machine.
    queue: Vec<Event>,
    /// Ranks the world has killed: they answer nothing more.
    dead: BTreeSet<GlobalRank>,
    /// Ranks whose loss the machine was told of before it finished.
    lost: BTreeSet<GlobalRank>,
    windows: Vec<Window>,
    /// Every armed `(token, at)`.
    tokens: Vec<(u64, Duration)>,
    reports: Vec<(OperationReport, Duration)>,
    /// A target-side down link was delivered while the machine sampled.
    link_down_seen: bool,
    /// `(rank, phase)` of every Failed reply for this operation the world sent.
    failures_sent: BTreeSet<(GlobalRank, Phase)>,
}

fn foreign() -> OperationId {
    op_id(0xF0_4E16)
}

fn rank_error(rank: GlobalRank, phase: Phase) -> RankError {
    let mut e = hal_failure("world", HcclCode::Network);
    e.message = format!("rank {rank} failed {phase}");
    e
}

/// `(rank, side)` pairs.
type Flags = Vec<(GlobalRank, NicSide)>;

impl World {
    fn new(case: &Case) -> World {
        let layout = Layout::new(case.nodes, case.per_node);
        let world = layout.world();
        let mut seen = BTreeSet::new();
        let mut targets = Vec::new();
        let mut previous = Vec::new();
        for (r, b, prev) in &case.targets {
            let r = r % world;
            if seen.insert(r) {
                targets.push((r, *b));
                previous.push((r, *prev));
            }
        }
        let plan = layout.plan(&targets);
        let steps = (0..world)
            .map(|r| {
                let ahead = case.ahead.get(r as usize).copied().unwrap_or(false);
                (GlobalRank(r), case.base_step + u64::from(ahead))
            })
            .collect();
        let id = op_id(0x5EED);
        let started = secs(1000);
        let (op, actions) = Operation::start(
            id,
            plan.clone(),
            flags(&previous),
            layout.ranks(),
            DL,
            started,
        );
        let mut w = World {
            targets: plan.rank_sides(),
            // The rollback re-states every target's previous side; an unchanged one whose
            // partner die the switch changes in a second round (the two dies of one NPU are
            // never told opposite sides in one call).
            previous: {
                let was: BTreeMap<GlobalRank, NicSide> = flags(&previous).into_iter().collect();
                let changed: BTreeSet<u32> = plan
                    .rank_sides()
                    .into_iter()
                    .filter(|(r, now)| was.get(r).is_some_and(|w| w != now))
                    .map(|(r, _)| r.0)
                    .collect();
                let partner = |r: u32| layout.rank_of_partner(GlobalRank(r));
                flags(&previous).into_iter().partition(|(r, was)| {
                    !plan.rank_sides().contains(&(*r, *was))
                        || !partner(r.0).is_some_and(|p| changed.contains(&p.0))
                })
            },
            plan_targets: plan.targets,
            layout,
            id,
            steps,
            dice: Dice {
                v: case.dice.clone(),
                i: 0,
            },
            chaos: case.chaos,
            wild: case.wild,
            now: started,
            started,
            op,
            queue: Vec::new(),
            dead: BTreeSet::new(),
            lost: BTreeSet::new(),
            windows: Vec::new(),
            tokens: Vec::new(),
            reports: Vec::new(),
            link_down_seen: false,
            failures_sent: BTreeSet::new(),
        };
        w.process(actions);
        w
    }

    /// The chaos level of a phase.
    fn chaos_in(&self, p: Phase) -> u8 {
        let bit = match p {
            Phase::Sample => 0,
            Phase::Pause => 1,
            Phase::Switch => 2,
            Phase::Rollback => 3,
            Phase::Resume => 4,
            Phase::Verify | Phase::Stop | Phase::Abort => {
                unreachable!("an operation never verifies or stops, and none here aborts")
            }
        };
        if self.wild & (1 << bit) != 0 {
            self.chaos
        } else {
            0
        }
    }

    fn finished(&self) -> bool {
        !self.reports.is_empty()
    }

    fn window(&self, phase: Phase) -> Option<&Window> {
        self.windows.iter().find(|w| w.phase() == phase)
    }

    fn live(&self) -> Vec<GlobalRank> {
        self.layout
            .ranks()
            .into_iter()
            .filter(|r| !self.lost.contains(r))
            .collect()
    }

    // ---- the machine's side ----------------------------------------------------------------

    fn handle(&mut self, ev: Event) {
        let actions = self.op.handle(ev, self.now);
        self.process(actions);
    }

    fn process(&mut self, actions: Vec<Action>) {
        for a in actions {
            assert!(!self.finished(), "an action after the Finish: {a:?}");
            match a {
                Action::Broadcast(d) => self.on_broadcast(d),
                Action::ArmDeadline { token, phase, at } => {
                    let w = self.windows.last().expect("a deadline after a broadcast");
                    assert_eq!(
                        phase,
                        w.phase(),
                        "the deadline is for the phase just entered"
                    );
                    assert_eq!(token, self.tokens.len() as u64 + 1, "tokens count up");
                    assert_eq!(at, self.now + STEP);
                    self.tokens.push((token, at));
                }
                Action::Finish(r) => self.reports.push((*r, self.now)),
                Action::Verified(v) => panic!("an operation never verifies: {v}"),
                Action::Held(h) => panic!("only a sequenced operation holds: {h:?}"),
            }
        }
    }

    /// Checks a directive against what the world saw, then answers it.
    fn on_broadcast(&mut self, d: Directive) {
        assert_eq!(d.op, self.id);
        let prev = self.windows.last().map(Window::phase);
        let phase = d.phase();
        let allowed = match prev {
            None => phase == Phase::Sample,
            Some(Phase::Sample) => matches!(phase, Phase::Pause | Phase::Resume),
            Some(Phase::Pause) => matches!(phase, Phase::Switch | Phase::Resume),
            Some(Phase::Switch) => matches!(phase, Phase::Rollback | Phase::Resume),
            Some(Phase::Rollback) => phase == Phase::Resume,
            Some(Phase::Resume | Phase::Verify | Phase::Stop | Phase::Abort) => false,
        };
        assert!(allowed, "{prev:?} -> {phase}");
        match &d.kind {
            DirectiveKind::AbortInFlight { .. } | DirectiveKind::SwitchInFlight { .. } => {
                unreachable!("no operation here moves the job inside a step")
            }
            DirectiveKind::Sample { targets } => assert_eq!(targets, &self.plan_targets),
            DirectiveKind::PauseAt { step } => {
                // Every rank sampled, nothing went wrong, and T is the largest step.
                let w = self.window(Phase::Sample).unwrap();
                let mut t = 0;
                for r in self.layout.ranks() {
                    match w.first.get(&r) {
                        Some(ReplyBody::Sampled {
                            in_step,
                            in_flight: false,
                        }) => t = t.max(*in_step),
                        other => {
                            panic!("pause sent but rank {r} answered the sample with {other:?}")
                        }
                    }
                }
                assert_eq!(*step, t, "T = max(step)");
                assert!(self.lost.is_empty() && !self.link_down_seen);
            }
            DirectiveKind::Switch { targets, .. } => {
                assert_eq!(targets, &self.targets);
                // Never switch unless every rank holds at T.
                let t = match self.window(Phase::Pause).unwrap().directive.kind {
                    DirectiveKind::PauseAt { step } => step,
                    _ => unreachable!(),
                };
                let w = self.window(Phase::Pause).unwrap();
                for r in self.layout.ranks() {
                    assert_eq!(
                        w.first.get(&r),
                        Some(&ReplyBody::Paused { step: t }),
                        "switch sent but rank {r} did not hold at {t}"
                    );
                }
                assert!(self.lost.is_empty() && !self.link_down_seen);
            }
            DirectiveKind::Rollback {
                targets, restate, ..
            } => {
                assert_eq!((targets, restate), (&self.previous.0, &self.previous.1))
            }
            DirectiveKind::Verify | DirectiveKind::StopTraining { .. } => {
                panic!("an operation never verifies or stops training")
            }
            DirectiveKind::Resume => {
                // Never resume while a switch is unconfirmed.
                if self.window(Phase::Switch).is_some() {
                    let last = self.windows.last().unwrap();
                    let ok = match last.phase() {
                        Phase::Switch => self.confirmed(last),
                        Phase::Rollback => self.confirmed(last),
                        _ => false,
                    };
                    assert!(
                        ok,
                        "resume after an unconfirmed {}: {:#?}",
                        last.phase(),
                        last.first
                    );
                }
            }
        }
        self.windows.push(Window {
            directive: d.clone(),
            first: BTreeMap::new(),
        });
        self.answer(&d);
    }

    /// Every live rank replied `Applied`, and in every group anyone reported, all members
    /// reported it with one digest.
    fn confirmed(&self, w: &Window) -> bool {
        let mut by_group: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for r in self.live() {
            match w.first.get(&r) {
                Some(ReplyBody::Applied { calls }) => {
                    for c in calls {
                        by_group.entry(&c.group).or_default().push(c.digest);
                    }
                }
                _ => return false,
            }
        }
        by_group.iter().all(|(g, digests)| {
            digests.len() == self.layout.group_size(g) && digests.iter().all(|d| *d == digests[0])
        })
    }

    // ---- the world's side ------------------------------------------------------------------

    fn correct(&self, d: &Directive, r: GlobalRank) -> ReplyBody {
        match &d.kind {
            DirectiveKind::AbortInFlight { .. } | DirectiveKind::SwitchInFlight { .. } => {
                unreachable!("no operation here moves the job inside a step")
            }
            DirectiveKind::Sample { .. } => ReplyBody::Sampled {
                in_step: self.steps[&r],
                in_flight: false,
            },
            DirectiveKind::PauseAt { step } => ReplyBody::Paused { step: *step },
            DirectiveKind::Switch { targets, .. } => ReplyBody::Applied {
                calls: self.layout.calls(r, targets),
            },
            DirectiveKind::Rollback {
                targets, restate, ..
            } => ReplyBody::Applied {
                calls: self.layout.rollback_calls(r, targets, restate),
            },
            DirectiveKind::Resume => ReplyBody::Resumed {
                stalled: Duration::from_millis(10 * u64::from(r.0)),
            },
            DirectiveKind::Verify | DirectiveKind::StopTraining { .. } => {
                unreachable!("an operation never verifies or stops training")
            }
        }
    }

    fn garbled(&mut self, d: &Directive, r: GlobalRank) -> ReplyBody {
        match self.correct(d, r) {
            ReplyBody::Sampled { in_step, in_flight } => ReplyBody::Sampled {
                in_step: in_step + 3,
                in_flight,
            },
            ReplyBody::Paused { step } => ReplyBody::Paused { step: step + 1 },
            ReplyBody::Applied { mut calls } => {
                if !calls.is_empty() {
                    let k = self.dice.pick(calls.len());
                    match self.dice.roll(0) % 3 {
                        0 => calls[k].digest ^= 1 << (self.dice.roll(0) % 64),
                        1 => {
                            calls.remove(k);
                        }
                        _ => calls.reverse(),
                    }
                }
                ReplyBody::Applied { calls }
            }
            other => other,
        }
    }

    fn mismatched(&self, d: &Directive, r: GlobalRank) -> ReplyBody {
        match d.phase() {
            Phase::Sample => ReplyBody::Paused {
                step: self.steps[&r],
            },
            Phase::Pause => ReplyBody::Sampled {
                in_step: self.steps[&r],
                in_flight: false,
            },
            Phase::Switch | Phase::Rollback => ReplyBody::Resumed { stalled: secs(1) },
            Phase::Resume => ReplyBody::Applied { calls: vec![] },
            Phase::Verify | Phase::Stop | Phase::Abort => {
                unreachable!("an operation never verifies or stops, and none here aborts")
            }
        }
    }

    fn send(&mut self, r: GlobalRank, op: OperationId, phase: Phase, body: ReplyBody) {
        if op == self.id {
            if let ReplyBody::Failed(_) = body {
                self.failures_sent.insert((r, phase));
            }
        }
        let reply = RankReply {
            rank: r,
            op,
            phase,
            body,
        };
        self.queue.push(Event::Replies(NodeReply {
            node: self.layout.node_of(r),
            op,
            phase,
            replies: vec![reply],
            health: vec![],
        }));
    }

    fn answer(&mut self, d: &Directive) {
        let phase = d.phase();
        if phase == Phase::Sample {
            self.send_health();
        }
        for r in self.layout.ranks() {
            if self.dead.contains(&r) {
                continue;
            }
            let c = choice(self.dice.roll(0), self.chaos_in(phase), self.dice.roll(0));
            match c {
                Choice::Correct => {
                    let b = self.correct(d, r);
                    self.send(r, self.id, phase, b);
                }
                Choice::Failed => {
                    let times = 1 + usize::from(self.dice.roll(0) % 4 == 0);
                    for _ in 0..times {
                        self.send(r, self.id, phase, ReplyBody::Failed(rank_error(r, phase)));
                    }
                }
                Choice::Silent => {}
                Choice::Duplicate => {
                    let b = self.correct(d, r);
                    self.send(r, self.id, phase, b.clone());
                    self.send(r, self.id, phase, b);
                }
                Choice::Stale => {
                    let b = self.correct(d, r);
                    self.send(r, self.id, phase, b.clone());
                    // A late copy of an earlier answer of this rank, or a foreign reply.
                    let earlier: Vec<(Phase, ReplyBody)> = self.windows[..self.windows.len() - 1]
                        .iter()
                        .filter_map(|w| w.first.get(&r).map(|b| (w.phase(), b.clone())))
                        .collect();
                    if !earlier.is_empty() && self.dice.roll(0) % 2 == 0 {
                        let (p, b) = earlier[self.dice.pick(earlier.len())].clone();
                        self.send(r, self.id, p, b);
                    } else {
                        let body = if self.dice.roll(0) % 2 == 0 {
                            ReplyBody::Failed(rank_error(r, phase))
                        } else {
                            b
                        };
                        self.send(r, foreign(), phase, body);
                    }
                }
                Choice::Garbled => {
                    let b = self.garbled(d, r);
                    self.send(r, self.id, phase, b);
                }
                Choice::Mismatched => {
                    let b = self.mismatched(d, r);
                    self.send(r, self.id, phase, b);
                }
                Choice::Lost => {
                    if self.dice.roll(0) % 2 == 0 {
                        let b = self.correct(d, r);
                        self.send(r, self.id, phase, b);
                    }
                    self.dead.insert(r);
                    self.queue.push(Event::WorkerLost {
                        rank: r,
                        reason: format!("rank {r} died"),
                    });
                }
            }
        }
    }

    /// Each node reports the link health of its targeted devices: mostly up; sometimes the side
    /// the target moves to is down (a reason to reject); sometimes the other side is down (no
    /// reason at all).
    fn send_health(&mut self) {
        let mut by_node: BTreeMap<_, Vec<LinkHealth>> = BTreeMap::new();
        for t in self.plan_targets.clone() {
            let side = NicSide::from_use_backup(t.use_backup);
            let x = self.dice.roll(0);
            let target_up = u16::from(x) + u16::from(self.chaos_in(Phase::Sample) / 3) <= 255;
            let other_up = x % 2 == 0;
            let (primary_up, backup_up) = match side {
                NicSide::Primary => (target_up, other_up),
                NicSide::Backup => (other_up, target_up),
            };
            by_node
                .entry(t.node.clone())
                .or_default()
                .push(LinkHealth::new(t.device, primary_up, backup_up));
        }
        for (node, health) in by_node {
            self.queue.push(Event::Replies(NodeReply {
                node,
                op: self.id,
                phase: Phase::Sample,
                replies: vec![],
                health,
            }));
        }
    }

    /// Delivers one message, keeping the world's record of who said what in which window.
    fn deliver(&mut self, ev: Event) {
        if !self.finished() {
            match &ev {
                Event::Replies(nr) if nr.op == self.id => {
                    let w = self.windows.last_mut().unwrap();
                    for r in &nr.replies {
                        if r.op == self.id && r.phase == w.phase() && !self.lost.contains(&r.rank) {
                            w.first.entry(r.rank).or_insert_with(|| r.body.clone());
                        }
                    }
                    if nr.phase == Phase::Sample && w.phase() == Phase::Sample {
                        for h in &nr.health {
                            let down = self.plan_targets.iter().any(|t| {
                                t.node == nr.node
                                    && t.device == h.device
                                    && !h.is_up(NicSide::from_use_backup(t.use_backup))
                            });
                            self.link_down_seen |= down;
                        }
                    }
                }
                Event::WorkerLost { rank, .. } => {
                    self.lost.insert(*rank);
                }
                _ => {}
            }
        }
        self.handle(ev);
    }

    fn fire_current(&mut self) {
        let (token, at) = *self.tokens.last().expect("a deadline is armed");
        self.now = self.now.max(at);
        self.handle(Event::Deadline { token });
    }

    /// Runs until the machine finishes; `blackout`: after that many steps the world goes
    /// silent and only the current deadline fires.
    fn run(&mut self, blackout: Option<usize>) {
        let mut step = 0;
        while !self.finished() {
            step += 1;
            assert!(step < 5_000, "no finish after {step} steps");
            if blackout.is_some_and(|b| step > b) {
                let mut fired = 0;
                while !self.finished() {
                    fired += 1;
                    assert!(fired <= 2, "a silent world needs at most two deadlines");
                    self.fire_current();
                }
                break;
            }
            self.now += Duration::from_millis(250 * u64::from(self.dice.roll(0) % 4));
            // Deadlines fire early (the world is slow) more often the wilder it is; stale
            // tokens fire at any chaos level.
            let x = self.dice.roll(255);
            let early = self.chaos_in(self.op.phase()) / 16;
            if self.queue.is_empty() || x < early {
                self.fire_current();
            } else if x < early + 12 && self.tokens.len() > 1 {
                let (token, _) = self.tokens[self.dice.pick(self.tokens.len() - 1)];
                let phase = self.op.phase();
                let pending = self.op.pending().clone();
                let a = self.op.handle(Event::Deadline { token }, self.now);
                assert_eq!(a, vec![], "stale token {token}");
                assert_eq!((self.op.phase(), self.op.pending()), (phase, &pending));
            } else {
                let i = self.dice.pick(self.queue.len());
                let ev = self.queue.remove(i);
                self.deliver(ev);
            }
        }
        // Everything that is still on its way, every deadline, a loss and fresh replies: all
        // ignored.
        let mut late: Vec<Event> = std::mem::take(&mut self.queue);
        late.extend(
            self.tokens
                .iter()
                .map(|(token, _)| Event::Deadline { token: *token }),
        );
        late.push(Event::WorkerLost {
            rank: GlobalRank(0),
            reason: "late".into(),
        });
        for w in &self.windows {
            for r in self.layout.ranks() {
                late.push(Event::Replies(NodeReply {
                    node: self.layout.node_of(r),
                    op: self.id,
                    phase: w.phase(),
                    replies: vec![RankReply {
                        rank: r,
                        op: self.id,
                        phase: w.phase(),
                        body: ReplyBody::Failed(rank_error(r, w.phase())),
                    }],
                    health: vec![],
                }));
            }
        }
        for ev in late {
            let a = self.op.handle(ev, self.now);
            assert_eq!(a, vec![], "an event after the Finish was acted on");
        }
        assert!(self.op.is_finished());
    }

    /// Checks the final report against the world's record.
    fn check_report(&self) {
        assert_eq!(self.reports.len(), 1, "exactly one Finish");
        let (r, at) = &self.reports[0];
        assert_eq!(r.id, self.id);
        assert_eq!(r.targets, self.plan_targets);
        assert_eq!(r.phases.total, *at - self.started);

        let phases: Vec<Phase> = self.windows.iter().map(Window::phase).collect();
        let switch_sent = phases.contains(&Phase::Switch);
        let rollback_sent = phases.contains(&Phase::Rollback);
        let resumed_after = |p: Phase| phases.windows(2).any(|w| w == [p, Phase::Resume]);

        // The flags say what happened.
        assert_eq!(r.applied, resumed_after(Phase::Switch), "applied");
        assert_eq!(r.rolled_back, resumed_after(Phase::Rollback), "rolled_back");
        assert_eq!(r.pause_step.is_some(), switch_sent, "pause_step");
        if let Some(t) = r.pause_step {
            assert_eq!(
                self.window(Phase::Pause).unwrap().directive.kind,
                DirectiveKind::PauseAt { step: t }
            );
        }
        assert_eq!(r.lost_ranks, self.lost.iter().copied().collect::<Vec<_>>());
        if !r.lost_ranks.is_empty() {
            assert_eq!(r.job_state, JobState::NeedsRecovery);
        }

        match r.outcome {
            Outcome::Succeeded => {
                assert!(r.applied, "succeeded but not applied");
                assert_eq!(r.job_state, JobState::Running);
                assert_eq!(r.error, None);
                assert_eq!(r.rollback_error, None);
                assert!(!rollback_sent);
                assert_eq!(
                    phases,
                    vec![Phase::Sample, Phase::Pause, Phase::Switch, Phase::Resume]
                );
                // Every rank answered every phase, with the answer that phase asks for.
                for w in &self.windows {
                    for rank in self.layout.ranks() {
                        let ok = matches!(
                            (w.phase(), w.first.get(&rank)),
                            (Phase::Sample, Some(ReplyBody::Sampled { .. }))
                                | (Phase::Pause, Some(ReplyBody::Paused { .. }))
                                | (Phase::Switch, Some(ReplyBody::Applied { .. }))
                                | (Phase::Resume, Some(ReplyBody::Resumed { .. }))
                        );
                        assert!(
                            ok,
                            "succeeded, but rank {rank} answered {} with {:?}",
                            w.phase(),
                            w.first.get(&rank)
                        );
                    }
                }
            }
            Outcome::Failed => {
                assert!(r.error.is_some(), "failed without a reason");
                if switch_sent && !r.rolled_back {
                    assert_ne!(
                        r.job_state,
                        JobState::Running,
                        "failed, switched and not rolled back, yet running"
                    );
                }
            }
            Outcome::Rejected => {
                assert!(!switch_sent, "rejected after a switch");
                assert!(self.link_down_seen);
                assert!(matches!(r.error, Some(OperationError::LinkDown { .. })));
            }
        }

        // A rollback that did not complete leaves the gates shut.
        if rollback_sent && !r.rolled_back {
            assert_ne!(phases.last(), Some(&Phase::Resume));
            assert!(
                r.rollback_error.is_some() || self.lost.len() == self.layout.ranks().len(),
                "rollback incomplete without a reason: {r:#?}"
            );
            assert_ne!(r.job_state, JobState::Running);
        }

        // Running means every gate is known to be open: the last directive was the resume and
        // every rank answered it with `resumed`.
        if r.job_state == JobState::Running {
            assert_eq!(phases.last(), Some(&Phase::Resume));
            let w = self.windows.last().unwrap();
            for rank in self.layout.ranks() {
                assert!(
                    matches!(w.first.get(&rank), Some(ReplyBody::Resumed { .. })),
                    "running, but rank {rank} answered the resume with {:?}",
                    w.first.get(&rank)
                );
            }
        }

        // Rank errors: only failures this operation's ranks really sent, each once.
        let mut seen = BTreeSet::new();
        for (rank, phase, _) in &r.rank_errors {
            assert!(
                self.failures_sent.contains(&(*rank, *phase)),
                "rank error {rank}/{phase} nobody sent"
            );
            assert!(
                seen.insert((*rank, *phase)),
                "rank error {rank}/{phase} twice"
            );
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    nodes: u32,
    per_node: u32,
    /// `(rank mod world, use_backup, previous use_backup)`; repeated ranks are dropped.
    targets: Vec<(u32, bool, bool)>,
    base_step: u64,
    ahead: Vec<bool>,
    blackout: Option<usize>,
    /// How wild the world is: 0 = always behaves, 255 = misbehaves almost always.
    chaos: u8,
    /// The phases the chaos applies to (see [`World::chaos_in`]).
    wild: u8,
    dice: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=3, 1u32..=4).prop_flat_map(|(nodes, per_node)| {
        let world = (nodes * per_node) as usize;
        (
            proptest::collection::vec(
                (0..nodes * per_node, any::<bool>(), any::<bool>()),
                1..=world,
            ),
            0u64..1_000,
            proptest::collection::vec(any::<bool>(), world),
            proptest::option::weighted(0.2, 0usize..60),
            // Mostly calm worlds, so that enough runs get past the pause to the switch.
            prop_oneof![4 => 0u8..24, 3 => 24u8..80, 2 => 80u8..=255],
            // Every phase, any mix, or the switch (and its rollback) alone.
            prop_oneof![2 => Just(0x1fu8), 4 => 0u8..0x20, 2 => Just(0x04u8), 1 => Just(0x0cu8)],
            proptest::collection::vec(any::<u8>(), 0..400),
        )
            .prop_map(
                move |(targets, base_step, ahead, blackout, chaos, wild, dice)| Case {
                    nodes,
                    per_node,
                    targets,
                    base_step,
                    ahead,
                    blackout,
                    chaos,
                    wild,
                    dice,
                },
            )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    /// One Finish, nothing after it, always; no pause, switch or resume the world's record does
    /// not justify; the report agrees with what happened.
    #[test]
    fn the_machine_is_safe_in_any_world(case in case()) {
        let mut w = World::new(&case);
        w.run(case.blackout);
        w.check_report();
    }

    /// A world that always behaves: the operation succeeds and the targets' new state holds.
    #[test]
    fn a_well_behaved_world_always_succeeds(
        nodes in 1u32..=3,
        per_node in 1u32..=4,
        picks in proptest::collection::vec((any::<u32>(), any::<bool>(), any::<bool>()), 1..6),
        base_step in 0u64..1_000,
        ahead in proptest::collection::vec(any::<bool>(), 12),
    ) {
        let case = Case {
            nodes,
            per_node,
            targets: picks,
            base_step,
            ahead: ahead.clone(),
            blackout: None,
            chaos: 0,
            wild: 0,
            dice: vec![],
        };
        let mut w = World::new(&case);
        w.run(None);
        w.check_report();
        let (r, _) = &w.reports[0];
        prop_assert_eq!(r.outcome, Outcome::Succeeded);
        let world = (nodes * per_node) as usize;
        let t = base_step + u64::from(ahead[..world].iter().any(|a| *a));
        prop_assert_eq!(r.pause_step, Some(t));
        prop_assert!(r.applied);
        prop_assert_eq!(r.job_state, JobState::Running);
    }
}

/// How an operation ended, coarsely: the generator must reach every one of these, or the
/// properties above hold vacuously.
fn ending(r: &OperationReport, phases: &[Phase]) -> &'static str {
    match (r.outcome, r.job_state) {
        (Outcome::Succeeded, _) => "succeeded",
        (Outcome::Rejected, JobState::Running) => "rejected",
        (Outcome::Rejected, _) => "rejected, then trouble",
        (Outcome::Failed, JobState::NeedsRecovery) if !r.lost_ranks.is_empty() => "worker lost",
        (Outcome::Failed, JobState::NeedsRecovery) => "a gate not known open",
        (Outcome::Failed, JobState::Paused) => "rollback failed, held",
        (Outcome::Failed, JobState::Running) if r.rolled_back => "rolled back",
        (Outcome::Failed, JobState::Running) if !phases.contains(&Phase::Switch) => {
            "failed before the switch"
        }
        (Outcome::Failed, JobState::Running) => "failed, running, neither applied nor rolled back",
        // Only the ledger declares it, between operations.
        (Outcome::Failed, JobState::Degraded) => "degraded",
    }
}

#[test]
fn the_world_reaches_every_ending() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut stale_tokens = 0;
    for _ in 0..600 {
        let c = case().new_tree(&mut runner).unwrap().current();
        let mut w = World::new(&c);
        w.run(c.blackout);
        w.check_report();
        let phases: Vec<Phase> = w.windows.iter().map(Window::phase).collect();
        *seen.entry(ending(&w.reports[0].0, &phases)).or_default() += 1;
        stale_tokens += usize::from(w.tokens.len() > 1);
    }
    for e in [
        "succeeded",
        "rejected",
        "worker lost",
        "a gate not known open",
        "rollback failed, held",
        "rolled back",
        "failed before the switch",
    ] {
        assert!(
            seen.get(e).copied().unwrap_or(0) >= 5,
            "{e} reached too rarely: {seen:?}"
        );
    }
    assert!(
        !seen.contains_key("failed, running, neither applied nor rolled back"),
        "{seen:?}"
    );
    assert!(stale_tokens > 300);
}

/// The garbled-call checks are only meaningful if a correct world agrees with itself: every
/// member of a group computes the same digest.
#[test]
fn correct_calls_agree_across_each_group() {
    for (nodes, per_node) in [(1, 1), (1, 4), (2, 3), (3, 4)] {
        let layout = Layout::new(nodes, per_node);
        let targets = flags(&[(0, true), (layout.world() - 1, false)]);
        let mut by_group: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
        for r in layout.ranks() {
            let calls: Vec<AppliedCall> = layout.calls(r, &targets);
            assert!(calls.iter().any(|c| c.group == "world"));
            for c in calls {
                by_group
                    .entry(c.group.clone())
                    .or_default()
                    .insert(c.digest);
                *sizes.entry(c.group.clone()).or_default() += 1;
                assert_eq!(c.group_size as usize, layout.group_size(&c.group));
            }
        }
        for (g, digests) in &by_group {
            assert_eq!(digests.len(), 1, "{g}");
            assert_eq!(sizes[g], layout.group_size(g), "{g}");
        }
    }
}
