//! The automatic failover policy: which devices to move to their backup NIC, or back, without
//! waiting for an operator; when; and, when it holds a move back, why.
//!
//! Pure, like the operation machine: the manager hands in what the proxies' link probes saw
//! ([`AutoPolicy::link_changed`]), what the job allows now ([`JobGate`], each device's NIC side)
//! and the time; [`AutoPolicy::evaluate`] answers with its [`Evaluation`]: the decisions (the
//! moves of the one operation to start now, if any, and every move held back, with its reason)
//! and when to ask again. The rules (docs/auto-failover.md):
//!
//! - A device whose link in use (its primary, or its backup once it moved) has been not up for
//!   `down_after` consecutive probes moves to its other NIC if that link is up; if it is not
//!   up either, nothing moves and the decision says so. A link whose state is unknown (its probe
//!   failed or did not answer) counts as not up.
//! - A device the policy moved to its backup NIC whose primary link has been up for
//!   `switchback_after` continuously moves back. A device an operator put on its backup NIC
//!   stays there (the operator decided; the policy does not undo it).
//! - A device with more than `max_flaps` link changes in the last `flap_window` stays where it
//!   is until its links calm down.
//! - Moves that fall due within `coalesce` of the first one go in one operation; no operation
//!   while another runs, while the job is not running or not verified, or within
//!   `min_interval` of the previous automatic one; a device whose automatic operation failed is
//!   not moved again until its links change.
//! - The two dies of one NPU are never told opposite sides in one operation (HCCL refuses the
//!   call, see [`crate::command::ValidationError::PartnerConflict`]): when both fall due that
//!   way, the one due first goes now and its partner in the next operation.
//!
//! The policy reads each link's [`SideState`] as its node's HAL reported it. A link that is up
//! but *degraded* (its probe's loss or round-trip time past a threshold: `taskd-hal-linux`)
//! counts as not up, with reasons of its own (`primary_degraded`, `backup_degraded`): the
//! device moves off it under the same damping, and a switchback waits until the primary has
//! been up and healthy for the hold time.
//!
//! Only changes of a link's *health* ([`SideState::is_healthy`]) count: a link going from down
//! to unknown did not change, nor did a degraded link whose loss changed.

use crate::hal::{LinkHealth, NicSide, SideState};
use crate::ids::{DeviceId, NodeName, OperationId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// The policy's knobs (`taskd manager --auto-failover`, `taskd sim --auto-failover`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoConfig {
    /// How often each proxy probes both links of every device of its node (`--link-probe-ms`).
    pub link_probe: Duration,
    /// Consecutive probes a link in use must fail before its device moves (`--down-after`).
    pub down_after: u32,
    /// Moves due within this long of the first one go in one operation (`--coalesce-ms`).
    pub coalesce: Duration,
    /// How long a primary link must be up before a device on backup moves back
    /// (`--switchback-after-ms`).
    pub switchback_after: Duration,
    /// More link changes than this within [`AutoConfig::flap_window`] hold a device where it
    /// is (`--max-flaps`).
    pub max_flaps: u32,
    /// The window in which link changes are counted (`--flap-window-ms`).
    pub flap_window: Duration,
    /// The shortest time between the starts of two automatic operations (`--min-interval-ms`).
    pub min_interval: Duration,
}

impl Default for AutoConfig {
    /// The defaults docs/auto-failover.md explains: probe every 2 s, act
    /// after 3 failed probes (a kernel's carrier loss at once), gather 200 ms, switch back after 5 min up, damp more than 4 changes
    /// a minute, at most one automatic operation per 30 s.
    fn default() -> Self {
        AutoConfig {
            link_probe: Duration::from_millis(2_000),
            down_after: 3,
            coalesce: Duration::from_millis(200),
            switchback_after: Duration::from_millis(300_000),
            max_flaps: 4,
            flap_window: Duration::from_millis(60_000),
            min_interval: Duration::from_millis(30_000),
        }
    }
}

/// A knob the policy cannot work with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AutoConfigError {
    /// A zero probe interval would probe without pause.
    #[error("the link probe interval must be at least 1 ms")]
    ZeroProbe,
    /// A link must fail at least one probe.
    #[error("down-after must be at least 1 probe")]
    ZeroDownAfter,
    /// With no change allowed, every link that ever changed would be flapping.
    #[error("max-flaps must be at least 1")]
    ZeroMaxFlaps,
    /// Changes must be counted over some time.
    #[error("the flap window must be at least 1 ms")]
    ZeroFlapWindow,
}

impl AutoConfig {
    /// Refuses knobs the policy cannot work with, naming the knob.
    pub fn validate(&self) -> Result<(), AutoConfigError> {
        if self.link_probe.is_zero() {
            return Err(AutoConfigError::ZeroProbe);
        }
        if self.down_after == 0 {
            return Err(AutoConfigError::ZeroDownAfter);
        }
        if self.max_flaps == 0 {
            return Err(AutoConfigError::ZeroMaxFlaps);
        }
        if self.flap_window.is_zero() {
            return Err(AutoConfigError::ZeroFlapWindow);
        }
        Ok(())
    }

    /// How long after the first failed probe the `down_after`-th one comes: the proxies report
    /// changes only, so consecutive failed probes are the time a link stayed not up.
    pub fn confirm_delay(&self) -> Duration {
        self.link_probe
            .saturating_mul(self.down_after.saturating_sub(1))
    }
}

/// Both links of one device, as its node's HAL saw them: its own NIC (primary) and its partner
/// die's (backup). The policy reads each side's [`SideState`] as it is: only a healthy link
/// ([`SideState::is_healthy`]) is one to stay on or move to; down, unknown and degraded links
/// are not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Links {
    /// The device's own NIC.
    pub primary: SideState,
    /// The NIC it uses on backup (its partner die's).
    pub backup: SideState,
}

impl Links {
    /// Both links' states known: up or down as given.
    pub fn known(primary_up: bool, backup_up: bool) -> Self {
        Links {
            primary: SideState::up_or_down(primary_up),
            backup: SideState::up_or_down(backup_up),
        }
    }

