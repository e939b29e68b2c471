//! A peer that stops reading costs a bounded queue, not memory without end: the manager keeps
//! at most `queue_capacity` unacknowledged messages for a proxy; the next send fails with
//! `Full`, the proxy is declared lost (its ranks with it) and its queue is freed. And the other
//! way round: what a proxy sends is acknowledged in time even when nothing answers it.

mod support;

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use taskd_actors::control::{self, ControlClient, ControlConfig, ControlServer};
use taskd_actors::net::testing as wire;
use taskd_actors::net::{pb, ManagerNode, ManagerNodeConfig, NetConfig, Registry};
use taskd_core::auto::Links;
use taskd_core::protocol::{
    DirectiveKind, LinkReport, NodeReply, Phase, ProxyToManager, RankError, RankReply, ReplyBody,
    WorkerHello, WorkerReport,
};
use taskd_core::{
    DeviceId, GlobalRank, JobId, NodeName, OperationId, PhaseDeadlines, RankTable,
    SwitchCapabilities,
};
use tokio_stream::wrappers::ReceiverStream;

const CAPACITY: usize = 4;

/// A manager on an actix system of its own, with its control API; returns its address, its
/// control server and its proxy registry.
fn start_manager() -> (SocketAddr, ControlServer, Arc<Registry>, actix::System) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let ms = Duration::from_millis(100);
            let node = ManagerNode::spawn(ManagerNodeConfig {
                job: JobId("slow".into()),
                table: RankTable::uniform(1, 2),
                deadlines: PhaseDeadlines {
                    pause: ms,
                    switch: ms,
                    rollback: ms,
                    resume: ms,
                },
                listen: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                net: NetConfig {
                    // Long heartbeats: the stalled proxy is cut off by its queue, not by silence.
                    heartbeat_interval: Duration::from_secs(10),
                    queue_capacity: CAPACITY,
                    ..NetConfig::default()
                },
            })
            .await
            .expect("manager starts");
            let ctl = control::serve(
                node.manager().clone(),
                ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId("slow".into())),
            )
            .expect("control API starts");
            tx.send((
                node.local_addr(),
                ctl,
                node.peers(),
                actix::System::current(),
            ))
            .unwrap();
            std::mem::forget(node); // lives as long as the system
        });
        sys.run().unwrap();
    });
    rx.recv().expect("manager started")
}

fn up(seq: u64, body: pb::up::Body) -> pb::Up {
    pb::Up {
        seq,
        ack: 0,
        body: Some(body),
    }
}

/// A raw proxy connection for node-0, registered: what it sends and what it receives.
async fn register_raw(
    addr: SocketAddr,
    incarnation: &str,
) -> (
    tokio::sync::mpsc::Sender<pb::Up>,
    tonic::Streaming<pb::Down>,
) {
    let mut raw = pb::task_net_client::TaskNetClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(up(
        0,
        pb::up::Body::Register(pb::Register {
            role: pb::Role::Proxy as i32,
            job: "slow".into(),
            node: "node-0".into(),
            incarnation: incarnation.into(),
            ..Default::default()
        }),
    ))
    .await
    .unwrap();
    let mut inbound = raw
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let ack = inbound.message().await.unwrap().unwrap();
    assert!(matches!(ack.body, Some(pb::down::Body::Registered(_))));
    (tx, inbound)
}

/// Messages that nothing answers are still acknowledged, each in its turn, by a frame of
/// their own well before the next heartbeat (10 s here): the peer's queue does not hold them
/// until then. (Answered messages are acknowledged by their answers.)
#[test]
fn messages_nobody_answers_are_acknowledged_before_the_next_heartbeat() {
    let (addr, _ctl, _peers, system) = start_manager();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut inbound) = register_raw(addr, "reporting-proxy").await;
        for seq in 1..=3u64 {
            let report = ProxyToManager::Links(LinkReport {
                node: NodeName("node-0".into()),
                device: DeviceId(0),
                links: Links::known(seq % 2 == 0, true),
                from_kernel: false,
            });
            tx.send(up(seq, pb::up::Body::Proxy(wire::proxy_msg_to_pb(report))))
                .await
                .unwrap();
            let acked = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let down = inbound
                        .message()
                        .await
                        .unwrap()
                        .expect("an acknowledgement");
                    if down.ack >= seq {
                        return down;
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("message {seq} not acknowledged before the heartbeat"));
            assert_eq!(
                (acked.seq, acked.ack),
                (0, seq),
                "a frame of its own: {acked:?}"
            );
        }
        drop(tx);
    });
    system.stop();
}

