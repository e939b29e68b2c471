//! Messages between manager, proxies and workers. One set for every transport.
//!
//! Downstream, the manager sends one [`Directive`] per node; the proxy hands it to each of its
//! workers. Upstream, each worker answers with a [`RankReply`]; the proxy fans them in and sends
//! the manager one [`NodeReply`] per node (early, with what it has, when a rank fails).

use crate::auto::Links;
use crate::command::RankTarget;
use crate::hal::{HalError, LinkHealth, NicSide, SwitchCapabilities};
use crate::ids::{DeviceId, GlobalRank, Instance, JobId, NodeName, OperationId};
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
    /// Every rank stops training: its training loop ends, and its launcher restarts the
    /// process as a new incarnation (no operation runs, no NIC is touched).
    Stop,
    /// An operation that moves the job inside a step: every rank ends its collectives in
    /// flight on the old plane and reports where each group's sequence stands
    /// ([`crate::inflight`]). Comes after the sample, instead of the pause.
    Abort,
}

impl Phase {
    /// The name in logs, span fields, metric labels and JSON; stable, dashboards key on it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Sample => "sample",
            Phase::Pause => "pause",
            Phase::Switch => "switch",
            Phase::Rollback => "rollback",
            Phase::Resume => "resume",
            Phase::Verify => "verify",
            Phase::Stop => "stop",
            Phase::Abort => "abort",
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
    /// The operation (or verification round) it belongs to: replies carry it back, and a
    /// reply for another id is a stale one.
    pub op: OperationId,
    /// What to do.
    pub kind: DirectiveKind,
}

impl Directive {
    /// The phase the replies to this directive answer, so a fan-in can match them.
    pub fn phase(&self) -> Phase {
        match self.kind {
            DirectiveKind::Sample { .. } => Phase::Sample,
            DirectiveKind::PauseAt { .. } => Phase::Pause,
            DirectiveKind::Switch { .. } => Phase::Switch,
            DirectiveKind::Rollback { .. } => Phase::Rollback,
            DirectiveKind::Resume => Phase::Resume,
            DirectiveKind::Verify => Phase::Verify,
            DirectiveKind::StopTraining { .. } => Phase::Stop,
            DirectiveKind::AbortInFlight { .. } => Phase::Abort,
            DirectiveKind::SwitchInFlight { .. } => Phase::Switch,
        }
    }
}

/// The instruction a [`Directive`] carries, one per [`Phase`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectiveKind {
    /// Report the step you are in and hold, at the latest, after finishing it, until told
    /// the pause step. The proxy adds the link health of the targets on its node.
    Sample {
        /// The operation's targets, for the proxies' link-health probe (workers ignore them).
        targets: Vec<RankTarget>,
    },
    /// Finish step `step` (no further) and hold at that boundary.
    PauseAt {
        /// The pause step: the highest step any rank sampled, so no rank has to go back.
        step: u64,
    },
    /// Plan and apply `(rank, side)` on every group you share with a target.
    Switch {
        /// The targets and the side each moves to, in the operator's order: every rank
        /// plans from the same list, so every member of a group makes the same call.
        targets: Vec<(GlobalRank, NicSide)>,
        /// The time a rank's calls have ([`crate::PhaseDeadlines::call_timeout`]): shorter
        /// than the phase, so that a call one rank gave up on ends in time for the rollback.
        #[serde(default)]
        call_timeout: Duration,
    },
    /// Same as `Switch`, with the previous NIC state of the targets, in two rounds: `targets`
    /// first, then `restate` in a second call on each group it touches.
    Rollback {
        /// The targets with the side the NIC table had for each before the operation.
        targets: Vec<(GlobalRank, NicSide)>,
        /// Targets the switch did not change whose partner die it changed, with their side:
        /// re-stated after `targets`, because one call may not tell the two dies of one NPU
        /// opposite sides (see `crate::operation::RollbackTargets`).
        restate: Vec<(GlobalRank, NicSide)>,
        /// The time a rank's calls have, as for `Switch`.
        #[serde(default)]
        call_timeout: Duration,
    },
    /// Open the step gate, if it serves this operation (a gate serving another operation
    /// stays as it is, and the rank answers how long it was held: zero).
    Resume,
    /// Report the NIC configuration applied to every group and the gate's state
    /// ([`ReplyBody::Verified`]). Changes nothing.
    Verify,
    /// Stop training for good: a rank held at its gate, or arriving there, gets a stop
    /// instead of a resume and its training loop ends (the process exits non-zero and its
    /// launcher restarts it). No NIC call. Answered with [`ReplyBody::Stopped`].
    StopTraining {
        /// Why, one line: the training process logs it and its gate hands it to the loop.
        reason: String,
        /// What the launchers do once the processes stopped: the proxies hand it to theirs
        /// (taskd's agent restarts every worker of its node together, as one restart of the
        /// job, or ends the job on its node).
        #[serde(default)]
        then: AfterStop,
        /// The processes the stop is for, when it is sent again to old processes that showed
        /// up after it (a node cut off during the stop): a worker of another instance ignores
        /// it. Empty: every process of the job.
        #[serde(default)]
        only: Vec<Instance>,
    },
    /// End every collective in flight on the groups the targets' move rebuilds (the
    /// framework's, on the plane being left) and report where each group's sequence stands:
    /// answered with [`ReplyBody::Aborted`]. The training thread waits mid-step for the redo.
    AbortInFlight {
        /// The targets and the side each moves to, as the switch will have them.
        targets: Vec<(GlobalRank, NicSide)>,
    },
    /// The switch of an operation that aborted its collectives in flight: rebuild the groups
    /// with `targets` applied (off the training thread, which waits mid-step or at its gate),
    /// then issue every group's collectives again from its redo point. Answered with
    /// [`ReplyBody::Applied`], checked as a switch's.
    SwitchInFlight {
        /// The targets and the side each moves to.
        targets: Vec<(GlobalRank, NicSide)>,
        /// The time a rank's calls have, as for `Switch`.
        call_timeout: Duration,
        /// Per group, the first collective that did not complete on every member.
        redo: Vec<crate::inflight::RedoPoint>,
    },
}

