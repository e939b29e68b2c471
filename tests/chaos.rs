//! The seeded fault campaign (`taskd chaos`): a modest run of schedules through the library and
//! the binary, and the seeds the campaign found product bugs with. Every schedule ends with the
//! invariant that every communication group agrees on its NIC configuration (checked by the
//! driver on the quiet job and on the stopped fabric).

mod common;

use common::taskd;
use serde_json::Value;
use taskd::chaos::{run_campaign, run_one, CampaignConfig, Schedule};

fn chaos(args: &[&str]) -> (i32, String, String) {
    taskd(&[&["chaos"], args].concat())
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
        assert!(
            a.violations.is_empty(),
            "{:?}\n{}",
            a.violations,
            a.log.join("\n")
        );
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

/// Runs `seed`'s schedule up to `runs` times (its steps are the seed's; the actors' timing is
/// not) and fails at the first violation.
fn never_violates(seed: u64, runs: usize) {
    for run in 1..=runs {
        let r = run_one(seed);
        assert!(
            r.violations.is_empty(),
            "run {run}: {:?}\n{}",
            r.violations,
            r.log.join("\n")
        );
    }
}

/// Found by the campaign (seed 545; fails on every run). A rank's NIC-set call hangs past its
/// peers' HCCL timeout (rank 4: 1.19 s; peers give up after 1 s). The switch deadline passes
/// first, and the operation machine (`core/src/operation.rs`: `Operation::advance` ->
/// `after_failure` in `Phase::Switch`) broadcasts the rollback at once, while every rank is
/// still inside its switch calls. Each worker queues the rollback behind them
/// (`actors/src/worker.rs`, `hal_loop`); the peers, whose calls timed out, start the rollback's
/// calls while rank 4 is still one call behind, so rank 4's late switch call on a group
/// (`hccl_world_group`, then `tp_1`, `dp_0`) pairs with its peers' rollback call there, with
/// other `ranks`/`useBackup` arguments. The simulator answers HCCL_E_PARA and records the broken
/// rule ("mismatched HcclCommWorkingDevNicSet arguments"); on real HCCL, members calling with
/// different arguments is undefined. The job ends paused.
///
/// Fixed in the operation machine (`core/src/operation.rs`, `after_failure`): the rollback goes
/// out only once every live rank has answered the switch; past the switch deadline with ranks
/// still inside their calls the operation ends paused without calling HCCL again.
#[test]
fn seed_545_a_rollback_never_pairs_with_a_late_switch_call() {
    never_violates(545, 3);
}

/// Found by the campaign (seed 1274; fails on about one run in three: it needs the lost
/// worker's connection to close before the switch directive reaches it). Rank 7's connection
/// closes as the switch starts; its process lives on but gets no directive. The manager fails
/// the operation (`WorkerLost`) and rolls back at once among the other ranks
/// (`core/src/operation.rs`, `after_failure` in `Phase::Switch`). Every NIC-set call, of the
/// switch and of the rollback, on a group rank 7 belongs to (`hccl_world_group`, `tp_1`,
/// `dp_3`) can only time out, and the members time out at different moments (rank 3 started
/// 105 ms late behind an injected hang), so from then on their calls on `tp_0` pair with
/// different calls: rank 3's switch call with ranks 0-2's rollback call (mismatched arguments).
/// Fixed: with a rank lost in the switch, nothing more is called (calls on its groups cannot
/// complete); the operation ends `needs_recovery` with the gates held, for the verification and
/// recovery once the rank is back.
#[test]
fn seed_1274_no_calls_on_the_groups_of_a_lost_rank() {
    never_violates(1274, 8);
}

/// Found by the campaign (seed 914; fails on about one run in three). The consequence of seed
/// 545's bug: once the members of a group are at different calls (a hang of 1.21 s past HCCL's
/// timeout), every later NIC-set call on that group pairs wrongly or waits alone until HCCL's
/// timeout, so each `recover` (an operation whose calls queue behind the backlog on every
/// worker) misses its switch deadline and adds more calls to the backlog: the job stays paused
/// after five recoveries, each tried once no rank was inside a NIC-set call. Fixed besides seed
/// 545's fix: `JobLedger::recover` (`core/src/ledger.rs`) refuses (`InCalls`, naming the ranks)
/// while ranks have not answered the NIC-set phase the previous operation ended in, so a
/// recovery never queues behind calls that cannot complete; the campaign's operator retries.
#[test]
fn seed_914_a_desynchronized_job_can_still_be_recovered() {
    never_violates(914, 5);
}

#[test]
fn recovery_schedules_restart_the_job_once_per_fault_and_never_stop_a_degraded_one() {
    use taskd::chaos::schedule::{CutStop, Step};
    // The first recovery schedules that, between them, kill a process, stop training while a
    // node is cut off (by an operator and by the hold policy) and lose a proxy with nothing in
    // flight.
    let mut wanted = ["kill", "operator", "policy", "away"].to_vec();
    let mut seeds = Vec::new();
    for seed in 0..500 {
        let s = Schedule::generate(seed);
        if s.recovery.is_none() {
            continue;
        }
        let has = |k: &str| {
            s.steps.iter().any(|step| match (k, step) {
                ("kill", Step::KillRank { .. }) => true,
                ("operator", Step::StopWhileCut { by, .. }) => *by == CutStop::Operator,
                ("policy", Step::StopWhileCut { by, .. }) => *by != CutStop::Operator,
                ("away", Step::ProxyAway { .. }) => true,
                _ => false,
            })
        };
        if wanted.iter().any(|k| has(k)) {
            wanted.retain(|k| !has(k));
            seeds.push(seed);
        }
        if wanted.is_empty() {
            break;
        }
    }
    assert!(wanted.is_empty(), "{wanted:?}");
    let mut observed = std::collections::BTreeMap::new();
    for seed in seeds {
        let r = run_one(seed);
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}\n{}",
            r.violations,
            r.log.join("\n")
        );
        for (k, n) in r.observations {
            *observed.entry(k).or_insert(0) += n;
        }
    }
    for what in [
        "job_restarted_after_a_fault",
        "old_processes_back_after_a_cut_were_told_to_stop_again",
        "degraded_job_ran_again_once_its_proxy_was_back",
    ] {
        assert!(observed.contains_key(what), "{what}: {observed:?}");
    }
}
