//! `taskd manager --state-dir` as processes see it: a journal that cannot be written is never
//! passed off as durable (the result says so, status and metrics say so, nothing new starts
//! until it can be written again), a journal that does not answer does not silence the
//! manager, one manager per state directory, and files that are not regular ones refused at
//! start instead of hanging it. The tests of a full or frozen disk mount a file system of
//! their own, so they need root; elsewhere they say so and pass.

mod common;
mod net_support;

use common::taskd;
use net_support::{fast_heartbeats, s, Cluster, ClusterSpec, Proc, Scratch, PATIENCE};
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Instant;
use taskd::actors::control::proto::RefusalKind;
use taskd::actors::control::ClientError;
use taskd::actors::telemetry;
use taskd::chaos::process::disk::StateDisk;

/// `GET /metrics` of the endpoint at `addr`: the body.
fn scrape(addr: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).expect("the metrics endpoint");
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// The value of the unlabelled series `name` in a scrape.
/// `taskd manager` of a one-rank job on a free port, with `extra` flags.
fn manager<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "manager",
        "--job-id",
        "state-dir",
        "--nodes",
        "1",
        "--procs-per-node",
        "1",
        "--listen",
        "127.0.0.1:0",
    ];
    a.extend(extra);
    a
}

fn value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The state directory on a tmpfs of 1 MiB of its own, or why not (printed: the test is
/// skipped).
fn small_tmpfs(scratch: &Scratch) -> Option<StateDisk> {
    StateDisk::tmpfs(&scratch.path("state"), 1 << 20)
        .map_err(|why| eprintln!("skipped: {why}"))
        .ok()
}

/// Pads `journal` with blank lines (which a reader skips) so that a record of `next` bytes
/// ends it exactly at the end of a page: on a file system then filled up, that record is the
/// last that fits, and the write after it fails. (The padding is written while nothing else
/// writes the journal: between two operations.)
fn pad_journal(journal: &Path, next: usize) {
    const PAGE: u64 = 4096;
    let next = next as u64;
    let len = std::fs::metadata(journal).unwrap().len();
    let room = (PAGE - len % PAGE) % PAGE;
    let pad = if room >= next {
        room - next
    } else {
        room + PAGE - next
    };
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(journal)
        .unwrap();
    f.write_all(&vec![b'\n'; pad as usize]).unwrap();
}

/// The disk under the manager's state directory fills up in the middle of a job (a tmpfs of
/// its own, root only): the admission of the next switch is the last record that fits, so
/// the switch runs and its result reports that it is not journaled; status and the metric say
/// the journal is failing, and a new switch is refused with a typed reason. Once space is
/// freed the next switch runs, and after a `kill -9` a restarted manager knows every result.
#[test]
fn a_journal_that_cannot_be_written_refuses_new_operations_and_says_so() {
    let scratch = Scratch::new("journal-failing");
    let Some(disk) = small_tmpfs(&scratch) else {
        return;
    };
    let state_dir = disk.path().display().to_string();
    let mut manager_flags = s(&["--state-dir", &state_dir]);
    manager_flags.extend(s(&["--metrics-addr", "127.0.0.1:0"]));
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "journal-failing",
            nodes: 1,
            ppn: 2,
            worker_flags: &|_| Vec::new(),
            manager_flags,
            common: fast_heartbeats(),
            tls: None,
        },
    );
    // Printed before the transport's address, so found in the log (written by then).
    let log = c.manager.stderr();
    let metrics = log
        .lines()
        .find_map(|l| l.split_once("serving Prometheus metrics at /metrics addr="))
        .map(|(_, a)| a.trim().to_owned())
        .expect("the metrics endpoint's address in the log");
    assert_eq!(
        value(&scrape(&metrics), telemetry::JOURNAL_FAILING),
        Some(0.0)
    );
    let mut warm = c.command(&[(0, 0, true)]);
    warm.id = Some(taskd::core::OperationId(uuid::Uuid::new_v4()));
    assert_eq!(c.run(&warm).unwrap().result, "succeeded");
    let journal = disk.path().join("operations.json");
    let text = std::fs::read_to_string(&journal).unwrap();
    let admission = text
        .lines()
        .find(|l| l.starts_with("{\"admit\""))
        .expect("an admission line")
        .len()
        + 1;

    pad_journal(&journal, admission);
    disk.fill().unwrap();
    // Through the CLI: a success it could not record exits 4, not 0 (done) or 1 (retry).
    let mut first = c.command(&[(0, 1, true)]);
    let uuid = uuid::Uuid::new_v4();
    first.id = Some(taskd::core::OperationId(uuid));
    let uuid = uuid.to_string();
    let (code, out, err) = taskd(&[
        "switch",
        "--uuid",
        &uuid,
        "--addr",
        &c.control_addr,
        "--job",
        &c.job,
        "--node",
        "node-0",
        "--dev",
        "1",
        "--to",
        "backup",
        "--wait",
    ]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains("NOT RECORDED"), "{out}");
    let r = &c.status(1).recent[0];
    assert_eq!(r.result, "succeeded", "{r:#?}");
    let why = r.journal_error.clone();
    assert!(why.contains("operations.json"), "names the file: {why}");
    assert!(why.contains("No space left"), "says why: {why}");

    let st = c.status(4);
    assert!(st.journal_error.contains("operations.json"), "{st:#?}");
    let last = st.recent.last().expect("the results");
    assert_eq!(last.journal_error, why, "the history says it too");
    let scraped = scrape(&metrics);
    assert_eq!(value(&scraped, telemetry::JOURNAL_FAILING), Some(1.0));
    assert!(value(&scraped, telemetry::JOURNAL_WRITE_FAILURES_TOTAL).unwrap() >= 1.0);
    let refused = c.submit(&c.command(&[(0, 1, false)])).map(|op| op.uuid);
    match refused {
        Err(ClientError::Refused { kind, reason, .. }) => {
            assert_eq!(kind, RefusalKind::JournalFailing, "{reason}");
            assert!(reason.contains("journal cannot be written"), "{reason}");
        }
        other => panic!("not refused: {other:?}"),
    }
    let (code, out, err) = taskd(&["status", "--addr", &c.control_addr, "--job", &c.job]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("journal    CANNOT BE WRITTEN"), "{out}");

    disk.free();
    let mut second = c.command(&[(0, 1, false)]);
    second.id = Some(taskd::core::OperationId(uuid::Uuid::new_v4()));
    let r = c
        .run(&second)
        .expect("admitted once the journal is writable");
    assert_eq!(r.result, "succeeded", "{r:#?}");
    assert_eq!(r.journal_error, None);
    assert!(c.status(1).journal_error.is_empty());
    assert_eq!(
        value(&scrape(&metrics), telemetry::JOURNAL_FAILING),
        Some(0.0)
    );

    // Every result is durable now: a restarted manager answers each uuid as known.
    c.manager.kill();
    c.restart_manager(&scratch, &s(&["--state-dir", &state_dir]));
    let st = c.wait_registered();
    assert_eq!(st.ranks_on_backup, [0], "{st:#?}");
    for cmd in [&warm, &first, &second] {
        let again = c.submit(cmd).expect("answered");
        assert!(again.known, "journaled before the restart");
    }
    let st = c.status(0);
    assert!(st.verified, "{st:#?}");
    let v = st.last_verification.expect("a verification round ran");
    assert!(v.disagreements.is_empty(), "every group agrees: {v:#?}");
    c.shutdown_cleanly();
}

