//! The job's manager inside a host process (the reference's `manager.py`): what
//! `taskd manager` runs, configured by a JSON object, on a thread of its own.

use crate::config::{self, Keys};
use crate::error::CapiError;
use crate::role::{stop_requested, RoleStart, RoleThread};
use crate::state::Shared;
use actix::Addr;
use clap::{CommandFactory, Parser};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use taskd_actors::manager::{AwaitRegistered, LastWordsHost, Manager, ReportFault, SetLastWords};
use taskd_actors::process::{ManagerProcess, ManagerProcessConfig, ShutdownSignals};
use taskd_actors::telemetry::MetricsServer;
use taskd_core::env::{TASKD_CONTROL_ADDR, TASKD_MANAGER_LISTEN};
use taskd_core::GlobalRank;
use taskd_roles::ManagerArgs;

#[derive(Parser)]
#[command(name = "manager", no_binary_name = true)]
struct ManagerCmd {
    #[command(flatten)]
    args: ManagerArgs,
}

/// The reference's keys: `node_nums` and `proc_per_node` are `--nodes` and
/// `--procs-per-node`, `fault_recover: "on"` is `--process-recovery` (below); the rest
/// configure what taskd does not do.
const KEYS: Keys<'static> = Keys {
    renamed: &[("node_nums", "nodes"), ("proc_per_node", "procs_per_node")],
    ignored: &["plugin_dir", "taskd_enable", "cluster_infos"],
};

/// The manager's flags from its JSON configuration. A missing `control_addr` or `listen` is
/// taken from `TASKD_CONTROL_ADDR` / `TASKD_MANAGER_LISTEN` when set.
pub fn manager_args(json: &str) -> Result<ManagerArgs, CapiError> {
    let mut map = config::object("manager", json)?;
    // The reference's switch for process recovery, "on" or "off".
    match map.remove("fault_recover") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if v.trim().eq_ignore_ascii_case("on") => {
            map.insert("process_recovery".into(), Value::Bool(true));
        }
        Some(Value::String(v)) if v.trim().eq_ignore_ascii_case("off") => {}
        Some(other) => {
            return Err(CapiError::Config {
                role: "manager",
                message: format!("fault_recover: expected \"on\" or \"off\", got {other}"),
            })
        }
    }
    for (key, var) in [
        ("control_addr", TASKD_CONTROL_ADDR),
        ("listen", TASKD_MANAGER_LISTEN),
    ] {
        if !map.contains_key(key) {
            // `off`: not served (the control API's switch in a host's environment).
            if let Some(v) = config::env_value(var).filter(|v| !v.eq_ignore_ascii_case("off")) {
                map.insert(key.to_owned(), Value::String(v));
            }
        }
    }
    let cmd = ManagerCmd::command();
    let argv = config::to_args("manager", &cmd, &map, &KEYS)?;
    let parsed =
        ManagerCmd::try_parse_from(argv).map_err(|e| config::parse_error("manager", &cmd, &e))?;
    Ok(parsed.args)
}

/// Checks a manager configuration without starting anything.
pub fn check(json: &str) -> Result<(), CapiError> {
    manager_args(json)?
        .config()
        .map(drop)
        .map_err(|e| crate::config_error("manager", e))
}

/// Where a running manager listens, and for what job.
#[derive(Clone, Debug)]
pub struct ManagerInfo {
    /// The proxies' port.
    pub listen: SocketAddr,
    /// The operators' control API, when served.
    pub control: Option<SocketAddr>,
    /// The job.
    pub job: String,
    /// Nodes and ranks of the job.
    pub nodes: usize,
    /// Ranks of the job.
    pub ranks: usize,
}

#[derive(Default)]
struct ManagerState {
    /// Every worker registered and the job verified (once).
    ready: bool,
    /// Why it stopped, once it has.
    stopped: Option<String>,
    /// The manager actor, once it runs.
    actor: Option<Addr<Manager>>,
}

/// A running manager. Every method may be called from any thread, concurrently.
pub struct EmbeddedManager {
    info: ManagerInfo,
    state: Arc<Shared<ManagerState>>,
    role: RoleThread,
    _metrics: Option<MetricsServer>,
}

