//! Reconnects: a worker whose connection breaks comes back as the same process and resumes its
//! session (nothing lost, nothing repeated, nobody declared lost), while a new process for the
//! same rank replaces the old one.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::{control_when_registered, spawn_proxy, start_rank};
use taskd_actors::control::{self, ControlConfig, ControlServer};
use taskd_actors::net::{ManagerNode, ManagerNodeConfig, NetConfig};
use taskd_core::{JobId, PhaseDeadlines, RankTable, SwitchCommand};
use taskd_hal_mock::SoloLayout;
use tokio::sync::Mutex as AsyncMutex;

fn net() -> NetConfig {
    NetConfig {
        heartbeat_interval: Duration::from_millis(500),
        missed_heartbeats: 6,
        backoff_initial: Duration::from_millis(20),
        ..NetConfig::default()
    }
}

/// A manager (with its control API) and one proxy on an actix system of their own; returns the
/// control server, the proxy's address and the system.
fn start_job(nodes: u32, ppn: u32) -> (ControlServer, String, actix::System) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let m = ManagerNode::spawn(ManagerNodeConfig {
                job: JobId("rc".into()),
                table: RankTable::uniform(nodes, ppn),
                deadlines: PhaseDeadlines::default(),
                listen: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                net: net(),
            })
            .await
            .unwrap();
            let p = spawn_proxy("rc", m.local_addr().to_string(), 0, net()).await;
            let ctl = control::serve(
                m.manager().clone(),
                ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId("rc".into())),
            )
            .unwrap();
            tx.send((ctl, p.local_addr().to_string(), actix::System::current()))
                .unwrap();
            std::mem::forget((m, p));
        });
        sys.run().unwrap();
    });
    rx.recv().unwrap()
}

/// A TCP relay whose connections the test can cut.
struct Relay {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    conns: Arc<AsyncMutex<Vec<tokio::task::JoinHandle<()>>>>,
    rt: tokio::runtime::Runtime,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Relay {
    fn start(target: String) -> Relay {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let conns: Arc<AsyncMutex<Vec<tokio::task::JoinHandle<()>>>> = Default::default();
        let (a, c) = (accepted.clone(), conns.clone());
        let acceptor = rt.spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                c.lock().await.push(h);
            }
        });
        Relay {
            addr,
            accepted,
            conns,
            rt,
            acceptor,
        }
    }

    /// Drops every connection through the relay (both ends see them close).
    fn cut(&self) {
        self.rt.block_on(async {
            for h in self.conns.lock().await.drain(..) {
                h.abort();
            }
        });
    }

    /// Cuts and stops accepting: the worker behind it cannot come back.
    fn close(self) {
        self.acceptor.abort();
        self.cut();
    }
}

fn cmd(dev: u32, backup: bool) -> SwitchCommand {
    support::switch_on_node_0("rc", dev, backup)
}

#[test]
fn a_reconnecting_worker_resumes_and_a_new_process_replaces_the_old() {
    let (ctl, proxy, system) = start_job(1, 2);
    let layout = SoloLayout::new(1, 2);
    let relay = Relay::start(proxy.clone());
    let r0 = start_rank("rc", 0, &relay.addr.to_string(), layout, net());
    let r1 = start_rank("rc", 1, &proxy, layout, net());
    let (rt, mut control) = control_when_registered(&ctl, "rc");
    assert_eq!(relay.accepted.load(Ordering::SeqCst), 1);

    // The connection of rank 0 breaks just as an operation starts: the directives queued for
    // it are replayed when it comes back, its replies too, and the operation succeeds.
    relay.cut();
    let r = rt.block_on(control.run(&cmd(0, true))).unwrap();
    assert_eq!(r.result, "succeeded", "{r:#?}");
    assert!(
        relay.accepted.load(Ordering::SeqCst) >= 2,
        "rank 0 reconnected"
    );
    let st = rt.block_on(control.status("rc", 0)).unwrap();
    assert!(st.lost_ranks.is_empty(), "{:?}", st.lost_ranks);
    assert_eq!(st.workers_registered, 2);
    assert_eq!(st.ranks_on_backup, [0]);
    // Through the relay, a round trip to the manager and back works again.
    let rtt = r0.worker.ping(true, Duration::from_secs(10)).unwrap();
    assert!(rtt < Duration::from_secs(10));

    // Rank 0's process is cut off for good; a new process for rank 0 takes its place within
    // the old one's grace period (a restart, not a duplicate).
    relay.close();
    let r0_new = start_rank("rc", 0, &proxy, layout, net());
    // Until the manager has seen the replacement, a registered-and-verified job is still the
    // old process's: ask again until the new one's verification is the job's state.
    let mut asked = 0;
    let st = loop {
        let st = rt.block_on(control.wait_registered("rc", None)).unwrap();
        if st.state == "needs_recovery" {
            break st;
        }
        asked += 1;
        assert!(
            asked < 1_000_000,
            "the replacement never reached the manager: {st:#?}"
        );
        std::thread::yield_now();
    };
    assert_eq!(st.workers_registered, 2);
    assert!(st.lost_ranks.is_empty(), "{:?}", st.lost_ranks);
    // The new process starts on its primary NIC while rank 1 has rank 0 on backup: the
    // verification round after its registration finds the split, and no switch runs on it.
    assert_eq!(st.state, "needs_recovery", "{st:#?}");
    let v = st.last_verification.expect("a verification ran").summary;
    assert!(
        v.contains("groups disagree") && v.contains("ranks 0 say none on backup"),
        "{v}"
    );
    let e = rt.block_on(control.run(&cmd(0, false))).unwrap_err();
    assert!(e.to_string().contains("needs_recovery"), "{e}");
    // The operator re-states rank 0 as the table has it (backup) on every rank: the job runs.
    let rec = rt.block_on(control.recover("rc", "as-is")).unwrap();
    assert_eq!(rec.job_state, "running", "{rec:#?}");
    let r = rt.block_on(control.run(&cmd(0, false))).unwrap();
    assert_eq!(r.result, "succeeded", "{r:#?}");
    // Every communication group of the live ranks agrees: everyone back on the primary NIC.
    for r in [&r0_new, &r1] {
        assert!(r.solo.views_agree(), "every group of a rank agrees");
        assert!(r.solo.ranks_on_backup().is_empty());
    }

    r0.worker.gate().shutdown();
    r0.training.stop();
    drop(r0.worker);
    r0_new.stop();
    r1.stop();
    system.stop();
}

/// A rank's gate says the job is whole only once every rank of the job has registered: the
/// manager starts its first verification round then, and the round reaches every rank.
#[test]
fn the_job_is_whole_for_a_rank_once_every_rank_has_registered() {
    let (_ctl, proxy, system) = start_job(1, 2);
    let layout = SoloLayout::new(1, 2);
    let r0 = start_rank("rc", 0, &proxy, layout, net());
    // Rank 1 has not started: no round can start, the job is not whole.
    assert!(!r0.worker.gate().wait_job_whole(Some(Duration::ZERO)));
    let r1 = start_rank("rc", 1, &proxy, layout, net());
    for r in [&r0, &r1] {
        assert!(r
            .worker
            .gate()
            .wait_job_whole(Some(Duration::from_secs(60))));
    }
    r0.stop();
    r1.stop();
    system.stop();
}
