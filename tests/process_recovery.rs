//! Process recovery coordinated by the manager, through the actors on the simulated fabric,
//! with a simulated launcher on every node that follows the manager's orders as taskd's agent
//! does (`taskd::sim::launcher`): a killed process restarts the whole job once; a stop while a
//! node's proxy is cut off waits for that node's old processes to be told to stop again; a
//! proxy lost with nothing in flight leaves the job `degraded`, never stopped. Every test ends
//! with the invariant: every group agrees on its NICs.

mod common;

use common::{assert_consistent_end, cmd, small, status_until, WAIT};
use std::collections::BTreeSet;
use std::time::Duration;
use taskd::actors::manager::HoldPolicy;
use taskd::core::ledger::{ProcessRecovery, StopBy, StopPhase};
use taskd::core::operation::{JobState, Outcome};
use taskd::core::protocol::AfterStop;
use taskd::core::{DeviceId, GlobalRank};
use taskd::hal_mock::RankExit;
use taskd::sim::{Followed, SimConfig, Simulation};

/// The small job with process recovery: at most `max_restarts` restarts of the whole job.
fn recovering(max_restarts: u32) -> SimConfig {
    SimConfig {
        process_recovery: Some(ProcessRecovery { max_restarts }),
        ..small()
    }
}

fn ranks_of_node_1() -> BTreeSet<GlobalRank> {
    (4..8).map(GlobalRank).collect()
}

