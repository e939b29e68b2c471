//! The device layer's contract: what a rank and a node must be able to do for a switch.
//!
//! Calls are blocking (they are C calls into HCCL in production); the worker runs them on a
//! thread of their own, strictly one at a time per rank, as HCCL requires.
//!
//! Every call fails with a [`HalError`]: a [`HalErrorKind`] the control plane can act on
//! without knowing the hardware, and the vendor's own [`VendorCode`] (library, number, name)
//! kept beside it. Which code maps to which kind is written down with the codes
//! (`core/src/hal/codes.rs`, [`HcclCode::kind`], and each backend's own [`CodeTable`]).

use crate::ids::{DeviceId, GlobalRank, GroupRank};
use serde::{Deserialize, Serialize};
use std::fmt;

mod codes;
mod error;

pub use codes::{CodeTable, HcclCode};
pub use error::{
    HalError, HalErrorKind, LibraryName, LibraryNameError, VendorCode, VendorStatus,
    OTHER_CODE_NAME,
};

/// One communication group a process belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// HCCL's name of the group (`HcclGetCommName`), unique in the job.
    pub name: String,
    /// Members as global ranks, in group-rank order: `members[i]` has group rank `i`.
    pub members: Vec<GlobalRank>,
}

impl GroupInfo {
    /// `rank`'s group rank: its index in `members`, which is what HCCL's NIC-set call takes.
    /// `None` when `rank` is not a member.
    pub fn group_rank_of(&self, rank: GlobalRank) -> Option<GroupRank> {
        self.members
            .iter()
            .position(|m| *m == rank)
            .map(|i| GroupRank(i as u32))
    }
}

/// What a rank's HCCL can do, as its HAL knows it: HCCL answers success and changes nothing
/// when L2 retry is off or there are no RDMA links.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HcclCapabilities {
    /// `HCCL_OP_RETRY_ENABLE` contains `L2:1` for this process's HCCL.
    pub l2_retry: bool,
    /// The topology has RDMA links (no RDMA: HCCL's NIC set is a silent no-op).
    pub rdma: bool,
}

impl HcclCapabilities {
    /// Both present: what a HAL of a fully configured rank reports.
    pub const ALL: HcclCapabilities = HcclCapabilities {
        l2_retry: true,
        rdma: true,
    };

    /// Whether HCCL's NIC set on this rank really switches, rather than succeed and change
    /// nothing.
    pub fn can_switch(&self) -> bool {
        self.l2_retry && self.rdma
    }
}

/// What a registered rank can switch: its training framework's TSP, which the worker knows
/// from its process's configuration, and its HCCL's capabilities, which the HAL reports. A
/// switch is refused unless every rank can really switch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SwitchCapabilities {
    /// `MS_ENABLE_TFT` contains `TSP:1`: the framework lets its communication be paused and
    /// the NIC switched (the worker's registration carries it; no HAL knows it).
    pub tsp: bool,
    /// `HCCL_OP_RETRY_ENABLE` contains `L2:1` for this process's HCCL.
    pub l2_retry: bool,
    /// The topology has RDMA links (no RDMA: HCCL's NIC set is a silent no-op).
    pub rdma: bool,
}

impl SwitchCapabilities {
    /// Everything present: what a fully configured rank reports, and the identity when the
    /// manager intersects ranks' capabilities to name what is missing anywhere.
    pub const ALL: SwitchCapabilities = SwitchCapabilities::new(true, HcclCapabilities::ALL);

    /// A rank's registration: the framework's `tsp` joined to what its HAL says of HCCL.
    pub const fn new(tsp: bool, hccl: HcclCapabilities) -> Self {
        SwitchCapabilities {
            tsp,
            l2_retry: hccl.l2_retry,
            rdma: hccl.rdma,
        }
    }

    /// The HCCL part, as a HAL reports it.
    pub fn hccl(&self) -> HcclCapabilities {
        HcclCapabilities {
            l2_retry: self.l2_retry,
            rdma: self.rdma,
        }
    }

