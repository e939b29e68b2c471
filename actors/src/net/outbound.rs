//! The stream of frames a connection writes, polled by the HTTP/2 stack itself.
//!
//! Sequenced messages (the bulk of the traffic) go from the peer's [`Outbox`] straight into
//! the stream that tonic encodes: the connection's HTTP/2 task takes the next frame when it
//! can write one, and no task of ours is woken on the way. The session's writer task hands
//! over only what it makes itself (the registration answer, pings and pongs, acknowledgements
//! that found no frame to ride on, heartbeats) and the outbox to write from
//! ([`Outgoing::Attach`]). At 512 ranks this took a task wake-up and a channel hop off every
//! message on both ends of every connection (BENCHMARKS.md).
//!
//! Every frame leaves stamped with the highest message received from the peer, whoever made
//! it; the stamp is shared (`Stamp`) so the writer knows what was acknowledged already.

use super::frame::{End, Frame};
use super::outbox::{Outbox, Stop};
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, Notify};
use tokio_stream::Stream;

/// What the session's writer hands to the stream.
pub(crate) enum Outgoing<Out: Frame> {
    /// A frame the writer made and stamped.
    Frame(Box<Out>),
    /// From now on, sequenced frames come from this outbox (the epoch of [`Outbox::attach`]).
    Attach(Arc<Outbox<Out::Body>>, u64),
}

/// The acknowledgement every frame carries, shared by a connection's writer and stream.
pub(crate) struct Stamp {
    /// The highest sequenced message received from the peer (survives reconnects).
    received: Arc<AtomicU64>,
    /// The highest one a frame written so far carried.
    acked: AtomicU64,
}

impl Stamp {
    fn new(received: Arc<AtomicU64>) -> Self {
        Stamp {
            received,
            acked: AtomicU64::new(0),
        }
    }

    /// `body` as frame `seq` (0: unsequenced), acknowledging everything received so far.
    pub(crate) fn frame<Out: Frame>(&self, seq: u64, body: Out::Body) -> Out {
        let ack = self.received.load(Ordering::Acquire);
        self.acked.fetch_max(ack, Ordering::AcqRel);
        Out::make(seq, ack, body)
    }

    /// The count of messages received from the peer that frames acknowledge.
    pub(crate) fn received(&self) -> &Arc<AtomicU64> {
        &self.received
    }

    /// Received messages that no frame has acknowledged yet.
    pub(crate) fn unacked(&self) -> u64 {
        self.received
            .load(Ordering::Acquire)
            .saturating_sub(self.acked.load(Ordering::Acquire))
    }
}

/// Why the stream stopped taking frames from the outbox, for the writer to end the session.
#[derive(Default)]
pub(crate) struct StreamEnd {
    why: Mutex<Option<End>>,
    notify: Notify,
}

impl StreamEnd {
    fn set(&self, end: End) {
        self.why.lock().get_or_insert(end);
        self.notify.notify_one();
    }

    /// Resolves once the stream has ended on its own; why.
    pub(crate) async fn wait(&self) -> End {
        loop {
            if let Some(end) = self.why.lock().take() {
                return end;
            }
            self.notify.notified().await;
        }
    }
}

/// The writer's side of a connection's stream.
pub(crate) struct OutboundTx<Out: Frame> {
    tx: mpsc::Sender<Outgoing<Out>>,
    pub(crate) stamp: Arc<Stamp>,
    pub(crate) end: Arc<StreamEnd>,
}

impl<Out: Frame> Clone for OutboundTx<Out> {
    fn clone(&self) -> Self {
        OutboundTx {
            tx: self.tx.clone(),
            stamp: self.stamp.clone(),
            end: self.end.clone(),
        }
    }
}

impl<Out: Frame> OutboundTx<Out> {
    /// Hands a frame over if the stream has room; gives it back if not. `Err(None)`: the
    /// stream is gone.
    pub(crate) fn try_send(&self, item: Outgoing<Out>) -> Result<(), Option<Outgoing<Out>>> {
        self.tx.try_send(item).map_err(|e| match e {
            mpsc::error::TrySendError::Full(i) => Some(i),
            mpsc::error::TrySendError::Closed(_) => None,
        })
    }

    /// Waits for room in the stream; `None` once it is gone.
    pub(crate) async fn reserve(&self) -> Option<mpsc::Permit<'_, Outgoing<Out>>> {
        self.tx.reserve().await.ok()
    }
}

/// The stream a connection writes: the writer's frames first, then the outbox's.
pub(crate) struct Outbound<Out: Frame> {
    rx: mpsc::Receiver<Outgoing<Out>>,
    /// The outbox attached and the epoch of [`Outbox::attach`].
    source: Option<(Arc<Outbox<Out::Body>>, u64)>,
    stamp: Arc<Stamp>,
    end: Arc<StreamEnd>,
}

