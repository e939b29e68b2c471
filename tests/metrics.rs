//! The Prometheus endpoint as a scraper sees it: a simulated switch, switchback and a failed
//! switch, then `GET /metrics` over HTTP; then a second simulated job with automatic failover
//! (a failover and two moves held back); and the Grafana dashboard checked against what is
//! really exported.
//!
//! The metrics recorder is process-global, so this file has a binary of its own and runs its
//! simulations once, shared by its tests.

mod common;

use common::small;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;
use taskd::actors::telemetry::{self, serve_metrics};
use taskd::core::auto::{AutoAction, AutoConfig, AutoReason, DeviceKey, Links};
use taskd::core::operation::Outcome;
use taskd::core::{DeviceId, GlobalRank, HcclCode, NodeName};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{SimConfig, Simulation};

/// One series: name and labels.
type Series = (String, BTreeMap<String, String>);

struct Scrape {
    text: String,
    series: BTreeMap<Series, f64>,
}

impl Scrape {
    fn parse(text: String) -> Scrape {
        let mut series = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (key, value) = line.rsplit_once(' ').expect("`series value`");
            let (name, labels) = match key.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').expect("closing brace")),
                None => (key, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("label=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            series.insert(
                (name.to_owned(), labels),
                value.parse::<f64>().expect("a number"),
            );
        }
        Scrape { text, series }
    }

    /// The value of the series with exactly these labels.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.series.get(&(name.to_owned(), labels)).copied()
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in\n{}", self.text))
    }

    /// Sum over every series of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| v)
            .sum()
    }

    fn names(&self) -> BTreeSet<&str> {
        self.series.keys().map(|(n, _)| n.as_str()).collect()
    }
}

fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("the endpoint accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    (head.to_owned(), body.to_owned())
}

struct Run {
    /// After the switch to backup.
    switched: Scrape,
    /// After the switch back.
    back: Scrape,
    /// After a third operation that failed on a HAL error and was rolled back.
    end: Scrape,
    /// After a second job's automatic failover: one device moved, two held back.
    auto: Scrape,
    content_type: String,
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let server = serve_metrics("127.0.0.1:0".parse().unwrap()).expect("serving metrics");
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0, "the bound port is reported");
        let cfg = SimConfig {
            steps_between: 1,
            ..small()
        };
        let sim = Simulation::start(&cfg).expect("the simulation starts");
        let targets = [(NodeName("node-1".into()), vec![DeviceId(0), DeviceId(2)])];
        let scrape = || {
            let (head, body) = get(addr, "/metrics");
            (head, Scrape::parse(body))
        };

        let r = sim.job().run(sim.command(&targets, true)).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
        let (head, switched) = scrape();
        let r = sim.job().run(sim.command(&targets, false)).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
        let (_, back) = scrape();

        sim.fabric()
            .inject_nic_set_fault(GlobalRank(5), NicSetFault::Fail(HcclCode::Network));
        let r = sim.job().run(sim.command(&targets, true)).unwrap();
        assert_eq!(r.outcome, Outcome::Failed, "{r}");
        assert!(r.rolled_back, "{r}");
        let (_, end) = scrape();

        let state = sim.finish();
        assert!(state.groups_consistent, "{}", state.consistency);
        auto_failover(&cfg);
        let (_, auto) = scrape();
        server.shutdown();
        let content_type = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type: ")
                    .map(str::to_owned)
            })
            .expect("a content type");
        Run {
            switched,
            back,
            end,
            auto,
            content_type,
        }
    })
}