    /// Both sides of a node HAL's answer, as they are.
    pub fn from_health(h: &LinkHealth) -> Self {
        Links {
            primary: h.primary.clone(),
            backup: h.backup.clone(),
        }
    }

    /// Neither link's state is known (the node's HAL failed), for `why`.
    pub fn unknown(why: &str) -> Self {
        Links {
            primary: SideState::Unknown(why.to_owned()),
            backup: SideState::Unknown(why.to_owned()),
        }
    }

    /// The state of `side`'s link.
    pub fn side(&self, side: NicSide) -> &SideState {
        match side {
            NicSide::Primary => &self.primary,
            NicSide::Backup => &self.backup,
        }
    }

    /// Whether both sides are in the same states as `other`'s, whatever their reasons
    /// ([`SideState::same_state`]).
    pub fn same_states(&self, other: &Links) -> bool {
        self.primary.same_state(&other.primary) && self.backup.same_state(&other.backup)
    }
}

/// `primary down, backup up`: the states, without their reasons.
impl fmt::Display for Links {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "primary {}, backup {}",
            self.primary.as_str(),
            self.backup.as_str()
        )
    }
}

/// One device of the job, by node and device number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceKey {
    /// The node.
    pub node: NodeName,
    /// The device on that node.
    pub device: DeviceId,
}

impl DeviceKey {
    /// Device `device` of node `node`.
    pub fn new(node: NodeName, device: DeviceId) -> Self {
        DeviceKey { node, device }
    }

    /// The other die of the same NPU ([`DeviceId::partner`]).
    pub fn partner(&self) -> DeviceKey {
        DeviceKey {
            node: self.node.clone(),
            device: self.device.partner(),
        }
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.device)
    }
}

/// What a decision did.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoAction {
    /// The device moves to its backup NIC in the operation started now.
    ToBackup,
    /// The device moves back to its primary NIC in the operation started now.
    ToPrimary,
    /// The device stays where it is, for the decision's reason.
    Hold,
}

impl AutoAction {
    /// Every action: the values of the `action` label.
    pub const ALL: [AutoAction; 3] = [
        AutoAction::ToBackup,
        AutoAction::ToPrimary,
        AutoAction::Hold,
    ];

    /// The name used in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            AutoAction::ToBackup => "to_backup",
            AutoAction::ToPrimary => "to_primary",
            AutoAction::Hold => "hold",
        }
    }

    fn to(side: NicSide) -> Self {
        match side {
            NicSide::Primary => AutoAction::ToPrimary,
            NicSide::Backup => AutoAction::ToBackup,
        }
    }

    /// The side a move goes to (`None` for a hold).
    pub fn side(self) -> Option<NicSide> {
        match self {
            AutoAction::ToBackup => Some(NicSide::Backup),
            AutoAction::ToPrimary => Some(NicSide::Primary),
            AutoAction::Hold => None,
        }
    }
}

/// Why a decision was taken: the values of the `reason` label, a fixed set.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoReason {
    /// The primary link failed: a move to backup, or (no backup) a hold on a device on backup.
    PrimaryDown,
    /// The backup link failed: a move back to primary, or a hold of a device whose primary
    /// failed with no backup to go to.
    BackupDown,
    /// The primary link is up but degraded: a move to backup (or a hold, as for a failure).
    PrimaryDegraded,
    /// The backup link is up but degraded: a move back to primary (or a hold).
    BackupDegraded,
    /// The primary link has been up for the switchback time: a move back to primary.
    PrimaryRecovered,
    /// The device's links change too often: it stays where it is until they calm down.
    Flapping,
    /// Another operation (or a verification round) runs.
    OperationRunning,
    /// The job is paused or needs recovery.
    JobNotRunning,
    /// The job's NIC configuration is not verified yet (a rank registered again).
    Unverified,
    /// The previous automatic operation started less than the minimum interval ago.
    MinInterval,
    /// An automatic operation moving this device failed; its links have not changed since.
    FailedBefore,
    /// Its partner die moves the other way now; it follows in the next operation.
    PartnerConflict,
    /// The manager refused the automatic operation (the job could not switch).
    Refused,
}

impl AutoReason {
    /// Every reason.
    pub const ALL: [AutoReason; 13] = [
        AutoReason::PrimaryDown,
        AutoReason::BackupDown,
        AutoReason::PrimaryDegraded,
        AutoReason::BackupDegraded,
        AutoReason::PrimaryRecovered,
        AutoReason::Flapping,
        AutoReason::OperationRunning,
        AutoReason::JobNotRunning,
        AutoReason::Unverified,
        AutoReason::MinInterval,
        AutoReason::FailedBefore,
        AutoReason::PartnerConflict,
        AutoReason::Refused,
    ];

    /// The name used in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            AutoReason::PrimaryDown => "primary_down",
            AutoReason::BackupDown => "backup_down",
            AutoReason::PrimaryDegraded => "primary_degraded",
            AutoReason::BackupDegraded => "backup_degraded",
            AutoReason::PrimaryRecovered => "primary_recovered",
            AutoReason::Flapping => "flapping",
            AutoReason::OperationRunning => "operation_running",
            AutoReason::JobNotRunning => "job_not_running",
            AutoReason::Unverified => "unverified",
            AutoReason::MinInterval => "min_interval",
            AutoReason::FailedBefore => "failed_before",
            AutoReason::PartnerConflict => "partner_conflict",
            AutoReason::Refused => "refused",
        }
    }

    /// The reason in words, for the log line.
    fn explain(self) -> &'static str {
        match self {
            AutoReason::PrimaryDown => "its primary link is not up",
            AutoReason::BackupDown => "its backup link is not up",
            AutoReason::PrimaryDegraded => "its primary link is degraded (probe loss or delay)",
            AutoReason::BackupDegraded => "its backup link is degraded (probe loss or delay)",
            AutoReason::PrimaryRecovered => "its primary link has been up for the switchback time",
            AutoReason::Flapping => "its links change too often (flapping)",
            AutoReason::OperationRunning => "another operation runs",
            AutoReason::JobNotRunning => "the job is not running",
            AutoReason::Unverified => "the job's NIC configuration is not verified yet",
            AutoReason::MinInterval => "the previous automatic operation started too recently",
            AutoReason::FailedBefore => {
                "an automatic operation moving it failed and its links have not changed since"
            }
            AutoReason::PartnerConflict => {
                "its partner die moves the other way now (HCCL refuses both in one call)"
            }
            AutoReason::Refused => "the manager refused the automatic operation",
        }
    }
}

