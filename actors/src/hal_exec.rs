//! Where a worker's HAL calls run.
//!
//! A worker holds one [`TaskRankHal`] and awaits its calls on its actor's thread, one job at a
//! time, so one rank's calls stay strictly sequential and the actor never blocks in one.
//! HCCL's calls are blocking C calls, made from a thread whose device context is set: a
//! blocking [`RankHal`] becomes a [`TaskRankHal`] through [`ThreadedRankHal`], a thread of its
//! own that owns the HAL and makes its calls in the order they were asked. The simulated
//! fabric's HAL is a [`TaskRankHal`] itself (its NIC set is a rendezvous of every member of a
//! group, a parked future rather than a blocked thread), so a process can host thousands of
//! simulated ranks.
//!
//! A HAL that panics is out of service: the panic is caught (`caught`) and surfaced as a
//! [`HalPanicked`], which the worker reports as its rank's failure, for the call that
//! panicked and every later one.

use crate::background::panic_message;
use parking_lot::Mutex;
use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::Poll;
use std::time::Duration;
use taskd_core::{
    GlobalRank, GroupRank, GroupsFuture, HalFuture, RankHal, SwitchCapabilities, TaskRankHal,
};
use tokio::sync::oneshot;

/// A HAL panicked: its calls fail from then on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the HAL panicked{}: {message}", thread.as_ref().map(|t| format!(" on thread {t}")).unwrap_or_default())]
pub struct HalPanicked {
    /// The HAL's own thread, for a [`ThreadedRankHal`].
    pub thread: Option<String>,
    /// The panic's message.
    pub message: String,
}

impl HalPanicked {
    /// The panic that unwound with `payload`: a [`HalPanicked`] passed on as it is, else the
    /// message of a `panic!`.
    pub fn from_payload(payload: Box<dyn Any + Send>) -> HalPanicked {
        match payload.downcast::<HalPanicked>() {
            Ok(p) => *p,
            Err(payload) => HalPanicked {
                thread: None,
                message: panic_message(&*payload),
            },
        }
    }
}

/// Runs `fut`; a panic while it is polled ends it with the [`HalPanicked`] it carried.
pub(crate) async fn caught<F: Future>(fut: F) -> Result<F::Output, HalPanicked> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(
        move |cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(HalPanicked::from_payload(payload))),
        },
    )
    .await
}

/// One call for the HAL's thread, which says through the flag when it is inside the HAL;
/// `Err` with the panic's message when the HAL panicked.
type Job = Box<dyn FnOnce(&mut dyn RankHal, &AtomicBool) -> Result<(), String> + Send>;

/// What the adapter and its thread share.
struct Shared {
    name: String,
    /// The thread is inside a HAL call (so a drop does not wait for it); cleared before the
    /// call's answer is sent, so a caller that has its answer never finds it set for that call.
    in_call: AtomicBool,
    /// Why the thread ended: set before it drops its queue.
    panic: Mutex<Option<String>>,
}

impl Shared {
    /// The panic that ended the thread, as a caller sees it.
    fn panicked(&self, message: Option<String>) -> HalPanicked {
        let message = message
            .or_else(|| self.panic.lock().clone())
            .unwrap_or_else(|| "its thread ended".into());
        HalPanicked {
            thread: Some(self.name.clone()),
            message,
        }
    }

    /// The answer on `rx` (see [`Shared::settle`]).
    async fn answer<T>(self: Arc<Self>, rx: oneshot::Receiver<Result<T, String>>) -> T {
        let got = rx.await;
        self.settle(got)
    }

    /// The answer the thread sent; a panic of the HAL (the panic's message, or no answer at
    /// all) unwinds the caller with a [`HalPanicked`].
    fn settle<T, E>(&self, got: Result<Result<T, String>, E>) -> T {
        match got {
            Ok(Ok(v)) => v,
            Ok(Err(message)) => resume_unwind(Box::new(self.panicked(Some(message)))),
            Err(_) => resume_unwind(Box::new(self.panicked(None))),
        }
    }
}