#[test]
fn a_proxy_that_stops_reading_is_cut_off_at_its_queue_capacity() {
    let (addr, ctl, peers, system) = start_manager();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A proxy that registers node-0 and its two workers, then never reads or acknowledges.
        let (tx, mut inbound) = register_raw(addr, "stalled-proxy").await;
        for r in 0..2u32 {
            let hello = ProxyToManager::WorkerUp(WorkerHello {
                job: JobId("slow".into()),
                node: NodeName("node-0".into()),
                rank: GlobalRank(r),
                capabilities: SwitchCapabilities::ALL,
                instance: taskd_core::Instance(u64::from(r) + 1),
                generation: 0,
            });
            tx.send(up(
                u64::from(r) + 1,
                pb::up::Body::Proxy(wire::proxy_msg_to_pb(hello)),
            ))
            .await
            .unwrap();
        }
        // The manager asks both ranks what they applied before it admits a switch: answer
        // that one directive (and acknowledge it), then stall.
        let verify = loop {
            let down = inbound.message().await.unwrap().expect("the verification");
            if let Some(pb::down::Body::Directive(d)) = down.body {
                break (down.seq, wire::directive_from_pb(d).unwrap());
            }
        };
        assert_eq!(verify.1.kind, DirectiveKind::Verify);
        let verified = ProxyToManager::Reply(NodeReply {
            node: NodeName("node-0".into()),
            op: verify.1.op,
            phase: Phase::Verify,
            replies: (0..2)
                .map(|r| RankReply {
                    rank: GlobalRank(r),
                    op: verify.1.op,
                    phase: Phase::Verify,
                    body: ReplyBody::Verified(WorkerReport::default()),
                })
                .collect(),
            health: Vec::new(),
        });
        tx.send(pb::Up {
            seq: 3,
            ack: verify.0,
            body: Some(pb::up::Body::Proxy(wire::proxy_msg_to_pb(verified))),
        })
        .await
        .unwrap();
        let mut control = ControlClient::connect(&ctl.local_addr().to_string(), None)
            .await
            .unwrap();
        control.wait_registered("slow", None).await.unwrap();
        let cmd = support::switch_on_node_0("slow", 0, true);
        // Each operation queues two directives (sample, then resume). The stalled proxy never
        // reads them, but answers blind: rank 0 fails the sample, both ranks resume.
        let mut seq = 3;
        for i in 0..CAPACITY / 2 {
            let op = control.submit(&cmd).await.unwrap();
            let id: OperationId = op.uuid.parse().unwrap();
            let reply = |phase: Phase, body: &dyn Fn(u32) -> ReplyBody| {
                ProxyToManager::Reply(NodeReply {
                    node: NodeName("node-0".into()),
                    op: id,
                    phase,
                    replies: (0..2)
                        .map(|r| RankReply {
                            rank: GlobalRank(r),
                            op: id,
                            phase,
                            body: body(r),
                        })
                        .filter(|r| phase != Phase::Sample || r.rank.0 == 0)
                        .collect(),
                    health: Vec::new(),
                })
            };
            let failed = reply(Phase::Sample, &|_| {
                ReplyBody::Failed(RankError {
                    group: None,
                    hal: None,
                    message: "refusing to pause".into(),
                })
            });
            let resumed = reply(Phase::Resume, &|_| ReplyBody::Resumed {
                stalled: Duration::ZERO,
            });
            for m in [failed, resumed] {
                seq += 1;
                tx.send(up(seq, pb::up::Body::Proxy(wire::proxy_msg_to_pb(m))))
                    .await
                    .unwrap();
            }
            let r = op.result().await.unwrap();
            assert!(
                r.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("rank 0 failed in sample: ")),
                "operation {i}: {r:#?}"
            );
            assert_eq!(r.job_state, "running");
            let depth = peers.queue_depth("node-0").expect("still registered");
            assert_eq!(depth.queued, 2 * (i + 1));
            assert!(depth.high_water <= CAPACITY);
        }
        // The queue is full: the next directive is refused, the proxy is declared lost.
        let r = control.run(&cmd).await.unwrap();
        assert_eq!(r.result, "failed");
        let error = r.error.as_deref().unwrap_or_default();
        assert!(
            error.contains(" was lost during ") && error.contains("queue is full (4 messages)"),
            "expected the ranks lost, got {error:?}"
        );
        assert_eq!(r.lost_ranks, [0, 1]);
        assert_eq!(r.job_state, "needs_recovery");
        let st = control.status("slow", 0).await.unwrap();
        assert_eq!(st.nodes_connected, 0);
        assert_eq!(st.workers_registered, 0);
        assert_eq!(st.lost_ranks.len(), 2);
        // Its queue is gone with it, and its connection is closed. The manager declared it
        // lost when the queue refused a directive; the session ends on a task of its own and
        // removes the queue then, so the test lets that task run until it has.
        let gone = async {
            while peers.queue_depth("node-0").is_some() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), gone)
            .await
            .expect("the queue went with its proxy");
        // What was in flight before the close: at most the queue's directives. Heartbeats and
        // pongs come with time (how many depends on how long the test took), so they are not
        // counted.
        let mut directives = 0;
        while let Ok(Some(down)) = inbound.message().await {
            if matches!(down.body, Some(pb::down::Body::Directive(_))) {
                directives += 1;
            }
        }
        assert!(directives <= CAPACITY, "{directives} directives");
        drop(tx);
    });
    system.stop();
}
