//! A node HAL's link states reach the manager over gRPC as the HAL said them: a degraded link
//! as degraded, with its reason, as on the in-process path (the wire once carried a node's
//! health as up or down and lost the degradation).

use std::time::Duration;
use taskd_actors::net::{ManagerNode, ManagerNodeConfig, NetConfig, ProxyNode, ProxyNodeConfig};
use taskd_actors::{Manager, ProgressKind};
use taskd_core::auto::{AutoConfig, Links};
use taskd_core::{
    DeviceId, HalError, JobId, LinkHealth, NodeHal, PhaseDeadlines, RankTable, SideState,
};

const PROBE: Duration = Duration::from_millis(20);

fn net() -> NetConfig {
    NetConfig {
        backoff_initial: Duration::from_millis(10),
        link_probe: Some(PROBE),
        ..NetConfig::default()
    }
}

/// Device 0's primary link is degraded and its backup down; every other link is up.
struct OneDegraded;

impl NodeHal for OneDegraded {
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        Ok(match device.0 {
            0 => LinkHealth {
                device,
                primary: SideState::Degraded("loss 50% > 25%".into()),
                backup: SideState::Down("carrier lost".into()),
            },
            _ => LinkHealth::new(device, true, true),
        })
    }
}

#[actix_rt::test]
async fn a_degraded_link_reaches_the_manager_over_grpc_as_degraded() {
    use actix::Actor as _;
    let job = JobId("link-health".into());
    let table = RankTable::uniform(1, 2);
    let manager =
        Manager::new(job.clone(), table.clone(), PhaseDeadlines::default()).with_auto(AutoConfig {
            link_probe: PROBE,
            ..AutoConfig::default()
        });
    let mut progress = manager.progress().subscribe();
    let node = ManagerNode::spawn_with(
        ManagerNodeConfig {
            job: job.clone(),
            table,
            deadlines: PhaseDeadlines::default(),
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: None,
            net: net(),
        },
        manager.start(),
    )
    .await
    .unwrap();
    let proxy = ProxyNode::spawn(ProxyNodeConfig {
        node_rank: Some(0),
        listen: "127.0.0.1:0".parse().unwrap(),
        net: net(),
        ..ProxyNodeConfig::new(job, node.local_addr().to_string(), |_: &_| {
            Box::new(OneDegraded) as Box<dyn NodeHal>
        })
    })
    .await
    .unwrap();
    let reported = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let event = progress.recv().await.unwrap();
            if let ProgressKind::Links { report, .. } = event.kind {
                if report.device == DeviceId(0) {
                    return report.links;
                }
            }
        }
    })
    .await
    .expect("no link report of device 0 reached the manager");
    assert_eq!(
        reported,
        Links {
            primary: SideState::Degraded("loss 50% > 25%".into()),
            backup: SideState::Down("carrier lost".into()),
        }
    );
    proxy.shutdown("test over").await;
    node.shutdown().await;
}
