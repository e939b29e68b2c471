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
//!   after every final result (a temporary file, fsync, rename, fsync of the directory).
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
/// or after it, never half of it.
#[derive(Debug)]
pub struct FileJournal {
    dir: PathBuf,
    path: PathBuf,
    job: JobId,
    records: Mutex<Records>,
}

impl FileJournal {
    /// Opens the journal of `job` in `dir` (created when missing); a missing file is an empty
    /// journal. Refused, naming the file and what to do, when the file cannot be read, is not
    /// a journal, or is another job's.
    pub fn open(dir: &Path, job: &JobId) -> Result<FileJournal, JournalError> {
        let dir_err = |source| JournalError::Dir {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        if !dir.is_dir() {
            return Err(dir_err(std::io::Error::other("not a directory")));
        }
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
        Ok(FileJournal {
            dir: dir.to_owned(),
            path,
            job: job.clone(),
            records: Mutex::new(records),
        })
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `ops` to a temporary file beside the journal, syncs it, renames it over the
    /// journal and syncs the directory (so the rename itself survives a power loss).
    fn write(&self, records: &Records) -> std::io::Result<()> {
        let file = JournalFile {
            format: FORMAT,
            job: self.job.clone(),
            records: records.clone(),
        };
        let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{JOURNAL_FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

/// The journal at `path`: `None` when there is none yet.
fn read(path: &Path) -> Result<Option<JournalFile>, JournalError> {
    let read_err = |source| JournalError::Read {
        path: path.to_owned(),
        source,
    };
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    if size > MAX_JOURNAL_BYTES {
        return Err(corrupt(format!(
            "{size} bytes, more than the {MAX_JOURNAL_BYTES} a journal can have"
        )));
    }
    let bytes = std::fs::read(path).map_err(read_err)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use taskd_core::command::{Direction, RankTarget};
    use taskd_core::operation::{JobState, OperationReport, Outcome, PhaseDurations};
    use taskd_core::{DeviceId, GlobalRank, OperationId};

    /// A fresh directory under the system's temporary one, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(test: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "taskd-journal-{test}-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4()
            ));
            TempDir(dir)
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
            id: OperationId(uuid::Uuid::from_u128(n.into())),
            direction: Direction::ToBackup,
            targets: vec![target],
            outcome: Outcome::Failed,
            error: None,
            rollback_error: None,
            rank_errors: Vec::new(),
            rolled_back: true,
            applied: false,
            pause_step: Some(42),
            sampled_steps: Some((41, 42)),
            phases,
            stall: Some(Duration::from_nanos(1_234_567)),
            lost_ranks: vec![GlobalRank(3)],
            job_state: JobState::NeedsRecovery,
            trigger: Default::default(),
        })
    }

    #[test]
    fn records_survive_a_reopen_unchanged_and_bounded() {
        let dir = TempDir::new("reopen");
        let j = FileJournal::open(&dir.0, &job()).expect("a new directory");
        assert!(j.load().is_empty(), "no file yet: nothing recorded");
        assert!(!j.path().exists(), "nothing is written before a record");
        j.record(finished(1)).unwrap();
        j.record(finished(2)).unwrap();
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.load(), vec![finished(1), finished(2)]);
        // No temporary file is left behind by a completed write.
        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [JOURNAL_FILE]);
        // The newest JOURNAL_LEN are kept.
        for n in 3..=JOURNAL_LEN as u32 + 2 {
            again.record(finished(n)).unwrap();
        }
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
        assert!(
            matches!(e, JournalError::Read { .. } | JournalError::Corrupt { .. }),
            "{e:?}"
        );
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
        let tmp = dir.0.join(format!("{JOURNAL_FILE}.tmp"));
        std::fs::create_dir(&tmp).unwrap();
        let e = j.record(finished(2)).unwrap_err();
        assert!(matches!(e, JournalError::Write { .. }), "{e:?}");
        assert_eq!(
            FileJournal::open(&dir.0, &job()).unwrap().load(),
            vec![finished(1)],
            "the earlier file is whole"
        );
        std::fs::remove_dir(&tmp).unwrap();
        j.record(finished(3)).unwrap();
        assert_eq!(
            FileJournal::open(&dir.0, &job()).unwrap().load(),
            vec![finished(1), finished(2), finished(3)]
        );
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
