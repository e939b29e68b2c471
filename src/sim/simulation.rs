//! The simulator: a whole job in one process on the simulated fabric of `taskd-hal-mock`.
//!
//! Every rank runs a simulated training loop (all-reduces on its groups that wait for every
//! peer) and calls its worker's step gate at each step boundary; the manager, proxies and
//! workers are the production actors over the in-process transport. Nothing here is real
//! hardware: NPUs, NICs, links and HCCL are simulated, with HCCL's rules enforced.
//!
//! A rank is not a thread: its training loop is a task on a small runtime
//! ([`taskd_hal_mock::SimTraining`]) and its worker's HAL calls are futures the worker awaits
//! (the fabric's HAL is a [`taskd_core::TaskRankHal`]). A rank blocked in a collective is a parked task, held at
//! its gate a parked task too, and its worker still answers the pause sample from the step the
//! gate published, exactly as for a real training thread.

use super::launcher::SimLaunchers;
use super::timeline::StepClock;
use std::sync::Arc;
use std::time::Duration;
use taskd_actors::{LocalJob, LocalJobConfig, LocalJobError, LocalJobOptions, RankSpec, StepGate};
use taskd_core::auto::AutoConfig;
use taskd_core::command::Target;
use taskd_core::ledger::ProcessRecovery;
use taskd_core::operation::{JobState, OperationReport};
use taskd_core::{
    DeviceId, GlobalRank, HcclCode, JobId, NodeHal, NodeName, OperationId, PhaseDeadlines,
    RankTable, SwitchCommand, ValidationError,
};
use taskd_hal_mock::{
    Fabric, FabricConfig, Hold, NicSetFault, RankExit, SimTraining, StepHook, TrainingOptions,
};

/// How long the simulator waits for training to make progress before it declares the job
/// stuck (a hung training loop is a finding, not something to wait on forever).
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);

/// The most simulated ranks in one process: 65,536, the largest job a rank table describes
/// ([`taskd_core::rank_table::MAX_RANKS`]). A simulated rank is a task and a few small
/// structures, not a thread: measured on a 2-core machine (release build), the default
/// scenario runs 16,384 ranks in about 4 s and 230 MiB, 65,536 in about 16 s and 860 MiB.
pub const MAX_SIM_RANKS: u32 = taskd_core::rank_table::MAX_RANKS as u32;

/// Memory a simulated job takes beyond its ranks (the runtime, the actors' systems).
pub const SIM_BASE_BYTES: u64 = 64 << 20;

/// Memory a simulated job takes per rank, with room to spare: about 14 KiB measured at
/// 16,384 and 65,536 ranks (fabric, actors, gates, tasks, the manager's book), and the peaks
/// of an operation.
pub const SIM_BYTES_PER_RANK: u64 = 32 << 10;

/// What a simulation of `ranks` ranks needs in memory, by [`SIM_BASE_BYTES`] and
/// [`SIM_BYTES_PER_RANK`].
pub fn sim_memory_needed(ranks: u64) -> u64 {
    SIM_BASE_BYTES + ranks * SIM_BYTES_PER_RANK
}

/// Memory this process may still take: the system's available memory (`MemAvailable`), or
/// less if its control group is limited. `None` where neither can be read (then nothing is
/// refused on memory grounds).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let system = meminfo.as_deref().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
    });
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // cgroup v2: a limit ("max" does not parse: no limit) minus what the group uses now.
    let group =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (system, group) {
        (Some(s), Some(g)) => Some(s.min(g)),
        (s, g) => s.or(g),
    }
}

