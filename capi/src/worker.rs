//! The worker inside a training process: [`taskd_actors::RemoteWorker`] over a
//! [`FrameworkHal`], configured by a JSON object, with the step gate the training loop calls.

use crate::config::{self, Keys};
use crate::error::CapiError;
use crate::framework::{self, FrameworkHal, FrameworkSwitch};
use crate::state::Shared;
use clap::{CommandFactory, Parser, ValueEnum};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use taskd_actors::net::{ClientState, RemoteWorker, RemoteWorkerConfig, WorkerRegistration};
use taskd_actors::telemetry::MetricsServer;
use taskd_actors::StepGate;
use taskd_core::env::process_env;
use taskd_core::{GlobalRank, StepOutcome, SwitchCapabilities};
use taskd_roles::WorkerArgs;
use tokio::sync::watch;

/// The communication library a framework's switch function moves: what the rank's switch
/// needs of its process, and so what its registration says it lacks. The one value that picks
/// an embedded worker's backend (the key `backend`; the Python package sets it from the switch
/// function's entry, `taskd/python/framework/spec.py`).
///
/// A new backend is a value here with its check ([`SwitchBackend::capabilities`]), and a switch
/// function naming it in the framework registry (docs/hal.md, "Adding a backend").
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SwitchBackend {
    /// HCCL communicators (MindSpore's and torch_npu's functions; the default): HCCL's L2 retry
    /// and RDMA links, read from the environment as `AscendRankHal` reads them.
    Hccl,
    /// Gloo process groups (taskd's own Gloo switch rebuilds them on the other NIC): nothing
    /// the worker can check.
    Gloo,
}

impl SwitchBackend {
    /// The value's name, as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SwitchBackend::Hccl => "hccl",
            SwitchBackend::Gloo => "gloo",
        }
    }

    /// What a rank of this backend lacks for a switch, from this process's environment.
    pub fn capabilities(self) -> SwitchCapabilities {
        match self {
            SwitchBackend::Hccl => {
                taskd_hal_ascend::rank::capabilities_from_env(&process_env).capabilities()
            }
            SwitchBackend::Gloo => SwitchCapabilities::ALL,
        }
    }
}

/// An embedded worker's settings: the keys of its JSON configuration are the flags of a
/// worker ([`WorkerArgs`], the same as `taskd worker`'s but for the simulated rank's), and
/// `backend`.
#[derive(Parser)]
#[command(name = "worker", no_binary_name = true)]
pub struct WorkerOptions {
    #[command(flatten)]
    args: WorkerArgs,
    /// The communication library the switch function moves: hccl (the default: MindSpore's
    /// and torch_npu's functions) or gloo (taskd's Gloo switch). Deprecated spelling, still
    /// read: `"hccl": false` for `"backend": "gloo"`.
    #[arg(long, value_enum, value_name = "BACKEND")]
    backend: Option<SwitchBackend>,
    /// Deprecated: `false` is `backend` gloo, `true` is hccl.
    #[arg(long, hide = true, action = clap::ArgAction::Set)]
    hccl: Option<bool>,
}

impl WorkerOptions {
    /// The settings of the JSON configuration `json`.
    pub fn parse(json: &str) -> Result<WorkerOptions, CapiError> {
        let map = config::object("worker", json)?;
        let cmd = WorkerOptions::command();
        let no_reference_keys = Keys {
            renamed: &[],
            ignored: &[],
        };
        let argv = config::to_args("worker", &cmd, &map, &no_reference_keys)?;
        let opts = WorkerOptions::try_parse_from(argv)
            .map_err(|e| config::parse_error("worker", &cmd, &e))?;
        opts.backend()?;
        Ok(opts)
    }

    /// The backend `backend` names, or its deprecated spelling (`hccl`); HCCL when neither. The
    /// two saying different things is refused.
    pub fn backend(&self) -> Result<SwitchBackend, CapiError> {
        let old = self.hccl.map(|moves_hccl| {
            if moves_hccl {
                SwitchBackend::Hccl
            } else {
                SwitchBackend::Gloo
            }
        });
        match (self.backend, old) {
            (Some(b), Some(o)) if b != o => Err(CapiError::Config {
                role: "worker",
                message: format!(
                    "backend {:?} and hccl {} (deprecated: backend {:?}) disagree; give backend \
                     alone",
                    b.as_str(),
                    self.hccl == Some(true),
                    o.as_str()
                ),
            }),
            (b, o) => Ok(b.or(o).unwrap_or(SwitchBackend::Hccl)),
        }
    }

    /// What this rank's switch lacks in its process: its backend's check
    /// ([`SwitchBackend::capabilities`]).
    fn capabilities(&self) -> Result<SwitchCapabilities, CapiError> {
        Ok(self.backend()?.capabilities())
    }