impl EmbeddedManager {
    /// Starts the manager of the configuration `json` and returns once it listens. With
    /// `signals`, SIGINT, SIGTERM and SIGHUP stop it (as they stop `taskd manager`) instead of
    /// the process.
    pub fn start(json: &str, signals: bool) -> Result<EmbeddedManager, CapiError> {
        crate::init_logging();
        let args = manager_args(json)?;
        let cfg = args
            .config()
            .map_err(|e| crate::config_error("manager", e))?;
        let metrics = args
            .serve_metrics()
            .map_err(|e| crate::config_error("manager", e))?;
        let state = Arc::new(Shared::new(ManagerState::default()));
        let (ready, stopped) = (state.clone(), state.clone());
        let (role, info) = RoleThread::spawn(
            "manager",
            move |start| run(cfg, signals, start, ready),
            move |why| stopped.update(|s| s.stopped = Some(why)),
        )?;
        Ok(EmbeddedManager {
            info,
            state,
            role,
            _metrics: metrics,
        })
    }

    /// Where it listens, and for what job.
    pub fn info(&self) -> &ManagerInfo {
        &self.info
    }

    /// Waits until every expected worker has registered and the job's NIC configuration is
    /// verified (switches are accepted from then on), the manager stops, or `timeout` passes.
    pub fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), CapiError> {
        let r = self.state.wait_for(timeout, |s| {
            if s.ready {
                Some(Ok(()))
            } else {
                s.stopped.clone().map(|why| Err(CapiError::Stopped(why)))
            }
        });
        r.unwrap_or(Err(CapiError::Timeout(
            timeout.unwrap_or_default(),
            "every worker to register",
        )))
    }

    /// Waits until the manager stopped (a signal, [`EmbeddedManager::stop`]) and says why.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<String, CapiError> {
        self.state
            .wait_for(timeout, |s| s.stopped.clone())
            .ok_or(CapiError::Timeout(
                timeout.unwrap_or_default(),
                "the manager to stop",
            ))
    }

    /// Asks `host` for a last-words checkpoint before every stop of training, each within
    /// `within` (see [`LastWordsHost`]).
    pub fn set_last_words(
        &self,
        host: Arc<dyn LastWordsHost>,
        within: Duration,
    ) -> Result<(), CapiError> {
        self.actor()?
            .try_send(SetLastWords { host, within })
            .map_err(|e| CapiError::Stopped(format!("the manager is gone: {e}")))
    }

    /// The process of `rank` died, as something outside taskd's transport saw it (MindIO's
    /// own fault detection): the same as a lost worker.
    pub fn report_fault(&self, rank: u32, why: &str) -> Result<(), CapiError> {
        self.actor()?
            .try_send(ReportFault {
                rank: GlobalRank(rank),
                why: why.to_owned(),
            })
            .map_err(|e| CapiError::Stopped(format!("the manager is gone: {e}")))
    }

    fn actor(&self) -> Result<Addr<Manager>, CapiError> {
        self.state.read(|s| match (&s.actor, &s.stopped) {
            (_, Some(why)) => Err(CapiError::Stopped(why.clone())),
            (Some(a), None) => Ok(a.clone()),
            (None, None) => Err(CapiError::Stopped("the manager has not started".into())),
        })
    }

    /// Asks the manager to stop (it ends the operation in flight safely first); returns at
    /// once. [`EmbeddedManager::wait`] waits for the end.
    pub fn stop(&self, reason: &str) {
        self.role.request_stop(reason);
    }
}

