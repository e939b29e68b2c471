//! `taskd chaos --fault link_dies_mid_step`: seeded schedules of a link that dies (or starves)
//! while a group's collectives are in flight, answered by an in-flight move.
//!
//! Each schedule is a group of 2 to 8 ranks on the simulated fabric of
//! [`taskd_hal_mock::inflight`] (collectives that complete on each member at its own moment and
//! out of order, kept inputs, a link whose death stops everything launched on it), training
//! steps of one to three collectives each; the link dies at a drawn moment (mid-collective,
//! between two, before the first or after the last) and the manager's in-flight operation
//! (`taskd_core`'s [`Operation`], marked in flight) is driven through the ranks' in-flight
//! sides as the workers drive them: sample, abort, the agreed redo points, the switch, resume.
//! Every event (a rank issues, a collective completes on one rank, a directive reaches one
//! rank) is drawn from the seed, so a seed replays its schedule exactly. Some schedules have a
//! rank that cannot abort: the move fails and every rank takes the recovery path.
//!
//! The invariant: no collective's result taken twice or wrong on any rank, none lost on a rank
//! that trains on (no step lost or applied twice); a move that succeeded leaves every rank on
//! the same generation of the group (the groups agree) and every rank training; no schedule
//! stops with work left and nothing able to move (a deadlock).

use super::rng::SplitMix64;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;
use taskd_core::inflight::InFlightFramework;
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, NodeReply, RankError, RankReply, ReplyBody,
};
use taskd_core::{
    Action, DeviceId, Event, GlobalRank, NicSide, NodeName, Operation, OperationId, Outcome,
    PhaseDeadlines, RankTarget, SwitchPlan,
};
use taskd_hal_mock::inflight::{InFlightFabric, LinkFault, SimInFlight};

/// Ticks a schedule may take before it counts as stuck.
const LIMIT: u64 = 100_000;

/// One schedule's result.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct InFlightRun {
    /// The seed.
    pub seed: u64,
    /// Ranks of the group.
    pub world: u32,
    /// Collectives each rank issues.
    pub collectives: u64,
    /// Whether the link died (`dead`), starved (`starved`) or stayed up before the end.
    pub fault: &'static str,
    /// The move's outcome, when one ran.
    pub outcome: Option<String>,
    /// Results a redo brought to a rank that had them (dropped, as they must be).
    pub dropped: u64,
    /// What broke, if something did.
    pub violation: Option<String>,
    /// What happened, in order (`--explain`).
    pub trace: Vec<String>,
}

/// Runs the schedule of `seed`.
pub fn run_one(seed: u64, explain: bool) -> InFlightRun {
    let mut rng = SplitMix64::new(seed ^ 0x1f11_6d1e_5a1d_0001);
    let world = 2 + rng.below(7) as u32;
    let per_step = 1 + rng.below(3);
    let steps = 2 + rng.below(5);
    let total = steps * per_step;
    let window = 1 + rng.below(per_step);
    let fault_at = 1 + rng.below(total * u64::from(world) * 3);
    let starved = rng.below(4) == 0;
    let react = rng.below(4 * u64::from(world) + 1);
    let refuser = (rng.below(10) == 0).then(|| GlobalRank(rng.below(u64::from(world)) as u32));
    let mut run = InFlightRun {
        seed,
        world,
        collectives: total,
        fault: "none",
        ..InFlightRun::default()
    };
    let fabric = InFlightFabric::new(world);
    let mut s = Sched {
        sides: (0..world).map(|r| fabric.rank(GlobalRank(r))).collect(),
        fabric,
        world,
        per_step,
        total,
        window,
        op: None,
        queue: VecDeque::new(),
        aborted: BTreeSet::new(),
        refuser,
        trace: Vec::new(),
        explain,
        outcome: None,
    };
    let mut failed = false;
    for tick in 1..=LIMIT {
        if tick == fault_at {
            let f = if starved {
                LinkFault::Starved
            } else {
                LinkFault::Dead
            };
            s.fabric.set_link(f);
            run.fault = if starved { "starved" } else { "dead" };
            s.note(format!("tick {tick}: the link {}", run.fault));
        }
        if tick >= fault_at && tick == fault_at + react && s.op.is_none() {
            s.start(tick);
        }
        if s.outcome.is_some() && !failed && s.outcome != Some(Outcome::Succeeded) {
            // The move failed: the ranks that gave up end, their peers' collectives fail with
            // them, and the job takes the recovery path (its processes start again).
            failed = true;
            for r in 0..world {
                s.fabric.stop_training(GlobalRank(r));
            }
        }
        if !s.act(&mut rng, tick) {
            if s.finished() {
                break;
            }
            if tick < fault_at || (s.op.is_none() && run.fault != "none") {
                continue; // the fault or the move is still to come
            }
            run.violation = Some(format!(
                "tick {tick}: nothing can move and work is left (deadlock): {}",
                s.state()
            ));
            break;
        }
        if tick == LIMIT {
            run.violation = Some(format!("no end within {LIMIT} ticks: {}", s.state()));
        }
    }
    run.outcome = s.outcome.map(|o| o.as_str().to_owned());
    run.dropped = s.fabric.dropped();
    if run.violation.is_none() {
        run.violation = s.check().err();
    }
    run.trace = std::mem::take(&mut s.trace);
    run
}

