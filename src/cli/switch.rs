//! `taskd switch`: move devices of a job to their backup NIC or back.

use super::connect::{call_error, explain, ConnectArgs};
use super::error::{exit, CliError};
use super::runtime;
use clap::{Args, ValueEnum};
use std::process::ExitCode;
use taskd_actors::control::proto::{self, switch_event::Event, RefusalKind};
use taskd_core::OperationSummary;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Side {
    Backup,
    Primary,
}

/// The flags of `taskd switch`: where the control API is, the job, and the targets as
/// repeated `--node NODE --dev DEV[,DEV...] --to backup|primary` groups.
#[derive(Args, Debug)]
pub struct SwitchArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// The job's id.
    #[arg(long)]
    job: String,
    /// A node to switch; give --dev and --to after each --node (repeatable).
    #[arg(long = "node", value_name = "NODE", required = true)]
    nodes: Vec<String>,
    /// Devices of the preceding --node, comma-separated physical ids as in the rank table (e.g.
    /// 0,8).
    #[arg(long = "dev", value_name = "DEV[,DEV...]", required = true)]
    devs: Vec<String>,
    /// Which NIC the preceding --node's devices use from now on.
    #[arg(long = "to", value_name = "backup|primary", required = true)]
    to: Vec<Side>,
    /// Client-chosen operation UUID: repeated with the same targets it returns the known
    /// result; with other targets it is refused (exit 2).
    #[arg(long)]
    uuid: Option<String>,
    /// Wait for the result, showing the phases; exit non-zero unless it succeeded.
    #[arg(long)]
    wait: bool,
    /// Print the events as JSON lines.
    #[arg(long)]
    json: bool,
    /// Move in flight: abort the collectives in flight and finish the step on the rebuilt
    /// groups, instead of pausing at the next step boundary. Use it when a link is down or
    /// starved and the step in flight is stuck on it (the boundary never comes before the
    /// group's timeout). Needs an in-flight side in every training process (taskd's Gloo
    /// switch); the operation fails, aborting nothing, on a job without one.
    #[arg(long)]
    abort_in_flight: bool,
}

/// The targets from the repeated `--node/--dev/--to` groups.
pub(crate) fn targets(
    nodes: &[String],
    devs: &[String],
    to: &[Side],
) -> Result<Vec<proto::Target>, String> {
    if nodes.len() != devs.len() || nodes.len() != to.len() {
        return Err(format!(
            "every --node needs one --dev and one --to (got {} --node, {} --dev, {} --to)",
            nodes.len(),
            devs.len(),
            to.len()
        ));
    }
    let mut out = Vec::new();
    for ((node, devs), to) in nodes.iter().zip(devs).zip(to) {
        for d in devs.split(',') {
            let device = d.trim().parse::<u32>().map_err(|_| {
                format!("--dev {devs:?} of node {node}: {d:?} is not a device number")
            })?;
            out.push(proto::Target {
                node: node.clone(),
                device,
                use_backup: *to == Side::Backup,
                rank: 0,
            });
        }
    }
    Ok(out)
}

/// Submits the switch and, with `--wait`, follows it to its one final result, printing each
/// phase as it happens. `Ok` carries how it ended: 0 succeeded (without `--wait`: accepted), 1
/// failed; a refusal, a wrong command line or an unreachable manager is a [`CliError`] (exit 1,
/// 2 or 3), so a script can tell a refusal from a failed switch.
pub fn run(a: SwitchArgs) -> Result<ExitCode, CliError> {
    let targets = targets(&a.nodes, &a.devs, &a.to).map_err(CliError::Usage)?;
    let code = runtime()?.block_on(switch(&a, targets))?;
    Ok(ExitCode::from(code))
}

async fn switch(a: &SwitchArgs, targets: Vec<proto::Target>) -> Result<u8, CliError> {
    let mut client = a.connect.client().await?;
    let req = proto::SwitchRequest {
        job_id: a.job.clone(),
        uuid: a.uuid.clone().unwrap_or_default(),
        targets,
        wait: a.wait,
        abort_in_flight: a.abort_in_flight,
    };
    let stream = client.switch(req).await.map_err(call_error)?;
    follow(a, stream).await
}

/// Shows the events of one switch as they come; the exit code of a switch that was not
/// refused.
async fn follow(
    a: &SwitchArgs,
    mut stream: tonic::Streaming<proto::SwitchEvent>,
) -> Result<u8, CliError> {
    let mut code = None;
    // Phases as they happen: a bar redrawn in place on a terminal, plain lines otherwise.
    let mut printer = crate::sim::progress::ProgressPrinter::stdout();
    while let Some(ev) = stream
        .message()
        .await
        .map_err(|s| CliError::Unreachable(format!("the stream broke: {}", explain(&s))))?
    {
        let Some(ev) = ev.event else { continue };
        if a.json {
            println!("{}", super::render::event_json(&ev));
        }
        match ev {
            Event::Accepted(acc) => {
                if !a.json {
                    let what = if acc.known {
                        "already ran: its result follows"
                    } else if acc.in_flight {
                        "is already in flight (nothing new started): its result follows"
                    } else {
                        "accepted"
                    };
                    println!("operation {} {what}", acc.uuid);
                }
                if !a.wait && !acc.known {
                    code = Some(exit::OK);
                }
            }
            Event::Refused(r) => return Err(refused(&r)),
            Event::Phase(p) => {
                if let Some(ev) = super::render::progress_event(&p).filter(|_| !a.json) {
                    let _ = printer.event(&ev);
                }
            }
            Event::Result(r) => {
                let r = OperationSummary::from(&r);
                if !a.json {
                    let _ = printer.finish();
                    print!("{}", super::render::result_text(&r));
                }
                code = Some(result_code(&r));
            }
        }
    }
    code.ok_or_else(|| {
        CliError::Failed("the control API ended the switch without its result".to_owned())
    })
}

/// The exit code of a switch's final result: a success whose result the journal could not
/// record is told apart from one it did.
fn result_code(r: &OperationSummary) -> u8 {
    match (r.result == "succeeded", r.journal_error.is_some()) {
        (true, false) => exit::OK,
        (true, true) => exit::NOT_RECORDED,
        (false, _) => exit::FAILED,
    }
}

/// Why the manager refused, as the CLI's error: bad input (exit 2) when the command line
/// itself is wrong (a `--uuid` already used for another request, or not a UUID), a refused
/// command (exit 1, the code's name and the reason) otherwise.
fn refused(r: &proto::Refused) -> CliError {
    match r.kind() {
        RefusalKind::IdReused => CliError::Usage(format!(
            "--uuid: {} (a retry must repeat the same --node/--dev/--to)",
            r.reason
        )),
        RefusalKind::Malformed => CliError::Usage(format!("--uuid: {}", r.reason)),
        _ => CliError::CommandRefused {
            code: r.code,
            reason: r.reason.clone(),
        },
    }
}
