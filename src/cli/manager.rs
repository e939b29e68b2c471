//! `taskd manager`: the job's manager, serving its proxies (and, with `--control-addr`, the
//! operators' control API).

use super::net_common::{env, load_rank_table, say, shutdown_signal, NetArgs, TlsArgs};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use taskd_actors::control::{ControlConfig, GuardConfig, RateLimit};
use taskd_actors::net::{ManagerNode, ManagerNodeConfig, DEFAULT_MANAGER_PORT};
use taskd_core::{JobId, PhaseDeadlines, RankTable};

#[derive(Args)]
pub struct ManagerArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = "MINDX_TASK_ID")]
    job_id: String,
    /// Nodes in the job, named node-0 .. node-{N-1} (or give --rank-table).
    #[arg(long, value_name = "N", required_unless_present = "rank_table")]
    nodes: Option<u32>,
    /// Training processes (ranks) per node; rank = node_rank * P + local index.
    #[arg(long, value_name = "P", required_unless_present = "rank_table")]
    procs_per_node: Option<u32>,
    /// The HCCL rank table (JSON: server_list / device / rank_id) instead of --nodes and
    /// --procs-per-node.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nodes", "procs_per_node"])]
    rank_table: Option<PathBuf>,
    /// Where proxies connect.
    #[arg(long, value_name = "ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_MANAGER_PORT)))]
    listen: SocketAddr,
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
    #[arg(long, value_name = "MS")]
    pause_timeout_ms: Option<u64>,
    /// Deadline of the switch phase.
    #[arg(long, value_name = "MS")]
    switch_timeout_ms: Option<u64>,
    /// Deadline of the rollback.
    #[arg(long, value_name = "MS")]
    rollback_timeout_ms: Option<u64>,
    /// Deadline of the resume.
    #[arg(long, value_name = "MS")]
    resume_timeout_ms: Option<u64>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

pub fn run(a: ManagerArgs) -> ExitCode {
    let _metrics = match a.net.serve_metrics("manager") {
        Ok(m) => m,
        Err(code) => return code,
    };
    if !a.force {
        if let (Some(sched), Some(pod)) = (env("MS_SCHED_HOST"), env("POD_IP")) {
            if sched != pod {
                eprintln!(
                    "taskd manager: MS_SCHED_HOST ({sched}) is not this pod's POD_IP ({pod}): the manager runs on the scheduler host only; use --force to run it here anyway"
                );
                return ExitCode::from(2);
            }
        }
    }
    let table = match (&a.rank_table, a.nodes, a.procs_per_node) {
        (Some(path), _, _) => match load_rank_table(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("taskd manager: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(n), Some(p)) if n > 0 && p > 0 => RankTable::uniform(n, p),
        _ => {
            eprintln!("taskd manager: --nodes and --procs-per-node must be at least 1");
            return ExitCode::from(2);
        }
    };
    let tls = match a.tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("taskd manager: {e}");
            return ExitCode::from(2);
        }
    };
    let token = match super::connect::control_token(a.control_token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("taskd manager: {e}");
            return ExitCode::from(2);
        }
    };
    let rate = RateLimit {
        burst: a.control_rate_burst,
        per_second: a.control_rate_per_sec,
    };
    if let Err(e) = rate.check() {
        eprintln!("taskd manager: --control-rate-burst/--control-rate-per-sec: {e}");
        return ExitCode::from(2);
    }
    let d = PhaseDeadlines::default();
    let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
    let deadlines = PhaseDeadlines {
        pause: ms(a.pause_timeout_ms, d.pause),
        switch: ms(a.switch_timeout_ms, d.switch),
        rollback: ms(a.rollback_timeout_ms, d.rollback),
        resume: ms(a.resume_timeout_ms, d.resume),
    };
    let job = JobId(a.job_id.clone());
    let cfg = ManagerNodeConfig {
        job: job.clone(),
        table: table.clone(),
        deadlines,
        listen: a.listen,
        tls: tls.clone(),
        net: a.net.config(),
    };
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        let node = match ManagerNode::spawn(cfg).await {
            Ok(n) => n,
            Err(e) => {
                eprintln!("taskd manager: {e}");
                return ExitCode::from(1);
            }
        };
        say(format!(
            "taskd manager listening on {} (job {job}, {} nodes, {} ranks)",
            node.local_addr(),
            table.nodes().len(),
            table.world_size()
        ));
        // The operators' control API, served in front of the same manager actor.
        let control = match a.control_addr {
            Some(addr) => {
                // The transport's TLS files serve the control port too (mutual: the job's CA).
                let cfg = ControlConfig {
                    guard: GuardConfig { token, rate },
                    tls: tls.clone(),
                    ..ControlConfig::new(addr, job.clone())
                };
                match taskd_actors::control::serve(node.manager().clone(), cfg) {
                    Ok(c) => {
                        say(format!("taskd manager control API on {}", c.local_addr()));
                        Some(c)
                    }
                    Err(e) => {
                        eprintln!("taskd manager: control API: {e}");
                        node.shutdown().await;
                        return ExitCode::from(1);
                    }
                }
            }
            None => None,
        };
        let sig = shutdown_signal().await;
        eprintln!("taskd manager: {sig}: shutting down");
        if let Some(c) = control {
            c.shutdown();
        }
        node.shutdown().await;
        ExitCode::SUCCESS
    })
}
