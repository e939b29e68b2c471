//! The network transport: the roles of one job in separate processes, over gRPC (HTTP/2,
//! tonic), worker -> proxy -> manager. The actors do not know about it: it hands them
//! [`Link`](crate::transport::Link)s and connection events exactly as the in-process transport
//! ([`crate::local`]) does.
//!
//! - [`ManagerNode`]: the manager actor and the port its proxies connect to (default 9601).
//!   Operators, tests and tools reach the manager through its control port instead
//!   ([`crate::control`]), which has authentication.
//! - [`ProxyNode`]: a node's proxy actor, connected to the manager, and the port the node's
//!   workers connect to.
//! - [`RemoteWorker`]: the library a training process links: a worker for one global rank,
//!   its step gate and its connection to the node's proxy.
//!
//! How a connection works (`session`, `server`, `client`): the client registers (role,
//! job, node, ranks, capabilities and an *incarnation* id unique to its process); duplicates
//! and conflicts are refused with a reason ([`ClientState::Refused`]). Protocol messages are
//! numbered, kept in a bounded queue per peer (`outbox`, behind the
//! [`Sender`](crate::transport::Sender) of an actor's [`Link`](crate::transport::Link)) until
//! acknowledged and replayed after a reconnect of the same process, so a network blip loses
//! nothing; a new process under the same identity is a new peer and the old one is declared
//! lost. Heartbeats go both ways (`heartbeat`); a peer silent for `missed_heartbeats`
//! intervals is lost, and so is one whose connection closed and did not come back within the
//! same time. Clients reconnect with `backoff`. Optional mutual [`tls`]. The connections and
//! queues of a node's peers are its [`Registry`].
//!
//! Everything else is the crate's own; the `testing` feature opens the frame conversions to
//! the transport's fuzz and slow-peer tests (`net::testing`).

pub(crate) mod backoff;
pub(crate) mod client;
pub(crate) mod codec;
pub(crate) mod frame;
pub(crate) mod heartbeat;
pub(crate) mod limits;
pub(crate) mod liveness;
pub mod manager_node;
pub(crate) mod outbound;
pub(crate) mod outbox;
pub mod proxy_node;
pub(crate) mod server;
pub(crate) mod session;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
// Its `pub` items are the conversions `testing` re-exports: reachable with the feature only.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub(crate) mod wire;
pub mod worker_node;

pub use client::ClientState;
pub use limits::{fd_budget, ConnLimits, FD_RESERVE, FIRST_REQUEST};
pub use manager_node::{ManagerNode, ManagerNodeConfig};
pub use proxy_node::{ProxyNode, ProxyNodeConfig};
pub use server::{QueueDepth, Registry};
pub use tls::{PemIdentity, TlsError, TlsFiles, TlsPem};
pub use worker_node::{RemoteWorker, RemoteWorkerConfig, WorkerRegistration};

use std::time::Duration;

/// Generated from `proto/net.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/taskd.net.v1.rs"));
}

/// The default port of the manager (the container port `taskd-port` of the reference
/// deployment).
pub const DEFAULT_MANAGER_PORT: u16 = 9601;

/// The default port of a node's proxy. Workers run on the proxy's node, so it listens on
/// loopback by default; it is not 9601 because the manager's pod also runs a proxy.
pub const DEFAULT_PROXY_PORT: u16 = 9602;

/// Knobs of the transport, one set per process. A server tells its clients its heartbeat
/// settings at registration, so both ends of a connection use the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// How often each side sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// A peer is lost after this many intervals without a frame from it, and a peer whose
    /// connection closed is lost when it has not reconnected within the same time.
    pub missed_heartbeats: u32,
    /// Messages queued for one peer and not yet acknowledged, at most. A peer that falls this
    /// far behind is not keeping up: sending to it fails with `Full` and it is disconnected.
    pub queue_capacity: usize,
    /// The largest encoded message accepted or sent.
    pub max_message_bytes: usize,
    /// Connecting to a server gives up after this long (then the client backs off and retries).
    pub connect_timeout: Duration,
    /// First wait between reconnection attempts; it doubles after every failed attempt, each
    /// wait jittered by up to 25% so clients of a restarted server do not reconnect in step.
    pub backoff_initial: Duration,
    /// Longest wait between reconnection attempts (before jitter): how soon, at worst, a
    /// client notices that its server is back.
    pub backoff_max: Duration,
    /// How long a server waits for the first frame (the registration) of a new connection.
    pub register_timeout: Duration,
    /// A manager's: how often its proxies probe the links of their node's devices and report
    /// changes, told to them at registration like the heartbeat (`None`: they do not probe;
    /// automatic failover is off). Set from the manager's [`taskd_core::auto::AutoConfig`].
    pub link_probe: Option<Duration>,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            heartbeat_interval: Duration::from_secs(1),
            missed_heartbeats: 3,
            queue_capacity: 1024,
            max_message_bytes: 4 << 20,
            connect_timeout: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            register_timeout: Duration::from_secs(10),
            link_probe: None,
        }
    }
}

impl NetConfig {
    /// How long a peer may stay silent (or disconnected) before it is lost.
    pub fn loss_after(&self) -> Duration {
        self.heartbeat_interval * self.missed_heartbeats.max(1)
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The listening socket could not be bound (port in use, address not local).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An address that is not `HOST:PORT`.
    #[error("bad address {0:?}: expected HOST:PORT")]
    Address(String),
    /// The TLS files could not be read or do not make a valid configuration.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The server refused the registration for good (wrong job, node, rank or role, or a
    /// duplicate that did not go away): retrying cannot help.
    #[error("registration refused by {server}: {reason}")]
    Refused {
        /// The server's address.
        server: String,
        /// The server's reason, verbatim.
        reason: String,
    },
    /// The node was stopped while the caller waited on it.
    #[error("the node stopped")]
    Stopped,
    /// A wait gave up after the given time; the text names what was waited for.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// A worker's HAL thread could not be started.
    #[error("cannot start the HAL thread: {0}")]
    HalThread(#[source] std::io::Error),
}
