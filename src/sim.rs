//! The simulator: a whole job in one process on the simulated fabric of `taskd-hal-mock`.
//!
//! Every rank runs a simulated training loop (blocking all-reduces on its groups) on its own
//! thread and calls its worker's step gate at each step boundary; the manager, proxies and
//! workers are the production actors over the in-process transport. Nothing here is real
//! hardware: NPUs, NICs, links and HCCL are simulated, with HCCL's rules enforced.

use crate::report::{OperationSummary, ScenarioReport};
use crate::timeline::{PhaseLog, StepClock, Timeline};
use std::sync::Arc;
use std::time::Duration;
use taskd_actors::{LocalJob, LocalJobConfig, LocalJobError, ProgressEvent, RankParts};
use taskd_core::command::Target;
use taskd_core::operation::JobState;
use taskd_core::{
    DeviceId, GlobalRank, HcclCode, JobId, NodeHal, NodeName, PhaseDeadlines, RankHal, RankTable,
    StepBoundary, SwitchCommand, ValidationError,
};
use taskd_hal_mock::{Fabric, FabricConfig, NicSetFault, SimTraining, TrainingOptions};

/// How long the simulator waits for training to make progress before it declares the job
/// stuck (a hung training loop is a finding, not something to wait on forever).
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);

/// A simulated job and the scenario to run on it.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub job: JobId,
    pub nodes: u32,
    pub devices_per_node: u32,
    /// Targets of operation 1: `(node, devices)`.
    pub switch: Vec<(NodeName, Vec<DeviceId>)>,
    /// The first NIC-set call of this rank in operation 1 fails with HCCL_E_NETWORK.
    pub fail_rank: Option<GlobalRank>,
    /// The first NIC-set call of this rank in operation 1 hangs this long, then HCCL_E_TIMEOUT.
    pub hang: Option<(GlobalRank, Duration)>,
    /// Ranks whose HCCL runs without L2 retry (`HCCL_OP_RETRY_ENABLE` lacks `L2:1`).
    pub l2_retry_off: Vec<GlobalRank>,
    /// Ranks whose process lacks `TSP:1` in `MS_ENABLE_TFT`.
    pub tsp_off: Vec<GlobalRank>,
    pub deadlines: PhaseDeadlines,
    /// Simulated compute time of one training step.
    pub step_time: Duration,
    /// Steps trained before, between and after the operations.
    pub steps_between: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            job: JobId("sim".into()),
            nodes: 4,
            devices_per_node: 16,
            switch: vec![(NodeName("node-1".into()), vec![DeviceId(0), DeviceId(8)])],
            fail_rank: None,
            hang: None,
            l2_retry_off: Vec::new(),
            tsp_off: Vec::new(),
            deadlines: PhaseDeadlines {
                pause: Duration::from_secs(30),
                switch: Duration::from_secs(30),
                rollback: Duration::from_secs(30),
                resume: Duration::from_secs(30),
            },
            step_time: Duration::from_millis(2),
            steps_between: 3,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad simulation setup: {0}")]
    Setup(String),
    #[error("bad target: {0}")]
    Target(#[from] ValidationError),
    #[error(transparent)]
    Job(#[from] LocalJobError),
    #[error("training made no progress for {0:?}: ranks are stuck (at step {1})")]
    Stuck(Duration, u64),
}

/// A running simulated job.
pub struct Simulation {
    job_id: JobId,
    fabric: Arc<Fabric>,
    table: RankTable,
    job: Option<LocalJob>,
    training: Option<SimTraining>,
    clock: Arc<StepClock>,
}

impl Simulation {
    /// Builds the fabric, starts the actors and the training loops, and waits until every
    /// worker registered and every rank trained one step.
    pub fn start(cfg: &SimConfig) -> Result<Simulation, SimError> {
        if cfg.nodes == 0 || cfg.devices_per_node == 0 {
            return Err(SimError::Setup(
                "a job needs at least one node and one device per node".into(),
            ));
        }
        let fabric = Fabric::new(FabricConfig::new(cfg.nodes, cfg.devices_per_node));
        for r in &cfg.l2_retry_off {
            fabric.set_l2_retry(*r, false);
        }
        let table = RankTable::uniform(cfg.nodes, cfg.devices_per_node);
        let nodes: Vec<Box<dyn NodeHal>> = (0..cfg.nodes)
            .map(|n| Box::new(fabric.node_hal(n)) as Box<dyn NodeHal>)
            .collect();
        let ranks: Vec<RankParts> = (0..table.world_size() as u32)
            .map(|r| RankParts {
                hal: Box::new(fabric.rank_hal(GlobalRank(r))) as Box<dyn RankHal>,
                tsp: !cfg.tsp_off.contains(&GlobalRank(r)),
            })
            .collect();
        let job = LocalJob::start(
            LocalJobConfig {
                job: cfg.job.clone(),
                table: table.clone(),
                deadlines: cfg.deadlines,
            },
            nodes,
            ranks,
        )?;
        job.wait_registered(PROGRESS_TIMEOUT)?;
        let clock = StepClock::new(table.world_size() as u32);
        let hooks: Vec<Arc<dyn StepBoundary>> = (0..table.world_size() as u32)
            .map(|r| clock.wrap(job.gate(GlobalRank(r))))
            .collect();
        let training = SimTraining::start(
            fabric.clone(),
            hooks,
            TrainingOptions {
                step_time: cfg.step_time,
            },
        );
        let sim = Simulation {
            job_id: cfg.job.clone(),
            fabric,
            table,
            job: Some(job),
            training: Some(training),
            clock,
        };
        sim.train(1)?;
        Ok(sim)
    }

    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    pub fn table(&self) -> &RankTable {
        &self.table
    }

    pub fn job(&self) -> &LocalJob {
        self.job.as_ref().expect("job runs until finish")
    }

    pub fn training(&self) -> &SimTraining {
        self.training.as_ref().expect("training runs until finish")
    }

    /// When every rank completed each step (see [`crate::timeline`]).
    pub fn step_clock(&self) -> &Arc<StepClock> {
        &self.clock
    }

    /// Blocks until every rank trained `steps` more steps than the furthest rank had.
    pub fn train(&self, steps: u64) -> Result<(), SimError> {
        let t = self.training();
        let target = t.max_steps() + steps;
        if t.wait_min_steps(target, PROGRESS_TIMEOUT) {
            Ok(())
        } else {
            Err(SimError::Stuck(PROGRESS_TIMEOUT, t.min_steps()))
        }
    }

    /// A command for `targets` in this job.
    pub fn command(
        &self,
        targets: &[(NodeName, Vec<DeviceId>)],
        use_backup: bool,
    ) -> SwitchCommand {
        SwitchCommand {
            job: self.job_id.clone(),
            id: None,
            targets: targets
                .iter()
                .flat_map(|(node, devs)| {
                    devs.iter().map(move |d| Target {
                        node: node.clone(),
                        device: *d,
                        use_backup,
                    })
                })
                .collect(),
        }
    }

    /// Stops training at a common step (nobody left inside a collective), stops the actors
    /// and reads the final state of the fabric.
    pub fn finish(mut self) -> FinalState {
        let job = self.job.take().expect("finish once");
        let training = self.training.take().expect("finish once");
        let state = job
            .status(0)
            .map(|s| s.state)
            .unwrap_or(JobState::NeedsRecovery);
        let table_on_backup = job.status(0).map(|s| s.ranks_on_backup).unwrap_or_default();
        let steps_completed = if state == JobState::Running {
            // Every rank stops after the same step, so nobody is left inside a collective.
            let last = training.max_steps() + 1;
            training.stop_after(last);
            training.wait_min_steps(last, PROGRESS_TIMEOUT);
            training.min_steps()
        } else {
            // Held ranks must not train on groups that may disagree: they leave the loop as
            // soon as their gate opens.
            training.stop_after(0);
            training.min_steps()
        };
        // Wakes anything still blocked (a stuck run) so every thread can be joined.
        self.fabric.shutdown();
        job.shutdown();
        let collective_failures = training.collective_failures();
        training.join();
        let consistency = self.fabric.check_consistency();
        FinalState {
            steps_completed,
            ranks_on_backup: self.fabric.ranks_on_backup(),
            manager_on_backup: table_on_backup,
            groups_consistent: consistency.is_consistent(),
            consistency: consistency.to_string(),
            collectives_on_inconsistent_groups: self.fabric.collectives_on_inconsistent_groups(),
            collective_failures,
            violations: self.fabric.violations(),
            job_state: state,
        }
    }
}

/// The state of a simulated job after it stopped.
#[derive(Clone, Debug)]
pub struct FinalState {
    pub steps_completed: u64,
    pub ranks_on_backup: Vec<GlobalRank>,
    /// The manager's NIC table at the end.
    pub manager_on_backup: Vec<GlobalRank>,
    pub groups_consistent: bool,
    pub consistency: String,
    pub collectives_on_inconsistent_groups: u64,
    pub collective_failures: u64,
    pub violations: Vec<String>,
    pub job_state: JobState,
}

/// Runs `taskd sim`'s default scenario: train; operation 1 moves the targets to their backup
/// NIC; train; operation 2 moves them back; train; report.
pub fn run_scenario(cfg: &SimConfig) -> Result<ScenarioReport, SimError> {
    run_scenario_observed(cfg, |_| {}).map(|run| run.report)
}

/// What a scenario produced: its report and its per-step timeline.
#[derive(Clone, Debug)]
pub struct ScenarioRun {
    pub report: ScenarioReport,
    pub timeline: Timeline,
}

/// [`run_scenario`], handing every progress event of the operations to `on_progress` as it
/// happens (on the calling thread), and keeping the per-step timeline.
pub fn run_scenario_observed(
    cfg: &SimConfig,
    mut on_progress: impl FnMut(&ProgressEvent),
) -> Result<ScenarioRun, SimError> {
    let table = RankTable::uniform(cfg.nodes, cfg.devices_per_node);
    // Refuse bad targets before starting anything, naming them.
    let probe = SwitchCommand {
        job: cfg.job.clone(),
        id: None,
        targets: cfg
            .switch
            .iter()
            .flat_map(|(n, ds)| {
                ds.iter().map(move |d| Target {
                    node: n.clone(),
                    device: *d,
                    use_backup: true,
                })
            })
            .collect(),
    };
    probe.resolve(&table)?;
    for r in cfg.fail_rank.iter().chain(cfg.hang.iter().map(|(r, _)| r)) {
        if r.0 as usize >= table.world_size() {
            return Err(SimError::Setup(format!(
                "rank {r} does not exist (the job has ranks 0..{})",
                table.world_size()
            )));
        }
    }

    let sim = Simulation::start(cfg)?;
    let clock = sim.step_clock().clone();
    let mut phases = PhaseLog::default();
    let mut operations = Vec::new();
    sim.train(cfg.steps_between)?;

    if let Some(r) = cfg.fail_rank {
        sim.fabric()
            .inject_nic_set_fault(r, NicSetFault::Fail(HcclCode::Network));
    }
    if let Some((r, d)) = cfg.hang {
        sim.fabric().inject_nic_set_fault(
            r,
            NicSetFault::Hang {
                duration: d,
                code: HcclCode::Timeout,
            },
        );
    }
    let mut steps_ok = true;
    for use_backup in [true, false] {
        let cmd = sim.command(&cfg.switch, use_backup);
        let observe = |ev: &ProgressEvent| {
            phases.observe(ev, clock.elapsed());
            on_progress(ev);
        };
        let summary = match sim.job().run_with_progress(cmd.clone(), observe) {
            Ok(report) => OperationSummary::from(&report),
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
    }
    let exactly_one_each = sim.job().status(usize::MAX)?.recent.len()
        == operations.iter().filter(|o| o.result != "rejected").count();
    let end = sim.finish();
    let timeline = Timeline::build(&clock.completed_steps(), &phases);
    let report = ScenarioReport::new(cfg, &table, operations, end, exactly_one_each, steps_ok);
    Ok(ScenarioRun { report, timeline })
}
