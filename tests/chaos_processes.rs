//! The process fault campaign (`taskd chaos --processes`): a few schedules on jobs whose every
//! role is a `taskd` process on loopback over gRPC, through the library and the binary. Every
//! schedule ends by checking, from the ranks' own reports, that every communication group
//! agrees on its NIC configuration and that the manager's table is what the ranks hold.

mod common;

use common::taskd;
use serde_json::Value;
use taskd::chaos::process::job::ProcEnv;
use taskd::chaos::process::schedule::{Fault, LandAt, ProcSchedule, Step};
use taskd::chaos::run_one_process;

/// Where the jobs keep their files: the system's temporary directory, on the disk. The
/// manager writes its journal there (two `fsync`s a record) off its actor's thread, so a
/// loaded disk delays its operations without silencing its transport (RELIABILITY.md,
/// section 6, finding A).
fn scratch() -> std::path::PathBuf {
    std::env::temp_dir()
}

/// The fault a switch of the schedule meets, or a fault alone.
fn faults(s: &ProcSchedule) -> Vec<&Fault> {
    s.steps
        .iter()
        .filter_map(|st| match st {
            Step::Switch { fault: Some(f), .. } | Step::Fault(f) => Some(f),
            _ => None,
        })
        .collect()
}

/// The first seed from 0 whose schedule has a switch that meets a fault `pick` chooses.
fn seed_with(pick: impl Fn(&Fault) -> bool) -> u64 {
    (0..10_000)
        .find(|seed| {
            let s = ProcSchedule::generate(*seed);
            s.steps
                .iter()
                .any(|st| matches!(st, Step::Switch { fault: Some(f), .. } if pick(f)))
        })
        .expect("a seed with that fault")
}

/// Every fault of schedule `s` landed in run `r`, but for the disk faults of a state
/// directory with no file system of its own (not root: skipped, and said so).
fn assert_landed(s: &ProcSchedule, r: &taskd::chaos::RunResult) {
    let skipped = r
        .observations
        .get("disk_fault_skipped")
        .copied()
        .unwrap_or(0);
    assert_eq!(
        r.faults.values().sum::<u64>() + skipped,
        faults(s).len() as u64,
        "seed {}: every fault of the schedule landed\n{}",
        s.seed,
        r.log.join("\n")
    );
}

#[test]
fn process_schedules_with_a_killed_manager_a_cut_link_and_a_frozen_proxy_break_no_invariant() {
    let env = ProcEnv {
        bin: env!("CARGO_BIN_EXE_taskd").into(),
        scratch: scratch(),
    };
    let seeds = [
        seed_with(|f| *f == Fault::KillManager),
        seed_with(|f| matches!(f, Fault::Cut { .. } | Fault::Blackhole { .. })),
        seed_with(|f| matches!(f, Fault::Freeze { proxy: Some(_), .. })),
    ];
    for seed in seeds {
        let s = ProcSchedule::generate(seed);
        let r = run_one_process(&env, seed);
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}\n{}",
            r.violations,
            r.log.join("\n")
        );
        assert_landed(&s, &r);
        // The end's new switch at least, and the ranks' views were read and compared.
        assert!(r.operations >= 1, "{}", r.log.join("\n"));
        assert!(
            r.log.iter().any(|l| l.contains("every group agrees")),
            "{}",
            r.log.join("\n")
        );
    }
}

/// A switch whose admission meets a frozen state directory (refused `JOURNAL_FAILING` once
/// the journal timeout passes), one whose result meets a full one, one whose result meets a
/// frozen one: no invariant breaks, and the job runs and switches again once they heal. As
/// root the state directory is a file system of its own; elsewhere the faults are skipped.
#[test]
fn process_schedules_with_a_full_and_a_frozen_state_directory_break_no_invariant() {
    let env = ProcEnv {
        bin: env!("CARGO_BIN_EXE_taskd").into(),
        scratch: scratch(),
    };
    let disk_at = |freeze: bool, before: bool| {
        (0..10_000)
            .find(|seed| {
                let s = ProcSchedule::generate(*seed);
                s.steps.iter().any(|st| {
                    matches!(st, Step::Switch { at, fault: Some(f), .. }
                        if (*at == LandAt::Before) == before
                            && matches!(f, Fault::FreezeDisk { .. }) == freeze
                            && f.is_disk())
                })
            })
            .expect("a seed with that disk fault")
    };
    let seeds = [
        disk_at(true, true),
        disk_at(false, false),
        disk_at(true, false),
    ];
    for seed in seeds {
        let s = ProcSchedule::generate(seed);
        let r = run_one_process(&env, seed);
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}\n{}",
            r.violations,
            r.log.join("\n")
        );
        assert_landed(&s, &r);
        if r.observations.contains_key("disk_fault_skipped") {
            eprintln!("seed {seed}: the disk faults were skipped: {:?}", r.log);
        }
        assert!(
            r.log.iter().any(|l| l.contains("every group agrees")),
            "{}",
            r.log.join("\n")
        );
    }
}

#[test]
fn the_binary_runs_process_schedules_and_reports_them_as_json() {
    let dir = scratch().display().to_string();
    let args = [
        "chaos",
        "--processes",
        "--seeds",
        "1",
        "--json",
        "--scratch",
        &dir,
    ];
    let (code, out, err) = taskd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["schedules"], 1);
    assert_eq!(v["violations"].as_array().map(Vec::len), Some(0), "{out}");
    assert!(v["operations"].as_u64() >= Some(1), "{out}");
}

/// How many live processes run a role of `job` (the roles carry `--job-id JOB`).
fn roles_of(job: &str) -> usize {
    let needle = format!("--job-id\0{job}\0");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .count()
}

/// Polls `done` every 20 ms until it holds or `within` passed; whether it held.
fn eventually(within: std::time::Duration, done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    done()
}

#[test]
fn a_campaign_stopped_by_sigterm_kills_every_role_it_started() {
    let seed = "987654321";
    let job = format!("chaos-{seed}");
    let dir = scratch().display().to_string();
    let args = [
        "chaos",
        "--processes",
        "--seeds",
        "1",
        "--first-seed",
        seed,
        "--scratch",
        &dir,
    ];
    let campaign = common::taskd_command(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("taskd chaos starts");
    let wait = std::time::Duration::from_secs(30);
    // The manager, two proxies and some workers: every role in a process group of its own.
    assert!(
        eventually(wait, || roles_of(&job) >= 4),
        "the job never ran"
    );
    let campaign_pid = campaign.id();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &campaign.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(term.success());
    let out = campaign.wait_with_output().expect("the campaign exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{err}{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("SIGTERM: every job's processes killed"),
        "{err}"
    );
    assert!(
        eventually(wait, || roles_of(&job) == 0),
        "{} roles of {job} outlived the campaign",
        roles_of(&job)
    );
    // A campaign stopped by a signal keeps its job's files, as a failing schedule does.
    let kept = scratch().join(format!("taskd-chaos-{}-{seed}", campaign_pid));
    assert!(kept.is_dir(), "{}", kept.display());
    let _ = std::fs::remove_dir_all(kept);
}

#[test]
fn a_scratch_directory_needs_the_process_mode_and_must_be_usable() {
    let (code, _, err) = taskd(&["chaos", "--scratch", "/tmp"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--processes"), "{err}");
    let (code, _, err) = taskd(&["chaos", "--processes", "--scratch", "/proc/taskd-no"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--scratch /proc/taskd-no"), "{err}");
}
