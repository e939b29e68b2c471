//! Who waits for what from the manager: an operation's result, a verification round's report,
//! a registration count (or every rank registered and verified), every rank out of its NIC-set
//! calls. [`Waiters`] owns the four lists; the manager says when something happened and the
//! waiters whose condition holds are answered (a waiter that went away is skipped).

use std::collections::HashMap;
use taskd_core::operation::OperationReport;
use taskd_core::verify::VerifyReport;
use taskd_core::OperationId;
use tokio::sync::oneshot;

/// Waiters for a value that belongs to one operation or round id.
struct ById<T>(HashMap<OperationId, Vec<oneshot::Sender<T>>>);

impl<T> Default for ById<T> {
    fn default() -> Self {
        ById(HashMap::new())
    }
}

impl<T: Clone> ById<T> {
    fn wait(&mut self, id: OperationId) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        self.0.entry(id).or_default().push(tx);
        rx
    }

    fn answer(&mut self, id: OperationId, value: &T) {
        for w in self.0.remove(&id).unwrap_or_default() {
            let _ = w.send(value.clone());
        }
    }
}

/// Everyone waiting for something from the manager.
#[derive(Default)]
pub(super) struct Waiters {
    /// For an operation's final result.
    results: ById<OperationReport>,
    /// For a registered-worker count (`None`: every worker registered and the job's NIC
    /// configuration verified).
    registered: Vec<(Option<usize>, oneshot::Sender<()>)>,
    /// For every rank to answer the NIC-set phase the last operation ended in.
    calls: Vec<oneshot::Sender<()>>,
    /// For a verification round's report.
    rounds: ById<VerifyReport>,
}

impl Waiters {
    /// Waits for the final result of operation `id`.
    pub(super) fn result(&mut self, id: OperationId) -> oneshot::Receiver<OperationReport> {
        self.results.wait(id)
    }

    /// Answers whoever waits for `report`'s operation.
    pub(super) fn finished(&mut self, report: &OperationReport) {
        self.results.answer(report.id, report);
    }

    /// Waits for the report of verification round `id`.
    pub(super) fn round(&mut self, id: OperationId) -> oneshot::Receiver<VerifyReport> {
        self.rounds.wait(id)
    }

    /// Answers whoever waits for `report`'s round.
    pub(super) fn round_done(&mut self, report: &VerifyReport) {
        self.rounds.answer(report.id, report);
    }

    /// Waits for exactly `want` registered workers (`None`: every one, and verified).
    pub(super) fn registered(&mut self, want: Option<usize>) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.registered.push((want, tx));
        rx
    }

    /// Answers the registration waiters whose condition holds with `n` of `all` workers
    /// registered, and the NIC configuration `verified` (with no round running) or not.
    pub(super) fn wake_registered(&mut self, n: usize, all: usize, verified: bool) {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.registered)
            .into_iter()
            .partition(|(want, _)| match want {
                Some(want) => *want == n,
                None => n == all && verified,
            });
        self.registered = waiting;
        for (_, tx) in ready {
            let _ = tx.send(());
        }
    }

    /// Waits for every rank to be out of its NIC-set calls.
    pub(super) fn calls(&mut self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.calls.push(tx);
        rx
    }

    /// Answers the calls waiters: no rank is left inside calls.
    pub(super) fn calls_answered(&mut self) {
        for tx in self.calls.drain(..) {
            let _ = tx.send(());
        }
    }
}
