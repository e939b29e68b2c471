//! The operator's walk-through as separate processes: `taskd sim --serve` as the live rig,
//! driven by `taskd switch --wait` and `taskd status --json`.

mod common;

use common::{manager_args, taskd, taskd_command};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A `taskd sim --serve` process, stopped with SIGTERM when dropped.
struct LiveRig {
    child: Child,
    addr: String,
}

impl LiveRig {
    fn start(extra: &[&str]) -> LiveRig {
        let mut child = taskd_command(&[
            "sim",
            "--serve",
            "--control-addr",
            "127.0.0.1:0",
            "--nodes",
            "2",
            "--devices-per-node",
            "4",
            "--job-id",
            "rig",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("taskd starts");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .rsplit(' ')
            .next()
            .map(|s| s.trim().to_owned())
            .filter(|s| s.contains(':'))
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        LiveRig { child, addr }
    }

    fn stop(mut self) -> (i32, String) {
        terminate(&self.child);
        let mut rest = String::new();
        let mut out = self.child.stdout.take().unwrap();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        std::mem::forget(self);
        (code, rest)
    }
}

fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

impl Drop for LiveRig {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `taskd manager` for job `m` on one node of `ppn` ranks, listening on port 0.
fn manager(ppn: &str) -> Vec<&str> {
    [&manager_args("m", ppn)[..], &["--force"]].concat()
}

#[test]
fn switch_watch_switch_back_and_read_status() {
    let rig = LiveRig::start(&[]);
    let a = rig.addr.clone();
    let (code, out, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-1", "--dev", "0,2", "--to",
        "backup", "--node", "node-0", "--dev", "3", "--to", "backup", "--wait",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("accepted") && out.contains("SUCCEEDED"),
        "{out}"
    );

    let (code, out, err) = taskd(&["status", "--addr", &a, "--job", "rig", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "running");
    assert_eq!(v["ranks_on_backup"], serde_json::json!([3, 4, 6]));
    assert_eq!(v["workers_registered"], 8);
    assert_eq!(v["recent"][0]["result"], "succeeded");

    let (code, out, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-1", "--dev", "0,2", "--to",
        "primary", "--node", "node-0", "--dev", "3", "--to", "primary", "--wait", "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["event"], "result");
    assert_eq!(last["result"]["direction"], "to_primary");
    // Each phase event says what happened: started (with the ranks waited for), then finished
    // (with how long it took).
    let phases: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["event"] == "phase" && e["kind"] != "waiting")
        .map(|e| (e["phase"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    let want: Vec<(&str, &str)> = ["sample", "pause", "switch", "resume"]
        .iter()
        .flat_map(|p| [(*p, "started"), (*p, "finished")])
        .collect();
    assert_eq!(phases, want, "{out}");
    for e in events.iter().filter(|e| e["event"] == "phase") {
        match e["kind"].as_str().unwrap() {
            "started" => assert_eq!(e["waiting"], 8, "{e}"),
            "finished" => assert!(e["took_ms"].as_f64().unwrap() >= 0.0, "{e}"),
            "waiting" => assert!(e["waiting"].as_u64().unwrap() < 8, "{e}"),
            other => panic!("unknown kind {other} in {e}"),
        }
    }

    let (code, out, _) = taskd(&["status", "--addr", &a, "--job", "rig"]);
    assert_eq!(code, 0);
    assert!(out.contains("on backup  none"), "{out}");

    let (code, rest) = rig.stop();
    assert_eq!(code, 0, "{rest}");
    assert!(rest.contains("groups consistent: true"), "{rest}");
}

#[test]
fn bad_input_and_refusals_exit_with_documented_codes() {
    let rig = LiveRig::start(&[]);
    let a = rig.addr.clone();
    // A refused command: exit 1 with the code's name and the bad node.
    let (code, _, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-9", "--dev", "0", "--to", "backup",
        "--wait",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("PARAMETER_INVALID") && err.contains("node-9"),
        "{err}"
    );
    // A malformed command line: exit 2, one line saying what to fix.
    let (code, _, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-0", "--node", "node-1", "--dev",
        "0", "--to", "backup",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("every --node needs one --dev and one --to"),
        "{err}"
    );
    let (code, _, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-0", "--dev", "zero", "--to",
        "backup",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("\"zero\" is not a device number"), "{err}");
    // The wrong job: exit 1, naming it and the flag to check.
    let (code, _, err) = taskd(&["status", "--addr", &a, "--job", "nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("taskd status: ") && err.contains("\"nope\"") && err.contains("--job"),
        "{err}"
    );
    drop(rig);
    // Nobody listening: exit 3, naming the address and saying what to check.
    let (code, _, err) = taskd(&["status", "--addr", "127.0.0.1:1", "--job", "rig"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("127.0.0.1:1") && err.contains("is --addr right?"),
        "{err}"
    );
}

/// Every way `taskd switch` ends short of a result goes through the one error path: one line
/// on stderr naming the bad value or saying what to do, and the exit code docs/operating.md gives.
#[test]
fn switch_refusals_and_failures_exit_with_documented_codes() {
    let rig = LiveRig::start(&[]);
    let a = rig.addr.clone();
    let switch = |extra: &[&str]| {
        let base = [
            "switch", "--addr", &a, "--node", "node-0", "--dev", "1", "--to", "backup",
        ];
        taskd(&[&base[..], extra].concat())
    };
    // Another job: refused (exit 1) with the code's name, naming the job.
    let (code, out, err) = switch(&["--job", "nope", "--wait"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with("taskd switch: refused (")
            && err.contains("JOB_NOT_EXIST")
            && err.contains("nope"),
        "{err}"
    );
    // With --json the refusal is the last event on stdout too.
    let (code, out, err) = switch(&["--job", "nope", "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "refused", "{out}");
    assert_eq!(last["name"], "JOB_NOT_EXIST", "{out}");
    assert_eq!(last["kind"], "unknown_job", "{out}");
    assert!(err.contains("JOB_NOT_EXIST"), "{err}");
    // A --uuid that is not a UUID is a wrong command line (exit 2), naming the value.
    let (code, _, err) = switch(&["--job", "rig", "--uuid", "not-a-uuid", "--wait"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--uuid") && err.contains("not-a-uuid"),
        "{err}"
    );
    // A token file that cannot be read: exit 2 before connecting, naming the file.
    let missing = std::env::temp_dir().join(format!("taskd-no-token-{}", std::process::id()));
    let missing = missing.to_str().unwrap();
    let (code, _, err) = switch(&["--job", "rig", "--token-file", missing]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(missing), "{err}");
    // Without --wait, accepted is success.
    let (code, out, err) = switch(&["--job", "rig"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("accepted"), "{out}");
    drop(rig);
    // Nobody listening: exit 3, naming the address and saying what to check.
    let (code, _, err) = switch(&["--job", "rig", "--wait"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains(&a) && err.contains("is --addr right?"),
        "{err}"
    );
}

#[test]
fn a_reused_uuid_with_other_targets_is_refused_naming_it() {
    let rig = LiveRig::start(&[]);
    let a = rig.addr.clone();
    let uuid = "6f9b1c2e-0000-4000-8000-00000000000a";
    let switch = |dev: &str| {
        taskd(&[
            "switch", "--addr", &a, "--job", "rig", "--node", "node-0", "--dev", dev, "--to",
            "backup", "--uuid", uuid, "--wait",
        ])
    };
    let (code, out, err) = switch("2");
    assert_eq!(code, 0, "{out}\n{err}");
    // A retry: the known result, exit 0.
    let (code, out, err) = switch("2");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("already ran"), "{out}");
    // Another request under the same uuid: exit 2, naming the uuid; nothing ran.
    let (code, out, err) = switch("3");
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("--uuid") && err.contains(uuid), "{err}");
    let (code, out, _) = taskd(&["status", "--addr", &a, "--job", "rig", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranks_on_backup"], serde_json::json!([2]));
    assert_eq!(v["recent"].as_array().unwrap().len(), 1);
    drop(rig);
}

#[test]
fn the_manager_refuses_a_control_rate_limit_that_refuses_everything() {
    for flags in [
        ["--control-rate-burst", "0"],
        ["--control-rate-per-sec", "0"],
    ] {
        let args = [
            &manager("1")[..],
            &["--control-addr", "127.0.0.1:0"],
            &flags[..],
        ]
        .concat();
        let (code, _, err) = taskd(&args);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains(flags[0]), "{err}");
    }
}

#[test]
fn a_token_protected_rig_refuses_the_cli_without_it() {
    let dir = std::env::temp_dir().join(format!("taskd-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "rig-token\n").unwrap();
    let rig = LiveRig::start(&["--token-file", token.to_str().unwrap()]);
    let a = rig.addr.clone();
    let (code, _, err) = taskd(&["status", "--addr", &a, "--job", "rig"]);
    assert_eq!(code, 3);
    assert!(err.contains("--token-file"), "{err}");
    let (code, _, err) = taskd(&[
        "switch", "--addr", &a, "--job", "rig", "--node", "node-0", "--dev", "1", "--to", "backup",
        "--wait",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--token-file"), "{err}");
    // An empty token file would turn authentication off unnoticed: exit 2, naming it.
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let status = |token_file: &str| {
        taskd(&[
            "status",
            "--addr",
            &a,
            "--job",
            "rig",
            "--token-file",
            token_file,
        ])
    };
    let (code, _, err) = status(empty);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(empty) && err.contains("empty"), "{err}");
    let (code, out, err) = status(token.to_str().unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state      running"), "{out}");
    assert!(out.contains("verified   yes"), "{out}");
    drop(rig);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_manager_binary_serves_metrics_when_asked() {
    let mut child = taskd_command(&manager("2"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // First the metrics URL, then (once the manager runs) the listening line.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut url = None;
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the manager exited");
        if let Some(u) = line.split_whitespace().find(|w| w.starts_with("http://")) {
            url = Some(u.to_owned());
        }
        if line.contains("listening on") {
            break;
        }
    }
    let url = url.expect("a metrics URL before the listening line");
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b
    };
    terminate(&child);
    let _ = child.wait();
    assert!(body.contains("taskd_workers_expected 2"), "{body}");
    assert!(body.contains("taskd_workers_registered 0"), "{body}");
}

#[test]
fn recover_says_when_there_is_nothing_to_recover_and_checks_its_side() {
    let rig = LiveRig::start(&[]);
    let (code, out, err) = taskd(&["recover", "--addr", &rig.addr, "--job", "rig"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("refused") && out.contains("nothing to recover"),
        "{out}"
    );
    assert!(out.contains("job running"), "{out}");
    let (code, out, _) = taskd(&["recover", "--addr", &rig.addr, "--job", "rig", "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job_state"], "running");
    assert_eq!(v["refused"]["code"], 401, "{v}");
    let (code, _, err) = taskd(&[
        "recover", "--addr", &rig.addr, "--job", "rig", "--to", "sideways",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("sideways"), "{err}");
    rig.stop();
}

/// `taskd switch --abort-in-flight` asks for an in-flight move; the simulator's training
/// processes have no in-flight side, so the move fails after its sample (exit 1), saying so,
/// and nothing moved.
#[test]
fn switch_abort_in_flight_says_when_the_ranks_cannot_move_in_flight() {
    let rig = LiveRig::start(&[]);
    let a = rig.addr.clone();
    let (code, out, err) = taskd(&[
        "switch",
        "--addr",
        &a,
        "--job",
        "rig",
        "--node",
        "node-0",
        "--dev",
        "1",
        "--to",
        "backup",
        "--abort-in-flight",
        "--wait",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("have no in-flight side"), "{out}");
    let (code, out, err) = taskd(&["status", "--addr", &a, "--job", "rig", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["ranks_on_backup"], serde_json::json!([]), "{out}");
    let (code, help, _) = taskd(&["switch", "--help"]);
    assert_eq!(code, 0);
    assert!(
        help.contains("--abort-in-flight") && help.contains("stuck"),
        "{help}"
    );
    drop(rig);
}
