//! `taskd worker --sim`: one simulated rank in its own process (a solo mock HAL and a
//! simulated training loop), connected to its node's proxy. For rigs and tests without NPUs.
//! A real training process links the worker API instead ([`taskd_actors::RemoteWorker`],
//! `examples/remote_worker.rs`): its worker must live where its HCCL communicators are.

use super::error::{exit, CliError};
use super::flags;
use super::{runtime, say};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use taskd_actors::net::{RemoteWorker, RemoteWorkerConfig, WorkerRegistration};
use taskd_actors::process::{LateRankHal, LateRankHalSlot, ShutdownSignals};
use taskd_core::{HcclCode, HcclSetup, StepBoundary, SwitchCapabilities};
use taskd_hal_mock::{NicSetFault, SoloLayout, SoloRank, SoloTraining, SoloTrainingOptions};
use taskd_roles::WorkerArgs;

/// The flags of `taskd worker --sim`: a worker's (the job and rank, where the node's proxy
/// is, TLS), and the simulated rank's training and faults.
#[derive(Args)]
pub struct SimWorkerArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// Run a simulated rank: a mock HAL for this rank alone and a simulated training loop.
    #[arg(long)]
    sim: bool,
    /// With --sim: simulated compute time of one training step (at most 60000).
    #[arg(long, value_name = "MS", default_value_t = 10, value_parser = flags::step_ms())]
    step_ms: u64,
    /// With --sim: tensor-parallel group size (default: min(8, ranks per node)). Ranks
    /// started with different sizes disagree on their groups, as a misconfigured job would.
    #[arg(long, value_name = "N")]
    sim_tp_size: Option<u32>,
    /// With --sim: the first NIC-set call fails with this HcclResult (e.g. 19, HCCL_E_NETWORK).
    #[arg(long, value_name = "CODE")]
    sim_fail_nic_set: Option<i32>,
    /// With --sim: HCCL runs without L2 retry here (a switch must be refused).
    #[arg(long)]
    sim_l2_off: bool,
    /// With --sim: on a stop by signal, print one line `sim views: {json}` on stdout: this
    /// rank's view of each of its groups' NICs and the HCCL rules it saw broken (what the
    /// process fault campaign, `taskd chaos --processes`, checks the groups' agreement with).
    #[arg(long)]
    sim_report_views: bool,
}

impl SimWorkerArgs {
    /// What the simulated HCCL lacks: nothing, unless `--sim-l2-off`.
    fn capabilities(&self) -> SwitchCapabilities {
        HcclSetup {
            l2_retry: !self.sim_l2_off,
            rdma: true,
        }
        .capabilities()
    }

    /// The worker's configuration: a simulated rank reports TSP:1 unless `--tsp false`.
    fn config(&self) -> Result<RemoteWorkerConfig, CliError> {
        Ok(RemoteWorkerConfig {
            tsp: self.worker.tsp.unwrap_or(true),
            ..self.worker.config()?
        })
    }

    /// The simulated rank, shaped as registration told, and its training loop.
    fn start_sim_rank(
        &self,
        reg: &WorkerRegistration,
        worker: &RemoteWorker,
        slot: &LateRankHalSlot,
    ) -> Result<(SoloRank, SoloTraining), CliError> {
        let nodes = reg.node_count.max(1);
        if reg.world_size % nodes != 0 {
            return Err(CliError::usage(format!(
                "--sim needs the same number of ranks on every node ({} ranks on {} nodes)",
                reg.world_size, nodes
            )));
        }
        let mut layout = SoloLayout::new(nodes, reg.world_size / nodes);
        if let Some(tp) = self.sim_tp_size {
            layout.tp_size = tp;
        }
        let solo = SoloRank::new(layout, worker.rank()).map_err(CliError::Usage)?;
        if self.sim_l2_off {
            solo.set_l2_retry(false);
        }
        if let Some(code) = self.sim_fail_nic_set {
            solo.inject_nic_set_fault(NicSetFault::Fail(HcclCode::from_raw(code)));
        }
        slot.install(Box::new(solo.hal()));
        let epoch = SystemTime::UNIX_EPOCH + Duration::from_millis(reg.job_epoch_unix_ms);
        let training = SoloTraining::start(
            solo.clone(),
            worker.gate() as Arc<dyn StepBoundary>,
            SoloTrainingOptions {
                step_time: Duration::from_millis(self.step_ms),
                epoch: Some(epoch),
            },
        );
        Ok((solo, training))
    }
}

/// The `--sim-report-views` line: every group of the rank with its members and this rank's
/// view of their NICs (`true`: backup), and the rule violations it saw.
fn views_line(solo: &SoloRank) -> String {
    let groups: Vec<serde_json::Value> = solo
        .layout()
        .groups_of(solo.rank())
        .into_iter()
        .map(|g| {
            let members: Vec<u32> = g.members.iter().map(|m| m.0).collect();
            serde_json::json!({"name": g.name, "members": members, "view": solo.view(&g.name)})
        })
        .collect();
    let report = serde_json::json!({
        "rank": solo.rank().0,
        "groups": groups,
        "violations": solo.violations(),
    });
    format!("sim views: {report}")
}

/// Runs the simulated rank until SIGINT, SIGTERM or SIGHUP (exit 0), until the manager stops
/// training (exit 1, for its launcher to restart it), or until its proxy refuses it for good
/// (exit 2).
pub fn run(a: SimWorkerArgs) -> Result<ExitCode, CliError> {
    if !a.sim {
        return Err(CliError::usage(
            "only simulated ranks run as a process of their own (--sim). A real training \
             process links the worker API (taskd_actors::RemoteWorker, see \
             examples/remote_worker.rs) so that its worker lives where its HCCL communicators \
             are.",
        ));
    }
    let _metrics = a.worker.serve_metrics()?;
    let cfg = a.config()?;
    let rank = cfg.rank;
    let rt = runtime()?;
    let mut signals = rt.block_on(async { ShutdownSignals::install() })?;
    let (hal, slot) = LateRankHal::new(a.capabilities());
    let worker = RemoteWorker::start(cfg, Box::new(hal)).map_err(|e| CliError::Start(e.into()))?;
    rt.block_on(async move {
        let reg = match signals.or_signal(worker.registered()).await {
            Err(sig) => {
                worker.stop_with(&format!("the worker process stopped ({sig})"));
                return Ok(ExitCode::SUCCESS);
            }
            Ok(Err(e)) => {
                worker.stop_with("refused");
                return Err(CliError::Refused(format!("rank {rank}: {e}")));
            }
            Ok(Ok(reg)) => reg,
        };
        let (solo, training) = match a.start_sim_rank(&reg, &worker, &slot) {
            Ok(t) => t,
            Err(e) => {
                worker.stop_with("cannot simulate this job");
                return Err(e);
            }
        };
        say(format!(
            "taskd worker rank {rank} registered on {} (device {}); simulated training, {} ms a step",
            reg.node, reg.device, a.step_ms
        ));
        let gate = worker.gate();
        let sig = tokio::select! {
            sig = signals.recv() => sig,
            why = gate.training_stopped() => {
                let steps = training.stop();
                eprintln!("taskd worker rank {rank}: training stopped after step {steps}: {why}");
                worker.stop_with("training stopped by the manager");
                return Ok(ExitCode::from(exit::FAILED));
            }
        };
        gate.shutdown();
        let steps = training.stop();
        if a.sim_report_views {
            say(views_line(&solo));
        }
        eprintln!("taskd worker: {sig}: stopping after step {steps}");
        worker.stop_with(&format!("the worker process stopped ({sig})"));
        Ok(ExitCode::SUCCESS)
    })
}
