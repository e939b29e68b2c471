//! Does the manager's work grow with nodes, not ranks? (Not a test: `cargo bench --bench
//! scale`; figures in BENCHMARKS.md.)
//!
//! **Control plane at scale.** For each size (1,024, 4,096 and 16,384 ranks, 16 a node): the
//! production manager (`taskd manager`, a process of its own, so that its CPU time, memory and
//! messages are its own), one production proxy per node (`ProxyNode`, in this process, each
//! with its own gRPC connection to the manager over loopback), and behind each proxy its 16
//! ranks simulated cheaply: they answer every directive as a worker does (the step they are
//! in, held after the pause step, the calls and digests the planner gives for the job's groups,
//! how long they were held, what they applied) but have no training loop, step gate, HAL or
//! connection of their own (`ProxyNode::attach_local`). Operations alternate `node-0:0` to its
//! backup NIC and back, submitted through the manager's control API. One JSON line per size:
//! `ranks, nodes, op_ms_median, op_ms_p90, stall_ms_median, manager_cpu_ms_per_op,
//! manager_rss_bytes, manager_msgs_per_op` (node replies the manager received per operation),
//! and more.
//!
//! **Stall against its floor** (`--sim`, and by default after the above): the simulator
//! (`taskd sim`'s scenario: real training loops, step gates and HCCL rendezvous, all
//! in-process) at 512 and 16,384 ranks; per operation, the stall from the first rank held to
//! the last one training again, beside the phases it cannot avoid: the pause (every rank
//! confirming it holds at the pause step), the switch and the resume, as the manager timed
//! them.
//!
//! `cargo bench --bench scale -- --sizes 1024,4096 --ops 10 --proxy-threads 2 --sim-sizes 512`;
//! `--no-sim` or `--sim-only`.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use taskd::actors::control::{ControlClient, Progress};
use taskd::actors::net::{NetConfig, ProxyNode};
use taskd::actors::transport::{Link, Sender, TransportError};
use taskd::actors::ProgressKind;
use taskd::core::protocol::{
    AppliedCall, Directive, DirectiveKind, GateReport, GroupView, Phase, RankReply, ReplyBody,
    WorkerHello, WorkerReport, WorkerToProxy,
};
use taskd::core::{plan_calls, GlobalRank, JobId, NicSide, OperationId, SwitchCapabilities};
use taskd::hal_mock::SoloLayout;
use taskd::sim::{run_scenario_observed, SimConfig};

const JOB: &str = "scale";
const PER_NODE: u32 = 16;

// ---------------------------------------------------------------------------------------------
// The manager, a process of its own

/// `taskd manager` for a job of `nodes` x 16 ranks, and where it listens.
struct ManagerProcess {
    child: Child,
    listen: String,
    control: String,
    metrics: String,
}

