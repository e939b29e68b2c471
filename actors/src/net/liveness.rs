//! Whether a client's process still runs, for a server on the same host.
//!
//! A connection that closes is given the reconnect window (`--heartbeat-ms` times the loss
//! factor) before its peer is declared lost: a network blip must not cost a registration. A
//! worker killed by its launcher closes its connection the same way, and for those seconds its
//! rank still counts as registered: a manager that sees the replacement of another rank of the
//! node then believes the job whole although a killed process holds a slot, and starts the
//! verification round that lets restarted ranks train (see `docs/python.md`, the agent).
//!
//! So a client says which process it is ([`LocalProcess`], in its registration) and a server on
//! the same host (the same boot and the same pid namespace, so the pid means the same process)
//! watches that process once the connection closes: through a pidfd, which becomes readable when
//! the process ends. Its end cuts the window short. Anything that cannot be told (another host,
//! another namespace, no pidfd, a pid that now names a process started later) keeps the window.

use super::pb;
use std::fs;
use std::os::fd::OwnedFd;
use std::sync::OnceLock;
use std::time::Duration;

/// A process as its server can check it: its pid and its start time on one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LocalProcess {
    pub(crate) pid: u32,
    /// Clock ticks since boot when it started (field 22 of `/proc/<pid>/stat`): tells it from a
    /// later process given the same pid.
    pub(crate) start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub(crate) boot_id: String,
    /// The pid namespace (`/proc/self/ns/pid`, for example `pid:[4026531836]`).
    pub(crate) pid_namespace: String,
}

/// What this process knows of itself: read once.
fn this_host() -> Option<&'static (String, String)> {
    static HOST: OnceLock<Option<(String, String)>> = OnceLock::new();
    HOST.get_or_init(|| {
        let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = fs::read_link("/proc/self/ns/pid").ok()?;
        Some((boot.trim().to_owned(), ns.to_string_lossy().into_owned()))
    })
    .as_ref()
}

/// The state letter and start time in `/proc/<pid>/stat`; `None` when there is no such process.
fn stat(pid: u32) -> Option<(char, u64)> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter and start time of a `/proc/<pid>/stat` line.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) is in parentheses and may hold anything: the fields that
    // follow start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 was the state; the start time is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

impl LocalProcess {
    /// This process, where `/proc` says what it needs (Linux); `None` elsewhere.
    pub(crate) fn current() -> Option<LocalProcess> {
        let (boot_id, pid_namespace) = this_host()?.clone();
        let pid = std::process::id();
        let (_, start_ticks) = stat(pid)?;
        Some(LocalProcess {
            pid,
            start_ticks,
            boot_id,
            pid_namespace,
        })
    }

    /// The process a registration names, if it names one completely.
    pub(crate) fn from_pb(p: &pb::LocalProcess) -> Option<LocalProcess> {
        (p.pid != 0 && !p.boot_id.is_empty() && !p.pid_namespace.is_empty()).then(|| LocalProcess {
            pid: p.pid,
            start_ticks: p.start_ticks,
            boot_id: p.boot_id.clone(),
            pid_namespace: p.pid_namespace.clone(),
        })
    }

    /// Whether `pid` means this process here: the same boot and pid namespace.
    fn is_local(&self) -> bool {
        this_host().is_some_and(|(boot, ns)| *boot == self.boot_id && *ns == self.pid_namespace)
    }

    /// Whether the process has ended, as far as can be told now: `Some(true)` when its pid is
    /// gone, names a process started later, or is a zombie; `None` when it cannot be told.
    fn ended_now(&self) -> Option<bool> {
        if !self.is_local() {
            return None;
        }
        Some(match stat(self.pid) {
            None => true,
            Some((state, start)) => start != self.start_ticks || matches!(state, 'Z' | 'X'),
        })
    }

