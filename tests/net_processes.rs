//! The three roles as separate OS processes on loopback: `taskd manager`, one `taskd proxy`
//! per node, one `taskd worker --sim` per rank. Operations are submitted through the
//! manager's control API (`Control`, on port 0 next to its transport port); processes print
//! their bound addresses and registrations on stdout, which is what the tests wait for.

mod common;
mod net_support;

use common::taskd;
use net_support::{fast_heartbeats, s, worker_args, Cluster, ClusterSpec, Proc, Scratch};
use taskd::actors::control::proto::RefusalKind;
use taskd::actors::control::{codes, ClientError};

/// A rank stepping once a second, far behind the others' 2 ms.
const SLOW_STEP: &[&str] = &["--step-ms", "1000"];

/// A job of `nodes` x `ppn` processes with fast heartbeats; `odd` gives one rank flags of its
/// own (a slower step, another group size) and `manager` adds flags to the manager's.
fn start(
    scratch: &Scratch,
    job: &str,
    nodes: u32,
    ppn: u32,
    odd: Option<(u32, &[&str])>,
    manager: &[&str],
) -> Cluster {
    let worker_flags = move |r: u32| match odd {
        Some((rank, flags)) if rank == r => s(flags),
        _ => Vec::new(),
    };
    Cluster::start(
        scratch,
        ClusterSpec {
            job,
            nodes,
            ppn,
            worker_flags: &worker_flags,
            manager_flags: s(manager),
            common: fast_heartbeats(),
            tls: None,
        },
    )
}

#[test]
fn switch_to_backup_and_back_across_processes() {
    let scratch = Scratch::new("net-switch");
    let mut c = start(
        &scratch,
        "net-switch",
        2,
        4,
        None,
        &["--pause-timeout-ms", "20000"],
    );

    // node-0:1 and node-1:2 (ranks 1 and 6) to their backup NIC, then back.
    let to_backup = c.command(&[(0, 1, true), (1, 2, true)]);
    let r = c.run(&to_backup).expect("operation 1 runs");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    assert!(r.applied && !r.rolled_back);
    assert!(r.pause_step.is_some());
    assert!(r.phases_ms.switch.is_some() && r.phases_ms.resume.is_some());
    let st = c.status(4);
    assert_eq!(st.ranks_on_backup, [1, 6]);
    assert_eq!(st.state, "running");

    let back = c.command(&[(0, 1, false), (1, 2, false)]);
    let r = c.run(&back).expect("operation 2 runs");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    let st = c.status(4);
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
    // And a second proxy for a live node; said at its first refusal (a warning), before it
    // gives up after twice the loss time in case the other one was its own predecessor.
    let mut dup_proxy = Proc::spawn(
        &scratch,
        "duplicate-proxy",
        &[
            s(&[
                "proxy",
                "--job-id",
                "net-switch",
                "--node-rank",
                "0",
                "--manager",
                &c.manager_addr,
                "--listen",
                "127.0.0.1:0",
                "--sim",
            ]),
            fast_heartbeats(),
        ]
        .concat(),
    );
    assert_eq!(dup_proxy.wait_exit().code(), Some(2));
    let log = dup_proxy.stderr();
    let first = log
        .lines()
        .position(|l| l.contains("WARN") && l.contains("registration refused as a duplicate"))
        .unwrap_or_else(|| panic!("no warning at the first refusal:\n{log}"));
    let attempts_before = log
        .lines()
        .take(first)
        .filter(|l| l.contains("retrying"))
        .count();
    assert_eq!(attempts_before, 0, "said at the first refusal:\n{log}");
    assert!(
        log.contains("already registered by another live process"),
        "{log}"
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
    let st = c.status(0);
    assert_eq!(st.workers_registered, 8);

    c.shutdown_cleanly();
}

/// A killed worker's proxy, on the same host, watches the process once its connection closes
/// and declares it lost when the process has ended, not after the reconnect window: a restart
/// by the launcher does not leave the old process's rank registered for seconds.
#[test]
fn a_killed_worker_is_lost_when_its_process_ends_not_after_the_reconnect_window() {
    let scratch = Scratch::new("net-ended");
    const VICTIM: u32 = 1;
    let slow = move |r: u32| {
        if r == VICTIM {
            s(SLOW_STEP)
        } else {
            Vec::new()
        }
    };
    // Two-second heartbeats, lost after 60 of them: a two-minute reconnect window.
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-ended",
            nodes: 1,
            ppn: 2,
            worker_flags: &slow,
            manager_flags: s(&["--pause-timeout-ms", "600000"]),
            common: s(&["--heartbeat-ms", "2000", "--missed-heartbeats", "60"]),
            tls: None,
        },
    );
    let mut op = c.submit(&c.command(&[(0, 0, true)])).expect("admitted");
    assert!(c.until_phase(&mut op, "pause").is_some());
    let victim = c.workers[VICTIM as usize].as_mut().unwrap();
    let pid = victim.pid();
    victim.kill();
    let r = c.result(op);
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(&format!("rank {VICTIM} was lost during pause: "))
            && error.ends_with(&format!("and its process (pid {pid}) ended")),
        "expected the victim lost when its process ended, got {error:?}"
    );
    assert_eq!(r.lost_ranks, [VICTIM]);
    c.shutdown_cleanly();
}

