//! What `taskd sim` prints: the JSON contract (stable: scripts and dashboards depend on it)
//! and the readable timeline.

use crate::sim::{FinalState, SimConfig};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;
use taskd_core::operation::{OperationReport, Outcome};
use taskd_core::{RankTable, SubmitError, SwitchCommand};

/// One target as the report shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TargetSummary {
    pub node: String,
    pub device: u32,
    pub rank: u32,
    pub use_backup: bool,
}

/// Phase durations in milliseconds; `null` for a phase that did not run.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct PhasesMs {
    pub pause: Option<f64>,
    pub switch: Option<f64>,
    pub resume: Option<f64>,
    pub rollback: Option<f64>,
    pub total: f64,
}

/// One operation as the report shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct OperationSummary {
    pub uuid: String,
    pub direction: String,
    pub targets: Vec<TargetSummary>,
    pub result: String,
    pub error: Option<String>,
    pub rolled_back: bool,
    pub pause_step: Option<u64>,
    pub phases_ms: PhasesMs,
    pub stall_ms: Option<f64>,
    pub job_state: String,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl OperationSummary {
    pub fn from_report(r: &OperationReport) -> Self {
        OperationSummary {
            uuid: r.id.to_string(),
            direction: r.direction.as_str().into(),
            targets: r
                .targets
                .iter()
                .map(|t| TargetSummary {
                    node: t.node.0.clone(),
                    device: t.device.0,
                    rank: t.rank.0,
                    use_backup: t.use_backup,
                })
                .collect(),
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
        }
    }

    /// A command the manager refused before anything ran.
    pub fn rejected(cmd: &SwitchCommand, table: &RankTable, e: &SubmitError) -> Self {
        let plan = cmd.resolve(table).ok();
        let direction = plan
            .as_ref()
            .map(|p| p.direction().as_str())
            .unwrap_or("mixed");
        OperationSummary {
            uuid: cmd.id.map(|i| i.to_string()).unwrap_or_default(),
            direction: direction.into(),
            targets: plan
                .map(|p| {
                    p.targets
                        .iter()
                        .map(|t| TargetSummary {
                            node: t.node.0.clone(),
                            device: t.device.0,
                            rank: t.rank.0,
                            use_backup: t.use_backup,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            result: Outcome::Rejected.as_str().into(),
            error: Some(e.to_string()),
            rolled_back: false,
            pause_step: None,
            phases_ms: PhasesMs::default(),
            stall_ms: None,
            job_state: String::new(),
        }
    }
}

/// The whole run, as `taskd sim --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub nodes: u32,
    pub devices_per_node: u32,
    pub ranks: usize,
    /// Fewest steps any rank completed.
    pub steps_completed: u64,
    pub operations: Vec<OperationSummary>,
    pub ranks_on_backup: Vec<u32>,
    pub groups_consistent: bool,
    pub job_state: String,
    /// Invariants checked at the end; `ok` is false if any broke.
    pub invariants: Invariants,
    /// Collectives that ran on the default (primary) NIC of a rank their group had switched to
    /// its backup NIC: HCCL keeps a set NIC only for operators issued before the switch, and
    /// runs every operator issued later (here the training loop's evaluations) on the default
    /// NIC. Counted once per collective; not an invariant (the members agree).
    pub collectives_on_default_nic: u64,
}

/// The checks behind the exit status.
#[derive(Clone, Debug, Serialize)]
pub struct Invariants {
    pub ok: bool,
    /// Collectives that ran while their group disagreed on the NIC configuration.
    pub collectives_on_inconsistent_groups: u64,
    /// Every submitted operation got exactly one final result.
    pub one_result_per_operation: bool,
    /// The manager's NIC table matches what HCCL (the simulated fabric) has.
    pub nic_table_matches_fabric: bool,
    /// Training progressed whenever the job was running.
    pub training_progressed: bool,
    /// HCCL rule violations the simulated fabric saw.
    pub hccl_violations: Vec<String>,
    /// Disagreements found by the final consistency check.
    pub consistency: String,
    pub collective_failures: u64,
}

impl ScenarioReport {
    pub fn new(
        cfg: &SimConfig,
        table: &RankTable,
        operations: Vec<OperationSummary>,
        end: FinalState,
        one_result_per_operation: bool,
        training_progressed: bool,
    ) -> Self {
        let nic_table_matches_fabric =
            !end.groups_consistent || end.ranks_on_backup == end.manager_on_backup;
        let ok = end.groups_consistent
            && end.collectives_on_inconsistent_groups == 0
            && one_result_per_operation
            && nic_table_matches_fabric
            && training_progressed;
        ScenarioReport {
            nodes: cfg.nodes,
            devices_per_node: cfg.devices_per_node,
            ranks: table.world_size(),
            steps_completed: end.steps_completed,
            operations,
            ranks_on_backup: end.ranks_on_backup.iter().map(|r| r.0).collect(),
            groups_consistent: end.groups_consistent,
            job_state: end.job_state.as_str().into(),
            collectives_on_default_nic: end.collectives_on_default_nic,
            invariants: Invariants {
                ok,
                collectives_on_inconsistent_groups: end.collectives_on_inconsistent_groups,
                one_result_per_operation,
                nic_table_matches_fabric,
                training_progressed,
                hccl_violations: end.violations,
                consistency: end.consistency,
                collective_failures: end.collective_failures,
            },
        }
    }

    /// The readable timeline.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "simulated job: {} nodes x {} devices = {} ranks (mock HAL, simulated fabric)",
            self.nodes, self.devices_per_node, self.ranks
        );
        for (i, op) in self.operations.iter().enumerate() {
            let targets: Vec<String> = op
                .targets
                .iter()
                .map(|t| format!("{}:{} (rank {})", t.node, t.device, t.rank))
                .collect();
            let _ = writeln!(
                s,
                "\noperation {} {} {}\n  targets   {}",
                i + 1,
                op.uuid,
                op.direction,
                targets.join(", ")
            );
            let phase = |name: &str, v: Option<f64>| match v {
                Some(v) => format!("  {name:<9} {v:>10.3} ms\n"),
                None => String::new(),
            };
            s.push_str(&phase("pause", op.phases_ms.pause));
            if let Some(step) = op.pause_step {
                let _ = writeln!(s, "            every rank held after step {step}");
            }
            s.push_str(&phase("switch", op.phases_ms.switch));
            s.push_str(&phase("rollback", op.phases_ms.rollback));
            s.push_str(&phase("resume", op.phases_ms.resume));
            if op.result != "rejected" {
                s.push_str(&phase("total", Some(op.phases_ms.total)));
            }
            s.push_str(&phase("stall", op.stall_ms));
            let _ = write!(s, "  result    {}", op.result.to_uppercase());
            if op.result == "failed" {
                let _ = write!(
                    s,
                    " (rolled back: {}, job {})",
                    if op.rolled_back { "yes" } else { "NO" },
                    op.job_state
                );
            }
            s.push('\n');
            if let Some(e) = &op.error {
                let _ = writeln!(s, "  reason    {e}");
            }
        }
        s.push('\n');
        s.push_str(&self.end_text());
        s
    }

    /// The closing line (and the broken invariants, if any).
    pub fn end_text(&self) -> String {
        let mut s = String::new();
        let backup: Vec<String> = self.ranks_on_backup.iter().map(|r| r.to_string()).collect();
        let _ = writeln!(
            s,
            "end: {} steps trained, ranks on backup NIC: {}, groups consistent: {}, job {}",
            self.steps_completed,
            if backup.is_empty() {
                "none".into()
            } else {
                backup.join(", ")
            },
            if self.groups_consistent { "yes" } else { "NO" },
            self.job_state
        );
        let _ = writeln!(
            s,
            "collectives on the default NIC of a switched group: {} (operators first issued \
             after a switch; see the README)",
            self.collectives_on_default_nic
        );
        if !self.invariants.ok {
            let _ = writeln!(s, "INVARIANT BROKEN: {:#?}", self.invariants);
        }
        s
    }
}
