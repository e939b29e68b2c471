//! Control-plane cost of the network transport on loopback (not a test: `cargo bench --bench
//! net`; figures in BENCHMARKS.md).
//!
//! - A full operation (pause + switch + resume, then the switch back) for 8, 64 and 512 ranks:
//!   a manager, one proxy per node (16 ranks a node) and one worker per rank, each with its own
//!   gRPC connection over real loopback sockets, as tasks on three actix systems (manager,
//!   proxies, workers) in this process. The HAL is the solo mock (in-memory, microseconds) and
//!   training steps take no time: a rank parks until an operation arms its gate, so what is
//!   measured is the control plane, not the training or HCCL.
//! - The round trip of one message worker -> proxy -> manager -> proxy -> worker, and of
//!   worker -> proxy -> worker.
//!
//! `cargo bench --bench net -- --sizes 8,64 --ops 20 --pings 5000 --worker-threads 4` to change
//! the run (`--worker-threads`: how many actix systems host the workers; 1 by default).
//!
//! The simulated ranks are tasks (`--harness tasks`, the default): each rank's training loop
//! is a task beside its worker (on the workers' actix system). `--harness threads` gives every
//! rank a training thread, as one process per rank would: the figures of BENCHMARKS.md before
//! the simulated ranks became tasks. Either way every worker's HAL calls run on a thread of
//! its own (`taskd_actors::ThreadedRankHal`), as in a training process. `--harness inline`
//! makes the training loops tasks and the solo mock's calls on the worker's own thread (it
//! never blocks: the bench injects no fault), to show the control plane without HAL threads.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use taskd::actors::control::{self, ControlClient, ControlConfig, ControlServer, RateLimit};
use taskd::actors::net::worker_node::WorkerNode;
use taskd::actors::net::{
    ManagerNode, ManagerNodeConfig, NetConfig, ProxyNode, RemoteWorkerConfig,
};
use taskd::actors::{StepGate, ThreadedRankHal};
use taskd::core::summary::ms;
use taskd::core::OperationSummary;
use taskd::core::{GlobalRank, JobId, PhaseDeadlines, RankTable};
use taskd::core::{GroupRank, GroupsFuture, HalFuture, RankHal, SwitchCapabilities, TaskRankHal};
use taskd::hal_mock::{SoloLayout, SoloRank, SoloRankHal};

const JOB: &str = "bench";

fn net() -> NetConfig {
    NetConfig {
        queue_capacity: 4096,
        ..NetConfig::default()
    }
}

enum Cmd {
    Ping {
        n: usize,
        to_manager: bool,
        reply: mpsc::Sender<Vec<Duration>>,
    },
    Stop,
}

/// How the bench simulates its ranks' training loops and where their HAL calls run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Harness {
    /// A thread per rank for training, a HAL thread per worker.
    Threads,
    /// Training loops as tasks beside their workers, a HAL thread per worker.
    Tasks,
    /// Training loops as tasks, the HAL's calls on the worker's thread.
    Inline,
}

/// The solo mock called on the worker's own thread: its calls never block when no fault is
/// injected, which this bench never does.
struct InlineSolo(SoloRankHal);

impl TaskRankHal for InlineSolo {
    fn groups(&mut self) -> GroupsFuture<'_> {
        Box::pin(std::future::ready(self.0.groups()))
    }

    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a> {
        Box::pin(std::future::ready(
            self.0.set_working_nic(group, ranks, use_backup),
        ))
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.0.capabilities()
    }
}

/// A job of `nodes` x `ppn` ranks on loopback.
struct Job {
    /// The manager's control API (operations are submitted there, as an operator does).
    control: ControlServer,
    systems: Vec<actix::System>,
    workers: tokio::sync::mpsc::UnboundedSender<Cmd>,
    stop: Arc<AtomicBool>,
    trainers: Trainers,
    gates: Vec<Arc<StepGate>>,
}

/// The ranks' training loops: threads, or tasks beside their workers.
enum Trainers {
    Threads(Vec<std::thread::JoinHandle<()>>),
    Tasks(Vec<tokio::task::JoinHandle<()>>),
}

/// The manager and its control API on an actix system of their own: the manager's transport
/// address and the control server.
fn start_manager(nodes: u32, ppn: u32) -> ((String, ControlServer), actix::System) {
    common::system("bench-manager", move || async move {
        let m = ManagerNode::spawn(ManagerNodeConfig {
            job: JobId(JOB.into()),
            table: RankTable::uniform(nodes, ppn),
            deadlines: PhaseDeadlines::default(),
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: None,
            net: net(),
        })
        .await
        .unwrap();
        let addr = m.local_addr().to_string();
        let mut cfg = ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId(JOB.into()));
        // The bench submits operations back to back: faster than an operator's rate limit.
        cfg.guard.rate = RateLimit {
            burst: 1_000_000,
            per_second: 1e6,
        };
        let ctl = control::serve(m.manager().clone(), cfg).unwrap();
        std::mem::forget(m);
        (addr, ctl)
    })
}

