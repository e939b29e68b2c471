//! The simulated hardware: nodes, NPU dies, their NIC ports, HCCL groups and each member's
//! view of its group's NIC configuration, plus the consistency check every test ends with.
//!
//! All state sits behind one mutex. A call that waits (a rendezvous, an injected hang) leaves
//! its waker where the event it waits for happens (the round it joined, its rank's slot) and is
//! woken by that event alone, or by one that ends every wait (shutdown, a process killed); it
//! then re-checks its own condition, so there is no polling and no lost wake-up, and a round of
//! 16,384 members wakes each of them once. Every change also bumps a generation counter and
//! notifies one condition variable, for observers ([`Fabric::wait_activity`]).

use crate::fault::{NicSetFault, NicSetRecord};
use crate::operator::{self, Collective, OperatorViews};
use crate::view::BackupSet;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};
use taskd_core::{DeviceId, GlobalRank, GroupInfo, GroupRank, HcclCode, NodeName};

/// How many NIC-set calls [`Fabric::nic_set_log`] keeps (about 150 bytes each): every call of
/// an operation even at 16,384 ranks (three groups a rank).
pub const NIC_SET_LOG_LEN: usize = 1 << 16;

/// Name of the world group, as HCCL names it.
pub const WORLD_GROUP: &str = "hccl_world_group";

/// At most this many violation messages are kept; the rest are only counted, so a training
/// loop that keeps running on a broken group cannot exhaust memory.
const MAX_VIOLATIONS: usize = 1000;

/// Shape and HCCL settings of a simulated job.
///
/// Why a plain struct with public fields: tests tweak one knob (a 50 ms HCCL timeout, no
/// RDMA) on top of [`FabricConfig::new`]'s defaults with struct-update syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// Number of nodes (servers); node `i` is named `node-{i}`.
    pub nodes: u32,
    /// NPU dies per node, one rank each: rank = node_index * devices_per_node + device.
    pub devices_per_node: u32,
    /// Tensor-parallel group size. Must divide `devices_per_node`, so tensor-parallel groups
    /// never span nodes (as in real deployments). Default `min(8, devices_per_node)`.
    pub tp_size: u32,
    /// Whether the topology has RDMA links. Without them HCCL's NIC set is a silent no-op.
    /// Default `true`.
    pub rdma: bool,
    /// How long a rank waits in a rendezvous (NIC set, collective) for its peers before it
    /// gives up with `HCCL_E_TIMEOUT`. Default 120 s, like `HCCL_CONNECT_TIMEOUT`.
    pub hccl_timeout: Duration,
}

impl FabricConfig {
    /// A fabric of `nodes` x `devices_per_node` with the defaults documented on each field.
    pub fn new(nodes: u32, devices_per_node: u32) -> Self {
        FabricConfig {
            nodes,
            devices_per_node,
            tp_size: devices_per_node.clamp(1, 8),
            rdma: true,
            hccl_timeout: Duration::from_secs(120),
        }
    }
}

/// Whether every HCCL group agrees on its NIC configuration, and where it does not.
///
/// Why: resuming training with members that disagree hangs or corrupts it, so this is the
/// invariant every test (and every simulated operation) ends by checking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsistencyReport {
    /// How many groups were examined.
    pub groups_checked: usize,
    /// Every disagreement found: inside a group, or between groups about one rank.
    pub disagreements: Vec<GroupDisagreement>,
}

impl ConsistencyReport {
    /// `true` when nothing disagrees.
    pub fn is_consistent(&self) -> bool {
        self.disagreements.is_empty()
    }
}

impl fmt::Display for ConsistencyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_consistent() {
            return write!(f, "all {} groups consistent", self.groups_checked);
        }
        write!(
            f,
            "{} disagreement(s) in {} groups:",
            self.disagreements.len(),
            self.groups_checked
        )?;
        for d in &self.disagreements {
            write!(f, "\n  {}: {}", d.group, d.detail)?;
        }
        Ok(())
    }
}

/// One disagreement: which group (or groups, comma-separated, for a disagreement between
/// groups about one rank) and what differs, naming the members.
///
/// Why: a failed test must say which rank holds which view, not only "inconsistent".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDisagreement {
    /// The group name, or `a,b,...` when groups disagree with each other.
    pub group: String,
    /// Human-readable: which group ranks are seen differently and by whom.
    pub detail: String,
}

