//! The hardware-in-the-loop rig (`taskd::rig`, what `examples/hil_rig.rs` runs) end to end
//! against the stub vendor libraries: real threads per rank, multi-rank all-reduces in the
//! HCCL stub, the production actors, `AscendRankHal` and `AscendNodeHal`.
//!
//! Each test installs its own copy of the stubs (own call logs) and hands the rig an
//! environment map; the process environment is never touched.

mod common;

use common::{deadlines, lookup, stub_env, stub_install};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;
use taskd::rig::{Rig, RigConfig, RigLibraries};
use taskd_core::{plan_calls, DeviceId, GlobalRank, GroupInfo, NicSide};
use taskd_hal_ascend::testing::{self, NicSetRecord, StubControl, StubInstall};

fn fresh_stubs(test: &str) -> StubInstall {
    stub_install("hil-rig", test)
}

fn config(n: u32, pairs: bool) -> RigConfig {
    let mut c = RigConfig::new(n);
    if pairs {
        c.extra_groups = RigConfig::pairs(n as usize);
    }
    c.elements = 64;
    // No compute between all-reduces: steps of tens of microseconds, far shorter than the
    // spread between the ranks' pause requests, the hardest case for the two-phase pause.
    c.compute = Duration::ZERO;
    c.window = 3;
    c.deadlines = deadlines(Duration::from_secs(30));
    c.progress_timeout = Duration::from_secs(60);
    c
}

/// `nRanks=.. ranks=[..] useBackup=[..]` as the HCCL stub logs a call.
fn args(ranks: &[u32], use_backup: &[bool]) -> String {
    let r: Vec<String> = ranks.iter().map(u32::to_string).collect();
    let b: Vec<String> = use_backup
        .iter()
        .map(|b| u8::from(*b).to_string())
        .collect();
    format!(
        "nRanks={} ranks=[{}] useBackup=[{}]",
        ranks.len(),
        r.join(","),
        b.join(",")
    )
}

/// Per global rank, the NIC-set calls the stub recorded: (group name, arguments), in order.
fn recorded_by_rank(log: &[String], groups: &[GroupInfo]) -> BTreeMap<u32, Vec<(String, String)>> {
    let members: HashMap<&str, &[GlobalRank]> = groups
        .iter()
        .map(|g| (g.name.as_str(), g.members.as_slice()))
        .collect();
    let mut out: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
    for r in log.iter().filter_map(|l| NicSetRecord::parse(l)) {
        let global = members[r.group.as_str()][r.rank as usize].0;
        out.entry(global).or_default().push((r.group, r.args));
    }
    out
}

/// What the planner says rank `rank` must call for `targets`.
fn planned(
    groups_of_rank: &[GroupInfo],
    targets: &[(GlobalRank, NicSide)],
) -> Vec<(String, String)> {
    plan_calls(groups_of_rank, targets)
        .into_iter()
        .map(|c| {
            let ranks: Vec<u32> = c.ranks.iter().map(|r| r.0).collect();
            (c.group.clone(), args(&ranks, &c.use_backup()))
        })
        .collect()
}