/// What the job allows now, as the manager's ledger says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum JobGate {
    /// Running, verified, nothing in flight: an operation may start.
    Ready,
    /// An operation or a verification round runs.
    OperationRunning,
    /// The job is paused or needs recovery.
    NotRunning,
    /// Running, but the NIC configuration is not verified yet.
    Unverified,
}

impl JobGate {
    fn hold_reason(self) -> Option<AutoReason> {
        match self {
            JobGate::Ready => None,
            JobGate::OperationRunning => Some(AutoReason::OperationRunning),
            JobGate::NotRunning => Some(AutoReason::JobNotRunning),
            JobGate::Unverified => Some(AutoReason::Unverified),
        }
    }
}

/// One decision: a device moved (in the operation started now) or held back, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoDecision {
    /// The device.
    pub node: NodeName,
    /// The device on that node.
    pub device: DeviceId,
    /// What was decided.
    pub action: AutoAction,
    /// Why.
    pub reason: AutoReason,
    /// The device's links as the policy knew them.
    pub links: Links,
    /// When, on the manager's clock (since it started).
    pub at: Duration,
    /// The automatic operation that moves the device (set by the manager once it started it).
    pub operation: Option<OperationId>,
}

impl AutoDecision {
    /// The device it is about.
    pub fn key(&self) -> DeviceKey {
        DeviceKey {
            node: self.node.clone(),
            device: self.device,
        }
    }

    /// Whether the device moves.
    pub fn is_move(&self) -> bool {
        self.action != AutoAction::Hold
    }
}

/// One line: `node-1:0 to_backup: its primary link is not up (primary down, backup up)`.
impl fmt::Display for AutoDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} {}: {} ({})",
            self.node,
            self.device,
            self.action.as_str(),
            self.reason.explain(),
            self.links
        )
    }
}

/// What [`AutoPolicy::evaluate`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Every new decision: the moves of the operation to start now and the moves held back.
    /// A device held for the same reason as last time is not repeated.
    pub decisions: Vec<AutoDecision>,
    /// When to evaluate again (a link's failure is confirmed, a hold time or the coalescing
    /// window ends, the minimum interval passes, a flapping link calms down). `None`: only a
    /// new link report or a change of the job can change anything.
    pub wake_at: Option<Duration>,
}

impl Evaluation {
    /// The moves of the operation to start now, in device order (empty: none).
    pub fn moves(&self) -> impl Iterator<Item = &AutoDecision> + '_ {
        self.decisions.iter().filter(|d| d.is_move())
    }

    fn wake(&mut self, at: Duration) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }
}

/// What the policy knows of one device.
#[derive(Clone, Debug)]
struct Track {
    links: Links,
    /// When the primary's up-ness last changed (or the device was first reported).
    primary_since: Duration,
    /// Likewise for the backup.
    backup_since: Duration,
    /// When its links changed, within the flap window, oldest first.
    changes: VecDeque<Duration>,
    /// Whether a flapping hold was reported and the links have not calmed down since.
    flapping: bool,
    /// An automatic operation moving it failed; cleared when its links change.
    failed: bool,
    /// It is on its backup NIC because the policy moved it there (only such a device is
    /// switched back when its primary recovers).
    moved_by_policy: bool,
    /// The reason of the last hold reported, so it is not repeated.
    held: Option<AutoReason>,
    /// Per side (primary, backup): its node's system said it is down (a kernel carrier event,
    /// [`AutoPolicy::link_changed_by_kernel`]): no confirming probes are waited for.
    kernel_down: [bool; 2],
}

impl Track {
    /// How long a side that is not up waits for confirming probes before it counts.
    fn confirm(&self, side: NicSide, cfg: &AutoConfig) -> Duration {
        let kernel = match side {
            NicSide::Primary => self.kernel_down[0],
            NicSide::Backup => self.kernel_down[1],
        };
        if kernel {
            Duration::ZERO
        } else {
            cfg.confirm_delay()
        }
    }

    fn since(&self, side: NicSide) -> Duration {
        match side {
            NicSide::Primary => self.primary_since,
            NicSide::Backup => self.backup_since,
        }
    }

    fn prune(&mut self, now: Duration, window: Duration) {
        while self
            .changes
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= window)
        {
            self.changes.pop_front();
        }
    }

    /// When the changes in the window will be `max` or fewer again.
    fn calm_at(&self, max: u32, window: Duration) -> Duration {
        let n = self.changes.len();
        let keep = (max as usize).min(n);
        self.changes[n - keep - 1] + window
    }
}

/// What one device's links ask for, before the job's gates.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// Nothing to do.
    Nothing,
    /// Nothing yet; a move may fall due at this time.
    Later(Duration),
    /// A move to `to`, due since `due`.
    Move {
        to: NicSide,
        reason: AutoReason,
        due: Duration,
    },
    /// A move is needed, but the other side is not up either.
    Stuck(AutoReason),
}

