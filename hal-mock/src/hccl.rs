//! HCCL's rules, simulated: the `HcclCommWorkingDevNicSet` rendezvous and the all-reduce
//! rendezvous the training loop runs on.
//!
//! Both are collective calls: every member of the group must call, and the call completes
//! when the last member arrives. A member that waits longer than
//! [`FabricConfig::hccl_timeout`](crate::FabricConfig::hccl_timeout) gives up with
//! `HCCL_E_TIMEOUT`, one whose peer died gets `HCCL_E_REMOTE`, and everyone gets
//! `HCCL_E_UNAVAIL` once the simulation is shut down.
//!
//! Return codes chosen where the CANN documentation is silent (documented so tests can rely
//! on them):
//! - the calling process was killed, an unknown group, a rank that is not a member:
//!   `HCCL_E_NOT_FOUND`;
//! - a NIC set on a group that never ran a collective: `HCCL_E_INTERNAL` (HCCL only says
//!   "fails"; it logs an internal error because the group has no transport links yet);
//! - a concurrent NIC set on one rank: `HCCL_E_INTERNAL`;
//! - arguments that differ across members, a bad length or group rank, the two dies of one
//!   NPU told opposite sides in one call: `HCCL_E_PARA`;
//! - switching a rank onto a NIC whose port is down: `HCCL_E_ROCE_CONNECT` for every member
//!   (nothing applied), as the reference system refuses it too;
//! - a collective whose member sends on a down port: `HCCL_E_ROCE_TRANSFER`; on a group
//!   whose members hold different configurations of its operator: `HCCL_E_INTERNAL`; members
//!   issuing different operators in one round: `HCCL_E_PARA`;
//! - simulation shut down: `HCCL_E_UNAVAIL`.
//!
//! Every call is a state machine (`NicSetCall`, `CollectiveCall`) advanced under the
//! fabric's lock; `hal-mock/src/call.rs` runs it on a blocked thread (the
//! [`taskd_core::RankHal`] calls) or as a task (the `_async` calls and
//! [`taskd_core::TaskRankHal`], for simulated ranks that are tasks).

use crate::call::{self, Progress};
use crate::fabric::{
    deadline_after, fmt_backup, CollectiveRound, Fabric, NicArrival, NicResult, State,
};
use crate::fault::{NicSetFault, NicSetRecord};
use crate::operator::{self, Collective};
use crate::view::BackupSet;
use parking_lot::MutexGuard;
use std::task::Waker;
use std::time::Instant;
use taskd_core::{GlobalRank, GroupRank, HalError, HcclCode};

/// The HCCL entry point a NIC-set error names.
pub const NIC_SET_OP: &str = "HcclCommWorkingDevNicSet";
/// The HCCL entry point a collective error names.
pub const ALL_REDUCE_OP: &str = "HcclAllReduce";

type Guard<'a> = MutexGuard<'a, State>;

fn fail(code: HcclCode, detail: impl Into<String>) -> NicResult {
    NicResult {
        code,
        detail: detail.into(),
        applied: false,
    }
}

fn shut_down() -> (HcclCode, String) {
    (
        HcclCode::Unavail,
        "the simulated fabric was shut down".to_owned(),
    )
}

fn killed(rank: GlobalRank) -> (HcclCode, String) {
    (
        HcclCode::NotFound,
        format!("the process of rank {rank} was killed; its communicators are gone"),
    )
}

fn peer_lost(peer: GlobalRank) -> (HcclCode, String) {
    (
        HcclCode::Remote,
        format!("peer rank {peer} of the group died"),
    )
}

/// `[P B P]`: a view, compactly.
fn fmt_view(v: &[bool]) -> String {
    let s: Vec<&str> = v.iter().map(|b| if *b { "B" } else { "P" }).collect();
    format!("[{}]", s.join(" "))
}

