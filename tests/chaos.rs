//! The seeded fault campaign (`taskd chaos`): a modest run of schedules through the library and
//! the binary, and the seeds the campaign found product bugs with. Every schedule ends with the
//! invariant that every communication group agrees on its NIC configuration (checked by the
//! driver on the quiet job and on the stopped fabric).

use serde_json::Value;
use std::process::Command;
use taskd::chaos::{run_campaign, run_one, CampaignConfig, Schedule};

fn chaos(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_taskd"))
        .arg("chaos")
        .args(args)
        .output()
        .expect("taskd runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_modest_campaign_breaks_no_invariant() {
    let cfg = CampaignConfig {
        first_seed: 1_000,
        schedules: 16,
        jobs: 2,
    };
    let mut seen = Vec::new();
    let report = run_campaign(&cfg, |r| seen.push(r.seed));
    let details: Vec<String> = report
        .violations
        .iter()
        .map(|v| format!("seed {} {}: {}", v.seed, v.invariant, v.detail))
        .collect();
    assert!(report.violations.is_empty(), "{}", details.join("\n"));
    seen.sort_unstable();
    assert_eq!(seen, (1_000..1_016).collect::<Vec<u64>>());
    assert_eq!(report.schedules, 16);
    assert!(report.operations >= 16, "{report:?}");
    assert_eq!(
        report.faults_injected,
        report.by_fault.values().sum::<u64>()
    );
    // The schedules mix faults of the HAL, of processes and of the network.
    for kind in ["nic_fail", "manager_kill", "worker_disconnect"] {
        assert!(report.by_fault.contains_key(kind), "{kind}: {report:?}");
    }
}

#[test]
fn a_seed_reproduces_its_schedule_and_its_faults() {
    for seed in [3, 77] {
        assert_eq!(Schedule::generate(seed), Schedule::generate(seed));
        let (a, b) = (run_one(seed), run_one(seed));
        assert!(a.violations.is_empty(), "{:?}\n{}", a.violations, a.log.join("\n"));
        assert!(b.violations.is_empty(), "{:?}", b.violations);
        // Which faults fired is the schedule's, not the timing's.
        assert_eq!(a.faults, b.faults, "seed {seed}");
        assert!(!a.log.is_empty());
    }
}

#[test]
fn the_command_prints_json_and_exits_by_its_findings() {
    let (code, out, err) = chaos(&["--seeds", "2", "--first-seed", "10", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["schedules"], 2);
    assert_eq!(v["violations"], serde_json::json!([]));
    assert!(v["operations"].as_u64().unwrap() >= 2, "{v:#}");
    let by_fault = v["by_fault"].as_object().expect("by_fault");
    let sum: u64 = by_fault.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(v["faults_injected"].as_u64(), Some(sum));

    let (code, out, _) = chaos(&["--seeds", "1", "--first-seed", "10", "--explain"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("seed 10 ("), "{out}");
    assert!(out.contains("the end (recovery contract)"), "{out}");
    assert!(out.contains("no invariant broke"), "{out}");
}

#[test]
fn bad_input_exits_2_naming_the_value() {
    for (args, needle) in [
        (vec!["--seeds", "0"], "--seeds"),
        (vec!["--seeds", "1000001"], "--seeds"),
        (vec!["--jobs", "0"], "--jobs"),
        (vec!["--seeds", "x"], "x"),
        (
            vec!["--first-seed", "18446744073709551615", "--seeds", "2"],
            "--first-seed 18446744073709551615 --seeds 2",
        ),
    ] {
        let (code, out, err) = chaos(&args);
        assert_eq!(code, 2, "{args:?}: {out}\n{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Found by the campaign (seed 545: a schedule with a hang longer than HCCL's
/// timeout). A rank's NIC-set call hangs past its peers' HCCL timeout (rank 4: 1.19 s, peers
/// give up after 1 s). The switch deadline passes first, and `Operation::handle`
/// (core/src/operation.rs) answers the deadline in `Phase::Switch` by broadcasting the
/// rollback at once, while every rank is still inside its switch calls. Each worker queues the
/// rollback behind them (`actors/src/worker.rs`, `hal_loop`), and the peers, once their calls
/// timed out, start the rollback's calls while rank 4 is still one call behind: rank 4's late
/// switch call on `hccl_world_group` (and then `tp_1`, `dp_0`) pairs with its peers' rollback
/// call on that group, with different `ranks`/`useBackup` arguments. The simulator answers
/// HCCL_E_PARA and records the broken rule ("mismatched HcclCommWorkingDevNicSet arguments");
/// on real HCCL, members calling with different arguments is undefined (a hang at best). The
/// job ends paused, and every `recover` fails the same way until the calls drain.
///
/// Fix (in the operation machine): after a switch deadline, broadcast the rollback only once
/// every rank has answered the switch (each answers when its calls return, which HCCL's own
/// timeout bounds) or is lost, under a deadline of its own past which the job stays paused.
#[test]
#[ignore = "product bug: the rollback is sent while ranks are still inside timed-out switch calls"]
fn seed_545_a_rollback_never_pairs_with_a_late_switch_call() {
    let r = run_one(545);
    assert!(r.violations.is_empty(), "{:?}\n{}", r.violations, r.log.join("\n"));
}