#[test]
fn a_worker_killed_during_the_pause_fails_the_operation_and_is_reported_lost() {
    let scratch = Scratch::new("net-kill");
    const VICTIM: u32 = 3;
    // The victim steps once a second: the others run far ahead, so the pause step is
    // far beyond the victim's and it cannot hold before it is killed.
    let mut c = start(&scratch, "net-kill", 2, 2, Some((VICTIM, SLOW_STEP)), &[]);
    let cmd = c.command(&[(0, 0, true)]);
    let mut op = c.submit(&cmd).expect("admitted");
    // Wait until the manager sent the pause step: every rank sampled, the pause runs.
    let pause_step = c.until_phase(&mut op, "pause");
    assert!(pause_step.is_some());
    c.workers[VICTIM as usize].as_mut().unwrap().kill();

    let r = c.result(op);
    assert_eq!(r.result, "failed", "{r:#?}");
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(&format!("rank {VICTIM} was lost during pause: ")),
        "expected the victim lost in the pause, got {error:?}"
    );
    assert_eq!(r.lost_ranks, [VICTIM]);
    assert!(!r.applied && !r.rolled_back, "nothing was switched");
    assert_eq!(r.job_state, "needs_recovery");
    let st = c.status(1);
    assert_eq!(st.state, "needs_recovery");
    assert_eq!(st.workers_registered, 3);
    assert_eq!(st.lost_ranks.len(), 1, "{:?}", st.lost_ranks);
    assert_eq!(st.lost_ranks[0].rank, VICTIM);
    assert!(
        st.lost_ranks[0].reason.contains("connection closed"),
        "{}",
        st.lost_ranks[0].reason
    );
    // `taskd status` names the lost rank and why.
    let status = |args: &[&str]| {
        let base = ["status", "--addr", &c.control_addr, "--job", "net-kill"];
        let (code, out, err) = taskd(&[&base[..], args].concat());
        assert_eq!(code, 0, "{out}{err}");
        out
    };
    let text = status(&[]);
    let lost = text
        .lines()
        .find(|l| l.starts_with("lost "))
        .unwrap_or_else(|| panic!("no lost line in\n{text}"));
    assert!(
        lost.contains(&format!("rank {VICTIM}: ")) && lost.contains("connection closed"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
    assert_eq!(v["state"], "needs_recovery");
    assert_eq!(v["lost_ranks"][0]["rank"], VICTIM);
    // The job refuses new switches until the lost rank is back and verified.
    let refused = c.submit(&cmd).map(|op| op.uuid);
    assert!(
        matches!(
            refused,
            Err(ClientError::Refused {
                code: codes::JOB_NOT_REGISTERED,
                kind: RefusalKind::WorkersMissing,
                ..
            })
        ),
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
    let st = c.wait_registered();
    assert_eq!(st.workers_registered, 4);
    assert!(st.lost_ranks.is_empty(), "{:?}", st.lost_ranks);
    // Nothing was switched: the verification after its return finds every group agreeing and
    // the job runs again by itself (the recovery contract).
    assert!(st.verified);
    assert_eq!(st.state, "running", "{st:#?}");
    c.workers[VICTIM as usize] = Some(again);

    c.shutdown_cleanly();
}

#[test]
fn a_manager_stopped_during_the_pause_resumes_every_rank_before_it_exits() {
    let scratch = Scratch::new("net-drain");
    const SLOW: u32 = 3;
    // The slow rank keeps the pause waiting long enough for the signal to land in it.
    let mut c = start(&scratch, "net-drain", 2, 2, Some((SLOW, SLOW_STEP)), &[]);
    let cmd = c.command(&[(0, 0, true)]);
    let mut op = c.submit(&cmd).expect("admitted");
    c.until_phase(&mut op, "pause");
    c.manager.term();
    // The operation ends safely before the manager goes: nothing was switched, every gate
    // opened, one result.
    let r = c.result(op);
    assert_eq!(r.result, "failed", "{r:#?}");
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("aborted during pause: SIGTERM"),
        "{error}"
    );
    assert!(!r.applied && !r.rolled_back);
    assert_eq!(r.job_state, "running");
    let st = c.manager.wait_exit();
    assert!(st.success(), "{st}: {}", c.manager.stderr_tail());
    assert!(
        c.manager.stderr().contains("ended before stopping"),
        "{}",
        c.manager.stderr_tail()
    );
    c.shutdown_cleanly();
}

#[test]
fn a_proxy_killed_during_the_pause_loses_its_node() {
    let scratch = Scratch::new("net-proxy-kill");
    // Rank 3 (node-1) is slow: the pause waits for it while node-1's proxy dies.
    let mut c = start(&scratch, "net-proxy-kill", 2, 2, Some((3, SLOW_STEP)), &[]);
    let mut op = c.submit(&c.command(&[(0, 0, true)])).expect("admitted");
    c.until_phase(&mut op, "pause");
    c.proxies[1].kill();
    let r = c.result(op);
    assert_eq!(r.result, "failed", "{r:#?}");
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("rank ") && error.contains(" was lost during pause: "),
        "{r:#?}"
    );
    assert_eq!(r.lost_ranks, [2, 3]);
    assert_eq!(r.job_state, "needs_recovery");
    let st = c.status(0);
    assert_eq!(st.nodes_connected, 1);
    let lost: Vec<u32> = st.lost_ranks.iter().map(|l| l.rank).collect();
    assert_eq!(lost, [2, 3]);
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
    let mut c = start(
        &scratch,
        "net-digest",
        1,
        4,
        Some((3, &["--sim-tp-size", "2"])),
        &[],
    );
    // The verification round after registration already finds tp_0 split (rank 3 reports a
    // group of 2): the job needs recovery and no switch is started on it.
    let status = c.status(0);
    assert_eq!(status.state, "needs_recovery", "{status:#?}");
    let v = status.last_verification.expect("a verification ran");
    assert!(
        v.summary.contains("tp_0") && v.summary.contains("3 of 4 members"),
        "{v:?}"
    );
    assert_eq!(v.disagreements[0].group, "tp_0");
    let e = c.run(&c.command(&[(0, 0, true)])).unwrap_err();
    assert!(e.to_string().contains("needs_recovery"), "{e}");
    c.shutdown_cleanly();
}

