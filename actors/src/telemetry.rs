//! Metrics: the names (docs/observability.md, "Prometheus metrics": dashboards depend on them;
//! add, never rename), the helpers that record them through the `metrics` facade, the
//! Prometheus recorder and the `/metrics` HTTP endpoint every role serves.
//!
//! Recording is always on and costs next to nothing until a recorder is installed: the library
//! never installs one by itself. A binary opts in with [`serve_metrics`] (its `--metrics-addr`
//! flag), or with [`install_recorder`] when it serves the text itself.
//!
//! **Cardinality.** No metric has a label that takes a rank, node, group, job or operation id:
//! every label has a small fixed set of values (`result`, `direction`, `phase`, `op`, `code`,
//! `kind`, `state`, `type`, `report`, `action`, `reason`), so one process exports well under 200
//! series whatever the size of the job.
//! Which job and which process a series comes from is the scrape target's business (Prometheus
//! adds `job` and `instance`). Per-rank detail belongs in logs (spans carry the rank), not in
//! series: a job can have tens of thousands of ranks.

use crate::background::Background;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use taskd_core::HalError;

/// Counter `{result, direction}`: operations by final result (`succeeded`, `failed`,
/// `rejected`) and direction (`to_backup`, `to_primary`, `mixed`; `none` for a command refused
/// before it could be resolved).
pub const OPERATIONS_TOTAL: &str = "taskd_switch_operations_total";
/// Histogram `{phase}`: `pause` (sample and pause together), `switch`, `resume`, `rollback`,
/// `total`.
pub const PHASE_DURATION: &str = "taskd_switch_phase_duration_seconds";
/// Histogram: the longest time any rank's training was held at its step gate, per operation.
pub const TRAINING_STALL: &str = "taskd_training_stall_seconds";
/// Gauge: workers the manager has registered.
pub const WORKERS_REGISTERED: &str = "taskd_workers_registered";
/// Gauge: workers the job's rank table expects.
pub const WORKERS_EXPECTED: &str = "taskd_workers_expected";
/// Gauge: 1 while an operation runs.
pub const OPERATION_IN_FLIGHT: &str = "taskd_operation_in_flight";
/// Gauge: ranks whose traffic is on the backup NIC, per the manager's NIC table.
pub const RANKS_ON_BACKUP: &str = "taskd_ranks_on_backup_nic";
/// Counter `{op, result}`: device HAL calls (`groups`, `set_working_nic`, `link_health`) by
/// result (`ok`, `error`).
pub const HAL_CALLS_TOTAL: &str = "taskd_hal_calls_total";
/// Histogram `{op}`: device HAL call latency.
pub const HAL_CALL_DURATION: &str = "taskd_hal_call_duration_seconds";
/// Counter `{direction, kind}`: control messages by direction (`in`, `out`) and kind (the
/// phase of a directive, `reply`, `node_reply`, `hello`, `worker_up`, `worker_lost`).
pub const MESSAGES_TOTAL: &str = "taskd_messages_total";
/// Counter `{op, kind, code}`: failed HAL calls by the error's vendor-neutral kind
/// (`network`, `timeout`, ...: `taskd_core::HalErrorKind::as_str`) and the vendor's name of its
/// code (`HCCL_E_NETWORK`, `DCMI_ERR_CODE_TIME_OUT`, ...). `code` is the name a code table
/// compiled into this process gave (`taskd_core::VendorCode::metric_name`), `OTHER` for a code
/// it has no name for or an error without a code, so both labels have fixed sets of values.
/// Added to section 8.
pub const HAL_ERRORS_TOTAL: &str = "taskd_hal_errors_total";
/// Gauge `{state}`: 1 for the job's current state (`running`, `paused`, `needs_recovery`,
/// `degraded`), 0 for the others. `paused` after a failed rollback is the "operator action required" alarm.
pub const JOB_STATE: &str = "taskd_job_state";
/// Gauge: ranks the phase in flight still waits for (0 when idle): a stuck phase shows here.
pub const OPERATION_PENDING_RANKS: &str = "taskd_operation_pending_ranks";
/// Gauge `{version}`: always 1; the version of the process.
pub const BUILD_INFO: &str = "taskd_build_info";
/// Gauge: ranks of this process whose training is held at the step gate now. Held ranks with
/// no operation in flight (`taskd_operation_in_flight` 0) mean a manager went away: they stay
/// held, which is safe, until the next manager's verification round releases them.
pub const RANKS_HELD: &str = "taskd_ranks_held";
/// Counter: training stopped for good on a rank of this process (the manager's stop), or, on
/// the manager, stops it sent, by who decided (`by`: operator, policy, clusterd).
pub const TRAINING_STOPS: &str = "taskd_training_stops_total";
/// Gauge: 1 while the manager's ClusterD client has a session (Init and Register answered,
/// the signal stream's first message in, the switch subscription sent), 0 while it
/// reconnects. Only a manager that is a ClusterD client
/// exports it.
pub const CLUSTERD_CONNECTED: &str = "taskd_clusterd_connected";
/// Counter `{type}`: what ClusterD sent: `keep_alive`, `pause_train`, `stop_train`,
/// `kill_master`, `continue`, `other` (a `ProcessManageSignal`), `switch` (a `SwitchRankList`).
pub const CLUSTERD_SIGNALS_TOTAL: &str = "taskd_clusterd_signals_total";
/// Counter `{report, result}`: reports to ClusterD (`stop_complete`, `switch_result`,
/// `recover_status`) by what they said (`ok`, `failed`), or `error` when ClusterD could not be
/// told (retried while the session lasts), or `dropped` when the session that asked ended.
pub const CLUSTERD_REPORTS_TOTAL: &str = "taskd_clusterd_reports_total";

