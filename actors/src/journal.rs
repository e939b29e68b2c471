//! The manager's journal of finished operations: per uuid, what identified the request and its
//! final report ([`FinishedOperation`]), the newest [`JOURNAL_LEN`]. A manager records every
//! final result in it before anyone is told the result, and a new manager of the job is
//! seeded from it ([`JobLedger::seed`](taskd_core::JobLedger::seed)), so a command repeated
//! with the same uuid after a restart returns the earlier result instead of running again,
//! and a uuid reused for another request is still refused.
//!
//! It also records each operation when it is admitted, before its first directive
//! ([`AdmittedOperation`]), and forgets it at its final result (or when the manager withdraws
//! an operation whose admission it could not write). What is left admitted when a manager
//! stops was interrupted: the next manager refuses those uuids
//! ([`SubmitError::Interrupted`](taskd_core::SubmitError::Interrupted)) instead of running
//! them a second time.
//!
//! A record is bounded whatever the job's size ([`bounded`]): a request is known by its
//! fingerprint (16 bytes), and a report keeps at most [`RECORD_TARGETS`] targets (a larger
//! request is answered with the targets its repetition names), [`RECORD_RANK_ERRORS`] rank
//! errors and [`RECORD_LOST_RANKS`] lost ranks, so a whole-job switch of 65,536 ranks costs
//! the journal what a switch of one device does.
//!
//! - [`FileJournal`]: `taskd manager --state-dir DIR`, one file of JSON lines: a header (the
//!   format and the job), then one record a line, appended and synced (`fdatasync`) at every
//!   admission and result, so a write costs one record, not the journal. Every
//!   [`COMPACT_AFTER`] records (and after a write that failed) the live records are written
//!   to a temporary file of the manager's own, synced and renamed over the journal, the
//!   directory synced. A file cut short (a write that did not complete) or with a line that
//!   is not a record is read up to its last good record, saying what was ignored, and so is
//!   the one-object journal of earlier builds (format 1), rewritten at open.
//!
//!   Everything in the directory goes through a descriptor of the directory, never through a
//!   symbolic link, and the temporary file is created exclusively: a link planted under its
//!   name is removed, not written through. A directory other users may write is refused. The
//!   manager holds an exclusive lock on the directory itself for as long as it runs (and on
//!   [`LOCK_FILE`], which names it, as managers of earlier builds do), so a second manager on
//!   the same directory is refused at start, even once the lock file was removed. The
//!   directory is proven writable at open (the journal is written once), and a write that
//!   fails later is the manager's to report (it refuses new operations until a write succeeds
//!   again). Its writes block for their syncs, so the manager makes them on a thread of their
//!   own (`manager/journal_writer.rs`), not on its actor's thread, which its transport shares.
//! - [`MemoryJournal`]: the in-process job's ([`crate::LocalJob`]): its managers share one,
//!   so a restarted manager remembers as one with `--state-dir` does.

use crate::files;
use parking_lot::Mutex;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use taskd_core::ledger::{AdmittedOperation, FinishedOperation, HISTORY_LEN};
use taskd_core::{JobId, OperationId};

/// How many finished operations a journal keeps: as many as the manager's history.
pub const JOURNAL_LEN: usize = HISTORY_LEN;

/// The file a [`FileJournal`] keeps in its state directory.
pub const JOURNAL_FILE: &str = "operations.json";

/// The file of a state directory that names the manager holding it (`pid N on HOST`); it is
/// locked too, as managers of earlier builds lock it.
pub const LOCK_FILE: &str = "manager.lock";

/// The most of [`LOCK_FILE`] read to name its holder.
const MAX_HOLDER_BYTES: u64 = 4096;

/// The most targets a record lists; a larger request is known by its fingerprint alone.
pub const RECORD_TARGETS: usize = 64;

/// The most rank errors a record keeps (the first ones).
pub const RECORD_RANK_ERRORS: usize = 16;

/// The most lost ranks a record names (the first ones).
pub const RECORD_LOST_RANKS: usize = 64;

/// The most bytes of one text a record keeps when it would be larger than [`RECORD_BYTES`].
const RECORD_TEXT: usize = 1024;

/// The most bytes a record takes in the file ([`bounded`] makes it fit).
pub const RECORD_BYTES: usize = 32 << 10;

/// The longest line read as a record: twice what this build writes.
const MAX_LINE_BYTES: usize = 2 * RECORD_BYTES;

/// Records appended between two rewrites of the live ones.
pub const COMPACT_AFTER: usize = JOURNAL_LEN;

/// The most of a journal read: more than its live records ([`JOURNAL_LEN`] results and as
/// many admissions) and [`COMPACT_AFTER`] appended ones at [`RECORD_BYTES`] each. What lies
/// beyond is ignored, with a warning.
pub const MAX_JOURNAL_BYTES: u64 = 32 << 20;

/// The most of a journal of an earlier build (format 1: one JSON object, every target of
/// every request twice) read: above the largest one could write (256 records of 65,536
/// targets). Read record by record, so its size costs time, not memory.
pub const MAX_LEGACY_BYTES: u64 = 4 << 30;

/// The version of the file's layout this build writes; it reads [`LEGACY_FORMAT`] too.
const FORMAT: u32 = 2;

/// The layout of earlier builds: one JSON object rewritten whole at every record.
const LEGACY_FORMAT: u32 = 1;

