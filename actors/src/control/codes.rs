//! Result codes of the control API: `Status.code` of ClusterD's `Recover` and `Refused.code` of
//! taskd's `Control`.
//!
//! | code | name | `Recover` (as ClusterD) | `Control` |
//! |---|---|---|---|
//! | 0 | OK | the operation started; the service is healthy | the operation started |
//! | 400 | JOB_NOT_REGISTERED | | not every expected worker has registered |
//! | 401 | OUT_OF_ORDER | | the job is `paused` or `needs_recovery` |
//! | 402 | JOB_NOT_EXIST | `HealthCheck` of another job | this manager runs another job |
//! | 411 | OPERATION_RUNNING | an operation is in flight, or the job is not `running` | another operation is in flight |
//! | 412 | SWITCH_UNSUPPORTED | | some ranks cannot switch (TSP:1, HCCL L2 retry or RDMA missing) |
//! | 413 | PARAMETER_INVALID | every refusal of the request itself (job, node, device, lists, workers missing, capabilities) | a node, device or list is wrong; a uuid reused with other targets |
//! | 499 | CLIENT_ERROR | | the request is malformed (a uuid that is not a UUID) |
//! | 504 | QUEUE_BUSY | reserved (ClusterD's "signal queue busy") | |
//! | 507 | REPORT_TIMEOUT | reserved (ClusterD's "waiting for a report timed out") | |
//! | 599 | SERVER_ERROR | the manager is not answering | the manager is not answering |
//!
//! Every number keeps ClusterD's meaning (its `common.RespCode`): `Recover` answers exactly as
//! ClusterD's `SwitchNicTrack` does — 411 (`OMIsRunning`) when it cannot start now, 413
//! (`OMParamInvalid`) for anything wrong with the request — while `Control` tells the cases
//! apart with ClusterD's finer codes (400, 401, 402) and one of taskd's own (412, unused by
//! ClusterD). ClusterD's 403 ("process recovery off") and 409 are not used.

use super::proto::RefusalKind;
use taskd_core::SubmitError;

/// The operation started, or the service is healthy.
pub const OK: i32 = 0;
/// Not every expected worker of the job has registered.
pub const JOB_NOT_REGISTERED: i32 = 400;
/// The job is paused or needs recovery after a failed operation.
pub const OUT_OF_ORDER: i32 = 401;
/// This manager does not run that job.
pub const JOB_NOT_EXIST: i32 = 402;
/// Another operation is in flight (ClusterD: "nic is swtiching, or job recovering").
pub const OPERATION_RUNNING: i32 = 411;
/// Some ranks cannot switch NICs (taskd's own code).
pub const SWITCH_UNSUPPORTED: i32 = 412;
/// Something in the request is wrong; the reason names it.
pub const PARAMETER_INVALID: i32 = 413;
/// The request itself is malformed.
pub const CLIENT_ERROR: i32 = 499;
/// Reserved: ClusterD's "signal queue busy".
pub const QUEUE_BUSY: i32 = 504;
/// Reserved: ClusterD's "waiting for a report timed out".
pub const REPORT_TIMEOUT: i32 = 507;
/// The manager is not answering.
pub const SERVER_ERROR: i32 = 599;

/// `Control`'s code for a refused command.
pub fn control_code(e: &SubmitError) -> i32 {
    match e {
        SubmitError::UnknownJob { .. } => JOB_NOT_EXIST,
        SubmitError::WorkersMissing { .. } | SubmitError::Unverified { .. } => JOB_NOT_REGISTERED,
        SubmitError::Busy { .. } | SubmitError::InCalls { .. } => OPERATION_RUNNING,
        SubmitError::Invalid(_)
        | SubmitError::IdReused { .. }
        | SubmitError::Interrupted { .. } => PARAMETER_INVALID,
        SubmitError::CapabilityMissing { .. } => SWITCH_UNSUPPORTED,
        SubmitError::NotRunning { .. }
        | SubmitError::NothingToRecover { .. }
        | SubmitError::TrainingStopped { .. } => OUT_OF_ORDER,
    }
}

