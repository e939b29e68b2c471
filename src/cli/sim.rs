//! `taskd sim`: a simulated job in this process, through a switch to backup and back.

use super::auto::AutoArgs;
use super::error::CliError;
use super::flags;
use crate::sim::progress::{self, ProgressPrinter};
use crate::sim::{
    run_scenario_observed, LinkEvent, ScenarioRun, SimConfig, SimError, MAX_SIM_RANKS,
};
use clap::Args;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use taskd_core::rank_table::MAX_NODES;
use taskd_core::{DeviceId, GlobalRank, NodeName};

/// The flags of `taskd sim`: the simulated job's size, the targets, the faults to inject,
/// the deadlines and the outputs (docs/simulator.md).
#[derive(Args)]
pub struct SimArgs {
    /// Number of nodes (named node-0 .. node-{N-1}).
    #[arg(long, default_value_t = 4, value_parser = flags::count(MAX_NODES))]
    nodes: u32,
    /// Devices (ranks) per node; rank = node_index * D + device. At most 65536 simulated
    /// ranks in all, and no more than the machine's available memory holds.
    #[arg(long, default_value_t = 16, value_parser = flags::count(MAX_SIM_RANKS as usize))]
    devices_per_node: u32,
    /// Targets of operation 1, as NODE:DEV[,DEV...]; repeatable. Default node-1:0,8 (with
    /// --auto-failover: no operator operation unless given).
    #[arg(long = "switch", value_name = "NODE:DEV[,DEV...]", value_parser = parse_switch)]
    switch: Vec<(NodeName, Vec<DeviceId>)>,
    #[command(flatten)]
    auto: AutoArgs,
    /// With --auto-failover: the NIC port of NODE:DEV (DEV's primary, its partner die's
    /// backup) goes down MS after training started; repeatable.
    #[arg(long = "link-down", value_name = "NODE:DEV@MS", requires = "auto_failover", conflicts_with = "serve", value_parser = parse_link_down)]
    link_down: Vec<LinkEvent>,
    /// With --auto-failover: the port comes back up at MS; repeatable.
    #[arg(long = "link-up", value_name = "NODE:DEV@MS", requires = "auto_failover", conflicts_with = "serve", value_parser = parse_link_up)]
    link_up: Vec<LinkEvent>,
    /// With --auto-failover: the port goes down at MS, then changes every PERIOD_MS, COUNT
    /// changes in all (odd: it ends down); repeatable.
    #[arg(long = "link-flap", value_name = "NODE:DEV@MS:PERIOD_MS:COUNT", requires = "auto_failover", conflicts_with = "serve", value_parser = parse_link_flap)]
    link_flap: Vec<Vec<LinkEvent>>,
    /// In operation 1, the first NIC-set call on this global rank fails with HCCL_E_NETWORK (19).
    #[arg(long, value_name = "R")]
    fail_rank: Option<u32>,
    /// In operation 1, the first NIC-set call on this global rank hangs, then fails with
    /// HCCL_E_TIMEOUT (9). Needs --hang-ms.
    #[arg(long, value_name = "R", requires = "hang_ms")]
    hang_rank: Option<u32>,
    /// How long the hang of --hang-rank lasts (at most one day).
    #[arg(long, value_name = "MS", requires = "hang_rank", value_parser = flags::hang_ms())]
    hang_ms: Option<u64>,
    /// Deadline of the switch phase (1 ms to one day).
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = flags::deadline_ms())]
    switch_timeout_ms: u64,
    /// Deadline of each pause part, of the rollback and of the resume (1 ms to one day).
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = flags::deadline_ms())]
    phase_timeout_ms: u64,
    /// Simulated compute time of one training step (at most 60000).
    #[arg(long, value_name = "MS", default_value_t = 2, value_parser = flags::step_ms())]
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
    /// Keep the metrics endpoint up this long after the scenario, so it can be scraped (at
    /// most one day).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "metrics_addr", value_parser = flags::hold_secs())]
    hold_secs: u64,
    /// Write a per-step timeline as CSV (step, time_ms, step_ms, operation, phase) to FILE,
    /// to plot step time around each operation.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    serve: super::serve::ServeArgs,
}

/// `--switch NODE:DEV[,DEV...]`, e.g. `node-1:0,8`, refused with a message naming the bad
/// part; whether the node and devices exist is checked later against the job's size.
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