    /// Whether the process ends within `window` (or has already): `false` at once when that
    /// cannot be told (see the module's docs). Race-free: the pidfd is opened before the check,
    /// so an end after the check wakes the wait, and a pid reused before the open fails the
    /// check. The wait blocks a thread of tokio's blocking pool for at most `window`.
    pub(crate) async fn ends_within(&self, window: Duration) -> bool {
        // Opened first; it fails for a process that has ended and been reaped, which the
        // check then says has ended.
        let fd = self.pidfd();
        match self.ended_now() {
            Some(true) => return true,
            None => return false,
            Some(false) => {}
        }
        let Some(fd) = fd else {
            return false; // it runs, and this kernel gives no pidfd to wait on
        };
        tokio::task::spawn_blocking(move || readable_within(&fd, window))
            .await
            .unwrap_or(false)
    }

    fn pidfd(&self) -> Option<OwnedFd> {
        if !self.is_local() {
            return None;
        }
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.pid).ok()?)?;
        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK).ok()
    }
}

/// Whether `fd` (a pidfd: readable once its process has ended) polls readable within `window`.
fn readable_within(fd: &OwnedFd, window: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec {
        tv_sec: i64::try_from(window.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(window.subsec_nanos()),
    };
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, Some(&timeout)) {
            Ok(n) => return n > 0,
            // A signal cut the wait short: wait again (at most one window more).
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

impl From<&LocalProcess> for pb::LocalProcess {
    fn from(p: &LocalProcess) -> Self {
        pb::LocalProcess {
            pid: p.pid,
            start_ticks: p.start_ticks,
            boot_id: p.boot_id.clone(),
            pid_namespace: p.pid_namespace.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn of_child(child: &std::process::Child) -> LocalProcess {
        let me = LocalProcess::current().expect("Linux has /proc");
        LocalProcess {
            pid: child.id(),
            start_ticks: stat(child.id()).expect("the child runs").1,
            ..me
        }
    }

    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep runs")
    }

    #[test]
    fn this_process_runs_and_survives_the_round_trip_through_its_message() {
        let me = LocalProcess::current().expect("Linux has /proc");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.ended_now(), Some(false));
        assert_eq!(LocalProcess::from_pb(&(&me).into()), Some(me));
        assert_eq!(LocalProcess::from_pb(&pb::LocalProcess::default()), None);
    }

    #[test]
    fn a_killed_child_has_ended_while_a_zombie_and_once_reaped() {
        let mut child = sleeper();
        let p = of_child(&child);
        assert_eq!(p.ended_now(), Some(false));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let fd = p.pidfd().expect("a pidfd for a child");
            assert!(!readable_within(&fd, Duration::ZERO), "the child sleeps");
            child.kill().expect("kill");
            assert!(
                p.ends_within(Duration::from_secs(60)).await,
                "the pidfd says it ended"
            );
        });
        // Not reaped yet: a zombie.
        assert_eq!(p.ended_now(), Some(true));
        child.wait().expect("reaped");
        assert_eq!(p.ended_now(), Some(true));
        // Reaped before the server looks: no pidfd for it any more, and it has ended.
        assert!(p.pidfd().is_none());
        assert!(rt.block_on(p.ends_within(Duration::from_secs(3600))));
    }

    #[test]
    fn a_pid_of_a_later_process_or_of_another_host_is_not_taken_for_the_same_process() {
        let mut child = sleeper();
        let p = of_child(&child);
        let later = LocalProcess {
            start_ticks: p.start_ticks + 1,
            ..p.clone()
        };
        assert_eq!(later.ended_now(), Some(true), "a pid reused since");
        let elsewhere = LocalProcess {
            boot_id: "another-host".into(),
            ..p.clone()
        };
        assert_eq!(elsewhere.ended_now(), None, "cannot be told");
        assert!(elsewhere.pidfd().is_none());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        assert!(
            !rt.block_on(elsewhere.ends_within(Duration::from_secs(3600))),
            "at once"
        );
        child.kill().expect("kill");
        child.wait().expect("reaped");
    }

    #[test]
    fn a_command_name_with_parentheses_and_spaces_is_read_past() {
        let fields: Vec<String> = (4..=21).map(|f| f.to_string()).collect();
        let line = format!("42 (a ) b) Z {} 987654 23 24\n", fields.join(" "));
        assert_eq!(parse_stat(&line), Some(('Z', 987654)));
        assert_eq!(parse_stat("42 (cut short"), None);
    }
}