/// Counter `{action, reason}`: the automatic failover policy's decisions: `action` =
/// `to_backup`, `to_primary` (the device moved in an automatic operation) or `hold` (it was held
/// back); `reason` = why (`taskd_core::auto::AutoReason::as_str`: `primary_down`,
/// `backup_down`, `primary_degraded`, `backup_degraded`, `primary_recovered`, `flapping`, `operation_running`, `job_not_running`,
/// `unverified`, `min_interval`, `failed_before`, `partner_conflict`, `refused`). Both sets are
/// fixed.
pub const AUTO_DECISIONS_TOTAL: &str = "taskd_auto_decisions_total";

/// Gauge: 1 while the manager's journal (`--state-dir`) cannot be written (no operation is
/// admitted then, and a result finished meanwhile is not durable), 0 while it can. Only a
/// manager with a journal exports it.
pub const JOURNAL_FAILING: &str = "taskd_journal_failing";
/// Counter: writes of the manager's journal that failed.
pub const JOURNAL_WRITE_FAILURES_TOTAL: &str = "taskd_journal_write_failures_total";
/// Gauge, by `port` (`transport`, `control`): connections a server holds open now.
pub const CONNECTIONS_OPEN: &str = "taskd_connections_open";
/// Counter, by `port` and `why`: connections a server refused or closed for its limits
/// (`per_client`, `total`: refused at accept; `evicted`: a pending one closed for a newer one;
/// `deadline`: no handshake and first request in time).
pub const CONNECTIONS_CLOSED_TOTAL: &str = "taskd_connections_closed_total";
/// Counter, by `port`: accepts the system refused for want of descriptors or memory (each
/// followed by a backoff).
pub const ACCEPT_ERRORS_TOTAL: &str = "taskd_accept_errors_total";

/// Counter: restarts of the whole job the manager began (process recovery: a lost process,
/// or a stop of training, restarts every node's workers together).
pub const JOB_RESTARTS: &str = "taskd_job_restarts_total";
/// Counter: stops of training that passed their bound with ranks not back.
pub const TRAINING_STOPS_OVERDUE: &str = "taskd_training_stops_overdue_total";
/// Gauge: ranks the manager cannot reach now (their node's proxy lost its connection); with no
/// operation in flight the job is `degraded`, not held.
pub const RANKS_UNREACHABLE: &str = "taskd_ranks_unreachable";
/// Histogram: how long a rank's framework took to end its collectives in flight and say where
/// its groups stand (the abort of an in-flight move).
pub const IN_FLIGHT_ABORT_SECONDS: &str = "taskd_in_flight_abort_seconds";
/// Gauge: ranks whose worker's hang watch says their training loop finished no step for its
/// timeout (a hung collective, with HCCL's watchdog off under `TSP:1`).
pub const RANKS_HUNG: &str = "taskd_ranks_hung";

