//! Helpers the root integration tests share: the small simulated job most scenarios run,
//! commands for it, the invariant every scenario ends with, a bounded wait on the manager's
//! progress feed, and the `taskd` binary run as a user runs it. Each test file has `mod
//! common;`; helpers only one file needs stay in that file.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use taskd::actors::{LocalJob, LocalJobError, ProgressEvent, RecoveryResult};
use taskd::core::command::Target;
use taskd::core::ledger::{RecoverTo, StopBy, StopPhase};
use taskd::core::operation::JobState;
use taskd::core::HcclCode;
use taskd::core::SubmitError;
use taskd::core::{env, DeviceId, GlobalRank, JobId, NodeName, PhaseDeadlines, SwitchCommand};
use taskd::hal_mock::{Fabric, NicSetFault, RankExit};
use taskd::sim::{FinalState, SimConfig, Simulation};
use taskd_hal_ascend::testing::{self, StubInstall};
use tokio::sync::broadcast::{error::RecvError, Receiver};

/// A bound on every wait, so a broken build fails instead of hanging; never reached.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// 2 nodes x 4 devices (job `sim`), 1 ms steps.
pub(crate) fn small() -> SimConfig {
    SimConfig {
        nodes: 2,
        devices_per_node: 4,
        step_time: Duration::from_millis(1),
        steps_between: 2,
        ..SimConfig::default()
    }
}

/// A command for the simulator's job `sim`: `(node, device, use_backup)` per target.
pub(crate) fn cmd(targets: &[(&str, u32, bool)]) -> SwitchCommand {
    SwitchCommand {
        job: JobId("sim".into()),
        id: None,
        targets: targets
            .iter()
            .map(|(n, d, b)| Target {
                node: NodeName((*n).into()),
                device: DeviceId(*d),
                use_backup: *b,
            })
            .collect(),
    }
}

/// Global ranks from numbers.
pub(crate) fn ranks(v: &[u32]) -> Vec<GlobalRank> {
    v.iter().map(|r| GlobalRank(*r)).collect()
}

/// Returns once rank `r`'s gate is armed: a pause request reached its worker. It spins (a
/// rank's gate has no notification to wait on), failing the test after 2^32 looks.
pub(crate) fn await_armed(job: &LocalJob, r: u32) {
    let gate = job.gate(GlobalRank(r));
    let mut spins = 0u64;
    while !gate.is_armed() {
        spins += 1;
        assert!(spins < 1 << 32, "the sample request never reached rank {r}");
        std::thread::yield_now();
    }
}

/// `recover` as a patient operator runs it: while ranks are still inside an earlier
/// operation's NIC-set calls the manager refuses (`InCalls`); ask again once they answered.
pub(crate) fn recover_when_calls_answered(sim: &Simulation, to: RecoverTo) -> RecoveryResult {
    match sim.job().recover(to) {
        Err(LocalJobError::Refused(SubmitError::InCalls { .. })) => {
            sim.job()
                .wait_calls_answered(WAIT)
                .expect("the late calls end");
            sim.job().recover(to).expect("the recovery runs")
        }
        other => other.expect("the recovery runs"),
    }
}

/// The same deadline for every phase of an operation.
pub(crate) fn deadlines(each: Duration) -> PhaseDeadlines {
    PhaseDeadlines {
        pause: each,
        switch: each,
        rollback: each,
        resume: each,
    }
}

/// The invariant every scenario ends with: every communication group agrees on its NIC
/// configuration, training never ran a collective on a group that disagreed, the manager's
/// NIC table matches the fabric and the control plane broke none of HCCL's rules.
pub(crate) fn assert_consistent_end(end: &FinalState) {
    assert!(
        end.groups_consistent,
        "groups disagree: {}",
        end.consistency
    );
    assert_eq!(end.collectives_on_inconsistent_groups, 0);
    assert_eq!(end.ranks_on_backup, end.manager_on_backup);
    assert!(end.violations.is_empty(), "{:?}", end.violations);
}

/// Submits `c` and returns, with the operation's id, once the manager started `phase` of it.
pub(crate) fn submit_until(
    sim: &Simulation,
    c: SwitchCommand,
    phase: taskd::core::protocol::Phase,
) -> taskd::core::OperationId {
    use taskd::actors::ProgressKind;
    let mut events = sim.job().subscribe_progress();
    let id = sim.job().submit(c).expect("admitted").id();
    await_progress(&mut events, "phase start", |ev| match &ev.kind {
        ProgressKind::PhaseStarted { phase: p, .. } if ev.op == id && *p == phase => Some(()),
        ProgressKind::Finished(r) if ev.op == id => panic!("finished before {phase}: {r}"),
        _ => None,
    });
    id
}

/// Reads the manager's progress feed until `f` finds what it looks for and returns it; fails
/// the test, naming `what`, if the feed closes or nothing is found within [`WAIT`]. Events a
/// slow reader lost are skipped (the feed never loses a final report).
pub(crate) fn await_progress<T>(
    rx: &mut Receiver<ProgressEvent>,
    what: &str,
    mut f: impl FnMut(&ProgressEvent) -> Option<T>,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for the wait");
    let read = async {
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    if let Some(t) = f(&ev) {
                        return t;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("the progress feed closed before {what}"),
            }
        }
    };
    rt.block_on(async { tokio::time::timeout(WAIT, read).await })
        .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
}