/// How a journal of this build's layout begins: anything else is read as the earlier layout
/// (a JSON object), or refused.
const PREFIX: &[u8] = b"{\"format\":2,";

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
    /// Users other than the manager's may write the state directory: they could replace the
    /// journal, or plant a file under a name the manager writes.
    #[error("the state directory {} may be written by other users (mode {mode:04o}); make it the manager's alone (chmod go-w {}), or give a --state-dir inside it (created the manager's alone)", path.display(), path.display())]
    OpenToOthers {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The journal exists and cannot be read.
    #[error("cannot read the operation journal {}: {source}; fix its permissions, or move it away to start without the earlier results", path.display())]
    Read {
        /// The journal file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not a journal (empty, another format, not JSON): nothing in it can be read.
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
    /// The journal (or the lock file) is a symbolic link, a FIFO, a device or a directory:
    /// the manager renames a new file over the journal, which would replace a link (its
    /// target left stale).
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

    /// Records a final result ([`bounded`]), forgetting the oldest past [`JOURNAL_LEN`];
    /// durable when it returns `Ok`.
    fn record(&self, op: FinishedOperation) -> Result<(), JournalError>;

    /// Forgets the admission of `id`: the manager withdrew the operation before anything ran
    /// (its admission could not be written in time, and the command was refused), so a later
    /// manager must not refuse the uuid as interrupted.
    fn withdraw(&self, id: OperationId) -> Result<(), JournalError> {
        let _ = id;
        Ok(())
    }

    /// Writes again what it holds, after a failed write: `Ok` when everything recorded so far
    /// is durable now.
    fn flush(&self) -> Result<(), JournalError> {
        Ok(())
    }
}

/// The record a journal keeps of a final result: the report bounded whatever the job's size
/// (its targets, when more than [`RECORD_TARGETS`], left out: the fingerprint identifies the
/// request; the first [`RECORD_RANK_ERRORS`] rank errors and [`RECORD_LOST_RANKS`] lost
/// ranks; and, should it still be larger than [`RECORD_BYTES`], each text cut to a
/// kilobyte). A report within those bounds is kept as it is.
pub fn bounded(mut op: FinishedOperation) -> FinishedOperation {
    let r = &mut op.report;
    if r.targets.len() > RECORD_TARGETS {
        r.targets.clear();
    }
    r.rank_errors.truncate(RECORD_RANK_ERRORS);
    r.lost_ranks.truncate(RECORD_LOST_RANKS);
    let fits =
        |op: &FinishedOperation| serde_json::to_vec(op).is_ok_and(|b| b.len() + 64 <= RECORD_BYTES);
    if fits(&op) {
        return op;
    }
    let cut = cut_texts(&op).unwrap_or_else(|| op.clone());
    if fits(&cut) {
        return cut;
    }
    let mut least = cut;
    least.report.targets.clear();
    least.report.rank_errors.clear();
    least.report.lost_ranks.clear();
    least
}

/// `op` with every text longer than [`RECORD_TEXT`] cut there.
fn cut_texts(op: &FinishedOperation) -> Option<FinishedOperation> {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) if s.len() > RECORD_TEXT => {
                let mut end = RECORD_TEXT;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
                s.push_str(" [...]");
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            serde_json::Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(op).ok()?;
    walk(&mut v);
    serde_json::from_value(v).ok()
}

/// What a journal keeps: the live records, bounded.
#[derive(Debug, Default, Clone)]
struct Records {
    operations: VecDeque<FinishedOperation>,
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

    /// Forgets the admission of `id`.
    fn withdraw(&mut self, id: OperationId) {
        self.admitted.retain(|a| a.id != id);
    }

    fn apply(&mut self, line: Line) {
        match line {
            Line::Admit(op) => self.admit(op),
            Line::Finish(op) => self.finish(bounded(*op)),
            Line::Withdraw { id } => self.withdraw(id),
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
        self.records.lock().finish(bounded(op));
        Ok(())
    }

    fn withdraw(&self, id: OperationId) -> Result<(), JournalError> {
        self.records.lock().withdraw(id);
        Ok(())
    }
}

/// The first line of a journal file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: u32,
    job: JobId,
}

/// One record line, as read.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Admit(AdmittedOperation),
    Finish(Box<FinishedOperation>),
    Withdraw { id: OperationId },
}

