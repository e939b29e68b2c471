//! One operation as people and programs outside the manager read it: [`OperationSummary`], a
//! serde projection of [`OperationReport`] with durations in milliseconds and enums as their
//! documented names.
//!
//! It is the one shape every reader shares: `taskd sim --json`'s `operations`, the hardware
//! rig's records, the control API's `OperationResult` (`actors/proto/control.proto`) and the
//! detail `Recover` appends to ClusterD's failure strings. Field names and values are the
//! simulator's documented JSON contract (docs/simulator.md); fields are only ever added.

use crate::command::{RankTarget, SwitchCommand};
use crate::ledger::SubmitError;
use crate::operation::{OperationReport, Outcome, Trigger};
use crate::rank_table::RankTable;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Milliseconds, rounded to the microsecond: how every duration of a summary is written.
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One target as a summary shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetSummary {
    /// The node's name.
    pub node: String,
    /// The device on that node.
    pub device: u32,
    /// The global rank of that device.
    pub rank: u32,
    /// `true`: onto the backup NIC; `false`: back to the primary.
    pub use_backup: bool,
}

impl From<&RankTarget> for TargetSummary {
    fn from(t: &RankTarget) -> Self {
        TargetSummary {
            node: t.node.0.clone(),
            device: t.device.0,
            rank: t.rank.0,
            use_backup: t.use_backup,
        }
    }
}

/// Phase durations in milliseconds; `None` (JSON `null`) for a phase that did not run.
#[derive(Clone, Copy, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct PhasesMs {
    /// Sample and pause together: from the request until every rank held.
    pub pause: Option<f64>,
    /// Applying the new NIC state.
    pub switch: Option<f64>,
    /// Opening the gates again.
    pub resume: Option<f64>,
    /// Re-applying the previous NIC state after a failure.
    pub rollback: Option<f64>,
    /// From admission to the final report (0 for a command refused at admission).
    pub total: f64,
}

/// One rank's own failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankErrorSummary {
    /// The global rank that failed.
    pub rank: u32,
    /// The phase it failed in (`sample`, `pause`, `switch`, `rollback`, `resume`).
    pub phase: String,
    /// The group whose call failed, when a HAL call failed.
    pub group: Option<String>,
    /// Deprecated, kept for the readers that have it: [`RankErrorSummary::code`] when the
    /// library is HCCL (`library` = `hccl`), else absent. Read `library` and `code` instead.
    pub hccl_code: Option<i32>,
    /// What the control plane made of the HAL's failure (`network`, `timeout`, ...: the
    /// `HalErrorKind`), when a HAL call failed.
    #[serde(default)]
    pub kind: Option<String>,
    /// The library that failed (`hccl`, `dcmi`, `framework`, a new backend's): the numbering
    /// `code` is in. When a HAL call failed.
    #[serde(default)]
    pub library: Option<String>,
    /// The library's own status code, when it answered one.
    #[serde(default)]
    pub code: Option<i32>,
    /// The vendor's name for `code` (`HCCL_E_NETWORK`), when the reporting process knew it.
    #[serde(default)]
    pub code_name: Option<String>,
    /// The failure in words.
    pub message: String,
}

impl RankErrorSummary {
    /// Rank `rank`'s failure `e` in `phase`.
    pub fn new(rank: u32, phase: &str, e: &crate::protocol::RankError) -> Self {
        let hal = e.hal.as_ref();
        RankErrorSummary {
            rank,
            phase: phase.into(),
            group: e.group.clone(),
            hccl_code: hal.and_then(|h| h.hccl_code()),
            kind: hal.map(|h| h.kind.as_str().into()),
            library: hal.map(|h| h.vendor.library.to_string()),
            code: hal.and_then(|h| h.vendor.code),
            code_name: hal.and_then(|h| h.vendor.name.as_deref().map(Into::into)),
            message: e.to_string(),
        }
    }
}

