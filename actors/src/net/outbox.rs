//! The bounded, acknowledged queue of messages for one peer, and the [`Link`] actors send
//! through.
//!
//! Why it outlives a connection: a message handed to the transport must reach the peer even if
//! the connection drops and the same process reconnects. Each message gets a sequence number
//! and stays queued until the peer acknowledges it; a new connection starts writing again at
//! the first unacknowledged one ([`Outbox::attach`]). The queue is bounded: when `capacity`
//! messages are unacknowledged the peer is not keeping up, [`Outbox::push`] refuses with
//! [`TransportError::Full`] and the connection is reset, so a slow or stuck peer costs at most
//! `capacity` messages of memory, never more.
//!
//! Some messages must survive even a *fresh* session (the peer forgot us, or a new process took
//! its place): a worker's hello, the proxy's "worker up" for each live worker. They are
//! *sticky* and [`Outbox::renew`] queues them again.
//!
//! The queue is behind the network transport's [`Sender`](crate::transport::Sender), the
//! sending half of a [`Link`] an actor holds ([`link`]).

use crate::transport::{Link, Sender, TransportError};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::sync::Notify;

/// Whether a message must be re-sent to a fresh session.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sticky {
    /// An ordinary message: once acknowledged it is forgotten, and a fresh session never
    /// sees it.
    No,
    /// Keep this message under the key (replacing an earlier one).
    Keep(u64),
    /// The message under the key is void (e.g. "worker lost" voids "worker up").
    Drop(u64),
}

/// Classifies messages for [`Sticky`] handling.
pub(crate) type StickyFn<T> = fn(&T) -> Sticky;

struct State<T> {
    next_seq: u64,
    /// Unacknowledged messages, ascending by sequence number.
    queue: VecDeque<(u64, T)>,
    /// The next sequence number the attached connection writes.
    cursor: u64,
    /// Bumped by every attach: a writer of an older connection gets nothing more.
    epoch: u64,
    closed: Option<String>,
    overflowed: bool,
    sticky: BTreeMap<u64, T>,
    high_water: usize,
    /// The connection's stream waiting for a frame ([`Outbox::poll_next`]).
    waiting: Option<Waker>,
}

/// Releases the lock, then wakes the stream waiting for a frame, if any (it will find a frame,
/// a new connection, or the end).
fn unlock_and_wake<T>(mut st: MutexGuard<'_, State<T>>) {
    let waiting = st.waiting.take();
    drop(st);
    if let Some(w) = waiting {
        w.wake();
    }
}

/// The queue of one peer. Share it as `Arc<Outbox<T>>`: the peer's link pushes into it, its
/// connection's stream takes from it.
pub(crate) struct Outbox<T> {
    state: Mutex<State<T>>,
    /// The queue shrank (acknowledgements), for [`Outbox::drained`].
    shrunk: Notify,
    /// Callers of [`Outbox::drained`] waiting now: acknowledgements wake nobody when none
    /// does (every frame received carries one).
    draining: AtomicUsize,
    capacity: usize,
    sticky: Option<StickyFn<T>>,
}

/// Takes a waiter off the count when its wait ends, however it ends.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a writer gets no more frames from [`Outbox::poll_next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The peer is gone for good.
    Closed(String),
    /// A push found the queue full: the peer is not keeping up.
    Overflowed,
    /// A newer connection took over.
    Superseded,
}

