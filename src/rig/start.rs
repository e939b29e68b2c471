//! Starting the rig: the node HAL and the physical devices, the rank table, the Ascend
//! runtime and the root infos, and the rank threads until every one is ready.

use super::training::{rank_thread, RankSetup, Ready, Shared};
use super::{RigConfig, RigError, UnmonitoredNodeHal};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use taskd_actors::StepGate;
use taskd_core::env::EnvLookup;
use taskd_core::{DeviceId, GlobalRank, GroupInfo, HcclSetup, NodeHal, RankTable};
use taskd_hal_ascend::node;
use taskd_hal_ascend::result::{self};
use taskd_hal_ascend::sys::acl::AclLib;
use taskd_hal_ascend::sys::dcmi::DcmiLib;
use taskd_hal_ascend::sys::hccl::HcclLib;
use taskd_hal_ascend::{AscendNodeHal, AscendRankHal, LoadError, RootInfo};

/// The rank threads while they set up: their handles, how to hand each its gate, and where
/// they report.
pub(super) struct Starting {
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) gates: Vec<mpsc::Sender<Option<Arc<StepGate>>>>,
    pub(super) ready: mpsc::Receiver<(u32, Ready)>,
}

impl Starting {
    /// Tells every rank thread there is no job, and joins them (when they can be joined).
    pub(super) fn abort(self, join: bool, e: RigError) -> RigError {
        for tx in &self.gates {
            let _ = tx.send(None);
        }
        if join {
            for t in self.threads {
                let _ = t.join();
            }
        }
        e
    }
}

/// The proxy's node HAL, what it is, and the physical id of each of the rig's devices.
pub(super) struct NodeSetup {
    pub(super) hal: Box<dyn NodeHal>,
    pub(super) description: String,
    pub(super) physical: Vec<DeviceId>,
}