/// One operation, as the simulator's JSON, the rig, the control API and `Recover` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationSummary {
    /// The operation's UUID (empty for a command refused before it got one).
    pub uuid: String,
    /// `to_backup`, `to_primary` or `mixed`.
    pub direction: String,
    /// The targets, resolved to their ranks.
    pub targets: Vec<TargetSummary>,
    /// `succeeded`, `failed` or `rejected`.
    pub result: String,
    /// The first failure, in words.
    pub error: Option<String>,
    /// Whether a rollback restored the previous NIC state on every group.
    pub rolled_back: bool,
    /// The step every rank stopped after, if they all paused.
    pub pause_step: Option<u64>,
    /// How long each phase took.
    pub phases_ms: PhasesMs,
    /// Longest time any rank's training was held.
    pub stall_ms: Option<f64>,
    /// `running`, `paused` or `needs_recovery` after the operation (empty for a command
    /// refused at admission).
    pub job_state: String,
    /// Whether the targets' new NIC state is in effect.
    #[serde(default)]
    pub applied: bool,
    /// Every rank's own failure, in the order they arrived.
    #[serde(default)]
    pub rank_errors: Vec<RankErrorSummary>,
    /// Ranks lost during the operation.
    #[serde(default)]
    pub lost_ranks: Vec<u32>,
    /// Who asked for it: `operator`, or `auto` (the automatic failover policy); an older
    /// writer's summary, which does not say, is an operator's.
    #[serde(default)]
    pub trigger: Trigger,
    /// Why the manager could not journal this result, when it could not (it is then not
    /// durable across a restart of the manager).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_error: Option<String>,
    /// When the job is left not running: what that leads to under the manager's hold policy
    /// (`stop training after 300s held`, `hold until an operator acts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
}

impl From<&OperationReport> for OperationSummary {
    fn from(r: &OperationReport) -> Self {
        OperationSummary {
            uuid: r.id.to_string(),
            direction: r.direction.as_str().into(),
            targets: r.targets.iter().map(TargetSummary::from).collect(),
            result: r.outcome.as_str().into(),
            error: r.error.as_ref().map(|e| e.to_string()),
            rolled_back: r.rolled_back,
            pause_step: r.pause_step,
            phases_ms: PhasesMs {
                pause: r.phases.pause.map(ms),
                switch: r.phases.switch.map(ms),
                resume: r.phases.resume.map(ms),
                rollback: r.phases.rollback.map(ms),
                total: ms(r.phases.total),
            },
            stall_ms: r.stall.map(ms),
            job_state: r.job_state.as_str().into(),
            applied: r.applied,
            rank_errors: r
                .rank_errors
                .iter()
                .map(|(rank, phase, e)| RankErrorSummary::new(rank.0, phase.as_str(), e))
                .collect(),
            lost_ranks: r.lost_ranks.iter().map(|r| r.0).collect(),
            trigger: r.trigger,
            journal_error: r.journal_error.clone(),
            hold: r.hold.clone(),
        }
    }
}

impl OperationSummary {
    /// A command the manager refused before anything ran: its targets as far as they resolve
    /// against `table`, the refusal as the error.
    pub fn rejected(cmd: &SwitchCommand, table: &RankTable, e: &SubmitError) -> Self {
        let plan = cmd.resolve(table).ok();
        OperationSummary {
            journal_error: None,
            hold: None,
            uuid: cmd.id.map(|i| i.to_string()).unwrap_or_default(),
            direction: plan
                .as_ref()
                .map_or("mixed", |p| p.direction().as_str())
                .into(),
            targets: plan
                .map(|p| p.targets.iter().map(TargetSummary::from).collect())
                .unwrap_or_default(),
            result: Outcome::Rejected.as_str().into(),
            error: Some(e.to_string()),
            rolled_back: false,
            pause_step: None,
            phases_ms: PhasesMs::default(),
            stall_ms: None,
            job_state: String::new(),
            applied: false,
            rank_errors: Vec::new(),
            lost_ranks: Vec::new(),
            trigger: Trigger::Operator,
        }
    }

    /// Whether the automatic failover policy asked for it.
    pub fn is_auto(&self) -> bool {
        self.trigger == Trigger::Auto
    }
}

