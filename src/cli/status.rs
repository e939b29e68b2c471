//! `taskd status`: the job as its manager sees it.

use super::connect::{exit, explain, ConnectArgs};
use clap::Args;
use std::process::ExitCode;
use taskd_actors::control::ClientError;

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

/// Asks the manager for the job's status and prints it, as a table or one JSON object.
pub fn run(a: StatusArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("taskd status: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    ExitCode::from(rt.block_on(status(a)))
}

async fn status(a: StatusArgs) -> u8 {
    let token = match a.connect.token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("taskd status: {e}");
            return exit::USAGE;
        }
    };
    let mut client = match a.connect.connect(token).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskd status: {e}");
            return exit::UNREACHABLE;
        }
    };
    match client.status(&a.job, a.recent).await {
        Ok(s) => {
            if a.json {
                println!("{:#}", super::render::status_json(&s));
            } else {
                print!("{}", super::render::status_text(&s));
            }
            exit::OK
        }
        Err(ClientError::Rpc(s)) => {
            eprintln!("taskd status: {}", explain(&s));
            if s.code() == tonic::Code::NotFound {
                exit::FAILED
            } else {
                exit::UNREACHABLE
            }
        }
        Err(e) => {
            eprintln!("taskd status: {e}");
            exit::UNREACHABLE
        }
    }
}
