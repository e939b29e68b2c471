//! ClusterD's operator API (`Recover`, `proto/clusterd.proto`), answering exactly as ClusterD's
//! own service does, so a platform written against ClusterD reads taskd's answers right:
//!
//! - `SwitchNicTrack`: code 0 and [`SWITCH_STARTED`]; 411 when an operation is in flight or
//!   the job is not `running` (info [`busy_info`], then `": "` and taskd's reason); 413 for
//!   anything wrong with the request, the info naming it ([`codes::recover_code`]).
//! - `SubscribeSwitchNicSignal`: exactly one `SwitchNicResponse`, whose `msg` is exactly
//!   [`SWITCH_FINISHED`] on success, or one of ClusterD's failure strings followed by `": "` and
//!   the operation's summary ([`result_message`]). Nothing in flight: gRPC `UNKNOWN`
//!   ([`not_switching`]), except that the job's last result is still delivered while no other
//!   operation has started and it is at most [`super::RESULT_RETENTION`] old.
//!
//! Per-phase durations, per-rank errors and JSON belong to taskd's own `Control` service.

use super::codes;
use super::retention::LastResult;
use crate::clusterd::proto::{self, SwitchNicResponse};
use crate::manager::{AwaitResult, GetStatus, Manager, Submission, Submit};
use actix::Addr;
use std::collections::BTreeMap;
use std::pin::Pin;
use taskd_core::operation::{OperationError, OperationReport, Outcome};
use taskd_core::protocol::Phase;
use taskd_core::{JobId, OperationId, OperationSummary, SubmitError, SwitchCommand};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// `SwitchNicTrack`'s info when the operation started.
pub const SWITCH_STARTED: &str = "switching operation was successfully distributed";
/// The subscription's message for a successful operation.
pub const SWITCH_FINISHED: &str = "switch nic finish";
/// A rank failed or was lost before every rank held.
pub const PAUSE_FAILED: &str = "om failed, pause train failed";
/// The pause passed its deadline.
pub const PAUSE_TIMEOUT: &str = "pause train timeout";
/// Applying (or rolling back) the NIC change failed, or a target's link is down.
pub const SWITCH_FAILED: &str = "switch nic failed, switch nic failed";
/// Applying (or rolling back) the NIC change passed its deadline.
pub const SWITCH_TIMEOUT: &str = "switch nic failed, report switch nic timeout";
/// Resuming training failed.
pub const CONTINUE_FAILED: &str = "switch nic failed, continue train failed";
/// Resuming training passed its deadline.
pub const CONTINUE_TIMEOUT: &str = "switch nic failed, continue train timeout";
/// The manager stopped before the operation finished.
pub const SERVICE_NOT_READY: &str = "switch nic failed, job service not ready";

/// `SwitchNicTrack`'s info (code 411) when the job cannot start an operation now.
pub fn busy_info(job: &str) -> String {
    format!("jobId={job} nic is swtiching, or job recovering")
}

/// The `UNKNOWN` status of a subscription with nothing to deliver.
pub fn not_switching(job: &str) -> String {
    format!("jobId={job} is not swtiching nic")
}

/// The `UNKNOWN` status of a subscription for a job this manager does not run.
pub fn not_registered(job: &str) -> String {
    format!("jobId={job} not registed")
}

/// ClusterD's failure string for a failed or rejected operation: by the phase it failed in.
fn failure_string(r: &OperationReport) -> &'static str {
    let by_phase = |phase: Phase, timeout: bool| match (phase, timeout) {
        (Phase::Sample | Phase::Pause | Phase::Abort, false) => PAUSE_FAILED,
        (Phase::Sample | Phase::Pause | Phase::Abort, true) => PAUSE_TIMEOUT,
        (Phase::Switch | Phase::Rollback, false) => SWITCH_FAILED,
        (Phase::Switch | Phase::Rollback, true) => SWITCH_TIMEOUT,
        (Phase::Resume | Phase::Verify | Phase::Stop, false) => CONTINUE_FAILED,
        (Phase::Resume | Phase::Verify | Phase::Stop, true) => CONTINUE_TIMEOUT,
    };
    match &r.error {
        Some(OperationError::Timeout { phase, .. }) => by_phase(*phase, true),
        Some(OperationError::RankFailed { phase, .. })
        | Some(OperationError::WorkerLost { phase, .. })
        | Some(OperationError::GroupDisagrees { phase, .. })
        | Some(OperationError::Aborted { phase, .. }) => by_phase(*phase, false),
        // An in-flight move's training could not be stopped inside the step: its pause.
        Some(OperationError::WrongPauseStep { .. } | OperationError::NoInFlightSide { .. }) => {
            PAUSE_FAILED
        }
        // Operations ClusterD drives (the manager as its client) end these ways.
        Some(OperationError::HoldExpired { .. }) => PAUSE_TIMEOUT,
        Some(OperationError::Stopped { phase, .. }) => by_phase(*phase, false),
        Some(OperationError::LinkDown { .. } | OperationError::LinkUnknown { .. }) | None => {
            SWITCH_FAILED
        }
    }
}

