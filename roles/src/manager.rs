//! The manager's options: the job's manager, serving its proxies (and, with `--control-addr`,
//! the operators' control API; in a MindCluster cluster, as ClusterD's client). Starting and
//! stopping it is `taskd_actors::process::ManagerProcess`'s.

use crate::auto::AutoArgs;
use crate::error::ConfigError;
use crate::flags;
use crate::net::{NetArgs, TlsArgs};
use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use taskd_actors::clusterd::ClusterdConfig;
use taskd_actors::control::{ControlConfig, GuardConfig, RateLimit};
use taskd_actors::manager::HoldPolicy;
use taskd_actors::net::{ManagerNodeConfig, DEFAULT_MANAGER_PORT};
use taskd_actors::process::{rank_table, ManagerProcessConfig};
use taskd_actors::telemetry::MetricsServer;
use taskd_core::clusterd;
use taskd_core::env::{self, process_env};
use taskd_core::ledger::ProcessRecovery;
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
    /// How long a pause ClusterD started waits for its next signal before training resumes
    /// (default 900000: ClusterD's own wait for each answer). Formerly --clusterd-hold-ms, still
    /// accepted: "hold" is the hold policy's word (--hold-policy, --hold-bound-ms).
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms(),
          alias = "clusterd-hold-ms")]
    clusterd_signal_wait_ms: Option<u64>,
    /// Start even though MS_SCHED_HOST differs from POD_IP (the manager belongs on the
    /// scheduler host).
    #[arg(long)]
    force: bool,
    /// Keep what must survive a restart here (created when missing): the journal of finished
    /// operations, so a command repeated with its uuid after a restart returns the earlier
    /// result instead of running again. Without it a restarted manager forgets every uuid. One
    /// manager per directory (it holds it locked); it must be writable, and by this manager's
    /// user alone.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// How long the manager waits for a write of its journal (--state-dir) before it counts
    /// the journal as failing (a file system that does not answer: a hung NFS server, a
    /// frozen or dying disk): the command being admitted is refused, and so is every new one
    /// until a write succeeds again. The manager handles nothing else while it waits.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms(),
          default_value_t = taskd_actors::manager::DEFAULT_JOURNAL_TIMEOUT.as_millis() as u64)]
    journal_timeout_ms: u64,
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
    /// Coordinate process recovery: a rank whose process died stops training on every rank
    /// and every node's launcher (taskd's agent) restarts all its workers together, as one
    /// restart of the job, at most --max-restarts times. On by default where PROCESS_RECOVER
    /// is `on` (MindCluster's switch for process-level recovery).
    #[arg(long)]
    process_recovery: bool,
    /// With process recovery: how many restarts the job may have in all.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    max_restarts: u32,
    /// How long a stop of training (and the restart after it) may take before it is
    /// overdue: then it says which ranks it still waits for and why.
    #[arg(long, value_name = "MS", value_parser = flags::deadline_ms(),
          default_value_t = taskd_core::ledger::DEFAULT_STOP_BOUND.as_millis() as u64)]
    stop_bound_ms: u64,
    #[command(flatten)]
    auto: AutoArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