/// A job like `cfg` with automatic failover: node-0:2's port fails (it moves to backup), then
/// both ports of node-1's first NPU (neither die has a port to go to: two holds). Returns once
/// the policy has settled; the caller scrapes.
fn auto_failover(cfg: &SimConfig) {
    let auto = AutoConfig {
        link_probe: Duration::from_millis(5),
        // 195 ms: both ports of the NPU are down long before either failure counts.
        down_after: 40,
        coalesce: Duration::from_millis(20),
        switchback_after: Duration::from_secs(60),
        max_flaps: 4,
        flap_window: Duration::from_secs(60),
        min_interval: Duration::from_millis(50),
    };
    let sim = Simulation::start(&SimConfig {
        auto: Some(auto),
        ..cfg.clone()
    })
    .expect("the simulation starts");
    let mut events = sim.job().subscribe_progress();
    sim.fabric().set_link(1, DeviceId(0), false);
    sim.fabric().set_link(1, DeviceId(1), false);
    sim.fabric().set_link(0, DeviceId(2), false);
    let key = |node: &str, device| DeviceKey {
        node: NodeName(node.into()),
        device: DeviceId(device),
    };
    let links = Links::known;
    let expect = vec![
        (key("node-0", 2), links(false, true)),
        (key("node-0", 3), links(true, false)),
        (key("node-1", 0), links(false, false)),
        (key("node-1", 1), links(false, false)),
    ];
    sim.job()
        .await_auto_settled(expect, Duration::from_secs(60), &mut events, |_| {})
        .expect("automatic failover settles");
    assert_eq!(sim.fabric().ranks_on_backup(), [GlobalRank(2)]);
    let state = sim.finish();
    assert!(state.groups_consistent, "{}", state.consistency);
}

const OPS: &str = telemetry::OPERATIONS_TOTAL;
const PHASE: &str = "taskd_switch_phase_duration_seconds";

