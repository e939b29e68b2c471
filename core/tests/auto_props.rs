//! Property tests of the automatic failover policy against a simulated job.
//!
//! A job of 2 nodes x 4 devices whose links change at random (up, down, unknown, degraded with
//! reasons that change while the state does not), whose
//! operator and verification rounds come and go, and whose automatic operations take a random
//! time and succeed or fail at random. The world drives the policy as the manager does (on
//! every report, at every wake-up time it asks for, whenever an operation ends) and keeps its
//! own record of every link change, to check every decision against the rules.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use taskd_core::auto::{
    AutoAction, AutoConfig, AutoDecision, AutoPolicy, AutoReason, DeviceKey, JobGate, Links,
};
use taskd_core::{DeviceId, NicSide, NodeName, SideState};

const MS: Duration = Duration::from_millis(1);

fn cfg() -> AutoConfig {
    AutoConfig {
        link_probe: 10 * MS,
        down_after: 3,
        coalesce: 15 * MS,
        switchback_after: 300 * MS,
        max_flaps: 3,
        flap_window: 200 * MS,
        min_interval: 80 * MS,
    }
}

fn key(i: u8) -> DeviceKey {
    DeviceKey {
        node: NodeName::uniform(u32::from((i / 4) % 2)),
        device: DeviceId(u32::from(i % 4)),
    }
}

/// A side's state from two dice: which state, and (for the reasons) how bad.
fn state(x: u8, how: u8) -> SideState {
    match x % 4 {
        0 => SideState::Up,
        1 => SideState::Down(String::new()),
        2 => SideState::Unknown("probe did not answer".into()),
        _ => SideState::Degraded(format!("loss {}% > 25%", 26 + how % 8)),
    }
}

fn up() -> Links {
    Links {
        primary: SideState::Up,
        backup: SideState::Up,
    }
}

/// Something that happens to the job.
#[derive(Clone, Debug)]
enum Happening {
    /// A device's links as a probe now sees them.
    Links { device: u8, primary: u8, backup: u8 },
    /// An operator's operation (or a verification round) starts or ends.
    OperatorOp,
    /// An operator's operation moved a device (it ended a moment ago).
    OperatorMove { device: u8, backup: bool },
    /// The job stops running (or runs again).
    JobState,
    /// Nothing but time.
    Idle,
}

fn happening() -> impl Strategy<Value = Happening> {
    prop_oneof![
        6 => (0u8..8, 0u8..8, 0u8..8).prop_map(|(device, primary, backup)| Happening::Links {
            device,
            primary,
            backup
        }),
        1 => Just(Happening::OperatorOp),
        1 => (0u8..8, any::<bool>())
            .prop_map(|(device, backup)| Happening::OperatorMove { device, backup }),
        1 => Just(Happening::JobState),
        2 => Just(Happening::Idle),
    ]
}

/// An automatic operation in flight in the world.
struct AutoOp {
    ends_at: Duration,
    succeeds: bool,
    moves: Vec<(DeviceKey, NicSide)>,
}

/// The world: the job's NIC sides, its gate, the links as reported and their history.
struct World {
    policy: AutoPolicy,
    now: Duration,
    sides: BTreeMap<DeviceKey, NicSide>,
    links: BTreeMap<DeviceKey, Links>,
    /// When each device's health changed, per side.
    changes: BTreeMap<DeviceKey, Vec<Duration>>,
    since: HashMap<(DeviceKey, NicSide), Duration>,
    operator_op: bool,
    not_running: bool,
    auto: Option<AutoOp>,
    starts: Vec<Duration>,
    /// Devices whose automatic operation failed, and their change count at that time.
    failed: BTreeMap<DeviceKey, usize>,
    /// Devices on backup because an automatic operation put them there.
    moved_by_policy: BTreeSet<DeviceKey>,
    last_hold: BTreeMap<DeviceKey, AutoReason>,
    wake_at: Option<Duration>,
    decisions: Vec<AutoDecision>,
    dice: Vec<u8>,
    roll: usize,
}