/// What the launchers do once a stop of training ended the processes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterStop {
    /// Whatever the launcher does by itself when a process exits with an error (MindCluster's
    /// process recovery, torchrun's `--max-restarts`): the manager does not coordinate it.
    #[default]
    Launcher,
    /// Every node's launcher starts all its workers again, once, as restart `number` of the
    /// job (1 for the first): one new incarnation of the whole job.
    Restart {
        /// The job's restart count once this one is done.
        number: u32,
    },
    /// No restart: every node's launcher ends the job (the job's restart budget is spent).
    End,
}

impl AfterStop {
    /// What it says in logs and `taskd status`.
    pub fn describe(self) -> String {
        match self {
            AfterStop::Launcher => "the launcher restarts the processes".to_owned(),
            AfterStop::Restart { number } => {
                format!("every node restarts its workers together (restart {number} of the job)")
            }
            AfterStop::End => "the job ends (no restart left)".to_owned(),
        }
    }
}

impl DirectiveKind {
    /// Whether a worker of `instance` acts on this directive: every directive is for every
    /// worker, except a stop sent again to named old processes.
    pub fn is_for(&self, instance: Instance) -> bool {
        match self {
            DirectiveKind::StopTraining { only, .. } => only.is_empty() || only.contains(&instance),
            _ => true,
        }
    }
}

/// One NIC-set call a rank made, as it reports it for cross-rank agreement checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedCall {
    /// The group's name (its HCCL communicator name).
    pub group: String,
    /// Members of the group, as this rank's HAL reports them: with the name, what lets the
    /// manager rebuild every group's view from replies.
    pub group_size: u32,
    /// [`crate::planner::GroupCall::digest`] of the call.
    pub digest: u64,
}

impl AppliedCall {
    /// Adds `call` to the calls one rank made in one phase, kept sorted by group name (the
    /// planner's order, which the manager checks). A group called a second time in the phase
    /// (a rollback's `restate` round) keeps one entry, its digest the fold of both calls'
    /// digests in order: every member makes the same calls in the same order, so the folded
    /// digests agree exactly when the calls do.
    pub fn record(calls: &mut Vec<AppliedCall>, call: AppliedCall) {
        match calls.binary_search_by(|c| c.group.cmp(&call.group)) {
            Ok(i) => calls[i].digest = calls[i].digest.rotate_left(29) ^ call.digest,
            Err(i) => calls.insert(i, call),
        }
    }
}

/// A rank's answer to one directive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReply {
    /// Who answers.
    pub rank: GlobalRank,
    /// The directive's operation id: a reply to an older operation is dropped, not counted.
    pub op: OperationId,
    /// The directive's phase: a late reply to an earlier phase is not taken for this one.
    pub phase: Phase,
    /// The answer itself.
    pub body: ReplyBody,
}