impl ManagerArgs {
    /// The process's configuration, or why these flags and this environment cannot run.
    /// (`taskd manager` runs it, and so does the embedded manager of `taskd-capi`.)
    pub fn config(&self) -> Result<ManagerProcessConfig, ConfigError> {
        let sched = env::get(&process_env, env::MS_SCHED_HOST);
        if !self.force {
            if let (Some(sched), Some(pod)) = (&sched, env::get(&process_env, env::POD_IP)) {
                if !env::same_host(sched, &pod) {
                    return Err(ConfigError::usage(format!(
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
                return Err(ConfigError::usage(
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
            ConfigError::usage(format!("--control-rate-burst/--control-rate-per-sec: {e}"))
        })?;
        let control = match self.control_addr {
            None => None,
            // The transport's TLS files serve the control port too (mutual: the job's CA).
            Some(addr) => Some(ControlConfig {
                guard: GuardConfig {
                    token: control_token(self.control_token_file.as_deref())
                        .map_err(ConfigError::Usage)?,
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
            return Err(ConfigError::usage(format!(
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
                net: self.net.checked()?,
            },
            control,
            clusterd,
            auto: self.auto.config(),
            abort_in_flight: self.auto.abort_in_flight,
            state_dir: self.state_dir.clone(),
            journal_timeout: Duration::from_millis(self.journal_timeout_ms),
            hold: match self.hold_policy {
                HeldPolicyArg::Stop => {
                    HoldPolicy::StopAfter(Duration::from_millis(self.hold_bound_ms))
                }
                HeldPolicyArg::Hold => HoldPolicy::Hold,
            },
            recovery: self.process_recovery().then_some(ProcessRecovery {
                max_restarts: self.max_restarts,
            }),
            stop_bound: Duration::from_millis(self.stop_bound_ms),
        })
    }

    /// `--process-recovery`, or `PROCESS_RECOVER=on` in the environment.
    fn process_recovery(&self) -> bool {
        self.process_recovery
            || env::get(&process_env, env::PROCESS_RECOVER)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("on"))
    }

    /// Starts the metrics endpoint when `--metrics-addr` was given (keep it while the role runs).
    pub fn serve_metrics(&self) -> Result<Option<MetricsServer>, ConfigError> {
        self.net.serve_metrics("manager")
    }

    /// ClusterD's client: `--clusterd`, else the environment (`--no-clusterd`: none).
    fn clusterd_config(&self, job: &JobId) -> Result<Option<ClusterdConfig>, ConfigError> {
        let addr = match (&self.clusterd, self.no_clusterd) {
            (Some(a), _) => a.clone(),
            (None, true) => return Ok(None),
            (None, false) => match env::clusterd_addr(&process_env, clusterd::DEFAULT_PORT) {
                None => return Ok(None),
                Some(a) => {
                    env::check_host_port(&a).map_err(|e| {
                        ConfigError::usage(format!(
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
        if let Some(ms) = self.clusterd_signal_wait_ms {
            cfg.signal_wait = Duration::from_millis(ms);
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

/// The longest token file read: far above any bearer token (a larger file is not one).
const MAX_TOKEN_BYTES: u64 = 4096;

/// The control API's bearer token, for the client and the server alike: the trimmed contents of
/// `file` (a regular file, read without blocking), or else `TASKD_CONTROL_TOKEN` when set and
/// not empty. Refused, naming the source, when it is only whitespace (it would otherwise turn
/// authentication off without anyone noticing) or holds a character an HTTP header cannot
/// carry (no client could send it: every operator would be locked out).
pub fn control_token(file: Option<&std::path::Path>) -> Result<Option<String>, String> {
    token_from(file, &taskd_core::env::process_env)
}

fn token_from(
    file: Option<&std::path::Path>,
    env: taskd_core::env::EnvLookup<'_>,
) -> Result<Option<String>, String> {
    use taskd_core::env::TASKD_CONTROL_TOKEN;
    let (text, source) = match file {
        Some(p) => {
            let source = format!("the token file {}", p.display());
            let bytes = taskd_actors::files::read_regular(p, MAX_TOKEN_BYTES)
                .map_err(|e| format!("cannot read {source}: {e}"))?;
            let text = String::from_utf8(bytes).map_err(|_| format!("{source} is not text"))?;
            (text, source)
        }
        None => match env(TASKD_CONTROL_TOKEN) {
            None => return Ok(None),
            Some(v) if v.is_empty() => return Ok(None),
            Some(v) => (
                v.into_string()
                    .map_err(|_| format!("{TASKD_CONTROL_TOKEN} is not text"))?,
                TASKD_CONTROL_TOKEN.to_owned(),
            ),
        },
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(format!(
            "{source} is empty or only whitespace, which would turn authentication off; give a token, or none at all"
        ));
    }
    if let Some(c) = t.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "{source} holds {c:?}, which an HTTP header cannot carry, so no client could send the token; a token is one line of printable ASCII"
        ));
    }
    Ok(Some(t.to_owned()))
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

    use std::ffi::OsString;

    fn env(v: Option<&str>) -> impl Fn(&str) -> Option<OsString> + '_ {
        move |name| (name == taskd_core::env::TASKD_CONTROL_TOKEN).then(|| v.map(OsString::from))?
    }

    #[test]
    fn tokens_a_header_cannot_carry_or_that_are_blank_are_refused_naming_the_source() {
        assert_eq!(token_from(None, &env(None)), Ok(None));
        assert_eq!(token_from(None, &env(Some(""))), Ok(None));
        assert_eq!(
            token_from(None, &env(Some(" s3cret \n"))),
            Ok(Some("s3cret".into()))
        );
        let e = token_from(None, &env(Some(" "))).unwrap_err();
        assert!(
            e.starts_with("TASKD_CONTROL_TOKEN is empty or only whitespace"),
            "{e}"
        );
        let e = token_from(None, &env(Some("a\tb"))).unwrap_err();
        assert!(e.contains("TASKD_CONTROL_TOKEN holds '\\t'"), "{e}");

        let dir = std::env::temp_dir().join(format!("taskd-roles-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tok");
        for (text, want) in [
            (
                "first\nsecond\n",
                "holds '\\n', which an HTTP header cannot carry",
            ),
            ("  \n\t", "is empty or only whitespace"),
            ("caf\u{e9}", "holds '\u{e9}'"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = token_from(Some(&file), &env(None)).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains(&file.display().to_string()), "{e}");
        }
        std::fs::write(&file, "one line\n").unwrap();
        assert_eq!(
            token_from(Some(&file), &env(Some("ignored"))),
            Ok(Some("one line".into()))
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let e = token_from(Some(std::path::Path::new("/dev/zero")), &env(None)).unwrap_err();
        assert!(e.contains("a character device"), "{e}");
    }
}
