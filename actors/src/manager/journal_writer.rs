//! The manager's journal writes, on a thread of their own: a journal's write ends in two
//! `fsync`s (the file, then its directory), which take seconds on a busy disk, and the
//! manager's actor shares its thread with the transport's server (its proxies' heartbeats and
//! registrations) and the control API. The manager hands each batch of records to
//! [`JournalWriter::write`] and waits for the answer without blocking its thread
//! (`ctx.wait`: it handles nothing else meanwhile, so the order of its records, directives
//! and results is kept).
//!
//! The thread (`taskd-journal`) writes the batches in the order they come, is joined when the
//! writer is dropped, and a write that panics is answered as a failed write naming the panic.

use crate::background::panic_message;
use crate::journal::OperationJournal;
use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use taskd_core::ledger::{AdmittedOperation, FinishedOperation};
use tokio::sync::oneshot;

/// One record for the journal.
pub(super) enum Write {
    /// An operation admitted, before its first directive.
    Admit(AdmittedOperation),
    /// A final result, before it is published.
    Record(Box<FinishedOperation>),
    /// Everything held written again, after a failed write.
    Flush,
}

/// A batch and where its answer goes: the last failure's message, `None` when every write of
/// the batch is durable.
type Batch = (Vec<Write>, oneshot::Sender<Option<String>>);

/// The journal and the thread that writes it.
pub(super) struct JournalWriter {
    journal: Arc<dyn OperationJournal>,
    batches: Option<mpsc::Sender<Batch>>,
    thread: Option<JoinHandle<()>>,
}

impl JournalWriter {
    /// Starts the thread that writes `journal`; panics, as `std::thread::spawn` does, when the
    /// system cannot start a thread.
    pub(super) fn spawn(journal: Arc<dyn OperationJournal>) -> JournalWriter {
        let (tx, rx) = mpsc::channel::<Batch>();
        let theirs = journal.clone();
        let thread = std::thread::Builder::new()
            .name("taskd-journal".into())
            .spawn(move || {
                for (writes, done) in rx {
                    // Every write, in order; the last failure is the answer.
                    let failed = writes
                        .into_iter()
                        .fold(None, |last, w| write_one(theirs.as_ref(), w).or(last));
                    let _ = done.send(failed);
                }
            })
            .expect("the system cannot start the journal's writer thread");
        JournalWriter {
            journal,
            batches: Some(tx),
            thread: Some(thread),
        }
    }

    /// The journal written.
    pub(super) fn journal(&self) -> &Arc<dyn OperationJournal> {
        &self.journal
    }

    /// Hands `writes` to the thread; resolves, without blocking, once they are written: `None`
    /// when all are durable, else the last failure (a thread that is gone is one).
    pub(super) fn write(
        &self,
        writes: Vec<Write>,
    ) -> impl std::future::Future<Output = Option<String>> + 'static {
        let (done, answer) = oneshot::channel();
        let sent = self
            .batches
            .as_ref()
            .is_some_and(|b| b.send((writes, done)).is_ok());
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
    fn drop(&mut self) {
        drop(self.batches.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the journal's writer thread panicked");
            }
        }
    }
}

/// Writes one record; its failure's message, logged with what it means for the operation.
fn write_one(journal: &dyn OperationJournal, w: Write) -> Option<String> {
    const ADMISSION: &str = "the admission is not journaled: were this manager to stop before the result, its uuid would run again; nothing new starts until the journal can be written";
    const RESULT: &str = "the result is not journaled: after a restart its uuid would run again; nothing new starts until the journal can be written";
    let lost = match &w {
        Write::Admit(op) => Some((op.id, ADMISSION)),
        Write::Record(op) => Some((op.report.id, RESULT)),
        Write::Flush => None,
    };
    let res = std::panic::catch_unwind(AssertUnwindSafe(|| match w {
        Write::Admit(op) => journal.admit(op),
        Write::Record(op) => journal.record(*op),
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
        let w = JournalWriter::spawn(memory.clone());
        let first = w.write(vec![Write::Admit(admitted(1))]);
        let second = w.write(vec![Write::Admit(admitted(2)), Write::Flush]);
        assert_eq!(first.await, None);
        assert_eq!(second.await, None);
        assert_eq!(memory.interrupted(), [admitted(1), admitted(2)]);
        drop(w);

        let w = JournalWriter::spawn(Arc::new(Panicking));
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
}
