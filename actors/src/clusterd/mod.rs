//! The manager as ClusterD's client, as TaskD's manager is (`docs/clusterd.md`).
//!
//! In a MindCluster cluster the operators' platform calls ClusterD, and ClusterD drives each
//! job's manager over gRPC (service `Recover`, no package: `proto/clusterd.proto`). The
//! client keeps a session with ClusterD: `Init`, `Register`, then two server streams,
//! `SubscribeProcessManageSignal` (pause, stop, continue, killMaster, a keep-alive every 5 s)
//! and, once that stream's first message is in, `SubscribeNotifySwitch` (the ranks to switch).
//! ClusterD is a grpc-go server: it sends a stream's headers only with its first message, so
//! nothing waits for them (`session.rs` says how). The client hands every signal to the
//! manager actor (`actors/src/manager/clusterd.rs`, where `core/src/clusterd.rs` decides),
//! tagged with its session, and sends the reports the manager owes: `ReportStopComplete`,
//! `ReplySwitchNicResult`, `ReportRecoverStatus`, in the order they are owed, each once, as
//! soon as they are owed.
//!
//! The end of the signal stream is normal (ClusterD resets the job's flow after each switch,
//! and whenever the stream ends): the reports owed to that session are dropped, the manager
//! ends the flow it drove, and the client starts again from `Init`; after a failure it waits
//! with a jittered backoff, forever, logging each change of its link once. The end of the
//! switch stream alone subscribes that stream again, alone. A session that hears nothing (not
//! even a keep-alive) for [`ClusterdConfig::silence`] is given up. Metrics:
//! `taskd_clusterd_connected`, `taskd_clusterd_signals_total{type}`,
//! `taskd_clusterd_reports_total{report, result}` (`result` `dropped` for a report whose
//! session ended); spans `clusterd` (the client) and `clusterd_signal` (the manager's
//! handling of one signal).

mod session;

use crate::background::Background;
use crate::manager::{AttachClusterd, Manager};
use crate::telemetry;
use actix::Addr;
use std::time::Duration;
use taskd_core::clusterd::DEFAULT_SIGNAL_WAIT;
use taskd_core::env::{check_host_port, AddressError};
use taskd_core::JobId;

/// Generated from `proto/clusterd.proto`: ClusterD's `Recover` (no package, as ClusterD's). Its
/// client is used here; its server is the operator API of [`crate::control::recover`].
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

/// How the client reaches ClusterD and how patient it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterdConfig {
    /// ClusterD's `HOST:PORT` (`$MINDX_SERVER_IP:8899` in a cluster).
    pub addr: String,
    /// The job (`ClientInfo.jobId`).
    pub job: JobId,
    /// How long a pause ClusterD started waits for ClusterD's next signal before the job
    /// resumes (`--clusterd-signal-wait-ms`).
    pub signal_wait: Duration,
    /// The first wait before reconnecting after a failure (and after ClusterD ends the
    /// streams; and before subscribing the switch stream again); it doubles up to
    /// [`ClusterdConfig::retry_max`].
    pub retry_min: Duration,
    /// The longest wait between two attempts.
    pub retry_max: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// A session that receives nothing for this long (ClusterD sends a keep-alive every 5 s)
    /// is given up and started again.
    pub silence: Duration,
}

impl ClusterdConfig {
    /// ClusterD at `addr` for `job`, with the defaults: pauses waiting 15 minutes for a signal (ClusterD's own
    /// wait for each report), reconnecting after 1 s up to 30 s, 5 s to connect, 30 s of
    /// silence.
    pub fn new(addr: impl Into<String>, job: JobId) -> ClusterdConfig {
        ClusterdConfig {
            addr: addr.into(),
            job,
            signal_wait: DEFAULT_SIGNAL_WAIT,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            silence: Duration::from_secs(30),
        }
    }
}

/// Why the client could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterdError {
    /// The address is not `HOST:PORT`.
    #[error("ClusterD address: {0}")]
    Address(#[from] AddressError),
    /// No thread or runtime for the client.
    #[error("cannot start the ClusterD client's runtime: {0}")]
    Runtime(std::io::Error),
}

/// A running ClusterD client. Dropping it stops it.
pub struct ClusterdClient {
    thread: Background,
}

impl ClusterdClient {
    /// Makes `manager` ClusterD's client and starts the session on a thread of its own (it
    /// connects in the background and keeps trying). Callable from any thread.
    pub fn start(
        manager: Addr<Manager>,
        cfg: ClusterdConfig,
    ) -> Result<ClusterdClient, ClusterdError> {
        check_host_port(&cfg.addr)?;
        let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
        manager.do_send(AttachClusterd {
            addr: cfg.addr.clone(),
            signal_wait: cfg.signal_wait,
            reports: reports_tx,
        });
        metrics::gauge!(telemetry::CLUSTERD_CONNECTED).set(0.0);
        let thread = Background::spawn("taskd-clusterd", move |stop| {
            session::run(manager, cfg, reports, stop)
        })
        .map_err(ClusterdError::Runtime)?;
        Ok(ClusterdClient { thread })
    }

    /// Ends the session and waits for the client's thread.
    pub fn shutdown(mut self) {
        self.thread.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::proto;

    /// The paths a real ClusterD serves and calls: service `Recover` in no package, exactly
    /// these methods (generated once, for the client here and the server of
    /// [`crate::control::recover`]).
    #[test]
    fn the_recover_paths_are_clusterds() {
        assert_eq!(proto::recover_server::SERVICE_NAME, "Recover");
        let generated = include_str!(concat!(env!("OUT_DIR"), "/_.rs"));
        let mut paths: Vec<&str> = generated
            .split("\"/Recover/")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        paths.sort_unstable();
        paths.dedup();
        let mut want = [
            "HealthCheck",
            "Init",
            "Register",
            "ReplySwitchNicResult",
            "ReportRecoverStatus",
            "ReportStopComplete",
            "SubscribeNotifySwitch",
            "SubscribeProcessManageSignal",
            "SubscribeSwitchNicSignal",
            "SwitchNicTrack",
        ];
        want.sort_unstable();
        assert_eq!(paths, want);
    }
}
