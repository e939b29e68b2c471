//! `taskd sim --serve`: the simulated job as a live rig. It trains until interrupted and
//! serves the control API, so the CLI, a platform or a dashboard can drive it.

use super::error::CliError;
use super::flags;
use super::runtime;
use crate::sim::{SimConfig, Simulation};
use clap::Args;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use taskd_actors::control::{self, ControlConfig, GuardConfig, RateLimit};
use taskd_actors::net::{PemIdentity, TlsPem};
use taskd_actors::process::ShutdownSignals;
use taskd_core::JobId;

/// The flags `taskd sim --serve` adds: the control API's address, the simulated job's id,
/// and the API's token, TLS and rate limit.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Keep the simulated job training and serve the control API until SIGINT, SIGTERM or
    /// SIGHUP, instead of running the scripted scenario.
    #[arg(long)]
    pub serve: bool,
    /// Where the control API listens (port 0 picks a free port; the bound address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9602")]
    pub control_addr: SocketAddr,
    /// The simulated job's id.
    #[arg(long, value_name = "ID", default_value = "sim", value_parser = flags::non_empty)]
    pub job_id: String,
    /// Require this bearer token (file) on the control API (or set TASKD_CONTROL_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Server certificate (PEM); turns on TLS for the control API.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Server key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must be signed by (mutual TLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Requests a client may send at once before the rate limit applies.
    #[arg(long, value_name = "N", default_value_t = RateLimit::default().burst, value_parser = flags::count(1_000_000))]
    pub rate_burst: u32,
    /// Requests per second a client may send after its burst (positive).
    #[arg(long, value_name = "N", default_value_t = RateLimit::default().per_second, value_parser = flags::rate)]
    pub rate_per_sec: f64,
}

fn read(p: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

impl ServeArgs {
    /// The control port's guard: token from `--token-file` or `TASKD_CONTROL_TOKEN`.
    pub fn guard(&self) -> Result<GuardConfig, String> {
        let token = super::connect::control_token(self.token_file.as_deref())?;
        let rate = RateLimit {
            burst: self.rate_burst,
            per_second: self.rate_per_sec,
        };
        rate.check()
            .map_err(|e| format!("--rate-burst/--rate-per-sec: {e}"))?;
        Ok(GuardConfig { token, rate })
    }

    /// The control port's TLS: `--tls-cert`/`--tls-key`, mutual with `--tls-client-ca`.
    pub fn tls(&self) -> Result<Option<TlsPem>, String> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        Ok(Some(TlsPem {
            ca: self.tls_client_ca.as_ref().map(read).transpose()?,
            identity: Some(PemIdentity {
                cert: read(cert)?,
                key: read(key)?,
            }),
            domain: None,
        }))
    }
}

/// How many steps the live simulator's step clock keeps (it builds no timeline).
const SERVE_STEPS_KEPT: usize = 1024;

/// Runs the live rig until SIGINT, SIGTERM or SIGHUP; exit 1 if an invariant broke.
pub fn run(mut cfg: SimConfig, a: ServeArgs) -> Result<ExitCode, CliError> {
    cfg.job = JobId(a.job_id.clone());
    let guard = a.guard().map_err(CliError::Usage)?;
    let tls = a.tls().map_err(CliError::Usage)?;
    let rt = runtime()?;
    let mut signals = rt.block_on(async { ShutdownSignals::install() })?;
    let sim = Simulation::start(&cfg).map_err(|e| CliError::Failed(e.to_string()))?;
    // No timeline is built here: a few seconds of steps, not minutes of them.
    sim.step_clock().keep_latest(SERVE_STEPS_KEPT);
    let server = control::serve(
        sim.job().manager().clone(),
        ControlConfig {
            guard,
            tls,
            ..ControlConfig::new(a.control_addr, cfg.job.clone())
        },
    )
    .map_err(|e| CliError::Failed(e.to_string()))?;
    // One line a person or a script can read the port from.
    println!(
        "taskd sim: job {} ({} nodes x {} devices, simulated) serving the control API on {}",
        cfg.job,
        cfg.nodes,
        cfg.devices_per_node,
        server.local_addr()
    );
    let _ = std::io::stdout().flush();
    let sig = rt.block_on(signals.recv());
    eprintln!("taskd sim: {sig}: stopping");
    server.shutdown();
    let end = sim.finish();
    println!(
        "taskd sim: stopped after {} steps; ranks on backup NIC: {:?}; groups consistent: {}; job {}",
        end.steps_completed,
        end.ranks_on_backup.iter().map(|r| r.0).collect::<Vec<_>>(),
        end.groups_consistent,
        end.job_state.as_str()
    );
    if end.groups_consistent && end.collectives_on_inconsistent_groups == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(CliError::Failed(format!(
            "INVARIANT BROKEN: {}",
            end.consistency
        )))
    }
}