#[test]
fn four_ranks_switch_to_backup_and_back_with_every_rank_calling_in_planner_order() {
    let stubs = fresh_stubs("e2e");
    let hccl = StubControl::attach(&stubs.hccl);
    let env = stub_env(&stubs);
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(4, true), libs, &lookup(&env)).unwrap();
    assert!(rig.node_hal().starts_with("DCMI"), "{}", rig.node_hal());
    let rank_groups = rig.rank_groups().to_vec();
    let groups = rig.groups();
    assert_eq!(groups.len(), 3, "world and two pairs: {groups:?}");
    for (r, mine) in rank_groups.iter().enumerate() {
        assert_eq!(mine.len(), 2, "rank {r} is in the world and one pair");
        assert_eq!(mine[0].members.len(), 4, "world first");
    }
    rig.train(2).unwrap();

    // Devices 0 and 2 (ranks 0 and 2): one in each pair, both in the world group.
    let devices = [DeviceId(0), DeviceId(2)];
    let op1 = rig.switch(&devices, true).unwrap().clone();
    assert_eq!(op1.summary.result, "succeeded", "{op1:?}");
    assert!(op1.summary.applied);
    let op2 = rig.switch(&devices, false).unwrap().clone();
    assert_eq!(op2.summary.result, "succeeded", "{op2:?}");
    for op in [&op1, &op2] {
        let labels: Vec<&str> = op.windows.iter().map(|w| w.label).collect();
        assert_eq!(labels, ["before", "during", "after"]);
        let t = op.summary.pause_step.expect("every rank paused");
        assert_eq!(
            op.windows[1].last_step,
            t + 1,
            "during ends with the first step after resume"
        );
        for w in [&op.windows[0], &op.windows[2]] {
            assert_eq!(w.samples, 4 * 3, "{w:?}: 4 ranks x window of 3");
            assert!(w.min_ms <= w.median_ms && w.median_ms <= w.max_ms, "{w:?}");
        }
    }
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert!(report.ranks_on_backup.is_empty());
    assert_eq!(report.wrong_results, 0);

    // The stub saw every rank make exactly the planner's calls, operation by operation, with
    // identical arguments on every member of each group.
    let log = hccl.log();
    let agreed = testing::nic_set_agreement(&log).unwrap_or_else(|e| panic!("{e}"));
    for g in &groups {
        let calls = &agreed[&g.name];
        assert_eq!(
            calls.callers.len(),
            g.members.len(),
            "every member of {} called",
            g.name
        );
    }
    let recorded = recorded_by_rank(&log, &groups);
    let to_backup = [
        (GlobalRank(0), NicSide::Backup),
        (GlobalRank(2), NicSide::Backup),
    ];
    let to_primary = [
        (GlobalRank(0), NicSide::Primary),
        (GlobalRank(2), NicSide::Primary),
    ];
    for (r, mine) in rank_groups.iter().enumerate() {
        let mut want = planned(mine, &to_backup);
        want.extend(planned(mine, &to_primary));
        assert_eq!(recorded[&(r as u32)], want, "rank {r}");
        // The planner's order: groups sorted by name.
        let names: Vec<&str> = want
            .iter()
            .take(want.len() / 2)
            .map(|(g, _)| g.as_str())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }
    // World: both targets, in command order; each pair: its own target only.
    let world = &groups.iter().find(|g| g.members.len() == 4).unwrap().name;
    assert_eq!(
        agreed[world].calls,
        vec![args(&[0, 2], &[true, true]), args(&[0, 2], &[false, false])]
    );
    for pair in groups.iter().filter(|g| g.members.len() == 2) {
        assert_eq!(
            agreed[&pair.name].calls,
            vec![args(&[0], &[true]), args(&[0], &[false])],
            "{pair:?}"
        );
    }
    // Nothing broke HCCL's rules, and every communicator was destroyed once.
    for bad in [
        "NICSET_",
        "BAD_COMM",
        "HcclAllReduce TIMEOUT",
        "HcclAllReduce MISMATCH",
        "HcclAllReduce BROKEN",
    ] {
        assert!(
            log.iter().all(|l| !l.starts_with(bad)),
            "{bad}: {:?}",
            log.iter()
                .filter(|l| l.starts_with(bad))
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(
        hccl.calls("HcclCommDestroy").len(),
        8,
        "4 ranks x 2 communicators"
    );
}

#[test]
fn a_backup_nic_that_dcmi_reports_unreachable_rejects_the_switch_before_any_call() {
    let stubs = fresh_stubs("link_down");
    let hccl = StubControl::attach(&stubs.hccl);
    let dcmi = StubControl::attach(&stubs.dcmi);
    // Default stub topology: cards 10 and 11, two dies each. Device 0's backup NIC is its
    // partner die's (device 1: card 10, chip 1); 3 = DCMI_RDFX_DETECT_UNREACH.
    dcmi.dcmi_health(10, 1, 3);
    let env = stub_env(&stubs);
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(2, false), libs, &lookup(&env)).unwrap();
    let op = rig.switch(&[DeviceId(0)], true).unwrap().clone();
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    assert!(
        op.summary
            .error
            .as_deref()
            .unwrap_or("")
            .contains("backup NIC link"),
        "{op:?}"
    );
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert!(hccl.calls("HcclCommWorkingDevNicSet").is_empty());
}

