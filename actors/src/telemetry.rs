//! Metric names (DESIGN section 8: dashboards depend on them; add, never rename) and the small
//! helpers that record them through the `metrics` facade. Without an installed recorder the
//! calls cost next to nothing.

use std::time::Duration;

pub const OPERATIONS_TOTAL: &str = "taskd_switch_operations_total";
pub const PHASE_DURATION: &str = "taskd_switch_phase_duration_seconds";
pub const TRAINING_STALL: &str = "taskd_training_stall_seconds";
pub const WORKERS_REGISTERED: &str = "taskd_workers_registered";
pub const WORKERS_EXPECTED: &str = "taskd_workers_expected";
pub const OPERATION_IN_FLIGHT: &str = "taskd_operation_in_flight";
pub const RANKS_ON_BACKUP: &str = "taskd_ranks_on_backup_nic";
pub const HAL_CALLS_TOTAL: &str = "taskd_hal_calls_total";
pub const HAL_CALL_DURATION: &str = "taskd_hal_call_duration_seconds";
pub const MESSAGES_TOTAL: &str = "taskd_messages_total";

/// Every metric name this crate exports.
pub const ALL: [&str; 10] = [
    OPERATIONS_TOTAL,
    PHASE_DURATION,
    TRAINING_STALL,
    WORKERS_REGISTERED,
    WORKERS_EXPECTED,
    OPERATION_IN_FLIGHT,
    RANKS_ON_BACKUP,
    HAL_CALLS_TOTAL,
    HAL_CALL_DURATION,
    MESSAGES_TOTAL,
];

pub(crate) fn hal_call(op: &'static str, ok: bool, took: Duration) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(HAL_CALLS_TOTAL, "op" => op, "result" => result).increment(1);
    metrics::histogram!(HAL_CALL_DURATION, "op" => op).record(took.as_secs_f64());
}

/// `direction` is `in` or `out`; `kind` the message's kind (`sample`, `reply`, ...).
pub(crate) fn message(direction: &'static str, kind: &'static str) {
    metrics::counter!(MESSAGES_TOTAL, "direction" => direction, "kind" => kind).increment(1);
}
