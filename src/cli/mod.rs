//! The `taskd` command line. Each subcommand lives in a file of its own and returns its exit
//! code or a [`CliError`]; [`main`] prints the error (the one place that does) and exits with
//! its code. The roles' flags and configuration are `taskd_roles`' (the C ABI parses the same
//! ones); starting and stopping the roles is `taskd_actors::process`'; `main.rs` only calls
//! [`main`].

use clap::{Parser, Subcommand};
pub use error::CliError;
use std::process::ExitCode;
use taskd_core::GlobalRank;
pub use taskd_roles::{auto, flags, say};

pub mod chaos;
pub mod connect;
pub mod doctor;
pub mod error;
pub mod recover;
pub mod render;
pub mod roles;
pub mod serve;
pub mod sim;
pub mod status;
pub mod switch;
pub mod worker;

#[derive(Parser)]
#[command(
    name = "taskd",
    version,
    about = "NIC failover and switchback for running Ascend training jobs"
)]
pub(crate) struct Cli {
    /// Log format on stderr: `text` for people, `json` (one object per line, with the spans
    /// of the operation: uuid, phase, role) for a log aggregator. Levels from RUST_LOG.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = taskd_core::env::TASKD_LOG_FORMAT)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a simulated job in this process (mock HAL, simulated fabric) through a switch to
    /// the backup NIC and back, and report.
    Sim(sim::SimArgs),
    /// Run seeded fault schedules (crashes, HAL failures, lost connections, operator
    /// commands) on simulated jobs and check the recovery contract's invariants after each.
    Chaos(chaos::ChaosArgs),
    /// Move devices of a running job to their backup NIC or back (through the manager's
    /// control API).
    Switch(switch::SwitchArgs),
    /// Show a job as its manager sees it: workers, NIC table, operation in flight, results.
    Status(status::StatusArgs),
    /// Bring a job that is paused or needs recovery back: re-state the ranks in doubt to one
    /// NIC side and resume, or verify what every rank applied (through the control API).
    Recover(recover::RecoverArgs),
    /// Preflight for a node about to run a job: vendor libraries, HCCL/MindCluster flags, the
    /// taskd port, the job environment. Exit 0 only when no check fails.
    Doctor(doctor::DoctorArgs),
    /// Run the job's manager: proxies connect to it (port 9601), operators reach it through
    /// the control API (--control-addr).
    Manager(taskd_roles::ManagerArgs),
    /// Run one node's proxy, between the node's workers and the manager.
    Proxy(taskd_roles::ProxyArgs),
    /// Run one simulated rank (--sim) as a process of its own, connected to its node's proxy.
    Worker(worker::SimWorkerArgs),
}

/// Parses the command line, sets up logging and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let (name, result) = match cli.command {
        Command::Sim(args) => ("sim", sim::run(args)),
        Command::Chaos(args) => ("chaos", chaos::run(args)),
        Command::Switch(args) => ("switch", switch::run(args)),
        Command::Status(args) => ("status", status::run(args)),
        Command::Recover(args) => ("recover", recover::run(args)),
        Command::Doctor(args) => ("doctor", Ok(doctor::run(args))),
        Command::Manager(args) => ("manager", roles::manager(args)),
        Command::Proxy(args) => ("proxy", roles::proxy(args)),
        Command::Worker(args) => ("worker", worker::run(args)),
    };
    finish(name, result)
}

/// The one place a subcommand's error is printed (`taskd COMMAND: MESSAGE` on stderr) and
/// turned into the process's exit code.
pub fn finish(command: &str, result: Result<ExitCode, CliError>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("taskd {command}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `0-3` or `0, 2, 5`.
pub fn rank_span(ranks: &[GlobalRank]) -> String {
    match (ranks.first(), ranks.last()) {
        (Some(a), Some(b)) if (b.0 - a.0) as usize + 1 == ranks.len() && ranks.len() > 1 => {
            format!("{a}-{b}")
        }
        _ => ranks
            .iter()
            .map(|r| r.0.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A current-thread tokio runtime for a role or a command.
pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start a runtime: {e}")))
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: errors only), as text or JSON.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        // Each line carries the current span and the whole span list, so every line of one
        // operation, on any machine, has its uuid and phase.
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_spans() {
        assert_eq!(
            rank_span(&[GlobalRank(4), GlobalRank(5), GlobalRank(6)]),
            "4-6"
        );
        assert_eq!(rank_span(&[GlobalRank(1), GlobalRank(3)]), "1, 3");
    }
}