/// One line: `operation U to_backup failed: <error> (rolled back: yes, job running)`.
impl fmt::Display for OperationSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operation {} {} {}",
            self.uuid, self.direction, self.result
        )?;
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        if self.result != Outcome::Succeeded.as_str() {
            write!(
                f,
                " (rolled back: {}, job {})",
                if self.rolled_back { "yes" } else { "no" },
                if self.job_state.is_empty() {
                    "unchanged"
                } else {
                    &self.job_state
                }
            )?;
        }
        if !self.lost_ranks.is_empty() {
            let lost: Vec<String> = self.lost_ranks.iter().map(u32::to_string).collect();
            write!(f, "; lost ranks {}", lost.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_keep_microseconds() {
        assert_eq!(ms(Duration::from_micros(1_234_567)), 1234.567);
        assert_eq!(ms(Duration::from_nanos(1_499)), 0.001);
        assert_eq!(ms(Duration::ZERO), 0.0);
    }

    #[test]
    fn the_json_field_names_are_the_documented_ones() {
        let s = OperationSummary {
            journal_error: None,
            hold: None,
            uuid: "u".into(),
            direction: "to_backup".into(),
            targets: vec![TargetSummary {
                node: "node-1".into(),
                device: 0,
                rank: 8,
                use_backup: true,
            }],
            result: "succeeded".into(),
            error: None,
            rolled_back: false,
            pause_step: Some(6),
            phases_ms: PhasesMs {
                pause: Some(1.0),
                switch: Some(2.0),
                resume: Some(3.0),
                rollback: None,
                total: 6.0,
            },
            stall_ms: Some(2.5),
            job_state: "running".into(),
            applied: true,
            rank_errors: Vec::new(),
            lost_ranks: Vec::new(),
            trigger: Trigger::Auto,
        };
        let v = serde_json::to_value(&s).unwrap();
        for key in [
            "uuid",
            "direction",
            "targets",
            "result",
            "error",
            "rolled_back",
            "pause_step",
            "phases_ms",
            "stall_ms",
            "job_state",
            "trigger",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        // A summary written before the trigger existed is an operator's.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("trigger");
        let old: OperationSummary = serde_json::from_value(old).unwrap();
        assert_eq!(old.trigger, Trigger::Operator);
        assert_eq!(v["trigger"], "auto");
        assert!(s.is_auto() && !old.is_auto());
        assert_eq!(v["phases_ms"]["rollback"], serde_json::Value::Null);
        assert_eq!(v["targets"][0]["rank"], 8);
        let back: OperationSummary = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        assert_eq!(s.to_string(), "operation u to_backup succeeded");
    }

    #[test]
    fn a_rank_error_names_its_library_and_code_and_hccl_code_only_for_hccls() {
        use crate::hal::{CodeTable, HalError, HalErrorKind, HcclCode, LibraryName};
        use crate::protocol::RankError;
        let hccl = RankError::in_group(
            "dp_0",
            HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "link"),
        );
        let e = RankErrorSummary::new(1, "switch", &hccl);
        assert_eq!(
            (
                e.kind.as_deref(),
                e.library.as_deref(),
                e.code,
                e.code_name.as_deref()
            ),
            (
                Some("network"),
                Some("hccl"),
                Some(19),
                Some("HCCL_E_NETWORK")
            )
        );
        assert_eq!((e.hccl_code, e.group.as_deref()), (Some(19), Some("dp_0")));
        const ACME: CodeTable = CodeTable::new(
            LibraryName::new("acme"),
            &[(19, "ACME_E_PORT", HalErrorKind::Unavailable)],
        );
        let acme = RankError::hal(HalError::new("acme_set_port", ACME.status(19), ""));
        let e = RankErrorSummary::new(2, "switch", &acme);
        assert_eq!(
            (e.library.as_deref(), e.code, e.hccl_code),
            (Some("acme"), Some(19), None),
            "another library's 19 is no HcclResult"
        );
        let v = serde_json::to_value(&e).unwrap();
        for key in ["hccl_code", "kind", "library", "code", "code_name"] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        let worker = RankErrorSummary::new(3, "pause", &RankError::worker("gate refused"));
        assert_eq!(
            (&worker.kind, &worker.library, worker.code),
            (&None, &None, None)
        );
        // A summary written before the neutral fields existed reads with them absent.
        let mut old = serde_json::to_value(&worker).unwrap();
        for key in ["kind", "library", "code", "code_name"] {
            old.as_object_mut().unwrap().remove(key);
        }
        assert_eq!(
            serde_json::from_value::<RankErrorSummary>(old).unwrap(),
            worker
        );
    }
}
