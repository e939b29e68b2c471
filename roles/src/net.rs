//! What the manager, the proxy and the worker share: TLS and transport options, the metrics
//! endpoint, and the line it prints for scripts.

use crate::error::ConfigError;
use crate::flags;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use taskd_actors::net::{NetConfig, TlsError, TlsFiles, TlsPem};
use taskd_actors::telemetry::MetricsServer;

/// Mutual TLS between the roles of the job.
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// The job's CA certificate (PEM). Turns on mutual TLS: servers require client
    /// certificates signed by it and clients verify servers against it.
    #[arg(long, value_name = "PEM", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate (PEM), signed by the CA.
    #[arg(long, value_name = "PEM", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// This process's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    /// The name to verify in the server's certificate (default: the host it connects to).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

impl TlsArgs {
    /// The PEM files, read; `None` without `--tls-ca`.
    pub fn load(&self) -> Result<Option<TlsPem>, TlsError> {
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key)
        else {
            return Ok(None);
        };
        TlsFiles {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
            domain: self.tls_domain.clone(),
        }
        .load()
        .map(Some)
    }
}

/// Knobs of the transport.
#[derive(Args, Clone, Debug)]
pub struct NetArgs {
    /// Heartbeat interval (1 to 60000). A server tells its clients its own.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = flags::heartbeat_ms())]
    pub heartbeat_ms: u64,
    /// A peer is lost after this many intervals without a sign of life (or this long
    /// disconnected); 1 to 1000.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = flags::missed_heartbeats())]
    pub missed_heartbeats: u32,
    /// Messages queued per peer before it counts as not keeping up (1 to 65536).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = flags::queue_capacity())]
    pub queue_capacity: usize,
    /// Largest message accepted or sent (64 KiB to 64 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20, value_parser = flags::message_bytes())]
    pub max_message_bytes: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl NetArgs {
    /// Starts the metrics endpoint when `--metrics-addr` was given and says where; keep the
    /// returned server for as long as the role runs.
    pub fn serve_metrics(&self, role: &str) -> Result<Option<MetricsServer>, ConfigError> {
        let Some(addr) = self.metrics_addr else {
            return Ok(None);
        };
        let m = taskd_actors::telemetry::serve_metrics(addr)?;
        say(format!("taskd {role} metrics on {}", m.url()));
        Ok(Some(m))
    }

    /// The transport's configuration, or why the flags cannot run: each is range-checked
    /// when parsed, and together they must leave a peer at least [`flags::MIN_LOSS_MS`]
    /// before it is lost.
    pub fn checked(&self) -> Result<NetConfig, ConfigError> {
        let loss = self.heartbeat_ms * u64::from(self.missed_heartbeats);
        if loss < flags::MIN_LOSS_MS {
            return Err(ConfigError::usage(format!(
                "--heartbeat-ms {} with --missed-heartbeats {} loses a peer after {loss} ms \
                 without a heartbeat, below the {} ms a loaded machine keeps (a scheduling \
                 hiccup would flap the job); raise --heartbeat-ms or --missed-heartbeats",
                self.heartbeat_ms,
                self.missed_heartbeats,
                flags::MIN_LOSS_MS
            )));
        }
        Ok(self.config())
    }

    /// The transport's configuration (the flags are range-checked when parsed; see
    /// [`NetArgs::checked`] for the check of the two heartbeat flags together).
    pub fn config(&self) -> NetConfig {
        NetConfig {
            heartbeat_interval: Duration::from_millis(self.heartbeat_ms),
            missed_heartbeats: self.missed_heartbeats,
            queue_capacity: self.queue_capacity,
            max_message_bytes: self.max_message_bytes,
            ..NetConfig::default()
        }
    }
}

/// Prints a line on stdout at once (scripts and tests wait for these lines).
pub fn say(line: impl AsRef<str>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}
