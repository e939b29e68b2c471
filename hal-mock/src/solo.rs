//! One rank of a simulated job, alone in its own process.
//!
//! The [`Fabric`](crate::Fabric) simulates a whole job in one process, with rendezvous between
//! the members of each group. A rank running in a process of its own (`taskd worker --sim`)
//! cannot rendezvous with its peers, so [`SoloRank`] simulates only its own side: it knows the
//! job's group layout (the same names and members as the fabric: `hccl_world_group`, `tp_{i}`,
//! `dp_{j}`), applies each NIC-set call to its own view of the group, and enforces every rule
//! one rank can check alone (argument checks, a group that never ran a collective, a call
//! while a collective is in flight, L2 retry off = silent no-op). Whether the ranks of a group
//! agree is then exactly what the manager's digest check verifies across processes.

use crate::fabric::WORLD_GROUP;
use crate::fault::{NicSetFault, NicSetRecord};
use crate::hccl::NIC_SET_OP;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use taskd_core::{
    DeviceId, GlobalRank, GroupInfo, GroupRank, HalError, HalErrorKind, HcclCode, HcclSetup,
    LinkHealth, NodeHal, RankHal, StepBoundary, StepOutcome, SwitchCapabilities,
};

/// The shape of the job a solo rank belongs to.
///
/// Why: every solo rank must derive the same groups as its peers in other processes, exactly
/// as the fabric would lay them out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SoloLayout {
    /// Number of nodes.
    pub nodes: u32,
    /// Ranks per node; rank = node_index * devices_per_node + device.
    pub devices_per_node: u32,
    /// Tensor-parallel group size (divides `devices_per_node`).
    pub tp_size: u32,
}

impl SoloLayout {
    /// `nodes` x `devices_per_node` with the fabric's default tensor-parallel size.
    pub fn new(nodes: u32, devices_per_node: u32) -> Self {
        SoloLayout {
            nodes,
            devices_per_node,
            tp_size: devices_per_node.clamp(1, 8),
        }
    }