#[test]
fn a_switch_and_a_switchback_are_counted_by_result_direction_and_phase() {
    let run = run();
    assert!(
        run.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        run.content_type
    );
    let s = &run.back;
    let succeeded = |direction| [("result", "succeeded"), ("direction", direction)];
    assert_eq!(s.value(OPS, &succeeded("to_backup")), 1.0);
    assert_eq!(s.value(OPS, &succeeded("to_primary")), 1.0);
    assert_eq!(s.sum(OPS, &[]), 2.0, "nothing else was counted");

    // Phase histograms: one observation per operation for each phase that ran.
    for phase in ["pause", "switch", "resume", "total"] {
        let count = format!("{PHASE}_count");
        assert_eq!(s.value(&count, &[("phase", phase)]), 2.0, "{phase}");
        assert!(s.value(&format!("{PHASE}_sum"), &[("phase", phase)]) > 0.0);
        let inf = [("phase", phase), ("le", "+Inf")];
        assert_eq!(s.value(&format!("{PHASE}_bucket"), &inf), 2.0);
    }
    assert_eq!(
        s.get(&format!("{PHASE}_count"), &[("phase", "rollback")]),
        None
    );
    // The buckets are the ones chosen for milliseconds to minutes.
    let mut les: Vec<f64> = s
        .series
        .keys()
        .filter(|(n, l)| n == &format!("{PHASE}_bucket") && l["phase"] == "total")
        .filter_map(|(_, l)| l["le"].parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .collect();
    les.sort_by(f64::total_cmp);
    assert_eq!(les, telemetry::DURATION_BUCKETS);
    let total_sum = s.value(&format!("{PHASE}_sum"), &[("phase", "total")]);
    assert!(
        total_sum < 60.0,
        "two simulated operations take milliseconds"
    );

    let stall = telemetry::TRAINING_STALL;
    assert_eq!(s.value(&format!("{stall}_count"), &[]), 2.0);
    assert!(s.value(&format!("{stall}_sum"), &[]) > 0.0);

    // Gauges.
    assert_eq!(s.value(telemetry::WORKERS_EXPECTED, &[]), 8.0);
    assert_eq!(s.value(telemetry::WORKERS_REGISTERED, &[]), 8.0);
    assert_eq!(s.value(telemetry::OPERATION_IN_FLIGHT, &[]), 0.0);
    assert_eq!(s.value(telemetry::OPERATION_PENDING_RANKS, &[]), 0.0);
    // Every rank was held during each operation and released after it.
    assert_eq!(s.value(telemetry::RANKS_HELD, &[]), 0.0);
    assert_eq!(run.switched.value(telemetry::RANKS_ON_BACKUP, &[]), 2.0);
    assert_eq!(s.value(telemetry::RANKS_ON_BACKUP, &[]), 0.0);
    assert_eq!(s.value(telemetry::JOB_STATE, &[("state", "running")]), 1.0);
    assert_eq!(s.value(telemetry::JOB_STATE, &[("state", "paused")]), 0.0);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(s.value(telemetry::BUILD_INFO, &[("version", version)]), 1.0);
}

#[test]
fn every_role_counts_its_messages_and_hal_calls() {
    let s = &run().back;
    let msgs = telemetry::MESSAGES_TOTAL;
    let m = |direction, kind| s.value(msgs, &[("direction", direction), ("kind", kind)]);
    // Registration: 8 workers said hello to their proxy, which passed each on.
    assert_eq!(m("out", "hello"), 8.0);
    assert_eq!(m("in", "hello"), 8.0);
    assert_eq!(m("out", "worker_up"), 8.0);
    assert_eq!(m("in", "worker_up"), 8.0);
    // Each of the 2 operations' 4 phases: the manager sends one directive per node (2), each
    // proxy receives it and relays one per worker (4 each), each worker receives one.
    for phase in ["sample", "pause", "switch", "resume"] {
        assert_eq!(m("out", phase), 2.0 * (2.0 + 8.0), "{phase}");
        assert_eq!(m("in", phase), 2.0 * (2.0 + 8.0), "{phase}");
    }
    // The verification round after registration: one directive per node and worker.
    assert_eq!(m("out", "verify"), 2.0 + 8.0);
    // One reply per rank and phase (and to the verification), fanned in to one node reply per
    // node and phase.
    assert_eq!(m("out", "reply"), 2.0 * 4.0 * 8.0 + 8.0);
    assert_eq!(m("in", "reply"), 2.0 * 4.0 * 8.0 + 8.0);
    assert_eq!(m("out", "node_reply"), m("in", "node_reply"));
    assert!(m("in", "node_reply") >= 2.0 * 4.0 * 2.0);

    let hal = telemetry::HAL_CALLS_TOTAL;
    // Every rank lists its groups once per switch and once for the verification.
    assert_eq!(
        s.value(hal, &[("op", "groups"), ("result", "ok")]),
        2.0 * 8.0 + 8.0
    );
    // The proxy of node-1 reads the link health of its 2 targets once per operation.
    assert_eq!(
        s.value(hal, &[("op", "link_health"), ("result", "ok")]),
        2.0 * 2.0
    );
    let nic_sets = s.value(hal, &[("op", "set_working_nic"), ("result", "ok")]);
    assert!(nic_sets >= 2.0 * 8.0, "every rank shares the world group");
    assert_eq!(s.sum(hal, &[("result", "error")]), 0.0);
    let dur = format!("{}_count", telemetry::HAL_CALL_DURATION);
    assert_eq!(s.value(&dur, &[("op", "set_working_nic")]), nic_sets);
    // Cardinality: no label names a rank, node, group or operation.
    for (name, labels) in s.series.keys() {
        for k in labels.keys() {
            assert!(
                [
                    "result",
                    "direction",
                    "phase",
                    "op",
                    "code",
                    "kind",
                    "state",
                    "version",
                    "le"
                ]
                .contains(&k.as_str()),
                "{name} has an unbounded label {k}"
            );
        }
    }
}

#[test]
fn a_failed_switch_counts_its_rollback_and_hal_error() {
    let run = run();
    let s = &run.end;
    assert_eq!(
        s.value(OPS, &[("result", "failed"), ("direction", "to_backup")]),
        1.0
    );
    assert_eq!(
        s.value(OPS, &[("result", "succeeded"), ("direction", "to_backup")]),
        1.0
    );
    assert_eq!(
        s.value(&format!("{PHASE}_count"), &[("phase", "rollback")]),
        1.0
    );
    assert_eq!(
        s.value(&format!("{PHASE}_count"), &[("phase", "total")]),
        3.0
    );
    let errors = telemetry::HAL_ERRORS_TOTAL;
    assert_eq!(
        s.value(
            errors,
            &[
                ("op", "set_working_nic"),
                ("kind", "network"),
                ("code", "HCCL_E_NETWORK")
            ]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            telemetry::HAL_CALLS_TOTAL,
            &[("op", "set_working_nic"), ("result", "error")]
        ),
        1.0
    );
    assert_eq!(s.value(telemetry::JOB_STATE, &[("state", "running")]), 1.0);
    assert_eq!(s.value(telemetry::RANKS_ON_BACKUP, &[]), 0.0);
}

/// Every `taskd_*` metric name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("taskd_") {
        // Only at the start of an identifier.
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The name a series belongs to: a histogram's `_bucket`, `_sum` and `_count` are its own.
fn base_name(series: &str) -> &str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix) {
            if telemetry::ALL.contains(&base) {
                return base;
            }
        }
    }
    series
}