    /// The worker's configuration, or why these settings cannot run.
    pub fn config(&self) -> Result<RemoteWorkerConfig, CapiError> {
        self.args
            .config()
            .map_err(|e| crate::config_error("worker", e))
    }
}

/// Checks a worker configuration without starting anything.
pub fn check(json: &str) -> Result<(), CapiError> {
    WorkerOptions::parse(json)?.config().map(drop)
}

type Registrations = watch::Receiver<Option<WorkerRegistration>>;

/// A running worker. [`EmbeddedWorker::step_completed`] is for the training thread; every
/// other method may be called from any thread, concurrently with it.
pub struct EmbeddedWorker {
    rank: GlobalRank,
    gate: Arc<StepGate>,
    watches: (Registrations, watch::Receiver<ClientState>),
    stopping: watch::Sender<bool>,
    worker: Mutex<Option<RemoteWorker>>,
    _metrics: Option<MetricsServer>,
}

impl EmbeddedWorker {
    /// Starts the worker of the configuration `json`, switching through `switch`. Returns at
    /// once; the worker connects to its proxy in the background (with retries), and the gate
    /// lets every step pass until an operation arms it.
    pub fn start(
        json: &str,
        switch: Box<dyn FrameworkSwitch>,
    ) -> Result<EmbeddedWorker, CapiError> {
        crate::init_logging();
        let opts = WorkerOptions::parse(json)?;
        let cfg = opts.config()?;
        let metrics = opts
            .args
            .serve_metrics()
            .map_err(|e| crate::config_error("worker", e))?;
        let rank = cfg.rank;
        let caps = opts.capabilities()?;
        // The HAL asks for the job's size only for a directive, which comes after the
        // registration; the registration's channel exists once the worker has started.
        let handoff: Arc<Shared<Option<Registrations>>> = Arc::new(Shared::new(None));
        let source = handoff.clone();
        let world = Box::new(move || {
            let reg = source.wait_for(None, Clone::clone)?;
            let size = reg.borrow().as_ref().map(|r| r.world_size);
            size
        });
        // The framework's function runs on the training thread held at the gate, which
        // exists once the worker has started.
        let gate_slot = Arc::new(OnceLock::new());
        let run = framework::on_training_thread(gate_slot.clone());
        let slot = gate_slot.clone();
        let hal = FrameworkHal::new(switch, run, world, caps).with_in_flight(Box::new(move || {
            slot.get()
                .and_then(|g: &Arc<taskd_actors::StepGate>| g.in_flight())
        }));
        let worker = RemoteWorker::start(cfg, Box::new(hal)).map_err(|e| CapiError::Start {
            role: "worker",
            message: e.to_string(),
        })?;
        let _ = gate_slot.set(worker.gate());
        let watches = worker.watch();
        handoff.update(|h| *h = Some(watches.0.clone()));
        tracing::info!(rank = rank.0, node_rank = ?opts.args.node_rank, proxy = %opts.args.proxy, "embedded worker started");
        Ok(EmbeddedWorker {
            rank,
            gate: worker.gate(),
            watches,
            stopping: watch::channel(false).0,
            worker: Mutex::new(Some(worker)),
            _metrics: metrics,
        })
    }

    /// This worker's global rank.
    pub fn rank(&self) -> GlobalRank {
        self.rank
    }

    /// The training loop completed `step`: returns at once unless an operation holds the rank
    /// here (while it holds, the framework's switch function runs on this thread, inside this
    /// call). [`StepOutcome::Stop`] once the manager stopped training. One training thread
    /// calls it.
    #[inline]
    pub fn step_completed(&self, step: u64) -> StepOutcome {
        self.gate.step_completed(step)
    }

    /// Registers the process's in-flight side (see [`crate::in_flight`]); `false` when one
    /// was registered already.
    pub fn set_in_flight(&self, call: crate::in_flight::InFlightCall) -> bool {
        let f = crate::in_flight::CallbackInFlight::new(call);
        self.gate.set_in_flight(Arc::new(f))
    }

