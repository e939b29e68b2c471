//! What `taskd sim` prints: the JSON contract (stable: scripts and dashboards depend on it)
//! and the readable timeline.

use super::simulation::{FinalState, SimConfig};
use super::timeline::{Holds, Timeline};
use serde::Serialize;
use std::fmt::Write as _;
use taskd_core::auto::AutoDecision;
/// One operation as the report shows it: the summary every reader of a result shares.
pub use taskd_core::summary::{OperationSummary, PhasesMs, TargetSummary};
use taskd_core::RankTable;

/// The whole run, as `taskd sim --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    /// Nodes simulated (`--nodes`).
    pub nodes: u32,
    /// Ranks per node (`--devices-per-node`).
    pub devices_per_node: u32,
    /// Ranks in the job: `nodes x devices_per_node`.
    pub ranks: usize,
    /// Fewest steps any rank completed.
    pub steps_completed: u64,
    /// Each operation submitted, in order, with its one final result.
    pub operations: Vec<OperationSummary>,
    /// Ranks on their backup NIC at the end, by the simulated fabric (not the manager's
    /// table; `invariants` says whether the two match).
    pub ranks_on_backup: Vec<u32>,
    /// Whether every group agrees on its NIC configuration at the end, the invariant every
    /// scenario ends with.
    pub groups_consistent: bool,
    /// The manager's job state at the end: `running`, `paused` or `needs_recovery`.
    pub job_state: String,
    /// Invariants checked at the end; `ok` is false if any broke.
    pub invariants: Invariants,
    /// Collectives that ran on the default (primary) NIC of a rank their group had switched to
    /// its backup NIC: HCCL keeps a set NIC only for operators issued before the switch, and
    /// runs every operator issued later (here the training loop's evaluations) on the default
    /// NIC. Counted once per collective; not an invariant (the members agree).
    pub collectives_on_default_nic: u64,
    /// Every decision of the automatic failover policy, in order (empty when it is off).
    pub decisions: Vec<DecisionSummary>,
}

/// One decision of the automatic failover policy, as the JSON report shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionSummary {
    /// When, on the manager's clock (milliseconds since it started).
    pub at_ms: f64,
    /// The device's node.
    pub node: String,
    /// The device.
    pub device: u32,
    /// `to_backup`, `to_primary` or `hold`.
    pub action: String,
    /// Why (`primary_down`, `backup_down`, `primary_recovered`, `flapping`, ...).
    pub reason: String,
    /// The device's primary link then: `up`, `down` or `unknown`.
    pub primary: String,
    /// Its backup link then.
    pub backup: String,
    /// The automatic operation that moved it (a move only).
    pub operation: Option<String>,
}

impl From<&AutoDecision> for DecisionSummary {
    fn from(d: &AutoDecision) -> Self {
        DecisionSummary {
            at_ms: taskd_core::summary::ms(d.at),
            node: d.node.0.clone(),
            device: d.device.0,
            action: d.action.as_str().into(),
            reason: d.reason.as_str().into(),
            primary: d.links.primary.as_str().into(),
            backup: d.links.backup.as_str().into(),
            operation: d.operation.map(|id| id.to_string()),
        }
    }
}

/// The checks behind the exit status.
#[derive(Clone, Debug, Serialize)]
pub struct Invariants {
    /// All of the below held (and the groups are consistent): the run exits 0.
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
    /// Training collectives that returned an error (a peer timed out or was lost). Reported,
    /// not an invariant: an injected hang makes some on purpose.
    pub collective_failures: u64,
}

impl ScenarioReport {
    /// The report of a finished run, judging the invariants from the end state. The NIC
    /// table is compared with the fabric only when the groups are consistent: otherwise no
    /// single answer is right, and `groups_consistent` already fails the run.
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
            decisions: Vec::new(),
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
             after a switch; see docs/a3-node.md)",
            self.collectives_on_default_nic
        );
        if !self.invariants.ok {
            let _ = writeln!(s, "INVARIANT BROKEN: {:#?}", self.invariants);
        }
        s
    }
}

/// What a scenario produced: its report and its per-step timeline.
#[derive(Clone, Debug)]
pub struct ScenarioRun {
    /// What `--json` prints, and the readable table.
    pub report: ScenarioReport,
    /// One row per training step with the phases it overlapped (`--timeline`).
    pub timeline: Timeline,
    /// Per operation (in the report's order), the ranks' holds at the step boundary: from the
    /// first rank held to the last one training again (`None`: no rank was held). Empty for
    /// the automatic failover scenario, whose operations start on their own.
    pub holds: Vec<Option<Holds>>,
}
