//! Conversions between the manager's types and the control API's messages. A result travels as
//! [`OperationSummary`] both ways, so `Control`, the CLI's JSON and the simulator's JSON are one
//! shape.

use super::proto;
use crate::manager::ManagerStatus;
use taskd_core::ledger::TrainingStop;
use taskd_core::operation::{OperationReport, Trigger};
use taskd_core::protocol::AfterStop;
use taskd_core::summary::{PhasesMs, RankErrorSummary, TargetSummary};
use taskd_core::verify::VerifyReport;
use taskd_core::OperationSummary;

impl From<&OperationSummary> for proto::OperationResult {
    fn from(s: &OperationSummary) -> Self {
        let p = s.phases_ms;
        proto::OperationResult {
            uuid: s.uuid.clone(),
            direction: s.direction.clone(),
            result: s.result.clone(),
            error: s.error.clone().unwrap_or_default(),
            rolled_back: s.rolled_back,
            pause_step: s.pause_step,
            phases: Some(proto::PhaseDurations {
                pause_ms: p.pause,
                switch_ms: p.switch,
                resume_ms: p.resume,
                rollback_ms: p.rollback,
                total_ms: p.total,
            }),
            stall_ms: s.stall_ms,
            targets: s
                .targets
                .iter()
                .map(|t| proto::Target {
                    node: t.node.clone(),
                    device: t.device,
                    use_backup: t.use_backup,
                    rank: t.rank,
                })
                .collect(),
            rank_errors: s
                .rank_errors
                .iter()
                .map(|e| proto::RankError {
                    rank: e.rank,
                    phase: e.phase.clone(),
                    group: e.group.clone(),
                    hccl_code: e.hccl_code,
                    message: e.message.clone(),
                    kind: e.kind.clone(),
                    library: e.library.clone(),
                    code: e.code,
                    code_name: e.code_name.clone(),
                })
                .collect(),
            lost_ranks: s.lost_ranks.clone(),
            job_state: s.job_state.clone(),
            applied: s.applied,
            trigger: s.trigger.as_str().into(),
            journal_error: s.journal_error.clone().unwrap_or_default(),
            hold: s.hold.clone().unwrap_or_default(),
        }
    }
}

impl From<&proto::OperationResult> for OperationSummary {
    fn from(r: &proto::OperationResult) -> Self {
        let p = r.phases.unwrap_or_default();
        OperationSummary {
            uuid: r.uuid.clone(),
            direction: r.direction.clone(),
            targets: r
                .targets
                .iter()
                .map(|t| TargetSummary {
                    node: t.node.clone(),
                    device: t.device,
                    rank: t.rank,
                    use_backup: t.use_backup,
                })
                .collect(),
            result: r.result.clone(),
            error: Some(r.error.clone()).filter(|e| !e.is_empty()),
            rolled_back: r.rolled_back,
            pause_step: r.pause_step,
            phases_ms: PhasesMs {
                pause: p.pause_ms,
                switch: p.switch_ms,
                resume: p.resume_ms,
                rollback: p.rollback_ms,
                total: p.total_ms,
            },
            stall_ms: r.stall_ms,
            job_state: r.job_state.clone(),
            applied: r.applied,
            rank_errors: r
                .rank_errors
                .iter()
                .map(|e| RankErrorSummary {
                    rank: e.rank,
                    phase: e.phase.clone(),
                    group: e.group.clone(),
                    hccl_code: e.hccl_code,
                    kind: e.kind.clone(),
                    library: e.library.clone(),
                    code: e.code,
                    code_name: e.code_name.clone(),
                    message: e.message.clone(),
                })
                .collect(),
            lost_ranks: r.lost_ranks.clone(),
            // An older manager's results say nothing: an operator's.
            trigger: if r.trigger == Trigger::Auto.as_str() {
                Trigger::Auto
            } else {
                Trigger::Operator
            },
            journal_error: Some(r.journal_error.clone()).filter(|e| !e.is_empty()),
            hold: Some(r.hold.clone()).filter(|h| !h.is_empty()),
        }
    }
}

/// A final report as `Control` sends it.
pub fn result(r: &OperationReport) -> proto::OperationResult {
    (&OperationSummary::from(r)).into()
}

