//! Work on a thread of its own, with a runtime of its own, that stops when told: the ClusterD
//! client, the control API's server and the metrics endpoint ([`Background::spawn`], a tokio
//! runtime), a [`LocalJob`](crate::LocalJob)'s actors, a [`RemoteWorker`](crate::RemoteWorker)
//! and the C ABI's roles ([`Background::spawn_actix`], an actix system), whatever runtime (or
//! none) their caller has. Each is a `run(listener, stop)`-shaped future; this owns the
//! thread, the runtime, the stop signal and the join, and says when the work panicked.

use parking_lot::Mutex;
use std::any::Any;
use std::future::Future;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// The work of a [`Background`] thread panicked; its thread is gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thread {thread} panicked: {message}")]
pub struct Panicked {
    /// The thread's name.
    pub thread: String,
    /// The panic's message (or a placeholder when it was not text).
    pub message: String,
}

/// A running background thread. The work gets a `oneshot::Receiver<S>`: it resolves with the
/// value of [`Background::request_stop`], or with an error when the handle is dropped or
/// [`stopped`](Background::stop) without one; either way the work is to end. Dropping the
/// handle tells it to stop and waits for it.
pub struct Background<S = ()> {
    name: String,
    stop: Mutex<Option<oneshot::Sender<S>>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: Send + 'static> Background<S> {
    /// Runs `work(stop)` on a thread named `name` with a one-worker tokio runtime.
    pub fn spawn<F, W>(name: &str, work: W) -> std::io::Result<Background<S>>
    where
        W: FnOnce(oneshot::Receiver<S>) -> F + Send + 'static,
        F: Future<Output = ()>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        Self::on_thread(name, move |stop| runtime.block_on(work(stop)))
    }

    /// Runs `work(stop)` on a thread named `name` inside an actix system of its own: actors
    /// started by `work` live until it returns.
    pub fn spawn_actix<F, W>(name: &str, work: W) -> std::io::Result<Background<S>>
    where
        W: FnOnce(oneshot::Receiver<S>) -> F + Send + 'static,
        F: Future<Output = ()>,
    {
        Self::on_thread(name, move |stop| {
            actix_rt::System::new().block_on(work(stop));
        })
    }

    fn on_thread(
        name: &str,
        body: impl FnOnce(oneshot::Receiver<S>) + Send + 'static,
    ) -> std::io::Result<Background<S>> {
        let (tx, rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || body(rx))?;
        Ok(Background {
            name: name.to_owned(),
            stop: Mutex::new(Some(tx)),
            thread: Some(thread),
        })
    }

    /// Tells the work to end, with `why`; returns at once. Only the first request is heard.
    pub fn request_stop(&self, why: S) {
        if let Some(tx) = self.stop.lock().take() {
            let _ = tx.send(why);
        }
    }
}

impl<S> Background<S> {
    /// Waits for the thread after telling the work to end (without a value, unless
    /// [`request_stop`](Self::request_stop) gave one); `Err` when the work panicked.
    pub fn join(mut self) -> Result<(), Panicked> {
        self.finish()
    }

    /// [`join`](Self::join) for a handle that is kept: a panic is logged, not returned.
    pub fn stop(&mut self) {
        if let Err(p) = self.finish() {
            tracing::error!(thread = %p.thread, panic = %p.message, "background work panicked");
        }
    }

    fn finish(&mut self) -> Result<(), Panicked> {
        drop(self.stop.lock().take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(payload)) => Err(Panicked {
                thread: self.name.clone(),
                message: panic_message(payload.as_ref()),
            }),
            _ => Ok(()),
        }
    }
}

impl<S> Drop for Background<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The text of a panic's payload (a placeholder when it was not text): for every place in
/// this crate that reports a caught panic.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not text)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_gets_the_first_stop_request() {
        let (tx, rx) = std::sync::mpsc::channel();
        let bg = Background::spawn("bg-test", move |stop| async move {
            tx.send(stop.await.ok()).unwrap();
        })
        .unwrap();
        bg.request_stop("first");
        bg.request_stop("second");
        bg.join().unwrap();
        assert_eq!(rx.recv().unwrap(), Some("first"));
    }

    #[test]
    fn dropping_the_handle_stops_the_work_and_waits_for_it() {
        let (tx, rx) = std::sync::mpsc::channel();
        let bg = Background::<()>::spawn_actix("bg-test", move |stop| async move {
            let ended = stop.await.is_err();
            // Inside the actix system: actors could run here.
            assert!(actix::System::try_current().is_some());
            tx.send(ended).unwrap();
        })
        .unwrap();
        drop(bg);
        // The thread is joined: its answer is already there.
        assert_eq!(rx.try_recv(), Ok(true));
    }

    #[test]
    fn a_panic_in_the_work_is_returned_by_join() {
        let bg = Background::<()>::spawn("bg-panics", |_stop| async { panic!("the work broke") })
            .unwrap();
        let err = bg.join().unwrap_err();
        assert_eq!(
            err,
            Panicked {
                thread: "bg-panics".into(),
                message: "the work broke".into(),
            }
        );
    }
}