/// The PromQL of every panel target (rows' nested panels included) and of every query
/// variable.
fn collect_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn panels(list: &serde_json::Value, out: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().expect("a target's expr").to_owned());
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for a in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(e) = a["expr"].as_str() {
            out.push(e.to_owned());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let q = match &var["query"] {
                serde_json::Value::String(s) => s.clone(),
                q => q["query"].as_str().expect("a variable's query").to_owned(),
            };
            out.push(q);
        }
    }
    out
}

#[test]
fn every_metric_the_dashboard_queries_is_exported_and_scraped() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana/taskd-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard file"))
            .expect("the dashboard is JSON");
    assert!(dashboard["title"].as_str().is_some());
    let panels = dashboard["panels"].as_array().expect("panels");
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has its own id");

    let exprs = collect_queries(&dashboard);
    assert!(exprs.len() >= 10, "{exprs:?}");

    let s = &run().auto;
    let scraped = s.names();
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query with no taskd metric: {expr}");
        for series in names {
            let base = base_name(&series);
            assert!(
                telemetry::ALL.contains(&base),
                "the dashboard queries {series}, which taskd does not export ({expr})"
            );
            assert!(
                scraped.contains(series.as_str()),
                "the dashboard queries {series}, which a real scrape does not have ({expr})"
            );
            used.insert(base.to_owned());
        }
    }
    // The panels the dashboard promises.
    for must in [
        telemetry::OPERATIONS_TOTAL,
        telemetry::PHASE_DURATION,
        telemetry::TRAINING_STALL,
        telemetry::RANKS_ON_BACKUP,
        telemetry::WORKERS_REGISTERED,
        telemetry::WORKERS_EXPECTED,
        telemetry::HAL_CALLS_TOTAL,
        telemetry::AUTO_DECISIONS_TOTAL,
    ] {
        assert!(used.contains(must), "the dashboard does not show {must}");
    }
}

#[test]
fn automatic_failover_counts_each_decision_by_action_and_reason() {
    let run = run();
    let auto = telemetry::AUTO_DECISIONS_TOTAL;
    assert_eq!(
        run.end.sum(auto, &[]),
        0.0,
        "nothing before automatic failover"
    );
    let s = &run.auto;
    let count = |action, reason| s.value(auto, &[("action", action), ("reason", reason)]);
    assert_eq!(count("to_backup", "primary_down"), 1.0);
    assert_eq!(count("hold", "backup_down"), 2.0);
    assert_eq!(s.sum(auto, &[]), 3.0, "nothing else was decided");
    // The failover is an operation like any other.
    let ok = [("result", "succeeded"), ("direction", "to_backup")];
    assert_eq!(s.value(OPS, &ok), run.end.value(OPS, &ok) + 1.0);
    // Bounded labels: every action and reason is one of the policy's fixed names.
    let actions: Vec<&str> = AutoAction::ALL.iter().map(|a| a.as_str()).collect();
    let reasons: Vec<&str> = AutoReason::ALL.iter().map(|r| r.as_str()).collect();
    for (name, labels) in s.series.keys() {
        if name == auto {
            assert_eq!(labels.len(), 2, "{labels:?}");
            assert!(actions.contains(&labels["action"].as_str()), "{labels:?}");
            assert!(reasons.contains(&labels["reason"].as_str()), "{labels:?}");
        }
    }
}

#[test]
fn metric_names_are_found_in_promql() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.9, sum by (le) (rate(taskd_switch_phase_duration_seconds_bucket{phase=\"total\"}[5m]))) / taskd_x"
        ),
        ["taskd_switch_phase_duration_seconds_bucket", "taskd_x"]
    );
    assert_eq!(metric_names("sum(my_taskd_thing)"), Vec::<String>::new());
    assert_eq!(
        base_name("taskd_training_stall_seconds_sum"),
        "taskd_training_stall_seconds"
    );
    assert_eq!(base_name("taskd_messages_total"), "taskd_messages_total");
}