/// A connection's stream, with `first` (the registration, or its answer) queued, and the
/// writer's side. `received` is the connection's count of messages received.
pub(crate) fn outbound<Out: Frame>(
    received: Arc<AtomicU64>,
    first: Out,
) -> (OutboundTx<Out>, Outbound<Out>) {
    let (tx, rx) = mpsc::channel(32);
    tx.try_send(Outgoing::Frame(Box::new(first)))
        .unwrap_or_else(|_| unreachable!("an empty channel takes one frame"));
    let stamp = Arc::new(Stamp::new(received));
    let end = Arc::new(StreamEnd::default());
    let writer = OutboundTx {
        tx,
        stamp: stamp.clone(),
        end: end.clone(),
    };
    let stream = Outbound {
        rx,
        source: None,
        stamp,
        end,
    };
    (writer, stream)
}

impl<Out: Frame> Outbound<Out> {
    /// The attached outbox's next frame, if it has one now (else `cx` is woken when it has).
    /// `Some(None)`: the outbox stopped this connection, and the stream ends.
    fn next_from_outbox(&mut self, cx: &mut Context<'_>) -> Option<Option<Out>> {
        let (outbox, epoch) = self.source.as_ref()?;
        match outbox.poll_next(*epoch, cx) {
            Poll::Pending => None,
            Poll::Ready(Ok((seq, body))) => Some(Some(self.stamp.frame::<Out>(seq, body))),
            Poll::Ready(Err(stop)) => {
                self.source = None;
                self.end.set(match stop {
                    Stop::Overflowed => End::Overflowed,
                    Stop::Closed(r) => End::PeerGone(r),
                    Stop::Superseded => End::Stopped,
                });
                Some(None)
            }
        }
    }
}

impl<Out: Frame> Stream for Outbound<Out> {
    type Item = Out;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Out>> {
        let this = self.get_mut();
        // The outbox first: most frames are its messages, and a frame found there spares a
        // look at the writer's channel. Once the writer is gone the session is over and
        // nothing more is written.
        loop {
            if this.rx.is_closed() && this.rx.is_empty() {
                return Poll::Ready(None);
            }
            if let Some(frame) = this.next_from_outbox(cx) {
                return Poll::Ready(frame);
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Outgoing::Frame(f))) => return Poll::Ready(Some(*f)),
                // Attached: look at the outbox again, which also registers for its frames.
                Poll::Ready(Some(Outgoing::Attach(outbox, epoch))) => {
                    this.source = Some((outbox, epoch));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::pb;
    use tokio_stream::StreamExt;

    fn body(n: u64) -> pb::down::Body {
        pb::down::Body::Pong(pb::Pong {
            id: n,
            origin_rank: 0,
        })
    }

    #[tokio::test]
    async fn the_first_frame_then_the_outbox_in_order_each_stamped() {
        let received = Arc::new(AtomicU64::new(7));
        let (tx, mut stream) = outbound::<pb::Down>(received.clone(), pb::Down::default());
        let outbox = Outbox::new(8, None);
        outbox.push(body(1)).unwrap();
        outbox.push(body(2)).unwrap();
        let epoch = outbox.attach();
        tx.try_send(Outgoing::Attach(outbox.clone(), epoch))
            .map_err(|_| ())
            .unwrap();
        assert_eq!(stream.next().await.unwrap(), pb::Down::default());
        let a = stream.next().await.unwrap();
        assert_eq!((a.seq, a.ack), (1, 7));
        received.store(9, Ordering::Release);
        let b = stream.next().await.unwrap();
        assert_eq!((b.seq, b.ack), (2, 9));
        assert_eq!(tx.stamp.unacked(), 0);
        received.store(10, Ordering::Release);
        assert_eq!(tx.stamp.unacked(), 1);
        // Nothing queued: the stream waits, and a push wakes it.
        let later = tokio::spawn(async move { stream.next().await.map(|f| f.seq) });
        tokio::task::yield_now().await;
        outbox.push(body(3)).unwrap();
        assert_eq!(later.await.unwrap(), Some(3));
    }

    #[tokio::test]
    async fn an_overflowed_outbox_ends_the_stream_and_tells_the_writer_why() {
        let received = Arc::new(AtomicU64::new(0));
        let (tx, mut stream) = outbound::<pb::Down>(received, pb::Down::default());
        let outbox = Outbox::new(1, None);
        let epoch = outbox.attach();
        tx.try_send(Outgoing::Attach(outbox.clone(), epoch))
            .map_err(|_| ())
            .unwrap();
        outbox.push(body(1)).unwrap();
        assert!(outbox.push(body(2)).is_err());
        assert_eq!(stream.next().await, Some(pb::Down::default()));
        assert_eq!(stream.next().await, None);
        assert_eq!(tx.end.wait().await, End::Overflowed);
    }

    #[tokio::test]
    async fn the_stream_ends_when_the_writer_is_gone() {
        let (tx, mut stream) =
            outbound::<pb::Down>(Arc::new(AtomicU64::new(0)), pb::Down::default());
        drop(tx);
        assert_eq!(stream.next().await, Some(pb::Down::default()));
        assert_eq!(stream.next().await, None);
    }
}