/// One record line, as written.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum LineRef<'a> {
    Admit(&'a AdmittedOperation),
    Finish(&'a FinishedOperation),
    Withdraw { id: OperationId },
}

/// A journal in one file of a state directory ([`JOURNAL_FILE`], see the module's doc): one
/// record appended and synced per write, the live ones rewritten atomically every
/// [`COMPACT_AFTER`]. It holds the directory's lock until dropped.
#[derive(Debug)]
pub struct FileJournal {
    /// The state directory, locked (`flock`) while this is open.
    dirfd: OwnedFd,
    path: PathBuf,
    /// This process's temporary file's name, renamed over the journal at every rewrite.
    tmp: String,
    job: JobId,
    state: Mutex<State>,
    /// What could not be read at open.
    warnings: Vec<String>,
    /// [`LOCK_FILE`], held locked as managers of earlier builds do.
    _lock: File,
}

/// The records and the file they are appended to.
#[derive(Debug)]
struct State {
    records: Records,
    /// The journal, open for appending; `None` until the next write rewrites it (after a
    /// failed write: the file may end with a partial line).
    file: Option<File>,
    /// Records appended since it was last rewritten.
    appended: usize,
    /// Every write fails with this while set.
    #[cfg(test)]
    fail: Option<io::ErrorKind>,
}

impl FileJournal {
    /// Opens the journal of `job` in `dir` (created when missing, the manager's alone), locks
    /// the directory and writes the journal once, so a directory that cannot be written is
    /// refused now rather than at the first result; a missing file is an empty journal.
    /// Refused, naming the file and what to do, when another manager holds the directory,
    /// other users may write it, the file cannot be read, is not a regular file, is not a
    /// journal, or is another job's. A journal with records that cannot be read is read up to
    /// its last good record ([`FileJournal::warnings`] say what was ignored, and the log).
    pub fn open(dir: &Path, job: &JobId) -> Result<FileJournal, JournalError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir_err = |source| JournalError::Dir {
            path: dir.to_owned(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(dir_err)?;
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dirfd = rustix::fs::open(dir, flags, Mode::empty()).map_err(|e| dir_err(e.into()))?;
        let mode = rustix::fs::fstat(&dirfd)
            .map_err(|e| dir_err(e.into()))?
            .st_mode;
        if mode & 0o022 != 0 {
            return Err(JournalError::OpenToOthers {
                path: dir.to_owned(),
                mode: mode & 0o7777,
            });
        }
        let lock = lock(dirfd.as_fd(), dir)?;
        remove_stale_temporaries(dir, dirfd.as_fd());
        let path = dir.join(JOURNAL_FILE);
        let (records, warnings) = match read(dirfd.as_fd(), &path)? {
            None => (Records::default(), Vec::new()),
            Some(file) if file.job != *job => {
                return Err(JournalError::OtherJob {
                    path,
                    found: file.job,
                    job: job.clone(),
                })
            }
            Some(file) => (file.records, file.warnings),
        };
        for w in &warnings {
            tracing::warn!(journal = %path.display(), "{w}");
        }
        let journal = FileJournal {
            dirfd,
            tmp: format!("{JOURNAL_FILE}.{}.tmp", std::process::id()),
            path,
            job: job.clone(),
            state: Mutex::new(State {
                records,
                file: None,
                appended: 0,
                #[cfg(test)]
                fail: None,
            }),
            warnings,
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

    /// What could not be read when it was opened (a record cut short, lines that are not
    /// records, bytes past [`MAX_JOURNAL_BYTES`]); empty when every record was read.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Changes the records, then writes `line` (appended), or every live record when the
    /// file must be rewritten (`line` is `None`, the last write failed, or [`COMPACT_AFTER`]
    /// records were appended since the last rewrite). A record that could not be written is
    /// still kept in memory: the next write carries it too.
    fn update(
        &self,
        change: impl FnOnce(&mut Records),
        line: Option<LineRef<'_>>,
    ) -> Result<(), JournalError> {
        let mut st = self.state.lock();
        change(&mut st.records);
        #[cfg(test)]
        if let Some(kind) = st.fail {
            st.file = None;
            return Err(JournalError::Write {
                path: self.path.clone(),
                source: io::Error::new(kind, "a write failed (test)"),
            });
        }
        let written = match line {
            Some(line) if st.file.is_some() && st.appended < COMPACT_AFTER => {
                self.append(&mut st, &line)
            }
            _ => self.rewrite(&mut st),
        };
        written.map_err(|source| JournalError::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Appends one record and syncs its data; a failure cuts the file back to its length
    /// before the write (best effort) and leaves the next write to rewrite it.
    fn append(&self, st: &mut State, line: &LineRef<'_>) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        let f = st.file.as_mut().expect("checked by the caller");
        let len = f.metadata()?.len();
        match f.write_all(&bytes).and_then(|()| f.sync_data()) {
            Ok(()) => {
                st.appended += 1;
                Ok(())
            }
            Err(e) => {
                let _ = f.set_len(len);
                st.file = None;
                Err(e)
            }
        }
    }

    /// Writes the header and every live record to this process's temporary file (created
    /// exclusively, never through a link), syncs it, renames it over the journal and syncs
    /// the directory (so the rename itself survives a power loss); it is the file appended to
    /// from then on. A failed rewrite removes the temporary file (no empty file is left on a
    /// full disk) and leaves the earlier journal as it was.
    fn rewrite(&self, st: &mut State) -> io::Result<()> {
        st.file = None;
        let dir = self.dirfd.as_fd();
        let f = files::create_exclusive_at(dir, &self.tmp)?;
        let written = (|| {
            let mut w = io::BufWriter::new(&f);
            let mut line = |bytes: Vec<u8>| -> io::Result<()> {
                w.write_all(&bytes)?;
                w.write_all(b"\n")
            };
            let header = Header {
                format: FORMAT,
                job: self.job.clone(),
            };
            line(serde_json::to_vec(&header).map_err(io::Error::other)?)?;
            let admitted = st.records.admitted.iter().map(LineRef::Admit);
            let finished = st.records.operations.iter().map(LineRef::Finish);
            for l in admitted.chain(finished) {
                line(serde_json::to_vec(&l).map_err(io::Error::other)?)?;
            }
            w.flush()?;
            drop(w);
            f.sync_all()?;
            rustix::fs::renameat(dir, self.tmp.as_str(), dir, JOURNAL_FILE)?;
            rustix::fs::fsync(dir)?;
            Ok(())
        })();
        match written {
            Ok(()) => {
                st.file = Some(f);
                st.appended = 0;
                Ok(())
            }
            Err(e) => {
                let _ = rustix::fs::unlinkat(dir, self.tmp.as_str(), rustix::fs::AtFlags::empty());
                Err(e)
            }
        }
    }
}

/// Takes the exclusive lock of `dir` (the directory itself, and [`LOCK_FILE`] for managers of
/// earlier builds) and writes this process's name into [`LOCK_FILE`];
/// [`JournalError::Locked`], naming the holder, when another process holds either. The lock on
/// the directory holds even when the lock file is removed (a clean-up of "stale" locks).
fn lock(dirfd: BorrowedFd<'_>, dir: &Path) -> Result<File, JournalError> {
    let path = dir.join(LOCK_FILE);
    let dir_err = |source| JournalError::Dir {
        path: dir.to_owned(),
        source,
    };
    let locked = || {
        let holder = files::open_regular_at(dirfd, LOCK_FILE)
            .ok()
            .flatten()
            .and_then(|f| {
                let mut b = Vec::new();
                f.take(MAX_HOLDER_BYTES).read_to_end(&mut b).ok()?;
                Some(String::from_utf8_lossy(&b).trim().to_owned())
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "a process that did not say which".into());
        JournalError::Locked {
            path: dir.to_owned(),
            holder,
        }
    };
    match files::try_lock_exclusive(dirfd) {
        Ok(true) => {}
        Ok(false) => return Err(locked()),
        Err(e) => return Err(dir_err(e)),
    }
    let mut f = files::open_or_create_at(dirfd, LOCK_FILE).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput => JournalError::NotRegular { path, source: e },
        _ => dir_err(e),
    })?;
    match files::try_lock_exclusive(&f) {
        Ok(true) => {}
        Ok(false) => return Err(locked()),
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
fn remove_stale_temporaries(dir: &Path, dirfd: BorrowedFd<'_>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&format!("{JOURNAL_FILE}.")) && name.ends_with(".tmp") {
            let _ = rustix::fs::unlinkat(dirfd, name.as_ref(), rustix::fs::AtFlags::empty());
        }
    }
}

/// A journal as read: its job, its live records and what could not be read.
struct Loaded {
    job: JobId,
    records: Records,
    warnings: Vec<String>,
}

/// The journal of the directory `dir` (`path` names it): `None` when there is none yet. Only
/// a regular file is read (a link, a FIFO or a device is refused without blocking on it).
fn read(dir: BorrowedFd<'_>, path: &Path) -> Result<Option<Loaded>, JournalError> {
    let read_err = |source| JournalError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = match files::open_regular_at(dir, JOURNAL_FILE) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            return Err(JournalError::NotRegular {
                path: path.to_owned(),
                source: e,
            })
        }
        Err(e) => return Err(read_err(e)),
    };
    let size = file.metadata().map_err(read_err)?.len();
    // The first bytes say which layout it is; the bound depends on it.
    let mut start = Vec::with_capacity(PREFIX.len());
    (&mut file)
        .take(PREFIX.len() as u64)
        .read_to_end(&mut start)
        .map_err(read_err)?;
    let legacy = start != PREFIX && !start.is_empty();
    let bound = if legacy {
        MAX_LEGACY_BYTES
    } else {
        MAX_JOURNAL_BYTES
    };
    let rest = file.take(bound.saturating_sub(start.len() as u64));
    let reader = BufReader::new(io::Cursor::new(start).chain(rest));
    let mut loaded = if legacy {
        read_legacy(reader, path)?
    } else {
        read_lines(reader, path)?
    };
    if size > bound {
        loaded.warnings.push(format!(
            "it is {size} bytes, more than the {bound} a journal can have: only its first {bound} bytes were read; a uuid recorded past them is forgotten (a repeated command under it runs again)"
        ));
    }
    Ok(Some(loaded))
}

/// One line read by [`read_line`].
struct LineRead {
    /// Bytes taken from the reader (the whole line, also when it was too long).
    bytes: usize,
    /// Whether it ended with a newline.
    complete: bool,
    /// Whether it was longer than the bound (its start is in the buffer, the rest skipped).
    too_long: bool,
}

/// Reads one line of at most `max` bytes (its newline included) into `buf`.
fn read_line(r: &mut impl io::BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
    buf.clear();
    let n = r.by_ref().take(max as u64).read_until(b'\n', buf)?;
    let ended = buf.last() == Some(&b'\n');
    if ended || n < max {
        return Ok(LineRead {
            bytes: n,
            complete: ended,
            too_long: false,
        });
    }
    let mut skipped = 0;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        r.consume(take);
        skipped += take;
        if done {
            break;
        }
    }
    Ok(LineRead {
        bytes: n + skipped,
        complete: true,
        too_long: true,
    })
}

/// A journal of this build's layout: its header, then its records up to the last good one.
fn read_lines(mut r: impl io::BufRead, path: &Path) -> Result<Loaded, JournalError> {
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let read_err = |source| JournalError::Read {
        path: path.to_owned(),
        source,
    };
    let mut line = Vec::new();
    let first = read_line(&mut r, &mut line, MAX_LINE_BYTES).map_err(read_err)?;
    if first.bytes == 0 {
        return Err(corrupt("empty: not a journal".into()));
    }
    let header: serde_json::Value = serde_json::from_slice(line.trim_ascii())
        .map_err(|e| corrupt(format!("not a journal: {e}")))?;
    match header.get("format").and_then(serde_json::Value::as_u64) {
        Some(f) if f == u64::from(FORMAT) => {}
        Some(f) => {
            return Err(corrupt(format!(
                "format {f}, this build reads formats {LEGACY_FORMAT} and {FORMAT}"
            )))
        }
        None => return Err(corrupt("not a journal: no format".into())),
    }
    let header: Header =
        serde_json::from_value(header).map_err(|e| corrupt(format!("not a journal: {e}")))?;
    let mut records = Records::default();
    let (mut number, mut bad, mut torn) = (1usize, Vec::new(), false);
    loop {
        let got = read_line(&mut r, &mut line, MAX_LINE_BYTES).map_err(read_err)?;
        if got.bytes == 0 {
            break;
        }
        number += 1;
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Line>(text) {
            Ok(l) if !got.too_long => records.apply(l),
            Err(_) if !got.complete => torn = true,
            _ => bad.push(number),
        }
    }
    let mut warnings = Vec::new();
    if torn {
        warnings.push(format!(
            "its last line ({number}) is a record cut short (a write that did not complete, whose operation nobody was told of): ignored"
        ));
    }
    if !bad.is_empty() {
        let lines: Vec<String> = bad.iter().map(usize::to_string).collect();
        warnings.push(format!(
            "line(s) {} are not records: ignored, and the journal rewritten without them; a uuid recorded there is forgotten (a repeated command under it runs again, or is no longer refused as interrupted)",
            lines.join(", ")
        ));
    }
    Ok(Loaded {
        job: header.job,
        records,
        warnings,
    })
}

/// What a journal of the earlier layout holds, filled in as it is read.
#[derive(Default)]
struct LegacyHead {
    format: Option<u32>,
    job: Option<JobId>,
    records: Records,
    read: usize,
}

/// A journal of the earlier layout (one JSON object), read record by record (so its size
/// costs time, not memory), each result bounded as this build keeps them; up to its last
/// good record when it cannot be read whole.
fn read_legacy(r: impl io::Read, path: &Path) -> Result<Loaded, JournalError> {
    let mut head = LegacyHead::default();
    let mut de = serde_json::Deserializer::from_reader(r);
    let res = Legacy(&mut head).deserialize(&mut de);
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    match (head.format, head.job.take()) {
        (Some(LEGACY_FORMAT), Some(job)) => read_legacy_done(job, head, res),
        (Some(f), _) if f != LEGACY_FORMAT => Err(corrupt(format!(
            "format {f}, this build reads formats {LEGACY_FORMAT} and {FORMAT}"
        ))),
        _ => Err(corrupt(format!(
            "not a journal: {}",
            res.err()
                .map_or("no format or job".into(), |e| e.to_string())
        ))),
    }
}

/// What [`read_legacy`] read of a journal of `job`, and what it could not read.
fn read_legacy_done(
    job: JobId,
    head: LegacyHead,
    res: Result<(), serde_json::Error>,
) -> Result<Loaded, JournalError> {
    let mut warnings = vec![format!(
        "it was written by an earlier build (format {LEGACY_FORMAT}): read and rewritten in format {FORMAT}"
    )];
    if let Err(e) = res {
        warnings.push(format!(
            "it could not be read past its first {} records ({e}): the results after them, and the operations an earlier manager left interrupted, are forgotten (a repeated command under one of their uuids runs again)",
            head.read
        ));
    }
    Ok(Loaded {
        job,
        records: head.records,
        warnings,
    })
}

/// Reads the object of a journal of the earlier layout into a [`LegacyHead`].
struct Legacy<'a>(&'a mut LegacyHead);

impl<'de> DeserializeSeed<'de> for Legacy<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Legacy<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an operation journal")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let head = self.0;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "format" => head.format = Some(map.next_value()?),
                "job" => head.job = Some(map.next_value()?),
                "operations" => map.next_value_seed(Each(head, |h, op| {
                    h.records.finish(bounded(op));
                }))?,
                "admitted" => map.next_value_seed(Each(head, |h, op| h.records.admit(op)))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Reads a list, handing each element to a function as it comes.
struct Each<'a, T>(&'a mut LegacyHead, fn(&mut LegacyHead, T));

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Each<'_, T> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Each<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(x) = seq.next_element::<T>()? {
            (self.1)(self.0, x);
            self.0.read += 1;
        }
        Ok(())
    }
}