/// Starts the proxies of `nodes` on the current actix system; their addresses, by node.
async fn spawn_proxies(nodes: Vec<u32>, manager: String) -> Vec<(u32, String)> {
    let mut addrs = Vec::new();
    for k in nodes {
        let p = ProxyNode::spawn(common::proxy_config(JOB, &manager, k, net()))
            .await
            .unwrap();
        p.assigned().await.unwrap();
        addrs.push((k, p.local_addr().to_string()));
        std::mem::forget(p);
    }
    addrs
}

/// Training with zero-time steps, on threads: a rank parks until an operation arms its gate.
fn train_threads(
    solos: Vec<SoloRank>,
    gates: &[Arc<StepGate>],
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    solos
        .into_iter()
        .zip(gates.iter().cloned())
        .map(|(solo, gate)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                solo.run_collectives();
                let mut step = 1;
                while !stop.load(Ordering::Acquire) {
                    if gate.wait_armed(Duration::from_millis(200)) {
                        step += 1;
                        solo.run_collectives();
                        if gate.step_completed(step).is_stop() {
                            return;
                        }
                    }
                }
            })
        })
        .collect()
}

/// One rank's training with zero-time steps, as a task: it parks until an operation arms its
/// gate, then steps to the pause and holds there.
async fn train_task(solo: SoloRank, gate: Arc<StepGate>, stop: Arc<AtomicBool>) {
    solo.run_collectives();
    let mut step = 1;
    loop {
        gate.armed().await;
        if stop.load(Ordering::Acquire) {
            return;
        }
        step += 1;
        solo.run_collectives();
        if let Some(hold) = gate.step_completed_or_hold(step) {
            if hold.await.is_stop() {
                return;
            }
        }
    }
}

/// Which thread hosts what: `--layout roles` (the manager, all proxies, all workers on a
/// thread each, workers spread over `--worker-threads`) or `--layout nodes` (each node's proxy
/// with its workers, as they share a host; nodes spread over `--worker-threads` threads).
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Layout {
    Roles,
    Nodes,
}

/// What one actix system of the bench hosts.
struct Group {
    name: String,
    /// Nodes whose proxy it runs.
    nodes: Vec<u32>,
    /// Ranks whose worker (and training task) it runs.
    ranks: Vec<u32>,
}

/// The ranks' parts and how they run, shared by every group.
#[derive(Clone)]
struct Parts {
    solos: Vec<SoloRank>,
    gates: Vec<Arc<StepGate>>,
    harness: Harness,
    stop: Arc<AtomicBool>,
    ppn: u32,
}

/// Starts the workers of `ranks` (and, with task harness, their training tasks) on the current
/// actix system; `proxies[node]` is each node's address. The workers and the tasks.
async fn spawn_workers(
    ranks: &[u32],
    proxies: &[String],
    p: &Parts,
) -> (Vec<WorkerNode>, Vec<tokio::task::JoinHandle<()>>) {
    let mut nodes_ = Vec::new();
    let mut trainers = Vec::new();
    for &r in ranks {
        let mut cfg = RemoteWorkerConfig::new(
            JobId(JOB.into()),
            GlobalRank(r),
            proxies[(r / p.ppn) as usize].clone(),
        );
        cfg.tsp = true;
        cfg.net = net();
        let solo = p.solos[r as usize].hal();
        let hal: Box<dyn TaskRankHal> = match p.harness {
            Harness::Inline => Box::new(InlineSolo(solo)),
            _ => Box::new(ThreadedRankHal::for_rank(GlobalRank(r), Box::new(solo)).unwrap()),
        };
        let gate = p.gates[r as usize].clone();
        nodes_.push(WorkerNode::spawn(cfg, hal, gate.clone()));
        if p.harness != Harness::Threads {
            let solo = p.solos[r as usize].clone();
            trainers.push(actix_rt::spawn(train_task(solo, gate, p.stop.clone())));
        }
    }
    for w in &nodes_ {
        w.registered().await.unwrap();
    }
    (nodes_, trainers)
}

/// Answers the ping commands with the first worker of `nodes_` (rank 0).
fn serve_pings(nodes_: Vec<WorkerNode>, mut cmd_rx: tokio::sync::mpsc::UnboundedReceiver<Cmd>) {
    actix_rt::spawn(async move {
        while let Some(cmd) = cmd_rx.recv().await {
            match cmd {
                Cmd::Ping {
                    n,
                    to_manager,
                    reply,
                } => {
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        let rtt = nodes_[0].ping(to_manager, Duration::from_secs(5));
                        v.push(rtt.await.unwrap());
                    }
                    let _ = reply.send(v);
                }
                Cmd::Stop => break,
            }
        }
    });
}