    /// Why this layout is impossible, if it is.
    pub fn check(&self) -> Result<(), String> {
        if self.nodes == 0 || self.devices_per_node == 0 {
            return Err("a job needs at least one node and one device per node".into());
        }
        if self.tp_size == 0 || self.devices_per_node % self.tp_size != 0 {
            return Err(format!(
                "the tensor-parallel size {} must divide the devices per node ({})",
                self.tp_size, self.devices_per_node
            ));
        }
        Ok(())
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> u32 {
        self.nodes * self.devices_per_node
    }

    /// The groups of `rank`, as the fabric lays them out: world, `tp_{rank / tp}`,
    /// `dp_{rank % tp}`, members ascending.
    pub fn groups_of(&self, rank: GlobalRank) -> Vec<GroupInfo> {
        let world = self.world_size();
        if rank.0 >= world {
            return Vec::new();
        }
        let tp = self.tp_size;
        let (t, d) = (rank.0 / tp, rank.0 % tp);
        vec![
            GroupInfo {
                name: WORLD_GROUP.to_owned(),
                members: (0..world).map(GlobalRank).collect(),
            },
            GroupInfo {
                name: format!("tp_{t}"),
                members: (t * tp..(t + 1) * tp).map(GlobalRank).collect(),
            },
            GroupInfo {
                name: format!("dp_{d}"),
                members: (0..world / tp).map(|c| GlobalRank(c * tp + d)).collect(),
            },
        ]
    }

    /// The other die of the same NPU ([`DeviceId::partner`]), if it exists.
    pub fn partner(&self, rank: GlobalRank) -> Option<GlobalRank> {
        let dpn = self.devices_per_node;
        let (node, dev) = (rank.0 / dpn, rank.0 % dpn);
        let p = DeviceId(dev).partner().0;
        (p < dpn && rank.0 < self.world_size()).then_some(GlobalRank(node * dpn + p))
    }
}

struct Group {
    members: Vec<GlobalRank>,
    /// This rank's view: whether each group rank uses its backup NIC.
    view: Vec<bool>,
    ran_op: bool,
}

struct State {
    groups: BTreeMap<String, Group>,
    in_nic_set: bool,
    in_collective: bool,
    faults: VecDeque<NicSetFault>,
    l2_retry: bool,
    rdma: bool,
    /// The newest [`SOLO_LOG_LEN`] calls: a long-running worker makes calls for ever.
    log: VecDeque<NicSetRecord>,
    /// The first [`SOLO_LOG_LEN`] violations (the first is what matters), and how many
    /// more were seen.
    violations: Vec<String>,
    violations_dropped: u64,
    collectives: u64,
}

/// How many NIC-set calls and rule violations a [`SoloRank`] keeps: a rank makes a few calls
/// an operation, so the newest of many operations; bounded, so a simulated worker that runs
/// for days does not grow.
pub const SOLO_LOG_LEN: usize = 256;

impl State {
    fn violation(&mut self, v: String) {
        if self.violations.len() < SOLO_LOG_LEN {
            self.violations.push(v);
        } else {
            self.violations_dropped += 1;
        }
    }
}

/// One simulated rank: its groups and its view of each. Clone it to share between the HAL
/// (the worker) and the training loop.
#[derive(Clone)]
pub struct SoloRank {
    rank: GlobalRank,
    layout: SoloLayout,
    state: Arc<Mutex<State>>,
}

impl SoloRank {
    /// Rank `rank` of a job of shape `layout`: every view "all primary", no group has run a
    /// collective yet, L2 retry and RDMA on.
    pub fn new(layout: SoloLayout, rank: GlobalRank) -> Result<SoloRank, String> {
        layout.check()?;
        if rank.0 >= layout.world_size() {
            return Err(format!(
                "rank {rank} is outside the job ({} ranks)",
                layout.world_size()
            ));
        }
        let groups = layout
            .groups_of(rank)
            .into_iter()
            .map(|g| {
                let n = g.members.len();
                (
                    g.name,
                    Group {
                        members: g.members,
                        view: vec![false; n],
                        ran_op: false,
                    },
                )
            })
            .collect();
        Ok(SoloRank {
            rank,
            layout,
            state: Arc::new(Mutex::new(State {
                groups,
                in_nic_set: false,
                in_collective: false,
                faults: VecDeque::new(),
                l2_retry: true,
                rdma: true,
                log: VecDeque::new(),
                violations: Vec::new(),
                violations_dropped: 0,
                collectives: 0,
            })),
        })
    }

    /// The rank simulated.
    pub fn rank(&self) -> GlobalRank {
        self.rank
    }

    /// The job's shape.
    pub fn layout(&self) -> SoloLayout {
        self.layout
    }

    /// The HAL a worker owns for this rank.
    pub fn hal(&self) -> SoloRankHal {
        SoloRankHal(self.clone())
    }

    /// Queues a fault for this rank's next NIC-set call.
    pub fn inject_nic_set_fault(&self, fault: NicSetFault) {
        self.state.lock().faults.push_back(fault);
    }

    /// `HCCL_OP_RETRY_ENABLE` L2 (default on); off: NIC-set calls succeed and change nothing.
    pub fn set_l2_retry(&self, on: bool) {
        self.state.lock().l2_retry = on;
    }

    /// Whether the topology has RDMA links (default yes); without, NIC sets are no-ops.
    pub fn set_rdma(&self, on: bool) {
        self.state.lock().rdma = on;
    }

    /// This rank's view of `group` (use_backup per group rank).
    pub fn view(&self, group: &str) -> Option<Vec<bool>> {
        self.state.lock().groups.get(group).map(|g| g.view.clone())
    }

