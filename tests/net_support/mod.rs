//! Support for the network tests: the `taskd` binary as separate processes on loopback, each
//! printing its bound address on stdout, and a client of the manager's control API (served on
//! port 0 next to its transport port).
//!
//! Nothing here sleeps to wait for an event: a test waits for a line a process prints, or for
//! the manager's answer. Every process is killed when its [`Proc`] drops, so a failing test
//! leaves nothing running.
//!
//! It builds on the helpers of `tests/common`: a test file with `mod net_support;` has `mod
//! common;` too.

#![allow(dead_code)]

use crate::common::lines_of;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use taskd::actors::control::proto::JobStatus;
use taskd::actors::control::{ClientError, ControlClient, Progress, Switching};
use taskd::actors::net::TlsPem;
use taskd::core::command::Target;
use taskd::core::{DeviceId, JobId, NodeName, OperationSummary, SwitchCommand};

/// How long a test waits for a line or an exit before it fails (a safety net: the expected
/// line normally comes in milliseconds).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A scratch directory for one test's logs and files, removed when the test passes.
pub(crate) struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub(crate) fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("taskd-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch { dir }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

/// One `taskd` process.
pub(crate) struct Proc {
    pub name: String,
    pid: u32,
    lines: mpsc::Receiver<String>,
    exit: mpsc::Receiver<ExitStatus>,
    stderr: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Starts `taskd ARGS` with stdout read line by line and stderr (RUST_LOG=info) to a file.
    pub(crate) fn spawn(scratch: &Scratch, name: &str, args: &[String]) -> Proc {
        let stderr = scratch.path(&format!("{name}.err"));
        let mut child: Child = Command::new(env!("CARGO_BIN_EXE_taskd"))
            .args(args)
            .env("RUST_LOG", "info,h2=warn,tower=warn,hyper=warn")
            .env_remove("MINDX_TASK_ID")
            .env_remove("MS_SCHED_HOST")
            .env_remove("POD_IP")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("taskd starts");
        let pid = child.id();
        let lines = lines_of(child.stdout.take().expect("piped stdout"));
        let (etx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(st) = child.wait() {
                let _ = etx.send(st);
            }
        });
        Proc {
            name: name.to_owned(),
            pid,
            lines,
            exit,
            stderr,
            exited: None,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The last lines of its stderr, for failure messages.
    pub(crate) fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Its whole stderr.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for a stdout line containing `pat` and returns it.
    pub(crate) fn wait_line(&mut self, pat: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(pat) => return l,
                Ok(_) => continue,
                Err(_) => panic!(
                    "{} printed no line with {pat:?} (exit: {:?}); stderr:\n{}",
                    self.name,
                    self.exit.try_recv().ok(),
                    self.stderr_tail()
                ),
            }
        }
    }

    /// The address after "listening on " in its first such line.
    pub(crate) fn listening_addr(&mut self) -> String {
        let line = self.wait_line("listening on ");
        line.split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("an address after 'listening on'")
            .to_owned()
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }

    /// SIGTERM: a clean shutdown.
    pub(crate) fn term(&self) {
        if self.exited.is_none() {
            self.signal("-TERM");
        }
    }

    /// SIGKILL: a crash. Returns once the process is gone.
    pub(crate) fn kill(&mut self) {
        if self.exited.is_none() {
            self.signal("-KILL");
            self.wait_exit();
        }
    }

    /// Whether it still runs, as far as can be seen now.
    pub(crate) fn running(&mut self) -> bool {
        if self.exited.is_none() {
            if let Ok(s) = self.exit.try_recv() {
                self.exited = Some(s);
            }
        }
        self.exited.is_none()
    }

    /// Waits for the process to exit.
    pub(crate) fn wait_exit(&mut self) -> ExitStatus {
        if let Some(s) = self.exited {
            return s;
        }
        match self.exit.recv_timeout(PATIENCE) {
            Ok(s) => {
                self.exited = Some(s);
                s
            }
            Err(_) => panic!(
                "{} did not exit; stderr:\n{}",
                self.name,
                self.stderr_tail()
            ),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.signal("-KILL");
            let _ = self.exit.recv_timeout(PATIENCE);
        }
    }
}

