//! The Worker actor's conversation with HCCL, written as scripts: each test declares the
//! calls the worker must make on its rank HAL ([`ScriptedRankHal`]), drives the worker with
//! directives as its proxy would, and reads its replies from a channel.
//!
//! Rank 1 of a 4-rank job, in three groups: the world group, `tp_0` = {0, 1} and
//! `dp_1` = {1, 3}. HCCL needs every member of a group to make the identical call with the
//! training loop held, so the script fixes the calls' order (groups sorted by name, as
//! `taskd_core::planner` plans them) and their arguments (group ranks).

use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use taskd_actors::transport::{Deliver, Sender, TransportError};
use taskd_actors::worker::WorkerConfig;
use taskd_actors::{StepGate, ThreadedRankHal, Worker};
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, Phase, RankError, ReplyBody, WorkerToProxy,
};
use taskd_core::{
    GlobalRank, GroupCall, GroupInfo, GroupRank, HalError, HalErrorKind, HcclCode, NicSide,
    OperationId, RankHal, StepOutcome, SwitchCapabilities,
};
use taskd_hal_mock::{Expect, ScriptedRankHal};
use tokio::sync::mpsc;

const RANK: GlobalRank = GlobalRank(1);
const WORLD: &str = "hccl_world_group";
/// A safety net: a broken worker fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(30);
/// The time the directives give the calls (an HCCL HAL ignores it).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn layout() -> Vec<GroupInfo> {
    let group = |name: &str, members: &[u32]| GroupInfo {
        name: name.into(),
        members: members.iter().copied().map(GlobalRank).collect(),
    };
    // In the order HCCL lists them, which is not the order they are called in.
    vec![
        group(WORLD, &[0, 1, 2, 3]),
        group("tp_0", &[0, 1]),
        group("dp_1", &[1, 3]),
    ]
}

/// Ranks 1 and 3 to their backup NIC.
fn to_backup() -> Vec<(GlobalRank, NicSide)> {
    vec![
        (GlobalRank(1), NicSide::Backup),
        (GlobalRank(3), NicSide::Backup),
    ]
}

fn op(n: u128) -> OperationId {
    OperationId(uuid::Uuid::from_u128(n))
}

/// The worker's proxy, as far as the worker can tell: a channel the test reads.
struct ToTest(mpsc::UnboundedSender<WorkerToProxy>);

impl Sender<WorkerToProxy> for ToTest {
    fn send(&self, msg: WorkerToProxy) -> Result<(), TransportError> {
        self.0.send(msg).map_err(|_| TransportError::Closed)
    }
}

/// One worker on a scripted HAL, its step gate, and what it sent upstream.
struct Harness {
    worker: Addr<Worker>,
    gate: Arc<StepGate>,
    upstream: mpsc::UnboundedReceiver<WorkerToProxy>,
    hal: ScriptedRankHal,
}

impl Harness {
    /// Starts the worker (on the current actix system) over the script's HAL on a thread of
    /// its own; it asks the HAL for its capabilities at once, so every script starts with
    /// `Expect::capabilities`.
    fn start(script: impl IntoIterator<Item = Expect>) -> Self {
        Self::start_on(script, |hal| Box::new(hal))
    }

    /// [`Harness::start`] with the scripted HAL wrapped by `wrap`.
    fn start_on(
        script: impl IntoIterator<Item = Expect>,
        wrap: impl FnOnce(ScriptedRankHal) -> Box<dyn RankHal>,
    ) -> Self {
        Self::start_with(script, wrap, None)
    }

    /// [`Harness::start_on`] with the worker's hang watch at `hang_timeout`.
    fn start_with(
        script: impl IntoIterator<Item = Expect>,
        wrap: impl FnOnce(ScriptedRankHal) -> Box<dyn RankHal>,
        hang_timeout: Option<Duration>,
    ) -> Self {
        let hal = ScriptedRankHal::new(script);
        let gate = Arc::new(StepGate::new());
        let (tx, upstream) = mpsc::unbounded_channel();
        let cfg = WorkerConfig {
            job: "job".into(),
            node: "node-0".into(),
            rank: RANK,
            tsp: true,
            generation: 0,
            hang_timeout,
        };
        let on_thread = ThreadedRankHal::for_rank(RANK, wrap(hal.clone())).unwrap();
        let worker =
            Worker::new(cfg, Box::new(on_thread), gate.clone(), Arc::new(ToTest(tx))).start();
        Harness {
            worker,
            gate,
            upstream,
            hal,
        }
    }