/// The variables the roles read, removed so the machine's environment cannot change a result.
pub(crate) const ROLE_ENV: [&str; 10] = [
    env::MINDX_TASK_ID,
    env::MS_SCHED_HOST,
    env::POD_IP,
    env::MS_NODE_RANK,
    env::RANK,
    env::LOCAL_WORLD_SIZE,
    env::TASKD_CONTROL_TOKEN,
    env::TASKD_LOG_FORMAT,
    env::MINDX_SERVER_IP,
    env::LOCAL_PROXY_ENABLE,
];

/// `taskd ARGS` with the job environment of [`ROLE_ENV`] removed, to spawn or run.
pub(crate) fn taskd_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_taskd"));
    c.args(args);
    for v in ROLE_ENV {
        c.env_remove(v);
    }
    c
}

/// Runs `taskd ARGS` to its end: its exit code (-1 for a signal), stdout and stderr.
pub(crate) fn taskd(args: &[&str]) -> (i32, String, String) {
    let out = taskd_command(args).output().expect("taskd runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stdout lines of a child process, read on a thread of their own.
pub(crate) fn lines_of(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// `taskd proxy` for node 0 of `job`, with simulated link health, connected to the manager at
/// `manager` and listening on port 0.
pub(crate) fn proxy_args<'a>(job: &'a str, manager: &'a str) -> [&'a str; 11] {
    [
        "proxy",
        "--job-id",
        job,
        "--node-rank",
        "0",
        "--manager",
        manager,
        "--listen",
        "127.0.0.1:0",
        "--node-hal",
        "sim",
    ]
}

/// `taskd manager` for `job` on one node of `ppn` ranks, listening on port 0.
pub(crate) fn manager_args<'a>(job: &'a str, ppn: &'a str) -> [&'a str; 9] {
    [
        "manager",
        "--job-id",
        job,
        "--nodes",
        "1",
        "--procs-per-node",
        ppn,
        "--listen",
        "127.0.0.1:0",
    ]
}

/// An environment as the doctor and the hardware rig read it: variable name to value.
pub(crate) type EnvMap = HashMap<String, OsString>;

/// `m` as the environment's lookup function.
pub(crate) fn lookup(m: &EnvMap) -> impl Fn(&str) -> Option<OsString> + '_ {
    move |k| m.get(k).cloned()
}

/// A directory of its own (not created yet) for one test, under `area` in the target's
/// scratch directory.
pub(crate) fn fresh_dir(area: &str, test: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(area)
        .join(format!(
            "{}-{test}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The stub vendor libraries, installed in a [`fresh_dir`].
pub(crate) fn stub_install(area: &str, test: &str) -> StubInstall {
    testing::install(&fresh_dir(area, test)).unwrap_or_else(|e| panic!("{e}"))
}

/// The stubs' paths and the reference deployment's HCCL retry and MindSpore fault-tolerance
/// flags.
pub(crate) fn stub_env(stubs: &StubInstall) -> EnvMap {
    let mut m: EnvMap = stubs
        .overrides()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_os_string()))
        .collect();
    m.insert("HCCL_OP_RETRY_ENABLE".into(), "L0:0, L1:1, L2:1".into());
    m.insert("MS_ENABLE_TFT".into(), "{TTP:1,TSP:1}".into());
    m
}

/// Rank 1 makes two NIC-set calls per switch of the small job (tp_0, world): its first call
/// fails, and so does the second call of its rollback, so the world group is left split and
/// the job `paused`, every rank held.
pub(crate) fn fail_rank_1s_switch_and_rollback(f: &Fabric) {
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Fail(HcclCode::Network));
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::ZERO));
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::ZERO));
    f.inject_nic_set_fault(GlobalRank(1), NicSetFault::Fail(HcclCode::Network));
}

/// After a stop of training by `by` and the launcher's restart: the job runs, verified,
/// every rank on its default NIC, and the stop is remembered as over.
pub(crate) fn assert_running_again(sim: &Simulation, by: StopBy) {
    let s = sim.job().status(1).unwrap();
    assert_eq!(s.state, JobState::Running, "{s:?}");
    assert!(s.verified && s.ranks_on_backup.is_empty(), "{s:?}");
    assert!(s.training_stop.is_none(), "{s:?}");
    let last = s.last_training_stop.expect("the stop is remembered");
    assert_eq!((last.by, last.phase()), (by, StopPhase::Restarted));
}

/// The simulated launcher restarts every process after a stop of training by `by` that may
/// have found ranks a step apart (a rank stopped after its step, or one whose peer's process
/// exited while it waited in the next step's collective); then the job runs again.
pub(crate) fn restart_after_stop(sim: &mut Simulation, by: StopBy) {
    let exits = sim.restart_processes().unwrap();
    assert!(
        exits
            .iter()
            .all(|e| matches!(e, RankExit::TrainingStopped | RankExit::PeerLost)),
        "{exits:?}"
    );
    assert!(exits.contains(&RankExit::TrainingStopped), "{exits:?}");
    assert_running_again(sim, by);
}

/// `job`'s status once `until` holds (the manager handles what it was sent in order; a status
/// asked for after it answers after it), at most [`WAIT`].
pub(crate) fn status_until(
    job: &LocalJob,
    until: impl Fn(&taskd::actors::manager::ManagerStatus) -> bool,
) -> taskd::actors::manager::ManagerStatus {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = job.status(0).unwrap();
        if until(&s) {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "never: {s:?}");
        std::thread::park_timeout(Duration::from_millis(2));
    }
}
