//! The cases of process recovery in a recovery schedule ([`Schedule::recovery`]): the job
//! runs with process recovery and a launcher on every node that follows the manager's orders
//! ([`crate::sim::launcher`]); the driver carries the launchers' orders out
//! ([`Simulation::follow_orders`]) and checks `one_restart_per_fault`,
//! `only_new_incarnations_count` and `no_stop_without_hold` (see the module of the driver).
//!
//! [`Schedule::recovery`]: crate::chaos::Schedule::recovery
//! [`Simulation::follow_orders`]: crate::sim::Simulation::follow_orders

use super::{Checked, Driver, Watch, TRAIN_WAIT, WAIT};
use crate::chaos::schedule::{CutStop, DEVICES, NODES, RANKS};
use crate::sim::launcher::Orders;
use crate::sim::Followed;
use std::time::{Duration, Instant};
use taskd_actors::manager::{AwaitRegistered, HoldPolicy};
use taskd_core::ledger::{ProcessRecovery, StopBy};
use taskd_core::operation::JobState;
use taskd_core::protocol::AfterStop;
use taskd_core::{GlobalRank, OperationId};

/// The hold bound while a proxy is away with nothing in flight: far shorter than the time it
/// stays away, so a hold policy that stopped training for a degraded job would be seen.
pub(super) const DEGRADED_HOLD: Duration = Duration::from_millis(60);
/// How long a proxy stays away with nothing in flight at the least (training goes on).
pub(super) const AWAY_AT_LEAST: Duration = Duration::from_millis(300);
/// The hold bound once a switch lost a cut node's proxy (the job held): the policy stops.
pub(super) const CUT_HOLD: Duration = Duration::from_millis(150);

/// What a recovery schedule did so far, to judge the manager's restarts by.
pub(super) struct Book {
    /// The job's restart budget.
    max: u32,
    /// Faults injected that owe a restart of the job: processes killed, stops of training.
    faults: u32,
    /// Of which stops.
    stops: u32,
    /// Restarts the launchers carried out (the last restart number).
    restarts: u32,
    /// The launchers ended the job (its budget spent).
    ended: bool,
    /// A proxy away with nothing in flight.
    away: Option<Away>,
}

/// A proxy lost with nothing in flight, and what the job had then.
struct Away {
    node: u32,
    /// Orders handed to launchers before.
    orders: usize,
    /// The manager's restart count before.
    restarts: u32,
}

impl Book {
    pub(super) fn new(recovery: ProcessRecovery) -> Book {
        Book {
            max: recovery.max_restarts,
            faults: 0,
            stops: 0,
            restarts: 0,
            ended: false,
            away: None,
        }
    }
}

/// The node's ranks, as a list for people.
fn ranks_of(node: u32) -> String {
    format!("{}-{}", node * DEVICES, node * DEVICES + DEVICES - 1)
}

