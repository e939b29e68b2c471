//! The control API with real gRPC clients against an in-process manager on port 0: ClusterD's
//! `Recover` service (its codes and strings, the one-message subscription, the late subscription
//! within the retention window), taskd's `Control` (status with lost ranks, waiting for
//! registrations, submit-and-wait, refusals with their codes and kinds), the guard interceptor on
//! both services (bearer token, rate limit) and mutual TLS.

mod common;

use common::{cmd, small, WAIT};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use taskd::actors::clusterd::proto::recover_client::RecoverClient;
use taskd::actors::clusterd::proto::{ClientInfo, DeviceList, SwitchNicRequest, SwitchNics};
use taskd::actors::control::proto::{self, switch_event::Event, RefusalKind};
use taskd::actors::control::recover::{
    busy_info, not_registered, not_switching, SWITCH_FAILED, SWITCH_FINISHED, SWITCH_STARTED,
    SWITCH_TIMEOUT,
};
use taskd::actors::control::{
    codes, serve, ClientError, Clock, ControlClient, ControlConfig, ControlServer, GuardConfig,
    ManualClock, RateLimit, RESULT_RETENTION,
};
use taskd::actors::net::{PemIdentity, TlsPem};
use taskd::core::{GlobalRank, HcclCode, OperationId};
use taskd::hal_mock::inflight::{InFlightFabric, LinkFault};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{SimConfig, Simulation};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Fields drop in order: the clients' runtime (and their connections) before the server.
struct Rig {
    sim: Simulation,
    rt: tokio::runtime::Runtime,
    server: ControlServer,
    clock: ManualClock,
}

impl Rig {
    /// A simulated job and its control server (on a clock the test moves), configured by `f`.
    fn start(cfg: SimConfig, f: impl FnOnce(ControlConfig) -> ControlConfig) -> Rig {
        let sim = Simulation::start(&cfg).unwrap();
        let (clock, hand) = Clock::manual();
        let control = ControlConfig {
            clock,
            ..ControlConfig::new("127.0.0.1:0".parse().unwrap(), cfg.job.clone())
        };
        let server = serve(sim.job().manager().clone(), f(control)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Rig {
            sim,
            rt,
            server,
            clock: hand,
        }
    }

    fn plain(cfg: SimConfig) -> Rig {
        Self::start(cfg, |c| c)
    }

    fn block<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn recover(&self) -> RecoverClient<Channel> {
        let uri = format!("http://{}", self.addr());
        RecoverClient::new(
            self.block(Endpoint::from_shared(uri).unwrap().connect())
                .unwrap(),
        )
    }

    fn control(&self) -> ControlClient {
        self.block(ControlClient::connect(&self.addr().to_string(), None))
            .unwrap()
    }

    fn switch_nic_track(&self, job: &str, ops: &[(&str, &[&str], &[bool])]) -> (i32, String) {
        let mut c = self.recover();
        let nic_ops: HashMap<String, DeviceList> = ops
            .iter()
            .map(|(n, d, o)| {
                (
                    n.to_string(),
                    DeviceList {
                        dev: d.iter().map(|s| s.to_string()).collect(),
                        op: o.to_vec(),
                    },
                )
            })
            .collect();
        let s = self
            .block(c.switch_nic_track(SwitchNics {
                job_id: job.into(),
                nic_ops,
            }))
            .unwrap()
            .into_inner();
        (s.code, s.info)
    }

    /// Every message of one subscription until the server ends the stream, or the status the
    /// subscription was refused with.
    fn subscribe(&self, job: &str) -> Result<Vec<String>, tonic::Status> {
        let mut c = self.recover();
        self.block(async {
            let mut s = c
                .subscribe_switch_nic_signal(SwitchNicRequest { job_id: job.into() })
                .await?
                .into_inner();
            let mut out = Vec::new();
            while let Some(m) = s.message().await? {
                assert_eq!(m.job_id, job);
                out.push(m.msg);
            }
            Ok(out)
        })
    }

    fn status(&self, recent: u32) -> proto::JobStatus {
        self.block(self.control().status("sim", recent)).unwrap()
    }

    /// Control's events for a switch with `wait`.
    fn switch_wait(&self, targets: &[(&str, u32, bool)], uuid: &str) -> Vec<Event> {
        self.switch_events(targets, uuid, false)
    }

    /// Control's events for a switch with `wait`, an in-flight move with `abort_in_flight`.
    fn switch_events(
        &self,
        targets: &[(&str, u32, bool)],
        uuid: &str,
        abort_in_flight: bool,
    ) -> Vec<Event> {
        let req = proto::SwitchRequest {
            job_id: "sim".into(),
            uuid: uuid.into(),
            targets: targets
                .iter()
                .map(|(n, d, b)| proto::Target {
                    node: n.to_string(),
                    device: *d,
                    use_backup: *b,
                    rank: 0,
                })
                .collect(),
            wait: true,
            abort_in_flight,
        };
        let mut c = self.control();
        self.block(async {
            let mut s = c.switch(req).await.unwrap();
            let mut out = Vec::new();
            while let Some(ev) = s.message().await.unwrap() {
                out.push(ev.event.unwrap());
            }
            out
        })
    }
}

#[test]
fn a_switch_starts_at_once_and_the_subscription_delivers_exactly_one_result() {
    let rig = Rig::plain(small());
    // Keep the operation in flight long enough to subscribe to it.
    rig.sim
        .fabric()
        .inject_nic_set_fault(GlobalRank(0), NicSetFault::Slow(Duration::from_millis(300)));
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["0", "2"], &[true, true])]);
    assert_eq!((code, info.as_str()), (codes::OK, SWITCH_STARTED));
    let uuid = rig.status(0).in_flight.expect("in flight").uuid;
    // Exactly one message, exactly ClusterD's success string.
    assert_eq!(rig.subscribe("sim").unwrap(), [SWITCH_FINISHED]);
    let last = &rig.status(1).recent[0];
    assert_eq!(
        (last.uuid.as_str(), last.result.as_str()),
        (uuid.as_str(), "succeeded")
    );
    assert_eq!(last.direction, "to_backup");
    assert!(last.phases.unwrap().total_ms > 0.0);
    assert_eq!(
        rig.sim.fabric().ranks_on_backup(),
        vec![GlobalRank(4), GlobalRank(6)]
    );
    // A subscription for a job this manager does not run: ClusterD's error.
    let e = rig.subscribe("other").unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), not_registered("other"));
    let end = rig.sim.finish();
    assert!(end.groups_consistent, "{}", end.consistency);
}