/// What the simulated processes are doing right now, for tests that must wait until a rank
/// is blocked somewhere (instead of sleeping and hoping).
///
/// Why: deadlocks and concurrency rules can only be tested deterministically if the test can
/// observe "rank 3 is now waiting in the rendezvous of group X".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Bumped on every state change of the fabric.
    pub generation: u64,
    /// Ranks inside a NIC-set call (at any stage, including an injected hang).
    pub in_nic_set: Vec<GlobalRank>,
    /// `(group, rank)` of members that joined a NIC-set rendezvous and wait for peers.
    pub waiting_in_nic_set: Vec<(String, GlobalRank)>,
    /// `(group, rank)` of members inside a collective (all-reduce) on that group.
    pub waiting_in_collective: Vec<(String, GlobalRank)>,
}

/// The simulated cluster: topology, NIC ports, HCCL groups, processes, faults and the rule
/// book of what went wrong. Share it as `Arc<Fabric>`; hand [`Fabric::rank_hal`]s to workers
/// and [`Fabric::node_hal`]s to proxies, drive faults from the test.
///
/// Why one object: every rendezvous, link and fault interacts, and one lock makes every
/// interleaving a test provokes well defined.
pub struct Fabric {
    pub(crate) cfg: FabricConfig,
    pub(crate) state: Mutex<State>,
    pub(crate) cv: Condvar,
}

/// Per-member state of one NIC-set rendezvous.
#[derive(Clone, Debug)]
pub(crate) struct NicArrival {
    pub ranks: Vec<GroupRank>,
    pub use_backup: Vec<bool>,
    /// Set when an injected fault makes this member fail at completion.
    pub fault: Option<HcclCode>,
}

/// What a member gets back from a completed NIC-set round.
#[derive(Clone, Debug)]
pub(crate) struct NicResult {
    pub code: HcclCode,
    pub detail: String,
    pub applied: bool,
}

/// One collective round of a group, keyed by sequence number.
#[derive(Clone, Debug)]
pub(crate) struct CollectiveRound {
    /// The operator the first member to arrive issued.
    pub op: Collective,
    pub values: Vec<Option<f64>>,
    /// Members whose value is in `values`.
    pub arrived: usize,
    pub outcome: Option<Result<f64, (HcclCode, String)>>,
    pub consumed: Vec<bool>,
    /// Members that took the outcome (the round is dropped when all have).
    pub consumed_count: usize,
    /// Members waiting for the outcome: woken when it is decided.
    pub wakers: Vec<Option<Waker>>,
}

impl CollectiveRound {
    pub(crate) fn new(n: usize, op: Collective) -> Self {
        CollectiveRound {
            op,
            values: vec![None; n],
            arrived: 0,
            outcome: None,
            consumed: vec![false; n],
            consumed_count: 0,
            wakers: vec![None; n],
        }
    }

    /// Wakes every member waiting for this round.
    pub(crate) fn wake(&mut self) {
        self.wakers
            .iter_mut()
            .filter_map(Option::take)
            .for_each(Waker::wake);
    }
}

/// HCCL state of one communicator (group), per member.
#[derive(Clone, Debug)]
pub(crate) struct GroupState {
    pub name: String,
    /// Ascending (every group is built so), which [`GroupState::member_index`] relies on.
    pub members: Vec<GlobalRank>,
    /// `views[m]`: the group ranks the NIC-set calls member `m` applied put on their backup
    /// NIC: the group's set configuration as `m` holds it (see [`crate::operator`]).
    pub views: Vec<BackupSet>,
    /// Per member, the configuration of each operator it issued on this group.
    pub op_views: Vec<OperatorViews>,
    /// Whether member `m`'s communicator ran at least one collective.
    pub ran_op: Vec<bool>,
    /// The open NIC-set round: one slot per member.
    pub nic_round: Vec<Option<NicArrival>>,
    /// Members in the open round (`Some` in `nic_round`).
    pub nic_arrived: usize,
    pub nic_round_id: u64,
    /// Member joined the open round and gave up on it (timeout, lost peer, shutdown).
    pub nic_left: Vec<bool>,
    /// Members waiting in the open round: woken when it completes.
    pub nic_wakers: Vec<Option<Waker>>,
    /// Results of completed rounds, waiting to be picked up: `(round id, result)`.
    pub nic_results: Vec<Option<(u64, NicResult)>>,
    /// Next all-reduce sequence number of each member.
    pub ar_next_seq: Vec<u64>,
    pub ar_rounds: BTreeMap<u64, CollectiveRound>,
    /// Member is inside an all-reduce on this group.
    pub ar_in_flight: Vec<bool>,
}

impl GroupState {
    fn new(name: String, members: Vec<GlobalRank>) -> Self {
        let n = members.len();
        GroupState {
            name,
            members,
            views: vec![BackupSet::default(); n],
            op_views: vec![OperatorViews::new(); n],
            ran_op: vec![false; n],
            nic_round: vec![None; n],
            nic_arrived: 0,
            nic_round_id: 0,
            nic_left: vec![false; n],
            nic_wakers: vec![None; n],
            nic_results: vec![None; n],
            ar_next_seq: vec![0; n],
            ar_rounds: BTreeMap::new(),
            ar_in_flight: vec![false; n],
        }
    }

