//! The manager's journal writes, on a thread of their own: a journal's write ends in two
//! `fsync`s (the file, then its directory), which take seconds on a busy disk, and the
//! manager's actor shares its thread with the transport's server (its proxies' heartbeats and
//! registrations) and the control API. The manager hands each batch of records to
//! [`JournalWriter::write`] and waits for the answer without blocking its thread
//! (`ctx.wait`: it handles nothing else meanwhile, so the order of its records, directives
//! and results is kept).
//!
//! The thread (`taskd-journal`) writes the batches in the order they come, and a write that
//! panics is answered as a failed write naming the panic. The manager waits for a write no
//! longer than its bound (a file system that does not answer, a hung NFS server, holds the
//! thread inside the kernel for as long as it lasts): past it the write is a failing journal's
//! and the manager goes on, knowing the thread is still busy ([`JournalWriter::busy_for`]), so
//! it hands it no more retries meanwhile. Dropped, the writer waits for the thread as long
//! too, then leaves it behind rather than hang the manager's stop.

use crate::background::panic_message;
use crate::journal::OperationJournal;
use parking_lot::Mutex;
use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use taskd_core::ledger::{AdmittedOperation, FinishedOperation};
use taskd_core::OperationId;
use tokio::sync::oneshot;

/// One record for the journal.
pub(super) enum Write {
    /// An operation admitted, before its first directive.
    Admit(AdmittedOperation),
    /// A final result, before it is published.
    Record(Box<FinishedOperation>),
    /// An admission forgotten: its operation was withdrawn before anything ran.
    Withdraw(OperationId),
    /// Everything held written again, after a failed write.
    Flush,
}

/// A batch and where its answer goes: the last failure's message, `None` when every write of
/// the batch is durable.
type Batch = (Vec<Write>, oneshot::Sender<Option<String>>);

/// The batches handed to the thread and not written yet, and since when the oldest waits.
#[derive(Default)]
struct Pending {
    batches: usize,
    since: Option<Instant>,
}

/// The journal and the thread that writes it.
pub(super) struct JournalWriter {
    batches: Option<mpsc::Sender<Batch>>,
    thread: Option<JoinHandle<()>>,
    pending: Arc<Mutex<Pending>>,
    /// Told when the thread ends.
    ended: mpsc::Receiver<()>,
    /// How long a drop waits for the thread.
    bound: Duration,
}

impl JournalWriter {
    /// Starts the thread that writes `journal`; a drop waits for it at most `bound`. Panics,
    /// as `std::thread::spawn` does, when the system cannot start a thread.
    pub(super) fn spawn(journal: Arc<dyn OperationJournal>, bound: Duration) -> JournalWriter {
        let (tx, rx) = mpsc::channel::<Batch>();
        let (ended_tx, ended) = mpsc::channel();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let counts = pending.clone();
        let thread = std::thread::Builder::new()
            .name("taskd-journal".into())
            .spawn(move || {
                for (writes, done) in rx {
                    // Every write, in order; the last failure is the answer.
                    let failed = writes
                        .into_iter()
                        .fold(None, |last, w| write_one(journal.as_ref(), w).or(last));
                    {
                        let mut p = counts.lock();
                        p.batches -= 1;
                        p.since = (p.batches > 0).then(Instant::now);
                    }
                    let _ = done.send(failed);
                }
                let _ = ended_tx.send(());
            })
            .expect("the system cannot start the journal's writer thread");
        JournalWriter {
            batches: Some(tx),
            thread: Some(thread),
            pending,
            ended,
            bound,
        }
    }

    /// How long the thread has been writing what it was handed, when it has not finished:
    /// `None` when it waits for work.
    pub(super) fn busy_for(&self) -> Option<Duration> {
        self.pending.lock().since.map(|t| t.elapsed())
    }

    /// Sets how long a drop waits for the thread.
    pub(super) fn set_bound(&mut self, bound: Duration) {
        self.bound = bound;
    }

    /// Hands `writes` to the thread; resolves, without blocking, once they are written: `None`
    /// when all are durable, else the last failure (a thread that is gone is one).
    pub(super) fn write(
        &self,
        writes: Vec<Write>,
    ) -> impl std::future::Future<Output = Option<String>> + 'static {
        let (done, answer) = oneshot::channel();
        let sent = self.batches.as_ref().is_some_and(|b| {
            let mut p = self.pending.lock();
            let sent = b.send((writes, done)).is_ok();
            if sent {
                p.batches += 1;
                p.since.get_or_insert_with(Instant::now);
            }
            sent
        });
        async move {
            if !sent {
                return Some(GONE.to_owned());
            }
            answer.await.unwrap_or_else(|_| Some(GONE.to_owned()))
        }
    }
}

/// What a write answers when the thread is gone (it panicked outside a write, or stopped).
const GONE: &str = "the journal's writer thread stopped";

impl Drop for JournalWriter {
    /// Waits for what the thread was handed, at most the bound (not at all when a write is
    /// already past it): a thread held inside a write by a file system that does not answer
    /// is left behind (the process's exit then waits for the kernel to let it go), so a
    /// stopping manager still stops.
    fn drop(&mut self) {
        drop(self.batches.take());
        let Some(t) = self.thread.take() else { return };
        // A write already past the bound is not waited for again.
        let wait = match self.busy_for() {
            Some(busy) if busy >= self.bound => Duration::ZERO,
            _ => self.bound,
        };
        match self.ended.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Timeout) => tracing::error!(
                bound = ?self.bound,
                "the operation journal's writer thread is still inside a write (its file system does not answer?); the manager stops without it"
            ),
            _ => {
                if t.join().is_err() {
                    tracing::error!("the journal's writer thread panicked");
                }
            }
        }
    }
}

