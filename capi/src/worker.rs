//! The worker inside a training process: [`taskd_actors::RemoteWorker`] over a
//! [`FrameworkHal`], configured by a JSON object, with the step gate the training loop calls.

use crate::config::{self, Keys};
use crate::error::CapiError;
use crate::framework::{self, FrameworkHal, FrameworkSwitch};
use crate::state::Shared;
use clap::{CommandFactory, Parser};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use taskd_actors::net::{ClientState, RemoteWorker, RemoteWorkerConfig, WorkerRegistration};
use taskd_actors::telemetry::MetricsServer;
use taskd_actors::StepGate;
use taskd_core::env::process_env;
use taskd_core::{GlobalRank, HcclCapabilities, StepOutcome};
use taskd_roles::WorkerArgs;
use tokio::sync::watch;

/// An embedded worker's settings: the keys of its JSON configuration are the flags of a
/// worker ([`WorkerArgs`], the same as `taskd worker`'s but for the simulated rank's).
#[derive(Parser)]
#[command(name = "worker", no_binary_name = true)]
pub struct WorkerOptions {
    #[command(flatten)]
    args: WorkerArgs,
    /// The switch function moves HCCL communicators (the default: MindSpore's and torch_npu's),
    /// so HCCL's L2 retry and RDMA links are what the switch needs; `false` for a function that
    /// moves no HCCL communicator (taskd's Gloo switch), whose rank then needs neither.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    hccl: bool,
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
        WorkerOptions::try_parse_from(argv).map_err(|e| config::parse_error("worker", &cmd, &e))
    }

    /// What this rank's switch needs that its process has: HCCL's L2 retry and RDMA links from
    /// the environment for a function that moves HCCL communicators, nothing of HCCL's for one
    /// that does not (`"hccl": false`).
    fn capabilities(&self) -> HcclCapabilities {
        if self.hccl {
            taskd_hal_ascend::rank::capabilities_from_env(&process_env)
        } else {
            HcclCapabilities::ALL
        }
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
        let caps = opts.capabilities();
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
        let env = taskd_hal_ascend::rank::capabilities_from_env(&process_env);
        let hccl = WorkerOptions::parse(r#"{"job_id": "j", "rank": 0}"#).unwrap();
        assert_eq!(
            hccl.capabilities(),
            env,
            "by default what the environment says"
        );
        let gloo = WorkerOptions::parse(r#"{"job_id": "j", "rank": 0, "hccl": false}"#).unwrap();
        assert_eq!(gloo.capabilities(), HcclCapabilities::ALL);
        assert!(check(r#"{"job_id": "j", "rank": 0, "hccl": "no"}"#).is_err());
    }
}