    async fn next(&mut self) -> WorkerToProxy {
        tokio::time::timeout(PATIENCE, self.upstream.recv())
            .await
            .expect("the worker said nothing")
            .expect("the worker's link closed")
    }

    fn send(&self, op: OperationId, kind: DirectiveKind) {
        self.worker.do_send(Deliver(Directive { op, kind }));
    }

    /// The worker's reply to `op`'s `phase`. A HAL that panicked on a script mismatch shows
    /// as a failed reply: the script's own message says more, so it goes first.
    async fn reply(&mut self, op: OperationId, phase: Phase) -> ReplyBody {
        let WorkerToProxy::Reply(r) = self.next().await else {
            panic!("expected a reply to {phase}");
        };
        if matches!(&r.body, ReplyBody::Failed(e) if e.message.contains("the HAL panicked")) {
            self.hal.done();
        }
        assert_eq!((r.rank, r.op, r.phase), (RANK, op, phase), "{r:?}");
        r.body
    }

    /// Samples and pauses the rank after step 2, with a training thread that holds there
    /// until the gate opens. Returns that thread.
    async fn hold(&mut self, op: OperationId) -> std::thread::JoinHandle<StepOutcome> {
        assert_eq!(self.gate.step_completed(1), StepOutcome::Go);
        self.send(op, DirectiveKind::Sample { targets: vec![] });
        assert_eq!(
            self.reply(op, Phase::Sample).await,
            ReplyBody::Sampled {
                in_step: 2,
                in_flight: false
            }
        );
        self.send(op, DirectiveKind::PauseAt { step: 2 });
        let gate = self.gate.clone();
        let training = std::thread::spawn(move || gate.step_completed(2));
        assert_eq!(
            self.reply(op, Phase::Pause).await,
            ReplyBody::Paused { step: 2 }
        );
        training
    }

    /// Stops training for `reason` with `op`: the held `training` thread is told to stop.
    async fn stop_training(
        &mut self,
        op: OperationId,
        reason: &str,
        training: std::thread::JoinHandle<StepOutcome>,
    ) {
        let kind = DirectiveKind::StopTraining {
            reason: reason.into(),
            then: taskd_core::protocol::AfterStop::Launcher,
            only: Vec::new(),
        };
        self.send(op, kind);
        assert!(matches!(
            self.reply(op, Phase::Stop).await,
            ReplyBody::Stopped { .. }
        ));
        assert_eq!(
            training.join().expect("the training thread"),
            StepOutcome::Stop(reason.into())
        );
    }

    async fn resume(&mut self, op: OperationId, training: std::thread::JoinHandle<StepOutcome>) {
        self.send(op, DirectiveKind::Resume);
        assert!(matches!(
            self.reply(op, Phase::Resume).await,
            ReplyBody::Resumed { .. }
        ));
        assert_eq!(
            training.join().expect("the training thread"),
            StepOutcome::Go
        );
    }
}

/// The HAL knows L2 retry and RDMA but not `TSP:1`, which is the worker's own configuration.
fn hal_capabilities() -> Expect {
    Expect::capabilities(SwitchCapabilities::ALL)
}

fn call(group: &str, ranks: &[u32], use_backup: &[bool]) -> GroupCall {
    GroupCall {
        group: group.into(),
        ranks: ranks.iter().copied().map(GroupRank).collect(),
        sides: use_backup
            .iter()
            .map(|b| NicSide::from_use_backup(*b))
            .collect(),
    }
}

