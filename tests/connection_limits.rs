//! Idle connections (TCP only: no TLS bytes, no request, no token) against a manager whose
//! descriptor limit is low: they are capped per client address and closed at their
//! deadline, so `taskd status` is answered and a restarted proxy registers, on the control
//! port and on the transport port alike.

mod common;
mod net_support;

use common::taskd;
use net_support::{fast_heartbeats, s, Cluster, ClusterSpec, Proc, Scratch, PATIENCE};
use std::net::TcpStream;
use std::time::Instant;

/// The manager's descriptor limit during the test, and how many idle connections go to one
/// port: more than the limit leaves.
const NOFILE: u32 = 200;
const IDLE: usize = 300;

/// Lowers the running process `pid`'s descriptor limit (`prlimit`); `false` when it cannot.
fn lower_nofile(pid: u32) -> bool {
    let limit = format!("--nofile={NOFILE}:{NOFILE}");
    std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &limit])
        .status()
        .is_ok_and(|s| s.success())
}

/// How many descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Opens `n` connections to `addr` and keeps them, sending nothing.
fn idle(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect()
}

#[test]
fn idle_connections_leave_the_manager_answering_and_its_proxies_registering() {
    let scratch = Scratch::new("connection-limits");
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "conn-limits",
            nodes: 2,
            ppn: 1,
            worker_flags: &|_| Vec::new(),
            manager_flags: Vec::new(),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let pid = c.manager.pid();
    if !lower_nofile(pid) {
        return eprintln!("skipped: prlimit cannot lower the manager's descriptor limit");
    }
    for (port, addr) in [
        ("control", c.control_addr.clone()),
        ("transport", c.manager_addr.clone()),
    ] {
        let held = idle(&addr, IDLE);
        assert_eq!(
            held.len(),
            IDLE,
            "the {port} port accepts (and sorts out) every one"
        );
        assert!(
            open_fds(pid) < NOFILE as usize - 20,
            "{port}: {} descriptors open",
            open_fds(pid)
        );
        let started = Instant::now();
        let (code, out, err) = taskd(&["status", "--addr", &c.control_addr, "--job", &c.job]);
        assert_eq!(code, 0, "{port}: status answered: {out}{err}");
        assert!(started.elapsed() < PATIENCE);

        // A proxy killed and started again registers at once.
        c.proxies[0].kill();
        let mut args = s(&[
            "proxy",
            "--job-id",
            &c.job,
            "--node-rank",
            "0",
            "--manager",
            &c.manager_addr,
            "--listen",
            &c.proxy_addrs[0],
            "--sim",
        ]);
        args.extend(fast_heartbeats());
        c.proxies[0] = Proc::spawn(&scratch, &format!("proxy-0-{port}"), &args);
        c.proxies[0].wait_line("registered as node-0");
        drop(held);
    }
    let st = c.status(0);
    assert_eq!(st.nodes_connected, 2, "{st:#?}");
}
