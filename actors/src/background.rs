//! Work on a thread of its own, with its own tokio runtime, that stops when told: the ClusterD
//! client, the control API's server and the metrics endpoint run this way, whatever runtime
//! (or none) their caller has. Each is a `run(listener, stop)`-shaped future; this owns the
//! thread, the runtime, the stop signal and the join.

use std::future::Future;
use tokio::sync::oneshot;

/// A running background thread. Dropping it (or [`Background::stop`]) tells it to stop and
/// waits for it.
pub(crate) struct Background {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Runs `work(stop)` on a thread named `name` with a one-worker runtime; `stop` resolves
    /// when the work is to end.
    pub(crate) fn spawn<F, W>(name: &str, work: W) -> std::io::Result<Background>
    where
        W: FnOnce(oneshot::Receiver<()>) -> F + Send + 'static,
        F: Future<Output = ()>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        let (tx, rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || runtime.block_on(work(rx)))?;
        Ok(Background {
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// Tells the work to end and waits for its thread.
    pub(crate) fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}