    /// What both `self` and `other` have: the manager's intersection over ranks.
    pub fn and(self, other: SwitchCapabilities) -> SwitchCapabilities {
        SwitchCapabilities {
            tsp: self.tsp && other.tsp,
            l2_retry: self.l2_retry && other.l2_retry,
            rdma: self.rdma && other.rdma,
        }
    }

    /// Whether a NIC-set call on this rank would really switch.
    pub fn can_switch(&self) -> bool {
        self.tsp && self.hccl().can_switch()
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
///
/// The control plane speaks of sides; HCCL's `HcclCommWorkingDevNicSet` takes one `useBackup`
/// flag per rank, and so do the wire formats (`use_backup` in the protobuf and in the JSON of
/// a command). [`NicSide::from_use_backup`] and [`NicSide::use_backup`] convert at those
/// boundaries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NicSide {
    /// The NIC a device uses by default (HCCL's default for a new group).
    Primary,
    /// The other NIC of the device's pair, taken over when the primary fails.
    Backup,
}

impl NicSide {
    /// The side a `use_backup` flag names.
    pub fn from_use_backup(use_backup: bool) -> Self {
        if use_backup {
            NicSide::Backup
        } else {
            NicSide::Primary
        }
    }

    /// HCCL's `useBackup` flag for this side.
    pub fn use_backup(self) -> bool {
        self == NicSide::Backup
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
///
/// A side is *up*, *down*, or *unknown*: its probe did not answer in time, failed, or the die
/// whose NIC it is cannot be seen from this node. An unknown side is reported not up, with the
/// reason in `primary_unknown` / `backup_unknown`, so that a switch onto it is refused with
/// that reason rather than as a link that is down (and rather than going ahead blind).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkHealth {
    /// The device, by the rank table's (physical) id; see [`DeviceId`].
    pub device: DeviceId,
    /// The device's own NIC is up.
    pub primary_up: bool,
    /// Its backup NIC (its partner die's NIC) is up.
    pub backup_up: bool,
    /// Why the primary side's state is not known, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_unknown: Option<String>,
    /// Why the backup side's state is not known, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_unknown: Option<String>,
    /// Why the primary side, up, is degraded (its probe's loss or round-trip time is past a
    /// threshold), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_degraded: Option<String>,
    /// Why the backup side, up, is degraded, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_degraded: Option<String>,
}

impl LinkHealth {
    /// Both sides known: up or down as given.
    pub fn new(device: DeviceId, primary_up: bool, backup_up: bool) -> Self {
        LinkHealth {
            device,
            primary_up,
            backup_up,
            primary_unknown: None,
            backup_unknown: None,
            primary_degraded: None,
            backup_degraded: None,
        }
    }

    /// `side` is up but degraded, for `reason`. A side that is not up stays not up.
    pub fn with_degraded(mut self, side: NicSide, reason: impl Into<String>) -> Self {
        if self.is_up(side) {
            let reason = Some(reason.into());
            match side {
                NicSide::Primary => self.primary_degraded = reason,
                NicSide::Backup => self.backup_degraded = reason,
            }
        }
        self
    }

    /// Why `side` is degraded; `None` when it is not.
    pub fn degraded(&self, side: NicSide) -> Option<&str> {
        match side {
            NicSide::Primary => self.primary_degraded.as_deref(),
            NicSide::Backup => self.backup_degraded.as_deref(),
        }
    }

    /// `side` is unknown, for `reason` (and so not up).
    pub fn with_unknown(mut self, side: NicSide, reason: impl Into<String>) -> Self {
        let reason = Some(reason.into());
        match side {
            NicSide::Primary => (self.primary_up, self.primary_unknown) = (false, reason),
            NicSide::Backup => (self.backup_up, self.backup_unknown) = (false, reason),
        }
        self
    }

