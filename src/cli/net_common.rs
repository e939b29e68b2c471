//! What `taskd manager`, `taskd proxy` and `taskd worker` share: TLS and transport flags, the
//! HCCL rank table file, the MindCluster environment, and waiting for SIGINT/SIGTERM.

use clap::Args;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use taskd_actors::net::{NetConfig, TlsFiles, TlsPem};
use taskd_core::rank_table::RankSlot;
use taskd_core::{DeviceId, GlobalRank, NodeName, RankTable};

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
    pub fn load(&self) -> Result<Option<TlsPem>, String> {
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
        .map_err(|e| e.to_string())
    }
}

/// Knobs of the transport.
#[derive(Args, Clone, Debug)]
pub struct NetArgs {
    /// Heartbeat interval. A server tells its clients its own.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// A peer is lost after this many intervals without a sign of life (or this long
    /// disconnected).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub missed_heartbeats: u32,
    /// Messages queued per peer before it counts as not keeping up.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub queue_capacity: usize,
    /// Largest message accepted or sent.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_message_bytes: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl NetArgs {
    /// Starts the metrics endpoint when `--metrics-addr` was given; keep the returned server
    /// for as long as the role runs. `Err` is the exit code after a message on stderr.
    pub fn serve_metrics(
        &self,
        role: &str,
    ) -> Result<Option<taskd_actors::telemetry::MetricsServer>, std::process::ExitCode> {
        let Some(addr) = self.metrics_addr else {
            return Ok(None);
        };
        match taskd_actors::telemetry::serve_metrics(addr) {
            Ok(m) => {
                say(format!("taskd {role} metrics on {}", m.url()));
                Ok(Some(m))
            }
            Err(e) => {
                eprintln!("taskd {role}: metrics endpoint: {e}");
                Err(std::process::ExitCode::from(2))
            }
        }
    }

    pub fn config(&self) -> NetConfig {
        NetConfig {
            heartbeat_interval: Duration::from_millis(self.heartbeat_ms.max(1)),
            missed_heartbeats: self.missed_heartbeats.max(1),
            queue_capacity: self.queue_capacity.max(1),
            max_message_bytes: self.max_message_bytes,
            ..NetConfig::default()
        }
    }
}

/// An environment variable, trimmed, if set and not empty.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A value of an HCCL rank table: a string (as HCCL writes them) or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Num {
    Text(String),
    Int(u64),
}

impl Num {
    fn get(&self, what: &str) -> Result<u32, String> {
        match self {
            Num::Int(n) => u32::try_from(*n).map_err(|_| format!("{what} {n} is too large")),
            Num::Text(s) => s
                .trim()
                .parse()
                .map_err(|_| format!("{what} {s:?} is not a number")),
        }
    }
}

#[derive(Deserialize)]
struct HcclDevice {
    device_id: Num,
    rank_id: Num,
}

#[derive(Deserialize)]
struct HcclServer {
    server_id: String,
    #[serde(default)]
    server_name: Option<String>,
    device: Vec<HcclDevice>,
}

#[derive(Deserialize)]
struct HcclRankTable {
    server_list: Vec<HcclServer>,
}

/// Reads an HCCL rank table (`server_list[].device[].{device_id, rank_id}`). A node is named
/// by its `server_name` when the file has one, else by its `server_id`.
pub fn load_rank_table(path: &Path) -> Result<RankTable, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the rank table {}: {e}", path.display()))?;
    parse_rank_table(&text).map_err(|e| format!("rank table {}: {e}", path.display()))
}

pub fn parse_rank_table(text: &str) -> Result<RankTable, String> {
    let t: HcclRankTable =
        serde_json::from_str(text).map_err(|e| format!("not an HCCL rank table: {e}"))?;
    let mut slots = Vec::new();
    for s in t.server_list {
        let node = NodeName(s.server_name.unwrap_or(s.server_id));
        for d in s.device {
            slots.push(RankSlot {
                node: node.clone(),
                device: DeviceId(d.device_id.get("device_id")?),
                rank: GlobalRank(d.rank_id.get("rank_id")?),
            });
        }
    }
    RankTable::new(slots).map_err(|e| e.to_string())
}

/// Resolves at SIGINT or SIGTERM, naming it.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Prints a line on stdout at once (scripts and tests wait for these lines).
pub fn say(line: impl AsRef<str>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}

/// `0-3` or `0, 2, 5`.
pub fn rank_span(ranks: &[GlobalRank]) -> String {
    match (ranks.first(), ranks.last()) {
        (Some(a), Some(b)) if (b.0 - a.0) as usize + 1 == ranks.len() && ranks.len() > 1 => {
            format!("{a}-{b}")
        }
        _ => ranks
            .iter()
            .map(|r| r.0.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_hccl_rank_table() {
        let t = parse_rank_table(
            r#"{"version": "1.0", "server_count": "2", "status": "completed",
                "server_list": [
                  {"server_id": "10.0.0.1", "host_nic_ip": "reserve",
                   "device": [{"device_id": "0", "device_ip": "192.168.1.1", "rank_id": "0"},
                              {"device_id": "1", "device_ip": "192.168.1.2", "rank_id": "1"}]},
                  {"server_id": "10.0.0.2", "server_name": "node-b",
                   "device": [{"device_id": 0, "rank_id": 2}, {"device_id": 1, "rank_id": 3}]}
                ]}"#,
        )
        .unwrap();
        assert_eq!(t.world_size(), 4);
        assert_eq!(
            t.nodes(),
            [NodeName("10.0.0.1".into()), NodeName("node-b".into())]
        );
        assert_eq!(
            t.rank_of(&"node-b".into(), DeviceId(1)),
            Some(GlobalRank(3))
        );
        let e = parse_rank_table(r#"{"server_list": [{"server_id": "a", "device": [{"device_id": "x", "rank_id": "0"}]}]}"#)
            .unwrap_err();
        assert!(e.contains("device_id \"x\""), "{e}");
        assert!(parse_rank_table("{}").is_err());
        assert_eq!(
            rank_span(&[GlobalRank(4), GlobalRank(5), GlobalRank(6)]),
            "4-6"
        );
        assert_eq!(rank_span(&[GlobalRank(1), GlobalRank(3)]), "1, 3");
    }
}
