//! Automatic failover and switchback through the actors on the simulated fabric: the proxies
//! probe the links, the manager's policy decides, its operations run like an operator's. The
//! tests change links on the fabric and wait on the manager's progress feed (link reports,
//! decisions, results), never on the clock; the policy's knobs are milliseconds. Every test
//! ends with the invariant: every communication group agrees on its NIC configuration.

mod common;
mod net_support;

use common::{assert_consistent_end, cmd, manager_args, proxy_args, small};
use net_support::{fast_heartbeats, s, worker_args, Proc, Scratch};
use std::time::Duration;
use taskd::actors::{ProgressEvent, ProgressKind};
use taskd::core::auto::{AutoAction, AutoConfig, AutoDecision, AutoReason, DeviceKey, Links};
use taskd::core::operation::{JobState, OperationReport, Outcome, Trigger};
use taskd::core::protocol::Phase;
use taskd::core::{DeviceId, Direction, GlobalRank, HcclCode, NodeName};
use taskd::hal_mock::NicSetFault;
use taskd::sim::{FinalState, SimConfig, Simulation};
use tokio::sync::broadcast::{error::RecvError, Receiver};

/// A bound on every wait, so a broken build fails instead of hanging; never reached.
const WAIT: Duration = Duration::from_secs(60);

fn knobs() -> AutoConfig {
    AutoConfig {
        link_probe: Duration::from_millis(5),
        down_after: 2,
        coalesce: Duration::from_millis(20),
        switchback_after: Duration::from_millis(300),
        max_flaps: 4,
        flap_window: Duration::from_secs(60),
        min_interval: Duration::from_millis(50),
    }
}

fn start(auto: AutoConfig) -> Simulation {
    Simulation::start(&SimConfig {
        auto: Some(auto),
        ..small()
    })
    .expect("the simulation starts")
}

fn key(node: u32, device: u32) -> DeviceKey {
    DeviceKey::new(NodeName::uniform(node), DeviceId(device))
}

fn links(primary: bool, backup: bool) -> Links {
    Links::known(primary, backup)
}

/// The manager's progress feed, and every event seen on it so far.
struct Feed {
    rx: Receiver<ProgressEvent>,
    rt: tokio::runtime::Runtime,
    seen: Vec<ProgressEvent>,
}