struct Sched {
    fabric: InFlightFabric,
    sides: Vec<SimInFlight>,
    world: u32,
    per_step: u64,
    total: u64,
    window: u64,
    op: Option<Operation>,
    queue: VecDeque<(GlobalRank, Directive)>,
    aborted: BTreeSet<GlobalRank>,
    refuser: Option<GlobalRank>,
    trace: Vec<String>,
    explain: bool,
    outcome: Option<Outcome>,
}

impl Sched {
    fn note(&mut self, s: String) {
        if self.explain {
            self.trace.push(s);
        }
    }

    /// The manager's move: every rank's device to its backup, in flight.
    fn start(&mut self, tick: u64) {
        let plan = SwitchPlan {
            targets: (0..self.world)
                .map(|r| RankTarget {
                    node: NodeName("node-0".into()),
                    device: DeviceId(r),
                    rank: GlobalRank(r),
                    use_backup: true,
                })
                .collect(),
        };
        let previous = (0..self.world)
            .map(|r| (GlobalRank(r), NicSide::Primary))
            .collect();
        let (mut op, actions) = Operation::start(
            OperationId(uuid::Uuid::from_u128(u128::from(tick) + 1)),
            plan,
            previous,
            (0..self.world).map(GlobalRank),
            PhaseDeadlines::default(),
            Duration::from_millis(tick),
        );
        op.set_in_flight();
        self.note(format!(
            "tick {tick}: the manager moves every rank in flight"
        ));
        self.op = Some(op);
        self.carry_out(actions);
    }