impl OperationJournal for FileJournal {
    fn load(&self) -> Vec<FinishedOperation> {
        self.state
            .lock()
            .records
            .operations
            .iter()
            .cloned()
            .collect()
    }

    fn interrupted(&self) -> Vec<AdmittedOperation> {
        self.state.lock().records.admitted.iter().cloned().collect()
    }

    fn admit(&self, op: AdmittedOperation) -> Result<(), JournalError> {
        let line = op.clone();
        self.update(|r| r.admit(op), Some(LineRef::Admit(&line)))
    }

    fn record(&self, op: FinishedOperation) -> Result<(), JournalError> {
        let op = bounded(op);
        let line = op.clone();
        self.update(|r| r.finish(op), Some(LineRef::Finish(&line)))
    }

    fn withdraw(&self, id: OperationId) -> Result<(), JournalError> {
        self.update(|r| r.withdraw(id), Some(LineRef::Withdraw { id }))
    }

    fn flush(&self) -> Result<(), JournalError> {
        self.update(|_| {}, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;
    use taskd_core::command::{Direction, RankTarget};
    use taskd_core::ledger::RequestFingerprint;
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

        /// The directory, made (the manager's alone).
        fn made(test: &str) -> TempDir {
            let d = TempDir::new(test);
            std::fs::create_dir_all(&d.0).unwrap();
            std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
            d
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

    fn target(rank: u32) -> RankTarget {
        RankTarget {
            node: format!("node-{}", rank / 16).as_str().into(),
            device: DeviceId(rank % 16),
            rank: GlobalRank(rank),
            use_backup: true,
        }
    }

    /// A finished switch of `targets` to their backup NIC under uuid `n`.
    fn finished_of(n: u32, targets: Vec<RankTarget>) -> FinishedOperation {
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
                targets,
                Outcome::Failed,
            )
        })
    }

