//! `taskd manager`: the job's manager, serving its proxies (and, with `--control-addr`, the
//! operators' control API). Starting and stopping it is [`ManagerProcess`]'s.

use super::error::CliError;
use super::flags;
use super::net_common::{say, NetArgs, TlsArgs};
use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use taskd_actors::control::{ControlConfig, GuardConfig, RateLimit};
use taskd_actors::net::{ManagerNodeConfig, DEFAULT_MANAGER_PORT};
use taskd_actors::process::{rank_table, ManagerProcess, ManagerProcessConfig, ShutdownSignals};
use taskd_core::env::{self, process_env};
use taskd_core::rank_table::{MAX_NODES, MAX_RANKS};
use taskd_core::{JobId, PhaseDeadlines, RankTable};

/// The flags of `taskd manager`: the job, its shape, the manager's two ports and their
/// TLS, and the deadlines of every operation.
#[derive(Args)]
pub struct ManagerArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = env::MINDX_TASK_ID, value_parser = flags::non_empty)]
    job_id: String,
    /// Nodes in the job, named node-0 .. node-{N-1} (or give --rank-table); at most 4096.
    #[arg(long, value_name = "N", required_unless_present = "rank_table", value_parser = flags::count(MAX_NODES))]
    nodes: Option<u32>,
    /// Training processes (ranks) per node; rank = node_rank * P + local index. At most
    /// 65536 ranks in all.
    #[arg(long, value_name = "P", required_unless_present = "rank_table", value_parser = flags::count(MAX_RANKS))]
    procs_per_node: Option<u32>,
    /// The HCCL rank table (JSON: server_list / device / rank_id) instead of --nodes and
    /// --procs-per-node.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nodes", "procs_per_node"])]
    rank_table: Option<PathBuf>,
    /// Where proxies connect (default: 0.0.0.0:9601, or [::]:9601 when MS_SCHED_HOST is an
    /// IPv6 address).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Serve the operators' control API (ClusterD-compatible) here.
    #[arg(long, value_name = "ADDR")]
    control_addr: Option<SocketAddr>,
    /// File holding the bearer token the control API requires (or set TASKD_CONTROL_TOKEN).
    #[arg(long, value_name = "FILE", requires = "control_addr")]
    control_token_file: Option<PathBuf>,
    /// Requests a client of the control API may send at once before the rate limit applies.
    #[arg(long, value_name = "N", default_value_t = RateLimit::default().burst)]
    control_rate_burst: u32,
    /// Requests per second a client of the control API may send after its burst.
    #[arg(long, value_name = "N", default_value_t = RateLimit::default().per_second)]
    control_rate_per_sec: f64,
    /// Start even though MS_SCHED_HOST differs from POD_IP (the manager belongs on the
    /// scheduler host).
    #[arg(long)]
    force: bool,
    /// Deadline of each pause part (sample, pause).
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms())]
    pause_timeout_ms: Option<u64>,
    /// Deadline of the switch phase.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms())]
    switch_timeout_ms: Option<u64>,
    /// Deadline of the rollback.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms())]
    rollback_timeout_ms: Option<u64>,
    /// Deadline of the resume.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms())]
    resume_timeout_ms: Option<u64>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

