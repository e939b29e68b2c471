//! `taskd sim`: a simulated job in this process, through a switch to backup and back.

use crate::progress::{self, ProgressPrinter};
use crate::sim::{run_scenario_observed, SimConfig, SimError};
use clap::Args;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use taskd_core::{DeviceId, GlobalRank, NodeName};

#[derive(Args)]
pub struct SimArgs {
    /// Number of nodes (named node-0 .. node-{N-1}).
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// Devices (ranks) per node; rank = node_index * D + device.
    #[arg(long, default_value_t = 16)]
    devices_per_node: u32,
    /// Targets of operation 1, as NODE:DEV[,DEV...]; repeatable. Default node-1:0,8.
    #[arg(long = "switch", value_name = "NODE:DEV[,DEV...]", value_parser = parse_switch)]
    switch: Vec<(NodeName, Vec<DeviceId>)>,
    /// In operation 1, the first NIC-set call on this global rank fails with HCCL_E_NETWORK (19).
    #[arg(long, value_name = "R")]
    fail_rank: Option<u32>,
    /// In operation 1, the first NIC-set call on this global rank hangs, then fails with
    /// HCCL_E_TIMEOUT (9). Needs --hang-ms.
    #[arg(long, value_name = "R", requires = "hang_ms")]
    hang_rank: Option<u32>,
    /// How long the hang of --hang-rank lasts.
    #[arg(long, value_name = "MS", requires = "hang_rank")]
    hang_ms: Option<u64>,
    /// Deadline of the switch phase.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    switch_timeout_ms: u64,
    /// Deadline of each pause part, of the rollback and of the resume.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    phase_timeout_ms: u64,
    /// Simulated compute time of one training step.
    #[arg(long, value_name = "MS", default_value_t = 2)]
    step_ms: u64,
    /// Ranks whose HCCL runs without L2 retry (a switch must then be refused); repeatable.
    #[arg(long = "l2-off-rank", value_name = "R")]
    l2_off_rank: Vec<u32>,
    /// Print one JSON object instead of the live progress and the table.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while the simulation runs (port 0
    /// picks a free port; the address is printed on stderr).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Keep the metrics endpoint up this long after the scenario, so it can be scraped.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "metrics_addr")]
    hold_secs: u64,
    /// Write a per-step timeline as CSV (step, time_ms, step_ms, operation, phase) to FILE,
    /// to plot step time around each operation.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    serve: super::serve::ServeArgs,
}

pub fn parse_switch(s: &str) -> Result<(NodeName, Vec<DeviceId>), String> {
    let (node, devs) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected NODE:DEV[,DEV...], e.g. node-1:0,8"))?;
    if node.is_empty() {
        return Err(format!("{s:?}: the node name is empty"));
    }
    let devs = devs
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<u32>()
                .map(DeviceId)
                .map_err(|_| format!("{s:?}: {d:?} is not a device number"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((NodeName(node.to_owned()), devs))
}

pub fn run(a: SimArgs) -> ExitCode {
    let defaults = SimConfig::default();
    let phase = Duration::from_millis(a.phase_timeout_ms);
    let cfg = SimConfig {
        nodes: a.nodes,
        devices_per_node: a.devices_per_node,
        switch: if a.switch.is_empty() {
            defaults.switch
        } else {
            a.switch
        },
        fail_rank: a.fail_rank.map(GlobalRank),
        hang: a
            .hang_rank
            .zip(a.hang_ms)
            .map(|(r, ms)| (GlobalRank(r), Duration::from_millis(ms))),
        l2_retry_off: a.l2_off_rank.into_iter().map(GlobalRank).collect(),
        deadlines: taskd_core::PhaseDeadlines {
            pause: phase,
            switch: Duration::from_millis(a.switch_timeout_ms),
            rollback: phase,
            resume: phase,
        },
        step_time: Duration::from_millis(a.step_ms),
        ..defaults
    };
    let metrics = match a.metrics_addr.map(taskd_actors::telemetry::serve_metrics) {
        None => None,
        Some(Ok(m)) => {
            eprintln!("taskd sim: Prometheus metrics at {}", m.url());
            Some(m)
        }
        Some(Err(e)) => {
            eprintln!("taskd sim: {e}");
            return ExitCode::from(2);
        }
    };
    if a.serve.serve {
        return super::serve::run(cfg, a.serve);
    }
    let code = run_and_report(&cfg, a.json, a.timeline.as_deref());
    if let Some(m) = metrics.filter(|_| a.hold_secs > 0) {
        eprintln!(
            "taskd sim: holding {} for {} s (Ctrl-C ends it)",
            m.url(),
            a.hold_secs
        );
        std::thread::sleep(Duration::from_secs(a.hold_secs));
    }
    code
}

/// Runs the scenario, printing live progress and the final table (or the JSON report).
fn run_and_report(cfg: &SimConfig, json: bool, timeline: Option<&std::path::Path>) -> ExitCode {
    // Refuse an unwritable timeline before running anything.
    let mut timeline_file = match timeline.map(std::fs::File::create).transpose() {
        Ok(f) => f.map(std::io::BufWriter::new),
        Err(e) => {
            let path = timeline
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            eprintln!("taskd sim: cannot write the timeline to {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut printer = (!json).then(ProgressPrinter::stdout);
    let heading_text = format!(
        "simulated job: {} nodes x {} devices = {} ranks (mock HAL, simulated fabric)",
        cfg.nodes,
        cfg.devices_per_node,
        cfg.nodes * cfg.devices_per_node
    );
    let mut heading = true;
    // A closed stdout (`| head`) is the reader's choice, not a failure of the run: write
    // errors are ignored throughout.
    let res = run_scenario_observed(cfg, |ev| {
        if let Some(p) = printer.as_mut() {
            if std::mem::take(&mut heading) {
                let _ = p.line(&heading_text);
            }
            let _ = p.event(ev);
        }
    });
    if let Some(p) = printer.as_mut() {
        let _ = p.finish();
    }
    match res {
        Ok(run) => {
            let report = run.report;
            if let (Some(f), Some(path)) = (timeline_file.as_mut(), timeline) {
                if let Err(e) = run.timeline.write_csv(f).and_then(|_| f.flush()) {
                    eprintln!(
                        "taskd sim: cannot write the timeline to {}: {e}",
                        path.display()
                    );
                    return ExitCode::from(1);
                }
            }
            let text = if json {
                serde_json::to_string_pretty(&report).expect("the report serializes") + "\n"
            } else {
                // Every command was refused before it ran: no event printed the heading.
                let head = if heading {
                    heading_text + "\n"
                } else {
                    String::new()
                };
                format!(
                    "{head}\n{}\n{}",
                    progress::table(&report.operations),
                    report.end_text()
                )
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            if report.invariants.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e @ (SimError::Target(_) | SimError::Setup(_))) => {
            eprintln!("taskd sim: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("taskd sim: the simulation could not complete: {e}");
            ExitCode::from(1)
        }
    }
}