#[actix_rt::test]
async fn a_switch_makes_the_planned_calls_in_order_and_reports_each() {
    let mut w = Harness::start([
        hal_capabilities(),
        Expect::groups(layout()),
        Expect::set_working_nic("dp_1", &[0, 1], &[true, true]),
        Expect::set_working_nic(WORLD, &[1, 3], &[true, true]),
        Expect::set_working_nic("tp_0", &[1], &[true]),
    ]);
    let WorkerToProxy::Hello(hello) = w.next().await else {
        panic!("the worker must introduce itself first");
    };
    assert_eq!(hello.rank, RANK);
    assert_eq!(hello.capabilities, SwitchCapabilities::ALL, "tsp joined in");

    let training = w.hold(op(1)).await;
    w.send(
        op(1),
        DirectiveKind::Switch {
            targets: to_backup(),
            call_timeout: CALL_TIMEOUT,
        },
    );
    let applied = |c: GroupCall, size: u32| AppliedCall {
        group: c.group.clone(),
        group_size: size,
        digest: c.digest(),
    };
    assert_eq!(
        w.reply(op(1), Phase::Switch).await,
        ReplyBody::Applied {
            calls: vec![
                applied(call("dp_1", &[0, 1], &[true, true]), 2),
                applied(call(WORLD, &[1, 3], &[true, true]), 4),
                applied(call("tp_0", &[1], &[true]), 2),
            ]
        }
    );
    w.resume(op(1), training).await;
    w.hal.done();
}

#[actix_rt::test]
async fn a_rollback_restates_in_a_second_round_and_reports_one_entry_per_group() {
    let mut w = Harness::start([
        hal_capabilities(),
        // Round 1: rank 3 back to its primary NIC.
        Expect::groups(layout()),
        Expect::set_working_nic("dp_1", &[1], &[false]),
        Expect::set_working_nic(WORLD, &[3], &[false]),
        // Round 2: rank 1 re-stated on its backup NIC, in calls of their own.
        Expect::groups(layout()),
        Expect::set_working_nic("dp_1", &[0], &[true]),
        Expect::set_working_nic(WORLD, &[1], &[true]),
        Expect::set_working_nic("tp_0", &[1], &[true]),
    ]);
    w.next().await; // hello
    let training = w.hold(op(5)).await;
    w.send(
        op(5),
        DirectiveKind::Rollback {
            targets: vec![(GlobalRank(3), NicSide::Primary)],
            restate: vec![(GlobalRank(1), NicSide::Backup)],
            call_timeout: CALL_TIMEOUT,
        },
    );
    let mut want = Vec::new();
    for (c, size) in [
        (call("dp_1", &[1], &[false]), 2),
        (call(WORLD, &[3], &[false]), 4),
        (call("dp_1", &[0], &[true]), 2),
        (call(WORLD, &[1], &[true]), 4),
        (call("tp_0", &[1], &[true]), 2),
    ] {
        let made = AppliedCall {
            group: c.group.clone(),
            group_size: size,
            digest: c.digest(),
        };
        AppliedCall::record(&mut want, made);
    }
    assert_eq!(want.len(), 3);
    assert_eq!(
        w.reply(op(5), Phase::Rollback).await,
        ReplyBody::Applied { calls: want }
    );
    w.resume(op(5), training).await;
    w.hal.done();
}

#[actix_rt::test]
async fn a_failed_group_does_not_stop_the_others_and_the_first_failure_is_reported() {
    let network = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "dp_1 link");
    let timeout = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Timeout, "tp_0 peers");
    let mut w = Harness::start([
        hal_capabilities(),
        Expect::groups(layout()),
        Expect::set_working_nic("dp_1", &[0, 1], &[true, true]).fails(network.clone()),
        // The world group's peers are already waiting in this call: it must still be made.
        Expect::set_working_nic(WORLD, &[1, 3], &[true, true]),
        Expect::set_working_nic("tp_0", &[1], &[true]).fails(timeout),
    ]);
    w.next().await; // hello
    let training = w.hold(op(2)).await;
    w.send(
        op(2),
        DirectiveKind::Switch {
            targets: to_backup(),
            call_timeout: CALL_TIMEOUT,
        },
    );
    let ReplyBody::Failed(e) = w.reply(op(2), Phase::Switch).await else {
        panic!("the switch must fail");
    };
    assert_eq!(
        e,
        RankError {
            group: Some("dp_1".into()),
            message: network.to_string(),
            hal: Some(network),
        }
    );
    assert_eq!(e.hal.as_ref().map(|h| h.kind), Some(HalErrorKind::Network));
    w.resume(op(2), training).await;
    w.hal.done();
}

