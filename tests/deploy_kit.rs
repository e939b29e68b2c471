//! The deployment kit (`deploy/mindcluster/`): the job YAML has every label, annotation, port
//! and variable taskd relies on, spelled as the code reads them, and the launcher starts the
//! manager only on the Scheduler pod, a proxy everywhere, then msrun (run here with stand-ins
//! for `taskd` and `msrun`). No cluster is needed.

use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use taskd::actors::net::DEFAULT_MANAGER_PORT;
use taskd::core::env;

fn kit(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/mindcluster")
        .join(file)
}

fn job() -> Value {
    let text = std::fs::read_to_string(kit("mindformers-job.yaml")).expect("the job YAML");
    serde_yaml::from_str(&text).expect("the job YAML parses")
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut at = v;
    for k in path {
        at = &at[*k];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{} is not a string: {at:?}", path.join(".")))
}

/// The container named `ascend` of every replica type.
fn containers(job: &Value) -> Vec<(String, Value)> {
    let specs = job["spec"]["replicaSpecs"]
        .as_mapping()
        .expect("replicaSpecs");
    specs
        .iter()
        .map(|(name, spec)| {
            let c = spec["template"]["spec"]["containers"]
                .as_sequence()
                .expect("containers")
                .iter()
                .find(|c| c["name"] == "ascend")
                .unwrap_or_else(|| panic!("{name:?} has no container named ascend"))
                .clone();
            (name.as_str().unwrap().to_owned(), c)
        })
        .collect()
}

fn env_var<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
}

fn env_value(c: &Value, name: &str) -> Option<String> {
    env_var(c, name).and_then(|e| e["value"].as_str().map(str::to_owned))
}