/// Every metric name this crate exports.
pub const ALL: &[&str] = &[
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
    HAL_ERRORS_TOTAL,
    JOB_STATE,
    OPERATION_PENDING_RANKS,
    BUILD_INFO,
    RANKS_HELD,
    TRAINING_STOPS,
    CLUSTERD_CONNECTED,
    CLUSTERD_SIGNALS_TOTAL,
    CLUSTERD_REPORTS_TOTAL,
    AUTO_DECISIONS_TOTAL,
    JOURNAL_FAILING,
    JOURNAL_WRITE_FAILURES_TOTAL,
    JOB_RESTARTS,
    TRAINING_STOPS_OVERDUE,
    RANKS_UNREACHABLE,
    IN_FLIGHT_ABORT_SECONDS,
    RANKS_HUNG,
    CONNECTIONS_OPEN,
    CONNECTIONS_CLOSED_TOTAL,
    ACCEPT_ERRORS_TOTAL,
];

/// Buckets (seconds) of the phase and stall histograms: a millisecond (a simulated step) up
/// to ten minutes (past the default five-minute phase deadlines, so a timeout still lands in
/// a finite bucket).
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Buckets (seconds) of the HAL call histogram: 100 µs (a no-op or a query) to five minutes
/// (a NIC-set that renegotiates links, or hangs until the switch deadline).
pub const HAL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub(crate) fn hal_call(op: &'static str, ok: bool, took: Duration) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(HAL_CALLS_TOTAL, "op" => op, "result" => result).increment(1);
    metrics::histogram!(HAL_CALL_DURATION, "op" => op).record(took.as_secs_f64());
}

/// One decision of the automatic failover policy.
pub(crate) fn auto_decision(d: &taskd_core::auto::AutoDecision) {
    metrics::counter!(
        AUTO_DECISIONS_TOTAL,
        "action" => d.action.as_str(),
        "reason" => d.reason.as_str()
    )
    .increment(1);
}

/// A failed HAL call's kind and code; call it besides [`hal_call`].
pub(crate) fn hal_error(op: &'static str, e: &HalError) {
    metrics::counter!(
        HAL_ERRORS_TOTAL,
        "op" => op,
        "kind" => e.kind.as_str(),
        "code" => e.vendor.metric_name()
    )
    .increment(1);
}

/// `direction` is `in` or `out`; `kind` the message's kind (`sample`, `reply`, ...).
pub(crate) fn message(direction: &'static str, kind: &'static str) {
    metrics::counter!(MESSAGES_TOTAL, "direction" => direction, "kind" => kind).increment(1);
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        OPERATIONS_TOTAL,
        Unit::Count,
        "NIC switch operations by final result and direction"
    );
    describe_histogram!(
        PHASE_DURATION,
        Unit::Seconds,
        "Duration of each phase of a switch operation (pause, switch, resume, rollback, total)"
    );
    describe_histogram!(
        TRAINING_STALL,
        Unit::Seconds,
        "Longest time any rank's training was held at its step gate, per operation"
    );
    describe_gauge!(
        WORKERS_REGISTERED,
        Unit::Count,
        "Workers registered with the manager"
    );
    describe_gauge!(
        WORKERS_EXPECTED,
        Unit::Count,
        "Workers the job's rank table expects"
    );
    describe_gauge!(
        OPERATION_IN_FLIGHT,
        Unit::Count,
        "1 while a switch operation runs"
    );
    describe_gauge!(
        RANKS_ON_BACKUP,
        Unit::Count,
        "Ranks whose traffic uses the backup NIC"
    );
    describe_counter!(
        HAL_CALLS_TOTAL,
        Unit::Count,
        "Device HAL calls by operation and result"
    );
    describe_histogram!(
        IN_FLIGHT_ABORT_SECONDS,
        Unit::Seconds,
        "Time a rank's framework took to end its collectives in flight (an in-flight move)"
    );
    describe_histogram!(
        HAL_CALL_DURATION,
        Unit::Seconds,
        "Device HAL call latency by operation"
    );
    describe_counter!(
        MESSAGES_TOTAL,
        Unit::Count,
        "Control-plane messages by direction and kind"
    );
    describe_counter!(
        HAL_ERRORS_TOTAL,
        Unit::Count,
        "Failed device HAL calls by operation, error kind and vendor code name"
    );
    describe_job();
}

/// The job's gauges and counters, by what they watch.
fn describe_job() {
    describe_job_state();
    describe_clusterd();
    describe_recovery();
    describe_connections();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// The job's state, its operation and its held ranks.
fn describe_job_state() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        JOB_STATE,
        Unit::Count,
        "1 for the job's current state (running, paused, needs_recovery, degraded)"
    );
    describe_gauge!(
        OPERATION_PENDING_RANKS,
        Unit::Count,
        "Ranks the phase in flight still waits for"
    );
    describe_gauge!(
        RANKS_HELD,
        Unit::Count,
        "Ranks whose training is held at the step gate now"
    );
    describe_counter!(
        TRAINING_STOPS,
        Unit::Count,
        "Training stopped for good (a rank's gate, or the manager's stop by who decided)"
    );
}