fn rule(t: &Track, side: NicSide, cfg: &AutoConfig, now: Duration) -> Rule {
    let other = match side {
        NicSide::Primary => NicSide::Backup,
        NicSide::Backup => NicSide::Primary,
    };
    if !t.links.side(side).is_healthy() {
        let due = t.since(side) + t.confirm(side, cfg);
        if now < due {
            return Rule::Later(due);
        }
        return if t.links.side(other).is_healthy() {
            Rule::Move {
                to: other,
                reason: not_up(side, t.links.side(side)),
                due,
            }
        } else {
            Rule::Stuck(not_up(other, t.links.side(other)))
        };
    }
    if side == NicSide::Backup && t.moved_by_policy && t.links.primary.is_healthy() {
        let due = t.primary_since + cfg.switchback_after;
        return if now < due {
            Rule::Later(due)
        } else {
            Rule::Move {
                to: NicSide::Primary,
                reason: AutoReason::PrimaryRecovered,
                due,
            }
        };
    }
    Rule::Nothing
}

/// Why `side`'s link, in `state`, is not healthy: degraded has reasons of its own.
fn not_up(side: NicSide, state: &SideState) -> AutoReason {
    match (side, matches!(state, SideState::Degraded(_))) {
        (NicSide::Primary, false) => AutoReason::PrimaryDown,
        (NicSide::Backup, false) => AutoReason::BackupDown,
        (NicSide::Primary, true) => AutoReason::PrimaryDegraded,
        (NicSide::Backup, true) => AutoReason::BackupDegraded,
    }
}

/// A move the links ask for, waiting for the job's gates.
#[derive(Clone, Debug)]
struct Want {
    key: DeviceKey,
    to: NicSide,
    reason: AutoReason,
    due: Duration,
}

/// The policy's memory: every device's links and their history, and its own operations.
#[derive(Clone, Debug)]
pub struct AutoPolicy {
    cfg: AutoConfig,
    devices: BTreeMap<DeviceKey, Track>,
    /// When the last automatic operation started.
    last_start: Option<Duration>,
    /// The devices of the automatic operation started and not finished, and the side each
    /// moves to.
    in_flight: BTreeMap<DeviceKey, NicSide>,
}

impl AutoPolicy {
    /// A policy with `cfg` (see [`AutoConfig::validate`]) that knows no device yet.
    pub fn new(cfg: AutoConfig) -> Self {
        AutoPolicy {
            cfg,
            devices: BTreeMap::new(),
            last_start: None,
            in_flight: BTreeMap::new(),
        }
    }

    /// The knobs.
    pub fn config(&self) -> &AutoConfig {
        &self.cfg
    }

    /// The links of `key` as last reported.
    pub fn links(&self, key: &DeviceKey) -> Option<&Links> {
        self.devices.get(key).map(|t| &t.links)
    }

