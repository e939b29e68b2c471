//! A node's proxy inside a host process (the launcher, or the reference's management
//! process): what `taskd proxy` runs, configured by a JSON object, on a thread of its own.

use crate::config::{self, Keys};
use crate::error::CapiError;
use crate::role::{stop_requested, RoleStart, RoleThread};
use crate::state::Shared;
use actix::Recipient;
use clap::{CommandFactory, Parser};
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use taskd_actors::net::{ProxyNode, ProxyNodeConfig, DEFAULT_MANAGER_PORT, DEFAULT_PROXY_PORT};
use taskd_actors::proxy::{LauncherOrder, WorkerExited};
use taskd_actors::telemetry::MetricsServer;
use taskd_core::GlobalRank;
use taskd_roles::ProxyArgs;

#[derive(Parser)]
#[command(name = "proxy", no_binary_name = true)]
struct ProxyCmd {
    #[command(flatten)]
    args: ProxyArgs,
}

/// The reference's `ServerRank` is `--node-rank`; its address keys are joined below.
const KEYS: Keys<'static> = Keys {
    renamed: &[("ServerRank", "node_rank")],
    ignored: &[],
};

/// Joins the reference's `HOST` and `PORT` keys into one `HOST:PORT` flag value (an IPv6
/// address in brackets); a missing half takes taskd's default.
fn join_address(
    map: &mut Map<String, Value>,
    (host_key, port_key): (&str, &str),
    flag_key: &str,
    default_port: u16,
) -> Result<(), CapiError> {
    let (host, port) = (map.remove(host_key), map.remove(port_key));
    if host.is_none() && port.is_none() {
        return Ok(());
    }
    if map.contains_key(flag_key) {
        return Err(CapiError::Config {
            role: "proxy",
            message: format!("give {flag_key} or {host_key}/{port_key}, not both"),
        });
    }
    let text = |key: &str, v: Option<Value>| match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(CapiError::Config {
            role: "proxy",
            message: format!("{key}: expected a string, got {other}"),
        }),
    };
    let host = text(host_key, host)?.unwrap_or_else(|| "127.0.0.1".to_owned());
    let port = match text(port_key, port)? {
        None => default_port,
        Some(p) => p.trim().parse().map_err(|_| CapiError::Config {
            role: "proxy",
            message: format!("{port_key}: {p:?} is not a port (0 to 65535)"),
        })?,
    };
    let joined = taskd_core::env::host_port(&host, port);
    map.insert(flag_key.to_owned(), Value::String(joined));
    Ok(())
}

/// The proxy's flags from its JSON configuration: `taskd proxy`'s flags, or the reference's
/// `UpstreamAddr`/`UpstreamPort` (the manager), `ListenAddr`/`ListenPort`, `ServerRank`.
pub fn proxy_args(json: &str) -> Result<ProxyArgs, CapiError> {
    let mut map = config::object("proxy", json)?;
    join_address(
        &mut map,
        ("UpstreamAddr", "UpstreamPort"),
        "manager",
        DEFAULT_MANAGER_PORT,
    )?;
    join_address(
        &mut map,
        ("ListenAddr", "ListenPort"),
        "listen",
        DEFAULT_PROXY_PORT,
    )?;
    let cmd = ProxyCmd::command();
    let argv = config::to_args("proxy", &cmd, &map, &KEYS)?;
    let parsed =
        ProxyCmd::try_parse_from(argv).map_err(|e| config::parse_error("proxy", &cmd, &e))?;
    Ok(parsed.args)
}

/// Checks a proxy configuration without starting anything.
pub fn check(json: &str) -> Result<(), CapiError> {
    proxy_args(json)?
        .config()
        .map(drop)
        .map_err(|e| crate::config_error("proxy", e))
}

/// Which node the manager made this proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The node's name.
    pub node: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
}