/// A blocking [`RankHal`] on a thread of its own, seen as a [`TaskRankHal`]: each call is
/// handed to the thread and its answer awaited, so whoever awaits it never blocks (only
/// [`TaskRankHal::capabilities`], asked once at a worker's start, waits for the thread). The
/// thread makes the calls in the order they were asked and ends when the adapter is dropped:
/// the drop joins it, unless a call is still in progress (a HAL blocked past its deadline),
/// which the thread finishes on its own before it drops the HAL.
pub struct ThreadedRankHal {
    calls: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl ThreadedRankHal {
    /// Moves `hal` onto a new thread named `name`.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn spawn(name: String, hal: Box<dyn RankHal>) -> std::io::Result<ThreadedRankHal> {
        let shared = Arc::new(Shared {
            name: name.clone(),
            in_call: AtomicBool::new(false),
            panic: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let on_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || serve(hal, rx, &on_thread))?;
        Ok(ThreadedRankHal {
            calls: Some(tx),
            thread: Some(thread),
            shared,
        })
    }

    /// Rank `rank`'s HAL on its thread, `taskd-hal-{rank}`.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn for_rank(rank: GlobalRank, hal: Box<dyn RankHal>) -> std::io::Result<ThreadedRankHal> {
        Self::spawn(format!("taskd-hal-{}", rank.0), hal)
    }

    /// Queues `f` for the thread, made inside the caller's span; its answer (or the panic's
    /// message) comes on the receiver. A call whose receiver is gone by the time the thread
    /// comes to it is not made.
    fn ask<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn RankHal) -> T + Send + 'static,
    ) -> oneshot::Receiver<Result<T, String>> {
        let (tx, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.queue(Box::new(move |hal, in_call| {
            if tx.is_closed() {
                return Ok(());
            }
            let _entered = span.enter();
            make_call((hal, in_call), f, |out| drop(tx.send(out)))
        }));
        rx
    }

    /// Queues `job`; dropped unrun (its answer's sender with it) when the thread is gone.
    fn queue(&self, job: Job) {
        if let Some(calls) = &self.calls {
            let _ = calls.send(job);
        }
    }
}

/// Makes `f` on `hal`, with `in_call` set meanwhile, and hands its answer, or the panic's
/// message, to `deliver`; `Err` with that message when the HAL panicked.
fn make_call<T>(
    (hal, in_call): (&mut dyn RankHal, &AtomicBool),
    f: impl FnOnce(&mut dyn RankHal) -> T,
    deliver: impl FnOnce(Result<T, String>),
) -> Result<(), String> {
    in_call.store(true, Ordering::SeqCst);
    let out = catch_unwind(AssertUnwindSafe(|| f(hal))).map_err(|p| panic_message(&*p));
    in_call.store(false, Ordering::SeqCst);
    let failed = out.as_ref().err().cloned();
    deliver(out);
    failed.map_or(Ok(()), Err)
}

/// The HAL's thread: makes the calls in turn until the adapter is gone or the HAL panicked.
fn serve(mut hal: Box<dyn RankHal>, calls: mpsc::Receiver<Job>, shared: &Shared) {
    while let Ok(job) = calls.recv() {
        if let Err(message) = job(hal.as_mut(), &shared.in_call) {
            tracing::error!(thread = %shared.name, panic = %message, "the HAL panicked: it makes no more calls");
            *shared.panic.lock() = Some(message);
            // Its state is unknown after a panic: dropped, and a panic in its drop kept here.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(hal)));
            return;
        }
    }
}

impl TaskRankHal for ThreadedRankHal {
    fn groups(&mut self) -> GroupsFuture<'_> {
        let rx = self.ask(|hal| hal.groups());
        Box::pin(self.shared.clone().answer(rx))
    }

    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a> {
        let (group, ranks, use_backup) = (group.to_owned(), ranks.to_vec(), use_backup.to_vec());
        let rx = self.ask(move |hal| hal.set_working_nic(&group, &ranks, &use_backup));
        Box::pin(self.shared.clone().answer(rx))
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        let (tx, rx) = mpsc::sync_channel(1);
        self.queue(Box::new(move |hal, in_call| {
            make_call(
                (hal, in_call),
                |hal| hal.capabilities(),
                |out| drop(tx.send(out)),
            )
        }));
        self.shared.settle(rx.recv())
    }

    fn set_call_timeout(&mut self, timeout: Duration) {
        self.queue(Box::new(move |hal, in_call| {
            make_call((hal, in_call), |hal| hal.set_call_timeout(timeout), drop)
        }));
    }
}

