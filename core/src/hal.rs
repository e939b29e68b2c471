//! The device layer's contract: what a rank and a node must be able to do for a switch.
//!
//! Calls are blocking (they are C calls into HCCL in production); the worker runs them on a
//! thread of their own, strictly one at a time per rank, as HCCL requires.

use crate::ids::{DeviceId, GlobalRank, GroupRank};
use serde::{Deserialize, Serialize};
use std::fmt;

/// `HcclResult` as HCCL defines it. [`HcclCode::Other`] keeps any code a newer HCCL adds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HcclCode {
    Success,
    Para,
    Ptr,
    Memory,
    Internal,
    NotSupport,
    NotFound,
    Unavail,
    Syscall,
    Timeout,
    OpenFileFailure,
    TcpConnect,
    RoceConnect,
    TcpTransfer,
    RoceTransfer,
    Runtime,
    Drv,
    Profiling,
    Cce,
    Network,
    Again,
    Remote,
    Suspending,
    OpretryFail,
    Oom,
    Other(i32),
}

const HCCL_NAMES: [(HcclCode, &str); 25] = [
    (HcclCode::Success, "HCCL_SUCCESS"),
    (HcclCode::Para, "HCCL_E_PARA"),
    (HcclCode::Ptr, "HCCL_E_PTR"),
    (HcclCode::Memory, "HCCL_E_MEMORY"),
    (HcclCode::Internal, "HCCL_E_INTERNAL"),
    (HcclCode::NotSupport, "HCCL_E_NOT_SUPPORT"),
    (HcclCode::NotFound, "HCCL_E_NOT_FOUND"),
    (HcclCode::Unavail, "HCCL_E_UNAVAIL"),
    (HcclCode::Syscall, "HCCL_E_SYSCALL"),
    (HcclCode::Timeout, "HCCL_E_TIMEOUT"),
    (HcclCode::OpenFileFailure, "HCCL_E_OPEN_FILE_FAILURE"),
    (HcclCode::TcpConnect, "HCCL_E_TCP_CONNECT"),
    (HcclCode::RoceConnect, "HCCL_E_ROCE_CONNECT"),
    (HcclCode::TcpTransfer, "HCCL_E_TCP_TRANSFER"),
    (HcclCode::RoceTransfer, "HCCL_E_ROCE_TRANSFER"),
    (HcclCode::Runtime, "HCCL_E_RUNTIME"),
    (HcclCode::Drv, "HCCL_E_DRV"),
    (HcclCode::Profiling, "HCCL_E_PROFILING"),
    (HcclCode::Cce, "HCCL_E_CCE"),
    (HcclCode::Network, "HCCL_E_NETWORK"),
    (HcclCode::Again, "HCCL_E_AGAIN"),
    (HcclCode::Remote, "HCCL_E_REMOTE"),
    (HcclCode::Suspending, "HCCL_E_SUSPENDING"),
    (HcclCode::OpretryFail, "HCCL_E_OPRETRY_FAIL"),
    (HcclCode::Oom, "HCCL_E_OOM"),
];

impl HcclCode {
    /// Maps the numeric `HcclResult`.
    pub fn from_raw(code: i32) -> Self {
        usize::try_from(code)
            .ok()
            .and_then(|i| HCCL_NAMES.get(i))
            .map(|(c, _)| *c)
            .unwrap_or(HcclCode::Other(code))
    }

    /// The numeric `HcclResult`.
    pub fn raw(self) -> i32 {
        match self {
            HcclCode::Other(c) => c,
            known => HCCL_NAMES
                .iter()
                .position(|(c, _)| *c == known)
                .expect("every named code is in the table") as i32,
        }
    }

    /// The name HCCL's headers and logs use, e.g. `HCCL_E_NETWORK`.
    pub fn name(self) -> &'static str {
        match self {
            HcclCode::Other(_) => "HCCL_E_UNKNOWN",
            known => HCCL_NAMES
                .iter()
                .find(|(c, _)| *c == known)
                .map(|(_, n)| *n)
                .expect("every named code is in the table"),
        }
    }
}

impl fmt::Display for HcclCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// An error from the device layer, keeping the vendor's code and what was being done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{op} failed with {code}: {detail}")]
pub struct HalError {
    /// The HAL operation, e.g. `HcclCommWorkingDevNicSet`.
    pub op: String,
    pub code: HcclCode,
    pub detail: String,
}

impl HalError {
    pub fn new(op: impl Into<String>, code: HcclCode, detail: impl Into<String>) -> Self {
        HalError {
            op: op.into(),
            code,
            detail: detail.into(),
        }
    }
}

/// One communication group a process belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// HCCL's name of the group (`HcclGetCommName`), unique in the job.
    pub name: String,
    /// Members as global ranks, in group-rank order: `members[i]` has group rank `i`.
    pub members: Vec<GlobalRank>,
}

