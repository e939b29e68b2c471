//! Does the live simulator's memory stay flat over thousands of operations? (Not a test:
//! `cargo bench --bench serve`; figures in BENCHMARKS.md.)
//!
//! Starts `taskd sim --serve` (2 nodes x 8 devices unless told otherwise) as a process of its
//! own, then runs operations back to back through its control API (node-1:0 to its backup NIC
//! and back, each waited for), reading the process's resident memory from
//! `/proc/PID/status` every `--every` operations. One JSON line per sample:
//! `ops, rss_bytes, rss_anon_bytes, ms_per_op` (the mean over the operations since the last
//! sample); then a summary line with the growth from the first sample to the last.
//!
//! `cargo bench --bench serve -- --ops 5000 --every 500 --nodes 2 --devices-per-node 8`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;
use taskd::actors::control::{ControlClient, Progress};

const JOB: &str = "serve";

/// `taskd sim --serve` and the control API address it printed.
struct Rig {
    child: Child,
    control: String,
}

impl Rig {
    fn start(nodes: u32, devices: u32) -> Rig {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskd"))
            .args(["sim", "--serve", "--job-id", JOB])
            .args(["--control-addr", "127.0.0.1:0"])
            .args(["--nodes", &nodes.to_string()])
            .args(["--devices-per-node", &devices.to_string()])
            // Operations back to back, faster than an operator's rate limit.
            .args(["--rate-burst", "1000000", "--rate-per-sec", "1000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("taskd sim --serve starts");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let control = loop {
            let line = lines
                .next()
                .expect("the rig prints its control address")
                .expect("a line of output");
            if let Some((_, rest)) = line.split_once("control API on ") {
                break rest.trim().to_owned();
            }
        };
        // Keep reading its output so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Rig { child, control }
    }

    /// `VmRSS` and `RssAnon` of the rig's process, in bytes.
    fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the rig's /proc status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        };
        (field("VmRSS:"), field("RssAnon:"))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one operation to its end; panics if it did not succeed.
async fn run_op(client: &mut ControlClient, use_backup: bool) {
    let mut s = client
        .submit(&common::switch_device_0(JOB, "node-1", use_backup))
        .await
        .expect("admitted");
    loop {
        if let Progress::Finished(r) = s.next().await.expect("the operation's progress") {
            assert_eq!(r.result, "succeeded", "{r}");
            return;
        }
    }
}

/// The live simulator's memory over thousands of operations.
#[derive(clap::Parser)]
struct Args {
    /// Operations to run.
    #[arg(long, default_value_t = 5000)]
    ops: u64,
    /// Measure the memory every this many operations.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    every: u64,
    /// Nodes of the simulated job.
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Devices per node.
    #[arg(long, default_value_t = 8)]
    devices_per_node: u32,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args {
        ops,
        every,
        nodes,
        devices_per_node: devices,
        ..
    } = clap::Parser::parse();
    let rig = Rig::start(nodes, devices);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut client = rt
        .block_on(ControlClient::connect(&rig.control, None))
        .expect("the rig's control API");
    rt.block_on(client.wait_registered(JOB, None))
        .expect("every rank registered");
    let mut samples = vec![(0, rig.rss())];
    let mut since = Instant::now();
    for i in 1..=ops {
        rt.block_on(run_op(&mut client, i % 2 == 1));
        if i % every == 0 || i == ops {
            let (rss, anon) = rig.rss();
            let done = i - samples.last().map_or(0, |s| s.0);
            let ms_per_op = since.elapsed().as_secs_f64() * 1e3 / done as f64;
            println!(
                "{}",
                serde_json::json!({
                    "ops": i,
                    "rss_bytes": rss,
                    "rss_anon_bytes": anon,
                    "ms_per_op": (ms_per_op * 100.0).round() / 100.0,
                })
            );
            samples.push((i, (rss, anon)));
            since = Instant::now();
        }
    }
    // The first sample after operations started is the baseline: the first operations
    // allocate what every later one reuses (the history, buffers, the step window).
    let base = samples.get(1).copied().unwrap_or(samples[0]);
    let last = samples[samples.len() - 1];
    println!(
        "{}",
        serde_json::json!({
            "ranks": nodes * devices,
            "ops": ops,
            "rss_bytes_before_ops": samples[0].1 .0,
            "rss_bytes_after_first_sample": base.1 .0,
            "rss_bytes_at_end": last.1 .0,
            "rss_anon_growth_bytes_after_first_sample":
                last.1 .1 as i64 - base.1 .1 as i64,
        })
    );
}
