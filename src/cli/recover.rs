//! `taskd recover`: brings a job that is not running back (docs/recovery.md). The ranks in
//! doubt are re-stated to one side and training resumes, or, with nothing in doubt, a
//! verification round establishes the job's state; either way a round confirms the result.
//! `--stop-training` stops training instead: every process ends, its launcher restarts it on
//! its default NIC, and the job runs again once every rank is back and verified.

use super::connect::{call_error, ConnectArgs};
use super::error::{exit, CliError};
use super::runtime;
use clap::{Args, ValueEnum};
use std::process::ExitCode;
use taskd_actors::control::proto::{self, recover_reply::Outcome};
use taskd_core::OperationSummary;

/// The flags of `taskd recover`: where the control API is, the job, and which NIC side the
/// ranks in doubt are re-stated to.
#[derive(Args, Debug)]
pub struct RecoverArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// The job's id.
    #[arg(long)]
    job: String,
    /// The side the ranks in doubt are re-stated to: their primary NIC, their backup NIC, or
    /// the side the manager's NIC table has for each.
    #[arg(long, value_enum, default_value_t = To::AsIs, conflicts_with = "stop_training")]
    to: To,
    /// Stop training on every rank instead (no NIC is touched): each training process ends
    /// with an error, its launcher restarts it, and the new processes come back on their
    /// default NIC. Answers once the stop is sent; `taskd status` follows the restart.
    #[arg(long)]
    stop_training: bool,
    /// With --stop-training: why, one line, for every training process's log.
    #[arg(
        long,
        value_name = "TEXT",
        requires = "stop_training",
        default_value = ""
    )]
    reason: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// `--to`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum To {
    Primary,
    Backup,
    AsIs,
}

impl To {
    fn as_str(self) -> &'static str {
        match self {
            To::Primary => "primary",
            To::Backup => "backup",
            To::AsIs => "as-is",
        }
    }
}

/// Runs the recovery; exit 0 when it ran and the job runs afterwards (with --stop-training:
/// when the stop was sent), 1 when it was refused or the job does not run (the output says
/// why), 2 for bad input, 3 when the control API cannot be reached.
pub fn run(a: RecoverArgs) -> Result<ExitCode, CliError> {
    let reply = runtime()?.block_on(async {
        let mut client = a.connect.client().await?;
        if a.stop_training {
            client.stop_training(&a.job, &a.reason).await
        } else {
            client.recover(&a.job, a.to.as_str()).await
        }
        .map_err(call_error)
    })?;
    if a.json {
        println!("{:#}", reply_json(&reply));
    } else {
        print!("{}", reply_text(&reply, a.to));
    }
    let refused = matches!(reply.outcome, Some(Outcome::Refused(_)));
    let stopped = matches!(reply.outcome, Some(Outcome::Stopped(_)));
    Ok(ExitCode::from(
        if stopped || (reply.job_state == "running" && !refused) {
            exit::OK
        } else {
            exit::FAILED
        },
    ))
}

fn reply_text(r: &proto::RecoverReply, to: To) -> String {
    let what = match &r.outcome {
        Some(Outcome::Operation(op)) => format!(
            "re-stated the ranks in doubt to {}: {}\n",
            to.as_str(),
            OperationSummary::from(op)
        ),
        Some(Outcome::Verification(v)) => {
            format!("nothing in doubt; verification: {}\n", v.summary)
        }
        Some(Outcome::Refused(f)) => format!(
            "refused ({} {}): {}\n",
            f.code,
            taskd_actors::control::codes::name(f.code),
            f.reason
        ),
        Some(Outcome::Stopped(t)) => format!(
            "training stopped ({}): {}; {}\n",
            t.uuid, t.reason, t.waiting_for
        ),
        None => "no answer\n".to_owned(),
    };
    format!("{what}job {}\n", r.job_state)
}

fn reply_json(r: &proto::RecoverReply) -> serde_json::Value {
    let outcome = match &r.outcome {
        Some(Outcome::Operation(op)) => serde_json::json!({
            "operation": OperationSummary::from(op),
        }),
        Some(Outcome::Verification(v)) => serde_json::json!({
            "verification": {
                "uuid": v.uuid,
                "summary": v.summary,
                "disagreements": v.disagreements.iter().map(|d| serde_json::json!({
                    "group": d.group, "ranks": d.ranks, "detail": d.detail,
                })).collect::<Vec<_>>(),
                "released": v.released,
                "missing": v.missing,
                "held": v.held,
            }
        }),
        Some(Outcome::Refused(f)) => serde_json::json!({
            "refused": { "code": f.code, "reason": f.reason },
        }),
        Some(Outcome::Stopped(t)) => serde_json::json!({
            "stopped": super::render::training_stop_json(t),
        }),
        None => serde_json::json!({}),
    };
    let mut v = outcome;
    v["job_state"] = serde_json::Value::from(r.job_state.clone());
    v
}