/// The node's setup through DCMI when it is there, else every NIC reported up and the rig's
/// (logical) device ids taken as physical.
pub(super) fn node_hal(
    dcmi: Result<DcmiLib, LoadError>,
    cfg: &RigConfig,
    env: EnvLookup<'_>,
) -> Result<NodeSetup, RigError> {
    let unmonitored = |why: String| NodeSetup {
        hal: Box::new(UnmonitoredNodeHal),
        description: format!(
            "unmonitored: every NIC reported up ({why}); logical ids taken as physical"
        )
        .replace('\n', " "),
        physical: cfg.devices.clone(),
    };
    let dcmi = match dcmi {
        Ok(d) => d,
        Err(e) => return Ok(unmonitored(format!("DCMI not loaded: {e}"))),
    };
    let path = dcmi.path().display().to_string();
    let timeout = node::probe_timeout_from_env(env).map_err(|e| RigError::Setup(e.to_string()))?;
    let hal = match AscendNodeHal::with_timeout(dcmi, timeout) {
        Ok(h) => h,
        Err(e) => return Ok(unmonitored(e.to_string())),
    };
    let physical = cfg
        .devices
        .iter()
        .map(|d| hal.physical_of_logical(d.0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RigError::Setup(format!("the physical ids of the rig's devices: {e}")))?;
    Ok(NodeSetup {
        hal: Box::new(hal),
        description: format!("DCMI ({path})"),
        physical,
    })
}

/// The rank table: this node's physical devices, rank `r` on the `r`-th.
pub(super) fn rank_table(cfg: &RigConfig, physical: &[DeviceId]) -> Result<RankTable, RigError> {
    RankTable::new(
        physical
            .iter()
            .enumerate()
            .map(|(r, d)| taskd_core::rank_table::RankSlot {
                node: cfg.node.clone(),
                device: *d,
                rank: GlobalRank(r as u32),
            })
            .collect(),
    )
    .map_err(|e| RigError::Setup(e.to_string()))
}

/// HCCL and ACL, which every rank uses.
pub(super) struct Runtime {
    pub(super) hccl: Arc<HcclLib>,
    pub(super) acl: Arc<AclLib>,
}

/// One root info per communicator, made on the device of its first member.
pub(super) fn root_infos(cfg: &RigConfig, rt: &Runtime) -> Result<Vec<RootInfo>, RigError> {
    let mut roots = Vec::new();
    for g in cfg.all_groups() {
        let device = cfg.devices[g[0].0 as usize];
        result::acl::set_device(&rt.acl, device.0 as i32)
            .map_err(|e| RigError::Setup(e.to_string()))?;
        roots.push(RootInfo::generate(&rt.hccl).map_err(|e| RigError::Setup(e.to_string()))?);
    }
    Ok(roots)
}

/// Starts one thread per rank; each sets its device up and joins its communicators.
pub(super) fn spawn_ranks(
    cfg: &RigConfig,
    rt: &Runtime,
    roots: &[RootInfo],
    caps: HcclSetup,
    shared: &Arc<Shared>,
) -> Starting {
    let groups = cfg.all_groups();
    let (ready_tx, ready) = mpsc::channel();
    let mut start = Starting {
        threads: Vec::new(),
        gates: Vec::new(),
        ready,
    };
    for (r, device) in cfg.devices.iter().enumerate() {
        let setup = RankSetup {
            rank: r as u32,
            device: *device,
            hccl: Arc::clone(&rt.hccl),
            acl: Arc::clone(&rt.acl),
            groups: groups
                .iter()
                .zip(roots)
                .filter(|(g, _)| g.contains(&GlobalRank(r as u32)))
                .map(|(g, root)| (root.clone(), g.clone()))
                .collect(),
            caps,
            elements: cfg.elements,
            compute: cfg.compute,
            eval_every: cfg.eval_every,
            timeout: cfg.progress_timeout,
        };
        let (gate_tx, gate_rx) = mpsc::channel();
        start.gates.push(gate_tx);
        let (ready, shared) = (ready_tx.clone(), Arc::clone(shared));
        start.threads.push(
            std::thread::Builder::new()
                .name(format!("rig-rank-{r}"))
                .spawn(move || rank_thread(setup, ready, gate_rx, shared))
                .expect("spawning a rank thread"),
        );
    }
    start
}

/// Every rank's HAL and groups, once each reported ready.
pub(super) type ReadyRanks = (Vec<Arc<Mutex<AscendRankHal>>>, Vec<Vec<GroupInfo>>);

/// Waits for every rank to report ready.
pub(super) fn wait_ready(
    cfg: &RigConfig,
    start: Starting,
) -> Result<(Starting, ReadyRanks), RigError> {
    let n = cfg.devices.len();
    let mut hals: Vec<Option<Arc<Mutex<AscendRankHal>>>> = vec![None; n];
    let mut rank_groups: Vec<Vec<GroupInfo>> = vec![Vec::new(); n];
    for _ in 0..n {
        match start.ready.recv_timeout(cfg.progress_timeout) {
            Ok((r, Ok((hal, groups)))) => {
                hals[r as usize] = Some(hal);
                rank_groups[r as usize] = groups;
            }
            Ok((r, Err(error))) => {
                let device = cfg.devices[r as usize].0;
                let e = RigError::RankInit {
                    rank: r,
                    device,
                    error,
                };
                return Err(start.abort(true, e));
            }
            // Ranks stuck in HcclCommInitRootInfo cannot be stopped: leave them.
            Err(_) => return Err(start.abort(false, RigError::Stuck(cfg.progress_timeout, 0))),
        }
    }
    let hals = hals
        .into_iter()
        .map(|h| h.expect("every rank reported"))
        .collect();
    Ok((start, (hals, rank_groups)))
}

/// Everything [`Rig::start`] prepares before the actors start.
pub(super) struct Prepared {
    pub(super) node: NodeSetup,
    pub(super) table: RankTable,
    pub(super) starting: Starting,
    pub(super) ranks: ReadyRanks,
}

/// The node HAL and the rank table, then every rank set up and joined to its communicators.
pub(super) fn prepare(
    cfg: &RigConfig,
    rt: &Runtime,
    dcmi: Result<DcmiLib, LoadError>,
    caps: HcclSetup,
    shared: &Arc<Shared>,
    env: EnvLookup<'_>,
) -> Result<Prepared, RigError> {
    let node = node_hal(dcmi, cfg, env)?;
    let table = rank_table(cfg, &node.physical)?;
    let roots = root_infos(cfg, rt)?;
    let (starting, ranks) = wait_ready(cfg, spawn_ranks(cfg, rt, &roots, caps, shared))?;
    Ok(Prepared {
        node,
        table,
        starting,
        ranks,
    })
}
