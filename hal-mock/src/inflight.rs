//! A simulated group whose link dies mid-collective, with the framework side of an in-flight
//! move ([`InFlightFramework`]) for each of its ranks: what taskd's Gloo switch does in a
//! training process, on a fabric a test or `taskd chaos` drives step by step.
//!
//! Every rank issues the same sequence of collectives (an all-reduce of one value per rank:
//! the result is their sum) and takes each result once. A collective completes on a rank only
//! once every member launched it on the same generation of the group; members complete it at
//! different moments (Gloo's ring ends on one rank before another), and collectives in flight
//! complete out of order. When the link dies, nothing launched on the group's first generation
//! completes any more (a starved link: now and then). The in-flight side then works as the
//! real one: [`InFlightFramework::abort`] parks every collective not completed and reports the
//! completed prefix and the issued count; [`InFlightFramework::switch`] moves the rank to the
//! next generation (the rebuilt group on the backup) and launches every collective from the
//! redo point again with its kept input (a result a rank already took is dropped);
//! [`InFlightFramework::give_up`] fails the parked collectives: the rank's training ends.
//!
//! [`InFlightFabric::check`] says whether every rank took every result exactly once, and the
//! right one.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use taskd_core::inflight::{CollectivePosition, InFlightFramework, RedoPoint};
use taskd_core::{GlobalRank, NicSide};

/// The group's name, as a rank reports it.
pub const GROUP: &str = "0";

/// One collective on one rank.
#[derive(Clone, Debug)]
struct Entry {
    /// The rank's input (kept for a redo).
    input: i64,
    /// The generations it was launched on (a peer completes it there only once every
    /// member launched it there).
    launches: BTreeSet<u64>,
    /// The generation of its launch still running on this rank, if one is.
    pending: Option<u64>,
    /// Its caller took its result (or gave it up).
    settled: bool,
}

#[derive(Clone, Debug, Default)]
struct RankState {
    generation: u64,
    entries: BTreeMap<u64, Entry>,
    done: BTreeSet<u64>,
    aborting: bool,
    /// Gave its collectives up: its training ended with their error.
    failed: bool,
    armed: Option<Vec<RedoPoint>>,
    /// `(collective, result)` in the order the rank took them.
    taken: Vec<(u64, i64)>,
    /// Results a redo brought that the rank had taken already (dropped).
    dropped: u64,
}

impl RankState {
    fn issued(&self) -> u64 {
        self.entries.len() as u64
    }

    fn completed(&self) -> u64 {
        (0..).find(|q| !self.done.contains(q)).unwrap_or(0)
    }
}

/// The state of the link the group's first generation runs on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LinkFault {
    /// Every collective completes.
    Healthy,
    /// Nothing launched on the first generation completes any more.
    Dead,
    /// Collectives on the first generation complete, but only now and then.
    Starved,
}

#[derive(Debug)]
struct State {
    world: u32,
    link: LinkFault,
    ranks: Vec<RankState>,
}

/// The simulated group, shared by its ranks' in-flight sides and the driver.
#[derive(Clone, Debug)]
pub struct InFlightFabric {
    state: Arc<Mutex<State>>,
}

/// What a rank's input to collective `q` is (any value that differs by rank and collective).
pub fn input(q: u64, rank: u32) -> i64 {
    let x =
        q.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(rank).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x % 1_000_003) as i64 - 500_000
}

impl InFlightFabric {
    /// A group of `world` ranks, every link healthy.
    pub fn new(world: u32) -> Self {
        InFlightFabric {
            state: Arc::new(Mutex::new(State {
                world,
                link: LinkFault::Healthy,
                ranks: vec![RankState::default(); world as usize],
            })),
        }
    }

    /// The in-flight side of `rank`.
    pub fn rank(&self, rank: GlobalRank) -> SimInFlight {
        SimInFlight {
            fabric: self.clone(),
            rank: rank.0 as usize,
        }
    }

    /// The link fails (or heals) as `fault` says.
    pub fn set_link(&self, fault: LinkFault) {
        self.state.lock().link = fault;
    }

    /// `rank` issues its next collective: launched on its generation now, or parked for the
    /// redo while it aborts. Returns its number.
    pub fn issue(&self, rank: GlobalRank) -> u64 {
        let mut st = self.state.lock();
        let r = &mut st.ranks[rank.0 as usize];
        let q = r.issued();
        let pending = (!r.aborting).then_some(r.generation);
        r.entries.insert(
            q,
            Entry {
                input: input(q, rank.0),
                launches: pending.into_iter().collect(),
                pending,
                settled: false,
            },
        );
        q
    }

