//! The proxy's options: one node's proxy, between the node's workers and the job's manager.

use crate::error::ConfigError;
use crate::flags;
use crate::net::{NetArgs, TlsArgs};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use taskd_actors::net::proxy_node::{NodeAssignment, NodeHalFactory};
use taskd_actors::net::{ProxyNodeConfig, DEFAULT_MANAGER_PORT, DEFAULT_PROXY_PORT};
use taskd_actors::process::{rank_table, ProxyIdentity};
use taskd_actors::telemetry::MetricsServer;
use taskd_core::env::{self, process_env};
use taskd_core::{
    DeviceId, HalError, HalErrorKind, JobId, LinkHealth, NodeHal, NodeName, RankTable,
};
use taskd_hal_mock::SoloNodeHal;

/// The flags of `taskd proxy`: the job, which node this is, where the manager and the
/// node's workers are, TLS, and the node HAL (DCMI, or simulated with `--sim`).
#[derive(Args)]
pub struct ProxyArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = env::MINDX_TASK_ID, value_parser = flags::non_empty)]
    job_id: String,
    /// This node's rank (default: $MS_NODE_RANK, or $RANK / $LOCAL_WORLD_SIZE).
    #[arg(long, value_name = "K")]
    node_rank: Option<u32>,
    /// The manager, HOST:PORT, IPv6 in brackets (default: $MS_SCHED_HOST:9601).
    #[arg(long, value_name = "HOST:PORT", value_parser = flags::host_port)]
    manager: Option<String>,
    /// This node's name (default: node-K, or the rank table's).
    #[arg(long, value_name = "NAME", value_parser = flags::non_empty)]
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
    /// Link health from Linux interfaces: a JSON file naming each device's primary and backup
    /// interface and the probe of each plane (docs/rig.md).
    #[arg(long, value_name = "FILE", conflicts_with = "sim")]
    linux_links: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

/// Link health from DCMI when the library is there, each probe bounded by `timeout`;
/// otherwise unknown (the proxy then lets HCCL decide, as without a probe).
fn hardware_node_hal(timeout: std::time::Duration) -> Box<dyn NodeHal> {
    use taskd_hal_ascend::sys::dcmi::DcmiLib;
    match DcmiLib::open(&process_env)
        .map_err(|e| e.to_string())
        .and_then(|l| {
            taskd_hal_ascend::AscendNodeHal::with_timeout(l, timeout).map_err(|e| e.to_string())
        }) {
        Ok(h) => Box::new(h),
        Err(e) => {
            eprintln!("taskd proxy: no link health on this node ({e}); switches go ahead without the link check");
            Box::new(NoHealth)
        }
    }
}

/// The Linux HAL over the interfaces `path` names; a device of the node it does not name is
/// said once (its links read as unknown).
fn linux_node_hal(path: &std::path::Path) -> Result<NodeHalFactory, ConfigError> {
    let cfg =
        taskd_hal_linux::LinkConfig::load(path).map_err(|e| ConfigError::usage(e.to_string()))?;
    Ok(Box::new(move |n: &NodeAssignment| {
        for d in n.ranks.values() {
            if !cfg.devices.contains_key(&d.0) {
                eprintln!(
                    "taskd proxy: device {} of this node has no interfaces in the link configuration; its links read as unknown",
                    d.0
                );
            }
        }
        Box::new(taskd_hal_linux::LinuxNodeHal::new(cfg)) as Box<dyn NodeHal>
    }))
}

struct NoHealth;

impl NodeHal for NoHealth {
    fn link_health(&mut self, _device: DeviceId) -> Result<LinkHealth, HalError> {
        Err(no_dcmi())
    }
}

fn no_dcmi() -> HalError {
    taskd_hal_ascend::codes::DCMI.uncoded(
        "dcmi",
        HalErrorKind::NotSupported,
        "no device management library",
    )
}

impl ProxyArgs {
    /// `--rank-table`, loaded (again: [`ProxyArgs::config`] read it already), for checking the
    /// manager's assignment against it ([`devices_differ`]).
    pub fn rank_table(&self) -> Result<Option<RankTable>, ConfigError> {
        Ok(self
            .rank_table
            .as_deref()
            .map(rank_table::load)
            .transpose()?)
    }