/// The manager's thread: start, announce, wait to be stopped, shut down. Returns why it
/// stopped.
async fn run(
    cfg: ManagerProcessConfig,
    want_signals: bool,
    mut start: RoleStart<ManagerInfo>,
    state: Arc<Shared<ManagerState>>,
) -> String {
    let fail = |message: String| {
        let _ = start.started.send(Err(CapiError::Start {
            role: "manager",
            message: message.clone(),
        }));
        message
    };
    // Installed before the manager starts, so that an early signal is not lost.
    let mut signals = match want_signals.then(ShutdownSignals::install).transpose() {
        Ok(s) => s,
        Err(e) => return fail(e.to_string()),
    };
    let (job, nodes, ranks) = (
        cfg.node.job.0.clone(),
        cfg.node.table.nodes().len(),
        cfg.node.table.world_size(),
    );
    let manager = match ManagerProcess::start(cfg).await {
        Ok(m) => m,
        Err(e) => return fail(e.to_string()),
    };
    let info = ManagerInfo {
        listen: manager.local_addr(),
        control: manager.control_addr(),
        job,
        nodes,
        ranks,
    };
    tracing::info!(listen = %info.listen, job = %info.job, "embedded manager listening");
    // Before the start is answered: a host may call the actor (its last-words host) at once.
    let actor = manager.node().manager().clone();
    state.update(|s| s.actor = Some(actor.clone()));
    let _ = start.started.send(Ok(info));
    actix_rt::spawn(async move {
        if actor.send(AwaitRegistered(None)).await.is_ok() {
            state.update(|s| s.ready = true);
        }
    });
    let reason = stop_requested(&mut start.stop, signals.as_mut()).await;
    tracing::info!(%reason, "embedded manager stopping");
    manager.shutdown().await;
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_keys_and_every_flag_are_accepted() {
        let a = manager_args(
            r#"{"job_id": "j", "node_nums": 2, "proc_per_node": 4, "plugin_dir": "/p",
                "fault_recover": "on", "taskd_enable": "on", "cluster_infos": [],
                "listen": "127.0.0.1:0", "switch_timeout_ms": 1500, "heartbeat_ms": 100}"#,
        )
        .unwrap();
        let cfg = a.config().unwrap();
        assert_eq!(cfg.node.job.0, "j");
        assert_eq!(cfg.node.table.world_size(), 8);
        assert_eq!(cfg.node.deadlines.switch, Duration::from_millis(1500));
        assert_eq!(cfg.node.net.heartbeat_interval, Duration::from_millis(100));
        assert!(cfg.control.is_none());
    }

    #[test]
    fn clusterd_and_automatic_failover_are_keys_too() {
        let a = manager_args(
            r#"{"job_id": "j", "nodes": 1, "procs_per_node": 1, "clusterd": "10.0.0.9:8899"}"#,
        )
        .unwrap();
        let cfg = a.config().unwrap();
        assert_eq!(
            cfg.clusterd.expect("a ClusterD client").addr,
            "10.0.0.9:8899"
        );
        let a = manager_args(
            r#"{"job_id": "j", "nodes": 1, "procs_per_node": 1, "no_clusterd": true,
                "auto_failover": true, "link_probe_ms": 500}"#,
        )
        .unwrap();
        let cfg = a.config().unwrap();
        assert!(cfg.clusterd.is_none());
        let auto = cfg.auto.expect("automatic failover on");
        assert_eq!(auto.link_probe, Duration::from_millis(500));
        // Both at once is refused, as on the command line.
        let e = check(
            r#"{"job_id": "j", "nodes": 1, "procs_per_node": 1, "clusterd": "10.0.0.9:8899",
                "auto_failover": true}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("ClusterD client mode"), "{e}");
    }

    #[test]
    fn bad_values_are_named_by_key() {
        let e = check(r#"{"job_id": "j", "node_nums": 2, "proc_per_node": 0}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("invalid value '0' for 'procs_per_node"),
            "{e}"
        );
        let e = check(
            r#"{"job_id": "j", "node_nums": 2, "proc_per_node": 1, "switch_timeout_ms": "soon"}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("'soon' for 'switch_timeout_ms"),
            "{e}"
        );
        let e = check(r#"{"job_id": "", "nodes": 1, "procs_per_node": 1}"#).unwrap_err();
        assert!(e.to_string().contains("job_id"), "{e}");
        let e =
            check(r#"{"job_id": "j", "nodes": 1, "procs_per_node": 1, "help": true}"#).unwrap_err();
        assert!(e.to_string().contains("unknown key \"help\""), "{e}");
    }
}
