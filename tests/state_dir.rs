//! `taskd manager --state-dir` as processes see it: a journal that cannot be written is never
//! passed off as durable (the result says so, status and metrics say so, nothing new starts
//! until it can be written again), one manager per state directory, and files that are not
//! regular ones refused at start instead of hanging it.

mod common;
mod net_support;

use common::taskd;
use net_support::{fast_heartbeats, s, Cluster, ClusterSpec, Proc, Scratch};
use std::io::{Read as _, Write as _};
use taskd::actors::control::proto::RefusalKind;
use taskd::actors::control::ClientError;
use taskd::actors::telemetry;

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

/// The manager's journal stops being writable in the middle of a job (here: its temporary
/// file's name taken by a directory, which fails every write as a full disk does): the
/// operation that finishes then reports that its result is not journaled, status and the
/// metric say the journal is failing, and a new switch is refused with a typed reason. Once a
/// write succeeds again the next switch runs, and after a `kill -9` a restarted manager knows
/// both results.
#[test]
fn a_journal_that_cannot_be_written_refuses_new_operations_and_says_so() {
    let scratch = Scratch::new("journal-failing");
    let state = scratch.path("state");
    let state_dir = state.display().to_string();
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

    let blocker = state.join(format!("operations.json.{}.tmp", c.manager.pid()));
    std::fs::create_dir(&blocker).unwrap();
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

    let st = c.status(4);
    assert!(st.journal_error.contains("operations.json"), "{st:#?}");
    assert_eq!(st.recent[0].journal_error, why, "the history says it too");
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

    std::fs::remove_dir(&blocker).unwrap();
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

    // Both results are durable now: a restarted manager answers both uuids as known.
    c.manager.kill();
    c.restart_manager(&scratch, &s(&["--state-dir", &state_dir]));
    let st = c.wait_registered();
    assert!(st.ranks_on_backup.is_empty(), "{st:#?}");
    for cmd in [&first, &second] {
        let again = c.submit(cmd).expect("answered");
        assert!(again.known, "journaled before the restart");
    }
    let st = c.status(0);
    assert!(st.verified, "{st:#?}");
    let v = st.last_verification.expect("a verification round ran");
    assert!(v.disagreements.is_empty(), "every group agrees: {v:#?}");
    c.shutdown_cleanly();
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