impl GroupInfo {
    pub fn group_rank_of(&self, rank: GlobalRank) -> Option<GroupRank> {
        self.members
            .iter()
            .position(|m| *m == rank)
            .map(|i| GroupRank(i as u32))
    }
}

/// What a rank's HCCL setup allows. A switch is refused unless every rank can really switch:
/// HCCL answers success and changes nothing when L2 retry is off or there are no RDMA links.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SwitchCapabilities {
    /// `MS_ENABLE_TFT` contains `TSP:1`.
    pub tsp: bool,
    /// `HCCL_OP_RETRY_ENABLE` contains `L2:1` for this process's HCCL.
    pub l2_retry: bool,
    /// The topology has RDMA links (no RDMA: HCCL's NIC set is a silent no-op).
    pub rdma: bool,
}

impl SwitchCapabilities {
    pub const ALL: SwitchCapabilities = SwitchCapabilities {
        tsp: true,
        l2_retry: true,
        rdma: true,
    };

    /// Whether a NIC-set call on this rank would really switch.
    pub fn can_switch(&self) -> bool {
        self.tsp && self.l2_retry && self.rdma
    }

    /// What is missing, in the words of the flag an operator sets.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if !self.tsp {
            m.push("MS_ENABLE_TFT without TSP:1");
        }
        if !self.l2_retry {
            m.push("HCCL_OP_RETRY_ENABLE without L2:1");
        }
        if !self.rdma {
            m.push("no RDMA links");
        }
        m
    }
}

/// Which of a device's two NICs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NicSide {
    Primary,
    Backup,
}

impl NicSide {
    pub fn from_use_backup(use_backup: bool) -> Self {
        if use_backup {
            NicSide::Backup
        } else {
            NicSide::Primary
        }
    }
}

impl fmt::Display for NicSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NicSide::Primary => "primary",
            NicSide::Backup => "backup",
        })
    }
}

/// Link state of one device's two NICs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkHealth {
    pub device: DeviceId,
    pub primary_up: bool,
    pub backup_up: bool,
}

impl LinkHealth {
    pub fn is_up(&self, side: NicSide) -> bool {
        match side {
            NicSide::Primary => self.primary_up,
            NicSide::Backup => self.backup_up,
        }
    }
}

/// Per-rank device capability, owned by the worker of that rank and called from one thread.
pub trait RankHal: Send {
    /// The communication groups this process belongs to.
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError>;

    /// `HcclCommWorkingDevNicSet` on one group: `ranks[i]` (group ranks) use their backup NIC
    /// when `use_backup[i]`. Every member of the group must make the identical call.
    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError>;

    /// `HcclCommResume` on one group, where the HAL needs it after a switch.
    fn resume_group(&mut self, _group: &str) -> Result<(), HalError> {
        Ok(())
    }

    /// Whether a NIC-set call on this rank would really switch (L2 retry, RDMA links). The
    /// `tsp` flag is the worker's own configuration and is filled in by the worker.
    fn capabilities(&mut self) -> SwitchCapabilities;
}

/// Per-node device capability, owned by the node's proxy.
pub trait NodeHal: Send {
    fn device_count(&mut self) -> Result<u32, HalError>;

    /// Link state of both NICs of one device.
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError>;
}

/// The hook a training loop calls at every step boundary, after it completed `step`
/// (1 for the first step). A pause holds the calling thread here; otherwise it returns at once.
pub trait StepBoundary: Send + Sync {
    fn step_completed(&self, step: u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hccl_code_round_trips() {
        for raw in 0..25 {
            let c = HcclCode::from_raw(raw);
            assert_eq!(c.raw(), raw);
            assert!(!matches!(c, HcclCode::Other(_)));
        }
        assert_eq!(HcclCode::from_raw(19), HcclCode::Network);
        assert_eq!(HcclCode::Network.name(), "HCCL_E_NETWORK");
        assert_eq!(HcclCode::from_raw(9).name(), "HCCL_E_TIMEOUT");
        assert_eq!(HcclCode::from_raw(99), HcclCode::Other(99));
        assert_eq!(HcclCode::Other(99).raw(), 99);
        assert_eq!(HcclCode::from_raw(-1), HcclCode::Other(-1));
        assert_eq!(HcclCode::Oom.raw(), 24);
    }

    #[test]
    fn capabilities_name_what_is_missing() {
        assert!(SwitchCapabilities::ALL.can_switch());
        let c = SwitchCapabilities {
            l2_retry: false,
            ..SwitchCapabilities::ALL
        };
        assert!(!c.can_switch());
        assert_eq!(c.missing(), vec!["HCCL_OP_RETRY_ENABLE without L2:1"]);
    }
}