#[test]
fn a_late_subscription_gets_the_last_result_for_the_retention_window_only() {
    let rig = Rig::plain(small());
    // Nothing ran yet: ClusterD's "not switching".
    let e = rig.subscribe("sim").unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), not_switching("sim"));
    assert_eq!(e.message(), "jobId=sim is not swtiching nic");

    let r = rig.block(rig.control().run(&cmd(&[("node-0", 2, true)])));
    assert_eq!(r.unwrap().result, "succeeded");
    // The operation is over before anyone subscribed: the result is still delivered, to every
    // subscription, for the whole window.
    assert_eq!(rig.subscribe("sim").unwrap(), [SWITCH_FINISHED]);
    rig.clock.advance(RESULT_RETENTION);
    assert_eq!(rig.subscribe("sim").unwrap(), [SWITCH_FINISHED]);
    // And not after it.
    rig.clock.advance(Duration::from_millis(1));
    let e = rig.subscribe("sim").unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), not_switching("sim"));
    rig.sim.finish();
}

#[test]
fn once_another_operation_started_the_earlier_result_is_not_delivered() {
    let mut cfg = small();
    cfg.deadlines.switch = Duration::from_millis(200);
    let rig = Rig::plain(cfg);
    let ok = rig.block(rig.control().run(&cmd(&[("node-0", 2, true)])));
    assert_eq!(ok.unwrap().result, "succeeded");
    assert_eq!(rig.subscribe("sim").unwrap(), [SWITCH_FINISHED]);
    // A second operation fails (and rolls back); a late subscription gets its failure only.
    rig.sim
        .fabric()
        .inject_nic_set_fault(GlobalRank(5), NicSetFault::Fail(HcclCode::Network));
    let failed = rig
        .block(rig.control().run(&cmd(&[("node-1", 1, true)])))
        .unwrap();
    assert_eq!(failed.result, "failed", "{failed:?}");
    assert!(failed.rolled_back);
    let msgs = rig.subscribe("sim").unwrap();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    let detail = msgs[0]
        .strip_prefix(SWITCH_FAILED)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or_else(|| panic!("{:?} is not ClusterD's switch failure", msgs[0]));
    assert!(detail.contains(&failed.uuid), "{detail}");
    assert!(detail.contains("rolled back: yes, job running"), "{detail}");
    rig.sim.finish();
}

