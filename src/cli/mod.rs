//! The `taskd` command line. Each subcommand lives in a file of its own; `main.rs` only calls
//! [`main`].

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod sim;

#[derive(Parser)]
#[command(
    name = "taskd",
    version,
    about = "NIC failover and switchback for running Ascend training jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a simulated job in this process (mock HAL, simulated fabric) through a switch to
    /// the backup NIC and back, and report.
    Sim(sim::SimArgs),
}

/// Parses the command line, sets up logging and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Sim(args) => sim::run(args),
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: errors only).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