/// A whole job as processes: a manager, one proxy per node, one worker per rank.
pub(crate) struct Cluster {
    pub job: String,
    pub nodes: u32,
    pub ppn: u32,
    pub manager: Proc,
    pub manager_addr: String,
    pub proxies: Vec<Proc>,
    pub proxy_addrs: Vec<String>,
    pub workers: Vec<Option<Proc>>,
    pub rt: tokio::runtime::Runtime,
    /// The manager's control API, and a client of it.
    pub control_addr: String,
    pub control: ControlClient,
    /// Flags every process gets (heartbeats, TLS).
    pub common: Vec<String>,
}

/// How to build a [`Cluster`].
pub(crate) struct ClusterSpec<'a> {
    pub job: &'a str,
    pub nodes: u32,
    pub ppn: u32,
    /// Extra flags for rank r's worker (e.g. a slower step).
    pub worker_flags: &'a dyn Fn(u32) -> Vec<String>,
    pub manager_flags: Vec<String>,
    /// Flags for every process.
    pub common: Vec<String>,
    /// TLS material for the control client (the manager's control port uses the job's TLS).
    pub tls: Option<TlsPem>,
}

pub(crate) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

/// 100 ms heartbeats, lost after 20 (two seconds). A killed process's connection closes at
/// once, and it is declared lost when it has not come back within those two seconds; a live
/// process stalled by a loaded machine (a third of a second is common when other builds share
/// the cores) is not lost.
pub(crate) fn fast_heartbeats() -> Vec<String> {
    s(&["--heartbeat-ms", "100", "--missed-heartbeats", "20"])
}

/// `taskd manager` with its control API on port 0; the process, its transport address and its
/// control address.
fn spawn_manager(scratch: &Scratch, spec: &ClusterSpec<'_>) -> (Proc, String, String) {
    let mut margs = s(&[
        "manager",
        "--job-id",
        spec.job,
        "--nodes",
        &spec.nodes.to_string(),
        "--procs-per-node",
        &spec.ppn.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--control-addr",
        "127.0.0.1:0",
    ]);
    margs.extend(spec.manager_flags.iter().cloned());
    margs.extend(spec.common.iter().cloned());
    let mut manager = Proc::spawn(scratch, "manager", &margs);
    let manager_addr = manager.listening_addr();
    let control_addr = manager
        .wait_line("control API on ")
        .rsplit(' ')
        .next()
        .expect("an address after 'control API on'")
        .to_owned();
    (manager, manager_addr, control_addr)
}

impl Cluster {
    /// Starts a new manager of the same job on the same transport address (so the proxies
    /// find it), with `flags` besides the job's shape and the common flags, after the old one
    /// was killed; the control client follows it to its new control port.
    pub(crate) fn restart_manager(&mut self, scratch: &Scratch, flags: &[String]) {
        let mut args = s(&[
            "manager",
            "--job-id",
            &self.job,
            "--nodes",
            &self.nodes.to_string(),
            "--procs-per-node",
            &self.ppn.to_string(),
            "--listen",
            &self.manager_addr,
            "--control-addr",
            "127.0.0.1:0",
        ]);
        args.extend(flags.iter().cloned());
        args.extend(self.common.iter().cloned());
        self.manager = Proc::spawn(scratch, "manager-restarted", &args);
        let line = self.manager.wait_line("control API on ");
        self.control_addr = line.rsplit(' ').next().unwrap().to_owned();
        self.control = self
            .rt
            .block_on(ControlClient::connect(&self.control_addr, None))
            .expect("the control client connects");
    }

    /// Starts the manager, then every proxy, then every worker, and waits until every worker
    /// is registered.
    pub(crate) fn start(scratch: &Scratch, spec: ClusterSpec<'_>) -> Cluster {
        Cluster::start_via(scratch, spec, &|_, manager| manager.to_owned())
    }

