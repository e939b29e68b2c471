//! `taskd proxy`: one node's proxy, between the node's workers and the job's manager.

use super::net_common::{env, load_rank_table, rank_span, say, shutdown_signal, NetArgs, TlsArgs};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use taskd_actors::net::proxy_node::{NodeAssignment, NodeHalFactory};
use taskd_actors::net::{ProxyNode, ProxyNodeConfig, DEFAULT_MANAGER_PORT, DEFAULT_PROXY_PORT};
use taskd_core::{
    DeviceId, GlobalRank, HalError, HalErrorKind, JobId, Library, LinkHealth, NodeHal, NodeName,
};
use taskd_hal_mock::SoloNodeHal;

#[derive(Args)]
pub struct ProxyArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = "MINDX_TASK_ID")]
    job_id: String,
    /// This node's rank (default: $MS_NODE_RANK, or $RANK / $LOCAL_WORLD_SIZE).
    #[arg(long, value_name = "K")]
    node_rank: Option<u32>,
    /// The manager, HOST:PORT (default: $MS_SCHED_HOST:9601).
    #[arg(long, value_name = "HOST:PORT")]
    manager: Option<String>,
    /// This node's name (default: node-K, or the rank table's).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Where this node's workers connect.
    #[arg(long, value_name = "ADDR", default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PROXY_PORT)))]
    listen: SocketAddr,
    /// The HCCL rank table: names the node and its ranks (checked against the manager's).
    #[arg(long, value_name = "FILE")]
    rank_table: Option<PathBuf>,
    /// Simulated link health (every port up unless --sim-link-down), for rigs without NPUs.
    #[arg(long)]
    sim: bool,
    /// With --sim: the port of this device is down (its primary NIC, its partner's backup).
    #[arg(long, value_name = "DEV", requires = "sim")]
    sim_link_down: Vec<u32>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

/// Link health from DCMI when the library is there; otherwise unknown (the proxy then lets
/// HCCL decide, as without a probe).
fn hardware_node_hal() -> Box<dyn NodeHal> {
    use taskd_hal_ascend::search::process_env;
    use taskd_hal_ascend::sys::dcmi::DcmiLib;
    match DcmiLib::open(&process_env)
        .map_err(|e| e.to_string())
        .and_then(|l| taskd_hal_ascend::AscendNodeHal::new(l).map_err(|e| e.to_string()))
    {
        Ok(h) => Box::new(h),
        Err(e) => {
            eprintln!("taskd proxy: no link health on this node ({e}); switches go ahead without the link check");
            Box::new(NoHealth)
        }
    }
}

struct NoHealth;

impl NodeHal for NoHealth {
    fn link_health(&mut self, _device: DeviceId) -> Result<LinkHealth, HalError> {
        Err(HalError::uncoded(
            "dcmi",
            Library::Dcmi,
            HalErrorKind::NotSupported,
            "no device management library",
        ))
    }
}

pub fn run(a: ProxyArgs) -> ExitCode {
    let _metrics = match a.net.serve_metrics("proxy") {
        Ok(m) => m,
        Err(code) => return code,
    };
    let node_rank = a.node_rank.or_else(|| {
        taskd_core::env::node_rank(
            env("MS_NODE_RANK").as_deref(),
            env("RANK").as_deref(),
            env("LOCAL_WORLD_SIZE").as_deref(),
        )
    });
    let Some(manager) = a
        .manager
        .clone()
        .or_else(|| env("MS_SCHED_HOST").map(|h| format!("{h}:{DEFAULT_MANAGER_PORT}")))
    else {
        eprintln!(
            "taskd proxy: where is the manager? give --manager HOST:PORT or set MS_SCHED_HOST"
        );
        return ExitCode::from(2);
    };
    let mut node = a.node_name.clone().map(NodeName);
    let mut ranks: Vec<GlobalRank> = Vec::new();
    if let Some(path) = &a.rank_table {
        let table = match load_rank_table(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("taskd proxy: {e}");
                return ExitCode::from(2);
            }
        };
        if node.is_none() {
            node = node_rank.and_then(|k| table.nodes().get(k as usize).cloned());
        }
        if let Some(n) = &node {
            ranks = table.ranks_of(n);
            if ranks.is_empty() {
                eprintln!(
                    "taskd proxy: node {n} is not in the rank table {}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        }
    }
    if node.is_none() && node_rank.is_none() {
        eprintln!(
            "taskd proxy: which node is this? give --node-rank (or set MS_NODE_RANK, or RANK and LOCAL_WORLD_SIZE) or --node-name"
        );
        return ExitCode::from(2);
    }
    if node.is_none() && a.rank_table.is_none() {
        node = node_rank.map(|k| NodeName(format!("node-{k}")));
    }
    let tls = match a.tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("taskd proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let node_hal: NodeHalFactory = if a.sim {
        let down = a.sim_link_down.clone();
        Box::new(move |n: &NodeAssignment| {
            let devices = n.ranks.values().map(|d| d.0 + 1).max().unwrap_or(0);
            let hal = SoloNodeHal::new(devices);
            for d in down {
                hal.set_link(DeviceId(d), false);
            }
            Box::new(hal) as Box<dyn NodeHal>
        })
    } else {
        Box::new(|_: &NodeAssignment| hardware_node_hal())
    };
    let cfg = ProxyNodeConfig {
        job: JobId(a.job_id.clone()),
        manager: manager.clone(),
        node,
        node_rank,
        ranks,
        listen: a.listen,
        node_hal,
        tls,
        net: a.net.config(),
    };
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        let proxy = match ProxyNode::spawn(cfg).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("taskd proxy: {e}");
                return ExitCode::from(1);
            }
        };
        say(format!(
            "taskd proxy listening on {} (manager {manager})",
            proxy.local_addr()
        ));
        let signal = shutdown_signal();
        tokio::pin!(signal);
        let first = tokio::select! {
            sig = &mut signal => Err(sig),
            assigned = proxy.assigned() => Ok(assigned),
        };
        match first {
            Err(sig) => {
                eprintln!("taskd proxy: {sig}: shutting down");
                proxy
                    .shutdown(&format!("the proxy process stopped ({sig})"))
                    .await;
                return ExitCode::SUCCESS;
            }
            Ok(Ok(n)) => {
                let ranks: Vec<GlobalRank> = n.ranks.keys().copied().collect();
                say(format!(
                    "taskd proxy registered as {} (ranks {})",
                    n.node,
                    rank_span(&ranks)
                ));
            }
            Ok(Err(e)) => {
                eprintln!("taskd proxy: {e}");
                proxy.shutdown("refused by the manager").await;
                return ExitCode::from(2);
            }
        }
        let sig = signal.await;
        eprintln!("taskd proxy: {sig}: shutting down");
        proxy
            .shutdown(&format!("the proxy process stopped ({sig})"))
            .await;
        ExitCode::SUCCESS
    })
}
