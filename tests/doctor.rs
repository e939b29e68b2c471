//! `taskd doctor` against the stub vendor libraries: each check PASSes and FAILs (or WARNs)
//! where it should, with an injected environment; the binary prints one line per check or a
//! JSON array and exits 0 only when nothing fails.

mod common;

use common::{fresh_dir, lookup, stub_env, stub_install, EnvMap};
use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};
use taskd::doctor::{self, Check, DoctorConfig, Library, Status};
use taskd_hal_ascend::testing::{self, Stub, StubControl, StubInstall};

fn stubs(test: &str) -> StubInstall {
    stub_install("doctor", test)
}

/// A node ready to run: the stubs, the reference flags, a coherent worker environment.
fn good_env(s: &StubInstall) -> EnvMap {
    let mut m = stub_env(s);
    for (k, v) in [
        ("PROCESS_RECOVER", "on"),
        ("ELASTIC_PROCESS_RECOVER_ENABLE", "1"),
        ("MINDX_TASK_ID", "job-42"),
        ("MS_SCHED_HOST", "10.0.0.1"),
        ("POD_IP", "10.0.0.2"),
        ("MS_NODE_RANK", "1"),
        // MindIO's controller, hosted by the manager at MS_SCHED_HOST (the seed's job).
        ("MS_TFT_IP", "10.0.0.1"),
        ("MS_TFT_PORT", "8000"),
        ("MINDIO_FOR_MINDSPORE", "1"),
    ] {
        m.insert(k.into(), v.into());
    }
    m
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    l.local_addr().unwrap().port()
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.check == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:#?}"))
}

#[test]
fn a_ready_node_passes_every_check() {
    let s = stubs("ready");
    let env = good_env(&s);
    let checks = doctor::run(&config(free_port()), &lookup(&env));
    for c in &checks {
        assert_eq!(c.status, Status::Pass, "{}", c.line());
        assert!(c.fix.is_none());
    }
    let names: Vec<&str> = checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(
        names,
        [
            "library:hccl",
            "library:acl",
            "library:dcmi",
            "dcmi:devices",
            "dcmi:partners",
            "dcmi:links",
            "env:HCCL_OP_RETRY_ENABLE",
            "env:MS_ENABLE_TFT",
            "env:PROCESS_RECOVER",
            "env:ELASTIC_PROCESS_RECOVER_ENABLE",
            "env:TASKD_HCCL_RDMA",
            "job:id",
            "job:role",
            "job:node-rank",
            "job:mindio",
            "port",
        ]
    );
    assert!(doctor::ready(&checks));
    let hccl = find(&checks, "library:hccl");
    assert!(
        hccl.detail.contains(&s.hccl.display().to_string())
            && hccl.detail.contains("$TASKD_HCCL_LIBRARY")
            && hccl.detail.contains("all 8 functions"),
        "{}",
        hccl.detail
    );
    assert!(!hccl.detail.contains("optional"), "{}", hccl.detail);
    assert!(
        find(&checks, "dcmi:devices")
            .detail
            .contains("4 NPU dies visible (physical ids 0, 1, 2, 3"),
        "{checks:#?}"
    );
    assert!(find(&checks, "dcmi:partners")
        .detail
        .contains("both dies of every NPU are visible"));
    assert!(find(&checks, "job:role").detail.contains("worker host"));
}

