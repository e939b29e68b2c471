//! The manager's journal of finished operations: per uuid, what identified the request and its
//! final report ([`FinishedOperation`]), the newest [`JOURNAL_LEN`]. A manager records every
//! final result in it before anyone is told the result, and a new manager of the job is
//! seeded from it ([`JobLedger::seed`](taskd_core::JobLedger::seed)), so a command repeated
//! with the same uuid after a restart returns the earlier result instead of running again,
//! and a uuid reused for another request is still refused.
//!
//! It also records each operation when it is admitted, before its first directive
//! ([`AdmittedOperation`]), and forgets it at its final result. What is left admitted when a
//! manager stops was interrupted: the next manager refuses those uuids
//! ([`SubmitError::Interrupted`](taskd_core::SubmitError::Interrupted)) instead of running
//! them a second time.
//!
//! - [`FileJournal`]: `taskd manager --state-dir DIR`, one JSON file rewritten atomically
//!   after every final result (a temporary file of the manager's own, fsync, rename, fsync of
//!   the directory). The manager holds an exclusive lock on [`LOCK_FILE`] for as long as it
//!   runs, so a second manager on the same directory (a rescheduled pod whose predecessor
//!   still runs) is refused at start instead of overwriting the first one's records. The
//!   directory is proven writable at open (the journal is written once), and a write that
//!   fails later is the manager's to report (it refuses new operations until a write
//!   succeeds again). Its writes block for their fsyncs, so the manager makes them on a thread
//!   of their own (`manager/journal_writer.rs`), not on its actor's thread, which its
//!   transport shares (but for the check at a command while a write is failing).
//! - [`MemoryJournal`]: the in-process job's ([`crate::LocalJob`]): its managers share one,
//!   so a restarted manager remembers as one with `--state-dir` does.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use taskd_core::ledger::{AdmittedOperation, FinishedOperation, HISTORY_LEN};
use taskd_core::JobId;

/// How many finished operations a journal keeps: as many as the manager's history.
pub const JOURNAL_LEN: usize = HISTORY_LEN;

/// The file a [`FileJournal`] keeps in its state directory.
pub const JOURNAL_FILE: &str = "operations.json";

/// The file of a state directory a [`FileJournal`] holds locked (`flock`, exclusive) for its
/// life; it says which process holds it.
pub const LOCK_FILE: &str = "manager.lock";

/// The most of [`LOCK_FILE`] read to name its holder.
const MAX_HOLDER_BYTES: u64 = 4096;

/// The largest journal file read: far above [`JOURNAL_LEN`] reports of the largest job, so
/// only a file that is not a journal is refused for its size.
pub const MAX_JOURNAL_BYTES: u64 = 256 << 20;

/// The version of the file's layout this build writes and reads.
const FORMAT: u32 = 1;

