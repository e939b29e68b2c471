//! The device layer's contract: what a rank and a node must be able to do for a switch.
//!
//! Nothing in the contract is one vendor's: a rank HAL lists the groups of its process, switches
//! the NICs of some members of one group, and says what its backend lacks for a switch to
//! really switch ([`SwitchCapabilities`], each [`Missing`] thing named by the backend); a node
//! HAL tells each NIC's [`SideState`]. HCCL is one backend (`taskd-hal-ascend`, simulated by
//! `taskd-hal-mock`), a framework's switch function another (`taskd-capi`); docs/hal.md says how
//! to add one.
//!
//! Calls are blocking (C calls into the vendor's library in production); the worker runs them
//! on a thread of their own, strictly one at a time per rank, as HCCL requires.
//!
//! Every call fails with a [`HalError`]: a [`HalErrorKind`] the control plane can act on
//! without knowing the hardware, and the vendor's own [`VendorCode`] (library, number, name)
//! kept beside it. Which code maps to which kind is written down with each backend's codes (its
//! own [`CodeTable`]; HCCL's is [`HcclCode::kind`], in `core/src/hal/codes.rs` because the real
//! and the simulated HCCL share it).

use crate::ids::{DeviceId, GlobalRank, GroupRank};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

mod codes;
mod error;
mod hccl;

pub use codes::{CodeTable, HcclCode};
pub use error::{
    HalError, HalErrorKind, LibraryName, LibraryNameError, VendorCode, VendorStatus,
    OTHER_CODE_NAME,
};
pub use hccl::HcclSetup;

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

/// One thing a rank lacks for its NIC switch to really switch, named by the backend that knows
/// it is needed: HCCL's NIC set, for one, succeeds and changes nothing without L2 retry or RDMA
/// links ([`HcclSetup`]); a framework that cannot pause its communication cannot be switched
/// under ([`Missing::TSP`]).
///
/// A backend writes its own as constants, `Missing::new(ACME, "ACME_MULTIRAIL=0")`; the
/// manager only collects and shows them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Missing {
    /// Who says it is needed: the backend's library (`hccl`), or [`LibraryName::FRAMEWORK`].
    pub by: LibraryName,
    /// What is missing, in the words of the setting an operator changes
    /// (`HCCL_OP_RETRY_ENABLE without L2:1`).
    pub what: Cow<'static, str>,
}

impl Missing {
    /// The training framework lets its communication be paused and the NIC switched only with
    /// `MS_ENABLE_TFT` containing `TSP:1`. No HAL knows it: the worker adds it from its
    /// process's configuration ([`SwitchCapabilities::with_tsp`]).
    pub const TSP: Missing = Missing::new(LibraryName::FRAMEWORK, "MS_ENABLE_TFT without TSP:1");

    /// `what` is missing, as `by` says.
    pub const fn new(by: LibraryName, what: &'static str) -> Self {
        Missing {
            by,
            what: Cow::Borrowed(what),
        }
    }
}

/// The words alone: what an operator sets.
impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

/// What a rank lacks for a NIC switch: nothing ([`SwitchCapabilities::ALL`]), or each
/// [`Missing`] thing as its backend named it.
///
/// A rank HAL answers with its backend's part ([`RankHal::capabilities`]); the worker adds the
/// framework's TSP ([`SwitchCapabilities::with_tsp`]) and registers the whole; the manager
/// refuses a switch unless no rank lacks anything, naming everything missing anywhere (the
/// ledger's `CapabilityMissing`). The things are kept sorted and once each, so two ranks that
/// lack the same compare equal and a message lists them in one order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchCapabilities {
    missing: BTreeSet<Missing>,
}

impl SwitchCapabilities {
    /// Nothing missing: what a fully configured rank reports, and the identity when the
    /// manager joins ranks' capabilities to name what is missing anywhere.
    pub const ALL: SwitchCapabilities = SwitchCapabilities {
        missing: BTreeSet::new(),
    };

    /// A rank that lacks each of `missing`.
    pub fn lacking(missing: impl IntoIterator<Item = Missing>) -> Self {
        SwitchCapabilities {
            missing: missing.into_iter().collect(),
        }
    }

