//! The three roles as separate OS processes on loopback: `taskd manager`, one `taskd proxy`
//! per node, one `taskd worker --sim` per rank. Operations are submitted through the
//! manager's admin service; processes print their bound addresses and registrations on
//! stdout, which is what the tests wait for.

mod net_support;

use net_support::{fast_heartbeats, s, worker_args, Cluster, ClusterSpec, Proc, Scratch};
use taskd::actors::net::AdminError;
use taskd::actors::ProgressKind;
use taskd::core::operation::{JobState, OperationError, Outcome};
use taskd::core::protocol::Phase;
use taskd::core::GlobalRank;

fn ranks(v: &[u32]) -> Vec<GlobalRank> {
    v.iter().map(|r| GlobalRank(*r)).collect()
}

#[test]
fn switch_to_backup_and_back_across_processes() {
    let scratch = Scratch::new("net-switch");
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-switch",
            nodes: 2,
            ppn: 4,
            worker_flags: &|_| Vec::new(),
            manager_flags: s(&["--pause-timeout-ms", "20000"]),
            common: fast_heartbeats(),
            tls: None,
        },
    );

    // node-0:1 and node-1:2 (ranks 1 and 6) to their backup NIC, then back.
    let to_backup = c.command(&[(0, 1, true), (1, 2, true)]);
    let r =
        c.rt.block_on(c.admin.run(&to_backup))
            .expect("operation 1 runs");
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:#?}");
    assert!(r.applied && !r.rolled_back);
    assert!(r.pause_step.is_some());
    assert!(r.phases.switch.is_some() && r.phases.resume.is_some());
    let st = c.rt.block_on(c.admin.status(4)).unwrap();
    assert_eq!(st.ranks_on_backup, ranks(&[1, 6]));
    assert_eq!(st.state, JobState::Running);

    let back = c.command(&[(0, 1, false), (1, 2, false)]);
    let r = c.rt.block_on(c.admin.run(&back)).expect("operation 2 runs");
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:#?}");
    let st = c.rt.block_on(c.admin.status(4)).unwrap();
    assert!(st.ranks_on_backup.is_empty());
    assert_eq!(st.recent.len(), 2);
    assert_eq!(st.workers_registered, 8);
    assert_eq!(st.nodes_connected, 2);
    assert!(st.lost_ranks.is_empty());

    // A second process for a live rank is refused, with the reason.
    let mut dup = Proc::spawn(
        &scratch,
        "duplicate-worker",
        &[
            worker_args("net-switch", 0, &c.proxy_addrs[0]),
            fast_heartbeats(),
        ]
        .concat(),
    );
    assert_eq!(dup.wait_exit().code(), Some(2));
    assert!(
        dup.stderr()
            .contains("already registered by another live process"),
        "{}",
        dup.stderr_tail()
    );
    // So is a worker of another job, at once.
    let mut stranger = Proc::spawn(
        &scratch,
        "stranger-worker",
        &worker_args("other-job", 0, &c.proxy_addrs[0]),
    );
    assert_eq!(stranger.wait_exit().code(), Some(2));
    assert!(
        stranger
            .stderr()
            .contains("this proxy serves job \"net-switch\""),
        "{}",
        stranger.stderr_tail()
    );
    // And neither disturbed the job.
    let st = c.rt.block_on(c.admin.status(0)).unwrap();
    assert_eq!(st.workers_registered, 8);

    c.shutdown_cleanly();
}

#[test]
fn a_worker_killed_during_the_pause_fails_the_operation_and_is_reported_lost() {
    let scratch = Scratch::new("net-kill");
    const VICTIM: u32 = 3;
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-kill",
            nodes: 2,
            ppn: 2,
            // The victim steps once a second: the others run far ahead, so the pause step is
            // far beyond the victim's and it cannot hold before it is killed.
            worker_flags: &|r| {
                if r == VICTIM {
                    s(&["--step-ms", "1000"])
                } else {
                    Vec::new()
                }
            },
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let mut watch = c.rt.block_on(c.admin.watch_progress()).unwrap();
    let sub =
        c.rt.block_on(c.admin.submit(&c.command(&[(0, 0, true)])))
            .expect("admitted");
    // Wait until the manager sent the pause step: every rank sampled, the pause runs.
    loop {
        let ev = c.rt.block_on(watch.next()).expect("progress").unwrap();
        if let ProgressKind::PhaseStarted {
            phase: Phase::Pause,
            pause_step,
            ..
        } = ev.kind
        {
            assert!(pause_step.is_some());
            break;
        }
        assert!(ev.report().is_none(), "finished before the pause: {ev:?}");
    }
    c.workers[VICTIM as usize].as_mut().unwrap().kill();

    let r = c.rt.block_on(c.admin.wait(sub.id())).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:#?}");
    match &r.error {
        Some(OperationError::WorkerLost { rank, phase, .. }) => {
            assert_eq!((*rank, *phase), (GlobalRank(VICTIM), Phase::Pause))
        }
        other => panic!("expected the victim lost in the pause, got {other:?}"),
    }
    assert_eq!(r.lost_ranks, ranks(&[VICTIM]));
    assert!(!r.applied && !r.rolled_back, "nothing was switched");
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    let st = c.rt.block_on(c.admin.status(1)).unwrap();
    assert_eq!(st.state, JobState::NeedsRecovery);
    assert_eq!(st.workers_registered, 3);
    assert_eq!(st.lost_ranks.len(), 1, "{:?}", st.lost_ranks);
    assert_eq!(st.lost_ranks[0].rank, GlobalRank(VICTIM));
    assert!(
        st.lost_ranks[0].reason.contains("connection closed"),
        "{}",
        st.lost_ranks[0].reason
    );
    // The job refuses new switches until an operator recovered it.
    let refused = c.rt.block_on(c.admin.submit(&c.command(&[(0, 0, true)])));
    assert!(
        matches!(refused, Err(AdminError::Refused(_))),
        "{refused:?}"
    );

    // Process-level recovery restarts the rank: a new process registers in its place.
    let node = (VICTIM / c.ppn) as usize;
    let mut again = Proc::spawn(
        &scratch,
        "worker-3-restarted",
        &[
            worker_args("net-kill", VICTIM, &c.proxy_addrs[node]),
            fast_heartbeats(),
        ]
        .concat(),
    );
    again.wait_line("registered on");
    let st = c.rt.block_on(c.admin.await_registered(None)).unwrap();
    assert_eq!(st.workers_registered, 4);
    assert!(st.lost_ranks.is_empty(), "{:?}", st.lost_ranks);
    c.workers[VICTIM as usize] = Some(again);

    c.shutdown_cleanly();
}