#[test]
fn a_killed_process_restarts_the_whole_job_once_on_its_default_nics_then_the_budget_ends_it() {
    let mut sim = Simulation::start(&recovering(1)).unwrap();
    // A switch first: the new processes must come back on their default NIC all the same.
    let r = sim.job().run(cmd(&[("node-1", 2, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Running, "{r}");
    sim.train(2).unwrap();

    // A physical port goes down: the new processes find it down too.
    sim.fabric().set_link(1, DeviceId(3), false);
    sim.fabric().kill_rank(GlobalRank(5));
    sim.job().kill_worker(GlobalRank(5));
    // Every node's launcher is ordered restart 1, once; the simulation restarts every process.
    let Followed::Restarted { number, exits } = sim.follow_orders(WAIT).unwrap() else {
        panic!("no restart");
    };
    assert_eq!(number, 1);
    assert_eq!(exits[5], RankExit::Killed, "{exits:?}");
    let orders = sim.launchers().unwrap().orders();
    assert_eq!(orders.handed.len(), 2, "{orders:?}");
    assert_eq!(orders.highest(), 1, "{orders:?}");
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.restarts.done, 1, "no second restart: {:?}", s.restarts);
    assert!(s.ranks_on_backup.is_empty(), "{:?}", s.ranks_on_backup);
    let last = s.last_training_stop.expect("the stop ended");
    assert_eq!(
        (last.by, last.then, last.phase()),
        (
            StopBy::Fault,
            AfterStop::Restart { number: 1 },
            StopPhase::Restarted
        )
    );
    assert!(s.training_stop.is_none() && s.restart_owed.is_none());
    sim.train(3).unwrap();
    assert!(sim.fabric().check_consistency().is_consistent());
    // The proxies see the new processes' links: node-1:2's backup NIC (its partner's port) is
    // down, then up again.
    assert!(!sim.fabric().link_up(1, DeviceId(3)));
    let r = sim.job().run(cmd(&[("node-1", 2, true)])).unwrap();
    assert_eq!(r.outcome, Outcome::Rejected, "{r}");
    sim.fabric().set_link(1, DeviceId(3), true);
    let r = sim.job().run(cmd(&[("node-1", 2, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Running, "{r}");
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");

    // The budget is spent: the next lost process ends the job on every node.
    sim.fabric().kill_rank(GlobalRank(2));
    sim.job().kill_worker(GlobalRank(2));
    assert_eq!(sim.follow_orders(WAIT).unwrap(), Followed::Ended);
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.restarts.done, 1);
    let stop = s.training_stop.expect("the last stop is under way");
    assert_eq!((stop.by, stop.then), (StopBy::Fault, AfterStop::End));
    assert_ne!(s.state, JobState::Running);
    assert_eq!(sim.launchers().unwrap().orders().handed.len(), 4);
    assert_consistent_end(&sim.finish());
}

#[test]
fn a_stop_while_a_node_is_cut_off_restarts_the_job_only_once_its_old_processes_were_told() {
    let mut sim = Simulation::start(&recovering(2)).unwrap();
    let launchers = sim.launchers().unwrap().clone();
    sim.job().kill_proxy(1);
    sim.job().wait_registered_count(Some(4), WAIT).unwrap();
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Degraded);

    let id = sim.job().stop_training("maintenance").unwrap();
    // node-0's launcher has its order; node-1's cannot: nothing restarts yet.
    assert!(launchers.wait(WAIT, |o| o.ordered(0, 1)));
    assert!(!launchers.orders().ordered(1, 1));
    assert_eq!(launchers.orders().restart_due(0), None);
    let stop = sim.job().status(0).unwrap().training_stop.unwrap();
    assert_eq!(stop.id, id);
    assert_eq!(stop.not_back.len(), 8, "{stop}");
    assert!(ranks_of_node_1().is_subset(&stop.unreachable), "{stop}");

    // The proxy is back: node-1's old processes register again, are not counted, and are told
    // to stop again; their launcher gets the same order.
    sim.job().restart_proxy(1);
    assert!(launchers.wait(WAIT, |o| o.ordered(1, 1)));
    // The order goes out at the first old process's registration; the others follow it.
    let s = status_until(sim.job(), |s| {
        s.training_stop
            .as_ref()
            .is_some_and(|t| t.old_back == ranks_of_node_1())
    });
    let stop = s.training_stop.expect("still under way");
    assert_eq!(stop.not_back.len(), 8, "{stop}");
    assert_eq!(stop.old_back, ranks_of_node_1(), "{stop}");
    assert_ne!(s.state, JobState::Running);
    assert_eq!(sim.incarnation(), 0);

    // Only now does the job restart, once, and run.
    let followed = sim.follow_orders(WAIT).unwrap();
    assert!(
        matches!(followed, Followed::Restarted { number: 1, .. }),
        "{followed:?}"
    );
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.restarts.done, 1);
    assert_eq!(s.last_training_stop.map(|t| t.id), Some(id));
    assert_eq!(launchers.orders().highest(), 1);
    sim.train(3).unwrap();
    let r = sim.job().run(cmd(&[("node-0", 1, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Running, "{r}");
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

#[test]
fn a_proxy_lost_with_nothing_in_flight_leaves_the_job_degraded_and_training_on() {
    let bound = Duration::from_millis(20);
    let sim = Simulation::start(&recovering(1)).unwrap();
    sim.job()
        .set_hold_policy(HoldPolicy::StopAfter(bound))
        .unwrap();
    sim.job().kill_proxy(1);
    sim.job().wait_registered_count(Some(4), WAIT).unwrap();
    assert_eq!(sim.job().status(0).unwrap().state, JobState::Degraded);
    // Each step takes at least its 1 ms of compute: 100 steps outlast the bound five times.
    sim.train(100).unwrap();
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::Degraded);
    assert!(s.training_stop.is_none(), "{:?}", s.training_stop);
    assert_eq!(s.restarts.done, 0);
    assert!(s.restart_owed.is_none());
    assert!(sim.launchers().unwrap().orders().handed.is_empty());

    // The proxy is back: a verification round makes the job running.
    sim.job().restart_proxy(1);
    sim.job().wait_registered(WAIT).unwrap();
    let s = sim.job().status(0).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert!(s.last_training_stop.is_none());
    let r = sim.job().run(cmd(&[("node-1", 3, true)])).unwrap();
    assert_eq!(r.job_state, JobState::Running, "{r}");
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}