/// A simulated job and the scenario to run on it.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The simulated job's id (what the manager, the control API and the summaries show).
    pub job: JobId,
    /// Nodes, named `node-0` .. `node-{N-1}`.
    pub nodes: u32,
    /// Ranks per node; `rank = node_index * devices_per_node + device`.
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
    /// Deadlines of every phase of both operations.
    pub deadlines: PhaseDeadlines,
    /// Simulated compute time of one training step.
    pub step_time: Duration,
    /// Steps trained before, between and after the operations.
    pub steps_between: u64,
    /// Every this many steps a rank's step ends with an evaluation, an all-reduce of a size
    /// never used before (a new HCCL operator, which after a switch runs on the default NIC;
    /// `taskd_hal_mock::operator`). 0: never.
    pub eval_every: u64,
    /// Automatic failover, when on (see [`super::auto`]): the manager runs the policy
    /// and every proxy probes its links. With it on, an empty `switch` means no operator
    /// operation.
    pub auto: Option<AutoConfig>,
    /// Link events of the scenario, from the start of training (they need `auto`).
    pub links: Vec<LinkEvent>,
    /// How long a simulated HCCL call waits for its peers before it gives up
    /// ([`FabricConfig::hccl_timeout`]).
    pub hccl_timeout: Duration,
    /// Process recovery coordinated by the manager: a lost process restarts the whole job, and
    /// every node's simulated launcher takes the manager's orders ([`super::launcher`];
    /// [`Simulation::follow_orders`] carries them out). `None` (the default): no launcher takes
    /// orders, and processes restart only through [`Simulation::restart_processes`].
    pub process_recovery: Option<ProcessRecovery>,
}

/// A NIC port of the simulated fabric going down or up during the scenario. The port of
/// `node:device` is that device's primary NIC and its partner die's backup NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEvent {
    /// When, from the start of training.
    pub at: Duration,
    /// The node.
    pub node: NodeName,
    /// The device whose port it is.
    pub device: DeviceId,
    /// Up (`true`) or down.
    pub up: bool,
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
            eval_every: 3,
            auto: None,
            links: Vec::new(),
            hccl_timeout: FabricConfig::new(1, 1).hccl_timeout,
            process_recovery: None,
        }
    }
}

impl SimConfig {
    /// Ranks in the simulated job.
    pub fn ranks(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.devices_per_node)
    }

    /// Refuses a job the simulator cannot run (no ranks, more than [`MAX_SIM_RANKS`], more
    /// than this machine's available memory holds) and faults aimed at ranks the job does not
    /// have, naming the value.
    pub fn validate(&self) -> Result<(), SimError> {
        self.validate_for(available_memory())
    }

    /// [`SimConfig::validate`] on a machine with `available` bytes of memory free (`None`:
    /// unknown, not checked).
    pub fn validate_for(&self, available: Option<u64>) -> Result<(), SimError> {
        if self.nodes == 0 || self.devices_per_node == 0 {
            return Err(SimError::Setup(format!(
                "a job needs at least one node and one device per node (got {} x {})",
                self.nodes, self.devices_per_node
            )));
        }
        if self.ranks() > u64::from(MAX_SIM_RANKS) {
            return Err(SimError::Setup(format!(
                "{} nodes x {} devices = {} simulated ranks is more than a job can have \
                 ({MAX_SIM_RANKS}, the largest rank table)",
                self.nodes,
                self.devices_per_node,
                self.ranks()
            )));
        }
        let need = sim_memory_needed(self.ranks());
        if let Some(free) = available.filter(|free| need > *free) {
            return Err(SimError::Setup(format!(
                "{} nodes x {} devices = {} simulated ranks need about {} MiB of memory, but \
                 this machine has {} MiB available: simulate fewer ranks, or run the roles as \
                 processes (taskd manager / proxy / worker)",
                self.nodes,
                self.devices_per_node,
                self.ranks(),
                need >> 20,
                free >> 20
            )));
        }
        let faults = [
            ("--fail-rank", self.fail_rank.iter().collect::<Vec<_>>()),
            ("--hang-rank", self.hang.iter().map(|(r, _)| r).collect()),
            ("--l2-off-rank", self.l2_retry_off.iter().collect()),
            ("TSP off", self.tsp_off.iter().collect()),
        ];
        for (what, ranks) in faults {
            if let Some(r) = ranks.into_iter().find(|r| u64::from(r.0) >= self.ranks()) {
                return Err(SimError::Setup(format!(
                    "{what} {r}: rank {r} does not exist (the job has ranks 0..{})",
                    self.ranks()
                )));
            }
        }
        self.validate_auto()
    }

    /// The automatic failover's knobs, and link events only with it and only on ports the
    /// job has.
    fn validate_auto(&self) -> Result<(), SimError> {
        if let Some(a) = &self.auto {
            a.validate()
                .map_err(|e| SimError::Setup(format!("automatic failover: {e}")))?;
        } else if let Some(e) = self.links.first() {
            return Err(SimError::Setup(format!(
                "the link event of {}:{} needs --auto-failover",
                e.node, e.device
            )));
        }
        let table = RankTable::uniform(self.nodes, self.devices_per_node);
        for e in &self.links {
            if table.rank_of(&e.node, e.device).is_none() {
                return Err(SimError::Setup(format!(
                    "link event {}:{}: the job has no such device (nodes node-0..node-{}, devices 0..{})",
                    e.node,
                    e.device,
                    self.nodes - 1,
                    self.devices_per_node
                )));
            }
        }
        Ok(())
    }
}

