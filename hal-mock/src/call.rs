//! How a simulated HCCL call waits: as a thread blocked in a C call, or as a task.
//!
//! A rendezvous (a NIC set, an all-reduce) completes when the last member arrives. Each call is
//! a small state machine the fabric advances under its lock ([`Progress`]): it answers at once,
//! or it leaves its waker where the event it waits for will happen and says until when it
//! waits. [`block_on`] runs one on the calling thread, parked between polls, which is what the
//! blocking [`taskd_core::RankHal`] calls do; [`drive`] runs one as a future on a tokio
//! runtime, so thousands of simulated ranks wait in collectives without a thread each.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};
use std::time::Instant;

/// Where a call stands after a poll.
pub(crate) enum Progress<T> {
    /// Answered.
    Done(T),
    /// Waiting: woken through the waker it left, or by `until` (`None`: no deadline).
    Wait(Option<Instant>),
}

/// Wakes a thread parked in [`block_on`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a call to its answer on this thread. `poll(waker, now)` advances it.
pub(crate) fn block_on<T>(mut poll: impl FnMut(&Waker, Instant) -> Progress<T>) -> T {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    loop {
        let now = Instant::now();
        match poll(&waker, now) {
            Progress::Done(t) => return t,
            // A wake-up before the park is kept by the thread's token: nothing is lost.
            Progress::Wait(None) => std::thread::park(),
            Progress::Wait(Some(until)) => {
                if let Some(left) = until.checked_duration_since(now) {
                    std::thread::park_timeout(left);
                }
            }
        }
    }
}

/// Runs a call to its answer as a future (on a tokio runtime with its timer enabled).
pub(crate) async fn drive<T>(mut poll: impl FnMut(&Waker, Instant) -> Progress<T>) -> T {
    let mut sleep: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // A deadline the timer has fired for counts as passed, whatever the clock says.
    let mut passed: Option<Instant> = None;
    std::future::poll_fn(move |cx| loop {
        let now = passed.map_or_else(Instant::now, |p| p.max(Instant::now()));
        let until = match poll(cx.waker(), now) {
            Progress::Done(t) => return Poll::Ready(t),
            Progress::Wait(None) => return Poll::Pending,
            Progress::Wait(Some(until)) => until,
        };
        let at = tokio::time::Instant::from_std(until);
        let timer = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        passed = Some(until);
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_blocked_call_answers_once_woken_or_at_its_deadline() {
        let slot: Arc<parking_lot::Mutex<(bool, Option<Waker>)>> = Default::default();
        let s = slot.clone();
        let t = std::thread::spawn(move || {
            block_on(|w, _| {
                let mut g = s.lock();
                if g.0 {
                    Progress::Done("woken")
                } else {
                    g.1 = Some(w.clone());
                    Progress::Wait(None)
                }
            })
        });
        loop {
            let mut g = slot.lock();
            if let Some(w) = g.1.take() {
                g.0 = true;
                w.wake();
                break;
            }
            drop(g);
            std::thread::yield_now();
        }
        assert_eq!(t.join().unwrap(), "woken");
        let until = Instant::now() + Duration::from_millis(20);
        let got = block_on(|_, now| {
            if now >= until {
                Progress::Done(now)
            } else {
                Progress::Wait(Some(until))
            }
        });
        assert!(got >= until);
    }

    #[test]
    fn a_driven_call_answers_at_its_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let until = Instant::now() + Duration::from_millis(20);
        let got = rt.block_on(drive(|_, now| {
            if now >= until {
                Progress::Done(true)
            } else {
                Progress::Wait(Some(until))
            }
        }));
        assert!(got && Instant::now() >= until);
    }
}