#[test]
fn library_checks_say_where_from_and_what_is_missing() {
    let dir = fresh_dir("doctor", "libs");
    let s = testing::install(&dir).unwrap();

    // Found through ASCEND_TOOLKIT_HOME after ASCEND_HOME_PATH had no file: a warning, naming
    // both.
    let home = dir.join("empty-home");
    std::fs::create_dir_all(home.join("lib64")).unwrap();
    let env: EnvMap = [
        ("ASCEND_HOME_PATH", home.clone().into_os_string()),
        ("ASCEND_TOOLKIT_HOME", s.root.clone().into_os_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for lib in [Library::Hccl, Library::Acl] {
        let c = doctor::library(lib, &lookup(&env));
        assert_eq!(c.status, Status::Warn, "{}", c.line());
        assert!(
            c.detail.contains("$ASCEND_TOOLKIT_HOME/lib64"),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains(&home.display().to_string()),
            "{}",
            c.detail
        );
    }

    // An override to a file that is not there: FAIL for HCCL and ACL, WARN for DCMI.
    let nowhere: EnvMap = [
        ("TASKD_HCCL_LIBRARY", dir.join("no/libhccl.so")),
        ("TASKD_ACL_LIBRARY", dir.join("no/libascendcl.so")),
        ("TASKD_DCMI_LIBRARY", dir.join("no/libdcmi.so")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_os_string()))
    .collect();
    for (lib, status, var) in [
        (Library::Hccl, Status::Fail, "TASKD_HCCL_LIBRARY"),
        (Library::Acl, Status::Fail, "TASKD_ACL_LIBRARY"),
        (Library::Dcmi, Status::Warn, "TASKD_DCMI_LIBRARY"),
    ] {
        let c = doctor::library(lib, &lookup(&nowhere));
        assert_eq!(c.status, status, "{}", c.line());
        assert!(c.detail.contains("could not be loaded"), "{}", c.detail);
        assert!(c.fix.as_deref().unwrap().contains(var), "{}", c.line());
    }

    // An HCCL without HcclCommResume (documented as reserved, never called): it passes, and the
    // absent optional function is named.
    let old = testing::compile(Stub::HcclWithoutResume, &dir.join("old")).unwrap();
    let env: EnvMap = [("TASKD_HCCL_LIBRARY".to_string(), old.into_os_string())].into();
    let c = doctor::library(Library::Hccl, &lookup(&env));
    assert_eq!(c.status, Status::Pass, "{}", c.line());
    assert!(
        c.detail
            .contains("optional, absent (not needed): HcclCommResume"),
        "{}",
        c.detail
    );
    // An ACL without aclFinalizeReference (an older runtime) likewise.
    let legacy = testing::compile(Stub::AclLegacy, &dir.join("legacy")).unwrap();
    let env: EnvMap = [("TASKD_ACL_LIBRARY".to_string(), legacy.into_os_string())].into();
    let c = doctor::library(Library::Acl, &lookup(&env));
    assert_eq!(c.status, Status::Pass, "{}", c.line());
    assert!(c.detail.contains("aclFinalizeReference"), "{}", c.detail);

    // The wrong library under the HCCL name lacks every HCCL function.
    let env: EnvMap = [(
        "TASKD_HCCL_LIBRARY".to_string(),
        s.acl.clone().into_os_string(),
    )]
    .into();
    let c = doctor::library(Library::Hccl, &lookup(&env));
    assert!(
        c.detail
            .contains("HcclCommWorkingDevNicSet, HcclGetRootInfo"),
        "{}",
        c.detail
    );
}

fn config(port: u16) -> DoctorConfig {
    DoctorConfig {
        port,
        ..DoctorConfig::default()
    }
}

/// The DCMI checks against `s`'s stub, with `extra` added to the good environment.
fn dcmi_checks(s: &StubInstall, timeout: Duration, extra: &[(&str, &str)]) -> Vec<Check> {
    let mut env = good_env(s);
    for (k, v) in extra {
        env.insert(k.to_string(), v.into());
    }
    let cfg = DoctorConfig {
        probe_timeout: Some(timeout),
        ..config(free_port())
    };
    let checks = doctor::dcmi(&cfg, &lookup(&env));
    checks
}

#[test]
fn dcmi_checks_count_devices_and_report_unreachable_nics() {
    let s = stubs("dcmi");
    let dcmi = StubControl::attach(&s.dcmi);
    dcmi.dcmi_health(10, 1, 3); // physical 1 (card 10, chip 1) unreachable
    let checks = dcmi_checks(&s, Duration::from_secs(5), &[]);
    let c = find(&checks, "dcmi:links");
    assert_eq!(c.status, Status::Warn, "{}", c.line());
    // Device 1's own NIC is its primary and device 0's backup.
    assert!(
        c.detail
            .contains("not reachable: device 0 (backup), 1 (primary)"),
        "{}",
        c.detail
    );
    assert!(c.fix.as_deref().unwrap().contains("hccn_tool"));
    // DCMI_RDFX_DETECT_INIT is up, as MindCluster reads it.
    dcmi.dcmi_health(10, 1, 6);
    let checks = dcmi_checks(&s, Duration::from_secs(5), &[]);
    assert_eq!(find(&checks, "dcmi:links").status, Status::Pass);

    dcmi.set_result("dcmi_init", -8002);
    let env = good_env(&s);
    let checks = doctor::run(&config(free_port()), &lookup(&env));
    let c = find(&checks, "dcmi:devices");
    assert_eq!(c.status, Status::Warn, "{}", c.line());
    assert!(c.detail.contains("dcmi_init"), "{}", c.detail);
    // Without the dies there are no partner or links checks.
    assert!(checks
        .iter()
        .all(|c| !c.check.starts_with("dcmi:") || c.check == "dcmi:devices"));
    assert!(doctor::ready(&checks), "a DCMI problem is a warning");
}

#[test]
fn dcmi_checks_name_devices_by_physical_id_in_a_renumbering_container() {
    let s = stubs("dcmi_renumbered");
    let dcmi = StubControl::attach(&s.dcmi);
    dcmi.dcmi_visible(&[2, 3, 0, 1]); // logical 0..3 = physical 2, 3, 0, 1
    dcmi.dcmi_health(10, 1, 3); // physical 1 unreachable
    let checks = dcmi_checks(&s, Duration::from_secs(5), &[]);
    assert!(find(&checks, "dcmi:devices")
        .detail
        .contains("physical ids 2, 3, 0, 1"));
    // Physical 0 and 1 (logical 2 and 3): named by the rank table's ids, not "2 (backup),
    // 3 (primary)".
    let links = find(&checks, "dcmi:links");
    assert!(
        links
            .detail
            .contains("not reachable: device 0 (backup), 1 (primary)"),
        "{}",
        links.detail
    );
}

#[test]
fn a_partner_die_the_job_cannot_see_is_reported() {
    let s = stubs("dcmi_partners");
    let dcmi = StubControl::attach(&s.dcmi);
    // The container has physical 0, 1 and 2; physical 3 (card 11, chip 1) is not there.
    dcmi.dcmi_visible(&[0, 1, 2]);
    let checks = dcmi_checks(&s, Duration::from_secs(5), &[]);
    let c = find(&checks, "dcmi:partners");
    assert_eq!(c.status, Status::Warn, "{}", c.line());
    assert!(
        c.detail.contains(
            "device 2 (logical 2, card 11 chip 0): its partner die (card 11 chip 1) is not \
             visible in this container"
        ) && c.detail.contains("the manager refuses such a switch"),
        "{}",
        c.detail
    );
    assert!(!c.detail.contains("device 0"), "{}", c.detail);
    // Its backup NIC is unknown, not down.
    let links = find(&checks, "dcmi:links");
    assert!(
        links.detail.contains("unknown: device 2 (backup:"),
        "{}",
        links.detail
    );
    assert!(doctor::ready(&checks));

    // ASCEND_RT_VISIBLE_DEVICES hides a partner from the job although the container has it.
    let checks = dcmi_checks(
        &s,
        Duration::from_secs(5),
        &[("ASCEND_RT_VISIBLE_DEVICES", "0,2")],
    );
    let c = find(&checks, "dcmi:partners");
    assert!(
        c.detail.contains(
            "device 0 (logical 0, card 10 chip 0): its partner die (card 10 chip 1) is hidden \
             by ASCEND_RT_VISIBLE_DEVICES=0,2"
        ),
        "{}",
        c.detail
    );
    let checks = dcmi_checks(
        &s,
        Duration::from_secs(5),
        &[("ASCEND_RT_VISIBLE_DEVICES", "zero")],
    );
    assert!(find(&checks, "dcmi:partners")
        .detail
        .contains("ASCEND_RT_VISIBLE_DEVICES=\"zero\" is not a list"));
}

#[test]
fn a_probe_that_hangs_makes_its_side_unknown_and_the_doctor_still_answers() {
    let s = stubs("dcmi_hang");
    let dcmi = StubControl::attach(&s.dcmi);
    dcmi.dcmi_block_health(10, 1); // physical 1's NIC: device 1's primary, device 0's backup
                                   // Long enough for every call that does not hang, on a loaded machine.
    let timeout = Duration::from_secs(2);
    let t = Instant::now();
    let checks = dcmi_checks(&s, timeout, &[]);
    let took = t.elapsed();
    assert!(dcmi.dcmi_wait_blocked(1, Duration::from_secs(5)));
    // One probe waited out its timeout; the second die sharing the chip did not wait again.
    assert!(
        took >= timeout && took < Duration::from_secs(20),
        "{took:?}"
    );
    let c = find(&checks, "dcmi:links");
    assert_eq!(c.status, Status::Warn, "{}", c.line());
    assert!(
        c.detail.contains("unknown: device 0 (backup:")
            && c.detail.contains("did not answer within 2s")
            && c.detail.contains("1 (primary:")
            && c.detail.contains("has not returned since"),
        "{}",
        c.detail
    );
    assert_eq!(
        dcmi.calls("dcmi_get_device_network_health card_id=10 device_id=1")
            .len(),
        1
    );
    dcmi.dcmi_release();

    // Released, the chip answers again.
    let checks = dcmi_checks(&s, Duration::from_secs(5), &[]);
    assert_eq!(find(&checks, "dcmi:links").status, Status::Pass);
    // A timeout that is not a number is named, and the default used.
    let mut env = good_env(&s);
    env.insert("TASKD_DCMI_TIMEOUT_MS".into(), "soon".into());
    let checks = doctor::dcmi(&config(free_port()), &lookup(&env));
    let c = find(&checks, "dcmi:devices");
    assert_eq!(c.status, Status::Warn, "{}", c.line());
    assert!(c.detail.contains("TASKD_DCMI_TIMEOUT_MS"), "{}", c.detail);
}

fn taskd_doctor(env: &EnvMap, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_taskd"))
        .arg("doctor")
        .args(args)
        .env_clear()
        .envs(env)
        .output()
        .expect("run taskd doctor");
    (
        out.status.code().expect("exited"),
        String::from_utf8(out.stdout).expect("utf-8"),
    )
}

#[test]
fn the_binary_prints_json_or_lines_and_exits_1_on_a_failure() {
    let s = stubs("binary");
    let mut env = good_env(&s);
    let port = free_port().to_string();

    let (code, out) = taskd_doctor(&env, &["--json", "--port", &port]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let arr = json.as_array().expect("an array");
    assert_eq!(arr.len(), 16);
    for item in arr {
        let obj = item.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["check", "detail", "fix", "status"]);
        assert_eq!(obj["status"], "PASS", "{item}");
        assert!(obj["fix"].is_null());
    }

    // HCCL without L2 retry: FAIL, exit 1; a recovery flag off: only a warning.
    env.remove("HCCL_OP_RETRY_ENABLE");
    env.insert("PROCESS_RECOVER".into(), "off".into());
    let (code, out) = taskd_doctor(&env, &["--json", "--port", &port]);
    assert_eq!(code, 1, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let by_name = |n: &str| {
        json.as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == n)
            .unwrap()
            .clone()
    };
    let l2 = by_name("env:HCCL_OP_RETRY_ENABLE");
    assert_eq!(l2["status"], "FAIL");
    assert!(l2["detail"].as_str().unwrap().contains("switch nothing"));
    assert!(l2["fix"].as_str().unwrap().contains("L2:1"));
    assert_eq!(by_name("env:PROCESS_RECOVER")["status"], "WARN");

    // Text: one line per check, status first, the fix on the same line.
    let (code, out) = taskd_doctor(&env, &["--port", &port]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 16, "{out}");
    assert!(lines
        .iter()
        .all(|l| l.starts_with("PASS  ") || l.starts_with("WARN  ") || l.starts_with("FAIL  ")));
    let l2 = lines
        .iter()
        .find(|l| l.contains("env:HCCL_OP_RETRY_ENABLE"))
        .unwrap();
    assert!(
        l2.starts_with("FAIL  ") && l2.contains("  fix: export HCCL_OP_RETRY_ENABLE="),
        "{l2}"
    );

    // Only warnings: exit 0.
    env.insert("HCCL_OP_RETRY_ENABLE".into(), "L0:0, L1:1, L2:1".into());
    let (code, _) = taskd_doctor(&env, &["--port", &port]);
    assert_eq!(code, 0);

    // The manager host needs its port: taken there, the doctor fails.
    env.insert("POD_IP".into(), "10.0.0.1".into());
    let held = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let taken = held.local_addr().unwrap().port().to_string();
    let (code, out) = taskd_doctor(&env, &["--port", &taken]);
    assert_eq!(code, 1, "{out}");
    assert!(out.lines().any(|l| l.starts_with("FAIL  port")), "{out}");
}