/// Writes one record; its failure's message, logged with what it means for the operation.
fn write_one(journal: &dyn OperationJournal, w: Write) -> Option<String> {
    const ADMISSION: &str = "the admission is not journaled: the command is refused (nothing of it ran); nothing new starts until the journal can be written";
    const RESULT: &str = "the result is not journaled: after a restart its uuid would run again; nothing new starts until the journal can be written";
    const WITHDRAWAL: &str = "the withdrawal of an admission is not journaled: were this manager to stop before another write succeeds, a later one would refuse its uuid as interrupted";
    let lost = match &w {
        Write::Admit(op) => Some((op.id, ADMISSION)),
        Write::Record(op) => Some((op.report.id, RESULT)),
        Write::Withdraw(id) => Some((*id, WITHDRAWAL)),
        Write::Flush => None,
    };
    let res = std::panic::catch_unwind(AssertUnwindSafe(|| match w {
        Write::Admit(op) => journal.admit(op),
        Write::Record(op) => journal.record(*op),
        Write::Withdraw(id) => journal.withdraw(id),
        Write::Flush => journal.flush(),
    }));
    let why = match res {
        Ok(Ok(())) => return None,
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!("the journal's write panicked: {}", panic_message(&*panic)),
    };
    match lost {
        Some((id, what)) => tracing::error!(%id, error = %why, "{what}"),
        None => tracing::debug!(error = %why, "the operation journal still cannot be written"),
    }
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{JournalError, MemoryJournal};

    /// A journal whose writes panic.
    struct Panicking;

    impl OperationJournal for Panicking {
        fn load(&self) -> Vec<FinishedOperation> {
            Vec::new()
        }
        fn interrupted(&self) -> Vec<AdmittedOperation> {
            Vec::new()
        }
        fn admit(&self, _: AdmittedOperation) -> Result<(), JournalError> {
            panic!("disk on fire")
        }
        fn record(&self, _: FinishedOperation) -> Result<(), JournalError> {
            Ok(())
        }
    }

    fn admitted(n: u128) -> AdmittedOperation {
        AdmittedOperation {
            id: taskd_core::OperationId(uuid::Uuid::from_u128(n)),
            fingerprint: taskd_core::ledger::RequestFingerprint::of(&[]),
        }
    }

    #[actix_rt::test]
    async fn writes_land_in_order_and_a_panic_is_a_failed_write() {
        let memory = Arc::new(MemoryJournal::default());
        let w = JournalWriter::spawn(memory.clone(), Duration::from_secs(30));
        let first = w.write(vec![Write::Admit(admitted(1))]);
        let second = w.write(vec![Write::Admit(admitted(2)), Write::Flush]);
        assert_eq!(first.await, None);
        assert_eq!(second.await, None);
        assert_eq!(memory.interrupted(), [admitted(1), admitted(2)]);
        drop(w);

        let w = JournalWriter::spawn(Arc::new(Panicking), Duration::from_secs(30));
        let why = w.write(vec![Write::Admit(admitted(3))]).await;
        let why = why.expect("a panic is a failure");
        assert!(why.contains("disk on fire"), "{why}");
        assert_eq!(
            w.write(vec![Write::Flush]).await,
            None,
            "the thread lives on"
        );
        assert_eq!(
            w.thread.as_ref().unwrap().thread().name(),
            Some("taskd-journal")
        );
    }

    /// A journal whose admissions block until the test lets them go (a frozen file system).
    struct Frozen(std::sync::Mutex<mpsc::Receiver<()>>);

    impl OperationJournal for Frozen {
        fn load(&self) -> Vec<FinishedOperation> {
            Vec::new()
        }
        fn interrupted(&self) -> Vec<AdmittedOperation> {
            Vec::new()
        }
        fn admit(&self, _: AdmittedOperation) -> Result<(), JournalError> {
            let _ = self.0.lock().unwrap().recv();
            Ok(())
        }
        fn record(&self, _: FinishedOperation) -> Result<(), JournalError> {
            Ok(())
        }
    }

    /// A write that never returns shows as the thread being busy, and a drop of the writer
    /// returns after its bound instead of waiting for the write.
    #[actix_rt::test]
    async fn a_write_that_does_not_return_leaves_the_writer_busy_and_its_drop_bounded() {
        let (thaw, frozen) = mpsc::channel();
        let bound = Duration::from_millis(200);
        let w = JournalWriter::spawn(Arc::new(Frozen(std::sync::Mutex::new(frozen))), bound);
        assert_eq!(w.busy_for(), None, "idle");
        let stuck = w.write(vec![Write::Admit(admitted(1))]);
        assert!(w.busy_for().is_some(), "a write handed over is under way");
        let waited = tokio::time::timeout(bound, stuck).await;
        assert!(waited.is_err(), "the write does not return while frozen");
        assert!(w.busy_for().is_some_and(|t| t >= bound));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(w);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the drop returned with the write still frozen");
        let _ = thaw.send(());
    }
}
