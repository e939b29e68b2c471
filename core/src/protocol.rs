//! Messages between manager, proxies and workers. One set for every transport.
//!
//! Downstream, the manager sends one [`Directive`] per node; the proxy hands it to each of its
//! workers. Upstream, each worker answers with a [`RankReply`]; the proxy fans them in and sends
//! the manager one [`NodeReply`] per node (early, with what it has, when a rank fails).

use crate::auto::Links;
use crate::command::RankTarget;
use crate::hal::{HalError, LinkHealth, NicSide, SwitchCapabilities};
use crate::ids::{DeviceId, GlobalRank, JobId, NodeName, OperationId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The steps of an operation, in the order they normally run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Pause, part A: every rank reports the step it is in.
    Sample,
    /// Pause, part B: every rank finishes step `T` and holds at that boundary.
    Pause,
    /// Every rank applies the NIC change to its groups.
    Switch,
    /// Every rank re-applies the previous NIC state of the targets.
    Rollback,
    /// Every rank opens its step gate.
    Resume,
    /// Every rank reports what it has applied and where its gate stands (no operation runs).
    Verify,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Sample => "sample",
            Phase::Pause => "pause",
            Phase::Switch => "switch",
            Phase::Rollback => "rollback",
            Phase::Resume => "resume",
            Phase::Verify => "verify",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the manager asks of every rank of the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directive {
    pub op: OperationId,
    pub kind: DirectiveKind,
}

impl Directive {
    pub fn phase(&self) -> Phase {
        match self.kind {
            DirectiveKind::Sample { .. } => Phase::Sample,
            DirectiveKind::PauseAt { .. } => Phase::Pause,
            DirectiveKind::Switch { .. } => Phase::Switch,
            DirectiveKind::Rollback { .. } => Phase::Rollback,
            DirectiveKind::Resume => Phase::Resume,
            DirectiveKind::Verify => Phase::Verify,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectiveKind {
    /// Report the step you are in and hold, at the latest, after finishing it, until told
    /// the pause step. The proxy adds the link health of the targets on its node.
    Sample { targets: Vec<RankTarget> },
    /// Finish step `step` (no further) and hold at that boundary.
    PauseAt { step: u64 },
    /// Plan and apply `(rank, side)` on every group you share with a target.
    Switch { targets: Vec<(GlobalRank, NicSide)> },
    /// Same as `Switch`, with the previous NIC state of the targets.
    Rollback { targets: Vec<(GlobalRank, NicSide)> },
    /// Open the step gate, if it serves this operation (a gate serving another operation
    /// stays as it is, and the rank answers how long it was held: zero).
    Resume,
    /// Report the NIC configuration applied to every group and the gate's state
    /// ([`ReplyBody::Verified`]). Changes nothing.
    Verify,
}

/// One NIC-set call a rank made, as it reports it for cross-rank agreement checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedCall {
    pub group: String,
    pub group_size: u32,
    /// [`crate::planner::GroupCall::digest`] of the call.
    pub digest: u64,
}

/// A rank's answer to one directive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReply {
    pub rank: GlobalRank,
    pub op: OperationId,
    pub phase: Phase,
    pub body: ReplyBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyBody {
    /// Phase A: the step this rank is in (it holds after finishing it unless told otherwise).
    Sampled { in_step: u64 },
    /// Phase B: held after finishing `step`.
    Paused { step: u64 },
    /// Switch or rollback done: the calls made, in order.
    Applied { calls: Vec<AppliedCall> },
    /// The gate is open; training was held for `stalled`.
    Resumed { stalled: Duration },
    /// The answer to [`DirectiveKind::Verify`].
    Verified(WorkerReport),
    /// The directive failed on this rank.
    Failed(RankError),
}

/// What one rank has applied, per group, and where its step gate stands: the truth a manager
/// (a restarted one too) rebuilds its NIC table from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Every group of the process, sorted by name.
    pub groups: Vec<GroupView>,
    pub gate: GateReport,
}

/// The NIC configuration one rank has applied to one group: which members it set to their
/// backup NIC (every other member uses its primary, HCCL's default for a new group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    pub group: String,
    /// Members of the group (every one of them must report the same view).
    pub size: u32,
    /// Members on their backup NIC, ascending.
    pub on_backup: Vec<GlobalRank>,
    /// Members whose side this rank cannot vouch for: the targets of its last NIC-set call
    /// on the group, which failed (HCCL keeps a setting per operator, so a failed call can
    /// leave some of the group's operators on another side than the rest). Empty once a later
    /// call on the group succeeds.
    #[serde(default)]
    pub unsettled: Vec<GlobalRank>,
}

/// Where a rank's step gate stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateReport {
    /// The operation the gate serves (armed for it), if any.
    pub op: Option<OperationId>,
    /// The step after which training is held now, if it is.
    pub held_after: Option<u64>,
}

/// Why a directive failed on a rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankError {
    /// The group whose call failed, if a HAL call failed.
    pub group: Option<String>,
    pub hal: Option<HalError>,
    pub message: String,
}

impl fmt::Display for RankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.group, &self.hal) {
            (Some(g), Some(h)) => write!(f, "group {g}: {h}"),
            (None, Some(h)) => write!(f, "{h}"),
            _ => f.write_str(&self.message),
        }
    }
}

/// Replies of some ranks of one node to one directive, plus, for [`Phase::Sample`], the link
/// health of the node's targeted devices as the node's HAL reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReply {
    pub node: NodeName,
    pub op: OperationId,
    pub phase: Phase,
    pub replies: Vec<RankReply>,
    pub health: Vec<LinkHealth>,
}

/// A worker introducing itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerHello {
    pub job: JobId,
    pub node: NodeName,
    pub rank: GlobalRank,
    pub capabilities: SwitchCapabilities,
}

/// The links of one device of a node, as the node's proxy probed them: sent when they
/// changed since the last report (the first probe reports every device), for the automatic
/// failover policy ([`crate::auto`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkReport {
    /// The node.
    pub node: NodeName,
    /// The device on that node.
    pub device: DeviceId,
    /// Its primary and backup link now.
    pub links: Links,
}

/// What flows from a proxy to the manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyToManager {
    WorkerUp(WorkerHello),
    WorkerLost {
        rank: GlobalRank,
        reason: String,
    },
    Reply(NodeReply),
    /// A device's links changed (only proxies asked to probe send it).
    Links(LinkReport),
}

/// What flows from a worker to its proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerToProxy {
    Hello(WorkerHello),
    Reply(RankReply),
}
