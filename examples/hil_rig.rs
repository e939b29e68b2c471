//! Hardware-in-the-loop rig for one node: every local NPU trains an all-reduce loop through
//! the production control plane (in-process manager, proxy and workers, real HCCL through
//! `taskd-hal-ascend`), and the rig switches devices to their backup NIC and back while
//! printing all-reduce latency before, during and after each operation. The rig itself is
//! `taskd::rig`; this file is its command line.
//!
//! ```sh
//! # On an Atlas A3 node (CANN environment sourced, see docs/a3-node.md):
//! cargo run --release --example hil_rig -- --devices 0-7 --pairs --switch 0,1 --switch 2
//! # Anywhere, against the stub libraries the tests use (needs `cc`):
//! cargo run --example hil_rig -- --stubs --devices 0-3 --pairs --switch 0,2
//! # Commands from stdin (`switch 0,1`, `back 0,1`, `train 20`), one per line:
//! cargo run --example hil_rig -- --stubs --stdin
//! ```
//!
//! Each `--switch DEVS` is two operations: DEVS to their backup NIC, then back. Without
//! `--switch` or `--stdin` the rig switches the first device and back. Devices are logical ids
//! (what `aclrtSetDevice` takes); the rig sends the manager their physical ids, asked of DCMI.
//! Exit status: 0 when every invariant held, 1 otherwise, 2 for bad input or a rig that could
//! not start.

use clap::Parser;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use taskd::rig::{self, Rig, RigCommand, RigConfig, RigLibraries};
use taskd_core::env as env_names;
use taskd_core::{DeviceId, GlobalRank, JobId, NodeName, PhaseDeadlines};
use taskd_hal_ascend::testing::{self, StubControl};

#[derive(Parser)]
#[command(
    about = "Hardware-in-the-loop rig: switch NPUs of this node to their backup NIC and back"
)]
struct Args {
    /// Local devices, one rank each: `0,1,2,3` or `0-7`.
    #[arg(long, default_value = "0,1")]
    devices: String,
    /// Also make a communicator per pair of ranks (0,1), (2,3), ... besides the world one.
    #[arg(long)]
    pairs: bool,
    /// Devices to switch to backup and back, e.g. `0,1`; repeatable.
    #[arg(long = "switch", value_name = "DEVS")]
    switch: Vec<String>,
    /// Read commands from stdin after warm-up: `switch DEVS`, `back DEVS`, `train N`.
    #[arg(long)]
    stdin: bool,
    /// f32 elements per all-reduce.
    #[arg(long, default_value_t = 1 << 18)]
    elements: usize,
    /// Host compute per step before the collectives, in ms (see `taskd::rig` on why not 0).
    #[arg(long, default_value_t = 2.0)]
    compute_ms: f64,
    /// Steps per latency window (before / after each operation).
    #[arg(long, default_value_t = 10)]
    window: u64,
    /// Every N steps, an evaluation all-reduce of a new size on the world communicator (an
    /// operator HCCL has not issued before; 0: never). See the report's
    /// collectives_on_default_nic.
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// This node's name in commands and reports.
    #[arg(long, default_value = "node-0")]
    node: String,
    /// Deadline of each operation phase, in seconds.
    #[arg(long, default_value_t = 300)]
    phase_timeout_s: u64,
    /// Run against stub libraries compiled with `cc` (no NPU, no CANN needed).
    #[arg(long)]
    stubs: bool,
    /// Print the final report as JSON (the operation blocks still go to stderr).
    #[arg(long)]
    json: bool,
}

fn parse_device_list(s: &str) -> Result<Vec<DeviceId>, String> {
    if let Some((a, b)) = s.split_once('-') {
        let (a, b): (u32, u32) = (
            a.trim()
                .parse()
                .map_err(|_| format!("{a:?} is not a device"))?,
            b.trim()
                .parse()
                .map_err(|_| format!("{b:?} is not a device"))?,
        );
        if a > b {
            return Err(format!("empty range {s:?}"));
        }
        return Ok((a..=b).map(DeviceId).collect());
    }
    rig::parse_devices(s)
}