    /// Waits until the proxy admitted this rank, refused it for good, the worker stopped, or
    /// `timeout` passed.
    pub fn wait_registered(
        &self,
        timeout: Option<Duration>,
    ) -> Result<WorkerRegistration, CapiError> {
        let (mut reg, mut conn) = self.watches.clone();
        let mut stopping = self.stopping.subscribe();
        let wait = async move {
            loop {
                if let Some(r) = reg.borrow_and_update().clone() {
                    return Ok(r);
                }
                if let ClientState::Refused(why) = &*conn.borrow_and_update() {
                    return Err(CapiError::Refused(why.clone()));
                }
                if *stopping.borrow_and_update() {
                    return Err(CapiError::Stopped("the worker was stopped".into()));
                }
                let gone = tokio::select! {
                    r = reg.changed() => r.is_err(),
                    r = conn.changed() => r.is_err(),
                    r = stopping.changed() => r.is_err(),
                };
                if gone {
                    return Err(CapiError::Stopped("the worker stopped".into()));
                }
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| CapiError::Stopped(format!("cannot wait: {e}")))?;
        rt.block_on(async {
            match timeout {
                None => wait.await,
                Some(t) => tokio::time::timeout(t, wait)
                    .await
                    .unwrap_or(Err(CapiError::Timeout(t, "the proxy to admit the worker"))),
            }
        })
    }

    /// Waits until the job is whole: the manager has every rank of the job registered and has
    /// asked this one in a verification round ([`StepGate::wait_job_whole`]). For a training
    /// loop before its first step, so that a restarted rank does not run its first collective
    /// ahead of peers still starting.
    pub fn wait_job_whole(&self, timeout: Option<Duration>) -> Result<(), CapiError> {
        if self.gate.wait_job_whole(timeout) {
            return Ok(());
        }
        if *self.stopping.borrow() || self.gate.stopped().is_some() {
            return Err(CapiError::Stopped("the worker was stopped".into()));
        }
        Err(CapiError::Timeout(
            timeout.unwrap_or_default(),
            "every rank of the job to register",
        ))
    }

    /// Stops the worker: the gate opens for good (a training thread held in it returns), the
    /// proxy is told the rank is leaving (`reason`), and the worker's threads end. Later calls
    /// of [`EmbeddedWorker::step_completed`] return at once.
    pub fn stop(&self, reason: &str) {
        self.stopping.send_replace(true);
        if let Some(w) = self.worker.lock().take() {
            w.stop_with(reason);
        }
    }
}

impl Drop for EmbeddedWorker {
    fn drop(&mut self) {
        self.stop("the training process freed its worker");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_their_defaults() {
        let o = WorkerOptions::parse(
            r#"{"job_id": "j", "rank": 3, "proxy": "[fd00::2]:9602", "node_rank": 1, "tsp": true}"#,
        )
        .unwrap();
        let c = o.config().unwrap();
        assert_eq!(
            (c.rank, c.proxy.as_str(), c.tsp),
            (GlobalRank(3), "[fd00::2]:9602", true)
        );
        let e = check(r#"{"job_id": "j"}"#).unwrap_err();
        assert!(e.to_string().contains("rank"), "{e}");
        let e = check(r#"{"job_id": "j", "rank": 0, "proxy": "nowhere"}"#).unwrap_err();
        assert!(e.to_string().contains("'nowhere' for 'proxy"), "{e}");
        let e = check(r#"{"job_id": "j", "rank": -1}"#).unwrap_err();
        assert!(e.to_string().contains("'-1' for 'rank"), "{e}");
    }

    #[test]
    fn a_switch_that_moves_no_hccl_communicator_needs_nothing_of_hccls() {
        let env = taskd_hal_ascend::rank::capabilities_from_env(&process_env).capabilities();
        let caps = |json: &str| WorkerOptions::parse(json).unwrap().capabilities().unwrap();
        assert_eq!(
            caps(r#"{"job_id": "j", "rank": 0}"#),
            env,
            "by default what the environment says"
        );
        assert_eq!(
            caps(r#"{"job_id": "j", "rank": 0, "backend": "hccl"}"#),
            env
        );
        assert_eq!(
            caps(r#"{"job_id": "j", "rank": 0, "backend": "gloo"}"#),
            SwitchCapabilities::ALL
        );
        let e = check(r#"{"job_id": "j", "rank": 0, "backend": "nccl"}"#).unwrap_err();
        assert!(e.to_string().contains("hccl, gloo"), "{e}");
        // The deprecated boolean still reads, as the value it stands for.
        assert_eq!(
            caps(r#"{"job_id": "j", "rank": 0, "hccl": false}"#),
            SwitchCapabilities::ALL
        );
        assert_eq!(caps(r#"{"job_id": "j", "rank": 0, "hccl": true}"#), env);
        assert_eq!(
            caps(r#"{"job_id": "j", "rank": 0, "hccl": false, "backend": "gloo"}"#),
            SwitchCapabilities::ALL
        );
        let e =
            check(r#"{"job_id": "j", "rank": 0, "hccl": false, "backend": "hccl"}"#).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
        assert!(check(r#"{"job_id": "j", "rank": 0, "hccl": "no"}"#).is_err());
    }
}
