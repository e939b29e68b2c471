//! libtaskd.so as its users run it: the C example (`examples/c_worker.c`) built against
//! `capi/include/taskd.h` and run as two training processes; the Python package's unit tests
//! (`python/tests`, over fake frameworks); and the end-to-end job of processes
//! (`python/tests/e2e/run_job.py`) for MindSpore and for PyTorch, driven by `taskd switch
//! --wait`.
//!
//! A plain program (`harness = false`): with `TASKD_E2E_CLI` set it *is* the `taskd` command
//! (`taskd::cli::main`, what the binary's `main` calls), which the end-to-end job runs; a test
//! target cannot name the facade's binary. Needs `cc` and `python3` (>= 3.8; `$PYTHON`
//! overrides). Prints one line per check and exits 1 on the first failure, with its output.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};
use taskd::actors::control::ControlClient;
use taskd::core::command::Target;
use taskd::core::{DeviceId, JobId, NodeName, SwitchCommand};
use taskd_capi::{EmbeddedManager, EmbeddedProxy};

const CLI: &str = "TASKD_E2E_CLI";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The shared library cargo built for this test (beside the test binary).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let lib = exe.parent().unwrap().join("libtaskd_capi.so");
    assert!(
        lib.exists(),
        "{} is missing: build with cargo test -p taskd-capi",
        lib.display()
    );
    lib
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A scratch directory for one check, removed when it passes.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("taskd-capi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn python_env<'a>(cmd: &'a mut Command, scratch: &Scratch) -> &'a mut Command {
    cmd.env("PYTHONPATH", repo().join("python"))
        .env("TASKD_LIBRARY", library())
        .env("TASKD_LOG_PATH", &scratch.0)
        .env("PYTHONDONTWRITEBYTECODE", "1")
}

fn the_package_version_is_the_workspaces() {
    let init = std::fs::read_to_string(repo().join("python/taskd/__init__.py")).unwrap();
    let line = format!("__version__ = \"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(
        init.contains(&line),
        "python/taskd/__init__.py lacks {line}"
    );
}

fn python_unit_tests() {
    let scratch = Scratch::new("pytest");
    let tests = repo().join("python/tests");
    let out = run(python_env(
        Command::new(python())
            .args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(&tests)
            .arg("-t")
            .arg(&tests),
        &scratch,
    ));
    ok(&out, "python -m unittest discover python/tests");
}

fn end_to_end_job(framework: &str) {
    let scratch = Scratch::new(&format!("e2e-{framework}"));
    let exe = std::env::current_exe().unwrap();
    let out = run(python_env(
        Command::new(python())
            .arg(repo().join("python/tests/e2e/run_job.py"))
            .args(["--framework", framework, "--taskd"])
            .arg(exe)
            .env(CLI, "1"),
        &scratch,
    ));
    ok(&out, &format!("run_job.py --framework {framework}"));
}

/// Builds examples/c_worker.c against the header and the library (named libtaskd.so).
fn build_c_worker(scratch: &Scratch) -> PathBuf {
    let dir = &scratch.0;
    std::os::unix::fs::symlink(library(), dir.join("libtaskd.so")).unwrap();
    let bin = dir.join("c_worker");
    let out = run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo().join("capi/include"))
        .arg(repo().join("examples/c_worker.c"))
        .arg("-L")
        .arg(dir)
        .arg("-ltaskd")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-o")
        .arg(&bin));
    ok(&out, "cc examples/c_worker.c");
    bin
}

fn switch(job: &str, use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(job.into()),
        id: None,
        targets: vec![Target {
            node: NodeName("node-0".into()),
            device: DeviceId(1),
            use_backup,
        }],
    }
}

/// Two C training processes of one node: a switch to the backup NIC and back reaches each
/// one's switch function once per operation, while its loop is held, and training goes on.
fn the_c_example_runs_a_worker_loop() {
    let scratch = Scratch::new("c");
    let bin = build_c_worker(&scratch);
    let job = "c-job";
    let manager = EmbeddedManager::start(
        &format!(r#"{{"job_id": "{job}", "nodes": 1, "procs_per_node": 2, "listen": "127.0.0.1:0", "control_addr": "127.0.0.1:0", "heartbeat_ms": 100}}"#),
        false,
    )
    .unwrap();
    let proxy = EmbeddedProxy::start(&format!(
        r#"{{"job_id": "{job}", "manager": "{}", "node_rank": 0, "listen": "127.0.0.1:0", "node_hal": "sim"}}"#,
        manager.info().listen
    ))
    .unwrap();
    let workers: Vec<_> = (0..2)
        .map(|r| {
            Command::new(&bin)
                .args([r.to_string(), "2".into()])
                .env("MINDX_TASK_ID", job)
                .env("TASKD_PROXY", proxy.local_addr().to_string())
                .env("MS_ENABLE_TFT", "{TTP:1,TSP:1}")
                .env("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    manager.wait_ready(Some(Duration::from_secs(60))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut admin = rt
        .block_on(ControlClient::connect(
            &manager.info().control.expect("served").to_string(),
            None,
        ))
        .unwrap();
    for to_backup in [true, false] {
        let report = rt.block_on(admin.run(&switch(job, to_backup))).unwrap();
        assert_eq!(report.result, "succeeded", "{report:?}");
    }
    drop(admin);
    for (r, w) in workers.into_iter().enumerate() {
        let out = w.wait_with_output().unwrap();
        ok(&out, &format!("c_worker {r}"));
        check_c_output(r, &String::from_utf8_lossy(&out.stdout));
    }
    proxy.stop("the check is over");
    manager.stop("the check is over");
    manager.wait(Some(Duration::from_secs(60))).unwrap();
}

fn check_c_output(rank: usize, out: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(&format!("rank {rank} registered on node-0 (libtaskd ")),
        "{out}"
    );
    let switches: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("switch:"))
        .copied()
        .collect();
    assert_eq!(switches.len(), 2, "one call per operation:\n{out}");
    let step = |l: &str| -> u64 {
        l.split_whitespace()
            .nth(3)
            .unwrap()
            .trim_end_matches(',')
            .parse()
            .unwrap()
    };
    for (line, side) in switches.iter().zip(["1:backup", "1:primary"]) {
        // Called on the training thread, with the call timeout of the default switch phase.
        assert!(
            line.ends_with(&format!(
                "on the training thread, within 225000 ms, targets {side}"
            )),
            "{line}"
        );
    }
    assert!(
        step(switches[1]) > step(switches[0]),
        "training went on:\n{out}"
    );
    let last = lines.last().unwrap();
    let trained: u64 = last.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(
        trained > step(switches[1]),
        "training went on after the last switch:\n{out}"
    );
    assert!(last.ends_with("steps, 2 switches"), "{last}");
}

fn main() -> ExitCode {
    if std::env::var_os(CLI).is_some() {
        return taskd::cli::main();
    }
    let checks: [(&str, fn()); 5] = [
        (
            "the_package_version_is_the_workspaces",
            the_package_version_is_the_workspaces,
        ),
        (
            "the_c_example_runs_a_worker_loop",
            the_c_example_runs_a_worker_loop,
        ),
        ("python_unit_tests", python_unit_tests),
        ("end_to_end_job_mindspore", || end_to_end_job("ms")),
        ("end_to_end_job_pytorch", || end_to_end_job("pt")),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for (name, check) in checks {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        match std::panic::catch_unwind(check) {
            Ok(()) => println!(
                "test {name} ... ok ({:.1} s)",
                started.elapsed().as_secs_f64()
            ),
            Err(_) => {
                println!("test {name} ... FAILED");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
