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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use taskd::actors::control::{self, ControlClient, ControlConfig, ControlServer};
use taskd::actors::net::proxy_node::NodeAssignment;
use taskd::actors::net::worker_node::WorkerNode;
use taskd::actors::net::{
    ManagerNode, ManagerNodeConfig, NetConfig, ProxyNode, ProxyNodeConfig, RemoteWorkerConfig,
};
use taskd::actors::StepGate;
use taskd::core::command::Target;
use taskd::core::summary::ms;
use taskd::core::OperationSummary;
use taskd::core::{
    DeviceId, GlobalRank, JobId, NodeHal, NodeName, PhaseDeadlines, RankTable, SwitchCommand,
};
use taskd::hal_mock::{SoloLayout, SoloNodeHal, SoloRank};

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

/// A job of `nodes` x `ppn` ranks on loopback.
struct Job {
    /// The manager's control API (operations are submitted there, as an operator does).
    control: ControlServer,
    systems: Vec<actix::System>,
    workers: tokio::sync::mpsc::UnboundedSender<Cmd>,
    stop: Arc<AtomicBool>,
    trainers: Vec<std::thread::JoinHandle<()>>,
    gates: Vec<Arc<StepGate>>,
}

fn system<T: Send + 'static, F, Fut>(name: &str, f: F) -> (T, actix::System)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let sys = actix::System::new();
            sys.block_on(async move {
                let v = f().await;
                tx.send((v, actix::System::current())).unwrap();
            });
            sys.run().unwrap();
        })
        .unwrap();
    rx.recv().unwrap()
}

/// The manager and its control API on an actix system of their own: the manager's transport
/// address and the control server.
fn start_manager(nodes: u32, ppn: u32) -> ((String, ControlServer), actix::System) {
    system("bench-manager", move || async move {
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
        let ctl = control::serve(
            m.manager().clone(),
            ControlConfig::new("127.0.0.1:0".parse().unwrap(), JobId(JOB.into())),
        )
        .unwrap();
        std::mem::forget(m);
        (addr, ctl)
    })
}

/// One proxy per node on an actix system of their own; their addresses.
fn start_proxies(nodes: u32, manager: String) -> (Vec<String>, actix::System) {
    system("bench-proxies", move || async move {
        let mut addrs = Vec::new();
        for k in 0..nodes {
            let p = ProxyNode::spawn(ProxyNodeConfig {
                job: JobId(JOB.into()),
                manager: manager.clone(),
                node: None,
                node_rank: Some(k),
                ranks: Vec::new(),
                listen: "127.0.0.1:0".parse().unwrap(),
                node_hal: Box::new(|a: &NodeAssignment| {
                    Box::new(SoloNodeHal::new(a.ranks.len() as u32)) as Box<dyn NodeHal>
                }),
                tls: None,
                net: net(),
            })
            .await
            .unwrap();
            p.assigned().await.unwrap();
            addrs.push(p.local_addr().to_string());
            std::mem::forget(p);
        }
        addrs
    })
}

/// Training with zero-time steps: a rank parks until an operation arms its gate. The flag that
/// stops the trainers, and their threads.
fn train(
    solos: Vec<SoloRank>,
    gates: &[Arc<StepGate>],
) -> (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let trainers = solos
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
                        gate.step_completed(step);
                    }
                }
            })
        })
        .collect();
    (stop, trainers)
}