    /// A rank's registration: what its HAL says, and [`Missing::TSP`] unless the framework runs
    /// with TSP (`tsp`, from the worker's configuration).
    pub fn with_tsp(mut self, tsp: bool) -> Self {
        if !tsp {
            self.missing.insert(Missing::TSP);
        }
        self
    }

    /// What `self` and `other` lack together: the manager's join over ranks.
    pub fn and(mut self, other: SwitchCapabilities) -> SwitchCapabilities {
        self.missing.extend(other.missing);
        self
    }

    /// Whether a NIC switch on this rank would really switch: nothing is missing.
    pub fn can_switch(&self) -> bool {
        self.missing.is_empty()
    }

    /// Whether `thing` is missing.
    pub fn lacks(&self, thing: &Missing) -> bool {
        self.missing.contains(thing)
    }

    /// What is missing, sorted by who named it, then by its words.
    pub fn missing(&self) -> impl Iterator<Item = &Missing> + '_ {
        self.missing.iter()
    }
}

/// What is missing, in the words of the settings an operator changes, comma separated
/// (`MS_ENABLE_TFT without TSP:1, no RDMA links`); `nothing missing` for none.
impl fmt::Display for SwitchCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.missing.is_empty() {
            return f.write_str("nothing missing");
        }
        for (i, m) in self.missing.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{m}")?;
        }
        Ok(())
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

/// One NIC's state, as its node's HAL saw it: the one link-state type of the control plane
/// (the HALs return it, the proxy reports it, the wire carries it, the automatic policy reads
/// it).
///
/// Every state but up says why, in the HAL's words (empty when it has nothing to add): a
/// degraded link its probe's loss or delay, a down link the kernel's or the device's words, an
/// unknown one why it could not be told (its probe failed or did not answer in time, or the die
/// whose NIC it is cannot be seen from this node).
///
/// Two questions are asked of it. [`SideState::is_up`]: does the link carry traffic, so that a
/// switch may go onto it (degraded does); a switch onto an unknown side is refused with its
/// reason rather than as a link that is down, and never goes ahead blind.
/// [`SideState::is_healthy`]: is it a link to stay on (degraded is not; the automatic policy
/// moves a device off it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", content = "why", rename_all = "snake_case")]
pub enum SideState {
    /// Up, and its probe (when there is one) within its thresholds.
    Up,
    /// Up, but its probe's loss or round-trip time is past a threshold: why.
    Degraded(String),
    /// Down (no carrier, administratively down, the device's health says so): why.
    Down(String),
    /// Not known: why. Not up.
    Unknown(String),
}

impl SideState {
    /// Up, or down with nothing more to say: a HAL that knows only whether the link is up.
    pub fn up_or_down(up: bool) -> Self {
        if up {
            SideState::Up
        } else {
            SideState::Down(String::new())
        }
    }

    /// Whether the link carries traffic (up, or degraded): a switch may go onto it.
    pub fn is_up(&self) -> bool {
        matches!(self, SideState::Up | SideState::Degraded(_))
    }

    /// Whether it is a link to stay on: up and not degraded. What the automatic failover
    /// policy reads; anything else counts as a failed link there.
    pub fn is_healthy(&self) -> bool {
        matches!(self, SideState::Up)
    }

    /// Why the link is not plainly up; `None` when it is. May be empty.
    pub fn reason(&self) -> Option<&str> {
        match self {
            SideState::Up => None,
            SideState::Degraded(why) | SideState::Down(why) | SideState::Unknown(why) => Some(why),
        }
    }

    /// The state's name in logs, metrics and JSON: `up`, `degraded`, `down` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SideState::Up => "up",
            SideState::Degraded(_) => "degraded",
            SideState::Down(_) => "down",
            SideState::Unknown(_) => "unknown",
        }
    }

    /// Whether `self` and `other` are the same state, whatever their reasons: a degraded link
    /// whose loss changed is still the same degraded link.
    pub fn same_state(&self, other: &SideState) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// `up`, `down`, or the state and why: `degraded: loss 50% > 25%`.
impl fmt::Display for SideState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(why) if !why.is_empty() => write!(f, "{}: {why}", self.as_str()),
            _ => f.write_str(self.as_str()),
        }
    }
}

