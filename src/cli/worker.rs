//! `taskd worker --sim`: one simulated rank in its own process (a solo mock HAL and a
//! simulated training loop), connected to its node's proxy. For rigs and tests without NPUs.
//! A real training process links the worker API instead ([`taskd_actors::RemoteWorker`],
//! `examples/remote_worker.rs`): its worker must live where its HCCL communicators are.

use super::net_common::{env, load_rank_table, say, shutdown_signal, NetArgs, TlsArgs};
use clap::Args;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use taskd_actors::net::{RemoteWorker, RemoteWorkerConfig, DEFAULT_PROXY_PORT};
use taskd_core::{
    GlobalRank, GroupInfo, GroupRank, HalError, HcclCode, JobId, NodeName, RankHal, StepBoundary,
    SwitchCapabilities,
};
use taskd_hal_mock::{
    NicSetFault, SoloLayout, SoloRank, SoloRankHal, SoloTraining, SoloTrainingOptions,
};

#[derive(Args)]
pub struct WorkerArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = "MINDX_TASK_ID")]
    job_id: String,
    /// This process's global rank (default: $RANK).
    #[arg(long, value_name = "R")]
    rank: Option<u32>,
    /// This node's proxy, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", default_value_t = format!("127.0.0.1:{DEFAULT_PROXY_PORT}"))]
    proxy: String,
    /// The HCCL rank table: the node this rank must be on (the proxy checks it).
    #[arg(long, value_name = "FILE")]
    rank_table: Option<PathBuf>,
    /// Run a simulated rank: a mock HAL for this rank alone and a simulated training loop.
    #[arg(long)]
    sim: bool,
    /// With --sim: simulated compute time of one training step.
    #[arg(long, value_name = "MS", default_value_t = 10)]
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
    /// Whether this rank reports TSP:1 (MS_ENABLE_TFT). Simulated ranks default to true;
    /// `--tsp false` makes every switch of the job be refused.
    #[arg(long)]
    tsp: Option<bool>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

/// The HAL handed to the worker before the job's shape is known: it becomes the solo rank's
/// once registration has told the world size and node count.
struct LateHal {
    inner: Arc<Mutex<Option<SoloRankHal>>>,
    capabilities: SwitchCapabilities,
}

impl RankHal for LateHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        match self.inner.lock().as_mut() {
            Some(h) => h.groups(),
            None => Err(not_ready()),
        }
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        match self.inner.lock().as_mut() {
            Some(h) => h.set_working_nic(group, ranks, use_backup),
            None => Err(not_ready()),
        }
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.capabilities
    }
}

fn not_ready() -> HalError {
    HalError::new(
        "HcclGetCommName",
        HcclCode::Unavail,
        "the simulated rank is not set up yet",
    )
}

pub fn run(a: WorkerArgs) -> ExitCode {
    let _metrics = match a.net.serve_metrics("worker") {
        Ok(m) => m,
        Err(code) => return code,
    };
    if !a.sim {
        eprintln!(
            "taskd worker: only simulated ranks run as a process of their own (--sim). A real training process links the worker API (taskd_actors::RemoteWorker, see examples/remote_worker.rs) so that its worker lives where its HCCL communicators are."
        );
        return ExitCode::from(2);
    }
    let Some(rank) = a.rank.or_else(|| env("RANK").and_then(|r| r.parse().ok())) else {
        eprintln!("taskd worker: which rank? give --rank or set RANK");
        return ExitCode::from(2);
    };
    let rank = GlobalRank(rank);
    let mut node = None;
    if let Some(path) = &a.rank_table {
        match load_rank_table(path) {
            Ok(t) => match t.slot(rank) {
                Some(s) => node = Some(s.node.clone()),
                None => {
                    eprintln!(
                        "taskd worker: rank {rank} is not in the rank table {}",
                        path.display()
                    );
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                eprintln!("taskd worker: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let tls = match a.tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("taskd worker: {e}");
            return ExitCode::from(2);
        }
    };
    let tsp = a.tsp.unwrap_or(true);
    let cfg = RemoteWorkerConfig {
        job: JobId(a.job_id.clone()),
        rank,
        proxy: a.proxy.clone(),
        node: node.map(|n: NodeName| n),
        tsp,
        tls,
        net: a.net.config(),
    };
    let slot = Arc::new(Mutex::new(None));
    let hal = LateHal {
        inner: slot.clone(),
        capabilities: SwitchCapabilities {
            tsp,
            l2_retry: !a.sim_l2_off,
            rdma: true,
        },
    };
    let worker = match RemoteWorker::start(cfg, Box::new(hal)) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("taskd worker: {e}");
            return ExitCode::from(1);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    rt.block_on(async move {
        let signal = shutdown_signal();
        tokio::pin!(signal);
        let first = tokio::select! {
            sig = &mut signal => Err(sig),
            r = worker.registered() => Ok(r),
        };
        let reg = match first {
            Err(sig) => {
                worker.stop_with(&format!("the worker process stopped ({sig})"));
                return ExitCode::SUCCESS;
            }
            Ok(Err(e)) => {
                eprintln!("taskd worker: rank {rank}: {e}");
                worker.stop_with("refused");
                return ExitCode::from(2);
            }
            Ok(Ok(reg)) => reg,
        };
        let nodes = reg.node_count.max(1);
        let mut layout = SoloLayout::new(nodes, reg.world_size / nodes);
        if let Some(tp) = a.sim_tp_size {
            layout.tp_size = tp;
        }
        if reg.world_size % nodes != 0 {
            eprintln!(
                "taskd worker: --sim needs the same number of ranks on every node ({} ranks on {} nodes)",
                reg.world_size, nodes
            );
            worker.stop_with("cannot simulate this job");
            return ExitCode::from(2);
        }
        let solo = match SoloRank::new(layout, rank) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("taskd worker: {e}");
                worker.stop_with("cannot simulate this job");
                return ExitCode::from(2);
            }
        };
        if a.sim_l2_off {
            solo.set_l2_retry(false);
        }
        if let Some(code) = a.sim_fail_nic_set {
            solo.inject_nic_set_fault(NicSetFault::Fail(HcclCode::from_raw(code)));
        }
        *slot.lock() = Some(solo.hal());
        let epoch = SystemTime::UNIX_EPOCH + Duration::from_millis(reg.job_epoch_unix_ms);
        let training = SoloTraining::start(
            solo,
            worker.gate() as Arc<dyn StepBoundary>,
            SoloTrainingOptions {
                step_time: Duration::from_millis(a.step_ms),
                epoch: Some(epoch),
            },
        );
        say(format!(
            "taskd worker rank {rank} registered on {} (device {}); simulated training, {} ms a step",
            reg.node, reg.device, a.step_ms
        ));
        let sig = signal.await;
        worker.gate().shutdown();
        let steps = training.stop();
        eprintln!("taskd worker: {sig}: stopping after step {steps}");
        worker.stop_with(&format!("the worker process stopped ({sig})"));
        ExitCode::SUCCESS
    })
}
