//! The seeded fault campaign behind `taskd chaos`: many small, deterministic schedules of
//! faults and operator commands, each run on a simulated job in this process (the production
//! manager, proxy and worker actors on the simulated fabric), each checked against the
//! invariants of the recovery contract (docs/recovery.md; the list is in [`driver`]).
//!
//! `taskd chaos --processes` runs smaller schedules ([`process::schedule`]) on a job whose
//! every role is a `taskd` process on loopback, over the real gRPC transport, with links
//! through a [`relay::FaultRelay`] (simulated network failure), checked from outside
//! ([`process::run`]).
//!
//! A seed determines its schedule completely ([`Schedule::generate`], drawn from
//! [`rng::SplitMix64`]; no clock, no OS randomness), so a violation is reported with the seed
//! that re-runs the same schedule. What a seed cannot fix is the interleaving of the actors'
//! threads with the schedule's events (a phase a disruption waits for may end a little
//! before or after it lands), so a timing-dependent finding may need a few runs of its seed.

pub mod answers;
pub mod driver;
pub mod inflight;
pub mod process;
pub mod relay;
pub mod rng;
pub mod schedule;

pub use driver::{RunResult, Violation};
pub use schedule::Schedule;

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// The most schedules one campaign runs.
pub const MAX_SCHEDULES: u64 = 1_000_000;

/// The most schedules run at once.
pub const MAX_JOBS: usize = 64;

/// Which schedules to run, and how many at once.
#[derive(Clone, Debug)]
pub struct CampaignConfig {
    /// The seed of the first schedule; the others follow it.
    pub first_seed: u64,
    /// How many schedules.
    pub schedules: u64,
    /// How many run at once (each on a simulated job of its own).
    pub jobs: usize,
}

/// What a campaign found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CampaignReport {
    /// Schedules run.
    pub schedules: u64,
    /// Every broken invariant, by seed.
    pub violations: Vec<Violation>,
    /// Operations the managers admitted.
    pub operations: u64,
    /// Faults injected in all.
    pub faults_injected: u64,
    /// Faults injected, by kind.
    pub by_fault: BTreeMap<String, u64>,
    /// An operator's unusual commands (concurrent, repeated and reused uuids, recoveries),
    /// by kind.
    pub commands: BTreeMap<String, u64>,
    /// Behaviour that breaks no invariant but is worth knowing, by kind.
    pub observations: BTreeMap<String, u64>,
    /// Wall time of the campaign, in seconds.
    pub elapsed_secs: f64,
    /// The slowest schedule: its seed and wall time in seconds.
    pub slowest: Option<(u64, f64)>,
}

impl CampaignReport {
    fn add(&mut self, r: &RunResult) {
        self.schedules += 1;
        self.violations.extend(r.violations.iter().cloned());
        self.operations += r.operations;
        for (kind, n) in &r.faults {
            self.faults_injected += n;
            *self.by_fault.entry((*kind).to_owned()).or_default() += n;
        }
        for (kind, n) in &r.commands {
            *self.commands.entry((*kind).to_owned()).or_default() += n;
        }
        for (kind, n) in &r.observations {
            *self.observations.entry((*kind).to_owned()).or_default() += n;
        }
        let secs = r.elapsed.as_secs_f64();
        if self.slowest.map_or(true, |(_, s)| secs > s) {
            self.slowest = Some((r.seed, secs));
        }
    }
}

/// Runs the schedule of `seed`; a panic (of the driver or of product code it called) is a
/// violation of its own.
pub fn run_one(seed: u64) -> RunResult {
    caught(seed, || driver::run(&Schedule::generate(seed)))
}

/// Runs the process schedule of `seed` ([`process::schedule::ProcSchedule`]) on a job of `taskd`
/// processes started as `env` says; a panic of the driver is a violation.
pub fn run_one_process(env: &process::job::ProcEnv, seed: u64) -> RunResult {
    caught(seed, || {
        process::run::run(env, &process::schedule::ProcSchedule::generate(seed))
    })
}

fn caught(seed: u64, run: impl FnOnce() -> RunResult + std::panic::UnwindSafe) -> RunResult {
    std::panic::catch_unwind(run).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        RunResult {
            seed,
            violations: vec![Violation {
                seed,
                invariant: "panic",
                detail: format!("the schedule panicked: {what}"),
            }],
            ..RunResult::default()
        }
    })
}

/// Runs the campaign, handing each schedule's result to `each` (on this thread, in the order
/// they finish) as it comes.
pub fn run_campaign(cfg: &CampaignConfig, each: impl FnMut(&RunResult)) -> CampaignReport {
    run_campaign_with(cfg, run_one, each)
}

/// [`run_campaign`] with `run` carrying out each seed's schedule (e.g. [`run_one_process`]).
pub fn run_campaign_with(
    cfg: &CampaignConfig,
    run: impl Fn(u64) -> RunResult + Sync,
    mut each: impl FnMut(&RunResult),
) -> CampaignReport {
    let started = Instant::now();
    let mut report = CampaignReport::default();
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..cfg.jobs.max(1) {
            let tx = tx.clone();
            let (next, run) = (&next, &run);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cfg.schedules {
                    return;
                }
                let seed = cfg.first_seed.wrapping_add(i);
                if tx.send(run(seed)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        for r in rx {
            report.add(&r);
            each(&r);
        }
    });
    report.violations.sort_by_key(|v| v.seed);
    report.elapsed_secs = started.elapsed().as_secs_f64();
    report
}