    /// A finished switch of rank `n` to its backup NIC under uuid `n`.
    fn finished(n: u32) -> FinishedOperation {
        finished_of(n, vec![target(n)])
    }

    fn admitted(n: u32) -> AdmittedOperation {
        let f = finished(n);
        AdmittedOperation {
            id: f.report.id,
            fingerprint: f.fingerprint,
        }
    }

    /// What the journal file of `dir` holds now (read without opening the journal, which its
    /// writer holds locked).
    fn read_dir_journal(dir: &Path) -> Loaded {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        read(fd.as_fd(), &dir.join(JOURNAL_FILE))
            .unwrap()
            .expect("a journal file")
    }

    fn on_disk(dir: &Path) -> Vec<FinishedOperation> {
        read_dir_journal(dir)
            .records
            .operations
            .into_iter()
            .collect()
    }

    #[test]
    fn records_survive_a_reopen_unchanged_and_bounded() {
        let dir = TempDir::new("reopen");
        let j = FileJournal::open(&dir.0, &job()).expect("a new directory");
        assert!(j.load().is_empty(), "no file yet: nothing recorded");
        assert_eq!(
            on_disk(&dir.0),
            [],
            "written once at open: the directory is writable"
        );
        let mode = std::fs::metadata(&dir.0).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "made the manager's alone");
        j.record(finished(1)).unwrap();
        j.record(finished(2)).unwrap();
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.load(), vec![finished(1), finished(2)]);
        assert!(again.warnings().is_empty(), "{:?}", again.warnings());
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
    fn a_file_that_is_not_a_journal_is_refused_naming_the_file_and_what_to_do() {
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

        // Empty, not JSON at all, its header cut short: nothing in it can be read.
        let header_end = good.iter().position(|b| *b == b'\n').unwrap();
        for bad in [&b""[..], b"\x00\xffnot json", &good[..header_end / 2]] {
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
                .replacen("\"format\":2", "\"format\":99", 1);
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

    /// A journal cut short by a write that did not complete, or with a line that is not a
    /// record, is read up to its last good record and says what it ignored: refusing it would
    /// lose every uuid it protects.
    #[test]
    fn a_journal_cut_short_or_with_a_bad_line_is_read_up_to_its_last_good_record() {
        let dir = TempDir::new("partial");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        for n in 1..=3 {
            j.record(finished(n)).unwrap();
        }
        j.admit(admitted(4)).unwrap();
        let path = j.path().to_owned();
        drop(j);
        let good = std::fs::read(&path).unwrap();

        // Cut in the middle of its last record (the admission of 4).
        std::fs::write(&path, &good[..good.len() - 20]).unwrap();
        let j = FileJournal::open(&dir.0, &job()).expect("read, not refused");
        assert_eq!(j.load(), [finished(1), finished(2), finished(3)]);
        assert!(j.interrupted().is_empty());
        let w = j.warnings().join("; ");
        assert!(w.contains("cut short"), "{w}");
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert!(again.warnings().is_empty(), "rewritten whole at open");
        drop(again);

        // A line in the middle that is not a record: the others are read.
        let text = String::from_utf8(good).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines[2] = "{\"finish\": not a record";
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(j.load(), [finished(1), finished(3)]);
        assert_eq!(j.interrupted(), [admitted(4)]);
        let w = j.warnings().join("; ");
        assert!(w.contains("line(s) 3 are not records"), "{w}");
        assert!(w.contains("forgotten"), "says what it costs: {w}");
    }

    /// A result of a whole-job switch costs the journal what a switch of one device does: the
    /// record holds the request's fingerprint, not its targets, and a write appends one
    /// record instead of rewriting the journal. (The journal of a 1,024 x 16 job's whole-job
    /// switches grew to hundreds of MiB, each write rewrote and synced all of it, and the
    /// next manager refused it as too large.)
    #[test]
    fn a_write_costs_one_bounded_record_whatever_the_jobs_size() {
        let dir = TempDir::new("size");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        let len = || std::fs::metadata(j.path()).unwrap().len();
        j.record(finished(1)).unwrap();
        let small = len();
        j.record(finished(2)).unwrap();
        let one_device = len() - small;
        let whole_job: Vec<RankTarget> = (0..16_384).map(target).collect();
        let big = finished_of(3, whole_job.clone());
        let before = len();
        j.record(big.clone()).unwrap();
        let grew = len() - before;
        assert!(
            grew <= one_device + 200,
            "a whole-job record takes {grew} bytes, a one-device one {one_device}"
        );
        for n in 4..40 {
            j.record(finished_of(n, whole_job.clone())).unwrap();
        }
        assert!(len() < 64 << 10, "{} bytes for 40 records", len());
        // Appended, not rewritten: the file is the same one since the open's write.
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let first = ino(j.path());
        j.record(finished(41)).unwrap();
        assert_eq!(ino(j.path()), first, "appended in place");
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        let kept = again
            .load()
            .into_iter()
            .find(|f| f.report.id == big.report.id);
        let kept = kept.expect("the whole-job result is known");
        assert_eq!(kept.fingerprint, RequestFingerprint::of(&whole_job));
        assert!(kept.report.targets.is_empty(), "known by its fingerprint");
        assert_eq!(kept.report.outcome, big.report.outcome);
    }

    /// The live records are rewritten every COMPACT_AFTER appends: the file stays bounded.
    #[test]
    fn the_file_is_rewritten_with_only_its_live_records_and_stays_bounded() {
        let dir = TempDir::new("compact");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        let mut most = 0;
        for n in 0..(JOURNAL_LEN + 3 * COMPACT_AFTER) as u32 {
            j.admit(admitted(n)).unwrap();
            j.record(finished(n)).unwrap();
            most = most.max(std::fs::read_to_string(j.path()).unwrap().lines().count());
        }
        assert!(
            most <= 1 + JOURNAL_LEN + COMPACT_AFTER,
            "at most the live records and one round of appends: {most} lines"
        );
        drop(j);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.load().len(), JOURNAL_LEN);
        assert!(again.interrupted().is_empty());
    }

    /// A record's texts and lists are bounded, so one record can never be larger than
    /// RECORD_BYTES, whatever its errors say.
    #[test]
    fn a_record_is_bounded_whatever_its_report_holds() {
        use taskd_core::operation::OperationError;
        let mut op = finished(1);
        op.report.error = Some(OperationError::Timeout {
            phase: taskd_core::protocol::Phase::Pause,
            deadline: Duration::from_secs(1),
            missing: "x".repeat(1 << 20),
        });
        op.report.lost_ranks = (0..65_536).map(GlobalRank).collect();
        let b = bounded(op.clone());
        assert!(serde_json::to_vec(&b).unwrap().len() <= RECORD_BYTES);
        assert_eq!(b.report.lost_ranks.len(), RECORD_LOST_RANKS);
        assert_eq!(b.report.id, op.report.id);
        assert_eq!(
            bounded(finished(2)),
            finished(2),
            "a small record is kept whole"
        );
    }

    /// The journal of an earlier build (one JSON object holding every target twice) is read
    /// record by record, its results bounded, and rewritten in this build's layout; cut
    /// short, it is read up to its last whole record.
    #[test]
    fn a_journal_of_an_earlier_build_is_read_and_rewritten() {
        let dir = TempDir::made("legacy");
        let path = dir.0.join(JOURNAL_FILE);
        let whole_job: Vec<RankTarget> = (0..4096).map(target).collect();
        let legacy_op = |n: u32, targets: Vec<RankTarget>| {
            let f = finished_of(n, targets.clone());
            let pairs: Vec<(u32, bool)> = targets.iter().map(|t| (t.rank.0, true)).collect();
            serde_json::json!({"fingerprint": pairs, "report": f.report})
        };
        // As earlier builds wrote it: serde's order, the fields of their `JournalFile`.
        #[derive(Serialize)]
        struct Format1 {
            format: u32,
            job: JobId,
            operations: Vec<serde_json::Value>,
            admitted: Vec<serde_json::Value>,
        }
        let legacy = serde_json::to_string(&Format1 {
            format: 1,
            job: job(),
            operations: vec![
                legacy_op(1, vec![target(1)]),
                legacy_op(2, whole_job.clone()),
            ],
            admitted: vec![serde_json::json!({"id": admitted(3).id, "fingerprint": [[3, true]]})],
        })
        .unwrap();
        assert!(legacy.starts_with("{\"format\":1,"));
        std::fs::write(&path, &legacy).unwrap();
        let j = FileJournal::open(&dir.0, &job()).expect("read");
        let ops = j.load();
        assert_eq!(ops[0], finished(1));
        assert_eq!(ops[1].fingerprint, RequestFingerprint::of(&whole_job));
        assert!(ops[1].report.targets.is_empty(), "bounded");
        assert_eq!(j.interrupted(), [admitted(3)]);
        assert!(
            j.warnings()[0].contains("earlier build"),
            "{:?}",
            j.warnings()
        );
        drop(j);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"format\":2,"), "rewritten: {text:.60}");
        assert!(text.len() < legacy.len() / 10, "{} bytes", text.len());

        // Cut short inside its second result: the first is read, the admission is lost and
        // the warning says so.
        std::fs::write(&path, &legacy[..legacy.len() / 2]).unwrap();
        let j = FileJournal::open(&dir.0, &job()).expect("read up to the cut");
        assert_eq!(j.load(), [finished(1)]);
        assert!(j.interrupted().is_empty());
        let w = j.warnings().join("; ");
        assert!(w.contains("past its first 1 records"), "{w}");
        assert!(w.contains("interrupted"), "{w}");
    }

    #[test]
    fn a_record_that_cannot_be_written_is_kept_for_the_next_write() {
        let dir = TempDir::new("unwritable");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        j.record(finished(1)).unwrap();
        j.state.lock().fail = Some(io::ErrorKind::Other);
        let e = j.record(finished(2)).unwrap_err();
        assert!(matches!(e, JournalError::Write { .. }), "{e:?}");
        assert_eq!(on_disk(&dir.0), [finished(1)], "the earlier file is whole");
        assert!(j.flush().is_err(), "still failing");
        j.state.lock().fail = None;
        j.flush().unwrap();
        assert_eq!(on_disk(&dir.0), [finished(1), finished(2)], "flushed");
        j.record(finished(3)).unwrap();
        assert_eq!(on_disk(&dir.0), [finished(1), finished(2), finished(3)]);
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
        assert_eq!(on_disk(&dir.0), [finished(1)], "untouched");
        drop(first);
        let next = FileJournal::open(&dir.0, &job()).expect("released with its holder");
        assert_eq!(next.load(), [finished(1)]);
    }

    /// The lock is the directory's, not only its lock file's: removing `manager.lock` (a
    /// clean-up of stale locks, a temporary files reaper) does not let a second manager in.
    #[test]
    fn a_removed_lock_file_does_not_let_a_second_journal_in() {
        let dir = TempDir::new("unlocked");
        let first = FileJournal::open(&dir.0, &job()).unwrap();
        std::fs::remove_file(dir.0.join(LOCK_FILE)).unwrap();
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::Locked { .. }), "{e:?}");
        // Through another path to the same directory too.
        let link = dir.0.with_extension("link");
        std::os::unix::fs::symlink(&dir.0, &link).unwrap();
        let e = FileJournal::open(&link, &job()).unwrap_err();
        std::fs::remove_file(&link).unwrap();
        assert!(matches!(e, JournalError::Locked { .. }), "{e:?}");
        drop(first);
        FileJournal::open(&dir.0, &job()).expect("released with its holder");
    }

    #[test]
    fn the_temporary_file_is_the_process_own_and_stale_ones_are_removed() {
        let dir = TempDir::made("tmpname");
        // What a manager killed in a write left: the older shared name and another pid's.
        let stale = [
            format!("{JOURNAL_FILE}.tmp"),
            format!("{JOURNAL_FILE}.4242.tmp"),
        ];
        for name in &stale {
            std::fs::write(dir.0.join(name), b"").unwrap();
        }
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        assert!(j.tmp.contains(&std::process::id().to_string()), "{}", j.tmp);
        for name in &stale {
            assert!(!dir.0.join(name).exists(), "{name} removed");
        }
    }

    /// A symbolic link planted under the temporary file's name (by anyone who could write the
    /// directory) is removed, never written through: its target is untouched and the journal
    /// stays a regular file.
    #[test]
    fn the_temporary_file_is_created_exclusively_and_never_through_a_link() {
        let dir = TempDir::new("planted");
        let j = FileJournal::open(&dir.0, &job()).unwrap();
        let victim = dir.0.with_extension("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let tmp = dir.0.join(&j.tmp);
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        // A rewrite goes through the temporary file.
        j.flush().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "untouched");
        std::fs::remove_file(&victim).unwrap();
        let meta = std::fs::symlink_metadata(j.path()).unwrap();
        assert!(meta.file_type().is_file(), "the journal is the file itself");
        assert!(!tmp.exists(), "renamed into place");
        j.record(finished(1)).unwrap();
        drop(j);
        assert_eq!(
            FileJournal::open(&dir.0, &job()).unwrap().load(),
            [finished(1)]
        );
    }

    /// A state directory other users may write is refused: whoever can write it can replace
    /// the journal or plant files under the names the manager writes.
    #[test]
    fn a_state_directory_others_may_write_is_refused() {
        let dir = TempDir::made("shared");
        for mode in [0o777, 0o1777, 0o775, 0o757] {
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = FileJournal::open(&dir.0, &job()).unwrap_err();
            assert!(
                matches!(e, JournalError::OpenToOthers { .. }),
                "{mode:o}: {e:?}"
            );
            let text = e.to_string();
            assert!(text.contains("chmod go-w"), "{text}");
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
        }
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        FileJournal::open(&dir.0, &job()).expect("the manager's alone");
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_refused_at_open() {
        let dir = TempDir::made("probe");
        // This process's temporary name taken by a directory: no rewrite can succeed.
        let tmp = dir
            .0
            .join(format!("{JOURNAL_FILE}.{}.tmp", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        // Not stale: the open removes files only.
        let e = FileJournal::open(&dir.0, &job()).unwrap_err();
        assert!(matches!(e, JournalError::Dir { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&dir.0.display().to_string()), "{text}");
        assert!(text.contains("writable --state-dir"), "{text}");
    }

    #[test]
    fn a_journal_that_is_a_link_or_a_fifo_is_refused_without_blocking() {
        let dir = TempDir::made("kinds");
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

    #[test]
    fn an_admission_is_kept_until_its_result_or_its_withdrawal_and_survives_a_reopen() {
        let dir = TempDir::new("admitted");
        let file = FileJournal::open(&dir.0, &job()).unwrap();
        let memory = MemoryJournal::default();
        for j in [&file as &dyn OperationJournal, &memory] {
            j.admit(admitted(1)).unwrap();
            j.admit(admitted(2)).unwrap();
            j.admit(admitted(5)).unwrap();
            assert_eq!(j.interrupted(), [admitted(1), admitted(2), admitted(5)]);
            j.record(finished(1)).unwrap();
            j.withdraw(admitted(5).id).unwrap();
            assert_eq!(j.interrupted(), [admitted(2)], "finished or withdrawn");
            assert_eq!(j.load(), [finished(1)]);
        }
        drop(file);
        let again = FileJournal::open(&dir.0, &job()).unwrap();
        assert_eq!(again.interrupted(), [admitted(2)]);
        assert_eq!(again.load(), [finished(1)]);
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
