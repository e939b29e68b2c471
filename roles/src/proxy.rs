//! The proxy's options: one node's proxy, between the node's workers and the job's manager.

use crate::error::ConfigError;
use crate::flags;
use crate::net::{NetArgs, TlsArgs};
use clap::{Args, ValueEnum};
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

/// Where a proxy reads its node's link health: the one value that picks the node HAL
/// (`--node-hal`, and the key `node_hal` of an embedded proxy's JSON configuration).
///
/// A new node backend is a crate implementing `taskd_core::NodeHal`, a value here and its arm
/// in [`ProxyArgs::config`]'s choice (docs/hal.md, "Adding a backend").
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeHalKind {
    /// DCMI's network health probe of each die and its partner (`taskd-hal-ascend`): Ascend
    /// NPUs. The default.
    Dcmi,
    /// Linux network interfaces, each device's named in `--linux-links FILE`
    /// (`taskd-hal-linux`): a rig of namespaces, a job on Gloo, any host whose NICs are
    /// kernel interfaces.
    Linux,
    /// Simulated, every port up unless `--sim-link-down` (`taskd-hal-mock`): rigs and tests
    /// without NPUs.
    Sim,
}

impl NodeHalKind {
    /// The value's name, as `--node-hal` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeHalKind::Dcmi => "dcmi",
            NodeHalKind::Linux => "linux",
            NodeHalKind::Sim => "sim",
        }
    }
}

