//! The job of the process campaign: every role a `taskd` process on loopback, over the real
//! gRPC transport. One manager (journal in a state directory, control API behind a bearer
//! token), [`NODES`] nodes of one `proxy --sim` each with [`PPN`] `worker --sim` ranks, and a
//! [`FaultRelay`] between each proxy and the manager. Every port is bound to 0 and read from
//! the line the role prints; a restarted manager or proxy binds the port its first
//! incarnation got, so the others find it again.
//!
//! As root, the manager's state directory is a file system of its own (an ext4 image on a
//! loop device, [`super::disk`]), which the disk faults fill up or freeze; elsewhere it is
//! a plain directory and those faults are skipped, saying why.

use super::children::{Proc, ProcError, Sig};
use super::disk::StateDisk;
use crate::chaos::relay::{FaultRelay, LinkMode};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use taskd_actors::control::proto::JobStatus;
use taskd_actors::control::{ClientError, ControlClient};

/// Nodes of the job.
pub const NODES: u32 = 2;
/// Ranks per node.
pub const PPN: u32 = 2;
/// Every phase deadline of the job.
pub const PHASE_DEADLINE: Duration = Duration::from_millis(1500);
/// The manager's hold bound (`--hold-bound-ms`): a job that does not run has training
/// stopped after this long.
pub const HOLD_BOUND: Duration = Duration::from_millis(2000);
/// The most the campaign waits for a role's line, a control call or an exit.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// The manager's journal timeout (`--journal-timeout-ms`): a frozen state directory fails a
/// write after this long. Above a busy disk's slow writes (the campaign runs on the disk).
pub const JOURNAL_TIMEOUT: Duration = Duration::from_millis(1000);

