//! Bad input and limits, as a user meets them: every value a command cannot use gets exit code
//! 2 and a message naming it, before anything starts: never a panic, an abort, a hang or
//! memory growing until the process is killed.

mod common;

use common::{manager_args, taskd_command};
use std::io::Write as _;
use std::process::Output;

fn taskd(args: &[&str], env: &[(&str, &str)]) -> Output {
    taskd_command(args)
        .envs(env.iter().copied())
        .output()
        .expect("taskd runs")
}

/// Runs `taskd ARGS` and checks it refused with exit 2, naming each of `needles` on stderr.
fn refused(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let out = taskd(args, env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "taskd {args:?} {env:?}: {err}");
    assert!(!err.contains("panicked"), "taskd {args:?}: {err}");
    for n in needles {
        assert!(
            err.contains(n),
            "taskd {args:?} {env:?}: {n:?} not in: {err}"
        );
    }
}

/// `taskd BASE FLAG VALUE` is refused, naming the flag and the value.
fn refused_value(base: &[&str], flag: &str, value: &str) {
    let args: Vec<&str> = base.iter().copied().chain([flag, value]).collect();
    refused(&args, &[], &[flag, &format!("'{value}'")]);
}

#[test]
fn sim_refuses_sizes_it_cannot_run() {
    refused_value(&["sim"], "--nodes", "0");
    refused_value(&["sim"], "--devices-per-node", "0");
    refused_value(&["sim"], "--nodes", "5000");
    // More ranks than a rank table can have is said up front (a simulated rank is a task, so
    // the cap is the job's, not the threads').
    refused(
        &["sim", "--nodes", "4096", "--devices-per-node", "17"],
        &[],
        &["69632 simulated ranks", "65536"],
    );
}

#[test]
fn sim_refuses_faults_on_ranks_it_does_not_have_and_absurd_times() {
    let small = ["sim", "--nodes", "2", "--devices-per-node", "4"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        small.iter().chain(extra).copied().collect()
    };
    refused(
        &with(&["--l2-off-rank", "8"]),
        &[],
        &["--l2-off-rank 8", "0..8"],
    );
    refused(&with(&["--fail-rank", "99"]), &[], &["--fail-rank 99"]);
    refused(
        &with(&["--hang-rank", "8", "--hang-ms", "5"]),
        &[],
        &["--hang-rank 8"],
    );
    for (flag, value) in [
        ("--step-ms", "60001"),
        ("--switch-timeout-ms", "0"),
        ("--phase-timeout-ms", "0"),
        ("--switch-timeout-ms", "18446744073709551615"),
    ] {
        refused_value(&small, flag, value);
    }
    refused(&with(&["--switch", ":0"]), &[], &["the node name is empty"]);
    refused(
        &with(&["--serve", "--job-id", ""]),
        &[],
        &["--job-id", "empty"],
    );
    refused_value(&with(&["--serve"]), "--rate-per-sec", "NaN");
}

#[test]
fn manager_refuses_job_sizes_above_the_maximum() {
    let base = ["manager", "--job-id", "j", "--listen", "127.0.0.1:0"];
    // Grew memory until it was killed; now refused before allocating.
    refused(
        &[
            &base[..],
            &["--nodes", "1000000", "--procs-per-node", "1000000"],
        ]
        .concat(),
        &[],
        &["'1000000'", "1..=4096"],
    );
    refused(
        &[&base[..], &["--nodes", "4096", "--procs-per-node", "17"]].concat(),
        &[],
        &["69632 ranks", "65536"],
    );
    let one = manager_args("j", "1");
    refused_value(&base, "--procs-per-node", "0");
    for (flag, value) in [
        ("--heartbeat-ms", "0"),
        ("--missed-heartbeats", "0"),
        ("--queue-capacity", "0"),
        ("--max-message-bytes", "1000"),
        ("--pause-timeout-ms", "0"),
        ("--switch-timeout-ms", "0"),
        ("--rollback-timeout-ms", "0"),
        ("--resume-timeout-ms", "0"),
    ] {
        refused_value(&one, flag, value);
    }
    refused(
        &[
            "manager",
            "--job-id",
            "",
            "--nodes",
            "1",
            "--procs-per-node",
            "1",
        ],
        &[],
        &["--job-id", "empty"],
    );
    refused(
        &["manager", "--nodes", "1", "--procs-per-node", "1"],
        &[("MINDX_TASK_ID", " ")],
        &["--job-id", "empty"],
    );
}