/// The groups of a job of `nodes` x `ppn` ranks on `threads` threads.
fn groups(layout: Layout, nodes: u32, ppn: u32, threads: u32) -> Vec<Group> {
    let world = nodes * ppn;
    match layout {
        Layout::Roles => {
            let threads = threads.clamp(1, world);
            let mut g = vec![Group {
                name: "bench-proxies".into(),
                nodes: (0..nodes).collect(),
                ranks: Vec::new(),
            }];
            g.extend((0..threads).map(|t| Group {
                name: format!("bench-workers-{t}"),
                nodes: Vec::new(),
                ranks: (t..world).step_by(threads as usize).collect(),
            }));
            g
        }
        Layout::Nodes => {
            let threads = threads.clamp(1, nodes);
            (0..threads)
                .map(|t| {
                    let ns: Vec<u32> = (t..nodes).step_by(threads as usize).collect();
                    Group {
                        name: format!("bench-nodes-{t}"),
                        ranks: ns.iter().flat_map(|n| n * ppn..(n + 1) * ppn).collect(),
                        nodes: ns,
                    }
                })
                .collect()
        }
    }
}

impl Job {
    fn start(nodes: u32, ppn: u32, threads: u32, harness: Harness, layout: Layout) -> Job {
        let ((manager, control), sys_m) = start_manager(nodes, ppn);
        let layout_ = SoloLayout::new(nodes, ppn);
        let world = nodes * ppn;
        let parts = Parts {
            solos: (0..world)
                .map(|r| SoloRank::new(layout_, GlobalRank(r)).unwrap())
                .collect(),
            gates: (0..world).map(|_| Arc::new(StepGate::new())).collect(),
            harness,
            stop: Arc::new(AtomicBool::new(false)),
            ppn,
        };
        let (cmd_tx, cmd_rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
        let mut cmd_rx = Some(cmd_rx);
        let mut systems = vec![sys_m];
        let mut tasks = Vec::new();
        // Proxies first (the workers need their addresses), then the workers of each group.
        let groups = groups(layout, nodes, ppn, threads);
        let mut proxies = vec![String::new(); nodes as usize];
        let mut started = Vec::new();
        for g in groups {
            let (ns, manager) = (g.nodes.clone(), manager.clone());
            let (addrs, sys) = common::system(&g.name, move || spawn_proxies(ns, manager));
            for (k, a) in addrs {
                proxies[k as usize] = a;
            }
            started.push((g, sys));
        }
        for (g, sys) in started {
            let (p, proxies) = (parts.clone(), proxies.clone());
            // The group of rank 0 answers the ping commands.
            let cmds = g.ranks.contains(&0).then(|| cmd_rx.take()).flatten();
            let (tx, rx) = mpsc::channel();
            sys.arbiter().spawn(async move {
                let (nodes_, trainers) = spawn_workers(&g.ranks, &proxies, &p).await;
                match cmds {
                    Some(cmds) => serve_pings(nodes_, cmds),
                    None => std::mem::forget(nodes_),
                }
                tx.send(trainers).unwrap();
            });
            tasks.extend(rx.recv().unwrap());
            systems.push(sys);
        }
        let trainers = match harness {
            Harness::Threads => Trainers::Threads(train_threads(
                parts.solos.clone(),
                &parts.gates,
                &parts.stop,
            )),
            Harness::Tasks | Harness::Inline => Trainers::Tasks(tasks),
        };
        Job {
            control,
            systems,
            workers: cmd_tx,
            stop: parts.stop,
            trainers,
            gates: parts.gates,
        }
    }

    fn pings(&self, n: usize, to_manager: bool) -> Vec<Duration> {
        let (tx, rx) = mpsc::channel();
        self.workers
            .send(Cmd::Ping {
                n,
                to_manager,
                reply: tx,
            })
            .unwrap();
        rx.recv().unwrap()
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for g in &self.gates {
            g.shutdown();
        }
        match self.trainers {
            Trainers::Threads(threads) => {
                for t in threads {
                    t.join().unwrap();
                }
            }
            Trainers::Tasks(tasks) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                })
            }
        }
        let _ = self.workers.send(Cmd::Stop);
        self.control.shutdown();
        for s in self.systems.into_iter().rev() {
            s.stop();
        }
    }
}

/// CPU time (user + system) process `pid` has used, in milliseconds (from `/proc`, in clock
/// ticks of 10 ms).
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 after the name.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 * 10.0
}

