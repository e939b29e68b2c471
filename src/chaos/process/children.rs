//! One `taskd` role as a child process of the process campaign: in a process group of its
//! own (so a signal reaches all of it), its stdout read line by line (roles print their bound
//! addresses there), its stderr kept in a file to show for a failed schedule, and killed with
//! its group when dropped, on every path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// The process groups of every live role, and whether the campaign is stopping (then no role
/// starts any more): what [`kill_all`] ends when the campaign itself is told to stop.
static LIVE: Mutex<(BTreeSet<u32>, bool)> = Mutex::new((BTreeSet::new(), false));

/// Kills the process group of every live role and lets no new one start, then thaws and
/// unmounts every state directory's file system ([`super::disk`]): for a campaign stopped
/// by a signal, which runs no `Drop`.
pub fn kill_all() {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.1 = true;
    for pid in &live.0 {
        kill_group(*pid, Sig::Kill);
    }
    drop(live);
    super::disk::release_all();
}

/// Whether [`kill_all`] ran: the campaign is being stopped, and what its runs saw since (roles
/// killed under them) is no finding.
pub fn stopping() -> bool {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).1
}

fn kill_group(pid: u32, sig: Sig) {
    let _ = Command::new("kill")
        .args(["-s", sig.name(), "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Why a role's process did not do what the campaign waited for.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// The binary did not start.
    #[error("cannot start {name} ({bin}): {source}")]
    Spawn {
        /// Which role.
        name: String,
        /// The binary.
        bin: String,
        /// The OS's error.
        source: std::io::Error,
    },
    /// Its stderr file could not be created.
    #[error("cannot create {path}: {source}")]
    Log {
        /// The file.
        path: String,
        /// The OS's error.
        source: std::io::Error,
    },
    /// The campaign is stopping: no role starts any more.
    #[error("the campaign is stopping: {0} not started")]
    Stopping(String),
    /// It printed no line with the pattern in time (or exited first).
    #[error("{name} printed no line with {pattern:?} within {waited:?} (exit: {exit})")]
    NoLine {
        /// Which role.
        name: String,
        /// What was awaited.
        pattern: String,
        /// How long.
        waited: Duration,
        /// Its exit status, if it exited.
        exit: String,
    },
}

/// A signal the campaign sends.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Sig {
    /// kill -9: a crash.
    Kill,
    /// SIGTERM: a clean stop.
    Term,
    /// SIGSTOP: frozen.
    Stop,
    /// SIGCONT: thawed.
    Cont,
}

impl Sig {
    fn name(self) -> &'static str {
        match self {
            Sig::Kill => "KILL",
            Sig::Term => "TERM",
            Sig::Stop => "STOP",
            Sig::Cont => "CONT",
        }
    }
}

/// One running (or exited) role.
pub struct Proc {
    /// Its name in logs (`manager`, `proxy-1`, `worker-3`, with the incarnation).
    pub name: String,
    pid: u32,
    lines: mpsc::Receiver<String>,
    exit: mpsc::Receiver<ExitStatus>,
    exited: Option<ExitStatus>,
    stderr: PathBuf,
}

impl Proc {
    /// Starts `bin ARGS` in a new process group, stderr to `dir/NAME.err`.
    pub fn spawn(bin: &Path, dir: &Path, name: &str, args: &[String]) -> Result<Proc, ProcError> {
        use std::os::unix::process::CommandExt as _;
        let stderr = dir.join(format!("{name}.err"));
        let err_file = std::fs::File::create(&stderr).map_err(|source| ProcError::Log {
            path: stderr.display().to_string(),
            source,
        })?;
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if live.1 {
            return Err(ProcError::Stopping(name.to_owned()));
        }
        let mut child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "info,h2=warn,tower=warn,hyper=warn")
            .env_remove("MINDX_TASK_ID")
            .env_remove("MS_SCHED_HOST")
            .env_remove("POD_IP")
            .env_remove("MINDX_SERVER_IP")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err_file)
            .process_group(0)
            .spawn()
            .map_err(|source| ProcError::Spawn {
                name: name.to_owned(),
                bin: bin.display().to_string(),
                source,
            })?;
        let pid = child.id();
        live.0.insert(pid);
        drop(live);
        let (ltx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                use std::io::BufRead as _;
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { return };
                    if ltx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        let (etx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(st) = child.wait() {
                let _ = etx.send(st);
            }
        });
        Ok(Proc {
            name: name.to_owned(),
            pid,
            lines,
            exit,
            exited: None,
            stderr,
        })
    }

    /// Waits at most `wait` for a stdout line containing `pattern`.
    pub fn wait_line(&mut self, pattern: &str, wait: Duration) -> Result<String, ProcError> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(pattern) => return Ok(l),
                Ok(_) => continue,
                Err(_) => {
                    return Err(ProcError::NoLine {
                        name: self.name.clone(),
                        pattern: pattern.to_owned(),
                        waited: wait,
                        exit: self
                            .exited()
                            .map_or_else(|| "still running".to_owned(), |s| s.to_string()),
                    })
                }
            }
        }
    }

    /// The stdout lines printed so far and not yet read.
    pub fn take_lines(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Sends `sig` to its whole process group (nothing once it exited).
    pub fn signal(&mut self, sig: Sig) {
        if self.exited().is_some() {
            return;
        }
        kill_group(self.pid, sig);
    }

    /// kill -9 and wait (at most `wait`) until it is gone; whether it is.
    pub fn kill(&mut self, wait: Duration) -> bool {
        self.signal(Sig::Kill);
        self.wait_exit(wait).is_some()
    }

    /// Its exit status, if it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.exit.try_recv().ok();
            self.forget_if_gone();
        }
        self.exited
    }

    /// Waits at most `wait` for it to exit.
    pub fn wait_exit(&mut self, wait: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.exit.recv_timeout(wait).ok();
            self.forget_if_gone();
        }
        self.exited
    }

    /// An exited role's group is no longer one to kill (its pid may be reused).
    fn forget_if_gone(&self) {
        if self.exited.is_some() {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.0.remove(&self.pid);
        }
    }

    /// The last `n` lines of its stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.signal(Sig::Kill);
            let _ = self.wait_exit(Duration::from_secs(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, script: &str) -> Proc {
        let args = ["-c".to_owned(), script.to_owned()];
        Proc::spawn(Path::new("/bin/sh"), dir, "sh", &args).unwrap()
    }

    #[test]
    fn lines_exit_and_group_kill() {
        let dir = std::env::temp_dir().join(format!("taskd-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = sh(&dir, "echo hello on 1; echo oops >&2; exec sleep 600");
        let line = p.wait_line("hello", Duration::from_secs(10)).unwrap();
        assert_eq!(line, "hello on 1");
        assert!(p.exited().is_none());
        assert!(p.kill(Duration::from_secs(10)), "kill -9 did not end it");
        assert_eq!(p.stderr_tail(5), "oops");
        let mut q = sh(&dir, "exit 3");
        assert_eq!(
            q.wait_exit(Duration::from_secs(10)).and_then(|s| s.code()),
            Some(3)
        );
        assert!(matches!(
            q.wait_line("never", Duration::from_millis(1)),
            Err(ProcError::NoLine { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
