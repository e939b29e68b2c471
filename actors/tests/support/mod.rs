//! What the network tests share: a proxy, a rank in its own training loop behind a
//! [`RemoteWorker`], a control client. Each test crate uses part of it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use taskd_actors::control::{ControlClient, ControlServer};
use taskd_actors::net::proxy_node::NodeAssignment;
use taskd_actors::net::{NetConfig, ProxyNode, ProxyNodeConfig, RemoteWorker, RemoteWorkerConfig};
use taskd_actors::StepGate;
use taskd_core::command::Target;
use taskd_core::{DeviceId, GlobalRank, JobId, NodeHal, NodeName, StepBoundary, SwitchCommand};
use taskd_hal_mock::{SoloLayout, SoloNodeHal, SoloRank, SoloTraining, SoloTrainingOptions};

/// One simulated rank: its HAL's view, its worker and its training loop (2 ms a step, on the
/// job's clock origin).
pub(crate) struct Rank {
    pub(crate) solo: SoloRank,
    pub(crate) worker: RemoteWorker,
    pub(crate) training: SoloTraining,
}

/// Rank `rank` of `job` in `layout`, registered through the proxy at `proxy`, training.
pub(crate) fn start_rank(
    job: &str,
    rank: u32,
    proxy: &str,
    layout: SoloLayout,
    net: NetConfig,
) -> Rank {
    let solo = SoloRank::new(layout, GlobalRank(rank)).unwrap();
    let mut cfg = RemoteWorkerConfig::new(JobId(job.into()), GlobalRank(rank), proxy);
    cfg.tsp = true;
    cfg.net = net;
    let worker = RemoteWorker::start(cfg, Box::new(solo.hal())).unwrap();
    let reg = worker.wait_registered(Duration::from_secs(30)).unwrap();
    let gate: Arc<StepGate> = worker.gate();
    let training = SoloTraining::start(
        solo.clone(),
        gate as Arc<dyn StepBoundary>,
        SoloTrainingOptions {
            step_time: Duration::from_millis(2),
            epoch: Some(std::time::UNIX_EPOCH + Duration::from_millis(reg.job_epoch_unix_ms)),
        },
    );
    Rank {
        solo,
        worker,
        training,
    }
}

impl Rank {
    /// Ends training, then the worker.
    pub(crate) fn stop(self) {
        self.worker.gate().shutdown();
        self.training.stop();
        self.worker.stop();
    }
}

/// A client of the control API `ctl` on a runtime of its own, once every worker of `job` is
/// registered.
pub(crate) fn control_when_registered(
    ctl: &ControlServer,
    job: &str,
) -> (tokio::runtime::Runtime, ControlClient) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut control = rt
        .block_on(ControlClient::connect(&ctl.local_addr().to_string(), None))
        .unwrap();
    rt.block_on(control.wait_registered(job, None)).unwrap();
    (rt, control)
}

/// The proxy of node rank `node_rank` of `job` (every link up), registered with the manager at
/// `manager`.
pub(crate) async fn spawn_proxy(
    job: &str,
    manager: String,
    node_rank: u32,
    net: NetConfig,
) -> ProxyNode {
    let hal = |a: &NodeAssignment| -> Box<dyn NodeHal> {
        Box::new(SoloNodeHal::new(a.ranks.len() as u32))
    };
    let p = ProxyNode::spawn(ProxyNodeConfig {
        node_rank: Some(node_rank),
        listen: "127.0.0.1:0".parse().unwrap(),
        net,
        ..ProxyNodeConfig::new(JobId(job.into()), manager, hal)
    })
    .await
    .unwrap();
    p.assigned().await.unwrap();
    p
}

/// A switch of `job` for one device of `node-0`: to its backup NIC (`use_backup`) or back.
pub(crate) fn switch_on_node_0(job: &str, device: u32, use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(job.into()),
        id: None,
        targets: vec![Target {
            node: NodeName("node-0".into()),
            device: DeviceId(device),
            use_backup,
        }],
    }
}
