//! `taskd chaos`: the seeded fault campaign (see [`crate::chaos`]).

use super::error::CliError;
use crate::chaos::process::job::ProcEnv;
use crate::chaos::{
    run_campaign_with, run_one, run_one_process, CampaignConfig, CampaignReport, RunResult,
    MAX_JOBS, MAX_SCHEDULES,
};
use clap::builder::RangedU64ValueParser;
use clap::Args;
use std::io::Write as _;
use std::process::ExitCode;
use taskd_actors::process::ShutdownSignals;

/// The flags of `taskd chaos`.
#[derive(Args)]
pub struct ChaosArgs {
    /// How many schedules to run (at most 1000000).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = RangedU64ValueParser::<u64>::new().range(1..=MAX_SCHEDULES))]
    seeds: u64,
    /// The seed of the first schedule; the next ones are S+1, S+2, ...
    #[arg(long, value_name = "S", default_value_t = 0)]
    first_seed: u64,
    /// Schedules run at once, each on a simulated job of its own (at most 64).
    #[arg(long, value_name = "J", default_value_t = 1,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_JOBS as u64))]
    jobs: usize,
    /// Run the process schedules instead: every role a `taskd` process on loopback over the
    /// real gRPC transport (this binary), with kill -9, SIGSTOP/SIGCONT and link cuts through
    /// a fault relay; a few seconds a schedule.
    #[arg(long)]
    processes: bool,
    /// With --processes: where each job keeps its logs, token and the manager's state
    /// directory (default: the system's temporary directory). The manager fsyncs its journal
    /// there: a slow disk is part of the test.
    #[arg(long, value_name = "DIR", requires = "processes")]
    scratch: Option<std::path::PathBuf>,
    /// Print what every schedule did, step by step (a failing schedule's steps are always
    /// printed).
    #[arg(long)]
    explain: bool,
    /// Print one JSON object: {schedules, violations: [{seed, invariant, detail}],
    /// operations, faults_injected, by_fault, ...}.
    #[arg(long)]
    json: bool,
    /// Run the schedules of one fault instead: `link_dies_mid_step`, a link that dies or
    /// starves while collectives are in flight, answered by an in-flight move (abort, the
    /// agreed redo point, the switch); invariant: no step lost or applied twice, the groups
    /// agree.
    #[arg(long, value_name = "FAULT", value_parser = ["link_dies_mid_step"], conflicts_with = "processes")]
    fault: Option<String>,
}

