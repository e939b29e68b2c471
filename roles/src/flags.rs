//! The limits of the `taskd` flags (the "Maximum sizes" table of docs/operating.md; the
//! embedded roles' keys are the same flags) and the value parsers that enforce them: a value
//! outside its range is refused by the flag parser, before anything runs, with a message naming
//! the flag, the value and the range (exit code 2 from the binary).

use clap::builder::RangedU64ValueParser;

/// The longest phase deadline (and simulated hang): one day. Longer is a typo, and an
/// unbounded one would overflow the clock arithmetic of the deadlines.
pub const MAX_DEADLINE_MS: u64 = 86_400_000;

/// The longest simulated training step: one minute.
pub const MAX_STEP_MS: u64 = 60_000;

/// The longest heartbeat interval: one minute (a peer is lost after `--missed-heartbeats` of
/// them).
pub const MAX_HEARTBEAT_MS: u64 = 60_000;

/// The most heartbeat intervals a peer may miss before it is lost.
pub const MAX_MISSED_HEARTBEATS: u64 = 1_000;

/// The shortest time without a heartbeat before a peer is lost (`--heartbeat-ms` times
/// `--missed-heartbeats`): a quarter of a second. A loaded machine stalls a process for tens
/// of milliseconds (scheduling, a journal's fsync, a page fault storm); a shorter limit
/// declares live peers lost, over and over, and every switch fails or is refused.
pub const MIN_LOSS_MS: u64 = 250;

/// The most unacknowledged messages queued per peer.
pub const MAX_QUEUE_CAPACITY: u64 = 65_536;

/// The smallest `--max-message-bytes`: 64 KiB. A registration, a heartbeat and the directives
/// of a switch of a few thousand targets (20 to 30 bytes a target) fit; a smaller limit would
/// refuse ordinary protocol messages.
pub const MIN_MESSAGE_BYTES: u64 = 64 << 10;

/// The largest `--max-message-bytes`: 64 MiB (a switch of every rank of the largest job is
/// under 2 MiB).
pub const MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// The longest link probe interval (`--link-probe-ms`): one minute. Longer would leave a
/// failed link unnoticed for minutes.
pub const MAX_PROBE_MS: u64 = 60_000;

/// The most probes or link changes a count of the automatic failover policy takes
/// (`--down-after`, `--max-flaps`).
pub const MAX_PROBES: u64 = 1_000;

/// The longest `taskd sim --hold-secs`: one day.
pub const MAX_HOLD_SECS: u64 = 86_400;

/// A phase deadline in milliseconds: 1 ..= [`MAX_DEADLINE_MS`].
pub fn deadline_ms() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(1..=MAX_DEADLINE_MS)
}

/// A simulated hang in milliseconds: a [`span_ms`].
pub fn hang_ms() -> RangedU64ValueParser<u64> {
    span_ms()
}

/// A time span that may be zero, in milliseconds (a hang, the automatic failover's
/// `--coalesce-ms`, `--switchback-after-ms`, `--min-interval-ms`): 0 ..= [`MAX_DEADLINE_MS`].
pub fn span_ms() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(0..=MAX_DEADLINE_MS)
}

/// A simulated step in milliseconds: 0 ..= [`MAX_STEP_MS`].
pub fn step_ms() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(0..=MAX_STEP_MS)
}

/// `--heartbeat-ms`: 1 ..= [`MAX_HEARTBEAT_MS`].
pub fn heartbeat_ms() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(1..=MAX_HEARTBEAT_MS)
}

/// `--missed-heartbeats`: 1 ..= [`MAX_MISSED_HEARTBEATS`].
pub fn missed_heartbeats() -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::new().range(1..=MAX_MISSED_HEARTBEATS)
}

/// `--queue-capacity`: 1 ..= [`MAX_QUEUE_CAPACITY`].
pub fn queue_capacity() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=MAX_QUEUE_CAPACITY)
}

/// `--max-message-bytes`: [`MIN_MESSAGE_BYTES`] ..= [`MAX_MESSAGE_BYTES`].
pub fn message_bytes() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(MIN_MESSAGE_BYTES..=MAX_MESSAGE_BYTES)
}

/// A count of at least 1 and at most `max` (nodes, devices per node).
pub fn count(max: usize) -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::new().range(1..=max as u64)
}

/// `--link-probe-ms`: 1 ..= [`MAX_PROBE_MS`].
pub fn probe_ms() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(1..=MAX_PROBE_MS)
}

/// `--down-after`, `--max-flaps`: 1 ..= [`MAX_PROBES`].
pub fn probes() -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::new().range(1..=MAX_PROBES)
}

/// `--hold-secs`: 0 ..= [`MAX_HOLD_SECS`].
pub fn hold_secs() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(0..=MAX_HOLD_SECS)
}

/// A name that must not be empty (a job id, a node name).
pub fn non_empty(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(t.to_owned())
}

/// A `HOST:PORT` to connect to (see [`taskd_core::env::check_host_port`]).
pub fn host_port(s: &str) -> Result<String, String> {
    taskd_core::env::check_host_port(s)
        .map(|()| s.to_owned())
        .map_err(|e| format!("not HOST:PORT ({})", e.why))
}

/// A positive, finite rate (requests per second).
pub fn rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err("expected a positive number".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(non_empty(" job-1 "), Ok("job-1".into()));
        assert!(non_empty(" ").is_err());
        assert_eq!(host_port("[fd00::1]:9601"), Ok("[fd00::1]:9601".into()));
        assert_eq!(
            host_port("notanaddress"),
            Err("not HOST:PORT (no port)".into())
        );
        assert_eq!(rate("2.5"), Ok(2.5));
        for bad in ["0", "-1", "NaN", "inf", "x"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
    }
}
