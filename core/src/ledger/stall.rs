//! Ranks whose training loop stopped finishing steps: what the workers' hang watches report.
//!
//! Under `TSP:1` HCCL's own watchdog is off, so a collective that never completes blocks its
//! ranks for good and nothing fails. Each worker watches its own loop (`taskd-actors`'s
//! worker, docs/recovery.md "A hung rank") and says when it finished no step for its timeout
//! while the gate did not hold it, and again when it finishes one. The ledger keeps the
//! stalled ranks for the status and, with process recovery, owes the job a restart: a hung
//! collective is a fault like a dead process, and the stop of training that follows (bounded
//! like every stop) ends the processes stuck in it.

use super::JobLedger;
use crate::ids::GlobalRank;
use crate::protocol::StallNotice;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A rank whose loop finished no step for its hang watch's timeout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StalledRank {
    /// The rank.
    pub rank: GlobalRank,
    /// The last step its loop finished.
    pub last_step: u64,
    /// How long it had made no progress when its worker said so.
    pub stalled_for: Duration,
    /// When the manager heard it (manager clock).
    pub at: Duration,
}

/// What a [`StallNotice`] came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StallOutcome {
    /// Of a process the manager does not count (gone, replaced, or ended by a stop): nothing.
    Ignored,
    /// The rank is stalled; `restart_owed` tells whether a job-wide restart is owed for it
    /// now (process recovery on, none owed before).
    Stalled {
        /// A job-wide restart is owed for this stall.
        restart_owed: bool,
    },
    /// A rank that was stalled finished a step again.
    Progressing,
    /// A rank not known as stalled says it progresses: nothing.
    Unchanged,
}

impl JobLedger {
    /// A worker's hang watch spoke (`n`, at `now`). A stall of the registered process is kept
    /// until the rank progresses, registers again or is lost, or a stop of training ends it;
    /// with process recovery it owes the job a restart (one for all the ranks that stall
    /// together: a hung collective stalls every member).
    pub fn rank_stalled(&mut self, n: StallNotice, now: Duration) -> StallOutcome {
        let counted = self.workers.get(&n.rank).is_some_and(|w| {
            !w.instance.is_known() || !n.instance.is_known() || w.instance == n.instance
        });
        if !counted || self.stop.is_some() {
            return StallOutcome::Ignored;
        }
        let Some(stalled_for) = n.stalled_for else {
            return match self.stalled.remove(&n.rank) {
                Some(_) => StallOutcome::Progressing,
                None => StallOutcome::Unchanged,
            };
        };
        self.stalled.insert(
            n.rank,
            StalledRank {
                rank: n.rank,
                last_step: n.last_step,
                stalled_for,
                at: now,
            },
        );
        let owed_before = self.owed_restart.is_some();
        self.owe_restart(
            format!(
                "rank {} hung: its training loop finished no step for {:?} after step {}",
                n.rank, stalled_for, n.last_step
            ),
            now,
        );
        StallOutcome::Stalled {
            restart_owed: !owed_before && self.owed_restart.is_some(),
        }
    }

    /// Ranks stalled now, ascending.
    pub fn stalled_ranks(&self) -> impl Iterator<Item = &StalledRank> + '_ {
        self.stalled.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Instance, JobId, NodeName};
    use crate::ledger::{JobLedger, ProcessRecovery};
    use crate::operation::PhaseDeadlines;
    use crate::protocol::WorkerHello;
    use crate::rank_table::RankTable;
    use crate::SwitchCapabilities;

    fn ledger(recovery: bool) -> JobLedger {
        let table = RankTable::uniform_named(&[NodeName("n0".into())], 2);
        let mut l = JobLedger::new(JobId("j".into()), table, PhaseDeadlines::default());
        if recovery {
            l.set_process_recovery(Some(ProcessRecovery { max_restarts: 3 }));
        }
        for r in 0..2 {
            l.register(WorkerHello {
                job: JobId("j".into()),
                node: NodeName("n0".into()),
                rank: GlobalRank(r),
                capabilities: SwitchCapabilities::ALL,
                instance: Instance(10 + u64::from(r)),
                generation: 0,
            })
            .unwrap();
        }
        l
    }

    fn notice(rank: u32, instance: u64, stalled_for: Option<u64>) -> StallNotice {
        StallNotice {
            rank: GlobalRank(rank),
            instance: Instance(instance),
            last_step: 41,
            stalled_for: stalled_for.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_stall_owes_one_restart_for_every_rank_that_stalls_with_it() {
        let mut l = ledger(true);
        let at = Duration::from_secs(100);
        assert_eq!(
            l.rank_stalled(notice(0, 10, Some(30)), at),
            StallOutcome::Stalled { restart_owed: true }
        );
        assert_eq!(
            l.rank_stalled(notice(1, 11, Some(30)), at),
            StallOutcome::Stalled {
                restart_owed: false
            }
        );
        let owed = l.restart_owed().expect("a restart is owed");
        assert!(
            owed.contains("rank 0 hung") && owed.contains("after step 41"),
            "{owed}"
        );
        assert!(l.restart_due());
        let ranks: Vec<_> = l.stalled_ranks().map(|s| s.rank.0).collect();
        assert_eq!(ranks, [0, 1]);
    }

    #[test]
    fn without_process_recovery_a_stall_is_kept_for_the_status_and_owes_nothing() {
        let mut l = ledger(false);
        let out = l.rank_stalled(notice(1, 11, Some(30)), Duration::ZERO);
        assert_eq!(
            out,
            StallOutcome::Stalled {
                restart_owed: false
            }
        );
        assert!(l.restart_owed().is_none());
        assert_eq!(l.stalled_ranks().count(), 1);
        assert_eq!(
            l.rank_stalled(notice(1, 11, None), Duration::ZERO),
            StallOutcome::Progressing
        );
        assert_eq!(l.stalled_ranks().count(), 0);
        assert_eq!(
            l.rank_stalled(notice(1, 11, None), Duration::ZERO),
            StallOutcome::Unchanged
        );
    }

    #[test]
    fn a_notice_of_another_process_or_during_a_stop_changes_nothing() {
        let mut l = ledger(true);
        assert_eq!(
            l.rank_stalled(notice(0, 99, Some(30)), Duration::ZERO),
            StallOutcome::Ignored
        );
        assert!(l.restart_owed().is_none());
        l.rank_stalled(notice(0, 10, Some(30)), Duration::ZERO);
        let id = crate::OperationId(uuid::Uuid::from_u128(7));
        l.restart_job(id, Duration::from_secs(1)).unwrap();
        assert_eq!(
            l.stalled_ranks().count(),
            0,
            "the stop ends the stalled processes"
        );
        assert_eq!(
            l.rank_stalled(notice(1, 11, Some(60)), Duration::from_secs(2)),
            StallOutcome::Ignored
        );
    }
}