/// The file system under the state directory stops answering (frozen with `fsfreeze`, as a
/// hung NFS server or a dying disk would; an ext4 image on a loop device, root only): the
/// switch whose admission cannot be written is refused once the journal timeout passes, and
/// the manager keeps answering its status, sees a lost rank and stops on SIGTERM (its process
/// ends once the kernel lets its writing thread go, at the thaw).
#[test]
fn a_frozen_state_dir_refuses_commands_and_the_manager_keeps_answering() {
    let scratch = Scratch::new("state-dir-frozen");
    let disk = StateDisk::ext4(&scratch.path("state"), &scratch.path("state.img"));
    let mut disk = match disk {
        Ok(d) => d,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let state_dir = disk.path().display().to_string();
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "state-dir-frozen",
            nodes: 1,
            ppn: 2,
            worker_flags: &|_| Vec::new(),
            manager_flags: s(&["--state-dir", &state_dir, "--journal-timeout-ms", "500"]),
            common: fast_heartbeats(),
            tls: None,
        },
    );
    if let Err(why) = disk.freeze() {
        return eprintln!("skipped: {why}");
    }
    let (code, out, err) = taskd(&[
        "switch",
        "--addr",
        &c.control_addr,
        "--job",
        &c.job,
        "--node",
        "node-0",
        "--dev",
        "0",
        "--to",
        "backup",
        "--wait",
    ]);
    assert_eq!(code, 1, "refused: {out}{err}");
    assert!(
        err.contains("599") && err.contains("has not finished"),
        "{err}"
    );
    let (code, out, err) = taskd(&["status", "--addr", &c.control_addr, "--job", &c.job]);
    assert_eq!(code, 0, "answered while frozen: {err}");
    assert!(out.contains("journal    CANNOT BE WRITTEN"), "{out}");
    assert!(out.contains("in flight  none"), "nothing ran: {out}");

    c.workers[1].take().expect("rank 1 runs").kill();
    let deadline = Instant::now() + PATIENCE;
    while !c.status(0).lost_ranks.iter().any(|l| l.rank == 1) {
        assert!(
            Instant::now() < deadline,
            "rank 1's loss is seen while frozen"
        );
        // A poll of the status, bounded by the deadline above.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    c.manager.term();
    // The manager stops serving while the disk is still frozen.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (code, _, _) = taskd(&["status", "--addr", &c.control_addr, "--job", &c.job]);
        if code == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the control port still answers");
        // A poll of the port, bounded by the deadline above.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    disk.thaw().unwrap();
    let st = c.manager.wait_exit();
    assert!(st.success(), "{st}: {}", c.manager.stderr_tail());
}