impl<T: Clone + Send + 'static> Outbox<T> {
    /// An empty queue holding at most `capacity` unacknowledged messages. `sticky` classifies
    /// the messages a fresh session must get again; `None` when nothing must be (a server's
    /// queue towards a client).
    pub(crate) fn new(capacity: usize, sticky: Option<StickyFn<T>>) -> Arc<Self> {
        Arc::new(Outbox {
            state: Mutex::new(State {
                next_seq: 1,
                queue: VecDeque::new(),
                cursor: 1,
                epoch: 0,
                closed: None,
                overflowed: false,
                sticky: BTreeMap::new(),
                high_water: 0,
                waiting: None,
            }),
            shrunk: Notify::new(),
            draining: AtomicUsize::new(0),
            capacity: capacity.max(1),
            sticky,
        })
    }

    /// Queues a message. Never blocks.
    pub(crate) fn push(&self, msg: T) -> Result<(), TransportError> {
        let mut st = self.state.lock();
        if st.closed.is_some() {
            return Err(TransportError::Closed);
        }
        if st.queue.len() >= self.capacity {
            st.overflowed = true;
            unlock_and_wake(st);
            return Err(TransportError::Full {
                capacity: self.capacity,
            });
        }
        if let Some(f) = self.sticky {
            match f(&msg) {
                Sticky::No => {}
                Sticky::Keep(k) => {
                    st.sticky.insert(k, msg.clone());
                }
                Sticky::Drop(k) => {
                    st.sticky.remove(&k);
                }
            }
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.queue.push_back((seq, msg));
        st.high_water = st.high_water.max(st.queue.len());
        unlock_and_wake(st);
        Ok(())
    }

    /// The peer received everything up to `upto`.
    pub(crate) fn ack(&self, upto: u64) {
        let mut st = self.state.lock();
        let before = st.queue.len();
        while st.queue.front().is_some_and(|(s, _)| *s <= upto) {
            st.queue.pop_front();
        }
        let shrank = st.queue.len() != before;
        drop(st);
        // Sequentially consistent with `drained`'s count and its look at the queue: either it
        // counted itself before this looks, or it sees the shorter queue.
        if shrank && self.draining.load(Ordering::SeqCst) > 0 {
            self.shrunk.notify_waiters();
        }
    }

    /// A new connection to the peer: it writes from the first unacknowledged message. Returns
    /// the epoch to pass to [`Outbox::poll_next`]; writers of older connections stop.
    pub(crate) fn attach(&self) -> u64 {
        let mut st = self.state.lock();
        st.epoch += 1;
        st.cursor = st.queue.front().map_or(st.next_seq, |(s, _)| *s);
        st.overflowed = false;
        let epoch = st.epoch;
        unlock_and_wake(st);
        epoch
    }

    /// The peer has no memory of this session: what was unacknowledged is void, the sticky
    /// messages are queued again (in key order).
    pub(crate) fn renew(&self) {
        let mut st = self.state.lock();
        st.queue.clear();
        let sticky: Vec<T> = st.sticky.values().cloned().collect();
        for msg in sticky {
            let seq = st.next_seq;
            st.next_seq += 1;
            st.queue.push_back((seq, msg));
        }
        st.cursor = st.queue.front().map_or(st.next_seq, |(s, _)| *s);
        unlock_and_wake(st);
        self.shrunk.notify_waiters();
    }

    /// The peer is gone for good: later pushes fail with `Closed`.
    pub(crate) fn close(&self, reason: impl Into<String>) {
        let mut st = self.state.lock();
        if st.closed.is_none() {
            st.closed = Some(reason.into());
        }
        st.queue.clear();
        st.sticky.clear();
        unlock_and_wake(st);
        self.shrunk.notify_waiters();
    }

    /// Unacknowledged messages now.
    pub(crate) fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// The most messages ever queued at once.
    pub(crate) fn high_water(&self) -> usize {
        self.state.lock().high_water
    }

    /// The bound given to [`new`](Self::new); a push beyond it resets the connection.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The next frame for the connection of `epoch` to write; when there is none yet, `cx` is
    /// woken when there is (or the connection must stop). One waiter at a time: the stream of
    /// the connection attached last (an older one is woken by [`Outbox::attach`] and told it
    /// was superseded).
    pub(crate) fn poll_next(
        &self,
        epoch: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(u64, T), Stop>> {
        let mut st = self.state.lock();
        match Self::take_next(&mut st, epoch) {
            Some(answer) => Poll::Ready(answer),
            None => {
                match &mut st.waiting {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// The next frame for the connection of `epoch`, or why it gets none; `None`: nothing yet.
    fn take_next(st: &mut State<T>, epoch: u64) -> Option<Result<(u64, T), Stop>> {
        if let Some(r) = &st.closed {
            return Some(Err(Stop::Closed(r.clone())));
        }
        if st.epoch != epoch {
            return Some(Err(Stop::Superseded));
        }
        if st.overflowed {
            return Some(Err(Stop::Overflowed));
        }
        let front = st.queue.front().map(|(s, _)| *s)?;
        let idx = (st.cursor.max(front) - front) as usize;
        let (seq, msg) = st.queue.get(idx).cloned()?;
        st.cursor = seq + 1;
        Some(Ok((seq, msg)))
    }

    /// Resolves once every queued message is acknowledged (or the outbox is closed).
    pub(crate) async fn drained(&self) {
        self.draining.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.draining);
        loop {
            let notified = self.shrunk.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if st.queue.is_empty() || st.closed.is_some() {
                    return;
                }
            }
            notified.await;
        }
    }
}

/// The [`Link`] an actor sends through: encodes each message into the outbox of its peer.
struct NetLink<M, T> {
    outbox: Arc<Outbox<T>>,
    encode: fn(M) -> T,
}

impl<M: Send + 'static, T: Clone + Send + 'static> Sender<M> for NetLink<M, T> {
    fn send(&self, msg: M) -> Result<(), TransportError> {
        self.outbox.push((self.encode)(msg))
    }
}

/// A link that queues messages, encoded by `encode`, into `outbox`.
pub(crate) fn link<M, T>(outbox: Arc<Outbox<T>>, encode: fn(M) -> T) -> Link<M>
where
    M: Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    Arc::new(NetLink { outbox, encode })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sticky_even(m: &u32) -> Sticky {
        match m {
            m if m % 2 == 0 => Sticky::Keep(u64::from(*m)),
            m if m % 10 == 9 => Sticky::Drop(u64::from(m - 1)),
            _ => Sticky::No,
        }
    }

    /// The next frame for the connection of `epoch`, waiting for one, as its stream does.
    async fn next(o: &Outbox<u32>, epoch: u64) -> Result<(u64, u32), Stop> {
        std::future::poll_fn(|cx| o.poll_next(epoch, cx)).await
    }

    async fn next_now(o: &Outbox<u32>, epoch: u64) -> Option<(u64, u32)> {
        tokio::time::timeout(Duration::from_millis(20), next(o, epoch))
            .await
            .ok()
            .and_then(Result::ok)
    }

    #[tokio::test]
    async fn bounded_full_then_acks_free_room() {
        let o = Outbox::<u32>::new(3, None);
        for i in 0..3 {
            o.push(i).unwrap();
        }
        assert_eq!(o.push(99), Err(TransportError::Full { capacity: 3 }));
        assert_eq!(o.len(), 3);
        assert_eq!(o.high_water(), 3);
        // The overflow stops the writer (the connection is reset) ...
        let e = o.attach();
        o.push(98).unwrap_err();
        assert_eq!(next(&o, e).await, Err(Stop::Overflowed));
        // ... and acknowledgements make room again.
        o.ack(2);
        let e = o.attach();
        o.push(3).unwrap();
        assert_eq!(next_now(&o, e).await, Some((3, 2)));
        assert_eq!(next_now(&o, e).await, Some((4, 3)));
        assert_eq!(next_now(&o, e).await, None);
        assert_eq!(o.high_water(), 3);
    }

    #[tokio::test]
    async fn a_new_connection_replays_what_was_not_acknowledged() {
        let o = Outbox::<u32>::new(10, None);
        let e1 = o.attach();
        for i in 10..14 {
            o.push(i).unwrap();
        }
        assert_eq!(next_now(&o, e1).await, Some((1, 10)));
        assert_eq!(next_now(&o, e1).await, Some((2, 11)));
        o.ack(1);
        // The connection breaks; the peer had only seen 1.
        let e2 = o.attach();
        assert_eq!(next(&o, e1).await, Err(Stop::Superseded));
        let got: Vec<_> = [
            next_now(&o, e2).await,
            next_now(&o, e2).await,
            next_now(&o, e2).await,
        ]
        .into_iter()
        .flatten()
        .map(|(s, _)| s)
        .collect();
        assert_eq!(got, [2, 3, 4]);
        o.ack(4);
        assert_eq!(o.len(), 0);
        tokio::time::timeout(Duration::from_millis(20), o.drained())
            .await
            .expect("drained");
    }

    #[tokio::test]
    async fn renew_requeues_only_sticky_messages_and_close_refuses() {
        let o = Outbox::<u32>::new(10, Some(sticky_even));
        for m in [2, 3, 4, 5, 9] {
            o.push(m).unwrap();
        }
        // 9 voids 8 (never sent); 2 and 4 stay sticky; 3 and 5 are void in a fresh session.
        o.renew();
        let e = o.attach();
        let got: Vec<u32> = [next_now(&o, e).await, next_now(&o, e).await]
            .into_iter()
            .flatten()
            .map(|(_, m)| m)
            .collect();
        assert_eq!(got, [2, 4]);
        assert_eq!(next_now(&o, e).await, None);
        o.close("gone");
        assert_eq!(o.push(6), Err(TransportError::Closed));
        assert_eq!(next(&o, e).await, Err(Stop::Closed("gone".into())));
    }
}