/// The network manager serves the operators' control API too: the same `taskd switch --wait`
/// and `taskd status` an operator uses against the simulator drive a job of processes.
#[test]
fn the_network_manager_serves_the_control_api_to_the_cli() {
    let scratch = Scratch::new("net-control");
    // Five calls from this address, no refill: the client's wait for registrations,
    // one switch, two status calls; the fifth is refused.
    let c = start(
        &scratch,
        "net-control",
        2,
        2,
        None,
        &[
            "--control-rate-burst",
            "4",
            "--control-rate-per-sec",
            "0.0001",
        ],
    );
    let addr = c.control_addr.clone();
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
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("SUCCEEDED"), "{out}");
    let (code, out, err) = taskd(&["status", "--addr", &addr, "--job", "net-control", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranks_on_backup"], serde_json::json!([3]));
    assert_eq!(v["workers_registered"], 4);
    let (code, out, err) = taskd(&["status", "--addr", &addr, "--job", "net-control"]);
    assert_eq!(code, 0, "{out}\n{err}");
    // The manager's --control-rate-* flags: past the burst, the control port refuses (exit 3).
    let (code, _, err) = taskd(&["status", "--addr", &addr, "--job", "net-control"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("rate limit"), "{err}");
    c.shutdown_cleanly();
}

/// A manager killed (`kill -9`) and started again with the same `--state-dir` answers a
/// repeated uuid with the earlier result (nothing runs again) and still refuses the uuid for
/// another request: its journal of finished operations outlives the process.
#[test]
fn a_restarted_manager_with_a_state_dir_answers_a_repeated_uuid_with_the_earlier_result() {
    let scratch = Scratch::new("net-state-dir");
    let state = scratch.path("state");
    let state_dir = state.display().to_string();
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-state-dir",
            nodes: 2,
            ppn: 2,
            worker_flags: &|_| Vec::new(),
            manager_flags: s(&["--state-dir", &state_dir]),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let mut cmd = c.command(&[(1, 1, true)]);
    cmd.id = Some(taskd::core::OperationId(uuid::Uuid::new_v4()));
    let first = c.run(&cmd).expect("the operation runs");
    assert_eq!(first.result, "succeeded", "{first:#?}");

    c.manager.kill();
    // The same transport address, so the proxies find the new manager; a new control port.
    c.restart_manager(&scratch, &s(&["--state-dir", &state_dir]));
    let st = c.wait_registered();
    assert_eq!(st.ranks_on_backup, [3], "rebuilt from the ranks: {st:#?}");

    let again = c.submit(&cmd).expect("answered");
    assert!(again.known, "the uuid ran before the restart");
    assert_eq!(again.uuid, first.uuid);
    let earlier = c.rt.block_on(again.result()).expect("the earlier result");
    assert_eq!(earlier.result, first.result);
    assert_eq!(earlier.pause_step, first.pause_step, "the same operation");
    assert!(
        c.status(4).recent.is_empty(),
        "nothing ran on the new manager"
    );
    let mut reused = c.command(&[(1, 1, false)]);
    reused.id = cmd.id;
    let refused = c.submit(&reused).map(|op| op.uuid);
    assert!(
        matches!(
            refused,
            Err(ClientError::Refused {
                kind: RefusalKind::IdReused,
                ..
            })
        ),
        "{refused:?}"
    );
    c.shutdown_cleanly();
}

/// A node waiting on one slow rank says which: the replies of its other ranks reach the
/// manager without waiting for the slow one, so the manager's count goes down during the
/// phase and its status names the slow rank alone, not every rank of the node.
#[test]
fn a_slow_rank_is_the_only_one_its_node_still_waits_for() {
    use taskd::actors::control::Progress;
    const SLOW: u32 = 1;
    let scratch = Scratch::new("net-pending");
    let mut c = start(&scratch, "net-pending", 1, 3, Some((SLOW, SLOW_STEP)), &[]);
    let cmd = c.command(&[(0, 0, true)]);
    let mut op = c.submit(&cmd).expect("admitted");
    c.until_phase(&mut op, "pause");
    loop {
        match c.rt.block_on(op.next()).expect("progress") {
            Progress::Phase(p) if p.phase == "pause" && p.kind == "waiting" && p.waiting == 1 => {
                break
            }
            Progress::Phase(p) if p.phase == "pause" && p.kind == "finished" => {
                panic!("the pause ended without its count going down to the slow rank: {p:?}")
            }
            Progress::Phase(_) => continue,
            Progress::Finished(r) => panic!("finished first: {r:?}"),
        }
    }
    let st = c.status(0);
    // Unless the slow rank answered meanwhile, the pause waits for it alone.
    if let Some(f) = st.in_flight.filter(|f| f.phase == "pause") {
        assert_eq!(f.pending_ranks, [SLOW], "only the slow rank");
    }
    let r = c.result(op);
    assert_eq!(r.result, "succeeded", "{r:#?}");
    let st = c.status(0);
    assert_eq!(st.ranks_on_backup, [0]);
    assert!(st.verified, "{st:#?}");
    c.shutdown_cleanly();
}

/// A proxy whose rank table puts the node's ranks on other devices than the manager's (the
/// same ranks, so the manager's check of the ranks passes) exits 2 after registering, naming
/// the first rank whose device differs: it would probe and switch the wrong dies.
#[test]
fn a_proxy_whose_rank_table_maps_devices_differently_is_refused() {
    let scratch = Scratch::new("net-table-devices");
    let table = |name: &str, devices: [u32; 2]| {
        let p = scratch.path(name);
        let text = format!(
            r#"{{"server_list": [{{"server_id": "a", "device": [
                {{"device_id": {}, "rank_id": 0}}, {{"device_id": {}, "rank_id": 1}}]}}]}}"#,
            devices[0], devices[1]
        );
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (mine, other) = (table("manager.json", [0, 1]), table("proxy.json", [1, 0]));
    let mut manager = Proc::spawn(
        &scratch,
        "manager",
        &s(&[
            "manager",
            "--job-id",
            "devices",
            "--rank-table",
            &mine,
            "--listen",
            "127.0.0.1:0",
        ]),
    );
    let addr = manager.listening_addr();
    let mut proxy = Proc::spawn(
        &scratch,
        "proxy",
        &s(&[
            "proxy",
            "--job-id",
            "devices",
            "--node-rank",
            "0",
            "--manager",
            &addr,
            "--listen",
            "127.0.0.1:0",
            "--sim",
            "--rank-table",
            &other,
        ]),
    );
    assert_eq!(proxy.wait_exit().code(), Some(2), "{}", proxy.stderr_tail());
    let err = proxy.stderr();
    assert!(
        err.contains("puts rank 0 on device 0 of a, this proxy's --rank-table on device 1"),
        "{err}"
    );
    manager.term();
    assert!(manager.wait_exit().success(), "{}", manager.stderr_tail());
}