#[test]
fn recover_refuses_with_clusterds_codes_and_names_what_is_wrong() {
    let rig = Rig::plain(small());
    let bad = |job: &str, ops: &[(&str, &[&str], &[bool])], culprit: &str| {
        let (code, info) = rig.switch_nic_track(job, ops);
        assert_eq!(code, codes::PARAMETER_INVALID, "{info}");
        assert_eq!(code, 413);
        assert!(info.contains(culprit), "{info} should name {culprit}");
    };
    bad("", &[("node-0", &["0"], &[true])], "jobID is empty");
    bad("other-job", &[("node-0", &["0"], &[true])], "other-job");
    bad("sim", &[("node-7", &["0"], &[true])], "node-7");
    bad("sim", &[("node-1", &["4"], &[true])], "device 4");
    bad("sim", &[("node-1", &["x"], &[true])], "\"x\"");
    // ClusterD matches device ids as exact strings: " 2" names no device.
    bad(
        "sim",
        &[("node-1", &[" 2"], &[true])],
        "\" 2\" of node \"node-1\"",
    );
    bad(
        "sim",
        &[("node-1", &["0", "2"], &[true])],
        "2 devices but 1 operations",
    );
    bad("sim", &[], "no targets");
    bad(
        "sim",
        &[("node-0", &["0", "1"], &[true, false])],
        "two dies of one NPU",
    );

    // Busy while one is in flight: 411 with ClusterD's text, then the uuid in flight.
    rig.sim
        .fabric()
        .inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::from_millis(300)));
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["0"], &[true])]);
    assert_eq!((code, info.as_str()), (codes::OK, SWITCH_STARTED));
    let first = rig.status(0).in_flight.expect("in flight").uuid;
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["0"], &[true])]);
    assert_eq!(code, 411);
    assert!(
        info.starts_with(&format!("{}: ", busy_info("sim"))),
        "{info}"
    );
    assert!(info.contains(&first), "{info}");
    assert_eq!(rig.subscribe("sim").unwrap(), [SWITCH_FINISHED]);

    // A worker gone: the job is not fully registered (ClusterD: a bad parameter too), and
    // `Control` says which rank is lost and why.
    rig.sim.job().kill_worker(GlobalRank(7));
    let st = rig
        .block(rig.control().wait_registered("sim", Some(7)))
        .unwrap();
    assert_eq!(st.workers_registered, 7);
    assert_eq!(st.lost_ranks.len(), 1, "{st:?}");
    assert_eq!(st.lost_ranks[0].rank, 7);
    assert!(!st.lost_ranks[0].reason.is_empty());
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["2"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID, "{info}");
    assert!(info.contains("missing ranks: 7"), "{info}");
    let e = rig
        .block(rig.control().run(&cmd(&[("node-0", 2, true)])))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Refused {
                code: 400,
                kind: RefusalKind::WorkersMissing,
                ..
            }
        ),
        "{e:?}"
    );
    // Nothing but the one successful switch ever reached HCCL.
    assert!(rig
        .sim
        .fabric()
        .nic_set_log()
        .iter()
        .all(|c| c.ranks.len() == 1 && c.use_backup == vec![true]));
    rig.sim.finish();
}

