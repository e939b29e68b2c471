//! The control API with real gRPC clients against an in-process manager on port 0: ClusterD's
//! `Recover` service (codes, subscription) and taskd's `Control` (status, submit-and-wait),
//! bearer-token and mutual-TLS refusals, and the per-client rate limit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use taskd::actors::control::proto::control_client::ControlClient;
use taskd::actors::control::proto::{self, switch_event::Event};
use taskd::actors::control::recover::recover_client::RecoverClient;
use taskd::actors::control::recover::{ClientInfo, DeviceList, SwitchNicRequest, SwitchNics};
use taskd::actors::control::{codes, serve, ControlServer, ControlTls, GuardConfig, RateLimit};
use taskd::core::{GlobalRank, HcclCode};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{SimConfig, Simulation};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

fn small() -> SimConfig {
    SimConfig {
        nodes: 2,
        devices_per_node: 4,
        step_time: Duration::from_millis(1),
        ..SimConfig::default()
    }
}

/// Fields drop in order: the clients' runtime (and their connections) before the server.
struct Rig {
    sim: Simulation,
    rt: tokio::runtime::Runtime,
    server: ControlServer,
}

impl Rig {
    fn start(cfg: SimConfig, guard: GuardConfig, tls: Option<ControlTls>) -> Rig {
        let sim = Simulation::start(&cfg).unwrap();
        let server = serve(
            "127.0.0.1:0".parse().unwrap(),
            sim.job().manager().clone(),
            cfg.job.clone(),
            guard,
            tls,
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Rig { sim, rt, server }
    }

    fn plain(cfg: SimConfig) -> Rig {
        Self::start(cfg, GuardConfig::default(), None)
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn channel(&self) -> Channel {
        let uri = format!("http://{}", self.addr());
        self.rt
            .block_on(Endpoint::from_shared(uri).unwrap().connect())
            .unwrap()
    }

    fn recover(&self) -> RecoverClient<Channel> {
        RecoverClient::new(self.channel())
    }

    fn control(&self) -> ControlClient<Channel> {
        ControlClient::new(self.channel())
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
            .rt
            .block_on(c.switch_nic_track(SwitchNics {
                job_id: job.into(),
                nic_ops,
            }))
            .unwrap()
            .into_inner();
        (s.code, s.info)
    }

    /// Every message of one subscription, until the server ends the stream.
    fn subscribe(&self, job: &str) -> Vec<serde_json::Value> {
        let mut c = self.recover();
        self.rt.block_on(async {
            let mut s = c
                .subscribe_switch_nic_signal(SwitchNicRequest { job_id: job.into() })
                .await
                .unwrap()
                .into_inner();
            let mut out = Vec::new();
            while let Some(m) = s.message().await.unwrap() {
                assert_eq!(m.job_id, job);
                out.push(serde_json::from_str(&m.msg).unwrap());
            }
            out
        })
    }

    fn switch_wait(&self, targets: &[(&str, u32, bool)], uuid: &str) -> Vec<Event> {
        let mut c = self.control();
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
        };
        self.rt.block_on(async {
            let mut s = c.switch(req).await.unwrap().into_inner();
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
    assert_eq!(code, codes::OK, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let uuid = info["uuid"].as_str().unwrap().to_owned();
    let msgs = rig.subscribe("sim");
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["uuid"], uuid);
    assert_eq!(msgs[0]["result"], "succeeded");
    assert_eq!(msgs[0]["direction"], "to_backup");
    assert_eq!(msgs[0]["rolled_back"], false);
    assert!(msgs[0]["phases_ms"]["total"].as_f64().unwrap() > 0.0);
    // Nothing in flight now: the subscription says so at once.
    let msgs = rig.subscribe("sim");
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["result"], "none");
    assert_eq!(
        rig.sim.fabric().ranks_on_backup(),
        vec![GlobalRank(4), GlobalRank(6)]
    );
    let end = rig.sim.finish();
    assert!(end.groups_consistent, "{}", end.consistency);
}

#[test]
fn every_refusal_has_its_code_and_names_what_is_wrong() {
    let rig = Rig::plain(small());
    let (code, info) = rig.switch_nic_track("", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::CLIENT_ERROR, "{info}");
    let (code, info) = rig.switch_nic_track("other-job", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::JOB_NOT_EXIST, "{info}");
    assert!(info.contains("other-job"), "{info}");
    let (code, info) = rig.switch_nic_track("sim", &[("node-7", &["0"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(info.contains("node-7"), "{info}");
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["4"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(
        info.contains("device 4") && info.contains("node-1"),
        "{info}"
    );
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["x"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(info.contains("\"x\""), "{info}");
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["0", "2"], &[true])]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(info.contains("2 devices but 1 operations"), "{info}");
    let (code, info) = rig.switch_nic_track("sim", &[]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(info.contains("no targets"), "{info}");
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["0", "1"], &[true, false])]);
    assert_eq!(code, codes::PARAMETER_INVALID);
    assert!(info.contains("two dies of one NPU"), "{info}");

    // Busy while one is in flight.
    rig.sim
        .fabric()
        .inject_nic_set_fault(GlobalRank(1), NicSetFault::Slow(Duration::from_millis(300)));
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::OK, "{info}");
    let first: serde_json::Value = serde_json::from_str(&info).unwrap();
    let (code, info) = rig.switch_nic_track("sim", &[("node-1", &["0"], &[true])]);
    assert_eq!(code, codes::OPERATION_RUNNING);
    assert!(info.contains(first["uuid"].as_str().unwrap()), "{info}");
    assert_eq!(rig.subscribe("sim")[0]["result"], "succeeded");

    // A worker gone: the job is not fully registered.
    rig.sim.job().kill_worker(GlobalRank(7));
    rig.sim
        .job()
        .wait_registered_count(Some(7), Duration::from_secs(10))
        .unwrap();
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["2"], &[true])]);
    assert_eq!(code, codes::JOB_NOT_REGISTERED, "{info}");
    assert!(info.contains("missing ranks: 7"), "{info}");
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
fn ranks_that_cannot_switch_are_refused_with_412() {
    let rig = Rig::plain(SimConfig {
        l2_retry_off: vec![GlobalRank(2)],
        ..small()
    });
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["0"], &[true])]);
    assert_eq!(code, codes::SWITCH_UNSUPPORTED, "{info}");
    assert!(info.contains("HCCL_OP_RETRY_ENABLE"), "{info}");
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
    let r = &rig.subscribe("sim")[0];
    assert_eq!(r["result"], "failed");
    assert_eq!(r["rolled_back"], false);
    assert_eq!(r["job_state"], "paused");
    let (code, info) = rig.switch_nic_track("sim", &[("node-0", &["2"], &[true])]);
    assert_eq!(code, codes::OUT_OF_ORDER, "{info}");
    rig.sim.finish();
}

