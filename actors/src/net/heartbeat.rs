//! Liveness of the peer of one connection: when did we last hear from it?
//!
//! Both sides send a heartbeat every interval; any frame counts as a sign of life. The peer is
//! lost after `missed` intervals of silence. While our own side is busy handing a message to a
//! slow actor we are not reading, so silence then is ours, not the peer's: it does not count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct Liveness {
    start: Instant,
    /// Milliseconds after `start` of the last frame heard.
    last_heard_ms: AtomicU64,
    busy: AtomicBool,
    interval: Duration,
    missed: u32,
}

impl Liveness {
    pub(crate) fn new(interval: Duration, missed: u32) -> Self {
        Liveness {
            start: Instant::now(),
            last_heard_ms: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            interval,
            missed: missed.max(1),
        }
    }

    /// How often to send a heartbeat (and to check the peer's).
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// A frame arrived.
    pub(crate) fn heard(&self) {
        self.last_heard_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Our side is (or no longer is) busy delivering a received message.
    pub(crate) fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Relaxed);
        if !busy {
            self.heard();
        }
    }

    pub(crate) fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// The silence that makes the peer lost.
    pub(crate) fn limit(&self) -> Duration {
        self.interval * self.missed
    }

    /// Whether the peer missed `missed` heartbeats in a row.
    pub(crate) fn is_lost(&self) -> bool {
        !self.busy.load(Ordering::Relaxed) && self.silent_for() > self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_beyond_the_limit_is_loss_unless_we_are_busy() {
        let l = Liveness::new(Duration::from_millis(1), 2);
        assert_eq!(l.limit(), Duration::from_millis(2));
        l.heard();
        assert!(!l.is_lost());
        std::thread::sleep(Duration::from_millis(5)); // let the clock pass the limit
        assert!(l.is_lost());
        l.set_busy(true);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!l.is_lost());
        l.set_busy(false);
        assert!(!l.is_lost());
    }
}
