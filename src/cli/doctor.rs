//! `taskd doctor`: preflight checks for a node about to run a job (see [`crate::doctor`]).

use crate::doctor::{self, DoctorConfig, DEFAULT_PORT};
use clap::Args;
use std::io::Write as _;
use std::process::ExitCode;
use taskd_core::env::process_env;

/// The flags of `taskd doctor`: the port to check and the output format. Everything else it
/// checks is read from the node and from the process's environment, as the roles read them.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// The taskd port to check (the pod's containerPort named taskd-port).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Print a JSON array of {check, status, detail, fix} instead of one line per check.
    #[arg(long)]
    pub json: bool,
}

/// Exit status 0 when no check failed, 1 otherwise.
pub fn run(a: DoctorArgs) -> ExitCode {
    let cfg = DoctorConfig {
        port: a.port,
        ..DoctorConfig::default()
    };
    let checks = doctor::run(&cfg, &process_env);
    let text = if a.json {
        serde_json::to_string_pretty(&checks).expect("checks serialize") + "\n"
    } else {
        doctor::render_text(&checks)
    };
    // A closed stdout (`| head`) is the reader's choice, not a failed check.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if doctor::ready(&checks) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