    /// How many collectives `rank` issued, and how many of them its caller has the result of
    /// (the completed prefix).
    pub fn progress(&self, rank: GlobalRank) -> (u64, u64) {
        let st = self.state.lock();
        let r = &st.ranks[rank.0 as usize];
        (r.issued(), r.completed())
    }

    /// Whether `rank`'s collective `q` has its result (or was given up).
    pub fn settled(&self, rank: GlobalRank, q: u64) -> bool {
        let st = self.state.lock();
        st.ranks[rank.0 as usize]
            .entries
            .get(&q)
            .is_some_and(|e| e.settled)
    }

    /// Whether `rank` gave its collectives up (its training ended).
    pub fn failed(&self, rank: GlobalRank) -> bool {
        self.state.lock().ranks[rank.0 as usize].failed
    }

    /// The generation each rank's group is on (every member the same: the groups agree).
    pub fn generations(&self) -> Vec<u64> {
        self.state
            .lock()
            .ranks
            .iter()
            .map(|r| r.generation)
            .collect()
    }

    /// Every `(rank, collective)` that may complete now: running on the rank's generation,
    /// launched there by every member, on a link that carries it.
    pub fn completable(&self) -> Vec<(GlobalRank, u64)> {
        let st = self.state.lock();
        let mut out = Vec::new();
        for (i, r) in st.ranks.iter().enumerate() {
            if r.failed {
                continue;
            }
            for (q, e) in &r.entries {
                let Some(g) = e.pending.filter(|g| *g == r.generation) else {
                    continue;
                };
                if g == 0 && st.link == LinkFault::Dead {
                    continue;
                }
                let everyone = st
                    .ranks
                    .iter()
                    .all(|p| p.entries.get(q).is_some_and(|pe| pe.launches.contains(&g)));
                if everyone {
                    out.push((GlobalRank(i as u32), *q));
                }
            }
        }
        out
    }

    /// Whether the first generation's collectives are slow (a starved link): the driver
    /// completes them only now and then.
    pub fn starved(&self) -> bool {
        self.state.lock().link == LinkFault::Starved
    }

    /// Collective `q` completes on `rank` (one of [`InFlightFabric::completable`]): its
    /// caller takes the sum of every member's input, unless it took this result already (a
    /// redo's result is dropped).
    pub fn complete(&self, rank: GlobalRank, q: u64) {
        let mut st = self.state.lock();
        // The sum of what every member launched it with: its kept input.
        let sum: i64 = st
            .ranks
            .iter()
            .map(|p| p.entries.get(&q).map_or(0, |e| e.input))
            .sum();
        let r = &mut st.ranks[rank.0 as usize];
        let Some(e) = r.entries.get_mut(&q) else {
            return;
        };
        e.pending = None;
        if e.settled {
            r.dropped += 1;
            return;
        }
        e.settled = true;
        r.done.insert(q);
        r.taken.push((q, sum));
    }

    /// Whether every rank that did not give up took each of the first `total` collectives'
    /// results exactly once, and the right one; what is wrong otherwise. A rank that gave up
    /// must not have taken a result twice either.
    pub fn check(&self, total: u64) -> Result<(), String> {
        let st = self.state.lock();
        for (i, r) in st.ranks.iter().enumerate() {
            let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
            for (q, v) in &r.taken {
                *seen.entry(*q).or_default() += 1;
                let want: i64 = (0..st.world).map(|p| input(*q, p)).sum();
                if *v != want {
                    return Err(format!("rank {i} took {v} for collective {q}, not {want}"));
                }
            }
            if let Some((q, n)) = seen.iter().find(|(_, n)| **n > 1) {
                return Err(format!("rank {i} applied collective {q} {n} times"));
            }
            if !r.failed {
                if let Some(q) = (0..total).find(|q| !seen.contains_key(q)) {
                    return Err(format!(
                        "rank {i} never took collective {q}: a step was lost"
                    ));
                }
            }
        }
        Ok(())
    }

    /// `rank`'s training ends (its process exits for the recovery path): what it waits for is
    /// given up.
    pub fn stop_training(&self, rank: GlobalRank) {
        let mut st = self.state.lock();
        let r = &mut st.ranks[rank.0 as usize];
        r.failed = true;
        r.aborting = false;
        for e in r.entries.values_mut().filter(|e| !e.settled) {
            e.settled = true;
            e.pending = None;
        }
    }

    /// Results dropped because a redo brought them to a rank that had taken them.
    pub fn dropped(&self) -> u64 {
        self.state.lock().ranks.iter().map(|r| r.dropped).sum()
    }
}

