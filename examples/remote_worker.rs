//! The worker API in a training process: start a worker for the process's global rank with
//! its HAL, call the step gate after every training step, stop it at the end.
//!
//! Run it alone and it brings its own small job: a manager and a proxy on loopback (what
//! `taskd manager` and `taskd proxy` run), two "training processes" (threads here) with the
//! worker API, and one switch to the backup NIC and back:
//!
//! ```sh
//! cargo run --example remote_worker
//! ```
//!
//! Or join a job started by hand (see docs/operating.md's quick start) as one rank:
//!
//! ```sh
//! TASKD_PROXY=127.0.0.1:9602 RANK=1 MINDX_TASK_ID=demo cargo run --example remote_worker
//! ```
//!
//! In a real training process the HAL is `taskd_hal_ascend::AscendRankHal` over the process's
//! HCCL communicators instead of the simulated `SoloRank`, and the loop is the training loop.

use std::time::Duration;
use taskd::actors::control::{self, ControlClient, ControlConfig};
use taskd::actors::net::proxy_node::NodeAssignment;
use taskd::actors::net::{
    ManagerNode, ManagerNodeConfig, NetConfig, ProxyNode, ProxyNodeConfig, RemoteWorker,
    RemoteWorkerConfig,
};
use taskd::core::command::Target;
use taskd::core::env as env_names;
use taskd::core::{
    DeviceId, GlobalRank, JobId, NodeHal, NodeName, PhaseDeadlines, RankHal, RankTable,
    SwitchCommand,
};
use taskd::hal_mock::{SoloLayout, SoloNodeHal, SoloRank};

/// One training process: the worker API around a training loop.
fn training_process(job: &str, rank: u32, proxy: &str, layout: SoloLayout, steps: u64) {
    // 1. The HAL of this rank (here: one simulated rank; in production: HCCL).
    let solo = SoloRank::new(layout, GlobalRank(rank)).expect("a valid layout");
    let hal: Box<dyn RankHal> = Box::new(solo.hal());
    // 2. Start the worker: it connects to the node's proxy in the background (with retries).
    //    `tsp` comes from MS_ENABLE_TFT; this demo enables it.
    let mut cfg = RemoteWorkerConfig::new(JobId(job.into()), GlobalRank(rank), proxy);
    cfg.tsp = true;
    let worker = RemoteWorker::start(cfg, hal).expect("the worker starts");
    let reg = worker
        .wait_registered(Duration::from_secs(30))
        .expect("registered with the proxy");
    println!(
        "rank {rank}: registered on {} (device {})",
        reg.node, reg.device
    );
    // 3. The training loop calls the gate after every step. With no operation pending this
    //    is one atomic load; during an operation it holds the loop at the agreed step. When
    //    the manager stops training the loop ends, and the process exits with a failure for
    //    its launcher to restart it.
    let gate = worker.gate();
    for step in 1..=steps {
        std::thread::sleep(Duration::from_millis(2)); // the step's compute and collectives
        solo.run_collectives();
        if let taskd::core::StepOutcome::Stop(why) = gate.step_completed(step) {
            eprintln!("rank {rank}: training stopped after step {step}: {why}");
            worker.stop();
            std::process::exit(3);
        }
    }
    // 4. Stop: the gate opens for good and the proxy is told this rank is leaving.
    worker.stop();
    println!(
        "rank {rank}: trained {steps} steps, views agree: {}",
        solo.views_agree()
    );
}

/// A manager (with its control API, as `taskd manager --control-addr` serves it) and the proxy
/// of node-0 for a job of one node with two ranks, on an actix system of their own; the control
/// API's and the proxy's addresses.
fn start_job() -> (std::net::SocketAddr, std::net::SocketAddr) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let manager = ManagerNode::spawn(ManagerNodeConfig {
                job: JobId("demo".into()),
                table: RankTable::uniform(1, 2),
                deadlines: PhaseDeadlines::default(),
                listen: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                net: NetConfig::default(),
            })
            .await
            .expect("the manager starts");
            let hal = |a: &NodeAssignment| -> Box<dyn NodeHal> {
                Box::new(SoloNodeHal::new(a.ranks.len() as u32))
            };
            let addr = manager.local_addr().to_string();
            let proxy = ProxyNode::spawn(ProxyNodeConfig {
                node_rank: Some(0),
                listen: "127.0.0.1:0".parse().unwrap(),
                ..ProxyNodeConfig::new(JobId("demo".into()), addr, hal)
            })
            .await
            .expect("the proxy starts");
            let ctl = control::serve(
                manager.manager().clone(),
                ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId("demo".into())),
            )
            .expect("the control API starts");
            tx.send((ctl.local_addr(), proxy.local_addr())).unwrap();
            std::mem::forget((manager, proxy, ctl)); // they live as long as this process
        });
        sys.run().unwrap();
    });
    rx.recv().unwrap()
}

/// An operator's switch of node-0:1 to its backup NIC and back, through the control API.
fn operate(control_addr: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = ControlClient::connect(control_addr, None)
            .await
            .expect("the manager answers");
        client.wait_registered("demo", None).await.unwrap();
        for use_backup in [true, false] {
            let cmd = SwitchCommand {
                job: JobId("demo".into()),
                id: None,
                targets: vec![Target {
                    node: NodeName("node-0".into()),
                    device: DeviceId(1),
                    use_backup,
                }],
            };
            let result = client.run(&cmd).await.unwrap();
            println!("{result}");
            println!(
                "  paused after step {:?}, total {} ms",
                result.pause_step, result.phases_ms.total
            );
        }
    });
}

fn main() {
    if let Ok(proxy) = std::env::var(env_names::TASKD_PROXY) {
        let job = std::env::var(env_names::MINDX_TASK_ID).unwrap_or_else(|_| "demo".into());
        let rank: u32 = std::env::var(env_names::RANK)
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let nodes = std::env::var("NODES")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(1);
        let ppn = std::env::var("PROCS_PER_NODE")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(2);
        training_process(&job, rank, &proxy, SoloLayout::new(nodes, ppn), 5_000);
        return;
    }

    let (control_addr, proxy) = start_job();
    println!("manager's control API on {control_addr}, proxy of node-0 on {proxy}");

    let layout = SoloLayout::new(1, 2);
    let proxy_addr = proxy.to_string();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let p = proxy_addr.clone();
            std::thread::spawn(move || training_process("demo", r, &p, layout, 1_500))
        })
        .collect();

    operate(&control_addr.to_string());
    for r in ranks {
        r.join().unwrap();
    }
}