impl World {
    fn new(dice: Vec<u8>) -> World {
        let mut policy = AutoPolicy::new(cfg());
        let mut links = BTreeMap::new();
        let mut since = HashMap::new();
        for i in 0..8 {
            policy.link_changed(key(i), up(), Duration::ZERO);
            links.insert(key(i), up());
            since.insert((key(i), NicSide::Primary), Duration::ZERO);
            since.insert((key(i), NicSide::Backup), Duration::ZERO);
        }
        World {
            policy,
            now: Duration::ZERO,
            sides: (0..8).map(|i| (key(i), NicSide::Primary)).collect(),
            links,
            changes: BTreeMap::new(),
            since,
            operator_op: false,
            not_running: false,
            auto: None,
            starts: Vec::new(),
            failed: BTreeMap::new(),
            moved_by_policy: BTreeSet::new(),
            last_hold: BTreeMap::new(),
            wake_at: None,
            decisions: Vec::new(),
            dice,
            roll: 0,
        }
    }

    fn roll(&mut self) -> u8 {
        let x = self.dice.get(self.roll).copied().unwrap_or(0);
        self.roll += 1;
        x
    }

    fn gate(&self) -> JobGate {
        if self.not_running {
            JobGate::NotRunning
        } else if self.operator_op || self.auto.is_some() {
            JobGate::OperationRunning
        } else {
            JobGate::Ready
        }
    }

    fn report(&mut self, k: DeviceKey, new: Links) {
        let old = self.links[&k].clone();
        let mut changed = false;
        for side in [NicSide::Primary, NicSide::Backup] {
            if old.side(side).is_healthy() != new.side(side).is_healthy() {
                self.changes.entry(k.clone()).or_default().push(self.now);
                self.since.insert((k.clone(), side), self.now);
                changed = true;
            }
        }
        if changed {
            // The links changed: a hold may be said again.
            self.last_hold.remove(&k);
        }
        self.links.insert(k.clone(), new.clone());
        assert_eq!(self.policy.link_changed(k, new, self.now), changed);
    }

    fn changes_in_window(&self, k: &DeviceKey) -> usize {
        let w = cfg().flap_window;
        self.changes.get(k).map_or(0, |c| {
            c.iter()
                .filter(|t| self.now.saturating_sub(**t) < w)
                .count()
        })
    }

    fn evaluate(&mut self) {
        let gate = self.gate();
        let sides = self.sides.clone();
        let side_of = move |k: &DeviceKey| sides.get(k).copied();
        let e = self.policy.evaluate(gate, &side_of, self.now);
        self.wake_at = e.wake_at;
        if let Some(w) = e.wake_at {
            assert!(
                w > self.now,
                "a wake-up in the past: {w:?} at {:?}",
                self.now
            );
        }
        for d in &e.decisions {
            self.check_decision(d, gate);
        }
        let moves: Vec<(DeviceKey, NicSide)> = e
            .moves()
            .map(|d| (d.key(), d.action.side().expect("a move")))
            .collect();
        if !moves.is_empty() {
            self.check_operation(&moves);
            let took = Duration::from_millis(u64::from(self.roll() % 60) + 1);
            let succeeds = self.roll() % 4 != 3;
            self.starts.push(self.now);
            self.auto = Some(AutoOp {
                ends_at: self.now + took,
                succeeds,
                moves,
            });
        }
        self.decisions.extend(e.decisions);
    }