impl Drop for ThreadedRankHal {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it is out of its current call; calls still
        // queued have no one awaiting them and are not made.
        drop(self.calls.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.shared.in_call.load(Ordering::SeqCst) {
            tracing::warn!(thread = %self.shared.name, "the HAL is still in a call: its thread ends when the call returns");
        } else {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::{GroupInfo, HalError};

    /// A HAL answering from the test's channels: one group, a NIC set that waits for `go`.
    struct Probe {
        go: mpsc::Receiver<()>,
        seen: mpsc::Sender<String>,
        panic_on: Option<&'static str>,
    }

    impl RankHal for Probe {
        fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            self.seen.send(format!("groups on {name}")).unwrap();
            Ok(vec![GroupInfo {
                name: "g".into(),
                members: vec![GlobalRank(0)],
            }])
        }

        fn set_working_nic(
            &mut self,
            group: &str,
            _: &[GroupRank],
            _: &[bool],
        ) -> Result<(), HalError> {
            if self.panic_on == Some(group) {
                panic!("no such communicator: {group}");
            }
            self.seen.send(format!("in {group}")).unwrap();
            self.go.recv().unwrap();
            self.seen.send(format!("set {group}")).unwrap();
            Ok(())
        }

        fn capabilities(&mut self) -> SwitchCapabilities {
            SwitchCapabilities::ALL
        }

        fn set_call_timeout(&mut self, timeout: Duration) {
            self.seen.send(format!("timeout {timeout:?}")).unwrap();
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = self.seen.send("dropped".into());
        }
    }

    fn probe(
        panic_on: Option<&'static str>,
    ) -> (ThreadedRankHal, mpsc::Sender<()>, mpsc::Receiver<String>) {
        let (go_tx, go) = mpsc::channel();
        let (seen, seen_rx) = mpsc::channel();
        let hal = Probe { go, seen, panic_on };
        let hal = ThreadedRankHal::spawn("test-hal-7".into(), Box::new(hal)).unwrap();
        (hal, go_tx, seen_rx)
    }

    fn run<F: Future>(fut: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(fut)
    }

    #[test]
    fn calls_run_in_order_on_the_hals_thread_which_the_drop_joins() {
        let (mut hal, go, seen) = probe(None);
        assert_eq!(hal.capabilities(), SwitchCapabilities::ALL);
        let groups = run(hal.groups()).unwrap();
        assert_eq!(groups[0].name, "g");
        hal.set_call_timeout(Duration::from_millis(750));
        go.send(()).unwrap();
        run(hal.set_working_nic("a", &[GroupRank(0)], &[true])).unwrap();
        drop(hal);
        let got: Vec<String> = seen.try_iter().collect();
        assert_eq!(
            got,
            [
                "groups on test-hal-7",
                "timeout 750ms",
                "in a",
                "set a",
                "dropped"
            ],
            "the drop returned after the thread dropped the HAL"
        );
    }

    #[test]
    fn a_call_that_blocks_leaves_the_caller_free_and_the_drop_does_not_wait_for_it() {
        let (mut hal, go, seen) = probe(None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let waited = rt.block_on(async {
            let mut call = hal.set_working_nic("a", &[GroupRank(0)], &[true]);
            assert_eq!(seen.recv().unwrap(), "in a");
            // The call is on the HAL's thread, waiting for `go`: polling it does not block.
            std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending())).await
        });
        assert!(waited, "the call waits for the HAL");
        drop(hal); // returns while the HAL is still in its call
        go.send(()).unwrap();
        assert_eq!(seen.recv().unwrap(), "set a");
        assert_eq!(
            seen.recv().unwrap(),
            "dropped",
            "the thread ends after the call"
        );
    }

    #[test]
    fn a_panic_in_the_hal_is_reported_for_its_call_and_every_later_one() {
        let (mut hal, _go, seen) = probe(Some("bad"));
        let first = run(caught(hal.set_working_nic("bad", &[GroupRank(0)], &[true])));
        let want = HalPanicked {
            thread: Some("test-hal-7".into()),
            message: "no such communicator: bad".into(),
        };
        assert_eq!(first, Err(want.clone()));
        assert_eq!(
            seen.recv().unwrap(),
            "dropped",
            "a HAL that panicked is dropped"
        );
        assert_eq!(run(caught(hal.groups())).map(drop), Err(want.clone()));
        let later = catch_unwind(AssertUnwindSafe(|| hal.capabilities())).unwrap_err();
        assert_eq!(HalPanicked::from_payload(later), want);
        assert_eq!(
            want.to_string(),
            "the HAL panicked on thread test-hal-7: no such communicator: bad"
        );
    }
}