    /// Ranks this rank's world-group view puts on their backup NIC.
    pub fn ranks_on_backup(&self) -> Vec<GlobalRank> {
        let st = self.state.lock();
        st.groups
            .get(WORLD_GROUP)
            .map(|g| {
                g.members
                    .iter()
                    .zip(&g.view)
                    .filter(|(_, b)| **b)
                    .map(|(m, _)| *m)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether this rank's groups agree with each other about every rank they share.
    pub fn views_agree(&self) -> bool {
        let st = self.state.lock();
        let mut seen: BTreeMap<GlobalRank, bool> = BTreeMap::new();
        st.groups.values().all(|g| {
            g.members
                .iter()
                .zip(&g.view)
                .all(|(m, b)| *seen.entry(*m).or_insert(*b) == *b)
        })
    }

    /// The NIC-set calls so far, oldest first: the newest [`SOLO_LOG_LEN`].
    pub fn nic_set_log(&self) -> Vec<NicSetRecord> {
        self.state.lock().log.iter().cloned().collect()
    }

    /// Rule violations seen (a call on a group that never ran a collective, a call while a
    /// collective was in flight, a collective during a NIC set).
    pub fn violations(&self) -> Vec<String> {
        let st = self.state.lock();
        let mut v = st.violations.clone();
        if st.violations_dropped > 0 {
            v.push(format!("... and {} more", st.violations_dropped));
        }
        v
    }

    /// Collectives run so far (one per group per step).
    pub fn collectives(&self) -> u64 {
        self.state.lock().collectives
    }

    /// One step's collectives, on every group of the rank.
    pub fn run_collectives(&self) {
        let mut st = self.state.lock();
        if st.in_nic_set {
            st.violation(format!(
                "rank {}: a collective ran while {NIC_SET_OP} was in progress (training was not paused)",
                self.rank
            ));
        }
        st.in_collective = true;
        let n = st.groups.len() as u64;
        for g in st.groups.values_mut() {
            g.ran_op = true;
        }
        st.collectives += n;
        st.in_collective = false;
    }

    fn set_working_nic(
        &self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        let fault = {
            let mut st = self.state.lock();
            if st.in_nic_set {
                st.violation(format!(
                    "rank {}: concurrent {NIC_SET_OP} (group {group})",
                    self.rank
                ));
                return Err(HalError::new(
                    NIC_SET_OP,
                    HcclCode::Internal,
                    "another call is in progress on this rank",
                ));
            }
            st.in_nic_set = true;
            st.faults.pop_front()
        };
        let (code, applied, detail) = self.nic_set(group, ranks, use_backup, fault);
        let mut st = self.state.lock();
        st.in_nic_set = false;
        if st.log.len() == SOLO_LOG_LEN {
            st.log.pop_front();
        }
        st.log.push_back(NicSetRecord {
            rank: self.rank,
            group: group.to_owned(),
            ranks: ranks.to_vec(),
            use_backup: use_backup.to_vec(),
            result: code,
            applied,
        });
        if code == HcclCode::Success {
            Ok(())
        } else {
            Err(HalError::new(
                NIC_SET_OP,
                code,
                format!("rank {}, group {group}: {detail}", self.rank),
            ))
        }
    }

    /// The call itself: `(code, applied, detail)`.
    fn nic_set(
        &self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
        fault: Option<NicSetFault>,
    ) -> (HcclCode, bool, String) {
        let fail_with = match fault {
            None => None,
            Some(NicSetFault::Fail(c)) => Some(c),
            Some(NicSetFault::Hang { duration, code }) => {
                std::thread::sleep(duration); // the simulated hang itself
                Some(code)
            }
            Some(NicSetFault::Slow(d)) => {
                std::thread::sleep(d); // the simulated slow call itself
                None
            }
        };
        let mut st = self.state.lock();
        let (l2, rdma, in_collective) = (st.l2_retry, st.rdma, st.in_collective);
        let Some(g) = st.groups.get(group) else {
            return (
                HcclCode::NotFound,
                false,
                format!("rank {} is in no group {group:?}", self.rank),
            );
        };
        if let Err(detail) = self.check_arguments(g, ranks, use_backup) {
            return (HcclCode::Para, false, detail);
        }
        if !g.ran_op {
            st.violation(format!(
                "{NIC_SET_OP} by rank {} on group {group}, which has not run any collective yet",
                self.rank
            ));
            return (
                HcclCode::Internal,
                false,
                "the group has not run any collective yet (no transport links to switch)".into(),
            );
        }
        if in_collective {
            st.violation(format!(
                "{NIC_SET_OP} by rank {} on group {group} while a collective is in flight",
                self.rank
            ));
        }
        if let Some(c) = fail_with {
            return (c, false, "injected fault".into());
        }
        if !l2 || !rdma {
            return (
                HcclCode::Success,
                false,
                "no-op: L2 retry off or no RDMA".into(),
            );
        }
        let g = st.groups.get_mut(group).expect("checked above");
        for (gr, b) in ranks.iter().zip(use_backup) {
            g.view[gr.0 as usize] = *b;
        }
        (HcclCode::Success, true, String::new())
    }

    fn check_arguments(
        &self,
        g: &Group,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), String> {
        crate::hccl::check_nic_set_arguments(
            &g.members,
            |r| self.layout.partner(r),
            ranks,
            use_backup,
        )
    }
}

/// The [`RankHal`] of a [`SoloRank`].
pub struct SoloRankHal(SoloRank);

impl RankHal for SoloRankHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        Ok(self.0.layout.groups_of(self.0.rank))
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        self.0.set_working_nic(group, ranks, use_backup)
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        let st = self.0.state.lock();
        HcclSetup {
            l2_retry: st.l2_retry,
            rdma: st.rdma,
        }
        .capabilities()
    }
}

/// A node's link health for a proxy without hardware: every port up unless set down.
///
/// Why: the proxy of a simulated node must answer "is the target's NIC up" as the fabric's
/// [`MockNodeHal`](crate::MockNodeHal) does (backup = the partner die's port).
#[derive(Clone)]
pub struct SoloNodeHal {
    devices: u32,
    ports_up: Arc<Mutex<Vec<bool>>>,
}

impl SoloNodeHal {
    /// A node of `devices` dies, every port up.
    pub fn new(devices: u32) -> Self {
        SoloNodeHal {
            devices,
            ports_up: Arc::new(Mutex::new(vec![true; devices as usize])),
        }
    }

