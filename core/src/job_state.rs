//! The state of a training job as the control plane declares it: what every operation's
//! report and every verification round end with. A leaf: the operation machine, the
//! verification round and the ledger all name it, and it names none of them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The state of the training job after an operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Training runs; every group agrees on its NIC configuration.
    Running,
    /// Training is held at the step gate because groups may disagree on their NICs:
    /// resuming would hang or corrupt training. An operator must intervene.
    Paused,
    /// A process is gone; the job needs process-level recovery.
    NeedsRecovery,
    /// Training runs as far as the manager knows, but some ranks cannot be reached (their
    /// node's proxy lost its connection while no operation ran, so no gate holds them): nothing
    /// switches until they are back, and no hold bound runs, since nothing is held.
    Degraded,
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobState {
    /// The name used in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::NeedsRecovery => "needs_recovery",
            JobState::Degraded => "degraded",
        }
    }
}