/// Starts a job of `n` ranks, runs `ops` operations through the control API and prints the
/// table's row; the job, still running.
fn measure(
    rt: &tokio::runtime::Runtime,
    n: u32,
    ops: usize,
    worker_threads: u32,
    (harness, layout): (Harness, Layout),
) -> Job {
    let ppn = n.min(16);
    let nodes = n.div_ceil(ppn);
    let t0 = Instant::now();
    let job = Job::start(nodes, ppn, worker_threads, harness, layout);
    let mut client = rt
        .block_on(ControlClient::connect(
            &job.control.local_addr().to_string(),
            None,
        ))
        .unwrap();
    rt.block_on(client.wait_registered(JOB, None)).unwrap();
    let setup = t0.elapsed();
    // One warm-up round trip of each direction.
    for b in [true, false] {
        let r = rt
            .block_on(client.run(&common::switch_device_0(JOB, "node-0", b)))
            .unwrap();
        assert_eq!(r.result, "succeeded", "{r}");
    }
    let mut reports: Vec<OperationSummary> = Vec::new();
    let mut walls = Vec::new();
    let cpu0 = cpu_ms(std::process::id());
    for i in 0..ops {
        let t = Instant::now();
        let r = rt
            .block_on(client.run(&common::switch_device_0(JOB, "node-0", i % 2 == 0)))
            .unwrap();
        walls.push(ms(t.elapsed()));
        assert_eq!(r.result, "succeeded", "{r}");
        reports.push(r);
    }
    let cpu = (cpu_ms(std::process::id()) - cpu0) / ops as f64;
    drop(client);
    let col = |f: &dyn Fn(&OperationSummary) -> Option<f64>| {
        common::median(reports.iter().filter_map(f).collect())
    };
    let mut totals: Vec<f64> = reports.iter().map(|r| r.phases_ms.total).collect();
    let total = common::median(totals.clone());
    println!(
        "| {n} | {nodes} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |",
        setup.as_secs_f64(),
        total,
        common::pct(&mut totals, 0.9),
        col(&|r| r.phases_ms.pause),
        col(&|r| r.phases_ms.switch),
        col(&|r| r.phases_ms.resume),
        common::median(walls),
        total * 1e3 / f64::from(n),
        cpu * 1e3 / f64::from(n),
    );
    job
}

/// Control-plane cost of the network transport on loopback.
#[derive(clap::Parser)]
struct Args {
    /// Job sizes in ranks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64,512")]
    sizes: Vec<u32>,
    /// Operations per size.
    #[arg(long, default_value_t = 10)]
    ops: usize,
    /// Round trips of the ping measurement.
    #[arg(long, default_value_t = 2000)]
    pings: usize,
    /// How many actix systems host the workers.
    #[arg(long, default_value_t = 1)]
    worker_threads: u32,
    /// `tasks` (every rank a task), `threads` (every rank a training thread) or `inline`
    /// (tasks, and no HAL threads).
    #[arg(long, value_enum, default_value_t = Harness::Tasks)]
    harness: Harness,
    /// `roles` (a thread per role) or `nodes` (each node's proxy with its workers).
    #[arg(long, value_enum, default_value_t = Layout::Roles)]
    layout: Layout,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args {
        sizes,
        ops,
        pings,
        worker_threads,
        harness,
        layout,
        ..
    } = clap::Parser::parse();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cpu}, {cores} cores available; workers on {worker_threads} thread(s); \
         ranks' training and HAL as {harness:?}; layout {layout:?}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    println!("\n| ranks | nodes | setup s | op total ms (median) | p90 | pause | switch | resume | submit-to-result ms (median) | µs per rank per op | CPU µs per rank per op |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rtt_job = None;
    for &n in &sizes {
        let job = measure(&rt, n, ops, worker_threads, (harness, layout));
        if n == sizes[0] {
            rtt_job = Some(job);
        } else {
            job.stop();
        }
    }
    if let Some(job) = rtt_job {
        println!(
            "\nround trips from rank 0 ({pings} sequential, idle job of {} ranks):",
            sizes[0]
        );
        println!("| path | median µs | p90 | p99 | min |");
        println!("|---|---|---|---|---|");
        for (to_manager, label) in [
            (true, "worker -> proxy -> manager -> proxy -> worker"),
            (false, "worker -> proxy -> worker"),
        ] {
            job.pings(100, to_manager); // warm-up
            let mut v: Vec<f64> = job
                .pings(pings, to_manager)
                .into_iter()
                .map(|d| d.as_secs_f64() * 1e6)
                .collect();
            let min = v.iter().cloned().fold(f64::MAX, f64::min);
            println!(
                "| {label} | {:.0} | {:.0} | {:.0} | {:.0} |",
                common::median(v.clone()),
                common::pct(&mut v.clone(), 0.9),
                common::pct(&mut v, 0.99),
                min
            );
        }
        job.stop();
    }
}