/// Why a journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The state directory cannot be created or is not a directory.
    #[error("the state directory {} cannot be used: {source}; give a writable --state-dir", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The journal exists and cannot be read.
    #[error("cannot read the operation journal {}: {source}; fix its permissions, or move it away to start without the earlier results", path.display())]
    Read {
        /// The journal file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The journal is not one this build wrote (truncated, edited, another format, too large).
    #[error("the operation journal {} is corrupt ({detail}); move it away to start without the earlier results (a repeated uuid of those then runs again)", path.display())]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The journal is another job's: its uuids mean nothing here.
    #[error("the operation journal {} belongs to job \"{found}\", not \"{job}\"; give each job a --state-dir of its own, or move the file away", path.display())]
    OtherJob {
        /// The journal file.
        path: PathBuf,
        /// The job it records.
        found: JobId,
        /// The job of this manager.
        job: JobId,
    },
    /// Another manager holds the state directory's lock: two managers on one directory
    /// would each overwrite the other's records.
    #[error("the state directory {} is in use by another manager ({holder}); stop that one first, or give this manager a --state-dir of its own", path.display())]
    Locked {
        /// The directory.
        path: PathBuf,
        /// What the lock file says of its holder.
        holder: String,
    },
    /// The journal is a symbolic link, a FIFO, a device or a directory: the manager renames a
    /// new file over it at every record, which would replace a link (its target left stale).
    #[error("the operation journal {} is {source}; the manager rewrites it in place, so it must be the file itself", path.display())]
    NotRegular {
        /// The journal file.
        path: PathBuf,
        /// What it is.
        source: std::io::Error,
    },
    /// A record could not be written (the earlier file is left as it was).
    #[error("cannot write the operation journal {}: {source}", path.display())]
    Write {
        /// The journal file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Where a manager records its operations and a new manager of the job finds them.
pub trait OperationJournal: Send + Sync {
    /// The finished operations recorded so far, oldest first (at most [`JOURNAL_LEN`]).
    fn load(&self) -> Vec<FinishedOperation>;

    /// The operations admitted and never finished, oldest first: their manager stopped
    /// before their final result.
    fn interrupted(&self) -> Vec<AdmittedOperation>;

    /// Records an operation admitted, before its first directive; durable when it returns
    /// `Ok`. Forgotten when its final result is recorded.
    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError>;

    /// Records a final result, forgetting the oldest past [`JOURNAL_LEN`]; durable when it
    /// returns `Ok`.
    fn record(&self, op: FinishedOperation) -> Result<(), JournalError>;

    /// Writes again what it holds, after a failed write: `Ok` when everything recorded so far
    /// is durable now.
    fn flush(&self) -> Result<(), JournalError> {
        Ok(())
    }
}

/// What a journal keeps: the file's content, and a [`MemoryJournal`]'s.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Records {
    operations: VecDeque<FinishedOperation>,
    /// Absent from the files of builds that did not record admissions.
    #[serde(default)]
    admitted: VecDeque<AdmittedOperation>,
}

impl Records {
    /// Appends `op` and forgets its admission, forgetting the oldest past [`JOURNAL_LEN`].
    fn finish(&mut self, op: FinishedOperation) {
        self.admitted.retain(|a| a.id != op.report.id);
        self.operations.push_back(op);
        while self.operations.len() > JOURNAL_LEN {
            self.operations.pop_front();
        }
    }

    /// Appends an admission, forgetting the oldest past [`JOURNAL_LEN`].
    fn admit(&mut self, op: AdmittedOperation) {
        self.admitted.push_back(op);
        while self.admitted.len() > JOURNAL_LEN {
            self.admitted.pop_front();
        }
    }
}

/// A journal in memory: it lives as long as whoever holds it (the in-process job).
#[derive(Debug, Default)]
pub struct MemoryJournal {
    records: Mutex<Records>,
}

impl OperationJournal for MemoryJournal {
    fn load(&self) -> Vec<FinishedOperation> {
        self.records.lock().operations.iter().cloned().collect()
    }

    fn interrupted(&self) -> Vec<AdmittedOperation> {
        self.records.lock().admitted.iter().cloned().collect()
    }

    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError> {
        self.records.lock().admit(op);
        Ok(())
    }

    fn record(&self, op: FinishedOperation) -> Result<(), JournalError> {
        self.records.lock().finish(op);
        Ok(())
    }
}

/// The file's content.
#[derive(Serialize, Deserialize)]
struct JournalFile {
    format: u32,
    job: JobId,
    #[serde(flatten)]
    records: Records,
}

/// A journal in one file of a state directory ([`JOURNAL_FILE`]), rewritten whole and
/// atomically after every record: a reader (the next manager) sees the file before a record
/// or after it, never half of it. It holds the directory's [`LOCK_FILE`] until dropped.
#[derive(Debug)]
pub struct FileJournal {
    dir: PathBuf,
    path: PathBuf,
    /// This process's temporary file, renamed over the journal at every write.
    tmp: PathBuf,
    job: JobId,
    records: Mutex<Records>,
    /// The lock, held while this is open (`flock` is released when the file is closed).
    _lock: std::fs::File,
}

impl FileJournal {
    /// Opens the journal of `job` in `dir` (created when missing), locks the directory and
    /// writes the journal once, so a directory that cannot be written is refused now rather
    /// than at the first result; a missing file is an empty journal. Refused, naming the file
    /// and what to do, when another manager holds the directory, the file cannot be read, is
    /// not a regular file, is not a journal, or is another job's.
    pub fn open(dir: &Path, job: &JobId) -> Result<FileJournal, JournalError> {
        let dir_err = |source| JournalError::Dir {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        if !dir.is_dir() {
            return Err(dir_err(std::io::Error::other("not a directory")));
        }
        let lock = lock(dir)?;
        remove_stale_temporaries(dir);
        let path = dir.join(JOURNAL_FILE);
        let records = match read(&path)? {
            None => Records::default(),
            Some(file) if file.job != *job => {
                return Err(JournalError::OtherJob {
                    path,
                    found: file.job,
                    job: job.clone(),
                })
            }
            Some(file) => {
                let mut records = Records::default();
                let Records {
                    operations,
                    admitted,
                } = file.records;
                admitted.into_iter().for_each(|op| records.admit(op));
                operations.into_iter().for_each(|op| records.finish(op));
                records
            }
        };
        let journal = FileJournal {
            dir: dir.to_owned(),
            tmp: dir.join(format!("{JOURNAL_FILE}.{}.tmp", std::process::id())),
            path,
            job: job.clone(),
            records: Mutex::new(records),
            _lock: lock,
        };
        journal.flush().map_err(|e| match e {
            JournalError::Write { source, .. } => dir_err(source),
            e => e,
        })?;
        Ok(journal)
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `ops` to this process's temporary file beside the journal, syncs it, renames
    /// it over the journal and syncs the directory (so the rename itself survives a power
    /// loss). A failed write removes the temporary file (no empty file is left on a full
    /// disk).
    fn write(&self, records: &Records) -> std::io::Result<()> {
        let file = JournalFile {
            format: FORMAT,
            job: self.job.clone(),
            records: records.clone(),
        };
        let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        let written = (|| {
            let mut f = std::fs::File::create(&self.tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&self.tmp, &self.path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        written
    }
}

/// Takes the exclusive lock of `dir` ([`LOCK_FILE`]) and writes this process's name into it;
/// [`JournalError::Locked`], naming the holder, when another process holds it.
fn lock(dir: &Path) -> Result<std::fs::File, JournalError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(LOCK_FILE);
    let dir_err = |source| JournalError::Dir {
        path: dir.to_owned(),
        source,
    };
    crate::files::check_regular_or_absent(&path).map_err(|source| JournalError::NotRegular {
        path: path.clone(),
        source,
    })?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(crate::files::NONBLOCK)
        .open(&path)
        .map_err(dir_err)?;
    match crate::files::try_lock_exclusive(&f) {
        Ok(true) => {}
        Ok(false) => {
            let holder = crate::files::read_regular(&path, MAX_HOLDER_BYTES)
                .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "a process that did not say which".into());
            return Err(JournalError::Locked {
                path: dir.to_owned(),
                holder,
            });
        }
        Err(e) => return Err(dir_err(e)),
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let me = format!("pid {} on {}", std::process::id(), host.trim());
    f.set_len(0)
        .and_then(|()| f.write_all(me.as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(dir_err)?;
    Ok(f)
}

/// Removes the temporary files earlier managers of `dir` left when they were killed in a
/// write (the caller holds the lock: no other manager is writing).
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&format!("{JOURNAL_FILE}.")) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The journal at `path`: `None` when there is none yet. Only a regular file is read (a link,
/// a FIFO or a device is refused without blocking on it).
fn read(path: &Path) -> Result<Option<JournalFile>, JournalError> {
    let read_err = |source| JournalError::Read {
        path: path.to_owned(),
        source,
    };
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    match crate::files::check_regular_or_absent(path) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            return Err(JournalError::NotRegular {
                path: path.to_owned(),
                source: e,
            })
        }
        Err(e) => return Err(read_err(e)),
    }
    let bytes = match crate::files::read_regular(path, MAX_JOURNAL_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(corrupt(format!(
                "more than the {MAX_JOURNAL_BYTES} bytes a journal can have"
            )))
        }
        Err(e) => return Err(read_err(e)),
    };
    let file: JournalFile =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not a journal: {e}")))?;
    if file.format != FORMAT {
        return Err(corrupt(format!(
            "format {}, this build reads format {FORMAT}",
            file.format
        )));
    }
    Ok(Some(file))
}

impl FileJournal {
    /// Changes the records and writes them. A record that could not be written is still
    /// kept in memory: the next record that is written carries it too.
    fn update(&self, change: impl FnOnce(&mut Records)) -> Result<(), JournalError> {
        let mut records = self.records.lock();
        change(&mut records);
        self.write(&records).map_err(|source| JournalError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

impl OperationJournal for FileJournal {
    fn load(&self) -> Vec<FinishedOperation> {
        self.records.lock().operations.iter().cloned().collect()
    }

    fn interrupted(&self) -> Vec<AdmittedOperation> {
        self.records.lock().admitted.iter().cloned().collect()
    }

    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError> {
        self.update(|r| r.admit(op))
    }

    fn record(&self, op: FinishedOperation) -> Result<(), JournalError> {
        self.update(|r| r.finish(op))
    }

    fn flush(&self) -> Result<(), JournalError> {
        self.update(|_| {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use taskd_core::command::{Direction, RankTarget};
    use taskd_core::operation::{JobState, OperationReport, Outcome, PhaseDurations};
    use taskd_core::{DeviceId, GlobalRank, OperationId};

    /// A fresh directory under the system's temporary one, removed when dropped. It holds
    /// [`crate::files::FORKING`] meanwhile: the tests reopen journals they just closed.
    struct TempDir(
        PathBuf,
        #[allow(dead_code)] parking_lot::MutexGuard<'static, ()>,
    );

    impl TempDir {
        fn new(test: &str) -> TempDir {
            let fork = crate::files::FORKING.lock();
            let dir = std::env::temp_dir().join(format!(
                "taskd-journal-{test}-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4()
            ));
            TempDir(dir, fork)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn job() -> JobId {
        JobId("job-a".into())
    }

    /// A finished switch of rank `n` to its backup NIC under uuid `n`.
    fn finished(n: u32) -> FinishedOperation {
        let target = RankTarget {
            node: "node-0".into(),
            device: DeviceId(n),
            rank: GlobalRank(n),
            use_backup: true,
        };
        let phases = PhaseDurations {
            pause: Some(Duration::from_micros(1500)),
            total: Duration::from_millis(3),
            ..PhaseDurations::default()
        };
        FinishedOperation::of(&OperationReport {
            rolled_back: true,
            pause_step: Some(42),
            sampled_steps: Some((41, 42)),
            phases,
            stall: Some(Duration::from_nanos(1_234_567)),
            lost_ranks: vec![GlobalRank(3)],
            job_state: JobState::NeedsRecovery,
            ..OperationReport::new(
                OperationId(uuid::Uuid::from_u128(n.into())),
                Direction::ToBackup,
                vec![target],
                Outcome::Failed,
            )
        })
    }

    #[test]
    fn records_survive_a_reopen_unchanged_and_bounded() {
        let dir = TempDir::new("reopen");
        let j = FileJournal::open(&dir.0, &job()).expect("a new directory");
        assert!(j.load().is_empty(), "no file yet: nothing recorded");
        assert_eq!(
            on_disk(j.path()),
            [],
            "written once at open: the directory is writable"
        );
        j.record(finished(1)).unwrap();
        j.record(finished(2)).unwrap();
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.load(), vec![finished(1), finished(2)]);
        // No temporary file is left behind by a completed write.
        let mut names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [LOCK_FILE, JOURNAL_FILE]);
        // The newest JOURNAL_LEN are kept.
        for n in 3..=JOURNAL_LEN as u32 + 2 {
            again.record(finished(n)).unwrap();
        }
        drop(again);
        let ops = FileJournal::open(&dir.0, &job()).unwrap().load();
        assert_eq!(ops.len(), JOURNAL_LEN);
        assert_eq!(ops[0], finished(3));
        assert_eq!(ops[JOURNAL_LEN - 1], finished(JOURNAL_LEN as u32 + 2));
    }

    #[test]
    fn a_bad_journal_is_refused_naming_the_file_and_what_to_do() {
        let dir = TempDir::new("bad");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        j.record(finished(1)).unwrap();
        let path = j.path().to_owned();
        let good = std::fs::read(&path).unwrap();
        drop(j);

        // Another job's journal.
        let e = FileJournal::open(&dir.0, &JobId("job-b".into())).unwrap_err();
        assert!(matches!(e, JournalError::OtherJob { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains("\"job-a\"") && text.contains("move the file away"),
            "{text}"
        );

        // Truncated (a write that was not ours), empty, or not JSON at all.
        for bad in [&good[..good.len() / 2], b"", b"\x00\xffnot json"] {
            std::fs::write(&path, bad).unwrap();
            let e = FileJournal::open(&dir.0, &job()).unwrap_err();
            assert!(matches!(e, JournalError::Corrupt { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains("move it away"), "{text}");
        }
        // Another format.
        let other =
            String::from_utf8(good.clone())
                .unwrap()
                .replacen("\"format\":1", "\"format\":99", 1);
        std::fs::write(&path, other).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(e.to_string().contains("format 99"), "{e}");

        // A journal that is a directory cannot be read.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::NotRegular { .. }), "{e:?}");
        assert!(e.to_string().contains("a directory"), "{e}");
        // And a state directory that is a file is not one.
        let file = dir.0.join("plain");
        std::fs::write(&file, b"x").unwrap();
        let e = FileJournal::open(&file, &job()).unwrap_err();
        assert!(matches!(e, JournalError::Dir { .. }), "{e:?}");
    }

    #[test]
    fn a_record_that_cannot_be_written_is_kept_for_the_next_write() {
        let dir = TempDir::new("unwritable");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        j.record(finished(1)).unwrap();
        // The temporary file's name taken by a directory: the write fails, the file stays.
        std::fs::create_dir(&j.tmp).unwrap();
        let e = j.record(finished(2)).unwrap_err();
        assert!(matches!(e, JournalError::Write { .. }), "{e:?}");
        assert_eq!(
            on_disk(j.path()),
            [finished(1)],
            "the earlier file is whole"
        );
        assert!(j.flush().is_err(), "still failing");
        std::fs::remove_dir(&j.tmp).unwrap();
        j.flush().unwrap();
        assert_eq!(on_disk(j.path()), [finished(1), finished(2)], "flushed");
        j.record(finished(3)).unwrap();
        assert_eq!(on_disk(j.path()), [finished(1), finished(2), finished(3)]);
    }

    /// What the journal file at `path` holds now (read without opening the journal, which
    /// its writer holds locked).
    fn on_disk(path: &Path) -> Vec<FinishedOperation> {
        let file = read(path).unwrap().expect("a journal file");
        file.records.operations.into_iter().collect()
    }

    #[test]
    fn a_second_journal_on_one_directory_is_refused_naming_the_holder() {
        let dir = TempDir::new("locked");
        let first = FileJournal::open(&dir.0, &job()).unwrap();
        first.record(finished(1)).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::Locked { .. }), "{e:?}");
        let text = e.to_string();
        let me = format!("pid {}", std::process::id());
        assert!(text.contains(&me), "names the holder: {text}");
        assert!(text.contains(&dir.0.display().to_string()), "{text}");
        assert!(text.contains("--state-dir of its own"), "{text}");
        assert_eq!(on_disk(first.path()), [finished(1)], "untouched");
        drop(first);
        let next = FileJournal::open(&dir.0, &job()).expect("released with its holder");
        assert_eq!(next.load(), [finished(1)]);
    }

    #[test]
    fn the_temporary_file_is_the_process_own_and_stale_ones_are_removed() {
        let dir = TempDir::new("tmpname");
        std::fs::create_dir_all(&dir.0).unwrap();
        // What a manager killed in a write left: the older shared name and another pid's.
        let stale = [
            format!("{JOURNAL_FILE}.tmp"),
            format!("{JOURNAL_FILE}.4242.tmp"),
        ];
        for name in &stale {
            std::fs::write(dir.0.join(name), b"").unwrap();
        }
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        let own = j.tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(own.contains(&std::process::id().to_string()), "{own}");
        for name in &stale {
            assert!(!dir.0.join(name).exists(), "{name} removed");
        }
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_refused_at_open() {
        let dir = TempDir::new("probe");
        std::fs::create_dir_all(&dir.0).unwrap();
        // This process's temporary name taken by a directory: no write can succeed.
        let tmp = dir
            .0
            .join(format!("{JOURNAL_FILE}.{}.tmp", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::Dir { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&dir.0.display().to_string()), "{text}");
        assert!(text.contains("writable --state-dir"), "{text}");
    }

    #[test]
    fn a_journal_that_is_a_link_or_a_fifo_is_refused_without_blocking() {
        let dir = TempDir::new("kinds");
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join(JOURNAL_FILE);
        let target = dir.0.join("elsewhere.json");
        std::fs::write(&target, b"{}").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::NotRegular { .. }), "{e:?}");
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"{}",
            "its target untouched"
        );

        std::fs::remove_file(&path).unwrap();
        crate::files::mkfifo(&path);
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }

    fn admitted(n: u32) -> AdmittedOperation {
        let f = finished(n);
        AdmittedOperation {
            id: f.report.id,
            fingerprint: f.fingerprint,
        }
    }

    #[test]
    fn an_admission_is_kept_until_its_result_and_survives_a_reopen() {
        let dir = TempDir::new("admitted");
        let file = FileJournal::open(&dir.0, &job()).unwrap();
        let memory = MemoryJournal::default();
        for j in [&file as &dyn OperationJournal, &memory] {
            j.admit(admitted(1)).unwrap();
            j.admit(admitted(2)).unwrap();
            assert_eq!(j.interrupted(), [admitted(1), admitted(2)]);
            j.record(finished(1)).unwrap();
            assert_eq!(j.interrupted(), [admitted(2)], "finished: not interrupted");
            assert_eq!(j.load(), [finished(1)]);
        }
        drop(file);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.interrupted(), [admitted(2)]);
        assert_eq!(again.load(), [finished(1)]);
    }

    #[test]
    fn a_journal_written_before_admissions_were_recorded_opens() {
        let dir = TempDir::new("older");
        std::fs::create_dir_all(&dir.0).unwrap();
        let older = serde_json::json!({
            "format": FORMAT,
            "job": job(),
            "operations": [finished(1)],
        });
        std::fs::write(dir.0.join(JOURNAL_FILE), older.to_string()).unwrap();
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(j.load(), [finished(1)]);
        assert!(j.interrupted().is_empty());
    }

    #[test]
    fn the_memory_journal_keeps_the_newest() {
        let j = MemoryJournal::default();
        for n in 0..JOURNAL_LEN as u32 + 1 {
            j.record(finished(n)).unwrap();
        }
        let ops = j.load();
        assert_eq!(ops.len(), JOURNAL_LEN);
        assert_eq!(ops[0], finished(1));
    }
}