    /// Whether the automatic operation the policy asked for has not finished yet.
    pub fn operation_pending(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// A probe of `key`'s links, as its proxy reported it at `now` (the first report of a
    /// device is its initial state, not a change). Returns whether either link's health
    /// changed ([`SideState::is_healthy`]); the links are kept as reported, reasons and all.
    pub fn link_changed(&mut self, key: DeviceKey, links: Links, now: Duration) -> bool {
        let window = self.cfg.flap_window;
        let Some(t) = self.devices.get_mut(&key) else {
            self.devices.insert(
                key,
                Track {
                    links,
                    primary_since: now,
                    backup_since: now,
                    changes: VecDeque::new(),
                    flapping: false,
                    failed: false,
                    moved_by_policy: false,
                    held: None,
                    kernel_down: [false; 2],
                },
            );
            return false;
        };
        let mut changed = false;
        if t.links.primary.is_healthy() != links.primary.is_healthy() {
            t.primary_since = now;
            t.changes.push_back(now);
            t.kernel_down[0] = false;
            changed = true;
        }
        if t.links.backup.is_healthy() != links.backup.is_healthy() {
            t.backup_since = now;
            t.changes.push_back(now);
            t.kernel_down[1] = false;
            changed = true;
        }
        t.links = links;
        t.prune(now, window);
        if changed {
            t.failed = false;
        }
        changed
    }

    /// [`AutoPolicy::link_changed`] for a report its node's system made
    /// (`LinkReport::from_kernel`: the kernel said a carrier went): a side it says is down
    /// counts at once, without the `down_after` probes that guard against a lost ping. The
    /// coalescing window, the flap rule and the minimum interval apply as to any change.
    pub fn link_changed_by_kernel(&mut self, key: DeviceKey, links: Links, now: Duration) -> bool {
        let kernel_down = [
            matches!(links.primary, SideState::Down(_)),
            matches!(links.backup, SideState::Down(_)),
        ];
        let changed = self.link_changed(key.clone(), links, now);
        if let Some(t) = self.devices.get_mut(&key) {
            t.kernel_down = kernel_down;
        }
        changed
    }

    /// Decides at `now`, with the job as `gate` says and each device's NIC side as `side_of`
    /// says (`None`: the device is not in the job). When the evaluation has moves, the caller
    /// starts their operation now and reports its end with [`AutoPolicy::finished`] (or its
    /// refusal with [`AutoPolicy::refused`]).
    pub fn evaluate(
        &mut self,
        gate: JobGate,
        side_of: &dyn Fn(&DeviceKey) -> Option<NicSide>,
        now: Duration,
    ) -> Evaluation {
        let mut eval = Evaluation::default();
        let wants = self.wants(side_of, now, &mut eval);
        if wants.is_empty() {
            return eval;
        }
        if let Some(reason) = gate.hold_reason() {
            self.hold_all(&wants, reason, now, &mut eval);
            return eval;
        }
        if let Some(next) = self.last_start.map(|s| s + self.cfg.min_interval) {
            if now < next {
                self.hold_all(&wants, AutoReason::MinInterval, now, &mut eval);
                eval.wake(next);
                return eval;
            }
        }
        let first_due = wants.iter().map(|w| w.due).min().expect("not empty");
        let batch_at = first_due + self.cfg.coalesce;
        if now < batch_at {
            eval.wake(batch_at);
            return eval;
        }
        self.start(wants, now, &mut eval);
        eval
    }

    /// Every device's rule: the moves wanted (not failed before, not in the operation in
    /// flight); holds for flapping links and moves with nowhere to go go into `eval`.
    fn wants(
        &mut self,
        side_of: &dyn Fn(&DeviceKey) -> Option<NicSide>,
        now: Duration,
        eval: &mut Evaluation,
    ) -> Vec<Want> {
        let cfg = self.cfg;
        let mut wants = Vec::new();
        for (key, t) in self.devices.iter_mut() {
            let Some(side) = side_of(key) else { continue };
            // On its primary, whoever moved it: nothing of the policy's to undo.
            t.moved_by_policy &= side == NicSide::Backup;
            t.prune(now, cfg.flap_window);
            if t.changes.len() > cfg.max_flaps as usize {
                if !t.flapping {
                    t.flapping = true;
                    t.held = Some(AutoReason::Flapping);
                    eval.decisions.push(decision(
                        key,
                        t,
                        AutoAction::Hold,
                        AutoReason::Flapping,
                        now,
                    ));
                }
                eval.wake(t.calm_at(cfg.max_flaps, cfg.flap_window));
                continue;
            }
            t.flapping = false;
            match rule(t, side, &cfg, now) {
                Rule::Nothing => t.held = None,
                Rule::Later(at) => {
                    t.held = None;
                    eval.wake(at);
                }
                Rule::Stuck(reason) => hold_once(key, t, reason, now, eval),
                Rule::Move { .. } if self.in_flight.contains_key(key) => {}
                // A refusal already said why.
                Rule::Move { .. } if t.failed => {
                    if t.held != Some(AutoReason::Refused) {
                        hold_once(key, t, AutoReason::FailedBefore, now, eval)
                    }
                }
                Rule::Move { to, reason, due } => wants.push(Want {
                    key: key.clone(),
                    to,
                    reason,
                    due,
                }),
            }
        }
        wants
    }

    fn hold_all(
        &mut self,
        wants: &[Want],
        reason: AutoReason,
        now: Duration,
        eval: &mut Evaluation,
    ) {
        for w in wants {
            if let Some(t) = self.devices.get_mut(&w.key) {
                hold_once(&w.key, t, reason, now, eval);
            }
        }
    }

    /// Starts the operation of `wants`, less the partners that would be told the opposite
    /// side in the same call (they wait for the next one).
    fn start(&mut self, mut wants: Vec<Want>, now: Duration, eval: &mut Evaluation) {
        // The move due first keeps its place; ties go to the lower device.
        wants.sort_by(|a, b| (a.due, &a.key).cmp(&(b.due, &b.key)));
        let mut chosen: BTreeMap<DeviceKey, NicSide> = BTreeMap::new();
        let mut deferred = Vec::new();
        for w in wants {
            match chosen.get(&w.key.partner()) {
                Some(side) if *side != w.to => deferred.push(w),
                _ => {
                    chosen.insert(w.key.clone(), w.to);
                    let t = self
                        .devices
                        .get_mut(&w.key)
                        .expect("wanted devices are known");
                    t.held = None;
                    let d = decision(&w.key, t, AutoAction::to(w.to), w.reason, now);
                    eval.decisions.push(d);
                }
            }
        }
        self.hold_all(&deferred, AutoReason::PartnerConflict, now, eval);
        eval.decisions.sort_by_key(AutoDecision::key);
        self.last_start = Some(now);
        self.in_flight = chosen;
    }

    /// The automatic operation it asked for ended; `succeeded` says whether its new NIC state
    /// is in effect. A device of an operation that did not succeed is not moved again until
    /// its links change.
    pub fn finished(&mut self, succeeded: bool) {
        for (key, side) in std::mem::take(&mut self.in_flight) {
            let Some(t) = self.devices.get_mut(&key) else {
                continue;
            };
            if succeeded {
                t.moved_by_policy = side == NicSide::Backup;
            } else {
                t.failed = true;
                t.held = None;
            }
        }
    }

    /// An operator's operation moved `devices` (its new state is in effect): whatever side
    /// they are on now is the operator's choice, which a switchback does not undo.
    pub fn operator_moved<'a>(&mut self, devices: impl IntoIterator<Item = &'a DeviceKey>) {
        for key in devices {
            if let Some(t) = self.devices.get_mut(key) {
                t.moved_by_policy = false;
            }
        }
    }

    /// The manager refused the automatic operation it asked for at `now`: like a failure,
    /// and a hold decision for each of its devices.
    pub fn refused(&mut self, now: Duration) -> Vec<AutoDecision> {
        let keys: Vec<DeviceKey> = self.in_flight.keys().cloned().collect();
        self.finished(false);
        let mut out = Vec::new();
        for key in &keys {
            if let Some(t) = self.devices.get_mut(key) {
                t.held = Some(AutoReason::Refused);
                out.push(decision(key, t, AutoAction::Hold, AutoReason::Refused, now));
            }
        }
        out
    }
}

fn decision(
    key: &DeviceKey,
    t: &Track,
    action: AutoAction,
    reason: AutoReason,
    now: Duration,
) -> AutoDecision {
    AutoDecision {
        node: key.node.clone(),
        device: key.device,
        action,
        reason,
        links: t.links.clone(),
        at: now,
        operation: None,
    }
}

