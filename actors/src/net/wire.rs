//! Conversions between the protocol of `taskd-core` and its protobuf form (`proto/net.proto`).
//!
//! Encoding never fails; decoding refuses a frame that lacks a required part or carries a
//! malformed id, naming what is wrong, so a peer speaking another version is told why.

use super::pb;
use std::borrow::Cow;
use std::time::Duration;
use taskd_core::auto::Links;
use taskd_core::command::RankTarget;
use taskd_core::inflight::{CollectivePosition, RedoPoint};
use taskd_core::protocol::{
    AfterStop, AppliedCall, Directive, DirectiveKind, GateReport, Gone, GroupView, LinkReport,
    NodeReply, Phase, ProxyToManager, RankError, RankReply, ReplyBody, StallNotice, WorkerHello,
    WorkerReport, WorkerToProxy,
};
use taskd_core::{
    DeviceId, GlobalRank, HalError, HalErrorKind, HcclSetup, Instance, JobId, LibraryName,
    LinkHealth, Missing, NicSide, NodeName, OperationId, SideState, SwitchCapabilities, VendorCode,
};

/// A frame that cannot be decoded into the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what}: {detail}")]
pub struct WireError {
    /// The message being decoded (`directive`, `rank reply`, ...).
    pub what: &'static str,
    /// What is wrong with it: the missing part, or the malformed value and why.
    pub detail: String,
}

fn missing(what: &'static str, part: &str) -> WireError {
    WireError {
        what,
        detail: format!("{part} is missing"),
    }
}

fn op_id(what: &'static str, s: &str) -> Result<OperationId, WireError> {
    s.parse().map_err(|e| WireError {
        what,
        detail: format!("operation id {s:?}: {e}"),
    })
}

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn phase_to_pb(p: Phase) -> pb::Phase {
    match p {
        Phase::Sample => pb::Phase::Sample,
        Phase::Pause => pb::Phase::Pause,
        Phase::Switch => pb::Phase::Switch,
        Phase::Rollback => pb::Phase::Rollback,
        Phase::Resume => pb::Phase::Resume,
        Phase::Verify => pb::Phase::Verify,
        Phase::Stop => pb::Phase::Stop,
        Phase::Abort => pb::Phase::Abort,
    }
}

pub(crate) fn phase_from_pb(what: &'static str, raw: i32) -> Result<Phase, WireError> {
    match pb::Phase::try_from(raw) {
        Ok(pb::Phase::Sample) => Ok(Phase::Sample),
        Ok(pb::Phase::Pause) => Ok(Phase::Pause),
        Ok(pb::Phase::Switch) => Ok(Phase::Switch),
        Ok(pb::Phase::Rollback) => Ok(Phase::Rollback),
        Ok(pb::Phase::Resume) => Ok(Phase::Resume),
        Ok(pb::Phase::Verify) => Ok(Phase::Verify),
        Ok(pb::Phase::Stop) => Ok(Phase::Stop),
        Ok(pb::Phase::Abort) => Ok(Phase::Abort),
        _ => Err(WireError {
            what,
            detail: format!("unknown phase {raw}"),
        }),
    }
}

/// What a rank lacks, listed; and, for a peer of the previous version, its three booleans:
/// anything it has no word for counts as L2 retry missing, so that it refuses the switch too.
pub(crate) fn caps_to_pb(c: &SwitchCapabilities) -> pb::Capabilities {
    let known = [Missing::TSP, HcclSetup::L2_RETRY_OFF, HcclSetup::NO_RDMA];
    let other = c.missing().any(|m| !known.contains(m));
    pb::Capabilities {
        tsp: !c.lacks(&Missing::TSP),
        l2_retry: !c.lacks(&HcclSetup::L2_RETRY_OFF) && !other,
        rdma: !c.lacks(&HcclSetup::NO_RDMA),
        missing: c
            .missing()
            .map(|m| pb::Missing {
                by: m.by.to_string(),
                what: m.what.to_string(),
            })
            .collect(),
    }
}