/// The manager's ClusterD client.
fn describe_clusterd() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        CLUSTERD_CONNECTED,
        Unit::Count,
        "1 while the manager's ClusterD client has a session"
    );
    describe_counter!(
        CLUSTERD_SIGNALS_TOTAL,
        Unit::Count,
        "Signals received from ClusterD by type"
    );
    describe_counter!(
        CLUSTERD_REPORTS_TOTAL,
        Unit::Count,
        "Reports sent to ClusterD by kind and result"
    );
}

/// The build, the automatic failover, the journal and the job's recovery.
fn describe_recovery() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        BUILD_INFO,
        Unit::Count,
        "Always 1; labelled with the version"
    );
    describe_counter!(
        AUTO_DECISIONS_TOTAL,
        Unit::Count,
        "Automatic failover decisions by action (to_backup, to_primary, hold) and reason"
    );
    describe_gauge!(
        JOURNAL_FAILING,
        Unit::Count,
        "1 while the manager's operation journal cannot be written"
    );
    describe_counter!(
        JOURNAL_WRITE_FAILURES_TOTAL,
        Unit::Count,
        "Failed writes of the manager's operation journal"
    );
    describe_counter!(
        JOB_RESTARTS,
        Unit::Count,
        "Restarts of the whole job the manager began"
    );
    describe_counter!(
        TRAINING_STOPS_OVERDUE,
        Unit::Count,
        "Stops of training that passed their bound with ranks not back"
    );
    describe_gauge!(
        RANKS_UNREACHABLE,
        Unit::Count,
        "Ranks the manager cannot reach now (their proxy is not connected)"
    );
    describe_gauge!(
        RANKS_HUNG,
        Unit::Count,
        "Ranks whose training loop finished no step for the hang watch's timeout"
    );
}

/// The limits of the control and transport ports.
fn describe_connections() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        CONNECTIONS_OPEN,
        Unit::Count,
        "Connections a server holds open, by port"
    );
    describe_counter!(
        CONNECTIONS_CLOSED_TOTAL,
        Unit::Count,
        "Connections a server refused or closed for its limits, by port and why"
    );
    describe_counter!(
        ACCEPT_ERRORS_TOTAL,
        Unit::Count,
        "Accepts refused by the system for want of descriptors or memory, by port"
    );
}

/// Why metrics could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The `metrics` facade takes one recorder per process, and something else installed
    /// one first; the text is the facade's.
    #[error("cannot install the Prometheus recorder (is another metrics recorder installed in this process?): {0}")]
    Recorder(String),
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen for /metrics on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The server's own runtime or socket setup failed after the bind.
    #[error("cannot start the metrics server: {0}")]
    Start(std::io::Error),
}

static RECORDER: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle)
/// with this crate's histogram buckets and metric descriptions. Fails if another `metrics`
/// recorder is installed already.
pub fn install_recorder() -> Result<PrometheusHandle, MetricsError> {
    let mut slot = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let err = |e: metrics_exporter_prometheus::BuildError| MetricsError::Recorder(e.to_string());
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(PHASE_DURATION.into()), DURATION_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(TRAINING_STALL.into()), DURATION_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(HAL_CALL_DURATION.into()), HAL_BUCKETS)
        .map_err(err)?
        .install_recorder()
        .map_err(err)?;
    describe();
    *slot = Some(handle.clone());
    Ok(handle)
}

