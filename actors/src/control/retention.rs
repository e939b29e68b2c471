//! The job's last final result, kept for a subscription that comes after the operation ended.
//!
//! taskd's operations take milliseconds, so a platform that calls `SubscribeSwitchNicSignal`
//! right after `SwitchNicTrack` often finds the operation over. ClusterD would answer "not
//! switching"; taskd delivers the last result instead, as long as no other operation has started
//! since and it finished at most [`RESULT_RETENTION`] ago.
//!
//! `LastResult` reads the manager's progress feed: an operation's `Started` forgets the last
//! result, its `Finished` remembers the id with the time it was read, on the control server's
//! [`Clock`]. The feed is drained both by a task woken on every event and by each subscription
//! before it asks (so a result published just before is never missed); a feed that lagged forgets
//! rather than guess.

use crate::progress::{ProgressEvent, ProgressKind};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd_core::OperationId;
use tokio::sync::broadcast::{self, error::TryRecvError};

/// How long after it finished an operation's result is still delivered to a new subscription
/// (unless another operation started since).
pub const RESULT_RETENTION: Duration = Duration::from_secs(60);

/// Where the control server reads the time: the system's monotonic clock, or one a test moves.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Instant + Send + Sync>);

impl Clock {
    /// The system's monotonic clock.
    pub fn system() -> Clock {
        Clock(Arc::new(Instant::now))
    }

    /// A clock that reads `now()`.
    pub fn from_fn(now: impl Fn() -> Instant + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// A clock that stands still until [`ManualClock::advance`] moves it.
    pub fn manual() -> (Clock, ManualClock) {
        let base = Instant::now();
        let offset = Arc::new(Mutex::new(Duration::ZERO));
        let read = offset.clone();
        (
            Clock::from_fn(move || base + *read.lock()),
            ManualClock { offset },
        )
    }

    /// The time now.
    pub fn now(&self) -> Instant {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// The handle that moves a [`Clock::manual`].
#[derive(Clone, Debug)]
pub struct ManualClock {
    offset: Arc<Mutex<Duration>>,
}

impl ManualClock {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.offset.lock() += by;
    }
}

struct State {
    feed: broadcast::Receiver<ProgressEvent>,
    last: Option<(OperationId, Instant)>,
}

/// The last finished operation and when it finished, read from the progress feed.
#[derive(Clone)]
pub(crate) struct LastResult {
    state: Arc<Mutex<State>>,
    clock: Clock,
}

impl LastResult {
    pub(crate) fn new(feed: broadcast::Receiver<ProgressEvent>, clock: Clock) -> LastResult {
        LastResult {
            state: Arc::new(Mutex::new(State { feed, last: None })),
            clock,
        }
    }

    /// Reads every event published so far.
    pub(crate) fn pump(&self) {
        let mut s = self.state.lock();
        loop {
            match s.feed.try_recv() {
                Ok(ev) => match ev.kind {
                    ProgressKind::Started { .. } => s.last = None,
                    ProgressKind::Finished(r) => s.last = Some((r.id, self.clock.now())),
                    _ => {}
                },
                // Events were lost: an operation may have started unseen.
                Err(TryRecvError::Lagged(_)) => s.last = None,
                Err(TryRecvError::Empty) | Err(TryRecvError::Closed) => return,
            }
        }
    }

    /// The id of the operation whose result a subscription arriving now may still get:
    /// the last one finished, if nothing started since and it is at most
    /// [`RESULT_RETENTION`] old.
    pub(crate) fn deliverable(&self) -> Option<OperationId> {
        self.pump();
        let now = self.clock.now();
        let s = self.state.lock();
        s.last
            .filter(|(_, at)| now.saturating_duration_since(*at) <= RESULT_RETENTION)
            .map(|(id, _)| id)
    }

    /// Keeps the record current while nobody asks: pumps on every event until the feed
    /// closes (the manager stopped).
    pub(crate) async fn follow(self, mut wake: broadcast::Receiver<ProgressEvent>) {
        use broadcast::error::RecvError;
        loop {
            match wake.recv().await {
                Ok(_) | Err(RecvError::Lagged(_)) => self.pump(),
                Err(RecvError::Closed) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::ProgressFeed;
    use taskd_core::command::Direction;
    use taskd_core::operation::{OperationReport, Outcome};
    use taskd_core::JobId;

    fn report(id: OperationId) -> OperationReport {
        OperationReport {
            applied: true,
            pause_step: Some(1),
            ..OperationReport::new(id, Direction::ToBackup, Vec::new(), Outcome::Succeeded)
        }
    }

    fn started() -> ProgressKind {
        ProgressKind::Started {
            job: JobId("j".into()),
            direction: Direction::ToBackup,
            targets: Vec::new(),
            ranks: 1,
        }
    }

    #[test]
    fn the_last_result_lasts_its_window_and_no_longer_than_the_next_start() {
        let feed = ProgressFeed::new();
        let (clock, hand) = Clock::manual();
        let last = LastResult::new(feed.subscribe(), clock);
        let (a, b) = (
            OperationId(uuid::Uuid::from_u128(1)),
            OperationId(uuid::Uuid::from_u128(2)),
        );
        assert_eq!(last.deliverable(), None);
        feed.publish(a, Duration::ZERO, started());
        assert_eq!(last.deliverable(), None, "in flight, not finished");
        feed.publish(
            a,
            Duration::ZERO,
            ProgressKind::Finished(Box::new(report(a))),
        );
        assert_eq!(last.deliverable(), Some(a));
        hand.advance(RESULT_RETENTION);
        assert_eq!(last.deliverable(), Some(a), "kept for the whole window");
        hand.advance(Duration::from_millis(1));
        assert_eq!(last.deliverable(), None, "and not after it");

        feed.publish(b, Duration::ZERO, started());
        feed.publish(
            b,
            Duration::ZERO,
            ProgressKind::Finished(Box::new(report(b))),
        );
        assert_eq!(last.deliverable(), Some(b));
        let c = OperationId(uuid::Uuid::from_u128(3));
        feed.publish(c, Duration::ZERO, started());
        assert_eq!(last.deliverable(), None, "another operation started");
    }
}
