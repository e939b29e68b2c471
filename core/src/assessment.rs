//! What a verification round finds: the [`Assessment`] of every rank's report and the round's
//! [`VerifyReport`]. Kept apart from the round itself ([`crate::verify`]) because the
//! operation machine's actions carry a report, and the round emits those actions.

use crate::display::short_list;
use crate::ids::{GlobalRank, OperationId};
use crate::job_state::JobState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// What a [`Disagreement`] is.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisagreementKind {
    /// Members of a group report different members on backup, each view a clean one.
    #[default]
    Views,
    /// Not every member of a group reported it.
    Partial,
    /// A rank's last NIC-set call on the group failed: its operators may be split.
    Unsettled,
    /// A rank is on different sides in its groups.
    SidesAcrossGroups,
}

/// A group whose members do not agree, or a rank whose groups do not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disagreement {
    /// The group (or, for a rank on different sides in its groups, the groups named).
    pub group: String,
    /// The ranks involved (every member that reported).
    pub ranks: Vec<GlobalRank>,
    /// The ranks whose side differs between the views: what a recovery must re-state.
    #[serde(default)]
    pub in_doubt: Vec<GlobalRank>,
    /// What differs, for a person.
    pub detail: String,
    /// What kind of disagreement it is.
    #[serde(default)]
    pub kind: DisagreementKind,
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.group, self.detail)
    }
}

/// What the reports of every rank say about the job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessment {
    /// Ranks some group has on its backup NIC, ascending (the rebuilt NIC table).
    pub on_backup: BTreeSet<GlobalRank>,
    /// Empty when every group agrees.
    pub disagreements: Vec<Disagreement>,
    /// Ranks whose gate is armed or holds for an operation, by operation.
    pub gates: BTreeMap<OperationId, Vec<GlobalRank>>,
    /// Ranks that hold training now.
    pub held: Vec<GlobalRank>,
}

impl Assessment {
    /// Whether every group agrees on its NIC configuration.
    pub fn consistent(&self) -> bool {
        self.disagreements.is_empty()
    }

    /// Every rank whose side some group does not agree on, ascending.
    pub fn ranks_in_doubt(&self) -> BTreeSet<GlobalRank> {
        self.disagreements
            .iter()
            .flat_map(|d| d.in_doubt.iter().copied())
            .collect()
    }

    /// The job's state if nothing else is known: running when consistent, otherwise paused
    /// (a gate holds) or needs_recovery.
    pub fn job_state(&self) -> JobState {
        match (self.consistent(), self.held.is_empty()) {
            (true, _) => JobState::Running,
            (false, false) => JobState::Paused,
            (false, true) => JobState::NeedsRecovery,
        }
    }
}

/// How a verification round ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// The round's id (it is not an operation's, but shares the id space: directives and
    /// replies carry it the same way).
    pub id: OperationId,
    /// `None` when some rank did not answer (see `missing`).
    pub assessment: Option<Assessment>,
    /// Ranks that did not answer before the deadline.
    pub missing: Vec<GlobalRank>,
    /// Orphaned operations whose held gates were opened.
    pub released: Vec<OperationId>,
    /// From the query to the end of the round (the last answer or the deadline, and the
    /// release of held gates when there were any).
    pub took: Duration,
}

impl VerifyReport {
    /// The job state the round establishes (`None`: it establishes nothing, some rank did not
    /// answer).
    pub fn job_state(&self) -> Option<JobState> {
        let a = self.assessment.as_ref()?;
        if !self.missing.is_empty() {
            return None;
        }
        Some(a.job_state())
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.assessment {
            _ if !self.missing.is_empty() => {
                write!(f, "no report from ranks {}", short_list(&self.missing))
            }
            Some(a) if a.consistent() => {
                write!(f, "every group agrees; ranks on backup: ")?;
                if a.on_backup.is_empty() {
                    f.write_str("none")?;
                } else {
                    f.write_str(&short_list(&a.on_backup))?;
                }
                if !self.released.is_empty() {
                    write!(f, "; opened gates held for {}", short_list(&self.released))?;
                }
                Ok(())
            }
            Some(a) => {
                let d: Vec<String> = a.disagreements.iter().map(|d| d.to_string()).collect();
                write!(f, "groups disagree: {}", d.join("; "))?;
                if !a.held.is_empty() {
                    write!(f, "; training held on ranks {}", short_list(&a.held))?;
                }
                Ok(())
            }
            None => f.write_str("no assessment"),
        }
    }
}