/// Link state of one device's two NICs: what [`NodeHal::link_health`] returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkHealth {
    /// The device, by the rank table's (physical) id; see [`DeviceId`].
    pub device: DeviceId,
    /// The device's own NIC.
    pub primary: SideState,
    /// Its backup NIC (its partner die's NIC).
    pub backup: SideState,
}

impl LinkHealth {
    /// Both sides known, up or down as given, with nothing more to say of a side that is down.
    pub fn new(device: DeviceId, primary_up: bool, backup_up: bool) -> Self {
        LinkHealth {
            device,
            primary: SideState::up_or_down(primary_up),
            backup: SideState::up_or_down(backup_up),
        }
    }

    /// `side` is in `state`.
    pub fn with(mut self, side: NicSide, state: SideState) -> Self {
        match side {
            NicSide::Primary => self.primary = state,
            NicSide::Backup => self.backup = state,
        }
        self
    }

    /// `side`, up, is degraded, for `reason`. A side that is not up stays as it is.
    pub fn with_degraded(self, side: NicSide, reason: impl Into<String>) -> Self {
        if self.side(side).is_up() {
            self.with(side, SideState::Degraded(reason.into()))
        } else {
            self
        }
    }

    /// `side` is unknown, for `reason` (and so not up).
    pub fn with_unknown(self, side: NicSide, reason: impl Into<String>) -> Self {
        self.with(side, SideState::Unknown(reason.into()))
    }

    /// The state of `side`.
    pub fn side(&self, side: NicSide) -> &SideState {
        match side {
            NicSide::Primary => &self.primary,
            NicSide::Backup => &self.backup,
        }
    }

    /// Whether `side` carries traffic (up, or degraded): see [`SideState::is_up`].
    pub fn is_up(&self, side: NicSide) -> bool {
        self.side(side).is_up()
    }

    /// Why `side` is degraded; `None` when it is not.
    pub fn degraded(&self, side: NicSide) -> Option<&str> {
        match self.side(side) {
            SideState::Degraded(why) => Some(why),
            _ => None,
        }
    }

    /// Why `side`'s state is not known; `None` when it is (up, degraded or down).
    pub fn unknown(&self, side: NicSide) -> Option<&str> {
        match self.side(side) {
            SideState::Unknown(why) => Some(why),
            _ => None,
        }
    }
}

/// Per-rank device capability, owned by the worker of that rank and called from one thread.
pub trait RankHal: Send {
    /// The communication groups this process belongs to.
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError>;

    /// Switches the working NIC of some members of one group: `ranks[i]` (group ranks) use
    /// their backup NIC when `use_backup[i]`. Every member of the group must make the identical
    /// call (HCCL's is `HcclCommWorkingDevNicSet`; a framework's switch function takes the
    /// whole list at once).
    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError>;

    /// What this rank's backend lacks for [`RankHal::set_working_nic`] to really switch, each
    /// thing named by the backend (HCCL's: [`HcclSetup`]); [`SwitchCapabilities::ALL`] when
    /// nothing. TSP is not the HAL's to know: the worker adds its process's own
    /// ([`SwitchCapabilities::with_tsp`]).
    fn capabilities(&mut self) -> SwitchCapabilities;

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

    /// Switches the working NIC of some members of one group (see
    /// [`RankHal::set_working_nic`]).
    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a>;

