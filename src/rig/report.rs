//! What the rig measured and what it checked: latency windows around each operation, the
//! operations' records, the invariants, and the commands of a rig script.

use super::RigError;
use serde::Serialize;
use std::fmt::Write as _;
use taskd_core::operation::Outcome;
use taskd_core::{DeviceId, GroupInfo, OperationSummary};

/// Latency of the timed collectives over some steps, every rank's steps together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyWindow {
    /// `before`, `during` or `after`.
    pub label: &'static str,
    /// The window's first step.
    pub first_step: u64,
    /// The window's last step (inclusive).
    pub last_step: u64,
    /// Rank-steps measured.
    pub samples: usize,
    /// Fastest rank-step; `None` without samples.
    pub min_ms: Option<f64>,
    /// The upper middle value for an even count.
    pub median_ms: Option<f64>,
    /// Slowest rank-step; `None` without samples.
    pub max_ms: Option<f64>,
}

impl LatencyWindow {
    fn line(&self) -> String {
        let steps = if self.first_step > self.last_step {
            "no steps".to_string()
        } else {
            format!("steps {:>4}-{:<4}", self.first_step, self.last_step)
        };
        match (self.min_ms, self.median_ms, self.max_ms) {
            (Some(lo), Some(mid), Some(hi)) => format!(
                "{:<7}{steps}  n={:<4} min {lo:.3} ms  median {mid:.3} ms  max {hi:.3} ms",
                self.label, self.samples
            ),
            _ => format!("{:<7}{steps}  n=0", self.label),
        }
    }
}

/// One switch or switchback and what training saw around it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperationRecord {
    /// The devices of the rig's node it targeted.
    pub devices: Vec<u32>,
    /// Onto the backup NIC (`true`) or back to the primary.
    pub use_backup: bool,
    /// The operation as every reader of a result sees it (`result`, `error`, `applied`,
    /// `phases_ms`, ...; a refused command is `rejected` with the refusal as its error).
    #[serde(flatten)]
    pub summary: OperationSummary,
    /// All-reduce latency before, during and after the operation.
    pub windows: Vec<LatencyWindow>,
}

impl OperationRecord {
    /// The operation's block of the rig's output.
    pub fn to_text(&self, n: usize) -> String {
        let op = &self.summary;
        let devs: Vec<String> = self.devices.iter().map(u32::to_string).collect();
        let what = if self.use_backup {
            "switch to backup"
        } else {
            "switch back to primary"
        };
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let mut s = format!(
            "operation {n}: {what}, devices {}: {}",
            devs.join(","),
            op.result
        );
        if let Some(e) = &op.error {
            let _ = write!(s, " ({e})");
        }
        let total = (op.result != Outcome::Rejected.as_str()).then_some(op.phases_ms.total);
        let _ = write!(
            s,
            "\n  total {} ms  pause {} ms  switch {} ms  resume {} ms  stall {} ms  pause step {}  \
             job {}\n",
            opt(total),
            opt(op.phases_ms.pause),
            opt(op.phases_ms.switch),
            opt(op.phases_ms.resume),
            opt(op.stall_ms),
            op.pause_step.map_or("-".to_string(), |t| t.to_string()),
            op.job_state
        );
        for w in &self.windows {
            let _ = writeln!(s, "  all-reduce {}", w.line());
        }
        s
    }
}

/// One invariant and whether it held.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Invariant {
    /// What must hold, in words.
    pub name: &'static str,
    /// Whether it held.
    pub ok: bool,
    /// What was seen, to act on when it did not.
    pub detail: String,
}

/// The rig's final report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RigReport {
    /// The rig's devices, logical ids ([`RigConfig::devices`](super::RigConfig::devices)).
    pub devices: Vec<u32>,
    /// Their physical ids, as the rank table and the manager name them.
    pub physical_devices: Vec<u32>,
    /// Every communicator (HCCL's name, members), in planner order.
    pub groups: Vec<GroupInfo>,
    /// Which node HAL the proxy used.
    pub node_hal: String,
    /// Each operation submitted, in order, with its result.
    pub operations: Vec<OperationRecord>,
    /// Fewest steps any rank completed.
    pub steps_completed: u64,
    /// Collectives (or rank setups) that failed, one line each with rank and step.
    pub collective_errors: Vec<String>,
    /// All-reduces whose sum differed from the expected one: data a switch lost or mixed up.
    pub wrong_results: u64,
    /// Collectives that ran on the default NIC of a switched communicator, by HCCL's
    /// documented per-operator rule: the evaluations ([`RigConfig::eval_every`](super::RigConfig::eval_every)) issued while
    /// a rank was on its backup NIC (a NIC set reaches only the operators issued before it).
    /// What the rig's own bookkeeping predicts; HCCL cannot be asked. The HCCL stub counts
    /// the same thing itself, which is what the tests compare.
    pub collectives_on_default_nic: u64,
    /// The manager's NIC table at the end.
    pub ranks_on_backup: Vec<u32>,
    /// What the operations' results imply.
    pub expected_on_backup: Vec<u32>,
    /// The manager's job state at the end.
    pub job_state: String,
    /// The checks behind [`RigReport::ok`].
    pub invariants: Vec<Invariant>,
}

impl RigReport {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.invariants.iter().all(|i| i.ok)
    }

    /// The summary printed after the operations.
    pub fn summary_text(&self) -> String {
        let mut s = format!(
            "steps completed: {}  ranks on backup: {:?}  job: {}  collectives on the default \
             NIC of a switched group: {}\n",
            self.steps_completed,
            self.ranks_on_backup,
            self.job_state,
            self.collectives_on_default_nic
        );
        for i in &self.invariants {
            let _ = writeln!(
                s,
                "{} {}: {}",
                if i.ok { "ok  " } else { "FAIL" },
                i.name,
                i.detail
            );
        }
        s
    }
}

/// A rig command, from a script or a line of stdin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RigCommand {
    /// `train N`: train N more steps.
    Train(u64),
    /// `switch D[,D...]` (to backup) or `back D[,D...]` (to primary).
    Switch {
        /// Logical device ids, as [`RigConfig::devices`](super::RigConfig::devices) lists them.
        devices: Vec<DeviceId>,
        /// `switch` (to backup) or `back` (to primary).
        use_backup: bool,
    },
}

impl RigCommand {
    /// Parses `switch 0,1`, `back 0,1` or `train 10`.
    pub fn parse(line: &str) -> Result<Self, RigError> {
        let bad = |why: &str| RigError::Command(line.to_string(), why.to_string());
        let mut words = line.split_whitespace();
        let (Some(verb), Some(arg), None) = (words.next(), words.next(), words.next()) else {
            return Err(bad("expected `switch DEVS`, `back DEVS` or `train N`"));
        };
        match verb {
            "train" => arg
                .parse()
                .map(RigCommand::Train)
                .map_err(|_| bad("N must be a number of steps")),
            "switch" | "back" => Ok(RigCommand::Switch {
                devices: parse_devices(arg).map_err(|e| bad(&e))?,
                use_backup: verb == "switch",
            }),
            _ => Err(bad("unknown command; use switch, back or train")),
        }
    }
}

/// `0,1,8` as devices.
pub fn parse_devices(s: &str) -> Result<Vec<DeviceId>, String> {
    s.split(',')
        .map(|d| {
            d.trim()
                .parse::<u32>()
                .map(DeviceId)
                .map_err(|_| format!("{d:?} is not a device number"))
        })
        .collect()
}