/// The flags of `taskd proxy`: the job, which node this is, where the manager and the
/// node's workers are, TLS, and the node HAL (`--node-hal dcmi|linux|sim`).
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
    /// Where link health comes from: dcmi (Ascend NPUs' own probe; the default), linux (the
    /// interfaces --linux-links names), sim (simulated, for rigs without NPUs). Deprecated
    /// spellings, still read: --sim for `--node-hal sim`, --linux-links FILE alone for
    /// `--node-hal linux`.
    #[arg(long, value_enum, value_name = "HAL")]
    node_hal: Option<NodeHalKind>,
    /// Deprecated: `--node-hal sim`.
    #[arg(long, hide = true)]
    sim: bool,
    /// With --node-hal sim: the port of this device is down (its primary NIC, its partner's
    /// backup).
    #[arg(long, value_name = "DEV")]
    sim_link_down: Vec<u32>,
    /// With --node-hal linux: a JSON file naming each device's primary and backup interface
    /// and the probe of each plane (docs/rig.md).
    #[arg(long, value_name = "FILE")]
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
            tracing::warn!(
                error = %e,
                "no link health on this node: switches go ahead without the link check"
            );
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
                tracing::warn!(
                    device = d.0,
                    "this device of the node has no interfaces in the link configuration: its links read as unknown"
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

    /// The node HAL `--node-hal` names, or its deprecated spellings (`--sim`, `--linux-links`
    /// alone); `dcmi` when none. A flag of another HAL than the chosen one is refused, naming
    /// both.
    pub fn node_hal_kind(&self) -> Result<NodeHalKind, ConfigError> {
        let alias =
            match (self.sim, &self.linux_links) {
                (true, Some(_)) => return Err(ConfigError::usage(
                    "--sim (--node-hal sim) and --linux-links (--node-hal linux) name two node \
                     HALs; give one --node-hal",
                )),
                (true, None) => Some(NodeHalKind::Sim),
                (false, Some(_)) => Some(NodeHalKind::Linux),
                (false, None) => None,
            };
        let kind = match (self.node_hal, alias) {
            (Some(k), Some(a)) if self.sim && a != k => {
                return Err(ConfigError::usage(format!(
                    "--sim is --node-hal sim, which --node-hal {} contradicts",
                    k.as_str()
                )))
            }
            (Some(k), _) => k,
            (None, Some(a)) => a,
            (None, None) => NodeHalKind::Dcmi,
        };
        match kind {
            NodeHalKind::Linux if self.linux_links.is_none() => Err(ConfigError::usage(
                "--node-hal linux needs --linux-links FILE (each device's interfaces)",
            )),
            k if k != NodeHalKind::Linux && self.linux_links.is_some() => {
                Err(ConfigError::usage(format!(
                    "--linux-links is the linux node HAL's configuration, not the {} one's",
                    k.as_str()
                )))
            }
            k if k != NodeHalKind::Sim && !self.sim_link_down.is_empty() => {
                Err(ConfigError::usage(format!(
                    "--sim-link-down is for --node-hal sim, not {}",
                    k.as_str()
                )))
            }
            k => Ok(k),
        }
    }

    /// The node's HAL, as [`ProxyArgs::node_hal_kind`] chose it: DCMI (its probes bounded by
    /// `TASKD_DCMI_TIMEOUT_MS`, default 1 s; a value that is not a number is refused), Linux
    /// interfaces, or simulated.
    fn node_hal(&self) -> Result<NodeHalFactory, ConfigError> {
        match self.node_hal_kind()? {
            NodeHalKind::Dcmi => {
                let timeout = taskd_hal_ascend::node::probe_timeout_from_env(&process_env)?;
                Ok(Box::new(move |_: &NodeAssignment| {
                    hardware_node_hal(timeout)
                }))
            }
            NodeHalKind::Linux => {
                let path = self
                    .linux_links
                    .as_deref()
                    .expect("checked by node_hal_kind");
                linux_node_hal(path)
            }
            NodeHalKind::Sim => {
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
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        proxy: ProxyArgs,
    }

    fn kind(flags: &[&str]) -> Result<NodeHalKind, String> {
        let argv = ["t", "--job-id", "j"].iter().chain(flags);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.proxy.node_hal_kind().map_err(|e| e.to_string())
    }

    #[test]
    fn one_value_picks_the_node_hal() {
        assert_eq!(kind(&[]), Ok(NodeHalKind::Dcmi));
        for k in [NodeHalKind::Dcmi, NodeHalKind::Sim] {
            assert_eq!(kind(&["--node-hal", k.as_str()]), Ok(k));
        }
        assert_eq!(
            kind(&["--node-hal", "linux", "--linux-links", "l.json"]),
            Ok(NodeHalKind::Linux)
        );
        assert_eq!(
            kind(&["--node-hal", "sim", "--sim-link-down", "1"]),
            Ok(NodeHalKind::Sim)
        );
        let e = kind(&["--node-hal", "nvml"]).unwrap_err();
        assert!(e.contains("dcmi, linux, sim"), "{e}");
    }

    #[test]
    fn the_old_flags_are_spellings_of_the_value() {
        assert_eq!(kind(&["--sim"]), Ok(NodeHalKind::Sim));
        assert_eq!(
            kind(&["--sim", "--sim-link-down", "3"]),
            Ok(NodeHalKind::Sim)
        );
        assert_eq!(kind(&["--node-hal", "sim", "--sim"]), Ok(NodeHalKind::Sim));
        assert_eq!(kind(&["--linux-links", "l.json"]), Ok(NodeHalKind::Linux));
        // --sim is not in the help; --node-hal says what replaced it.
        let Err(help) = Cli::try_parse_from(["t", "--help"]) else {
            panic!("--help parsed as flags")
        };
        let help = help.to_string();
        assert!(!help.contains("\n      --sim "), "{help}");
        assert!(
            help.contains("--node-hal <HAL>") && help.contains("Deprecated"),
            "{help}"
        );
    }

    #[test]
    fn flags_of_two_node_hals_are_refused_naming_both() {
        let e = kind(&["--node-hal", "linux"]).unwrap_err();
        assert!(e.contains("--linux-links FILE"), "{e}");
        let e = kind(&["--node-hal", "dcmi", "--sim"]).unwrap_err();
        assert!(e.contains("--node-hal dcmi"), "{e}");
        let e = kind(&["--sim", "--linux-links", "l.json"]).unwrap_err();
        assert!(e.contains("give one --node-hal"), "{e}");
        let e = kind(&["--node-hal", "sim", "--linux-links", "l.json"]).unwrap_err();
        assert!(e.contains("not the sim one's"), "{e}");
        let e = kind(&["--sim-link-down", "1"]).unwrap_err();
        assert!(
            e.contains("--sim-link-down is for --node-hal sim, not dcmi"),
            "{e}"
        );
    }
}
