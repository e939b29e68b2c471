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
