//! The long-running roles as processes: SIGHUP ends each of them as SIGTERM does (a goodbye,
//! exit 0), and an IPv6 scheduler host works end to end.

mod common;

use common::{lines_of, manager_args, proxy_args, taskd_command};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a test waits for a line or an exit before it fails (a safety net: they normally
/// come in milliseconds).
const PATIENCE: Duration = Duration::from_secs(30);

/// One `taskd` process, its stdout read line by line.
struct Role {
    name: &'static str,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Role {
    fn spawn(name: &'static str, args: &[&str], env: &[(&str, &str)]) -> Role {
        let mut c = taskd_command(args);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.envs(env.iter().copied()).spawn().expect("taskd starts");
        let lines = lines_of(child.stdout.take().expect("piped stdout"));
        Role { name, child, lines }
    }

    /// Waits for a stdout line containing `pat`.
    fn wait_line(&mut self, pat: &str) -> String {
        loop {
            match self.lines.recv_timeout(PATIENCE) {
                Ok(l) if l.contains(pat) => return l,
                Ok(_) => {}
                Err(_) => {
                    let err = self.stderr_now();
                    panic!("{}: no line with {pat:?}: {err}", self.name)
                }
            }
        }
    }

    fn stderr_now(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success(), "kill -{sig} {}", self.name);
    }

    /// Waits for the process to exit; its status and stderr.
    fn exit(mut self) -> (ExitStatus, String) {
        let mut err = self.child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            let _ = tx.send(s);
        });
        let stderr = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            let _ = self.child.kill();
            panic!("{} did not exit", self.name)
        });
        (self.child.wait().expect("exit status"), stderr)
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `127.0.0.1:PORT` from `taskd manager listening on 127.0.0.1:PORT (...)`.
fn addr_in(line: &str) -> String {
    line.split_whitespace()
        .nth(4)
        .expect("an address in the line")
        .to_owned()
}

/// A proxy for node 0 of `job`, with simulated link health, connected to the manager at `at`.
fn sim_proxy(job: &str, at: &str) -> Role {
    Role::spawn("proxy", &proxy_args(job, at), &[])
}

fn hup_ends_it(role: Role) {
    let name = role.name;
    role.signal("HUP");
    let (st, err) = role.exit();
    assert_eq!(st.code(), Some(0), "{name}: {err}");
    assert!(err.contains("SIGHUP"), "{name}: {err}");
    assert!(!err.contains("panicked"), "{name}: {err}");
}

#[test]
fn sighup_stops_every_role_cleanly() {
    let mut manager = Role::spawn("manager", &manager_args("hup", "1"), &[]);
    let at = addr_in(&manager.wait_line("taskd manager listening on"));
    let mut proxy = sim_proxy("hup", &at);
    let proxy_at = addr_in(&proxy.wait_line("taskd proxy listening on"));
    proxy.wait_line("registered as node-0");
    let mut worker = Role::spawn(
        "worker",
        &[
            "worker",
            "--job-id",
            "hup",
            "--rank",
            "0",
            "--proxy",
            &proxy_at,
            "--sim",
            "--step-ms",
            "1",
        ],
        &[],
    );
    worker.wait_line("taskd worker rank 0 registered on node-0");
    hup_ends_it(worker);
    hup_ends_it(proxy);
    hup_ends_it(manager);
}

#[test]
fn sighup_stops_the_live_simulator() {
    let mut sim = Role::spawn(
        "sim --serve",
        &[
            "sim",
            "--serve",
            "--control-addr",
            "127.0.0.1:0",
            "--nodes",
            "1",
            "--devices-per-node",
            "2",
        ],
        &[],
    );
    sim.wait_line("serving the control API on");
    sim.signal("HUP");
    let line = sim.wait_line("taskd sim: stopped after");
    assert!(line.contains("groups consistent: true"), "{line}");
    let (st, err) = sim.exit();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(err.contains("SIGHUP"), "{err}");
}

/// The manager on the IPv6 loopback with `MS_SCHED_HOST` and `POD_IP` spelling the same
/// address differently (compared as addresses, so it starts), a proxy reaching it through a
/// bracketed address, and a proxy whose default manager address comes from an IPv6
/// `MS_SCHED_HOST` (brackets added).
#[test]
fn an_ipv6_scheduler_host_works() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback on this host: nothing to test");
        return;
    }
    let ipv6 = [("MS_SCHED_HOST", "::1"), ("POD_IP", "0:0:0:0:0:0:0:1")];
    let mut manager = Role::spawn(
        "manager",
        &[
            "manager",
            "--job-id",
            "v6",
            "--nodes",
            "1",
            "--procs-per-node",
            "1",
            "--listen",
            "[::1]:0",
        ],
        &ipv6,
    );
    let at = addr_in(&manager.wait_line("taskd manager listening on"));
    assert!(at.starts_with("[::1]:"), "{at}");
    let mut proxy = sim_proxy("v6", &at);
    proxy.wait_line("registered as node-0");
    let mut defaulted = Role::spawn(
        "proxy with the default manager",
        &[
            "proxy",
            "--job-id",
            "v6",
            "--node-rank",
            "0",
            "--listen",
            "127.0.0.1:0",
        ],
        &[("MS_SCHED_HOST", "fd00::1")],
    );
    let line = defaulted.wait_line("taskd proxy listening on");
    assert!(line.ends_with("(manager [fd00::1]:9601)"), "{line}");
    for r in [defaulted, proxy, manager] {
        r.signal("TERM");
        let (st, err) = r.exit();
        assert_eq!(st.code(), Some(0), "{err}");
    }
}
