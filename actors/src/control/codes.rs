//! Result codes of the control API (`Status.code` of `Recover`, `Refused.code` of `Control`).
//!
//! | code | name | meaning |
//! |---|---|---|
//! | 0 | OK | the operation started (or the service is healthy) |
//! | 400 | JOB_NOT_REGISTERED | not every expected worker of the job has registered |
//! | 401 | OUT_OF_ORDER | the job is paused or needs recovery after a failed operation |
//! | 402 | JOB_NOT_EXIST | this manager does not run that job |
//! | 403 | PARAMETER_INVALID | a node, device or op list is wrong; `info` names it |
//! | 409 | OPERATION_RUNNING | another operation is in flight; `info` carries its uuid |
//! | 412 | SWITCH_UNSUPPORTED | some ranks cannot switch (TSP:1, HCCL L2 retry or RDMA missing) |
//! | 499 | CLIENT_ERROR | the request itself is malformed (e.g. empty job id, bad uuid) |
//! | 504 | QUEUE_BUSY | this client sent too many requests; retry later |
//! | 507 | REPORT_TIMEOUT | waiting for the operation's report timed out |
//! | 599 | SERVER_ERROR | the manager is not answering |
//!
//! 0, 400, 401, 402, 499, 504, 507 and 599 keep ClusterD's meaning; 403, 409 and 412 are the
//! "parameter invalid", "operation already running" and capability codes taskd defines.

use taskd_core::SubmitError;

pub const OK: i32 = 0;
pub const JOB_NOT_REGISTERED: i32 = 400;
pub const OUT_OF_ORDER: i32 = 401;
pub const JOB_NOT_EXIST: i32 = 402;
pub const PARAMETER_INVALID: i32 = 403;
pub const OPERATION_RUNNING: i32 = 409;
pub const SWITCH_UNSUPPORTED: i32 = 412;
pub const CLIENT_ERROR: i32 = 499;
pub const QUEUE_BUSY: i32 = 504;
pub const REPORT_TIMEOUT: i32 = 507;
pub const SERVER_ERROR: i32 = 599;

/// The code for a refused command.
pub fn for_submit_error(e: &SubmitError) -> i32 {
    match e {
        SubmitError::UnknownJob { .. } => JOB_NOT_EXIST,
        SubmitError::WorkersMissing { .. } | SubmitError::Unverified { .. } => JOB_NOT_REGISTERED,
        SubmitError::Busy { .. } => OPERATION_RUNNING,
        SubmitError::Invalid(_) => PARAMETER_INVALID,
        SubmitError::CapabilityMissing { .. } => SWITCH_UNSUPPORTED,
        SubmitError::NotRunning { .. } | SubmitError::NothingToRecover { .. } => OUT_OF_ORDER,
    }
}

/// A code's name, for people reading a CLI's output.
pub fn name(code: i32) -> &'static str {
    match code {
        OK => "OK",
        JOB_NOT_REGISTERED => "JOB_NOT_REGISTERED",
        OUT_OF_ORDER => "OUT_OF_ORDER",
        JOB_NOT_EXIST => "JOB_NOT_EXIST",
        PARAMETER_INVALID => "PARAMETER_INVALID",
        OPERATION_RUNNING => "OPERATION_RUNNING",
        SWITCH_UNSUPPORTED => "SWITCH_UNSUPPORTED",
        CLIENT_ERROR => "CLIENT_ERROR",
        QUEUE_BUSY => "QUEUE_BUSY",
        REPORT_TIMEOUT => "REPORT_TIMEOUT",
        SERVER_ERROR => "SERVER_ERROR",
        _ => "UNKNOWN",
    }
}