/// Why the simulator could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration asks for something the simulator cannot build (a size above
    /// [`MAX_SIM_RANKS`], a fault on a rank the job does not have); the text names it.
    #[error("bad simulation setup: {0}")]
    Setup(String),
    /// A `--switch` target the rank table does not have.
    #[error("bad target: {0}")]
    Target(#[from] ValidationError),
    /// The in-process job could not start or be driven.
    #[error(transparent)]
    Job(#[from] LocalJobError),
    /// The slowest rank completed no step for the given time (at the given step): a
    /// deadlock the control plane should have prevented, reported instead of hanging.
    #[error("training made no progress for {0:?}: ranks are stuck (at step {1})")]
    Stuck(Duration, u64),
}

/// A simulated rank's step boundary: its worker's gate, a hold awaited as a task
/// ([`StepGate::step_completed_or_hold`]).
pub struct GateHook(pub Arc<StepGate>);

impl StepHook for GateHook {
    fn step_completed(&self, step: u64) -> Option<Hold<'_>> {
        self.0
            .step_completed_or_hold(step)
            .map(|hold| Box::pin(hold) as Hold<'_>)
    }
}

/// The HAL a simulated node's proxy owns: the links of the job's fabric of the moment. The
/// proxies outlive a restart of every process ([`Simulation::restart_processes`]), which
/// brings a new fabric; the physical links they report are the new fabric's, which keeps the
/// old one's link states.
struct CurrentNodeHal {
    fabric: Arc<parking_lot::Mutex<Arc<Fabric>>>,
    node: u32,
}

impl NodeHal for CurrentNodeHal {
    fn link_health(
        &mut self,
        device: DeviceId,
    ) -> Result<taskd_core::LinkHealth, taskd_core::HalError> {
        let fabric = self.fabric.lock().clone();
        fabric.node_hal(self.node).link_health(device)
    }
}

/// A running simulated job.
pub struct Simulation {
    job_id: JobId,
    fabric: Arc<Fabric>,
    /// The fabric the proxies' node HALs read (the one of the processes running).
    current: Arc<parking_lot::Mutex<Arc<Fabric>>>,
    table: RankTable,
    job: Option<LocalJob>,
    training: Option<SimTraining>,
    clock: Arc<StepClock>,
    /// The training loops' options, for restarted processes.
    options: TrainingOptions,
    /// Ranks whose processes lack `TSP:1`.
    tsp: Vec<GlobalRank>,
    /// Ranks whose HCCL runs without L2 retry (their new processes too).
    l2_off: Vec<GlobalRank>,
    /// The nodes' launchers, with process recovery.
    launchers: Option<Arc<SimLaunchers>>,
    /// How many times every process was restarted (the running processes' incarnation).
    incarnation: u32,
    /// The last restart number of the manager's orders carried out.
    carried: u32,
    /// Whether the launchers ended the job (no process runs).
    ended: bool,
}

/// What [`Simulation::follow_orders`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Followed {
    /// Every process was restarted as restart `number` of the job; how each old loop ended.
    Restarted {
        /// The restart's number, as the manager ordered it.
        number: u32,
        /// How each old training loop ended, by global rank.
        exits: Vec<RankExit>,
    },
    /// Every node was ordered to end the job: every process ended.
    Ended,
    /// No order was due within the wait.
    Nothing,
}