    /// The rules one decision must keep.
    fn check_decision(&mut self, d: &AutoDecision, gate: JobGate) {
        let k = d.key();
        assert_eq!(d.at, self.now);
        assert_eq!(d.links, self.links[&k], "{d}");
        match d.action {
            AutoAction::Hold => {
                let last = self.last_hold.insert(k.clone(), d.reason);
                assert_ne!(last, Some(d.reason), "a hold repeated: {d}");
            }
            action => {
                assert_eq!(gate, JobGate::Ready, "moved while {gate:?}: {d}");
                self.last_hold.remove(&k);
                let to = action.side().unwrap();
                let from = self.sides[&k];
                assert_ne!(to, from, "a move to the side it is on: {d}");
                assert!(
                    self.links[&k].side(to).is_healthy(),
                    "a move onto a link not up and healthy: {d}"
                );
                assert!(
                    self.changes_in_window(&k) <= cfg().max_flaps as usize,
                    "a flapping device moved: {d}"
                );
                if let Some(at_failure) = self.failed.get(&k) {
                    let now = self.changes.get(&k).map_or(0, Vec::len);
                    assert!(now > *at_failure, "retried with no link change: {d}");
                }
                let since = self.since[&(k.clone(), from)];
                match d.reason {
                    AutoReason::PrimaryDown | AutoReason::BackupDown => {
                        let was = self.links[&k].side(from);
                        assert!(!was.is_up(), "{d}");
                        assert!(
                            self.now >= since + cfg().confirm_delay(),
                            "not confirmed: {d}"
                        );
                    }
                    AutoReason::PrimaryDegraded | AutoReason::BackupDegraded => {
                        let was = self.links[&k].side(from);
                        assert!(matches!(was, SideState::Degraded(_)), "{d}");
                        assert!(
                            self.now >= since + cfg().confirm_delay(),
                            "not confirmed: {d}"
                        );
                    }
                    AutoReason::PrimaryRecovered => {
                        assert!(
                            self.moved_by_policy.contains(&k),
                            "an operator's choice undone: {d}"
                        );
                        let up = self.since[&(k.clone(), NicSide::Primary)];
                        assert!(self.links[&k].primary.is_healthy());
                        assert!(self.now >= up + cfg().switchback_after, "too early: {d}");
                    }
                    other => panic!("a move for {other:?}: {d}"),
                }
            }
        }
    }

    /// The rules one automatic operation must keep.
    fn check_operation(&self, moves: &[(DeviceKey, NicSide)]) {
        if let Some(prev) = self.starts.last() {
            assert!(
                self.now >= *prev + cfg().min_interval,
                "two automatic operations {:?} apart",
                self.now - *prev
            );
        }
        let by: BTreeMap<&DeviceKey, NicSide> = moves.iter().map(|(k, s)| (k, *s)).collect();
        for (k, s) in moves {
            if let Some(p) = by.get(&k.partner()) {
                assert_eq!(p, s, "partners told opposite sides: {moves:?}");
            }
        }
    }

    /// Ends the automatic operation if it is due by `t`.
    fn end_auto_by(&mut self, t: Duration) -> bool {
        let Some(op) = self.auto.as_ref().filter(|op| op.ends_at <= t) else {
            return false;
        };
        self.now = op.ends_at;
        let op = self.auto.take().unwrap();
        let keys: Vec<DeviceKey> = op.moves.iter().map(|(k, _)| k.clone()).collect();
        if op.succeeds {
            for (k, s) in &op.moves {
                self.sides.insert(k.clone(), *s);
                self.failed.remove(k);
                if *s == NicSide::Backup {
                    self.moved_by_policy.insert(k.clone());
                } else {
                    self.moved_by_policy.remove(k);
                }
            }
        } else {
            for k in &keys {
                let n = self.changes.get(k).map_or(0, Vec::len);
                self.failed.insert(k.clone(), n);
                self.last_hold.remove(k);
            }
        }
        self.policy.finished(op.succeeds);
        true
    }

    /// Lets time pass until `t`, waking the policy whenever it asked and ending operations,
    /// whichever comes first.
    fn advance_to(&mut self, t: Duration) {
        loop {
            let ends = self.auto.as_ref().map(|op| op.ends_at).filter(|e| *e <= t);
            let wake = self.wake_at.filter(|w| *w <= t);
            match (ends, wake) {
                (None, None) => break,
                (Some(e), Some(w)) if w < e => self.now = w,
                (Some(e), _) => {
                    self.end_auto_by(e);
                }
                (None, Some(w)) => self.now = w,
            }
            self.evaluate();
        }
        self.now = t;
    }