/// `NODE:DEV@MS`: a port and a time in milliseconds (at most one day).
fn parse_port_at(s: &str) -> Result<(NodeName, DeviceId, u64), String> {
    let (port, ms) = s
        .rsplit_once('@')
        .ok_or_else(|| format!("{s:?}: expected NODE:DEV@MS, e.g. node-1:0@500"))?;
    let (node, devs) = parse_switch(port)?;
    let [device] = devs[..] else {
        return Err(format!("{s:?}: name one device"));
    };
    let ms = parse_ms(s, ms)?;
    Ok((node, device, ms))
}

fn parse_ms(s: &str, ms: &str) -> Result<u64, String> {
    match ms.trim().parse::<u64>() {
        Ok(v) if v <= flags::MAX_DEADLINE_MS => Ok(v),
        _ => Err(format!(
            "{s:?}: {ms:?} is not a number of milliseconds up to {}",
            flags::MAX_DEADLINE_MS
        )),
    }
}

fn link_event(node: NodeName, device: DeviceId, ms: u64, up: bool) -> LinkEvent {
    LinkEvent {
        at: Duration::from_millis(ms),
        node,
        device,
        up,
    }
}

fn parse_link_down(s: &str) -> Result<LinkEvent, String> {
    let (node, device, ms) = parse_port_at(s)?;
    Ok(link_event(node, device, ms, false))
}

fn parse_link_up(s: &str) -> Result<LinkEvent, String> {
    let (node, device, ms) = parse_port_at(s)?;
    Ok(link_event(node, device, ms, true))
}

/// The most changes one `--link-flap` makes.
const MAX_FLAP_COUNT: u64 = 10_000;

/// `NODE:DEV@MS:PERIOD_MS:COUNT`: COUNT changes, down first, PERIOD_MS apart.
fn parse_link_flap(s: &str) -> Result<Vec<LinkEvent>, String> {
    let bad = || format!("{s:?}: expected NODE:DEV@MS:PERIOD_MS:COUNT, e.g. node-1:0@500:100:6");
    let (port, rest) = s.rsplit_once('@').ok_or_else(bad)?;
    let mut parts = rest.split(':');
    let (Some(ms), Some(period), Some(count), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let (node, device, start) = parse_port_at(&format!("{port}@{ms}"))?;
    let period = parse_ms(s, period)?;
    let count = match count.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_FLAP_COUNT).contains(&n) => n,
        _ => return Err(format!("{s:?}: COUNT must be 1 to {MAX_FLAP_COUNT}")),
    };
    Ok((0..count)
        .map(|i| link_event(node.clone(), device, start + i * period, i % 2 == 1))
        .collect())
}

impl SimArgs {
    /// The scenario these flags describe (checked by [`SimConfig::validate`] when it runs).
    fn config(&self) -> SimConfig {
        let defaults = SimConfig::default();
        let phase = Duration::from_millis(self.phase_timeout_ms);
        let auto = self.auto.config();
        let mut links: Vec<LinkEvent> = self.link_down.clone();
        links.extend(self.link_up.iter().cloned());
        links.extend(self.link_flap.iter().flatten().cloned());
        SimConfig {
            nodes: self.nodes,
            devices_per_node: self.devices_per_node,
            switch: match (self.switch.is_empty(), auto.is_some()) {
                (false, _) => self.switch.clone(),
                (true, false) => defaults.switch.clone(),
                // Automatic failover alone: only the link events.
                (true, true) => Vec::new(),
            },
            auto,
            links,
            fail_rank: self.fail_rank.map(GlobalRank),
            hang: self
                .hang_rank
                .zip(self.hang_ms)
                .map(|(r, ms)| (GlobalRank(r), Duration::from_millis(ms))),
            l2_retry_off: self.l2_off_rank.iter().copied().map(GlobalRank).collect(),
            deadlines: taskd_core::PhaseDeadlines {
                pause: phase,
                switch: Duration::from_millis(self.switch_timeout_ms),
                rollback: phase,
                resume: phase,
            },
            step_time: Duration::from_millis(self.step_ms),
            ..defaults
        }
    }
}

