//! `taskd sim --auto-failover`: the simulated job with the automatic failover policy on, run
//! through a script of link events (`--link-down`, `--link-up`, `--link-flap`) and, when
//! targets are given, the operator's two operations as in the default scenario, until the
//! policy has settled: the manager has seen every link's final state, nothing runs and the
//! policy waits for nothing. The report lists every operation with its trigger, and every
//! decision.

use super::report::{DecisionSummary, OperationSummary, ScenarioReport, ScenarioRun};
use super::simulation::{
    inject_faults, one_result_each, LinkEvent, SimConfig, SimError, Simulation,
};
use super::timeline::{PhaseLog, StepClock, Timeline};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd_actors::manager::{AwaitResult, Submission};
use taskd_actors::{LocalJobError, ProgressEvent, ProgressKind};
use taskd_core::auto::{AutoConfig, AutoDecision, DeviceKey, Links};
use taskd_core::operation::JobState;
use taskd_core::{DeviceId, NodeName, OperationId, RankTable};
use taskd_hal_mock::Fabric;
use tokio::sync::broadcast::Receiver;

/// Slack on top of what the policy's knobs make it wait for, before the run is declared stuck.
const SETTLE_SLACK: Duration = Duration::from_secs(60);

/// What the run saw: the operations in the order they started (or were refused), the
/// decisions, the phases for the timeline.
struct Log {
    clock: Arc<StepClock>,
    phases: PhaseLog,
    decisions: Vec<AutoDecision>,
    entries: Vec<Entry>,
}

enum Entry {
    /// An operation the manager admitted: its result is in the manager's history.
    Admitted(OperationId),
    /// An operator's command refused before it ran.
    Refused(Box<OperationSummary>),
}

impl Log {
    fn observe(&mut self, ev: &ProgressEvent, on_progress: &mut impl FnMut(&ProgressEvent)) {
        self.phases.observe(ev, self.clock.elapsed());
        if let ProgressKind::Decision(d) = &ev.kind {
            if let Some(id) = d.operation.filter(|_| d.is_move()) {
                if !self.admitted().any(|a| a == id) {
                    self.entries.push(Entry::Admitted(id));
                }
            }
            self.decisions.push(d.clone());
        }
        on_progress(ev);
    }

    fn admitted(&self) -> impl Iterator<Item = OperationId> + '_ {
        self.entries.iter().filter_map(|e| match e {
            Entry::Admitted(id) => Some(*id),
            Entry::Refused(_) => None,
        })
    }
}

/// Runs the scenario of `cfg` (whose `auto` is on), handing every progress event to
/// `on_progress`.
pub(crate) fn run(
    cfg: &SimConfig,
    mut on_progress: impl FnMut(&ProgressEvent),
) -> Result<ScenarioRun, SimError> {
    let table = RankTable::uniform(cfg.nodes, cfg.devices_per_node);
    if !cfg.switch.is_empty() {
        super::simulation::switch_command(&cfg.job, &cfg.switch, true).resolve(&table)?;
    }
    let sim = Simulation::start(cfg)?;
    let mut events = sim.job().subscribe_progress();
    let mut log = Log {
        clock: sim.step_clock().clone(),
        phases: PhaseLog::default(),
        decisions: Vec::new(),
        entries: Vec::new(),
    };
    let script = LinkScript::start(sim.fabric().clone(), &table, &cfg.links);
    let mut steps_ok = train(&sim, cfg.steps_between);
    inject_faults(&sim, cfg);
    for use_backup in [true, false].into_iter().filter(|_| !cfg.switch.is_empty()) {
        operator_operation(
            &sim,
            cfg,
            &table,
            use_backup,
            &mut events,
            &mut log,
            &mut on_progress,
        )?;
        steps_ok = steps_ok && train(&sim, cfg.steps_between);
    }
    let job = sim.job();
    job.drive(script.done, &mut events, |ev| {
        log.observe(ev, &mut on_progress)
    })
    .map_err(|_| SimError::Setup("the link script stopped".into()))?;
    let links = final_links(cfg);
    let limit = settle_limit(cfg);
    job.await_auto_settled(links, limit, &mut events, |ev| {
        log.observe(ev, &mut on_progress)
    })?;
    steps_ok = steps_ok && train(&sim, cfg.steps_between);
    let history = job.status(usize::MAX)?.recent;
    let admitted: Vec<OperationId> = log.admitted().collect();
    let exactly_one_each = one_result_each(&admitted, &history);
    let operations = log
        .entries
        .into_iter()
        .filter_map(|e| match e {
            Entry::Admitted(id) => history
                .iter()
                .find(|r| r.id == id)
                .map(OperationSummary::from),
            Entry::Refused(s) => Some(*s),
        })
        .collect();
    let end = sim.finish();
    let _ = script.thread.join();
    let timeline = Timeline::build(&log.clock.completed_steps(), &log.phases);
    let mut report = ScenarioReport::new(cfg, &table, operations, end, exactly_one_each, steps_ok);
    report.decisions = log.decisions.iter().map(DecisionSummary::from).collect();
    // Operations here start on their own, at no step the scenario chose: no holds are taken.
    Ok(ScenarioRun {
        report,
        timeline,
        holds: Vec::new(),
    })
}