    fn carry_out(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Broadcast(d) => {
                    for r in 0..self.world {
                        self.queue.push_back((GlobalRank(r), d.clone()));
                    }
                }
                Action::Finish(report) => {
                    self.note(format!("the move ends: {}", report.outcome.as_str()));
                    self.outcome = Some(report.outcome);
                }
                _ => {}
            }
        }
    }

    fn can_issue(&self, r: GlobalRank) -> bool {
        if self.fabric.failed(r) {
            return false;
        }
        let (issued, _) = self.fabric.progress(r);
        if issued >= self.total {
            return false;
        }
        let step_start = issued / self.per_step * self.per_step;
        // The previous steps' collectives all came back (DDP waits for its buckets, the
        // script's own collectives are synchronous) ...
        if !(0..step_start).all(|q| self.fabric.settled(r, q)) {
            return false;
        }
        // ... and at most `window` of this step's are out at once.
        let out = (step_start..issued)
            .filter(|q| !self.fabric.settled(r, *q))
            .count() as u64;
        out < self.window
    }

    /// One drawn event; `false` when none can happen.
    fn act(&mut self, rng: &mut SplitMix64, tick: u64) -> bool {
        let issuers: Vec<GlobalRank> = (0..self.world)
            .map(GlobalRank)
            .filter(|r| self.can_issue(*r))
            .collect();
        let mut completable = self.fabric.completable();
        if self.fabric.starved() && rng.below(8) != 0 {
            // A starved link: its collectives complete only now and then.
            completable.retain(|_| false);
        }
        let kinds = [
            !issuers.is_empty(),
            !completable.is_empty(),
            !self.queue.is_empty(),
        ];
        let open: Vec<usize> = (0..3).filter(|k| kinds[*k]).collect();
        if open.is_empty() {
            // A starved link may still complete later.
            return self.fabric.starved() && !self.fabric.completable().is_empty();
        }
        match open[rng.below(open.len() as u64) as usize] {
            0 => {
                let r = issuers[rng.below(issuers.len() as u64) as usize];
                let q = self.fabric.issue(r);
                self.note(format!("tick {tick}: rank {} issues {q}", r.0));
            }
            1 => {
                let (r, q) = completable[rng.below(completable.len() as u64) as usize];
                self.fabric.complete(r, q);
                self.note(format!("tick {tick}: {q} completes on rank {}", r.0));
            }
            _ => {
                // A directive reaches one rank (each rank's in order, ranks in any order).
                let ranks: BTreeSet<GlobalRank> = self.queue.iter().map(|(r, _)| *r).collect();
                let ranks: Vec<GlobalRank> = ranks.into_iter().collect();
                let r = ranks[rng.below(ranks.len() as u64) as usize];
                let i = self
                    .queue
                    .iter()
                    .position(|(x, _)| *x == r)
                    .expect("queued");
                let (_, d) = self.queue.remove(i).expect("queued");
                self.deliver(r, d, tick);
            }
        }
        true
    }

    /// What a worker does with a directive of an in-flight move, and its reply fed back.
    fn deliver(&mut self, r: GlobalRank, d: Directive, tick: u64) {
        let side = self.sides[r.0 as usize].clone();
        let (issued, completed) = self.fabric.progress(r);
        let in_step = completed / self.per_step + 1;
        let body = match &d.kind {
            DirectiveKind::Sample { .. } => ReplyBody::Sampled {
                in_step,
                in_flight: true,
            },
            DirectiveKind::AbortInFlight { targets } => {
                self.aborted.insert(r);
                if self.refuser == Some(r) {
                    ReplyBody::Failed(RankError::worker("this process has no in-flight side"))
                } else {
                    match side.abort(targets) {
                        Ok(collectives) => ReplyBody::Aborted {
                            in_step,
                            collectives,
                        },
                        Err(e) => ReplyBody::Failed(RankError::worker(e)),
                    }
                }
            }
            DirectiveKind::SwitchInFlight {
                targets,
                call_timeout,
                redo,
            } => {
                side.arm_switch(redo.clone());
                let redo = side.take_switch().unwrap_or_default();
                let ranks: Vec<u32> = targets.iter().map(|(g, _)| g.0).collect();
                let flags: Vec<bool> = targets.iter().map(|(_, s)| s.use_backup()).collect();
                match side.switch(&ranks, &flags, &redo, *call_timeout) {
                    Ok(()) => {
                        self.aborted.remove(&r);
                        ReplyBody::Applied {
                            calls: vec![AppliedCall {
                                group: "framework".into(),
                                group_size: self.world,
                                digest: 0x5eed,
                            }],
                        }
                    }
                    Err(e) => ReplyBody::Failed(RankError::worker(e)),
                }
            }
            DirectiveKind::Resume => {
                if self.aborted.remove(&r) {
                    side.give_up("the in-flight move did not finish");
                }
                ReplyBody::Resumed {
                    stalled: Duration::ZERO,
                }
            }
            other => ReplyBody::Failed(RankError::worker(format!("unexpected {other:?}"))),
        };
        self.note(format!(
            "tick {tick}: rank {} ({issued} issued, {completed} done) answers {}",
            r.0,
            d.phase()
        ));
        let Some(op) = self.op.as_mut() else { return };
        let phase = d.phase();
        let reply = RankReply {
            rank: r,
            op: d.op,
            phase,
            body,
        };
        let nr = NodeReply {
            node: NodeName("node-0".into()),
            op: d.op,
            phase,
            replies: vec![reply],
            health: Vec::new(),
        };
        let actions = op.handle(Event::Replies(nr), Duration::from_millis(tick));
        self.carry_out(actions);
    }

    fn finished(&self) -> bool {
        let ranks_done = (0..self.world).map(GlobalRank).all(|r| {
            self.fabric.failed(r) || {
                let (issued, completed) = self.fabric.progress(r);
                issued == self.total && completed == self.total
            }
        });
        ranks_done && self.queue.is_empty() && (self.op.is_none() || self.outcome.is_some())
    }

    fn state(&self) -> String {
        let ranks: Vec<String> = (0..self.world)
            .map(|r| {
                let (i, c) = self.fabric.progress(GlobalRank(r));
                format!(
                    "{r}:{c}/{i}{}",
                    if self.fabric.failed(GlobalRank(r)) {
                        "x"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        format!(
            "ranks done/issued {}; move {}",
            ranks.join(" "),
            match (&self.op, self.outcome) {
                (None, _) => "not started".to_owned(),
                (Some(op), None) => format!("in {}", op.phase()),
                (Some(_), Some(o)) => o.as_str().to_owned(),
            }
        )
    }

    fn check(&self) -> Result<(), String> {
        self.fabric.check(self.total)?;
        if self.outcome == Some(Outcome::Succeeded) {
            let g = self.fabric.generations();
            if g.iter().any(|x| *x != g[0]) {
                return Err(format!(
                    "the groups disagree after the move: generations {g:?}"
                ));
            }
            if let Some(r) = (0..self.world).find(|r| self.fabric.failed(GlobalRank(*r))) {
                return Err(format!("the move succeeded but rank {r} stopped training"));
            }
        }
        if self.refuser.is_some() && self.outcome == Some(Outcome::Succeeded) {
            return Err("a rank refused its abort and the move succeeded".into());
        }
        Ok(())
    }
}

/// The campaign's totals.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct InFlightReport {
    /// Schedules run.
    pub schedules: u64,
    /// Schedules whose link died / starved before the end.
    pub dead: u64,
    /// Likewise, starved.
    pub starved: u64,
    /// Moves that succeeded / failed.
    pub moves_succeeded: u64,
    /// Moves that failed (a rank refused its abort).
    pub moves_failed: u64,
    /// Results a redo brought again, dropped.
    pub dropped: u64,
    /// The schedules that broke the invariant.
    pub violations: Vec<InFlightRun>,
}

/// Runs `count` schedules from `first`.
pub fn campaign(first: u64, count: u64, explain: bool) -> InFlightReport {
    let mut rep = InFlightReport::default();
    for seed in first..first.saturating_add(count) {
        let run = run_one(seed, explain);
        rep.schedules += 1;
        match run.fault {
            "dead" => rep.dead += 1,
            "starved" => rep.starved += 1,
            _ => {}
        }
        match run.outcome.as_deref() {
            Some("succeeded") => rep.moves_succeeded += 1,
            Some(_) => rep.moves_failed += 1,
            None => {}
        }
        rep.dropped += run.dropped;
        if run.violation.is_some() {
            rep.violations.push(run);
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invariant_holds_over_many_schedules_and_a_seed_replays_its_schedule() {
        let rep = campaign(0, 2_000, false);
        assert!(rep.violations.is_empty(), "{:#?}", rep.violations.first());
        assert!(rep.dead > 0 && rep.starved > 0 && rep.moves_failed > 0 && rep.dropped > 0);
        assert_eq!(run_one(17, true).trace, run_one(17, true).trace);
    }
}
