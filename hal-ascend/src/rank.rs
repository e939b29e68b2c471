//! [`AscendRankHal`]: the per-rank HAL over real HCCL communicators.

use crate::safe::Comm;
use crate::search::EnvLookup;
use std::collections::HashSet;
use taskd_core::{
    env, GroupInfo, GroupRank, HalError, HcclCode, HcclSetup, RankHal, SwitchCapabilities,
};

/// `HCCL_OP_RETRY_ENABLE`: HCCL's retry levels; `L2:1` is needed for a real NIC switch.
///
/// `TASKD_HCCL_RDMA`: set to `0`, `false`, `off` or `no` to declare that this rank's topology
/// has no RDMA (RoCE) links, so that preflight refuses a switch that would be a silent no-op.
/// HCCL offers no call that reports whether a communicator uses RDMA links, so
/// [`AscendRankHal`] cannot find out by itself and assumes they exist unless told otherwise.
pub use taskd_core::env::{HCCL_OP_RETRY_ENABLE, TASKD_HCCL_RDMA};

/// What this rank's HCCL setup allows, from the environment: `l2_retry` from
/// `HCCL_OP_RETRY_ENABLE` (parsed by [`taskd_core::env::l2_retry_enabled`]), `rdma` true unless
/// [`TASKD_HCCL_RDMA`] says otherwise (what a rank lacks then: [`HcclSetup::capabilities`]).
/// TSP is the framework's, which the worker adds.
pub fn capabilities_from_env(env: EnvLookup<'_>) -> HcclSetup {
    let get = |k: &str| env(k).map(|v| v.to_string_lossy().into_owned());
    let rdma_off = get(TASKD_HCCL_RDMA).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        )
    });
    HcclSetup {
        l2_retry: env::l2_retry_enabled(get(HCCL_OP_RETRY_ENABLE).as_deref()),
        rdma: !rdma_off,
    }
}

struct Group {
    comm: Comm,
    /// The launcher's description; an empty name means "use HCCL's".
    info: GroupInfo,
    /// `HcclGetCommName`, once asked.
    hccl_name: Option<String>,
}

/// The per-rank HAL over the communicators of one training process.
///
/// HCCL can tell a communicator's name and size but not which global ranks its members are,
/// so the launcher (or a rig) hands in each communicator together with its [`GroupInfo`]:
/// the members as global ranks in group-rank order. [`RankHal::groups`] then reports HCCL's
/// own name (`HcclGetCommName`, identical on every member) and checks that
/// `HcclGetRankSize` equals the number of members the launcher gave. A mismatch (size,
/// name, or two communicators with one name) is a `HalError` with `HcclCode::Para` under the
/// HCCL call that revealed it, and nothing is switched.
///
/// Calls reach HCCL exactly as the caller orders them: the worker executes
/// [`taskd_core::plan_calls`] one call at a time, which is what HCCL requires.
pub struct AscendRankHal {
    groups: Vec<Group>,
    caps: HcclSetup,
}

impl AscendRankHal {
    /// `groups`: each communicator with its members. A non-empty `GroupInfo::name` must equal
    /// HCCL's name for that communicator (a check that comm and members were paired right);
    /// an empty one is filled from HCCL. `env` is read once, for [`capabilities_from_env`].
    pub fn new(groups: Vec<(Comm, GroupInfo)>, env: EnvLookup<'_>) -> Self {
        Self::with_capabilities(groups, capabilities_from_env(env))
    }

    /// As [`AscendRankHal::new`], with the capabilities given instead of read.
    pub fn with_capabilities(groups: Vec<(Comm, GroupInfo)>, caps: HcclSetup) -> Self {
        AscendRankHal {
            groups: groups
                .into_iter()
                .map(|(comm, info)| Group {
                    comm,
                    info,
                    hccl_name: None,
                })
                .collect(),
            caps,
        }
    }