/// The manager's status as `Control` sends it.
pub fn status(s: &ManagerStatus) -> proto::JobStatus {
    proto::JobStatus {
        job_id: s.job.0.clone(),
        state: s.state.as_str().into(),
        workers_registered: s.workers_registered as u32,
        workers_expected: s.workers_expected as u32,
        nodes_connected: s.nodes_connected as u32,
        ranks_on_backup: s.ranks_on_backup.iter().map(|r| r.0).collect(),
        in_flight: s.in_flight.as_ref().map(|(id, phase)| proto::InFlight {
            uuid: id.to_string(),
            phase: phase.as_str().into(),
            pending_ranks: s.pending_ranks.iter().map(|r| r.0).collect(),
        }),
        recent: s.recent.iter().map(result).collect(),
        lost_ranks: s
            .lost_ranks
            .iter()
            .map(|l| proto::LostRank {
                rank: l.rank.0,
                reason: l.reason.clone(),
                how: l.how.as_str().into(),
            })
            .collect(),
        verified: s.verified,
        last_verification: s.last_verification.as_ref().map(verification),
        clusterd: s.clusterd.as_ref().map(|c| proto::ClusterdLink {
            addr: c.addr.clone(),
            connected: c.connected,
            detail: c.detail.clone(),
            driving: c.driving.clone().unwrap_or_default(),
        }),
        in_calls: s.in_calls.as_ref().map(|(op, ranks)| proto::InCalls {
            uuid: op.to_string(),
            ranks: ranks.iter().map(|r| r.0).collect(),
        }),
        training_stop: s.training_stop.as_ref().map(training_stop),
        last_training_stop: s.last_training_stop.as_ref().map(training_stop),
        journal_error: s.journal_error.clone().unwrap_or_default(),
        restarts: (s.restarts.max.is_some() || s.restarts.done > 0).then(|| proto::Restarts {
            done: s.restarts.done,
            max: s.restarts.max,
            cause: s
                .restarts
                .cause
                .as_ref()
                .map(|(c, _)| c.clone())
                .unwrap_or_default(),
            owed: s.restart_owed.clone().unwrap_or_default(),
        }),
        stalled_ranks: s
            .stalled_ranks
            .iter()
            .map(|h| proto::StalledRank {
                rank: h.rank.0,
                last_step: h.last_step,
                stalled_for_ms: ms(h.stalled_for),
            })
            .collect(),
        hold: s.hold.map(|(held, stops_in)| proto::Hold {
            held_ms: ms(held),
            stops_in_ms: stops_in.map(ms),
        }),
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A stop of training for the wire.
pub fn training_stop(t: &TrainingStop) -> proto::TrainingStop {
    proto::TrainingStop {
        uuid: t.id.to_string(),
        by: t.by.as_str().into(),
        reason: t.reason.clone(),
        phase: t.phase().as_str().into(),
        stopping: t.stopping.iter().map(|r| r.0).collect(),
        not_back: t.not_back.iter().map(|r| r.0).collect(),
        waiting_for: t.waiting_for(),
        then: match t.then {
            AfterStop::Launcher => "launcher",
            AfterStop::Restart { .. } => "restart",
            AfterStop::End => "end",
        }
        .into(),
        restart: match t.then {
            AfterStop::Restart { number } => number,
            _ => 0,
        },
        unreachable: t.unreachable.iter().map(|r| r.0).collect(),
        old_back: t.old_back.iter().map(|r| r.0).collect(),
        overdue: t.overdue,
        trained_to: t.trained_to,
        last_words: t.last_words.as_ref().map(|l| proto::LastWords {
            taken: l.taken,
            detail: l.detail.clone(),
        }),
        resume: t.resume_note().unwrap_or_default(),
    }
}

/// A verification round for the wire.
pub fn verification(v: &VerifyReport) -> proto::Verification {
    let a = v.assessment.clone().unwrap_or_default();
    proto::Verification {
        uuid: v.id.to_string(),
        summary: v.to_string(),
        disagreements: a
            .disagreements
            .iter()
            .map(|d| proto::Disagreement {
                group: d.group.clone(),
                ranks: d.ranks.iter().map(|r| r.0).collect(),
                detail: d.detail.clone(),
            })
            .collect(),
        released: v.released.iter().map(|o| o.to_string()).collect(),
        missing: v.missing.iter().map(|r| r.0).collect(),
        held: a.held.iter().map(|r| r.0).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_survives_the_wire() {
        let s = OperationSummary {
            journal_error: None,
            hold: None,
            uuid: "8b1f8d36-0000-4000-8000-000000000001".into(),
            direction: "to_backup".into(),
            targets: vec![TargetSummary {
                node: "node-0".into(),
                device: 1,
                rank: 1,
                use_backup: true,
            }],
            result: "failed".into(),
            error: Some("rank 1 failed in switch".into()),
            rolled_back: true,
            pause_step: Some(4),
            phases_ms: PhasesMs {
                pause: Some(1.5),
                switch: Some(0.25),
                resume: Some(0.125),
                rollback: Some(0.5),
                total: 2.375,
            },
            stall_ms: Some(2.0),
            job_state: "running".into(),
            applied: false,
            rank_errors: vec![RankErrorSummary {
                rank: 1,
                phase: "switch".into(),
                group: Some("dp_0".into()),
                hccl_code: Some(19),
                kind: Some("network".into()),
                library: Some("hccl".into()),
                code: Some(19),
                code_name: Some("HCCL_E_NETWORK".into()),
                message: "group dp_0: network".into(),
            }],
            lost_ranks: vec![],
            trigger: Trigger::Auto,
        };
        let wire = proto::OperationResult::from(&s);
        assert_eq!(OperationSummary::from(&wire), s);
        let none = OperationSummary {
            journal_error: None,
            hold: None,
            error: None,
            rank_errors: Vec::new(),
            ..s
        };
        assert_eq!(
            OperationSummary::from(&proto::OperationResult::from(&none)),
            none
        );
        // A result from a manager that predates triggers is an operator's.
        let old = proto::OperationResult {
            trigger: String::new(),
            ..proto::OperationResult::from(&none)
        };
        assert_eq!(OperationSummary::from(&old).trigger, Trigger::Operator);
    }
}