/// The list when there is one; a previous-version frame's booleans otherwise. A thing named by
/// something that is not a library name is refused.
pub(crate) fn caps_from_pb(c: Option<pb::Capabilities>) -> Result<SwitchCapabilities, WireError> {
    let c = c.unwrap_or_default();
    if c.missing.is_empty() {
        let said = [
            (c.tsp, Missing::TSP),
            (c.l2_retry, HcclSetup::L2_RETRY_OFF),
            (c.rdma, HcclSetup::NO_RDMA),
        ];
        return Ok(SwitchCapabilities::lacking(
            said.into_iter().filter(|(has, _)| !has).map(|(_, m)| m),
        ));
    }
    let missing = c
        .missing
        .into_iter()
        .map(|m| {
            let by = LibraryName::parse(m.by).map_err(|e| WireError {
                what: "capabilities",
                detail: e.to_string(),
            })?;
            Ok(Missing {
                by,
                what: Cow::Owned(m.what),
            })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    Ok(SwitchCapabilities::lacking(missing))
}

pub(crate) fn hello_to_pb(h: WorkerHello) -> pb::WorkerHello {
    pb::WorkerHello {
        job: h.job.0,
        node: h.node.0,
        rank: h.rank.0,
        capabilities: Some(caps_to_pb(&h.capabilities)),
        instance: h.instance.0,
        generation: h.generation,
    }
}

pub(crate) fn hello_from_pb(h: pb::WorkerHello) -> Result<WorkerHello, WireError> {
    Ok(WorkerHello {
        job: JobId(h.job),
        node: NodeName(h.node),
        rank: GlobalRank(h.rank),
        capabilities: caps_from_pb(h.capabilities)?,
        instance: Instance(h.instance),
        generation: h.generation,
    })
}

/// The wire keeps HCCL's `use_backup` flag per rank; the directive speaks of sides.
fn flags_to_pb(targets: Vec<(GlobalRank, NicSide)>) -> Vec<pb::RankFlag> {
    targets
        .into_iter()
        .map(|(r, side)| pb::RankFlag {
            rank: r.0,
            use_backup: side.use_backup(),
        })
        .collect()
}

fn flags_from_pb(t: Vec<pb::RankFlag>) -> Vec<(GlobalRank, NicSide)> {
    t.into_iter()
        .map(|f| (GlobalRank(f.rank), NicSide::from_use_backup(f.use_backup)))
        .collect()
}

/// A directive as the manager's server sends it in a `Down` frame.
pub fn directive_to_pb(d: Directive) -> pb::Directive {
    use pb::directive::Kind;
    let kind = match d.kind {
        DirectiveKind::Sample { targets } => Kind::Sample(pb::SampleStep {
            targets: targets
                .into_iter()
                .map(|t| pb::RankTarget {
                    node: t.node.0,
                    device: t.device.0,
                    rank: t.rank.0,
                    use_backup: t.use_backup,
                })
                .collect(),
        }),
        DirectiveKind::PauseAt { step } => Kind::PauseAt(pb::PauseAt { step }),
        DirectiveKind::Switch {
            targets,
            call_timeout,
        } => Kind::SwitchNics(pb::NicTargets {
            targets: flags_to_pb(targets),
            restate: Vec::new(),
            call_timeout_ms: millis(call_timeout),
        }),
        DirectiveKind::Rollback {
            targets,
            restate,
            call_timeout,
        } => Kind::Rollback(pb::NicTargets {
            targets: flags_to_pb(targets),
            restate: flags_to_pb(restate),
            call_timeout_ms: millis(call_timeout),
        }),
        DirectiveKind::Resume => Kind::Resume(pb::ResumeTraining {}),
        DirectiveKind::Verify => Kind::Verify(pb::VerifyState {}),
        DirectiveKind::StopTraining { reason, then, only } => {
            let (then, restart) = match then {
                AfterStop::Launcher => (pb::AfterStop::Launcher, 0),
                AfterStop::Restart { number } => (pb::AfterStop::Restart, number),
                AfterStop::End => (pb::AfterStop::End, 0),
            };
            Kind::StopTraining(pb::StopTraining {
                reason,
                then: then.into(),
                restart,
                only: only.into_iter().map(|i| i.0).collect(),
            })
        }
        DirectiveKind::AbortInFlight { targets } => Kind::AbortInFlight(pb::NicTargets {
            targets: flags_to_pb(targets),
            restate: Vec::new(),
            call_timeout_ms: 0,
        }),
        DirectiveKind::SwitchInFlight {
            targets,
            call_timeout,
            redo,
        } => Kind::SwitchInFlight(pb::SwitchInFlight {
            nics: Some(pb::NicTargets {
                targets: flags_to_pb(targets),
                restate: Vec::new(),
                call_timeout_ms: millis(call_timeout),
            }),
            redo: redo
                .into_iter()
                .map(|r| pb::RedoPoint {
                    group: r.group,
                    from: r.from,
                })
                .collect(),
        }),
    };
    pb::Directive {
        op: d.op.to_string(),
        kind: Some(kind),
    }
}

/// A directive from a `Down` frame, as a client decodes it; refused if the operation id is
/// not a uuid or the kind is missing.
pub fn directive_from_pb(d: pb::Directive) -> Result<Directive, WireError> {
    use pb::directive::Kind;
    const W: &str = "directive";
    let op = op_id(W, &d.op)?;
    let kind = match d.kind.ok_or_else(|| missing(W, "its kind"))? {
        Kind::Sample(s) => DirectiveKind::Sample {
            targets: s
                .targets
                .into_iter()
                .map(|t| RankTarget {
                    node: NodeName(t.node),
                    device: DeviceId(t.device),
                    rank: GlobalRank(t.rank),
                    use_backup: t.use_backup,
                })
                .collect(),
        },
        Kind::PauseAt(p) => DirectiveKind::PauseAt { step: p.step },
        Kind::SwitchNics(t) => DirectiveKind::Switch {
            targets: flags_from_pb(t.targets),
            call_timeout: Duration::from_millis(t.call_timeout_ms),
        },
        Kind::Rollback(t) => DirectiveKind::Rollback {
            targets: flags_from_pb(t.targets),
            restate: flags_from_pb(t.restate),
            call_timeout: Duration::from_millis(t.call_timeout_ms),
        },
        Kind::Resume(_) => DirectiveKind::Resume,
        Kind::Verify(_) => DirectiveKind::Verify,
        Kind::StopTraining(t) => DirectiveKind::StopTraining {
            then: match t.then() {
                pb::AfterStop::Launcher => AfterStop::Launcher,
                pb::AfterStop::Restart => AfterStop::Restart { number: t.restart },
                pb::AfterStop::End => AfterStop::End,
            },
            reason: t.reason,
            only: t.only.into_iter().map(Instance).collect(),
        },
        Kind::AbortInFlight(t) => DirectiveKind::AbortInFlight {
            targets: flags_from_pb(t.targets),
        },
        Kind::SwitchInFlight(s) => {
            let nics = s.nics.ok_or_else(|| missing(W, "its targets"))?;
            DirectiveKind::SwitchInFlight {
                targets: flags_from_pb(nics.targets),
                call_timeout: Duration::from_millis(nics.call_timeout_ms),
                redo: s
                    .redo
                    .into_iter()
                    .map(|r| RedoPoint {
                        group: r.group,
                        from: r.from,
                    })
                    .collect(),
            }
        }
    };
    Ok(Directive { op, kind })
}

fn kind_to_pb(k: HalErrorKind) -> pb::HalErrorKind {
    use pb::HalErrorKind as P;
    match k {
        HalErrorKind::InvalidArgument => P::InvalidArgument,
        HalErrorKind::Timeout => P::Timeout,
        HalErrorKind::Network => P::Network,
        HalErrorKind::PeerLost => P::PeerLost,
        HalErrorKind::Unavailable => P::Unavailable,
        HalErrorKind::NotSupported => P::NotSupported,
        // A kind added to the core after this mapping; the round-trip test catches it.
        _ => P::Other,
    }
}

/// A kind this build does not know (a newer peer's) is read as `Other`: the kind is advice to
/// the control plane, and the vendor's code beside it still says exactly what happened.
fn kind_from_pb(raw: i32) -> Result<HalErrorKind, WireError> {
    use pb::HalErrorKind as P;
    Ok(match P::try_from(raw) {
        Ok(P::Unspecified) => return Err(missing("HAL error", "its kind")),
        Ok(P::InvalidArgument) => HalErrorKind::InvalidArgument,
        Ok(P::Timeout) => HalErrorKind::Timeout,
        Ok(P::Network) => HalErrorKind::Network,
        Ok(P::PeerLost) => HalErrorKind::PeerLost,
        Ok(P::Unavailable) => HalErrorKind::Unavailable,
        Ok(P::NotSupported) => HalErrorKind::NotSupported,
        Ok(P::Other) | Err(_) => HalErrorKind::Other,
    })
}

/// The previous version's closed enum, by the names its values stood for. Frozen: a new
/// backend's library travels in `library` alone.
const LEGACY_LIBRARIES: [(pb::LegacyLibrary, &str); 4] = [
    (pb::LegacyLibrary::Hccl, "hccl"),
    (pb::LegacyLibrary::Acl, "acl"),
    (pb::LegacyLibrary::Dcmi, "dcmi"),
    (pb::LegacyLibrary::Mock, "mock"),
];

/// What a peer of the previous version reads: the enum value of one of its four libraries;
/// HCCL's for an error without a code of any other library (no numbering to misread: the
/// previous version's framework HAL sent its errors so); else unspecified (which it refuses,
/// as it refuses any library it does not know).
fn legacy_library_to_pb(v: &VendorCode) -> pb::LegacyLibrary {
    let known = LEGACY_LIBRARIES
        .iter()
        .find(|(_, n)| *n == v.library.as_str())
        .map(|(l, _)| *l);
    match (known, v.code) {
        (Some(l), _) => l,
        (None, None) => pb::LegacyLibrary::Hccl,
        (None, Some(_)) => pb::LegacyLibrary::Unspecified,
    }
}

/// The library a frame names: `library` when set; the legacy enum of a previous-version
/// peer's frame otherwise. A name that is not a library name, an unknown legacy value, or
/// neither, is refused: the code could not be read in the right numbering.
fn library_from_pb(name: String, legacy: i32) -> Result<LibraryName, WireError> {
    let refused = |detail: String| WireError {
        what: "HAL error",
        detail,
    };
    if !name.is_empty() {
        return LibraryName::parse(name).map_err(|e| refused(e.to_string()));
    }
    match LEGACY_LIBRARIES.iter().find(|(v, _)| *v as i32 == legacy) {
        Some((_, name)) => Ok(LibraryName::new(name)),
        None if legacy == pb::LegacyLibrary::Unspecified as i32 => {
            Err(missing("HAL error", "its library"))
        }
        None => Err(refused(format!("unknown library {legacy}"))),
    }
}

/// The kind, library, code and name travel as they are: the receiver re-reads nothing.
fn hal_error_to_pb(h: HalError) -> pb::HalError {
    pb::HalError {
        op: h.op,
        code: h.vendor.code,
        detail: h.detail,
        kind: kind_to_pb(h.kind) as i32,
        legacy_library: legacy_library_to_pb(&h.vendor) as i32,
        library: h.vendor.library.to_string(),
        name: h.vendor.name.map(String::from),
    }
}

fn hal_error_from_pb(h: pb::HalError) -> Result<HalError, WireError> {
    Ok(HalError {
        kind: kind_from_pb(h.kind)?,
        vendor: Box::new(VendorCode {
            library: library_from_pb(h.library, h.legacy_library)?,
            code: h.code,
            name: h.name.map(Cow::Owned),
        }),
        op: h.op,
        detail: h.detail,
    })
}

fn rank_error_to_pb(e: RankError) -> pb::RankError {
    pb::RankError {
        group: e.group,
        hal: e.hal.map(hal_error_to_pb),
        message: e.message,
    }
}

fn rank_error_from_pb(e: pb::RankError) -> Result<RankError, WireError> {
    Ok(RankError {
        group: e.group,
        hal: e.hal.map(hal_error_from_pb).transpose()?,
        message: e.message,
    })
}

fn worker_report_to_pb(w: WorkerReport) -> pb::WorkerReport {
    pb::WorkerReport {
        groups: w
            .groups
            .into_iter()
            .map(|g| pb::GroupView {
                group: g.group,
                size: g.size,
                on_backup: g.on_backup.into_iter().map(|r| r.0).collect(),
                unsettled: g.unsettled.into_iter().map(|r| r.0).collect(),
            })
            .collect(),
        gate_op: w.gate.op.map(|o| o.to_string()).unwrap_or_default(),
        held_after: w.gate.held_after,
    }
}

fn worker_report_from_pb(w: pb::WorkerReport) -> Result<WorkerReport, WireError> {
    let op = if w.gate_op.is_empty() {
        None
    } else {
        Some(op_id("worker report", &w.gate_op)?)
    };
    Ok(WorkerReport {
        groups: w
            .groups
            .into_iter()
            .map(|g| GroupView {
                group: g.group,
                size: g.size,
                on_backup: g.on_backup.into_iter().map(GlobalRank).collect(),
                unsettled: g.unsettled.into_iter().map(GlobalRank).collect(),
            })
            .collect(),
        gate: GateReport {
            op,
            held_after: w.held_after,
        },
    })
}

pub(crate) fn rank_reply_to_pb(r: RankReply) -> pb::RankReply {
    use pb::rank_reply::Body;
    let body = match r.body {
        ReplyBody::Sampled {
            in_step,
            in_flight: false,
        } => Body::SampledInStep(in_step),
        ReplyBody::Sampled {
            in_step,
            in_flight: true,
        } => Body::SampledInFlight(in_step),
        ReplyBody::Paused { step } => Body::PausedStep(step),
        ReplyBody::Applied { calls } => Body::Applied(pb::AppliedCalls {
            calls: calls
                .into_iter()
                .map(|c| pb::AppliedCall {
                    group: c.group,
                    group_size: c.group_size,
                    digest: c.digest,
                })
                .collect(),
        }),
        ReplyBody::Resumed { stalled } => {
            Body::ResumedStallNanos(stalled.as_nanos().min(u64::MAX as u128) as u64)
        }
        ReplyBody::Failed(e) => Body::Failed(rank_error_to_pb(e)),
        ReplyBody::Verified(w) => Body::Verified(worker_report_to_pb(w)),
        ReplyBody::Stopped { at_step } => Body::Stopped(pb::StoppedTraining { at_step }),
        ReplyBody::Aborted {
            in_step,
            collectives,
        } => Body::Aborted(pb::AbortedInFlight {
            in_step,
            collectives: collectives
                .into_iter()
                .map(|c| pb::CollectivePosition {
                    group: c.group,
                    size: c.size,
                    completed: c.completed,
                    issued: c.issued,
                })
                .collect(),
        }),
    };
    pb::RankReply {
        rank: r.rank.0,
        op: r.op.to_string(),
        phase: phase_to_pb(r.phase) as i32,
        body: Some(body),
    }
}

pub(crate) fn rank_reply_from_pb(r: pb::RankReply) -> Result<RankReply, WireError> {
    use pb::rank_reply::Body;
    const W: &str = "rank reply";
    let body = match r.body.ok_or_else(|| missing(W, "its body"))? {
        Body::SampledInStep(in_step) => ReplyBody::Sampled {
            in_step,
            in_flight: false,
        },
        Body::SampledInFlight(in_step) => ReplyBody::Sampled {
            in_step,
            in_flight: true,
        },
        Body::PausedStep(step) => ReplyBody::Paused { step },
        Body::Applied(a) => ReplyBody::Applied {
            calls: a
                .calls
                .into_iter()
                .map(|c| AppliedCall {
                    group: c.group,
                    group_size: c.group_size,
                    digest: c.digest,
                })
                .collect(),
        },
        Body::ResumedStallNanos(n) => ReplyBody::Resumed {
            stalled: Duration::from_nanos(n),
        },
        Body::Failed(e) => ReplyBody::Failed(rank_error_from_pb(e)?),
        Body::Verified(w) => ReplyBody::Verified(worker_report_from_pb(w)?),
        Body::Stopped(s) => ReplyBody::Stopped { at_step: s.at_step },
        Body::Aborted(a) => ReplyBody::Aborted {
            in_step: a.in_step,
            collectives: a
                .collectives
                .into_iter()
                .map(|c| CollectivePosition {
                    group: c.group,
                    size: c.size,
                    completed: c.completed,
                    issued: c.issued,
                })
                .collect(),
        },
    };
    Ok(RankReply {
        rank: GlobalRank(r.rank),
        op: op_id(W, &r.op)?,
        phase: phase_from_pb(W, r.phase)?,
        body,
    })
}

pub(crate) fn node_reply_to_pb(n: NodeReply) -> pb::NodeReply {
    pb::NodeReply {
        node: n.node.0,
        op: n.op.to_string(),
        phase: phase_to_pb(n.phase) as i32,
        replies: n.replies.into_iter().map(rank_reply_to_pb).collect(),
        health: n.health.into_iter().map(link_health_to_pb).collect(),
    }
}

/// Both sides as they are, and the previous version's fields beside them.
fn link_health_to_pb(h: LinkHealth) -> pb::LinkHealth {
    /// The previous version's reading of an unknown side: a reason, never empty.
    fn unknown_why(s: &SideState) -> String {
        match s {
            SideState::Unknown(why) if why.is_empty() => "not known".into(),
            SideState::Unknown(why) => why.clone(),
            _ => String::new(),
        }
    }
    pb::LinkHealth {
        device: h.device.0,
        primary_up: h.primary.is_up(),
        backup_up: h.backup.is_up(),
        primary_unknown: unknown_why(&h.primary),
        backup_unknown: unknown_why(&h.backup),
        primary_side: Some(side_to_pb(h.primary)),
        backup_side: Some(side_to_pb(h.backup)),
    }
}

/// Each side from its `SideState`; from the previous version's fields when it has none.
fn link_health_from_pb(h: pb::LinkHealth) -> Result<LinkHealth, WireError> {
    const W: &str = "link health";
    let previous = |up: bool, unknown: String| match (up, unknown.is_empty()) {
        (_, false) => SideState::Unknown(unknown),
        (up, true) => SideState::up_or_down(up),
    };
    Ok(LinkHealth {
        device: DeviceId(h.device),
        primary: match h.primary_side {
            Some(s) => side_from_pb(W, "the primary side's state", s)?,
            None => previous(h.primary_up, h.primary_unknown),
        },
        backup: match h.backup_side {
            Some(s) => side_from_pb(W, "the backup side's state", s)?,
            None => previous(h.backup_up, h.backup_unknown),
        },
    })
}

pub(crate) fn node_reply_from_pb(n: pb::NodeReply) -> Result<NodeReply, WireError> {
    const W: &str = "node reply";
    Ok(NodeReply {
        node: NodeName(n.node),
        op: op_id(W, &n.op)?,
        phase: phase_from_pb(W, n.phase)?,
        replies: n
            .replies
            .into_iter()
            .map(rank_reply_from_pb)
            .collect::<Result<_, _>>()?,
        health: n
            .health
            .into_iter()
            .map(link_health_from_pb)
            .collect::<Result<_, _>>()?,
    })
}

/// What a worker sends its proxy, as the body of an `Up` frame.
pub fn worker_msg_to_pb(m: WorkerToProxy) -> pb::WorkerMessage {
    use pb::worker_message::Kind;
    pb::WorkerMessage {
        kind: Some(match m {
            WorkerToProxy::Hello(h) => Kind::Hello(hello_to_pb(h)),
            WorkerToProxy::Reply(r) => Kind::Reply(rank_reply_to_pb(r)),
            WorkerToProxy::Stall(n) => Kind::Stall(stall_to_pb(n)),
        }),
    }
}

pub(crate) fn worker_msg_from_pb(m: pb::WorkerMessage) -> Result<WorkerToProxy, WireError> {
    use pb::worker_message::Kind;
    match m
        .kind
        .ok_or_else(|| missing("worker message", "its kind"))?
    {
        Kind::Hello(h) => Ok(WorkerToProxy::Hello(hello_from_pb(h)?)),
        Kind::Reply(r) => Ok(WorkerToProxy::Reply(rank_reply_from_pb(r)?)),
        Kind::Stall(n) => Ok(WorkerToProxy::Stall(stall_from_pb(n))),
    }
}

fn stall_to_pb(n: StallNotice) -> pb::StallNotice {
    pb::StallNotice {
        rank: n.rank.0,
        instance: n.instance.0,
        last_step: n.last_step,
        stalled_for_ms: n
            .stalled_for
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

fn stall_from_pb(n: pb::StallNotice) -> StallNotice {
    StallNotice {
        rank: GlobalRank(n.rank),
        instance: Instance(n.instance),
        last_step: n.last_step,
        stalled_for: n.stalled_for_ms.map(Duration::from_millis),
    }
}

fn link_state_to_pb(s: &SideState) -> pb::LinkState {
    match s {
        SideState::Up => pb::LinkState::Up,
        SideState::Down(_) => pb::LinkState::Down,
        SideState::Unknown(_) => pb::LinkState::Unknown,
        SideState::Degraded(_) => pb::LinkState::Degraded,
    }
}

/// The state `raw` names, with `why`: a newer peer's state is read as unknown (not up); a
/// missing one is refused.
fn link_state_from_pb(
    what: &'static str,
    side: &str,
    raw: i32,
    why: String,
) -> Result<SideState, WireError> {
    match pb::LinkState::try_from(raw) {
        Ok(pb::LinkState::Up) => Ok(SideState::Up),
        Ok(pb::LinkState::Down) => Ok(SideState::Down(why)),
        Ok(pb::LinkState::Degraded) => Ok(SideState::Degraded(why)),
        Ok(pb::LinkState::Unspecified) => Err(missing(what, side)),
        Ok(pb::LinkState::Unknown) | Err(_) => Ok(SideState::Unknown(why)),
    }
}

fn side_to_pb(s: SideState) -> pb::SideState {
    let state = link_state_to_pb(&s) as i32;
    let why = match s {
        SideState::Up => String::new(),
        SideState::Degraded(why) | SideState::Down(why) | SideState::Unknown(why) => why,
    };
    pb::SideState { state, why }
}

fn side_from_pb(what: &'static str, side: &str, s: pb::SideState) -> Result<SideState, WireError> {
    link_state_from_pb(what, side, s.state, s.why)
}

/// A proxy's link report for the wire: each side's state and reason, and the previous
/// version's state alone beside it.
pub(crate) fn link_report_to_pb(r: LinkReport) -> pb::LinkReport {
    pb::LinkReport {
        node: r.node.0,
        device: r.device.0,
        primary: link_state_to_pb(&r.links.primary) as i32,
        backup: link_state_to_pb(&r.links.backup) as i32,
        primary_side: Some(side_to_pb(r.links.primary)),
        backup_side: Some(side_to_pb(r.links.backup)),
        from_kernel: r.from_kernel,
    }
}

/// A proxy's link report from the wire: each side from its `SideState`, or from the previous
/// version's state alone when it has none; a missing state is refused, a newer one is unknown.
pub(crate) fn link_report_from_pb(r: pb::LinkReport) -> Result<LinkReport, WireError> {
    const W: &str = "link report";
    let side = |name: &str, s: Option<pb::SideState>, previous: i32| match s {
        Some(s) => side_from_pb(W, name, s),
        None => link_state_from_pb(W, name, previous, String::new()),
    };
    Ok(LinkReport {
        node: NodeName(r.node),
        device: DeviceId(r.device),
        links: Links {
            primary: side("the primary link's state", r.primary_side, r.primary)?,
            backup: side("the backup link's state", r.backup_side, r.backup)?,
        },
        from_kernel: r.from_kernel,
    })
}

/// What a proxy sends the manager, as the body of an `Up` frame.
pub fn proxy_msg_to_pb(m: ProxyToManager) -> pb::ProxyMessage {
    use pb::proxy_message::Kind;
    pb::ProxyMessage {
        kind: Some(match m {
            ProxyToManager::WorkerUp(h) => Kind::WorkerUp(hello_to_pb(h)),
            ProxyToManager::WorkerLost {
                rank,
                reason,
                how,
                instance,
                generation,
            } => Kind::WorkerLost(pb::WorkerLost {
                rank: rank.0,
                reason,
                how: match how {
                    Gone::Died => pb::Gone::Died,
                    Gone::Ended => pb::Gone::Ended,
                    Gone::Unreachable => pb::Gone::Unreachable,
                }
                .into(),
                instance: instance.0,
                generation,
            }),
            ProxyToManager::Reply(n) => Kind::Reply(node_reply_to_pb(n)),
            ProxyToManager::Links(r) => Kind::Links(link_report_to_pb(r)),
            ProxyToManager::Stall(n) => Kind::Stall(stall_to_pb(n)),
        }),
    }
}

pub(crate) fn proxy_msg_from_pb(m: pb::ProxyMessage) -> Result<ProxyToManager, WireError> {
    use pb::proxy_message::Kind;
    match m.kind.ok_or_else(|| missing("proxy message", "its kind"))? {
        Kind::WorkerUp(h) => Ok(ProxyToManager::WorkerUp(hello_from_pb(h)?)),
        Kind::WorkerLost(l) => Ok(ProxyToManager::WorkerLost {
            rank: GlobalRank(l.rank),
            how: match l.how() {
                pb::Gone::Died => Gone::Died,
                pb::Gone::Ended => Gone::Ended,
                pb::Gone::Unreachable => Gone::Unreachable,
            },
            reason: l.reason,
            instance: Instance(l.instance),
            generation: l.generation,
        }),
        Kind::Reply(n) => Ok(ProxyToManager::Reply(node_reply_from_pb(n)?)),
        Kind::Links(r) => Ok(ProxyToManager::Links(link_report_from_pb(r)?)),
        Kind::Stall(n) => Ok(ProxyToManager::Stall(stall_from_pb(n))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::HcclCode;

    fn op() -> OperationId {
        OperationId(uuid::Uuid::from_u128(0x1234_5678))
    }

    fn vendor(library: &str, code: Option<i32>, name: Option<&'static str>) -> Box<VendorCode> {
        Box::new(VendorCode {
            library: LibraryName::parse(library).unwrap(),
            code,
            name: name.map(Cow::Borrowed),
        })
    }

    #[test]
    fn hal_errors_cross_the_wire_as_they_are() {
        for kind in HalErrorKind::ALL {
            for library in ["hccl", "acl", "dcmi", "mock", "a_new_backend"] {
                let h = HalError {
                    op: "op".into(),
                    kind,
                    vendor: vendor(
                        library,
                        Some(-8005),
                        Some("A_NAME_THE_RECEIVER_NEED_NOT_KNOW"),
                    ),
                    detail: "d".into(),
                };
                assert_eq!(hal_error_from_pb(hal_error_to_pb(h.clone())).unwrap(), h);
            }
        }
        // A DCMI code travels as DCMI's, with DCMI's name, not as an HcclResult.
        let dcmi = HalError {
            op: "dcmi_init".into(),
            kind: HalErrorKind::Timeout,
            vendor: vendor("dcmi", Some(-8006), Some("DCMI_ERR_CODE_TIME_OUT")),
            detail: String::new(),
        };
        let pb = hal_error_to_pb(dcmi.clone());
        assert_eq!(
            (
                pb.library.as_str(),
                pb.legacy_library,
                pb.code,
                pb.name.as_deref()
            ),
            (
                "dcmi",
                pb::LegacyLibrary::Dcmi as i32,
                Some(-8006),
                Some("DCMI_ERR_CODE_TIME_OUT"),
            )
        );
        assert_eq!(pb.kind, pb::HalErrorKind::Timeout as i32);
        // A name read from a peer is never a metric label of this process.
        let read = hal_error_from_pb(pb).unwrap();
        assert_eq!(read.vendor.metric_name(), taskd_core::hal::OTHER_CODE_NAME);
        // A newer peer's kind is read as Other; a missing kind or library, a legacy value
        // the previous version did not have, or a name that is no library name is refused.
        let with = |f: fn(&mut pb::HalError)| {
            let mut p = hal_error_to_pb(dcmi.clone());
            f(&mut p);
            hal_error_from_pb(p)
        };
        assert_eq!(with(|p| p.kind = 99).unwrap().kind, HalErrorKind::Other);
        assert!(with(|p| p.kind = 0).unwrap_err().detail.contains("kind"));
        let no_library = with(|p| (p.library.clear(), p.legacy_library = 0).1).unwrap_err();
        assert!(no_library.detail.contains("library"), "{no_library}");
        assert_eq!(
            with(|p| (p.library.clear(), p.legacy_library = 42).1)
                .unwrap_err()
                .detail,
            "unknown library 42"
        );
        let bad = with(|p| p.library = "DCMI v2".into()).unwrap_err();
        assert!(bad.detail.contains("\"DCMI v2\""), "{bad}");
        // The name wins over the legacy value.
        let named = with(|p| p.library = "acl".into()).unwrap();
        assert_eq!(named.vendor.library.as_str(), "acl");
    }

    /// `HalError` as the previous version of `net.proto` had it: field 5 a closed enum of four
    /// libraries, no field 7.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PreviousHalError {
        #[prost(string, tag = "1")]
        op: String,
        #[prost(int32, optional, tag = "2")]
        code: Option<i32>,
        #[prost(string, tag = "3")]
        detail: String,
        #[prost(int32, tag = "4")]
        kind: i32,
        #[prost(int32, tag = "5")]
        library: i32,
        #[prost(string, optional, tag = "6")]
        name: Option<String>,
    }

    #[test]
    fn a_peer_of_the_previous_version_and_this_one_read_each_others_hal_errors() {
        use prost::Message as _;
        // What a previous-version worker sends: library 3 (DCMI), no name field 7.
        let old = PreviousHalError {
            op: "dcmi_get_device_network_health".into(),
            code: Some(-8006),
            detail: "card_id=1".into(),
            kind: pb::HalErrorKind::Timeout as i32,
            library: 3,
            name: Some("DCMI_ERR_CODE_TIME_OUT".into()),
        };
        let read = hal_error_from_pb(pb::HalError::decode(&old.encode_to_vec()[..]).unwrap());
        let read = read.unwrap();
        assert_eq!(read.vendor.library.as_str(), "dcmi");
        assert_eq!(
            (read.kind, read.vendor.code, read.vendor.name.as_deref()),
            (
                HalErrorKind::Timeout,
                Some(-8006),
                Some("DCMI_ERR_CODE_TIME_OUT")
            )
        );
        for (legacy, name) in [(1, "hccl"), (2, "acl"), (4, "mock")] {
            let frame = PreviousHalError {
                library: legacy,
                ..old.clone()
            };
            let read = pb::HalError::decode(&frame.encode_to_vec()[..]).unwrap();
            assert_eq!(
                hal_error_from_pb(read).unwrap().vendor.library.as_str(),
                name
            );
        }
        // What a previous-version manager reads from this version: its own enum value for its
        // four libraries; unspecified (0, which it refuses) for a library it never had.
        let sent = |library: &str| {
            let h = HalError {
                vendor: vendor(library, Some(19), None),
                ..read.clone()
            };
            PreviousHalError::decode(&hal_error_to_pb(h).encode_to_vec()[..]).unwrap()
        };
        for (name, legacy) in [("hccl", 1), ("acl", 2), ("dcmi", 3), ("mock", 4)] {
            let p = sent(name);
            assert_eq!(
                (p.library, p.code, p.op.as_str()),
                (legacy, Some(19), read.op.as_str())
            );
        }
        assert_eq!(sent("a_new_backend").library, 0);
        // An error without a code has no numbering to misread: the previous version reads it
        // as HCCL's (as its framework HAL sent them) rather than refuse the frame.
        let uncoded = HalError::uncoded(
            "_comm_switch_nic",
            LibraryName::FRAMEWORK,
            HalErrorKind::Other,
            "returned False",
        );
        let p = PreviousHalError::decode(&hal_error_to_pb(uncoded.clone()).encode_to_vec()[..])
            .unwrap();
        assert_eq!((p.library, p.code), (1, None));
        assert_eq!(
            hal_error_from_pb(hal_error_to_pb(uncoded.clone())).unwrap(),
            uncoded
        );
    }

    #[test]
    fn every_directive_round_trips() {
        let targets = vec![RankTarget {
            node: NodeName("node-1".into()),
            device: DeviceId(3),
            rank: GlobalRank(11),
            use_backup: true,
        }];
        let kinds = vec![
            DirectiveKind::Sample { targets },
            DirectiveKind::PauseAt { step: 42 },
            DirectiveKind::Switch {
                targets: vec![
                    (GlobalRank(11), NicSide::Backup),
                    (GlobalRank(2), NicSide::Primary),
                ],
                call_timeout: Duration::from_millis(225_000),
            },
            DirectiveKind::Rollback {
                targets: vec![(GlobalRank(11), NicSide::Primary)],
                restate: vec![(GlobalRank(10), NicSide::Backup)],
                call_timeout: Duration::from_millis(1),
            },
            DirectiveKind::Resume,
            DirectiveKind::Verify,
            DirectiveKind::StopTraining {
                reason: "the rollback of U failed; held 60s".into(),
                then: AfterStop::Launcher,
                only: Vec::new(),
            },
            DirectiveKind::StopTraining {
                reason: "rank 3 lost".into(),
                then: AfterStop::Restart { number: 2 },
                only: vec![Instance(7), Instance(u64::MAX)],
            },
            DirectiveKind::StopTraining {
                reason: "no restart left".into(),
                then: AfterStop::End,
                only: Vec::new(),
            },
            DirectiveKind::AbortInFlight {
                targets: vec![(GlobalRank(5), NicSide::Backup)],
            },
            DirectiveKind::SwitchInFlight {
                targets: vec![(GlobalRank(5), NicSide::Backup)],
                call_timeout: Duration::from_millis(9_000),
                redo: vec![RedoPoint {
                    group: "0".into(),
                    from: 41,
                }],
            },
        ];
        for kind in kinds {
            let d = Directive { op: op(), kind };
            assert_eq!(directive_from_pb(directive_to_pb(d.clone())).unwrap(), d);
        }
    }

    #[test]
    fn every_reply_round_trips() {
        let bodies = vec![
            ReplyBody::Sampled {
                in_step: 7,
                in_flight: false,
            },
            ReplyBody::Paused { step: 8 },
            ReplyBody::Applied {
                calls: vec![AppliedCall {
                    group: "tp_0".into(),
                    group_size: 8,
                    digest: u64::MAX - 3,
                }],
            },
            ReplyBody::Resumed {
                stalled: Duration::from_micros(1234),
            },
            ReplyBody::Stopped { at_step: None },
            ReplyBody::Stopped { at_step: Some(271) },
            ReplyBody::Aborted {
                in_step: 12,
                collectives: vec![CollectivePosition {
                    group: "0".into(),
                    size: 6,
                    completed: 40,
                    issued: 42,
                }],
            },
            ReplyBody::Verified(WorkerReport {
                groups: vec![GroupView {
                    group: "world".into(),
                    size: 16,
                    on_backup: vec![GlobalRank(3), GlobalRank(9)],
                    unsettled: vec![GlobalRank(9)],
                }],
                gate: GateReport {
                    op: Some(op()),
                    held_after: Some(41),
                },
            }),
            ReplyBody::Verified(WorkerReport::default()),
            ReplyBody::Failed(RankError::in_group(
                "dp_1",
                HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "x"),
            )),
            ReplyBody::Failed(RankError::hal(HalError::new("op", HcclCode::Other(77), ""))),
            ReplyBody::Failed(RankError::hal(HalError::uncoded(
                "dcmi",
                LibraryName::new("dcmi"),
                HalErrorKind::NotSupported,
                "no DCMI",
            ))),
            ReplyBody::Failed(RankError::worker("the HAL panicked")),
        ];
        for (i, body) in bodies.into_iter().enumerate() {
            let r = RankReply {
                rank: GlobalRank(i as u32),
                op: op(),
                phase: Phase::Switch,
                body,
            };
            let n = NodeReply {
                node: NodeName("node-0".into()),
                op: op(),
                phase: Phase::Switch,
                replies: vec![r.clone()],
                health: vec![
                    LinkHealth::new(DeviceId(1), false, true),
                    LinkHealth::new(DeviceId(2), true, true)
                        .with_unknown(NicSide::Backup, "probe timed out"),
                    LinkHealth::new(DeviceId(3), true, true)
                        .with_degraded(NicSide::Primary, "loss 50% > 25%")
                        .with(NicSide::Backup, SideState::Down("operstate down".into())),
                ],
            };
            let w = WorkerToProxy::Reply(r);
            assert_eq!(worker_msg_from_pb(worker_msg_to_pb(w.clone())).unwrap(), w);
            let p = ProxyToManager::Reply(n);
            assert_eq!(proxy_msg_from_pb(proxy_msg_to_pb(p.clone())).unwrap(), p);
        }
        for stalled_for in [Some(Duration::from_millis(1_836_000)), None] {
            let n = StallNotice {
                rank: GlobalRank(5),
                instance: Instance(0xfeed),
                last_step: 41,
                stalled_for,
            };
            let w = WorkerToProxy::Stall(n.clone());
            assert_eq!(worker_msg_from_pb(worker_msg_to_pb(w.clone())).unwrap(), w);
            let p = ProxyToManager::Stall(n);
            assert_eq!(proxy_msg_from_pb(proxy_msg_to_pb(p.clone())).unwrap(), p);
        }
        let hello = WorkerHello {
            job: JobId("j".into()),
            node: NodeName("n".into()),
            rank: GlobalRank(3),
            capabilities: SwitchCapabilities::lacking([
                HcclSetup::L2_RETRY_OFF,
                Missing::new(LibraryName::new("acme"), "ACME_MULTIRAIL=0"),
            ]),
            instance: Instance(0x1234_5678_9abc_def1),
            generation: 2,
        };
        let links = |primary: SideState, backup| {
            ProxyToManager::Links(LinkReport {
                node: NodeName("node-1".into()),
                device: DeviceId(5),
                from_kernel: matches!(primary, SideState::Down(_)),
                links: Links { primary, backup },
            })
        };
        for m in [
            ProxyToManager::WorkerUp(hello.clone()),
            ProxyToManager::WorkerLost {
                rank: GlobalRank(3),
                reason: "gone".into(),
                how: Gone::Died,
                instance: Instance(9),
                generation: 0,
            },
            ProxyToManager::WorkerLost {
                rank: GlobalRank(4),
                reason: "its proxy stopped".into(),
                how: Gone::Unreachable,
                instance: Instance::UNKNOWN,
                generation: 3,
            },
            ProxyToManager::WorkerLost {
                rank: GlobalRank(5),
                reason: "training ended".into(),
                how: Gone::Ended,
                instance: Instance(1),
                generation: 1,
            },
            links(SideState::Down(String::new()), SideState::Up),
            links(SideState::Up, SideState::Unknown("probe timed out".into())),
            links(
                SideState::Degraded("rtt 40 ms > 10 ms".into()),
                SideState::Up,
            ),
        ] {
            assert_eq!(proxy_msg_from_pb(proxy_msg_to_pb(m.clone())).unwrap(), m);
        }
        let w = WorkerToProxy::Hello(hello);
        assert_eq!(worker_msg_from_pb(worker_msg_to_pb(w.clone())).unwrap(), w);
    }

    #[test]
    fn a_link_state_from_a_newer_peer_is_not_up_and_a_missing_one_is_refused() {
        let report = |primary, backup| pb::LinkReport {
            node: "node-0".into(),
            device: 2,
            primary,
            backup,
            ..Default::default()
        };
        let r = link_report_from_pb(report(pb::LinkState::Up as i32, 42)).unwrap();
        assert_eq!(
            (r.links.primary, r.links.backup),
            (SideState::Up, SideState::Unknown(String::new()))
        );
        let e = link_report_from_pb(report(0, pb::LinkState::Up as i32)).unwrap_err();
        assert!(
            e.to_string().contains("primary link's state is missing"),
            "{e}"
        );
        // Likewise in a side of this version.
        let with_side = |state| pb::LinkReport {
            backup_side: Some(pb::SideState {
                state,
                why: "w".into(),
            }),
            ..report(1, 1)
        };
        let r = link_report_from_pb(with_side(42)).unwrap();
        assert_eq!(r.links.backup, SideState::Unknown("w".into()));
        let e = link_report_from_pb(with_side(0)).unwrap_err();
        assert!(
            e.to_string().contains("backup link's state is missing"),
            "{e}"
        );
        let health = pb::LinkHealth {
            primary_side: Some(pb::SideState::default()),
            ..Default::default()
        };
        let e = link_health_from_pb(health).unwrap_err();
        assert!(
            e.to_string().contains("primary side's state is missing"),
            "{e}"
        );
    }

    /// `LinkHealth` and `LinkReport` as the previous version of `net.proto` had them: no
    /// `SideState`, no degraded state in a node's health, no reason for a link that is down.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PreviousLinkHealth {
        #[prost(uint32, tag = "1")]
        device: u32,
        #[prost(bool, tag = "2")]
        primary_up: bool,
        #[prost(bool, tag = "3")]
        backup_up: bool,
        #[prost(string, tag = "4")]
        primary_unknown: String,
        #[prost(string, tag = "5")]
        backup_unknown: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PreviousLinkReport {
        #[prost(string, tag = "1")]
        node: String,
        #[prost(uint32, tag = "2")]
        device: u32,
        #[prost(int32, tag = "3")]
        primary: i32,
        #[prost(int32, tag = "4")]
        backup: i32,
    }

    #[test]
    fn a_peer_of_the_previous_version_and_this_one_read_each_others_link_states() {
        use prost::Message as _;
        // What a previous-version proxy sends: booleans and an unknown side's reason.
        let old = PreviousLinkHealth {
            device: 4,
            primary_up: true,
            backup_up: false,
            primary_unknown: String::new(),
            backup_unknown: "partner die not visible".into(),
        };
        let read = pb::LinkHealth::decode(&old.encode_to_vec()[..]).unwrap();
        assert_eq!(
            link_health_from_pb(read).unwrap(),
            LinkHealth::new(DeviceId(4), true, false)
                .with_unknown(NicSide::Backup, "partner die not visible")
        );
        // What a previous-version manager reads from this version: a degraded side is up, an
        // unknown one says why (a reason even when the HAL gave none), a down one is down.
        let sent = |h: LinkHealth| {
            PreviousLinkHealth::decode(&link_health_to_pb(h).encode_to_vec()[..]).unwrap()
        };
        let p = sent(
            LinkHealth::new(DeviceId(1), true, true)
                .with_degraded(NicSide::Primary, "loss 50% > 25%")
                .with(NicSide::Backup, SideState::Unknown(String::new())),
        );
        assert_eq!(
            (p.primary_up, p.primary_unknown.as_str()),
            (true, ""),
            "degraded reads as up"
        );
        assert_eq!(
            (p.backup_up, p.backup_unknown.as_str()),
            (false, "not known")
        );
        let p = sent(
            LinkHealth::new(DeviceId(1), false, true)
                .with(NicSide::Primary, SideState::Down("operstate down".into())),
        );
        assert_eq!((p.primary_up, p.primary_unknown.as_str()), (false, ""));
        // Link reports: the previous version's states alone, either way.
        let old = PreviousLinkReport {
            node: "node-0".into(),
            device: 1,
            primary: pb::LinkState::Degraded as i32,
            backup: pb::LinkState::Down as i32,
        };
        let r =
            link_report_from_pb(pb::LinkReport::decode(&old.encode_to_vec()[..]).unwrap()).unwrap();
        assert_eq!(
            (r.links.primary, r.links.backup),
            (
                SideState::Degraded(String::new()),
                SideState::Down(String::new())
            )
        );
        let report = LinkReport {
            node: NodeName("node-0".into()),
            device: DeviceId(1),
            links: Links {
                primary: SideState::Degraded("loss 50% > 25%".into()),
                backup: SideState::Up,
            },
            from_kernel: false,
        };
        let p = PreviousLinkReport::decode(&link_report_to_pb(report).encode_to_vec()[..]).unwrap();
        assert_eq!(
            (p.primary, p.backup),
            (pb::LinkState::Degraded as i32, pb::LinkState::Up as i32)
        );
    }

    #[test]
    fn capabilities_cross_the_wire_named_and_a_previous_peer_reads_its_booleans() {
        let acme = Missing::new(LibraryName::new("acme"), "ACME_MULTIRAIL=0");
        let cases = [
            SwitchCapabilities::ALL,
            SwitchCapabilities::ALL.with_tsp(false),
            HcclSetup {
                l2_retry: false,
                rdma: false,
            }
            .capabilities(),
            SwitchCapabilities::lacking([acme.clone()]),
        ];
        for c in &cases {
            assert_eq!(&caps_from_pb(Some(caps_to_pb(c))).unwrap(), c);
        }
        // A previous-version peer reads the booleans: another backend's gap refuses there too.
        let b = |p: pb::Capabilities| (p.tsp, p.l2_retry, p.rdma);
        assert_eq!(b(caps_to_pb(&cases[0])), (true, true, true));
        assert_eq!(b(caps_to_pb(&cases[1])), (false, true, true));
        assert_eq!(b(caps_to_pb(&cases[2])), (true, false, false));
        assert_eq!(b(caps_to_pb(&cases[3])), (true, false, true));
        // A previous-version frame: its booleans, in this version's words.
        let old = |tsp, l2_retry, rdma| {
            caps_from_pb(Some(pb::Capabilities {
                tsp,
                l2_retry,
                rdma,
                missing: Vec::new(),
            }))
            .unwrap()
        };
        assert_eq!(old(true, true, true), SwitchCapabilities::ALL);
        assert_eq!(old(false, true, true), cases[1]);
        assert_eq!(old(true, false, false), cases[2]);
        assert_eq!(caps_from_pb(None).unwrap().missing().count(), 3);
        // A thing named by something that is no library name is refused.
        let mut bad = caps_to_pb(&SwitchCapabilities::lacking([acme]));
        bad.missing[0].by = "Acme NICs".into();
        let e = caps_from_pb(Some(bad)).unwrap_err();
        assert!(e.to_string().contains("\"Acme NICs\""), "{e}");
    }

    #[test]
    fn malformed_frames_say_what_is_wrong() {
        let e = directive_from_pb(pb::Directive {
            op: "not-a-uuid".into(),
            kind: Some(pb::directive::Kind::Resume(pb::ResumeTraining {})),
        })
        .unwrap_err();
        assert!(e.to_string().contains("operation id"), "{e}");
        let e = directive_from_pb(pb::Directive {
            op: op().to_string(),
            kind: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("kind is missing"), "{e}");
        let e = rank_reply_from_pb(pb::RankReply {
            rank: 1,
            op: op().to_string(),
            phase: 0,
            body: Some(pb::rank_reply::Body::PausedStep(1)),
        })
        .unwrap_err();
        assert!(e.to_string().contains("unknown phase"), "{e}");
    }
}
