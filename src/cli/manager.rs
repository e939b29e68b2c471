//! `taskd manager`: the job's manager, serving its proxies (and, with `--control-addr`, the
//! operators' control API; in a MindCluster cluster, as ClusterD's client). Starting and
//! stopping it is [`ManagerProcess`]'s.

use super::auto::AutoArgs;
use super::error::CliError;
use super::flags;
use super::net_common::{say, NetArgs, TlsArgs};
use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use taskd_actors::clusterd::ClusterdConfig;
use taskd_actors::control::{ControlConfig, GuardConfig, RateLimit};
use taskd_actors::manager::{HoldPolicy, SubscribeProgress};
use taskd_actors::net::{ManagerNodeConfig, DEFAULT_MANAGER_PORT};
use taskd_actors::process::{rank_table, ManagerProcess, ManagerProcessConfig, ShutdownSignals};
use taskd_actors::telemetry::MetricsServer;
use taskd_core::env::{self, process_env};
use taskd_core::external;
use taskd_core::operation::Trigger;
use taskd_core::rank_table::{MAX_NODES, MAX_RANKS};
use taskd_core::{JobId, PhaseDeadlines, RankTable};

/// `--hold-policy`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeldPolicyArg {
    /// Stop training once the job has not run for --hold-bound-ms.
    Stop,
    /// Hold training until an operator acts.
    Hold,
}

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
    /// Be ClusterD's client at HOST:PORT (default: $MINDX_SERVER_IP:8899, or 127.0.0.1:8899
    /// when LOCAL_PROXY_ENABLE=on; not a client when neither is set).
    #[arg(long, value_name = "HOST:PORT", value_parser = flags::host_port, conflicts_with = "no_clusterd")]
    clusterd: Option<String>,
    /// Not ClusterD's client, whatever the environment says.
    #[arg(long)]
    no_clusterd: bool,
    /// How long a pause ClusterD started holds waiting for its next signal before training
    /// resumes (default 900000: ClusterD's own wait for each answer).
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms())]
    clusterd_hold_ms: Option<u64>,
    /// Start even though MS_SCHED_HOST differs from POD_IP (the manager belongs on the
    /// scheduler host).
    #[arg(long)]
    force: bool,
    /// Keep what must survive a restart here (created when missing): the journal of finished
    /// operations, so a command repeated with its uuid after a restart returns the earlier
    /// result instead of running again. Without it a restarted manager forgets every uuid.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
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
    /// What a job that does not run (paused or needs_recovery: a failed rollback, a recovery
    /// that could not re-state, a lost process) leads to: `stop` stops training once it has
    /// not run for --hold-bound-ms (the launcher restarts the processes on their default
    /// NIC); `hold` holds training until an operator acts.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = HeldPolicyArg::Stop)]
    hold_policy: HeldPolicyArg,
    /// With --hold-policy stop: how long a job may not run before training is stopped.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms(),
          default_value_t = taskd_actors::manager::DEFAULT_HOLD_BOUND.as_millis() as u64)]
    hold_bound_ms: u64,
    #[command(flatten)]
    auto: AutoArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

impl ManagerArgs {
    /// The process's configuration, or why these flags and this environment cannot run.
    /// (Also what the embedded manager of `taskd-capi` runs, from its JSON configuration.)
    pub fn config(&self) -> Result<ManagerProcessConfig, CliError> {
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
        let clusterd = self.clusterd_config(&job)?;
        if let (Some(c), true) = (&clusterd, self.auto.config().is_some()) {
            return Err(CliError::usage(format!(
                "--auto-failover is off in ClusterD client mode: ClusterD (at {}) decides every \
                 switch there; drop --auto-failover, or pass --no-clusterd for a job ClusterD \
                 does not drive",
                c.addr
            )));
        }
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
            clusterd,
            auto: self.auto.config(),
            state_dir: self.state_dir.clone(),
            hold: match self.hold_policy {
                HeldPolicyArg::Stop => {
                    HoldPolicy::StopAfter(Duration::from_millis(self.hold_bound_ms))
                }
                HeldPolicyArg::Hold => HoldPolicy::Hold,
            },
        })
    }

    /// Starts the metrics endpoint when `--metrics-addr` was given (keep it while the role runs).
    pub fn serve_metrics(&self) -> Result<Option<MetricsServer>, CliError> {
        self.net.serve_metrics("manager")
    }

    /// ClusterD's client: `--clusterd`, else the environment (`--no-clusterd`: none).
    fn clusterd_config(&self, job: &JobId) -> Result<Option<ClusterdConfig>, CliError> {
        let addr = match (&self.clusterd, self.no_clusterd) {
            (Some(a), _) => a.clone(),
            (None, true) => return Ok(None),
            (None, false) => match env::clusterd_addr(&process_env, external::DEFAULT_PORT) {
                None => return Ok(None),
                Some(a) => {
                    env::check_host_port(&a).map_err(|e| {
                        CliError::usage(format!(
                            "{} or {}: ClusterD's address {e}",
                            env::MINDX_SERVER_IP,
                            env::LOCAL_PROXY_ENABLE
                        ))
                    })?;
                    a
                }
            },
        };
        let mut cfg = ClusterdConfig::new(addr, job.clone());
        if let Some(ms) = self.clusterd_hold_ms {
            cfg.hold = Duration::from_millis(ms);
        }
        Ok(Some(cfg))
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

/// Prints one line on stdout for every automatic operation's result, as it comes (the
/// decisions themselves are in the log).
async fn say_automatic_results(manager: &ManagerProcess) {
    use tokio::sync::broadcast::error::RecvError;
    let Ok(mut rx) = manager.node().manager().send(SubscribeProgress).await else {
        return;
    };
    actix_rt::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    if let Some(r) = ev.report().filter(|r| r.trigger == Trigger::Auto) {
                        say(format!("taskd manager: automatic {r}"));
                    }
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            }
        }
    });
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
    let _metrics = a.serve_metrics()?;
    let cfg = a.config()?;
    let (job, nodes, ranks, auto) = (
        cfg.node.job.clone(),
        cfg.node.table.nodes().len(),
        cfg.node.table.world_size(),
        cfg.auto,
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
        if let Some(addr) = manager.clusterd_addr() {
            say(format!("taskd manager is ClusterD's client at {addr}"));
        }
        if let Some(a) = auto {
            say(format!(
                "taskd manager: automatic failover on (links probed every {} ms)",
                a.link_probe.as_millis()
            ));
            say_automatic_results(&manager).await;
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