/// Runs the scenario (or, with `--serve`, the live rig) and reports.
pub fn run(a: SimArgs) -> Result<ExitCode, CliError> {
    let cfg = a.config();
    cfg.validate()?;
    let metrics = match a.metrics_addr {
        None => None,
        Some(addr) => {
            let m = taskd_actors::telemetry::serve_metrics(addr)
                .map_err(|e| CliError::usage(e.to_string()))?;
            eprintln!("taskd sim: Prometheus metrics at {}", m.url());
            Some(m)
        }
    };
    if a.serve.serve {
        return super::serve::run(cfg, a.serve);
    }
    let code = run_and_report(&cfg, a.json, a.timeline.as_deref())?;
    if let Some(m) = metrics.filter(|_| a.hold_secs > 0) {
        eprintln!(
            "taskd sim: holding {} for {} s (Ctrl-C ends it)",
            m.url(),
            a.hold_secs
        );
        std::thread::sleep(Duration::from_secs(a.hold_secs));
    }
    Ok(code)
}

/// Runs the scenario, printing live progress and the final table (or the JSON report).
fn run_and_report(
    cfg: &SimConfig,
    json: bool,
    timeline: Option<&Path>,
) -> Result<ExitCode, CliError> {
    // Refuse an unwritable timeline before running anything.
    let mut timeline_file = match timeline {
        None => None,
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| {
                CliError::usage(format!(
                    "cannot write the timeline to {}: {e}",
                    path.display()
                ))
            })?,
        )),
    };
    let heading = format!(
        "simulated job: {} nodes x {} devices = {} ranks (mock HAL, simulated fabric)",
        cfg.nodes,
        cfg.devices_per_node,
        cfg.nodes * cfg.devices_per_node
    );
    let (run, heading_printed) = run_with_progress(cfg, json, &heading)?;
    if let (Some(f), Some(path)) = (timeline_file.as_mut(), timeline) {
        run.timeline
            .write_csv(f)
            .and_then(|_| f.flush())
            .map_err(|e| {
                CliError::Failed(format!(
                    "cannot write the timeline to {}: {e}",
                    path.display()
                ))
            })?;
    }
    let report = run.report;
    let text = if json {
        serde_json::to_string_pretty(&report).expect("the report serializes") + "\n"
    } else {
        // Every command was refused before it ran: no event printed the heading.
        let head = if heading_printed {
            String::new()
        } else {
            heading + "\n"
        };
        format!(
            "{head}\n{}\n{}",
            progress::table(&report.operations),
            report.end_text()
        )
    };
    // A closed stdout (`| head`) is the reader's choice, not a failure of the run.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(if report.invariants.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The scenario with its live progress on stdout (unless `json`); says whether the heading
/// was printed (it is, before the first event).
fn run_with_progress(
    cfg: &SimConfig,
    json: bool,
    heading: &str,
) -> Result<(ScenarioRun, bool), CliError> {
    let mut printer = (!json).then(ProgressPrinter::stdout);
    let mut printed = false;
    // Write errors are ignored: a closed stdout does not fail the run.
    let res = run_scenario_observed(cfg, |ev| {
        if let Some(p) = printer.as_mut() {
            if !std::mem::replace(&mut printed, true) {
                let _ = p.line(heading);
            }
            let _ = p.event(ev);
        }
    });
    if let Some(p) = printer.as_mut() {
        let _ = p.finish();
    }
    match res {
        Ok(run) => Ok((run, printed)),
        Err(e @ (SimError::Target(_) | SimError::Setup(_))) => Err(e.into()),
        Err(e) => Err(CliError::Failed(format!(
            "the simulation could not complete: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_events_parse_and_bad_ones_are_named() {
        let e = parse_link_down("node-1:3@250").unwrap();
        assert_eq!(
            (e.node.0.as_str(), e.device, e.at, e.up),
            ("node-1", DeviceId(3), Duration::from_millis(250), false)
        );
        assert!(parse_link_up("node-1:3@250").unwrap().up);
        let flap = parse_link_flap("node-0:1@100:20:3").unwrap();
        let got: Vec<(u128, bool)> = flap.iter().map(|e| (e.at.as_millis(), e.up)).collect();
        assert_eq!(got, [(100, false), (120, true), (140, false)]);
        for (bad, needle) in [
            ("node-1:3", "expected NODE:DEV@MS"),
            ("node-1:3,4@10", "name one device"),
            ("node-1:x@10", "not a device number"),
            ("node-1:3@soon", "not a number of milliseconds"),
            ("node-1:3@86400001", "up to 86400000"),
        ] {
            let e = parse_link_down(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        assert!(parse_link_flap("node-0:1@100:20").is_err());
        assert!(parse_link_flap("node-0:1@100:20:0")
            .unwrap_err()
            .contains("COUNT must be 1 to 10000"));
    }
}