impl Simulation {
    /// Builds the fabric, starts the actors and the training loops, and waits until every
    /// worker registered and every rank trained one step.
    pub fn start(cfg: &SimConfig) -> Result<Simulation, SimError> {
        cfg.validate()?;
        let fabric = Fabric::new(FabricConfig {
            hccl_timeout: cfg.hccl_timeout,
            ..FabricConfig::new(cfg.nodes, cfg.devices_per_node)
        });
        for r in &cfg.l2_retry_off {
            fabric.set_l2_retry(*r, false);
        }
        let table = RankTable::uniform(cfg.nodes, cfg.devices_per_node);
        let current = Arc::new(parking_lot::Mutex::new(fabric.clone()));
        let nodes: Vec<Box<dyn NodeHal>> = (0..cfg.nodes)
            .map(|node| {
                let fabric = current.clone();
                Box::new(CurrentNodeHal { fabric, node }) as Box<dyn NodeHal>
            })
            .collect();
        let ranks: Vec<RankSpec> = (0..table.world_size() as u32)
            .map(|r| RankSpec {
                hal: Box::new(fabric.rank_hal(GlobalRank(r))),
                tsp: !cfg.tsp_off.contains(&GlobalRank(r)),
            })
            .collect();
        let launchers = cfg
            .process_recovery
            .map(|_| Arc::new(SimLaunchers::new(table.nodes().len())));
        let options = LocalJobOptions {
            auto: cfg.auto,
            process_recovery: cfg.process_recovery,
            launchers: launchers.clone().map(|l| {
                Arc::new(move |node, order| l.take(node, order)) as taskd_actors::NodeLaunchers
            }),
            // The simulated collectives never hang: no watch.
            hang_timeout: None,
        };
        let job = LocalJob::start_with(
            LocalJobConfig {
                job: cfg.job.clone(),
                table: table.clone(),
                deadlines: cfg.deadlines,
            },
            options,
            nodes,
            ranks,
        )?;
        job.wait_registered(PROGRESS_TIMEOUT)?;
        let clock = StepClock::new(table.world_size() as u32);
        let hooks: Vec<Arc<dyn StepHook>> = (0..table.world_size() as u32)
            .map(|r| clock.wrap(Arc::new(GateHook(job.gate(GlobalRank(r))))))
            .collect();
        let options = TrainingOptions {
            step_time: cfg.step_time,
            eval_every: cfg.eval_every,
            ..TrainingOptions::default()
        };
        let training = SimTraining::start(fabric.clone(), hooks, options.clone());
        let sim = Simulation {
            job_id: cfg.job.clone(),
            fabric,
            current,
            table,
            job: Some(job),
            training: Some(training),
            clock,
            options,
            tsp: cfg.tsp_off.clone(),
            l2_off: cfg.l2_retry_off.clone(),
            launchers,
            incarnation: 0,
            carried: 0,
            ended: false,
        };
        sim.train(1)?;
        Ok(sim)
    }

    /// The simulated hardware: to inject faults, or to check what HCCL has applied.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// The job's rank table (uniform: `node-i`, devices `0..devices_per_node`).
    pub fn table(&self) -> &RankTable {
        &self.table
    }

    /// The job's actors, to submit operations to and ask for status.
    pub fn job(&self) -> &LocalJob {
        self.job.as_ref().expect("job runs until finish")
    }

    /// The ranks' training loops, to wait for steps or read their progress.
    pub fn training(&self) -> &SimTraining {
        self.training.as_ref().expect("training runs until finish")
    }