/// Why the job could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A role's process failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The scratch directory, the token file or the relay.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS's error.
        source: std::io::Error,
    },
    /// A role printed an address that does not parse.
    #[error("{name} printed {line:?}, with no address in it")]
    Address {
        /// Which role.
        name: String,
        /// Its line.
        line: String,
    },
    /// The control API did not answer.
    #[error("the control API: {0}")]
    Control(#[from] ClientError),
    /// A control call did not answer in time.
    #[error("the control API did not answer {0} within {PATIENCE:?}")]
    Timeout(&'static str),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> JobError {
    let what = what.into();
    move |source| JobError::Io { what, source }
}

/// Where the process campaign finds the `taskd` binary its roles run, and where each job
/// keeps its files (logs, the token file, the manager's state directory: the journal is
/// written there with fsync, so the disk under it is part of the test).
#[derive(Clone, Debug)]
pub struct ProcEnv {
    /// The `taskd` binary.
    pub bin: PathBuf,
    /// The directory each job makes its own directory in.
    pub scratch: PathBuf,
}

impl ProcEnv {
    /// `bin`, with the jobs' files in the system's temporary directory.
    pub fn new(bin: impl Into<PathBuf>) -> ProcEnv {
        ProcEnv {
            bin: bin.into(),
            scratch: std::env::temp_dir(),
        }
    }
}

/// A running job of processes; every process is killed when it drops.
pub struct ProcJob {
    bin: PathBuf,
    /// Logs, the token file, the state directory.
    pub dir: PathBuf,
    /// The job's id.
    pub job: String,
    token: String,
    manager: Proc,
    manager_addr: SocketAddr,
    control_addr: String,
    relays: Vec<FaultRelay>,
    proxies: Vec<Proc>,
    proxy_addrs: Vec<String>,
    workers: Vec<Proc>,
    /// How many processes each role has had (for their log names).
    incarnations: std::collections::BTreeMap<String, u32>,
    rt: tokio::runtime::Runtime,
    client: Option<ControlClient>,
    /// The state directory's own file system, or why it has none (then the disk faults are
    /// skipped).
    disk: Result<StateDisk, String>,
}

/// The address after `marker` in `line`.
fn addr_after(name: &str, line: &str, marker: &str) -> Result<String, JobError> {
    line.split(marker)
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_owned)
        .ok_or_else(|| JobError::Address {
            name: name.to_owned(),
            line: line.to_owned(),
        })
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// Every role's heartbeat period.
pub const HEARTBEAT: Duration = Duration::from_millis(100);
/// Heartbeats a role may miss before it is lost.
pub const MISSED: u32 = 20;
/// How long a silent or closed connection may stay so before its peer is lost: a role
/// frozen by the campaign for less is late, not lost.
pub const LOSS_BOUND: Duration = HEARTBEAT.saturating_mul(MISSED);

/// Flags every role gets: [`HEARTBEAT`], lost after [`MISSED`].
fn heartbeats() -> Vec<String> {
    let ms = HEARTBEAT.as_millis().to_string();
    strings(&[
        "--heartbeat-ms",
        &ms,
        "--missed-heartbeats",
        &MISSED.to_string(),
    ])
}

impl ProcJob {
    /// Starts the job of schedule `seed` and waits until every worker registered.
    pub fn start(env: &ProcEnv, seed: u64) -> Result<ProcJob, JobError> {
        let bin = env.bin.as_path();
        let dir = env
            .scratch
            .join(format!("taskd-chaos-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io(format!("{}", dir.display())))?;
        let disk = StateDisk::ext4(&dir.join("state"), &dir.join("state.img"));
        if disk.is_err() {
            std::fs::create_dir_all(dir.join("state")).map_err(io(format!("{}", dir.display())))?;
        }
        let token = format!("chaos-{seed:016x}");
        std::fs::write(dir.join("token"), &token).map_err(io("the token file"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(io("the control client's runtime"))?;
        let job = format!("chaos-{seed}");
        let mut incarnations = std::collections::BTreeMap::new();
        let args = manager_args(&dir, &job, "127.0.0.1:0");
        let manager = spawn_role(bin, &dir, &mut incarnations, "manager", &args)?;
        let mut j = ProcJob {
            bin: bin.to_owned(),
            dir,
            job,
            token,
            manager,
            manager_addr: "127.0.0.1:0".parse().expect("an address"),
            control_addr: String::new(),
            relays: Vec::new(),
            proxies: Vec::new(),
            proxy_addrs: Vec::new(),
            workers: Vec::new(),
            incarnations,
            rt,
            client: None,
            disk,
        };
        j.manager_started()?;
        j.start_nodes()?;
        j.wait_registered()?;
        Ok(j)
    }

    fn spawn(&mut self, role: &str, args: &[String]) -> Result<Proc, JobError> {
        spawn_role(&self.bin, &self.dir, &mut self.incarnations, role, args)
    }

    /// Reads the addresses the manager just started printed; the control client follows it
    /// to its (new) control port.
    fn manager_started(&mut self) -> Result<(), JobError> {
        let line = self.manager.wait_line("listening on ", PATIENCE)?;
        let addr = addr_after(&self.manager.name, &line, "listening on ")?;
        self.manager_addr = addr.parse().map_err(|_| JobError::Address {
            name: self.manager.name.clone(),
            line: line.clone(),
        })?;
        let line = self.manager.wait_line("control API on ", PATIENCE)?;
        self.control_addr = addr_after(&self.manager.name, &line, "control API on ")?;
        let connect = ControlClient::connect(&self.control_addr, None);
        let client = self.bounded("a connection", connect)??;
        self.client = Some(client.with_token(Some(self.token.clone())));
        Ok(())
    }

    fn proxy_args(&self, k: u32, listen: &str) -> Vec<String> {
        let relay = self.relays[k as usize].addr().to_string();
        let mut a = strings(&["proxy", "--job-id", &self.job, "--sim"]);
        a.extend(strings(&[
            "--node-rank",
            &k.to_string(),
            "--manager",
            &relay,
        ]));
        a.extend(strings(&["--listen", listen]));
        a.extend(heartbeats());
        a
    }

    fn worker_args(&self, r: u32) -> Vec<String> {
        let proxy = &self.proxy_addrs[(r / PPN) as usize];
        let mut a = strings(&[
            "worker",
            "--job-id",
            &self.job,
            "--sim",
            "--sim-report-views",
        ]);
        a.extend(strings(&["--rank", &r.to_string(), "--proxy", proxy]));
        a.extend(strings(&["--step-ms", "5"]));
        a.extend(heartbeats());
        a
    }

    /// A relay and a proxy per node, then every worker.
    fn start_nodes(&mut self) -> Result<(), JobError> {
        for k in 0..NODES {
            let relay = FaultRelay::start(self.manager_addr).map_err(io("a fault relay"))?;
            self.relays.push(relay);
            let args = self.proxy_args(k, "127.0.0.1:0");
            let mut p = self.spawn(&format!("proxy-{k}"), &args)?;
            let line = p.wait_line("listening on ", PATIENCE)?;
            self.proxy_addrs
                .push(addr_after(&p.name, &line, "listening on ")?);
            self.proxies.push(p);
        }
        for r in 0..NODES * PPN {
            let args = self.worker_args(r);
            let w = self.spawn(&format!("worker-{r}"), &args)?;
            self.workers.push(w);
        }
        Ok(())
    }

    /// Runs `fut` on the client's runtime, at most [`PATIENCE`].
    pub fn bounded<F: std::future::Future>(
        &self,
        what: &'static str,
        fut: F,
    ) -> Result<F::Output, JobError> {
        self.rt
            .block_on(async { tokio::time::timeout(PATIENCE, fut).await })
            .map_err(|_| JobError::Timeout(what))
    }

    /// The runtime the control calls run on (to follow an operation while a fault lands).
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// A client of the manager in charge now.
    pub fn client(&self) -> ControlClient {
        self.client.clone().expect("a manager was started")
    }

    /// The job's status with `recent` past results.
    pub fn status(&self, recent: u32) -> Result<JobStatus, JobError> {
        let mut c = self.client();
        let job = self.job.clone();
        Ok(self.bounded("a status", async move { c.status(&job, recent).await })??)
    }

    /// Waits until every worker is registered.
    pub fn wait_registered(&self) -> Result<JobStatus, JobError> {
        let mut c = self.client();
        let job = self.job.clone();
        let wait = async move { c.wait_registered(&job, None).await };
        Ok(self.bounded("the registrations", wait)??)
    }

    /// kill -9 of the manager, and a new one on the same state directory and port.
    pub fn restart_manager(&mut self) -> Result<(), JobError> {
        self.manager.kill(PATIENCE);
        self.client = None;
        let args = manager_args(&self.dir, &self.job, &self.manager_addr.to_string());
        self.manager = self.spawn("manager", &args)?;
        self.manager_started()
    }

    /// kill -9 of node `k`'s proxy, and a new one on the same port.
    pub fn restart_proxy(&mut self, k: u32) -> Result<(), JobError> {
        self.proxies[k as usize].kill(PATIENCE);
        let args = self.proxy_args(k, &self.proxy_addrs[k as usize].clone());
        let mut p = self.spawn(&format!("proxy-{k}"), &args)?;
        p.wait_line("listening on ", PATIENCE)?;
        self.proxies[k as usize] = p;
        Ok(())
    }

    /// kill -9 of rank `r`'s worker.
    pub fn kill_worker(&mut self, r: u32) {
        self.workers[r as usize].kill(PATIENCE);
    }

    /// Starts rank `r` again (the launcher's restart): a new incarnation.
    pub fn restart_worker(&mut self, r: u32) -> Result<(), JobError> {
        let args = self.worker_args(r);
        self.workers[r as usize] = self.spawn(&format!("worker-{r}"), &args)?;
        Ok(())
    }

    /// The ranks whose worker process exited, with its exit code.
    pub fn exited_workers(&mut self) -> Vec<(u32, Option<i32>)> {
        (0..NODES * PPN)
            .filter_map(|r| {
                let st = self.workers[r as usize].exited()?;
                Some((r, st.code()))
            })
            .collect()
    }

    /// A manager or proxy that exited though nobody killed it: which, and how.
    pub fn crashed(&mut self) -> Option<String> {
        let all = std::iter::once(&mut self.manager).chain(self.proxies.iter_mut());
        for p in all {
            if let Some(st) = p.exited() {
                return Some(format!("{} exited ({st}): {}", p.name, p.stderr_tail(10)));
            }
        }
        None
    }

    /// SIGSTOP (`frozen`) or SIGCONT of the manager (`None`) or of node k's proxy.
    pub fn freeze(&mut self, proxy: Option<u32>, frozen: bool) {
        let p = match proxy {
            None => &mut self.manager,
            Some(k) => &mut self.proxies[k as usize],
        };
        p.signal(if frozen { Sig::Stop } else { Sig::Cont });
    }

    /// Node `k`'s link to the manager.
    pub fn link(&self, k: u32, mode: LinkMode) {
        self.relays[k as usize].set(mode);
    }

    /// Fills up (`full`) or frees the state directory's file system; `Err` saying why when
    /// it has none of its own (the fault is skipped).
    pub fn fill_disk(&mut self, full: bool) -> Result<(), String> {
        let disk = self.disk.as_ref().map_err(Clone::clone)?;
        if full {
            disk.fill()
                .map(|_| ())
                .map_err(|e| format!("filling the disk: {e}"))
        } else {
            disk.free();
            Ok(())
        }
    }

    /// Freezes or thaws the state directory's file system; `Err` saying why when it has none
    /// of its own (the fault is skipped) or it cannot be.
    pub fn freeze_disk(&mut self, frozen: bool) -> Result<(), String> {
        let disk = self.disk.as_mut().map_err(|e| e.clone())?;
        if frozen {
            disk.freeze()
        } else {
            disk.thaw()
        }
    }

    /// Heals every link, thaws every process and frees the state directory's disk.
    pub fn heal_all(&mut self) {
        if let Ok(d) = &mut self.disk {
            let _ = d.thaw();
            d.free();
        }
        for r in &self.relays {
            r.set(LinkMode::Pass);
        }
        self.manager.signal(Sig::Cont);
        for p in &mut self.proxies {
            p.signal(Sig::Cont);
        }
    }

    /// Stops every worker with SIGTERM; each one's `sim views:` line (`Err`: why none).
    pub fn stop_workers(&mut self) -> Vec<Result<String, ProcError>> {
        for w in &mut self.workers {
            w.signal(Sig::Term);
        }
        self.workers
            .iter_mut()
            .map(|w| {
                let line = w.wait_line("sim views: ", PATIENCE)?;
                Ok(line
                    .split_once("sim views: ")
                    .map_or(line.clone(), |(_, j)| j.to_owned()))
            })
            .collect()
    }

    /// The last lines of every current process's stderr, for a failed schedule.
    pub fn stderr_tails(&self, n: usize) -> String {
        let mut s = String::new();
        let all = std::iter::once(&self.manager)
            .chain(&self.proxies)
            .chain(&self.workers);
        for p in all {
            s += &format!(
                "--- {} (stderr, last {n} lines)\n{}\n",
                p.name,
                p.stderr_tail(n)
            );
        }
        s
    }
}

/// `taskd manager` of `job` listening on `listen` (port 0 the first time, then the port it
/// got, so the relays find it again), control API on port 0 behind the token, journal in the
/// state directory, short deadlines and hold bound, fast heartbeats.
fn manager_args(dir: &Path, job: &str, listen: &str) -> Vec<String> {
    let ms = |d: Duration| d.as_millis().to_string();
    let state = dir.join("state").display().to_string();
    let token = dir.join("token").display().to_string();
    let mut a = strings(&["manager", "--job-id", job, "--no-clusterd"]);
    a.extend(strings(&["--nodes", &NODES.to_string()]));
    a.extend(strings(&["--procs-per-node", &PPN.to_string()]));
    a.extend(strings(&[
        "--listen",
        listen,
        "--control-addr",
        "127.0.0.1:0",
    ]));
    a.extend(strings(&[
        "--control-token-file",
        &token,
        "--state-dir",
        &state,
    ]));
    a.extend(strings(&["--control-rate-burst", "100000"]));
    a.extend(strings(&["--control-rate-per-sec", "100000"]));
    a.extend(strings(&["--journal-timeout-ms", &ms(JOURNAL_TIMEOUT)]));
    for phase in ["pause", "switch", "rollback", "resume"] {
        a.extend([format!("--{phase}-timeout-ms"), ms(PHASE_DEADLINE)]);
    }
    a.extend(strings(&[
        "--hold-policy",
        "stop",
        "--hold-bound-ms",
        &ms(HOLD_BOUND),
    ]));
    a.extend(heartbeats());
    a
}

/// Starts the next incarnation of `role`.
fn spawn_role(
    bin: &Path,
    dir: &Path,
    incarnations: &mut std::collections::BTreeMap<String, u32>,
    role: &str,
    args: &[String],
) -> Result<Proc, JobError> {
    let n = incarnations.entry(role.to_owned()).or_default();
    *n += 1;
    let name = format!("{role}.{n}");
    Ok(Proc::spawn(bin, dir, &name, args)?)
}

impl Drop for ProcJob {
    fn drop(&mut self) {
        // First: a process inside a write to a frozen file system cannot die until it thaws.
        if let Ok(d) = &mut self.disk {
            let _ = d.thaw();
        }
        self.client = None;
        // Workers first, then proxies, then the manager: each Proc kills its group.
        self.workers.clear();
        self.proxies.clear();
        self.manager.signal(Sig::Kill);
        self.manager.wait_exit(PATIENCE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_the_roles_lines() {
        let line = "taskd manager listening on 127.0.0.1:41157 (job chaos-1, 2 nodes, 4 ranks)";
        let got = addr_after("manager", line, "listening on ").unwrap();
        assert_eq!(got, "127.0.0.1:41157");
        let e = addr_after("proxy-0", "taskd proxy listening on", "listening on ").unwrap_err();
        assert!(e.to_string().contains("proxy-0"), "{e}");
    }

    #[test]
    fn the_manager_runs_the_campaigns_job_shape_and_bounds() {
        let a = manager_args(Path::new("/s"), "chaos-3", "127.0.0.1:0");
        let flag = |f: &str| a.iter().position(|x| x == f).map(|i| a[i + 1].as_str());
        assert_eq!(flag("--nodes"), Some("2"));
        assert_eq!(flag("--procs-per-node"), Some("2"));
        assert_eq!(flag("--state-dir"), Some("/s/state"));
        assert_eq!(flag("--hold-bound-ms"), Some("2000"));
        assert_eq!(flag("--pause-timeout-ms"), Some("1500"));
        assert_eq!(flag("--journal-timeout-ms"), Some("1000"));
        assert_eq!(LOSS_BOUND, Duration::from_secs(2));
    }
}
