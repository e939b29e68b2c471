//! `taskd status`: the job as its manager sees it.

use super::connect::{call_error, ConnectArgs};
use super::error::{exit, CliError};
use super::runtime;
use clap::Args;
use std::process::ExitCode;

/// The flags of `taskd status`: where the control API is, the job, how much history.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// The job's id.
    #[arg(long)]
    job: String,
    /// How many past results to show.
    #[arg(long, default_value_t = 10)]
    recent: u32,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Asks the manager for the job's status and prints it, as a table or one JSON object; an
/// unknown job (exit 1), a token that cannot be read (exit 2) or an unreachable manager (exit 3)
/// is a [`CliError`].
pub fn run(a: StatusArgs) -> Result<ExitCode, CliError> {
    let s = runtime()?.block_on(async {
        let mut client = a.connect.client().await?;
        client.status(&a.job, a.recent).await.map_err(call_error)
    })?;
    if a.json {
        println!("{:#}", super::render::status_json(&s));
    } else {
        print!("{}", super::render::status_text(&s));
    }
    Ok(ExitCode::from(exit::OK))
}