impl ManagerArgs {
    /// The process's configuration, or why these flags and this environment cannot run.
    fn config(&self) -> Result<ManagerProcessConfig, CliError> {
        let sched = env::get(&process_env, env::MS_SCHED_HOST);
        if !self.force {
            if let (Some(sched), Some(pod)) = (&sched, env::get(&process_env, env::POD_IP)) {
                if !env::same_host(sched, &pod) {
                    return Err(CliError::usage(format!(
                        "MS_SCHED_HOST ({sched}) is not this pod's POD_IP ({pod}): the manager \
                         runs on the scheduler host only; use --force to run it here anyway"
                    )));
                }
            }
        }
        let table = match (&self.rank_table, self.nodes, self.procs_per_node) {
            (Some(path), _, _) => rank_table::load(path)?,
            (None, Some(n), Some(p)) => RankTable::try_uniform(n, p)?,
            _ => {
                return Err(CliError::usage(
                    "give --nodes and --procs-per-node, or --rank-table",
                ))
            }
        };
        let tls = self.tls.load()?;
        let job = JobId(self.job_id.clone());
        let rate = RateLimit {
            burst: self.control_rate_burst,
            per_second: self.control_rate_per_sec,
        };
        rate.check().map_err(|e| {
            CliError::usage(format!("--control-rate-burst/--control-rate-per-sec: {e}"))
        })?;
        let control = match self.control_addr {
            None => None,
            // The transport's TLS files serve the control port too (mutual: the job's CA).
            Some(addr) => Some(ControlConfig {
                guard: GuardConfig {
                    token: super::connect::control_token(self.control_token_file.as_deref())
                        .map_err(CliError::Usage)?,
                    rate,
                },
                tls: tls.clone(),
                ..ControlConfig::new(addr, job.clone())
            }),
        };
        let listen = self
            .listen
            .unwrap_or_else(|| default_listen(sched.as_deref()));
        Ok(ManagerProcessConfig {
            node: ManagerNodeConfig {
                job,
                table,
                deadlines: self.deadlines(),
                listen,
                tls,
                net: self.net.config(),
            },
            control,
        })
    }

    fn deadlines(&self) -> PhaseDeadlines {
        let d = PhaseDeadlines::default();
        let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
        PhaseDeadlines {
            pause: ms(self.pause_timeout_ms, d.pause),
            switch: ms(self.switch_timeout_ms, d.switch),
            rollback: ms(self.rollback_timeout_ms, d.rollback),
            resume: ms(self.resume_timeout_ms, d.resume),
        }
    }
}

/// Every address of the manager's port, in the family of `MS_SCHED_HOST` (the address its
/// proxies connect to): `[::]:9601` for IPv6, else `0.0.0.0:9601`.
fn default_listen(sched_host: Option<&str>) -> SocketAddr {
    let any = match sched_host.and_then(env::parse_ip) {
        Some(IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    SocketAddr::new(any, DEFAULT_MANAGER_PORT)
}

/// Runs the manager until SIGINT, SIGTERM or SIGHUP.
pub fn run(a: ManagerArgs) -> Result<ExitCode, CliError> {
    let _metrics = a.net.serve_metrics("manager")?;
    let cfg = a.config()?;
    let (job, nodes, ranks) = (
        cfg.node.job.clone(),
        cfg.node.table.nodes().len(),
        cfg.node.table.world_size(),
    );
    actix_rt::System::new().block_on(async move {
        let mut signals = ShutdownSignals::install()?;
        let manager = ManagerProcess::start(cfg).await?;
        say(format!(
            "taskd manager listening on {} (job {job}, {nodes} nodes, {ranks} ranks)",
            manager.local_addr()
        ));
        if let Some(addr) = manager.control_addr() {
            say(format!("taskd manager control API on {addr}"));
        }
        let sig = signals.recv().await;
        eprintln!("taskd manager: {sig}: shutting down");
        // Never leave ranks held: the operation in flight ends safely first (a second signal
        // stops at once; the next manager then adopts what is left).
        match signals.or_signal(manager.drain(sig)).await {
            Ok(Some(report)) => eprintln!("taskd manager: ended before stopping: {report}"),
            Ok(None) => {}
            Err(again) => eprintln!(
                "taskd manager: {again} again: stopping now; held ranks stay held until the next manager verifies them"
            ),
        }
        manager.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_in_the_family_of_the_scheduler_host() {
        assert_eq!(default_listen(None).to_string(), "0.0.0.0:9601");
        assert_eq!(default_listen(Some("10.0.0.1")).to_string(), "0.0.0.0:9601");
        assert_eq!(default_listen(Some("fd00::1")).to_string(), "[::]:9601");
        assert_eq!(default_listen(Some("[fd00::1]")).to_string(), "[::]:9601");
        assert_eq!(default_listen(Some("mgr-0")).to_string(), "0.0.0.0:9601");
    }
}