    fn happen(&mut self, h: &Happening) {
        match h {
            Happening::Links {
                device,
                primary,
                backup,
            } => {
                let links = Links {
                    primary: state(*primary / 2, *backup),
                    backup: state(*backup / 2, *primary),
                };
                // Most probes see both links up.
                let links = if primary % 2 == 0 && backup % 2 == 0 {
                    up()
                } else {
                    links
                };
                self.report(key(*device), links);
            }
            Happening::OperatorOp => self.operator_op = !self.operator_op,
            Happening::OperatorMove { device, backup } => {
                if self.auto.is_none() && !self.operator_op {
                    let k = key(*device);
                    self.sides
                        .insert(k.clone(), NicSide::from_use_backup(*backup));
                    self.moved_by_policy.remove(&k);
                    // Another side: a hold may be said again.
                    self.last_hold.remove(&k);
                    self.policy.operator_moved([&k]);
                }
            }
            Happening::JobState => self.not_running = !self.not_running,
            Happening::Idle => {}
        }
        self.evaluate();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever the links, the job and the operations do, every decision keeps the rules: no
    /// move while an operation runs or the job does not run, no two automatic operations closer
    /// than the minimum interval, no move onto a link not up, of a flapping device, of a device
    /// whose automatic operation failed and whose links did not change since, before a failure
    /// is confirmed or a recovery held long enough; no partner told the opposite side in the
    /// same operation; a hold said once.
    #[test]
    fn every_decision_keeps_the_rules(
        script in prop::collection::vec((0u64..40, happening()), 1..120),
        dice in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut w = World::new(dice);
        for (dt, h) in &script {
            let t = w.now + Duration::from_millis(*dt);
            w.advance_to(t);
            w.happen(h);
        }
        // Quiet at the end: everything due happens, and the policy settles.
        w.operator_op = false;
        w.not_running = false;
        w.evaluate();
        let end = w.now + Duration::from_secs(10);
        w.advance_to(end);
        prop_assert!(w.auto.is_none());
        prop_assert!(w.wake_at.map_or(true, |t| t > end), "still waking at {:?}", w.wake_at);
    }

    /// Two devices whose links fail within the coalescing window of each other move in one
    /// operation; one failing later than that waits for its own.
    #[test]
    fn devices_failing_together_move_together(
        first in 0u8..8,
        second in 0u8..8,
        gap in 0u64..40,
    ) {
        prop_assume!(first != second && key(first).partner() != key(second));
        let mut w = World::new(Vec::new());
        w.advance_to(Duration::from_millis(50));
        let down = Links { primary: SideState::Down(String::new()), backup: SideState::Up };
        w.report(key(first), down.clone());
        w.evaluate();
        w.advance_to(Duration::from_millis(50 + gap));
        w.report(key(second), down);
        w.evaluate();
        w.advance_to(Duration::from_secs(2));
        let ops: Vec<&Duration> = w.starts.iter().collect();
        let together = gap <= cfg().coalesce.as_millis() as u64;
        prop_assert_eq!(ops.len(), if together { 1 } else { 2 }, "gap {} ms: {:?}", gap, w.decisions);
        let first_op: Vec<String> = w
            .decisions
            .iter()
            .filter(|d| d.is_move() && d.at == *ops[0])
            .map(|d| d.key().to_string())
            .collect();
        prop_assert_eq!(first_op.len(), if together { 2 } else { 1 });
    }

    /// A link that flaps faster than the damping allows moves its device at most once while
    /// it flaps: the first failure, confirmed before it counted as flapping.
    #[test]
    fn a_flapping_link_causes_no_operation_storm(
        period in 5u64..40,
        toggles in 4usize..60,
        device in 0u8..8,
    ) {
        let mut w = World::new(Vec::new());
        let mut t = Duration::from_millis(10);
        for i in 0..toggles {
            w.advance_to(t);
            let primary = if i % 2 == 0 { SideState::Down(String::new()) } else { SideState::Up };
            w.report(key(device), Links { primary, backup: SideState::Up });
            w.evaluate();
            t += Duration::from_millis(period);
        }
        let flapping_until = t;
        let moves_while_flapping = w
            .decisions
            .iter()
            .filter(|d| d.is_move() && d.at < flapping_until)
            .count();
        prop_assert!(moves_while_flapping <= 1, "{:?}", w.decisions);
        if toggles > cfg().max_flaps as usize {
            prop_assert!(
                w.decisions.iter().any(|d| d.reason == AutoReason::Flapping),
                "the hold is said: {:?}", w.decisions
            );
        }
    }
}
