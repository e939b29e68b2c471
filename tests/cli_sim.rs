//! `taskd sim` as a user runs it: the binary, its JSON contract and its exit status.

mod common;

use common::{taskd, taskd_command};
use serde_json::Value;

fn sim(args: &[&str]) -> (i32, Value, String) {
    let (code, out, err) = taskd(&[&["sim"], args].concat());
    (code, serde_json::from_str(&out).unwrap_or(Value::Null), err)
}

fn ops(v: &Value) -> &Vec<Value> {
    v["operations"].as_array().expect("operations array")
}

#[test]
fn default_scenario_switches_to_backup_and_back() {
    let (code, v, err) = sim(&["--json"]);
    assert_eq!(code, 0, "{err}\n{v:#}");
    assert_eq!(v["nodes"], 4);
    assert_eq!(v["devices_per_node"], 16);
    assert_eq!(v["ranks"], 64);
    assert_eq!(v["groups_consistent"], true);
    assert_eq!(v["job_state"], "running");
    assert_eq!(v["ranks_on_backup"], serde_json::json!([]));
    let ops = ops(&v);
    assert_eq!(ops.len(), 2);
    assert_eq!(ops[0]["direction"], "to_backup");
    assert_eq!(ops[1]["direction"], "to_primary");
    for op in ops {
        assert_eq!(op["result"], "succeeded", "{op:#}");
        assert_eq!(op["rolled_back"], false);
        assert!(op["pause_step"].as_u64().is_some());
        assert!(op["phases_ms"]["total"].as_f64().unwrap() > 0.0);
        assert!(op["phases_ms"]["rollback"].is_null());
        let targets: Vec<(String, u64, u64)> = op["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["node"].as_str().unwrap().to_owned(),
                    t["device"].as_u64().unwrap(),
                    t["rank"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            targets,
            vec![("node-1".into(), 0, 16), ("node-1".into(), 8, 24)]
        );
    }
    assert!(v["steps_completed"].as_u64().unwrap() > ops[1]["pause_step"].as_u64().unwrap());
    // The evaluations of the steps trained on backup were new operators: on the default NIC.
    let on_default = v["collectives_on_default_nic"].as_u64().expect("a count");
    assert!(on_default >= 1, "{v:#}");
    assert_eq!(v["invariants"]["ok"], true);
}

#[test]
fn a_failing_rank_is_rolled_back_and_reported() {
    let (code, v, err) = sim(&[
        "--json",
        "--nodes",
        "2",
        "--devices-per-node",
        "4",
        "--switch",
        "node-1:1",
        "--fail-rank",
        "2",
    ]);
    assert_eq!(code, 0, "{err}\n{v:#}");
    let ops = ops(&v);
    assert_eq!(ops[0]["result"], "failed");
    assert_eq!(ops[0]["rolled_back"], true);
    assert!(ops[0]["error"].as_str().unwrap().contains("HCCL_E_NETWORK"));
    assert_eq!(ops[1]["result"], "succeeded");
    assert_eq!(v["groups_consistent"], true);
    assert_eq!(v["job_state"], "running");
}

#[test]
fn a_hang_past_the_deadline_is_a_timeout() {
    let (code, v, err) = sim(&[
        "--json",
        "--nodes",
        "2",
        "--devices-per-node",
        "4",
        "--switch",
        "node-0:0",
        "--hang-rank",
        "3",
        "--hang-ms",
        "300",
        "--switch-timeout-ms",
        "100",
    ]);
    // Rank 3 is still inside its call at the deadline: nothing more is called (a rollback call
    // would pair with its late call), the job stays paused with its groups split, which the
    // exit status reports; no collective ran on them.
    assert_eq!(code, 1, "{err}\n{v:#}");
    let op = &ops(&v)[0];
    assert_eq!(op["result"], "failed");
    assert!(op["error"].as_str().unwrap().contains("deadline"), "{op:#}");
    assert_eq!(op["rolled_back"], false);
    assert_eq!(v["job_state"], "paused");
    assert_eq!(v["groups_consistent"], false);
    assert_eq!(v["invariants"]["collectives_on_inconsistent_groups"], 0);
}

#[test]
fn an_unknown_target_is_refused_by_name() {
    let (code, _, err) = sim(&["--switch", "node-9:0"]);
    assert_eq!(code, 2);
    assert!(err.contains("node-9"), "{err}");
    let (code, _, err) = sim(&[
        "--nodes",
        "2",
        "--devices-per-node",
        "4",
        "--switch",
        "node-1:4",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("device 4") && err.contains("node-1"), "{err}");
    let (code, _, err) = sim(&["--switch", "node-1"]);
    assert_eq!(code, 2);
    assert!(err.contains("NODE:DEV"), "{err}");
}

#[test]
fn the_timeline_is_readable() {
    let (code, text, err) = taskd(&[
        "sim",
        "--nodes",
        "2",
        "--devices-per-node",
        "4",
        "--switch",
        "node-1:0,2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("operation 1"), "{text}");
    assert!(text.contains("SUCCEEDED"), "{text}");
    assert!(text.contains("groups consistent: yes"), "{text}");
}

#[test]
fn progress_is_printed_live_as_plain_lines_then_a_table_and_a_timeline() {
    let csv = std::env::temp_dir().join(format!("taskd-timeline-{}.csv", std::process::id()));
    let (code, text, err) = taskd(&[
        "sim",
        "--nodes",
        "2",
        "--devices-per-node",
        "2",
        "--switch",
        "node-1:0",
        "--step-ms",
        "1",
        "--timeline",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    // Not a terminal: lines, never redrawn in place.
    assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    for phase in ["sample", "pause", "switch", "resume"] {
        let started = text
            .lines()
            .filter(|l| l.contains(&format!(" {phase:<8}  ")) && l.contains("waiting for"))
            .count();
        let done = text
            .lines()
            .filter(|l| l.contains(&format!(" {phase:<8}  done in ")))
            .count();
        assert_eq!((started, done), (2, 2), "{phase}: {text}");
    }
    assert!(text.contains("every rank finishes step"), "{text}");
    assert!(text.contains("  #  operation  direction"), "{text}");
    assert!(text.contains("to_primary"), "{text}");

    let timeline = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let mut lines = timeline.lines();
    assert_eq!(lines.next(), Some("step,time_ms,step_ms,operation,phase"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.len() >= 6, "{timeline}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.len(), 5, "{timeline}");
        assert_eq!(
            r[0],
            (i + 1).to_string(),
            "every step, in order: {timeline}"
        );
        assert!(r[1].parse::<f64>().is_ok() && r[2].parse::<f64>().is_ok());
    }
    let ops: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r[3])
        .filter(|o| !o.is_empty())
        .collect();
    assert_eq!(ops.len(), 2, "both operations appear: {timeline}");
    assert!(
        rows.iter().any(|r| r[4].contains("switch")),
        "the step around the switch is marked: {timeline}"
    );
}

#[test]
fn hold_secs_keeps_the_metrics_endpoint_up_after_the_scenario() {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = taskd_command(&[
        "sim",
        "--nodes",
        "1",
        "--devices-per-node",
        "2",
        "--switch",
        "node-0:1",
        "--step-ms",
        "1",
        "--json",
        "--metrics-addr",
        "127.0.0.1:0",
        "--hold-secs",
        "60",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The scenario is over once the hold starts: wait for that line, then scrape.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut url = None;
    let mut seen = String::new();
    for line in (&mut stderr).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.strip_prefix("taskd sim: holding http://") {
            url = rest.split_once('/').map(|(addr, _)| addr.to_owned());
            break;
        }
    }
    let addr = url.unwrap_or_else(|| panic!("no hold line in {seen}"));
    assert!(seen.contains(&format!("Prometheus metrics at http://{addr}/metrics")));
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for series in [
        "taskd_switch_operations_total{result=\"succeeded\",direction=\"to_backup\"} 1",
        "taskd_switch_operations_total{result=\"succeeded\",direction=\"to_primary\"} 1",
        "taskd_workers_registered 2",
    ] {
        assert!(body.contains(series), "{series} in {body}");
    }
}