impl ManagerProcess {
    fn start(nodes: u32) -> ManagerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskd"))
            .args(["manager", "--job-id", JOB, "--force"])
            .args(["--nodes", &nodes.to_string()])
            .args(["--procs-per-node", &PER_NODE.to_string()])
            .args(["--listen", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            // The bench submits operations back to back, faster than an operator would.
            .args(["--control-rate-burst", "1000000"])
            .args(["--control-rate-per-sec", "1000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("taskd manager starts");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let (mut listen, mut control, mut metrics) = (None, None, None);
        while listen.is_none() || control.is_none() || metrics.is_none() {
            let line = lines
                .next()
                .expect("the manager prints its addresses")
                .unwrap();
            let word = |after: &str| {
                line.split_once(after)
                    .and_then(|(_, r)| r.split_whitespace().next())
                    .map(str::to_owned)
            };
            if line.contains("manager listening on") {
                listen = word("listening on ");
            } else if line.contains("control API on") {
                control = word("control API on ");
            } else if line.contains("metrics on") {
                metrics = word("metrics on http://");
            }
        }
        // Keep reading its output so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        ManagerProcess {
            child,
            listen: listen.unwrap(),
            control: control.unwrap(),
            metrics: metrics.unwrap().trim_end_matches("/metrics").to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time (user + system) the manager has used, in milliseconds.
    fn cpu_ms(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // utime, stime: fields 14 and 15 of the line, in ticks of 10 ms.
        (f[11] + f[12]) as f64 * 10.0
    }

    /// Resident memory of the manager, in bytes.
    fn rss_bytes(&self) -> u64 {
        self.status_bytes("VmRSS:")
    }

    /// Of [`ManagerProcess::rss_bytes`], the manager's own memory (anonymous: heap, stacks),
    /// without the pages of the executable and libraries it maps.
    fn rss_anon_bytes(&self) -> u64 {
        self.status_bytes("RssAnon:")
    }

    /// A `kB` line of `/proc/PID/status`, in bytes.
    fn status_bytes(&self, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib << 10)
    }

    /// The manager's `taskd_messages_total` series, by `(direction, kind)`.
    fn messages(&self) -> Counts {
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body.lines()
            .filter_map(|l| l.strip_prefix("taskd_messages_total{"))
            .filter_map(|l| {
                let (labels, value) = l.split_once("} ")?;
                let label = |k: &str| {
                    labels
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                        .map(|v| v.trim_end_matches('"').to_owned())
                };
                Some(((label("direction")?, label("kind")?), value.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Ranks simulated behind their proxy

/// The calls of one switch (or rollback) for every group it touches, planned once for all
/// ranks: `(group, size, digest, members)`.
struct Plan {
    targets: Vec<(GlobalRank, NicSide)>,
    calls: Vec<(String, u32, u64, BTreeSet<GlobalRank>)>,
}

/// The job's group layout (the simulated fabric's: world, `tp_*`, `dp_*`) and the plan of the
/// switch in flight.
struct Job {
    layout: SoloLayout,
    plan: Mutex<Option<Arc<Plan>>>,
}

impl Job {
    /// The plan for `targets`, made by the core planner on each group a target is in.
    fn plan(&self, targets: &[(GlobalRank, NicSide)]) -> Arc<Plan> {
        let mut cached = self.plan.lock().unwrap();
        if let Some(p) = cached.as_ref().filter(|p| p.targets == targets) {
            return p.clone();
        }
        let mut calls = Vec::new();
        let mut seen = BTreeSet::new();
        for (t, _) in targets {
            for g in self.layout.groups_of(*t) {
                if !seen.insert(g.name.clone()) {
                    continue;
                }
                for c in plan_calls(std::slice::from_ref(&g), targets) {
                    let members = g.members.iter().copied().collect();
                    calls.push((c.group.clone(), g.members.len() as u32, c.digest(), members));
                }
            }
        }
        let p = Arc::new(Plan {
            targets: targets.to_vec(),
            calls,
        });
        *cached = Some(p.clone());
        p
    }

    /// The names and sizes of `rank`'s groups, sorted by name.
    fn groups_of(&self, rank: GlobalRank) -> Vec<(String, u32)> {
        let tp = self.layout.tp_size;
        let world = self.layout.world_size();
        let mut g = vec![
            (taskd::hal_mock::WORLD_GROUP.to_owned(), world),
            (format!("tp_{}", rank.0 / tp), tp),
            (format!("dp_{}", rank.0 % tp), world / tp),
        ];
        g.sort();
        g
    }
}

/// One simulated rank: what it answers to each directive.
struct SimRank {
    rank: GlobalRank,
    job: Arc<Job>,
    state: Mutex<RankState>,
    up: OnceLock<Link<WorkerToProxy>>,
}

#[derive(Default)]
struct RankState {
    /// The step it last completed (it trains only to reach a pause step).
    last: u64,
    held_since: Option<Instant>,
    gate: Option<OperationId>,
    /// Targets this rank has set to their backup NIC.
    on_backup: BTreeSet<GlobalRank>,
}

impl SimRank {
    fn answer(&self, d: &Directive) -> ReplyBody {
        let mut st = self.state.lock().unwrap();
        match &d.kind {
            DirectiveKind::Sample { .. } => {
                st.gate = Some(d.op);
                ReplyBody::Sampled {
                    in_step: st.last + 1,
                    in_flight: false,
                }
            }
            DirectiveKind::PauseAt { step } => {
                st.last = *step;
                st.held_since = Some(Instant::now());
                ReplyBody::Paused { step: *step }
            }
            DirectiveKind::Switch { targets, .. } => self.apply(&mut st, &[targets]),
            DirectiveKind::Rollback {
                targets, restate, ..
            } => self.apply(&mut st, &[targets, restate]),
            DirectiveKind::Resume => {
                st.gate = None;
                let stalled = st.held_since.take().map_or(Duration::ZERO, |t| t.elapsed());
                ReplyBody::Resumed { stalled }
            }
            DirectiveKind::Verify => ReplyBody::Verified(self.report(&st)),
            DirectiveKind::StopTraining { .. } => ReplyBody::Stopped { at_step: None },
            DirectiveKind::AbortInFlight { .. } => ReplyBody::Aborted {
                in_step: st.last + 1,
                collectives: Vec::new(),
            },
            DirectiveKind::SwitchInFlight { targets, .. } => self.apply(&mut st, &[targets]),
        }
    }

    /// The calls a worker makes for `rounds` in turn (one entry per group, as a worker
    /// reports them), and the targets' sides applied to the rank's state.
    fn apply(&self, st: &mut RankState, rounds: &[&Vec<(GlobalRank, NicSide)>]) -> ReplyBody {
        let mut calls: Vec<AppliedCall> = Vec::new();
        for targets in rounds.iter().filter(|t| !t.is_empty()) {
            let plan = self.job.plan(targets);
            for (group, size, digest, members) in &plan.calls {
                if members.contains(&self.rank) {
                    let made = AppliedCall {
                        group: group.clone(),
                        group_size: *size,
                        digest: *digest,
                    };
                    AppliedCall::record(&mut calls, made);
                }
            }
            for (t, side) in targets.iter() {
                match side {
                    NicSide::Backup => st.on_backup.insert(*t),
                    NicSide::Primary => st.on_backup.remove(t),
                };
            }
        }
        ReplyBody::Applied { calls }
    }

    /// What a worker reports to a verification round: per group, the targets on backup
    /// that are its members.
    fn report(&self, st: &RankState) -> WorkerReport {
        let groups = self
            .job
            .groups_of(self.rank)
            .into_iter()
            .map(|(group, size)| GroupView {
                on_backup: st
                    .on_backup
                    .iter()
                    .copied()
                    .filter(|t| self.job.groups_of(*t).iter().any(|(g, _)| *g == group))
                    .collect(),
                group,
                size,
                // A simulated rank's calls never fail half-way.
                unsettled: Vec::new(),
            })
            .collect();
        WorkerReport {
            groups,
            gate: GateReport {
                op: st.gate,
                held_after: st.held_since.map(|_| st.last),
            },
        }
    }
}

impl Sender<Directive> for SimRank {
    fn send(&self, d: Directive) -> Result<(), TransportError> {
        let body = self.answer(&d);
        let reply = RankReply {
            rank: self.rank,
            op: d.op,
            phase: d.phase(),
            body,
        };
        let up = self.up.get().ok_or(TransportError::Closed)?;
        up.send(WorkerToProxy::Reply(reply))
    }
}

/// The proxies of `nodes` and their simulated ranks, on the current actix system.
async fn spawn_nodes(nodes: Vec<u32>, job: Arc<Job>, manager: String) -> Vec<ProxyNode> {
    let mut proxies = Vec::new();
    for k in nodes {
        let p = ProxyNode::spawn(common::proxy_config(JOB, &manager, k, NetConfig::default()))
            .await
            .unwrap();
        let a = p.assigned().await.unwrap();
        for rank in a.ranks.keys() {
            let sim = Arc::new(SimRank {
                rank: *rank,
                job: job.clone(),
                state: Mutex::new(RankState::default()),
                up: OnceLock::new(),
            });
            let up = p.attach_local(*rank, sim.clone()).unwrap();
            let hello = WorkerHello {
                job: JobId(JOB.into()),
                node: a.node.clone(),
                rank: *rank,
                capabilities: SwitchCapabilities::ALL,
                instance: taskd::core::Instance(u64::from(rank.0) + 1),
                generation: 0,
            };
            up.send(WorkerToProxy::Hello(hello)).unwrap();
            let _ = sim.up.set(up);
        }
        proxies.push(p);
    }
    proxies
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// One operation as the control API streamed it: its summary and how long each phase took.
struct Op {
    total: f64,
    stall: f64,
    took: HashMap<String, f64>,
}

async fn run_op(client: &mut ControlClient, use_backup: bool) -> Op {
    let mut s = client
        .submit(&common::switch_device_0(JOB, "node-0", use_backup))
        .await
        .unwrap();
    let mut took = HashMap::new();
    loop {
        match s.next().await.unwrap() {
            Progress::Phase(p) => {
                if let Some(t) = p.took_ms {
                    took.insert(p.phase.clone(), t);
                }
            }
            Progress::Finished(r) => {
                assert_eq!(r.result, "succeeded", "{r}");
                return Op {
                    total: r.phases_ms.total,
                    stall: r.stall_ms.unwrap_or(f64::NAN),
                    took,
                };
            }
        }
    }
}

/// The manager's message counters: `(kind, direction)` to count.
type Counts = HashMap<(String, String), f64>;

fn messages_in(m: &Counts, kind: &str) -> f64 {
    m.get(&("in".to_owned(), kind.to_owned()))
        .copied()
        .unwrap_or(0.0)
}

fn directives_out(m: &Counts) -> f64 {
    m.iter()
        .filter(|((dir, kind), _)| {
            dir == "out"
                && ["sample", "pause", "switch", "rollback", "resume"].contains(&kind.as_str())
        })
        .map(|(_, v)| v)
        .sum()
}

/// Measures one size; prints its JSON line.
fn measure(ranks: u32, ops: usize, proxy_threads: u32) {
    let nodes = ranks / PER_NODE;
    let t0 = Instant::now();
    let manager = ManagerProcess::start(nodes);
    let rss_started = manager.rss_bytes();
    let job = Arc::new(Job {
        layout: SoloLayout::new(nodes, PER_NODE),
        plan: Mutex::new(None),
    });
    let threads = proxy_threads.clamp(1, nodes);
    let systems: Vec<_> = (0..threads)
        .map(|t| {
            let ns: Vec<u32> = (t..nodes).step_by(threads as usize).collect();
            let (job, listen) = (job.clone(), manager.listen.clone());
            let (proxies, sys) = common::system(&format!("scale-proxies-{t}"), move || {
                spawn_nodes(ns, job, listen)
            });
            std::mem::forget(proxies); // they live as long as their system
            sys
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut client = rt
        .block_on(ControlClient::connect(&manager.control, None))
        .unwrap();
    // Every rank registered and the manager's verification round (a report from every rank)
    // is over.
    rt.block_on(client.wait_registered(JOB, None)).unwrap();
    let setup = t0.elapsed();
    let rss_registered = manager.rss_bytes();
    for b in [true, false] {
        rt.block_on(run_op(&mut client, b));
    }
    let (cpu0, msgs0) = (manager.cpu_ms(), manager.messages());
    let mut done = Vec::new();
    for i in 0..ops {
        done.push(rt.block_on(run_op(&mut client, i % 2 == 0)));
    }
    let (cpu1, msgs1) = (manager.cpu_ms(), manager.messages());
    let (rss, rss_anon) = (manager.rss_bytes(), manager.rss_anon_bytes());
    let per_op = |f: &dyn Fn(&Counts) -> f64| (f(&msgs1) - f(&msgs0)) / ops as f64;
    let replies = per_op(&|m| messages_in(m, "node_reply"));
    let directives = per_op(&directives_out);
    let phase =
        |p: &str| common::median(done.iter().filter_map(|o| o.took.get(p).copied()).collect());
    let floors: Vec<f64> = done
        .iter()
        .map(|o| {
            ["pause", "switch", "resume"]
                .iter()
                .map(|p| o.took[*p])
                .sum()
        })
        .collect();
    let mut totals: Vec<f64> = done.iter().map(|o| o.total).collect();
    let stall = common::median(done.iter().map(|o| o.stall).collect());
    println!(
        "{}",
        serde_json::json!({
            "ranks": ranks,
            "nodes": nodes,
            "op_ms_median": common::median(totals.clone()),
            "op_ms_p90": common::pct(&mut totals, 0.9),
            "stall_ms_median": stall,
            "manager_cpu_ms_per_op": (cpu1 - cpu0) / ops as f64,
            "manager_rss_bytes": rss,
            "manager_msgs_per_op": replies,
            "manager_rss_bytes_per_rank": rss / u64::from(ranks),
            "manager_rss_anon_bytes": rss_anon,
            "manager_rss_started_bytes": rss_started,
            "manager_rss_registered_bytes": rss_registered,
            "manager_msgs_per_node_per_phase": replies / f64::from(nodes) / 4.0,
            "manager_directives_out_per_op": directives,
            "sample_ms_median": phase("sample"),
            "pause_ms_median": phase("pause"),
            "switch_ms_median": phase("switch"),
            "resume_ms_median": phase("resume"),
            "floor_ms_median": common::median(floors),
            "ops": ops,
            "setup_s": setup.as_secs_f64(),
        })
    );
    drop(client);
    for s in systems {
        s.stop();
    }
    drop(manager);
}

/// The simulator's scenario at `ranks`; one JSON line per operation: the stall from the first
/// rank held to the last one training again, beside its floor.
fn measure_sim(ranks: u32) {
    let cfg = SimConfig {
        nodes: ranks / PER_NODE,
        ..SimConfig::default()
    };
    let took: Mutex<HashMap<(OperationId, Phase), Duration>> = Mutex::default();
    let started = Instant::now();
    let run = run_scenario_observed(&cfg, |ev| {
        if let ProgressKind::PhaseFinished { phase, took: t } = &ev.kind {
            took.lock().unwrap().insert((ev.op, *phase), *t);
        }
    })
    .unwrap();
    let wall = started.elapsed();
    assert!(run.report.invariants.ok, "{:#?}", run.report.invariants);
    let took = took.into_inner().unwrap();
    for (op, holds) in run.report.operations.iter().zip(&run.holds) {
        let id: OperationId = op.uuid.parse().unwrap();
        let ms = |p: Phase| {
            took.get(&(id, p))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        let floor = ms(Phase::Pause) + ms(Phase::Switch) + ms(Phase::Resume);
        let stall = holds.map_or(f64::NAN, |h| h.stall().as_secs_f64() * 1e3);
        println!(
            "{}",
            serde_json::json!({
                "sim_ranks": ranks,
                "direction": op.direction,
                "stall_ms": stall,
                "ranks_held": holds.map(|h| h.ranks),
                "floor_ms": floor,
                "stall_to_floor": stall / floor,
                "sample_ms": ms(Phase::Sample),
                "pause_ms": ms(Phase::Pause),
                "switch_ms": ms(Phase::Switch),
                "resume_ms": ms(Phase::Resume),
                "op_ms": op.phases_ms.total,
                "longest_hold_ms": op.stall_ms,
                "scenario_wall_s": wall.as_secs_f64(),
            })
        );
    }
}

/// Does the manager's work grow with nodes, not ranks? And the simulator's stall.
#[derive(clap::Parser)]
struct Args {
    /// Job sizes in ranks for the manager's measurement, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    sizes: Vec<u32>,
    /// Job sizes in ranks for the stall against its floor, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,16384")]
    sim_sizes: Vec<u32>,
    /// Operations per size.
    #[arg(long, default_value_t = 10)]
    ops: usize,
    /// Threads hosting the simulated proxies.
    #[arg(long, default_value_t = 2)]
    proxy_threads: u32,
    /// Only the stall against its floor.
    #[arg(long, conflicts_with = "no_sim")]
    sim_only: bool,
    /// Not the stall against its floor.
    #[arg(long)]
    no_sim: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let args: Args = clap::Parser::parse();
    if !args.sim_only {
        for &n in &args.sizes {
            measure(n, args.ops, args.proxy_threads);
        }
    }
    if !args.no_sim {
        for &n in &args.sim_sizes {
            measure_sim(n);
        }
    }
}