/// What a rank reports for one directive: its phase's success payload, or a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyBody {
    /// Phase A: the step this rank is in (it holds after finishing it unless told otherwise).
    Sampled {
        /// The step the training loop is running (or about to run) on this rank.
        in_step: u64,
        /// The training process registered an in-flight side (`crate::inflight`): it can
        /// abort its collectives in flight for an in-flight move. False from a sender that
        /// predates it.
        #[serde(default)]
        in_flight: bool,
    },
    /// Phase B: held after finishing `step`.
    Paused {
        /// The step this rank finished before holding; the pause step of the directive.
        step: u64,
    },
    /// Switch or rollback done: the calls made, in order.
    Applied {
        /// Every NIC-set call this rank made, in order: the manager checks that every member
        /// of a group reports the same digest.
        calls: Vec<AppliedCall>,
    },
    /// The gate is open; training was held for `stalled`.
    Resumed {
        /// How long this rank's training loop was held at the gate (zero if the gate served
        /// another operation).
        stalled: Duration,
    },
    /// The answer to [`DirectiveKind::Verify`].
    Verified(WorkerReport),
    /// The answer to [`DirectiveKind::StopTraining`]: the gate stopped training; the
    /// process ends once its loop reaches (or leaves) the gate.
    Stopped {
        /// The last step the rank's training loop finished (taskd's count of this
        /// process), when it finished one: how far training got before the stop.
        at_step: Option<u64>,
    },
    /// The directive failed on this rank.
    Failed(RankError),
    /// The answer to [`DirectiveKind::AbortInFlight`]: the collectives in flight are ended.
    Aborted {
        /// The step the training loop is in (as a sample's answer).
        in_step: u64,
        /// Where each of the rank's groups stands, sorted by group name.
        collectives: Vec<crate::inflight::CollectivePosition>,
    },
}

/// What one rank has applied, per group, and where its step gate stands: the truth a manager
/// (a restarted one too) rebuilds its NIC table from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Every group of the process, sorted by name.
    pub groups: Vec<GroupView>,
    /// Whether training on this rank is held, and for which operation: a restarted manager
    /// must know which gates to open.
    pub gate: GateReport,
}

/// The NIC configuration one rank has applied to one group: which members it set to their
/// backup NIC (every other member uses its primary, HCCL's default for a new group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    /// The group's name.
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
    /// The HAL's error when a HAL call failed: its kind is what decides a rollback, its
    /// vendor code what an operator looks up.
    pub hal: Option<HalError>,
    /// A sentence for people, present whatever failed; the only description when no HAL
    /// call was involved (the HAL panicked, the gate refused, ...).
    pub message: String,
}

impl RankError {
    /// A HAL call that concerns no one group failed (reading the groups): `e` with its
    /// sentence.
    pub fn hal(e: HalError) -> Self {
        RankError {
            group: None,
            message: e.to_string(),
            hal: Some(e),
        }
    }

    /// The NIC-set call on `group` failed with `e`.
    pub fn in_group(group: impl Into<String>, e: HalError) -> Self {
        RankError {
            group: Some(group.into()),
            ..RankError::hal(e)
        }
    }

    /// The worker failed the directive without a HAL error: the gate refused, the HAL is out
    /// of service, ...; `message` says why.
    pub fn worker(message: impl Into<String>) -> Self {
        RankError {
            group: None,
            hal: None,
            message: message.into(),
        }
    }
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
    /// The proxy's node.
    pub node: NodeName,
    /// The directive's operation id.
    pub op: OperationId,
    /// The directive's phase.
    pub phase: Phase,
    /// Answers of the node's ranks, in no particular order. Usually all of them; fewer when
    /// a rank failed and the proxy forwarded early so the manager can react at once.
    pub replies: Vec<RankReply>,
    /// [`Phase::Sample`] only: link health of the node's targeted devices, so the manager
    /// refuses a move onto a NIC that is down. Empty for every other phase.
    pub health: Vec<LinkHealth>,
}

/// A worker introducing itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerHello {
    /// The job the training process belongs to (a worker of another job is refused).
    pub job: JobId,
    /// The node it runs on, checked against the rank table.
    pub node: NodeName,
    /// Its global rank.
    pub rank: GlobalRank,
    /// Whether its HCCL can really switch NICs; a switch is refused unless every rank can.
    pub capabilities: SwitchCapabilities,
    /// Which process of the rank this is: a restarted process has a new one.
    #[serde(default)]
    pub instance: Instance,
    /// The job restart its launcher started it for (`TASKD_RESTART_COUNT`; 0: the first
    /// start): a manager started after restarts learns the job's count from it.
    #[serde(default)]
    pub generation: u32,
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
    /// Read because the node's system said a link changed (the kernel's carrier event,
    /// [`crate::hal::NodeHal::watch`]): a side it says is down is the system's word, not a
    /// probe that may have lost a ping, and needs no confirming probes.
    #[serde(default)]
    pub from_kernel: bool,
}