#[derive(Default)]
struct ProxyState {
    assigned: Option<Result<Assignment, String>>,
    stopped: Option<String>,
    /// The manager's orders for the node's launcher, oldest first, until taken.
    orders: VecDeque<LauncherOrder>,
    /// Where the launcher's reports of ended workers go, once the node is admitted.
    exits: Option<Recipient<WorkerExited>>,
}

/// An order of the manager for the node's launcher, as the host process reads it
/// (`taskd_proxy_next_order`'s JSON).
pub fn order_json(o: &LauncherOrder) -> String {
    let v = match o {
        LauncherOrder::Restart { number, reason } => {
            serde_json::json!({"order": "restart", "number": number, "reason": reason})
        }
        LauncherOrder::End { reason } => serde_json::json!({"order": "end", "reason": reason}),
    };
    v.to_string()
}

/// A running proxy. Every method may be called from any thread, concurrently.
pub struct EmbeddedProxy {
    addr: SocketAddr,
    state: Arc<Shared<ProxyState>>,
    role: RoleThread,
    _metrics: Option<MetricsServer>,
}

impl EmbeddedProxy {
    /// Starts the proxy of the configuration `json`; returns once it listens for its
    /// workers. It joins the manager in the background, retrying until it is there.
    pub fn start(json: &str) -> Result<EmbeddedProxy, CapiError> {
        crate::init_logging();
        let args = proxy_args(json)?;
        let mut cfg = args.config().map_err(|e| crate::config_error("proxy", e))?;
        let metrics = args
            .serve_metrics()
            .map_err(|e| crate::config_error("proxy", e))?;
        let state = Arc::new(Shared::new(ProxyState::default()));
        let ordered = state.clone();
        cfg.launcher = Some(Arc::new(move |o: LauncherOrder| {
            ordered.update(|s| s.orders.push_back(o));
        }));
        let (admitted, stopped) = (state.clone(), state.clone());
        let (role, addr) = RoleThread::spawn(
            "proxy",
            move |start| run(cfg, start, admitted),
            move |why| stopped.update(|s| s.stopped = Some(why)),
        )?;
        Ok(EmbeddedProxy {
            addr,
            state,
            role,
            _metrics: metrics,
        })
    }

    /// Where the node's workers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the manager admitted this proxy (which node it is), refused it for good,
    /// the proxy stopped, or `timeout` passed.
    pub fn wait_registered(&self, timeout: Option<Duration>) -> Result<Assignment, CapiError> {
        let r = self
            .state
            .wait_for(timeout, |s| match (&s.assigned, &s.stopped) {
                (Some(Ok(a)), _) => Some(Ok(a.clone())),
                (Some(Err(why)), _) => Some(Err(CapiError::Refused(why.clone()))),
                (None, Some(why)) => Some(Err(CapiError::Stopped(why.clone()))),
                (None, None) => None,
            });
        r.unwrap_or(Err(CapiError::Timeout(
            timeout.unwrap_or_default(),
            "the manager to admit the proxy",
        )))
    }

    /// The manager's next order for the node's launcher (taskd's agent), waiting at most
    /// `timeout` for one: a restart of every worker of the node as restart `n` of the job, or
    /// the end of the job. Each order is handed out once.
    pub fn next_order(&self, timeout: Option<Duration>) -> Result<LauncherOrder, CapiError> {
        let r = self.state.wait_for(timeout, |s| {
            if let Some(o) = s.orders.front() {
                return Some(Ok(o.clone()));
            }
            s.stopped.clone().map(|why| Err(CapiError::Stopped(why)))
        });
        match r {
            Some(Ok(o)) => {
                self.state.update(|s| {
                    s.orders.pop_front();
                });
                Ok(o)
            }
            Some(Err(e)) => Err(e),
            None => Err(CapiError::Timeout(
                timeout.unwrap_or_default(),
                "an order of the manager for the launcher",
            )),
        }
    }