/// The one message a subscription gets for `r`: exactly [`SWITCH_FINISHED`] on success, else
/// ClusterD's failure string, `": "` and the operation's summary.
pub fn result_message(r: &OperationReport) -> String {
    if r.outcome == Outcome::Succeeded {
        SWITCH_FINISHED.to_owned()
    } else {
        format!("{}: {}", failure_string(r), OperationSummary::from(r))
    }
}

fn status(code: i32, info: impl Into<String>) -> Response<proto::Status> {
    Response::new(proto::Status {
        code,
        info: info.into(),
    })
}

/// The `info` of a refused `SwitchNicTrack`.
fn refusal_info(job: &str, e: &SubmitError) -> String {
    match codes::recover_code(e) {
        codes::OPERATION_RUNNING => format!("{}: {e}", busy_info(job)),
        _ => e.to_string(),
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The `Recover` service in front of a manager.
pub(crate) struct RecoverSvc {
    manager: Addr<Manager>,
    job: JobId,
    last: LastResult,
}

impl RecoverSvc {
    pub(crate) fn new(manager: Addr<Manager>, job: JobId, last: LastResult) -> RecoverSvc {
        RecoverSvc { manager, job, last }
    }

    /// The operation a subscription arriving now waits for: the one in flight, else the last
    /// one while it is retained.
    async fn to_deliver(&self, job: &str) -> Result<OperationId, Status> {
        let s = self
            .manager
            .send(GetStatus { recent: 1 })
            .await
            .map_err(|_| Status::unknown(SERVICE_NOT_READY))?;
        if let Some((id, _)) = s.in_flight {
            return Ok(id);
        }
        match (self.last.deliverable(), s.recent.last()) {
            (Some(id), Some(r)) if r.id == id => Ok(id),
            _ => Err(Status::unknown(not_switching(job))),
        }
    }
}

#[tonic::async_trait]
impl proto::recover_server::Recover for RecoverSvc {
    async fn switch_nic_track(
        &self,
        req: Request<proto::SwitchNics>,
    ) -> Result<Response<proto::Status>, Status> {
        let m = req.into_inner();
        if m.job_id.is_empty() {
            return Ok(status(codes::PARAMETER_INVALID, "jobID is empty"));
        }
        let ops: BTreeMap<String, (Vec<String>, Vec<bool>)> = m
            .nic_ops
            .into_iter()
            .map(|(node, l)| (node, (l.dev, l.op)))
            .collect();
        let cmd = match SwitchCommand::from_nic_ops(JobId(m.job_id.clone()), None, &ops) {
            Ok(c) => c,
            Err(e) => return Ok(status(codes::PARAMETER_INVALID, e.to_string())),
        };
        let Ok(res) = self.manager.send(Submit(cmd)).await else {
            return Ok(status(codes::SERVER_ERROR, "the manager is not answering"));
        };
        Ok(match res {
            Ok(Submission::Started(id)) => {
                tracing::info!(uuid = %id, job = %m.job_id, "SwitchNicTrack: operation started");
                status(codes::OK, SWITCH_STARTED)
            }
            // Without a uuid in the request, a submission is always new.
            Ok(Submission::InFlight(_)) | Ok(Submission::Known(_)) => {
                status(codes::OK, SWITCH_STARTED)
            }
            Err(e) => status(codes::recover_code(&e), refusal_info(&m.job_id, &e)),
        })
    }

    async fn subscribe_switch_nic_signal(
        &self,
        req: Request<proto::SwitchNicRequest>,
    ) -> Result<Response<Boxed<SwitchNicResponse>>, Status> {
        let job = req.into_inner().job_id;
        if job != self.job.0 {
            return Err(Status::unknown(not_registered(&job)));
        }
        let id = self.to_deliver(&job).await?;
        let (tx, rx) = mpsc::channel(1);
        let manager = self.manager.clone();
        tokio::spawn(async move {
            let msg = match manager.send(AwaitResult(id)).await {
                Ok(Some(r)) => result_message(&r),
                _ => SERVICE_NOT_READY.to_owned(),
            };
            let _ = tx.send(Ok(SwitchNicResponse { job_id: job, msg })).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn health_check(
        &self,
        req: Request<proto::ClientInfo>,
    ) -> Result<Response<proto::Status>, Status> {
        let info = req.into_inner();
        if !info.job_id.is_empty() && info.job_id != self.job.0 {
            return Ok(status(
                codes::JOB_NOT_EXIST,
                format!("job {:?} is not managed here", info.job_id),
            ));
        }
        let Ok(s) = self.manager.send(GetStatus { recent: 0 }).await else {
            return Ok(status(codes::SERVER_ERROR, "the manager is not answering"));
        };
        let info = serde_json::json!({
            "job": s.job.0,
            "state": s.state.as_str(),
            "workers_registered": s.workers_registered,
            "workers_expected": s.workers_expected,
            "operation_in_flight": s.in_flight.map(|(id, _)| id.to_string()),
        });
        Ok(status(codes::OK, info.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use taskd_core::command::Direction;
    use taskd_core::GlobalRank;

    fn failed(error: Option<OperationError>) -> OperationReport {
        OperationReport {
            error,
            rolled_back: true,
            ..OperationReport::new(
                OperationId(uuid::Uuid::from_u128(7)),
                Direction::ToBackup,
                Vec::new(),
                Outcome::Failed,
            )
        }
    }

    #[test]
    fn each_failure_gets_clusterds_string_for_its_phase_then_taskds_detail() {
        let timeout = |phase| OperationError::Timeout {
            phase,
            deadline: Duration::from_secs(1),
            missing: "3".into(),
        };
        let lost = |phase| OperationError::WorkerLost {
            rank: GlobalRank(3),
            phase,
            reason: "connection closed".into(),
        };
        let cases = [
            (timeout(Phase::Sample), PAUSE_TIMEOUT),
            (timeout(Phase::Pause), PAUSE_TIMEOUT),
            (timeout(Phase::Switch), SWITCH_TIMEOUT),
            (timeout(Phase::Rollback), SWITCH_TIMEOUT),
            (timeout(Phase::Resume), CONTINUE_TIMEOUT),
            (lost(Phase::Pause), PAUSE_FAILED),
            (lost(Phase::Switch), SWITCH_FAILED),
            (lost(Phase::Resume), CONTINUE_FAILED),
            (
                OperationError::GroupDisagrees {
                    group: "tp_0".into(),
                    phase: Phase::Switch,
                    detail: "3 of 4 members".into(),
                },
                SWITCH_FAILED,
            ),
            (
                OperationError::WrongPauseStep {
                    rank: GlobalRank(1),
                    got: 3,
                    expected: 4,
                },
                PAUSE_FAILED,
            ),
        ];
        for (e, want) in cases {
            let text = e.to_string();
            let msg = result_message(&failed(Some(e)));
            let detail = msg
                .strip_prefix(want)
                .and_then(|m| m.strip_prefix(": "))
                .unwrap_or_else(|| panic!("{msg:?} does not start with {want:?}: "));
            assert!(detail.contains(&text), "{detail}");
            assert!(detail.contains("rolled back: yes"), "{detail}");
        }
        let mut ok = failed(None);
        ok.outcome = Outcome::Succeeded;
        assert_eq!(result_message(&ok), "switch nic finish");
    }

    #[test]
    fn the_refusals_read_as_clusterds() {
        let busy = SubmitError::Busy {
            in_flight: OperationId(uuid::Uuid::from_u128(9)),
        };
        let info = refusal_info("job-a", &busy);
        assert!(
            info.starts_with("jobId=job-a nic is swtiching, or job recovering: "),
            "{info}"
        );
        assert_eq!(not_switching("J"), "jobId=J is not swtiching nic");
    }
}