impl Job {
    fn start(nodes: u32, ppn: u32, worker_threads: u32) -> Job {
        let ((manager, control), sys_m) = start_manager(nodes, ppn);
        let (proxies, sys_p) = start_proxies(nodes, manager);
        let layout = SoloLayout::new(nodes, ppn);
        let world = nodes * ppn;
        let solos: Vec<SoloRank> = (0..world)
            .map(|r| SoloRank::new(layout, GlobalRank(r)).unwrap())
            .collect();
        let gates: Vec<Arc<StepGate>> = (0..world).map(|_| Arc::new(StepGate::new())).collect();
        let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
        let mut systems = vec![sys_m, sys_p];
        let threads = worker_threads.clamp(1, world);
        for t in 0..threads {
            let (s2, g2, proxies) = (solos.clone(), gates.clone(), proxies.clone());
            // Thread 0 hosts rank 0 and answers the ping commands.
            let mut cmds = (t == 0)
                .then(|| std::mem::replace(&mut cmd_rx, tokio::sync::mpsc::unbounded_channel().1));
            let ((), sys_w) = system(&format!("bench-workers-{t}"), move || async move {
                let mut nodes_ = Vec::new();
                for r in (t..world).step_by(threads as usize) {
                    let mut cfg = RemoteWorkerConfig::new(
                        JobId(JOB.into()),
                        GlobalRank(r),
                        proxies[(r / ppn) as usize].clone(),
                    );
                    cfg.tsp = true;
                    cfg.net = net();
                    nodes_.push(WorkerNode::spawn(
                        cfg,
                        Box::new(s2[r as usize].hal()),
                        g2[r as usize].clone(),
                    ));
                }
                for w in &nodes_ {
                    w.registered().await.unwrap();
                }
                let Some(mut cmd_rx) = cmds.take() else {
                    std::mem::forget(nodes_);
                    return;
                };
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
                                    v.push(
                                        nodes_[0]
                                            .ping(to_manager, Duration::from_secs(5))
                                            .await
                                            .unwrap(),
                                    );
                                }
                                let _ = reply.send(v);
                            }
                            Cmd::Stop => break,
                        }
                    }
                });
            });
            systems.push(sys_w);
        }
        let (stop, trainers) = train(solos, &gates);
        Job {
            control,
            systems,
            workers: cmd_tx,
            stop,
            trainers,
            gates,
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
        for t in self.trainers {
            t.join().unwrap();
        }
        let _ = self.workers.send(Cmd::Stop);
        self.control.shutdown();
        for s in self.systems.into_iter().rev() {
            s.stop();
        }
    }
}

fn cmd(use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(JOB.into()),
        id: None,
        targets: vec![Target {
            node: NodeName("node-0".into()),
            device: DeviceId(0),
            use_backup,
        }],
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// Starts a job of `n` ranks, runs `ops` operations through the control API and prints the
/// table's row; the job, still running.
fn measure(rt: &tokio::runtime::Runtime, n: u32, ops: usize, worker_threads: u32) -> Job {
    let ppn = n.min(16);
    let nodes = n.div_ceil(ppn);
    let t0 = Instant::now();
    let job = Job::start(nodes, ppn, worker_threads);
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
        let r = rt.block_on(client.run(&cmd(b))).unwrap();
        assert_eq!(r.result, "succeeded", "{r}");
    }
    let mut reports: Vec<OperationSummary> = Vec::new();
    let mut walls = Vec::new();
    for i in 0..ops {
        let t = Instant::now();
        let r = rt.block_on(client.run(&cmd(i % 2 == 0))).unwrap();
        walls.push(ms(t.elapsed()));
        assert_eq!(r.result, "succeeded", "{r}");
        reports.push(r);
    }
    drop(client);
    let col = |f: &dyn Fn(&OperationSummary) -> Option<f64>| {
        median(reports.iter().filter_map(f).collect())
    };
    let totals: Vec<f64> = reports.iter().map(|r| r.phases_ms.total).collect();
    println!(
        "| {n} | {nodes} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
        setup.as_secs_f64(),
        median(totals.clone()),
        pct(totals, 0.9),
        col(&|r| r.phases_ms.pause),
        col(&|r| r.phases_ms.switch),
        col(&|r| r.phases_ms.resume),
        median(walls),
    );
    job
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<u32> = args
        .iter()
        .position(|a| a == "--sizes")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 64, 512]);
    let ops: usize = arg(&args, "--ops").unwrap_or(10);
    let pings: usize = arg(&args, "--pings").unwrap_or(2000);
    let worker_threads: u32 = arg(&args, "--worker-threads").unwrap_or(1);
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
    println!("machine: {cpu}, {cores} cores available; workers on {worker_threads} thread(s)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    println!("\n| ranks | nodes | setup s | op total ms (median) | p90 | pause | switch | resume | submit-to-result ms (median) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut rtt_job = None;
    for &n in &sizes {
        let job = measure(&rt, n, ops, worker_threads);
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
            let v: Vec<f64> = job
                .pings(pings, to_manager)
                .into_iter()
                .map(|d| d.as_secs_f64() * 1e6)
                .collect();
            let min = v.iter().cloned().fold(f64::MAX, f64::min);
            println!(
                "| {label} | {:.0} | {:.0} | {:.0} | {:.0} |",
                median(v.clone()),
                pct(v.clone(), 0.9),
                pct(v, 0.99),
                min
            );
        }
        job.stop();
    }
}
