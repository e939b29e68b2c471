//! Where a worker's HAL calls run.
//!
//! HCCL's calls are blocking C calls, strictly sequential per rank, made from a thread whose
//! device context is set. In production a process is one rank and its worker gives those calls
//! a thread of their own ([`WorkerHal::Thread`]). A process that hosts many simulated ranks
//! (the simulator, the benchmarks) cannot give each two threads (the training loop's and the
//! HAL's): at 16,384 ranks that is 32,768 stacks and more memory maps than a process may have.
//! There a rank's HAL runs
//!
//! - on a [`HalPool`] shared by the process's workers, a few threads ([`WorkerHal::Pool`]), for
//!   a blocking HAL whose calls never wait for another rank (the single-rank mock), or
//! - as a task ([`WorkerHal::Task`]), for a HAL whose calls are futures ([`TaskRankHal`]): the
//!   simulated fabric's NIC set, a rendezvous of every member of a group, which a bounded pool
//!   of threads could never complete for a group larger than the pool.
//!
//! Whichever it is, one worker's calls stay strictly sequential: the worker hands its HAL one
//! job at a time and waits for the job to end before the next.

use std::future::Future;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use taskd_core::{
    GroupInfo, GroupRank, HalError, HalFuture, HcclCapabilities, RankHal, TaskRankHal,
};

/// A blocking HAL seen as a [`TaskRankHal`]: each call runs, on the thread that polls it, when
/// its future is first polled. Only for a thread that may block: a HAL thread or a pool's.
pub(crate) struct Blocking<'h>(pub &'h mut dyn RankHal);

impl TaskRankHal for Blocking<'_> {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        self.0.groups()
    }

    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a> {
        let hal = &mut *self.0;
        Box::pin(async move { hal.set_working_nic(group, ranks, use_backup) })
    }

    fn capabilities(&mut self) -> HcclCapabilities {
        self.0.capabilities()
    }

    fn set_call_timeout(&mut self, timeout: std::time::Duration) {
        self.0.set_call_timeout(timeout)
    }
}

/// How a worker runs its rank's HAL.
pub enum WorkerHal {
    /// A blocking HAL on a thread of the worker's own: a rank's process in production.
    Thread(Box<dyn RankHal>),
    /// A blocking HAL whose calls never wait for another rank, on a pool shared by many
    /// workers of one process.
    Pool(Box<dyn RankHal>, HalPool),
    /// A HAL whose calls are futures, run as a task of the worker's actor system.
    Task(Box<dyn TaskRankHal>),
}

impl From<Box<dyn RankHal>> for WorkerHal {
    fn from(hal: Box<dyn RankHal>) -> Self {
        WorkerHal::Thread(hal)
    }
}

impl WorkerHal {
    /// The HAL's capabilities, asked on the calling thread (before the worker starts).
    pub fn capabilities(&mut self) -> HcclCapabilities {
        match self {
            WorkerHal::Thread(h) | WorkerHal::Pool(h, _) => h.capabilities(),
            WorkerHal::Task(h) => h.capabilities(),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed number of threads that run blocking HAL jobs for many workers of one process. The
/// threads end when the last handle is dropped and the queue is empty.
#[derive(Clone)]
pub struct HalPool {
    jobs: mpsc::Sender<Job>,
    threads: usize,
}

impl std::fmt::Debug for HalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalPool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl HalPool {
    /// A pool of `threads` threads (at least one), named `{name}-{i}`.
    ///
    /// # Errors
    /// When a thread cannot be started.
    pub fn new(name: &str, threads: usize) -> std::io::Result<HalPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        let threads = threads.max(1);
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })?;
        }
        Ok(HalPool { jobs: tx, threads })
    }

    /// Runs `job` on one of the pool's threads. `false` when the pool is gone.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.jobs.send(Box::new(job)).is_ok()
    }
}

/// Wakes a thread blocked in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on this thread (a HAL thread: it may block).
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_runs_jobs_on_its_threads_and_ends_with_its_last_handle() {
        let pool = HalPool::new("test-hal", 2).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..8 {
            let tx = tx.clone();
            assert!(pool.run(move || {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((i, name)).unwrap();
            }));
        }
        let mut got: Vec<_> = (0..8).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got.len(), 8);
        assert!(got
            .iter()
            .all(|(_, n)| n.as_deref().is_some_and(|n| n.starts_with("test-hal-"))));
        assert_eq!(block_on(async { 7 }), 7);
    }
}