    /// Whether `side` is known to be up.
    pub fn is_up(&self, side: NicSide) -> bool {
        match side {
            NicSide::Primary => self.primary_up,
            NicSide::Backup => self.backup_up,
        }
    }

    /// Why `side`'s state is not known; `None` when it is (up or down).
    pub fn unknown(&self, side: NicSide) -> Option<&str> {
        match side {
            NicSide::Primary => self.primary_unknown.as_deref(),
            NicSide::Backup => self.backup_unknown.as_deref(),
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

    /// What this rank's HCCL can do (L2 retry, RDMA links). TSP is not the HAL's to know: the
    /// worker joins in its process's own (`MS_ENABLE_TFT`, [`SwitchCapabilities::new`]).
    fn capabilities(&mut self) -> HcclCapabilities;

    /// The time the NIC-set calls of the directive the worker handles now have: shorter than
    /// the phase's deadline, so that a call that gives up still leaves the rollback its
    /// time. A HAL whose calls another timeout bounds (HCCL's own) ignores it; a framework's
    /// switch function is handed it.
    fn set_call_timeout(&mut self, _timeout: std::time::Duration) {}
}

/// The answer of one NIC-set call of a [`TaskRankHal`], when it comes.
pub type HalFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), HalError>> + Send + 'a>>;

/// The groups a [`TaskRankHal`] reads, when they come.
pub type GroupsFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<GroupInfo>, HalError>> + Send + 'a>,
>;

/// The HAL a worker holds: the calls of [`RankHal`] whose answers are futures, so that the
/// worker's actor never blocks on one. A blocking [`RankHal`] becomes one on a thread that
/// owns it (`taskd_actors::ThreadedRankHal`); a simulated rank waits for its group's other
/// members as a task, not a blocked thread (a process hosting thousands of ranks). The same
/// calls and rules as [`RankHal`], the calls of one rank strictly one after the other.
pub trait TaskRankHal: Send {
    /// The communication groups this process belongs to.
    fn groups(&mut self) -> GroupsFuture<'_>;

    /// `HcclCommWorkingDevNicSet` on one group (see [`RankHal::set_working_nic`]).
    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a>;

    /// What this rank's HCCL can do (see [`RankHal::capabilities`]). Asked when the worker
    /// starts, before any other call: it may wait for the HAL's own thread.
    fn capabilities(&mut self) -> HcclCapabilities;

    /// The time the next NIC-set calls have (see [`RankHal::set_call_timeout`]).
    fn set_call_timeout(&mut self, _timeout: std::time::Duration) {}
}

/// Per-node device capability, owned by the node's proxy.
///
/// The proxy needs only the link health of the devices a switch targets; counting a node's
/// devices is a preflight question, answered by the DCMI HAL itself
/// (`taskd_hal_ascend::AscendNodeHal::device_count`).
pub trait NodeHal: Send {
    /// Link state of both NICs of one device. `device` is the rank table's id of the die, its
    /// *physical* id (`/dev/davinciN`), whatever the renumbering inside the container.
    ///
    /// A call must return within a bounded time: a side whose probe does not answer is
    /// reported unknown ([`LinkHealth::with_unknown`]), never waited for without end.
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError>;

    /// Registers `wake`, called (from any thread) as soon as the HAL learns from its system
    /// that a link of the node changed (the kernel's carrier event), so that the proxy reads
    /// the links at once instead of at its next probe round; a link state read because of such
    /// a wake-up is the system's own word, not a probe's. `false`: the HAL has no such events
    /// (the default) and only its probe rounds see changes.
    fn watch(&mut self, _wake: LinkWake) -> bool {
        false
    }
}

/// What a [`NodeHal`] calls when its system says a link changed ([`NodeHal::watch`]).
pub type LinkWake = Box<dyn Fn() + Send + Sync>;

/// What a training loop does after a step boundary: go on, or stop training.
#[must_use = "a rank told to stop must end its training loop"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// Run the next step.
    Go,
    /// The manager stopped training (its reason, one line): end the training loop and exit
    /// with a failure, so the launcher restarts the process as a new incarnation.
    Stop(String),
}

impl StepOutcome {
    /// Whether the loop must end.
    pub fn is_stop(&self) -> bool {
        matches!(self, StepOutcome::Stop(_))
    }