#[test]
fn ranks_that_cannot_switch_are_refused() {
    let rig = Rig::plain(SimConfig {
        l2_retry_off: vec![GlobalRank(2)],
        ..small()
    });
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID, "{info}");
    assert!(info.contains("HCCL_OP_RETRY_ENABLE"), "{info}");
    let e = rig
        .block(rig.control().run(&cmd(&[("node-0", 0, true)])))
        .unwrap_err();
    match e {
        ClientError::Refused { code, kind, reason } => {
            assert_eq!(
                (code, kind),
                (codes::SWITCH_UNSUPPORTED, RefusalKind::CapabilityMissing)
            );
            assert!(reason.contains("HCCL_OP_RETRY_ENABLE"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    rig.sim.finish();
}

#[test]
fn a_paused_job_is_out_of_order() {
    let mut cfg = small();
    cfg.deadlines.switch = Duration::from_millis(100);
    cfg.deadlines.rollback = Duration::from_millis(100);
    let rig = Rig::plain(cfg);
    rig.sim.fabric().inject_nic_set_fault(
        GlobalRank(1),
        NicSetFault::Hang {
            duration: Duration::from_millis(600),
            code: HcclCode::Timeout,
        },
    );
    let (code, _) = rig.switch_nic_track("sim", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::OK);
    let msgs = rig.subscribe("sim").unwrap();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].starts_with(&format!("{SWITCH_TIMEOUT}: ")),
        "{:?}",
        msgs[0]
    );
    assert!(
        msgs[0].contains("rolled back: no, job paused"),
        "{}",
        msgs[0]
    );
    let r = &rig.status(1).recent[0];
    assert_eq!((r.result.as_str(), r.rolled_back), ("failed", false));
    assert_eq!(r.job_state, "paused");
    // ClusterD: "job recovering" (411); Control: out of order (401).
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["2"], &[true])]);
    assert_eq!(code, codes::OPERATION_RUNNING, "{info}");
    assert!(info.starts_with(&busy_info("sim")), "{info}");
    let e = rig
        .block(rig.control().run(&cmd(&[("node-0", 2, true)])))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: codes::OUT_OF_ORDER,
                kind: RefusalKind::NotRunning,
                ..
            }
        ),
        "{e:?}"
    );
    rig.sim.finish();
}