    /// Brings the port of `device` (its primary NIC, its partner's backup) up or down.
    pub fn set_link(&self, device: DeviceId, up: bool) {
        if let Some(p) = self.ports_up.lock().get_mut(device.0 as usize) {
            *p = up;
        }
    }
}

impl NodeHal for SoloNodeHal {
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        let ports = self.ports_up.lock();
        let Some(primary) = ports.get(device.0 as usize).copied() else {
            return Err(crate::MOCK.uncoded(
                "sim_get_device_network_health",
                HalErrorKind::InvalidArgument,
                format!("no device {device} on this node ({} devices)", self.devices),
            ));
        };
        let backup = ports
            .get(device.partner().0 as usize)
            .copied()
            .unwrap_or(false);
        Ok(LinkHealth::new(device, primary, backup))
    }
}

/// How a solo training loop steps.
///
/// Why a common clock: ranks in separate processes have no collectives to keep them in step,
/// so the loop paces step `k` to end at `epoch + k * step_time`. Every rank given the same
/// epoch (the manager's start, which registration hands out) then has the same step number
/// at the same moment, as collectives would keep them on real hardware.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoloTrainingOptions {
    /// Simulated compute per step. Zero: steps run back to back.
    pub step_time: Duration,
    /// The clock's origin; `None`: when the loop starts.
    pub epoch: Option<SystemTime>,
}

