//! `taskd sim`'s scenarios, start to end: the default one (train; move the targets to their
//! backup NIC; train; move them back; train; report) and, with automatic failover on, the
//! script of link events ([`super::auto`]).

use super::report::{OperationSummary, ScenarioReport, ScenarioRun};
use super::simulation::{
    inject_faults, one_result_each, switch_command, SimConfig, SimError, Simulation,
};
use super::timeline::{PhaseLog, Timeline};
use taskd_actors::{LocalJobError, ProgressEvent};
use taskd_core::operation::JobState;
use taskd_core::RankTable;

/// Runs `taskd sim`'s default scenario: train; operation 1 moves the targets to their backup
/// NIC; train; operation 2 moves them back; train; report.
pub fn run_scenario(cfg: &SimConfig) -> Result<ScenarioReport, SimError> {
    run_scenario_observed(cfg, |_| {}).map(|run| run.report)
}

/// [`run_scenario`], handing every progress event of the operations to `on_progress` as it
/// happens (on the calling thread), and keeping the per-step timeline.
pub fn run_scenario_observed(
    cfg: &SimConfig,
    mut on_progress: impl FnMut(&ProgressEvent),
) -> Result<ScenarioRun, SimError> {
    cfg.validate()?;
    if cfg.auto.is_some() {
        return super::auto::run(cfg, on_progress);
    }
    let table = RankTable::uniform(cfg.nodes, cfg.devices_per_node);
    // Refuse bad targets before starting anything, naming them.
    switch_command(&cfg.job, &cfg.switch, true).resolve(&table)?;

    let sim = Simulation::start(cfg)?;
    let clock = sim.step_clock().clone();
    let mut phases = PhaseLog::default();
    let mut operations = Vec::new();
    // The operations the manager admitted (whatever their result): each must have exactly
    // one final result. Commands refused at submission never became operations.
    let mut admitted = Vec::new();
    let mut holds = Vec::new();
    sim.train(cfg.steps_between)?;
    inject_faults(&sim, cfg);
    let mut steps_ok = true;
    for use_backup in [true, false] {
        let cmd = sim.command(&cfg.switch, use_backup);
        let observe = |ev: &ProgressEvent| {
            phases.observe(ev, clock.elapsed());
            on_progress(ev);
        };
        let summary = match sim.job().run_with_progress(cmd.clone(), observe) {
            Ok(report) => {
                admitted.push(report.id);
                OperationSummary::from(&report)
            }
            Err(LocalJobError::Refused(e)) => OperationSummary::rejected(&cmd, &table, &e),
            Err(e) => return Err(e.into()),
        };
        operations.push(summary);
        let running = sim.job().status(0)?.state == JobState::Running;
        if running && steps_ok {
            if let Err(e) = sim.train(cfg.steps_between) {
                tracing::error!(error = %e, "training stopped making progress");
                steps_ok = false;
            }
        }
        // Every rank held by the operation trained on since (or is still held): its hold is in.
        holds.push(clock.take_holds());
    }
    let results = sim.job().status(usize::MAX)?.recent;
    let exactly_one_each = one_result_each(&admitted, &results);
    let end = sim.finish();
    let timeline = Timeline::build(&clock.completed_steps(), &phases);
    let report = ScenarioReport::new(cfg, &table, operations, end, exactly_one_each, steps_ok);
    Ok(ScenarioRun {
        report,
        timeline,
        holds,
    })
}