#[test]
fn without_dcmi_the_rig_still_switches_and_without_l2_retry_it_is_refused() {
    // No DCMI: every NIC is assumed up and HCCL decides.
    let stubs = fresh_stubs("no_dcmi");
    let hccl = StubControl::attach(&stubs.hccl);
    let mut env = stub_env(&stubs);
    let missing: PathBuf = stubs.root.join("absent/libdcmi.so");
    env.insert("TASKD_DCMI_LIBRARY".into(), missing.into_os_string());
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    assert!(libs.dcmi.is_err());
    let mut rig = Rig::start(config(2, false), libs, &lookup(&env)).unwrap();
    assert!(
        rig.node_hal().starts_with("unmonitored"),
        "{}",
        rig.node_hal()
    );
    assert_eq!(
        rig.switch(&[DeviceId(1)], true).unwrap().summary.result,
        "succeeded"
    );
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert_eq!(report.ranks_on_backup, vec![1]);
    assert_eq!(hccl.calls("HcclCommWorkingDevNicSet").len(), 2);

    // HCCL without L2 retry would switch nothing: the manager refuses up front.
    let stubs = fresh_stubs("no_l2");
    let hccl = StubControl::attach(&stubs.hccl);
    let mut env = stub_env(&stubs);
    env.insert("HCCL_OP_RETRY_ENABLE".into(), "L0:0, L1:1, L2:0".into());
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(2, false), libs, &lookup(&env)).unwrap();
    let op = rig.switch(&[DeviceId(0)], true).unwrap().clone();
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    assert!(
        op.summary.error.as_deref().unwrap_or("").contains("L2:1"),
        "{op:?}"
    );
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert!(hccl.calls("HcclCommWorkingDevNicSet").is_empty());
}

#[test]
fn a_container_that_renumbers_its_dies_is_switched_by_physical_id() {
    let stubs = fresh_stubs("renumbered");
    let dcmi = StubControl::attach(&stubs.dcmi);
    let hccl = StubControl::attach(&stubs.hccl);
    // Eight dies on four cards (ids 10..13); the container has physical 6, 7 and 2 as its
    // logical 0, 1 and 2. Physical 7 (card 13, chip 1) is physical 6's backup NIC: down.
    dcmi.dcmi_topology(4, 2, 10);
    dcmi.dcmi_visible(&[6, 7, 2]);
    dcmi.dcmi_health(13, 1, 3);
    let env = stub_env(&stubs);
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(3, false), libs, &lookup(&env)).unwrap();
    let devices: Vec<u32> = rig.table().slots().iter().map(|s| s.device.0).collect();
    assert_eq!(devices, [6, 7, 2], "the rank table holds physical ids");
    // Logical device 0 is physical 6: its backup NIC is down, so the switch is refused.
    let op = rig.switch(&[DeviceId(0)], true).unwrap().clone();
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    let error = op.summary.error.clone().unwrap_or_default();
    assert!(
        error.contains("backup NIC link of node-0:6 (rank 0) is down"),
        "{error}"
    );
    assert!(dcmi
        .calls("dcmi_get_device_network_health")
        .iter()
        .all(|l| l.contains("card_id=13")));
    // Logical 2 is physical 2, whose partner (physical 3) is not the job's: refused up front.
    let op = rig.switch(&[DeviceId(2)], true).unwrap().clone();
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    let error = op.summary.error.clone().unwrap_or_default();
    assert!(
        error.contains("node-0:2") && error.contains("partner die node-0:3"),
        "{error}"
    );
    // The link is repaired: logical 0 moves, by its physical id, and back.
    dcmi.dcmi_health(13, 1, 0);
    assert_eq!(
        rig.switch(&[DeviceId(0)], true).unwrap().summary.result,
        "succeeded"
    );
    assert_eq!(
        rig.switch(&[DeviceId(0)], false).unwrap().summary.result,
        "succeeded"
    );
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert_eq!(
        (report.devices, report.physical_devices),
        (vec![0, 1, 2], vec![6, 7, 2])
    );
    assert_eq!(hccl.calls("HcclCommWorkingDevNicSet").len(), 2 * 3);
}