    /// The launcher saw the process of `rank` end (`status`, for people; `clean`: exit
    /// status 0), started for restart `generation` of the job: the manager learns it even of
    /// a worker that never registered. Refused before the manager admitted the node.
    pub fn worker_exited(
        &self,
        rank: u32,
        status: &str,
        clean: bool,
        generation: u32,
    ) -> Result<(), CapiError> {
        let exits = self.state.read(|s| s.exits.clone()).ok_or_else(|| {
            CapiError::Refused("the manager has not admitted this proxy yet".into())
        })?;
        exits
            .try_send(WorkerExited {
                rank: GlobalRank(rank),
                status: status.to_owned(),
                clean,
                generation,
            })
            .map_err(|e| CapiError::Stopped(format!("the proxy is gone: {e}")))
    }

    /// Stops the proxy (its workers and the manager are told it is leaving, with `reason`)
    /// and waits until it has.
    pub fn stop(&self, reason: &str) {
        self.role.request_stop(reason);
        self.state.wait_for(None, |s| s.stopped.clone());
    }
}

/// The proxy's thread: start, announce, follow its admission, wait to be stopped, shut down.
async fn run(
    cfg: ProxyNodeConfig,
    mut start: RoleStart<SocketAddr>,
    state: Arc<Shared<ProxyState>>,
) -> String {
    let proxy = match ProxyNode::spawn(cfg).await {
        Ok(p) => Rc::new(p),
        Err(e) => {
            let _ = start.started.send(Err(CapiError::Start {
                role: "proxy",
                message: e.to_string(),
            }));
            return e.to_string();
        }
    };
    let _ = start.started.send(Ok(proxy.local_addr()));
    let watched = proxy.clone();
    let admission = actix_rt::spawn(async move {
        let r = watched.assigned().await;
        let r = r
            .map(|n| Assignment {
                node: n.node.0.clone(),
                ranks: n.ranks.keys().map(|r| r.0).collect(),
            })
            .map_err(|e| e.to_string());
        let exits = watched.exits();
        state.update(|s| {
            s.assigned = Some(r);
            s.exits = exits;
        });
    });
    let reason = stop_requested(&mut start.stop, None).await;
    admission.abort();
    let _ = admission.await;
    match Rc::try_unwrap(proxy) {
        Ok(p) => {
            p.shutdown(&format!("the proxy was stopped ({reason})"))
                .await
        }
        Err(_) => tracing::error!("the proxy is still in use; it stops with its thread"),
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_keys_name_the_manager_the_port_and_the_node() {
        let a = proxy_args(
            r#"{"job_id": "j", "UpstreamAddr": "fd00::1", "UpstreamPort": "9700",
                "ListenAddr": "127.0.0.1", "ListenPort": "0", "ServerRank": "1"}"#,
        )
        .unwrap();
        let cfg = a.config().unwrap();
        assert_eq!(cfg.manager, "[fd00::1]:9700");
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:0");
        assert_eq!(cfg.node_rank, Some(1));
        let a = proxy_args(r#"{"job_id": "j", "UpstreamPort": 9800, "node_rank": 0}"#).unwrap();
        let cfg = a.config().unwrap();
        assert_eq!(cfg.manager, "127.0.0.1:9800");
        assert_eq!(cfg.listen.port(), DEFAULT_PROXY_PORT);
    }

    #[test]
    fn bad_values_are_named() {
        let e = check(r#"{"job_id": "j", "UpstreamPort": "http", "node_rank": 0}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "proxy configuration: UpstreamPort: \"http\" is not a port (0 to 65535)"
        );
        let e = check(r#"{"job_id": "j", "manager": "m:1", "ServerRank": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("'x' for 'node_rank"), "{e}");
        let e = check(r#"{"job_id": "j", "manager": "m:1", "node_rank": 0, "UpstreamAddr": "n"}"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "proxy configuration: give manager or UpstreamAddr/UpstreamPort, not both"
        );
    }
}