/// One rank's in-flight side over an [`InFlightFabric`].
#[derive(Clone, Debug)]
pub struct SimInFlight {
    fabric: InFlightFabric,
    rank: usize,
}

impl InFlightFramework for SimInFlight {
    fn abort(&self, _targets: &[(GlobalRank, NicSide)]) -> Result<Vec<CollectivePosition>, String> {
        let mut st = self.fabric.state.lock();
        let size = st.world;
        let r = &mut st.ranks[self.rank];
        if r.failed {
            return Err("this rank's training ended".into());
        }
        r.aborting = true;
        // Every collective running here fails at once; the unsettled ones wait for the redo.
        for e in r.entries.values_mut() {
            e.pending = None;
        }
        Ok(vec![CollectivePosition {
            group: GROUP.into(),
            size,
            completed: r.completed(),
            issued: r.issued(),
        }])
    }

    fn arm_switch(&self, redo: Vec<RedoPoint>) {
        self.fabric.state.lock().ranks[self.rank].armed = Some(redo);
    }

    fn take_switch(&self) -> Option<Vec<RedoPoint>> {
        self.fabric.state.lock().ranks[self.rank].armed.take()
    }

    fn switch(
        &self,
        _ranks: &[u32],
        _use_backup: &[bool],
        redo: &[RedoPoint],
        _timeout: Duration,
    ) -> Result<(), String> {
        let mut st = self.fabric.state.lock();
        let r = &mut st.ranks[self.rank];
        if r.failed {
            return Err("this rank's training ended".into());
        }
        let from = redo
            .iter()
            .find(|p| p.group == GROUP)
            .map_or(r.completed(), |p| p.from);
        r.generation += 1;
        r.aborting = false;
        let generation = r.generation;
        for (q, e) in r.entries.iter_mut() {
            // From the redo point on, everything again (a result taken already is dropped
            // when it comes); before it, whatever was left waiting (nothing, when the point
            // is right).
            if *q >= from || !e.settled {
                e.launches.insert(generation);
                e.pending = Some(generation);
            }
        }
        Ok(())
    }

    fn give_up(&self, _reason: &str) {
        let mut st = self.fabric.state.lock();
        let r = &mut st.ranks[self.rank];
        if !r.aborting {
            return;
        }
        r.aborting = false;
        r.failed = true;
        for e in r.entries.values_mut().filter(|e| !e.settled) {
            e.settled = true;
            e.pending = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::inflight::agree;

    fn drain(f: &InFlightFabric) {
        while let Some((r, q)) = f.completable().first().copied() {
            f.complete(r, q);
        }
    }

    #[test]
    fn a_collective_stuck_on_a_dead_link_is_redone_from_the_agreed_point_exactly_once() {
        let f = InFlightFabric::new(3);
        for _ in 0..4 {
            for r in 0..3 {
                f.issue(GlobalRank(r));
            }
        }
        drain(&f);
        // Collective 4: rank 0 finishes its part before the link dies; the others do not.
        for r in 0..3 {
            f.issue(GlobalRank(r));
        }
        f.complete(GlobalRank(0), 4);
        f.set_link(LinkFault::Dead);
        f.issue(GlobalRank(0)); // collective 5, rank 0 only
        assert!(f.completable().is_empty());
        let sides: Vec<SimInFlight> = (0..3).map(|r| f.rank(GlobalRank(r))).collect();
        let reports = sides
            .iter()
            .enumerate()
            .map(|(r, s)| (GlobalRank(r as u32), s.abort(&[]).unwrap()))
            .collect();
        let redo = agree(&reports).unwrap();
        assert_eq!(redo[0].from, 4);
        for s in &sides {
            s.switch(&[], &[], &redo, Duration::ZERO).unwrap();
        }
        drain(&f);
        f.issue(GlobalRank(1));
        f.issue(GlobalRank(2));
        drain(&f);
        assert_eq!(f.check(6), Ok(()));
        assert_eq!(
            f.dropped(),
            1,
            "rank 0's second result of collective 4 is dropped"
        );
        assert_eq!(f.generations(), vec![1, 1, 1]);
    }

    #[test]
    fn a_give_up_ends_the_rank_without_a_result_taken_twice() {
        let f = InFlightFabric::new(2);
        f.issue(GlobalRank(0));
        f.issue(GlobalRank(1));
        f.set_link(LinkFault::Dead);
        let s = f.rank(GlobalRank(0));
        s.abort(&[]).unwrap();
        s.give_up("the move failed");
        assert!(f.failed(GlobalRank(0)) && f.settled(GlobalRank(0), 0));
        assert!(f.check(1).is_err(), "rank 1 never got collective 0");
    }
}