/// The stub libraries, compiled into a directory of this process, and an environment that
/// points the library search at them.
struct Stubs {
    dir: PathBuf,
    overrides: HashMap<String, OsString>,
    hccl: StubControl,
    // Keeps the DCMI stub (and its topology) loaded for the whole run.
    _dcmi: StubControl,
}

fn stubs(devices: &[DeviceId]) -> Result<Stubs, String> {
    let dir: PathBuf = std::env::temp_dir().join(format!("taskd-hil-rig-{}", std::process::id()));
    let install = testing::install(&dir).map_err(|e| e.to_string())?;
    let hccl = StubControl::attach(&install.hccl);
    let dcmi = StubControl::attach(&install.dcmi);
    let max = devices.iter().map(|d| d.0).max().unwrap_or(0);
    // Two dies per card, cards 0.., enough for every device and its partner die.
    dcmi.dcmi_topology((max / 2 + 1) as i32, 2, 0);
    let overrides = install
        .overrides()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_os_string()))
        .collect();
    Ok(Stubs {
        dir,
        overrides,
        hccl,
        _dcmi: dcmi,
    })
}

/// Each `--switch DEVS` as two operations (to backup, back); the first device and back when
/// there is neither `--switch` nor `--stdin`.
fn script(a: &Args, devices: &[DeviceId]) -> Result<Vec<RigCommand>, String> {
    let mut script = Vec::new();
    for s in &a.switch {
        let d = rig::parse_devices(s)?;
        for use_backup in [true, false] {
            script.push(RigCommand::Switch {
                devices: d.clone(),
                use_backup,
            });
        }
    }
    if script.is_empty() && !a.stdin {
        for use_backup in [true, false] {
            script.push(RigCommand::Switch {
                devices: vec![devices[0]],
                use_backup,
            });
        }
    }
    Ok(script)
}

/// The process environment, with the stubs' overrides and, with stubs only, the reference
/// deployment's flags where unset (a real node must set them itself: see `taskd doctor`).
fn env_of(stub: &Option<Stubs>, name: &str) -> Option<OsString> {
    let Some(s) = stub else {
        return std::env::var_os(name);
    };
    if let Some(v) = s.overrides.get(name) {
        return Some(v.clone());
    }
    let default = match name {
        env_names::HCCL_OP_RETRY_ENABLE => Some("L0:0, L1:1, L2:1"),
        env_names::MS_ENABLE_TFT => Some("{TTP:1,TSP:1}"),
        _ => None,
    };
    std::env::var_os(name).or_else(|| default.map(OsString::from))
}

fn config(a: &Args, devices: Vec<DeviceId>, job: Option<OsString>) -> RigConfig {
    let n = devices.len();
    let phase = Duration::from_secs(a.phase_timeout_s);
    RigConfig {
        job: JobId(job.map_or_else(|| "hil-rig".into(), |v| v.to_string_lossy().into_owned())),
        node: NodeName(a.node.clone()),
        devices,
        extra_groups: if a.pairs {
            RigConfig::pairs(n)
        } else {
            Vec::new()
        },
        elements: a.elements,
        compute: Duration::from_secs_f64(a.compute_ms.max(0.0) / 1e3),
        window: a.window,
        eval_every: a.eval_every,
        deadlines: PhaseDeadlines {
            pause: phase,
            switch: phase,
            rollback: phase,
            resume: phase,
        },
        progress_timeout: Duration::from_secs(a.phase_timeout_s.max(60)),
    }
}

/// Runs one command, printing an operation's block; whether to go on.
fn run(rig: &mut Rig, cmd: &RigCommand, n_op: &mut usize, err: &mut std::io::Stderr) -> bool {
    match rig.execute(cmd) {
        Ok(Some(op)) => {
            *n_op += 1;
            let _ = write!(err, "{}", op.to_text(*n_op));
            true
        }
        Ok(None) => true,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            !matches!(e, rig::RigError::Stuck(..) | rig::RigError::Job(_))
        }
    }
}