impl Feed {
    fn new(sim: &Simulation) -> Feed {
        Feed {
            rx: sim.job().subscribe_progress(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap(),
            seen: Vec::new(),
        }
    }

    /// Reads events until `f` finds what it looks for.
    fn until<T>(&mut self, what: &str, mut f: impl FnMut(&ProgressEvent) -> Option<T>) -> T {
        let (rx, seen) = (&mut self.rx, &mut self.seen);
        let read = async {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        seen.push(ev.clone());
                        if let Some(t) = f(&ev) {
                            return t;
                        }
                    }
                    Err(RecvError::Lagged(n)) => panic!("{n} events lost"),
                    Err(RecvError::Closed) => panic!("the manager is gone"),
                }
            }
        };
        let found = self
            .rt
            .block_on(async { tokio::time::timeout(WAIT, read).await });
        found.unwrap_or_else(|_| panic!("no {what} in {:#?}", self.decisions()))
    }

    /// Waits until the manager has seen `device`'s links as `want`; returns when, on its
    /// clock.
    fn links_seen(&mut self, device: &DeviceKey, want: Links) -> Duration {
        self.until("link report", |ev| match &ev.kind {
            ProgressKind::Links { report, at }
                if report.node == device.node
                    && report.device == device.device
                    && report.links == want =>
            {
                Some(*at)
            }
            _ => None,
        })
    }

    /// Waits for the next final report of an automatic operation.
    fn auto_result(&mut self) -> OperationReport {
        self.until("automatic operation's result", |ev| match &ev.kind {
            ProgressKind::Finished(r) if r.trigger == Trigger::Auto => Some((**r).clone()),
            _ => None,
        })
    }

    /// Waits until automatic failover has settled with the manager seeing `links`.
    fn settled(&mut self, sim: &Simulation, links: Vec<(DeviceKey, Links)>) {
        let seen = &mut self.seen;
        sim.job()
            .await_auto_settled(links, WAIT, &mut self.rx, |ev| seen.push(ev.clone()))
            .expect("automatic failover settles");
    }

    fn decisions(&self) -> Vec<&AutoDecision> {
        self.seen
            .iter()
            .filter_map(|ev| match &ev.kind {
                ProgressKind::Decision(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    fn results(&self) -> Vec<&OperationReport> {
        self.seen.iter().filter_map(ProgressEvent::report).collect()
    }

    /// Where in the feed the first event `f` matches is.
    fn position(&self, f: impl Fn(&ProgressEvent) -> bool) -> usize {
        self.seen.iter().position(f).expect("the event was seen")
    }
}

fn summary(d: &AutoDecision) -> String {
    format!(
        "{}:{} {} {}",
        d.node,
        d.device,
        d.action.as_str(),
        d.reason.as_str()
    )
}

fn targets(r: &OperationReport) -> Vec<(String, u32, bool)> {
    r.targets
        .iter()
        .map(|t| (t.node.0.clone(), t.device.0, t.use_backup))
        .collect()
}

/// The invariant every scenario ends with, and the job running.
fn assert_consistent_running_end(end: &FinalState) {
    assert_consistent_end(end);
    assert_eq!(end.job_state, JobState::Running);
}

#[test]
fn a_failed_link_moves_its_device_to_backup_and_back_after_the_hold_time() {
    let sim = start(knobs());
    let mut feed = Feed::new(&sim);
    sim.fabric().set_link(1, DeviceId(0), false);
    let failed = feed.links_seen(&key(1, 0), links(false, true));
    let r = feed.auto_result();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(r.direction, Direction::ToBackup);
    assert_eq!(targets(&r), [("node-1".into(), 0, true)]);
    assert_eq!(sim.fabric().ranks_on_backup(), [GlobalRank(4)]);
    let moved = feed.decisions()[0].clone();
    assert_eq!(summary(&moved), "node-1:0 to_backup primary_down");
    assert_eq!(moved.operation, Some(r.id));
    // Not before the second failed probe.
    assert!(moved.at >= failed + knobs().link_probe, "{moved:?}");
    sim.train(2).unwrap();

    sim.fabric().set_link(1, DeviceId(0), true);
    let recovered = feed.links_seen(&key(1, 0), links(true, true));
    let r = feed.auto_result();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(targets(&r), [("node-1".into(), 0, false)]);
    let back = feed.decisions().last().copied().cloned().unwrap();
    assert_eq!(summary(&back), "node-1:0 to_primary primary_recovered");
    assert!(
        back.at >= recovered + knobs().switchback_after,
        "switched back {:?} after the primary came up",
        back.at - recovered
    );
    assert!(sim.fabric().ranks_on_backup().is_empty());

    feed.settled(&sim, vec![(key(1, 0), links(true, true))]);
    assert_eq!(feed.results().len(), 2, "one failover, one switchback");
    assert_eq!(feed.decisions().len(), 2, "{:#?}", feed.decisions());
    let status = sim.job().status(10).unwrap();
    assert!(status.recent.iter().all(|r| r.trigger == Trigger::Auto));
    sim.train(2).unwrap();
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn devices_of_two_nodes_failing_together_move_in_one_operation() {
    // A window far wider than the two proxies' probes are apart.
    let sim = start(AutoConfig {
        coalesce: Duration::from_secs(1),
        ..knobs()
    });
    let mut feed = Feed::new(&sim);
    sim.fabric().set_link(0, DeviceId(2), false);
    sim.fabric().set_link(1, DeviceId(1), false);
    let r = feed.auto_result();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    let mut moved = targets(&r);
    moved.sort();
    assert_eq!(
        moved,
        [("node-0".into(), 2, true), ("node-1".into(), 1, true)]
    );
    feed.settled(
        &sim,
        vec![
            (key(0, 2), links(false, true)),
            (key(0, 3), links(true, false)),
            (key(1, 1), links(false, true)),
            (key(1, 0), links(true, false)),
        ],
    );
    assert_eq!(feed.results().len(), 1, "one operation");
    let d: Vec<String> = feed.decisions().into_iter().map(summary).collect();
    assert_eq!(
        d,
        [
            "node-0:2 to_backup primary_down",
            "node-1:1 to_backup primary_down"
        ]
    );
    assert_eq!(
        sim.fabric().ranks_on_backup(),
        [GlobalRank(2), GlobalRank(5)]
    );
    sim.train(2).unwrap();
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn a_flapping_link_is_held_and_causes_no_operation_storm() {
    // A failure counts after 50 probes (245 ms): each flap is far shorter. Five changes in
    // the 1.5 s window are more than the 4 allowed.
    let window = Duration::from_millis(1500);
    let sim = start(AutoConfig {
        down_after: 50,
        flap_window: window,
        ..knobs()
    });
    let mut feed = Feed::new(&sim);
    let flapping = key(1, 2);
    let mut first = None;
    for i in 0..5 {
        let up = i % 2 == 1;
        sim.fabric().set_link(1, DeviceId(2), up);
        let at = feed.links_seen(&flapping, links(up, true));
        first.get_or_insert(at);
    }
    let first = first.unwrap();
    // The link stays down. Held while it flaps (its partner's backup flaps too), then, once
    // calm, one failover.
    let r = feed.auto_result();
    assert_eq!(targets(&r), [("node-1".into(), 2, true)]);
    let d: Vec<String> = feed.decisions().into_iter().map(summary).collect();
    assert_eq!(
        d,
        [
            "node-1:2 hold flapping",
            "node-1:3 hold flapping",
            "node-1:2 to_backup primary_down"
        ]
    );
    let moved = feed.decisions()[2].at;
    assert!(
        moved >= first + window,
        "moved {moved:?}, first change {first:?}"
    );
    feed.settled(
        &sim,
        vec![
            (key(1, 2), links(false, true)),
            (key(1, 3), links(true, false)),
        ],
    );
    assert_eq!(feed.results().len(), 1, "no storm: {:#?}", feed.decisions());
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn a_link_failing_during_an_operators_operation_is_acted_on_after_it() {
    let sim = start(knobs());
    let mut feed = Feed::new(&sim);
    // The operator's switch takes 300 ms (one rank's call is slow).
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(0), NicSetFault::Slow(Duration::from_millis(300)));
    let operator = sim.job().submit(cmd(&[("node-0", 1, true)])).unwrap().id();
    feed.until("the operator's switch", |ev| match ev.kind {
        ProgressKind::PhaseStarted {
            phase: Phase::Switch,
            ..
        } if ev.op == operator => Some(()),
        _ => None,
    });
    sim.fabric().set_link(1, DeviceId(2), false);
    let held = feed.until("a hold", |ev| match &ev.kind {
        ProgressKind::Decision(d) => Some(d.clone()),
        _ => None,
    });
    assert_eq!(summary(&held), "node-1:2 hold operation_running");
    let r = feed.auto_result();
    assert_eq!(targets(&r), [("node-1".into(), 2, true)]);
    let operator_done = feed.position(|ev| ev.op == operator && ev.report().is_some());
    let auto_decided = feed.position(
        |ev| matches!(&ev.kind, ProgressKind::Decision(d) if d.action == AutoAction::ToBackup),
    );
    assert!(
        operator_done < auto_decided,
        "acted on after the operator's"
    );
    let mine = sim.job().wait(operator).unwrap();
    assert_eq!(
        (mine.outcome, mine.trigger),
        (Outcome::Succeeded, Trigger::Operator)
    );
    assert_eq!(
        sim.fabric().ranks_on_backup(),
        [GlobalRank(1), GlobalRank(6)]
    );
    sim.train(2).unwrap();
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn with_the_backup_link_down_too_nothing_moves_and_the_decision_says_why() {
    // A failure counts after 40 probes: the two ports are down long before either counts.
    let sim = start(AutoConfig {
        down_after: 40,
        ..knobs()
    });
    let mut feed = Feed::new(&sim);
    // Both ports of NPU 0 of node-1: each die's primary is the other's backup.
    sim.fabric().set_link(1, DeviceId(1), false);
    sim.fabric().set_link(1, DeviceId(0), false);
    feed.settled(
        &sim,
        vec![
            (key(1, 0), links(false, false)),
            (key(1, 1), links(false, false)),
        ],
    );
    let mut d: Vec<String> = feed.decisions().into_iter().map(summary).collect();
    d.sort();
    assert_eq!(
        d,
        ["node-1:0 hold backup_down", "node-1:1 hold backup_down"]
    );
    assert!(feed.results().is_empty());
    assert!(sim.job().status(10).unwrap().recent.is_empty());
    assert!(sim.fabric().ranks_on_backup().is_empty());
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn a_failed_automatic_operation_waits_for_the_links_to_change() {
    let sim = start(knobs());
    let mut feed = Feed::new(&sim);
    sim.fabric().set_link(1, DeviceId(0), false);
    assert_eq!(feed.auto_result().outcome, Outcome::Succeeded);
    // The switchback fails on rank 4 and is rolled back onto the backup, whose link is up.
    sim.fabric()
        .inject_nic_set_fault(GlobalRank(4), NicSetFault::Fail(HcclCode::Network));
    sim.fabric().set_link(1, DeviceId(0), true);
    let r = feed.auto_result();
    assert_eq!(targets(&r), [("node-1".into(), 0, false)]);
    assert_eq!(
        (r.outcome, r.rolled_back, r.job_state),
        (Outcome::Failed, true, JobState::Running),
        "{r}"
    );
    let held = feed.until("a hold", |ev| match &ev.kind {
        ProgressKind::Decision(d) if d.action == AutoAction::Hold => Some(d.clone()),
        _ => None,
    });
    assert_eq!(summary(&held), "node-1:0 hold failed_before");
    assert_eq!(held.reason, AutoReason::FailedBefore);
    // Settled: nothing runs and the policy waits for nothing, so no retry comes.
    feed.settled(&sim, vec![(key(1, 0), links(true, true))]);
    assert_eq!(feed.results().len(), 2);
    assert_eq!(sim.fabric().ranks_on_backup(), [GlobalRank(4)]);
    // Its primary dips and returns: the links changed, so after the hold time it is tried
    // again.
    sim.fabric().set_link(1, DeviceId(0), false);
    feed.links_seen(&key(1, 0), links(false, true));
    sim.fabric().set_link(1, DeviceId(0), true);
    let r = feed.auto_result();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r}");
    assert_eq!(targets(&r), [("node-1".into(), 0, false)]);
    feed.settled(&sim, vec![(key(1, 0), links(true, true))]);
    assert_eq!(feed.results().len(), 3);
    assert!(sim.fabric().ranks_on_backup().is_empty());
    sim.train(2).unwrap();
    assert_consistent_running_end(&sim.finish());
}

#[test]
fn an_operators_move_to_backup_is_not_undone() {
    let sim = start(knobs());
    let mut feed = Feed::new(&sim);
    let r = sim.job().run(cmd(&[("node-0", 3, true)])).unwrap();
    assert_eq!(
        (r.outcome, r.trigger),
        (Outcome::Succeeded, Trigger::Operator)
    );
    // Its primary has been up all along, far longer than the hold time: still nothing.
    feed.settled(&sim, vec![(key(0, 3), links(true, true))]);
    assert!(feed.decisions().is_empty(), "{:#?}", feed.decisions());
    assert_eq!(sim.fabric().ranks_on_backup(), [GlobalRank(3)]);
    sim.train(2).unwrap();
    assert_consistent_running_end(&sim.finish());
}

/// The roles as processes: `taskd manager --auto-failover` tells its proxy to probe; the
/// proxy's simulated port 0 is down from the start, so the manager moves device 0 to its
/// backup NIC by itself once the job is verified, and says so on stdout.
#[test]
fn a_manager_process_with_automatic_failover_moves_a_device_whose_link_is_down() {
    let scratch = Scratch::new("auto-process");
    let job = "auto-process";
    let mut manager = Proc::spawn(
        &scratch,
        "manager",
        &[
            s(&manager_args(job, "2")),
            s(&[
                "--auto-failover",
                "--link-probe-ms",
                "10",
                "--down-after",
                "2",
                "--coalesce-ms",
                "10",
            ]),
            fast_heartbeats(),
        ]
        .concat(),
    );
    let addr = manager.listening_addr();
    manager.wait_line("automatic failover on (links probed every 10 ms)");
    let mut proxy = Proc::spawn(
        &scratch,
        "proxy",
        &[
            s(&proxy_args(job, &addr)),
            s(&["--sim-link-down", "0"]),
            fast_heartbeats(),
        ]
        .concat(),
    );
    let proxy_addr = proxy.listening_addr();
    let mut workers: Vec<Proc> = (0..2)
        .map(|r| {
            let args = [worker_args(job, r, &proxy_addr), fast_heartbeats()].concat();
            Proc::spawn(&scratch, &format!("worker-{r}"), &args)
        })
        .collect();
    for w in &mut workers {
        w.wait_line("registered on");
    }
    let line = manager.wait_line("taskd manager: automatic operation");
    assert!(
        line.contains("(to_backup, 1 targets): succeeded"),
        "{line}; manager stderr:\n{}",
        manager.stderr_tail()
    );
    let log = manager.stderr();
    assert!(
        log.contains("automatic failover: node-0:0 to_backup"),
        "{}",
        manager.stderr_tail()
    );
    for p in workers.iter().chain([&proxy, &manager]) {
        p.term();
    }
    for p in workers.iter_mut().chain([&mut proxy, &mut manager]) {
        let st = p.wait_exit();
        assert!(
            st.success(),
            "{} exited with {st}: {}",
            p.name,
            p.stderr_tail()
        );
    }
}

/// `taskd sim --auto-failover` as a user runs it: link events instead of operator operations,
/// and the JSON report lists every operation with its trigger, and every decision.
#[test]
fn taskd_sim_runs_link_events_and_reports_triggers_and_decisions() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskd"))
        .args(["sim", "--json", "--nodes", "2", "--devices-per-node", "4"])
        .args([
            "--auto-failover",
            "--link-probe-ms",
            "5",
            "--down-after",
            "20",
        ])
        .args(["--coalesce-ms", "20", "--switchback-after-ms", "200"])
        .args(["--min-interval-ms", "50"])
        .args(["--link-down", "node-1:0@0", "--link-up", "node-1:0@1500"])
        .args(["--link-down", "node-0:2@0", "--link-down", "node-0:3@0"])
        .output()
        .expect("taskd runs");
    let err = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{err}\n{v:#}");
    assert_eq!(v["invariants"]["ok"], true, "{v:#}");
    assert_eq!(v["groups_consistent"], true);
    assert_eq!(v["ranks_on_backup"], serde_json::json!([]));
    let ops = v["operations"].as_array().unwrap();
    let got: Vec<(&str, &str, &str)> = ops
        .iter()
        .map(|o| {
            (
                o["trigger"].as_str().unwrap(),
                o["direction"].as_str().unwrap(),
                o["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("auto", "to_backup", "succeeded"),
            ("auto", "to_primary", "succeeded")
        ]
    );
    let mut decisions: Vec<String> = v["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{}:{} {} {} {}",
                d["node"].as_str().unwrap(),
                d["device"],
                d["action"].as_str().unwrap(),
                d["reason"].as_str().unwrap(),
                d["operation"].is_string()
            )
        })
        .collect();
    decisions.sort();
    assert_eq!(
        decisions,
        [
            "node-0:2 hold backup_down false",
            "node-0:3 hold backup_down false",
            "node-1:0 to_backup primary_down true",
            "node-1:0 to_primary primary_recovered true",
        ]
    );
    assert_eq!(v["decisions"][0]["primary"], "down");
}

#[test]
fn taskd_sim_refuses_link_events_it_cannot_run_naming_them() {
    let sim = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskd"))
            .arg("sim")
            .args(args)
            .output()
            .expect("taskd runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = sim(&["--link-down", "node-1:0@5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--auto-failover"), "{err}");
    let (code, err) = sim(&["--auto-failover", "--link-down", "node-9:0@5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("node-9:0"), "{err}");
    let (code, err) = sim(&["--auto-failover", "--max-flaps", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--max-flaps"), "{err}");
}