fn fmt_ranks(rs: impl IntoIterator<Item = GlobalRank>) -> String {
    let v: Vec<String> = rs.into_iter().map(|r| r.0.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// One `HcclCommWorkingDevNicSet` call in progress.
pub(crate) struct NicSetCall {
    rank: GlobalRank,
    group: String,
    ranks: Vec<GroupRank>,
    use_backup: Vec<bool>,
    /// Inside HCCL: the rank's call slot is taken (`State::nic_call`).
    in_call: bool,
    stage: NicStage,
}

enum NicStage {
    Start,
    /// Held by an injected hang or slowness until `until`; then it joins the rendezvous and,
    /// with `fault`, fails at its completion.
    Delayed {
        until: Option<Instant>,
        fault: Option<HcclCode>,
    },
    /// Member `m` of group `gi` waits in round `round_id`.
    Joined {
        gi: usize,
        m: usize,
        round_id: u64,
        fault: Option<HcclCode>,
        deadline: Option<Instant>,
    },
    Done,
}

/// One collective (all-reduce) call in progress.
pub(crate) struct CollectiveCall {
    rank: GlobalRank,
    group: String,
    op: Collective,
    value: f64,
    stage: CollectiveStage,
}

enum CollectiveStage {
    Start,
    /// Member `m` of group `gi` waits for round `seq`.
    Joined {
        gi: usize,
        m: usize,
        seq: u64,
        deadline: Option<Instant>,
    },
    Done,
}

impl NicSetCall {
    fn new(rank: GlobalRank, group: &str, ranks: &[GroupRank], use_backup: &[bool]) -> Self {
        NicSetCall {
            rank,
            group: group.to_owned(),
            ranks: ranks.to_vec(),
            use_backup: use_backup.to_vec(),
            in_call: false,
            stage: NicStage::Start,
        }
    }
}

impl CollectiveCall {
    fn new(rank: GlobalRank, group: &str, op: Collective, value: f64) -> Self {
        CollectiveCall {
            rank,
            group: group.to_owned(),
            op,
            value,
            stage: CollectiveStage::Start,
        }
    }
}

/// A call that can be left half-way.
trait InFlight {
    /// Whether it has its answer.
    fn answered(&self) -> bool;
    /// Leaves the rendezvous as a rank that gave up would.
    fn abandon(&mut self, fabric: &Fabric, st: &mut Guard<'_>);
}

impl InFlight for NicSetCall {
    fn answered(&self) -> bool {
        matches!(self.stage, NicStage::Done)
    }

    fn abandon(&mut self, fabric: &Fabric, st: &mut Guard<'_>) {
        let r = self.rank.0 as usize;
        match std::mem::replace(&mut self.stage, NicStage::Done) {
            NicStage::Joined {
                gi, m, round_id, ..
            } => {
                st.groups[gi].nic_wakers[m] = None;
                fabric.leave_nic_round(st, gi, m, round_id);
            }
            NicStage::Delayed { .. } => st.delay_wakers[r] = None,
            NicStage::Start | NicStage::Done => {}
        }
        if std::mem::take(&mut self.in_call) {
            st.nic_call[r] = None;
        }
    }
}

impl InFlight for CollectiveCall {
    fn answered(&self) -> bool {
        matches!(self.stage, CollectiveStage::Done)
    }

    fn abandon(&mut self, _: &Fabric, st: &mut Guard<'_>) {
        if let CollectiveStage::Joined { gi, m, seq, .. } =
            std::mem::replace(&mut self.stage, CollectiveStage::Done)
        {
            let g = &mut st.groups[gi];
            g.ar_in_flight[m] = false;
            if let Some(round) = g.ar_rounds.get_mut(&seq) {
                round.wakers[m] = None;
            }
        }
    }
}

/// A call driven as a future. If the future is dropped before the answer (its task was
/// aborted), the call leaves its rendezvous as a rank that gave up would.
struct Driven<'a, C: InFlight> {
    fabric: &'a Fabric,
    call: C,
}

impl<C: InFlight> Drop for Driven<'_, C> {
    fn drop(&mut self) {
        if !self.call.answered() {
            let mut st = self.fabric.state.lock();
            self.call.abandon(self.fabric, &mut st);
            self.fabric.bump(&mut st);
        }
    }
}

/// Whether a call with `deadline` (`None`: none) may still wait at `now`.
fn before(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.map_or(true, |d| now < d)
}

impl Fabric {
    /// `HcclCommWorkingDevNicSet` of `rank` on `group` (see the module docs for the rules),
    /// blocking the calling thread until it returns.
    pub(crate) fn set_working_nic(
        &self,
        rank: GlobalRank,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        let mut c = NicSetCall::new(rank, group, ranks, use_backup);
        call::block_on(|w, now| self.poll_nic_set(&mut c, w, now))
    }

    /// [`Fabric::set_working_nic`] as a future: the rank waits in the rendezvous as a task.
    pub(crate) async fn set_working_nic_async(
        &self,
        rank: GlobalRank,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        let mut d = Driven {
            fabric: self,
            call: NicSetCall::new(rank, group, ranks, use_backup),
        };
        call::drive(|w, now| self.poll_nic_set(&mut d.call, w, now)).await
    }

    /// Advances a NIC-set call; once answered, records it in the log.
    fn poll_nic_set(
        &self,
        c: &mut NicSetCall,
        waker: &Waker,
        now: Instant,
    ) -> Progress<Result<(), HalError>> {
        let mut st = self.state.lock();
        let progress = self.advance_nic_set(&mut st, c, waker, now);
        let res = match progress {
            Progress::Wait(until) => {
                self.bump(&mut st);
                return Progress::Wait(until);
            }
            Progress::Done(res) => res,
        };
        c.stage = NicStage::Done;
        if std::mem::take(&mut c.in_call) {
            st.nic_call[c.rank.0 as usize] = None;
        }
        if st.log.len() == crate::fabric::NIC_SET_LOG_LEN {
            st.log.pop_front();
        }
        st.log.push_back(NicSetRecord {
            rank: c.rank,
            group: c.group.clone(),
            ranks: c.ranks.clone(),
            use_backup: c.use_backup.clone(),
            result: res.code,
            applied: res.applied,
        });
        self.bump(&mut st);
        drop(st);
        Progress::Done(if res.code == HcclCode::Success {
            Ok(())
        } else {
            Err(HalError::new(
                NIC_SET_OP,
                res.code,
                format!("rank {}, group {}: {}", c.rank, c.group, res.detail),
            ))
        })
    }

    fn advance_nic_set(
        &self,
        st: &mut Guard<'_>,
        c: &mut NicSetCall,
        waker: &Waker,
        now: Instant,
    ) -> Progress<NicResult> {
        let r = c.rank.0 as usize;
        loop {
            match c.stage {
                NicStage::Start => {
                    if let Err(res) = self.nic_set_entry(st, c.rank, &c.group) {
                        return Progress::Done(res);
                    }
                    c.in_call = true;
                    let (delay, fault) = match st.faults[r].pop_front() {
                        None => (None, None),
                        Some(NicSetFault::Fail(code)) => (None, Some(code)),
                        Some(NicSetFault::Hang { duration, code }) => (Some(duration), Some(code)),
                        Some(NicSetFault::Slow(d)) => (Some(d), None),
                    };
                    match delay {
                        Some(d) => {
                            c.stage = NicStage::Delayed {
                                until: deadline_after(d),
                                fault,
                            }
                        }
                        None => {
                            if let Err(res) = self.nic_set_join(st, c, fault) {
                                return Progress::Done(res);
                            }
                        }
                    }
                }
                NicStage::Delayed { until, fault } => {
                    if st.shut_down {
                        let (code, d) = shut_down();
                        return Progress::Done(fail(code, d));
                    }
                    if st.dead[r] {
                        let (code, d) = killed(c.rank);
                        return Progress::Done(fail(code, d));
                    }
                    if before(until, now) {
                        st.delay_wakers[r] = Some(waker.clone());
                        return Progress::Wait(until);
                    }
                    st.delay_wakers[r] = None;
                    if let Err(res) = self.nic_set_join(st, c, fault) {
                        return Progress::Done(res);
                    }
                }
                NicStage::Joined {
                    gi,
                    m,
                    round_id,
                    fault,
                    deadline,
                } => {
                    let waiting = (gi, m, round_id, fault, deadline);
                    return self.wait_nic_round(st, c.rank, waiting, waker, now);
                }
                NicStage::Done => unreachable!("a NIC-set call is polled after its answer"),
            }
        }
    }

    /// HCCL's checks at entry; takes the rank's call slot. `Err`: the call's answer.
    fn nic_set_entry(
        &self,
        st: &mut Guard<'_>,
        rank: GlobalRank,
        group: &str,
    ) -> Result<(), NicResult> {
        if st.shut_down {
            let (c, d) = shut_down();
            return Err(fail(c, d));
        }
        let r = rank.0 as usize;
        if r >= st.dead.len() {
            return Err(fail(
                HcclCode::NotFound,
                format!("no rank {rank} in the fabric"),
            ));
        }
        if st.dead[r] {
            let (c, d) = killed(rank);
            return Err(fail(c, d));
        }
        if let Some(other) = st.nic_call[r].clone() {
            st.violation(format!(
                "concurrent {NIC_SET_OP} on rank {rank}: group {group} called while the call on \
                 group {other} is still in progress"
            ));
            return Err(fail(
                HcclCode::Internal,
                format!("another {NIC_SET_OP} (group {other}) is in progress on this rank"),
            ));
        }
        st.nic_call[r] = Some(group.to_owned());
        Ok(())
    }

    /// The checks before the rendezvous, then joins it (`c.stage` becomes `Joined`).
    /// `Err`: the call's answer without a rendezvous.
    fn nic_set_join(
        &self,
        st: &mut Guard<'_>,
        c: &mut NicSetCall,
        fault: Option<HcclCode>,
    ) -> Result<(), NicResult> {
        let gi = self.nic_set_checks(st, c.rank, &c.group, &c.ranks, &c.use_backup, fault)?;
        let m = st.groups[gi]
            .member_index(c.rank)
            .expect("checked by nic_set_checks");
        let round_id = st.groups[gi].nic_round_id;
        {
            let g = &mut st.groups[gi];
            g.nic_results[m] = None;
            g.nic_left[m] = false;
            let arrival = NicArrival {
                ranks: c.ranks.clone(),
                use_backup: c.use_backup.clone(),
                fault,
            };
            if g.nic_round[m].replace(arrival).is_none() {
                g.nic_arrived += 1;
            }
        }
        if st.groups[gi].nic_arrived == st.groups[gi].members.len() {
            self.complete_nic_round(st, gi);
        } else {
            self.detect_order_cycle(st, c.rank);
        }
        c.stage = NicStage::Joined {
            gi,
            m,
            round_id,
            fault,
            deadline: deadline_after(self.cfg.hccl_timeout),
        };
        Ok(())
    }

    /// HCCL's immediate checks: nothing is waited for and nothing changes. `Ok(group index)`
    /// to go on to the rendezvous, or the call's answer.
    fn nic_set_checks(
        &self,
        st: &mut Guard<'_>,
        rank: GlobalRank,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
        fault_code: Option<HcclCode>,
    ) -> Result<usize, NicResult> {
        let r = rank.0 as usize;
        let Some(&gi) = st.by_name.get(group) else {
            return Err(fail(
                HcclCode::NotFound,
                format!("no communication group {group:?}"),
            ));
        };
        let Some(m) = st.groups[gi].member_index(rank) else {
            return Err(fail(
                HcclCode::NotFound,
                "this rank is not a member of the group",
            ));
        };
        if let Err(detail) = self.check_arguments(st, gi, ranks, use_backup) {
            return Err(fail(HcclCode::Para, detail));
        }
        if !st.groups[gi].ran_op[m] {
            st.violation(format!(
                "{NIC_SET_OP} by rank {rank} on group {group}, which has not run any collective yet"
            ));
            return Err(fail(
                HcclCode::Internal,
                "the group has not run any collective yet (no transport links to switch)",
            ));
        }
        if st.groups[gi].ar_in_flight[m] {
            st.violation(format!(
                "{NIC_SET_OP} by rank {rank} on group {group} while its collective on that group \
                 is still in flight (training was not paused)"
            ));
        }
        if !st.l2_retry[r] || !self.cfg.rdma {
            let why = if self.cfg.rdma {
                "HCCL_OP_RETRY_ENABLE has no L2:1"
            } else {
                "the topology has no RDMA links"
            };
            tracing::warn!(
                rank = rank.0,
                group,
                "sim HCCL: {NIC_SET_OP} does nothing because {why}; returning success"
            );
            return Err(match fault_code {
                Some(c) => fail(c, "injected fault"),
                None => NicResult {
                    code: HcclCode::Success,
                    detail: format!("no-op: {why}"),
                    applied: false,
                },
            });
        }
        if let Some(peer) = st.any_member_dead(gi) {
            let (c, d) = peer_lost(peer);
            return Err(fail(fault_code.unwrap_or(c), d));
        }

        Ok(gi)
    }

    /// Waits in a joined NIC-set round for its outcome, or for a reason to leave.
    fn wait_nic_round(
        &self,
        st: &mut Guard<'_>,
        rank: GlobalRank,
        (gi, m, round_id, fault, deadline): (usize, usize, u64, Option<HcclCode>, Option<Instant>),
        waker: &Waker,
        now: Instant,
    ) -> Progress<NicResult> {
        let r = rank.0 as usize;
        let with_fault = |c: HcclCode, d: String| fail(fault.unwrap_or(c), d);
        let g = &mut st.groups[gi];
        if matches!(&g.nic_results[m], Some((id, _)) if *id == round_id) {
            let (_, res) = g.nic_results[m].take().expect("checked just above");
            return Progress::Done(res);
        }
        let leave = if st.shut_down {
            Some(shut_down())
        } else if st.dead[r] {
            Some(killed(rank))
        } else {
            st.any_member_dead(gi).map(peer_lost)
        };
        if let Some((c, d)) = leave {
            self.leave_nic_round(st, gi, m, round_id);
            return Progress::Done(if c == HcclCode::Remote {
                with_fault(c, d)
            } else {
                fail(c, d)
            });
        }
        if !before(deadline, now) {
            let detail = self.nic_timeout(st, gi);
            self.leave_nic_round(st, gi, m, round_id);
            return Progress::Done(with_fault(HcclCode::Timeout, detail));
        }
        st.groups[gi].nic_wakers[m] = Some(waker.clone());
        Progress::Wait(deadline)
    }

    /// The argument checks HCCL does before touching anything.
    fn check_arguments(
        &self,
        st: &State,
        gi: usize,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), String> {
        check_nic_set_arguments(
            &st.groups[gi].members,
            |r| self.partner(r),
            ranks,
            use_backup,
        )
    }

    fn leave_nic_round(&self, st: &mut Guard<'_>, gi: usize, m: usize, round_id: u64) {
        let g = &mut st.groups[gi];
        if g.nic_round_id == round_id {
            if g.nic_round[m].take().is_some() {
                g.nic_arrived -= 1;
            }
            g.nic_left[m] = true;
        }
    }
    /// Explains a NIC-set timeout: which members never arrived.
    fn nic_timeout(&self, st: &State, gi: usize) -> String {
        let g = &st.groups[gi];
        let missing = g
            .members
            .iter()
            .zip(&g.nic_round)
            .filter(|(_, a)| a.is_none())
            .map(|(r, _)| *r);
        format!(
            "waited {:?} in group {} for ranks {} that never called",
            self.cfg.hccl_timeout,
            g.name,
            fmt_ranks(missing)
        )
    }

    /// The group whose open NIC-set round `rank` has joined and waits in, if any.
    fn waiting_in(st: &State, rank: GlobalRank) -> Option<usize> {
        let gi = *st.by_name.get(st.nic_call[rank.0 as usize].as_deref()?)?;
        let m = st.groups[gi].member_index(rank)?;
        st.groups[gi].nic_round[m].as_ref().map(|_| gi)
    }

    /// After `start` joined a round that is not complete: if the ranks it waits for (that
    /// have not yet called, as opposed to having given up on this round) wait, in turn, in
    /// other groups' rounds for it, no round can ever complete (until the timeout).
    /// That is HCCL's "same group order on every rank" rule broken; record it, naming the
    /// cycle. Checked at arrival, so detection does not depend on timing.
    fn detect_order_cycle(&self, st: &mut Guard<'_>, start: GlobalRank) {
        // A cycle through `start` closes at a rank waiting in another group of `start`, for
        // `start`: none is possible unless one of them has a round with a member in it. (The
        // common case, and what keeps an arrival in a group of thousands cheap.)
        let own = Self::waiting_in(st, start);
        let closable = st.rank_groups[start.0 as usize]
            .iter()
            .any(|gi| Some(*gi) != own && st.groups[*gi].nic_arrived > 0);
        if !closable {
            return;
        }
        // Breadth-first over "waits for" edges; `via[r] = (predecessor, group it waits in)`.
        let mut via: std::collections::HashMap<GlobalRank, (GlobalRank, usize)> =
            std::collections::HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        'search: while let Some(r) = queue.pop_front() {
            let Some(gi) = Self::waiting_in(st, r) else {
                continue;
            };
            // A round with a dead member waits for nobody: each of its members leaves it with
            // HCCL_E_REMOTE at its next look, as one that calls now gets it at once.
            if st.any_member_dead(gi).is_some() {
                continue;
            }
            let g = &st.groups[gi];
            for ((p, a), left) in g.members.iter().zip(&g.nic_round).zip(&g.nic_left) {
                if a.is_some() || *left {
                    continue; // arrived, or gave up on this round (not an order problem)
                }
                if *p == start {
                    closing = Some((r, gi));
                    break 'search;
                }
                if Self::waiting_in(st, *p).is_some() && !via.contains_key(p) {
                    via.insert(*p, (r, gi));
                    queue.push_back(*p);
                }
            }
        }
        let Some((last, gi)) = closing else {
            return;
        };
        let mut hops = vec![format!(
            "rank {last} waits in {} for rank {start}",
            st.groups[gi].name
        )];
        let mut r = last;
        while r != start {
            let (prev, pgi) = via[&r];
            hops.push(format!(
                "rank {prev} waits in {} for rank {r}",
                st.groups[pgi].name
            ));
            r = prev;
        }
        hops.reverse();
        st.violation(format!(
            "{NIC_SET_OP} order differs across ranks (deadlock until the HCCL timeout): {}",
            hops.join(", ")
        ));
    }

    /// The last member arrived: decide and hand every member its result.
    fn complete_nic_round(&self, st: &mut Guard<'_>, gi: usize) {
        let arrivals: Vec<NicArrival> = st.groups[gi]
            .nic_round
            .iter_mut()
            .map(|a| a.take().expect("complete only when every member arrived"))
            .collect();
        let round_id = st.groups[gi].nic_round_id;
        st.groups[gi].nic_round_id += 1;
        st.groups[gi].nic_arrived = 0;
        st.groups[gi].nic_left.iter_mut().for_each(|x| *x = false);
        let name = st.groups[gi].name.clone();
        // `Err((code, detail))`: nobody applies; otherwise every member not faulted applies.
        let verdict = self.nic_round_verdict(st, gi, &arrivals);
        let g = &mut st.groups[gi];
        for (m, a) in arrivals.iter().enumerate() {
            let res = match (&verdict, a.fault) {
                (_, Some(code)) => fail(code, "injected fault: the change was not applied"),
                (Err((c, d)), None) => fail(*c, d.clone()),
                (Ok(()), None) => {
                    for (gr, b) in a.ranks.iter().zip(&a.use_backup) {
                        g.views[m].set(gr.0 as usize, *b);
                        // HCCL re-links the operators issued so far; later ones start on the
                        // default NIC (see crate::operator).
                        operator::apply(&mut g.op_views[m], gr.0 as usize, *b);
                    }
                    NicResult {
                        code: HcclCode::Success,
                        detail: String::new(),
                        applied: true,
                    }
                }
            };
            g.nic_results[m] = Some((round_id, res));
        }
        g.wake_nic_round();
        tracing::debug!(group = %name, round_id, ok = verdict.is_ok(), "sim HCCL: NIC-set round completed");
    }

    /// Whether a complete NIC-set round may apply: the members' arguments must match and no
    /// rank may be moved onto a port that is down.
    fn nic_round_verdict(
        &self,
        st: &mut Guard<'_>,
        gi: usize,
        arrivals: &[NicArrival],
    ) -> Result<(), (HcclCode, String)> {
        let name = st.groups[gi].name.clone();
        let members = st.groups[gi].members.clone();
        let first = &arrivals[0];
        let mismatch = arrivals
            .iter()
            .any(|a| a.ranks != first.ranks || a.use_backup != first.use_backup);
        if mismatch {
            let desc: Vec<String> = arrivals
                .iter()
                .zip(&members)
                .map(|(a, r)| {
                    let rs: Vec<u32> = a.ranks.iter().map(|x| x.0).collect();
                    format!("rank {r}: ranks {rs:?} useBackup {:?}", a.use_backup)
                })
                .collect();
            st.violation(format!(
                "mismatched {NIC_SET_OP} arguments on group {name}: {}",
                desc.join("; ")
            ));
            return Err((
                HcclCode::Para,
                "members called with different ranks/useBackup".to_owned(),
            ));
        }
        {
            let g = &st.groups[gi];
            let mut down = Vec::new();
            for (gr, b) in first.ranks.iter().zip(&first.use_backup) {
                let gr = gr.0 as usize;
                if g.views.iter().all(|v| v.contains(gr) == *b) {
                    continue; // no change for this rank: nothing to connect
                }
                let r = members[gr];
                match self.working_port(r, *b) {
                    Some(p) if st.ports_up[p] => {}
                    Some(p) => down.push(format!("rank {r} -> {} (down)", self.port_name(p))),
                    None => down.push(format!("rank {r} has no backup NIC")),
                }
            }
            if down.is_empty() {
                Ok(())
            } else {
                Err((
                    HcclCode::RoceConnect,
                    format!(
                        "cannot switch onto a NIC whose link is down: {}",
                        down.join(", ")
                    ),
                ))
            }
        }
    }

    /// One all-reduce (sum) of `value` by `rank` on `group` as the training operator
    /// ([`Collective::TRAINING`]); see [`Fabric::collective`].
    ///
    /// Why public: a rig can drive its own training loop instead of [`crate::SimTraining`].
    pub fn all_reduce(&self, group: &str, rank: GlobalRank, value: f64) -> Result<f64, HalError> {
        self.collective(group, rank, Collective::TRAINING, value)
    }

    /// One collective `op` (an all-reduce, sum) of `value` by `rank` on `group`. Rounds are
    /// matched by each member's call count on the group, as HCCL matches operations by order,
    /// and every member of a round must issue the same operator. The member's first call of
    /// `op` on the group issues the operator on the default NIC ([`crate::operator`]). On
    /// completion the group counts as having run an operation; the round succeeds only if all
    /// members hold the same configuration of `op` and every member's working port (by that
    /// configuration of itself) is up; otherwise every member gets the same error. A member
    /// that times out aborts the round: every member, including late arrivals, then gets
    /// `HCCL_E_TIMEOUT` for it, so call counts stay aligned. Blocks the calling thread until
    /// the round is decided ([`Fabric::collective_async`] waits as a task instead).
    pub fn collective(
        &self,
        group: &str,
        rank: GlobalRank,
        op: Collective,
        value: f64,
    ) -> Result<f64, HalError> {
        let mut c = CollectiveCall::new(rank, group, op, value);
        call::block_on(|w, now| self.poll_collective(&mut c, w, now))
    }

    /// [`Fabric::collective`] as a future, on a tokio runtime: the rank waits for its peers as
    /// a task, not a thread.
    pub async fn collective_async(
        &self,
        group: &str,
        rank: GlobalRank,
        op: Collective,
        value: f64,
    ) -> Result<f64, HalError> {
        let mut d = Driven {
            fabric: self,
            call: CollectiveCall::new(rank, group, op, value),
        };
        call::drive(|w, now| self.poll_collective(&mut d.call, w, now)).await
    }

    fn poll_collective(
        &self,
        c: &mut CollectiveCall,
        waker: &Waker,
        now: Instant,
    ) -> Progress<Result<f64, HalError>> {
        let mut st = self.state.lock();
        let progress = self.advance_collective(&mut st, c, waker, now);
        self.bump(&mut st);
        drop(st);
        match progress {
            Progress::Wait(until) => Progress::Wait(until),
            Progress::Done(res) => {
                c.stage = CollectiveStage::Done;
                Progress::Done(res.map_err(|(code, detail)| {
                    HalError::new(
                        ALL_REDUCE_OP,
                        code,
                        format!("rank {}, group {}: {detail}", c.rank, c.group),
                    )
                }))
            }
        }
    }

    fn advance_collective(
        &self,
        st: &mut Guard<'_>,
        c: &mut CollectiveCall,
        waker: &Waker,
        now: Instant,
    ) -> Progress<Result<f64, (HcclCode, String)>> {
        let (gi, m, seq, deadline) = match c.stage {
            CollectiveStage::Start => match self.collective_entry(st, c) {
                Err(e) => return Progress::Done(Err(e)),
                Ok(joined) => joined,
            },
            CollectiveStage::Joined {
                gi,
                m,
                seq,
                deadline,
            } => (gi, m, seq, deadline),
            CollectiveStage::Done => unreachable!("a collective is polled after its answer"),
        };
        if st.groups[gi].ar_rounds[&seq].outcome.is_some() {
            return Progress::Done(Self::consume_collective(st, gi, m, seq));
        }
        let r = c.rank.0 as usize;
        let leave = if st.shut_down {
            Some(shut_down())
        } else if st.dead[r] {
            Some(killed(c.rank))
        } else {
            st.any_member_dead(gi).map(peer_lost)
        };
        if let Some(e) = leave {
            st.groups[gi].ar_in_flight[m] = false;
            return Progress::Done(Err(e));
        }
        if !before(deadline, now) {
            self.time_out_collective(st, gi, seq);
            return Progress::Done(Self::consume_collective(st, gi, m, seq));
        }
        if let Some(round) = st.groups[gi].ar_rounds.get_mut(&seq) {
            round.wakers[m] = Some(waker.clone());
        }
        Progress::Wait(deadline)
    }

    /// The checks at entry, then joins the group's next round (completing it when this member
    /// is the last): `(group, member, round, deadline)`, or the call's answer.
    #[allow(clippy::type_complexity)]
    fn collective_entry(
        &self,
        st: &mut Guard<'_>,
        c: &mut CollectiveCall,
    ) -> Result<(usize, usize, u64, Option<Instant>), (HcclCode, String)> {
        let (rank, group) = (c.rank, c.group.as_str());
        if st.shut_down {
            return Err(shut_down());
        }
        let r = rank.0 as usize;
        if r >= st.dead.len() {
            return Err((HcclCode::NotFound, format!("no rank {rank} in the fabric")));
        }
        if st.dead[r] {
            return Err(killed(rank));
        }
        let Some(&gi) = st.by_name.get(group) else {
            return Err((
                HcclCode::NotFound,
                format!("no communication group {group:?}"),
            ));
        };
        let Some(m) = st.groups[gi].member_index(rank) else {
            return Err((
                HcclCode::NotFound,
                "this rank is not a member of the group".to_owned(),
            ));
        };
        if st.nic_call[r].as_deref() == Some(group) {
            st.violation(format!(
                "collective by rank {rank} on group {group} while its {NIC_SET_OP} on that group \
                 is in progress"
            ));
        }
        if let Some(peer) = st.any_member_dead(gi) {
            return Err(peer_lost(peer));
        }
        let seq = self.join_collective(st, gi, m, c.op, c.value);
        let complete = {
            let round = &st.groups[gi].ar_rounds[&seq];
            round.outcome.is_none() && round.arrived == round.values.len()
        };
        if complete {
            self.complete_collective(st, gi, seq);
        }
        let deadline = deadline_after(self.cfg.hccl_timeout);
        c.stage = CollectiveStage::Joined {
            gi,
            m,
            seq,
            deadline,
        };
        Ok((gi, m, seq, deadline))
    }

    /// A member gave up waiting for round `seq`: the round fails with `HCCL_E_TIMEOUT` for
    /// everyone, naming the members that never arrived.
    fn time_out_collective(&self, st: &mut Guard<'_>, gi: usize, seq: u64) {
        let g = &mut st.groups[gi];
        let round = g
            .ar_rounds
            .get_mut(&seq)
            .expect("round exists until consumed");
        let missing = g
            .members
            .iter()
            .zip(&round.values)
            .filter(|(_, v)| v.is_none())
            .map(|(r, _)| *r);
        round.outcome = Some(Err((
            HcclCode::Timeout,
            format!(
                "all-reduce #{seq} waited {:?} for ranks {}",
                self.cfg.hccl_timeout,
                fmt_ranks(missing)
            ),
        )));
        round.wake();
    }

    /// Issues `op` for member `m` and puts its value into the group's next round; returns the
    /// round's sequence number.
    fn join_collective(
        &self,
        st: &mut Guard<'_>,
        gi: usize,
        m: usize,
        op: Collective,
        value: f64,
    ) -> u64 {
        let g = &mut st.groups[gi];
        let n = g.members.len();
        operator::issue(&mut g.op_views[m], op);
        let seq = g.ar_next_seq[m];
        g.ar_next_seq[m] += 1;
        let round = g
            .ar_rounds
            .entry(seq)
            .or_insert_with(|| CollectiveRound::new(n, op));
        let mismatch = round.op != op && round.outcome.is_none();
        if round.outcome.is_none() {
            if round.values[m].replace(value).is_none() {
                round.arrived += 1;
            }
            g.ar_in_flight[m] = true;
        }
        if mismatch {
            let msg = format!(
                "collective #{seq} on group {}: rank {} issued {op} but a peer issued {}",
                g.name, g.members[m], round.op
            );
            round.outcome = Some(Err((HcclCode::Para, msg.clone())));
            st.violation(msg);
        }
        seq
    }

    fn consume_collective(
        st: &mut Guard<'_>,
        gi: usize,
        m: usize,
        seq: u64,
    ) -> Result<f64, (HcclCode, String)> {
        let g = &mut st.groups[gi];
        g.ar_in_flight[m] = false;
        let round = g
            .ar_rounds
            .get_mut(&seq)
            .expect("round exists until consumed");
        if !std::mem::replace(&mut round.consumed[m], true) {
            round.consumed_count += 1;
        }
        let out = round.outcome.clone().expect("consumed only once decided");
        if round.consumed_count == round.consumed.len() {
            g.ar_rounds.remove(&seq);
        }
        out
    }

    fn complete_collective(&self, st: &mut Guard<'_>, gi: usize, seq: u64) {
        let g = &st.groups[gi];
        let op = g.ar_rounds[&seq].op;
        // Every member of the round issued `op`, so each holds a configuration of it.
        let views: Vec<&BackupSet> = g.op_views.iter().map(|v| &v[&op]).collect();
        let outcome = if views.iter().any(|v| *v != views[0]) {
            let desc: Vec<String> = g
                .members
                .iter()
                .zip(&views)
                .map(|(r, v)| format!("rank {r} sees {}", fmt_view(&v.to_dense(g.members.len()))))
                .collect();
            let msg = format!(
                "{op} on group {} while its members disagree on its NICs: {}",
                g.name,
                desc.join(", ")
            );
            st.inconsistent_collectives += 1;
            st.violation(msg.clone());
            Err((HcclCode::Internal, msg))
        } else {
            if operator::on_default_nic(&g.views, views[0]) {
                tracing::debug!(group = %g.name, %op, "sim HCCL: a collective ran on the default NIC of a switched group");
                st.default_nic_collectives += 1;
            }
            let g = &st.groups[gi];
            self.collective_outcome(st, gi, seq, &g.op_views[0][&op].clone())
        };
        let g = &mut st.groups[gi];
        g.ran_op.iter_mut().for_each(|x| *x = true);
        let round = g
            .ar_rounds
            .get_mut(&seq)
            .expect("round being completed exists");
        round.outcome = Some(outcome);
        round.wake();
    }

    /// The result of a round whose members agree on `view`: the sum, unless a member sends on
    /// a port that is down (or on a backup NIC it does not have).
    fn collective_outcome(
        &self,
        st: &State,
        gi: usize,
        seq: u64,
        view: &BackupSet,
    ) -> Result<f64, (HcclCode, String)> {
        let g = &st.groups[gi];
        let down: Vec<String> = g
            .members
            .iter()
            .enumerate()
            .filter_map(|(m, r)| match self.working_port(*r, view.contains(m)) {
                Some(p) if st.ports_up[p] => None,
                Some(p) => Some(format!("rank {r} sends on {} (down)", self.port_name(p))),
                None => Some(format!("rank {r} uses a backup NIC it does not have")),
            })
            .collect();
        if down.is_empty() {
            let round = &g.ar_rounds[&seq];
            Ok(round.values.iter().map(|v| v.unwrap_or(0.0)).sum())
        } else {
            Err((
                HcclCode::RoceTransfer,
                format!("{} ({})", down.join(", "), fmt_backup(view)),
            ))
        }
    }
}