#[test]
fn rank_tables_are_bounded_and_checked() {
    // Read for ever before; now the read stops at the bound and names the file.
    refused(
        &["manager", "--job-id", "j", "--rank-table", "/dev/zero"],
        &[],
        &["/dev/zero", "a character device, not a regular file"],
    );
    let dir = std::env::temp_dir().join(format!("taskd-cli-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p.to_string_lossy().into_owned()
    };
    let huge_device = table(
        "device.json",
        r#"{"server_list": [{"server_id": "a", "device": [{"device_id": "4000000000", "rank_id": "0"}]}]}"#,
    );
    refused(
        &["manager", "--job-id", "j", "--rank-table", &huge_device],
        &[],
        &[&huge_device, "a:4000000000"],
    );
    let nameless = table(
        "nameless.json",
        r#"{"server_list": [{"server_id": "", "device": [{"device_id": 0, "rank_id": 0}]}]}"#,
    );
    refused(
        &["manager", "--job-id", "j", "--rank-table", &nameless],
        &[],
        &[&nameless, "empty name"],
    );
    let fifo = dir.join("fifo.json");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let fifo = fifo.to_string_lossy().into_owned();
    // Blocked for ever in the open before.
    refused(
        &["manager", "--job-id", "j", "--rank-table", &fifo],
        &[],
        &[&fifo, "a FIFO"],
    );
    let two_nodes = table(
        "two.json",
        r#"{"server_list": [{"server_id": "a", "device": [{"device_id": 0, "rank_id": 0}]},
                            {"server_id": "b", "device": [{"device_id": 0, "rank_id": 1}]}]}"#,
    );
    refused(
        &[
            "proxy",
            "--job-id",
            "j",
            "--manager",
            "127.0.0.1:1",
            "--node-rank",
            "2",
            "--rank-table",
            &two_nodes,
        ],
        &[],
        &["node rank 2", &two_nodes],
    );
    refused(
        &[
            "worker",
            "--job-id",
            "j",
            "--sim",
            "--rank",
            "5",
            "--rank-table",
            &two_nodes,
        ],
        &[],
        &["rank 5", &two_nodes],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn roles_name_the_environment_variable_that_is_wrong() {
    let proxy = ["proxy", "--job-id", "j", "--manager", "127.0.0.1:1"];
    refused(
        &proxy,
        &[("MS_NODE_RANK", "-1")],
        &["MS_NODE_RANK", "\"-1\""],
    );
    refused(
        &proxy,
        &[("RANK", "3"), ("LOCAL_WORLD_SIZE", "0")],
        &["LOCAL_WORLD_SIZE", "\"0\""],
    );
    refused(&proxy, &[], &["which node is this?"]);
    refused(
        &["worker", "--job-id", "j", "--sim"],
        &[("RANK", "-1")],
        &["RANK", "\"-1\""],
    );
    refused(
        &["proxy", "--job-id", "j", "--node-rank", "0"],
        &[("MS_SCHED_HOST", "not a host")],
        &["MS_SCHED_HOST", "not a host"],
    );
    refused(
        &[
            "manager",
            "--job-id",
            "j",
            "--nodes",
            "1",
            "--procs-per-node",
            "1",
        ],
        &[("MS_SCHED_HOST", "10.0.0.1"), ("POD_IP", "10.0.0.2")],
        &["MS_SCHED_HOST (10.0.0.1)", "POD_IP (10.0.0.2)", "--force"],
    );
}

#[test]
fn bad_addresses_and_names_fail_at_once() {
    let proxy = ["proxy", "--job-id", "j", "--node-rank", "0"];
    let worker = ["worker", "--job-id", "j", "--sim", "--rank", "0"];
    // Retried silently for ever before.
    refused_value(&proxy, "--manager", "notanaddress");
    refused(
        &[&proxy[..], &["--manager", "fd00::1:9601"]].concat(),
        &[],
        &["'fd00::1:9601'", "brackets"],
    );
    refused_value(&worker, "--proxy", "nowhere");
    refused(
        &[&proxy[..], &["--node-name", ""]].concat(),
        &[],
        &["--node-name", "empty"],
    );
    refused_value(&worker, "--step-ms", "999999");
    refused_value(&["doctor"], "--port", "0");
}

/// A die whose partner die is not in the job (device 2 of a 3-device node) cannot move to its
/// backup NIC (its partner's): HCCL needs both dies of the NPU visible to the job. The command
/// is bad input, refused before anything runs, naming the device and its partner.
#[test]
fn a_die_without_its_partner_in_the_job_is_refused_up_front_naming_both() {
    let out = taskd(
        &[
            "sim",
            "--json",
            "--nodes",
            "1",
            "--devices-per-node",
            "3",
            "--switch",
            "node-0:2",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("node-0:2") && err.contains("partner die node-0:3"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing ran");
}

#[test]
fn automatic_failover_is_refused_in_clusterd_client_mode() {
    let base = [&manager_args("j", "1")[..], &["--auto-failover"]].concat();
    refused(
        &[&base[..], &["--clusterd", "127.0.0.1:8899"]].concat(),
        &[],
        &[
            "--auto-failover is off in ClusterD client mode",
            "127.0.0.1:8899",
        ],
    );
    // Found from the environment, the same.
    refused(
        &base,
        &[("MINDX_SERVER_IP", "10.0.0.9")],
        &["ClusterD (at 10.0.0.9:8899)", "--no-clusterd"],
    );
}

/// Heartbeat flags that together lose a peer after less than a quarter of a second are
/// refused on every role, naming both flags: `--heartbeat-ms 1` made the job flap (its proxy
/// lost every few milliseconds, half the switches failed).
#[test]
fn heartbeats_that_would_lose_peers_on_a_loaded_machine_are_refused() {
    let manager = manager_args("j", "1");
    let proxy = common::proxy_args("j", "127.0.0.1:1");
    let worker = [
        "worker",
        "--job-id",
        "j",
        "--sim",
        "--rank",
        "0",
        "--proxy",
        "127.0.0.1:1",
    ];
    for base in [&manager[..], &proxy[..], &worker[..]] {
        for (hb, missed) in [("1", "3"), ("80", "3"), ("249", "1")] {
            let args = [base, &["--heartbeat-ms", hb, "--missed-heartbeats", missed]].concat();
            refused(
                &args,
                &[],
                &[
                    &format!("--heartbeat-ms {hb} with --missed-heartbeats {missed}"),
                    "250 ms",
                ],
            );
        }
    }
}

/// Control tokens a header cannot carry (a newline inside), or only whitespace (which would
/// turn authentication off), are refused at start naming where they came from, on the
/// manager and on the operator's commands alike.
#[test]
fn control_tokens_a_client_cannot_send_or_that_are_blank_are_refused() {
    let dir = common::fresh_dir("cli-limits", "tokens");
    std::fs::create_dir_all(&dir).unwrap();
    let two = dir.join("two-lines");
    std::fs::write(&two, "first\nsecond\n").unwrap();
    let two = two.display().to_string();
    let mut manager = manager_args("j", "1").to_vec();
    manager.extend(["--control-addr", "127.0.0.1:0"]);
    let with_file = [&manager[..], &["--control-token-file", &two]].concat();
    refused(&with_file, &[], &[&two, "'\\n'", "header cannot carry"]);
    refused(
        &manager,
        &[("TASKD_CONTROL_TOKEN", " ")],
        &["TASKD_CONTROL_TOKEN", "only whitespace"],
    );
    let status = ["status", "--addr", "127.0.0.1:1", "--job", "j"];
    refused(
        &[&status[..], &["--token-file", &two]].concat(),
        &[],
        &[&two, "header cannot carry"],
    );
    refused(
        &status,
        &[("TASKD_CONTROL_TOKEN", "\t ")],
        &["TASKD_CONTROL_TOKEN", "only whitespace"],
    );
}

/// A control rate so slow it locks a client out for ever, and a control address that is not
/// HOST:PORT, are bad input (exit 2), not a start or an unreachable manager.
#[test]
fn absurd_control_rates_and_addresses_are_bad_input() {
    let mut manager = manager_args("j", "1").to_vec();
    manager.extend(["--control-addr", "127.0.0.1:0"]);
    refused(
        &[&manager[..], &["--control-rate-per-sec", "1e-300"]].concat(),
        &[],
        &["--control-rate-per-sec", "at least 0.0001"],
    );
    for cmd in [
        &[
            "switch", "--job", "j", "--node", "node-0", "--dev", "0", "--to", "backup",
        ][..],
        &["status", "--job", "j"][..],
    ] {
        refused(
            &[cmd, &["--addr", "nonsense"]].concat(),
            &[],
            &["--addr", "'nonsense'", "HOST:PORT"],
        );
    }
}

/// `MS_SCHED_HOST` with a zone id (`fe80::1%lo`) is refused naming it, rather than dropping
/// the zone and connecting for ever to an address no route reaches.
#[test]
fn a_scheduler_host_with_a_zone_id_is_refused() {
    refused(
        &["proxy", "--job-id", "j", "--node-rank", "0", "--sim"],
        &[("MS_SCHED_HOST", "fe80::1%lo")],
        &["MS_SCHED_HOST=\"fe80::1%lo\"", "zone id (%lo)"],
    );
}