    pub(crate) fn member_index(&self, rank: GlobalRank) -> Option<usize> {
        self.members.binary_search(&rank).ok()
    }

    /// Wakes every member waiting in the open NIC-set round.
    pub(crate) fn wake_nic_round(&mut self) {
        self.nic_wakers
            .iter_mut()
            .filter_map(Option::take)
            .for_each(Waker::wake);
    }

    pub(crate) fn info(&self) -> GroupInfo {
        GroupInfo {
            name: self.name.clone(),
            members: self.members.clone(),
        }
    }
}

/// Everything mutable, behind [`Fabric::state`].
pub(crate) struct State {
    /// Physical NIC port of each device, indexed like global ranks.
    pub ports_up: Vec<bool>,
    pub l2_retry: Vec<bool>,
    pub dead: Vec<bool>,
    /// How many ranks were killed (0: no group can have a dead member).
    pub killed: usize,
    /// The group a rank's NIC-set call in progress names (`Some` while inside the call).
    pub nic_call: Vec<Option<String>>,
    pub faults: Vec<VecDeque<NicSetFault>>,
    /// A rank whose call is held by an injected hang or slowness: woken if it dies or the
    /// simulation ends.
    pub delay_wakers: Vec<Option<Waker>>,
    pub groups: Vec<GroupState>,
    pub by_name: HashMap<String, usize>,
    /// Indices into `groups` of each rank's groups, in the fixed global order.
    pub rank_groups: Vec<Vec<usize>>,
    pub shut_down: bool,
    pub generation: u64,
    /// The newest [`NIC_SET_LOG_LEN`] NIC-set calls, oldest first.
    pub log: VecDeque<NicSetRecord>,
    pub violations: Vec<String>,
    pub violations_dropped: u64,
    pub inconsistent_collectives: u64,
    pub default_nic_collectives: u64,
}

impl State {
    pub(crate) fn violation(&mut self, msg: String) {
        tracing::warn!(violation = %msg, "HCCL rule violated in the simulation");
        if self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(msg);
        } else {
            self.violations_dropped += 1;
        }
    }

    pub(crate) fn any_member_dead(&self, gi: usize) -> Option<GlobalRank> {
        if self.killed == 0 {
            return None;
        }
        self.groups[gi]
            .members
            .iter()
            .copied()
            .find(|m| self.dead[m.0 as usize])
    }

    /// Wakes every call that waits anywhere: something that ends every wait happened (the
    /// simulation ended, a process died).
    pub(crate) fn wake_everyone(&mut self) {
        self.delay_wakers
            .iter_mut()
            .filter_map(Option::take)
            .for_each(Waker::wake);
        for g in &mut self.groups {
            g.wake_nic_round();
            g.ar_rounds.values_mut().for_each(CollectiveRound::wake);
        }
    }
}

/// The groups of a job, in the fixed global order: world, `tp_*`, `dp_*`.
fn build_groups(cfg: &FabricConfig) -> Vec<GroupState> {
    let world = cfg.nodes * cfg.devices_per_node;
    let tp = cfg.tp_size;
    let mut groups = vec![GroupState::new(
        WORLD_GROUP.to_owned(),
        (0..world).map(GlobalRank).collect(),
    )];
    for i in 0..world / tp {
        groups.push(GroupState::new(
            format!("tp_{i}"),
            (i * tp..(i + 1) * tp).map(GlobalRank).collect(),
        ));
    }
    for j in 0..tp {
        groups.push(GroupState::new(
            format!("dp_{j}"),
            (0..world / tp).map(|c| GlobalRank(c * tp + j)).collect(),
        ));
    }
    groups
}

/// `backup = [1, 4]` (group ranks on backup) or `none on backup`.
pub(crate) fn fmt_backup(v: &BackupSet) -> String {
    let on: Vec<String> = v.iter().map(|i| i.to_string()).collect();
    if on.is_empty() {
        "none on backup".to_owned()
    } else {
        format!("group ranks [{}] on backup", on.join(", "))
    }
}

/// `now + d`, or `None` (wait forever) when that overflows.
pub(crate) fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