#[test]
fn health_check_reports_the_job() {
    let rig = Rig::plain(small());
    let mut c = rig.recover();
    let s = rig
        .block(c.health_check(ClientInfo {
            job_id: "sim".into(),
            role: "platform".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::OK);
    let v: serde_json::Value = serde_json::from_str(&s.info).unwrap();
    assert_eq!(v["workers_registered"], 8);
    assert_eq!(v["state"], "running");
    let s = rig
        .block(c.health_check(ClientInfo {
            job_id: "nope".into(),
            role: "platform".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::JOB_NOT_EXIST);
    rig.sim.finish();
}

/// The uuid of the operation in flight sent again (a client that lost its stream): the
/// answer says it is that operation, not a new start, and its result follows.
#[test]
fn a_uuid_repeated_while_its_operation_runs_is_answered_as_in_flight() {
    let rig = Rig::plain(small());
    rig.sim.fabric().inject_nic_set_fault(
        GlobalRank(0),
        NicSetFault::Slow(Duration::from_millis(1000)),
    );
    let uuid = "8b1f8d36-0000-4000-8000-0000000000f1";
    let req = |wait| proto::SwitchRequest {
        job_id: "sim".into(),
        uuid: uuid.into(),
        targets: vec![proto::Target {
            node: "node-1".into(),
            device: 2,
            use_backup: true,
            rank: 0,
        }],
        wait,
        abort_in_flight: false,
    };
    let mut c = rig.control();
    let first = rig.block(async { c.switch(req(false)).await.unwrap().message().await });
    let Some(Event::Accepted(a)) = first.unwrap().and_then(|e| e.event) else {
        panic!("not accepted");
    };
    assert!(!a.known && !a.in_flight, "a new start: {a:?}");
    let events = rig.switch_wait(&[("node-1", 2, true)], uuid);
    assert!(
        matches!(&events[0], Event::Accepted(a) if a.in_flight && !a.known),
        "{events:?}"
    );
    assert!(
        matches!(events.last(), Some(Event::Result(r)) if r.uuid == uuid && r.result == "succeeded"),
        "{events:?}"
    );
    assert_eq!(rig.status(4).recent.len(), 1, "it ran once");
    rig.sim.finish();
}

#[test]
fn submit_and_wait_streams_the_result_and_status_shows_the_nic_table() {
    let rig = Rig::plain(small());
    let uuid = "8b1f8d36-0000-4000-8000-000000000001";
    let events = rig.switch_wait(&[("node-0", 2, true), ("node-1", 3, true)], uuid);
    assert!(
        matches!(&events[0], Event::Accepted(a) if a.uuid == uuid && !a.known),
        "{events:?}"
    );
    let Some(Event::Result(r)) = events.last() else {
        panic!("no result in {events:?}");
    };
    assert_eq!(r.result, "succeeded");
    assert!(r.applied);
    // The phases came as they happened, in order, each started then finished.
    let phases: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Phase(p) if p.kind != "waiting" => Some((p.phase.clone(), p.kind.clone())),
            _ => None,
        })
        .collect();
    let want: Vec<(String, String)> = ["sample", "pause", "switch", "resume"]
        .iter()
        .flat_map(|p| {
            [
                (p.to_string(), "started".into()),
                (p.to_string(), "finished".into()),
            ]
        })
        .collect();
    assert_eq!(phases, want);
    assert!(events.iter().any(|e| matches!(e, Event::Phase(p)
        if p.phase == "pause" && p.kind == "started" && p.pause_step == r.pause_step)));
    assert_eq!(
        r.targets.iter().map(|t| t.rank).collect::<Vec<_>>(),
        vec![2, 7]
    );
    assert!(r.pause_step.is_some());
    // The same uuid with the same targets (in another order): the known result, not a second
    // run.
    let calls = rig.sim.fabric().nic_set_log().len();
    let again = rig.switch_wait(&[("node-1", 3, true), ("node-0", 2, true)], uuid);
    assert!(matches!(&again[0], Event::Accepted(a) if a.known));
    assert!(matches!(again.last(), Some(Event::Result(x)) if x == r));
    // The same uuid with other targets: refused, naming the uuid; nothing ran.
    let reused = rig.switch_wait(&[("node-0", 2, true)], uuid);
    assert!(
        matches!(&reused[..], [Event::Refused(x)] if x.code == codes::PARAMETER_INVALID
            && x.kind() == RefusalKind::IdReused && x.reason.contains(uuid)),
        "{reused:?}"
    );
    let mut cmd = cmd(&[("node-1", 3, false)]);
    cmd.id = Some(uuid.parse::<OperationId>().unwrap());
    let e = rig.block(rig.control().run(&cmd)).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused { kind: RefusalKind::IdReused, reason, .. } if reason.contains(uuid)),
        "{e:?}"
    );
    assert_eq!(rig.sim.fabric().nic_set_log().len(), calls);
    // A refusal comes as one event with its code.
    let refused = rig.switch_wait(&[("node-9", 0, true)], "");
    assert!(
        matches!(&refused[..], [Event::Refused(x)] if x.code == codes::PARAMETER_INVALID
            && x.kind() == RefusalKind::Invalid && x.reason.contains("node-9")),
        "{refused:?}"
    );
    let refused = rig.switch_wait(&[("node-0", 0, true)], "not-a-uuid");
    assert!(matches!(&refused[..], [Event::Refused(x)] if x.code == codes::CLIENT_ERROR));

    let s = rig.status(5);
    assert_eq!(s.ranks_on_backup, vec![2, 7]);
    assert_eq!(s.workers_registered, 8);
    assert_eq!(s.workers_expected, 8);
    assert_eq!(s.nodes_connected, 2);
    assert!(s.in_flight.is_none());
    assert!(s.lost_ranks.is_empty());
    assert_eq!(s.recent.len(), 1);
    assert_eq!(s.state, "running");
    let e = rig.block(rig.control().status("other", 5)).unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc(s) if s.code() == tonic::Code::NotFound),
        "{e:?}"
    );
    let end = rig.sim.finish();
    assert!(end.groups_consistent);
}

fn with_token(c: ControlConfig) -> ControlConfig {
    ControlConfig {
        guard: GuardConfig {
            token: Some("s3cret".into()),
            rate: RateLimit::default(),
        },
        ..c
    }
}

