//! What the ledger knows about the job's NICs: the NIC table ([`NicTable`], which ranks use
//! their backup NIC), whether every rank's report confirmed it since the last event that could
//! have changed it, whether a verification round is owed, and the last round's report and
//! judgement. [`NicKnowledge`] owns those and their transitions ([`NicKnowledge::doubt`],
//! [`NicKnowledge::round_started`], [`NicKnowledge::settle_round`]).
//!
//! It is not an enum of verified / unverified: the last judgement outlives the confirmation
//! (a recovery plans from it), and a round dropped while the table was confirmed leaves it
//! confirmed with a round owed.

use crate::command::RankTarget;
use crate::hal::NicSide;
use crate::ids::GlobalRank;
use crate::operation::JobState;
use crate::verify::{Assessment, VerifyReport};
use std::collections::BTreeSet;

/// The side each rank uses as far as the ledger knows: the ranks on their backup NIC (every
/// other one on its primary).
#[derive(Clone, Debug, Default)]
pub(crate) struct NicTable {
    on_backup: BTreeSet<GlobalRank>,
}

impl NicTable {
    /// Ranks using their backup NIC, ascending.
    pub(crate) fn ranks_on_backup(&self) -> impl Iterator<Item = GlobalRank> + '_ {
        self.on_backup.iter().copied()
    }

    /// Whether `rank` uses its backup NIC.
    pub(crate) fn uses_backup(&self, rank: GlobalRank) -> bool {
        self.on_backup.contains(&rank)
    }

    /// The side `rank` uses.
    pub(crate) fn side_of(&self, rank: GlobalRank) -> NicSide {
        NicSide::from_use_backup(self.uses_backup(rank))
    }

    /// Records targets an operation applied.
    pub(crate) fn apply(&mut self, targets: &[RankTarget]) {
        for t in targets {
            if t.use_backup {
                self.on_backup.insert(t.rank);
            } else {
                self.on_backup.remove(&t.rank);
            }
        }
    }
}

/// The NIC table and how far it is confirmed.
#[derive(Debug)]
pub(crate) struct NicKnowledge {
    table: NicTable,
    /// Whether the table (and the job state) come from every rank's report since the last
    /// event that could have changed them (start, a lost or returning rank, a recovery).
    verified: bool,
    /// A round is owed: it starts once every rank is registered and nothing runs.
    owed: bool,
    /// The last round's judgement (for status and for `recover`).
    assessment: Option<Assessment>,
    /// The last round's report.
    last_round: Option<VerifyReport>,
}

impl Default for NicKnowledge {
    /// A job just started: every rank on its primary NIC, not confirmed, a round owed.
    fn default() -> Self {
        NicKnowledge {
            table: NicTable::default(),
            verified: false,
            owed: true,
            assessment: None,
            last_round: None,
        }
    }
}

impl NicKnowledge {
    /// The NIC table.
    pub(crate) fn table(&self) -> &NicTable {
        &self.table
    }

    /// The NIC table, to apply an operation's result to.
    pub(crate) fn table_mut(&mut self) -> &mut NicTable {
        &mut self.table
    }

    /// Whether every rank's report confirmed the table since it could last have changed.
    pub(crate) fn is_verified(&self) -> bool {
        self.verified
    }

    /// Whether a verification round is owed.
    pub(crate) fn round_owed(&self) -> bool {
        self.owed
    }

    /// The last round's judgement.
    pub(crate) fn assessment(&self) -> Option<&Assessment> {
        self.assessment.as_ref()
    }

    /// The last round's report.
    pub(crate) fn last_round(&self) -> Option<&VerifyReport> {
        self.last_round.as_ref()
    }

    /// Something may have changed what ranks applied: the table is no longer confirmed and a
    /// round is owed.
    pub(crate) fn doubt(&mut self) {
        self.verified = false;
        self.owed = true;
    }

    /// A round started: it is no longer owed.
    pub(crate) fn round_started(&mut self) {
        self.owed = false;
    }

    /// A round was dropped before its end: it is owed again.
    pub(crate) fn round_dropped(&mut self) {
        self.owed = true;
    }

    /// A round ended with `report`: when every rank answered, the table is the one it found
    /// and confirmed, and the job state it judged is returned; else the table is in doubt.
    pub(crate) fn settle_round(&mut self, report: &VerifyReport) -> Option<JobState> {
        let state = report.job_state();
        if state.is_some() {
            let a = report.assessment.clone().unwrap_or_default();
            self.table.on_backup = a.on_backup.clone();
            self.verified = true;
            self.assessment = Some(a);
        } else {
            self.doubt();
        }
        self.last_round = Some(report.clone());
        state
    }

    /// Why switches wait while the table is not confirmed ([`super::SubmitError::Unverified`]).
    pub(crate) fn unverified_why(&self) -> String {
        match &self.last_round {
            Some(v) if !v.missing.is_empty() => v.to_string(),
            _ => "the round runs once every rank is registered".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{DeviceId, NodeName};

    fn target(rank: u32, use_backup: bool) -> RankTarget {
        RankTarget {
            node: NodeName::from("node-0"),
            device: DeviceId(rank),
            rank: GlobalRank(rank),
            use_backup,
        }
    }

    #[test]
    fn the_table_records_what_operations_applied() {
        let mut t = NicTable::default();
        t.apply(&[target(1, true), target(2, true)]);
        t.apply(&[target(1, false)]);
        assert_eq!(t.ranks_on_backup().collect::<Vec<_>>(), [GlobalRank(2)]);
        assert_eq!(t.side_of(GlobalRank(2)), NicSide::Backup);
        assert_eq!(t.side_of(GlobalRank(1)), NicSide::Primary);
    }

    #[test]
    fn a_new_job_owes_a_round_and_a_doubt_owes_another() {
        let mut k = NicKnowledge::default();
        assert!(!k.is_verified() && k.round_owed());
        k.round_started();
        assert!(!k.round_owed());
        k.round_dropped();
        assert!(k.round_owed());
        k.round_started();
        k.doubt();
        assert!(!k.is_verified() && k.round_owed());
    }
}
