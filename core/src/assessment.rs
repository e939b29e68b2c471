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
    /// Ranks that did not report before the deadline (`refused` among them).
    pub missing: Vec<GlobalRank>,
    /// Ranks among `missing` that answered, but with a failure (a process whose HAL is not set
    /// up yet): the round ended without waiting for its deadline, and the manager asks again
    /// soon ([`VerifyReport::ask_again_after`]).
    #[serde(default)]
    pub refused: Vec<GlobalRank>,
    /// Orphaned operations whose held gates were opened.
    pub released: Vec<OperationId>,
    /// From the query to the end of the round (the last answer or the deadline, and the
    /// release of held gates when there were any).
    pub took: Duration,
}

/// How soon a round is asked again when every rank that did not report answered with a
/// failure: such a rank is up and answering (a process still building its communicators), so
/// a second's wait, not a phase deadline's, is what it needs.
pub const REFUSED_ASK_AGAIN: Duration = Duration::from_secs(1);

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

    /// When a round that established nothing is to be asked again: soon
    /// ([`REFUSED_ASK_AGAIN`], at most `deadline`) when every rank missing answered with a
    /// failure, after `deadline` when one did not answer at all. `None` when the round
    /// established the job's state.
    pub fn ask_again_after(&self, deadline: Duration) -> Option<Duration> {
        if self.job_state().is_some() {
            return None;
        }
        let all_refused =
            !self.missing.is_empty() && self.missing.iter().all(|r| self.refused.contains(r));
        Some(if all_refused {
            REFUSED_ASK_AGAIN.min(deadline)
        } else {
            deadline
        })
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.assessment {
            _ if !self.missing.is_empty() && !self.refused.is_empty() => {
                write!(f, "no report from ranks {}", short_list(&self.missing))?;
                write!(
                    f,
                    " ({} answered with a failure: asking again)",
                    short_list(&self.refused)
                )
            }
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