    /// [`Cluster::start`], node `k`'s proxy reaching the manager at `via(k, manager_addr)`
    /// (a fault relay in front of it, say).
    pub(crate) fn start_via(
        scratch: &Scratch,
        spec: ClusterSpec<'_>,
        via: &dyn Fn(u32, &str) -> String,
    ) -> Cluster {
        let (manager, manager_addr, control_addr) = spawn_manager(scratch, &spec);
        let mut proxies = Vec::new();
        let mut proxy_addrs = Vec::new();
        for k in 0..spec.nodes {
            let mut args = s(&[
                "proxy",
                "--job-id",
                spec.job,
                "--node-rank",
                &k.to_string(),
                "--manager",
                &via(k, &manager_addr),
                "--listen",
                "127.0.0.1:0",
                "--sim",
            ]);
            args.extend(spec.common.iter().cloned());
            let mut p = Proc::spawn(scratch, &format!("proxy-{k}"), &args);
            proxy_addrs.push(p.listening_addr());
            proxies.push(p);
        }
        for (k, p) in proxies.iter_mut().enumerate() {
            p.wait_line(&format!("registered as node-{k}"));
        }
        let mut workers = Vec::new();
        for r in 0..spec.nodes * spec.ppn {
            let mut args = worker_args(spec.job, r, &proxy_addrs[(r / spec.ppn) as usize]);
            let extra = (spec.worker_flags)(r);
            if !extra.iter().any(|f| f == "--step-ms") {
                args.extend(s(&["--step-ms", "2"]));
            }
            args.extend(extra);
            args.extend(spec.common.iter().cloned());
            workers.push(Some(Proc::spawn(scratch, &format!("worker-{r}"), &args)));
        }
        for w in workers.iter_mut().flatten() {
            w.wait_line("registered on");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the control client");
        let control = rt
            .block_on(ControlClient::connect(&control_addr, spec.tls.as_ref()))
            .expect("the control client connects");
        let mut c = Cluster {
            job: spec.job.to_owned(),
            nodes: spec.nodes,
            ppn: spec.ppn,
            manager,
            manager_addr,
            proxies,
            proxy_addrs,
            workers,
            rt,
            control_addr,
            control,
            common: spec.common,
        };
        let status = c.wait_registered();
        assert_eq!(status.workers_registered, spec.nodes * spec.ppn);
        c
    }

    /// Submits and waits for the result.
    pub(crate) fn run(&mut self, cmd: &SwitchCommand) -> Result<OperationSummary, ClientError> {
        self.rt.block_on(self.control.run(cmd))
    }

    /// Submits; the accepted operation, to follow with [`Cluster::until_phase`] and
    /// [`Cluster::result`].
    pub(crate) fn submit(&mut self, cmd: &SwitchCommand) -> Result<Switching, ClientError> {
        self.rt.block_on(self.control.submit(cmd))
    }

    /// Follows `op` until `phase` started (the pause step it announces, for the pause); fails
    /// the test if the operation finishes first.
    pub(crate) fn until_phase(&self, op: &mut Switching, phase: &str) -> Option<u64> {
        loop {
            match self.rt.block_on(op.next()).expect("progress") {
                Progress::Phase(p) if p.phase == phase && p.kind == "started" => {
                    return p.pause_step
                }
                Progress::Phase(_) => continue,
                Progress::Finished(r) => panic!("finished before {phase}: {r:?}"),
            }
        }
    }

    /// The result of `op`.
    pub(crate) fn result(&self, op: Switching) -> OperationSummary {
        self.rt.block_on(op.result()).expect("a result")
    }

    /// The job's status with `recent` past results.
    pub(crate) fn status(&mut self, recent: u32) -> JobStatus {
        self.rt
            .block_on(self.control.status(&self.job, recent))
            .expect("status")
    }

    /// Every worker's process exits 1 after a stop of training, for its launcher to restart
    /// it, with `reason` on its stderr.
    pub(crate) fn wait_workers_stopped(&mut self, reason: &str) {
        for w in self.workers.iter_mut().flatten() {
            let st = w.wait_exit();
            assert_eq!(st.code(), Some(1), "{}: {}", w.name, w.stderr_tail());
            assert!(w.stderr().contains(reason), "{}", w.stderr_tail());
        }
    }

    /// The launcher restarts every worker: a new incarnation of each rank, on its default
    /// NIC, registered; then waits until the manager has them all.
    pub(crate) fn restart_workers(&mut self, scratch: &Scratch) -> JobStatus {
        for r in 0..self.nodes * self.ppn {
            let proxy = &self.proxy_addrs[(r / self.ppn) as usize];
            let args = [worker_args(&self.job, r, proxy), self.common.clone()].concat();
            let mut again = Proc::spawn(scratch, &format!("worker-{r}-restarted"), &args);
            again.wait_line("registered on");
            self.workers[r as usize] = Some(again);
        }
        self.wait_registered()
    }

    /// Asks for the job's status until `done` holds (at most [`PATIENCE`], asking more and
    /// more slowly) and returns that status; fails the test naming `what` otherwise.
    pub(crate) fn wait_status(
        &mut self,
        what: &str,
        done: impl Fn(&JobStatus) -> bool,
    ) -> JobStatus {
        let deadline = Instant::now() + PATIENCE;
        let mut pause = Duration::from_millis(10);
        loop {
            let st = self.status(0);
            if done(&st) {
                return st;
            }
            assert!(Instant::now() < deadline, "{what} never came: {st:#?}");
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Waits until every worker is registered.
    pub(crate) fn wait_registered(&mut self) -> JobStatus {
        self.rt
            .block_on(self.control.wait_registered(&self.job, None))
            .expect("every worker registers")
    }

    /// A command for this job: `(node index, device, use_backup)`.
    pub(crate) fn command(&self, targets: &[(u32, u32, bool)]) -> SwitchCommand {
        SwitchCommand {
            job: JobId(self.job.clone()),
            id: None,
            targets: targets
                .iter()
                .map(|(n, d, b)| Target {
                    node: NodeName::uniform(*n),
                    device: DeviceId(*d),
                    use_backup: *b,
                })
                .collect(),
        }
    }

    /// Stops every running process with SIGTERM and checks each exits cleanly (status 0).
    pub(crate) fn shutdown_cleanly(mut self) {
        // Close the control connection first: the manager's graceful stop waits for it.
        drop(self.control);
        drop(self.rt);
        let mut all: Vec<&mut Proc> = Vec::new();
        all.extend(self.workers.iter_mut().flatten());
        all.extend(self.proxies.iter_mut());
        all.push(&mut self.manager);
        // Those a test killed are gone already.
        all.retain(|p| p.exited.is_none());
        for p in &all {
            p.term();
        }
        for p in all {
            let st = p.wait_exit();
            assert!(
                st.success(),
                "{} exited with {st}; stderr:\n{}",
                p.name,
                p.stderr_tail()
            );
        }
    }
}

/// `taskd worker` arguments for rank `r` of `job` through `proxy`.
pub(crate) fn worker_args(job: &str, r: u32, proxy: &str) -> Vec<String> {
    s(&[
        "worker",
        "--job-id",
        job,
        "--rank",
        &r.to_string(),
        "--proxy",
        proxy,
        "--sim",
    ])
}

/// Writes a CA and one certificate for 127.0.0.1/localhost (server and client use) under
/// `prefix` in the scratch directory; returns the file flags and the PEM contents.
pub(crate) fn make_tls(scratch: &Scratch, prefix: &str) -> (Vec<String>, TlsPem) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{prefix} test CA"));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::CrlSign,
    ];
    let ca_key = KeyPair::generate().expect("ca key");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(ca_params, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("leaf params");
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{prefix} test node"));
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("leaf cert");
    let write = |name: &str, pem: &str| {
        let p = scratch.path(&format!("{prefix}-{name}"));
        std::fs::write(&p, pem).expect("write pem");
        p.display().to_string()
    };
    let ca = write("ca.pem", &ca_cert.pem());
    let cert = write("node.pem", &leaf_cert.pem());
    let key = write("node.key", &leaf_key.serialize_pem());
    let flags = s(&["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key]);
    let pem = TlsPem::mutual(
        ca_cert.pem().into_bytes(),
        leaf_cert.pem().into_bytes(),
        leaf_key.serialize_pem().into_bytes(),
    );
    (flags, pem)
}