#[actix_rt::test]
async fn groups_that_cannot_be_read_are_reported_and_nothing_is_set() {
    let gone = HalError::new(
        "HcclGetCommName",
        HcclCode::Unavail,
        "communicator destroyed",
    );
    let mut w = Harness::start([
        hal_capabilities(),
        Expect::groups(vec![]).fails(gone.clone()),
    ]);
    w.next().await; // hello
    let training = w.hold(op(3)).await;
    w.send(
        op(3),
        DirectiveKind::Rollback {
            targets: to_backup(),
            restate: vec![],
            call_timeout: CALL_TIMEOUT,
        },
    );
    assert_eq!(
        w.reply(op(3), Phase::Rollback).await,
        ReplyBody::Failed(RankError {
            group: None,
            message: gone.to_string(),
            hal: Some(gone),
        })
    );
    w.resume(op(3), training).await;
    w.hal.done();
}

#[actix_rt::test]
async fn a_switch_while_training_is_not_held_is_refused_without_a_hal_call() {
    // Only the start-up question: any groups or NIC-set call would break the script.
    let mut w = Harness::start([hal_capabilities()]);
    w.next().await; // hello
    assert_eq!(w.gate.step_completed(7), StepOutcome::Go); // training runs, nobody holds it
    w.send(
        op(4),
        DirectiveKind::Switch {
            targets: to_backup(),
            call_timeout: CALL_TIMEOUT,
        },
    );
    let ReplyBody::Failed(e) = w.reply(op(4), Phase::Switch).await else {
        panic!("the switch must be refused");
    };
    assert_eq!((e.group, e.hal), (None, None));
    assert!(
        e.message.contains("not held at the step gate"),
        "{}",
        e.message
    );
    w.hal.done();
}

#[actix_rt::test]
async fn a_stop_ends_the_held_training_loop_and_no_hal_call_is_made() {
    // Only the start-up question: a stop touches no NIC.
    let mut w = Harness::start([hal_capabilities()]);
    w.next().await; // hello
    let training = w.hold(op(6)).await;
    let reason = "the rollback of operation 6 failed; held 60s without an operator";
    w.stop_training(op(7), reason, training).await;
    // The operation's late resume opens nothing and the loop keeps being told to stop; a
    // new operation is refused.
    w.send(op(6), DirectiveKind::Resume);
    assert!(matches!(
        w.reply(op(6), Phase::Resume).await,
        ReplyBody::Resumed { .. }
    ));
    assert!(w.gate.step_completed(3).is_stop());
    w.send(op(8), DirectiveKind::Sample { targets: vec![] });
    let ReplyBody::Failed(e) = w.reply(op(8), Phase::Sample).await else {
        panic!("a stopped rank takes no new operation");
    };
    assert!(e.message.contains("training was stopped"), "{}", e.message);
    w.hal.done();
}

#[actix_rt::test]
async fn a_loop_that_stops_finishing_steps_is_reported_hung_once_and_again_when_it_steps() {
    let timeout = Duration::from_millis(40);
    let mut w = Harness::start_with([hal_capabilities()], |h| Box::new(h), Some(timeout));
    w.next().await; // hello
                    // The loop finishes step 1, then nothing: the watch says so once, with the step.
    assert_eq!(w.gate.step_completed(1), StepOutcome::Go);
    let WorkerToProxy::Stall(n) = w.next().await else {
        panic!("expected a stall notice");
    };
    assert_eq!((n.rank, n.last_step), (RANK, 1));
    assert!(n.stalled_for.is_some_and(|d| d >= timeout), "{n:?}");
    // A step again: said once, then the stall is over.
    assert_eq!(w.gate.step_completed(2), StepOutcome::Go);
    let WorkerToProxy::Stall(n) = w.next().await else {
        panic!("expected the notice that the loop steps again");
    };
    assert_eq!((n.last_step, n.stalled_for), (2, None));
    // (A hold at the gate is no stall: `hang_watch`'s unit tests.)
    w.hal.done();
}