#[test]
fn the_job_has_what_taskd_and_clusterd_need() {
    let job = job();
    assert_eq!(str_at(&job, &["kind"]), "AscendJob");
    assert_eq!(
        str_at(&job, &["metadata", "labels", "framework"]),
        "mindspore"
    );
    assert_eq!(
        str_at(&job, &["metadata", "labels", "process-recover-enable"]),
        "on"
    );
    assert_eq!(
        str_at(&job, &["metadata", "labels", "fault-scheduling"]),
        "force"
    );
    assert_eq!(
        str_at(&job, &["metadata", "annotations", "recover-strategy"]),
        "retry"
    );
    let specs = containers(&job);
    let names: Vec<&str> = specs.iter().map(|(n, _)| n.as_str()).collect();
    // MS_SCHED_HOST is the Scheduler pod's IP: that is where the manager runs.
    assert!(names.contains(&"Scheduler"), "{names:?}");
    for (name, c) in &specs {
        let port = c["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == "taskd-port")
            .unwrap_or_else(|| panic!("{name}: no port named taskd-port"));
        assert_eq!(
            port["containerPort"].as_u64(),
            Some(u64::from(DEFAULT_MANAGER_PORT)),
            "{name}"
        );
        let pod_ip = env_var(c, env::POD_IP).unwrap_or_else(|| panic!("{name}: no POD_IP"));
        assert_eq!(
            str_at(pod_ip, &["valueFrom", "fieldRef", "fieldPath"]),
            "status.podIP",
            "{name}"
        );
        let tft = env_value(c, env::MS_ENABLE_TFT);
        assert!(env::tsp_enabled(tft.as_deref()), "{name}: {tft:?}");
        let retry = env_value(c, env::HCCL_OP_RETRY_ENABLE);
        assert!(env::l2_retry_enabled(retry.as_deref()), "{name}: {retry:?}");
        assert_eq!(env_value(c, env::PROCESS_RECOVER).as_deref(), Some("on"));
        assert_eq!(
            env_value(c, env::ELASTIC_PROCESS_RECOVER_ENABLE).as_deref(),
            Some("1")
        );
        // What Ascend Operator sets must not be overridden here: the manager finds the job
        // and ClusterD, the proxies their node and manager, from its values.
        for set_by_the_operator in [
            env::MINDX_TASK_ID,
            env::MINDX_SERVER_IP,
            env::MS_SCHED_HOST,
            env::MS_NODE_RANK,
        ] {
            assert!(
                env_var(c, set_by_the_operator).is_none(),
                "{name} overrides {set_by_the_operator}"
            );
        }
        let args = format!("{:?}", c["args"]);
        assert!(args.contains("taskd-launcher.sh"), "{name}: {args}");
    }
}

#[test]
fn the_launcher_reads_the_variables_as_the_code_spells_them() {
    let script = std::fs::read_to_string(kit("taskd-launcher.sh")).expect("the launcher");
    for name in [
        env::MINDX_TASK_ID,
        env::MS_SCHED_HOST,
        env::POD_IP,
        env::MS_NODE_RANK,
    ] {
        assert!(script.contains(name), "the launcher does not read {name}");
    }
}

/// Runs the launcher with stand-ins for `taskd` and `msrun` that record their arguments;
/// returns its exit code, stderr and the recorded calls.
fn launch(envs: &[(&str, &str)], msrun_exit: i32) -> (Option<i32>, String, Vec<String>) {
    let dir = std::env::temp_dir().join(format!(
        "taskd-launcher-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("calls");
    for (name, exit) in [("taskd", 0), ("msrun", msrun_exit)] {
        let stub = bin.join(name);
        std::fs::write(
            &stub,
            format!("#!/bin/sh\necho \"{name} $*\" >> \"$STUB_LOG\"\nexit {exit}\n"),
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&stub).status().unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg(kit("taskd-launcher.sh"))
        .args(["--config", "model.yaml"])
        .env_clear()
        .env("PATH", path)
        .env("STUB_LOG", &log)
        .env("TASKD_LOG_DIR", dir.join("logs"))
        .envs(envs.iter().copied())
        .output()
        .expect("bash runs the launcher");
    let calls = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        calls,
    )
}

fn pod(
    sched: &'static str,
    ip: &'static str,
    rank: &'static str,
) -> Vec<(&'static str, &'static str)> {
    vec![
        (env::MINDX_TASK_ID, "job-uid"),
        (env::MS_SCHED_HOST, sched),
        ("MS_SCHED_PORT", "8118"),
        (env::POD_IP, ip),
        (env::MS_NODE_RANK, rank),
        ("MS_WORKER_NUM", "32"),
        ("MS_LOCAL_WORKER", "16"),
    ]
}

/// Whether the launcher said it started `role` (it says so before starting it; a stand-in it
/// stops when training ends may not have run yet).
fn started(err: &str, role: &str) -> bool {
    err.lines()
        .any(|l| l.starts_with(&format!("taskd-launcher: starting taskd {role}")))
}

#[test]
fn the_launcher_starts_the_manager_only_on_the_scheduler_pod() {
    let (code, err, calls) = launch(&pod("10.0.0.1", "10.0.0.1", "0"), 0);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        started(&err, "manager --nodes 2 --procs-per-node 16"),
        "{err}"
    );
    assert!(started(&err, "proxy"), "{err}");
    let msrun = calls
        .iter()
        .find(|c| c.starts_with("msrun"))
        .expect("msrun ran");
    for part in [
        "--worker_num=32",
        "--local_worker_num=16",
        "--master_addr=10.0.0.1",
        "--master_port=8118",
        "--node_rank=0",
        "--config model.yaml",
    ] {
        assert!(msrun.contains(part), "{msrun}");
    }

    let (code, err, calls) = launch(&pod("10.0.0.1", "10.0.0.2", "1"), 0);
    assert_eq!(code, Some(0), "{err}");
    assert!(!started(&err, "manager"), "{err}");
    assert!(started(&err, "proxy"), "{err}");
    assert!(calls.iter().any(|c| c.starts_with("msrun")), "{calls:?}");

    // IPv6, with and without brackets, is the same host.
    let (_, err, _) = launch(&pod("[FD00::1]", "fd00::1", "0"), 0);
    assert!(started(&err, "manager"), "{err}");
}

#[test]
fn the_launcher_exits_as_training_does_and_refuses_a_pod_without_its_variables() {
    let (code, _, _) = launch(&pod("10.0.0.1", "10.0.0.1", "0"), 3);
    assert_eq!(code, Some(3), "the launcher's status is training's");
    let mut missing = pod("10.0.0.1", "10.0.0.1", "0");
    missing.retain(|(k, _)| *k != env::POD_IP);
    let (code, err, calls) = launch(&missing, 0);
    assert_eq!(code, Some(2));
    assert!(err.contains("POD_IP"), "{err}");
    assert!(calls.is_empty(), "nothing starts: {calls:?}");
}