    /// When every rank completed each step (see [`super::timeline`]).
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
        switch_command(&self.job_id, targets, use_backup)
    }

    /// The nodes' launchers and the orders they got (with process recovery).
    pub fn launchers(&self) -> Option<&Arc<SimLaunchers>> {
        self.launchers.as_ref()
    }

    /// How many times every process was restarted: 0 for the first processes, +1 per restart
    /// (by [`Simulation::restart_processes`] or an order carried out).
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Whether the launchers ended the job ([`Followed::Ended`]).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Carries out the manager's next order, as every node's agent does: waits at most
    /// `timeout` for an order every node's launcher has (the next restart number, or the
    /// end), then, once every old training loop ended, restarts every process as that restart
    /// of the job ([`Simulation::restart_processes`]) or ends every process. A restart number
    /// carried out already is never carried out again.
    ///
    /// # Errors
    /// As [`Simulation::restart_processes`]; the old loops do not end within `timeout`.
    pub fn follow_orders(&mut self, timeout: Duration) -> Result<Followed, SimError> {
        let Some(launchers) = self.launchers.clone() else {
            return Ok(Followed::Nothing);
        };
        if self.ended {
            return Ok(Followed::Nothing);
        }
        let carried = self.carried;
        let due = |o: &super::launcher::Orders| o.restart_due(carried).is_some() || o.end_due();
        if !launchers.wait(timeout, due) {
            return Ok(Followed::Nothing);
        }
        let orders = launchers.orders();
        match orders.restart_due(carried) {
            Some(number) => {
                let exits = self.restart_processes()?;
                self.carried = number;
                Ok(Followed::Restarted { number, exits })
            }
            None => {
                if !self.training().wait_ended(timeout) {
                    return Err(SimError::Stuck(timeout, self.training().min_steps()));
                }
                tracing::info!("sim: every node's launcher was ordered to end the job");
                self.job().end_processes();
                self.ended = true;
                Ok(Followed::Ended)
            }
        }
    }

    /// Restarts every rank's process as a new incarnation, as a launcher does once training
    /// stopped (the manager's stop, or its hold policy's): waits for every training loop to
    /// end, then starts new processes (a new fabric: new communicators, every NIC on its
    /// default) whose workers register, and their training. Returns once every rank is
    /// registered, the manager's verification round is over and every rank trained a step,
    /// with how each old loop ended.
    ///
    /// # Errors
    /// When the old loops do not end, or the new workers do not register or train, within
    /// the simulation's bound.
    pub fn restart_processes(&mut self) -> Result<Vec<RankExit>, SimError> {
        if !self.training().wait_ended(PROGRESS_TIMEOUT) {
            return Err(SimError::Stuck(
                PROGRESS_TIMEOUT,
                self.training().min_steps(),
            ));
        }
        let old = self.training.take().expect("training runs until finish");
        let exits = old.join().exits;
        tracing::info!(
            ?exits,
            "sim: every training loop ended; restarting the processes"
        );
        let fabric = Fabric::new(self.fabric.config().clone());
        // The links are physical: new processes find them as the old ones left them.
        let cfg = self.fabric.config();
        for node in 0..cfg.nodes {
            for d in 0..cfg.devices_per_node {
                let up = self.fabric.link_up(node, DeviceId(d));
                fabric.set_link(node, DeviceId(d), up);
            }
        }
        for r in &self.l2_off {
            fabric.set_l2_retry(*r, false);
        }
        *self.current.lock() = fabric.clone();
        let world = self.table.world_size() as u32;
        let tsp = self.tsp.clone();
        let ranks: Vec<RankSpec> = (0..world)
            .map(|r| RankSpec {
                hal: Box::new(fabric.rank_hal(GlobalRank(r))),
                tsp: !tsp.contains(&GlobalRank(r)),
            })
            .collect();
        self.job().restart_ranks(ranks, PROGRESS_TIMEOUT)?;
        self.job().wait_registered(PROGRESS_TIMEOUT)?;
        let hooks: Vec<Arc<dyn StepHook>> = (0..world)
            .map(|r| {
                self.clock
                    .wrap(Arc::new(GateHook(self.job().gate(GlobalRank(r)))))
            })
            .collect();
        let options = self.options.clone();
        self.training = Some(SimTraining::start(fabric.clone(), hooks, options));
        self.fabric = fabric;
        self.incarnation += 1;
        self.train(1)?;
        Ok(exits)
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
            collectives_on_default_nic: self.fabric.collectives_on_default_nic(),
            collective_failures,
            violations: self.fabric.violations(),
            job_state: state,
        }
    }
}