    /// Why training was stopped, when it was.
    pub fn stop_reason(&self) -> Option<&str> {
        match self {
            StepOutcome::Stop(why) => Some(why),
            StepOutcome::Go => None,
        }
    }
}

/// The hook a training loop calls at every step boundary, after it completed `step`
/// (1 for the first step). A pause holds the calling thread here; otherwise it returns at once.
pub trait StepBoundary: Send + Sync {
    /// Called after step `step` completed and before the next step issues any collective: a
    /// rank held here has no collective in flight, which HCCL's NIC-set call requires
    /// (`docs/hal.md`). Must be cheap when no operation is pending: it runs every step.
    /// [`StepOutcome::Stop`] ends the loop.
    fn step_completed(&self, step: u64) -> StepOutcome;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_side_is_not_up_and_says_why() {
        let h = LinkHealth::new(DeviceId(4), true, true)
            .with_unknown(NicSide::Backup, "probe did not answer within 1s");
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        assert_eq!(h.unknown(NicSide::Primary), None);
        assert_eq!(
            h.unknown(NicSide::Backup),
            Some("probe did not answer within 1s")
        );
        // Known sides serialize as before; an unknown side adds its reason.
        let known = serde_json::to_value(LinkHealth::new(DeviceId(1), true, false)).unwrap();
        assert_eq!(
            known,
            serde_json::json!({"device": 1, "primary_up": true, "backup_up": false})
        );
        let back: LinkHealth = serde_json::from_value(serde_json::to_value(&h).unwrap()).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn a_degraded_side_stays_up_and_says_why() {
        let h = LinkHealth::new(DeviceId(2), true, false)
            .with_degraded(NicSide::Primary, "probe lost 3/8 echoes")
            .with_degraded(NicSide::Backup, "not up: ignored");
        assert!(h.is_up(NicSide::Primary));
        assert_eq!(h.degraded(NicSide::Primary), Some("probe lost 3/8 echoes"));
        assert_eq!(
            h.degraded(NicSide::Backup),
            None,
            "a side that is down is not degraded"
        );
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["primary_degraded"], "probe lost 3/8 echoes");
        let back: LinkHealth = serde_json::from_value(json).unwrap();
        assert_eq!(back, h);
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

    #[test]
    fn a_registration_joins_the_frameworks_tsp_to_the_hals_hccl() {
        let hccl = HcclCapabilities {
            l2_retry: true,
            rdma: false,
        };
        let c = SwitchCapabilities::new(false, hccl);
        assert_eq!((c.tsp, c.l2_retry, c.rdma), (false, true, false));
        assert_eq!(c.hccl(), hccl);
        assert!(!hccl.can_switch() && HcclCapabilities::ALL.can_switch());
        assert_eq!(
            c.missing(),
            vec!["MS_ENABLE_TFT without TSP:1", "no RDMA links"]
        );
        assert_eq!(SwitchCapabilities::ALL.hccl(), HcclCapabilities::ALL);
        // The intersection keeps what every rank has, and ALL is its identity.
        let no_l2 = SwitchCapabilities::new(
            true,
            HcclCapabilities {
                l2_retry: false,
                rdma: true,
            },
        );
        assert_eq!(
            SwitchCapabilities::ALL.and(c).and(no_l2),
            SwitchCapabilities::new(
                false,
                HcclCapabilities {
                    l2_retry: false,
                    rdma: false
                }
            )
        );
        assert_eq!(SwitchCapabilities::ALL.and(no_l2), no_l2);
    }
}
