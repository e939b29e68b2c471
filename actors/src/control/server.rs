//! The control server: `Recover` and `Control` on one port, behind one [`Guard`] interceptor,
//! on a runtime thread of its own, in front of the manager actor. Its connections are held
//! within [`ControlConfig::limits`] (`crate::net::limits`): a connection that has not had a
//! call through the guard (a token, when one is configured) within the deadline is closed.

use super::guard::{Guard, GuardConfig};
use super::proto::control_server::ControlServer as ControlService;
use super::recover::RecoverSvc;
use super::retention::{Clock, LastResult};
use super::taskd_service::ControlSvc;
use crate::background::Background;
use crate::clusterd::proto::recover_server::RecoverServer;
use crate::manager::{Manager, SubscribeProgress};
use crate::net::limits::{self, Connections};
use crate::net::{ConnLimits, TlsError, TlsPem};
use actix::Addr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::JobId;
use tokio::sync::oneshot;

/// How long requests in progress may finish after a shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// What a control server serves and how.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// Where it listens (port 0: any free port; see [`ControlServer::local_addr`]).
    pub listen: SocketAddr,
    /// The job the manager runs; requests for another are refused.
    pub job: JobId,
    /// Bearer token and rate limit.
    pub guard: GuardConfig,
    /// TLS for the port; with a CA, clients must present a certificate signed by it (mutual
    /// TLS).
    pub tls: Option<TlsPem>,
    /// The clock of the result retention ([`super::RESULT_RETENTION`]); tests move their own.
    pub clock: Clock,
    /// How many connections the port holds, per client address and in all, and how long a
    /// new one has to complete its handshake and first authenticated call.
    pub limits: ConnLimits,
}

impl ControlConfig {
    /// Plain HTTP/2, no token, the default rate limit, the system clock.
    pub fn new(listen: SocketAddr, job: JobId) -> ControlConfig {
        ControlConfig {
            listen,
            job,
            guard: GuardConfig::default(),
            tls: None,
            clock: Clock::system(),
            limits: ConnLimits::control(),
        }
    }
}

/// Why a control server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The TLS material is incomplete or unreadable.
    #[error("TLS setup failed: {0}")]
    Tls(#[from] TlsError),
    /// The rate limit would refuse every request.
    #[error("{0}")]
    RateLimit(String),
    /// No thread or runtime for the server.
    #[error("cannot start the control server's runtime: {0}")]
    Runtime(std::io::Error),
}

/// A running control server. Dropping it stops it.
pub struct ControlServer {
    local_addr: SocketAddr,
    server: Background,
}

impl ControlServer {
    /// The address it listens on (with the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, finishes the requests in progress and returns.
    pub fn shutdown(mut self) {
        self.server.stop();
    }
}

/// Serves the control API for `cfg.job` at `cfg.listen` in front of `manager`. Returns once the
/// port is bound; callable from inside the manager's actix system.
pub fn serve(manager: Addr<Manager>, cfg: ControlConfig) -> Result<ControlServer, ServeError> {
    cfg.guard.rate.check().map_err(ServeError::RateLimit)?;
    let addr = cfg.listen;
    let bind = |source| ServeError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    let local_addr = listener.local_addr().map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &cfg.tls {
        builder = builder
            .tls_config(tls.server_config()?)
            .map_err(|e| TlsError::Config(crate::net::client::error_chain(&e)))?;
    }
    let server = Background::spawn("taskd-control", move |stop| {
        run(listener, builder, manager, cfg, stop)
    })
    .map_err(ServeError::Runtime)?;
    tracing::info!(%local_addr, "control API listening");
    Ok(ControlServer { local_addr, server })
}

/// The server's life on its runtime: follow the manager's results, serve until asked to stop.
async fn run(
    listener: std::net::TcpListener,
    mut builder: tonic::transport::Server,
    manager: Addr<Manager>,
    cfg: ControlConfig,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "control listener unusable");
            return;
        }
    };
    // Before the first request is read: every operation it starts is seen by the retention.
    // A stop may come first: the manager's thread then waits for this one to end, and cannot
    // answer.
    let feed = tokio::select! {
        feed = manager.send(SubscribeProgress) => match feed {
            Ok(feed) => feed,
            Err(_) => {
                tracing::error!("control API: the manager stopped before the server started");
                return;
            }
        },
        _ = &mut stop => return,
    };
    let last = LastResult::new(feed.resubscribe(), cfg.clock.clone());
    tokio::spawn(last.clone().follow(feed));
    // A connection is past its first request once a call of it is let through.
    let connections = Connections::new("control", cfg.limits);
    let guard = Guard::new(cfg.guard.clone()).with_connections(connections.clone());
    let recover = RecoverSvc::new(manager.clone(), cfg.job.clone(), last);
    let control = ControlSvc::new(manager, cfg.job.clone());
    let incoming = limits::incoming(listener, connections);
    let stopping = Arc::new(tokio::sync::Notify::new());
    let stop_signal = stopping.clone();
    let serving = builder
        .add_service(RecoverServer::with_interceptor(recover, guard.clone()))
        .add_service(ControlService::with_interceptor(control, guard))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.await;
            stop_signal.notify_one();
        });
    // Requests in progress (a client waiting for a result) get a grace period; a client that
    // keeps its connection open does not hold the shutdown forever.
    let give_up = async {
        stopping.notified().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        res = serving => {
            if let Err(e) = res {
                tracing::error!(error = %e, "control server stopped");
            }
        }
        _ = give_up => tracing::warn!("control server: connections still open after the grace period; closing them"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::Actor;
    use std::time::Duration;
    use taskd_core::{PhaseDeadlines, RankTable};

    /// A server stopped from the manager's own thread before it heard from the manager: the
    /// manager cannot answer while its thread waits for the server, so the server must not
    /// wait for the manager then (a SIGINT right after start hung the embedded manager so).
    #[test]
    fn a_server_stopped_before_it_started_serving_does_not_wait_for_the_manager() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sys = actix::System::new();
            sys.block_on(async move {
                let manager = Manager::new(
                    "job".into(),
                    RankTable::uniform(1, 1),
                    PhaseDeadlines::default(),
                )
                .start();
                let cfg = ControlConfig::new("127.0.0.1:0".parse().unwrap(), "job".into());
                let server = serve(manager, cfg).expect("the port binds");
                // This thread is the manager's: it answers nothing until the stop returns.
                server.shutdown();
                let _ = done_tx.send(());
            });
        });
        done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the stop returned without the manager's answer");
    }
}
