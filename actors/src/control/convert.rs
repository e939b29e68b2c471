//! Conversions between the manager's types and the control API's messages.

use super::proto;
use crate::manager::ManagerStatus;
use std::time::Duration;
use taskd_core::operation::OperationReport;

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// A final report as `Control` sends it.
pub fn result(r: &OperationReport) -> proto::OperationResult {
    proto::OperationResult {
        uuid: r.id.to_string(),
        direction: r.direction.as_str().into(),
        result: r.outcome.as_str().into(),
        error: r.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
        rolled_back: r.rolled_back,
        pause_step: r.pause_step,
        phases: Some(proto::PhaseDurations {
            pause_ms: r.phases.pause.map(ms),
            switch_ms: r.phases.switch.map(ms),
            resume_ms: r.phases.resume.map(ms),
            rollback_ms: r.phases.rollback.map(ms),
            total_ms: ms(r.phases.total),
        }),
        stall_ms: r.stall.map(ms),
        targets: r
            .targets
            .iter()
            .map(|t| proto::Target {
                node: t.node.0.clone(),
                device: t.device.0,
                use_backup: t.use_backup,
                rank: t.rank.0,
            })
            .collect(),
        rank_errors: r
            .rank_errors
            .iter()
            .map(|(rank, phase, e)| proto::RankError {
                rank: rank.0,
                phase: phase.as_str().into(),
                group: e.group.clone().unwrap_or_default(),
                hccl_code: e.hal.as_ref().and_then(|h| h.hccl_code()),
                message: e.to_string(),
            })
            .collect(),
        lost_ranks: r.lost_ranks.iter().map(|r| r.0).collect(),
        job_state: r.job_state.as_str().into(),
    }
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
    }
}

/// A final report as one JSON object: the `msg` of ClusterD's `SwitchNicResponse`.
pub fn result_json(r: &OperationReport) -> String {
    result_value(&result(r)).to_string()
}

/// A result as JSON, with the field names of `taskd sim --json`'s operations.
pub fn result_value(r: &proto::OperationResult) -> serde_json::Value {
    use serde_json::json;
    let p = r.phases.unwrap_or_default();
    json!({
        "uuid": r.uuid,
        "direction": r.direction,
        "result": r.result,
        "error": if r.error.is_empty() { None } else { Some(&r.error) },
        "rolled_back": r.rolled_back,
        "pause_step": r.pause_step,
        "phases_ms": {
            "pause": p.pause_ms, "switch": p.switch_ms, "resume": p.resume_ms,
            "rollback": p.rollback_ms, "total": p.total_ms,
        },
        "stall_ms": r.stall_ms,
        "targets": r.targets.iter().map(|t| json!({
            "node": t.node, "device": t.device, "rank": t.rank, "use_backup": t.use_backup,
        })).collect::<Vec<_>>(),
        "rank_errors": r.rank_errors.iter().map(|e| json!({
            "rank": e.rank, "phase": e.phase, "group": e.group, "hccl_code": e.hccl_code,
            "message": e.message,
        })).collect::<Vec<_>>(),
        "lost_ranks": r.lost_ranks,
        "job_state": r.job_state,
    })
}