/// `Recover`'s code for a refused command: ClusterD's two (411 cannot start now, 413 the
/// request is wrong).
pub fn recover_code(e: &SubmitError) -> i32 {
    match e {
        SubmitError::Busy { .. }
        | SubmitError::InCalls { .. }
        | SubmitError::NotRunning { .. }
        | SubmitError::TrainingStopped { .. }
        | SubmitError::Unverified { .. } => OPERATION_RUNNING,
        SubmitError::UnknownJob { .. }
        | SubmitError::NothingToRecover { .. }
        | SubmitError::WorkersMissing { .. }
        | SubmitError::Invalid(_)
        | SubmitError::CapabilityMissing { .. }
        | SubmitError::IdReused { .. }
        | SubmitError::Interrupted { .. } => PARAMETER_INVALID,
    }
}

/// What kind of refusal `e` is, for programs.
pub fn refusal_kind(e: &SubmitError) -> RefusalKind {
    match e {
        SubmitError::UnknownJob { .. } => RefusalKind::UnknownJob,
        SubmitError::WorkersMissing { .. } => RefusalKind::WorkersMissing,
        // Both clear by themselves: retry later.
        SubmitError::Busy { .. } | SubmitError::InCalls { .. } => RefusalKind::Busy,
        SubmitError::Invalid(_) => RefusalKind::Invalid,
        SubmitError::CapabilityMissing { .. } => RefusalKind::CapabilityMissing,
        // The job runs again by itself once the restarted processes are verified.
        SubmitError::NotRunning { .. } | SubmitError::TrainingStopped { .. } => {
            RefusalKind::NotRunning
        }
        // Neither uuid can be used again: a new one is the way forward.
        SubmitError::IdReused { .. } | SubmitError::Interrupted { .. } => RefusalKind::IdReused,
        SubmitError::Unverified { .. } => RefusalKind::Unverified,
        SubmitError::NothingToRecover { .. } => RefusalKind::NothingToRecover,
    }
}

/// A code's name, for people reading a CLI's output.
pub fn name(code: i32) -> &'static str {
    match code {
        OK => "OK",
        JOB_NOT_REGISTERED => "JOB_NOT_REGISTERED",
        OUT_OF_ORDER => "OUT_OF_ORDER",
        JOB_NOT_EXIST => "JOB_NOT_EXIST",
        OPERATION_RUNNING => "OPERATION_RUNNING",
        SWITCH_UNSUPPORTED => "SWITCH_UNSUPPORTED",
        PARAMETER_INVALID => "PARAMETER_INVALID",
        CLIENT_ERROR => "CLIENT_ERROR",
        QUEUE_BUSY => "QUEUE_BUSY",
        REPORT_TIMEOUT => "REPORT_TIMEOUT",
        SERVER_ERROR => "SERVER_ERROR",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::{JobId, JobState, OperationId, ValidationError};

    #[test]
    fn recover_answers_with_clusterds_two_codes_and_control_tells_them_apart() {
        let id = OperationId(uuid::Uuid::nil());
        let cases = [
            (
                SubmitError::UnknownJob {
                    job: JobId("a".into()),
                    known: JobId("b".into()),
                },
                PARAMETER_INVALID,
                JOB_NOT_EXIST,
            ),
            (
                SubmitError::WorkersMissing {
                    registered: 1,
                    expected: 2,
                    missing: "1".into(),
                },
                PARAMETER_INVALID,
                JOB_NOT_REGISTERED,
            ),
            (
                SubmitError::Busy { in_flight: id },
                OPERATION_RUNNING,
                OPERATION_RUNNING,
            ),
            (
                SubmitError::Invalid(ValidationError::NoTargets),
                PARAMETER_INVALID,
                PARAMETER_INVALID,
            ),
            (
                SubmitError::CapabilityMissing {
                    ranks: "2".into(),
                    missing: "TSP:1".into(),
                },
                PARAMETER_INVALID,
                SWITCH_UNSUPPORTED,
            ),
            (
                SubmitError::NotRunning {
                    state: JobState::Paused,
                },
                OPERATION_RUNNING,
                OUT_OF_ORDER,
            ),
            (
                SubmitError::IdReused { id },
                PARAMETER_INVALID,
                PARAMETER_INVALID,
            ),
        ];
        for (e, recover, control) in cases {
            assert_eq!(recover_code(&e), recover, "{e}");
            assert_eq!(control_code(&e), control, "{e}");
            assert_ne!(name(control), "UNKNOWN");
        }
        assert_eq!(
            refusal_kind(&SubmitError::IdReused { id }),
            RefusalKind::IdReused
        );
    }
}