impl Fabric {
    /// Builds the fabric: every port up, L2 retry on for every rank, every member's view
    /// "all primary", no group has run a collective yet.
    ///
    /// # Panics
    /// If `nodes` or `devices_per_node` is 0, or `tp_size` is 0 or does not divide
    /// `devices_per_node`: a simulation of an impossible job is a bug in the test.
    pub fn new(cfg: FabricConfig) -> Arc<Fabric> {
        assert!(cfg.nodes > 0, "a fabric needs at least one node");
        assert!(cfg.devices_per_node > 0, "a node needs at least one device");
        assert!(
            cfg.tp_size > 0 && cfg.devices_per_node % cfg.tp_size == 0,
            "tp_size {} must divide devices_per_node {}",
            cfg.tp_size,
            cfg.devices_per_node
        );
        let world = (cfg.nodes * cfg.devices_per_node) as usize;
        let groups = build_groups(&cfg);
        let by_name = groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.clone(), i))
            .collect();
        let mut rank_groups = vec![Vec::new(); world];
        for (gi, g) in groups.iter().enumerate() {
            for m in &g.members {
                rank_groups[m.0 as usize].push(gi);
            }
        }
        Arc::new(Fabric {
            cfg,
            state: Mutex::new(State {
                ports_up: vec![true; world],
                l2_retry: vec![true; world],
                dead: vec![false; world],
                killed: 0,
                nic_call: vec![None; world],
                faults: vec![VecDeque::new(); world],
                delay_wakers: vec![None; world],
                groups,
                by_name,
                rank_groups,
                shut_down: false,
                generation: 0,
                log: VecDeque::new(),
                violations: Vec::new(),
                violations_dropped: 0,
                inconsistent_collectives: 0,
                default_nic_collectives: 0,
            }),
            cv: Condvar::new(),
        })
    }

    /// The configuration the fabric was built with.
    pub fn config(&self) -> &FabricConfig {
        &self.cfg
    }

    /// Number of ranks (nodes x devices per node).
    pub fn world_size(&self) -> u32 {
        self.cfg.nodes * self.cfg.devices_per_node
    }

    /// The name of node `node_index` (`node-{i}`), as [`taskd_core::RankTable::uniform`]
    /// names it, so a rank table and a fabric of the same shape line up.
    pub fn node_name(&self, node_index: u32) -> NodeName {
        NodeName::uniform(node_index)
    }

    /// Where rank `rank` runs: `(node index, device)`, or `None` outside the fabric.
    pub fn location(&self, rank: GlobalRank) -> Option<(u32, DeviceId)> {
        (rank.0 < self.world_size()).then(|| {
            (
                rank.0 / self.cfg.devices_per_node,
                DeviceId(rank.0 % self.cfg.devices_per_node),
            )
        })
    }

    /// The rank on the other die of the same NPU ([`DeviceId::partner`]), whose NIC is this
    /// rank's backup NIC; `None` for the last device of an odd-sized node.
    pub fn partner(&self, rank: GlobalRank) -> Option<GlobalRank> {
        let (node, dev) = self.location(rank)?;
        let p = dev.partner().0;
        (p < self.cfg.devices_per_node).then(|| GlobalRank(node * self.cfg.devices_per_node + p))
    }

    /// The groups `rank` belongs to, in the fixed global order (world, tp, dp), members in
    /// group-rank order. Empty for a rank outside the fabric.
    pub fn groups_of(&self, rank: GlobalRank) -> Vec<GroupInfo> {
        let st = self.state.lock();
        st.rank_groups
            .get(rank.0 as usize)
            .map(|gs| gs.iter().map(|gi| st.groups[*gi].info()).collect())
            .unwrap_or_default()
    }

    /// The names of the groups `rank` belongs to, in the fixed global order: what a training
    /// loop needs, without copying member lists (the world group of a large job has tens of
    /// thousands).
    pub fn group_names_of(&self, rank: GlobalRank) -> Vec<String> {
        let st = self.state.lock();
        st.rank_groups
            .get(rank.0 as usize)
            .map(|gs| gs.iter().map(|gi| st.groups[*gi].name.clone()).collect())
            .unwrap_or_default()
    }

    /// Every group of the job, in the fixed global order.
    pub fn all_groups(&self) -> Vec<GroupInfo> {
        self.state
            .lock()
            .groups
            .iter()
            .map(GroupState::info)
            .collect()
    }

    /// Brings the physical NIC port of `(node_index, device)` up or down. That port is the
    /// device's primary NIC and its partner die's backup NIC.
    ///
    /// # Panics
    /// If the device does not exist.
    pub fn set_link(&self, node_index: u32, device: DeviceId, up: bool) {
        assert!(
            node_index < self.cfg.nodes && device.0 < self.cfg.devices_per_node,
            "no device {device} on node {node_index}"
        );
        let port = (node_index * self.cfg.devices_per_node + device.0) as usize;
        let mut st = self.state.lock();
        tracing::info!(node = node_index, device = device.0, up, "sim: link state");
        st.ports_up[port] = up;
        self.bump(&mut st);
    }

    /// Whether the physical port of `(node_index, device)` is up (`false` if it does not
    /// exist).
    pub fn link_up(&self, node_index: u32, device: DeviceId) -> bool {
        if node_index >= self.cfg.nodes || device.0 >= self.cfg.devices_per_node {
            return false;
        }
        self.state.lock().ports_up[(node_index * self.cfg.devices_per_node + device.0) as usize]
    }

    /// Sets `HCCL_OP_RETRY_ENABLE` L2 for one process (default on). With it off, the rank's
    /// NIC-set calls return success and change nothing, as HCCL does.
    pub fn set_l2_retry(&self, rank: GlobalRank, enabled: bool) {
        let mut st = self.state.lock();
        if let Some(f) = st.l2_retry.get_mut(rank.0 as usize) {
            *f = enabled;
        }
        self.bump(&mut st);
    }

    /// Whether `rank`'s HCCL has L2 retry on (`false` for a rank outside the fabric).
    pub fn l2_retry(&self, rank: GlobalRank) -> bool {
        self.state
            .lock()
            .l2_retry
            .get(rank.0 as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Queues a fault for `rank`'s next NIC-set call (each fault is used by one call).
    pub fn inject_nic_set_fault(&self, rank: GlobalRank, fault: NicSetFault) {
        let mut st = self.state.lock();
        if let Some(q) = st.faults.get_mut(rank.0 as usize) {
            tracing::info!(rank = rank.0, ?fault, "sim: fault injected");
            q.push_back(fault);
        }
    }

    /// Drops every queued fault no call has used yet, of every rank; returns how many.
    ///
    /// Why: a fault campaign ends each schedule by proving the job still switches, which a
    /// fault left over from an operation that never reached its call would spoil.
    pub fn clear_nic_set_faults(&self) -> usize {
        let mut st = self.state.lock();
        let n = st.faults.iter().map(VecDeque::len).sum();
        st.faults.iter_mut().for_each(VecDeque::clear);
        n
    }

    /// The process of `rank` dies: its pending and future calls fail with
    /// `HCCL_E_NOT_FOUND` (its communicators are gone), and peers that wait for it, or call
    /// into a group it belongs to, get `HCCL_E_REMOTE`. Its views no longer count in
    /// [`Fabric::check_consistency`].
    pub fn kill_rank(&self, rank: GlobalRank) {
        let mut st = self.state.lock();
        if let Some(d) = st.dead.get_mut(rank.0 as usize) {
            tracing::info!(rank = rank.0, "sim: process killed");
            if !*d {
                *d = true;
                st.killed += 1;
            }
        }
        st.wake_everyone();
        self.bump(&mut st);
    }

    /// Whether `rank` was killed.
    pub fn is_dead(&self, rank: GlobalRank) -> bool {
        self.state
            .lock()
            .dead
            .get(rank.0 as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Ends the simulation: every waiter (NIC set, collective, injected hang) returns
    /// `HCCL_E_UNAVAIL` promptly, and so does every later call.
    pub fn shutdown(&self) {
        let mut st = self.state.lock();
        st.shut_down = true;
        st.wake_everyone();
        self.bump(&mut st);
    }

    /// Whether [`Fabric::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.state.lock().shut_down
    }

    /// Member `rank`'s view of `group`'s set NIC configuration (`use_backup` per group rank:
    /// what the NIC-set calls it applied say), or `None` if it is not a member.
    pub fn view(&self, group: &str, rank: GlobalRank) -> Option<Vec<bool>> {
        let st = self.state.lock();
        let g = &st.groups[*st.by_name.get(group)?];
        Some(g.views[g.member_index(rank)?].to_dense(g.members.len()))
    }

    /// Member `rank`'s configuration of operator `op` on `group`: `None` if it is not a member
    /// or has not issued `op` there (see [`crate::operator`]).
    pub fn operator_view(
        &self,
        group: &str,
        rank: GlobalRank,
        op: Collective,
    ) -> Option<Vec<bool>> {
        let st = self.state.lock();
        let g = &st.groups[*st.by_name.get(group)?];
        g.op_views[g.member_index(rank)?]
            .get(&op)
            .map(|v| v.to_dense(g.members.len()))
    }

    /// Checks the three conditions of "consistent" ([`crate::operator`]): every group's live
    /// members hold identical set configurations, and identical configurations of every
    /// operator they issued; all groups of a rank agree about that rank's NIC.
    pub fn check_consistency(&self) -> ConsistencyReport {
        let st = self.state.lock();
        let mut disagreements = Vec::new();
        // What each internally consistent group says about each of its members.
        let mut says: Vec<Vec<(usize, bool)>> = vec![Vec::new(); st.dead.len()];
        for (gi, g) in st.groups.iter().enumerate() {
            let live: Vec<usize> = (0..g.members.len())
                .filter(|m| !st.dead[g.members[*m].0 as usize])
                .collect();
            if let Some(d) = Self::set_disagreement(g, &live) {
                disagreements.push(d);
            }
            // Group ranks some live member has on backup: only they can be contested.
            let mut contested: Vec<usize> = live.iter().flat_map(|m| g.views[*m].iter()).collect();
            contested.sort_unstable();
            contested.dedup();
            if live.is_empty() {
                continue;
            }
            for (gr, member) in g.members.iter().enumerate() {
                let on = contested.binary_search(&gr).is_ok();
                let agreed = !on || live.iter().all(|m| g.views[*m].contains(gr));
                if agreed {
                    says[member.0 as usize].push((gi, on));
                }
            }
        }
        disagreements.extend(Self::operator_disagreements(&st));
        for (rank, s) in says.iter().enumerate() {
            if s.iter().any(|x| x.1) && s.iter().any(|x| !x.1) {
                let side = |b: bool| if b { "backup" } else { "primary" };
                disagreements.push(GroupDisagreement {
                    group: s
                        .iter()
                        .map(|(gi, _)| st.groups[*gi].name.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    detail: format!(
                        "rank {rank}: {}",
                        s.iter()
                            .map(|(gi, b)| format!("{} says {}", st.groups[*gi].name, side(*b)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
        ConsistencyReport {
            groups_checked: st.groups.len(),
            disagreements,
        }
    }

    /// The live members of `g` (indices) that do not hold one set configuration: per group
    /// rank they disagree about, who has it on backup and who on primary.
    fn set_disagreement(g: &GroupState, live: &[usize]) -> Option<GroupDisagreement> {
        let first = &g.views[*live.first()?];
        if live.iter().all(|m| g.views[*m] == *first) {
            return None;
        }
        let mut contested: Vec<usize> = live.iter().flat_map(|m| g.views[*m].iter()).collect();
        contested.sort_unstable();
        contested.dedup();
        let names = |ms: &[usize]| {
            ms.iter()
                .map(|m| g.members[*m].0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let details: Vec<String> = contested
            .into_iter()
            .filter_map(|gr| {
                let (backup, primary): (Vec<usize>, Vec<usize>) =
                    live.iter().partition(|m| g.views[**m].contains(gr));
                (!primary.is_empty()).then(|| {
                    format!(
                        "group rank {gr} (rank {}): backup per ranks [{}], primary per ranks [{}]",
                        g.members[gr],
                        names(&backup),
                        names(&primary)
                    )
                })
            })
            .collect();
        Some(GroupDisagreement {
            group: g.name.clone(),
            detail: details.join("; "),
        })
    }

    /// Live members of a group holding different configurations of one operator.
    fn operator_disagreements(st: &State) -> Vec<GroupDisagreement> {
        let mut out = Vec::new();
        for g in &st.groups {
            let live: Vec<usize> = (0..g.members.len())
                .filter(|m| !st.dead[g.members[*m].0 as usize])
                .collect();
            for (op, held) in operator::disagreements(&g.op_views, &live) {
                let who: Vec<String> = held
                    .iter()
                    .map(|(m, v)| format!("rank {} has {}", g.members[*m], fmt_backup(v)))
                    .collect();
                out.push(GroupDisagreement {
                    group: g.name.clone(),
                    detail: format!("operator {op}: {}", who.join(", ")),
                });
            }
        }
        out
    }

    /// Ranks that every live member of every one of their groups sees on the backup NIC,
    /// sorted. This is what the manager's NIC table must match after an operation.
    pub fn ranks_on_backup(&self) -> Vec<GlobalRank> {
        let st = self.state.lock();
        // Per group: `None` without a live member, else the group ranks every live member
        // has on backup.
        let agreed: Vec<Option<BackupSet>> = st
            .groups
            .iter()
            .map(|g| {
                let mut live = (0..g.members.len())
                    .filter(|m| !st.dead[g.members[*m].0 as usize])
                    .map(|m| &g.views[m]);
                let mut common = live.next()?.clone();
                for v in live {
                    for gr in common.iter().collect::<Vec<_>>() {
                        if !v.contains(gr) {
                            common.set(gr, false);
                        }
                    }
                }
                Some(common)
            })
            .collect();
        let mut candidates: Vec<GlobalRank> = agreed
            .iter()
            .zip(&st.groups)
            .filter_map(|(a, g)| a.as_ref().map(|a| (a, g)))
            .flat_map(|(a, g)| a.iter().map(|gr| g.members[gr]))
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        candidates
            .into_iter()
            .filter(|r| {
                st.rank_groups[r.0 as usize].iter().all(|gi| {
                    let g = &st.groups[*gi];
                    let gr = g
                        .member_index(*r)
                        .expect("rank_groups lists only groups the rank belongs to");
                    agreed[*gi].as_ref().map_or(true, |a| a.contains(gr))
                })
            })
            .collect()
    }

    /// The NIC-set calls so far, in the order they returned: the newest [`NIC_SET_LOG_LEN`]
    /// (a simulator serving for hours forgets the oldest, so its memory stays flat).
    pub fn nic_set_log(&self) -> Vec<NicSetRecord> {
        self.state.lock().log.iter().cloned().collect()
    }

    /// Every HCCL rule violation seen (concurrent calls on one rank, mismatched arguments,
    /// NIC set on a group that never ran a collective or while one is in flight on it,
    /// different group order across ranks, a collective on a group whose members disagree).
    /// A test that passes must usually end with this empty.
    pub fn violations(&self) -> Vec<String> {
        let st = self.state.lock();
        let mut v = st.violations.clone();
        if st.violations_dropped > 0 {
            v.push(format!(
                "... and {} more violations not kept",
                st.violations_dropped
            ));
        }
        v
    }

    /// How many collectives ran while the group's members disagreed about its NICs (each
    /// failed with `HCCL_E_INTERNAL`; on real hardware they hang or corrupt data).
    pub fn collectives_on_inconsistent_groups(&self) -> u64 {
        self.state.lock().inconsistent_collectives
    }

    /// How many collectives ran with a rank on its default (primary) NIC that their group's
    /// set configuration had on its backup NIC: operators first issued after the switch, which
    /// HCCL runs on the default NIC (see [`crate::operator`]). Counted once per collective.
    pub fn collectives_on_default_nic(&self) -> u64 {
        self.state.lock().default_nic_collectives
    }

    /// A snapshot of who is waiting where.
    pub fn activity(&self) -> Activity {
        let st = self.state.lock();
        Self::activity_of(&st)
    }

    /// Waits until `pred` holds for the current [`Activity`] (re-checked on every state
    /// change, no polling), or `timeout` passes. Returns whether `pred` held.
    pub fn wait_activity(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&Activity) -> bool,
    ) -> bool {
        let deadline = deadline_after(timeout);
        let mut st = self.state.lock();
        loop {
            if pred(&Self::activity_of(&st)) {
                return true;
            }
            if !self.wait(&mut st, deadline) {
                return pred(&Self::activity_of(&st));
            }
        }
    }

    fn activity_of(st: &State) -> Activity {
        let mut a = Activity {
            generation: st.generation,
            in_nic_set: st
                .nic_call
                .iter()
                .enumerate()
                .filter(|(_, c)| c.is_some())
                .map(|(r, _)| GlobalRank(r as u32))
                .collect(),
            ..Activity::default()
        };
        for g in &st.groups {
            for (m, member) in g.members.iter().enumerate() {
                if g.nic_round[m].is_some() {
                    a.waiting_in_nic_set.push((g.name.clone(), *member));
                }
                if g.ar_in_flight[m] {
                    a.waiting_in_collective.push((g.name.clone(), *member));
                }
            }
        }
        a
    }

    /// Records a state change and wakes every waiter.
    pub(crate) fn bump(&self, st: &mut State) {
        st.generation += 1;
        self.cv.notify_all();
    }

    /// Waits for the next state change or the deadline. Returns `false` once the deadline
    /// has passed.
    pub(crate) fn wait(&self, st: &mut MutexGuard<'_, State>, deadline: Option<Instant>) -> bool {
        match deadline {
            None => {
                self.cv.wait(st);
                true
            }
            Some(d) => {
                if Instant::now() >= d {
                    return false;
                }
                self.cv.wait_until(st, d);
                true
            }
        }
    }

    /// The physical port rank `rank` sends on when it uses its backup NIC (`use_backup`) or
    /// its primary: the partner die's port or its own. `None`: no such NIC (odd node).
    /// Because partners swap, two partners both on backup use each other's ports.
    pub(crate) fn working_port(&self, rank: GlobalRank, use_backup: bool) -> Option<usize> {
        if use_backup {
            self.partner(rank).map(|p| p.0 as usize)
        } else {
            Some(rank.0 as usize)
        }
    }

    /// `node-1/dev-2` for messages.
    pub(crate) fn port_name(&self, port: usize) -> String {
        let d = self.cfg.devices_per_node as usize;
        format!("node-{}/dev-{}", port / d, port % d)
    }
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fabric")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use taskd_core::{NicSide, NodeHal, RankHal};

    #[test]
    fn topology_lays_out_ranks_partners_and_groups() {
        assert_eq!(FabricConfig::new(2, 16).tp_size, 8);
        assert_eq!(FabricConfig::new(1, 3).tp_size, 3);
        let f = fabric(2, 4, 2);
        assert_eq!(f.world_size(), 8);
        assert_eq!(f.location(r(5)), Some((1, DeviceId(1))));
        assert_eq!(f.location(r(8)), None);
        assert_eq!(f.partner(r(5)), Some(r(4)));
        assert_eq!(f.partner(r(4)), Some(r(5)));
        let names: Vec<String> = f.groups_of(r(5)).into_iter().map(|g| g.name).collect();
        assert_eq!(names, [WORLD_GROUP, "tp_2", "dp_1"]);
        let g = f.groups_of(r(5));
        assert_eq!(g[1].members, [r(4), r(5)]);
        assert_eq!(g[2].members, [r(1), r(3), r(5), r(7)]);
        assert_eq!(g[2].group_rank_of(r(5)), Some(GroupRank(2)));
        assert_eq!(f.all_groups().len(), 1 + 4 + 2);
        assert_eq!(f.node_name(1), NodeName("node-1".into()));
        assert!(f.groups_of(r(99)).is_empty());
        // A fresh fabric is trivially consistent, everyone on primary.
        assert!(f.check_consistency().is_consistent());
        assert!(f.ranks_on_backup().is_empty());
    }

    #[test]
    #[should_panic(expected = "must divide")]
    fn tp_size_must_divide_the_node() {
        Fabric::new(FabricConfig {
            tp_size: 3,
            ..FabricConfig::new(1, 4)
        });
    }

    #[test]
    fn the_last_die_of_an_odd_node_has_no_backup() {
        let f = fabric(1, 3, 3);
        assert_eq!(f.partner(r(2)), None);
        let h = f.node_hal(0).link_health(DeviceId(2)).unwrap();
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        warm_up(&f);
        for calls in switch_all(&f, &[(2, true)]) {
            for (group, res) in calls {
                let e = res.unwrap_err();
                assert_eq!(e.hccl(), Some(HcclCode::RoceConnect), "{group}");
                assert!(e.detail.contains("rank 2 has no backup NIC"), "{e}");
            }
        }
        assert!(f.check_consistency().is_consistent());
    }

    #[test]
    fn groups_disagreeing_about_one_rank_are_reported() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Only the world group is switched; tp_0 and dp_0 still say rank 0 is on primary.
        let res = on_ranks(&f, &[0, 1], |mut hal| {
            hal.set_working_nic(WORLD_GROUP, &[GroupRank(0)], &[true])
        });
        assert!(res.iter().all(Result::is_ok));
        let report = f.check_consistency();
        assert_eq!(report.disagreements.len(), 1, "{report}");
        assert_eq!(report.disagreements[0].group, "hccl_world_group,tp_0,dp_0");
        assert_eq!(
            report.disagreements[0].detail,
            "rank 0: hccl_world_group says backup, tp_0 says primary, dp_0 says primary"
        );
        assert!(report
            .to_string()
            .starts_with("1 disagreement(s) in 4 groups"));
        assert!(f.ranks_on_backup().is_empty());
    }

    #[test]
    fn cleared_faults_are_never_used() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        f.inject_nic_set_fault(r(0), NicSetFault::Fail(HcclCode::Network));
        f.inject_nic_set_fault(r(1), NicSetFault::Slow(Duration::ZERO));
        f.inject_nic_set_fault(r(1), NicSetFault::Fail(HcclCode::Network));
        assert_eq!(f.clear_nic_set_faults(), 3);
        assert_eq!(f.clear_nic_set_faults(), 0);
        for calls in switch_all(&f, &[(0, true)]) {
            for (group, res) in calls {
                assert!(res.is_ok(), "{group}: {res:?}");
            }
        }
        assert!(f.check_consistency().is_consistent());
        assert_eq!(f.ranks_on_backup(), [r(0)]);
    }

    #[test]
    fn a_dead_members_view_no_longer_counts() {
        let f = fabric(1, 2, 2);
        warm_up(&f);
        // Rank 1 fails its world call; then it dies: the survivors agree.
        f.inject_nic_set_fault(r(1), NicSetFault::Fail(HcclCode::Network));
        switch_all(&f, &[(0, true)]);
        assert!(!f.check_consistency().is_consistent());
        f.kill_rank(r(1));
        assert!(f.is_dead(r(1)));
        let report = f.check_consistency();
        assert!(report.is_consistent(), "{report}");
        assert_eq!(f.ranks_on_backup(), [r(0)]);
        let mut hal = f.rank_hal(r(1));
        assert!(hal
            .capabilities()
            .lacks(&taskd_core::HcclSetup::L2_RETRY_OFF));
    }
}
