//! Stopping training across processes: `taskd recover --stop-training` stops every `taskd
//! worker --sim` process (each exits 1, for its launcher to restart it, with the reason on
//! stderr), `taskd status` says the job is restarting and which ranks are not back, and once
//! the launcher's new processes registered the job runs again on their default NICs.

mod common;
mod net_support;

use common::taskd;
use net_support::{fast_heartbeats, Cluster, ClusterSpec, Scratch};

#[test]
fn stopped_workers_exit_for_their_launcher_and_the_restarted_job_runs() {
    let scratch = Scratch::new("net-stop");
    let no_flags = |_: u32| Vec::new();
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-stop",
            nodes: 2,
            ppn: 2,
            worker_flags: &no_flags,
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    // Something is on a backup NIC before the stop: the new processes must not inherit it.
    let r = c.run(&c.command(&[(1, 0, true)])).expect("switched");
    assert_eq!(r.result, "succeeded", "{r:#?}");

    let reason = "the NICs of node-1 are being replaced";
    let base = ["recover", "--addr", &c.control_addr, "--job", "net-stop"];
    let (code, out, err) = taskd(&[&base[..], &["--stop-training", "--reason", reason]].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("training stopped ("), "{out}");
    assert!(out.contains(reason), "{out}");
    c.wait_workers_stopped(reason);
    // Every old process is gone; the launcher has not started the new ones yet.
    let (code, text, err) = taskd(&["status", "--addr", &c.control_addr, "--job", "net-stop"]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(
        text.contains("state      restarting (training stopped by operator)"),
        "{text}"
    );
    assert!(text.contains("are not back yet"), "{text}");
    let st = c.status(0);
    assert_eq!(st.training_stop.map(|t| t.not_back), Some(vec![0, 1, 2, 3]));

    // The launcher restarts them: new incarnations, on their default NIC.
    let st = c.restart_workers(&scratch);
    assert_eq!(st.state, "running", "{st:#?}");
    assert!(st.verified && st.ranks_on_backup.is_empty(), "{st:#?}");
    assert!(st.training_stop.is_none());
    assert_eq!(
        st.last_training_stop.map(|t| t.phase).as_deref(),
        Some("restarted")
    );
    let r = c.run(&c.command(&[(0, 0, true)])).expect("switched");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    c.shutdown_cleanly();
}

/// A stop of training while node-1's proxy is cut off from the manager: node 0's processes stop
/// and the launcher restarts them; node 1's old processes never got the stop and train on. When
/// the link heals, its proxy introduces them again: they are old incarnations, so the stop is
/// sent to them again (they exit) and they never count as back; the job runs only once node 1's
/// new processes registered.
#[test]
fn a_stop_that_a_cut_off_node_missed_reaches_its_old_processes_when_the_link_heals() {
    use taskd::chaos::relay::{FaultRelay, LinkMode};
    let scratch = Scratch::new("net-stop-cut");
    let no_flags = |_: u32| Vec::new();
    let relay = std::cell::OnceCell::new();
    let via = |k: u32, manager: &str| {
        if k != 1 {
            return manager.to_owned();
        }
        let r = relay.get_or_init(|| FaultRelay::start(manager.parse().unwrap()).unwrap());
        r.addr().to_string()
    };
    let mut c = Cluster::start_via(
        &scratch,
        ClusterSpec {
            job: "net-stop-cut",
            nodes: 2,
            ppn: 2,
            worker_flags: &no_flags,
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
        &via,
    );
    let relay = relay.get().expect("node 1's relay");
    relay.set(LinkMode::Cut);
    let st = c.wait_status("node 1 unreachable", |s| s.state == "degraded");
    let unreachable: Vec<(u32, &str)> = st
        .lost_ranks
        .iter()
        .map(|l| (l.rank, l.how.as_str()))
        .collect();
    assert_eq!(unreachable, [(2, "unreachable"), (3, "unreachable")]);

    let reason = "node-1's switch is being replaced";
    let base = [
        "recover",
        "--addr",
        &c.control_addr,
        "--job",
        "net-stop-cut",
    ];
    let (code, out, err) = taskd(&[&base[..], &["--stop-training", "--reason", reason]].concat());
    assert_eq!(code, 0, "{out}{err}");
    for r in [0, 1] {
        let w = c.workers[r].as_mut().unwrap();
        assert_eq!(w.wait_exit().code(), Some(1), "{}", w.stderr_tail());
    }
    for r in [2, 3] {
        assert!(
            c.workers[r].as_mut().unwrap().running(),
            "rank {r} never got the stop"
        );
    }
    // Node 0's launcher restarts its ranks; the stop still waits for node 1's, unreachable.
    for r in [0, 1] {
        let args = [
            net_support::worker_args("net-stop-cut", r, &c.proxy_addrs[0]),
            c.common.clone(),
        ]
        .concat();
        let mut again = net_support::Proc::spawn(&scratch, &format!("worker-{r}-new"), &args);
        again.wait_line("registered on");
        c.workers[r as usize] = Some(again);
    }
    let st = c.wait_status("node 0 back", |s| {
        s.training_stop
            .as_ref()
            .is_some_and(|t| t.not_back == [2, 3])
    });
    let stop = st.training_stop.expect("under way");
    assert_eq!(stop.unreachable, [2, 3], "{stop:#?}");
    assert!(stop.waiting_for.contains("unreachable"), "{stop:#?}");

    // The link heals: node 1's old processes come back and are stopped again, not counted.
    relay.set(LinkMode::Pass);
    for r in [2, 3] {
        let w = c.workers[r].as_mut().unwrap();
        assert_eq!(w.wait_exit().code(), Some(1), "{}", w.stderr_tail());
        assert!(w.stderr().contains(reason), "{}", w.stderr_tail());
    }
    let st = c.status(0);
    assert_ne!(st.state, "running", "{st:#?}");
    let stop = st
        .training_stop
        .expect("still under way: node 1 is not back");
    assert_eq!(stop.not_back, [2, 3], "{stop:#?}");
    for r in [2, 3] {
        let args = [
            net_support::worker_args("net-stop-cut", r, &c.proxy_addrs[1]),
            c.common.clone(),
        ]
        .concat();
        let mut again = net_support::Proc::spawn(&scratch, &format!("worker-{r}-new"), &args);
        again.wait_line("registered on");
        c.workers[r as usize] = Some(again);
    }
    let st = c.wait_status("the job running again", |s| {
        s.state == "running" && s.verified && s.training_stop.is_none()
    });
    assert_eq!(
        st.last_training_stop.map(|t| t.phase).as_deref(),
        Some("restarted")
    );
    let r = c.run(&c.command(&[(1, 0, true)])).expect("switched");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    c.shutdown_cleanly();
}

/// A node's proxy killed between operations: its workers train on (nothing held them), so the
/// job is `degraded`, not held: no hold bound runs, however short. The proxy comes back, its
/// workers (the same processes) introduce themselves again, and the job runs.
#[test]
fn a_proxy_killed_between_operations_degrades_the_job_without_stopping_it() {
    let scratch = Scratch::new("net-proxy-down");
    let no_flags = |_: u32| Vec::new();
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-proxy-down",
            nodes: 2,
            ppn: 2,
            worker_flags: &no_flags,
            manager_flags: net_support::s(&["--hold-bound-ms", "500"]),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    c.proxies[1].kill();
    let st = c.wait_status("node 1 unreachable", |s| s.state == "degraded");
    assert!(st.hold.is_none(), "degraded is no hold: {st:#?}");
    let (code, text, err) = taskd(&[
        "status",
        "--addr",
        &c.control_addr,
        "--job",
        "net-proxy-down",
    ]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(text.contains("state      degraded"), "{text}");
    assert!(
        text.contains("(unreachable: it may be training on)"),
        "{text}"
    );
    // A switch needs every rank: refused while node 1 is away.
    assert!(c.run(&c.command(&[(0, 0, true)])).is_err());

    // The proxy comes back on its port; its workers reconnect and the job runs.
    let args = net_support::s(&[
        "proxy",
        "--job-id",
        "net-proxy-down",
        "--node-rank",
        "1",
        "--manager",
        &c.manager_addr.clone(),
        "--listen",
        &c.proxy_addrs[1].clone(),
        "--sim",
    ]);
    let args = [args, c.common.clone()].concat();
    let mut p = net_support::Proc::spawn(&scratch, "proxy-1-again", &args);
    p.wait_line("registered as node-1");
    c.proxies[1] = p;
    let st = c.wait_status("the job running again", |s| {
        s.state == "running" && s.verified && s.workers_registered == 4
    });
    assert!(
        st.training_stop.is_none() && st.last_training_stop.is_none(),
        "{st:#?}"
    );
    for (r, w) in c.workers.iter_mut().enumerate() {
        assert!(w.as_mut().unwrap().running(), "rank {r} was never stopped");
    }
    let r = c.run(&c.command(&[(1, 0, true)])).expect("switched");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    c.shutdown_cleanly();
}