/// How a rank's process left the manager's sight.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gone {
    /// The process is gone: it exited with an error, was killed, or its connection to its
    /// proxy closed. Held training on it cannot go on; the job needs its processes back.
    #[default]
    Died,
    /// The process ended cleanly: training is over on this rank.
    Ended,
    /// The rank's proxy cannot be reached (its connection is lost, or its process ended): the
    /// training process itself may be training on.
    Unreachable,
}

impl Gone {
    /// The name in logs, `taskd status` and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Gone::Died => "died",
            Gone::Ended => "ended",
            Gone::Unreachable => "unreachable",
        }
    }
}

/// What flows from a proxy to the manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyToManager {
    /// A worker of this node registered (or registered again after a reconnect).
    WorkerUp(WorkerHello),
    /// A worker of this node is gone (its connection closed or its actor stopped): the
    /// manager fails the operation in flight rather than wait for its deadline.
    WorkerLost {
        /// The rank whose worker is gone.
        rank: GlobalRank,
        /// What the proxy saw, for logs and the operation's error.
        reason: String,
        /// How it went: the process died, or ended cleanly.
        #[serde(default)]
        how: Gone,
        /// The process that went, when the proxy knew it ([`Instance::UNKNOWN`] for a
        /// process that never registered).
        #[serde(default)]
        instance: Instance,
        /// The job restart its launcher started the process for (0: the job's first start,
        /// or not known), which tells an old process of a restart under way from a new one
        /// that never registered.
        #[serde(default)]
        generation: u32,
    },
    /// The node's answers to a directive.
    Reply(NodeReply),
    /// A device's links changed (only proxies asked to probe send it).
    Links(LinkReport),
    /// A worker's hang watch: its rank stopped finishing steps, or finished one again.
    Stall(StallNotice),
}

/// What flows from a worker to its proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerToProxy {
    /// The first message of a worker, forwarded as [`ProxyToManager::WorkerUp`].
    Hello(WorkerHello),
    /// The worker's answer to a directive, fanned in with its node's.
    Reply(RankReply),
    /// The worker's hang watch spoke, forwarded as [`ProxyToManager::Stall`].
    Stall(StallNotice),
}

/// What a worker's hang watch saw: its training loop finished no step for the watch's
/// timeout while nothing held it (a collective that never completes, with HCCL's own
/// watchdog off under `TSP:1`), or, after that, finished one again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallNotice {
    /// The rank.
    pub rank: GlobalRank,
    /// Its process: a notice of a process the manager no longer counts changes nothing.
    pub instance: Instance,
    /// The last step the loop finished (the watch starts at the first).
    pub last_step: u64,
    /// While stalled: how long since the loop last made progress (a step, or a release from
    /// the gate). `None`: it finished a step again.
    pub stalled_for: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::{AppliedCall, RankError};
    use crate::hal::{HalError, HcclCode};

    #[test]
    fn a_rank_error_says_what_failed_in_the_words_of_its_hal_error() {
        let e = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "link down");
        let in_group = RankError::in_group("dp_1", e.clone());
        assert_eq!(
            (in_group.group.as_deref(), in_group.hal.as_ref()),
            (Some("dp_1"), Some(&e))
        );
        assert_eq!(in_group.message, e.to_string());
        assert_eq!(in_group.to_string(), format!("group dp_1: {e}"));
        let groups = RankError::hal(e.clone());
        assert_eq!((groups.to_string(), groups.group), (e.to_string(), None));
        let worker = RankError::worker("the gate refused");
        assert_eq!((worker.group, worker.hal), (None, None));
        assert_eq!(worker.message, "the gate refused");
    }

    fn call(group: &str, digest: u64) -> AppliedCall {
        AppliedCall {
            group: group.into(),
            group_size: 2,
            digest,
        }
    }

    #[test]
    fn a_second_call_on_a_group_folds_into_its_entry_and_order_is_kept() {
        let mut calls = vec![call("tp_0", 1)];
        AppliedCall::record(&mut calls, call("dp_1", 2));
        AppliedCall::record(&mut calls, call("tp_0", 3));
        let names: Vec<&str> = calls.iter().map(|c| c.group.as_str()).collect();
        assert_eq!(names, ["dp_1", "tp_0"]);
        assert_eq!(calls[0].digest, 2);
        let folded = calls[1].digest;
        assert_ne!(folded, 1);
        assert_ne!(folded, 3);
        // The order of the two calls matters: the same calls the other way round differ.
        let mut other = vec![call("tp_0", 3)];
        AppliedCall::record(&mut other, call("tp_0", 1));
        assert_ne!(other[0].digest, folded);
    }
}
