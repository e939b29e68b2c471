//! `taskd manager` as ClusterD's client, as a process: the flags, the address found in the
//! environment, and a switch and back, and a failing switch, driven by a fake ClusterD (serving
//! its streams as grpc-go, as ClusterD does, and also sending headers at once) through a job
//! whose roles are processes of their own, while the manager's control API answers beside it.
//! Each switch gets exactly one answer, and no report is left unread in ClusterD's slots.

mod clusterd_support;
mod common;
mod net_support;

use clusterd_support::{FakeClusterd, Headers, SWITCH_FAILED, SWITCH_FINISHED};
use common::{lines_of, manager_args, taskd_command};
use net_support::{fast_heartbeats, s, Cluster, ClusterSpec, Scratch};
use std::process::{Command, Stdio};
use taskd::core::env;

/// A job of 2 x 2 processes whose manager is the client of `fake`; `worker_flags` per rank.
fn job_of_processes(
    scratch: &Scratch,
    fake: &FakeClusterd,
    worker_flags: &dyn Fn(u32) -> Vec<String>,
) -> Cluster {
    let mut c = Cluster::start(
        scratch,
        ClusterSpec {
            job: "cd-job",
            nodes: 2,
            ppn: 2,
            worker_flags,
            manager_flags: s(&["--clusterd", &fake.addr().to_string()]),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    let line = c.manager.wait_line("ClusterD's client at");
    assert!(line.ends_with(&fake.addr().to_string()), "{line}");
    fake.wait_sessions(1);
    c
}

/// What the manager's log says of its reports: none dropped, and as many delivered as
/// ClusterD asked for.
fn assert_reports_delivered(c: &Cluster, asked: usize) {
    let log = c.manager.stderr();
    assert!(log.contains("ClusterD session up"), "{log}");
    assert!(!log.contains("report not sent"), "{log}");
    let delivered = log.matches("reported to ClusterD").count();
    assert_eq!(delivered, asked, "{log}");
}

fn switched_and_back_by_clusterd(headers: Headers) {
    let scratch = Scratch::new(&format!("clusterd-processes-{headers:?}"));
    let fake = FakeClusterd::start_with("cd-job", headers);
    let mut c = job_of_processes(&scratch, &fake, &|_| Vec::new());

    let uuid = fake.pause();
    let (code, info) = fake.stop_complete();
    assert_eq!(code, 0, "{info}");
    // The control API beside it sees ClusterD's operation and its link.
    let st = c.status(0);
    let link = st
        .clusterd
        .clone()
        .expect("the status has the ClusterD link");
    assert!(link.connected, "{link:?}");
    assert_eq!(link.driving, uuid);
    assert!(st.in_flight.is_some());
    fake.switch(&[1, 2], &[true, true]);
    assert!(fake.switch_result());
    fake.resume(&uuid);
    assert_eq!(fake.recover_status().0, 0);
    fake.reset_streams();
    fake.wait_sessions(2);
    let st = c.status(1);
    assert_eq!(st.ranks_on_backup, vec![1, 2]);
    assert_eq!(st.state, "running");

    assert_eq!(fake.switch_nic(&[1, 2], &[false, false]), SWITCH_FINISHED);
    assert_eq!(fake.answers(), vec![SWITCH_FINISHED]);
    fake.wait_sessions(3);
    let st = c.status(2);
    assert!(st.ranks_on_backup.is_empty());
    assert!(
        st.recent.iter().all(|r| r.result == "succeeded"),
        "{:?}",
        st.recent
    );
    fake.assert_clean();
    assert_reports_delivered(&c, 6);
    c.shutdown_cleanly();
}

/// ClusterD resets the flow right after it took the flow's last report, and its answer to that
/// report comes after the signal stream ended: the report still counts as taken, not as one
/// dropped with its session.
#[test]
fn a_report_answered_after_clusterd_reset_the_flow_counts_as_taken() {
    let scratch = Scratch::new("clusterd-processes-late-answer");
    let fake = FakeClusterd::start_answering_last_after_reset("cd-job");
    let c = job_of_processes(&scratch, &fake, &|_| Vec::new());
    assert_eq!(fake.switch_nic(&[1], &[true]), SWITCH_FINISHED);
    fake.wait_sessions(2);
    fake.assert_clean();
    // StopComplete, the switch result, and the RecoverStatus answered late.
    assert_reports_delivered(&c, 3);
    c.shutdown_cleanly();
}

#[test]
fn a_job_of_processes_is_switched_and_back_by_a_clusterd_serving_streams_as_grpc_go() {
    switched_and_back_by_clusterd(Headers::WithFirstMessage);
}

#[test]
fn a_job_of_processes_is_switched_and_back_by_a_clusterd_sending_headers_at_once() {
    switched_and_back_by_clusterd(Headers::AtOnce);
}

#[test]
fn a_failing_switch_of_processes_is_answered_once_with_clusterds_failure() {
    let scratch = Scratch::new("clusterd-processes-fail");
    let fake = FakeClusterd::start("cd-job");
    // Rank 1's first NIC-set fails (HCCL_E_NETWORK): the switch rolls back.
    let fail = |r: u32| {
        if r == 1 {
            s(&["--sim-fail-nic-set", "19"])
        } else {
            Vec::new()
        }
    };
    let mut c = job_of_processes(&scratch, &fake, &fail);
    assert_eq!(fake.switch_nic(&[1, 2], &[true, true]), SWITCH_FAILED);
    assert_eq!(fake.answers(), vec![SWITCH_FAILED]);
    fake.wait_sessions(2);
    // stop_train after the failed switch: the held operation ends, then training stops and
    // every training process exits 1, for its launcher to restart it.
    c.wait_workers_stopped("stop_train");
    let st = c.status(1);
    assert!(st.ranks_on_backup.is_empty(), "{st:?}");
    assert!(st.in_flight.is_none(), "{st:?}");
    let stop = st.training_stop.expect("a stop under way");
    assert_eq!(stop.by, "clusterd", "{stop:?}");
    // The launcher restarts them: new incarnations, on their default NIC, and ClusterD's next
    // switch runs on them.
    let st = c.restart_workers(&scratch);
    assert_eq!(st.state, "running", "{st:#?}");
    assert!(st.verified && st.ranks_on_backup.is_empty(), "{st:#?}");
    assert_eq!(fake.switch_nic(&[2], &[true]), SWITCH_FINISHED);
    fake.wait_sessions(3);
    assert_eq!(c.status(0).ranks_on_backup, vec![2]);
    fake.assert_clean();
    // StopComplete, the switch result, the StopComplete of stop_train; then three more.
    assert_reports_delivered(&c, 6);
    c.shutdown_cleanly();
}

/// `taskd manager` for one rank on port 0 with `args` and `envs`; waits for its lines and
/// stops it with SIGTERM. Returns stdout, stderr and the exit code.
fn manager(args: &[&str], envs: &[(&str, &str)]) -> (String, String, Option<i32>) {
    let mut cmd = taskd_command(&[&manager_args("j", "1")[..], args].concat());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .envs(envs.iter().copied())
        .spawn()
        .expect("taskd starts");
    let lines = lines_of(child.stdout.take().unwrap());
    // Until its last startup line ("listening on", then the ClusterD line when it is a
    // client), or its exit (the channel closes).
    let client = !args.contains(&"--no-clusterd") && (!envs.is_empty() || !args.is_empty());
    let mut text = String::new();
    loop {
        let line = match lines.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(line) => line,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("taskd manager {args:?} printed no more lines in 30 s: {text}");
            }
        };
        text.push_str(&line);
        text.push('\n');
        let last = if client {
            "ClusterD's client at"
        } else {
            "listening on"
        };
        if line.contains(last) {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }
    let status = child.wait().expect("taskd exits");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (text, err, status.code())
}

#[test]
fn the_manager_finds_clusterd_as_taskd_does_and_the_flags_override_it() {
    let (out, _, code) = manager(&[], &[(env::MINDX_SERVER_IP, "127.0.0.1")]);
    assert_eq!(code, Some(0));
    assert!(out.contains("ClusterD's client at 127.0.0.1:8899"), "{out}");
    let both = [
        (env::MINDX_SERVER_IP, "10.1.2.3"),
        (env::LOCAL_PROXY_ENABLE, "on"),
    ];
    let (out, _, _) = manager(&[], &both);
    assert!(out.contains("ClusterD's client at 127.0.0.1:8899"), "{out}");
    let (out, _, _) = manager(&[], &[(env::MINDX_SERVER_IP, "fd00::7")]);
    assert!(out.contains("ClusterD's client at [fd00::7]:8899"), "{out}");
    let (out, _, _) = manager(&["--clusterd", "127.0.0.1:18899"], &both);
    assert!(
        out.contains("ClusterD's client at 127.0.0.1:18899"),
        "{out}"
    );
    let (out, _, code) = manager(&["--no-clusterd"], &both);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("listening on") && !out.contains("ClusterD"),
        "{out}"
    );
    let (out, _, _) = manager(&[], &[]);
    assert!(
        !out.contains("ClusterD"),
        "standalone without the environment: {out}"
    );
}

#[test]
fn bad_clusterd_addresses_are_refused_naming_them() {
    let (_, err, code) = manager(&["--clusterd", "clusterd-svc"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("clusterd-svc") && err.contains("--clusterd"),
        "{err}"
    );
    let (_, err, code) = manager(&["--clusterd", "a:1", "--no-clusterd"], &[]);
    assert_eq!(code, Some(2), "{err}");
    let (_, err, code) = manager(&[], &[(env::MINDX_SERVER_IP, "not an address")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("MINDX_SERVER_IP") && err.contains("not an address"),
        "{err}"
    );
}
