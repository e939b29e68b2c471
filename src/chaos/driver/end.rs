//! The end of a schedule: the recovery contract's steps (every lost worker and proxy back,
//! every link up, `recover` when the job still does not run), then the proof that the job is
//! whole again: training progresses, a new switch succeeds, the NIC table is the fabric's and
//! every operation this manager ran has exactly one result.

use super::{Checked, Driver, Watch, HOLD_BOUND};
use std::collections::BTreeMap;
use taskd_actors::manager::HoldPolicy;
use taskd_core::ledger::RecoverTo;
use taskd_core::operation::{JobState, Outcome};
use taskd_core::{DeviceId, GlobalRank, OperationId};

/// How often the end of a schedule tries `recover` before it reports the job as not running.
const RECOVER_ATTEMPTS: usize = 5;

impl Driver<'_> {
    pub(super) fn end(&mut self) -> Checked {
        self.at = "the end (recovery contract)".into();
        self.log(self.at.clone());
        if let Some(rank) = self.killed {
            return self.end_without(rank);
        }
        if self.book.is_some() {
            // A recovery schedule: the proxy away back, every restart owed done; a job whose
            // budget was spent has ended. The operator recovers what a failed switch left.
            self.end_recovery()?;
            if self.job_ended() {
                return Ok(());
            }
            self.restore()?;
            self.bring_back()?;
        } else {
            self.restore()?;
            if self.schedule.seed % 2 == 1 {
                self.outlast_the_hold()?;
            } else {
                self.bring_back()?;
            }
        }
        self.train(3)?;
        self.final_switch()?;
        self.train(1)?;
        self.check_quiet()?;
        self.check_history()
    }

    /// Every lost worker reconnects, every link comes up, no fault is left armed; the manager
    /// verifies every rank.
    fn restore(&mut self) -> Checked {
        for rank in std::mem::take(&mut self.disconnected) {
            self.job().reconnect_worker(GlobalRank(rank));
        }
        for (node, device) in std::mem::take(&mut self.links_down) {
            self.sim.fabric().set_link(node, DeviceId(device), true);
        }
        let unused = self.sim.fabric().clear_nic_set_faults();
        self.log(format!(
            "  every worker connected, every link up, {unused} unused faults dropped"
        ));
        self.settle()?;
        let st = self.status()?;
        let agreed = st
            .last_verification
            .as_ref()
            .and_then(|v| v.assessment.as_ref())
            .is_some_and(|a| a.consistent());
        if st.state == JobState::NeedsRecovery && agreed && st.verified {
            return Err(self.fail(
                "not_running",
                "every rank is back and the verification found every group agreeing, yet the \
                 job stays needs_recovery"
                    .into(),
            ));
        }
        Ok(())
    }

    /// `recover` while the job does not run, as a patient operator would: once no rank is
    /// inside a NIC-set call (a recovery cannot get through HCCL calls still hung from an
    /// earlier operation), with the schedule's side first, then primary.
    pub(super) fn bring_back(&mut self) -> Checked {
        for attempt in 0..RECOVER_ATTEMPTS {
            let st = self.status()?;
            if st.state == JobState::Running {
                if attempt > 1 {
                    self.observe("recover_needed_retries");
                }
                return Ok(());
            }
            let idle = self
                .sim
                .fabric()
                .wait_activity(super::WAIT, |a| a.in_nic_set.is_empty());
            let to = if attempt == 0 {
                self.schedule.recover_to
            } else {
                RecoverTo::Primary
            };
            self.log(format!(
                "  the job is {} (HCCL idle: {idle}): recover --to {}",
                st.state,
                to.as_str()
            ));
            self.recover(to)?;
            self.settle()?;
        }
        let st = self.status()?;
        if st.state == JobState::Running {
            return Ok(());
        }
        let last = st.recent.last().map(|r| r.to_string());
        let verification = st.last_verification.map(|v| v.to_string());
        Err(self.fail(
            "not_running",
            format!(
                "after {RECOVER_ATTEMPTS} recoveries the job is {}; last result: {last:?}; last \
                 verification: {verification:?}",
                st.state
            ),
        ))
    }

    /// No operator comes (odd seeds): a job that does not run must have training stopped by
    /// the hold policy within its bound, and run again once its processes restart, as a
    /// launcher restarts them, as new incarnations on their default NIC.
    fn outlast_the_hold(&mut self) -> Checked {
        let st = self.status()?;
        if st.state == JobState::Running {
            return Ok(());
        }
        self.log(format!(
            "  the job is {}; no operator comes: hold policy stop after {HOLD_BOUND:?}",
            st.state
        ));
        if let Err(e) = self
            .job()
            .set_hold_policy(HoldPolicy::StopAfter(HOLD_BOUND))
        {
            return Err(self.fail("bounded", format!("setting the hold policy: {e}")));
        }
        if !self.sim.training().wait_ended(HOLD_BOUND + super::WAIT) {
            return Err(self.fail(
                "hold_bounded",
                format!(
                    "the job stayed {} past the hold bound {HOLD_BOUND:?}: training was never stopped",
                    st.state
                ),
            ));
        }
        let stop = self.status()?.training_stop;
        self.log(format!(
            "  training stopped: {}",
            stop.as_ref().map_or("?".into(), |s| s.to_string())
        ));
        self.observe("stopped_by_the_hold_policy");
        // What the old processes did is judged before they are replaced.
        self.check_fabric()?;
        if let Err(e) = self.sim.restart_processes() {
            return Err(self.fail("not_running", format!("restarting the processes: {e}")));
        }
        self.settle()?;
        let st = self.status()?;
        if st.state != JobState::Running || !st.ranks_on_backup.is_empty() {
            return Err(self.fail(
                "not_running",
                format!(
                    "after the restart the job is {} with ranks {:?} on backup",
                    st.state, st.ranks_on_backup
                ),
            ));
        }
        self.log("  every process restarted on its default NIC: running".into());
        Ok(())
    }

    /// A new switch on the recovered job must succeed.
    fn final_switch(&mut self) -> Checked {
        let id = OperationId(uuid::Uuid::from_u128(!u128::from(self.schedule.seed)));
        let cmd = self.command(id, &self.schedule.final_switch);
        let mut w = Watch::new(self.job());
        match self.job().submit(cmd) {
            Ok(taskd_actors::manager::Submission::Started(id)) => {
                self.admitted(id);
                let r = self.one_result(id, &mut w)?;
                if r.outcome == Outcome::Succeeded && r.job_state == JobState::Running {
                    return self.settle();
                }
                Err(self.fail("final_switch", format!("on the recovered job: {r}")))
            }
            other => Err(self.fail(
                "final_switch",
                format!("on the recovered job the switch got {other:?}"),
            )),
        }
    }

    /// The manager's history holds each of its operations exactly once.
    fn check_history(&mut self) -> Checked {
        let st = self.status()?;
        let mut seen: BTreeMap<OperationId, usize> = BTreeMap::new();
        for r in &st.recent {
            *seen.entry(r.id).or_default() += 1;
        }
        let epoch = self.epoch;
        let missing: Vec<OperationId> = self
            .ops
            .iter()
            .filter(|o| o.epoch == epoch && o.result.is_some())
            .filter(|o| seen.get(&o.id) != Some(&1))
            .map(|o| o.id)
            .collect();
        let twice: Vec<&OperationId> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id)
            .collect();
        if missing.is_empty() && twice.is_empty() {
            return Ok(());
        }
        let detail = format!("history: not exactly once {missing:?}, more than once {twice:?}");
        Err(self.fail("one_result", detail))
    }

    /// A process died for good: the job cannot run again in this simulation (it has no
    /// process-level restart); the manager must say so and name the rank.
    fn end_without(&mut self, rank: u32) -> Checked {
        for r in std::mem::take(&mut self.disconnected) {
            if r != rank {
                self.job().reconnect_worker(GlobalRank(r));
            }
        }
        self.settle()?;
        let st = self.status()?;
        let named = st.lost_ranks.iter().any(|l| l.rank == GlobalRank(rank));
        if st.state == JobState::Running || !named {
            return Err(self.fail(
                "lost_rank",
                format!(
                    "the process of rank {rank} is gone, yet the manager says {} with lost ranks {:?}",
                    st.state, st.lost_ranks
                ),
            ));
        }
        self.observe("ended_without_a_killed_process");
        self.log(format!(
            "  the job stays {}: rank {rank}'s process is gone and the simulator has no \
             process-level restart",
            st.state
        ));
        Ok(())
    }
}
