//! A role's state as the C caller's threads see it: a value under a lock, and a wait for a
//! condition on it (with a deadline or without), woken by every change.

use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// `S`, shared between the role's thread (which changes it) and callers (which wait on it).
pub struct Shared<S> {
    state: Mutex<S>,
    changed: Condvar,
}

impl<S> Shared<S> {
    /// A shared `initial`.
    pub fn new(initial: S) -> Self {
        Shared {
            state: Mutex::new(initial),
            changed: Condvar::new(),
        }
    }

    /// Changes the state and wakes every waiter.
    pub fn update(&self, f: impl FnOnce(&mut S)) {
        f(&mut self.state.lock());
        self.changed.notify_all();
    }

    /// Reads the state.
    pub fn read<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.state.lock())
    }

    /// Waits until `done` answers, or `timeout` (`None`: no deadline) passes (then `None`).
    pub fn wait_for<R>(
        &self,
        timeout: Option<Duration>,
        mut done: impl FnMut(&S) -> Option<R>,
    ) -> Option<R> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut s = self.state.lock();
        loop {
            if let Some(r) = done(&s) {
                return Some(r);
            }
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut s, d).timed_out() {
                        return done(&s);
                    }
                }
                None => self.changed.wait(&mut s),
            }
        }
    }
}

/// A timeout in milliseconds from C: `u64::MAX` waits for ever.
pub fn timeout_ms(ms: u64) -> Option<Duration> {
    (ms != u64::MAX).then(|| Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_sees_the_change_or_times_out() {
        let s = Arc::new(Shared::new(0u32));
        assert_eq!(
            s.wait_for(Some(Duration::from_millis(1)), |v| (*v > 0).then_some(*v)),
            None
        );
        let setter = s.clone();
        let t = std::thread::spawn(move || setter.update(|v| *v = 7));
        assert_eq!(s.wait_for(None, |v| (*v > 0).then_some(*v)), Some(7));
        t.join().unwrap();
        assert_eq!(s.read(|v| *v), 7);
        assert_eq!(timeout_ms(u64::MAX), None);
        assert_eq!(timeout_ms(5), Some(Duration::from_millis(5)));
    }
}