#[test]
fn a_bearer_token_is_required_on_every_service_when_configured() {
    let rig = Rig::start(small(), with_token);
    let info = || ClientInfo {
        job_id: "sim".into(),
        role: "ops".into(),
    };
    let authorized = |auth: &str| {
        let mut req = tonic::Request::new(info());
        req.metadata_mut()
            .insert("authorization", auth.parse().unwrap());
        req
    };
    // Recover: without a token and with a wrong one, refused before the manager is asked.
    let mut c = rig.recover();
    for e in [
        rig.block(c.health_check(info())).unwrap_err(),
        rig.block(c.health_check(authorized("Bearer wrong")))
            .unwrap_err(),
        rig.block(c.subscribe_switch_nic_signal(SwitchNicRequest {
            job_id: "sim".into(),
        }))
        .unwrap_err(),
    ] {
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    }
    let s = rig
        .block(c.health_check(authorized("Bearer s3cret")))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::OK);
    // Control: the same.
    let calls = rig.sim.fabric().nic_set_log().len();
    for token in [None, Some("wrong".to_owned())] {
        let mut c = rig.control().with_token(token);
        for e in [
            rig.block(c.status("sim", 0)).unwrap_err(),
            rig.block(c.wait_registered("sim", None)).unwrap_err(),
            rig.block(c.run(&cmd(&[("node-0", 0, true)]))).unwrap_err(),
        ] {
            assert!(
                matches!(&e, ClientError::Rpc(s) if s.code() == tonic::Code::Unauthenticated),
                "{e:?}"
            );
        }
    }
    assert_eq!(rig.sim.fabric().nic_set_log().len(), calls, "nothing ran");
    let mut c = rig.control().with_token(Some("s3cret".into()));
    assert_eq!(rig.block(c.status("sim", 0)).unwrap().workers_registered, 8);
    rig.sim.finish();
}

#[test]
fn a_client_in_a_loop_is_rate_limited_on_every_service() {
    let rig = Rig::start(small(), |c| ControlConfig {
        guard: GuardConfig {
            token: None,
            rate: RateLimit {
                burst: 3,
                per_second: 0.001,
            },
        },
        ..c
    });
    let mut c = rig.recover();
    let info = || ClientInfo {
        job_id: "sim".into(),
        role: "script".into(),
    };
    for _ in 0..3 {
        rig.block(c.health_check(info())).unwrap();
    }
    let e = rig.block(c.health_check(info())).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("rate limit"), "{}", e.message());
    // One bucket per client address, whatever the service.
    let e = rig.block(rig.control().status("sim", 0)).unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc(s) if s.code() == tonic::Code::ResourceExhausted),
        "{e:?}"
    );
    rig.sim.finish();
}

struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("localhost");
    let (client_cert, client_key) = leaf("operator");
    Pki {
        ca: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

#[test]
fn mutual_tls_admits_only_clients_with_a_certificate_from_the_ca() {
    let pki = pki();
    let server_tls = TlsPem {
        ca: Some(pki.ca.clone().into_bytes()),
        identity: Some(PemIdentity {
            cert: pki.server_cert.clone().into_bytes(),
            key: pki.server_key.clone().into_bytes(),
        }),
        domain: None,
    };
    let rig = Rig::start(small(), |c| ControlConfig {
        tls: Some(server_tls),
        ..c
    });
    let uri = format!("https://{}", rig.addr());
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    let with_cert = Endpoint::from_shared(uri.clone())
        .unwrap()
        .tls_config(
            tls.clone()
                .identity(Identity::from_pem(&pki.client_cert, &pki.client_key)),
        )
        .unwrap();
    let channel = rig.block(with_cert.connect()).unwrap();
    let s = rig
        .block(RecoverClient::new(channel).health_check(ClientInfo {
            job_id: "sim".into(),
            role: "ops".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::OK);
    // The typed client with the same material.
    let client_tls = TlsPem {
        ca: Some(pki.ca.clone().into_bytes()),
        identity: Some(PemIdentity {
            cert: pki.client_cert.clone().into_bytes(),
            key: pki.client_key.clone().into_bytes(),
        }),
        domain: Some("localhost".into()),
    };
    let mut c = rig
        .block(ControlClient::connect(
            &rig.addr().to_string(),
            Some(&client_tls),
        ))
        .unwrap();
    assert_eq!(rig.block(c.status("sim", 0)).unwrap().workers_registered, 8);

    // No client certificate: the handshake or the first call fails.
    let without = Endpoint::from_shared(uri).unwrap().tls_config(tls).unwrap();
    let refused = rig.block(async {
        match without.connect().await {
            Err(_) => true,
            Ok(ch) => RecoverClient::new(ch)
                .health_check(ClientInfo {
                    job_id: "sim".into(),
                    role: "ops".into(),
                })
                .await
                .is_err(),
        }
    });
    assert!(refused, "a client without a certificate got through");
    rig.sim.finish();
}

/// The phases of a switch's events, as `(phase, kind)`, the waits left out.
fn phases_of(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Phase(p) if p.kind != "waiting" => Some((p.phase.clone(), p.kind.clone())),
            _ => None,
        })
        .collect()
}

/// `abort_in_flight` on the switch request runs the operator's move in flight: sample, abort,
/// switch (the HAL's NIC set, then the redo through each rank's in-flight side), resume; no
/// pause step. The groups agree at the end.
#[test]
fn a_switch_with_abort_in_flight_aborts_instead_of_pausing() {
    let rig = Rig::plain(small());
    let world = 8;
    let group = InFlightFabric::new(world);
    for r in 0..world {
        let side = Arc::new(group.rank(GlobalRank(r)));
        assert!(rig.sim.job().gate(GlobalRank(r)).set_in_flight(side));
    }
    // Two collectives issued everywhere, the second completed on rank 0 only: the link died.
    for _ in 0..2 {
        for r in 0..world {
            group.issue(GlobalRank(r));
        }
    }
    for r in 0..world {
        group.complete(GlobalRank(r), 0);
    }
    group.complete(GlobalRank(0), 1);
    group.set_link(LinkFault::Dead);
    // The simulator's own HCCL training is not behind an in-flight side (tests/in_flight.rs).
    let training = rig.sim.training();
    training.stop_after(training.max_steps() + 1);
    assert!(training.wait_ended(WAIT));

    let events = rig.switch_events(&[("node-0", 2, true)], "", true);
    let Some(Event::Result(r)) = events.last() else {
        panic!("no result in {events:?}");
    };
    assert_eq!(r.result, "succeeded", "{r:?}");
    assert!(r.applied && !r.rolled_back);
    assert_eq!(r.pause_step, None, "no step boundary was waited for");
    let want: Vec<(String, String)> = ["sample", "abort", "switch", "resume"]
        .iter()
        .flat_map(|p| {
            [
                (p.to_string(), "started".into()),
                (p.to_string(), "finished".into()),
            ]
        })
        .collect();
    assert_eq!(phases_of(&events), want);
    // Collective 1 again on the rebuilt group (rank 0's second result dropped).
    while let Some((rank, q)) = group.completable().first().copied() {
        group.complete(rank, q);
    }
    assert_eq!(group.check(2), Ok(()));
    assert_eq!(group.dropped(), 1);
    assert_eq!(rig.status(1).ranks_on_backup, vec![2]);
    common::assert_consistent_end(&rig.sim.finish());
}

/// An in-flight move on a job whose training processes registered no in-flight side fails
/// after its sample, naming the ranks, before anything is aborted or switched; training goes on.
#[test]
fn a_switch_with_abort_in_flight_fails_without_in_flight_sides_and_touches_nothing() {
    let rig = Rig::plain(small());
    let calls = rig.sim.fabric().nic_set_log().len();
    let events = rig.switch_events(&[("node-0", 2, true)], "", true);
    assert!(matches!(&events[0], Event::Accepted(_)), "{events:?}");
    let Some(Event::Result(r)) = events.last() else {
        panic!("no result in {events:?}");
    };
    assert_eq!(r.result, "failed", "{r:?}");
    assert!(!r.applied && !r.rolled_back);
    assert!(
        r.error
            .contains("ranks 0, 1, 2, 3, 4, 5, 6, 7 have no in-flight side"),
        "{}",
        r.error
    );
    let phases: Vec<String> = phases_of(&events).into_iter().map(|(p, _)| p).collect();
    assert!(
        !phases.iter().any(|p| p == "abort" || p == "switch"),
        "{phases:?}"
    );
    assert_eq!(
        rig.sim.fabric().nic_set_log().len(),
        calls,
        "no NIC-set call"
    );
    assert_eq!(rig.status(1).state, "running");
    rig.sim.train(2).unwrap();
    common::assert_consistent_end(&rig.sim.finish());
}