/// Trains `steps` more steps if the job runs; says whether training progressed (a job that
/// does not run is not expected to).
fn train(sim: &Simulation, steps: u64) -> bool {
    let running = sim
        .job()
        .status(0)
        .is_ok_and(|s| s.state == JobState::Running);
    if !running {
        return true;
    }
    match sim.train(steps) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "training stopped making progress");
            false
        }
    }
}

/// One of the operator's operations (to backup, then back), handing the events to the log
/// while it runs.
fn operator_operation(
    sim: &Simulation,
    cfg: &SimConfig,
    table: &RankTable,
    use_backup: bool,
    events: &mut Receiver<ProgressEvent>,
    log: &mut Log,
    on_progress: &mut impl FnMut(&ProgressEvent),
) -> Result<(), SimError> {
    let cmd = sim.command(&cfg.switch, use_backup);
    let id = match sim.job().submit(cmd.clone()) {
        Ok(Submission::Known(r)) => r.id,
        Ok(sub) => sub.id(),
        Err(LocalJobError::Refused(e)) => {
            // An automatic operation may be running: the operator's is refused like any other.
            let refused = OperationSummary::rejected(&cmd, table, &e);
            log.entries.push(Entry::Refused(Box::new(refused)));
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    log.entries.push(Entry::Admitted(id));
    let result = sim.job().manager().send(AwaitResult(id));
    sim.job()
        .drive(result, events, |ev| log.observe(ev, on_progress))
        .map_err(|_| SimError::Job(LocalJobError::SystemGone))?;
    Ok(())
}

/// What each device touched by the script reports once every event happened: a device's
/// primary is its own port, its backup its partner die's (none past the node's last device).
pub(crate) fn final_links(cfg: &SimConfig) -> Vec<(DeviceKey, Links)> {
    let mut ports: BTreeMap<(NodeName, DeviceId), bool> = BTreeMap::new();
    for e in sorted(&cfg.links) {
        ports.insert((e.node.clone(), e.device), e.up);
    }
    let up = |node: &NodeName, d: DeviceId| {
        d.0 < cfg.devices_per_node && *ports.get(&(node.clone(), d)).unwrap_or(&true)
    };
    let mut out = BTreeMap::new();
    for (node, port) in ports.keys() {
        for device in [*port, port.partner()] {
            if device.0 >= cfg.devices_per_node {
                continue;
            }
            let links = Links::known(up(node, device), up(node, device.partner()));
            let key = DeviceKey {
                node: node.clone(),
                device,
            };
            out.insert(key, links);
        }
    }
    out.into_iter().collect()
}

/// How long the policy may take to settle after the script: every wait its knobs impose, for
/// each event, and slack.
fn settle_limit(cfg: &SimConfig) -> Duration {
    let a: AutoConfig = cfg.auto.unwrap_or_default();
    let last = cfg.links.iter().map(|e| e.at).max().unwrap_or_default();
    let per_event = a.confirm_delay() + a.coalesce + a.min_interval + a.link_probe;
    let n = cfg.links.len() as u32 + 2;
    last + per_event.saturating_mul(n) + a.switchback_after + a.flap_window + SETTLE_SLACK
}

fn sorted(events: &[LinkEvent]) -> Vec<LinkEvent> {
    let mut v = events.to_vec();
    v.sort_by_key(|e| e.at);
    v
}

/// The link events, each applied to the fabric at its time on a thread of its own (the
/// scenario's input, like an operator's commands; nothing waits on it but the end of the run).
struct LinkScript {
    thread: std::thread::JoinHandle<()>,
    done: tokio::sync::oneshot::Receiver<()>,
}

impl LinkScript {
    fn start(fabric: Arc<Fabric>, table: &RankTable, events: &[LinkEvent]) -> LinkScript {
        let t0 = Instant::now();
        let script: Vec<(Duration, u32, DeviceId, bool)> = sorted(events)
            .into_iter()
            .filter_map(|e| {
                let node = table.nodes().iter().position(|n| *n == e.node)?;
                Some((e.at, node as u32, e.device, e.up))
            })
            .collect();
        let (tx, done) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            for (at, node, device, up) in script {
                let due = t0 + at;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                fabric.set_link(node, device, up);
            }
            let _ = tx.send(());
        });
        LinkScript { thread, done }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: u64, device: u32, up: bool) -> LinkEvent {
        LinkEvent {
            at: Duration::from_millis(at),
            node: "node-1".into(),
            device: DeviceId(device),
            up,
        }
    }

    #[test]
    fn the_final_links_are_those_the_node_hal_reports_after_the_script() {
        let cfg = SimConfig {
            nodes: 2,
            devices_per_node: 3,
            auto: Some(AutoConfig::default()),
            links: vec![event(50, 0, true), event(10, 0, false), event(20, 2, false)],
            ..SimConfig::default()
        };
        let got: Vec<String> = final_links(&cfg)
            .iter()
            .map(|(k, l)| format!("{k} {l}"))
            .collect();
        assert_eq!(
            got,
            [
                "node-1:0 primary up, backup up",
                "node-1:1 primary up, backup up",
                // The last device of an odd node has no partner, so no backup.
                "node-1:2 primary down, backup down",
            ]
        );
    }
}