/// The scripted HAL with `before_nic_set` run first in every NIC-set call (to block or panic
/// there), telling the test each call timeout it is given.
struct Interposed {
    script: ScriptedRankHal,
    before_nic_set: Box<dyn FnMut() + Send>,
    timeouts: std::sync::mpsc::Sender<Duration>,
}

impl RankHal for Interposed {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        self.script.groups()
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        (self.before_nic_set)();
        self.script.set_working_nic(group, ranks, use_backup)
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.script.capabilities()
    }

    fn set_call_timeout(&mut self, timeout: Duration) {
        let _ = self.timeouts.send(timeout);
    }
}

/// A switch of rank 1 alone in `tp_0`, the one call the scripts below expect.
fn switch_tp_0() -> DirectiveKind {
    DirectiveKind::Switch {
        targets: vec![(GlobalRank(0), NicSide::Backup)],
        call_timeout: Duration::from_millis(1_500),
    }
}

fn tp_0_only() -> Vec<GroupInfo> {
    vec![GroupInfo {
        name: "tp_0".into(),
        members: vec![GlobalRank(0), GlobalRank(1)],
    }]
}

#[actix_rt::test]
async fn a_hal_call_that_blocks_gets_the_directives_timeout_and_the_worker_still_answers() {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (entered, in_call) = std::sync::mpsc::channel::<()>();
    let (timeouts, told) = std::sync::mpsc::channel();
    let released = std::sync::Mutex::new(released);
    let mut w = Harness::start_on(
        [
            hal_capabilities(),
            Expect::groups(tp_0_only()),
            Expect::set_working_nic("tp_0", &[0], &[true]),
        ],
        move |script| {
            Box::new(Interposed {
                script,
                before_nic_set: Box::new(move || {
                    entered.send(()).unwrap();
                    released.lock().unwrap().recv().unwrap();
                }),
                timeouts,
            })
        },
    );
    w.next().await; // hello
    let training = w.hold(op(9)).await;
    w.send(op(9), switch_tp_0());
    // The HAL is in its call, blocked until the test lets it go.
    tokio::task::spawn_blocking(move || in_call.recv().unwrap())
        .await
        .unwrap();
    assert_eq!(told.try_recv(), Ok(Duration::from_millis(1_500)));
    // Meanwhile the worker answers: an operator stops training.
    w.stop_training(op(10), "rank 1 hangs in HCCL", training)
        .await;
    // The call returns late, and its answer still comes.
    release.send(()).unwrap();
    assert!(matches!(
        w.reply(op(9), Phase::Switch).await,
        ReplyBody::Applied { calls } if calls.len() == 1
    ));
    w.hal.done();
}

#[actix_rt::test]
async fn a_hal_that_panics_fails_its_call_and_every_later_one() {
    let (timeouts, _told) = std::sync::mpsc::channel();
    let mut w = Harness::start_on(
        [
            // The NIC-set call panics before it reaches the script.
            hal_capabilities(),
            Expect::groups(tp_0_only()),
        ],
        |script| {
            Box::new(Interposed {
                script,
                before_nic_set: Box::new(|| panic!("the communicator was freed")),
                timeouts,
            })
        },
    );
    w.next().await; // hello
    let training = w.hold(op(11)).await;
    w.send(op(11), switch_tp_0());
    let want =
        RankError::worker("the HAL panicked on thread taskd-hal-1: the communicator was freed");
    assert_eq!(
        w.next().await,
        WorkerToProxy::Reply(taskd_core::protocol::RankReply {
            rank: RANK,
            op: op(11),
            phase: Phase::Switch,
            body: ReplyBody::Failed(want.clone()),
        })
    );
    // The HAL is out of service: a verification fails the same way, without a call.
    w.send(op(12), DirectiveKind::Verify);
    let WorkerToProxy::Reply(r) = w.next().await else {
        panic!("expected the verification's reply");
    };
    assert_eq!(r.body, ReplyBody::Failed(want));
    w.resume(op(11), training).await;
    w.hal.done();
}
