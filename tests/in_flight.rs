//! An in-flight move through the actors on the simulated fabric: the operator's command runs
//! as `SubmitInFlight`, every worker aborts through its rank's in-flight side (a simulated
//! group whose link died mid-collective), the manager agrees on the redo point, the workers
//! switch (the mock HCCL's NIC set, then the redo through the in-flight side) and resume. Ends
//! with every group agreeing on its NIC configuration, and every rank having taken every
//! collective's result once.

mod common;

use common::{assert_consistent_end, cmd, small, WAIT};
use std::sync::Arc;
use taskd::actors::manager::{Submission, SubmitInFlight};
use taskd::core::operation::{JobState, Outcome};
use taskd::core::GlobalRank;
use taskd::hal_mock::inflight::{InFlightFabric, LinkFault};
use taskd::sim::Simulation;

#[test]
fn a_link_that_dies_mid_collective_is_moved_in_flight_and_the_step_finished_once() {
    let sim = Simulation::start(&small()).unwrap();
    let world = 8u32;
    // The training processes' collectives: four complete everywhere, the fifth on rank 0 only
    // when the link dies, rank 0 issues a sixth.
    let group = InFlightFabric::new(world);
    for r in 0..world {
        let side = Arc::new(group.rank(GlobalRank(r)));
        assert!(sim.job().gate(GlobalRank(r)).set_in_flight(side));
    }
    for _ in 0..5 {
        for r in 0..world {
            group.issue(GlobalRank(r));
        }
    }
    for q in 0..4 {
        for r in 0..world {
            group.complete(GlobalRank(r), q);
        }
    }
    group.complete(GlobalRank(0), 4);
    group.set_link(LinkFault::Dead);
    group.issue(GlobalRank(0));
    assert!(
        group.completable().is_empty(),
        "nothing moves on the dead link"
    );

    // The simulator's own training loop runs HCCL collectives that do not go through an
    // in-flight side (outside the sequencer: the restart path's case, docs/decisions.md).
    // Its loops end at a common step first, so that the only training in flight is the
    // group's above, and no HCCL collective runs during the move's NIC-set calls.
    let training = sim.training();
    training.stop_after(training.max_steps() + 1);
    assert!(training.wait_ended(WAIT), "the simulator's loops end");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let move_node1 = cmd(&[("node-1", 0, true), ("node-1", 1, true)]);
    let submitted = rt
        .block_on(sim.job().manager().send(SubmitInFlight(move_node1)))
        .unwrap()
        .expect("the in-flight move is admitted");
    let Submission::Started(id) = submitted else {
        panic!("a new operation: {submitted:?}");
    };
    let r = sim.job().wait(id).unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert!(r.applied && !r.rolled_back);
    assert_eq!(r.job_state, JobState::Running);
    assert_eq!(r.pause_step, None, "no step boundary was waited for");

    // The rebuilt group finishes the step: collective 4 again from every rank (rank 0's
    // second result dropped), then the rest.
    for r in 1..world {
        group.issue(GlobalRank(r));
    }
    while let Some((rank, q)) = group.completable().first().copied() {
        group.complete(rank, q);
    }
    assert_eq!(group.check(6), Ok(()));
    assert_eq!(group.dropped(), 1);
    assert_eq!(group.generations(), vec![1; world as usize]);

    // HCCL's groups moved too (the HAL's part of the switch), as the manager's table says.
    assert_eq!(
        sim.fabric().ranks_on_backup(),
        vec![GlobalRank(4), GlobalRank(5)]
    );
    let end = sim.finish();
    assert_consistent_end(&end);
}
