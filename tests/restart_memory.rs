//! A uuid's answer outlives the manager that gave it: the in-process job's managers share one
//! journal of finished operations (as `taskd manager --state-dir` keeps it in a file), so after
//! a restart a command repeated with its uuid returns the earlier result without touching a NIC,
//! a uuid reused for another request is still refused, and a uuid whose manager died before its
//! result is refused as interrupted. Every test ends with the invariant:
//! every communication group agrees on its NIC configuration.

mod common;

use common::{assert_consistent_end, small, submit_until};
use std::time::Duration;
use taskd::actors::manager::Submission;
use taskd::actors::LocalJobError;
use taskd::chaos::run_one;
use taskd::core::command::Target;
use taskd::core::operation::{JobState, Outcome};
use taskd::core::protocol::Phase;
use taskd::core::{
    DeviceId, GlobalRank, HcclCode, JobId, NodeName, OperationId, SubmitError, SwitchCommand,
};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{SimConfig, Simulation};

const WAIT: Duration = Duration::from_secs(30);

/// A command of job `sim` under uuid `id`: `(node, device, use_backup)`.
fn command(id: u128, targets: &[(u32, u32, bool)]) -> SwitchCommand {
    SwitchCommand {
        job: JobId("sim".into()),
        id: Some(OperationId(uuid::Uuid::from_u128(id))),
        targets: targets
            .iter()
            .map(|&(node, device, use_backup)| Target {
                node: NodeName::uniform(node),
                device: DeviceId(device),
                use_backup,
            })
            .collect(),
    }
}

/// Kills the manager (as `kill -9` would) and waits until its successor verified every rank.
fn restart(sim: &Simulation) {
    sim.job().restart_manager().expect("a new manager starts");
    sim.job()
        .wait_registered(WAIT)
        .expect("every rank registers again");
}

#[test]
fn a_repeated_uuid_after_a_restart_returns_the_earlier_result_without_a_nic_call() {
    let sim = Simulation::start(&SimConfig {
        nodes: 2,
        devices_per_node: 4,
        step_time: Duration::from_millis(1),
        ..SimConfig::default()
    })
    .unwrap();
    let job = sim.job();
    let to_backup = command(0x11, &[(0, 1, true), (1, 2, true)]);
    let ok = job.run(to_backup.clone()).unwrap();
    assert_eq!(ok.outcome, Outcome::Succeeded, "{ok}");
    // A failed one is remembered as well: rank 5's NIC-set call fails, the switch rolls back.
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(5), NicSetFault::Fail(HcclCode::Network));
    let failing = command(0x22, &[(1, 1, true)]);
    let failed = job.run(failing.clone()).unwrap();
    assert_eq!(failed.outcome, Outcome::Failed, "{failed}");
    assert_eq!(failed.job_state, JobState::Running, "{failed}");

    restart(&sim);
    let calls = sim.fabric().nic_set_log().len();
    for (cmd, earlier) in [(&to_backup, &ok), (&failing, &failed)] {
        match job.submit(cmd.clone()).unwrap() {
            Submission::Known(r) => assert_eq!(*r, *earlier),
            other => panic!("uuid {:?} was answered {other:?}", cmd.id),
        }
        // A client that lost the answer asks the new manager for it.
        assert_eq!(job.wait(earlier.id).unwrap(), *earlier);
    }
    assert_eq!(sim.fabric().nic_set_log().len(), calls, "nothing ran again");
    // Another request under a used uuid is refused, naming it.
    let reused = command(0x11, &[(0, 1, false), (1, 2, false)]);
    match job.submit(reused) {
        Err(LocalJobError::Refused(e @ SubmitError::IdReused { .. })) => {
            assert!(e.to_string().contains(&ok.id.to_string()), "{e}");
        }
        other => panic!("a reused uuid was answered {other:?}"),
    }
    let st = job.status(8).unwrap();
    assert!(st.recent.is_empty(), "the new manager ran nothing: {st:?}");
    assert_eq!(
        st.ranks_on_backup,
        [GlobalRank(1), GlobalRank(6)],
        "rebuilt from the ranks"
    );

    // A second restart still knows (the journal is not the first successor's memory), and a
    // new uuid runs as usual.
    restart(&sim);
    assert_eq!(job.run(to_backup).unwrap(), ok);
    assert_eq!(sim.fabric().nic_set_log().len(), calls);
    let back = job
        .run(command(0x33, &[(0, 1, false), (1, 2, false)]))
        .unwrap();
    assert_eq!(back.outcome, Outcome::Succeeded, "{back}");
    assert!(sim.fabric().nic_set_log().len() > calls);
    sim.train(2).unwrap();
    assert_consistent_end(&sim.finish());
}

/// The fault campaign checks it too: in seed 22 a manager is stopped (SIGTERM) and replaced,
/// then the first switch's uuid comes again with its own request (the earlier result) and with
/// another one (refused). Before the journal, the new manager ran both.
/// The manager is killed in the middle of an operation: its successor has no result for the
/// uuid, but the journal kept the admission, so the same command is refused as interrupted
/// (it is not run a second time) and another request under the uuid as reused; a new uuid
/// runs as usual.
#[test]
fn a_uuid_whose_manager_died_mid_operation_is_refused_as_interrupted() {
    let sim = Simulation::start(&small()).unwrap();
    // Rank 1's NIC-set call takes a second, so the switch is still in flight when the kill
    // arrives (a call of the simulator otherwise ends within microseconds, and the whole
    // operation within milliseconds: its result would be journaled first).
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::from_secs(1)));
    let switch = command(0x33, &[(0, 1, true), (1, 2, true)]);
    let id = submit_until(&sim, switch.clone(), Phase::Switch);
    restart(&sim);
    let job = sim.job();
    match job.submit(switch) {
        Err(LocalJobError::Refused(e @ SubmitError::Interrupted { .. })) => {
            assert_eq!(e, SubmitError::Interrupted { id });
            assert!(e.to_string().contains("new uuid"), "{e}");
        }
        other => panic!("the interrupted uuid was answered {other:?}"),
    }
    match job.submit(command(0x33, &[(0, 3, true)])) {
        Err(LocalJobError::Refused(SubmitError::IdReused { id: reused })) => assert_eq!(reused, id),
        other => panic!("a reuse of the interrupted uuid was answered {other:?}"),
    }
    let fresh = job
        .run(command(0x34, &[(0, 1, false), (1, 2, false)]))
        .unwrap();
    assert_eq!(fresh.outcome, Outcome::Succeeded, "{fresh}");
    assert_consistent_end(&sim.finish());
}

#[test]
fn the_campaign_finds_repeated_uuids_answered_by_a_later_manager() {
    let run = run_one(22);
    assert!(
        run.violations.is_empty(),
        "{:?}\n{}",
        run.violations,
        run.log.join("\n")
    );
    for seen in [
        "uuid_answered_by_a_later_manager",
        "reused_uuid_refused_by_a_later_manager",
    ] {
        assert_eq!(
            run.observations.get(seen),
            Some(&1),
            "{seen}\n{}",
            run.log.join("\n")
        );
    }
}
