//! Identifiers. Each is a newtype so a device index can never be passed where a rank is meant.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A training job, as named by the platform (`MINDX_TASK_ID`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub String);

/// A node (server) of the job, by the name the operator uses (the key of ClusterD's `nicOps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeName(pub String);

impl NodeName {
    /// The name of node `index` of a uniform layout (`node-{index}`): how
    /// [`RankTable::uniform`](crate::RankTable::uniform), the simulator and a worker started
    /// with only its node's index name it.
    pub fn uniform(index: u32) -> Self {
        NodeName(format!("node-{index}"))
    }
}

/// An NPU die on a node, by its **physical** id: the `N` of `/dev/davinciN`, the id HCCL's rank
/// table (`device_id`) and ClusterD's `dev` strings carry, and the one operators see in
/// `npu-smi info -m` ("Phy-ID"). Everything in the control plane (commands, the rank table,
/// the NIC table, [`crate::NodeHal::link_health`]) speaks physical ids.
///
/// It is *not* the logical id `aclrtSetDevice` and `ASCEND_RT_VISIBLE_DEVICES` take: inside a
/// container the visible dies are renumbered from 0, so logical `0` may be physical `6`. Code
/// that holds a logical id (a training process, the hardware rig, DCMI's `*_from_logicid`
/// calls) converts at its edge and says so; `taskd_hal_ascend::AscendNodeHal` resolves a
/// physical id with DCMI's `dcmi_get_card_id_device_id_from_phyid`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceId(pub u32);

impl DeviceId {
    /// The other die of the same NPU, in physical ids: `2k` and `2k + 1` are the two dies of
    /// one NPU (Atlas A3: two dies per card, DCMI's chips 0 and 1 of one card), so the partner
    /// of `d` is `d ^ 1`. This holds for physical ids only; a logical id's partner must be
    /// found through DCMI (`(card, chip ^ 1)`). A die's backup NIC is its partner's NIC, which
    /// is why a switch moves traffic between partners and why the two dies of one NPU must not
    /// be told opposite NICs. Whether the partner exists (the last die of a node with an odd
    /// count has none) and is part of the job is the caller's to check against its topology.
    pub fn partner(self) -> DeviceId {
        DeviceId(self.0 ^ 1)
    }
}

/// A process's rank in the whole job (the world group).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GlobalRank(pub u32);

/// A rank's index inside one communication group; what `HcclCommWorkingDevNicSet` takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupRank(pub u32);

/// The id of one switch operation: a client-chosen or generated UUID. A repeated id returns
/// the known result instead of running twice.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperationId(pub uuid::Uuid);

/// One process of a rank. A new process of the rank (a restart) has a new instance; the same
/// process keeps its own across reconnects. After a stop of training the manager counts a rank
/// as back only under a new instance, and stops an old one that shows up again (a node cut off
/// during the stop). Drawn at random when a worker starts; [`Instance::UNKNOWN`] (0) is a peer
/// that does not say.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Instance(pub u64);

impl Instance {
    /// A worker that does not name its instance (an older peer): never matched as old.
    pub const UNKNOWN: Instance = Instance(0);

    /// Whether it names a process at all.
    pub fn is_known(self) -> bool {
        self != Instance::UNKNOWN
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

macro_rules! display_inner {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    )*};
}
display_inner!(
    JobId,
    NodeName,
    DeviceId,
    GlobalRank,
    GroupRank,
    OperationId
);

impl From<&str> for JobId {
    fn from(s: &str) -> Self {
        JobId(s.to_owned())
    }
}

impl From<&str> for NodeName {
    fn from(s: &str) -> Self {
        NodeName(s.to_owned())
    }
}

impl std::str::FromStr for OperationId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(OperationId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partners_are_the_two_dies_of_one_npu() {
        for k in 0..8 {
            let (even, odd) = (DeviceId(2 * k), DeviceId(2 * k + 1));
            assert_eq!(even.partner(), odd);
            assert_eq!(odd.partner(), even);
            assert_eq!(even.partner().partner(), even);
        }
    }
}