    /// What this rank's backend lacks (see [`RankHal::capabilities`]). Asked when the worker
    /// starts, before any other call: it may wait for the HAL's own thread.
    fn capabilities(&mut self) -> SwitchCapabilities;

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
    /// The answer is the two sides' states ([`SideState`]: up, degraded, down or unknown, each
    /// with the HAL's reason). A call must return within a bounded time: a side whose probe
    /// does not answer is reported [`SideState::Unknown`], never waited for without end.
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
        // Each side is its state, and its reason when it has one.
        let known = serde_json::to_value(LinkHealth::new(DeviceId(1), true, false)).unwrap();
        assert_eq!(
            known,
            serde_json::json!({"device": 1, "primary": {"state": "up"},
                               "backup": {"state": "down", "why": ""}})
        );
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(
            json["backup"],
            serde_json::json!({"state": "unknown", "why": "probe did not answer within 1s"})
        );
        let back: LinkHealth = serde_json::from_value(json).unwrap();
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
        assert_eq!(json["primary"]["state"], "degraded");
        assert_eq!(json["primary"]["why"], "probe lost 3/8 echoes");
        let back: LinkHealth = serde_json::from_value(json).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn a_side_is_up_healthy_or_neither_and_says_why() {
        let states = [
            SideState::Up,
            SideState::Degraded("loss 50% > 25%".into()),
            SideState::Down("operstate down".into()),
            SideState::Unknown(String::new()),
        ];
        let up: Vec<bool> = states.iter().map(SideState::is_up).collect();
        let healthy: Vec<bool> = states.iter().map(SideState::is_healthy).collect();
        assert_eq!(up, [true, true, false, false]);
        assert_eq!(healthy, [true, false, false, false]);
        let shown: Vec<String> = states.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "up",
                "degraded: loss 50% > 25%",
                "down: operstate down",
                "unknown"
            ]
        );
        assert_eq!(states[0].reason(), None);
        assert_eq!(states[3].reason(), Some(""));
        assert!(states[1].same_state(&SideState::Degraded("loss 75% > 25%".into())));
        assert!(!states[2].same_state(&states[3]));
        assert_eq!(SideState::up_or_down(false), SideState::Down(String::new()));
        let h = LinkHealth::new(DeviceId(0), true, true).with(NicSide::Backup, states[2].clone());
        assert_eq!(
            (h.side(NicSide::Primary), h.side(NicSide::Backup)),
            (&states[0], &states[2])
        );
    }

    #[test]
    fn capabilities_name_what_is_missing() {
        assert!(SwitchCapabilities::ALL.can_switch());
        let c = HcclSetup {
            l2_retry: false,
            rdma: true,
        }
        .capabilities();
        assert!(!c.can_switch());
        assert_eq!(c.to_string(), "HCCL_OP_RETRY_ENABLE without L2:1");
        assert!(c.lacks(&HcclSetup::L2_RETRY_OFF) && !c.lacks(&HcclSetup::NO_RDMA));
        assert_eq!(SwitchCapabilities::ALL.to_string(), "nothing missing");
    }

    #[test]
    fn a_registration_joins_the_frameworks_tsp_to_the_hals_answer() {
        let hccl = HcclSetup {
            l2_retry: true,
            rdma: false,
        };
        let c = hccl.capabilities().with_tsp(false);
        assert!(c.lacks(&Missing::TSP) && c.lacks(&HcclSetup::NO_RDMA));
        assert_eq!(c.to_string(), "MS_ENABLE_TFT without TSP:1, no RDMA links");
        assert_eq!(
            c.missing().map(|m| m.by.as_str()).collect::<Vec<_>>(),
            ["framework", "hccl"]
        );
        assert_eq!(
            HcclSetup::ALL.capabilities().with_tsp(true),
            SwitchCapabilities::ALL
        );
        // The join keeps what any rank lacks, once, and ALL is its identity.
        let no_l2 = HcclSetup {
            l2_retry: false,
            rdma: true,
        }
        .capabilities();
        let all = SwitchCapabilities::ALL.and(c.clone()).and(no_l2.clone());
        assert_eq!(
            all.to_string(),
            "MS_ENABLE_TFT without TSP:1, HCCL_OP_RETRY_ENABLE without L2:1, no RDMA links"
        );
        assert_eq!(all.clone().and(c), all);
        assert_eq!(SwitchCapabilities::ALL.and(no_l2.clone()), no_l2);
        // Another backend names its own, beside HCCL's.
        const ACME: LibraryName = LibraryName::new("acme");
        let acme = SwitchCapabilities::lacking([Missing::new(ACME, "ACME_MULTIRAIL=0")]);
        assert_eq!(acme.clone().and(no_l2).missing().count(), 2);
        let json = serde_json::to_value(&acme).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"missing": [{"by": "acme", "what": "ACME_MULTIRAIL=0"}]})
        );
        assert_eq!(
            serde_json::from_value::<SwitchCapabilities>(json).unwrap(),
            acme
        );
    }
}