#[test]
fn a_proxy_killed_during_the_pause_loses_its_node() {
    let scratch = Scratch::new("net-proxy-kill");
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-proxy-kill",
            nodes: 2,
            ppn: 2,
            // Rank 3 (node-1) is slow: the pause waits for it while node-1's proxy dies.
            worker_flags: &|r| {
                if r == 3 {
                    s(&["--step-ms", "1000"])
                } else {
                    Vec::new()
                }
            },
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let mut watch = c.rt.block_on(c.admin.watch_progress()).unwrap();
    let sub =
        c.rt.block_on(c.admin.submit(&c.command(&[(0, 0, true)])))
            .expect("admitted");
    loop {
        let ev = c.rt.block_on(watch.next()).expect("progress").unwrap();
        if matches!(
            ev.kind,
            ProgressKind::PhaseStarted {
                phase: Phase::Pause,
                ..
            }
        ) {
            break;
        }
        assert!(ev.report().is_none(), "finished before the pause: {ev:?}");
    }
    c.proxies[1].kill();
    let r = c.rt.block_on(c.admin.wait(sub.id())).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:#?}");
    assert!(
        matches!(
            r.error,
            Some(OperationError::WorkerLost {
                phase: Phase::Pause,
                ..
            })
        ),
        "{r:#?}"
    );
    assert_eq!(r.lost_ranks, ranks(&[2, 3]));
    assert_eq!(r.job_state, JobState::NeedsRecovery);
    let st = c.rt.block_on(c.admin.status(0)).unwrap();
    assert_eq!(st.nodes_connected, 1);
    let lost: Vec<GlobalRank> = st.lost_ranks.iter().map(|l| l.rank).collect();
    assert_eq!(lost, ranks(&[2, 3]));
    assert!(
        st.lost_ranks
            .iter()
            .all(|l| l.reason.contains("proxy of node-1")),
        "{:?}",
        st.lost_ranks
    );
    // The orphaned workers of node-1 keep retrying their proxy; stop them with the rest.
    c.shutdown_cleanly();
}

#[test]
fn ranks_that_disagree_on_their_groups_fail_the_digest_check() {
    let scratch = Scratch::new("net-digest");
    // Rank 3 believes tensor-parallel groups have 2 ranks, the others 4: a misconfigured job.
    // Each process applies its own plan; only the digests reveal the disagreement.
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-digest",
            nodes: 1,
            ppn: 4,
            worker_flags: &|r| {
                if r == 3 {
                    s(&["--sim-tp-size", "2"])
                } else {
                    Vec::new()
                }
            },
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    // The verification round after registration already finds tp_0 split (rank 3 reports a
    // group of 2): the job needs recovery and no switch is started on it.
    let status = c.rt.block_on(c.admin.status(0)).unwrap();
    assert_eq!(status.state, JobState::NeedsRecovery, "{status:#?}");
    let v = status.last_verification.expect("a verification ran");
    assert!(
        v.to_string().contains("tp_0") && v.to_string().contains("3 of 4 members"),
        "{v}"
    );
    let e =
        c.rt.block_on(c.admin.run(&c.command(&[(0, 0, true)])))
            .unwrap_err();
    assert!(e.to_string().contains("needs_recovery"), "{e}");
    c.shutdown_cleanly();
}

/// The network manager serves the operators' control API too: the same `taskd switch --wait`
/// and `taskd status` an operator uses against the simulator drive a job of processes.
#[test]
fn the_network_manager_serves_the_control_api_to_the_cli() {
    let scratch = Scratch::new("net-control");
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-control",
            nodes: 2,
            ppn: 2,
            worker_flags: &|_| Vec::new(),
            manager_flags: s(&["--control-addr", "127.0.0.1:0"]),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let line = c.manager.wait_line("control API on");
    let addr = line.rsplit(' ').next().unwrap().trim().to_owned();
    let taskd = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskd"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = taskd(&[
        "switch",
        "--addr",
        &addr,
        "--job",
        "net-control",
        "--node",
        "node-1",
        "--dev",
        "1",
        "--to",
        "backup",
        "--wait",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("SUCCEEDED"), "{out}");
    let (code, out, err) = taskd(&["status", "--addr", &addr, "--job", "net-control", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranks_on_backup"], serde_json::json!([3]));
    assert_eq!(v["workers_registered"], 4);
    c.shutdown_cleanly();
}