/// A second manager on a state directory another one holds exits 2 at start, naming the
/// directory and the holder's pid, and leaves the first one's journal alone.
#[test]
fn a_second_manager_on_one_state_dir_is_refused_naming_the_holder() {
    let scratch = Scratch::new("state-dir-locked");
    let state = scratch.path("state").display().to_string();
    let args = manager(&["--state-dir", &state]);
    let mut first = Proc::spawn(&scratch, "first", &s(&args));
    first.listening_addr();
    let (code, _, err) = taskd(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("in use by another manager"), "{err}");
    assert!(err.contains(&format!("pid {}", first.pid())), "{err}");
    assert!(err.contains(&state), "{err}");
    first.term();
    assert!(first.wait_exit().success(), "{}", first.stderr_tail());
    // Released with its holder.
    let mut next = Proc::spawn(&scratch, "next", &s(&args));
    next.listening_addr();
    next.term();
    assert!(next.wait_exit().success(), "{}", next.stderr_tail());
}

/// A FIFO as the journal or `/dev/zero` as the token file is refused at once with exit 2
/// (each used to hang the start for ever).
#[test]
fn a_fifo_journal_or_a_device_token_file_is_refused_at_start() {
    let scratch = Scratch::new("state-dir-fifo");
    let state = scratch.path("state");
    std::fs::create_dir_all(&state).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(state.join("operations.json"))
        .status()
        .unwrap();
    assert!(made.success());
    let state = state.display().to_string();
    let (code, _, err) = taskd(&manager(&["--state-dir", &state]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a FIFO, not a regular file"), "{err}");

    let (code, _, err) = taskd(&manager(&[
        "--control-addr",
        "127.0.0.1:0",
        "--control-token-file",
        "/dev/zero",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/dev/zero"), "{err}");
    assert!(err.contains("a character device"), "{err}");
}
