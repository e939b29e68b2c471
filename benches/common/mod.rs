//! What the benches share: an actix system on a thread, a proxy's configuration, the switch
//! they run, flags and percentiles. (Each bench includes it with `mod common;`, and not every
//! bench uses every item.)

#![allow(dead_code)]

use std::sync::mpsc;
use taskd::actors::net::proxy_node::NodeAssignment;
use taskd::actors::net::{NetConfig, ProxyNodeConfig};
use taskd::core::command::Target;
use taskd::core::{DeviceId, JobId, NodeHal, NodeName, SwitchCommand};
use taskd::hal_mock::SoloNodeHal;

/// An actix system on a thread of its own running `f`; its result and the system.
pub(crate) fn system<T: Send + 'static, F, Fut>(name: &str, f: F) -> (T, actix::System)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let sys = actix::System::new();
            sys.block_on(async move {
                let v = f().await;
                tx.send((v, actix::System::current())).unwrap();
            });
            sys.run().unwrap();
        })
        .unwrap();
    rx.recv().unwrap()
}

/// The proxy of node `node_rank` of `job`, connecting to `manager`, with the single-rank mock's
/// node HAL, listening on a port of loopback the system picks.
pub(crate) fn proxy_config(
    job: &str,
    manager: &str,
    node_rank: u32,
    net: NetConfig,
) -> ProxyNodeConfig {
    let hal = |a: &NodeAssignment| -> Box<dyn NodeHal> {
        Box::new(SoloNodeHal::new(a.ranks.len() as u32))
    };
    ProxyNodeConfig {
        node_rank: Some(node_rank),
        listen: "127.0.0.1:0".parse().unwrap(),
        net,
        ..ProxyNodeConfig::new(JobId(job.into()), manager, hal)
    }
}

/// Device 0 of `node` to its backup NIC (`use_backup`) or back: the switch every bench runs.
pub(crate) fn switch_device_0(job: &str, node: &str, use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(job.into()),
        id: None,
        targets: vec![Target {
            node: NodeName(node.into()),
            device: DeviceId(0),
            use_backup,
        }],
    }
}

/// The `p`-quantile of `v` (nearest rank; NaN when empty).
pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The median of `v`.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    pct(&mut v, 0.5)
}