#[test]
fn a_link_probe_that_hangs_refuses_the_switch_with_that_reason_without_holding_training() {
    let stubs = fresh_stubs("probe_hangs");
    let dcmi = StubControl::attach(&stubs.dcmi);
    let hccl = StubControl::attach(&stubs.hccl);
    let mut env = stub_env(&stubs);
    // Long enough for every call that does not hang, on a loaded machine.
    env.insert("TASKD_DCMI_TIMEOUT_MS".into(), "2000".into());
    dcmi.dcmi_block_health(10, 1); // device 0's backup NIC: its probe never answers
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(2, false), libs, &lookup(&env)).unwrap();
    let op = rig.switch(&[DeviceId(0)], true).unwrap().clone();
    assert!(dcmi.dcmi_wait_blocked(1, Duration::from_secs(5)));
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    let error = op.summary.error.clone().unwrap_or_default();
    assert!(
        error.contains("backup NIC link of node-0:0 (rank 0) is unknown")
            && error.contains("did not answer within 2s"),
        "{error}"
    );
    assert!(
        op.summary.phases_ms.total < 20_000.0,
        "bounded by the probe, not the phase deadline: {op:?}"
    );
    // Training went on (the after-window was trained); asked again while DCMI still hangs,
    // the answer is immediate and the same refusal.
    let op = rig.switch(&[DeviceId(0)], true).unwrap().clone();
    assert_eq!(op.summary.result, "rejected", "{op:?}");
    assert!(op
        .summary
        .error
        .unwrap_or_default()
        .contains("has not returned since"));
    dcmi.dcmi_release();
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert!(hccl.calls("HcclCommWorkingDevNicSet").is_empty());
}

#[test]
fn evaluations_on_a_switched_world_run_on_the_default_nic_as_the_rule_predicts() {
    let stubs = fresh_stubs("default_nic");
    let hccl = StubControl::attach(&stubs.hccl);
    let env = stub_env(&stubs);
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut cfg = config(4, true);
    cfg.eval_every = 2;
    let mut rig = Rig::start(cfg, libs, &lookup(&env)).unwrap();
    rig.train(4).unwrap();
    assert_eq!(
        rig.switch(&[DeviceId(0), DeviceId(1)], true)
            .unwrap()
            .summary
            .result,
        "succeeded"
    );
    rig.train(6).unwrap();
    assert_eq!(
        rig.switch(&[DeviceId(0), DeviceId(1)], false)
            .unwrap()
            .summary
            .result,
        "succeeded"
    );
    rig.train(4).unwrap();
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    // The rig's prediction by HCCL's documented rule equals what the HCCL stub counted.
    assert!(
        report.collectives_on_default_nic >= 3,
        "{}",
        report.summary_text()
    );
    assert_eq!(
        report.collectives_on_default_nic,
        hccl.hccl_collectives_on_default_nic()
    );
    assert!(report.summary_text().contains(&format!(
        "default NIC of a switched group: {}",
        report.collectives_on_default_nic
    )));
    let log = hccl.log();
    assert!(log
        .iter()
        .all(|l| !l.starts_with("HcclAllReduce NIC_DISAGREE")));
}

#[test]
fn the_rig_gives_back_only_its_own_reference_to_the_ascend_runtime() {
    let stubs = fresh_stubs("acl_refs");
    let acl = StubControl::attach(&stubs.acl);
    // A framework in the process initialised the runtime first.
    let framework = taskd_hal_ascend::sys::acl::AclLib::open_path(&stubs.acl).unwrap();
    taskd_hal_ascend::result::acl::init(&framework).unwrap();
    let env = stub_env(&stubs);
    let libs = RigLibraries::open(&lookup(&env)).unwrap();
    let mut rig = Rig::start(config(2, false), libs, &lookup(&env)).unwrap();
    assert_eq!(acl.acl_refs(), 2);
    assert_eq!(
        rig.switch(&[DeviceId(0)], true).unwrap().summary.result,
        "succeeded"
    );
    let report = rig.finish();
    assert!(report.ok(), "{}", report.summary_text());
    assert_eq!(acl.acl_refs(), 1, "the framework's reference is left");
    assert_eq!(acl.calls("aclFinalizeReference").len(), 1);
    assert!(acl.calls("aclFinalize").iter().all(|l| l != "aclFinalize"));
}