/// The script, then (with `--stdin`) one command per line until EOF.
fn run_commands(rig: &mut Rig, script: &[RigCommand], stdin: bool) {
    let mut err = std::io::stderr();
    let mut n_op = 0;
    for cmd in script {
        if !run(rig, cmd, &mut n_op, &mut err) {
            return;
        }
    }
    if !stdin {
        return;
    }
    let _ = writeln!(
        err,
        "commands: switch DEVS | back DEVS | train N (end with EOF)"
    );
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match RigCommand::parse(&line) {
            Ok(cmd) => {
                if !run(rig, &cmd, &mut n_op, &mut err) {
                    break;
                }
            }
            Err(e) => {
                let _ = writeln!(err, "{e}");
            }
        }
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let devices = match parse_device_list(&a.devices) {
        Ok(d) => d,
        Err(e) => return bad(&e),
    };
    let script = match script(&a, &devices) {
        Ok(s) => s,
        Err(e) => return bad(&e),
    };
    let stub = match a.stubs.then(|| stubs(&devices)).transpose() {
        Ok(s) => s,
        Err(e) => return bad(&format!("cannot build the stub libraries: {e}")),
    };
    let env = |name: &str| env_of(&stub, name);
    let libs = match RigLibraries::open(&env) {
        Ok(l) => l,
        Err(e) => {
            return bad(&format!(
                "{e}\n(no NPU here? run with --stubs to use the stub libraries)"
            ))
        }
    };
    let cfg = config(&a, devices, env(env_names::MINDX_TASK_ID));
    let mut err = std::io::stderr();
    let _ = write!(err, "{}", rig::header_text(&cfg, &libs));
    if stub.is_some() {
        let _ = writeln!(err, "(stub libraries: no NPU is used)");
    }
    let mut rig = match Rig::start(cfg, libs, &env) {
        Ok(r) => r,
        Err(e) => return bad(&format!("the rig could not start: {e}")),
    };
    let _ = writeln!(err, "{}node HAL: {}", rig.groups_text(), rig.node_hal());
    if let Err(e) = rig.train(rig.config().window) {
        let _ = writeln!(err, "warm-up failed: {e}");
    }
    run_commands(&mut rig, &script, a.stdin);
    let report = rig.finish();
    if let Some(s) = &stub {
        let _ = writeln!(err, "{}", stub_summary(&s.hccl, &report.groups));
        // The loaded copies stay mapped; the files are no longer needed.
        let _ = std::fs::remove_dir_all(&s.dir);
    }
    let out = if a.json {
        serde_json::to_string_pretty(&report).expect("the report serializes") + "\n"
    } else {
        report.summary_text()
    };
    let _ = write!(std::io::stdout(), "{out}");
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// What the HCCL stub recorded: did every member of every group make the same NIC-set calls?
fn stub_summary(hccl: &StubControl, groups: &[taskd_core::GroupInfo]) -> String {
    if hccl.log_overflowed() {
        return "stub: the call log overflowed; NIC-set agreement not checked".into();
    }
    match testing::nic_set_agreement(&hccl.log()) {
        Err(e) => format!("stub: NIC-set calls DISAGREE: {e}"),
        Ok(by_group) => {
            let mut s =
                String::from("stub: NIC-set calls per communicator (identical on every member):");
            for g in groups {
                let members: Vec<GlobalRank> = g.members.clone();
                match by_group.get(&g.name) {
                    None => s.push_str(&format!("\n  {}: none", g.name)),
                    Some(calls) => s.push_str(&format!(
                        "\n  {}: {} calls by {} of {} members",
                        g.name,
                        calls.calls.len(),
                        calls.callers.len(),
                        members.len()
                    )),
                }
            }
            s
        }
    }
}

fn bad(msg: &str) -> ExitCode {
    eprintln!("hil_rig: {msg}");
    ExitCode::from(2)
}