/// The argument checks HCCL makes on a NIC-set call before touching anything, shared by the
/// fabric and the single-rank mock: lengths, group-rank range, a rank listed twice with
/// different flags, and the two dies of one NPU (each other's backup) told opposite sides.
pub(crate) fn check_nic_set_arguments(
    members: &[GlobalRank],
    partner: impl Fn(GlobalRank) -> Option<GlobalRank>,
    ranks: &[GroupRank],
    use_backup: &[bool],
) -> Result<(), String> {
    if ranks.len() != use_backup.len() {
        return Err(format!(
            "{} ranks but {} useBackup flags",
            ranks.len(),
            use_backup.len()
        ));
    }
    if ranks.is_empty() {
        return Err("nRanks is 0".to_owned());
    }
    if let Some(bad) = ranks.iter().find(|gr| gr.0 as usize >= members.len()) {
        return Err(format!(
            "group rank {bad} out of range: the group has {} members",
            members.len()
        ));
    }
    for (i, (a, fa)) in ranks.iter().zip(use_backup).enumerate() {
        for (b, fb) in ranks.iter().zip(use_backup).skip(i + 1) {
            if a == b && fa != fb {
                return Err(format!("group rank {a} listed twice with different flags"));
            }
            let (ra, rb) = (members[a.0 as usize], members[b.0 as usize]);
            if fa != fb && partner(ra) == Some(rb) {
                return Err(format!(
                    "ranks {ra} and {rb} are the two dies of one NPU (the two ends of one \
                     link): one told primary and the other backup in one call"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;
    use crate::{Collective, Fabric, FabricConfig, NicSetFault, WORLD_GROUP};
    use proptest::prelude::*;
    use std::time::{Duration, Instant};
    use taskd_core::{GlobalRank, GroupRank, HcclCode, RankHal};

    fn gr(v: &[u32]) -> Vec<GroupRank> {
        v.iter().map(|x| GroupRank(*x)).collect()
    }

    #[test]
    fn a_full_round_switches_every_members_view() {
        // 2 nodes x 4 dies, tp 4: world, tp_0 {0..3}, tp_1 {4..7}, dp_j {j, j+4}.
        let f = fabric(2, 4, 4);
        warm_up(&f);
        // The operator moves node-1/dev-1 (rank 5) to its backup NIC. Every rank plans and
        // calls: all 8 on the world group, 4 on tp_1, 2 on dp_1.
        let calls = switch_all(&f, &[(5, true)]);
        assert_all_ok(&calls);
        assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 8 + 4 + 2);
        // Every member of every group of rank 5 now sees it on backup, nobody else.
        for m in 0..8 {
            assert_eq!(
                f.view(WORLD_GROUP, r(m)).unwrap(),
                [false, false, false, false, false, true, false, false]
            );
        }
        for m in [4, 5, 6, 7] {
            assert_eq!(f.view("tp_1", r(m)).unwrap(), [false, true, false, false]);
        }
        assert_eq!(f.view("dp_1", r(1)).unwrap(), [false, true]);
        assert_eq!(f.view("tp_0", r(0)).unwrap(), [false; 4]);
        let report = f.check_consistency();
        assert!(report.is_consistent(), "{report}");
        assert_eq!(report.groups_checked, 1 + 2 + 4);
        assert_eq!(f.ranks_on_backup(), [r(5)]);
        let log = f.nic_set_log();
        assert_eq!(log.len(), 14);
        assert!(log
            .iter()
            .all(|c| c.result == HcclCode::Success && c.applied));
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn mismatched_arguments_fail_every_member_with_e_para() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Rank 0 asks for itself on backup, rank 1 for itself: not the identical call.
        let res = on_ranks(&f, &[0, 1], |mut hal| {
            let me = hal.rank().0;
            hal.set_working_nic(WORLD_GROUP, &gr(&[me]), &[true])
        });
        assert_eq!(code(&res[0]), HcclCode::Para);
        assert_eq!(code(&res[1]), HcclCode::Para);
        assert_eq!(f.view(WORLD_GROUP, r(0)).unwrap(), [false, false]);
        assert_eq!(f.view(WORLD_GROUP, r(1)).unwrap(), [false, false]);
        assert!(f.check_consistency().is_consistent());
        let v = f.violations();
        assert!(v.len() == 1 && v[0].contains("mismatched"), "{v:?}");
    }

    #[test]
    fn groups_called_in_different_orders_time_out() {
        // world and tp_0 both hold ranks 0 and 1.
        let f = fabric_with_timeout(1, 2, 2, 100);
        warm_up(&f);
        std::thread::scope(|s| {
            // Rank 0 visits the world group first...
            let a = s.spawn(|| {
                f.rank_hal(r(0))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true])
            });
            assert!(f.wait_activity(Duration::from_secs(5), |a| a
                .waiting_in_nic_set
                .contains(&(WORLD_GROUP.to_owned(), r(0)))));
            // ...rank 1 visits tp_0 first: each waits for the other.
            let b = s.spawn(|| f.rank_hal(r(1)).set_working_nic("tp_0", &gr(&[0]), &[true]));
            assert_eq!(code(&a.join().unwrap()), HcclCode::Timeout);
            assert_eq!(code(&b.join().unwrap()), HcclCode::Timeout);
        });
        let v = f.violations();
        assert!(
            v.iter().any(|m| m.contains("order differs")
                && m.contains("rank 0 waits in hccl_world_group for rank 1")
                && m.contains("rank 1 waits in tp_0 for rank 0")),
            "{v:?}"
        );
        assert_eq!(f.view(WORLD_GROUP, r(0)).unwrap(), [false, false]);
        assert!(f.check_consistency().is_consistent());
    }

    #[test]
    fn a_round_a_dead_member_ends_is_not_an_order_violation() {
        // 1 node x 4 dies, tp 2: world {0..3}, tp_0 {0, 1}. Rank 0 has joined the world
        // group's round when rank 3 dies; rank 1 then finds the world group broken
        // (HCCL_E_REMOTE at once) and goes on to tp_0, where it waits for rank 0, before rank 0
        // looks again. Rank 0 leaves the world round with HCCL_E_REMOTE at its next look: the
        // same group order on both, nothing waits for ever.
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let f = fabric(1, 4, 2);
        warm_up(&f);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _in_runtime = rt.enter();
        let mut cx = Context::from_waker(Waker::noop());
        let (hal0, hal1) = (f.rank_hal(r(0)), f.rank_hal(r(1)));
        let (rank_0, backup) = (gr(&[0]), [true]);
        let mut world0 = Box::pin(hal0.set_working_nic_async(WORLD_GROUP, &rank_0, &backup));
        assert!(world0.as_mut().poll(&mut cx).is_pending());
        f.kill_rank(r(3));
        let mut world1 = Box::pin(hal1.set_working_nic_async(WORLD_GROUP, &rank_0, &backup));
        let Poll::Ready(res) = world1.as_mut().poll(&mut cx) else {
            panic!("a group with a dead member answers at once");
        };
        assert_eq!(code(&res), HcclCode::Remote);
        let mut tp1 = Box::pin(hal1.set_working_nic_async("tp_0", &rank_0, &backup));
        assert!(tp1.as_mut().poll(&mut cx).is_pending());
        assert!(f.violations().is_empty(), "{:?}", f.violations());
        let Poll::Ready(res) = world0.as_mut().poll(&mut cx) else {
            panic!("rank 0 leaves the broken round");
        };
        assert_eq!(code(&res), HcclCode::Remote);
        let mut tp0 = Box::pin(hal0.set_working_nic_async("tp_0", &rank_0, &backup));
        let Poll::Ready(res) = tp0.as_mut().poll(&mut cx) else {
            panic!("the last member completes tp_0's round");
        };
        assert_eq!(code(&res), HcclCode::Success);
        let Poll::Ready(res) = tp1.as_mut().poll(&mut cx) else {
            panic!("rank 1 has its answer");
        };
        assert_eq!(code(&res), HcclCode::Success);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn a_member_that_gave_up_on_a_round_is_not_an_order_violation() {
        // Ranks 2 and 3 never call. Rank 1 gives up on tp_0 first (rank 0 arrived 30 ms
        // later) and moves on to the world group while rank 0 still waits in tp_0: the same
        // group order on both, only the timeouts are staggered.
        let f = fabric_with_timeout(1, 4, 4, 100);
        warm_up(&f);
        f.inject_nic_set_fault(r(0), NicSetFault::Slow(Duration::from_millis(30)));
        let res = on_ranks(&f, &[0, 1], |mut hal| {
            let a = hal.set_working_nic("tp_0", &gr(&[0]), &[true]);
            let b = hal.set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
            (code(&a), code(&b))
        });
        assert_eq!(res, [(HcclCode::Timeout, HcclCode::Timeout); 2]);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn nic_set_before_any_collective_is_refused() {
        let f = fabric(1, 2, 2);
        // No warm-up: the world group has no transport links yet. Refused at once.
        let res = f
            .rank_hal(r(0))
            .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
        assert_eq!(code(&res), HcclCode::Internal);
        assert!(f.violations()[0].contains("has not run any collective"));
        assert_eq!(f.view(WORLD_GROUP, r(0)).unwrap(), [false, false]);
    }

    #[test]
    fn a_concurrent_call_on_one_rank_is_e_internal() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        std::thread::scope(|s| {
            let first = s.spawn(|| {
                f.rank_hal(r(0))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true])
            });
            assert!(
                f.wait_activity(Duration::from_secs(5), |a| a.in_nic_set == [r(0)]
                    && !a.waiting_in_nic_set.is_empty())
            );
            // A second thread of the same process calls while the first is inside HCCL.
            let second = f.rank_hal(r(0)).set_working_nic("tp_0", &gr(&[0]), &[true]);
            assert_eq!(code(&second), HcclCode::Internal);
            // The first call is unaffected and completes once rank 1 joins.
            let peer = f
                .rank_hal(r(1))
                .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
            assert!(peer.is_ok(), "{peer:?}");
            assert!(first.join().unwrap().is_ok());
        });
        let v = f.violations();
        assert!(v.len() == 1 && v[0].contains("concurrent"), "{v:?}");
        assert_eq!(f.view(WORLD_GROUP, r(1)).unwrap(), [true, false]);
    }

    #[test]
    fn l2_retry_off_or_no_rdma_is_a_silent_noop() {
        let l2_off = fabric(1, 2, 2);
        let no_rdma = Fabric::new(FabricConfig {
            rdma: false,
            tp_size: 2,
            ..FabricConfig::new(1, 2)
        });
        l2_off.set_l2_retry(r(0), false);
        l2_off.set_l2_retry(r(1), false);
        for f in [l2_off, no_rdma] {
            warm_up(&f);
            let mut hal = f.rank_hal(r(0));
            assert!(!hal.capabilities().can_switch());
            // Success at once, without a rendezvous (called from one thread, one rank at a
            // time) and without any change.
            for rank in [0, 1] {
                let res = f
                    .rank_hal(r(rank))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
                assert!(res.is_ok(), "{res:?}");
            }
            assert_eq!(f.view(WORLD_GROUP, r(0)).unwrap(), [false, false]);
            assert_eq!(f.view(WORLD_GROUP, r(1)).unwrap(), [false, false]);
            assert!(f.check_consistency().is_consistent());
            assert!(f.ranks_on_backup().is_empty());
            assert!(f
                .nic_set_log()
                .iter()
                .all(|c| c.result == HcclCode::Success && !c.applied));
        }
    }

    #[test]
    fn both_dies_of_one_npu_told_opposite_sides_is_e_para() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Ranks 0 and 1 are the two dies of one NPU: the two ends of one link.
        for rank in [0, 1] {
            let res =
                f.rank_hal(r(rank))
                    .set_working_nic(WORLD_GROUP, &gr(&[0, 1]), &[true, false]);
            assert_eq!(code(&res), HcclCode::Para);
            assert!(res.unwrap_err().detail.contains("two dies of one NPU"));
        }
        assert!(f.check_consistency().is_consistent());
        assert!(f.violations().is_empty());
    }

    #[test]
    fn partners_both_on_backup_swap_ports() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        assert_all_ok(&switch_all(&f, &[(0, true), (1, true)]));
        assert_eq!(f.ranks_on_backup(), [r(0), r(1)]);
        // Rank 0 now sends on port dev-1, rank 1 on port dev-0.
        f.set_link(0, taskd_core::DeviceId(0), false);
        let res = on_ranks(&f, &[0, 1], |hal| hal.all_reduce(WORLD_GROUP, 1.0));
        for x in &res {
            assert_eq!(code(x), HcclCode::RoceTransfer);
        }
        let detail = &res[0].as_ref().unwrap_err().detail;
        assert!(detail.contains("rank 1 sends on node-0/dev-0"), "{detail}");
        f.set_link(0, taskd_core::DeviceId(0), true);
        f.set_link(0, taskd_core::DeviceId(1), false);
        let res = on_ranks(&f, &[0, 1], |hal| hal.all_reduce(WORLD_GROUP, 1.0));
        let detail = &res[1].as_ref().unwrap_err().detail;
        assert!(detail.contains("rank 0 sends on node-0/dev-1"), "{detail}");
    }

    #[test]
    fn a_failing_member_splits_the_group_and_a_second_round_restores_it() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Rank 1's first call (hccl_world_group; dp_0 does not contain it) fails.
        f.inject_nic_set_fault(r(1), NicSetFault::Fail(HcclCode::Network));
        let calls = switch_all(&f, &[(0, true)]);
        assert!(calls[0].iter().all(|(_, res)| res.is_ok()), "{calls:?}");
        assert_eq!(calls[1][0].0, WORLD_GROUP);
        assert_eq!(code(&calls[1][0].1), HcclCode::Network);
        assert!(calls[1][1].1.is_ok());
        // Rank 0 applied, rank 1 did not: the world group disagrees.
        let report = f.check_consistency();
        assert!(!report.is_consistent());
        assert_eq!(report.disagreements[0].group, WORLD_GROUP);
        assert!(
            report
                .to_string()
                .contains("group rank 0 (rank 0): backup per ranks [0], primary per ranks [1]"),
            "{report}"
        );
        assert!(f.ranks_on_backup().is_empty());
        // The control plane repeats the round (or rolls back): agreement again.
        assert_all_ok(&switch_all(&f, &[(0, true)]));
        assert!(f.check_consistency().is_consistent());
        assert_eq!(f.ranks_on_backup(), [r(0)]);
        assert!(f.violations().is_empty());
    }

    #[test]
    fn hang_and_slow_faults_take_their_time() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        f.inject_nic_set_fault(
            r(1),
            NicSetFault::Hang {
                duration: Duration::from_millis(40),
                code: HcclCode::Timeout,
            },
        );
        f.inject_nic_set_fault(r(1), NicSetFault::Slow(Duration::from_millis(20)));
        // Round 1: rank 1 hangs 40 ms, then joins as a failed member; rank 0 waits and applies.
        let res = on_ranks(&f, &[0, 1], |mut hal| {
            let t = Instant::now();
            let res = hal.set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
            (res, t.elapsed())
        });
        assert!(res[0].0.is_ok());
        assert_eq!(code(&res[1].0), HcclCode::Timeout);
        assert!(res[1].1 >= Duration::from_millis(40));
        assert!(!f.check_consistency().is_consistent());
        // Round 2: rank 1 is slow but fine; the group agrees again.
        let res = on_ranks(&f, &[0, 1], |mut hal| {
            let t = Instant::now();
            let res = hal.set_working_nic(WORLD_GROUP, &gr(&[0]), &[true]);
            (res, t.elapsed())
        });
        assert!(res[0].0.is_ok() && res[1].0.is_ok());
        assert!(res[1].1 >= Duration::from_millis(20));
        assert_eq!(f.view(WORLD_GROUP, r(1)).unwrap(), [true, false]);
    }

    #[test]
    fn a_down_link_fails_collectives_until_that_rank_moves_to_backup() {
        let f = fabric(2, 4, 4);
        warm_up(&f);
        // node-1/dev-2 (rank 6) loses its port: every group of rank 6 fails, the rest run.
        f.set_link(1, taskd_core::DeviceId(2), false);
        for (rank, group, res) in step_all(&f) {
            let expect = if ["hccl_world_group", "tp_1", "dp_2"].contains(&group.as_str()) {
                HcclCode::RoceTransfer
            } else {
                HcclCode::Success
            };
            assert_eq!(code(&res), expect, "rank {rank} on {group}");
        }
        // Move rank 6 onto its backup NIC (dev-3's port, which is up).
        assert_all_ok(&switch_all(&f, &[(6, true)]));
        for (rank, group, res) in step_all(&f) {
            assert!(res.is_ok(), "rank {rank} on {group}: {res:?}");
        }
        assert!(f.check_consistency().is_consistent());
        assert_eq!(f.collectives_on_inconsistent_groups(), 0);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn switching_onto_a_down_link_fails_for_every_member() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        f.set_link(0, taskd_core::DeviceId(1), false); // rank 0's backup NIC
        for calls in switch_all(&f, &[(0, true)]) {
            for (group, res) in calls {
                assert_eq!(code(&res), HcclCode::RoceConnect, "{group}");
            }
        }
        assert!(f.check_consistency().is_consistent());
        assert!(f.ranks_on_backup().is_empty());
    }

    /// Every rank runs `op` once on the world group; the results, by rank.
    fn world(f: &std::sync::Arc<Fabric>, op: Collective) -> Vec<Result<f64, taskd_core::HalError>> {
        on_ranks(f, &all_ranks(f), |hal| {
            f.collective(WORLD_GROUP, hal.rank(), op, 1.0)
        })
    }

    #[test]
    fn only_operators_issued_before_a_switch_keep_it() {
        let f = fabric(1, 2, 2);
        warm_up(&f); // issues the training operator on every group
        let before = Collective::evaluation(1);
        assert!(world(&f, before).iter().all(Result::is_ok));
        assert_all_ok(&switch_all(&f, &[(0, true)]));
        // Issued before the call: switched; issued after: on the default NIC, on every member.
        let after = Collective::evaluation(2);
        assert!(world(&f, after).iter().all(Result::is_ok));
        for rank in [0, 1] {
            let view = |op| f.operator_view(WORLD_GROUP, r(rank), op).unwrap();
            assert_eq!(view(Collective::TRAINING), [true, false]);
            assert_eq!(view(before), [true, false]);
            assert_eq!(view(after), [false, false]);
        }
        assert_eq!(f.collectives_on_default_nic(), 1, "the new operator, once");
        // Running them again: the old ones on the switch, the new one on the default NIC.
        for op in [Collective::TRAINING, before, after] {
            assert!(world(&f, op).iter().all(Result::is_ok));
        }
        assert_eq!(f.collectives_on_default_nic(), 2);
        // A later call reaches the new operator too; switching back leaves nothing on default.
        assert_all_ok(&switch_all(&f, &[(0, false)]));
        assert!(world(&f, after).iter().all(Result::is_ok));
        assert_eq!(f.collectives_on_default_nic(), 2);
        // None of this is a disagreement: the invariant holds throughout.
        assert!(f.check_consistency().is_consistent());
        assert_eq!(f.collectives_on_inconsistent_groups(), 0);
        assert!(f.violations().is_empty(), "{:?}", f.violations());
    }

    #[test]
    fn a_new_operator_fails_on_the_primary_an_operator_took_down_for_maintenance() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        assert_all_ok(&switch_all(&f, &[(0, true)]));
        // The operator moved rank 0 off its NIC (dev-0) and takes that port down.
        f.set_link(0, taskd_core::DeviceId(0), false);
        assert!(world(&f, Collective::TRAINING).iter().all(Result::is_ok));
        let res = world(&f, Collective::evaluation(1));
        for x in &res {
            assert_eq!(code(x), HcclCode::RoceTransfer);
        }
        let detail = &res[0].as_ref().unwrap_err().detail;
        assert!(
            detail.contains("rank 0 sends on node-0/dev-0 (down)")
                && detail.contains("none on backup"),
            "{detail}"
        );
        assert_eq!(f.collectives_on_default_nic(), 1);
        assert!(f.check_consistency().is_consistent());
    }

    #[test]
    fn members_issuing_different_operators_in_one_round_fail_it() {
        let f = fabric(1, 2, 2);
        let res = on_ranks(&f, &[0, 1], |hal| {
            let op = Collective::evaluation(u64::from(hal.rank().0) + 1);
            f.collective(WORLD_GROUP, hal.rank(), op, 1.0)
        });
        for x in &res {
            assert_eq!(code(x), HcclCode::Para);
        }
        let v = f.violations();
        assert!(v.len() == 1 && v[0].contains("issued allreduce"), "{v:?}");
        // Each kept the operator it issued, on the default NIC: nothing disagrees.
        assert!(f.check_consistency().is_consistent());
    }

    #[test]
    fn members_holding_different_configurations_of_an_operator_are_inconsistent() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Rank 1's world call fails: the training operator is switched on rank 0 only.
        f.inject_nic_set_fault(r(1), NicSetFault::Fail(HcclCode::Network));
        switch_all(&f, &[(0, true)]);
        let report = f.check_consistency();
        let op_line = report
            .disagreements
            .iter()
            .find(|d| d.detail.starts_with("operator allreduce"))
            .unwrap_or_else(|| panic!("{report}"));
        assert_eq!(op_line.group, WORLD_GROUP);
        assert!(
            op_line
                .detail
                .contains("rank 0 has group ranks [0] on backup")
                && op_line.detail.contains("rank 1 has none on backup"),
            "{report}"
        );
    }

    #[test]
    fn collectives_on_disagreeing_views_are_counted() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        f.inject_nic_set_fault(r(1), NicSetFault::Fail(HcclCode::Network));
        switch_all(&f, &[(0, true)]);
        // Training resumed without a rollback: the world all-reduce runs on a split group.
        for (rank, group, res) in step_all(&f) {
            let expect = if group == WORLD_GROUP {
                HcclCode::Internal
            } else {
                HcclCode::Success
            };
            assert_eq!(code(&res), expect, "rank {rank} on {group}");
        }
        assert_eq!(f.collectives_on_inconsistent_groups(), 1);
        let v = f.violations();
        assert!(v.len() == 1 && v[0].contains("disagree"), "{v:?}");
    }

    #[test]
    fn a_killed_rank_fails_its_peers_with_e_remote() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        std::thread::scope(|s| {
            let waiting = s.spawn(|| f.all_reduce(WORLD_GROUP, r(1), 1.0));
            assert!(f.wait_activity(Duration::from_secs(5), |a| a
                .waiting_in_collective
                .contains(&(WORLD_GROUP.to_owned(), r(1)))));
            f.kill_rank(r(0));
            assert_eq!(code(&waiting.join().unwrap()), HcclCode::Remote);
        });
        // Later calls: the dead process has no communicators, its peers see a lost peer.
        assert_eq!(
            code(&f.all_reduce(WORLD_GROUP, r(0), 1.0)),
            HcclCode::NotFound
        );
        assert_eq!(code(&f.rank_hal(r(0)).groups()), HcclCode::NotFound);
        let res = f
            .rank_hal(r(1))
            .set_working_nic(WORLD_GROUP, &gr(&[1]), &[true]);
        assert_eq!(code(&res), HcclCode::Remote);
        // dp_1 = {1} has no dead member and still works.
        assert!(f.all_reduce("dp_1", r(1), 1.0).is_ok());
        assert!(f.check_consistency().is_consistent());
    }

    #[test]
    fn shutdown_wakes_every_waiter() {
        let f = Fabric::new(FabricConfig {
            tp_size: 2,
            ..FabricConfig::new(1, 2)
        }); // the default 120 s timeout
        warm_up(&f);
        f.inject_nic_set_fault(
            r(1),
            NicSetFault::Hang {
                duration: Duration::from_secs(3600),
                code: HcclCode::Timeout,
            },
        );
        let t = Instant::now();
        std::thread::scope(|s| {
            let nic = s.spawn(|| {
                f.rank_hal(r(0))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true])
            });
            let hung = s.spawn(|| {
                f.rank_hal(r(1))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true])
            });
            let coll = s.spawn(|| f.all_reduce("tp_0", r(0), 1.0));
            assert!(
                f.wait_activity(Duration::from_secs(5), |a| a.in_nic_set.len() == 2
                    && a.waiting_in_collective.len() == 1)
            );
            f.shutdown();
            assert_eq!(code(&nic.join().unwrap()), HcclCode::Unavail);
            assert_eq!(code(&hung.join().unwrap()), HcclCode::Unavail);
            assert_eq!(code(&coll.join().unwrap()), HcclCode::Unavail);
        });
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            code(&f.all_reduce(WORLD_GROUP, r(0), 1.0)),
            HcclCode::Unavail
        );
    }

    #[test]
    fn a_timed_out_collective_fails_late_arrivals_and_keeps_counts_aligned() {
        let f = fabric_with_timeout(1, 2, 2, 50);
        // Rank 0 all-reduces alone and gives up; rank 1 arrives late at the same round.
        assert_eq!(
            code(&f.all_reduce(WORLD_GROUP, r(0), 1.0)),
            HcclCode::Timeout
        );
        assert_eq!(
            code(&f.all_reduce(WORLD_GROUP, r(1), 1.0)),
            HcclCode::Timeout
        );
        // The next round pairs them again.
        let res = on_ranks(&f, &[0, 1], |hal| hal.all_reduce(WORLD_GROUP, 2.0));
        assert_eq!(res[0].as_ref().unwrap(), &4.0);
        assert_eq!(res[1].as_ref().unwrap(), &4.0);
    }

    #[test]
    fn bad_arguments_are_refused_before_any_rendezvous() {
        let f = fabric(1, 4, 2);
        warm_up(&f);
        let mut hal = f.rank_hal(r(0));
        let mut call = |g: &str, ranks: &[u32], flags: &[bool]| {
            code(&hal.set_working_nic(g, &gr(ranks), flags))
        };
        assert_eq!(call(WORLD_GROUP, &[0, 1], &[true]), HcclCode::Para);
        assert_eq!(call(WORLD_GROUP, &[], &[]), HcclCode::Para);
        assert_eq!(call(WORLD_GROUP, &[4], &[true]), HcclCode::Para);
        assert_eq!(call(WORLD_GROUP, &[2, 2], &[true, false]), HcclCode::Para);
        assert_eq!(call("tp_9", &[0], &[true]), HcclCode::NotFound);
        assert_eq!(call("tp_1", &[0], &[true]), HcclCode::NotFound); // not a member
        assert_eq!(f.nic_set_log().len(), 6);
        assert!(f.violations().is_empty());
        assert_eq!(
            code(
                &f.rank_hal(GlobalRank(9))
                    .set_working_nic(WORLD_GROUP, &gr(&[0]), &[true])
            ),
            HcclCode::NotFound
        );
    }

    /// A random well-formed switch for a small fabric: distinct ranks, partners never told
    /// opposite sides in one command.
    fn switches(world: u32) -> impl Strategy<Value = Vec<Vec<(u32, bool)>>> {
        let one = proptest::collection::vec((0..world, any::<bool>()), 1..5).prop_map(|ts| {
            let mut out: Vec<(u32, bool)> = Vec::new();
            for (rank, b) in ts {
                let clash = out
                    .iter()
                    .any(|(o, ob)| *o == rank || (*o == rank ^ 1 && *ob != b));
                if !clash {
                    out.push((rank, b));
                }
            }
            out
        });
        proptest::collection::vec(one, 1..5)
    }

    fn fabric_shape() -> impl Strategy<Value = (u32, u32, u32)> {
        (1u32..3, prop_oneof![Just(2u32), Just(4)]).prop_flat_map(|(nodes, d)| {
            let tps: Vec<u32> = (1..=d).filter(|t| d % t == 0).collect();
            (Just(nodes), Just(d), proptest::sample::select(tps))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// Whatever sequence of well-formed switches the control plane runs (every rank
        /// planning with the core planner), every group stays consistent and the ranks on
        /// backup are exactly those a simple model predicts.
        #[test]
        fn well_formed_rounds_keep_every_group_consistent(
            ((nodes, d, tp), ops) in fabric_shape().prop_flat_map(|s| (Just(s), switches(s.0 * s.1)))
        ) {
            let f = fabric(nodes, d, tp);
            warm_up(&f);
            let mut model = vec![false; (nodes * d) as usize];
            for op in &ops {
                assert_all_ok(&switch_all(&f, op));
                for (rank, b) in op {
                    model[*rank as usize] = *b;
                }
                let report = f.check_consistency();
                prop_assert!(report.is_consistent(), "{}", report);
                let expect: Vec<GlobalRank> = model
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b)
                    .map(|(rank, _)| GlobalRank(rank as u32))
                    .collect();
                prop_assert_eq!(f.ranks_on_backup(), expect);
            }
            // Training still runs: every working port is up.
            for (rank, group, res) in step_all(&f) {
                prop_assert!(res.is_ok(), "rank {} on {}: {:?}", rank, group, res);
            }
            prop_assert!(f.violations().is_empty(), "{:?}", f.violations());
        }
    }
}