/// `--fault link_dies_mid_step`: its schedules, one line (or one JSON object), exit 1 on a
/// violation.
fn run_in_flight(a: &ChaosArgs) -> Result<ExitCode, CliError> {
    let started = std::time::Instant::now();
    let rep = crate::chaos::inflight::campaign(a.first_seed, a.seeds, a.explain);
    let mut out = std::io::stdout().lock();
    if a.json {
        let text = serde_json::to_string(&rep).map_err(|e| CliError::usage(e.to_string()))?;
        let _ = writeln!(out, "{text}");
    } else {
        let _ = writeln!(
            out,
            "chaos link_dies_mid_step: {} schedules (seeds {}..={}) in {:.1} s: the link died in {}, starved in {}; moves succeeded {}, failed {} (a rank that cannot abort); {} results a redo brought again were dropped",
            rep.schedules,
            a.first_seed,
            a.first_seed + (a.seeds - 1),
            started.elapsed().as_secs_f64(),
            rep.dead,
            rep.starved,
            rep.moves_succeeded,
            rep.moves_failed,
            rep.dropped
        );
        for v in &rep.violations {
            let _ = writeln!(
                out,
                "  seed {}: {}\n  reproduce: taskd chaos --fault link_dies_mid_step --first-seed {} --seeds 1 --explain",
                v.seed,
                v.violation.as_deref().unwrap_or(""),
                v.seed
            );
            for line in &v.trace {
                let _ = writeln!(out, "    {line}");
            }
        }
        let _ = writeln!(
            out,
            "{} passed, {} failed",
            rep.schedules - rep.violations.len() as u64,
            rep.violations.len()
        );
    }
    Ok(if rep.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the campaign; exit 1 when an invariant broke.
pub fn run(a: ChaosArgs) -> Result<ExitCode, CliError> {
    if a.first_seed.checked_add(a.seeds - 1).is_none() {
        return Err(CliError::usage(format!(
            "--first-seed {} --seeds {}: the last seed would pass {}",
            a.first_seed,
            a.seeds,
            u64::MAX
        )));
    }
    if a.fault.is_some() {
        return run_in_flight(&a);
    }
    let cfg = CampaignConfig {
        first_seed: a.first_seed,
        schedules: a.seeds,
        jobs: a.jobs,
    };
    let procs = match a.processes {
        true => {
            let bin = std::env::current_exe().map_err(|e| {
                CliError::usage(format!("--processes: cannot find this taskd binary: {e}"))
            })?;
            let mut env = ProcEnv::new(bin);
            if let Some(dir) = &a.scratch {
                std::fs::create_dir_all(dir)
                    .map_err(|e| CliError::usage(format!("--scratch {}: {e}", dir.display())))?;
                env.scratch = dir.clone();
            }
            Some(env)
        }
        false => None,
    };
    if a.processes {
        stop_jobs_on_signals()?;
    }
    let mut out = std::io::stdout().lock();
    if !a.json {
        let job = match a.processes {
            true => "a 2-node x 2-rank job of processes on loopback",
            false => "a simulated 2-node x 4-device job",
        };
        let _ = writeln!(
            out,
            "chaos: {} schedules (seeds {}..={}), {} at once, each on {job}",
            a.seeds,
            a.first_seed,
            a.first_seed + (a.seeds - 1),
            a.jobs
        );
    }
    let run = |seed| match &procs {
        Some(env) => run_one_process(env, seed),
        None => run_one(seed),
    };
    let report = run_campaign_with(&cfg, run, |r| {
        if !a.json && !crate::chaos::process::children::stopping() {
            let _ = out.write_all(schedule_text(r, a.explain, a.processes).as_bytes());
        }
    });
    if crate::chaos::process::children::stopping() {
        // A signal is stopping the campaign: the runs it cut short found nothing, and the
        // signal's thread ends the process (exit 130) once every role is killed.
        loop {
            std::thread::park();
        }
    }
    // A closed stdout (`| head`) is the reader's choice, not a failure of the run.
    let _ = out.write_all(report_text(&report, a.json).as_bytes());
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// SIGINT, SIGTERM or SIGHUP end the campaign (exit 130) and first every role's process it
/// started: they run in process groups of their own, out of reach of the terminal's signal.
fn stop_jobs_on_signals() -> Result<(), CliError> {
    let rt = super::runtime()?;
    let mut signals = rt.block_on(async { ShutdownSignals::install() })?;
    std::thread::spawn(move || {
        let sig = rt.block_on(signals.recv());
        crate::chaos::process::children::kill_all();
        eprintln!("taskd chaos: {sig}: every job's processes killed");
        std::process::exit(130);
    });
    Ok(())
}

/// What a schedule prints: nothing when it passed (unless `explain`), its violation, its
/// steps and how to run it again otherwise.
fn schedule_text(r: &RunResult, explain: bool, processes: bool) -> String {
    let mut s = String::new();
    for v in &r.violations {
        s += &format!("seed {}: VIOLATION {}: {}\n", v.seed, v.invariant, v.detail);
    }
    if explain || !r.violations.is_empty() {
        s += &format!(
            "seed {} ({:.0} ms):\n",
            r.seed,
            r.elapsed.as_secs_f64() * 1e3
        );
        for line in &r.log {
            s += &format!("  {line}\n");
        }
    }
    if !r.violations.is_empty() {
        s += &format!(
            "  reproduce: taskd chaos{} --first-seed {} --seeds 1 --explain\n",
            if processes { " --processes" } else { "" },
            r.seed
        );
    }
    s
}

/// The summary (or the JSON object).
fn report_text(r: &CampaignReport, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).expect("the report serializes") + "\n";
    }
    let kinds = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = format!(
        "\n{} schedules in {:.1} s: {} operations, {} faults injected ({})\n",
        r.schedules,
        r.elapsed_secs,
        r.operations,
        r.faults_injected,
        kinds(&r.by_fault)
    );
    if !r.commands.is_empty() {
        s += &format!("operator commands: {}\n", kinds(&r.commands));
    }
    if !r.observations.is_empty() {
        s += &format!("observed: {}\n", kinds(&r.observations));
    }
    if let Some((seed, secs)) = r.slowest {
        s += &format!("slowest schedule: seed {seed}, {secs:.2} s\n");
    }
    if r.violations.is_empty() {
        s += "no invariant broke\n";
    } else {
        let seeds: Vec<String> = r.violations.iter().map(|v| v.seed.to_string()).collect();
        s += &format!(
            "{} violations; seeds to reproduce: {}\n",
            r.violations.len(),
            seeds.join(" ")
        );
    }
    s
}