/// The state of a simulated job after it stopped.
#[derive(Clone, Debug)]
pub struct FinalState {
    /// Fewest steps any rank completed.
    pub steps_completed: u64,
    /// Ranks on their backup NIC, as the fabric has them.
    pub ranks_on_backup: Vec<GlobalRank>,
    /// The manager's NIC table at the end.
    pub manager_on_backup: Vec<GlobalRank>,
    /// Whether every group agrees on its NIC configuration.
    pub groups_consistent: bool,
    /// The consistency check's findings, for people (the disagreeing groups and members).
    pub consistency: String,
    /// Collectives that ran while their group's members disagreed on the NIC configuration:
    /// what the whole control plane exists to keep at zero.
    pub collectives_on_inconsistent_groups: u64,
    /// Collectives that ran on the default NIC of a switched group (HCCL's per-operator rule;
    /// not a broken invariant).
    pub collectives_on_default_nic: u64,
    /// Training collectives that returned an error (not those ended by the shutdown).
    pub collective_failures: u64,
    /// HCCL rules the control plane broke, as the fabric recorded them.
    pub violations: Vec<String>,
    /// The manager's job state at the end.
    pub job_state: JobState,
}

/// Arms operation 1's faults: `--fail-rank` and `--hang-rank`.
pub(crate) fn inject_faults(sim: &Simulation, cfg: &SimConfig) {
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
}

/// Whether the manager's results are exactly one per admitted operation: every admitted id
/// once, nothing else. An operation the proxies rejected (a NIC that is down) is admitted and
/// has its one result, `rejected`.
pub(crate) fn one_result_each(admitted: &[OperationId], results: &[OperationReport]) -> bool {
    results.len() == admitted.len()
        && admitted
            .iter()
            .all(|id| results.iter().filter(|r| r.id == *id).count() == 1)
}

/// A command moving `targets` of `job` to their backup NIC (`use_backup`) or back.
pub(crate) fn switch_command(
    job: &JobId,
    targets: &[(NodeName, Vec<DeviceId>)],
    use_backup: bool,
) -> SwitchCommand {
    SwitchCommand {
        job: job.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_fault_ranks_are_checked() {
        let ok = SimConfig {
            nodes: 2,
            devices_per_node: 4,
            ..SimConfig::default()
        };
        assert!(ok.validate().is_ok());
        let bad = |c: SimConfig, needle: &str| {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        };
        bad(
            SimConfig {
                nodes: 0,
                ..ok.clone()
            },
            "at least one node",
        );
        bad(
            SimConfig {
                nodes: 4097,
                devices_per_node: 16,
                ..ok.clone()
            },
            "65552 simulated ranks is more than a job can have (65536",
        );
        // What the machine cannot hold is refused up front, naming both figures.
        let big = SimConfig {
            nodes: 1024,
            devices_per_node: 16,
            ..ok.clone()
        };
        assert!(big.validate_for(Some(8 << 30)).is_ok());
        assert!(big.validate_for(None).is_ok());
        let e = big.validate_for(Some(256 << 20)).unwrap_err().to_string();
        assert!(
            e.contains("16384 simulated ranks need about 576 MiB")
                && e.contains("this machine has 256 MiB available"),
            "{e}"
        );
        assert!(available_memory().is_some_and(|m| m > 0));
        bad(
            SimConfig {
                l2_retry_off: vec![GlobalRank(8)],
                ..ok.clone()
            },
            "--l2-off-rank 8: rank 8 does not exist (the job has ranks 0..8)",
        );
        bad(
            SimConfig {
                fail_rank: Some(GlobalRank(9)),
                ..ok.clone()
            },
            "--fail-rank 9",
        );
        bad(
            SimConfig {
                hang: Some((GlobalRank(100), Duration::from_millis(1))),
                ..ok
            },
            "--hang-rank 100",
        );
    }
}