    /// The communicators with the launcher's descriptions, in the order they were handed in.
    /// A caller that shares this HAL with its training loop (behind a lock, so that HCCL calls
    /// of one rank stay sequential) runs its collectives through these.
    pub fn comms(&self) -> impl Iterator<Item = (&Comm, &GroupInfo)> + '_ {
        self.groups.iter().map(|g| (&g.comm, &g.info))
    }

    /// Gives the communicators back (owned ones are destroyed when the caller drops them).
    pub fn into_comms(self) -> Vec<(Comm, GroupInfo)> {
        self.groups.into_iter().map(|g| (g.comm, g.info)).collect()
    }

    /// Asks HCCL for every name not known yet and checks names against the launcher's.
    fn resolve_names(&mut self) -> Result<(), HalError> {
        for g in &mut self.groups {
            if g.hccl_name.is_some() {
                continue;
            }
            let name = g.comm.name()?;
            if !g.info.name.is_empty() && g.info.name != name {
                return Err(HalError::new(
                    crate::result::hccl::OP_GET_COMM_NAME,
                    HcclCode::Para,
                    format!(
                        "the launcher paired this communicator with group {:?}, but HCCL names \
                         it {name:?}",
                        g.info.name
                    ),
                ));
            }
            g.hccl_name = Some(name);
        }
        let mut seen = HashSet::new();
        for name in self.groups.iter().filter_map(|g| g.hccl_name.as_deref()) {
            if !seen.insert(name) {
                return Err(HalError::new(
                    crate::result::hccl::OP_GET_COMM_NAME,
                    HcclCode::Para,
                    format!("two communicators are named {name:?}"),
                ));
            }
        }
        Ok(())
    }

    fn comm_named(&mut self, op: &str, group: &str) -> Result<&Comm, HalError> {
        self.resolve_names()?;
        self.groups
            .iter()
            .find(|g| g.hccl_name.as_deref() == Some(group))
            .map(|g| &g.comm)
            .ok_or_else(|| {
                HalError::new(
                    op,
                    HcclCode::NotFound,
                    format!("this process has no communicator named {group:?}"),
                )
            })
    }
}

impl RankHal for AscendRankHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        self.resolve_names()?;
        self.groups
            .iter()
            .map(|g| {
                let name = g.hccl_name.clone().expect("resolved above");
                let size = g.comm.rank_size()?;
                if size as usize != g.info.members.len() {
                    return Err(HalError::new(
                        crate::result::hccl::OP_GET_RANK_SIZE,
                        HcclCode::Para,
                        format!(
                            "HCCL reports {size} ranks in {name:?} but the launcher gave {} \
                             members",
                            g.info.members.len()
                        ),
                    ));
                }
                Ok(GroupInfo {
                    name,
                    members: g.info.members.clone(),
                })
            })
            .collect()
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        let op = crate::result::hccl::OP_WORKING_DEV_NIC_SET;
        let ranks: Vec<u32> = ranks.iter().map(|r| r.0).collect();
        self.comm_named(op, group)?
            .set_working_nic(&ranks, use_backup)
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.caps.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(pairs: &[(&str, &str)]) -> HcclSetup {
        let env = taskd_core::env::from_pairs(pairs);
        capabilities_from_env(&env)
    }

    #[test]
    fn l2_retry_comes_from_hccl_op_retry_enable() {
        assert!(caps(&[("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:1")]).l2_retry);
        assert!(!caps(&[("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:0")]).l2_retry);
        assert!(!caps(&[]).l2_retry);
    }

    #[test]
    fn rdma_is_assumed_unless_overridden() {
        assert!(caps(&[]).rdma);
        assert!(caps(&[("TASKD_HCCL_RDMA", "1")]).rdma);
        for off in ["0", "false", "OFF", " no "] {
            assert!(!caps(&[("TASKD_HCCL_RDMA", off)]).rdma, "{off}");
        }
    }

    #[test]
    fn no_groups_means_no_calls() {
        let mut hal = AscendRankHal::with_capabilities(Vec::new(), HcclSetup::ALL);
        assert_eq!(hal.groups().unwrap(), vec![]);
        let err = hal
            .set_working_nic("world", &[GroupRank(0)], &[true])
            .unwrap_err();
        assert_eq!(err.hccl(), Some(HcclCode::NotFound));
        assert_eq!(err.op, "HcclCommWorkingDevNicSet");
        assert_eq!(hal.capabilities(), SwitchCapabilities::ALL);
    }
}