/// Reports a hold of `key` for `reason`, unless the last one reported was for the same reason.
fn hold_once(
    key: &DeviceKey,
    t: &mut Track,
    reason: AutoReason,
    now: Duration,
    eval: &mut Evaluation,
) {
    if t.held != Some(reason) {
        t.held = Some(reason);
        eval.decisions
            .push(decision(key, t, AutoAction::Hold, reason, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const MS: Duration = Duration::from_millis(1);

    fn cfg() -> AutoConfig {
        AutoConfig {
            link_probe: 10 * MS,
            down_after: 3,
            coalesce: 5 * MS,
            switchback_after: 1000 * MS,
            max_flaps: 4,
            flap_window: 500 * MS,
            min_interval: 100 * MS,
        }
    }

    fn key(node: u32, device: u32) -> DeviceKey {
        DeviceKey::new(NodeName::uniform(node), DeviceId(device))
    }

    fn links(primary: bool, backup: bool) -> Links {
        Links::known(primary, backup)
    }

    /// A job of 2 nodes x 4 devices whose NIC sides the test sets.
    struct Job {
        policy: AutoPolicy,
        backup: BTreeSet<DeviceKey>,
        gate: JobGate,
    }

    impl Job {
        fn new(cfg: AutoConfig) -> Job {
            let mut policy = AutoPolicy::new(cfg);
            for n in 0..2 {
                for d in 0..4 {
                    policy.link_changed(key(n, d), links(true, true), Duration::ZERO);
                }
            }
            Job {
                policy,
                backup: BTreeSet::new(),
                gate: JobGate::Ready,
            }
        }

        fn eval(&mut self, at: Duration) -> Evaluation {
            let backup = self.backup.clone();
            let side = move |k: &DeviceKey| {
                (k.device.0 < 4).then(|| NicSide::from_use_backup(backup.contains(k)))
            };
            self.policy.evaluate(self.gate, &side, at)
        }

        /// Applies the moves of `e` as a successful operation would.
        fn apply(&mut self, e: &Evaluation) {
            for d in e.moves() {
                match d.action {
                    AutoAction::ToBackup => self.backup.insert(d.key()),
                    _ => self.backup.remove(&d.key()),
                };
            }
            self.policy.finished(true);
        }
    }

    fn summary(e: &Evaluation) -> Vec<String> {
        e.decisions
            .iter()
            .map(|d| format!("{} {} {}", d.key(), d.action.as_str(), d.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_failed_primary_moves_after_down_after_probes_and_the_coalescing_window() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(1, 0), links(false, true), 100 * MS);
        // Confirmed after two more probes (20 ms), then gathered for 5 ms.
        let e = job.eval(100 * MS);
        assert!(e.decisions.is_empty());
        assert_eq!(e.wake_at, Some(120 * MS));
        let e = job.eval(120 * MS);
        assert!(e.decisions.is_empty());
        assert_eq!(e.wake_at, Some(125 * MS));
        let e = job.eval(125 * MS);
        assert_eq!(summary(&e), ["node-1:0 to_backup primary_down"]);
        assert_eq!(e.decisions[0].links, links(false, true));
        job.apply(&e);
        // On backup with its primary down: nothing more.
        assert_eq!(job.eval(2000 * MS), Evaluation::default());
    }

    #[test]
    fn a_carrier_loss_the_kernel_reported_needs_no_confirming_probes_only_the_gathering() {
        let mut job = Job::new(cfg());
        assert!(job
            .policy
            .link_changed_by_kernel(key(1, 0), links(false, true), 100 * MS));
        // No down_after probes (20 ms): only the coalescing window (5 ms).
        let e = job.eval(100 * MS);
        assert!(e.decisions.is_empty());
        assert_eq!(e.wake_at, Some(105 * MS));
        let e = job.eval(105 * MS);
        assert_eq!(summary(&e), ["node-1:0 to_backup primary_down"]);
        // A probe's report of the same failure keeps the confirming probes.
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(1, 0), links(false, true), 100 * MS);
        assert_eq!(job.eval(100 * MS).wake_at, Some(120 * MS));
        // ... until the kernel's word about it arrives.
        job.policy
            .link_changed_by_kernel(key(1, 0), links(false, true), 103 * MS);
        assert_eq!(job.eval(103 * MS).wake_at, Some(105 * MS));
        // A degraded side is the probe's word whoever triggered the round.
        let mut job = Job::new(cfg());
        let degraded = Links {
            primary: SideState::Degraded("loss 20 % > 5 %".into()),
            backup: SideState::Up,
        };
        job.policy
            .link_changed_by_kernel(key(1, 2), degraded, 100 * MS);
        assert_eq!(job.eval(100 * MS).wake_at, Some(120 * MS));
    }

    #[test]
    fn a_degraded_primary_moves_with_its_own_reason_and_comes_back_after_the_hold() {
        let mut job = Job::new(cfg());
        let degraded = Links {
            primary: SideState::Degraded("loss 50% > 25%".into()),
            backup: SideState::Up,
        };
        assert!(job
            .policy
            .link_changed(key(1, 2), degraded.clone(), 100 * MS));
        // The same damping as a failure: confirmed after down_after probes, then gathered.
        assert!(job.eval(100 * MS).decisions.is_empty());
        let e = job.eval(125 * MS);
        assert_eq!(summary(&e), ["node-1:2 to_backup primary_degraded"]);
        assert_eq!(e.decisions[0].links, degraded);
        assert_eq!(
            e.decisions[0].to_string(),
            "node-1:2 to_backup: its primary link is degraded (probe loss or delay) \
             (primary degraded, backup up)"
        );
        job.apply(&e);
        // Still degraded: it stays. Healthy again at 400 ms: back after the hold time.
        assert!(job.eval(300 * MS).moves().next().is_none());
        assert!(job
            .policy
            .link_changed(key(1, 2), links(true, true), 400 * MS));
        let e = job.eval(1399 * MS);
        assert!(e.moves().next().is_none());
        assert_eq!(e.wake_at, Some(1400 * MS));
        let e = job.eval(1405 * MS);
        assert_eq!(summary(&e), ["node-1:2 to_primary primary_recovered"]);
    }

    #[test]
    fn a_degraded_backup_holds_a_device_whose_primary_failed() {
        let mut job = Job::new(cfg());
        let l = Links {
            primary: SideState::Down(String::new()),
            backup: SideState::Degraded("rtt 40 ms > 10 ms".into()),
        };
        job.policy.link_changed(key(0, 3), l, 10 * MS);
        let e = job.eval(40 * MS);
        assert_eq!(summary(&e), ["node-0:3 hold backup_degraded"]);
    }

    #[test]
    fn a_hals_degraded_side_is_a_degraded_link() {
        let h = LinkHealth::new(DeviceId(0), true, true).with_degraded(NicSide::Backup, "slow");
        let l = Links::from_health(&h);
        assert_eq!(
            (&l.primary, &l.backup),
            (&SideState::Up, &SideState::Degraded("slow".into()))
        );
        assert_eq!(
            serde_json::to_value(&l.backup).unwrap()["state"],
            "degraded"
        );
        // Degrading is a change, its loss changing is none, healing is one again.
        let mut job = Job::new(cfg());
        assert!(job.policy.link_changed(key(0, 0), l.clone(), 10 * MS));
        let slower = Links::from_health(&h.clone().with_degraded(NicSide::Backup, "slower"));
        assert!(!job.policy.link_changed(key(0, 0), slower.clone(), 20 * MS));
        assert_eq!(
            job.policy.links(&key(0, 0)),
            Some(&slower),
            "kept as reported"
        );
        assert!(l.same_states(&slower) && !l.same_states(&links(true, true)));
        assert!(job
            .policy
            .link_changed(key(0, 0), links(true, true), 30 * MS));
    }

    #[test]
    fn a_link_back_before_it_is_confirmed_moves_nothing() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(0, 2), links(false, true), 10 * MS);
        job.policy
            .link_changed(key(0, 2), links(true, true), 25 * MS);
        let e = job.eval(40 * MS);
        assert_eq!(e, Evaluation::default());
    }

    #[test]
    fn an_unknown_link_counts_as_not_up_and_down_to_unknown_is_no_change() {
        let mut job = Job::new(cfg());
        let unknown = Links {
            primary: SideState::Unknown("probe timed out".into()),
            backup: SideState::Up,
        };
        assert!(job
            .policy
            .link_changed(key(0, 1), links(false, true), 10 * MS));
        assert!(!job.policy.link_changed(key(0, 1), unknown, 20 * MS));
        let e = job.eval(35 * MS);
        assert_eq!(summary(&e), ["node-0:1 to_backup primary_down"]);
        // A backup whose state is unknown is no place to go.
        let mut job = Job::new(cfg());
        let no_backup = Links {
            primary: SideState::Down(String::new()),
            backup: SideState::Unknown("partner die not visible".into()),
        };
        job.policy.link_changed(key(0, 1), no_backup, 10 * MS);
        let e = job.eval(40 * MS);
        assert_eq!(summary(&e), ["node-0:1 hold backup_down"]);
    }

    #[test]
    fn switchback_waits_for_the_primary_to_be_up_for_the_hold_time() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(1, 0), links(false, true), Duration::ZERO);
        let e = job.eval(25 * MS);
        job.apply(&e);
        job.policy
            .link_changed(key(1, 0), links(true, true), 300 * MS);
        let e = job.eval(300 * MS);
        assert!(e.decisions.is_empty());
        assert_eq!(e.wake_at, Some(1300 * MS));
        // A dip restarts the hold.
        job.policy
            .link_changed(key(1, 0), links(false, true), 800 * MS);
        job.policy
            .link_changed(key(1, 0), links(true, true), 805 * MS);
        assert_eq!(job.eval(1300 * MS).wake_at, Some(1805 * MS));
        let e = job.eval(1805 * MS);
        assert!(e.decisions.is_empty(), "gathered first");
        let e = job.eval(1810 * MS);
        assert_eq!(summary(&e), ["node-1:0 to_primary primary_recovered"]);
        job.apply(&e);
        assert!(job.backup.is_empty());
    }

    #[test]
    fn a_device_an_operator_put_on_backup_stays_there() {
        let mut job = Job::new(cfg());
        // The policy moved node-1:0; an operator moved node-1:2 (and later node-1:0 back and
        // to backup again).
        job.policy
            .link_changed(key(1, 0), links(false, true), Duration::ZERO);
        let e = job.eval(25 * MS);
        job.apply(&e);
        job.backup.insert(key(1, 2));
        job.policy.operator_moved([&key(1, 2)]);
        job.policy
            .link_changed(key(1, 0), links(true, true), 100 * MS);
        let e = job.eval(1105 * MS);
        assert_eq!(summary(&e), ["node-1:0 to_primary primary_recovered"]);
        job.apply(&e);
        job.backup.insert(key(1, 0));
        job.policy.operator_moved([&key(1, 0)]);
        assert_eq!(job.eval(5000 * MS), Evaluation::default());
        // A failing backup still sends it back, whoever put it there.
        job.policy
            .link_changed(key(1, 2), links(true, false), 5000 * MS);
        let e = job.eval(5025 * MS);
        assert_eq!(summary(&e), ["node-1:2 to_primary backup_down"]);
    }

    #[test]
    fn a_failed_backup_sends_the_device_back_to_a_primary_that_is_up() {
        let mut job = Job::new(cfg());
        job.backup.insert(key(0, 3));
        job.policy
            .link_changed(key(0, 3), links(true, false), 50 * MS);
        let e = job.eval(75 * MS);
        assert_eq!(summary(&e), ["node-0:3 to_primary backup_down"]);
        // Both down: held, once, and nothing to wake for.
        let mut job = Job::new(cfg());
        job.backup.insert(key(0, 3));
        job.policy
            .link_changed(key(0, 3), links(false, false), 50 * MS);
        let e = job.eval(75 * MS);
        assert_eq!(summary(&e), ["node-0:3 hold primary_down"]);
        assert_eq!(e.wake_at, None);
        assert_eq!(job.eval(90 * MS), Evaluation::default());
    }

    #[test]
    fn devices_failing_within_the_window_go_in_one_operation_others_after_the_interval() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(0, 2), links(false, true), Duration::ZERO);
        job.policy
            .link_changed(key(1, 1), links(false, true), 4 * MS);
        job.policy
            .link_changed(key(1, 3), links(false, true), 9 * MS);
        // The second one falls due at 24 ms, the window closes at 25 ms.
        assert_eq!(job.eval(20 * MS).wake_at, Some(24 * MS));
        assert_eq!(job.eval(24 * MS).wake_at, Some(25 * MS));
        let e = job.eval(25 * MS);
        assert_eq!(
            summary(&e),
            [
                "node-0:2 to_backup primary_down",
                "node-1:1 to_backup primary_down"
            ]
        );
        job.apply(&e);
        let e = job.eval(29 * MS);
        assert_eq!(summary(&e), ["node-1:3 hold min_interval"]);
        assert_eq!(e.wake_at, Some(125 * MS));
        let e = job.eval(125 * MS);
        assert_eq!(summary(&e), ["node-1:3 to_backup primary_down"]);
    }

    #[test]
    fn nothing_moves_while_an_operation_runs_or_the_job_does_not_run() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(0, 0), links(false, true), Duration::ZERO);
        for (gate, reason) in [
            (JobGate::OperationRunning, "operation_running"),
            (JobGate::NotRunning, "job_not_running"),
            (JobGate::Unverified, "unverified"),
        ] {
            job.gate = gate;
            let e = job.eval(50 * MS);
            assert_eq!(summary(&e), [format!("node-0:0 hold {reason}")]);
            assert_eq!(job.eval(60 * MS), Evaluation::default(), "said once");
        }
        job.gate = JobGate::Ready;
        let e = job.eval(70 * MS);
        assert_eq!(summary(&e), ["node-0:0 to_backup primary_down"]);
    }

    #[test]
    fn a_failed_automatic_operation_is_not_retried_until_the_links_change() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(0, 0), links(false, true), Duration::ZERO);
        let e = job.eval(25 * MS);
        assert_eq!(e.moves().count(), 1);
        job.policy.finished(false);
        let e = job.eval(500 * MS);
        assert_eq!(summary(&e), ["node-0:0 hold failed_before"]);
        assert_eq!(e.wake_at, None);
        // The backup dips and returns: the links changed, so it is tried again.
        job.policy
            .link_changed(key(0, 0), links(false, false), 600 * MS);
        job.policy
            .link_changed(key(0, 0), links(false, true), 610 * MS);
        let e = job.eval(616 * MS);
        assert_eq!(summary(&e), ["node-0:0 to_backup primary_down"]);
        // A refusal counts as a failure and says so.
        let refused = job.policy.refused(617 * MS);
        assert_eq!(refused[0].reason, AutoReason::Refused);
        assert!(
            job.eval(900 * MS).decisions.is_empty(),
            "refused is not repeated"
        );
    }

    #[test]
    fn a_flapping_link_is_held_until_it_calms_down() {
        let mut job = Job::new(cfg());
        let k = key(1, 2);
        for (i, up) in [false, true, false, true, false].into_iter().enumerate() {
            job.policy
                .link_changed(k.clone(), links(up, true), (100 + 10 * i as u32) * MS);
        }
        // Five changes in the window (more than 4): held, said once, woken when calm.
        let e = job.eval(150 * MS);
        assert_eq!(summary(&e), ["node-1:2 hold flapping"]);
        assert_eq!(e.wake_at, Some(600 * MS));
        assert!(job.eval(300 * MS).decisions.is_empty());
        // Calm (the first change left the window): the link has been down since long before,
        // so it moves at once.
        let e = job.eval(600 * MS);
        assert_eq!(summary(&e), ["node-1:2 to_backup primary_down"]);
    }

    #[test]
    fn partners_are_never_told_opposite_sides_in_one_operation() {
        let mut job = Job::new(cfg());
        // node-0:1 is on backup (node-0:0's NIC); node-0:0's NIC fails: 0 wants backup, 1
        // wants its primary.
        job.backup.insert(key(0, 1));
        job.policy
            .link_changed(key(0, 0), links(false, true), Duration::ZERO);
        job.policy
            .link_changed(key(0, 1), links(true, false), 1 * MS);
        let e = job.eval(30 * MS);
        assert_eq!(
            summary(&e),
            [
                "node-0:0 to_backup primary_down",
                "node-0:1 hold partner_conflict"
            ]
        );
        job.apply(&e);
        let e = job.eval(130 * MS);
        assert_eq!(summary(&e), ["node-0:1 to_primary backup_down"]);
        // The same way is a swap, which HCCL allows.
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(1, 0), links(false, true), Duration::ZERO);
        job.policy
            .link_changed(key(1, 1), links(false, true), Duration::ZERO);
        let e = job.eval(25 * MS);
        job.apply(&e);
        assert_eq!(job.backup.len(), 2);
        job.policy
            .link_changed(key(1, 0), links(true, true), 100 * MS);
        job.policy
            .link_changed(key(1, 1), links(true, true), 100 * MS);
        let e = job.eval(2000 * MS);
        assert_eq!(
            summary(&e),
            [
                "node-1:0 to_primary primary_recovered",
                "node-1:1 to_primary primary_recovered"
            ]
        );
    }

    #[test]
    fn devices_not_in_the_job_are_ignored_and_the_knobs_are_checked() {
        let mut job = Job::new(cfg());
        job.policy
            .link_changed(key(0, 9), links(false, true), Duration::ZERO);
        assert_eq!(job.eval(100 * MS), Evaluation::default());
        assert!(AutoConfig::default().validate().is_ok());
        let bad = |f: fn(&mut AutoConfig)| {
            let mut c = AutoConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.link_probe = Duration::ZERO).contains("probe"));
        assert!(bad(|c| c.down_after = 0).contains("down-after"));
        assert!(bad(|c| c.max_flaps = 0).contains("max-flaps"));
        assert!(bad(|c| c.flap_window = Duration::ZERO).contains("flap window"));
        assert_eq!(AutoConfig::default().confirm_delay(), 4000 * MS);
    }

    #[test]
    fn a_decision_reads_as_one_line() {
        let d = AutoDecision {
            node: "node-1".into(),
            device: DeviceId(0),
            action: AutoAction::Hold,
            reason: AutoReason::BackupDown,
            links: links(false, false),
            at: Duration::ZERO,
            operation: None,
        };
        assert_eq!(
            d.to_string(),
            "node-1:0 hold: its backup link is not up (primary down, backup down)"
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["action"], "hold");
        assert_eq!(v["reason"], "backup_down");
        assert_eq!(v["links"]["primary"]["state"], "down");
    }
}
