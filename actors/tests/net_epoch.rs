//! The job's clock origin across a restart of the manager: the proxies that kept running bring
//! the origin the first manager gave them, and a proxy started after the restart gets that
//! origin too, so every node's simulated step clock and link probes count from one origin.

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::spawn_proxy;
use taskd_actors::net::{ManagerNode, ManagerNodeConfig, NetConfig, ProxyNode};
use taskd_core::{JobId, PhaseDeadlines, RankTable};

fn net() -> NetConfig {
    NetConfig {
        backoff_initial: Duration::from_millis(10),
        ..NetConfig::default()
    }
}

fn manager(listen: std::net::SocketAddr) -> ManagerNodeConfig {
    ManagerNodeConfig {
        job: JobId("epoch".into()),
        table: RankTable::uniform(2, 1),
        deadlines: PhaseDeadlines::default(),
        listen,
        tls: None,
        net: net(),
    }
}

async fn proxy(manager: &ManagerNode, node_rank: u32) -> ProxyNode {
    spawn_proxy("epoch", manager.local_addr().to_string(), node_rank, net()).await
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[actix_rt::test]
async fn a_proxy_started_after_a_restart_of_the_manager_counts_from_the_jobs_first_origin() {
    let first = ManagerNode::spawn(manager("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = first.local_addr();
    let kept = proxy(&first, 0).await;
    let origin = kept.assigned().await.unwrap().job_epoch_unix_ms;
    first.shutdown().await;
    // The next manager's own start is a later millisecond than the first's, so a proxy told
    // the next manager's own origin would differ from `origin`.
    while unix_ms() <= origin {
        std::hint::spin_loop();
    }
    let next = ManagerNode::spawn(manager(addr)).await.unwrap();
    // The proxy that kept running registers again (it backs off 10 ms at first).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !next.connected_nodes().contains(&"node-0".to_owned()) {
        assert!(Instant::now() < deadline, "the kept proxy never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started_after = proxy(&next, 1).await;
    let got = started_after.assigned().await.unwrap().job_epoch_unix_ms;
    assert_eq!(got, origin, "one origin for the job's nodes");
    started_after.shutdown("test over").await;
    kept.shutdown("test over").await;
    next.shutdown().await;
}