#[test]
fn health_check_reports_the_job() {
    let rig = Rig::plain(small());
    let mut c = rig.recover();
    let s = rig
        .rt
        .block_on(c.health_check(ClientInfo {
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
        .rt
        .block_on(c.health_check(ClientInfo {
            job_id: "nope".into(),
            role: "platform".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::JOB_NOT_EXIST);
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
    // The same uuid again: the known result, not a second run.
    let calls = rig.sim.fabric().nic_set_log().len();
    let again = rig.switch_wait(&[("node-0", 2, true), ("node-1", 3, true)], uuid);
    assert!(matches!(&again[0], Event::Accepted(a) if a.known));
    assert!(matches!(again.last(), Some(Event::Result(x)) if x == r));
    assert_eq!(rig.sim.fabric().nic_set_log().len(), calls);
    // A refusal comes as one event with its code.
    let refused = rig.switch_wait(&[("node-9", 0, true)], "");
    assert!(
        matches!(&refused[..], [Event::Refused(x)] if x.code == codes::PARAMETER_INVALID && x.reason.contains("node-9")),
        "{refused:?}"
    );
    let refused = rig.switch_wait(&[("node-0", 0, true)], "not-a-uuid");
    assert!(matches!(&refused[..], [Event::Refused(x)] if x.code == codes::CLIENT_ERROR));

    let mut c = rig.control();
    let s = rig
        .rt
        .block_on(c.get_status(proto::StatusRequest {
            job_id: "sim".into(),
            recent: 5,
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.ranks_on_backup, vec![2, 7]);
    assert_eq!(s.workers_registered, 8);
    assert_eq!(s.workers_expected, 8);
    assert_eq!(s.nodes_connected, 2);
    assert!(s.in_flight.is_none());
    assert_eq!(s.recent.len(), 1);
    assert_eq!(s.state, "running");
    let e = rig
        .rt
        .block_on(c.get_status(proto::StatusRequest {
            job_id: "other".into(),
            recent: 5,
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let end = rig.sim.finish();
    assert!(end.groups_consistent);
}

#[test]
fn a_bearer_token_is_required_when_configured() {
    let rig = Rig::start(
        small(),
        GuardConfig {
            token: Some("s3cret".into()),
            rate: RateLimit::default(),
        },
        None,
    );
    let mut c = rig.recover();
    let info = || ClientInfo {
        job_id: "sim".into(),
        role: "ops".into(),
    };
    let e = rig.rt.block_on(c.health_check(info())).unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut req = tonic::Request::new(info());
    req.metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    let e = rig.rt.block_on(c.health_check(req)).unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut req = tonic::Request::new(info());
    req.metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    let s = rig.rt.block_on(c.health_check(req)).unwrap().into_inner();
    assert_eq!(s.code, codes::OK);
    rig.sim.finish();
}

#[test]
fn a_client_in_a_loop_is_rate_limited() {
    let rig = Rig::start(
        small(),
        GuardConfig {
            token: None,
            rate: RateLimit {
                burst: 3,
                per_second: 0.001,
            },
        },
        None,
    );
    let mut c = rig.recover();
    let info = || ClientInfo {
        job_id: "sim".into(),
        role: "script".into(),
    };
    for _ in 0..3 {
        rig.rt.block_on(c.health_check(info())).unwrap();
    }
    let e = rig.rt.block_on(c.health_check(info())).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("rate limit"), "{}", e.message());
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
    let rig = Rig::start(
        small(),
        GuardConfig::default(),
        Some(ControlTls {
            cert_pem: pki.server_cert.clone().into_bytes(),
            key_pem: pki.server_key.clone().into_bytes(),
            client_ca_pem: Some(pki.ca.clone().into_bytes()),
        }),
    );
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
    let channel = rig.rt.block_on(with_cert.connect()).unwrap();
    let s = rig
        .rt
        .block_on(RecoverClient::new(channel).health_check(ClientInfo {
            job_id: "sim".into(),
            role: "ops".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(s.code, codes::OK);

    // No client certificate: the handshake or the first call fails.
    let without = Endpoint::from_shared(uri).unwrap().tls_config(tls).unwrap();
    let refused = rig.rt.block_on(async {
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