    /// The manager's address: `--manager`, else `$MS_SCHED_HOST:9601` (IPv6 in brackets).
    fn manager(&self) -> Result<String, ConfigError> {
        if let Some(m) = &self.manager {
            return Ok(m.clone());
        }
        let host = env::get(&process_env, env::MS_SCHED_HOST).ok_or_else(|| {
            ConfigError::usage(
                "where is the manager? give --manager HOST:PORT or set MS_SCHED_HOST",
            )
        })?;
        if let Some((_, zone)) = host.split_once('%') {
            // Dropping it would leave a link-local address no route reaches.
            return Err(ConfigError::usage(format!(
                "MS_SCHED_HOST={host:?} has a zone id (%{zone}), which the proxy's connection \
                 cannot carry; give the manager's global or unique-local address, or --manager"
            )));
        }
        let addr = env::host_port(&host, DEFAULT_MANAGER_PORT);
        env::check_host_port(&addr).map_err(|e| {
            ConfigError::usage(format!("MS_SCHED_HOST={host:?} is not a usable host ({e})"))
        })?;
        Ok(addr)
    }

    /// The node's HAL: simulated with `--sim`, DCMI otherwise (its probes bounded by
    /// `TASKD_DCMI_TIMEOUT_MS`, default 1 s; a value that is not a number is refused).
    fn node_hal(&self) -> Result<NodeHalFactory, ConfigError> {
        if let Some(path) = &self.linux_links {
            return linux_node_hal(path);
        }
        if !self.sim {
            let timeout = taskd_hal_ascend::node::probe_timeout_from_env(&process_env)?;
            return Ok(Box::new(move |_: &NodeAssignment| {
                hardware_node_hal(timeout)
            }));
        }
        let down = self.sim_link_down.clone();
        Ok(Box::new(move |n: &NodeAssignment| {
            let devices = n.ranks.values().map(|d| d.0 + 1).max().unwrap_or(0);
            let hal = SoloNodeHal::new(devices);
            for d in down {
                hal.set_link(DeviceId(d), false);
            }
            Box::new(hal) as Box<dyn NodeHal>
        }))
    }

    /// Starts the metrics endpoint when `--metrics-addr` was given (keep it while the role runs).
    pub fn serve_metrics(&self) -> Result<Option<MetricsServer>, ConfigError> {
        self.net.serve_metrics("proxy")
    }

    /// The proxy's configuration, or why these flags and this environment cannot run.
    /// (`taskd proxy` runs it, and so does the embedded proxy of `taskd-capi`.)
    pub fn config(&self) -> Result<ProxyNodeConfig, ConfigError> {
        let node_rank = match self.node_rank {
            Some(k) => Some(k),
            None => env::node_rank(&process_env)?,
        };
        let manager = self.manager()?;
        let table = self
            .rank_table
            .as_deref()
            .map(rank_table::load)
            .transpose()?;
        let id = ProxyIdentity::resolve(
            self.node_name.clone().map(NodeName),
            node_rank,
            table.as_ref(),
        )
        .map_err(|e| match &self.rank_table {
            Some(path) => ConfigError::usage(format!("{e} ({})", path.display())),
            None => e.into(),
        })?;
        let node_hal = self.node_hal()?;
        Ok(ProxyNodeConfig {
            node: id.node,
            node_rank: id.node_rank,
            ranks: id.ranks,
            listen: self.listen,
            tls: self.tls.load()?,
            net: self.net.checked()?,
            ..ProxyNodeConfig::new(JobId(self.job_id.clone()), manager, node_hal)
        })
    }
}

/// Where the manager's assignment `n` puts a rank on another device than this proxy's rank
/// `table` does (the manager checks the ranks of the node, not their devices): the first such
/// rank, in words. A proxy that probed and switched the wrong dies would corrupt the job.
pub fn devices_differ(table: &RankTable, n: &NodeAssignment) -> Option<String> {
    n.ranks.iter().find_map(|(rank, device)| {
        let mine = table
            .slot(*rank)
            .filter(|s| s.node == n.node)
            .map(|s| s.device);
        (mine != Some(*device)).then(|| {
            let mine = mine.map_or("no device".to_owned(), |d| format!("device {d}"));
            format!(
                "the manager's rank table puts rank {rank} on device {device} of {}, this \
                 proxy's --rank-table on {mine}: the two rank tables differ; give every role \
                 the same file",
                n.node
            )
        })
    })
}