impl Driver<'_> {
    fn book(&mut self) -> &mut Book {
        self.book.as_mut().expect("a recovery schedule")
    }

    /// Whether the launchers ended the job (a recovery schedule whose budget was spent).
    pub(super) fn job_ended(&self) -> bool {
        self.book.as_ref().is_some_and(|b| b.ended)
    }

    /// The node whose proxy is away with nothing in flight, if any.
    pub(super) fn proxy_away_node(&self) -> Option<u32> {
        self.book.as_ref()?.away.as_ref().map(|a| a.node)
    }

    fn orders(&self) -> Orders {
        self.sim.launchers().map(|l| l.orders()).unwrap_or_default()
    }

    /// Kills `rank`'s process (a fault owing a restart); the driver follows the restart.
    pub(super) fn kill_rank_only(&mut self, rank: u32) {
        self.count("process_kill_restarted");
        self.book().faults += 1;
        self.sim.fabric().kill_rank(GlobalRank(rank));
        self.job().kill_worker(GlobalRank(rank));
    }

    /// A rank's process dies between operations: one restart of the job follows.
    pub(super) fn kill_rank(&mut self, rank: u32) -> Checked {
        self.kill_rank_only(rank);
        self.follow_restart()
    }

    /// A fault owes a restart (or, the budget spent, the end): waits for every node's launcher
    /// to get its order, checks the stop under way, carries the order out and checks the job
    /// that runs again (or ended).
    pub(super) fn follow_restart(&mut self) -> Checked {
        let (carried, max) = (self.book().restarts, self.book().max);
        let Some(launchers) = self.sim.launchers().cloned() else {
            return Ok(());
        };
        let due = |o: &Orders| o.restart_due(carried).is_some() || o.end_due();
        if !launchers.wait(WAIT, due) {
            let st = self.status()?;
            let stop = st.training_stop.map(|s| s.to_string());
            return Err(self.fail(
                "bounded",
                format!(
                    "no order reached every node's launcher within {WAIT:?} (orders {:?}); the \
                     job is {}, stop: {stop:?}, restart owed: {:?}",
                    launchers.orders().handed,
                    st.state,
                    st.restart_owed
                ),
            ));
        }
        self.check_only_new()?;
        self.check_restarts()?;
        let orders = launchers.orders();
        let end_expected = carried >= max;
        if let Some(n) = orders.restart_due(carried).filter(|_| end_expected) {
            return Err(self.fail(
                "one_restart_per_fault",
                format!("restart {n} was ordered with the budget of {max} restarts spent"),
            ));
        }
        if orders.end_due() && !end_expected {
            return Err(self.fail(
                "not_running",
                format!("the job was ended after {carried} of {max} restarts"),
            ));
        }
        // What the old processes did is judged before they are replaced.
        let old = self.sim.fabric().clone();
        let followed = self.sim.follow_orders(WAIT);
        self.judge_fabric(&old)?;
        match followed {
            Ok(Followed::Restarted { number, .. }) => {
                self.log(format!("  every process restarted as restart {number}"));
                self.book().restarts = number;
            }
            Ok(Followed::Ended) => return self.ended(),
            Ok(Followed::Nothing) => {
                return Err(self.fail("bounded", "a due order was not carried out".into()))
            }
            Err(e) => return Err(self.fail("not_running", format!("following the orders: {e}"))),
        }
        // A second restart for the same fault would have begun by now: the old processes'
        // deaths came before the new ones registered.
        self.check_restarts()?;
        self.settle()?;
        let st = self.status()?;
        let number = self.book().restarts;
        if st.state != JobState::Running || !st.ranks_on_backup.is_empty() {
            return Err(self.fail(
                "not_running",
                format!(
                    "after restart {number} the job is {} with ranks {:?} on backup",
                    st.state, st.ranks_on_backup
                ),
            ));
        }
        // The stop that ended is this restart's: no second stop followed the same fault.
        let last = st.last_training_stop.as_ref().map(|s| s.then);
        if st.restarts.done != number
            || st.training_stop.is_some()
            || last != Some(AfterStop::Restart { number })
        {
            return Err(self.fail(
                "one_restart_per_fault",
                format!(
                    "after restart {number} the manager counts {} restarts, stop under way {:?}, \
                     last stop {:?}",
                    st.restarts.done,
                    st.training_stop.map(|s| s.to_string()),
                    st.last_training_stop.map(|s| s.to_string())
                ),
            ));
        }
        self.observe("job_restarted_after_a_fault");
        Ok(())
    }

    /// The launchers ended the job: the budget was spent, and the manager says so.
    fn ended(&mut self) -> Checked {
        self.book().ended = true;
        let st = self.status()?;
        let max = self.book().max;
        let then = st.training_stop.as_ref().map(|s| s.then);
        if st.restarts.done != max || then != Some(AfterStop::End) || st.state == JobState::Running
        {
            return Err(self.fail(
                "one_restart_per_fault",
                format!(
                    "the job ended with {} restarts of {max} counted, its stop saying {then:?}, \
                     the job {}",
                    st.restarts.done, st.state
                ),
            ));
        }
        self.log(format!(
            "  the job ended: {max} restarts spent, every node's launcher ordered to end it"
        ));
        self.observe("job_ended_with_its_restarts_spent");
        Ok(())
    }

    /// No collective ran on a disagreeing group of `fabric`, no HCCL rule broken there (the
    /// fabric of processes about to be replaced).
    fn judge_fabric(&mut self, fabric: &taskd_hal_mock::Fabric) -> Checked {
        let bad = fabric.collectives_on_inconsistent_groups();
        if bad > 0 {
            return Err(self.fail(
                "inconsistent_collective",
                format!("{bad} collectives of the old processes ran on groups that disagreed"),
            ));
        }
        let v = fabric.violations();
        if !v.is_empty() {
            return Err(self.fail("hccl_rule", v.join("; ")));
        }
        Ok(())
    }

    /// `one_restart_per_fault`: no more restarts, counted, ordered or carried out, than
    /// faults.
    fn check_restarts(&mut self) -> Checked {
        let st = self.status()?;
        let ordered = self.orders().highest();
        let (faults, stops) = (self.book().faults, self.book().stops);
        let carried = self.sim.incarnation();
        if st.restarts.done <= faults && ordered <= faults && carried <= faults {
            return Ok(());
        }
        Err(self.fail(
            "one_restart_per_fault",
            format!(
                "{faults} faults ({} killed processes, {stops} stops), yet the manager counts {} \
                 restarts (last cause {:?}), the launchers were ordered restart {ordered} and \
                 carried out {carried}",
                faults - stops,
                st.restarts.done,
                st.restarts.cause
            ),
        ))
    }

    /// `only_new_incarnations_count`, while a stop is under way and no launcher restarted
    /// the processes it retired: the manager counts no rank back, does not say the stop
    /// ended, nor `running`.
    fn check_only_new(&mut self) -> Checked {
        let st = self.status()?;
        let old_training = self.sim.training().running();
        let incarnation = self.sim.incarnation();
        let broken = match &st.training_stop {
            None => Some(format!(
                "the manager reports no stop under way (the last one: {:?}), yet every process \
                 is still one the stop retired (incarnation {incarnation}; {old_training} of \
                 their training loops still run)",
                st.last_training_stop.as_ref().map(|s| s.to_string())
            )),
            Some(s) if s.not_back.len() != RANKS as usize => {
                let back: Vec<u32> = (0..RANKS)
                    .filter(|r| !s.not_back.contains(&GlobalRank(*r)))
                    .collect();
                Some(format!(
                    "the manager counts ranks {back:?} back after the stop ({s}), yet no new \
                     process was started: each is still the one the stop retired \
                     (incarnation {incarnation}; {old_training} of their training loops still \
                     run)"
                ))
            }
            Some(_) if st.state == JobState::Running => Some(format!(
                "the manager says running during the stop, every process still one it retired \
                 ({old_training} training loops still run)"
            )),
            Some(_) => None,
        };
        match broken {
            Some(detail) => Err(self.fail("only_new_incarnations_count", detail)),
            None => Ok(()),
        }
    }

    /// Brings the job to quiet and `running` before a case that needs it (the recovery
    /// contract's `recover` when it is not).
    fn running_first(&mut self) -> Checked {
        self.settle()?;
        if self.status()?.state != JobState::Running {
            // As the contract has it: every link up before `recover`.
            for (node, device) in std::mem::take(&mut self.links_down) {
                self.sim
                    .fabric()
                    .set_link(node, taskd_core::DeviceId(device), true);
            }
            self.bring_back()?;
        }
        Ok(())
    }

    /// Training is stopped while `node`'s proxy is cut off (by an operator, or by the hold
    /// policy once a switch lost the node): the other node's processes stop and its launcher
    /// has the order; when the proxy is back, the cut node's old processes are told to stop
    /// again, never counted, and only then does the job restart and run.
    pub(super) fn stop_while_cut(&mut self, node: u32, by: &CutStop) -> Checked {
        self.running_first()?;
        self.count("stop_while_cut");
        let other = (node + 1) % NODES;
        let (carried, max) = (self.book().restarts, self.book().max);
        let next = carried + 1;
        let has_order = move |o: &Orders, n: u32| {
            if carried >= max {
                o.ordered_end(n as usize)
            } else {
                o.ordered(n as usize, next)
            }
        };
        let by_policy = match by {
            CutStop::Operator => {
                let before = (self.orders().handed.len(), self.status()?.restarts.done);
                self.cut(node)?;
                self.check_only_degraded((node, before.0, before.1))?;
                self.operator_stop()?;
                false
            }
            CutStop::Policy { id, targets, phase } => {
                self.cut_during_switch(node, *id, targets, *phase)?
            }
        };
        self.book().faults += 1;
        self.book().stops += 1;
        let Some(launchers) = self.sim.launchers().cloned() else {
            return Ok(());
        };
        let wait = if by_policy { WAIT + CUT_HOLD } else { WAIT };
        if !launchers.wait(wait, |o| has_order(o, other)) {
            let st = self.status()?;
            return Err(self.fail(
                "bounded",
                format!(
                    "node-{other}'s launcher got no order within {wait:?} of the stop: the job is \
                     {}, stop {:?}",
                    st.state,
                    st.training_stop.map(|s| s.to_string())
                ),
            ));
        }
        if by_policy {
            let st = self.status()?;
            let stop_by = st.training_stop.as_ref().map(|s| s.by);
            if stop_by == Some(StopBy::Policy) {
                self.observe("stopped_by_the_hold_policy_while_a_node_was_cut_off");
            }
            self.set_hold(HoldPolicy::default())?;
        }
        // node-{node} cannot have its order: the launchers restart nothing yet.
        self.log(format!(
            "  node-{other}'s launcher has its order, node-{node}'s proxy is cut off: nothing \
             restarts yet"
        ));
        self.check_only_new()?;
        self.check_restarts()?;
        if self.sim.launchers().is_some_and(|l| {
            let o = l.orders();
            o.restart_due(carried).is_some() || o.end_due()
        }) {
            return Err(self.fail(
                "only_new_incarnations_count",
                format!("node-{node}'s launcher was ordered while its proxy was cut off"),
            ));
        }
        // The proxy is back: its old processes register again and are told to stop again.
        self.restart_proxy(node as usize);
        if !launchers.wait(WAIT, |o| has_order(o, node)) {
            // A manager that counted them back never sends the stop again.
            self.check_only_new()?;
            return Err(self.fail(
                "bounded",
                format!(
                    "node-{node}'s launcher got no order within {WAIT:?} of its proxy's return"
                ),
            ));
        }
        self.check_only_new()?;
        let st = self.status()?;
        let old_back = st
            .training_stop
            .as_ref()
            .map(|s| s.old_back.iter().map(|r| r.0).collect::<Vec<_>>())
            .unwrap_or_default();
        self.log(format!(
            "  node-{node}'s proxy is back: old processes of ranks {old_back:?} told to stop \
             again, not counted; node-{node}'s launcher has its order"
        ));
        if old_back.iter().any(|r| r / DEVICES == node) {
            self.observe("old_processes_back_after_a_cut_were_told_to_stop_again");
        }
        self.follow_restart()
    }

    /// Kills `node`'s proxy with nothing in flight; waits until the manager lost its ranks.
    fn cut(&mut self, node: u32) -> Checked {
        self.count("proxy_kill");
        self.job().kill_proxy(node as usize);
        self.ask(
            AwaitRegistered(Some(((NODES - 1) * DEVICES) as usize)),
            WAIT,
            "the manager to lose the cut node's ranks",
        )
    }

    /// An operator stops training.
    fn operator_stop(&mut self) -> Checked {
        match self
            .job()
            .stop_training("chaos: an operator stops training")
        {
            Ok(id) => {
                self.log(format!("  training stopped by an operator: {id}"));
                Ok(())
            }
            Err(e) => Err(self.fail(
                "not_running",
                format!("an operator's stop of training was refused: {e}"),
            )),
        }
    }

    /// A switch loses `node`'s proxy when `phase` starts; a job it leaves held is stopped by
    /// the hold policy (a short bound), one it leaves degraded by an operator. Whether the
    /// policy was to stop it.
    fn cut_during_switch(
        &mut self,
        node: u32,
        raw: u128,
        targets: &[crate::chaos::schedule::Target],
        phase: taskd_core::protocol::Phase,
    ) -> Checked<bool> {
        let cmd = self.command(OperationId(uuid::Uuid::from_u128(raw)), targets);
        let mut w = Watch::new(self.job());
        let Some(id) = self.admit(cmd)? else {
            self.cut(node)?;
            self.operator_stop()?;
            return Ok(false);
        };
        let reached = self.await_phase(&mut w, id, phase)?;
        self.log(format!(
            "  proxy of node-{node} killed {} {phase}",
            if reached { "at" } else { "after the end of" }
        ));
        self.count("proxy_kill");
        self.job().kill_proxy(node as usize);
        let r = self.one_result(id, &mut w)?;
        self.ask(
            AwaitRegistered(Some(((NODES - 1) * DEVICES) as usize)),
            WAIT,
            "the manager to lose the cut node's ranks",
        )?;
        let state = self.status()?.state;
        if matches!(state, JobState::Paused | JobState::NeedsRecovery) {
            self.log(format!(
                "  the switch left the job {state} ({:?}): hold policy stop after {CUT_HOLD:?}",
                r.outcome
            ));
            self.set_hold(HoldPolicy::StopAfter(CUT_HOLD))?;
            return Ok(true);
        }
        self.log(format!("  the job is {state}: an operator stops training"));
        self.observe("cut_after_the_switch_ended");
        self.operator_stop()?;
        Ok(false)
    }

    fn set_hold(&mut self, policy: HoldPolicy) -> Checked {
        match self.job().set_hold_policy(policy) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail("bounded", format!("setting the hold policy: {e}"))),
        }
    }

    /// `node`'s proxy dies with nothing in flight: the job is degraded, no stop begins though
    /// the hold bound is short, and training goes on well past it.
    pub(super) fn proxy_away(&mut self, node: u32) -> Checked {
        self.running_first()?;
        self.count("proxy_away");
        let (orders, restarts) = (self.orders().handed.len(), self.status()?.restarts.done);
        self.set_hold(HoldPolicy::StopAfter(DEGRADED_HOLD))?;
        self.cut(node)?;
        self.book().away = Some(Away {
            node,
            orders,
            restarts,
        });
        self.check_degraded()?;
        let until = Instant::now() + AWAY_AT_LEAST;
        let from = self.sim.training().min_steps();
        while Instant::now() < until {
            let t = self.sim.training();
            let target = t.max_steps() + 5;
            if !t.wait_min_steps(target, TRAIN_WAIT) {
                // A stop of training ends the loops: say so before that training stopped.
                self.check_degraded()?;
                let detail = self.held_detail(target);
                return Err(self.fail("held", detail));
            }
            self.check_degraded()?;
        }
        let trained = self.sim.training().min_steps() - from;
        self.log(format!(
            "  degraded for {AWAY_AT_LEAST:?} (hold bound {DEGRADED_HOLD:?}): {trained} steps \
             trained, no stop, no order"
        ));
        Ok(())
    }

    /// `no_stop_without_hold` while a proxy is away with nothing in flight.
    fn check_degraded(&mut self) -> Checked {
        let Some(away) = self
            .book()
            .away
            .as_ref()
            .map(|a| (a.node, a.orders, a.restarts))
        else {
            return Ok(());
        };
        self.check_only_degraded(away)
    }

    /// `no_stop_without_hold`: with only `node`'s proxy lost and nothing in flight, the job is
    /// degraded, no launcher was ordered anything since `orders` orders were handed, and no
    /// stop began (the manager still counts `restarts` restarts).
    fn check_only_degraded(&mut self, (node, orders, restarts): (u32, usize, u32)) -> Checked {
        let st = self.status()?;
        let handed = self.orders().handed;
        let fine = st.state == JobState::Degraded
            && st.training_stop.is_none()
            && st.restart_owed.is_none()
            && st.restarts.done == restarts
            && handed.len() == orders;
        if fine {
            return Ok(());
        }
        Err(self.fail(
            "no_stop_without_hold",
            format!(
                "only node-{node}'s proxy is lost (ranks {}), nothing in flight, no process \
                 dead, yet the job is {} with stop {:?}, restart owed {:?}, {} restarts (were \
                 {restarts}), orders {:?}",
                ranks_of(node),
                st.state,
                st.training_stop.map(|s| s.to_string()),
                st.restart_owed,
                st.restarts.done,
                &handed[orders.min(handed.len())..]
            ),
        ))
    }

    /// The proxy [`Driver::proxy_away`] lost is back: a verification round makes the job
    /// running, and no stop began meanwhile.
    pub(super) fn proxy_back(&mut self, node: u32) -> Checked {
        if self.proxy_away_node() != Some(node) {
            return Ok(());
        }
        self.check_degraded()?;
        self.restart_proxy(node as usize);
        self.book().away = None;
        self.set_hold(HoldPolicy::default())?;
        self.settle()?;
        let st = self.status()?;
        if st.state != JobState::Running {
            return Err(self.fail(
                "not_running",
                format!(
                    "node-{node}'s proxy is back and its ranks verified, yet the job is {}",
                    st.state
                ),
            ));
        }
        self.log(format!("  node-{node}'s proxy is back: running"));
        self.observe("degraded_job_ran_again_once_its_proxy_was_back");
        Ok(())
    }

    /// The end of a recovery schedule: a job that ended stays ended (its budget spent); any
    /// other has its proxy back and every restart it owed done, exactly one per fault.
    pub(super) fn end_recovery(&mut self) -> Checked {
        if self.job_ended() {
            return Ok(());
        }
        if let Some(node) = self.proxy_away_node() {
            self.proxy_back(node)?;
        }
        let st = self.status()?;
        let (faults, restarts, max) = (self.book().faults, self.book().restarts, self.book().max);
        if restarts != faults.min(max) || st.restarts.done != restarts {
            return Err(self.fail(
                "one_restart_per_fault",
                format!(
                    "{faults} faults with a budget of {max}: the launchers carried out {restarts} \
                     restarts, the manager counts {}",
                    st.restarts.done
                ),
            ));
        }
        Ok(())
    }
}
