//! Faults that reach the manager besides a lost connection: a rank the last-words host saw
//! die ([`ReportFault`]), and a rank whose worker's hang watch says its training loop stopped
//! finishing steps ([`taskd_core::protocol::StallNotice`]). Both end as the ledger's: a lost
//! rank, or a stalled one, and with process recovery a restart of the job.

use super::Manager;
use actix::prelude::*;
use taskd_core::ledger::{LostRank, StallOutcome};
use taskd_core::protocol::StallNotice;
use taskd_core::GlobalRank;

/// A rank's process died, as something outside taskd's transport saw it (the last-words
/// host's own fault detection): the same as a lost worker, for a rank whose process is
/// registered (of a rank already lost, taskd's own word stands: a process that ended cleanly
/// and that the host, slower, takes for dead, is not).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReportFault {
    /// The rank.
    pub rank: GlobalRank,
    /// What was seen, one line.
    pub why: String,
}

impl Handler<ReportFault> for Manager {
    type Result = ();
    fn handle(&mut self, m: ReportFault, ctx: &mut Self::Context) {
        if !self.ledger.is_registered(m.rank) {
            tracing::info!(rank = m.rank.0, why = %m.why, "a rank already lost was reported dead");
            return;
        }
        tracing::warn!(rank = m.rank.0, why = %m.why, "a rank's process was reported dead");
        let now = self.now();
        let actions = self.ledger.worker_lost(m.rank, LostRank::died(m.why), now);
        self.job_changed();
        self.observe_waiting();
        self.run(actions, ctx);
        self.follow_bounds(ctx);
    }
}

impl Manager {
    /// A worker's hang watch spoke: the ledger keeps the stall and, with process recovery,
    /// owes the job a restart, which starts once nothing runs. Without process recovery the
    /// stall is said at ERROR and shown in the status: an operator restarts the job.
    pub(super) fn rank_stalled(&mut self, n: StallNotice, ctx: &mut Context<Self>) {
        let (rank, last_step, stalled_for) = (n.rank, n.last_step, n.stalled_for);
        let now = self.now();
        match self.ledger.rank_stalled(n, now) {
            StallOutcome::Ignored => {
                tracing::debug!(
                    rank = rank.0,
                    "a stall notice of a process no longer counted"
                )
            }
            StallOutcome::Unchanged => {}
            StallOutcome::Progressing => {
                tracing::warn!(
                    rank = rank.0,
                    last_step,
                    "a rank reported hung finished a step again"
                )
            }
            StallOutcome::Stalled { restart_owed } => {
                if restart_owed {
                    tracing::error!(rank = rank.0, last_step, ?stalled_for, "a rank is hung: its training loop finished no step for its hang watch's timeout; restarting the job");
                } else if self.ledger.restart_owed().is_none() {
                    tracing::error!(rank = rank.0, last_step, ?stalled_for, "a rank is hung: its training loop finished no step for its hang watch's timeout; without process recovery (--process-recovery) nothing restarts it: restart the job");
                } else {
                    tracing::warn!(
                        rank = rank.0,
                        last_step,
                        ?stalled_for,
                        "another rank is hung (a restart is owed already)"
                    );
                }
            }
        }
        self.job_changed();
        self.follow_bounds(ctx);
    }
}