/// The installed recorder's handle, if [`install_recorder`] ran.
pub fn recorder() -> Option<PrometheusHandle> {
    RECORDER.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Most connections served at once; more are closed at once (a scraper needs one).
const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the recorder's histogram buffers are folded in between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// A running `/metrics` endpoint. Dropping it (or [`MetricsServer::shutdown`]) stops it.
#[must_use = "the endpoint stops when this is dropped"]
pub struct MetricsServer {
    addr: SocketAddr,
    server: Background,
}

impl MetricsServer {
    /// The address it listens on (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    /// Stops listening and waits for the server thread.
    pub fn shutdown(mut self) {
        self.server.stop();
    }
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Installs the recorder (see [`install_recorder`]) and serves Prometheus' text format at
/// `GET /metrics` on `addr`, on a thread of its own (whatever runtime the caller uses). Port 0
/// picks a free port: [`MetricsServer::local_addr`] tells which. Every role binary calls this
/// for its `--metrics-addr`.
pub fn serve_metrics(addr: SocketAddr) -> Result<MetricsServer, MetricsError> {
    let handle = install_recorder()?;
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(MetricsError::Start)?;
    let server = Background::spawn("taskd-metrics", move |stop| serve(listener, handle, stop))
        .map_err(MetricsError::Start)?;
    tracing::info!(addr = %local, "serving Prometheus metrics at /metrics");
    Ok(MetricsServer {
        addr: local,
        server,
    })
}

async fn serve(
    listener: std::net::TcpListener,
    handle: PrometheusHandle,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "metrics endpoint: cannot use the listener");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut upkeep = tokio::time::interval(UPKEEP_EVERY);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = upkeep.tick() => handle.run_upkeep(),
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: try again shortly.
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::warn!("metrics endpoint: too many connections; closing one");
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let handle = handle.clone();
                        async move { Ok::<_, Infallible>(respond(&req, &handle)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "metrics endpoint: connection ended");
                    }
                    drop(permit);
                });
            }
        }
    }
}

fn respond(req: &Request<Incoming>, handle: &PrometheusHandle) -> Response<Full<Bytes>> {
    let readable = matches!(*req.method(), Method::GET | Method::HEAD);
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" if readable => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        ),
        "/" if readable => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "taskd: Prometheus metrics are at /metrics\n".to_owned(),
        ),
        "/metrics" | "/" => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: metrics are at /metrics\n".to_owned(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn http(addr: SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn hal_errors_count_by_kind_and_a_code_name_of_this_build() {
        use taskd_core::{CodeTable, HalErrorKind, HcclCode, LibraryName};
        // A backend's table, as hal-ascend's DCMI table has the code.
        let dcmi = CodeTable::new(
            LibraryName::new("dcmi"),
            &[(-8006, "DCMI_ERR_CODE_TIME_OUT", HalErrorKind::Timeout)],
        );
        let recorder = PrometheusBuilder::new().build_recorder();
        let mut from_a_peer = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Other(99), "");
        // A name that came over the wire is owned.
        from_a_peer.vendor.name = Some(String::from("HCCL_E_SOMETHING_NEW").into());
        metrics::with_local_recorder(&recorder, || {
            hal_error(
                "set_working_nic",
                &HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, ""),
            );
            hal_error(
                "link_health",
                &HalError::new("dcmi_init", dcmi.status(-8006), ""),
            );
            hal_error("set_working_nic", &from_a_peer);
        });
        let text = recorder.handle().render();
        for series in [
            r#"taskd_hal_errors_total{op="set_working_nic",kind="network",code="HCCL_E_NETWORK"} 1"#,
            r#"taskd_hal_errors_total{op="link_health",kind="timeout",code="DCMI_ERR_CODE_TIME_OUT"} 1"#,
            r#"taskd_hal_errors_total{op="set_working_nic",kind="other",code="OTHER"} 1"#,
        ] {
            assert!(text.contains(series), "{series} not in\n{text}");
        }
        assert!(!text.contains("SOMETHING_NEW"), "{text}");
    }

    #[test]
    fn serves_metrics_on_a_picked_port_and_nothing_else() {
        let server = serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        assert_eq!(server.url(), format!("http://{addr}/metrics"));
        message("in", "hello");

        let ok = http(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains("# TYPE taskd_messages_total counter"), "{ok}");
        assert!(
            ok.contains("taskd_messages_total{direction=\"in\",kind=\"hello\"}"),
            "{ok}"
        );
        assert!(ok.contains("taskd_build_info{version=\""), "{ok}");

        let missing = http(
            addr,
            "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = http(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(
            post.to_ascii_lowercase().contains("allow: get, head"),
            "{post}"
        );

        // A second server shares the one recorder; the first's port is free once it stops.
        let second = serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_ne!(second.local_addr(), addr);
        server.shutdown();
        assert!(std::net::TcpStream::connect(addr).is_err());
        let again = http(
            second.local_addr(),
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(again.contains("taskd_messages_total"), "{again}");
    }

    #[test]
    fn a_taken_port_is_a_clear_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve_metrics(addr).unwrap_err();
        assert!(matches!(err, MetricsError::Bind { .. }), "{err}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