/// A training loop for one rank on a thread of its own: each step waits for its slot on the
/// clock, runs the rank's collectives and calls the step hook.
pub struct SoloTraining {
    stop: Arc<(Mutex<bool>, Condvar)>,
    steps: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SoloTraining {
    /// Starts the loop of `rank`, calling `hook.step_completed(step)` after every step.
    pub fn start(
        rank: SoloRank,
        hook: Arc<dyn StepBoundary>,
        opts: SoloTrainingOptions,
    ) -> SoloTraining {
        // The clock's origin as an Instant, and the step the clock is in now.
        let now = Instant::now();
        let since_epoch = opts
            .epoch
            .and_then(|e| SystemTime::now().duration_since(e).ok())
            .unwrap_or_default();
        let origin = now.checked_sub(since_epoch).unwrap_or(now);
        let first = if opts.step_time.is_zero() {
            0
        } else {
            (since_epoch.as_nanos() / opts.step_time.as_nanos()) as u64
        };
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let steps = Arc::new(AtomicU64::new(first));
        let running = Arc::new(AtomicBool::new(true));
        let (t_stop, t_steps, t_running) = (stop.clone(), steps.clone(), running.clone());
        let step_time = opts.step_time;
        let thread = std::thread::Builder::new()
            .name(format!("solo-train-{}", rank.rank()))
            .spawn(move || {
                run(&rank, hook.as_ref(), step_time, origin, &t_stop, &t_steps);
                t_running.store(false, Ordering::Release);
            })
            .expect("spawning the training thread");
        SoloTraining {
            stop,
            steps,
            running,
            thread: Some(thread),
        }
    }

    /// The last step completed.
    pub fn steps_completed(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    /// Whether the loop still runs.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Stops after the current step and joins. A loop held in its hook returns only once the
    /// hook lets it (shut the step gate first). Returns the last step completed.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.steps_completed()
    }

    fn halt(&mut self) {
        {
            let (m, cv) = &*self.stop;
            *m.lock() = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SoloTraining {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(
    rank: &SoloRank,
    hook: &dyn StepBoundary,
    step_time: Duration,
    origin: Instant,
    stop: &(Mutex<bool>, Condvar),
    steps: &AtomicU64,
) {
    let mut step = steps.load(Ordering::Acquire);
    loop {
        let next = step + 1;
        if !step_time.is_zero() {
            let due = origin + Duration::from_nanos(step_time.as_nanos() as u64 * next);
            let (m, cv) = stop;
            let mut stopped = m.lock();
            while !*stopped && Instant::now() < due {
                cv.wait_until(&mut stopped, due);
            }
            if *stopped {
                return;
            }
        } else if *stop.0.lock() {
            return;
        }
        rank.run_collectives();
        step = next;
        steps.store(step, Ordering::Release);
        if let StepOutcome::Stop(why) = hook.step_completed(step) {
            tracing::error!(rank = rank.rank().0, reason = %why, "training stopped by the manager");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::NicSide;

    fn r(n: u32) -> GlobalRank {
        GlobalRank(n)
    }

    fn gr(v: &[u32]) -> Vec<GroupRank> {
        v.iter().map(|g| GroupRank(*g)).collect()
    }

    #[test]
    fn layout_matches_the_fabric() {
        let l = SoloLayout::new(2, 4);
        let f = crate::Fabric::new(crate::FabricConfig::new(2, 4));
        for rank in 0..8 {
            assert_eq!(l.groups_of(r(rank)), f.groups_of(r(rank)), "rank {rank}");
            assert_eq!(l.partner(r(rank)), f.partner(r(rank)));
        }
        assert!(SoloLayout {
            tp_size: 3,
            ..SoloLayout::new(1, 4)
        }
        .check()
        .is_err());
    }

    #[test]
    fn applies_calls_to_its_own_view_with_hccl_rules() {
        let solo = SoloRank::new(SoloLayout::new(1, 4), r(1)).unwrap();
        let mut hal = solo.hal();
        // Before any collective: refused, and a violation.
        let e = hal.set_working_nic("tp_0", &gr(&[1]), &[true]).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Internal));
        assert_eq!(solo.violations().len(), 1);
        solo.run_collectives();
        hal.set_working_nic("tp_0", &gr(&[1]), &[true]).unwrap();
        assert_eq!(solo.view("tp_0").unwrap(), [false, true, false, false]);
        // Partners 0 and 1 told opposite sides in one call: E_PARA.
        let e = hal
            .set_working_nic(WORLD_GROUP, &gr(&[0, 1]), &[true, false])
            .unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Para));
        hal.set_working_nic(WORLD_GROUP, &gr(&[1]), &[true])
            .unwrap();
        hal.set_working_nic("dp_1", &gr(&[0]), &[true]).unwrap();
        assert_eq!(solo.ranks_on_backup(), [r(1)]);
        assert!(solo.views_agree());
        // An injected failure leaves the view unchanged.
        solo.inject_nic_set_fault(NicSetFault::Fail(HcclCode::Network));
        let e = hal
            .set_working_nic("tp_0", &gr(&[1]), &[false])
            .unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Network));
        assert_eq!(solo.view("tp_0").unwrap(), [false, true, false, false]);
        // L2 retry off: success, no change.
        solo.set_l2_retry(false);
        assert!(hal.capabilities().lacks(&HcclSetup::L2_RETRY_OFF));
        hal.set_working_nic("tp_0", &gr(&[1]), &[false]).unwrap();
        assert_eq!(solo.view("tp_0").unwrap(), [false, true, false, false]);
        assert_eq!(solo.nic_set_log().len(), 7);
    }

    #[test]
    fn the_call_log_and_the_violations_stay_bounded() {
        let solo = SoloRank::new(SoloLayout::new(1, 4), r(1)).unwrap();
        let mut hal = solo.hal();
        // Calls before any collective: each a violation.
        for _ in 0..SOLO_LOG_LEN + 3 {
            let _ = hal.set_working_nic("tp_0", &gr(&[1]), &[true]);
        }
        let v = solo.violations();
        assert_eq!(v.len(), SOLO_LOG_LEN + 1);
        assert_eq!(v[SOLO_LOG_LEN], "... and 3 more");
        solo.run_collectives();
        for n in 0..2 * SOLO_LOG_LEN {
            hal.set_working_nic("tp_0", &gr(&[1]), &[n % 2 == 0])
                .unwrap();
        }
        let log = solo.nic_set_log();
        assert_eq!(log.len(), SOLO_LOG_LEN, "the newest only");
        assert_eq!(log.last().unwrap().use_backup, [false], "the last call");
    }

    #[test]
    fn node_hal_reports_partner_port_as_backup() {
        let mut n = SoloNodeHal::new(4);
        n.set_link(DeviceId(2), false);
        let h = n.link_health(DeviceId(3)).unwrap();
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        assert_eq!(
            n.link_health(DeviceId(4)).unwrap_err().kind,
            HalErrorKind::InvalidArgument
        );
    }

    struct Count(AtomicU64);
    impl StepBoundary for Count {
        fn step_completed(&self, step: u64) -> StepOutcome {
            self.0.store(step, Ordering::Release);
            StepOutcome::Go
        }
    }

    #[test]
    fn training_paces_steps_on_the_common_clock() {
        let solo = SoloRank::new(SoloLayout::new(1, 2), r(0)).unwrap();
        let hook = Arc::new(Count(AtomicU64::new(0)));
        let epoch = SystemTime::now() - Duration::from_secs(10);
        let t = SoloTraining::start(
            solo.clone(),
            hook.clone(),
            SoloTrainingOptions {
                step_time: Duration::from_millis(5),
                epoch: Some(epoch),
            },
        );
        // Ten seconds after the epoch at 5 ms a step: the clock is near step 2000.
        let first = t.steps_completed();
        assert!((1990..=2100).contains(&first), "{first}");
        let last = t.stop();
        assert!(last >= first);
        assert_eq!(hook.0.load(Ordering::Acquire).max(first), last);
        assert!(solo.violations().is_empty());
    }
}
